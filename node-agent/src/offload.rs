//! TUN offloads: what the kernel says about a packet in its virtio-net header,
//! and how such a packet is turned back into ordinary MTU-sized IP packets.
//!
//! With offload on, a read from the TUN device may return a TCP (or UDP)
//! super-packet of up to 64 KiB that the kernel has not cut into segments, and
//! packets whose transport checksum is left unfinished (the field holds only
//! the pseudo-header sum). Carrying a super-packet as one frame saves the
//! per-packet work of every stage; the receiving agent writes it to its TUN
//! device with the same header and the kernel segments or GRO-delivers it.
//!
//! The rule that keeps emulation faithful (DESIGN.md, "TUN offloads"): a link
//! that acts on single packets (shaping, queue limits, AQM, loss, jitter,
//! reordering, duplication, corruption) only ever sees finished MTU-sized
//! packets, because [`finish`] runs before its pipeline. Only links that
//! cannot tell a burst of segments from one super-packet pass it through.

use bytes::{Buf, Bytes, BytesMut};
use thiserror::Error;

/// virtio-net header flag: the transport checksum is to be finished.
pub const NEEDS_CSUM: u8 = 1;
const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_TCPV6: u8 = 4;
const GSO_UDP_L4: u8 = 5;
const GSO_ECN: u8 = 0x80;
/// Bytes of the kernel's `struct virtio_net_hdr`.
pub const VNET_LEN: usize = 10;
/// Bytes of offload metadata in front of a frame's payload (see `frame.rs`).
pub const WIRE_LEN: usize = 10;
/// A peer's super-packet may not ask for more segments than this; the kernel
/// never makes more than 64 KiB / MSS.
const MAX_SEGMENTS: usize = 1024;
const IPV4_MIN_HEADER: usize = 20;
const IPV6_HEADER: usize = 40;
const TCP_MIN_HEADER: usize = 20;
const UDP_HEADER: usize = 8;
const TCP_CSUM_OFFSET: u16 = 16;
const UDP_CSUM_OFFSET: u16 = 6;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum OffloadError {
    #[error("offload metadata is truncated")]
    Truncated,
    #[error("checksum field at {at} lies beyond the {len}-byte packet")]
    ChecksumOutside { at: usize, len: usize },
    #[error("unsupported GSO type {0:#x}")]
    GsoType(u8),
    #[error("GSO type {gso_type:#x} does not fit an IPv{version} packet")]
    GsoMismatch { gso_type: u8, version: u8 },
    #[error("GSO segment size is 0")]
    ZeroSegmentSize,
    #[error("GSO packet has a malformed header: {0}")]
    Header(&'static str),
    #[error("GSO packet would make {0} segments, more than {MAX_SEGMENTS}")]
    TooManySegments(usize),
    #[error("segmentation failed: {0}")]
    Split(String),
}

/// What the kernel said about a packet it handed over with a virtio-net
/// header; the default is an ordinary, finished packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offload {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl Offload {
    /// Nothing left to do: a packet as it would be on a wire.
    pub fn is_finished(&self) -> bool {
        self.flags & NEEDS_CSUM == 0 && !self.is_gso()
    }

    pub fn is_gso(&self) -> bool {
        self.gso_type & !GSO_ECN != GSO_NONE
    }

    /// Reads the header the kernel puts before a packet read from TUN (its own
    /// byte order). Only the checksum request is kept of the flags: a
    /// "checksum valid" hint is true of the bytes and says nothing new.
    pub fn from_vnet(h: &[u8; VNET_LEN]) -> Offload {
        let u16_at = |i: usize| u16::from_ne_bytes([h[i], h[i + 1]]);
        Offload {
            flags: h[0] & NEEDS_CSUM,
            gso_type: h[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        }
        .normalized()
    }

    /// The header to write before the packet into a TUN device.
    pub fn to_vnet(&self) -> [u8; VNET_LEN] {
        let mut h = [0u8; VNET_LEN];
        h[0] = self.flags;
        h[1] = self.gso_type;
        h[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        h[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        h[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        h[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        h
    }

    /// The link-frame form, big endian like the rest of the frame.
    pub fn to_wire(&self) -> [u8; WIRE_LEN] {
        let mut w = [0u8; WIRE_LEN];
        w[0] = self.flags;
        w[1] = self.gso_type;
        w[2..4].copy_from_slice(&self.hdr_len.to_be_bytes());
        w[4..6].copy_from_slice(&self.gso_size.to_be_bytes());
        w[6..8].copy_from_slice(&self.csum_start.to_be_bytes());
        w[8..10].copy_from_slice(&self.csum_offset.to_be_bytes());
        w
    }

    /// Splits a frame payload carrying offload metadata into the metadata and
    /// the packet. The metadata is checked when the packet is used.
    pub fn split_wire(mut payload: Bytes) -> Result<(Offload, Bytes), OffloadError> {
        let offload = Offload::from_wire(&payload)?;
        payload.advance(WIRE_LEN);
        Ok((offload, payload))
    }

    /// The metadata at the start of a frame payload (see [`Offload::split_wire`]).
    pub fn from_wire(payload: &[u8]) -> Result<Offload, OffloadError> {
        let w: &[u8; WIRE_LEN] = payload.first_chunk().ok_or(OffloadError::Truncated)?;
        let u16_at = |i: usize| u16::from_be_bytes([w[i], w[i + 1]]);
        Ok(Offload {
            flags: w[0] & NEEDS_CSUM,
            gso_type: w[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        }
        .normalized())
    }

    /// A GSO "packet" with nothing to cut is an ordinary one.
    fn normalized(mut self) -> Offload {
        if !self.is_gso() {
            self.gso_type = GSO_NONE;
            self.gso_size = 0;
        }
        if self.is_finished() {
            return Offload::default();
        }
        self
    }

    /// How many packets of at most `gso_size` payload bytes this `len`-byte
    /// packet stands for, and the bytes they would take on a wire. A packet
    /// that does not parse counts as one.
    pub fn wire_size(&self, packet: &[u8]) -> (u64, u64) {
        self.wire_size_of(packet.len() as u64, packet)
    }

    /// [`Offload::wire_size`] of a `len`-byte packet of which only the first
    /// bytes, `head`, are at hand (the rest is still in a kernel pipe).
    pub fn wire_size_of(&self, len: u64, head: &[u8]) -> (u64, u64) {
        if !self.is_gso() || self.gso_size == 0 {
            return (1, len);
        }
        let Ok(headers) = headers_len(self, head) else {
            return (1, len);
        };
        let payload = len.saturating_sub(headers as u64);
        let segments = payload.div_ceil(u64::from(self.gso_size)).max(1);
        (segments, len + (segments - 1) * headers as u64)
    }
}

/// Length of the IP and transport headers of a GSO packet, read from the
/// packet itself: the kernel's `hdr_len` is only a hint.
fn headers_len(offload: &Offload, packet: &[u8]) -> Result<usize, OffloadError> {
    let version = packet.first().map_or(0, |b| b >> 4);
    let base = offload.gso_type & !GSO_ECN;
    let tcp = match (base, version) {
        (GSO_TCPV4, 4) | (GSO_TCPV6, 6) => true,
        (GSO_UDP_L4, 4 | 6) => false,
        (GSO_TCPV4 | GSO_TCPV6 | GSO_UDP_L4, _) => {
            return Err(OffloadError::GsoMismatch {
                gso_type: offload.gso_type,
                version,
            });
        }
        (other, _) => return Err(OffloadError::GsoType(other)),
    };
    let start = usize::from(offload.csum_start);
    let min_ip = if version == 4 {
        IPV4_MIN_HEADER
    } else {
        IPV6_HEADER
    };
    if start < min_ip {
        return Err(OffloadError::Header(
            "transport header starts inside the IP header",
        ));
    }
    let expected_offset = if tcp {
        TCP_CSUM_OFFSET
    } else {
        UDP_CSUM_OFFSET
    };
    if offload.csum_offset != expected_offset {
        return Err(OffloadError::Header(
            "checksum offset does not fit the protocol",
        ));
    }
    let transport = if tcp {
        let data_offset = packet
            .get(start + 12)
            .ok_or(OffloadError::Header("TCP header truncated"))?;
        let len = usize::from(data_offset >> 4) * 4;
        if len < TCP_MIN_HEADER {
            return Err(OffloadError::Header("TCP data offset below 5"));
        }
        len
    } else {
        UDP_HEADER
    };
    let total = start + transport;
    if total > packet.len() {
        return Err(OffloadError::Header("headers longer than the packet"));
    }
    Ok(total)
}

/// Finishes the transport checksum in place: the field holds the
/// pseudo-header sum, the sum over the transport header and data is added.
fn finish_checksum(packet: &mut [u8], offload: &Offload) -> Result<(), OffloadError> {
    let start = usize::from(offload.csum_start);
    let at = start + usize::from(offload.csum_offset);
    if at + 2 > packet.len() {
        return Err(OffloadError::ChecksumOutside {
            at,
            len: packet.len(),
        });
    }
    let initial = u16::from_be_bytes([packet[at], packet[at + 1]]);
    packet[at] = 0;
    packet[at + 1] = 0;
    let sum = !tun_rs::checksum(&packet[start..], u64::from(initial));
    packet[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    Ok(())
}

/// Turns a packet into what a real NIC would put on a wire: MTU-sized
/// packets with finished checksums, each handed to `out` in order. A packet
/// with nothing to do is handed over as it is, without a copy.
pub fn finish(
    packet: BytesMut,
    offload: Offload,
    out: &mut impl FnMut(BytesMut),
) -> Result<(), OffloadError> {
    if offload.is_finished() {
        out(packet);
        return Ok(());
    }
    if !offload.is_gso() {
        let mut packet = packet;
        finish_checksum(&mut packet, &offload)?;
        out(packet);
        return Ok(());
    }
    if offload.gso_size == 0 {
        return Err(OffloadError::ZeroSegmentSize);
    }
    let headers = headers_len(&offload, &packet)?;
    let payload = packet.len() - headers;
    let gso_size = usize::from(offload.gso_size);
    let segments = payload.div_ceil(gso_size);
    if segments > MAX_SEGMENTS {
        return Err(OffloadError::TooManySegments(segments));
    }
    if segments == 0 {
        // Headers only: nothing to cut, only the checksum is left to do.
        let mut packet = packet;
        finish_checksum(&mut packet, &offload)?;
        out(packet);
        return Ok(());
    }
    let hdr = tun_rs::VirtioNetHdr {
        flags: offload.flags,
        gso_type: offload.gso_type,
        hdr_len: headers as u16,
        gso_size: offload.gso_size,
        csum_start: offload.csum_start,
        csum_offset: offload.csum_offset,
    };
    let segment_len = headers + gso_size.min(payload);
    let mut bufs: Vec<BytesMut> = (0..segments)
        .map(|_| BytesMut::zeroed(segment_len))
        .collect();
    let mut sizes = vec![0usize; segments];
    let mut input = packet;
    let is_v6 = input[0] >> 4 == 6;
    // tun-rs's splitter is the one its own `recv_multiple` uses: it fixes up
    // IP ids, lengths, TCP sequence numbers and flags, and both checksums.
    let made = tun_rs::gso_split(&mut input, hdr, &mut bufs, &mut sizes, 0, is_v6)
        .map_err(|e| OffloadError::Split(e.to_string()))?;
    for (mut buf, size) in bufs.into_iter().zip(sizes).take(made) {
        buf.truncate(size);
        out(buf);
    }
    Ok(())
}

/// Cuts a TCP super-packet into super-packets of at most `max_segments`
/// segments each, handed to `out` in order with their offload metadata: the
/// "trains" a rate-limited link charges and releases as a whole
/// (`sched::config::LinkConfig::passes_trains`). Each keeps the original's
/// `gso_size`, so the segments a receiver's kernel cuts from the trains are
/// byte for byte the ones it would cut from the original (IP ids, sequence
/// numbers, flags and checksums). A packet that is not TCP GSO, or already
/// short enough, is handed over whole.
pub fn chunk(
    packet: Bytes,
    offload: Offload,
    max_segments: usize,
    out: &mut impl FnMut(Bytes, Offload, u32),
) -> Result<(), OffloadError> {
    let base = offload.gso_type & !GSO_ECN;
    if !offload.is_gso() || !matches!(base, GSO_TCPV4 | GSO_TCPV6) {
        let (segments, _) = offload.wire_size(&packet);
        out(packet, offload, segments as u32);
        return Ok(());
    }
    if offload.gso_size == 0 {
        return Err(OffloadError::ZeroSegmentSize);
    }
    let headers = headers_len(&offload, &packet)?;
    let gso_size = usize::from(offload.gso_size);
    let payload = packet.len() - headers;
    let segments = payload.div_ceil(gso_size).max(1);
    if segments > MAX_SEGMENTS {
        return Err(OffloadError::TooManySegments(segments));
    }
    let per_train = max_segments.max(1);
    if segments <= per_train {
        out(packet, offload, segments as u32);
        return Ok(());
    }
    let start = usize::from(offload.csum_start);
    let v4 = packet[0] >> 4 == 4;
    let seq = u32::from_be_bytes([
        packet[start + 4],
        packet[start + 5],
        packet[start + 6],
        packet[start + 7],
    ]);
    let ip_id = u16::from_be_bytes([packet[4], packet[5]]);
    let trains = segments.div_ceil(per_train);
    let train_bytes = per_train * gso_size;
    for t in 0..trains {
        let from = headers + t * train_bytes;
        let to = (from + train_bytes).min(packet.len());
        let mut train = BytesMut::with_capacity(headers + to - from);
        train.extend_from_slice(&packet[..headers]);
        train.extend_from_slice(&packet[from..to]);
        let total = train.len();
        if v4 {
            train[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            // The kernel numbers a super-packet's segments from its IP id on.
            let id = ip_id.wrapping_add((t * per_train) as u16);
            train[4..6].copy_from_slice(&id.to_be_bytes());
            train[10..12].copy_from_slice(&[0, 0]);
            let ihl = usize::from(train[0] & 0xf) * 4;
            let sum = !tun_rs::checksum(&train[..ihl], 0);
            train[10..12].copy_from_slice(&sum.to_be_bytes());
        } else {
            train[4..6].copy_from_slice(&((total - IPV6_HEADER) as u16).to_be_bytes());
        }
        let tcp = &mut train[start..];
        let train_seq = seq.wrapping_add((t * train_bytes) as u32);
        tcp[4..8].copy_from_slice(&train_seq.to_be_bytes());
        const FIN: u8 = 0x01;
        const PSH: u8 = 0x08;
        const CWR: u8 = 0x80;
        if t + 1 < trains {
            tcp[13] &= !(FIN | PSH);
        }
        if t > 0 {
            tcp[13] &= !CWR;
        }
        let pseudo = pseudo_header_sum(&train, start, v4);
        train[start + 16..start + 18].copy_from_slice(&pseudo.to_be_bytes());
        let n = (to - from).div_ceil(gso_size).max(1);
        let mut meta = offload;
        meta.hdr_len = headers as u16;
        out(train.freeze(), meta, n as u32);
    }
    Ok(())
}

/// The folded pseudo-header sum a partial TCP checksum field holds (what the
/// kernel puts there for a packet it leaves the checksum of to the device).
fn pseudo_header_sum(packet: &[u8], transport_start: usize, v4: bool) -> u16 {
    let len = (packet.len() - transport_start) as u32;
    let mut pseudo = [0u8; 40];
    let used = if v4 {
        pseudo[..8].copy_from_slice(&packet[12..20]);
        pseudo[9] = 6;
        pseudo[10..12].copy_from_slice(&(len as u16).to_be_bytes());
        12
    } else {
        pseudo[..32].copy_from_slice(&packet[8..40]);
        pseudo[32..36].copy_from_slice(&len.to_be_bytes());
        pseudo[39] = 6;
        40
    };
    tun_rs::checksum(&pseudo[..used], 0)
}

#[cfg(test)]
pub(crate) mod tests;

//! Link frames: how packets and link-control messages travel over a TCP link.
//!
//! ```text
//!  0               4        5        6        7                9               13
//! +---------------+--------+--------+--------+----------------+---------------+---------+
//! | len: u32      | ver=2  | kind   | flags  | hops: u16      | label: u32    | payload |
//! +---------------+--------+--------+--------+----------------+---------------+---------+
//! ```
//!
//! All integers are big endian. `len` counts the bytes after itself (the rest of the
//! header plus the payload), so a reader knows the frame boundary from the first four
//! bytes. `label` is the route id of a label-switched explicit route, so a transit
//! node can forward without parsing the IP packet; 0 means "route by destination".
//! `hops` counts the links the packet has crossed; the dataplane drops a packet whose
//! count reaches the topology's hop limit as looping (see `hop_limit.rs`). It is 16
//! bits wide so that no planned path is too long for it: version 1 had 8 bits and a
//! fixed guard of 64, which cut every path longer than 64 links.
//!
//! `flags` bit 0 ([`FLAG_OFFLOAD`], data frames only): the payload starts with
//! [`OFFLOAD_LEN`] bytes of TUN offload metadata (`flags u8 | gso_type u8 | hdr_len u16 |
//! gso_size u16 | csum_start u16 | csum_offset u16`, the kernel's virtio-net header
//! in big endian), then the IP packet: a super-packet of up to 64 KiB still to be cut
//! into segments, or a packet whose transport checksum is still to be finished
//! (see `offload.rs`). The other bits are reserved and carried through.
//!
//! Everything here decodes untrusted bytes from a peer, so decoders return errors and
//! never panic, whatever the input.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;
use tokio_util::codec::{Decoder, Encoder};

/// Wire version written into, and required from, every frame.
pub const VERSION: u8 = 2;
/// Bytes of header, including the length field.
pub const HEADER_LEN: usize = 13;
/// Largest IP packet (IPv4 total length is a u16).
pub const MAX_PACKET: usize = 65_535;
/// Data-frame flag: offload metadata precedes the packet.
pub const FLAG_OFFLOAD: u8 = 0x01;
/// Bytes of offload metadata in front of the packet when [`FLAG_OFFLOAD`] is set.
pub const OFFLOAD_LEN: usize = 10;
/// Largest payload accepted: the largest IP packet with its offload metadata.
pub const MAX_PAYLOAD: usize = MAX_PACKET + OFFLOAD_LEN;

/// Bytes of header after the length field; the smallest legal `len`.
const LEN_FIELD: usize = 4;
const MIN_LEN: usize = HEADER_LEN - LEN_FIELD;
/// Longest string field of a [`LinkHello`].
pub const MAX_HELLO_FIELD: usize = 255;

#[derive(Debug, Error)]
pub enum FrameError {
    #[error("unsupported frame version {0} (this build speaks {VERSION})")]
    BadVersion(u8),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("frame length {len} exceeds the maximum of {max}", max = MIN_LEN + MAX_PAYLOAD)]
    Oversize { len: u64 },
    #[error("frame length {len} is shorter than the {MIN_LEN}-byte header")]
    TooShort { len: u32 },
    #[error("link hello is truncated")]
    HelloTruncated,
    #[error("link hello field `{field}` is {len} bytes, more than {MAX_HELLO_FIELD}")]
    HelloFieldTooLong { field: &'static str, len: usize },
    #[error("link hello field `{field}` is not valid UTF-8")]
    HelloNotUtf8 { field: &'static str },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// An IP packet.
    Data = 1,
    /// First frame on a link; payload is a [`LinkHello`].
    Hello = 2,
    /// Keeps an idle link observably alive; empty payload.
    Keepalive = 3,
}

impl FrameKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Data),
            2 => Some(Self::Hello),
            3 => Some(Self::Keepalive),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub hops: u16,
    /// Reserved; written as given and carried through, no meaning assigned yet.
    pub flags: u8,
    /// Route id of a label-switched route; 0 = route by destination address.
    pub label: u32,
    pub payload_len: u32,
}

impl FrameHeader {
    /// Bytes of the whole frame on the wire, header included.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.payload_len as usize
    }

    /// A fresh header as the first node of a path writes it.
    pub fn new(kind: FrameKind, label: u32, payload_len: u32) -> Self {
        Self {
            kind,
            hops: 0,
            flags: 0,
            label,
            payload_len,
        }
    }
}

/// Writes the 13-byte header. `h.payload_len` is written as is; the caller must keep it
/// at most [`MAX_PAYLOAD`] (peers reject larger frames). [`FrameCodec`] checks this.
pub fn encode_header(h: &FrameHeader, out: &mut impl BufMut) {
    debug_assert!(
        h.payload_len as usize <= MAX_PAYLOAD,
        "payload_len {} too large",
        h.payload_len
    );
    // Saturating so an oversize payload_len yields an over-long (rejected) frame, never
    // a short one that would desynchronise the peer's framing.
    out.put_u32((MIN_LEN as u32).saturating_add(h.payload_len));
    out.put_u8(VERSION);
    out.put_u8(h.kind as u8);
    out.put_u8(h.flags);
    out.put_u16(h.hops);
    out.put_u32(h.label);
}

/// Parses the frame at the start of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, or the header and the total frame
/// length (header included) once the whole frame is in `buf`. Fields are checked as
/// soon as their bytes arrive, so garbage is rejected before waiting for a body that
/// will never come.
pub fn decode(buf: &[u8]) -> Result<Option<(FrameHeader, usize)>, FrameError> {
    match decode_header(buf)? {
        Some(header) if buf.len() >= header.frame_len() => {
            let total = header.frame_len();
            Ok(Some((header, total)))
        }
        _ => Ok(None),
    }
}

/// The header at the start of `buf` as soon as its bytes are there, whether or
/// not the payload is: what a reader needs to decide where the payload goes.
/// Checked as [`decode`] checks it.
pub fn decode_header(buf: &[u8]) -> Result<Option<FrameHeader>, FrameError> {
    let Some(len_bytes) = buf.first_chunk::<4>() else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(*len_bytes);
    if (len as usize) < MIN_LEN {
        return Err(FrameError::TooShort { len });
    }
    if len as usize > MIN_LEN + MAX_PAYLOAD {
        return Err(FrameError::Oversize {
            len: u64::from(len),
        });
    }
    if let Some(&version) = buf.get(4)
        && version != VERSION
    {
        return Err(FrameError::BadVersion(version));
    }
    let kind = match buf.get(5) {
        None => return Ok(None),
        Some(&k) => FrameKind::from_u8(k).ok_or(FrameError::UnknownKind(k))?,
    };
    let Some(header) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    Ok(Some(FrameHeader {
        kind,
        flags: header[6],
        hops: u16::from_be_bytes([header[7], header[8]]),
        label: u32::from_be_bytes([header[9], header[10], header[11], header[12]]),
        payload_len: len - MIN_LEN as u32,
    }))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub header: FrameHeader,
    pub payload: Bytes,
}

impl Frame {
    /// A new frame whose header length matches `payload`.
    pub fn new(kind: FrameKind, label: u32, payload: Bytes) -> Self {
        // Oversize payloads are caught by the encoder; saturate rather than wrap here.
        let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        Self {
            header: FrameHeader::new(kind, label, len),
            payload,
        }
    }
}

/// Frames over a byte stream. After any decode error the stream is out of sync and
/// the link should be closed; there is no resynchronisation.
#[derive(Clone, Copy, Debug, Default)]
pub struct FrameCodec;

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        match decode(src)? {
            Some((header, total)) => {
                let mut frame = src.split_to(total);
                frame.advance(HEADER_LEN);
                Ok(Some(Frame {
                    header,
                    payload: frame.freeze(),
                }))
            }
            None => {
                // Grow the buffer once for the whole frame instead of in small steps.
                if let Some(len) = src.first_chunk::<4>() {
                    let total = LEN_FIELD + u32::from_be_bytes(*len) as usize;
                    src.reserve(total.saturating_sub(src.len()));
                }
                Ok(None)
            }
        }
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = FrameError;

    /// Writes the frame; its length comes from `payload`, not `header.payload_len`, so
    /// the two can never disagree on the wire.
    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        let len = frame.payload.len();
        if len > MAX_PAYLOAD {
            return Err(FrameError::Oversize {
                len: (MIN_LEN + len) as u64,
            });
        }
        let header = FrameHeader {
            payload_len: len as u32,
            ..frame.header
        };
        dst.reserve(HEADER_LEN + len);
        encode_header(&header, dst);
        dst.put_slice(&frame.payload);
        Ok(())
    }
}

/// A data frame to encode without first joining its parts: the offload
/// metadata, if any, and the packet are copied once, into the write buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataFrame {
    pub hops: u16,
    pub label: u32,
    /// Sets [`FLAG_OFFLOAD`] and goes in front of the packet.
    pub offload: Option<[u8; OFFLOAD_LEN]>,
    pub packet: Bytes,
}

impl Encoder<DataFrame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: DataFrame, dst: &mut BytesMut) -> Result<(), FrameError> {
        let prefix: &[u8] = match &frame.offload {
            Some(meta) => meta,
            None => &[],
        };
        let len = prefix.len() + frame.packet.len();
        if len > MAX_PAYLOAD {
            return Err(FrameError::Oversize {
                len: (MIN_LEN + len) as u64,
            });
        }
        let header = FrameHeader {
            kind: FrameKind::Data,
            hops: frame.hops,
            flags: if frame.offload.is_some() {
                FLAG_OFFLOAD
            } else {
                0
            },
            label: frame.label,
            payload_len: len as u32,
        };
        dst.reserve(HEADER_LEN + len);
        encode_header(&header, dst);
        dst.put_slice(prefix);
        dst.put_slice(&frame.packet);
        Ok(())
    }
}

/// The first frame on a link, sent by both ends, saying who is speaking, so an
/// acceptor can tell which of its links a connection belongs to and refuse strays
/// from another topology.
///
/// Wire: three `u16`-length-prefixed UTF-8 strings, topology, link, node, each at most
/// [`MAX_HELLO_FIELD`] bytes. Bytes after the third string are ignored so a later
/// version can append fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkHello {
    pub topology: String,
    pub link: String,
    pub node: String,
}

impl LinkHello {
    /// Checks the field lengths, so [`encode`](Self::encode) will write them unchanged.
    pub fn new(
        topology: impl Into<String>,
        link: impl Into<String>,
        node: impl Into<String>,
    ) -> Result<Self, FrameError> {
        let hello = Self {
            topology: topology.into(),
            link: link.into(),
            node: node.into(),
        };
        for (field, value) in hello.fields() {
            if value.len() > MAX_HELLO_FIELD {
                return Err(FrameError::HelloFieldTooLong {
                    field,
                    len: value.len(),
                });
            }
        }
        Ok(hello)
    }

    fn fields(&self) -> [(&'static str, &str); 3] {
        [
            ("topology", &self.topology),
            ("link", &self.link),
            ("node", &self.node),
        ]
    }

    /// Fields longer than [`MAX_HELLO_FIELD`] are cut at the last character boundary
    /// that fits (build with [`new`](Self::new) to rule that out): the output always
    /// decodes, and a mangled name is then refused by the peer as a mismatch.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(
            3 * 2 + self.fields().iter().map(|(_, v)| v.len()).sum::<usize>(),
        );
        for (_, value) in self.fields() {
            let value = truncate_to_boundary(value, MAX_HELLO_FIELD);
            out.put_u16(value.len() as u16);
            out.put_slice(value.as_bytes());
        }
        out.freeze()
    }

    pub fn decode(mut buf: &[u8]) -> Result<LinkHello, FrameError> {
        let topology = take_string(&mut buf, "topology")?;
        let link = take_string(&mut buf, "link")?;
        let node = take_string(&mut buf, "node")?;
        Ok(LinkHello {
            topology,
            link,
            node,
        })
    }
}

fn truncate_to_boundary(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    // Index 0 is always a boundary, so this finds one.
    let end = (0..=max)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0);
    &s[..end]
}

fn take_string(buf: &mut &[u8], field: &'static str) -> Result<String, FrameError> {
    let (len, rest) = buf
        .split_first_chunk::<2>()
        .ok_or(FrameError::HelloTruncated)?;
    let len = usize::from(u16::from_be_bytes(*len));
    if len > MAX_HELLO_FIELD {
        return Err(FrameError::HelloFieldTooLong { field, len });
    }
    let (value, rest) = rest
        .split_at_checked(len)
        .ok_or(FrameError::HelloTruncated)?;
    let value = std::str::from_utf8(value).map_err(|_| FrameError::HelloNotUtf8 { field })?;
    *buf = rest;
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encoded(frame: &Frame) -> BytesMut {
        let mut out = BytesMut::new();
        FrameCodec
            .encode(frame.clone(), &mut out)
            .expect("encodable");
        out
    }

    fn data(label: u32, payload: &'static [u8]) -> Frame {
        Frame::new(FrameKind::Data, label, Bytes::from_static(payload))
    }

    #[test]
    fn header_layout_is_as_documented() {
        let h = FrameHeader {
            kind: FrameKind::Hello,
            hops: 7,
            flags: 0x5a,
            label: 0x0102_0304,
            payload_len: 3,
        };
        let mut out = Vec::new();
        encode_header(&h, &mut out);
        assert_eq!(out, [0, 0, 0, 12, 2, 2, 0x5a, 0, 7, 1, 2, 3, 4]);
        assert_eq!(out.len(), HEADER_LEN);
    }

    #[test]
    fn decode_whole_frame() {
        let bytes = encoded(&data(9, b"hello"));
        let (h, total) = decode(&bytes).expect("valid").expect("complete");
        assert_eq!(total, HEADER_LEN + 5);
        assert_eq!(
            h,
            FrameHeader {
                kind: FrameKind::Data,
                hops: 0,
                flags: 0,
                label: 9,
                payload_len: 5
            }
        );
    }

    #[test]
    fn decode_needs_more_bytes_for_every_prefix() {
        let bytes = encoded(&data(0, b"abc"));
        for cut in 0..bytes.len() {
            assert!(
                matches!(decode(&bytes[..cut]), Ok(None)),
                "prefix of {cut} bytes"
            );
        }
    }

    #[test]
    fn decode_ignores_bytes_after_the_frame() {
        let mut bytes = encoded(&data(0, b"abc"));
        bytes.extend_from_slice(&[0xff; 10]);
        let (_, total) = decode(&bytes).expect("valid").expect("complete");
        assert_eq!(total, HEADER_LEN + 3);
    }

    #[test]
    fn empty_payload_is_fine() {
        let frame = Frame::new(FrameKind::Keepalive, 0, Bytes::new());
        let mut bytes = encoded(&frame);
        assert_eq!(bytes.len(), HEADER_LEN);
        assert_eq!(FrameCodec.decode(&mut bytes).expect("valid"), Some(frame));
        assert!(bytes.is_empty());
    }

    #[test]
    fn rejects_bad_version_as_soon_as_seen() {
        // Version 1 peers (8-bit hop counts) are refused, not misread.
        let err = decode(&[0, 0, 0, 9, 1]).expect_err("version 1");
        assert!(matches!(err, FrameError::BadVersion(1)), "{err}");
        let err = decode(&[0, 0, 0, 9, 0, 1, 0, 0, 0, 0, 0, 0, 0]).expect_err("version 0");
        assert!(matches!(err, FrameError::BadVersion(0)), "{err}");
    }

    #[test]
    fn rejects_unknown_kind() {
        for kind in [0u8, 4, 255] {
            let err = decode(&[0, 0, 0, 9, VERSION, kind]).expect_err("unknown kind");
            assert!(
                matches!(err, FrameError::UnknownKind(k) if k == kind),
                "{err}"
            );
        }
    }

    #[test]
    fn rejects_length_shorter_than_header() {
        for len in 0..MIN_LEN as u8 {
            let err = decode(&[0, 0, 0, len]).expect_err("short");
            assert!(
                matches!(err, FrameError::TooShort { len: l } if l == u32::from(len)),
                "{err}"
            );
        }
    }

    #[test]
    fn length_limits_are_exact() {
        let max = (MIN_LEN + MAX_PAYLOAD) as u32;
        let mut ok = max.to_be_bytes().to_vec();
        ok.extend_from_slice(&[VERSION, 1]);
        assert!(matches!(decode(&ok), Ok(None)));
        let mut too_big = (max + 1).to_be_bytes().to_vec();
        too_big.extend_from_slice(&[VERSION, 1]);
        assert!(matches!(decode(&too_big), Err(FrameError::Oversize { .. })));
        assert!(matches!(
            decode(&u32::MAX.to_be_bytes()),
            Err(FrameError::Oversize { .. })
        ));
    }

    #[test]
    fn largest_payload_round_trips() {
        let payload = Bytes::from(vec![0xab; MAX_PAYLOAD]);
        let frame = Frame::new(FrameKind::Data, 77, payload);
        let mut bytes = encoded(&frame);
        assert_eq!(FrameCodec.decode(&mut bytes).expect("valid"), Some(frame));
    }

    #[test]
    fn encoder_refuses_oversize_payload() {
        let frame = Frame::new(FrameKind::Data, 0, Bytes::from(vec![0; MAX_PAYLOAD + 1]));
        let mut out = BytesMut::new();
        assert!(matches!(
            FrameCodec.encode(frame, &mut out),
            Err(FrameError::Oversize { .. })
        ));
        assert!(out.is_empty(), "nothing written on error");
    }

    #[test]
    fn encoder_trusts_payload_over_header_length() {
        let mut frame = data(3, b"four");
        frame.header.payload_len = 1000;
        let mut bytes = encoded(&frame);
        let got = FrameCodec
            .decode(&mut bytes)
            .expect("valid")
            .expect("complete");
        assert_eq!(got.header.payload_len, 4);
        assert_eq!(&got.payload[..], b"four");
    }

    #[test]
    fn codec_decodes_back_to_back_frames() {
        let frames = [
            data(1, b"one"),
            Frame::new(FrameKind::Keepalive, 0, Bytes::new()),
            data(0, b"three"),
        ];
        let mut bytes = BytesMut::new();
        for f in &frames {
            FrameCodec.encode(f.clone(), &mut bytes).expect("encodable");
        }
        for f in &frames {
            assert_eq!(
                FrameCodec.decode(&mut bytes).expect("valid").as_ref(),
                Some(f)
            );
        }
        assert_eq!(FrameCodec.decode(&mut bytes).expect("valid"), None);
    }

    #[test]
    fn codec_reserves_for_a_partial_frame() {
        let bytes = encoded(&Frame::new(
            FrameKind::Data,
            0,
            Bytes::from(vec![1; 10_000]),
        ));
        let mut buf = BytesMut::from(&bytes[..HEADER_LEN]);
        assert_eq!(FrameCodec.decode(&mut buf).expect("valid"), None);
        assert!(buf.capacity() >= bytes.len());
    }

    #[test]
    fn data_frames_carry_offload_metadata_behind_a_flag() {
        let meta = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        let mut bytes = BytesMut::new();
        for offload in [None, Some(meta)] {
            FrameCodec
                .encode(
                    DataFrame {
                        hops: 3,
                        label: 9,
                        offload,
                        packet: Bytes::from_static(b"packet"),
                    },
                    &mut bytes,
                )
                .expect("encodable");
        }
        let plain = FrameCodec
            .decode(&mut bytes)
            .expect("valid")
            .expect("whole");
        assert_eq!(plain.header.flags, 0);
        assert_eq!((plain.header.hops, plain.header.label), (3, 9));
        assert_eq!(&plain.payload[..], b"packet");
        let offloaded = FrameCodec
            .decode(&mut bytes)
            .expect("valid")
            .expect("whole");
        assert_eq!(offloaded.header.flags, FLAG_OFFLOAD);
        assert_eq!(&offloaded.payload[..OFFLOAD_LEN], &meta);
        assert_eq!(&offloaded.payload[OFFLOAD_LEN..], b"packet");
    }

    #[test]
    fn the_largest_packet_fits_with_its_metadata_and_no_more() {
        let frame = |len| DataFrame {
            hops: 0,
            label: 0,
            offload: Some([0; OFFLOAD_LEN]),
            packet: Bytes::from(vec![0; len]),
        };
        let mut out = BytesMut::new();
        FrameCodec
            .encode(frame(MAX_PACKET), &mut out)
            .expect("largest packet");
        assert!(matches!(
            FrameCodec.decode(&mut out),
            Ok(Some(f)) if f.payload.len() == MAX_PAYLOAD
        ));
        assert!(matches!(
            FrameCodec.encode(frame(MAX_PACKET + 1), &mut out),
            Err(FrameError::Oversize { .. })
        ));
    }

    #[test]
    fn io_errors_convert() {
        let err: FrameError = std::io::Error::other("boom").into();
        assert!(matches!(err, FrameError::Io(_)));
    }

    #[test]
    fn hop_counts_past_255_survive_the_wire() {
        // A 300-node line's last transit node sees 298; version 1's u8 wrapped.
        let h = FrameHeader {
            hops: 298,
            ..FrameHeader::new(FrameKind::Data, 5, 0)
        };
        let mut out = Vec::new();
        encode_header(&h, &mut out);
        assert_eq!(decode(&out).expect("valid"), Some((h, HEADER_LEN)));
    }

    #[test]
    fn hello_round_trip_and_layout() {
        let hello = LinkHello::new("line3", "a-b", "a").expect("short names");
        let bytes = hello.encode();
        assert_eq!(&bytes[..], b"\x00\x05line3\x00\x03a-b\x00\x01a");
        assert_eq!(LinkHello::decode(&bytes).expect("valid"), hello);
    }

    #[test]
    fn hello_accepts_empty_and_max_fields_and_trailing_bytes() {
        let long = "x".repeat(MAX_HELLO_FIELD);
        let hello = LinkHello::new("", long.clone(), "ü").expect("fits");
        let mut bytes = hello.encode().to_vec();
        bytes.extend_from_slice(b"future fields");
        assert_eq!(LinkHello::decode(&bytes).expect("valid"), hello);
    }

    #[test]
    fn hello_rejects_bad_input() {
        assert!(matches!(
            LinkHello::decode(b""),
            Err(FrameError::HelloTruncated)
        ));
        assert!(matches!(
            LinkHello::decode(b"\x00\x05lin"),
            Err(FrameError::HelloTruncated)
        ));
        assert!(matches!(
            LinkHello::decode(b"\x00\x01a\x00\x01b"),
            Err(FrameError::HelloTruncated)
        ));
        assert!(matches!(
            LinkHello::decode(b"\x01\x00"),
            Err(FrameError::HelloFieldTooLong {
                field: "topology",
                len: 256
            })
        ));
        assert!(matches!(
            LinkHello::decode(b"\x00\x01a\x00\x01\xff\x00\x00"),
            Err(FrameError::HelloNotUtf8 { field: "link" })
        ));
    }

    #[test]
    fn hello_new_rejects_long_fields() {
        let long = "n".repeat(MAX_HELLO_FIELD + 1);
        assert!(matches!(
            LinkHello::new("t", "l", long),
            Err(FrameError::HelloFieldTooLong {
                field: "node",
                len: 256
            })
        ));
    }

    #[test]
    fn hello_encode_truncates_on_a_char_boundary() {
        // 254 ASCII bytes then a 2-byte char: cutting at 255 would split the char.
        let topology = format!("{}é", "t".repeat(MAX_HELLO_FIELD - 1));
        let hello = LinkHello {
            topology: topology.clone(),
            link: "l".into(),
            node: "n".into(),
        };
        let decoded = LinkHello::decode(&hello.encode()).expect("always decodable");
        assert_eq!(decoded.topology, topology[..MAX_HELLO_FIELD - 1]);
        assert_eq!(decoded.link, "l");
    }

    fn kind() -> impl Strategy<Value = FrameKind> {
        prop_oneof![
            Just(FrameKind::Data),
            Just(FrameKind::Hello),
            Just(FrameKind::Keepalive)
        ]
    }

    fn frame(max_payload: usize) -> impl Strategy<Value = Frame> {
        (
            kind(),
            any::<u16>(),
            any::<u8>(),
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..=max_payload),
        )
            .prop_map(|(kind, hops, flags, label, payload)| Frame {
                header: FrameHeader {
                    kind,
                    hops,
                    flags,
                    label,
                    payload_len: payload.len() as u32,
                },
                payload: payload.into(),
            })
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_plausible_headers(
            len in 0u32..200, version in 0u8..3, kind in 0u8..5, rest in proptest::collection::vec(any::<u8>(), 0..220),
        ) {
            // Random bytes rarely get past the length and version checks; aim at the body.
            let mut bytes = len.to_be_bytes().to_vec();
            bytes.extend_from_slice(&[version, kind]);
            bytes.extend_from_slice(&rest);
            if let Ok(Some((h, total))) = decode(&bytes) {
                prop_assert!(total <= bytes.len());
                prop_assert_eq!(total, HEADER_LEN + h.payload_len as usize);
            }
        }

        #[test]
        fn decoder_never_panics(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..8)) {
            let mut buf = BytesMut::new();
            for chunk in chunks {
                buf.extend_from_slice(&chunk);
                loop {
                    match FrameCodec.decode(&mut buf) {
                        Ok(Some(_)) => continue,
                        Ok(None) => break,
                        Err(_) => return Ok(()),
                    }
                }
            }
        }

        #[test]
        fn hello_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = LinkHello::decode(&bytes);
        }

        #[test]
        fn hello_round_trips(topology in "\\PC{0,60}", link in "\\PC{0,60}", node in "\\PC{0,60}") {
            let hello = LinkHello { topology, link, node };
            // Up to 60 chars of at most 4 bytes each: always within the limit.
            prop_assert_eq!(LinkHello::decode(&hello.encode()).expect("valid"), hello);
        }

        #[test]
        fn header_round_trips(frame in frame(0)) {
            let mut bytes = Vec::new();
            encode_header(&frame.header, &mut bytes);
            let (h, total) = decode(&bytes).expect("valid").expect("complete");
            prop_assert_eq!(h, frame.header);
            prop_assert_eq!(total, HEADER_LEN);
        }

        #[test]
        fn frame_round_trips_at_every_split(frame in frame(300)) {
            let bytes = encoded(&frame);
            for cut in 0..=bytes.len() {
                let mut buf = BytesMut::from(&bytes[..cut]);
                let mut codec = FrameCodec;
                let first = codec.decode(&mut buf).expect("valid prefix");
                if cut < bytes.len() {
                    prop_assert_eq!(first, None);
                    buf.extend_from_slice(&bytes[cut..]);
                    prop_assert_eq!(codec.decode(&mut buf).expect("valid"), Some(frame.clone()));
                } else {
                    prop_assert_eq!(first, Some(frame.clone()));
                }
                prop_assert!(buf.is_empty());
            }
        }

        #[test]
        fn frame_streams_round_trip_in_arbitrary_chunks(
            frames in proptest::collection::vec(frame(200), 1..6),
            chunk_sizes in proptest::collection::vec(1usize..50, 1..20),
        ) {
            let mut stream = BytesMut::new();
            for f in &frames {
                FrameCodec.encode(f.clone(), &mut stream).expect("encodable");
            }
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            let mut sizes = chunk_sizes.iter().cycle();
            while !stream.is_empty() {
                let n = sizes.next().copied().unwrap_or(1).min(stream.len());
                buf.extend_from_slice(&stream.split_to(n));
                while let Some(f) = FrameCodec.decode(&mut buf).expect("valid") {
                    got.push(f);
                }
            }
            prop_assert_eq!(got, frames);
            prop_assert!(buf.is_empty());
        }
    }
}

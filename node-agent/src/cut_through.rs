//! Cut-through transit. A frame that arrives on a link and leaves on a link
//! that does nothing to it (no rate, delay, impairment or capture: a
//! transparent pipeline) goes from the receiving task straight to the next
//! link's task, past the processors. On TCP links a large frame's payload
//! does not enter user space at all: the receiving task reads the frame's
//! header and the first bytes of its packet (enough to route it), writes the
//! next hop's header into a pipe and splices the rest of the frame from the
//! arriving socket behind it; the next link's task splices the pipe into its
//! own socket. The bytes are counted on both links as if copied.
//!
//! The next link re-checks when the frame reaches it: if it has stopped being
//! transparent in between (a delay was just added) or holds packets still on
//! their way (a delay was just removed), the frame is read out of the pipe and
//! takes the pipeline like any other, so switching is lossless and in order.
//! DESIGN.md "Cut-through transit" has the measurements behind it.

use crate::conn::Reader;
use crate::flow::FlowKey;
use crate::frame::{self, FLAG_OFFLOAD, Frame, FrameHeader, FrameKind, HEADER_LEN, OFFLOAD_LEN};
use crate::link::{LinkHandle, Receiver};
use crate::offload::Offload;
use crate::packet::Packet;
use crate::pipe::Pipe;
use crate::processor::Routes;
use crate::routing::Decision;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::net::TcpStream;

/// What of a frame's payload is read with its header when frames are being
/// spliced: the offload metadata and enough of the packet for its flow key and
/// the length of its headers (IPv4 or IPv6, TCP with options).
const PEEK: usize = OFFLOAD_LEN + 128;
/// A frame's payload is spliced from this size on; below it the two extra
/// system calls cost more than the copies they save.
pub const SPLICE_MIN: usize = 16 * 1024;
/// Pipes one arriving connection may have in flight to next hops; with none
/// free, frames are read into user space (and still go cut-through).
const PIPES_PER_LINK: usize = 8;
/// Frames read in small steps after a spliced one, so that the next frame's
/// payload stays in the socket to be spliced; after this many that were not,
/// reads fill the buffer again.
const SMALL_READS_FOR: u32 = 64;

/// Off for the whole process once the kernel refused to splice a link socket.
static REFUSED: AtomicBool = AtomicBool::new(false);

/// How transit frames pass, from `NEXTMINI_CUT_THROUGH` (read once): `splice`
/// (the default), `copy` (cut-through, payloads read into user space) or
/// `off` (every frame through the processors). For measuring one against the
/// other (BENCHMARKS.md "Transit hops").
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Off,
    Copy,
    Splice,
}

pub fn mode() -> Mode {
    static MODE: std::sync::LazyLock<Mode> =
        std::sync::LazyLock::new(|| match std::env::var("NEXTMINI_CUT_THROUGH").as_deref() {
            Ok("off") => Mode::Off,
            Ok("copy") => Mode::Copy,
            _ => Mode::Splice,
        });
    *MODE
}

/// A frame on its way from one link straight to the next.
pub enum DirectFrame {
    /// A whole frame, the next hop's header first, in a pipe.
    Spliced {
        pipe: PipeLease,
        len: usize,
        packets: u64,
        bytes: u64,
    },
    /// A packet read into user space (a small frame, or no pipe was free).
    Copied(Packet),
}

/// Where a frame goes next, when that is a transparent link.
pub struct Hop {
    pub link: Arc<LinkHandle>,
    pub label: u32,
    pub hops: u16,
}

/// The next hop of a packet that has crossed `hops` links, if it goes on at
/// once over a link that takes frames cut-through. Anything else (delivered
/// here, dropped, a hop limit reached, TTLs to decrement) is the processors'.
pub fn next_hop(routes: &Routes, packet: &[u8], label: u32, hops: u16) -> Option<Hop> {
    if mode() == Mode::Off {
        return None;
    }
    let key = FlowKey::parse(packet).ok()?;
    let table = routes.load();
    if table.ttl_reply_from().is_some() {
        return None;
    }
    match table.lookup(&key, label) {
        Decision::Forward { link, label } if link.takes_cut_through() => Some(Hop {
            hops: table.hop_limit().next(hops)?,
            link,
            label,
        }),
        _ => None,
    }
}

/// Pipes of one arriving connection, reused frame after frame.
#[derive(Clone, Default)]
pub struct PipePool {
    state: Arc<Mutex<PoolState>>,
}

#[derive(Default)]
struct PoolState {
    free: Vec<Pipe>,
    leased: usize,
}

impl PipePool {
    fn lease(&self) -> Option<PipeLease> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let pipe = match state.free.pop() {
            Some(p) => p,
            None if state.leased < PIPES_PER_LINK => Pipe::new()
                .inspect_err(|e| tracing::debug!(error = %e, "no pipe for cut-through"))
                .ok()?,
            None => return None,
        };
        state.leased += 1;
        Some(PipeLease {
            pipe: Some(pipe),
            pool: self.clone(),
            empty: true,
        })
    }
}

/// A pipe taken from a pool; back to it when dropped empty, closed when
/// dropped with bytes in it (a frame that was dropped or half sent).
pub struct PipeLease {
    pipe: Option<Pipe>,
    pool: PipePool,
    empty: bool,
}

impl PipeLease {
    fn pipe(&self) -> &Pipe {
        // Taken only in drop.
        self.pipe
            .as_ref()
            .expect("a lease holds its pipe until dropped")
    }

    /// Moves the `len` bytes the pipe holds into `to`.
    pub async fn empty_into(&mut self, to: &TcpStream, len: usize) -> std::io::Result<()> {
        self.pipe().empty_into(to, len).await?;
        self.empty = true;
        Ok(())
    }

    /// Reads the pipe's bytes out into user space.
    pub fn drain(&mut self) -> std::io::Result<Vec<u8>> {
        let bytes = self.pipe().drain()?;
        self.empty = true;
        Ok(bytes)
    }
}

impl Drop for PipeLease {
    fn drop(&mut self) {
        let mut state = self
            .pool
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.leased = state.leased.saturating_sub(1);
        if let Some(pipe) = self.pipe.take().filter(|_| self.empty) {
            state.free.push(pipe);
        }
    }
}

/// A frame read back out of a pipe, as the next link's pipeline takes it.
pub fn packet_of(raw: Vec<u8>) -> Result<Packet, String> {
    let (header, total) = frame::decode(&raw)
        .map_err(|e| e.to_string())?
        .ok_or("a spliced frame is incomplete")?;
    let payload = Bytes::from(raw).slice(HEADER_LEN..total);
    Packet::from_frame(&header, payload).map_err(|e| e.to_string())
}

/// The receiving half of a TCP link: frames from the peer go to [`Receiver::take`],
/// except large frames cut through to a transparent next link, whose payload
/// is spliced. Returns why it stopped.
pub(crate) async fn receive(reader: Reader, rx: Receiver) -> String {
    let Some(stream) = reader.tcp() else {
        return format!("link {}: cut-through needs a TCP connection", rx.link);
    };
    let mut buf = BytesMut::with_capacity(crate::link::READ_BUFFER);
    let mut small_reads = 0u32;
    loop {
        let header = match frame::decode_header(&buf) {
            Ok(h) => h,
            Err(e) => return format!("bad frame from peer of {}: {e}", rx.link),
        };
        let mut want = HEADER_LEN + PEEK;
        if let Some(header) = header {
            let total = header.frame_len();
            if buf.len() >= total {
                // A frame that could have been spliced but came in whole with a
                // bulk read: read the next ones in small steps, so that theirs
                // stay in the socket (a paced sender's frames arrive whole).
                if small_reads == 0
                    && splices(&header)
                    && next_hop_of(&buf[..total], header, &rx).is_some()
                {
                    small_reads = SMALL_READS_FOR;
                }
                let mut whole = buf.split_to(total);
                whole.advance(HEADER_LEN);
                let frame = Frame {
                    header,
                    payload: whole.freeze(),
                };
                if let Err(e) = rx.take(frame).await {
                    return e;
                }
                small_reads = small_reads.saturating_sub(1);
                continue;
            }
            let head = HEADER_LEN + PEEK;
            if splices(&header) {
                if buf.len() >= head {
                    match splice_through(stream, &mut buf, header, &rx).await {
                        Ok(true) => {
                            small_reads = SMALL_READS_FOR;
                            continue;
                        }
                        Ok(false) => want = total - buf.len() + head,
                        Err(e) => return e,
                    }
                } else {
                    want = head - buf.len();
                }
            } else {
                // The rest of this frame, and the head of the next.
                want = total - buf.len() + head;
            }
        }
        let want = if small_reads > 0 {
            want.max(1)
        } else {
            crate::link::READ_BUFFER
        };
        buf.reserve(want);
        if let Err(e) = stream.readable().await {
            return format!("reading from peer of {}: {e}", rx.link);
        }
        match stream.try_read_buf(&mut (&mut buf).limit(want)) {
            Ok(0) => return format!("peer of {} closed the connection", rx.link),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return format!("reading from peer of {}: {e}", rx.link),
        }
    }
}

/// Whether a frame with this header is spliced when its next link allows.
fn splices(header: &FrameHeader) -> bool {
    header.kind == FrameKind::Data
        && header.payload_len as usize >= SPLICE_MIN
        && mode() == Mode::Splice
        && !REFUSED.load(Relaxed)
}

/// The next hop of the data frame whose header and first bytes are `frame`,
/// if it cuts through; with the packet's offload metadata and the bytes of
/// the packet in `frame`.
fn next_hop_of<'a>(
    frame: &'a [u8],
    header: FrameHeader,
    rx: &Receiver,
) -> Option<(Hop, Offload, &'a [u8])> {
    let payload = frame.get(HEADER_LEN..)?;
    let (offload, packet) = if header.flags & FLAG_OFFLOAD != 0 {
        (
            Offload::from_wire(payload).ok()?,
            payload.get(OFFLOAD_LEN..)?,
        )
    } else {
        (Offload::default(), payload)
    };
    let hop = next_hop(&rx.routes, packet, header.label, header.hops)?;
    Some((hop, offload, packet))
}

/// Splices the frame whose header and first bytes are in `buf` (and nothing
/// after it) to its next hop, if that is a transparent link and a pipe is
/// free. False when the frame must be read as usual.
async fn splice_through(
    stream: &TcpStream,
    buf: &mut BytesMut,
    header: FrameHeader,
    rx: &Receiver,
) -> Result<bool, String> {
    let total = header.frame_len();
    let Some((hop, offload, packet)) = next_hop_of(buf, header, rx) else {
        return Ok(false);
    };
    let Some(mut lease) = rx.pipes.lease() else {
        return Ok(false);
    };
    let payload = &buf[HEADER_LEN..];
    let packet_len = total - HEADER_LEN - (payload.len() - packet.len());
    let (packets, bytes) = offload.wire_size_of(packet_len as u64, packet);
    let mut head = BytesMut::with_capacity(buf.len());
    frame::encode_header(
        &FrameHeader {
            hops: hop.hops,
            label: hop.label,
            ..header
        },
        &mut head,
    );
    head.put_slice(payload);
    if let Err(e) = lease.pipe().put(&head) {
        tracing::debug!(link = %rx.link, error = %e, "cut-through pipe refused the head");
        lease.drain().ok();
        return Ok(false);
    }
    lease.empty = false;
    if let Err(e) = lease.pipe().fill_from(stream, total - buf.len()).await {
        if let Some(errno) = e.raw_os_error().map(nix::errno::Errno::from_raw)
            && matches!(
                errno,
                nix::errno::Errno::EINVAL
                    | nix::errno::Errno::ENOSYS
                    | nix::errno::Errno::EOPNOTSUPP
            )
        {
            REFUSED.store(true, Relaxed);
            tracing::warn!(error = %e, "splice() of link sockets refused; transit frames are copied from now on");
        }
        return Err(format!("splicing from peer of {}: {e}", rx.link));
    }
    buf.clear();
    rx.counters.count_rx(packets, bytes);
    hop.link.send_direct(DirectFrame::Spliced {
        pipe: lease,
        len: total,
        packets,
        bytes,
    });
    Ok(true)
}

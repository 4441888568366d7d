//! Relays bytes between two TCP sockets in both directions with splice(2): socket →
//! pipe → socket, so the bytes never enter user space. Non-blocking splices are
//! driven by tokio's readiness of the sockets. Each direction ends on its own: when
//! one side stops sending, the other side's write half is shut down (half-close),
//! and the relay ends when both directions have.
//!
//! Where the kernel refuses to splice (EINVAL, ENOSYS, EOPNOTSUPP) or no pipe can be
//! had, that direction falls back to a copy loop; this is counted in
//! `nextmini_relay_splice_fallbacks_total` and logged as a warning. All of it goes
//! through nix's safe wrappers: no `unsafe` here.

use crate::pipe::{FLAGS, Pipe};
use nix::errno::Errno;
use nix::fcntl::splice;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tokio::io::Interest;
use tokio::net::TcpStream;

const COPY_BUFFER: usize = 64 * 1024;

/// Where the relay's figures go.
pub struct Meter<'a> {
    /// Bytes moved, both directions, added as they move.
    pub bytes: &'a AtomicU64,
    /// Directions that fell back to copying.
    pub fallbacks: &'a AtomicU64,
}

/// Bytes moved each way by a finished relay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    pub a_to_b: u64,
    pub b_to_a: u64,
}

/// Relays until both directions have ended. An error in either direction ends
/// both (the caller drops the sockets, which resets what is left).
pub async fn relay(a: &TcpStream, b: &TcpStream, meter: &Meter<'_>) -> io::Result<Moved> {
    let (a_to_b, b_to_a) = tokio::try_join!(pump(a, b, meter), pump(b, a, meter))?;
    Ok(Moved { a_to_b, b_to_a })
}

/// One direction, spliced where the kernel allows it.
async fn pump(from: &TcpStream, to: &TcpStream, meter: &Meter<'_>) -> io::Result<u64> {
    let pipe = match Pipe::new() {
        Ok(p) => p,
        Err(e) => {
            fall_back(meter, &e);
            return copy(from, to, meter.bytes).await;
        }
    };
    match splice_loop(from, to, &pipe, meter.bytes).await {
        Ok(n) => Ok(n),
        Err(Stop::Io(e)) => Err(e),
        Err(Stop::Refused { errno, moved }) => {
            fall_back(meter, &io::Error::from(errno));
            // Whatever reached the pipe before the refusal goes first.
            let stuck = pipe.drain()?;
            write_all(to, &stuck).await?;
            meter.bytes.fetch_add(stuck.len() as u64, Relaxed);
            Ok(moved + stuck.len() as u64 + copy(from, to, meter.bytes).await?)
        }
    }
}

fn fall_back(meter: &Meter<'_>, why: &io::Error) {
    meter.fallbacks.fetch_add(1, Relaxed);
    tracing::warn!(error = %why, "splice() refused; this direction of the relay copies through user space instead");
}

enum Stop {
    Io(io::Error),
    /// The kernel will not splice these descriptors; `moved` bytes went already.
    Refused {
        errno: Errno,
        moved: u64,
    },
}

impl From<io::Error> for Stop {
    fn from(e: io::Error) -> Stop {
        Stop::Io(e)
    }
}

fn refused(e: &io::Error) -> Option<Errno> {
    let errno = Errno::from_raw(e.raw_os_error()?);
    matches!(errno, Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP).then_some(errno)
}

async fn splice_loop(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &Pipe,
    bytes: &AtomicU64,
) -> Result<u64, Stop> {
    let mut moved = 0u64;
    loop {
        // The pipe is empty here, so EAGAIN means the socket has nothing to read.
        let n = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || {
                splice(from, None, &pipe.write, None, pipe.size, FLAGS).map_err(io::Error::from)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(match refused(&e) {
                        Some(errno) => Stop::Refused { errno, moved },
                        None => Stop::Io(e),
                    });
                }
            }
        };
        if n == 0 {
            shutdown_write(to);
            return Ok(moved);
        }
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                splice(&pipe.read, None, to, None, left, FLAGS).map_err(io::Error::from)
            }) {
                Ok(0) => return Err(Stop::Io(io::ErrorKind::WriteZero.into())),
                Ok(m) => {
                    left = left.saturating_sub(m);
                    moved += m as u64;
                    bytes.fetch_add(m as u64, Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(match refused(&e) {
                        Some(errno) => Stop::Refused { errno, moved },
                        None => Stop::Io(e),
                    });
                }
            }
        }
    }
}

/// One direction through a user-space buffer: the fallback, and what tests
/// compare splice against.
pub async fn copy(from: &TcpStream, to: &TcpStream, bytes: &AtomicU64) -> io::Result<u64> {
    let mut buf = vec![0u8; COPY_BUFFER];
    let mut moved = 0u64;
    loop {
        from.readable().await?;
        let n = match from.try_read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            shutdown_write(to);
            return Ok(moved);
        }
        write_all(to, &buf[..n]).await?;
        moved += n as u64;
        bytes.fetch_add(n as u64, Relaxed);
    }
}

async fn write_all(to: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        to.writable().await?;
        match to.try_write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Passes an end of stream on: the peer of `to` reads EOF, and may still send.
fn shutdown_write(to: &TcpStream) {
    if let Err(e) = nix::sys::socket::shutdown(to.as_raw_fd(), nix::sys::socket::Shutdown::Write) {
        tracing::debug!(error = %e, "shutdown(SHUT_WR) of a relayed socket failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn data(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// client ⇄ [a | relay | b] ⇄ server: both directions, then half-closes.
    #[tokio::test]
    async fn relays_both_directions_and_half_closes() {
        let (mut client, a) = crate::pipe::loopback_pair().await;
        let (b, mut server) = crate::pipe::loopback_pair().await;
        let bytes = AtomicU64::new(0);
        let fallbacks = AtomicU64::new(0);
        let up = data(3 << 20, 1);
        let down = data(5 << 20, 2);
        let relay = async {
            let meter = Meter {
                bytes: &bytes,
                fallbacks: &fallbacks,
            };
            relay(&a, &b, &meter).await.expect("relay")
        };
        let client_side = async {
            client.write_all(&up).await.expect("client writes");
            client.shutdown().await.expect("client half-closes");
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.expect("client reads");
            got
        };
        let server_side = async {
            let mut got = Vec::new();
            // EOF arrives only through the relay's half-close.
            server.read_to_end(&mut got).await.expect("server reads");
            server
                .write_all(&down)
                .await
                .expect("server writes after EOF");
            server.shutdown().await.expect("server closes");
            got
        };
        let (moved, at_client, at_server) = tokio::join!(relay, client_side, server_side);
        assert!(at_server == up, "client → server bytes differ");
        assert!(at_client == down, "server → client bytes differ");
        assert_eq!(
            moved,
            Moved {
                a_to_b: up.len() as u64,
                b_to_a: down.len() as u64
            }
        );
        assert_eq!(bytes.load(Relaxed), (up.len() + down.len()) as u64);
        assert_eq!(fallbacks.load(Relaxed), 0, "TCP to TCP splices");
    }

    #[tokio::test]
    async fn copy_fallback_moves_the_same_bytes() {
        let (mut client, a) = crate::pipe::loopback_pair().await;
        let (b, mut server) = crate::pipe::loopback_pair().await;
        let bytes = AtomicU64::new(0);
        let up = data(1 << 20, 3);
        let (moved, _, got) = tokio::join!(
            async { copy(&a, &b, &bytes).await.expect("copy") },
            async {
                client.write_all(&up).await.expect("write");
                client.shutdown().await.expect("half-close");
            },
            async {
                let mut got = Vec::new();
                server.read_to_end(&mut got).await.expect("read");
                got
            }
        );
        assert!(got == up);
        assert_eq!(moved, up.len() as u64);
        assert_eq!(bytes.load(Relaxed), up.len() as u64);
    }

    #[tokio::test]
    async fn a_reset_ends_the_relay() {
        let (client, a) = crate::pipe::loopback_pair().await;
        let (b, server) = crate::pipe::loopback_pair().await;
        let bytes = AtomicU64::new(0);
        let fallbacks = AtomicU64::new(0);
        // SO_LINGER 0: closing sends a reset.
        client.set_zero_linger().expect("linger");
        drop(client);
        let meter = Meter {
            bytes: &bytes,
            fallbacks: &fallbacks,
        };
        let result = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            // The server side stays open: only the reset may end the relay.
            let _server = &server;
            relay(&a, &b, &meter).await
        })
        .await
        .expect("the relay ends");
        assert!(result.is_err(), "a reset is an error: {result:?}");
    }
}

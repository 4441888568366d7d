//! A kernel pipe for splice(2), and moving an exact number of bytes through it
//! between TCP sockets. The bytes stay in kernel pages: splice from a socket
//! takes references to the received buffers, splice to a socket hands them on.
//! Non-blocking splices are driven by tokio's readiness of the sockets; all of
//! it goes through nix's safe wrappers.

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use std::io;
use std::os::fd::OwnedFd;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Pipe capacity asked for (Linux's default limit for unprivileged processes).
/// A pipe holds one buffer per page fragment, and a 64 KiB frame arriving in
/// small segments needs more than the default 16 of them.
const PIPE_SIZE: i32 = 1 << 20;
const DRAIN_BUFFER: usize = 64 * 1024;

pub(crate) const FLAGS: SpliceFFlags =
    SpliceFFlags::SPLICE_F_MOVE.union(SpliceFFlags::SPLICE_F_NONBLOCK);

pub(crate) struct Pipe {
    pub(crate) read: OwnedFd,
    pub(crate) write: OwnedFd,
    pub(crate) size: usize,
}

impl Pipe {
    pub(crate) fn new() -> io::Result<Pipe> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        // A bigger pipe moves more per call; the default (64 KiB) works too.
        let size = fcntl(&write, FcntlArg::F_SETPIPE_SZ(PIPE_SIZE))
            .ok()
            .and_then(|s| usize::try_from(s).ok())
            .unwrap_or(64 * 1024);
        Ok(Pipe { read, write, size })
    }

    /// Reads out what is left in the pipe.
    pub(crate) fn drain(&self) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; DRAIN_BUFFER];
        loop {
            match nix::unistd::read(&self.read, &mut buf) {
                Ok(0) | Err(Errno::EAGAIN) => return Ok(out),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Copies `data` into the empty pipe; it must fit (a frame's head does).
    pub(crate) fn put(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            match nix::unistd::write(&self.write, data) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => data = &data[n..],
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Moves exactly `len` bytes from the socket into the pipe, waiting for
    /// them to arrive. The pipe must have room for them.
    pub(crate) async fn fill_from(&self, from: &TcpStream, len: usize) -> io::Result<()> {
        let eof = io::ErrorKind::UnexpectedEof;
        exactly(from, Interest::READABLE, len, eof, |left| {
            splice(from, None, &self.write, None, left, FLAGS)
        })
        .await
    }

    /// Moves exactly `len` bytes from the pipe into the socket.
    pub(crate) async fn empty_into(&self, to: &TcpStream, len: usize) -> io::Result<()> {
        let full = io::ErrorKind::WriteZero;
        exactly(to, Interest::WRITABLE, len, full, |left| {
            splice(&self.read, None, to, None, left, FLAGS)
        })
        .await
    }
}

/// Runs `step` (a splice of at most the bytes left) whenever `socket` is
/// ready for `interest`, until `len` bytes have moved; a step that moves
/// nothing ends it with `stuck`.
async fn exactly(
    socket: &TcpStream,
    interest: Interest,
    mut len: usize,
    stuck: io::ErrorKind,
    mut step: impl FnMut(usize) -> nix::Result<usize>,
) -> io::Result<()> {
    while len > 0 {
        socket.ready(interest).await?;
        match socket.try_io(interest, || step(len).map_err(io::Error::from)) {
            Ok(0) => return Err(stuck.into()),
            Ok(n) => len = len.saturating_sub(n),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A connected pair of TCP sockets over loopback, for tests.
#[cfg(test)]
pub(crate) async fn loopback_pair() -> (TcpStream, TcpStream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
    (client.expect("connect"), accepted.expect("accept").0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A head written into the pipe, then exactly `len` bytes spliced from one
    /// socket, come out of the other socket in order; the bytes after them stay
    /// in the first socket for the next reader.
    #[tokio::test]
    async fn moves_exact_counts_between_sockets_behind_a_head() {
        let (mut sender, inbound) = loopback_pair().await;
        let (outbound, mut receiver) = loopback_pair().await;
        let body: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        sender.write_all(&body).await.expect("send");
        let pipe = Pipe::new().expect("pipe");
        let len = 60_000;
        pipe.put(b"head").expect("head");
        pipe.fill_from(&inbound, len).await.expect("fill");
        pipe.empty_into(&outbound, 4 + len).await.expect("empty");
        assert!(pipe.drain().expect("drain").is_empty(), "the pipe is empty");
        let mut got = vec![0u8; 4 + len];
        receiver.read_exact(&mut got).await.expect("receive");
        assert_eq!(&got[..4], b"head");
        assert!(got[4..] == body[..len], "spliced bytes differ");
        let mut rest = vec![0u8; body.len() - len];
        let mut inbound = inbound;
        inbound.read_exact(&mut rest).await.expect("rest");
        assert!(
            rest == body[len..],
            "bytes after the count stay in the socket"
        );
    }
}

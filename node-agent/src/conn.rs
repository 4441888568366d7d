//! A link's byte stream, whatever carries it: a TCP connection or one
//! bidirectional QUIC stream. Frames are the same on both; only TCP halves can
//! be spliced (`crate::cut_through`), so the halves keep their kind.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

pub enum Reader {
    Tcp(OwnedReadHalf),
    Quic(quinn::RecvStream),
}

pub enum Writer {
    Tcp(OwnedWriteHalf),
    Quic(quinn::SendStream),
}

impl Reader {
    /// The TCP socket under this half, if it is one.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Reader::Tcp(half) => Some(half.as_ref()),
            Reader::Quic(_) => None,
        }
    }
}

impl Writer {
    /// The TCP socket under this half, if it is one.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Writer::Tcp(half) => Some(half.as_ref()),
            Writer::Quic(_) => None,
        }
    }
}

impl AsyncRead for Reader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Reader::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            Reader::Quic(r) => AsyncRead::poll_read(Pin::new(r), cx, buf),
        }
    }
}

impl AsyncWrite for Writer {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Writer::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            Writer::Quic(w) => AsyncWrite::poll_write(Pin::new(w), cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Writer::Tcp(w) => Pin::new(w).poll_flush(cx),
            Writer::Quic(w) => AsyncWrite::poll_flush(Pin::new(w), cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Writer::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            Writer::Quic(w) => AsyncWrite::poll_shutdown(Pin::new(w), cx),
        }
    }
}

pub struct Conn {
    pub reader: Reader,
    pub writer: Writer,
    /// Keeps a QUIC connection open while its stream is in use.
    pub _quic: Option<quinn::Connection>,
}

impl Conn {
    pub fn tcp(stream: TcpStream) -> Conn {
        let (r, w) = stream.into_split();
        Conn {
            reader: Reader::Tcp(r),
            writer: Writer::Tcp(w),
            _quic: None,
        }
    }

    pub fn quic(
        connection: quinn::Connection,
        send: quinn::SendStream,
        recv: quinn::RecvStream,
    ) -> Conn {
        Conn {
            reader: Reader::Quic(recv),
            writer: Writer::Quic(send),
            _quic: Some(connection),
        }
    }
}

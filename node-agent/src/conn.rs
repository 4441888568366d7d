//! A link's byte stream, whatever carries it: a TCP connection or one
//! bidirectional QUIC stream. Frames are the same on both.

use tokio::io::{AsyncRead, AsyncWrite};

pub type Reader = Box<dyn AsyncRead + Send + Unpin>;
pub type Writer = Box<dyn AsyncWrite + Send + Unpin>;

pub struct Conn {
    pub reader: Reader,
    pub writer: Writer,
    /// Keeps a QUIC connection open while its stream is in use.
    pub _quic: Option<quinn::Connection>,
}

impl Conn {
    pub fn tcp(stream: tokio::net::TcpStream) -> Conn {
        let (r, w) = stream.into_split();
        Conn {
            reader: Box::new(r),
            writer: Box::new(w),
            _quic: None,
        }
    }

    pub fn quic(
        connection: quinn::Connection,
        send: quinn::SendStream,
        recv: quinn::RecvStream,
    ) -> Conn {
        Conn {
            reader: Box::new(recv),
            writer: Box::new(send),
            _quic: Some(connection),
        }
    }
}

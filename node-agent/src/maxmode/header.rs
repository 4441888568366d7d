//! The header a max-mode hop sends first on its connection to the next hop's relay:
//! where the connection finally goes, and proof that the sender belongs to the
//! topology. Pure codec, no I/O.
//!
//! ```text
//! magic "NMX1" | version u8 | hops u16 | label u32 | src ip[4] port u16 | dst ip[4] port u16 | tag[40]
//! ```
//!
//! The tag is the link handshake's ([`crate::link_auth`]): a signing time and an
//! HMAC-SHA256 over it and the 23 bytes before it, keyed with the topology's link
//! key. The answer to a header is one byte, a SOCKS5 reply code (0: the path to the
//! destination is open), after which the connection carries the relayed bytes.

use crate::link_auth::{AuthError, LinkKey, TAG_LEN};
use std::net::{Ipv4Addr, SocketAddrV4};
use thiserror::Error;

pub const MAGIC: [u8; 4] = *b"NMX1";
/// Version 2 widened `hops` to 16 bits with the link frames (see `hop_limit.rs`).
pub const VERSION: u8 = 2;
/// The signed part.
pub const BODY_LEN: usize = 23;
/// What a hop reads before anything else.
pub const HEADER_LEN: usize = BODY_LEN + TAG_LEN;

/// What every hop of a max-mode connection needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxHeader {
    /// Relays crossed before the receiver.
    pub hops: u16,
    /// Route id of an explicit path being followed (0: route by destination).
    pub label: u32,
    /// The connection's origin in the overlay (the SOCKS node and the client's
    /// port), which flow rules and multipath hashing see.
    pub src: SocketAddrV4,
    /// The final destination in the overlay.
    pub dst: SocketAddrV4,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HeaderError {
    #[error("{0} bytes are not a max-mode header ({HEADER_LEN} bytes)")]
    Length(usize),
    #[error("not a max-mode header (bad magic)")]
    Magic,
    #[error("max-mode header version {0} (this agent speaks {VERSION})")]
    Version(u8),
    #[error("{0}")]
    Auth(#[from] AuthError),
}

impl MaxHeader {
    pub fn encode_body(&self) -> [u8; BODY_LEN] {
        let mut b = [0u8; BODY_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5..7].copy_from_slice(&self.hops.to_be_bytes());
        b[7..11].copy_from_slice(&self.label.to_be_bytes());
        b[11..15].copy_from_slice(&self.src.ip().octets());
        b[15..17].copy_from_slice(&self.src.port().to_be_bytes());
        b[17..21].copy_from_slice(&self.dst.ip().octets());
        b[21..23].copy_from_slice(&self.dst.port().to_be_bytes());
        b
    }

    /// The body and its tag, as sent.
    pub fn seal(&self, key: &LinkKey, now_ms: u64) -> [u8; HEADER_LEN] {
        let body = self.encode_body();
        let mut out = [0u8; HEADER_LEN];
        out[..BODY_LEN].copy_from_slice(&body);
        out[BODY_LEN..].copy_from_slice(&key.sign(&body, now_ms));
        out
    }

    /// Reads the body only (no authentication): the pure parser.
    pub fn decode_body(buf: &[u8]) -> Result<MaxHeader, HeaderError> {
        let b: &[u8; BODY_LEN] = buf
            .get(..BODY_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(HeaderError::Length(buf.len()))?;
        if b[..4] != MAGIC {
            return Err(HeaderError::Magic);
        }
        if b[4] != VERSION {
            return Err(HeaderError::Version(b[4]));
        }
        let addr = |at: usize| {
            SocketAddrV4::new(
                Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3]),
                u16::from_be_bytes([b[at + 4], b[at + 5]]),
            )
        };
        Ok(MaxHeader {
            hops: u16::from_be_bytes([b[5], b[6]]),
            label: u32::from_be_bytes([b[7], b[8], b[9], b[10]]),
            src: addr(11),
            dst: addr(17),
        })
    }

    /// Reads and authenticates a whole header (exactly [`HEADER_LEN`] bytes).
    pub fn open(buf: &[u8], key: &LinkKey, now_ms: u64) -> Result<MaxHeader, HeaderError> {
        if buf.len() != HEADER_LEN {
            return Err(HeaderError::Length(buf.len()));
        }
        let header = MaxHeader::decode_body(buf)?;
        key.verify(&buf[..BODY_LEN], &buf[BODY_LEN..], now_ms)?;
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> MaxHeader {
        MaxHeader {
            hops: 1,
            label: 7,
            src: "198.18.0.1:40000".parse().expect("addr"),
            dst: "198.18.0.3:8000".parse().expect("addr"),
        }
    }

    #[test]
    fn round_trip_and_layout() {
        let key = LinkKey::from_identity(b"topology key").expect("key");
        let sealed = header().seal(&key, 1_000_000);
        assert_eq!(sealed.len(), HEADER_LEN);
        assert_eq!(&sealed[..4], b"NMX1");
        assert_eq!(&sealed[5..7], &[0, 1], "hops");
        assert_eq!(&sealed[7..11], &[0, 0, 0, 7], "label");
        assert_eq!(&sealed[17..23], &[198, 18, 0, 3, 0x1f, 0x40], "destination");
        assert_eq!(MaxHeader::open(&sealed, &key, 1_000_100), Ok(header()));
        assert_eq!(MaxHeader::decode_body(&sealed[..BODY_LEN]), Ok(header()));
    }

    #[test]
    fn refuses_forgeries_other_topologies_and_garbage() {
        let key = LinkKey::from_identity(b"topology key").expect("key");
        let other = LinkKey::from_identity(b"another topology").expect("key");
        let sealed = header().seal(&key, 1_000_000);
        assert_eq!(
            MaxHeader::open(&sealed, &other, 1_000_000),
            Err(HeaderError::Auth(AuthError::BadMac))
        );
        let mut redirected = sealed;
        redirected[20] = 9; // another destination, same tag
        assert_eq!(
            MaxHeader::open(&redirected, &key, 1_000_000),
            Err(HeaderError::Auth(AuthError::BadMac))
        );
        assert!(matches!(
            MaxHeader::open(&sealed, &key, 1_000_000 + 31_000),
            Err(HeaderError::Auth(AuthError::Stale(_)))
        ));
        assert_eq!(
            MaxHeader::open(&sealed[..HEADER_LEN - 1], &key, 1_000_000),
            Err(HeaderError::Length(HEADER_LEN - 1))
        );
        let mut magic = sealed;
        magic[0] = b'X';
        assert_eq!(MaxHeader::decode_body(&magic), Err(HeaderError::Magic));
        let mut version = sealed;
        version[4] = 1;
        assert_eq!(
            MaxHeader::decode_body(&version),
            Err(HeaderError::Version(1))
        );
        assert_eq!(MaxHeader::decode_body(&[]), Err(HeaderError::Length(0)));
    }
}

//! Link handshake authentication: a dialer proves it belongs to the topology by
//! appending a MAC of its handshake, keyed with a secret every agent of the
//! topology derives from the topology's link identity (sent in its snapshot).
//! Names alone are public; without the key, an agent of another topology (or
//! anything else on the underlay) cannot attach itself to a link. QUIC links are
//! also authenticated by TLS with the same identity.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Bytes appended to the handshake: the signing time (ms since the Unix epoch)
/// and the MAC over that time and the handshake.
pub const TAG_LEN: usize = 8 + 32;
/// Handshakes older or newer than this are refused, which bounds replays.
pub const MAX_SKEW_MS: u64 = 30_000;

#[derive(Clone)]
pub struct LinkKey([u8; 32]);

impl std::fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkKey(..)")
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("the handshake carries no authentication tag")]
    Missing,
    #[error("the handshake's authentication tag is wrong (another topology, or forged)")]
    BadMac,
    #[error("the handshake was signed {0} ms away from now (more than {MAX_SKEW_MS} ms)")]
    Stale(u64),
}

impl LinkKey {
    /// Derives the topology's link key from its identity's private key; `None`
    /// when the snapshot carries no identity.
    pub fn from_identity(key_der: &[u8]) -> Option<LinkKey> {
        if key_der.is_empty() {
            return None;
        }
        let mut h = Sha256::new();
        h.update(b"nextmini link auth v1\0");
        h.update(key_der);
        Some(LinkKey(h.finalize().into()))
    }

    fn mac(&self, hello: &[u8], unix_ms: u64) -> HmacSha256 {
        // HMAC takes keys of any length; a 32-byte key cannot fail.
        let mut mac =
            <HmacSha256 as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!());
        mac.update(&unix_ms.to_be_bytes());
        mac.update(hello);
        mac
    }

    /// The tag to append to `hello`.
    pub fn sign(&self, hello: &[u8], unix_ms: u64) -> [u8; TAG_LEN] {
        let mut out = [0u8; TAG_LEN];
        out[..8].copy_from_slice(&unix_ms.to_be_bytes());
        out[8..].copy_from_slice(&self.mac(hello, unix_ms).finalize().into_bytes());
        out
    }

    /// Checks `tag` (constant time) and its freshness against `now_ms`.
    pub fn verify(&self, hello: &[u8], tag: &[u8], now_ms: u64) -> Result<(), AuthError> {
        let (Some(time), Some(mac)) = (tag.get(..8), tag.get(8..TAG_LEN)) else {
            return Err(AuthError::Missing);
        };
        let mut ts = [0u8; 8];
        ts.copy_from_slice(time);
        let signed = u64::from_be_bytes(ts);
        self.mac(hello, signed)
            .verify_slice(mac)
            .map_err(|_| AuthError::BadMac)?;
        let skew = signed.abs_diff(now_ms);
        if skew > MAX_SKEW_MS {
            return Err(AuthError::Stale(skew));
        }
        Ok(())
    }
}

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_topologys_key_verifies() {
        let key = LinkKey::from_identity(b"topology A's private key").expect("key");
        let other = LinkKey::from_identity(b"topology B's private key").expect("key");
        let hello = b"line3/a-b/a";
        let tag = key.sign(hello, 1_000_000);
        assert_eq!(key.verify(hello, &tag, 1_000_500), Ok(()));
        assert_eq!(other.verify(hello, &tag, 1_000_500), Err(AuthError::BadMac));
        assert_eq!(
            key.verify(b"line3/a-b/z", &tag, 1_000_500),
            Err(AuthError::BadMac)
        );
        assert_eq!(
            key.verify(hello, &tag[..20], 1_000_500),
            Err(AuthError::Missing)
        );
        assert_eq!(
            key.verify(hello, &tag, 1_000_000 + MAX_SKEW_MS + 1),
            Err(AuthError::Stale(MAX_SKEW_MS + 1))
        );
        let mut forged = tag;
        forged[7] ^= 1;
        assert_eq!(
            key.verify(hello, &forged, 1_000_500),
            Err(AuthError::BadMac),
            "the time is covered by the MAC"
        );
        assert!(LinkKey::from_identity(b"").is_none());
    }
}

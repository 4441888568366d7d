//! What moves between the actors of the dataplane.

use bytes::Bytes;

/// An IP packet on its way through this node.
#[derive(Debug, Clone)]
pub struct Packet {
    pub data: Bytes,
    /// Route id from the link frame (0 = route by destination address).
    pub label: u32,
    /// Transit hops so far; bounded to catch routing loops.
    pub hops: u8,
}

impl Packet {
    pub fn from_tun(data: Bytes) -> Packet {
        Packet {
            data,
            label: 0,
            hops: 0,
        }
    }
}

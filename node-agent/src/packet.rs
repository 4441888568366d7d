//! What moves between the actors of the dataplane.

use crate::offload::Offload;
use bytes::Bytes;

/// An IP packet on its way through this node.
#[derive(Debug, Clone)]
pub struct Packet {
    pub data: Bytes,
    /// Route id from the link frame (0 = route by destination address).
    pub label: u32,
    /// Transit hops so far; bounded to catch routing loops.
    pub hops: u16,
    /// What the sending kernel left undone: a super-packet still to be cut into
    /// segments, or a checksum still to be finished. Default: nothing.
    pub offload: Offload,
}

impl Packet {
    pub fn from_tun(data: Bytes) -> Packet {
        Packet::offloaded(data, Offload::default())
    }

    /// A packet read from an offloading TUN device, with the kernel's header.
    pub fn offloaded(data: Bytes, offload: Offload) -> Packet {
        Packet {
            data,
            label: 0,
            hops: 0,
            offload,
        }
    }
}

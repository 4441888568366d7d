//! What moves between the actors of the dataplane.

use crate::frame::{FLAG_OFFLOAD, FrameHeader};
use crate::offload::{Offload, OffloadError};
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

    /// The packet a data frame carries, with the offload metadata the frame
    /// has before it when its flag says so.
    pub fn from_frame(header: &FrameHeader, payload: Bytes) -> Result<Packet, OffloadError> {
        let (offload, data) = if header.flags & FLAG_OFFLOAD != 0 {
            Offload::split_wire(payload)?
        } else {
            (Offload::default(), payload)
        };
        Ok(Packet {
            data,
            label: header.label,
            hops: header.hops,
            offload,
        })
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

//! The virtual device between smoltcp and the dataplane: IP packets in both
//! directions, no link layer, no kernel. Received packets are queued by the
//! stack (from the processors); transmitted ones collect in an outbox that the
//! stack hands to the processors after each poll.

use bytes::Bytes;
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use std::collections::VecDeque;

pub struct VirtualDevice {
    mtu: usize,
    rx: VecDeque<Bytes>,
    tx: Vec<Vec<u8>>,
}

impl VirtualDevice {
    pub fn new(mtu: usize) -> VirtualDevice {
        VirtualDevice {
            mtu,
            rx: VecDeque::new(),
            tx: Vec::new(),
        }
    }

    /// Queues a packet for the stack's next poll.
    pub fn push_rx(&mut self, packet: Bytes) {
        self.rx.push_back(packet);
    }

    pub fn rx_queued(&self) -> usize {
        self.rx.len()
    }

    /// Packets waiting to be received, for a look before smoltcp sees them.
    pub fn rx_iter(&self) -> impl Iterator<Item = &Bytes> {
        self.rx.iter()
    }

    /// What smoltcp transmitted since the last call.
    pub fn take_tx(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.tx)
    }
}

pub struct RxToken(Bytes);

impl phy::RxToken for RxToken {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        f(&self.0)
    }
}

pub struct TxToken<'a>(&'a mut Vec<Vec<u8>>);

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let mut buf = vec![0u8; len];
        let r = f(&mut buf);
        self.0.push(buf);
        r
    }
}

impl phy::Device for VirtualDevice {
    type RxToken<'a> = RxToken;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _: Instant) -> Option<(RxToken, TxToken<'_>)> {
        let packet = self.rx.pop_front()?;
        Some((RxToken(packet), TxToken(&mut self.tx)))
    }

    fn transmit(&mut self, _: Instant) -> Option<TxToken<'_>> {
        // Never refuses: smoltcp walks its sockets in the same order on every
        // poll, so a budget here would let the first ones starve the rest. The
        // driver paces the hand-over to the processors instead.
        Some(TxToken(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = self.mtu;
        // Checksums stay on both ways: links may corrupt packets on purpose.
        caps
    }
}

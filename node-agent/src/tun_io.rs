//! The node's TUN device: unmodified applications in the node's namespace send
//! real IP packets to it; the reader hands them to the processors, the writer
//! delivers packets addressed to this node.
//!
//! With offload on (the default, see `offload.rs`), every read and write carries
//! a virtio-net header: the kernel hands over TCP super-packets of up to 64 KiB
//! instead of MTU-sized segments, and takes them back the same way.

use crate::counters::NodeCounters;
use crate::frame::MAX_PACKET;
use crate::node_side::NodeSide;
use crate::offload::{self, Offload, VNET_LEN};
use crate::packet::Packet;
use crate::processor::Processors;
use bytes::{Bytes, BytesMut};
use std::io::IoSlice;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use tokio::sync::mpsc;
use tun_rs::{AsyncDevice, DeviceBuilder};

const TUN_WRITE_QUEUE: usize = 1024;
/// Packets the writer takes from its queue per wake-up.
const WRITE_BATCH: usize = 64;

/// The device, and whether reads and writes carry virtio-net headers.
#[derive(Clone)]
pub struct Tun {
    pub device: Arc<AsyncDevice>,
    pub offload: bool,
}

/// Creates the device. Offload is asked for when `offload` is set; a kernel
/// that refuses it gets a plain device, which works the same, only slower.
pub fn create(
    name: &str,
    addr: Ipv4Addr,
    prefix_len: u8,
    mtu: u16,
    offload: bool,
) -> std::io::Result<Tun> {
    let build = |offload: bool| {
        let device = DeviceBuilder::new()
            .name(name)
            .ipv4(addr, prefix_len, None)
            .mtu(mtu)
            .offload(offload)
            .enable(false)
            .build_async()?;
        up_without_ipv6(name, device.if_index(), || device.enabled(true))?;
        Ok::<_, std::io::Error>(device)
    };
    if offload {
        match build(true) {
            Ok(device) => {
                return Ok(Tun {
                    device: Arc::new(device),
                    offload: true,
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, tun = name, "TUN offload refused; packets go one by one");
            }
        }
    }
    Ok(Tun {
        device: Arc::new(build(false)?),
        offload: false,
    })
}

/// Like [`create`], with the device made in the node's namespace (which may
/// not be the caller's: see [`NodeSide`]).
pub async fn create_on(
    side: &NodeSide,
    name: &str,
    addr: Ipv4Addr,
    prefix_len: u8,
    mtu: u16,
    offload: bool,
) -> std::io::Result<Tun> {
    if !side.is_thread() {
        return create(name, addr, prefix_len, mtu, offload);
    }
    let name = name.to_string();
    let (device, offload) = side
        .run(move || {
            let build = |offload: bool| {
                let device = DeviceBuilder::new()
                    .name(&name)
                    .ipv4(addr, prefix_len, None)
                    .mtu(mtu)
                    .offload(offload)
                    .enable(false)
                    .build_sync()?;
                up_without_ipv6(&name, device.if_index(), || device.enabled(true))?;
                Ok::<_, std::io::Error>(device)
            };
            if offload {
                match build(true) {
                    Ok(device) => return Ok((device, true)),
                    Err(e) => {
                        tracing::warn!(error = %e, tun = %name, "TUN offload refused; packets go one by one");
                    }
                }
            }
            build(false).map(|device| (device, false))
        })
        .await??;
    // Registered with this runtime's reactor here; the device stays where it was made.
    Ok(Tun {
        device: Arc::new(AsyncDevice::new(device)?),
        offload,
    })
}

/// Brings the device up, told first to take no IPv6 address (see
/// [`crate::tun_ipv6`]). A kernel that refuses (no IPv6 at all) leaves nothing
/// to keep quiet.
fn up_without_ipv6(
    name: &str,
    index: std::io::Result<u32>,
    up: impl FnOnce() -> std::io::Result<()>,
) -> std::io::Result<()> {
    if let Err(e) = index.and_then(crate::tun_ipv6::no_addresses) {
        tracing::debug!(error = %e, tun = name, "TUN device keeps IPv6 addressing");
    }
    up()
}

pub fn spawn_reader(tun: Tun, processors: Processors, mtu: u16, counters: Arc<NodeCounters>) {
    tokio::spawn(async move {
        // A super-packet can be as large as the largest IP packet.
        let len = if tun.offload {
            VNET_LEN + MAX_PACKET
        } else {
            usize::from(mtu) + 64
        };
        let mut buf = vec![0u8; len];
        loop {
            let packet = match tun.device.recv(&mut buf).await {
                Ok(n) if tun.offload => {
                    let Some((header, data)) = buf[..n].split_first_chunk::<VNET_LEN>() else {
                        continue;
                    };
                    if data.is_empty() {
                        continue;
                    }
                    let offload = Offload::from_vnet(header);
                    let (segments, _) = offload.wire_size(data);
                    counters.tun_rx_packets.fetch_add(segments, Relaxed);
                    if offload.is_gso() {
                        counters.tun_rx_super.fetch_add(1, Relaxed);
                    }
                    Packet::offloaded(Bytes::copy_from_slice(data), offload)
                }
                Ok(0) => continue,
                Ok(n) => {
                    counters.tun_rx_packets.fetch_add(1, Relaxed);
                    Packet::from_tun(Bytes::copy_from_slice(&buf[..n]))
                }
                Err(e) => {
                    tracing::error!(error = %e, "TUN read failed; reader stops");
                    return;
                }
            };
            processors.dispatch(packet).await;
        }
    });
}

pub fn spawn_writer(tun: Tun, counters: Arc<NodeCounters>) -> mpsc::Sender<Packet> {
    let (tx, mut rx) = mpsc::channel::<Packet>(TUN_WRITE_QUEUE);
    tokio::spawn(async move {
        let mut batch = Vec::with_capacity(WRITE_BATCH);
        while rx.recv_many(&mut batch, WRITE_BATCH).await > 0 {
            for packet in batch.drain(..) {
                write(&tun, packet, &counters).await;
            }
        }
    });
    tx
}

async fn write(tun: &Tun, packet: Packet, counters: &NodeCounters) {
    if tun.offload {
        // The kernel finishes whatever the header says is left to do.
        let header = packet.offload.to_vnet();
        let (segments, _) = packet.offload.wire_size(&packet.data);
        let parts = [IoSlice::new(&header), IoSlice::new(&packet.data)];
        match tun.device.send_vectored(&parts).await {
            Ok(_) => {
                counters.tun_tx_packets.fetch_add(segments, Relaxed);
                if packet.offload.is_gso() {
                    counters.tun_tx_super.fetch_add(1, Relaxed);
                }
            }
            Err(e) => tracing::warn!(error = %e, "TUN write failed"),
        }
        return;
    }
    // A device without offload takes only finished packets.
    let mut finished = Vec::new();
    let data = packet
        .data
        .try_into_mut()
        .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
    if let Err(e) = offload::finish(data, packet.offload, &mut |p| finished.push(p)) {
        counters.malformed.fetch_add(1, Relaxed);
        tracing::debug!(error = %e, "offloaded packet dropped");
        return;
    }
    for p in finished {
        match tun.device.send(&p).await {
            Ok(_) => {
                counters.tun_tx_packets.fetch_add(1, Relaxed);
            }
            Err(e) => tracing::warn!(error = %e, "TUN write failed"),
        }
    }
}

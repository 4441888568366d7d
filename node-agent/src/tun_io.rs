//! The node's TUN device: unmodified applications in the node's namespace send
//! real IP packets to it; the reader hands them to the processors, the writer
//! delivers packets addressed to this node.

use crate::counters::NodeCounters;
use crate::node_side::NodeSide;
use crate::packet::Packet;
use crate::processor::Processors;
use bytes::Bytes;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use tokio::sync::mpsc;
use tun_rs::{AsyncDevice, DeviceBuilder};

const TUN_WRITE_QUEUE: usize = 1024;

pub fn create(
    name: &str,
    addr: Ipv4Addr,
    prefix_len: u8,
    mtu: u16,
) -> std::io::Result<Arc<AsyncDevice>> {
    let device = DeviceBuilder::new()
        .name(name)
        .ipv4(addr, prefix_len, None)
        .mtu(mtu)
        .build_async()?;
    Ok(Arc::new(device))
}

/// Like [`create`], with the device made in the node's namespace (which may
/// not be the caller's: see [`NodeSide`]).
pub async fn create_on(
    side: &NodeSide,
    name: &str,
    addr: Ipv4Addr,
    prefix_len: u8,
    mtu: u16,
) -> std::io::Result<Arc<AsyncDevice>> {
    if !side.is_thread() {
        return create(name, addr, prefix_len, mtu);
    }
    let name = name.to_string();
    let device = side
        .run(move || {
            DeviceBuilder::new()
                .name(name)
                .ipv4(addr, prefix_len, None)
                .mtu(mtu)
                .build_sync()
        })
        .await??;
    // Registered with this runtime's reactor here; the device stays where it was made.
    Ok(Arc::new(AsyncDevice::new(device)?))
}

pub fn spawn_reader(
    device: Arc<AsyncDevice>,
    processors: Processors,
    mtu: u16,
    counters: Arc<NodeCounters>,
) {
    tokio::spawn(async move {
        let mut buf = vec![0u8; usize::from(mtu) + 64];
        loop {
            match device.recv(&mut buf).await {
                Ok(0) => continue,
                Ok(n) => {
                    counters.tun_rx_packets.fetch_add(1, Relaxed);
                    let packet = Packet::from_tun(Bytes::copy_from_slice(&buf[..n]));
                    processors.dispatch(packet).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "TUN read failed; reader stops");
                    return;
                }
            }
        }
    });
}

pub fn spawn_writer(device: Arc<AsyncDevice>, counters: Arc<NodeCounters>) -> mpsc::Sender<Bytes> {
    let (tx, mut rx) = mpsc::channel::<Bytes>(TUN_WRITE_QUEUE);
    tokio::spawn(async move {
        while let Some(packet) = rx.recv().await {
            match device.send(&packet).await {
                Ok(_) => {
                    counters.tun_tx_packets.fetch_add(1, Relaxed);
                }
                Err(e) => tracing::warn!(error = %e, "TUN write failed"),
            }
        }
    });
    tx
}

//! One instance of a max-mode flow: a kernel TCP connection through the max-mode
//! relays to the destination agent's sink, which answers how many bytes arrived
//! once the source has sent everything and closed its half. The instance's
//! completion time runs from the connect to that answer.

use super::stack::{Finished, FlowRef, Protocol};
use super::workload::InstanceAmount;
use crate::maxmode::SINK_PORT;
use crate::relay::Relay;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CHUNK: usize = 256 * 1024;
/// How long the sink may take to answer after the last byte was sent.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

pub struct MaxInstance {
    pub flow: FlowRef,
    pub instance: u32,
    pub peer: Ipv4Addr,
    pub label: u32,
    pub amount: InstanceAmount,
}

/// Runs the instance to its end; the result says how it went.
pub async fn run(relay: Arc<Relay>, instance: MaxInstance) -> Finished {
    let started = Instant::now();
    let here = relay.view.load().overlay.unwrap_or(Ipv4Addr::UNSPECIFIED);
    // Source ports as synthetic flows use them, so flow rules see the same ones.
    let span = u32::from(u16::MAX - SINK_PORT);
    let port = SINK_PORT + 1 + u16::try_from(instance.instance % span).unwrap_or(0);
    let outcome = send(
        &relay,
        SocketAddrV4::new(here, port),
        SocketAddrV4::new(instance.peer, SINK_PORT),
        &instance,
        started,
    )
    .await;
    let (bytes, finished, error) = match outcome {
        Ok((bytes, at)) => (bytes, Some(at), None),
        Err((bytes, why)) => (bytes, None, Some(why)),
    };
    Finished {
        flow: instance.flow,
        instance: instance.instance,
        protocol: Protocol::Tcp,
        size: instance.amount.bytes(),
        bytes,
        started,
        finished,
        retransmissions: 0,
        error,
    }
}

/// Bytes the sink confirmed and when, or what was sent and why it failed.
async fn send(
    relay: &Relay,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    instance: &MaxInstance,
    started: Instant,
) -> Result<(u64, Instant), (u64, String)> {
    let mut stream = crate::maxmode::open(relay, src, dst, instance.label)
        .await
        .map_err(|(_, why)| (0, why))?;
    let _active = relay.counters.connection(true);
    let zeros = vec![0u8; CHUNK];
    let deadline = match instance.amount {
        InstanceAmount::For(d) => Some(started + d),
        _ => None,
    };
    let mut left = instance.amount.bytes();
    let mut sent = 0u64;
    loop {
        let n = match left {
            Some(0) => break,
            Some(l) => usize::try_from(l).map_or(CHUNK, |l| l.min(CHUNK)),
            None => CHUNK,
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        stream
            .write_all(&zeros[..n])
            .await
            .map_err(|e| (sent, format!("sending: {e}")))?;
        sent += n as u64;
        relay.counters.bytes(true).fetch_add(n as u64, Relaxed);
        left = left.map(|l| l.saturating_sub(n as u64));
    }
    stream
        .shutdown()
        .await
        .map_err(|e| (sent, format!("closing: {e}")))?;
    let confirmed = tokio::time::timeout(ANSWER_TIMEOUT, stream.read_u64())
        .await
        .map_err(|_| (sent, "the sink did not answer".to_string()))?
        .map_err(|e| (sent, format!("reading the sink's answer: {e}")))?;
    let at = Instant::now();
    if confirmed != sent {
        return Err((
            confirmed,
            format!("sent {sent} bytes, the sink received {confirmed}"),
        ));
    }
    Ok((confirmed, at))
}

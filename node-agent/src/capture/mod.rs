//! Per-link capture (`nextmini capture`): the agent that sends a link direction
//! streams pcapng of what its emulation pipeline did to each packet. A request
//! names the link and its bounds; the agent attaches a tap to that link's
//! pipeline, encodes what the tap sees and ends the stream when the count or
//! the duration is reached, or when the reader goes away (the tap is detached
//! at the next packet). A link with no capture pays one branch per packet.

mod link_tap;
pub mod pcapng;

pub use link_tap::{CHANNEL_PACKETS, CapturedPacket, LinkTap, TapCounters};

use crate::listener::LinkMap;
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::sync::mpsc;

/// What tcpdump keeps by default: the whole of any packet, super-packets included.
pub const DEFAULT_SNAPLEN: u32 = 262_144;
/// Packets encoded into one chunk of the stream at most.
const CHUNK_PACKETS: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureRequest {
    pub link: String,
    /// Stop after this many packets.
    pub count: Option<u64>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Bytes kept of each packet.
    pub snaplen: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("{field}: {reason}")]
    Bad { field: String, reason: String },
    #[error("this agent sends no link named {link} (it sends {known})")]
    NoSuchLink { link: String, known: String },
    #[error("link {0} is already being captured; one capture per link direction at a time")]
    Busy(String),
}

/// A capture of the link direction is running already.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a capture of this link direction is running")]
pub struct Busy;

impl RequestError {
    fn bad(field: &str, reason: impl Into<String>) -> RequestError {
        RequestError::Bad {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl CaptureRequest {
    /// From `link=L&count=N&duration_ms=D&snaplen=S` (only `link` required).
    pub fn from_query(query: &str) -> Result<CaptureRequest, RequestError> {
        let mut link = None;
        let mut request = CaptureRequest {
            link: String::new(),
            count: None,
            duration: None,
            snaplen: DEFAULT_SNAPLEN,
        };
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            let number = |field: &str| {
                value.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    RequestError::bad(field, format!("{value:?} is not a positive whole number"))
                })
            };
            match key.as_ref() {
                "link" => link = Some(value.to_string()),
                "count" => request.count = Some(number("count")?),
                "duration_ms" => {
                    request.duration = Some(Duration::from_millis(number("duration_ms")?))
                }
                "snaplen" => {
                    request.snaplen = u32::try_from(number("snaplen")?)
                        .map_err(|_| RequestError::bad("snaplen", "at most 4294967295"))?
                }
                other => {
                    return Err(RequestError::bad(
                        other,
                        "unknown parameter (link, count, duration_ms, snaplen)",
                    ));
                }
            }
        }
        request.link = link
            .filter(|l| !l.is_empty())
            .ok_or_else(|| RequestError::bad("link", "required"))?;
        Ok(request)
    }
}

/// Starts a capture on one of `links`: the header chunk comes at once, packets
/// as they pass, the statistics block last. Refused before anything starts
/// when the link is unknown or already captured.
pub fn start(
    links: &LinkMap,
    node: &str,
    request: CaptureRequest,
) -> Result<mpsc::Receiver<Bytes>, RequestError> {
    let map = links.load();
    let Some(link) = map.get(&request.link).cloned() else {
        let mut known: Vec<&str> = map.keys().map(String::as_str).collect();
        known.sort_unstable();
        return Err(RequestError::NoSuchLink {
            link: request.link,
            known: if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            },
        });
    };
    let counters = Arc::new(TapCounters::default());
    let (tx, packets) = mpsc::channel(CHANNEL_PACKETS);
    link.capture(tx, request.snaplen, request.count, counters.clone())
        .map_err(|Busy| RequestError::Busy(request.link.clone()))?;
    let interface = pcapng::Interface {
        name: &request.link,
        description: &format!(
            "nextmini link {} from {node} to {}",
            request.link, link.spec.peer_node
        ),
        snaplen: request.snaplen,
    };
    let encoder =
        pcapng::Encoder::new(&interface).map_err(|e| RequestError::bad("pcapng", e.to_string()))?;
    let (out, chunks) = mpsc::channel(16);
    tokio::spawn(stream(encoder, packets, out, request.duration, counters));
    Ok(chunks)
}

/// Encodes packets into chunks until the tap ends, the time is up or the
/// reader is gone.
async fn stream(
    mut encoder: pcapng::Encoder,
    mut packets: mpsc::Receiver<CapturedPacket>,
    out: mpsc::Sender<Bytes>,
    duration: Option<Duration>,
    counters: Arc<TapCounters>,
) {
    if out.send(Bytes::from(encoder.take())).await.is_err() {
        return;
    }
    let deadline = duration.map(|d| tokio::time::Instant::now() + d);
    let mut batch = Vec::with_capacity(CHUNK_PACKETS);
    loop {
        let received = match deadline {
            Some(at) => tokio::time::timeout_at(at, packets.recv_many(&mut batch, CHUNK_PACKETS))
                .await
                .unwrap_or(0),
            None => packets.recv_many(&mut batch, CHUNK_PACKETS).await,
        };
        if received == 0 {
            break;
        }
        for p in batch.drain(..) {
            if let Err(e) = encoder.packet(&p) {
                tracing::warn!(error = %e, "capture ended");
                return;
            }
        }
        if out.send(Bytes::from(encoder.take())).await.is_err() {
            return;
        }
    }
    // Closing the receiver detaches the tap at the link's next packet.
    packets.close();
    while let Ok(p) = packets.try_recv() {
        if encoder.packet(&p).is_err() {
            return;
        }
    }
    let kept = counters.kept.load(Relaxed);
    let missed = counters.missed.load(Relaxed);
    let now = crate::link_auth::unix_ms().saturating_mul(1_000_000);
    if encoder.statistics(now, kept, missed).is_ok() {
        let _ = out.send(Bytes::from(encoder.take())).await;
    }
    if missed > 0 {
        tracing::warn!(kept, missed, "capture could not keep every packet");
    }
}

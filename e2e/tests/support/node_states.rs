//! Notifications as the schema sends them (node state changes on
//! `nextmini_nodes`, the hub's problem lists on `nextmini_topology`), for the
//! suites that watch them (shared with `#[path]`; not a test target).

use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Node state changes as the schema announces them on `nextmini_nodes`
/// ("topology/node state"), with when they arrived: transitions too quick to
/// poll for (a restart within half a second) are still seen.
pub fn watch_node_states(url: String) -> mpsc::Receiver<(String, Instant)> {
    watch_channel(url, "nextmini_nodes")
}

/// Every notification on `channel`, with when it arrived; returns once
/// LISTEN is in effect.
pub fn watch_channel(url: String, channel: &'static str) -> mpsc::Receiver<(String, Instant)> {
    let (tx, rx) = mpsc::channel();
    // Returns only once LISTEN is in effect: an event sent before it would be
    // missed (a fixed pause was not always enough on a loaded machine).
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    std::thread::spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                let _ = ready_tx.send(Err(format!("runtime: {e}")));
                return;
            }
        };
        runtime.block_on(async move {
            let mut listener = match sqlx::postgres::PgListener::connect(&url).await {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("connect: {e}")));
                    return;
                }
            };
            if let Err(e) = listener.listen(channel).await {
                let _ = ready_tx.send(Err(format!("LISTEN: {e}")));
                return;
            }
            let _ = ready_tx.send(Ok(()));
            while let Ok(Some(n)) = listener.try_recv().await {
                if tx.send((n.payload().to_string(), Instant::now())).is_err() {
                    return;
                }
            }
        });
    });
    match ready_rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(())) => rx,
        Ok(Err(e)) => panic!("watching {channel}: {e}"),
        Err(e) => panic!("watching {channel}: not listening after 10 s ({e})"),
    }
}

pub fn wait_state(
    events: &mpsc::Receiver<(String, Instant)>,
    expected: &str,
    limit: Duration,
) -> Instant {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok((payload, at)) if payload == expected => return at,
            Ok(_) => continue,
            Err(e) => panic!("no `{expected}` notification within {limit:?} ({e})"),
        }
    }
}

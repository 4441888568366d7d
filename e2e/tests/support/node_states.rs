//! Node state changes as the schema announces them on `nextmini_nodes`, for
//! the suites that kill agents (shared with `#[path]`; not a test target).

use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Node state changes as the schema announces them on `nextmini_nodes`
/// ("topology/node state"), with when they arrived: transitions too quick to
/// poll for (a restart within half a second) are still seen.
pub fn watch_node_states(url: String) -> mpsc::Receiver<(String, Instant)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async move {
            let Ok(mut listener) = sqlx::postgres::PgListener::connect(&url).await else {
                return;
            };
            if listener.listen("nextmini_nodes").await.is_err() {
                return;
            }
            while let Ok(Some(n)) = listener.try_recv().await {
                if tx.send((n.payload().to_string(), Instant::now())).is_err() {
                    return;
                }
            }
        });
    });
    // Let LISTEN take effect before the caller causes anything.
    std::thread::sleep(Duration::from_millis(300));
    rx
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
            Err(_) => panic!("no `{expected}` on nextmini_nodes within {limit:?}"),
        }
    }
}

//! The fidelity guard's verdicts, as the hub keeps them: each agent judges the
//! report windows of the links it sends on (node-agent `fidelity.rs`); a run
//! of unfaithful windows of one link becomes one stored episode, which the
//! Topology's `Faithful` condition, `nextmini status` and the flow results'
//! `unfaithful` flag read.

use crate::store::Store;
use chrono::{DateTime, Utc};
use nextmini_proto::v1 as pb;
use std::collections::HashMap;

/// A window whose start is unknown (the session's first report) is taken to
/// be this long: the agents' default report interval.
const FIRST_WINDOW_MS: i64 = 1000;

/// The episodes of one agent's session.
#[derive(Debug, Default)]
pub(super) struct Episodes {
    /// Ongoing episodes by link, with their stored id.
    open: HashMap<String, i64>,
    last_report: Option<DateTime<Utc>>,
}

impl Episodes {
    /// Opens, extends and ends episodes from one report read at `at`. A store
    /// that fails is logged: counting and forwarding go on without it.
    pub async fn on_report(
        &mut self,
        store: &Store,
        topology_id: i64,
        node: &str,
        at: DateTime<Utc>,
        links: &[pb::LinkCounters],
    ) {
        let window_start = self
            .last_report
            .unwrap_or(at - chrono::Duration::milliseconds(FIRST_WINDOW_MS));
        self.last_report = Some(at);
        let mut ended = Vec::new();
        for l in links {
            let open = self.open.get(&l.link).copied();
            let result = match (open, l.unfaithful.is_empty()) {
                (None, true) => Ok(()),
                (Some(id), true) => {
                    self.open.remove(&l.link);
                    ended.push(id);
                    tracing::info!(link = %l.link, %node, "link runs as configured again");
                    Ok(())
                }
                (Some(id), false) => store.extend_fidelity_episode(id, at, &l.unfaithful).await,
                (None, false) => {
                    tracing::warn!(link = %l.link, %node, reason = %l.unfaithful,
                        "the emulator, not the emulated link, limited the link's traffic");
                    store
                        .open_fidelity_episode(
                            topology_id,
                            &l.link,
                            node,
                            window_start,
                            at,
                            &l.unfaithful,
                        )
                        .await
                        .map(|id| {
                            self.open.insert(l.link.clone(), id);
                        })
                }
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, link = %l.link, "storing a fidelity episode failed");
            }
        }
        // A link gone from the report (removed) ends its episode too.
        self.open.retain(|link, id| {
            let reported = links.iter().any(|l| &l.link == link);
            if !reported {
                ended.push(*id);
            }
            reported
        });
        if let Err(e) = store.close_fidelity_episodes(&ended, Some(at)).await {
            tracing::warn!(error = %e, "ending fidelity episodes failed");
        }
    }

    /// The session is over: its ongoing episodes end where they were last seen.
    pub async fn end(&mut self, store: &Store) {
        let ids: Vec<i64> = self.open.drain().map(|(_, id)| id).collect();
        if let Err(e) = store.close_fidelity_episodes(&ids, None).await {
            tracing::warn!(error = %e, "ending fidelity episodes failed");
        }
    }
}

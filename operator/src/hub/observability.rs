//! What the metrics endpoint asks of the hub.

use super::Hub;
use crate::observe::HubMetrics;
use crate::store::Store;
use std::collections::BTreeMap;
use std::sync::Arc;

impl Hub {
    pub fn metrics(&self) -> Arc<HubMetrics> {
        self.inner.metrics.clone()
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Recounts the connected agents per topology for the next scrape. A
    /// topology the hub has loaded but with no agent connected counts 0.
    pub async fn refresh_connected_agents(&self) {
        // One lock at a time: sessions are taken before views elsewhere.
        let mut counts: BTreeMap<String, u64> = self
            .inner
            .views
            .lock()
            .await
            .keys()
            .map(|t| (t.clone(), 0))
            .collect();
        for (topology, _) in self.inner.sessions.lock().await.keys() {
            *counts.entry(topology.clone()).or_default() += 1;
        }
        self.inner.metrics.set_connected_agents(counts);
    }
}

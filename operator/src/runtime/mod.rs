//! Where virtual nodes run. `netns`: each node in its own network namespace on
//! this machine, joined to a per-topology bridge by a veth, with one agent process
//! per node (the Nextmini paper's namespace mode). A Kubernetes runtime (pods)
//! implements the same trait.

pub mod cgroup;
pub mod limits;
pub mod names;
pub mod neigh;
pub mod netlink;
pub mod netns;
pub mod node_hosts;
pub mod packed;
pub mod pods;
pub mod process;
pub mod scenario_nodes;
pub mod start_gate;
pub mod supervise;
pub mod tunables;
pub mod worker;

use crate::plan::Plan;
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("netlink: {0}")]
    Netlink(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Conflict(String),
}

impl RuntimeError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> RuntimeError {
        RuntimeError::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<rtnetlink::Error> for RuntimeError {
    fn from(e: rtnetlink::Error) -> Self {
        RuntimeError::Netlink(e.to_string())
    }
}

/// What a tear-down removed, so `down` can say so and tests can assert it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Removed {
    pub processes: usize,
    pub namespaces: usize,
    pub links: usize,
}

/// How far the making of a node has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Its namespace and interfaces exist; no agent yet.
    Wired,
    /// Its agent was started.
    Started,
}

/// Called once per node and stage as creation progresses, for progress bars.
/// A node's agent starts after the node and its link peers are wired.
pub type Progress<'a> = &'a (dyn Fn(Stage, &str) + Sync);

/// How far removing a topology has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Its agents (this many) are being stopped.
    StoppingAgents(usize),
    /// `done` of its `total` namespaces are gone.
    Namespaces { done: usize, total: usize },
}

/// Called as a removal progresses, for progress bars.
pub type RemovalProgress<'a> = &'a (dyn Fn(Removal) + Sync);

#[allow(async_fn_in_trait)]
pub trait Runtime {
    /// Creates every node of the plan and starts its agent. `credentials` holds
    /// each node's token and certificate. On error, whatever was created is left for `destroy`.
    async fn create(
        &self,
        plan: &Plan,
        credentials: &crate::pki::Credentials,
        progress: Progress<'_>,
    ) -> Result<BTreeMap<String, u32>, RuntimeError>;

    /// Removes everything of the topology this runtime ever made, also what a
    /// crashed run left behind. Idempotent.
    async fn destroy(&self, topology: &str) -> Result<Removed, RuntimeError>;
}

//! Nextmini's control plane: CRD types, the pure planner, the PostgreSQL store, the
//! control hub (gRPC), and the runtimes that place virtual nodes (network namespaces
//! locally, pods on Kubernetes).

pub mod api;
pub mod controller;
pub mod crdgen;
pub mod hub;
pub mod import;
pub mod localpg;
pub mod observe;
pub mod pki;
pub mod plan;
pub mod runtime;
pub mod shutdown;
pub mod store;
pub mod units;

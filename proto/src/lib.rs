//! The `nextmini.v1` control protocol shared by the operator's hub and the node agents.
//!
//! One persistent bidirectional gRPC stream per agent: the agent says `Hello`, the hub
//! answers with a full `Snapshot`, then ordered `Delta`s tagged with a generation; the
//! agent acknowledges generations and reports per-link counters.

// Generated code: its style is tonic-build's.
#[allow(clippy::all)]
pub mod v1 {
    tonic::include_proto!("nextmini.v1");
}

/// Version of the control protocol spoken by this build; sent in `Hello`. 2: link
/// frames and max-mode headers carry 16-bit hop counts, so agents of version 1
/// cannot exchange packets with this build's.
pub const PROTOCOL_VERSION: u32 = 2;

pub mod error_chain;
pub mod tls;
pub mod topology_key;

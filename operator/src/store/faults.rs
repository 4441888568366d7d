//! Rows a topology's plan cannot be read from as written: what the database's
//! checks (migration 0011) would have refused, yet reached the store anyway —
//! written with the triggers disabled, or under an older schema. Loading
//! reports each one instead of failing the whole topology, so one bad row never
//! stops every other change; the hub decides what runs in its place.

/// Which part of the plan a faulty row held. The plan carries a stand-in for it
/// (unimpaired parameters, TCP, no SOCKS servers, no flow, no route) until the
/// hub puts back the last good state it knows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FaultyPart {
    LinkForward(String),
    LinkBackward(String),
    LinkTransport(String),
    NodeSocks(String),
    Flow(String),
}

/// One faulty row: where it is, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowFault {
    pub part: FaultyPart,
    /// Table, row and column, e.g. `links s-y params_forward`.
    pub subject: String,
    pub problem: String,
}

/// A problem as the hub shows it: the fault and what runs instead.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TopologyProblem {
    pub subject: String,
    pub problem: String,
    pub consequence: String,
}

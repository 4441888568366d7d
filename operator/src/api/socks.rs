//! SOCKS5 entry points: applications outside the emulated network (on the host in
//! local mode) reach its nodes through a node's agent.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A SOCKS5 server (RFC 1928, CONNECT only) run by the node's agent. Clients name a
/// node (`curl --socks5-hostname ADDR http://c:8000/`) or a node's overlay IPv4
/// address as the destination.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SocksSpec {
    /// Address and port to listen on, e.g. `127.0.0.1:1080`. In local mode it is an
    /// address of the host (outside every node's namespace), so it must be free
    /// there: two nodes or topologies cannot share it. On Kubernetes it is inside the
    /// node's pod.
    #[schemars(length(min = 1, max = 64))]
    pub listen: String,
    /// How accepted connections travel: `normal` (the default) connects from inside
    /// the node, so the bytes cross its TUN device and the emulated links like any
    /// application's; `max` relays them hop by hop with splice() over TCP
    /// connections between the agents along the routing table's next hops, past the
    /// link emulation, at the speed of the machine.
    #[serde(default, skip_serializing_if = "is_default")]
    pub mode: SocksMode,
    /// Accounts for RFC 1929 username/password authentication. Empty (the default):
    /// no authentication. Set: clients must log in as one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub users: Vec<SocksUserSpec>,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

// How SOCKS connections travel. (A plain comment: schemars would otherwise turn a doc
// comment into the field's description in place of the field's own doc.)
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SocksMode {
    /// Through the node's TUN device, processors and emulated links.
    #[default]
    Normal,
    /// Spliced hop by hop between the agents, past the link emulation.
    Max,
}

/// One SOCKS5 account.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SocksUserSpec {
    /// User name, 1 to 255 bytes (RFC 1929).
    #[schemars(length(min = 1, max = 255))]
    pub name: String,
    /// Password, 1 to 255 bytes (RFC 1929). The agents are sent only a salted SHA-256
    /// of it; RFC 1929 sends it in the clear, so use SOCKS on trusted addresses only.
    #[schemars(length(min = 1, max = 255))]
    pub password: String,
}

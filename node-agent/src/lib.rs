//! Nextmini's node agent: a user-space actor dataplane on tokio.
//!
//! Pure cores (no I/O, tested with plain inputs): [`frame`], [`flow`], [`jump_hash`],
//! [`routing`]. Actors (a task owning its state, driven through a handle holding a
//! bounded sender): TUN reader/writer, links, processors, the controller interface.
//! Ways in from outside: SOCKS5 servers ([`socks`]), in normal mode through the
//! dataplane or in max mode spliced hop by hop past it ([`maxmode`]).

pub mod flow;
pub mod frame;
pub mod hop_limit;
pub mod jump_hash;
pub mod routing;
pub mod sched;
pub mod synth;

pub mod alloc;
pub mod capture;
pub mod congestion;
pub mod conn;
pub mod control;
pub mod counters;
pub mod cut_through;
pub mod dataplane;
pub mod fidelity;
pub mod link;
pub mod link_auth;
pub mod listener;
pub mod maxmode;
pub mod metrics;
pub mod netns;
pub mod news;
pub mod node_side;
pub mod offload;
pub mod packet;
mod pipe;
pub mod probe;
pub mod processor;
pub mod quic;
pub mod relay;
pub mod scenario;
pub mod socks;
pub mod timer;
pub mod ttl;
pub mod tun_io;
mod tun_ipv6;

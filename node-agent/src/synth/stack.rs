//! One agent's user-space TCP/IP stack for synthetic flows: smoltcp on the
//! [`VirtualDevice`], sans-IO. The driver hands it the packets the processors
//! deliver, asks it to open instances, polls it with the current time, and takes
//! back the packets to route and the results of finished instances.
//!
//! As a source it opens one socket per instance and writes zeros (the bytes are
//! never looked at) as fast as the window, the congestion controller and the
//! flow's rate cap allow. As a sink it accepts on [`LISTEN_PORT`]: smoltcp needs
//! one listening socket per connection, so one is made when a SYN from a new
//! remote endpoint arrives, just before smoltcp sees it. Memory therefore grows
//! with the connections that exist, not with the ones that might.

use super::device::VirtualDevice;
use super::wire::{RetransmitCounter, Segment, set_dscp};
use super::workload::InstanceAmount;
use bytes::Bytes;
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::socket::{tcp, udp};
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, IpEndpoint, IpListenEndpoint};
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Where sinks accept synthetic flows, TCP and UDP.
pub const LISTEN_PORT: u16 = 61000;
/// Source ports of synthetic flows, per peer.
pub const CLIENT_PORTS: RangeInclusive<u16> = 61001..=65535;
/// How long a finished source waits for the sink's FIN before its socket goes.
const LINGER: Duration = Duration::from_secs(5);
/// A connection that gets no acknowledgement for this long is reset.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// A UDP instance the sink has heard nothing of for this long is reported.
const UDP_IDLE: Duration = Duration::from_secs(2);
/// Source sockets receive only ACKs; sink sockets send only ACKs.
const SMALL_BUFFER: usize = 1024;
/// IPv4 + UDP headers.
const UDP_OVERHEAD: usize = 28;
const UDP_MAGIC: [u8; 4] = *b"NMSF";
/// magic | tag | instance | sequence | flags
const UDP_HEADER: usize = 17;
const UDP_LAST: u8 = 1;
/// Datagrams a UDP socket queues; the device takes them all on every poll.
const UDP_PACKETS: usize = 64;

/// Which flow an instance belongs to: its name and the generation that defined it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FlowRef {
    pub name: Arc<str>,
    pub defined_generation: u64,
}

impl FlowRef {
    /// 32 bits naming the flow in UDP datagrams, the same at source and sink.
    pub fn tag(&self) -> u32 {
        let mut h = crate::flow::Fnv1a::new();
        h.write(self.name.as_bytes());
        h.write(&self.defined_generation.to_be_bytes());
        crate::flow::fmix64(h.finish()) as u32
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Congestion {
    Cubic,
    Reno,
    None,
}

/// An instance to open.
#[derive(Debug, Clone)]
pub struct Open {
    pub flow: FlowRef,
    pub instance: u32,
    pub protocol: Protocol,
    pub peer: Ipv4Addr,
    pub amount: InstanceAmount,
    /// Payload bytes per second × 8; `None` is as fast as TCP goes (UDP needs one).
    pub rate_bps: Option<u64>,
    /// Send buffer: the most a TCP instance has in flight.
    pub window: usize,
    pub congestion: Congestion,
    /// Route id for the packets' label (0: by destination).
    pub label: u32,
    pub dscp: u8,
}

/// An instance that ended at its source.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub flow: FlowRef,
    pub instance: u32,
    pub protocol: Protocol,
    pub size: Option<u64>,
    /// TCP: acknowledged; UDP: sent.
    pub bytes: u64,
    pub started: Instant,
    /// When the last byte was acknowledged (TCP) or sent (UDP); `None` if it failed.
    pub finished: Option<Instant>,
    pub retransmissions: u64,
    pub error: Option<String>,
}

/// What a sink received of one UDP instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub flow: FlowRef,
    pub instance: u32,
    pub bytes: u64,
    pub first: Instant,
    pub last: Instant,
}

#[derive(Debug, Clone)]
pub struct Outgoing {
    pub data: Bytes,
    /// Route id for the frame (0: route by destination).
    pub label: u32,
}

#[derive(Debug, Default)]
pub struct Output {
    pub packets: Vec<Outgoing>,
    pub finished: Vec<Finished>,
    pub received: Vec<Received>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum OpenError {
    #[error("all {count} source ports towards {0} are in use", count = CLIENT_PORTS.len())]
    NoPort(Ipv4Addr),
    #[error("udp instances need a rate")]
    NoRate,
    #[error("smoltcp refused: {0}")]
    Refused(String),
}

struct Source {
    open: Open,
    port: u16,
    started: Instant,
    /// Payload bytes handed to the socket.
    written: u64,
    /// TCP: bytes acknowledged, as of the last step the connection was alive
    /// (a reset clears the socket's buffers, and with them what was unacked).
    acked: u64,
    /// UDP datagrams sent.
    sequence: u32,
    /// Set when the instance ended, successfully or not; the socket lingers.
    ended: Option<Instant>,
    retx: RetransmitCounter,
}

impl Source {
    /// Whether every byte of the instance has been handed over.
    fn written_all(&self, now: Instant) -> bool {
        match self.open.amount {
            InstanceAmount::Bytes(b) => self.written >= b,
            InstanceAmount::For(d) => now >= self.started + d,
            InstanceAmount::Forever => false,
        }
    }

    /// Bytes the rate cap allows now, beyond what was written.
    fn allowance(&self, now: Instant) -> u64 {
        match self.open.rate_bps {
            None => u64::MAX,
            Some(rate) => {
                let elapsed = now.saturating_duration_since(self.started).as_secs_f64();
                ((elapsed * rate as f64 / 8.0) as u64).saturating_sub(self.written)
            }
        }
    }

    /// When `bytes` more will be allowed.
    fn allowed_at(&self, bytes: u64) -> Option<Instant> {
        let rate = self.open.rate_bps.filter(|r| *r > 0)?;
        let secs = (self.written + bytes) as f64 * 8.0 / rate as f64;
        Some(self.started + Duration::from_secs_f64(secs))
    }

    fn remaining(&self) -> u64 {
        match self.open.amount {
            InstanceAmount::Bytes(b) => b.saturating_sub(self.written),
            _ => u64::MAX,
        }
    }

    fn result(&self, bytes: u64, finished: Option<Instant>, error: Option<String>) -> Finished {
        Finished {
            flow: self.open.flow.clone(),
            instance: self.open.instance,
            protocol: self.open.protocol,
            size: self.open.amount.bytes(),
            bytes,
            started: self.started,
            finished,
            retransmissions: self.retx.retransmissions,
            error,
        }
    }
}

/// Round-robin source ports towards one peer, so a port is reused as late as
/// possible (the peer may still hold the last connection that used it).
#[derive(Default)]
struct PortPool {
    next: u16,
    in_use: std::collections::HashSet<u16>,
}

impl PortPool {
    fn take(&mut self) -> Option<u16> {
        let span = CLIENT_PORTS.len() as u16;
        for _ in 0..span {
            let port = CLIENT_PORTS.start() + self.next % span;
            self.next = (self.next + 1) % span;
            if self.in_use.insert(port) {
                return Some(port);
            }
        }
        None
    }

    fn release(&mut self, port: u16) {
        self.in_use.remove(&port);
    }
}

struct UdpInstance {
    bytes: u64,
    first: Instant,
    last: Instant,
    ended: bool,
}

pub struct Stack {
    iface: Interface,
    sockets: SocketSet<'static>,
    device: VirtualDevice,
    epoch: Instant,
    local: Ipv4Addr,
    mtu: usize,
    sources: HashMap<SocketHandle, Source>,
    /// (peer, source port) → the source socket, to mark what it sends.
    marks: HashMap<(Ipv4Addr, u16), SocketHandle>,
    ports: HashMap<Ipv4Addr, PortPool>,
    /// Accepted connections and their remote endpoint.
    sinks: HashMap<SocketHandle, (Ipv4Addr, u16)>,
    /// Remote endpoints with a sink socket (`None`: its listener is pending).
    remotes: HashMap<(Ipv4Addr, u16), Option<SocketHandle>>,
    pending_listeners: Vec<SocketHandle>,
    sink_window: usize,
    udp_sink: SocketHandle,
    /// UDP tags of the flows this node is the sink of.
    udp_flows: HashMap<u32, FlowRef>,
    udp_received: HashMap<(Ipv4Addr, u32, u32), UdpInstance>,
}

impl Stack {
    pub fn new(local: Ipv4Addr, prefix_len: u8, mtu: usize, seed: u64, now: Instant) -> Stack {
        let mut device = VirtualDevice::new(mtu);
        let mut config = Config::new(HardwareAddress::Ip);
        config.random_seed = seed;
        let mut iface = Interface::new(config, &mut device, smoltcp::time::Instant::ZERO);
        iface.update_ip_addrs(|addrs| {
            // Cannot fail: a fresh interface has no address yet.
            let _ = addrs.push(IpCidr::new(IpAddress::Ipv4(local), prefix_len));
        });
        // Every peer is on the overlay; with no link layer the gateway is moot,
        // but smoltcp wants a route for anything outside the prefix.
        let _ = iface.routes_mut().add_default_ipv4_route(local);
        let mut sockets = SocketSet::new(Vec::new());
        let mut udp_sink = udp::Socket::new(
            udp::PacketBuffer::new(
                vec![udp::PacketMetadata::EMPTY; 4 * UDP_PACKETS],
                vec![0u8; 4 * UDP_PACKETS * mtu],
            ),
            udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 1], vec![0u8; 1]),
        );
        // Cannot fail: the port is not zero.
        let _ = udp_sink.bind(IpListenEndpoint {
            addr: Some(local.into()),
            port: LISTEN_PORT,
        });
        let udp_sink = sockets.add(udp_sink);
        Stack {
            iface,
            sockets,
            device,
            epoch: now,
            local,
            mtu,
            sources: HashMap::new(),
            marks: HashMap::new(),
            ports: HashMap::new(),
            sinks: HashMap::new(),
            remotes: HashMap::new(),
            pending_listeners: Vec::new(),
            sink_window: 64 * 1024,
            udp_sink,
            udp_flows: HashMap::new(),
            udp_received: HashMap::new(),
        }
    }

    fn ts(&self, now: Instant) -> smoltcp::time::Instant {
        let micros = now.saturating_duration_since(self.epoch).as_micros();
        smoltcp::time::Instant::from_micros(i64::try_from(micros).unwrap_or(i64::MAX))
    }

    fn instant_of(&self, t: smoltcp::time::Instant) -> Instant {
        self.epoch + Duration::from_micros(u64::try_from(t.total_micros()).unwrap_or(0))
    }

    /// Receive buffer of accepted connections: the window sinks offer.
    pub fn set_sink_window(&mut self, bytes: usize) {
        self.sink_window = bytes.max(SMALL_BUFFER);
    }

    /// The UDP flows this node receives, by tag, so their results name them.
    pub fn set_udp_flows(&mut self, flows: impl IntoIterator<Item = FlowRef>) {
        self.udp_flows = flows.into_iter().map(|f| (f.tag(), f)).collect();
    }

    /// A packet the processors delivered to this node's synthetic ports.
    pub fn deliver(&mut self, packet: Bytes) {
        self.device.push_rx(packet);
    }

    /// Open connections (sources and sinks).
    pub fn connections(&self) -> usize {
        self.sources.len() + self.sinks.len()
    }

    /// Starts an instance now.
    pub fn open(&mut self, open: Open, now: Instant) -> Result<(), OpenError> {
        if open.protocol == Protocol::Udp && open.rate_bps.is_none_or(|r| r == 0) {
            return Err(OpenError::NoRate);
        }
        let pool = self.ports.entry(open.peer).or_default();
        let port = pool.take().ok_or(OpenError::NoPort(open.peer))?;
        let local = IpListenEndpoint {
            addr: Some(self.local.into()),
            port,
        };
        let handle = match open.protocol {
            Protocol::Tcp => {
                let mut socket = tcp::Socket::new(
                    tcp::SocketBuffer::new(vec![0u8; SMALL_BUFFER]),
                    tcp::SocketBuffer::new(vec![0u8; open.window.max(SMALL_BUFFER)]),
                );
                socket.set_nagle_enabled(false);
                socket.set_timeout(Some(CONNECTION_TIMEOUT.into()));
                socket.set_congestion_control(match open.congestion {
                    Congestion::Cubic => tcp::CongestionControl::Cubic,
                    Congestion::Reno => tcp::CongestionControl::Reno,
                    Congestion::None => tcp::CongestionControl::None,
                });
                let result = socket.connect(
                    self.iface.context(),
                    IpEndpoint::new(open.peer.into(), LISTEN_PORT),
                    local,
                );
                if let Err(e) = result {
                    self.release_port(open.peer, port);
                    return Err(OpenError::Refused(e.to_string()));
                }
                self.sockets.add(socket)
            }
            Protocol::Udp => {
                let mut socket = udp::Socket::new(
                    udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 1], vec![0u8; 1]),
                    udp::PacketBuffer::new(
                        vec![udp::PacketMetadata::EMPTY; UDP_PACKETS],
                        vec![0u8; UDP_PACKETS * self.mtu],
                    ),
                );
                if let Err(e) = socket.bind(local) {
                    self.release_port(open.peer, port);
                    return Err(OpenError::Refused(e.to_string()));
                }
                self.sockets.add(socket)
            }
        };
        self.marks.insert((open.peer, port), handle);
        self.sources.insert(
            handle,
            Source {
                open,
                port,
                started: now,
                written: 0,
                acked: 0,
                sequence: 0,
                ended: None,
                retx: RetransmitCounter::default(),
            },
        );
        Ok(())
    }

    fn release_port(&mut self, peer: Ipv4Addr, port: u16) {
        if let Some(pool) = self.ports.get_mut(&peer) {
            pool.release(port);
        }
    }

    /// Ends every running instance of `flow` (it was removed), reporting what
    /// each had sent.
    pub fn abort_flow(&mut self, flow: &FlowRef, now: Instant) -> Vec<Finished> {
        let mut out = Vec::new();
        for (&handle, source) in self.sources.iter_mut() {
            if source.open.flow != *flow || source.ended.is_some() {
                continue;
            }
            let bytes = match source.open.protocol {
                Protocol::Tcp => {
                    let socket = self.sockets.get_mut::<tcp::Socket>(handle);
                    let acked = source.written - socket.send_queue() as u64;
                    socket.abort();
                    acked
                }
                Protocol::Udp => source.written,
            };
            source.ended = Some(now);
            out.push(source.result(bytes, None, Some("the flow was removed".into())));
        }
        out
    }

    /// Runs the stack at `now`: takes in delivered packets, moves the instances
    /// on, and returns what to send and what ended.
    pub fn poll(&mut self, now: Instant) -> Output {
        let ts = self.ts(now);
        self.prepare_listeners();
        self.iface.poll(ts, &mut self.device, &mut self.sockets);
        self.settle_listeners();
        let mut out = Output::default();
        self.step_sources(now, &mut out);
        self.step_sinks(now, &mut out);
        // Again, so what the instances just wrote leaves now.
        self.iface.poll(ts, &mut self.device, &mut self.sockets);
        self.collect(&mut out);
        self.reap(now);
        out
    }

    /// When `poll` next has work to do without a packet arriving.
    pub fn poll_at(&mut self, now: Instant) -> Option<Instant> {
        let ts = self.ts(now);
        let mut at = self
            .iface
            .poll_at(ts, &self.sockets)
            .map(|t| self.instant_of(t));
        let mut earliest = |t: Instant| at = Some(at.map_or(t, |a| a.min(t)));
        let mtu = self.mtu as u64;
        for source in self.sources.values() {
            match source.ended {
                Some(ended) => earliest(ended + LINGER),
                None => {
                    if let InstanceAmount::For(d) = source.open.amount {
                        earliest(source.started + d);
                    }
                    if let Some(t) = source.allowed_at(mtu) {
                        earliest(t);
                    }
                }
            }
        }
        for udp in self.udp_received.values() {
            earliest(udp.last + UDP_IDLE);
        }
        at
    }

    /// Makes a listening socket for each SYN from a remote endpoint that has no
    /// connection yet, before smoltcp looks for one.
    fn prepare_listeners(&mut self) {
        let mut fresh = Vec::new();
        for packet in self.device.rx_iter() {
            let Some(s) = Segment::parse(packet) else {
                continue;
            };
            if s.is_syn()
                && s.dst == self.local
                && s.dst_port == LISTEN_PORT
                && !self.remotes.contains_key(&(s.src, s.src_port))
                && !fresh.contains(&(s.src, s.src_port))
            {
                fresh.push((s.src, s.src_port));
            }
        }
        for remote in fresh {
            let mut socket = tcp::Socket::new(
                tcp::SocketBuffer::new(vec![0u8; self.sink_window]),
                tcp::SocketBuffer::new(vec![0u8; SMALL_BUFFER]),
            );
            // Acknowledge every segment: a delayed ACK of a flow's last segment
            // would add the delay to its completion time.
            socket.set_ack_delay(None);
            socket.set_timeout(Some((2 * CONNECTION_TIMEOUT).into()));
            if socket
                .listen(IpListenEndpoint {
                    addr: Some(self.local.into()),
                    port: LISTEN_PORT,
                })
                .is_ok()
            {
                self.pending_listeners.push(self.sockets.add(socket));
                self.remotes.insert(remote, None);
            }
        }
    }

    /// Listeners that took a SYN become sink connections; the rest go.
    fn settle_listeners(&mut self) {
        for handle in std::mem::take(&mut self.pending_listeners) {
            let socket = self.sockets.get::<tcp::Socket>(handle);
            match socket.remote_endpoint() {
                Some(IpEndpoint {
                    addr: IpAddress::Ipv4(addr),
                    port,
                }) if socket.state() != tcp::State::Listen => {
                    self.sinks.insert(handle, (addr, port));
                    self.remotes.insert((addr, port), Some(handle));
                }
                _ => {
                    self.sockets.remove(handle);
                }
            }
        }
        self.remotes.retain(|_, h| h.is_some());
    }

    fn step_sources(&mut self, now: Instant, out: &mut Output) {
        for (&handle, source) in self.sources.iter_mut() {
            if source.ended.is_some() {
                continue;
            }
            match source.open.protocol {
                Protocol::Tcp => {
                    let socket = self.sockets.get_mut::<tcp::Socket>(handle);
                    if let Some(done) = step_tcp(source, socket, now) {
                        out.finished.push(done);
                    }
                }
                Protocol::Udp => {
                    let socket = self.sockets.get_mut::<udp::Socket>(handle);
                    if let Some(done) = step_udp(source, socket, now, self.mtu) {
                        out.finished.push(done);
                    }
                }
            }
        }
    }

    fn step_sinks(&mut self, now: Instant, out: &mut Output) {
        for &handle in self.sinks.keys() {
            let socket = self.sockets.get_mut::<tcp::Socket>(handle);
            // The data means nothing: take it off the buffer to reopen the window.
            while socket.can_recv() {
                match socket.recv(|buf| (buf.len(), buf.len())) {
                    Ok(n) if n > 0 => {}
                    _ => break,
                }
            }
            if socket.state() == tcp::State::CloseWait {
                socket.close();
            }
        }
        let socket = self.sockets.get_mut::<udp::Socket>(self.udp_sink);
        while let Ok((data, meta)) = socket.recv() {
            let IpAddress::Ipv4(src) = meta.endpoint.addr;
            let Some(header) = data.get(..UDP_HEADER) else {
                continue;
            };
            if header[..4] != UDP_MAGIC {
                continue;
            }
            let word = |at: usize| {
                u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
            };
            let (tag, instance) = (word(4), word(8));
            let entry = self
                .udp_received
                .entry((src, tag, instance))
                .or_insert(UdpInstance {
                    bytes: 0,
                    first: now,
                    last: now,
                    ended: false,
                });
            entry.bytes += data.len() as u64;
            entry.last = now;
            entry.ended |= header[16] & UDP_LAST != 0;
        }
        let flows = &self.udp_flows;
        self.udp_received.retain(|&(_, tag, instance), udp| {
            if !udp.ended && now < udp.last + UDP_IDLE {
                return true;
            }
            if let Some(flow) = flows.get(&tag) {
                out.received.push(Received {
                    flow: flow.clone(),
                    instance,
                    bytes: udp.bytes,
                    first: udp.first,
                    last: udp.last,
                });
            }
            false
        });
    }

    /// Takes what smoltcp sent, labels and marks source packets, and counts
    /// their retransmissions.
    fn collect(&mut self, out: &mut Output) {
        for mut data in self.device.take_tx() {
            let mut label = 0;
            if let Some(s) = Segment::parse(&data)
                && let Some(handle) = self.marks.get(&(s.dst, s.src_port))
                && let Some(source) = self.sources.get_mut(handle)
            {
                label = source.open.label;
                if s.protocol == crate::flow::PROTO_TCP {
                    source.retx.observe(s.seq, s.payload_len);
                }
                if source.open.dscp != 0 {
                    set_dscp(&mut data, source.open.dscp);
                }
            }
            out.packets.push(Outgoing {
                data: Bytes::from(data),
                label,
            });
        }
    }

    /// Removes sockets whose connection is over.
    fn reap(&mut self, now: Instant) {
        let mut gone = Vec::new();
        for (&handle, source) in &self.sources {
            let Some(ended) = source.ended else {
                continue;
            };
            let over = match source.open.protocol {
                Protocol::Tcp => matches!(
                    self.sockets.get::<tcp::Socket>(handle).state(),
                    tcp::State::Closed | tcp::State::TimeWait
                ),
                Protocol::Udp => true,
            };
            if over || now >= ended + LINGER {
                gone.push(handle);
            }
        }
        for handle in gone {
            if let Some(source) = self.sources.remove(&handle) {
                self.marks.remove(&(source.open.peer, source.port));
                self.release_port(source.open.peer, source.port);
            }
            self.sockets.remove(handle);
        }
        let closed: Vec<SocketHandle> = self
            .sinks
            .keys()
            .copied()
            .filter(|&h| {
                matches!(
                    self.sockets.get::<tcp::Socket>(h).state(),
                    tcp::State::Closed | tcp::State::TimeWait
                )
            })
            .collect();
        for handle in closed {
            if let Some(remote) = self.sinks.remove(&handle) {
                self.remotes.remove(&remote);
            }
            self.sockets.remove(handle);
        }
    }
}

/// Writes what the instance may send; returns its result once every byte is
/// acknowledged or the connection failed.
fn step_tcp(source: &mut Source, socket: &mut tcp::Socket, now: Instant) -> Option<Finished> {
    let state = socket.state();
    if matches!(state, tcp::State::Closed | tcp::State::TimeWait) {
        source.ended = Some(now);
        let why = if source.acked == 0 {
            "the connection was refused or timed out"
        } else {
            "the connection was reset or timed out"
        };
        return Some(source.result(source.acked, None, Some(why.into())));
    }
    source.acked = source.written - socket.send_queue() as u64;
    if socket.may_send() && !source.written_all(now) {
        let mut want = source.remaining().min(source.allowance(now));
        while want > 0 {
            let wrote = socket
                .send(|buf| {
                    // The buffer was zeroed when made and is never written: its
                    // bytes are the flow's payload as they are.
                    let n = buf.len().min(usize::try_from(want).unwrap_or(usize::MAX));
                    (n, n)
                })
                .unwrap_or(0);
            if wrote == 0 {
                break;
            }
            source.written += wrote as u64;
            want -= wrote as u64;
        }
    }
    let established = matches!(state, tcp::State::Established | tcp::State::CloseWait);
    if established && source.written_all(now) && socket.send_queue() == 0 {
        source.ended = Some(now);
        socket.close();
        return Some(source.result(source.written, Some(now), None));
    }
    None
}

/// Sends the datagrams the rate allows; returns the result after the last one.
fn step_udp(
    source: &mut Source,
    socket: &mut udp::Socket,
    now: Instant,
    mtu: usize,
) -> Option<Finished> {
    let payload = mtu.saturating_sub(UDP_OVERHEAD).max(UDP_HEADER);
    let peer = IpEndpoint::new(source.open.peer.into(), LISTEN_PORT);
    let mut datagram = vec![0u8; payload];
    datagram[..4].copy_from_slice(&UDP_MAGIC);
    datagram[4..8].copy_from_slice(&source.open.flow.tag().to_be_bytes());
    datagram[8..12].copy_from_slice(&source.open.instance.to_be_bytes());
    loop {
        let timed_out =
            matches!(source.open.amount, InstanceAmount::For(d) if now >= source.started + d);
        let size = (source.remaining().min(payload as u64) as usize).max(UDP_HEADER);
        let last = timed_out || source.remaining() <= payload as u64;
        if !timed_out && source.allowance(now) < size as u64 {
            return None;
        }
        if !socket.can_send() {
            return None;
        }
        datagram[12..16].copy_from_slice(&source.sequence.to_be_bytes());
        datagram[16] = if last { UDP_LAST } else { 0 };
        if socket.send_slice(&datagram[..size], peer).is_err() {
            return None;
        }
        source.sequence = source.sequence.wrapping_add(1);
        source.written += size as u64;
        if last {
            source.ended = Some(now);
            return Some(source.result(source.written, Some(now), None));
        }
    }
}

#[cfg(test)]
mod tests;

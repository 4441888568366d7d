//! A virtual link, one direction's sender and the other's receiver: a persistent
//! TCP connection or QUIC stream to the peer agent carrying length-prefixed
//! frames, with this node's emulation pipeline (classify → AQM → schedule →
//! shape → impair) in front of it. The dialing side reconnects with backoff; the
//! accepting side takes whatever connection the listener hands it. Parameters
//! change in place: the connection and the queued packets stay.

use crate::conn::Conn;
use crate::counters::LinkCounters;
use crate::cut_through::DirectFrame;
use crate::frame::{DataFrame, Frame, FrameCodec, FrameHeader, FrameKind, LinkHello};
use crate::offload::{self, Offload};
use crate::packet::Packet;
use crate::processor::Processors;
use crate::quic;
use crate::sched::{PacketMeta, Payload, Pipeline, RELEASE_SLACK, Tap};
use crate::timer::PreciseTimer;
use bytes::{Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use nextmini_proto::v1 as pb;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_util::codec::{FramedRead, FramedWrite};

/// Hand-off between processors and the link task; the pipeline holds the real,
/// configured queue.
const HANDOFF_QUEUE: usize = 1024;
/// Frames handed from other links' receiving tasks (cut-through), waiting.
const DIRECT_QUEUE: usize = 256;
/// Packets taken from the hand-off queue per wake-up.
const INTAKE_BATCH: usize = 256;
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Read buffer of a link connection: a read takes in as many frames as the
/// socket holds (about 46 full-size ones), so a busy link decodes many per
/// read syscall instead of five with tokio-util's default 8 KiB.
pub(crate) const READ_BUFFER: usize = 64 * 1024;
/// Frames fed to the writer are written when it is flushed, in one write, up
/// to this much (the default of 8 KiB wrote every sixth frame on its own).
const WRITE_BOUNDARY: usize = 256 * 1024;
/// Keepalive flag: this frame answers a probe.
const PROBE_REPLY: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Quic,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// `peer` is `host:port`: an address, or a name resolved at every attempt
    /// (pods get a new address when they are recreated).
    Dial {
        peer: String,
    },
    Accept,
}

/// What identifies a link's connection: a change here needs a new connection;
/// parameter changes do not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    pub topology: String,
    pub name: String,
    pub local_node: String,
    pub peer_node: String,
    pub role: Role,
    pub transport: Transport,
}

/// What every link of the agent shares.
#[derive(Clone)]
pub struct LinkContext {
    pub processors: Processors,
    /// The node's routes, for frames that cut through to their next link.
    pub routes: crate::processor::Routes,
    pub quic: Option<quinn::Endpoint>,
    pub mtu: u32,
    /// Signs this node's link handshakes (the topology's link key).
    pub auth: Option<crate::link_auth::LinkKey>,
    /// The experiment's seed (`NodeConfig.seed`), mixed into every link's.
    pub seed: u64,
}

/// Handle to a running link; dropping the last one stops its task.
pub struct LinkHandle {
    pub spec: LinkSpec,
    pub counters: Arc<LinkCounters>,
    queue: mpsc::Sender<Packet>,
    direct: mpsc::Sender<DirectFrame>,
    /// Set by the task while the link takes frames cut-through: connected over
    /// TCP with a transparent pipeline.
    cut_through: Arc<std::sync::atomic::AtomicBool>,
    attach: mpsc::Sender<Conn>,
    params: watch::Sender<pb::LinkParams>,
    /// Attaches a capture's tap to the pipeline.
    taps: mpsc::Sender<Box<dyn Tap>>,
    /// The running capture's channel: it is running while its reader is open.
    /// Weak, so that a tap that has what it wanted ends the stream by dropping.
    capturing: std::sync::Mutex<Option<mpsc::WeakSender<crate::capture::CapturedPacket>>>,
    /// The pipeline's clock starts here.
    epoch: Instant,
    /// Set by a scenario's `state: down`: the link takes no packets until it
    /// is up again (each end stops its own direction).
    down: std::sync::atomic::AtomicBool,
    _stop: watch::Sender<()>,
}

impl std::fmt::Debug for LinkHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkHandle")
            .field("spec", &self.spec)
            .finish()
    }
}

impl LinkHandle {
    /// Starts the link. Invalid parameters are refused here, before anything runs.
    pub fn spawn(
        spec: LinkSpec,
        params: pb::LinkParams,
        context: LinkContext,
    ) -> Result<Arc<LinkHandle>, crate::sched::ConfigError> {
        let seed = seed_for(&spec, context.seed);
        let pipeline = Pipeline::new(&params, context.mtu, seed)?;
        let (queue, queue_rx) = mpsc::channel(HANDOFF_QUEUE);
        let (direct, direct_rx) = mpsc::channel(DIRECT_QUEUE);
        let cut_through = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (attach, attach_rx) = mpsc::channel(4);
        let (stop, stop_rx) = watch::channel(());
        let (params_tx, params_rx) = watch::channel(params);
        let (taps, taps_rx) = mpsc::channel(1);
        let counters = Arc::new(LinkCounters::default());
        let epoch = Instant::now();
        let task = LinkTask {
            spec: spec.clone(),
            counters: counters.clone(),
            context,
            queue: queue_rx,
            direct: direct_rx,
            cut_through: cut_through.clone(),
            attach: attach_rx,
            params: params_rx,
            taps: taps_rx,
            stop: stop_rx,
            pipeline,
            epoch,
            ready: Vec::new(),
        };
        tokio::spawn(task.run());
        Ok(Arc::new(LinkHandle {
            spec,
            counters,
            queue,
            direct,
            cut_through,
            attach,
            params: params_tx,
            taps,
            capturing: std::sync::Mutex::new(None),
            epoch,
            down: std::sync::atomic::AtomicBool::new(false),
            _stop: stop,
        }))
    }

    /// Queues a packet for the peer; a full hand-off queue drops it.
    pub fn enqueue(&self, packet: Packet) {
        if self.down.load(Relaxed) {
            self.counters.count_down_drop();
        } else if self.queue.try_send(packet).is_err() {
            self.counters.count_drop();
        }
    }

    /// Whether frames may come straight from another link's receiving task
    /// (`crate::cut_through`) rather than through the processors.
    pub fn takes_cut_through(&self) -> bool {
        self.cut_through.load(Relaxed) && !self.down.load(Relaxed)
    }

    /// Queues a frame from another link's receiving task; dropped as
    /// [`LinkHandle::enqueue`] drops.
    pub fn send_direct(&self, frame: DirectFrame) {
        if self.down.load(Relaxed) {
            self.counters.count_down_drop();
        } else if self.direct.try_send(frame).is_err() {
            self.counters.count_drop();
        }
    }

    /// Gives an accepted connection (handshake already read) to this link.
    pub async fn attach(&self, conn: Conn) {
        if self.attach.send(conn).await.is_err() {
            tracing::debug!(link = %self.spec.name, "link stopped; connection dropped");
        }
    }

    /// Captures what the pipeline does to each packet this node sends on the
    /// link, into `tx` (see `crate::capture`). Refused while another capture
    /// of the link runs.
    pub fn capture(
        &self,
        tx: mpsc::Sender<crate::capture::CapturedPacket>,
        snaplen: u32,
        count: Option<u64>,
        counters: Arc<crate::capture::TapCounters>,
    ) -> Result<(), crate::capture::Busy> {
        {
            let mut current = self
                .capturing
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if current
                .as_ref()
                .and_then(mpsc::WeakSender::upgrade)
                .is_some_and(|tx| !tx.is_closed())
            {
                return Err(crate::capture::Busy);
            }
            *current = Some(tx.downgrade());
        }
        let unix_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let offset = unix_now.saturating_sub(self.epoch.elapsed()).as_nanos() as u64;
        let tap = crate::capture::LinkTap::new(tx, snaplen, count, offset, counters);
        // The new tap replaces an ended capture's, which the pipeline may still
        // hold if no packet has passed since. The slot is full only if that
        // one has not reached the task yet; a closed slot is a stopped link.
        // Either way the tap dropped here ends its capture.
        let _ = self.taps.try_send(Box::new(tap));
        Ok(())
    }

    /// Takes the link down (it drops what it is given, as a cut wire would)
    /// or brings it up again. Packets already queued still leave.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Relaxed);
    }

    pub fn is_down(&self) -> bool {
        self.down.load(Relaxed)
    }

    /// Configured shaped rate of the direction this node sends, bit/s (0 = unlimited).
    pub fn rate_bps(&self) -> u64 {
        self.params.borrow().rate_bps
    }

    /// Applies new emulation parameters without touching the connection.
    /// Checked first, so a bad change leaves the running ones in place.
    pub fn set_params(
        &self,
        params: pb::LinkParams,
        mtu: u32,
    ) -> Result<(), crate::sched::ConfigError> {
        Pipeline::<Outbound>::new(&params, mtu, 0)?;
        self.params.send_if_modified(|current| {
            if *current == params {
                return false;
            }
            *current = params;
            true
        });
        Ok(())
    }
}

/// Per-link seed: runs with the same experiment seed are reproducible, links
/// are not correlated. FNV-1a over the seed, the topology's name, the link and
/// the sending node; an experiment seed of 0 gives the streams of before it
/// existed. The name, not its namespace: the same manifest draws the same
/// numbers in every namespace and in local mode.
fn seed_for(spec: &LinkSpec, experiment: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ experiment;
    for b in nextmini_proto::topology_key::name_of(&spec.topology)
        .bytes()
        .chain(spec.name.bytes())
        .chain(spec.local_node.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

struct LinkTask {
    spec: LinkSpec,
    counters: Arc<LinkCounters>,
    context: LinkContext,
    queue: mpsc::Receiver<Packet>,
    direct: mpsc::Receiver<DirectFrame>,
    cut_through: Arc<std::sync::atomic::AtomicBool>,
    attach: mpsc::Receiver<Conn>,
    params: watch::Receiver<pb::LinkParams>,
    taps: mpsc::Receiver<Box<dyn Tap>>,
    stop: watch::Receiver<()>,
    pipeline: Pipeline<Outbound>,
    epoch: Instant,
    /// Reused for every poll, so transmitting allocates nothing.
    ready: Vec<Outbound>,
}

enum Outcome {
    Stopped,
    Replaced(Conn),
    Broken(String),
}

type FrameWriter = FramedWrite<crate::conn::Writer, FrameCodec>;

impl LinkTask {
    async fn run(mut self) {
        let mut next: Option<Conn> = None;
        loop {
            let conn = match next.take() {
                Some(c) => c,
                None => match self.connect().await {
                    Some(c) => c,
                    None => return,
                },
            };
            self.counters.set_connected(true);
            tracing::info!(link = %self.spec.name, peer = %self.spec.peer_node, transport = ?self.spec.transport, "link up");
            let outcome = self.carry(conn).await;
            self.counters.set_connected(false);
            match outcome {
                Outcome::Stopped => return,
                Outcome::Replaced(c) => next = Some(c),
                Outcome::Broken(reason) => {
                    tracing::warn!(link = %self.spec.name, %reason, "link down")
                }
            }
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// A fresh connection: dialed with backoff, or handed over by the listener.
    /// `None` when the link is being removed.
    async fn connect(&mut self) -> Option<Conn> {
        match self.spec.role.clone() {
            Role::Accept => tokio::select! {
                c = self.attach.recv() => c,
                _ = self.stop.changed() => None,
            },
            Role::Dial { peer } => {
                let mut backoff = BACKOFF_MIN;
                loop {
                    match dial(
                        &self.spec,
                        self.context.quic.as_ref(),
                        self.context.auth.as_ref(),
                        &peer,
                    )
                    .await
                    {
                        Ok(c) => return Some(c),
                        Err(e) => {
                            tracing::debug!(link = %self.spec.name, %peer, error = %e, "dial failed")
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = self.stop.changed() => return None,
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// Moves frames both ways until the connection breaks, the link is removed,
    /// or the peer reconnects.
    async fn carry(&mut self, conn: Conn) -> Outcome {
        let Conn {
            reader,
            writer,
            _quic: quic_connection,
        } = conn;
        let mut writer: FrameWriter = FramedWrite::new(writer, FrameCodec);
        writer.set_backpressure_boundary(WRITE_BOUNDARY);
        let (echo_tx, mut echo_rx) = mpsc::channel::<bytes::Bytes>(8);
        let rx = Receiver {
            counters: self.counters.clone(),
            processors: self.context.processors.clone(),
            routes: self.context.routes.clone(),
            pipes: crate::cut_through::PipePool::default(),
            link: self.spec.name.clone(),
            epoch: self.epoch,
            echo: echo_tx,
        };
        let tcp = reader.tcp().is_some();
        let mut inbound = tokio::spawn(async move {
            if tcp {
                crate::cut_through::receive(reader, rx).await
            } else {
                receive(
                    FramedRead::with_capacity(reader, FrameCodec, READ_BUFFER),
                    rx,
                )
                .await
            }
        });
        // The first probe goes at once, so the round trip is known early.
        // Only the dialer probes (see `crate::probe`).
        let prober = matches!(self.spec.role, Role::Dial { .. });
        let probe = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(probe);
        let traffic = |c: &LinkCounters| c.tx_packets.load(Relaxed) + c.rx_packets.load(Relaxed);
        let mut traffic_at_probe = traffic(&self.counters);
        let mut timer = match PreciseTimer::new() {
            Ok(t) => t,
            Err(e) => return Outcome::Broken(format!("timer: {e}")),
        };
        let mut wakeup: Option<u64> = None;
        let outcome = loop {
            self.cut_through
                .store(tcp && self.pipeline.is_transparent(), Relaxed);
            let deadline = wakeup.map(|ns| self.epoch + Duration::from_nanos(ns));
            let precise = holds_few_packets(self.pipeline.stats());
            tokio::select! {
                packet = self.queue.recv() => {
                    let Some(packet) = packet else { break Outcome::Stopped };
                    self.intake(packet);
                }
                Some(frame) = self.direct.recv() => {
                    if let Err(e) = self.direct_intake(frame, &mut writer).await {
                        break Outcome::Broken(e);
                    }
                }
                _ = async {
                    let deadline = deadline.unwrap_or_else(Instant::now);
                    if precise {
                        timer.sleep_until_precisely(deadline).await
                    } else {
                        timer.sleep_until(deadline).await
                    }
                }, if deadline.is_some() => {}
                _ = &mut probe, if prober => {
                    let sent = crate::probe::Probe {
                        sent_at_ns: self.now(),
                        rtt_us: self.counters.rtt_us.load(Relaxed),
                    };
                    if let Err(e) = writer.send(keepalive(0, sent.encode())).await {
                        break Outcome::Broken(e.to_string());
                    }
                    let now = traffic(&self.counters);
                    let busy = now != traffic_at_probe;
                    traffic_at_probe = now;
                    let next = crate::probe::next_at(
                        Instant::now(),
                        busy,
                        sent.rtt_us > 0,
                        crate::probe::agent_grid(),
                    );
                    probe.as_mut().reset(next.into());
                }
                echo = echo_rx.recv() => {
                    if let Some(payload) = echo
                        && let Err(e) = writer.send(keepalive(PROBE_REPLY, payload)).await
                    {
                        break Outcome::Broken(e.to_string());
                    }
                }
                changed = self.params.changed() => {
                    if changed.is_err() { break Outcome::Stopped; }
                    let params = self.params.borrow_and_update().clone();
                    if let Err(e) = self.pipeline.reconfigure(&params) {
                        tracing::warn!(link = %self.spec.name, error = %e, "link parameters refused");
                    } else {
                        tracing::info!(link = %self.spec.name, "link parameters changed");
                    }
                }
                Some(tap) = self.taps.recv() => {
                    self.pipeline.set_tap(Some(tap));
                    tracing::info!(link = %self.spec.name, "capture started");
                }
                replacement = self.attach.recv() => match replacement {
                    Some(c) => break Outcome::Replaced(c),
                    None => break Outcome::Stopped,
                },
                ended = &mut inbound => {
                    break Outcome::Broken(match ended {
                        Ok(e) => e,
                        Err(e) => e.to_string(),
                    });
                }
                _ = self.stop.changed() => break Outcome::Stopped,
            }
            match self.transmit(&mut writer).await {
                Ok(next) => wakeup = next,
                Err(e) => break Outcome::Broken(e),
            }
        };
        self.cut_through.store(false, Relaxed);
        inbound.abort();
        drop(quic_connection);
        outcome
    }

    /// Puts a packet, and whatever else is waiting, into the pipeline.
    fn intake(&mut self, first: Packet) {
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(packet) = next.take() {
            self.offer_one(packet);
            taken += 1;
            if taken < INTAKE_BATCH {
                next = self.queue.try_recv().ok();
            }
        }
    }

    fn offer_one(&mut self, packet: Packet) {
        let now = self.now();
        if let Err(e) = offer(&mut self.pipeline, packet, now) {
            self.counters.count_drop();
            tracing::debug!(link = %self.spec.name, error = %e, "offloaded packet dropped");
        }
    }

    /// Takes a frame from another link's receiving task, and whatever else is
    /// waiting, so that one write carries them all: a write per frame would
    /// make a TCP segment per frame, and every hop after this one would wake
    /// up for each.
    async fn direct_intake(
        &mut self,
        first: DirectFrame,
        writer: &mut FrameWriter,
    ) -> Result<(), String> {
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(frame) = next.take() {
            self.take_direct(frame, writer).await?;
            taken += 1;
            if taken < INTAKE_BATCH {
                next = self.direct.try_recv().ok();
            }
        }
        Ok(())
    }

    /// A frame from another link's receiving task. A spliced one goes from its
    /// pipe into the socket, after whatever the writer holds, if the link is
    /// still transparent and holds no packet of before; otherwise it is read
    /// out and takes the pipeline, so nothing is lost or overtaken.
    async fn take_direct(
        &mut self,
        frame: DirectFrame,
        writer: &mut FrameWriter,
    ) -> Result<(), String> {
        let (mut pipe, len, packets, bytes) = match frame {
            DirectFrame::Copied(packet) => {
                self.offer_one(packet);
                return Ok(());
            }
            DirectFrame::Spliced {
                pipe,
                len,
                packets,
                bytes,
            } => (pipe, len, packets, bytes),
        };
        let transparent = writer.get_ref().tcp().is_some() && self.pipeline.is_transparent();
        if transparent && !self.pipeline.is_empty() {
            // Copied frames taken just before this one go first.
            self.transmit(writer).await?;
        }
        let passes = transparent && self.pipeline.is_empty();
        if !passes {
            let raw = pipe.drain().map_err(|e| format!("cut-through pipe: {e}"))?;
            match crate::cut_through::packet_of(raw) {
                Ok(packet) => self.offer_one(packet),
                Err(e) => {
                    self.counters.count_drop();
                    tracing::debug!(link = %self.spec.name, error = %e, "cut-through frame dropped");
                }
            }
            return Ok(());
        }
        SinkExt::<DataFrame>::flush(writer)
            .await
            .map_err(|e| e.to_string())?;
        let Some(stream) = writer.get_ref().tcp() else {
            return Err("cut-through on a link that is not TCP".into());
        };
        pipe.empty_into(stream, len)
            .await
            .map_err(|e| e.to_string())?;
        self.counters.count_tx(packets, bytes);
        self.counters.count_spliced(len as u64);
        Ok(())
    }

    /// Sends every packet the pipeline releases now; returns when to look again.
    async fn transmit(&mut self, writer: &mut FrameWriter) -> Result<Option<u64>, String> {
        let now = self.now();
        let next = self
            .pipeline
            .poll_with_slack(now, RELEASE_SLACK, &mut self.ready);
        let sent = !self.ready.is_empty();
        for out in self.ready.drain(..) {
            let (packets, bytes) = out.offload.wire_size(&out.data);
            let offload = (!out.offload.is_finished()).then(|| out.offload.to_wire());
            writer
                .feed(DataFrame {
                    hops: out.hops,
                    label: out.label,
                    offload,
                    packet: out.data,
                })
                .await
                .map_err(|e| e.to_string())?;
            self.counters.count_tx(packets, bytes);
        }
        if sent {
            SinkExt::<DataFrame>::flush(writer)
                .await
                .map_err(|e| e.to_string())?;
        }
        self.counters
            .record_lateness(self.pipeline.take_max_lateness());
        self.counters.record_pipeline(self.pipeline.stats());
        Ok(next)
    }
}

/// Whether the link's next wake-up is worth a precise timer: a link holding a
/// packet or two (a ping, a request) hands each out at its own instant, and the
/// machine's wake-up latency would add to its delay. A busy link hands packets
/// out in batches up to `RELEASE_SLACK` early anyway, and spinning for it would
/// cost CPU on every batch.
fn holds_few_packets(stats: &crate::sched::PipelineStats) -> bool {
    stats.queued.packets + stats.in_flight <= LONE_PACKETS
}

/// See [`holds_few_packets`].
const LONE_PACKETS: u64 = 2;

/// Puts one packet into the pipeline. A link that acts on single packets gets
/// a super-packet as the MTU-sized packets a NIC would put on a wire, with
/// finished checksums (offload.rs, DESIGN.md "TUN offloads"); one that cannot
/// tell the difference gets it whole.
fn offer(
    pipeline: &mut Pipeline<Outbound>,
    packet: Packet,
    now: u64,
) -> Result<(), offload::OffloadError> {
    let (label, hops) = (packet.label, packet.hops);
    if packet.offload.is_finished() || pipeline.passes_aggregates() {
        // Queued as it came: a transit hop's packet is a slice of the read
        // buffer and is not copied (an ECN mark or a corruption copies it
        // then, see `Payload for Bytes`).
        let meta = PacketMeta::from_ip(&packet.data);
        let out = Outbound {
            data: packet.data,
            label,
            hops,
            offload: packet.offload,
        };
        pipeline.enqueue(out, meta, now);
        return Ok(());
    }
    if let Some(per_train) = pipeline.train_segments() {
        return offer_trains(pipeline, packet, per_train, now);
    }
    finish_and_offer(pipeline, packet, now)
}

/// Puts a super-packet into a link that takes trains: trains that fit the
/// queue go in whole; one that does not is cut into its packets, so the tail
/// drop takes exactly the packets that overflow.
fn offer_trains(
    pipeline: &mut Pipeline<Outbound>,
    packet: Packet,
    per_train: usize,
    now: u64,
) -> Result<(), offload::OffloadError> {
    let (label, hops) = (packet.label, packet.hops);
    let mut result = Ok(());
    offload::chunk(
        packet.data,
        packet.offload,
        per_train,
        &mut |data, offload, segments| {
            let (_, wire_bytes) = offload.wire_size(&data);
            let mut meta = PacketMeta::from_ip(&data);
            meta.len = u32::try_from(wire_bytes).unwrap_or(u32::MAX);
            let train = Outbound {
                data,
                label,
                hops,
                offload,
            };
            let refused = if segments <= 1 {
                Some(train)
            } else {
                pipeline.enqueue_train(train, meta, segments, now).err()
            };
            if let Some(train) = refused {
                let packet = Packet {
                    data: train.data,
                    label,
                    hops,
                    offload,
                };
                if let Err(e) = finish_and_offer(pipeline, packet, now) {
                    result = Err(e);
                }
            }
        },
    )?;
    result
}

/// Cuts a packet into the finished MTU-sized packets a NIC would send and
/// offers each.
fn finish_and_offer(
    pipeline: &mut Pipeline<Outbound>,
    packet: Packet,
    now: u64,
) -> Result<(), offload::OffloadError> {
    let (label, hops) = (packet.label, packet.hops);
    let data = packet
        .data
        .try_into_mut()
        .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
    offload::finish(data, packet.offload, &mut |data| {
        let meta = PacketMeta::from_ip(&data);
        let out = Outbound {
            data: data.freeze(),
            label,
            hops,
            offload: Offload::default(),
        };
        pipeline.enqueue(out, meta, now);
    })
}

/// Connects to the peer and sends the link handshake.
async fn dial(
    spec: &LinkSpec,
    quic: Option<&quinn::Endpoint>,
    auth: Option<&crate::link_auth::LinkKey>,
    peer: &str,
) -> Result<Conn, String> {
    let peer = resolve(peer).await?;
    let hello = LinkHello {
        topology: spec.topology.clone(),
        link: spec.name.clone(),
        node: spec.local_node.clone(),
    }
    .encode();
    // The tag follows the hello fields; decoders of the hello ignore it.
    let payload = match auth {
        Some(key) => {
            let tag = key.sign(&hello, crate::link_auth::unix_ms());
            let mut signed = bytes::BytesMut::from(&hello[..]);
            signed.extend_from_slice(&tag);
            signed.freeze()
        }
        None => hello,
    };
    let hello = Frame::new(FrameKind::Hello, 0, payload);
    let timeout = Duration::from_secs(2);
    match spec.transport {
        Transport::Tcp => {
            let stream = tokio::time::timeout(timeout, TcpStream::connect(peer))
                .await
                .map_err(|_| "connect timed out".to_string())?
                .map_err(|e| e.to_string())?;
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            crate::congestion::apply_to_link(&stream);
            let mut conn = Conn::tcp(stream);
            send_one(&mut conn, hello).await?;
            Ok(conn)
        }
        Transport::Quic => {
            let endpoint = quic.ok_or("this agent has no QUIC endpoint")?;
            let connecting = endpoint
                .connect(peer, quic::SERVER_NAME)
                .map_err(|e| e.to_string())?;
            let connection = tokio::time::timeout(timeout, connecting)
                .await
                .map_err(|_| "QUIC handshake timed out".to_string())?
                .map_err(|e| e.to_string())?;
            let (send, recv) = connection.open_bi().await.map_err(|e| e.to_string())?;
            let mut conn = Conn::quic(connection, send, recv);
            send_one(&mut conn, hello).await?;
            Ok(conn)
        }
    }
}

/// The first IPv4 address of `host:port` (the underlay is IPv4).
async fn resolve(peer: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = peer.parse() {
        return Ok(addr);
    }
    tokio::net::lookup_host(peer)
        .await
        .map_err(|e| format!("resolving {peer}: {e}"))?
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| format!("{peer} has no IPv4 address"))
}

/// A packet inside the pipeline, with what the frame needs besides the bytes.
#[derive(Debug, Clone)]
pub struct Outbound {
    pub data: Bytes,
    pub label: u32,
    pub hops: u16,
    /// Left undone by the sending kernel; only on links that pass super-packets.
    pub offload: Offload,
}

impl Payload for Outbound {
    fn bytes(&self) -> &[u8] {
        &self.data
    }

    fn edit<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        self.data.edit(f)
    }
}

async fn send_one(conn: &mut Conn, frame: Frame) -> Result<(), String> {
    let mut w = FramedWrite::new(&mut conn.writer, FrameCodec);
    w.send(frame).await.map_err(|e| e.to_string())
}

/// A keepalive frame: a probe (flags 0) or its echo (flags `PROBE_REPLY`),
/// carrying a [`crate::probe::Probe`]; it bypasses the emulation pipeline, so
/// the round trip is the connection's own.
fn keepalive(flags: u8, payload: bytes::Bytes) -> Frame {
    Frame {
        header: FrameHeader {
            kind: FrameKind::Keepalive,
            hops: 0,
            flags,
            label: 0,
            payload_len: payload.len() as u32,
        },
        payload,
    }
}

/// What the receiving half needs.
pub(crate) struct Receiver {
    pub(crate) counters: Arc<LinkCounters>,
    processors: Processors,
    pub(crate) routes: crate::processor::Routes,
    pub(crate) pipes: crate::cut_through::PipePool,
    pub(crate) link: String,
    epoch: Instant,
    echo: mpsc::Sender<bytes::Bytes>,
}

/// The receiving half of a QUIC link: frames from the peer go to
/// [`Receiver::take`]. Returns why it stopped. (A TCP link's is
/// `crate::cut_through::receive`.)
async fn receive(mut reader: FramedRead<crate::conn::Reader, FrameCodec>, rx: Receiver) -> String {
    while let Some(frame) = reader.next().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => return format!("bad frame from peer of {}: {e}", rx.link),
        };
        if let Err(e) = rx.take(frame).await {
            return e;
        }
    }
    format!("peer of {} closed the connection", rx.link)
}

impl Receiver {
    /// A whole frame from the peer: a packet goes cut-through to its next link
    /// if that one is transparent, else to the processors; probes are echoed
    /// and echoes give the round trip. An error ends the connection.
    pub(crate) async fn take(&self, frame: Frame) -> Result<(), String> {
        match frame.header.kind {
            FrameKind::Data => {
                let packet = Packet::from_frame(&frame.header, frame.payload)
                    .map_err(|e| format!("bad frame from peer of {}: {e}", self.link))?;
                let (packets, bytes) = packet.offload.wire_size(&packet.data);
                self.counters.count_rx(packets, bytes);
                match crate::cut_through::next_hop(
                    &self.routes,
                    &packet.data,
                    packet.label,
                    packet.hops,
                ) {
                    Some(hop) => hop.link.send_direct(DirectFrame::Copied(Packet {
                        label: hop.label,
                        hops: hop.hops,
                        ..packet
                    })),
                    None => self.processors.dispatch(packet).await,
                }
            }
            FrameKind::Keepalive if frame.header.flags & PROBE_REPLY == 0 => {
                // The dialer's round trip is this end's too: the same
                // connection, crossed both ways.
                if let Some(probe) = crate::probe::Probe::decode(&frame.payload)
                    && probe.rtt_us > 0
                {
                    self.counters.set_rtt_us(probe.rtt_us);
                }
                // A full echo queue means probes pile up; skipping one is harmless.
                let _ = self.echo.try_send(frame.payload);
            }
            FrameKind::Keepalive => {
                if let Some(sent) = crate::probe::Probe::decode(&frame.payload) {
                    let now = self.epoch.elapsed().as_nanos() as u64;
                    let rtt_ns = now.saturating_sub(sent.sent_at_ns);
                    self.counters.set_rtt_us(rtt_ns / 1000);
                }
            }
            FrameKind::Hello => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offload::tests::{checksums_verify, tcp_offload, tcp_super};

    const MTU: u32 = 1400;

    /// 4000 bytes of TCP payload in one super-packet: three segments of 1348.
    fn super_packet() -> Packet {
        Packet {
            data: tcp_super(&[5; 4000], 1, 0x18, 1).freeze(),
            label: 3,
            hops: 2,
            offload: tcp_offload(1348),
        }
    }

    fn spec(topology: &str, name: &str) -> LinkSpec {
        LinkSpec {
            topology: topology.into(),
            name: name.into(),
            local_node: "a".into(),
            peer_node: "b".into(),
            role: Role::Accept,
            transport: Transport::Tcp,
        }
    }

    #[test]
    fn a_links_random_stream_follows_the_topologys_name_not_its_namespace() {
        let local = seed_for(&spec("wan", "a-b"), 7);
        assert_eq!(local, seed_for(&spec("team-a/wan", "a-b"), 7));
        assert_eq!(local, seed_for(&spec("team-b/wan", "a-b"), 7));
        assert_ne!(local, seed_for(&spec("team-a/wan", "a-c"), 7));
        assert_ne!(local, seed_for(&spec("lan", "a-b"), 7));
    }

    /// What the pipeline lets out, far enough in the future for any delay.
    fn offered(params: pb::LinkParams) -> Vec<Outbound> {
        let mut pipeline = Pipeline::new(&params, MTU, 1).expect("valid parameters");
        offer(&mut pipeline, super_packet(), 0).expect("a valid super-packet");
        pipeline.poll(10_000_000_000).packets
    }

    #[test]
    fn links_that_cannot_tell_take_a_super_packet_whole() {
        for params in [
            pb::LinkParams::default(),
            pb::LinkParams {
                delay_us: 10_000,
                queue_packets: 2,
                ..Default::default()
            },
        ] {
            let out = offered(params.clone());
            assert_eq!(out.len(), 1, "{params:?}");
            assert!(out[0].offload.is_gso(), "still to be cut: {params:?}");
            assert_eq!((out[0].label, out[0].hops), (3, 2));
        }
    }

    #[test]
    fn links_that_act_per_packet_get_finished_mtu_sized_packets() {
        for params in [
            // A segment takes 1.1 ms at 10 Mbit/s: more than the release slack.
            pb::LinkParams {
                rate_bps: 10_000_000,
                ..Default::default()
            },
            pb::LinkParams {
                rate_bps: 1_000_000_000,
                queue: Some(pb::QueueConfig {
                    aqm: Some(pb::queue_config::Aqm::Red(pb::Red {
                        min_packets: 5,
                        max_packets: 15,
                        max_p_ppm: 100_000,
                        weight_ppm: 2_000,
                        ..Default::default()
                    })),
                    ..Default::default()
                }),
                ..Default::default()
            },
            pb::LinkParams {
                jitter_us: 1,
                delay_us: 10,
                ..Default::default()
            },
            pb::LinkParams {
                corrupt_ppm: 1,
                ..Default::default()
            },
            pb::LinkParams {
                reorder_ppm: 1,
                delay_us: 10,
                ..Default::default()
            },
        ] {
            let out = offered(params.clone());
            assert_eq!(out.len(), 3, "{params:?}");
            for o in &out {
                assert!(o.offload.is_finished(), "{params:?}");
                assert!(o.data.len() as u32 <= MTU, "{} bytes", o.data.len());
                assert!(checksums_verify(&o.data));
                assert_eq!((o.label, o.hops), (3, 2));
            }
        }
    }

    #[test]
    fn a_plain_rate_limited_link_takes_a_super_packet_as_a_train() {
        let params = pb::LinkParams {
            rate_bps: 1_000_000_000,
            delay_us: 5_000,
            ..Default::default()
        };
        let mut pipeline = Pipeline::new(&params, MTU, 1).expect("valid parameters");
        offer(&mut pipeline, super_packet(), 0).expect("a valid super-packet");
        let out = pipeline.poll(10_000_000_000).packets;
        assert_eq!(out.len(), 1, "one train");
        assert!(out[0].offload.is_gso(), "the receiver's kernel cuts it");
        assert_eq!((out[0].label, out[0].hops), (3, 2));
        let stats = pipeline.stats();
        assert_eq!(
            (stats.enqueued, stats.sent_packets),
            (3, 3),
            "counted as its packets"
        );
        assert_eq!(stats.sent_bytes, 3 * (52 + 1348) - 1348 * 3 + 4000);
    }

    /// Trains move the instants packets leave at by no more than the release
    /// slack: against the same super-packets offered as single packets, each
    /// train leaves at its first packet's instant, and the link's schedule
    /// (the instant the next train may leave) is the per-packet one within
    /// 1 µs.
    #[test]
    fn trains_keep_the_per_packet_schedule() {
        let params = pb::LinkParams {
            rate_bps: 100_000_000,
            delay_us: 2_000,
            queue_packets: 1000,
            ..Default::default()
        };
        let departures = |trains: bool| {
            let mut pipeline = Pipeline::new(&params, MTU, 1).expect("valid parameters");
            for _ in 0..10 {
                let packet = super_packet();
                if trains {
                    offer(&mut pipeline, packet, 0).expect("valid");
                } else {
                    finish_and_offer(&mut pipeline, packet, 0).expect("valid");
                }
            }
            // Poll every microsecond, noting when each segment came out.
            let mut at = Vec::new();
            let mut now = 0;
            while at.len() < 30 && now < 1_000_000_000 {
                for p in pipeline.poll(now).packets {
                    let (segments, _) = p.offload.wire_size(&p.data);
                    at.extend(std::iter::repeat_n(now, segments as usize));
                }
                now += 1_000;
            }
            at
        };
        let single = departures(false);
        let trains = departures(true);
        assert_eq!((single.len(), trains.len()), (30, 30));
        for train in trains.chunks(3) {
            assert!(
                train.iter().all(|t| *t == train[0]),
                "a train arrives whole"
            );
        }
        for (i, (t, s)) in trains.iter().zip(&single).enumerate() {
            let first_of_train = single[i - i % 3];
            assert!(
                t.abs_diff(first_of_train) <= 1_000,
                "segment {i}: train at {t} ns, its first packet alone at {first_of_train} ns"
            );
            assert!(
                s - t <= RELEASE_SLACK.ahead_ns,
                "segment {i} early by {} ns",
                s - t
            );
        }
    }

    /// A train that does not fit its queue is cut into its packets, so the
    /// tail drop takes what it would take from the same burst of packets.
    #[test]
    fn a_train_that_overflows_its_queue_is_cut_into_packets() {
        for limit in 1..=3 {
            let params = pb::LinkParams {
                rate_bps: 1_000_000_000,
                queue_packets: limit,
                ..Default::default()
            };
            let counts = |trains: bool| {
                let mut pipeline = Pipeline::new(&params, MTU, 1).expect("valid parameters");
                if trains {
                    offer(&mut pipeline, super_packet(), 0).expect("valid");
                } else {
                    finish_and_offer(&mut pipeline, super_packet(), 0).expect("valid");
                }
                let s = pipeline.stats();
                (s.enqueued, s.drops.queue_full)
            };
            assert_eq!(counts(true), counts(false), "queue limit {limit}");
            if limit == 1 {
                assert_eq!(counts(true), (2, 1), "the burst overflows a queue of one");
            }
        }
    }

    #[test]
    fn loss_and_queue_limits_count_segments_not_super_packets() {
        // The first segment leaves at once on the bucket's burst, the second
        // takes the one place in the queue, the third is a tail drop.
        let params = pb::LinkParams {
            rate_bps: 1_000_000,
            queue_packets: 1,
            ..Default::default()
        };
        let mut pipeline = Pipeline::new(&params, MTU, 1).expect("valid");
        offer(&mut pipeline, super_packet(), 0).expect("valid");
        let stats = pipeline.stats();
        assert_eq!(stats.enqueued, 2);
        assert_eq!(stats.drops.queue_full, 1);
        // Certain loss drops every segment, one by one.
        let lossy = pb::LinkParams {
            loss_ppm: 1_000_000,
            ..Default::default()
        };
        let mut pipeline = Pipeline::new(&lossy, MTU, 1).expect("valid");
        offer(&mut pipeline, super_packet(), 0).expect("valid");
        assert!(pipeline.poll(1).packets.is_empty());
        assert_eq!(pipeline.stats().drops.loss, 3);
    }
}

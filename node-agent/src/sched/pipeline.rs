//! The link emulation pipeline: classify → enqueue (AQM) → schedule → shaper →
//! impairment → wire. Sans-IO: the owner passes the time in and gets packets out.
//!
//! Departures happen in virtual time: a packet leaves at the instant the shaper
//! allowed it, not when the owner happened to call `poll`. Timers are coarse
//! (tokio's are 1 ms), and charging tokens at the late call instead would lose
//! whatever the bucket could not hold in between, so the emulated rate would
//! depend on timer precision.

use super::aqm::{Aqm, EcnThreshold, Red, TailDrop, Verdict};
use super::classify::{Classifier, RuleClassifier};
use super::config::{
    AqmConfig, ConfigError, LinkConfig, MAX_QUEUES, QueueLimits, SchedulerConfig, ShaperConfig,
};
use super::delay_line::DelayLine;
use super::impair::{Action, Impairment, Netem, Release};
use super::queue::{Entry, QueueState, Queues};
use super::scheduler::{Drr, Fcfs, Scheduler, StrictPriority, Wrr};
use super::schemes::{self, LinkContext};
use super::shaper::{Shaper, TokenBucket};
use super::tap::{PacketFate, Tap, TapVerdict};
use super::trace_shaper::TraceShaper;
use super::{PacketMeta, Payload};
use nextmini_proto::v1::LinkParams;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::fmt;

/// Transmission time of one packet assumed for RED's idle decay on an unlimited link.
const UNLIMITED_TX_TIME_NS: u64 = 1_000;
/// A packet handed out this much later than the emulated link released it
/// counts as late (the fidelity guard's bound, DESIGN.md "Fidelity guard"). A
/// busy but sufficient agent wakes within a few hundred microseconds; a late
/// millisecond is a millisecond of delay nobody configured.
pub const LATE_BOUND_NS: u64 = 1_000_000;

/// How far ahead of its exact release instant a packet may be handed out, so
/// that one wake-up of the owner serves several packets: at 200 Mbit/s every
/// packet has its own instant 56 µs after the last, and waking (and re-arming a
/// timer, and writing to the connection) once per packet cost most of a link's
/// CPU. Departures are still computed exactly in virtual time; only the hand-out
/// moves, never later than the instant and never more than `ahead_ns` before
/// it, and at most `packets` early ones per poll (DESIGN.md, "Release slack").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseSlack {
    pub ahead_ns: u64,
    pub packets: usize,
}

impl ReleaseSlack {
    /// Every packet at its exact instant.
    pub const NONE: ReleaseSlack = ReleaseSlack {
        ahead_ns: 0,
        packets: 0,
    };
}

/// What a link uses: a millisecond is far below the delays and the jitter
/// worth emulating and the sender's pacing quantum; 16 packets at 1400 bytes
/// are a quarter of a 64 KiB TSO burst, so TCP sees no burst it would not see
/// on a real host with interrupt coalescing.
pub const RELEASE_SLACK: ReleaseSlack = ReleaseSlack {
    ahead_ns: 1_000_000,
    packets: 16,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropCause {
    /// The queue was at its packet or byte limit.
    QueueFull,
    /// The AQM chose to drop.
    Aqm,
    /// Lost on the emulated wire. Decided when the packet leaves the queue (a lost
    /// packet still used the link), so it shows in the stats, never from `enqueue`.
    Loss,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueOutcome {
    Queued,
    /// Queued with ECN CE set in the payload.
    Marked,
    Dropped(DropCause),
}

/// Packets due now, in order, and when to call `poll` next (`None`: nothing is
/// pending until the next `enqueue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poll<P> {
    pub packets: Vec<P>,
    pub next_wakeup: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounts {
    pub queue_full: u64,
    pub aqm: u64,
    pub loss: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueDepth {
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// Packets accepted into a queue.
    pub enqueued: u64,
    /// Packets that left the queues through the shaper (before loss).
    pub dequeued: u64,
    /// Packets (duplicates included) handed out by `poll`, and their bytes.
    pub sent_packets: u64,
    pub sent_bytes: u64,
    pub drops: DropCounts,
    pub ecn_marked: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Packets that overtook one sent before them.
    pub reordered: u64,
    pub corrupted: u64,
    /// Packets in the queues now, and per queue.
    pub queued: QueueDepth,
    pub per_queue: Vec<QueueDepth>,
    /// Packets past the shaper, waiting out their delay.
    pub in_flight: u64,
    /// Packets handed out more than [`LATE_BOUND_NS`] after the emulated link
    /// released them: the owner polled too late (it had no CPU, or too much to do).
    pub late: u64,
    /// The worst lateness since [`Pipeline::take_max_lateness`] was last called.
    pub max_lateness_ns: u64,
    /// Time the link ran behind its emulated schedule by more than
    /// [`LATE_BOUND_NS`]: the union of the late packets' lateness intervals.
    /// It tells one stall (a few ms in a window, however many packets it
    /// caught) from an agent short of CPU (behind most of the window).
    pub behind_ns: u64,
}

/// The schemes a pipeline is made of; build them from `LinkParams` with
/// [`Parts::from_params`] and replace any with your own before
/// [`Pipeline::with_parts`].
pub struct Parts {
    pub classifier: Box<dyn Classifier>,
    /// One per queue: their number is the number of queues.
    pub aqms: Vec<Box<dyn Aqm>>,
    pub scheduler: Box<dyn Scheduler>,
    pub shaper: Box<dyn Shaper>,
    pub impairment: Box<dyn Impairment>,
    pub limits: QueueLimits,
    /// Used for defaults when the pipeline is reconfigured.
    pub mtu: u32,
}

impl Parts {
    pub fn from_params(params: &LinkParams, mtu: u32) -> Result<Parts, ConfigError> {
        Parts::from_config(&LinkConfig::from_params(params, mtu)?)
    }

    /// Fails only for a registered scheme whose settings no longer build, which
    /// `LinkConfig::from_params` already rules out.
    pub fn from_config(cfg: &LinkConfig) -> Result<Parts, ConfigError> {
        let scheduler = scheduler(cfg)?;
        Ok(Parts {
            classifier: classifier(cfg, scheduler.as_ref()),
            aqms: aqms(cfg, cfg.queues)?,
            scheduler,
            shaper: shaper(&cfg.shaper, 0)?,
            impairment: Box::new(Netem::new(&cfg.impairment)),
            limits: cfg.limits,
            mtu: cfg.mtu,
        })
    }
}

/// The scheduler's own classifier when it sorts packets itself, else the
/// link's class rules.
fn classifier(cfg: &LinkConfig, scheduler: &dyn Scheduler) -> Box<dyn Classifier> {
    scheduler.classifier().unwrap_or_else(|| {
        Box::new(RuleClassifier::new(
            cfg.classes.clone(),
            cfg.default_queue(),
        ))
    })
}

fn link_context(cfg: &LinkConfig) -> LinkContext {
    LinkContext {
        mtu: cfg.mtu,
        rate_bps: cfg.shaper.mean_rate_bps(),
    }
}

/// A trace starts at `origin` on the pipeline's clock.
fn shaper(cfg: &ShaperConfig, origin: u64) -> Result<Box<dyn Shaper>, ConfigError> {
    Ok(match &cfg.trace {
        Some(ms) => Box::new(
            TraceShaper::new(ms.clone(), origin)
                .map_err(|e| ConfigError::new("trace_ms", e.to_string()))?,
        ),
        None => Box::new(TokenBucket::new(cfg.rate_bps, cfg.burst_bytes)),
    })
}

fn aqms(cfg: &LinkConfig, n: usize) -> Result<Vec<Box<dyn Aqm>>, ConfigError> {
    (0..n).map(|_| aqm(cfg)).collect()
}

fn aqm(cfg: &LinkConfig) -> Result<Box<dyn Aqm>, ConfigError> {
    Ok(match &cfg.aqm {
        AqmConfig::TailDrop => Box::new(TailDrop),
        AqmConfig::Ecn { threshold_packets } => Box::new(EcnThreshold::new(*threshold_packets)),
        AqmConfig::Red(red) => {
            let tx_time_ns = match cfg.shaper.mean_rate_bps() {
                0 => UNLIMITED_TX_TIME_NS,
                rate => u64::from(cfg.mtu) * 8_000_000_000 / rate,
            };
            Box::new(Red::new(red, tx_time_ns))
        }
        AqmConfig::Scheme(s) => schemes::find_aqm(&s.name)
            .and_then(|entry| entry.build(&s.settings, &link_context(cfg)))
            .map_err(|e| ConfigError::new(format!("queue.aqm.scheme.{}", e.field()), e.reason()))?,
    })
}

fn scheduler(cfg: &LinkConfig) -> Result<Box<dyn Scheduler>, ConfigError> {
    Ok(match &cfg.scheduler {
        SchedulerConfig::Fcfs => Box::new(Fcfs),
        SchedulerConfig::Priority => Box::new(StrictPriority),
        SchedulerConfig::Wrr { weights } => Box::new(Wrr::new(weights.clone())),
        SchedulerConfig::Drr { quanta } => Box::new(Drr::new(quanta.clone())),
        SchedulerConfig::Scheme(s) => schemes::find_scheduler(&s.name)
            .and_then(|entry| entry.build(&s.settings, &link_context(cfg)))
            .map_err(|e| ConfigError::new(format!("scheduler.scheme.{}", e.field()), e.reason()))?,
    })
}

pub struct Pipeline<P> {
    classifier: Box<dyn Classifier>,
    aqms: Vec<Box<dyn Aqm>>,
    scheduler: Box<dyn Scheduler>,
    shaper: Box<dyn Shaper>,
    impairment: Box<dyn Impairment>,
    limits: QueueLimits,
    mtu: u32,
    queues: Queues<P>,
    wire: DelayLine<P>,
    /// Scratch for the impairment's answer, reused so departures do not allocate.
    releases: Vec<Release>,
    rng: SmallRng,
    /// Virtual time of the last departure: departures never go back in time.
    clock: u64,
    /// The latest `now` seen: the time of a `reconfigure` that is not given one.
    last_now: u64,
    /// End of the last interval counted in `stats.behind_ns`, so overlapping
    /// late packets count their shared time once.
    behind_until: u64,
    seq: u64,
    /// When the shaper lets the head of the line go; `None` if not computed since
    /// the queues last changed.
    blocked_until: Option<u64>,
    stats: PipelineStats,
    /// The configuration the built-in parts came from; `None` for custom parts.
    applied: Option<LinkConfig>,
    /// The observer of every packet's fate (a capture), if one is attached.
    tap: Option<Box<dyn Tap>>,
}

impl<P> fmt::Debug for Pipeline<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pipeline")
            .field("applied", &self.applied)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<P: Payload> Pipeline<P> {
    /// The built-in schemes `params` describe. `mtu` sizes the default burst and
    /// DRR quantum; `seed` makes every random decision reproducible.
    pub fn new(params: &LinkParams, mtu: u32, seed: u64) -> Result<Pipeline<P>, ConfigError> {
        let cfg = LinkConfig::from_params(params, mtu)?;
        let mut pipeline = Pipeline::with_parts(Parts::from_config(&cfg)?, seed)?;
        pipeline.applied = Some(cfg);
        Ok(pipeline)
    }

    /// A pipeline of any schemes, built-in or not.
    pub fn with_parts(parts: Parts, seed: u64) -> Result<Pipeline<P>, ConfigError> {
        let n = parts.aqms.len();
        if n == 0 || n > MAX_QUEUES {
            return Err(ConfigError::new(
                "aqms",
                format!("one per queue, 1 to {MAX_QUEUES} queues; got {n}"),
            ));
        }
        Ok(Pipeline {
            classifier: parts.classifier,
            aqms: parts.aqms,
            scheduler: parts.scheduler,
            shaper: parts.shaper,
            impairment: parts.impairment,
            limits: parts.limits,
            mtu: parts.mtu,
            queues: Queues::new(n),
            wire: DelayLine::default(),
            releases: Vec::with_capacity(4),
            rng: SmallRng::seed_from_u64(seed),
            clock: 0,
            last_now: 0,
            behind_until: 0,
            seq: 0,
            blocked_until: None,
            stats: PipelineStats {
                per_queue: vec![QueueDepth::default(); n],
                ..PipelineStats::default()
            },
            applied: None,
            tap: None,
        })
    }

    /// Offers a packet at `now`. Call `poll` afterwards: the packet may be due at once.
    pub fn enqueue(&mut self, payload: P, meta: PacketMeta, now: u64) -> EnqueueOutcome {
        let q = self.queue_at(&meta, now);
        self.admit(q, payload, meta, 1, now)
    }

    /// How many wire packets a train may hold on this link, if it takes
    /// trains: a super-packet cut into trains of that many segments is charged
    /// and released whole, each train leaving at its first segment's instant.
    /// Only a link with nothing that acts on single packets takes them (see
    /// [`LinkConfig::passes_trains`]), and no more segments than leave within
    /// [`RELEASE_SLACK`] at the link's rate, so a segment is early by no more
    /// than a busy link's packets already are. A capture sees single packets.
    pub fn train_segments(&self) -> Option<usize> {
        if self.tap.is_some() {
            return None;
        }
        let cfg = self.applied.as_ref().filter(|c| c.passes_trains())?;
        let segment_ns = u64::from(cfg.mtu) * 8 * 1_000_000_000 / cfg.shaper.rate_bps.max(1);
        let within_slack = RELEASE_SLACK.ahead_ns / segment_ns.max(1) + 1;
        let n = within_slack.min(RELEASE_SLACK.packets as u64) as usize;
        (n > 1).then_some(n)
    }

    /// Offers a train of `segments` wire packets and `meta.len` bytes at
    /// `now` on a link that takes trains. One that does not fit the queue it
    /// would join is handed back, nothing counted: the caller cuts it into
    /// its packets, so that the tail drop takes the packets that overflow, as
    /// it would take them from the burst the train stands for.
    pub fn enqueue_train(
        &mut self,
        payload: P,
        meta: PacketMeta,
        segments: u32,
        now: u64,
    ) -> Result<EnqueueOutcome, P> {
        let q = self.queue_at(&meta, now);
        if !self.fits(&self.queues.states()[q], meta.len, segments) {
            return Err(payload);
        }
        Ok(self.admit(q, payload, meta, segments, now))
    }

    /// The queue a packet joins at `now`, after everything due before `now`
    /// has left, so the AQM and the scheduler see the queue as it is then.
    fn queue_at(&mut self, meta: &PacketMeta, now: u64) -> usize {
        self.advance(now);
        self.classifier.classify(meta).min(self.queues.len() - 1)
    }

    /// Puts `segments` wire packets, as one entry, into queue `q` unless the
    /// AQM or the queue's limits refuse them.
    fn admit(
        &mut self,
        q: usize,
        mut payload: P,
        meta: PacketMeta,
        segments: u32,
        now: u64,
    ) -> EnqueueOutcome {
        let state = self.queues.states()[q];
        let verdict = self.aqms[q].on_enqueue(&state, &meta, now, &mut self.rng);
        let refused = if verdict == Verdict::Drop {
            Some(DropCause::Aqm)
        } else if !self.fits(&state, meta.len, segments) {
            Some(DropCause::QueueFull)
        } else {
            None
        };
        let marked = verdict == Verdict::Mark;
        // A mark the packet cannot carry becomes the drop it stands for.
        let refused = refused.or_else(|| {
            (marked && !(meta.ecn_capable && payload.mark_ce())).then_some(DropCause::Aqm)
        });
        if let Some(cause) = refused {
            self.tap_refused(&payload, &meta, q, &state, now, cause);
            return self.drop(cause, segments);
        }
        self.seq += 1;
        self.queues.push(
            q,
            Entry {
                payload,
                meta,
                segments,
                arrival: now,
                seq: self.seq,
                depth_packets: state.packets,
                depth_bytes: state.bytes,
                marked,
            },
        );
        self.scheduler.on_enqueue(q, &meta);
        self.blocked_until = None;
        self.stats.enqueued += u64::from(segments);
        self.stats.ecn_marked += u64::from(marked);
        self.sync_depth(q);
        if marked {
            EnqueueOutcome::Marked
        } else {
            EnqueueOutcome::Queued
        }
    }

    /// Packets due at `now`, in release order, and when to poll next.
    pub fn poll(&mut self, now: u64) -> Poll<P> {
        let mut packets = Vec::new();
        let next_wakeup = self.poll_into(now, &mut packets);
        Poll {
            packets,
            next_wakeup,
        }
    }

    /// Like [`Pipeline::poll`] but appends to the caller's buffer, so a loop that
    /// reuses it does not allocate. Returns the next wake-up.
    pub fn poll_into(&mut self, now: u64, out: &mut Vec<P>) -> Option<u64> {
        self.poll_with_slack(now, ReleaseSlack::NONE, out)
    }

    /// Like [`Pipeline::poll_into`], and, when some packet was due at `now`,
    /// also hands out up to `slack.packets` packets due within
    /// `slack.ahead_ns` after it. Only a wake-up that happens anyway for a due
    /// packet takes others along: a lone packet (a ping) polled right after it
    /// was offered is never early, which on a 1 ms link would have cut its
    /// delay to nothing. A queued packet leaves the shaper ahead of `now` (at
    /// its exact virtual instant) only when it would then be due within the
    /// slack, so at most one departure per poll is committed early for nothing.
    pub fn poll_with_slack(
        &mut self,
        now: u64,
        slack: ReleaseSlack,
        out: &mut Vec<P>,
    ) -> Option<u64> {
        self.advance(now);
        let mut due = 0;
        while let Some(slot) = self.wire.pop_due(now) {
            self.hand_out(slot, now, out);
            due += 1;
        }
        let horizon = now.saturating_add(slack.ahead_ns);
        let mut early = 0;
        while due > 0 && early < slack.packets {
            if let Some(slot) = self.wire.pop_due(horizon) {
                self.hand_out(slot, now, out);
                early += 1;
                continue;
            }
            if !self.depart_next(horizon) || self.wire.next_release().is_none_or(|t| t > horizon) {
                break;
            }
        }
        self.stats.in_flight = self.wire.len() as u64;
        self.next_wakeup()
    }

    /// Hands a packet out at `now`; one handed out after its instant is late
    /// by the difference (the fidelity guard), one handed out early is not.
    fn hand_out(&mut self, slot: super::delay_line::Slot<P>, now: u64, out: &mut Vec<P>) {
        let lateness = now.saturating_sub(slot.at);
        if lateness > LATE_BOUND_NS {
            self.stats.late += u64::from(slot.segments);
            let from = slot.at.max(self.behind_until);
            self.stats.behind_ns += now.saturating_sub(from);
            self.behind_until = self.behind_until.max(now);
        }
        self.stats.max_lateness_ns = self.stats.max_lateness_ns.max(lateness);
        self.stats.sent_packets += u64::from(slot.segments);
        self.stats.sent_bytes += u64::from(slot.len);
        out.push(slot.payload);
    }

    /// Applies new parameters at the latest time seen, keeping queued packets,
    /// packets in flight and the shaper's tokens.
    pub fn reconfigure(&mut self, params: &LinkParams) -> Result<(), ConfigError> {
        self.reconfigure_at(params, self.last_now)
    }

    /// Applies new parameters at `now`. Departures due before `now` happen under the
    /// old parameters; the new rate governs from `now` on. Parts whose
    /// configuration did not change keep their state (RED's average, the round
    /// robin position); a pipeline of custom parts gets the built-in ones, except
    /// its shaper, which is told the new rate. On error nothing changes.
    pub fn reconfigure_at(&mut self, params: &LinkParams, now: u64) -> Result<(), ConfigError> {
        let cfg = LinkConfig::from_params(params, self.mtu)?;
        let queues_changed = cfg.queues != self.queues.len();
        let old = self.applied.as_ref();
        // A registered scheme was built for the link's rate (PIE estimates delay
        // from it): a new rate makes a new one.
        let context_changed = old.is_none_or(|o| link_context(o) != link_context(&cfg));
        let aqm_scheme = matches!(cfg.aqm, AqmConfig::Scheme(_));
        let scheduler_scheme = matches!(cfg.scheduler, SchedulerConfig::Scheme(_));
        // Everything that can fail is built before anything changes.
        let new_aqms = if old.is_none_or(|o| o.aqm != cfg.aqm) || (aqm_scheme && context_changed) {
            Some(aqms(&cfg, cfg.queues)?)
        } else {
            None
        };
        let extra_aqms = aqms(&cfg, cfg.queues.saturating_sub(self.aqms.len()))?;
        // A new trace starts now; leaving a trace gives a full token bucket.
        let trace_changed = old.map_or(cfg.shaper.trace.is_some(), |o| {
            o.shaper.trace != cfg.shaper.trace
        });
        let new_shaper = if trace_changed {
            Some(shaper(&cfg.shaper, now.max(self.clock))?)
        } else {
            None
        };
        let new_scheduler = if queues_changed
            || old.is_none_or(|o| o.scheduler != cfg.scheduler)
            || (scheduler_scheme && context_changed)
        {
            Some(scheduler(&cfg)?)
        } else {
            None
        };
        self.advance(now);
        let now = now.max(self.clock);
        let old = self.applied.take();
        if queues_changed {
            self.queues.resize(cfg.queues);
            self.stats
                .per_queue
                .resize(cfg.queues, QueueDepth::default());
            (0..cfg.queues).for_each(|q| self.sync_depth(q));
        }
        match new_aqms {
            Some(aqms) => self.aqms = aqms,
            None => {
                self.aqms.truncate(cfg.queues);
                self.aqms.extend(extra_aqms);
            }
        }
        if let Some(scheduler) = new_scheduler {
            self.scheduler = scheduler;
        }
        self.classifier = classifier(&cfg, self.scheduler.as_ref());
        if let Some(shaper) = new_shaper {
            self.shaper = shaper;
        }
        self.shaper
            .set_rate(cfg.shaper.rate_bps, cfg.shaper.burst_bytes, now);
        if old.as_ref().is_none_or(|o| o.impairment != cfg.impairment) {
            let floor = self.wire.fifo_tail().unwrap_or(0);
            self.impairment = Box::new(Netem::new(&cfg.impairment).with_floor(floor));
        }
        self.limits = cfg.limits;
        self.blocked_until = None;
        self.applied = Some(cfg);
        Ok(())
    }

    /// Moves every departure due by `now` from the queues onto the wire.
    fn advance(&mut self, now: u64) {
        self.last_now = self.last_now.max(now);
        self.blocked_until = None;
        while self.depart_next(now) {}
        self.stats.in_flight = self.wire.len() as u64;
    }

    /// Moves the packet the scheduler picks onto the wire if the shaper lets it
    /// go by `now`; false when the queues are empty or the shaper holds it (then
    /// `blocked_until` says until when).
    fn depart_next(&mut self, now: u64) -> bool {
        if self.queues.packets() == 0 {
            return false;
        }
        let states = self.queues.states();
        let q = match self.scheduler.select(states) {
            Some(q) if states.get(q).is_some_and(|s| !s.is_empty()) => q,
            // A scheduler answering nonsense must not stall the link.
            _ => match states.iter().position(|s| !s.is_empty()) {
                Some(q) => q,
                None => return false,
            },
        };
        let Some(head) = self.queues.front(q) else {
            return false;
        };
        let at = self
            .shaper
            .earliest(head.meta.len, head.arrival.max(self.clock));
        if at > now {
            self.blocked_until = Some(at);
            return false;
        }
        match self.queues.pop(q) {
            Some(entry) => {
                self.depart(q, entry, at);
                true
            }
            None => false,
        }
    }

    fn depart(&mut self, q: usize, entry: Entry<P>, at: u64) {
        self.clock = at;
        self.shaper.consume(entry.meta.len, at);
        let state = self.queues.states()[q];
        self.aqms[q].on_dequeue(&state, at);
        self.scheduler
            .on_dequeue(q, &entry.meta, self.queues.states());
        self.stats.dequeued += u64::from(entry.segments);
        self.sync_depth(q);
        self.releases.clear();
        self.impairment
            .impair(&entry.meta, at, &mut self.rng, &mut self.releases);
        if self.tap.is_some() {
            self.tap_departed(q, &entry, at);
        }
        self.put_on_wire(entry.payload, entry.meta.len, entry.segments, at);
    }

    /// Tells the tap about a packet refused at the queue.
    fn tap_refused(
        &mut self,
        payload: &P,
        meta: &PacketMeta,
        q: usize,
        state: &QueueState,
        now: u64,
        cause: DropCause,
    ) {
        let Some(tap) = self.tap.as_mut() else {
            return;
        };
        let fate = PacketFate {
            len: meta.len,
            enqueued_ns: now,
            departed_ns: None,
            delivered_ns: None,
            queue: q,
            depth_packets: state.packets,
            depth_bytes: state.bytes,
            verdict: TapVerdict::Dropped(cause),
        };
        if !tap.record(payload.bytes(), &fate) {
            self.tap = None;
        }
    }

    /// Tells the tap what the impairment made of a packet leaving its queue at `at`.
    fn tap_departed(&mut self, q: usize, entry: &Entry<P>, at: u64) {
        let Some(tap) = self.tap.as_mut() else {
            return;
        };
        let delivered = self.releases.iter().filter(|r| r.action != Action::Drop);
        let copies = delivered.clone().count() as u32;
        let verdict = if copies == 0 {
            TapVerdict::Dropped(DropCause::Loss)
        } else {
            TapVerdict::Sent {
                ecn_marked: entry.marked,
                corrupted: delivered
                    .clone()
                    .any(|r| r.action == Action::DeliverCorrupted),
                copies,
            }
        };
        let fate = PacketFate {
            len: entry.meta.len,
            enqueued_ns: entry.arrival,
            departed_ns: Some(at),
            delivered_ns: delivered.map(|r| r.at.max(at)).min(),
            queue: q,
            depth_packets: entry.depth_packets,
            depth_bytes: entry.depth_bytes,
            verdict,
        };
        if !tap.record(entry.payload.bytes(), &fate) {
            self.tap = None;
        }
    }

    fn put_on_wire(&mut self, payload: P, len: u32, segments: u32, departed: u64) {
        // The common case, one plain copy, moves the payload once.
        if let [
            Release {
                at,
                action: Action::Deliver,
            },
        ] = self.releases[..]
        {
            if self.wire.push(at.max(departed), len, segments, payload) {
                self.stats.reordered += 1;
            }
            return;
        }
        let mut copies = self
            .releases
            .iter()
            .filter(|r| r.action != Action::Drop)
            .count();
        if copies == 0 {
            self.stats.drops.loss += 1;
            return;
        }
        self.stats.duplicated += copies as u64 - 1;
        let mut original = Some(payload);
        for i in 0..self.releases.len() {
            let Release { at, action } = self.releases[i];
            if action == Action::Drop {
                continue;
            }
            copies -= 1;
            // The last copy takes the original: no clone without duplication.
            let copy = if copies == 0 {
                original.take()
            } else {
                original.clone()
            };
            let Some(mut copy) = copy else { break };
            if action == Action::DeliverCorrupted {
                copy.corrupt(&mut self.rng);
                self.stats.corrupted += 1;
            }
            if self.wire.push(at.max(departed), len, segments, copy) {
                self.stats.reordered += 1;
            }
        }
    }

    fn fits(&self, state: &QueueState, len: u32, segments: u32) -> bool {
        let bytes_ok = self.limits.bytes == 0
            || state.packets == 0 // a byte limit below one packet must not blackhole the link
            || state.bytes + u64::from(len) <= self.limits.bytes;
        u64::from(state.packets) + u64::from(segments) <= u64::from(self.limits.packets) && bytes_ok
    }

    fn drop(&mut self, cause: DropCause, segments: u32) -> EnqueueOutcome {
        let counter = match cause {
            DropCause::QueueFull => &mut self.stats.drops.queue_full,
            DropCause::Aqm => &mut self.stats.drops.aqm,
            DropCause::Loss => &mut self.stats.drops.loss,
        };
        *counter += u64::from(segments);
        EnqueueOutcome::Dropped(cause)
    }
}

impl<P> Pipeline<P> {
    /// Attaches an observer of every packet's fate, replacing any other;
    /// `None` detaches. A tap that answers false is detached by the pipeline.
    pub fn set_tap(&mut self, tap: Option<Box<dyn Tap>>) {
        self.tap = tap;
    }

    pub fn tapped(&self) -> bool {
        self.tap.is_some()
    }

    pub fn stats(&self) -> &PipelineStats {
        &self.stats
    }

    /// The worst lateness since the last call, and starts a new window.
    pub fn take_max_lateness(&mut self) -> u64 {
        std::mem::take(&mut self.stats.max_lateness_ns)
    }

    /// See [`LinkConfig::passes_aggregates`]; never for custom parts, whose
    /// behaviour is unknown.
    pub fn passes_aggregates(&self) -> bool {
        self.applied
            .as_ref()
            .is_some_and(LinkConfig::passes_aggregates)
    }

    /// See [`LinkConfig::is_transparent`]; never with a capture attached (it
    /// records what the pipeline does) or for custom parts.
    pub fn is_transparent(&self) -> bool {
        self.tap.is_none()
            && self
                .applied
                .as_ref()
                .is_some_and(LinkConfig::is_transparent)
    }

    /// Nothing queued and nothing in flight.
    pub fn is_empty(&self) -> bool {
        self.stats.queued.packets == 0 && self.stats.in_flight == 0
    }

    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// When `poll` has something to hand out next: now if a queued packet has
    /// not been looked at since it arrived, else the wire's next instant or the
    /// earliest the head of the queue could reach the far end (the shaper's
    /// instant plus the least delay the impairment can give). Waking at the
    /// shaper's instant itself would hand out nothing on a delayed link: the
    /// departure is computed in virtual time whenever `poll` runs.
    pub fn next_wakeup(&self) -> Option<u64> {
        let queue = (self.queues.packets() > 0).then(|| match self.blocked_until {
            Some(at) => at.saturating_add(self.impairment.min_delay_ns()),
            None => self.last_now,
        });
        queue.into_iter().chain(self.wire.next_release()).min()
    }

    fn sync_depth(&mut self, q: usize) {
        let s = self.queues.states()[q];
        self.stats.per_queue[q] = QueueDepth {
            packets: u64::from(s.packets),
            bytes: s.bytes,
        };
        self.stats.queued = QueueDepth {
            packets: self.queues.packets(),
            bytes: self.queues.bytes(),
        };
    }
}

//! The tokio task that runs an agent's synthetic flows: it feeds the stack what
//! the processors deliver, starts instances as the workloads say, polls the
//! stack when smoltcp's timers or the workloads want it, and hands what the
//! stack sends to the processors like any packet from the TUN device.
//!
//! Packets reach it through an [`Inbox`] the processors fill without waiting
//! (a full inbox drops, as a NIC ring would): the driver itself waits on the
//! processors when they are busy, and must never be waited on by them.

use super::outbox::ResultOutbox;
use super::stack::{Finished, FlowRef, Open, OpenError, Protocol, Received, Stack};
use super::task::{SinkTask, SourceTask, Task};
use super::workload::{Launch, Workload};
use crate::offload::Offload;
use crate::packet::Packet;
use crate::processor::Processors;
use bytes::Bytes;
use nextmini_proto::v1 as pb;
use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc;

/// Delivered packets waiting for the driver.
const INBOX: usize = 8192;
/// Packets taken in per wake-up before the stack is polled.
const INTAKE_BATCH: usize = 1024;
/// How soon an instance that found no free port tries again.
const PORT_RETRY: Duration = Duration::from_millis(10);
/// Packets handed to the processors between two yields.
const DISPATCH_BATCH: usize = 128;
/// Sleep when nothing is scheduled; any command or packet wakes the driver.
const IDLE: Duration = Duration::from_secs(3600);

/// Where the processors put packets for the synthetic stack, once it exists.
pub type SynthSlot = Arc<OnceLock<Inbox>>;

#[derive(Clone)]
pub struct Inbox {
    tx: mpsc::Sender<Bytes>,
    dropped: Arc<AtomicU64>,
}

impl Inbox {
    /// Never waits: the driver may itself be waiting on the calling processor.
    pub fn deliver(&self, packet: Bytes) {
        if self.tx.try_send(packet).is_err() {
            self.dropped.fetch_add(1, Relaxed);
        }
    }

    /// Packets dropped because the driver was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }
}

enum Command {
    Tasks(Vec<Task>),
    Ready(u64),
}

/// Handle to the driver task; dropping it stops the task.
pub struct Synth {
    commands: mpsc::UnboundedSender<Command>,
    outbox: Arc<Mutex<ResultOutbox>>,
}

impl Synth {
    /// Starts the stack on this node's overlay address and registers its inbox
    /// with the processors.
    pub fn spawn(
        local: Ipv4Addr,
        prefix_len: u8,
        mtu: u16,
        processors: Processors,
        slot: &SynthSlot,
        relay: Arc<crate::relay::Relay>,
    ) -> Synth {
        let (tx, inbox) = mpsc::channel(INBOX);
        // Set once per agent: the dataplane keeps its one Synth for good.
        let _ = slot.set(Inbox {
            tx,
            dropped: Arc::default(),
        });
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let outbox = Arc::new(Mutex::new(ResultOutbox::default()));
        let now = Instant::now();
        let (max_done, max_done_rx) = mpsc::unbounded_channel();
        let driver = Driver {
            relay,
            max_done,
            max_running: HashMap::new(),
            stack: Stack::new(local, prefix_len, usize::from(mtu), rand::random(), now),
            processors,
            outbox: outbox.clone(),
            clock: Clock::new(now),
            ready: 0,
            runs: HashMap::new(),
        };
        tokio::spawn(driver.run(commands_rx, inbox, max_done_rx));
        tracing::info!(%local, "synthetic flow stack started");
        Synth { commands, outbox }
    }

    /// The flows this node takes part in now; flows no longer listed stop.
    pub fn set_tasks(&self, tasks: Vec<Task>) {
        let _ = self.commands.send(Command::Tasks(tasks));
    }

    /// Every agent runs `generation`: flows defined by it may start.
    pub fn ready(&self, generation: u64) {
        let _ = self.commands.send(Command::Ready(generation));
    }

    fn outbox(&self) -> std::sync::MutexGuard<'_, ResultOutbox> {
        // A panic elsewhere while holding the lock leaves plain data behind.
        self.outbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn next_report(&self) -> Option<pb::FlowReport> {
        self.outbox().next_report()
    }

    pub fn stored(&self, sequence: u64) {
        self.outbox().stored(sequence);
    }

    /// A new control session: results the last one did not confirm go again.
    pub fn resend_unconfirmed(&self) {
        self.outbox().resend_unconfirmed();
    }
}

/// Turns `Instant`s into Unix time for results.
struct Clock {
    at: Instant,
    unix_us: u64,
}

impl Clock {
    fn new(at: Instant) -> Clock {
        let unix_us = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        Clock { at, unix_us }
    }

    fn unix_us(&self, t: Instant) -> u64 {
        self.unix_us + t.saturating_duration_since(self.at).as_micros() as u64
    }
}

enum RunState {
    /// Not every agent runs the flow's generation yet.
    Waiting,
    StartsAt(Instant),
    Running(Workload),
    Done,
}

/// One flow this node is the source of.
struct Run {
    task: SourceTask,
    state: RunState,
    /// Launches waiting for a free port.
    queued: VecDeque<Launch>,
}

struct Driver {
    /// Max-mode instances: opened through the relays, reported back here.
    relay: Arc<crate::relay::Relay>,
    max_done: mpsc::UnboundedSender<Finished>,
    max_running: HashMap<FlowRef, Vec<tokio::task::AbortHandle>>,
    stack: Stack,
    processors: Processors,
    outbox: Arc<Mutex<ResultOutbox>>,
    clock: Clock,
    ready: u64,
    runs: HashMap<FlowRef, Run>,
}

impl Driver {
    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut inbox: mpsc::Receiver<Bytes>,
        mut max_done: mpsc::UnboundedReceiver<Finished>,
    ) {
        loop {
            let wake = self.next_wake(Instant::now());
            tokio::select! {
                biased;
                command = commands.recv() => match command {
                    Some(c) => self.command(c, Instant::now()),
                    None => return,
                },
                Some(done) = max_done.recv() => self.finished(vec![done]),
                packet = inbox.recv() => match packet {
                    Some(p) => {
                        self.stack.deliver(p);
                        for _ in 0..INTAKE_BATCH {
                            match inbox.try_recv() {
                                Ok(p) => self.stack.deliver(p),
                                Err(_) => break,
                            }
                        }
                    }
                    None => return,
                },
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
            let now = Instant::now();
            self.launch(now);
            let out = self.stack.poll(now);
            self.finished(out.finished);
            self.received(out.received);
            for (i, p) in out.packets.into_iter().enumerate() {
                self.processors
                    .dispatch(Packet {
                        data: p.data,
                        label: p.label,
                        hops: 0,
                        offload: Offload::default(),
                    })
                    .await;
                // A poll can release thousands of packets at once. The first
                // link's hand-off queue drops what it cannot hold, so let the
                // processors and links on this worker catch up between batches.
                if (i + 1) % DISPATCH_BATCH == 0 {
                    tokio::task::yield_now().await;
                }
            }
        }
    }

    fn next_wake(&mut self, now: Instant) -> Instant {
        let mut wake = self.stack.poll_at(now).unwrap_or(now + IDLE);
        for run in self.runs.values() {
            let at = match &run.state {
                RunState::StartsAt(t) => Some(*t),
                RunState::Running(_) if !run.queued.is_empty() => Some(now + PORT_RETRY),
                RunState::Running(w) => w.next_wake(),
                RunState::Waiting | RunState::Done => None,
            };
            if let Some(at) = at {
                wake = wake.min(at);
            }
        }
        wake
    }

    fn command(&mut self, command: Command, now: Instant) {
        match command {
            Command::Tasks(tasks) => self.set_tasks(tasks, now),
            Command::Ready(generation) => {
                self.ready = self.ready.max(generation);
                self.schedule(now);
            }
        }
    }

    fn set_tasks(&mut self, tasks: Vec<Task>, now: Instant) {
        let mut sources = HashMap::new();
        let mut sinks: Vec<SinkTask> = Vec::new();
        for task in tasks {
            match task {
                Task::Source(s) => {
                    sources.insert(s.flow.clone(), s);
                }
                Task::Sink(s) => sinks.push(s),
            }
        }
        let removed: Vec<FlowRef> = self
            .runs
            .keys()
            .filter(|f| !sources.contains_key(*f))
            .cloned()
            .collect();
        for flow in removed {
            self.runs.remove(&flow);
            for running in self.max_running.remove(&flow).unwrap_or_default() {
                running.abort();
            }
            let aborted = self.stack.abort_flow(&flow, now);
            self.finished(aborted);
            tracing::info!(flow = %flow.name, "flow removed; its running instances stopped");
        }
        for (flow, task) in sources {
            self.runs.entry(flow).or_insert(Run {
                task,
                state: RunState::Waiting,
                queued: VecDeque::new(),
            });
        }
        if let Some(window) = sinks.iter().map(|s| s.window).max() {
            self.stack.set_sink_window(window);
        }
        self.stack.set_udp_flows(
            sinks
                .iter()
                .filter(|s| s.protocol == Protocol::Udp)
                .map(|s| s.flow.clone()),
        );
        self.schedule(now);
    }

    /// Flows whose generation every agent runs are given their start time.
    fn schedule(&mut self, now: Instant) {
        for (flow, run) in &mut self.runs {
            if matches!(run.state, RunState::Waiting) && flow.defined_generation <= self.ready {
                run.state = RunState::StartsAt(now + run.task.start_delay);
                tracing::info!(flow = %flow.name, delay = ?run.task.start_delay, "flow scheduled");
            }
        }
    }

    /// Starts what is due: flows whose start time came, and their instances.
    fn launch(&mut self, now: Instant) {
        let mut failed = Vec::new();
        for run in self.runs.values_mut() {
            if let RunState::StartsAt(t) = run.state
                && t <= now
            {
                run.state = RunState::Running(Workload::new(run.task.workload.clone(), t));
            }
            let RunState::Running(workload) = &mut run.state else {
                continue;
            };
            run.queued.extend(workload.poll(now));
            if run.task.mode.is_max() {
                let running = self.max_running.entry(run.task.flow.clone()).or_default();
                running.retain(|h| !h.is_finished());
                for launch in run.queued.drain(..) {
                    let relay = self.relay.clone();
                    let done = self.max_done.clone();
                    let instance = super::max::MaxInstance {
                        flow: run.task.flow.clone(),
                        instance: launch.instance,
                        peer: run.task.peer,
                        label: run.task.label,
                        amount: launch.amount,
                    };
                    let task = tokio::spawn(async move {
                        let _ = done.send(super::max::run(relay, instance).await);
                    });
                    running.push(task.abort_handle());
                }
            }
            while let Some(launch) = run.queued.front().copied() {
                let size = launch.amount.bytes();
                let open = Open {
                    flow: run.task.flow.clone(),
                    instance: launch.instance,
                    protocol: run.task.protocol,
                    peer: run.task.peer,
                    amount: launch.amount,
                    rate_bps: run.task.rate_bps,
                    window: run.task.window,
                    congestion: run.task.congestion,
                    label: run.task.label,
                    dscp: run.task.dscp_for(size),
                };
                match self.stack.open(open, now) {
                    Ok(()) => {
                        run.queued.pop_front();
                    }
                    Err(OpenError::NoPort(_)) => break,
                    Err(e) => {
                        run.queued.pop_front();
                        workload.finished();
                        failed.push(Finished {
                            flow: run.task.flow.clone(),
                            instance: launch.instance,
                            protocol: run.task.protocol,
                            size,
                            bytes: 0,
                            started: now,
                            finished: None,
                            retransmissions: 0,
                            error: Some(e.to_string()),
                        });
                    }
                }
            }
            if workload.done() && run.queued.is_empty() {
                tracing::info!(flow = %run.task.flow.name, "flow finished");
                run.state = RunState::Done;
            }
        }
        self.finished(failed);
    }

    fn finished(&mut self, finished: Vec<Finished>) {
        if finished.is_empty() {
            return;
        }
        let mut outbox = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
        for f in finished {
            if let Some(Run {
                state: RunState::Running(w),
                ..
            }) = self.runs.get_mut(&f.flow)
            {
                w.finished();
            }
            let finished_us = f.finished.map(|t| self.clock.unix_us(t));
            let fct_us = f
                .finished
                .map(|t| t.saturating_duration_since(f.started).as_micros() as u64);
            if let Some(us) = fct_us.filter(|_| f.error.is_none()) {
                // The flow's name is its class on the agent's /metrics.
                crate::metrics::observe_flow_completion(&f.flow.name, us as f64 / 1e6);
            }
            outbox.push(pb::FlowResult {
                flow: f.flow.name.to_string(),
                defined_generation: f.flow.defined_generation,
                instance: f.instance,
                protocol: protocol(f.protocol) as i32,
                size_bytes: f.size.unwrap_or(0),
                bytes: f.bytes,
                started_unix_us: self.clock.unix_us(f.started),
                finished_unix_us: finished_us.unwrap_or(0),
                fct_us: fct_us.unwrap_or(0),
                retransmissions: f.retransmissions,
                error: f.error.unwrap_or_default(),
                from_sink: false,
                received_bytes: 0,
            });
        }
    }

    fn received(&mut self, received: Vec<Received>) {
        if received.is_empty() {
            return;
        }
        let mut outbox = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
        for r in received {
            outbox.push(pb::FlowResult {
                flow: r.flow.name.to_string(),
                defined_generation: r.flow.defined_generation,
                instance: r.instance,
                protocol: pb::FlowProtocol::Udp as i32,
                started_unix_us: self.clock.unix_us(r.first),
                finished_unix_us: self.clock.unix_us(r.last),
                from_sink: true,
                received_bytes: r.bytes,
                ..Default::default()
            });
        }
    }
}

fn protocol(p: Protocol) -> pb::FlowProtocol {
    match p {
        Protocol::Tcp => pb::FlowProtocol::Tcp,
        Protocol::Udp => pb::FlowProtocol::Udp,
    }
}

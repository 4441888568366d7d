//! Two stacks joined by a simulated link, on a simulated clock: the device, the
//! on-demand listeners, completion, marking and retransmission counting, with
//! no dataplane and no real time.

use super::*;
use std::collections::VecDeque;

const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const MTU: usize = 1400;

/// One direction of a link: serialisation at `rate_bps`, a fixed delay, a
/// drop-tail queue, and optionally every n-th packet lost.
struct Wire {
    rate_bps: u64,
    delay: Duration,
    limit: usize,
    lose_every: Option<u64>,
    seen: u64,
    busy_until: Instant,
    in_flight: VecDeque<(Instant, Bytes)>,
    dropped: u64,
}

impl Wire {
    fn new(rate_bps: u64, delay: Duration, now: Instant) -> Wire {
        Wire {
            rate_bps,
            delay,
            limit: 200,
            lose_every: None,
            seen: 0,
            busy_until: now,
            in_flight: VecDeque::new(),
            dropped: 0,
        }
    }

    fn send(&mut self, now: Instant, packet: Bytes) {
        self.seen += 1;
        let queued = self
            .in_flight
            .iter()
            .filter(|(t, _)| *t > now + self.delay)
            .count();
        if queued >= self.limit || self.lose_every.is_some_and(|n| self.seen.is_multiple_of(n)) {
            self.dropped += 1;
            return;
        }
        let start = self.busy_until.max(now);
        let done =
            start + Duration::from_secs_f64(packet.len() as f64 * 8.0 / self.rate_bps as f64);
        self.busy_until = done;
        self.in_flight.push_back((done + self.delay, packet));
    }

    fn due(&mut self, now: Instant) -> Vec<Bytes> {
        let mut out = Vec::new();
        while self.in_flight.front().is_some_and(|(t, _)| *t <= now) {
            if let Some((_, p)) = self.in_flight.pop_front() {
                out.push(p);
            }
        }
        out
    }

    fn next(&self) -> Option<Instant> {
        self.in_flight.front().map(|(t, _)| *t)
    }
}

struct Net {
    now: Instant,
    a: Stack,
    b: Stack,
    ab: Wire,
    ba: Wire,
    finished: Vec<Finished>,
    received: Vec<Received>,
    /// Labels and DSCPs of what a sent.
    sent_by_a: Vec<(u32, u8, usize)>,
    /// Least simulated time between polls; the agent's driver also takes in
    /// whatever arrived since its last wake-up at once.
    quantum: Duration,
}

impl Net {
    fn new(rate_bps: u64, delay: Duration) -> Net {
        let now = Instant::now();
        Net {
            now,
            a: Stack::new(A, 16, MTU, 1, now),
            b: Stack::new(B, 16, MTU, 2, now),
            ab: Wire::new(rate_bps, delay, now),
            ba: Wire::new(rate_bps, delay, now),
            finished: Vec::new(),
            received: Vec::new(),
            sent_by_a: Vec::new(),
            quantum: Duration::from_micros(10),
        }
    }

    fn step(&mut self) {
        for p in self.ab.due(self.now) {
            self.b.deliver(p);
        }
        for p in self.ba.due(self.now) {
            self.a.deliver(p);
        }
        let out = self.a.poll(self.now);
        for p in out.packets {
            self.sent_by_a.push((p.label, p.data[1] >> 2, p.data.len()));
            self.ab.send(self.now, p.data);
        }
        self.finished.extend(out.finished);
        self.received.extend(out.received);
        let out = self.b.poll(self.now);
        for p in out.packets {
            self.ba.send(self.now, p.data);
        }
        self.finished.extend(out.finished);
        self.received.extend(out.received);
    }

    /// Runs until `done` or `limit` of simulated time, jumping from event to event.
    fn run(&mut self, limit: Duration, done: impl Fn(&Net) -> bool) {
        let end = self.now + limit;
        while self.now < end && !done(self) {
            self.step();
            let next = [
                self.a.poll_at(self.now),
                self.b.poll_at(self.now),
                self.ab.next(),
                self.ba.next(),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(end);
            // At least a quantum on, so "poll now" cannot stall the clock.
            self.now = next.max(self.now + self.quantum).min(end);
        }
    }
}

fn flow(name: &str) -> FlowRef {
    FlowRef {
        name: name.into(),
        defined_generation: 3,
    }
}

fn tcp(instance: u32, bytes: u64) -> Open {
    Open {
        flow: flow("bulk"),
        instance,
        protocol: Protocol::Tcp,
        peer: B,
        amount: InstanceAmount::Bytes(bytes),
        rate_bps: None,
        window: 64 * 1024,
        congestion: Congestion::Cubic,
        label: 0,
        dscp: 0,
    }
}

#[test]
fn tcp_instances_complete_and_report_their_completion_times() {
    let mut net = Net::new(100_000_000, Duration::from_millis(1));
    // Deep enough for every window at once: no loss, so no 1 s timeout (smoltcp's
    // minimum) can stretch the run.
    net.ab.limit = 1000;
    let start = net.now;
    for i in 0..10 {
        net.a.open(tcp(i, 200_000), net.now).expect("open");
    }
    net.run(Duration::from_secs(30), |n| n.finished.len() == 10);
    assert_eq!(net.finished.len(), 10, "{:?}", net.finished);
    for f in &net.finished {
        assert_eq!(f.error, None);
        assert_eq!((f.bytes, f.size), (200_000, Some(200_000)));
        let fct = f.finished.expect("finished") - f.started;
        assert!(
            fct > Duration::from_millis(2),
            "at least a round trip: {fct:?}"
        );
    }
    // 2 MB over 100 Mbit/s take at least 0.16 s; fair sharing finishes them together.
    let last = net
        .finished
        .iter()
        .filter_map(|f| f.finished)
        .max()
        .expect("some");
    let span = (last - start).as_secs_f64();
    let goodput = 2_000_000.0 * 8.0 / span;
    assert!(
        goodput > 60e6 && goodput < 100e6,
        "{goodput} bit/s over {span} s"
    );
    // Sockets go once both ends have closed.
    net.run(Duration::from_secs(10), |n| {
        n.a.connections() + n.b.connections() == 0
    });
    assert_eq!((net.a.connections(), net.b.connections()), (0, 0));
}

#[test]
fn losses_are_recovered_and_counted() {
    let mut net = Net::new(50_000_000, Duration::from_millis(2));
    net.ab.lose_every = Some(97);
    net.a.open(tcp(0, 1_000_000), net.now).expect("open");
    net.run(Duration::from_secs(60), |n| !n.finished.is_empty());
    let f = &net.finished[0];
    assert_eq!((f.error.as_deref(), f.bytes), (None, 1_000_000));
    assert!(net.ab.dropped > 5);
    assert!(
        f.retransmissions >= net.ab.dropped / 2,
        "{} retransmissions for {} losses",
        f.retransmissions,
        net.ab.dropped
    );
}

#[test]
fn rate_caps_hold_and_packets_carry_label_and_dscp() {
    let mut net = Net::new(1_000_000_000, Duration::from_micros(100));
    let open = Open {
        rate_bps: Some(10_000_000),
        label: 7,
        dscp: 46,
        ..tcp(0, 500_000)
    };
    net.a.open(open, net.now).expect("open");
    net.run(Duration::from_secs(10), |n| !n.finished.is_empty());
    let f = &net.finished[0];
    let secs = (f.finished.expect("done") - f.started).as_secs_f64();
    // 500 kB at 10 Mbit/s: 0.4 s, plus the handshake.
    assert!((0.39..0.45).contains(&secs), "{secs} s");
    assert!(
        net.sent_by_a
            .iter()
            .all(|&(label, dscp, _)| label == 7 && dscp == 46)
    );
}

#[test]
fn udp_sends_at_its_rate_and_the_sink_counts_what_arrives() {
    let mut net = Net::new(100_000_000, Duration::from_millis(1));
    net.b.set_udp_flows([flow("cbr")]);
    let open = Open {
        flow: flow("cbr"),
        protocol: Protocol::Udp,
        amount: InstanceAmount::For(Duration::from_secs(2)),
        rate_bps: Some(8_000_000),
        ..tcp(4, 0)
    };
    net.a.open(open, net.now).expect("open");
    net.run(Duration::from_secs(5), |n| {
        !n.finished.is_empty() && !n.received.is_empty()
    });
    let sent = &net.finished[0];
    assert_eq!(sent.protocol, Protocol::Udp);
    let rate = sent.bytes as f64 * 8.0 / 2.0;
    assert!((rate / 8e6 - 1.0).abs() < 0.01, "{rate} bit/s");
    let got = &net.received[0];
    assert_eq!((got.flow.clone(), got.instance), (flow("cbr"), 4));
    assert_eq!(got.bytes, sent.bytes, "nothing was lost");
    assert!(
        net.a.open(
            Open {
                rate_bps: None,
                ..tcp(0, 1)
            }
            .udp(),
            net.now
        ) == Err(OpenError::NoRate)
    );
}

impl Open {
    fn udp(self) -> Open {
        Open {
            protocol: Protocol::Udp,
            ..self
        }
    }
}

#[test]
fn a_thousand_concurrent_instances_each_get_a_connection() {
    let mut net = Net::new(1_000_000_000, Duration::from_micros(200));
    net.ab.limit = 5000;
    net.ba.limit = 5000;
    net.quantum = Duration::from_millis(1);
    for i in 0..1000 {
        let open = Open {
            window: 8 * 1024,
            ..tcp(i, 20_000)
        };
        net.a.open(open, net.now).expect("open");
    }
    net.run(Duration::from_millis(50), |_| false);
    assert!(
        net.b.connections() >= 990,
        "{} accepted, {} and {} dropped",
        net.b.connections(),
        net.ab.dropped,
        net.ba.dropped
    );
    net.run(Duration::from_secs(30), |n| n.finished.len() == 1000);
    assert_eq!(net.finished.len(), 1000);
    assert!(
        net.finished
            .iter()
            .all(|f| f.error.is_none() && f.bytes == 20_000)
    );
}

#[test]
fn a_refused_connection_is_a_failed_instance() {
    let mut net = Net::new(100_000_000, Duration::from_millis(1));
    // Nobody at this address answers: the SYNs go nowhere.
    let open = Open {
        peer: Ipv4Addr::new(198, 18, 0, 9),
        ..tcp(0, 1000)
    };
    net.a.open(open, net.now).expect("open");
    net.run(Duration::from_secs(120), |n| !n.finished.is_empty());
    let f = &net.finished[0];
    assert_eq!(f.finished, None);
    assert!(
        f.error
            .as_deref()
            .is_some_and(|e| e.contains("refused or timed out"))
    );
}

#[test]
fn removing_a_flow_ends_its_instances() {
    let mut net = Net::new(100_000_000, Duration::from_millis(1));
    net.a
        .open(
            Open {
                amount: InstanceAmount::Forever,
                ..tcp(0, 0)
            },
            net.now,
        )
        .expect("open");
    net.run(Duration::from_millis(500), |_| false);
    let aborted = net.a.abort_flow(&flow("bulk"), net.now);
    assert_eq!(aborted.len(), 1);
    assert!(aborted[0].bytes > 1_000_000, "{}", aborted[0].bytes);
    net.run(Duration::from_secs(1), |_| false);
    assert_eq!(net.a.connections(), 0);
}

//! The workload of one flow at its source: when each instance starts and how
//! much it sends. Sans-IO: the driver asks what is due at `now`, reports
//! finished instances, and sleeps until `next_wake`.
//!
//! Instances start as `parallelism` allows (a closed loop: a finished instance
//! makes room for the next), or at the arrivals of a Poisson process; an
//! arrival that finds `parallelism` instances running waits for one to finish.

use super::cdf::SizeCdf;
use super::rng::{self, Stream};
use std::time::{Duration, Instant};

/// What each instance of a flow sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Amount {
    Bytes(u64),
    /// A size drawn per instance.
    Cdf(SizeCdf),
    /// Sends for this long.
    For(Duration),
    /// Sends until the flow is removed.
    Forever,
}

/// What one instance sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceAmount {
    Bytes(u64),
    For(Duration),
    Forever,
}

impl InstanceAmount {
    pub fn bytes(&self) -> Option<u64> {
        match self {
            InstanceAmount::Bytes(b) => Some(*b),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSpec {
    pub count: u32,
    /// At most this many instances at once (0: all of them).
    pub parallelism: u32,
    pub amount: Amount,
    /// Mean gap of Poisson arrivals; `None` starts instances as soon as allowed.
    pub mean_interarrival: Option<Duration>,
    pub seed: u64,
}

/// An instance to start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub instance: u32,
    pub amount: InstanceAmount,
    /// When it arrived (Poisson) or became allowed; it may start later than this
    /// when `parallelism` instances were running.
    pub arrived: Instant,
}

#[derive(Debug)]
pub struct Workload {
    spec: WorkloadSpec,
    launched: u32,
    active: u32,
    /// Arrival of instance `launched`.
    next_arrival: Instant,
}

impl Workload {
    /// A workload whose time starts at `origin` (the flow's start).
    pub fn new(spec: WorkloadSpec, origin: Instant) -> Workload {
        let next_arrival = origin + gap(&spec, 0);
        Workload {
            spec,
            launched: 0,
            active: 0,
            next_arrival,
        }
    }

    fn parallelism(&self) -> u32 {
        match self.spec.parallelism {
            0 => self.spec.count,
            p => p,
        }
    }

    /// The instance's amount, the same for instance `i` in every run of a seed.
    pub fn amount_of(&self, instance: u32) -> InstanceAmount {
        match &self.spec.amount {
            Amount::Bytes(b) => InstanceAmount::Bytes(*b),
            Amount::Cdf(cdf) => InstanceAmount::Bytes(cdf.sample(rng::unit(
                self.spec.seed,
                Stream::Size,
                u64::from(instance),
            ))),
            Amount::For(d) => InstanceAmount::For(*d),
            Amount::Forever => InstanceAmount::Forever,
        }
    }

    /// Instances due at `now`, in order.
    pub fn poll(&mut self, now: Instant) -> Vec<Launch> {
        let mut due = Vec::new();
        while self.launched < self.spec.count && self.active < self.parallelism() {
            let arrived = if self.spec.mean_interarrival.is_some() {
                if self.next_arrival > now {
                    break;
                }
                self.next_arrival
            } else {
                now
            };
            let instance = self.launched;
            due.push(Launch {
                instance,
                amount: self.amount_of(instance),
                arrived,
            });
            self.launched += 1;
            self.active += 1;
            self.next_arrival += gap(&self.spec, u64::from(self.launched));
        }
        due
    }

    /// One running instance has finished (or failed).
    pub fn finished(&mut self) {
        self.active = self.active.saturating_sub(1);
    }

    /// When `poll` has an instance to start (in the past: now), unless only a
    /// finishing instance can make room.
    pub fn next_wake(&self) -> Option<Instant> {
        (self.launched < self.spec.count && self.active < self.parallelism())
            .then_some(self.next_arrival)
    }

    pub fn running(&self) -> u32 {
        self.active
    }

    /// Every instance has started and finished.
    pub fn done(&self) -> bool {
        self.launched >= self.spec.count && self.active == 0
    }
}

/// Gap before arrival `index`: exponential for Poisson arrivals, none otherwise.
fn gap(spec: &WorkloadSpec, index: u64) -> Duration {
    match spec.mean_interarrival {
        Some(mean) => Duration::from_secs_f64(rng::exponential(
            spec.seed,
            Stream::Arrival,
            index,
            mean.as_secs_f64(),
        )),
        None => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::cdf::tests::web_search;

    fn spec(count: u32, parallelism: u32, mean: Option<Duration>) -> WorkloadSpec {
        WorkloadSpec {
            count,
            parallelism,
            amount: Amount::Bytes(1000),
            mean_interarrival: mean,
            seed: 5,
        }
    }

    #[test]
    fn closed_loop_keeps_parallelism_instances_running() {
        let t0 = Instant::now();
        let mut w = Workload::new(spec(5, 2, None), t0);
        let first: Vec<u32> = w.poll(t0).iter().map(|l| l.instance).collect();
        assert_eq!(first, [0, 1]);
        assert!(w.poll(t0).is_empty(), "two are running");
        assert_eq!(w.next_wake(), None, "only a finish makes room");
        w.finished();
        assert_eq!(w.poll(t0 + Duration::from_secs(1))[0].instance, 2);
        for _ in 0..2 {
            w.finished();
        }
        assert_eq!(w.poll(t0).len(), 2);
        assert!(!w.done());
        w.finished();
        w.finished();
        assert!(w.done());
    }

    #[test]
    fn poisson_arrivals_have_the_requested_rate() {
        let t0 = Instant::now();
        let mean = Duration::from_millis(10);
        let n = 20_000;
        let mut w = Workload::new(spec(n, 0, Some(mean)), t0);
        let mut arrivals = Vec::new();
        let mut now = t0;
        while let Some(at) = w.next_wake() {
            now = now.max(at);
            arrivals.extend(w.poll(now).into_iter().map(|l| l.arrived));
        }
        assert_eq!(arrivals.len(), n as usize);
        let span = arrivals[arrivals.len() - 1] - t0;
        let rate = f64::from(n) / span.as_secs_f64();
        assert!((rate - 100.0).abs() < 2.0, "{rate} arrivals/s");
        // Counts per 100 ms window are Poisson: variance equals the mean.
        let mut counts = vec![0u32; (span.as_millis() / 100 + 1) as usize];
        for a in &arrivals {
            counts[((*a - t0).as_millis() / 100) as usize] += 1;
        }
        let m = counts.iter().map(|&c| f64::from(c)).sum::<f64>() / counts.len() as f64;
        let var = counts
            .iter()
            .map(|&c| (f64::from(c) - m).powi(2))
            .sum::<f64>()
            / counts.len() as f64;
        assert!((var / m - 1.0).abs() < 0.1, "dispersion {}", var / m);
    }

    #[test]
    fn arrivals_wait_for_parallelism() {
        let t0 = Instant::now();
        let mut w = Workload::new(spec(3, 1, Some(Duration::from_millis(1))), t0);
        let late = t0 + Duration::from_secs(1);
        assert_eq!(w.poll(late).len(), 1, "all arrived, one may run");
        assert_eq!(w.next_wake(), None);
        w.finished();
        let next = w.poll(late);
        assert_eq!(next.len(), 1);
        assert!(next[0].arrived < late, "it arrived before it could start");
    }

    #[test]
    fn sizes_are_reproducible_per_instance() {
        let t0 = Instant::now();
        let dist = |seed| WorkloadSpec {
            count: 100,
            parallelism: 0,
            amount: Amount::Cdf(web_search()),
            mean_interarrival: None,
            seed,
        };
        let a = Workload::new(dist(1), t0);
        let b = Workload::new(
            WorkloadSpec {
                mean_interarrival: Some(Duration::from_millis(3)),
                ..dist(1)
            },
            t0,
        );
        let c = Workload::new(dist(2), t0);
        let sizes = |w: &Workload| (0..100).map(|i| w.amount_of(i)).collect::<Vec<_>>();
        assert_eq!(sizes(&a), sizes(&b), "arrivals do not change the sizes");
        assert_ne!(sizes(&a), sizes(&c), "another seed, other sizes");
    }
}

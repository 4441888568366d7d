use super::{Aqm, Verdict};
use crate::sched::config::RedConfig;
use crate::sched::{PacketMeta, QueueState};
use rand::Rng;
use rand::rngs::SmallRng;

const PPM: f64 = 1_000_000.0;

/// Random Early Detection as in Floyd & Jacobson 1993: an EWMA of the queue length,
/// a base probability rising linearly between the thresholds, and the count since
/// the last drop spreading drops out evenly (pa = pb / (1 - count·pb)).
#[derive(Debug, Clone)]
pub struct Red {
    min: f64,
    max: f64,
    max_p: f64,
    weight: f64,
    ecn: bool,
    /// Typical transmission time of one packet: the clock of the idle decay.
    tx_time_ns: f64,
    avg: f64,
    /// Packets accepted since the last drop or mark; -1 while the average is below `min`.
    count: i64,
    idle_since: Option<u64>,
}

impl Red {
    /// `tx_time_ns`: how long the link takes to send a typical packet, so an idle
    /// queue decays the average as if that many empty-queue samples were taken.
    pub fn new(cfg: &RedConfig, tx_time_ns: u64) -> Red {
        Red {
            min: f64::from(cfg.min_packets),
            max: f64::from(cfg.max_packets),
            max_p: f64::from(cfg.max_p_ppm) / PPM,
            weight: f64::from(cfg.weight_ppm) / PPM,
            ecn: cfg.ecn,
            tx_time_ns: tx_time_ns.max(1) as f64,
            avg: 0.0,
            count: -1,
            idle_since: None,
        }
    }

    /// The average queue length in packets.
    pub fn average(&self) -> f64 {
        self.avg
    }

    fn update_average(&mut self, queue: &QueueState, now: u64) {
        match self.idle_since.take() {
            Some(since) if queue.packets == 0 => {
                let m = now.saturating_sub(since) as f64 / self.tx_time_ns;
                self.avg *= (1.0 - self.weight).powf(m);
            }
            _ => {
                self.avg += self.weight * (f64::from(queue.packets) - self.avg);
            }
        }
    }

    fn congested(&self, meta: &PacketMeta) -> Verdict {
        if self.ecn && meta.ecn_capable {
            Verdict::Mark
        } else {
            Verdict::Drop
        }
    }
}

impl Aqm for Red {
    fn on_enqueue(
        &mut self,
        queue: &QueueState,
        meta: &PacketMeta,
        now: u64,
        rng: &mut SmallRng,
    ) -> Verdict {
        self.update_average(queue, now);
        if self.avg < self.min {
            self.count = -1;
            return Verdict::Accept;
        }
        if self.avg >= self.max {
            self.count = 0;
            return self.congested(meta);
        }
        // With count = packets accepted since the last drop, the gap between drops
        // is uniform on 1..=1/pb instead of geometric: drops do not cluster.
        self.count = self.count.max(0);
        let pb = self.max_p * (self.avg - self.min) / (self.max - self.min);
        let spread = 1.0 - self.count as f64 * pb;
        let pa = if spread <= 0.0 { 1.0 } else { pb / spread };
        if rng.random::<f64>() < pa {
            self.count = 0;
            self.congested(meta)
        } else {
            self.count += 1;
            Verdict::Accept
        }
    }

    fn on_dequeue(&mut self, queue: &QueueState, now: u64) {
        if queue.packets == 0 {
            self.idle_since = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn red(ecn: bool) -> Red {
        // Weight 1: the average is the instantaneous length, so a test can hold it.
        Red::new(
            &RedConfig {
                min_packets: 20,
                max_packets: 60,
                max_p_ppm: 100_000,
                weight_ppm: 1_000_000,
                ecn,
            },
            1000,
        )
    }

    fn fraction(aqm: &mut Red, packets: u32, meta: &PacketMeta, verdict: Verdict) -> f64 {
        let mut rng = SmallRng::seed_from_u64(u64::from(packets));
        let q = QueueState {
            packets,
            ..Default::default()
        };
        let n = 20_000;
        let hits = (0..n)
            .filter(|_| aqm.on_enqueue(&q, meta, 0, &mut rng) == verdict)
            .count();
        hits as f64 / f64::from(n)
    }

    #[test]
    fn drop_probability_rises_between_thresholds() {
        let m = PacketMeta::with_len(1500);
        let mut aqm = red(false);
        assert_eq!(fraction(&mut aqm, 10, &m, Verdict::Drop), 0.0);
        let mut last = 0.0;
        for packets in [25, 35, 45, 55] {
            let f = fraction(&mut aqm, packets, &m, Verdict::Drop);
            // Uniform gaps on 1..=1/pb: a mean gap of (1/pb + 1)/2 arrivals.
            let pb = 0.1 * f64::from(packets - 20) / 40.0;
            let expected = 2.0 * pb / (1.0 + pb);
            assert!(
                (f - expected).abs() < 0.15 * expected,
                "{packets}: {f} vs {expected}"
            );
            assert!(f > last);
            last = f;
        }
        assert_eq!(fraction(&mut aqm, 60, &m, Verdict::Drop), 1.0);
        assert_eq!(fraction(&mut aqm, 500, &m, Verdict::Drop), 1.0);
    }

    #[test]
    fn marks_ect_instead_of_dropping_when_ecn() {
        let ect = PacketMeta {
            ecn_capable: true,
            ..PacketMeta::with_len(1500)
        };
        let mut aqm = red(true);
        assert!(fraction(&mut aqm, 40, &ect, Verdict::Mark) > 0.05);
        assert_eq!(fraction(&mut aqm, 40, &ect, Verdict::Drop), 0.0);
        assert_eq!(fraction(&mut aqm, 80, &ect, Verdict::Mark), 1.0);
        // Not-ECT packets are still dropped.
        let plain = PacketMeta::with_len(1500);
        assert_eq!(fraction(&mut aqm, 80, &plain, Verdict::Drop), 1.0);
    }

    #[test]
    fn average_is_an_ewma_and_decays_when_idle() {
        let cfg = RedConfig {
            min_packets: 5,
            max_packets: 15,
            max_p_ppm: 100_000,
            weight_ppm: 500_000,
            ecn: false,
        };
        let mut aqm = Red::new(&cfg, 1000);
        let mut rng = SmallRng::seed_from_u64(0);
        let m = PacketMeta::with_len(1500);
        let q = |packets| QueueState {
            packets,
            ..Default::default()
        };
        aqm.on_enqueue(&q(8), &m, 0, &mut rng);
        assert_eq!(aqm.average(), 4.0);
        aqm.on_enqueue(&q(8), &m, 0, &mut rng);
        assert_eq!(aqm.average(), 6.0);
        // Empty for two packet times: (1 - 0.5)^2 of the average remains.
        aqm.on_dequeue(&q(0), 10_000);
        aqm.on_enqueue(&q(0), &m, 12_000, &mut rng);
        assert!((aqm.average() - 1.5).abs() < 1e-9);
    }
}

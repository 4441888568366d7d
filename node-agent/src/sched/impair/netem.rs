use super::{Action, Delay, GilbertLoss, Impairment, Release, chance};
use crate::sched::PacketMeta;
use crate::sched::config::ImpairmentConfig;
use rand::rngs::SmallRng;

/// The configured impairments of a link, applied in netem's order: loss first (a
/// lost packet is neither duplicated nor delayed), then reorder or delay, then
/// corruption and duplication per copy.
#[derive(Debug, Clone)]
pub struct Netem {
    delay: Delay,
    loss: GilbertLoss,
    reorder_ppm: u32,
    duplicate_ppm: u32,
    corrupt_ppm: u32,
}

impl Netem {
    pub fn new(cfg: &ImpairmentConfig) -> Netem {
        Netem {
            delay: Delay::new(cfg.delay_ns, cfg.jitter_ns, cfg.distribution),
            loss: GilbertLoss::new(cfg.loss_ppm, cfg.loss_correlation_ppm),
            reorder_ppm: cfg.reorder_ppm,
            duplicate_ppm: cfg.duplicate_ppm,
            corrupt_ppm: cfg.corrupt_ppm,
        }
    }

    /// Keeps FIFO release order after `last_release`, so replacing the stage on a
    /// reconfiguration does not let new packets overtake those in flight.
    pub fn with_floor(mut self, last_release: u64) -> Netem {
        self.delay = self.delay.with_floor(last_release);
        self
    }

    fn copy(&self, at: u64, rng: &mut SmallRng) -> Release {
        let action = if chance(self.corrupt_ppm, rng) {
            Action::DeliverCorrupted
        } else {
            Action::Deliver
        };
        Release { at, action }
    }
}

impl Impairment for Netem {
    fn min_delay_ns(&self) -> u64 {
        // A reordered packet skips the delay.
        if self.reorder_ppm > 0 {
            0
        } else {
            self.delay.min_ns()
        }
    }

    fn impair(&mut self, _: &PacketMeta, now: u64, rng: &mut SmallRng, out: &mut Vec<Release>) {
        if self.loss.lose(rng) {
            out.push(Release {
                at: now,
                action: Action::Drop,
            });
            return;
        }
        // A reordered packet skips the delay and so overtakes the ones in flight;
        // without a delay there is nothing to overtake and nothing to draw.
        let at = if !self.delay.is_zero() && chance(self.reorder_ppm, rng) {
            now
        } else {
            self.delay.release(now, rng)
        };
        out.push(self.copy(at, rng));
        if chance(self.duplicate_ppm, rng) {
            out.push(self.copy(at, rng));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn run(cfg: ImpairmentConfig, n: u64) -> Vec<Vec<Release>> {
        let mut netem = Netem::new(&cfg);
        let mut rng = SmallRng::seed_from_u64(11);
        let meta = PacketMeta::with_len(1000);
        (0..n)
            .map(|i| {
                let mut out = Vec::new();
                netem.impair(&meta, i * 1000, &mut rng, &mut out);
                out
            })
            .collect()
    }

    fn near(count: usize, n: u64, ppm: u32) -> bool {
        let expected = n as f64 * f64::from(ppm) / 1e6;
        (count as f64 - expected).abs() < 0.1 * expected
    }

    #[test]
    fn no_config_is_a_perfect_wire() {
        for (i, r) in run(ImpairmentConfig::default(), 1000).iter().enumerate() {
            assert_eq!(
                r,
                &[Release {
                    at: i as u64 * 1000,
                    action: Action::Deliver
                }]
            );
        }
    }

    #[test]
    fn duplicate_reorder_and_corrupt_rates() {
        let n = 200_000;
        let cfg = ImpairmentConfig {
            delay_ns: 5_000_000,
            reorder_ppm: 20_000,
            duplicate_ppm: 30_000,
            corrupt_ppm: 10_000,
            ..Default::default()
        };
        let out = run(cfg, n);
        let dups = out.iter().filter(|r| r.len() == 2).count();
        let reordered = out
            .iter()
            .enumerate()
            .filter(|(i, r)| r[0].at == *i as u64 * 1000)
            .count();
        let corrupted = out
            .iter()
            .flatten()
            .filter(|r| r.action == Action::DeliverCorrupted)
            .count();
        assert!(near(dups, n, 30_000), "{dups}");
        assert!(near(reordered, n, 20_000), "{reordered}");
        assert!(near(corrupted, n + dups as u64, 10_000), "{corrupted}");
        // Copies of one packet arrive together; the rest keep the delay exactly.
        for (i, r) in out.iter().enumerate() {
            assert!(r.iter().all(|c| c.at == r[0].at));
            let sent = i as u64 * 1000;
            assert!(r[0].at == sent || r[0].at == sent + 5_000_000);
        }
    }

    #[test]
    fn lost_packets_are_one_drop() {
        let cfg = ImpairmentConfig {
            loss_ppm: 1_000_000,
            duplicate_ppm: 1_000_000,
            ..Default::default()
        };
        assert!(run(cfg, 100).iter().all(|r| r
            == &[Release {
                at: r[0].at,
                action: Action::Drop
            }]));
    }

    #[test]
    fn floor_keeps_fifo_across_replacement() {
        let cfg = ImpairmentConfig {
            delay_ns: 1_000,
            ..Default::default()
        };
        let mut netem = Netem::new(&cfg).with_floor(50_000);
        let mut out = Vec::new();
        netem.impair(
            &PacketMeta::default(),
            0,
            &mut SmallRng::seed_from_u64(0),
            &mut out,
        );
        assert_eq!(out[0].at, 50_000);
    }
}

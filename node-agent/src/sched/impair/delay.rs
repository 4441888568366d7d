use crate::sched::config::JitterDistribution;
use rand::Rng;
use rand::rngs::SmallRng;

/// √3 / 2: the standard deviation of a Pareto(α = 3, xₘ = 1) variable.
const PARETO_STD: f64 = 0.866_025_403_784_438_6;
/// Its mean, α / (α − 1).
const PARETO_MEAN: f64 = 1.5;
/// Tails are cut so a rare outlier cannot hold every later packet behind it
/// (releases keep FIFO order) for an unbounded time.
const NORMAL_CUT: f64 = 3.0;
const PARETO_CUT: f64 = 10.0;

/// A constant delay plus jitter, released in FIFO order as netem does when it
/// also shapes: a packet never overtakes an earlier one because of jitter, it
/// waits for it. Only an explicit reorder may overtake.
#[derive(Debug, Clone)]
pub struct Delay {
    delay_ns: u64,
    jitter_ns: u64,
    distribution: JitterDistribution,
    last_release: u64,
}

impl Delay {
    pub fn new(delay_ns: u64, jitter_ns: u64, distribution: JitterDistribution) -> Delay {
        Delay {
            delay_ns,
            jitter_ns,
            distribution,
            last_release: 0,
        }
    }

    /// Continues FIFO order after `last_release` (e.g. from a replaced stage).
    pub fn with_floor(mut self, last_release: u64) -> Delay {
        self.last_release = last_release;
        self
    }

    pub fn is_zero(&self) -> bool {
        self.delay_ns == 0 && self.jitter_ns == 0
    }

    /// Range of the jitter offset in units of `jitter_ns`: uniform ±1; normal with
    /// σ = 1 cut at ±3; Pareto (α = 3) shifted to mean 0, scaled to σ = 1, cut at +10.
    pub fn offset_bounds(distribution: JitterDistribution) -> (f64, f64) {
        match distribution {
            JitterDistribution::Uniform => (-1.0, 1.0),
            JitterDistribution::Normal => (-NORMAL_CUT, NORMAL_CUT),
            JitterDistribution::Pareto => ((1.0 - PARETO_MEAN) / PARETO_STD, PARETO_CUT),
        }
    }

    /// The least delay a draw can give (FIFO ordering only adds).
    pub fn min_ns(&self) -> u64 {
        if self.jitter_ns == 0 {
            return self.delay_ns;
        }
        let (low, _) = Delay::offset_bounds(self.distribution);
        // `as` saturates negative to 0; one ns below the exact bound keeps
        // float rounding in `sample` from undercutting it.
        ((self.delay_ns as f64 + low * self.jitter_ns as f64).floor() as u64).saturating_sub(1)
    }

    /// One delay draw, before FIFO ordering: never negative.
    pub fn sample(&self, rng: &mut SmallRng) -> u64 {
        if self.jitter_ns == 0 {
            return self.delay_ns;
        }
        let unit = match self.distribution {
            JitterDistribution::Uniform => rng.random_range(-1.0..=1.0),
            JitterDistribution::Normal => standard_normal(rng).clamp(-NORMAL_CUT, NORMAL_CUT),
            JitterDistribution::Pareto => {
                // Inverse CDF; 1 − u is in (0, 1], so the power is finite.
                let x = (1.0 - rng.random::<f64>()).powf(-1.0 / 3.0);
                ((x - PARETO_MEAN) / PARETO_STD).min(PARETO_CUT)
            }
        };
        let delay = self.delay_ns as f64 + unit * self.jitter_ns as f64;
        // `as` saturates: negative becomes 0, huge becomes u64::MAX.
        delay.round() as u64
    }

    /// When a packet that left at `now` arrives.
    pub fn release(&mut self, now: u64, rng: &mut SmallRng) -> u64 {
        let at = now.saturating_add(self.sample(rng)).max(self.last_release);
        self.last_release = at;
        at
    }
}

/// Box–Muller: two uniforms, one normal (the twin is discarded for simplicity).
fn standard_normal(rng: &mut SmallRng) -> f64 {
    let u1 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const ALL: [JitterDistribution; 3] = [
        JitterDistribution::Uniform,
        JitterDistribution::Normal,
        JitterDistribution::Pareto,
    ];

    #[test]
    fn constant_delay_is_exact() {
        let mut d = Delay::new(5_000_000, 0, JitterDistribution::Uniform);
        let mut rng = SmallRng::seed_from_u64(0);
        for now in [0, 17, 1_000_000_000] {
            assert_eq!(d.release(now, &mut rng), now + 5_000_000);
        }
    }

    #[test]
    fn jitter_stays_within_bounds_and_has_the_right_spread() {
        let (delay, jitter) = (10_000_000u64, 2_000_000u64);
        for dist in ALL {
            let d = Delay::new(delay, jitter, dist);
            let mut rng = SmallRng::seed_from_u64(3);
            let (lo, hi) = Delay::offset_bounds(dist);
            let n = 50_000;
            let samples: Vec<f64> = (0..n).map(|_| d.sample(&mut rng) as f64).collect();
            for &s in &samples {
                let unit = (s - delay as f64) / jitter as f64;
                assert!(unit >= lo - 1e-6 && unit <= hi + 1e-6, "{dist:?}: {unit}");
            }
            let mean = samples.iter().sum::<f64>() / n as f64;
            let std = (samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
            assert!(
                (mean - delay as f64).abs() < 0.05 * jitter as f64,
                "{dist:?} mean {mean}"
            );
            // Uniform on ±j has σ = j/√3; the others are scaled to σ ≈ j.
            let expected = if dist == JitterDistribution::Uniform {
                jitter as f64 / 3f64.sqrt()
            } else {
                jitter as f64
            };
            // The cut tail makes the Pareto spread a little narrower.
            let tolerance = if dist == JitterDistribution::Pareto {
                0.2
            } else {
                0.1
            };
            assert!(
                (std - expected).abs() < tolerance * expected,
                "{dist:?} std {std}"
            );
        }
    }

    #[test]
    fn never_negative() {
        for dist in ALL {
            let d = Delay::new(1_000, 1_000_000, dist);
            let mut rng = SmallRng::seed_from_u64(4);
            let zeros = (0..10_000).filter(|_| d.sample(&mut rng) == 0).count();
            assert!(zeros > 0, "{dist:?}: the clamp is exercised");
        }
    }

    #[test]
    fn jitter_preserves_fifo() {
        for dist in ALL {
            let mut d = Delay::new(1_000_000, 900_000, dist);
            let mut rng = SmallRng::seed_from_u64(5);
            let releases: Vec<u64> = (0..10_000u64)
                .map(|i| d.release(i * 10_000, &mut rng))
                .collect();
            assert!(releases.windows(2).all(|w| w[0] <= w[1]), "{dist:?}");
            assert!(
                releases
                    .iter()
                    .enumerate()
                    .all(|(i, &r)| r >= i as u64 * 10_000)
            );
        }
    }
}

use rand::Rng;
use rand::rngs::SmallRng;

const PPM: u32 = 1_000_000;

/// True with probability `ppm` / 10⁶. Draws nothing for 0, so an unconfigured
/// impairment does not shift the random stream of the configured ones.
pub fn chance(ppm: u32, rng: &mut SmallRng) -> bool {
    ppm != 0 && (ppm >= PPM || rng.random_range(0..PPM) < ppm)
}

/// Random loss with optional correlation, as a two-state Markov chain (a simple
/// Gilbert model): after a loss the next packet is lost with p + ρ(1 − p), after a
/// delivery with p(1 − ρ). The long-run loss rate stays p for every ρ while the
/// mean burst length grows to 1 / ((1 − p)(1 − ρ)). (netem's correlation instead
/// blends successive random numbers, which changes the rate and barely the bursts.)
#[derive(Debug, Clone)]
pub struct GilbertLoss {
    after_loss_ppm: u32,
    after_delivery_ppm: u32,
    last_lost: bool,
}

impl GilbertLoss {
    pub fn new(loss_ppm: u32, correlation_ppm: u32) -> GilbertLoss {
        let (p, rho) = (
            u64::from(loss_ppm.min(PPM)),
            u64::from(correlation_ppm.min(PPM)),
        );
        let ppm = u64::from(PPM);
        let narrow = |v: u64| u32::try_from(v).unwrap_or(PPM);
        GilbertLoss {
            after_loss_ppm: narrow(p + rho * (ppm - p) / ppm),
            after_delivery_ppm: narrow(p * (ppm - rho) / ppm),
            last_lost: false,
        }
    }

    pub fn lose(&mut self, rng: &mut SmallRng) -> bool {
        let ppm = if self.last_lost {
            self.after_loss_ppm
        } else {
            self.after_delivery_ppm
        };
        self.last_lost = chance(ppm, rng);
        self.last_lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Loss rate and mean burst length over `n` packets.
    fn run(loss: &mut GilbertLoss, n: usize, seed: u64) -> (f64, f64) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (mut lost, mut bursts, mut prev) = (0usize, 0usize, false);
        for _ in 0..n {
            let l = loss.lose(&mut rng);
            lost += usize::from(l);
            bursts += usize::from(l && !prev);
            prev = l;
        }
        (lost as f64 / n as f64, lost as f64 / bursts.max(1) as f64)
    }

    #[test]
    fn one_percent_over_100k() {
        let (rate, burst) = run(&mut GilbertLoss::new(10_000, 0), 100_000, 1);
        assert!((rate - 0.01).abs() < 0.001, "{rate}");
        assert!(burst < 1.1, "{burst}");
    }

    #[test]
    fn correlation_lengthens_bursts_not_the_rate() {
        let (plain_rate, plain_burst) = run(&mut GilbertLoss::new(10_000, 0), 400_000, 2);
        let (rate, burst) = run(&mut GilbertLoss::new(10_000, 750_000), 400_000, 2);
        assert!((rate - 0.01).abs() < 0.001, "{rate}");
        assert!((plain_rate - 0.01).abs() < 0.001, "{plain_rate}");
        // Expected 1 / (0.99 · 0.25) ≈ 4.04 vs ≈ 1.01.
        assert!(burst > 3.0 * plain_burst, "{burst} vs {plain_burst}");
        assert!((burst - 4.04).abs() < 0.4, "{burst}");
    }

    #[test]
    fn extremes() {
        let mut rng = SmallRng::seed_from_u64(0);
        assert!(!chance(0, &mut rng));
        assert!(chance(PPM, &mut rng));
        let mut all = GilbertLoss::new(PPM, 500_000);
        assert!((0..100).all(|_| all.lose(&mut rng)));
        let mut none = GilbertLoss::new(0, 999_999);
        assert!((0..100).all(|_| !none.lose(&mut rng)));
    }
}

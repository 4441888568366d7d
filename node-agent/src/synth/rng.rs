//! Counter-based random numbers for the workload generators.
//!
//! Every draw is a pure function of `(seed, stream, index)`, so instance `i` of a
//! flow gets the same size in every run with the same seed, whatever order the
//! instances start in and however arrivals are spread. SplitMix64 is written out
//! here rather than taken from `rand`, whose small generators do not promise the
//! same output across versions: a seed in a published experiment must keep
//! meaning the same flows.

/// Independent sequences drawn from one seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Stream {
    Size = 0x5349_5a45,
    Arrival = 0x4152_5256,
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 64 random bits for draw `index` of `stream`.
pub fn bits(seed: u64, stream: Stream, index: u64) -> u64 {
    // Two rounds, so neighbouring seeds and indices do not give related outputs.
    splitmix(splitmix(seed ^ stream as u64).wrapping_add(index.wrapping_mul(GOLDEN)))
}

/// A uniform draw in the open interval (0, 1): never 0, so `-ln(u)` is finite.
pub fn unit(seed: u64, stream: Stream, index: u64) -> f64 {
    ((bits(seed, stream, index) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// An exponential draw with the given mean.
pub fn exponential(seed: u64, stream: Stream, index: u64, mean: f64) -> f64 {
    -unit(seed, stream, index).ln() * mean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_reproducible_and_independent_of_order() {
        let forward: Vec<u64> = (0..100).map(|i| bits(7, Stream::Size, i)).collect();
        let backward: Vec<u64> = (0..100).rev().map(|i| bits(7, Stream::Size, i)).collect();
        assert!(forward.iter().eq(backward.iter().rev()));
        assert_ne!(bits(7, Stream::Size, 0), bits(8, Stream::Size, 0));
        assert_ne!(bits(7, Stream::Size, 0), bits(7, Stream::Arrival, 0));
    }

    #[test]
    fn uniform_draws_are_uniform() {
        let n = 100_000;
        let mut buckets = [0u32; 10];
        let mut sum = 0.0;
        for i in 0..n {
            let u = unit(42, Stream::Size, i);
            assert!(u > 0.0 && u < 1.0);
            sum += u;
            buckets[(u * 10.0) as usize] += 1;
        }
        assert!((sum / n as f64 - 0.5).abs() < 0.005);
        // Chi-square with 9 degrees of freedom; 27.9 is the 0.1% critical value.
        let expected = n as f64 / 10.0;
        let chi2: f64 = buckets
            .iter()
            .map(|&b| (f64::from(b) - expected).powi(2) / expected)
            .sum();
        assert!(chi2 < 27.9, "chi-square {chi2}: {buckets:?}");
    }

    #[test]
    fn exponential_draws_have_the_mean_and_spread_of_an_exponential() {
        let n = 100_000;
        let draws: Vec<f64> = (0..n)
            .map(|i| exponential(3, Stream::Arrival, i, 2.0))
            .collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        let var = draws.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((mean - 2.0).abs() < 0.03, "mean {mean}");
        // An exponential's coefficient of variation is 1.
        assert!(
            (var.sqrt() / mean - 1.0).abs() < 0.02,
            "cv {}",
            var.sqrt() / mean
        );
        // P(X > mean) = 1/e.
        let above = draws.iter().filter(|&&d| d > 2.0).count() as f64 / n as f64;
        assert!((above - (-1.0f64).exp()).abs() < 0.005, "{above}");
    }
}

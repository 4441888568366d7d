//! Empirical flow-size distributions: points `P(size <= bytes) = p`, linear in
//! between, as ns-2's `EmpiricalRandomVariable` and the traffic generators of
//! pFabric and HPCC read them. A first point with `p > 0` is a point mass: that
//! share of flows has exactly its size.

use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum CdfError {
    #[error("a size distribution needs at least one point")]
    Empty,
    #[error("point {index}: probability {p} is not between 0 and 1")]
    Probability { index: usize, p: f64 },
    #[error("point {index}: sizes and probabilities must not decrease")]
    Decreasing { index: usize },
    #[error("the last point's probability is {0}, not 1")]
    Incomplete(f64),
}

#[derive(Debug, Clone, PartialEq)]
pub struct SizeCdf {
    /// (bytes, cumulative probability), both non-decreasing, the last at 1.
    points: Vec<(u64, f64)>,
}

impl SizeCdf {
    pub fn new(points: Vec<(u64, f64)>) -> Result<SizeCdf, CdfError> {
        let last = points.last().ok_or(CdfError::Empty)?.1;
        for (index, &(_, p)) in points.iter().enumerate() {
            if !(0.0..=1.0).contains(&p) {
                return Err(CdfError::Probability { index, p });
            }
        }
        for (index, pair) in points.windows(2).enumerate() {
            if pair[1].0 < pair[0].0 || pair[1].1 < pair[0].1 {
                return Err(CdfError::Decreasing { index: index + 1 });
            }
        }
        if (last - 1.0).abs() > 1e-9 {
            return Err(CdfError::Incomplete(last));
        }
        Ok(SizeCdf { points })
    }

    /// The size at cumulative probability `u` (in (0, 1]), at least one byte.
    pub fn sample(&self, u: f64) -> u64 {
        let i = self.points.partition_point(|&(_, p)| p < u);
        let size = match (
            i.checked_sub(1).and_then(|j| self.points.get(j)),
            self.points.get(i),
        ) {
            (Some(&(b0, p0)), Some(&(b1, p1))) if p1 > p0 => {
                b0 as f64 + (u - p0) / (p1 - p0) * (b1 - b0) as f64
            }
            (_, Some(&(b, _))) => b as f64,
            // u above the last point only through rounding: the largest size.
            (Some(&(b, _)), None) => b as f64,
            (None, None) => 1.0,
        };
        (size.round() as u64).max(1)
    }

    /// Mean size in bytes: the point mass of the first point plus each segment's
    /// share at its midpoint.
    pub fn mean(&self) -> f64 {
        let first = self.points.first().map_or(0.0, |&(b, p)| b as f64 * p);
        first
            + self
                .points
                .windows(2)
                .map(|w| (w[1].1 - w[0].1) * (w[0].0 + w[1].0) as f64 / 2.0)
                .sum::<f64>()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::synth::rng::{Stream, unit};

    /// The shipped web-search distribution, read the way the planner reads CSV.
    pub(crate) fn web_search() -> SizeCdf {
        let text = include_str!("../../../data/workloads/websearch.csv");
        let points = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("bytes"))
            .filter_map(|l| {
                let (b, p) = l.split_once(',')?;
                Some((b.trim().parse().ok()?, p.trim().parse().ok()?))
            })
            .collect();
        SizeCdf::new(points).expect("valid")
    }

    #[test]
    fn web_search_mean_and_shape() {
        let cdf = web_search();
        assert!((cdf.mean() - 1_711_250.0).abs() < 1.0, "{}", cdf.mean());
        let n = 200_000u64;
        let sizes: Vec<u64> = (0..n)
            .map(|i| cdf.sample(unit(9, Stream::Size, i)))
            .collect();
        let mean = sizes.iter().sum::<u64>() as f64 / n as f64;
        // Heavy-tailed: the sample mean converges slowly; 3% over 200k draws.
        assert!((mean / cdf.mean() - 1.0).abs() < 0.03, "sample mean {mean}");
        let share = |pred: &dyn Fn(u64) -> bool| {
            sizes.iter().filter(|&&s| pred(s)).count() as f64 / n as f64
        };
        assert!((share(&|s| s <= 80_000) - 0.53).abs() < 0.005);
        assert!((share(&|s| s <= 1_000_000) - 0.70).abs() < 0.005);
        assert!((share(&|s| s > 10_000_000) - 0.03).abs() < 0.002);
        let large: u64 = sizes.iter().filter(|&&s| s >= 10_000_000).sum();
        let bytes_share = large as f64 / sizes.iter().sum::<u64>() as f64;
        assert!((bytes_share - 0.35).abs() < 0.03, "{bytes_share}");
    }

    #[test]
    fn kolmogorov_smirnov_against_the_points() {
        let cdf = web_search();
        let n = 20_000u64;
        let mut sizes: Vec<u64> = (0..n)
            .map(|i| cdf.sample(unit(1, Stream::Size, i)))
            .collect();
        sizes.sort_unstable();
        // At every point of the distribution, the empirical CDF is within the
        // KS bound (1.95/sqrt(n): 0.1% significance).
        let bound = 1.95 / (n as f64).sqrt();
        for &(b, p) in &cdf.points {
            let below = sizes.partition_point(|&s| s <= b) as f64 / n as f64;
            assert!(
                (below - p).abs() < bound,
                "P(size <= {b}) = {below}, want {p}"
            );
        }
    }

    #[test]
    fn point_masses_and_interpolation() {
        let cdf = SizeCdf::new(vec![(1000, 0.5), (3000, 1.0)]).expect("valid");
        assert_eq!(cdf.sample(0.25), 1000, "the first point is a point mass");
        assert_eq!(cdf.sample(0.75), 2000);
        assert_eq!(cdf.sample(1.0), 3000);
        assert!((cdf.mean() - (500.0 + 1000.0)).abs() < 1e-9);
        let fixed = SizeCdf::new(vec![(4096, 1.0)]).expect("valid");
        assert_eq!(fixed.sample(0.3), 4096);
        assert_eq!(fixed.mean(), 4096.0);
    }

    #[test]
    fn bad_points_are_refused() {
        assert_eq!(SizeCdf::new(vec![]), Err(CdfError::Empty));
        assert_eq!(
            SizeCdf::new(vec![(10, 0.5), (5, 1.0)]),
            Err(CdfError::Decreasing { index: 1 })
        );
        assert_eq!(
            SizeCdf::new(vec![(10, 0.5)]),
            Err(CdfError::Incomplete(0.5))
        );
        assert!(matches!(
            SizeCdf::new(vec![(10, 1.5)]),
            Err(CdfError::Probability { index: 0, .. })
        ));
    }
}

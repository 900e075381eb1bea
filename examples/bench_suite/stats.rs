//! Small statistics: percentiles of latencies, and the median and spread of repeated runs.

use serde::Serialize;

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub samples: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// The value at quantile `q` (0..=1) of sorted `values`, by the nearest rank.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

impl Latency {
    pub fn of(mut ms: Vec<f64>) -> Self {
        ms.sort_by(f64::total_cmp);
        Latency {
            samples: ms.len(),
            p50: quantile(&ms, 0.5),
            p99: quantile(&ms, 0.99),
            max: ms.last().copied().unwrap_or(0.0),
        }
    }
}

/// The median of repeated measurements, with the smallest and largest.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: Vec<f64>,
}

impl Spread {
    pub fn of(runs: &[f64]) -> Self {
        let mut sorted = runs.to_vec();
        sorted.sort_by(f64::total_cmp);
        Spread {
            median: quantile(&sorted, 0.5),
            min: sorted.first().copied().unwrap_or(0.0),
            max: sorted.last().copied().unwrap_or(0.0),
            runs: runs.to_vec(),
        }
    }
}

/// Points of an empirical CDF, thinned to at most `n`: (latency ms, fraction at or below).
pub fn cdf(ms: &[f64], n: usize) -> Vec<(f64, f64)> {
    let mut sorted = ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    let len = sorted.len();
    if len == 0 {
        return Vec::new();
    }
    let step = len.div_ceil(n.max(1)).max(1);
    let mut out: Vec<(f64, f64)> = sorted
        .iter()
        .enumerate()
        .step_by(step)
        .map(|(i, v)| (*v, (i + 1) as f64 / len as f64))
        .collect();
    out.push((sorted[len - 1], 1.0));
    out
}

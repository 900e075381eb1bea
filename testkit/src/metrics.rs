//! Figures out of the Prometheus text exposition a tracker's `/metrics` serves.

/// The sum of every series of metric family `name` (all label sets); 0 when it has none.
/// `name` must be the whole family name: `redelivery_in_flight` does not match
/// `redelivery_in_flight_total`.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.chars().next()? {
                '{' => rest.rsplit_once('}')?.1,
                ' ' => rest,
                _ => return None,
            };
            value.trim().parse::<f64>().ok()
        })
        .sum()
}

/// The value of one `series` (for example `redelivery_marker_errors_total{kind="empty"}`);
/// 0 when absent.
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// The cumulative buckets `(upper bound, count)` of histogram `name` (an unlabelled one),
/// summed over several expositions (one per tracker), in the order they are listed.
pub fn histogram_buckets<S: AsRef<str>>(texts: &[S], name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut sum: Vec<(f64, f64)> = Vec::new();
    for text in texts {
        let buckets = text.as_ref().lines().filter_map(|l| {
            let (le, count) = l.strip_prefix(&prefix)?.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse::<f64>().ok()?))
        });
        for (i, (le, count)) in buckets.enumerate() {
            match sum.get_mut(i) {
                Some(b) => b.1 += count,
                None => sum.push((le, count)),
            }
        }
    }
    sum
}

/// The upper bound of the bucket holding quantile `q` of cumulative `buckets` (the
/// histogram's resolution); `None` when it recorded nothing.
pub fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, count)| *count >= q * total)
        .map(|(le, _)| *le)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP redelivery_in_flight Deliveries in flight
redelivery_in_flight{partition=\"0\"} 3
redelivery_in_flight{partition=\"1\"} 4
redelivery_in_flight_total 100
redelivery_ready 1
lag_bucket{le=\"0.001\"} 1
lag_bucket{le=\"0.01\"} 9
lag_bucket{le=\"+Inf\"} 10
";

    #[test]
    fn sums_a_family_and_reads_one_series() {
        assert_eq!(metric_sum(TEXT, "redelivery_in_flight"), 7.0);
        assert_eq!(metric_sum(TEXT, "redelivery_ready"), 1.0);
        assert_eq!(
            metric_value(TEXT, "redelivery_in_flight{partition=\"1\"}"),
            4.0
        );
        assert_eq!(metric_value(TEXT, "absent"), 0.0);
    }

    #[test]
    fn histogram_quantiles_are_bucket_bounds() {
        let b = histogram_buckets(&[TEXT, TEXT], "lag");
        assert_eq!(b, vec![(0.001, 2.0), (0.01, 18.0), (f64::INFINITY, 20.0)]);
        assert_eq!(bucket_quantile(&b, 0.5), Some(0.01));
        assert_eq!(bucket_quantile(&b, 1.0), Some(f64::INFINITY));
        assert_eq!(bucket_quantile(&[], 0.5), None);
    }
}

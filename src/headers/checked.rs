//! The `kr-*` headers a producer may set, read with a documented range.
//!
//! They come from any producer, so they are validated, not trusted: `kr-timeout-ms: 0` would
//! make every delivery due the moment it starts, `"30"` meant as seconds would do nearly the
//! same, and a delivery limit above what the tracker can count would never be reached. Each
//! value out of range is clamped or ignored, and the caller counts and logs it.

use std::time::Duration;

use super::{text, HeaderList, ATTEMPT, MAX_DELIVERIES, TIMEOUT_MS};

/// The shortest timeout `kr-timeout-ms` may ask for; smaller values are raised to it (a value
/// this small is most likely seconds written as milliseconds).
pub const MIN_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest timeout `kr-timeout-ms` may ask for (7 days); larger values are lowered to it.
/// Longer work keeps its delivery alive instead.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// The highest delivery attempt the tracker counts (its state keeps 13 bits): the upper bound
/// of `kr-max-deliveries`, `kr-attempt` and the tracker's `--max-deliveries`.
pub const MAX_ATTEMPT: u32 = 8191;

/// A header value after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked<T> {
    /// The header is not there.
    Absent,
    /// In range.
    Valid(T),
    /// Out of range, moved to the nearest bound.
    Clamped(T),
    /// Not a number in the header's unit (or zero where zero means nothing): not used.
    Ignored,
}

impl<T> Checked<T> {
    /// The value to use, if any.
    pub fn value(self) -> Option<T> {
        match self {
            Checked::Valid(v) | Checked::Clamped(v) => Some(v),
            Checked::Absent | Checked::Ignored => None,
        }
    }

    /// Whether the header was there but not usable as written.
    pub fn is_odd(&self) -> bool {
        matches!(self, Checked::Clamped(_) | Checked::Ignored)
    }
}

/// An integer header, parsed and then placed in `min..=max`. Zero, negative numbers and text
/// that is not a decimal integer are ignored.
fn ranged(headers: &HeaderList, name: &str, min: u64, max: u64) -> Checked<u64> {
    let Some(raw) = super::value(headers, name) else {
        return Checked::Absent;
    };
    let Some(n) = std::str::from_utf8(raw)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|&n| n > 0)
    else {
        return Checked::Ignored;
    };
    if n < min {
        Checked::Clamped(min)
    } else if n > max {
        Checked::Clamped(max)
    } else {
        Checked::Valid(n)
    }
}

/// `kr-timeout-ms`: the record's delivery timeout, in `MIN_TIMEOUT..=MAX_TIMEOUT`.
pub fn timeout(headers: &HeaderList) -> Checked<Duration> {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    match ranged(headers, TIMEOUT_MS, ms(MIN_TIMEOUT), ms(MAX_TIMEOUT)) {
        Checked::Valid(v) => Checked::Valid(Duration::from_millis(v)),
        Checked::Clamped(v) => Checked::Clamped(Duration::from_millis(v)),
        Checked::Absent => Checked::Absent,
        Checked::Ignored => Checked::Ignored,
    }
}

/// `kr-max-deliveries`: the record's delivery limit, in `1..=MAX_ATTEMPT`.
pub fn max_deliveries(headers: &HeaderList) -> Checked<u32> {
    narrow(ranged(headers, MAX_DELIVERIES, 1, u64::from(MAX_ATTEMPT)))
}

/// `kr-attempt`: which delivery a copy is, in `1..=MAX_ATTEMPT`. The tracker writes it on
/// copies; on any other record it is a producer's claim, read with the same bounds.
pub fn attempt(headers: &HeaderList) -> Checked<u32> {
    narrow(ranged(headers, ATTEMPT, 1, u64::from(MAX_ATTEMPT)))
}

/// A value already bounded by `MAX_ATTEMPT` as `u32`.
fn narrow(c: Checked<u64>) -> Checked<u32> {
    let n = |v: u64| u32::try_from(v).unwrap_or(MAX_ATTEMPT);
    match c {
        Checked::Valid(v) => Checked::Valid(n(v)),
        Checked::Clamped(v) => Checked::Clamped(n(v)),
        Checked::Absent => Checked::Absent,
        Checked::Ignored => Checked::Ignored,
    }
}

/// The header of `headers` that [`timeout`], [`max_deliveries`] or [`attempt`] found unusable
/// as written, with what it said: for the warning that reports it.
pub fn odd_ones(headers: &HeaderList) -> Vec<(&'static str, String)> {
    let said = |name: &str| text(headers, name).unwrap_or("(not UTF-8)").to_string();
    let mut out = Vec::new();
    if timeout(headers).is_odd() {
        out.push((TIMEOUT_MS, said(TIMEOUT_MS)));
    }
    if max_deliveries(headers).is_odd() {
        out.push((MAX_DELIVERIES, said(MAX_DELIVERIES)));
    }
    if attempt(headers).is_odd() {
        out.push((ATTEMPT, said(ATTEMPT)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &str, value: &[u8]) -> HeaderList {
        vec![(name.into(), Some(value.to_vec()))]
    }

    #[test]
    fn timeouts_out_of_range_are_clamped_and_nonsense_ignored() {
        let t = |v: &[u8]| timeout(&with(TIMEOUT_MS, v));
        assert_eq!(t(b"30000"), Checked::Valid(Duration::from_secs(30)));
        assert_eq!(t(b" 1500 "), Checked::Valid(Duration::from_millis(1500)));
        assert_eq!(
            t(b"30"),
            Checked::Clamped(MIN_TIMEOUT),
            "seconds written as ms"
        );
        assert_eq!(t(b"99999999999"), Checked::Clamped(MAX_TIMEOUT));
        for nonsense in [&b"0"[..], b"-5", b"30s", b"", b"\xff\xfe", b"1e3"] {
            assert_eq!(t(nonsense), Checked::Ignored, "{nonsense:?}");
        }
        assert_eq!(timeout(&Vec::new()), Checked::Absent);
        assert!(!Checked::<u32>::Absent.is_odd());
    }

    #[test]
    fn delivery_limits_and_attempts_stay_countable() {
        let m = |v: &[u8]| max_deliveries(&with(MAX_DELIVERIES, v));
        assert_eq!(m(b"3"), Checked::Valid(3));
        assert_eq!(m(b"8191"), Checked::Valid(MAX_ATTEMPT));
        assert_eq!(m(b"100000"), Checked::Clamped(MAX_ATTEMPT));
        assert_eq!(m(b"0"), Checked::Ignored);
        assert_eq!(m(b"-1"), Checked::Ignored);
        let a = |v: &[u8]| attempt(&with(ATTEMPT, v));
        assert_eq!(a(b"2"), Checked::Valid(2));
        assert_eq!(a(b"4294967296"), Checked::Clamped(MAX_ATTEMPT));
        assert_eq!(a(b"x"), Checked::Ignored);
    }

    #[test]
    fn odd_ones_names_each_header_and_what_it_said() {
        let mut h = with(TIMEOUT_MS, b"30");
        h.push((MAX_DELIVERIES.into(), Some(b"lots".to_vec())));
        h.push((ATTEMPT.into(), Some(b"2".to_vec())));
        assert_eq!(
            odd_ones(&h),
            vec![
                (TIMEOUT_MS, "30".to_string()),
                (MAX_DELIVERIES, "lots".to_string())
            ]
        );
    }
}

//! `redelivery-tracker inspect`: what a running tracker holds, from its admin endpoint.

use std::fmt::Write as _;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::tracker::inspect::TrackerView;

/// Why `inspect` could not show anything.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InspectError {
    /// The admin endpoint did not answer.
    #[error("cannot reach the tracker's admin endpoint at {addr}: {why}")]
    Unreachable {
        /// Where we looked.
        addr: String,
        /// What went wrong.
        why: String,
    },
    /// It answered something else than an inspect view.
    #[error("unexpected answer from {addr}: {why}")]
    BadAnswer {
        /// Where we looked.
        addr: String,
        /// What was wrong with it.
        why: String,
    },
}

/// Fetches `/inspect` from the admin server at `addr` (`host:port`, optionally `http://`).
pub async fn fetch(addr: &str) -> Result<TrackerView, InspectError> {
    let addr = addr
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let unreachable = |why: String| InspectError::Unreachable {
        addr: addr.clone(),
        why,
    };
    let stream = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect(&addr),
    )
    .await
    .map_err(|_| unreachable("timed out".into()))?
    .map_err(|e| unreachable(e.to_string()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    tokio::spawn(conn);
    let request = hyper::Request::get("/inspect")
        .header(hyper::header::HOST, &addr)
        .body(Empty::<Bytes>::new())
        .map_err(|e| unreachable(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(e.to_string()))?
        .to_bytes();
    let bad = |why: String| InspectError::BadAnswer {
        addr: addr.clone(),
        why,
    };
    if !status.is_success() {
        return Err(bad(format!("HTTP {status}")));
    }
    serde_json::from_slice(&body).map_err(|e| bad(e.to_string()))
}

fn duration(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let d = Duration::from_millis(ms.unsigned_abs() / 1000 * 1000);
    match ms.unsigned_abs() {
        0..=999 => format!("{ms}ms"),
        _ => format!("{sign}{}", humantime::format_duration(d)),
    }
}

/// The view as a table, one row per partition.
pub fn table(view: &TrackerView) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<9} {:<6} {:>9} {:>9} {:>12}  {:<24} {:>11}  NEXT DEADLINES IN",
        "PARTITION", "READY", "IN FLIGHT", "SCHEDULED", "REDELIVERED", "OLDEST", "OLDEST AGE"
    );
    for p in &view.partitions {
        let next: Vec<String> = p
            .next_deadlines_in_ms
            .iter()
            .map(|&d| duration(d))
            .collect();
        let oldest = if p.oldest.is_none() {
            "-".to_string()
        } else {
            duration(p.oldest_age_ms)
        };
        let _ = writeln!(
            out,
            "{:<9} {:<6} {:>9} {:>9} {:>12}  {:<24} {:>11}  {}",
            p.partition,
            match (p.ready, p.waiting_for_snapshot) {
                (true, _) => "yes",
                (false, true) => "no*",
                (false, false) => "no",
            },
            p.in_flight,
            p.scheduled,
            p.redeliveries,
            p.oldest.as_deref().unwrap_or("-"),
            oldest,
            if next.is_empty() {
                "-".to_string()
            } else {
                next.join(", ")
            }
        );
    }
    if view.partitions.iter().any(|p| p.waiting_for_snapshot) {
        let _ = writeln!(
            out,
            "* waiting for its snapshot, which could not be read (see the tracker's log)"
        );
    }
    let in_flight: usize = view.partitions.iter().map(|p| p.in_flight).sum();
    let scheduled: usize = view.partitions.iter().map(|p| p.scheduled).sum();
    let _ = writeln!(
        out,
        "{} partitions, {in_flight} in flight, {scheduled} scheduled, {}",
        view.partitions.len(),
        if view.ready { "ready" } else { "catching up" }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracker::inspect::PartitionView;

    #[test]
    fn table_shows_each_partition_and_a_total() {
        let view = TrackerView {
            ready: true,
            partitions: vec![
                PartitionView {
                    partition: 0,
                    ready: true,
                    waiting_for_snapshot: false,
                    in_flight: 3,
                    scheduled: 2,
                    oldest: Some("orders/0@12".into()),
                    oldest_age_ms: 65_000,
                    next_deadlines_in_ms: vec![-20, 1_500],
                    redeliveries: 7,
                    committed_offset: Some(10),
                },
                PartitionView {
                    partition: 1,
                    ready: false,
                    waiting_for_snapshot: false,
                    in_flight: 0,
                    scheduled: 0,
                    oldest: None,
                    oldest_age_ms: 0,
                    next_deadlines_in_ms: vec![],
                    redeliveries: 0,
                    committed_offset: None,
                },
            ],
        };
        let t = table(&view);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(
            lines[1].contains("1m 5s")
                && lines[1].contains("orders/0@12")
                && lines[1].contains("-20ms, 1s")
                && lines[1].contains(" 7 "),
            "{t}"
        );
        assert!(lines[2].starts_with("1         no"), "{t}");
        assert_eq!(lines[3], "2 partitions, 3 in flight, 2 scheduled, ready");
    }
}

//! The checker: from what the workers wrote and what sits in the dead-letter and markers
//! topics, decides for every produced id whether it was acked or dead-lettered, and counts the
//! duplicates per fault type.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Seek, SeekFrom};

use rdkafka::message::{Message, OwnedMessage};

use crate::fleet::Incarnation;
use crate::schedule::{Fault, FaultKind};

/// One line a worker wrote.
#[derive(Debug, Clone)]
struct Event {
    incarnation: usize,
    outcome: String,
    coordinates: (String, i32, i64),
    at_ms: u64,
}

/// Everything the workers said so far, read incrementally from their logs.
#[derive(Default)]
pub struct Checker {
    read_to: Vec<u64>,
    events: HashMap<String, Vec<Event>>,
    acked: HashSet<String>,
    /// Ids the DLQ holds, with the `kr-dlq-reason` they carry.
    dead: HashMap<String, Vec<String>>,
    /// Dead-letter records without a reason header (must stay 0).
    pub dead_without_reason: usize,
    /// Lines that did not parse (must stay 0).
    pub bad_lines: usize,
}

/// The outcome of a run.
#[derive(Debug, Default)]
pub struct Report {
    pub produced: usize,
    pub acked: usize,
    /// Acked, but the worker was killed between the ack and its line; proved by the End marker.
    pub acked_line_lost: usize,
    pub dead_lettered: usize,
    pub lost: Vec<String>,
    /// Extra settlements (acks beyond the first, or an ack and a dead-letter) by the fault
    /// judged to have caused them.
    pub duplicates: BTreeMap<String, usize>,
}

impl Checker {
    /// Reads what the worker logs gained since the last call.
    pub fn read_logs(&mut self, incarnations: &[Incarnation]) {
        self.read_to.resize(incarnations.len(), 0);
        for (n, inc) in incarnations.iter().enumerate() {
            let Ok(mut f) = std::fs::File::open(&inc.log) else {
                continue;
            };
            if f.seek(SeekFrom::Start(self.read_to[n])).is_err() {
                continue;
            }
            let mut reader = BufReader::new(f);
            let mut line = String::new();
            // Only whole lines: a line still being written is read next time.
            while reader.read_line(&mut line).unwrap_or(0) > 0 && line.ends_with('\n') {
                self.read_to[n] += line.len() as u64;
                self.take(n, line.trim_end());
                line.clear();
            }
        }
    }

    fn take(&mut self, incarnation: usize, line: &str) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            self.bad_lines += 1;
            return;
        };
        let (Some(key), Some(outcome)) = (v["key"].as_str(), v["outcome"].as_str()) else {
            self.bad_lines += 1;
            return;
        };
        let event = Event {
            incarnation,
            outcome: outcome.to_string(),
            coordinates: (
                v["topic"].as_str().unwrap_or_default().to_string(),
                v["partition"].as_i64().unwrap_or(-1) as i32,
                v["offset"].as_i64().unwrap_or(-1),
            ),
            at_ms: v["at_ms"].as_u64().unwrap_or(0),
        };
        if outcome == "ack" {
            self.acked.insert(key.to_string());
        }
        self.events.entry(key.to_string()).or_default().push(event);
    }

    /// Takes the dead-letter topic's records as read so far (all of them, each call).
    pub fn set_dead_letters(&mut self, records: &[OwnedMessage]) {
        self.dead.clear();
        self.dead_without_reason = 0;
        for m in records {
            let Some(key) = m.key().map(|k| String::from_utf8_lossy(k).into_owned()) else {
                continue;
            };
            match crate::common::header(m, "kr-dlq-reason") {
                Some(reason) => self.dead.entry(key).or_default().push(reason),
                None => self.dead_without_reason += 1,
            }
        }
    }

    /// Ids settled so far (acked or dead-lettered).
    pub fn settled(&self) -> usize {
        self.acked.len()
            + self
                .dead
                .keys()
                .filter(|k| !self.acked.contains(*k))
                .count()
    }

    /// Ids in `all` neither acked nor dead-lettered.
    pub fn unsettled<'k>(&self, all: &'k [String]) -> Vec<&'k String> {
        all.iter()
            .filter(|k| !self.acked.contains(*k) && !self.dead.contains_key(*k))
            .collect()
    }

    /// Settles the remaining ids against the End markers (an ack whose line died with its
    /// process), then counts everything.
    pub fn report(
        &self,
        all: &[String],
        ends: &HashSet<(String, i32, i64)>,
        incarnations: &[Incarnation],
        faults: &[(u64, Fault)],
    ) -> Report {
        let mut r = Report {
            produced: all.len(),
            ..Report::default()
        };
        for key in all {
            let events = self.events.get(key).map(Vec::as_slice).unwrap_or(&[]);
            let acks = events.iter().filter(|e| e.outcome == "ack").count();
            let dead = self.dead.get(key).map_or(0, Vec::len);
            if acks > 0 {
                r.acked += 1;
            } else if dead > 0 {
                r.dead_lettered += 1;
            } else if events.iter().any(|e| {
                e.outcome == "acking"
                    && incarnations[e.incarnation].killed_at_ms.is_some()
                    && ends.contains(&e.coordinates)
            }) {
                r.acked_line_lost += 1;
            } else {
                r.lost.push(key.clone());
            }
            let settlements = acks + dead;
            if settlements > 1 {
                let cause = blame(events, incarnations, faults);
                *r.duplicates.entry(cause).or_default() += settlements - 1;
            }
        }
        r
    }
}

/// Names the fault that most likely caused a record to be settled twice: a worker stopped or
/// killed while it held a delivery of it (received, not yet settled), else the tracker or
/// broker fault in the minute before its second delivery, else the worker fault in that
/// minute, else none ("unattributed").
///
/// Held, not merely received before: a worker stopped long after it acked a record is not to
/// blame for that record's second delivery. (Counted by "received before" until 2026-12-03,
/// every duplicate of a record whose worker was stopped at any later time went to the stops,
/// which hid 72,000 records re-read after a resume check was replaced: RELIABILITY.md.) A
/// settlement's line is stamped when the settlement was durable; until 2026-12-05 it was stamped
/// when it began, so a worker stopped between the two did not count as holding the delivery,
/// and its late End's duplicate went to the nearest infrastructure fault instead.
fn blame(events: &[Event], incarnations: &[Incarnation], faults: &[(u64, Fault)]) -> String {
    let mut received: Vec<&Event> = events.iter().filter(|e| e.outcome == "received").collect();
    received.sort_by_key(|e| e.at_ms);
    // When the incarnation that received `e` settled that delivery, if it did.
    let settled_at = |e: &Event| {
        events
            .iter()
            .filter(|s| {
                s.incarnation == e.incarnation
                    && s.coordinates == e.coordinates
                    && s.at_ms >= e.at_ms
                    && matches!(s.outcome.as_str(), "ack" | "nack" | "reject")
            })
            .map(|s| s.at_ms)
            .min()
    };
    let held_at = |e: &Event, t: u64| e.at_ms <= t && settled_at(e).is_none_or(|s| s > t);
    if received.iter().any(|e| {
        incarnations[e.incarnation]
            .stopped
            .iter()
            .any(|&(from, _)| held_at(e, from))
    }) {
        return FaultKind::WorkerStop.to_string();
    }
    if received.iter().any(|e| {
        incarnations[e.incarnation]
            .killed_at_ms
            .is_some_and(|k| held_at(e, k))
    }) {
        return FaultKind::WorkerKill.to_string();
    }
    // A worker killed or stopped after its batch's Starts were durable but before it handed
    // the batch out never received it: the last fault of any kind in the minute before the
    // second delivery, an infrastructure one first.
    let second = received.get(1).map_or(u64::MAX, |e| e.at_ms);
    let before = |infrastructure: bool| {
        faults.iter().rev().find(|(at, f)| {
            *at <= second && second - at < 60_000 && f.kind.is_infrastructure() == infrastructure
        })
    };
    before(true)
        .or_else(|| before(false))
        .map_or_else(|| "unattributed".to_string(), |(_, f)| f.kind.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn event(incarnation: usize, outcome: &str, offset: i64, at_ms: u64) -> Event {
        Event {
            incarnation,
            outcome: outcome.to_string(),
            coordinates: ("t".to_string(), 0, offset),
            at_ms,
        }
    }

    fn fault(at_ms: u64, kind: FaultKind) -> (u64, Fault) {
        let f = Fault {
            at: Duration::ZERO,
            kind,
            target: 0,
        };
        (at_ms, f)
    }

    /// Worker 0 received offset 5 at 1 s and was stopped at 2 s for 7 s; the copy (offset 9)
    /// went to worker 1; worker 0 acked the original when it woke.
    fn stopped_while_holding() -> (Vec<Event>, Vec<Incarnation>) {
        let events = vec![
            event(0, "received", 5, 1_000),
            event(1, "received", 9, 7_000),
            event(1, "ack", 9, 7_200),
            event(0, "ack", 5, 9_100),
        ];
        let mut stopped = Incarnation::default();
        stopped.stopped.push((2_000, 9_000));
        (events, vec![stopped, Incarnation::default()])
    }

    #[test]
    fn a_worker_stopped_while_it_held_the_record_is_blamed() {
        let (events, incarnations) = stopped_while_holding();
        let faults = [fault(1_500, FaultKind::TrackerKill)];
        assert_eq!(
            blame(&events, &incarnations, &faults),
            FaultKind::WorkerStop.to_string()
        );
    }

    /// The same worker acked the record before its stop: the stop did not cause the second
    /// delivery (here, a tracker kill just before it did).
    #[test]
    fn a_worker_stopped_after_it_acked_is_not_blamed() {
        let (mut events, incarnations) = stopped_while_holding();
        events[3].at_ms = 1_200;
        let faults = [
            fault(1_500, FaultKind::WorkerKill),
            fault(6_000, FaultKind::TrackerKill),
        ];
        assert_eq!(
            blame(&events, &incarnations, &faults),
            FaultKind::TrackerKill.to_string()
        );
        assert_eq!(
            blame(&events, &incarnations, &faults[..1]),
            FaultKind::WorkerKill.to_string(),
            "with no infrastructure fault, the worker fault in the minute before"
        );
        assert_eq!(blame(&events, &incarnations, &[]), "unattributed");
    }
}

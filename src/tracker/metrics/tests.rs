//! Each event moves its counter, and the known label sets exist at zero before any event.

use super::intake::{MarkerUndecodable, Tombstone};
use super::work::{DeliveryParked, HeldForGroup, ProduceFailed};
use super::*;
use crate::marker::SourceRef;
use crate::tracker::core::group_hold::{AfterHold, CopiedAfterHold};

fn series(m: &Metrics, s: &str) -> f64 {
    m.render()
        .lines()
        .find_map(|l| l.strip_prefix(s)?.trim().parse().ok())
        .unwrap_or(-1.0)
}

#[test]
fn known_label_sets_start_at_zero() {
    let m = Metrics::new();
    for kind in Problem::KINDS {
        assert_eq!(
            series(&m, &format!("redelivery_problems_total{{kind=\"{kind}\"}}")),
            0.0,
            "{kind}"
        );
    }
    assert_eq!(
        series(&m, "redelivery_marker_errors_total{kind=\"tombstone\"}"),
        0.0
    );
}

#[test]
fn every_problem_counts_under_its_own_kind() {
    let m = Metrics::new();
    let problems = [
        Problem::RestoreThreadGone,
        Problem::WorkerGone,
        Problem::ReadBeforeRestore {
            partition: 0,
            offset: 1,
        },
        Problem::SnapshotEntriesSkipped {
            partition: 0,
            skipped: 2,
        },
        Problem::MarkersNotBrokerStamped { partition: 3 },
        Problem::ReplayStalled {
            partition: 1,
            silent: std::time::Duration::from_secs(5),
        },
        Problem::RedeliveriesHeld {
            partition: 1,
            held: std::time::Duration::from_secs(5),
        },
    ];
    let kinds: Vec<_> = problems.iter().map(Problem::kind).collect();
    for p in problems {
        m.emit(p);
    }
    for kind in kinds {
        assert!(Problem::KINDS.contains(&kind));
        assert_eq!(
            series(&m, &format!("redelivery_problems_total{{kind=\"{kind}\"}}")),
            1.0
        );
    }
}

#[test]
fn a_rate_limited_event_still_counts_every_time() {
    let m = Metrics::new();
    let error = crate::marker::DecodeError::Empty;
    for offset in 0..100 {
        m.emit(MarkerUndecodable {
            partition: 0,
            offset,
            error: &error,
        });
        m.emit(Tombstone {
            partition: 0,
            offset,
        });
        m.emit(ProduceFailed {
            what: "copy",
            target: "t",
            error: &"broker away",
        });
    }
    let kind = error.kind();
    assert_eq!(
        series(
            &m,
            &format!("redelivery_marker_errors_total{{kind=\"{kind}\"}}")
        ),
        100.0
    );
    assert_eq!(
        series(&m, "redelivery_marker_errors_total{kind=\"tombstone\"}"),
        100.0
    );
    assert_eq!(
        series(&m, "redelivery_produce_errors_total{what=\"copy\"}"),
        100.0
    );
}

#[test]
fn a_parked_delivery_is_counted() {
    let m = Metrics::new();
    m.emit(DeliveryParked {
        source: &SourceRef::new("t", 0, 1),
        why: "refused",
        retry_in: std::time::Duration::from_secs(1),
    });
    assert_eq!(series(&m, "redelivery_parks_total"), 1.0);
}

#[test]
fn holds_for_the_source_group_are_counted_from_zero() {
    let m = Metrics::new();
    let held = "redelivery_group_holds_total{outcome=\"held\"}";
    let waited = "redelivery_group_holds_total{outcome=\"copied_after_wait\"}";
    let no_answer = "redelivery_group_holds_total{outcome=\"copied_no_answer\"}";
    let no_offset = "redelivery_group_holds_total{outcome=\"copied_no_offset\"}";
    let handed_out = "redelivery_group_holds_total{outcome=\"copied_handed_out\"}";
    let all =
        |m: &Metrics| [held, waited, no_answer, no_offset, handed_out].map(|name| series(m, name));
    assert_eq!(all(&m), [0.0; 5]);
    let mut copied = CopiedAfterHold::default();
    copied.add(AfterHold::Waited);
    copied.add(AfterHold::NoOffset);
    copied.add(AfterHold::NoOffset);
    m.emit(HeldForGroup {
        held: 3,
        copied_after_hold: copied,
    });
    assert_eq!(all(&m), [3.0, 1.0, 0.0, 2.0, 0.0]);
}

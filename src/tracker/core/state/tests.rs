use super::*;

fn src(offset: i64) -> SourceRef {
    SourceRef::new("orders", 0, offset)
}

fn start(offset: i64, timeout_ms: u32, attempt: u32) -> Marker {
    Marker::Start {
        source: src(offset),
        timeout_ms,
        attempt,
    }
}

#[test]
fn start_without_end_expires_once_at_its_deadline() {
    let mut s = PartitionState::new();
    assert_eq!(s.on_marker(10, 1_000, &start(5, 500, 1)), Applied::Started);
    assert_eq!(s.next_deadline(), Some(1_500));
    assert!(s.expired(1_499, 10).is_empty());
    let due = s.expired(1_500, 10);
    assert_eq!(
        due,
        vec![Expiry {
            source: src(5),
            attempt: 1,
            cause: Cause::Timeout,
            deadline_ms: 1_500,
            due_before_takeover: false,
        }]
    );
    assert!(
        s.expired(10_000, 10).is_empty(),
        "dispatched deliveries never expire again"
    );
    assert_eq!(
        s.in_flight(),
        1,
        "still in flight until the tracker's End is read"
    );
    assert_eq!(
        s.on_marker(11, 1_600, &Marker::End { source: src(5) }),
        Applied::Ended
    );
    assert_eq!(s.in_flight(), 0);
}

#[test]
fn acked_delivery_never_expires() {
    let mut s = PartitionState::new();
    s.on_marker(0, 0, &start(1, 100, 1));
    s.on_marker(1, 50, &Marker::End { source: src(1) });
    assert_eq!(s.next_deadline(), None);
    assert!(s.expired(i64::MAX, 10).is_empty());
}

#[test]
fn keep_alive_moves_the_deadline() {
    let mut s = PartitionState::new();
    s.on_marker(0, 0, &start(1, 100, 1));
    let keep = Marker::KeepAlive {
        source: src(1),
        timeout_ms: 1_000,
    };
    assert_eq!(s.on_marker(1, 90, &keep), Applied::KeptAlive);
    assert!(s.expired(500, 10).is_empty());
    assert_eq!(s.next_deadline(), Some(1_090));
    assert_eq!(s.expired(1_090, 10).len(), 1);
}

#[test]
fn nack_is_due_after_its_delay_with_its_cause() {
    let mut s = PartitionState::new();
    s.on_marker(0, 0, &start(1, 30_000, 2));
    let nack = Marker::Nack {
        source: src(1),
        delay_ms: 200,
    };
    assert_eq!(s.on_marker(1, 100, &nack), Applied::Nacked);
    // A keep-alive racing behind the nack must not undo it.
    let keep = Marker::KeepAlive {
        source: src(1),
        timeout_ms: 60_000,
    };
    s.on_marker(2, 150, &keep);
    let due = s.expired(300, 10);
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].cause, Cause::Nacked);
    assert_eq!(due[0].attempt, 2);
}

#[test]
fn reject_is_due_at_once_with_its_reason() {
    let mut s = PartitionState::new();
    s.on_marker(0, 0, &start(1, 30_000, 1));
    let reject = Marker::Reject {
        source: src(1),
        reason: "schema mismatch".into(),
    };
    assert_eq!(s.on_marker(1, 100, &reject), Applied::Rejected);
    let due = s.expired(100, 10);
    assert_eq!(due[0].cause, Cause::Rejected("schema mismatch".into()));
}

#[test]
fn odd_sequences_are_reported_not_fatal() {
    let mut s = PartitionState::new();
    assert_eq!(
        s.on_marker(0, 0, &Marker::End { source: src(9) }),
        Applied::Odd(Oddity::EndWithoutStart)
    );
    let keep = Marker::KeepAlive {
        source: src(9),
        timeout_ms: 1,
    };
    assert_eq!(
        s.on_marker(1, 0, &keep),
        Applied::Odd(Oddity::SettleWithoutStart)
    );
    s.on_marker(2, 0, &start(9, 10, 1));
    s.expired(10, 10);
    assert_eq!(
        s.on_marker(3, 20, &start(9, 10, 1)),
        Applied::Odd(Oddity::LateForRedelivery)
    );
    assert_eq!(
        s.on_marker(4, 20, &keep),
        Applied::Odd(Oddity::LateForRedelivery)
    );
    assert_eq!(
        s.on_marker(5, 0, &Marker::Tick { nonce: 7 }),
        Applied::Tick(7)
    );
}

#[test]
fn duplicate_start_keeps_the_first_offset_for_commits() {
    let mut s = PartitionState::new();
    s.on_marker(10, 0, &start(1, 100, 1));
    assert_eq!(s.on_marker(20, 50, &start(1, 100, 1)), Applied::Restarted);
    assert_eq!(s.summary(21, 60).commit_offset, 10);
    // The refreshed deadline wins; the old one is stale.
    assert!(s.expired(120, 10).is_empty());
    assert_eq!(s.expired(150, 10).len(), 1);
}

#[test]
fn commit_offset_is_the_oldest_start_in_flight() {
    let mut s = PartitionState::new();
    assert_eq!(s.summary(0, 0).commit_offset, 0);
    s.on_marker(3, 0, &start(1, 100, 1));
    s.on_marker(4, 2_000, &start(2, 100, 1));
    s.on_marker(5, 2_000, &Marker::End { source: src(1) });
    let summary = s.summary(6, 3_000);
    assert_eq!(summary.commit_offset, 4);
    assert_eq!(summary.in_flight, 1);
    assert_eq!(summary.oldest_age_ms, 1_000);
    assert_eq!(
        summary.oldest,
        Some(src(2)),
        "the delivery holding the commit back"
    );
    s.on_marker(6, 3_000, &Marker::End { source: src(2) });
    assert_eq!(s.summary(7, 3_000).commit_offset, 7);
}

#[test]
fn stale_heap_entries_are_swept() {
    let mut s = PartitionState::new();
    for i in 0..10_000 {
        s.on_marker(2 * i, 0, &start(i, 1_000, 1));
        s.on_marker(2 * i + 1, 0, &Marker::End { source: src(i) });
    }
    assert_eq!(s.in_flight(), 0);
    assert!(
        s.deadlines.len() <= 1024 + 1,
        "heap holds {} stale entries",
        s.deadlines.len()
    );
}

#[test]
fn expired_respects_its_limit_and_deadline_order() {
    let mut s = PartitionState::new();
    for i in 0..5 {
        s.on_marker(i, 0, &start(i, (50 - i * 10) as u32, 1));
    }
    let first = s.expired(100, 2);
    assert_eq!(
        first.iter().map(|e| e.source.offset).collect::<Vec<_>>(),
        vec![4, 3]
    );
    assert_eq!(s.expired(100, 10).len(), 3);
}

#[test]
fn meta_packs_and_saturates() {
    let m = Meta::new(123_456_789, 7, Phase::Nacked);
    assert_eq!(
        (m.start_offset(), m.attempt(), m.phase()),
        (123_456_789, 7, Phase::Nacked)
    );
    let m = m.with(9, Phase::Dispatched);
    assert_eq!(
        (m.start_offset(), m.attempt(), m.phase()),
        (123_456_789, 9, Phase::Dispatched)
    );
    let big = Meta::new(i64::MAX, u32::MAX, Phase::Waiting);
    assert_eq!(
        big.start_offset(),
        MAX_OFFSET,
        "too large an offset commits earlier, never later"
    );
    assert_eq!(big.attempt(), MAX_ATTEMPT);
    assert_eq!(Meta::new(-5, 1, Phase::Free).start_offset(), 0);
}

#[test]
fn freed_slots_are_reused_without_mixing_deliveries() {
    let mut s = PartitionState::new();
    s.on_marker(0, 0, &start(1, 100, 1));
    s.on_marker(1, 10, &Marker::End { source: src(1) });
    // Reuses slot 0 with the same deadline the stale heap entry has.
    s.on_marker(2, 0, &start(2, 100, 3));
    let due = s.expired(100, 10);
    assert_eq!(due.len(), 1, "one delivery, one expiry: {due:?}");
    assert_eq!((due[0].source.offset, due[0].attempt), (2, 3));
    assert_eq!(s.slots.len(), 1);
}

/// A deliberately simple model of the state, to check the real one against.
mod model {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    pub enum Op {
        Start(i64, u32, u32),
        KeepAlive(i64, u32),
        End(i64),
        Nack(i64, u64),
        Reject(i64),
        Advance(i64),
    }

    /// Keys 0..24: few enough that settlements often hit what batches started.
    pub fn op() -> impl Strategy<Value = Op> {
        let key = 0..24i64;
        prop_oneof![
            3 => (key.clone(), 1..300u32, 1..4u32).prop_map(|(k, t, a)| Op::Start(k, t, a)),
            1 => (key.clone(), 1..300u32).prop_map(|(k, t)| Op::KeepAlive(k, t)),
            2 => key.clone().prop_map(Op::End),
            1 => (key.clone(), 0..300u64).prop_map(|(k, d)| Op::Nack(k, d)),
            1 => key.prop_map(Op::Reject),
            2 => (0..200i64).prop_map(Op::Advance),
        ]
    }

    /// A settlement of one of the keys: what a version 2 Settle carries.
    pub fn settlement() -> impl Strategy<Value = Op> {
        let key = 0..24i64;
        prop_oneof![
            1 => (key.clone(), 1..300u32).prop_map(|(k, t)| Op::KeepAlive(k, t)),
            3 => key.clone().prop_map(Op::End),
            1 => (key.clone(), 0..300u64).prop_map(|(k, d)| Op::Nack(k, d)),
            1 => key.prop_map(Op::Reject),
        ]
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum P {
        Waiting,
        Nacked,
        Rejected,
        Dispatched,
    }

    #[derive(Default)]
    pub struct Model {
        m: BTreeMap<i64, (i64, P, i64, u32)>, // key -> (deadline, phase, start offset, attempt)
    }

    impl Model {
        pub fn apply(&mut self, offset: i64, ts: i64, op: &Op) {
            match *op {
                Op::Start(k, t, a) => match self.m.get_mut(&k) {
                    Some(e) if e.1 == P::Dispatched => {}
                    Some(e) => *e = (ts + i64::from(t), P::Waiting, e.2, e.3.max(a)),
                    None => {
                        self.m.insert(k, (ts + i64::from(t), P::Waiting, offset, a));
                    }
                },
                Op::KeepAlive(k, t) => {
                    if let Some(e) = self.m.get_mut(&k).filter(|e| e.1 == P::Waiting) {
                        e.0 = ts + i64::from(t);
                    }
                }
                Op::End(k) => {
                    self.m.remove(&k);
                }
                Op::Nack(k, d) => {
                    if let Some(e) = self.m.get_mut(&k).filter(|e| e.1 != P::Dispatched) {
                        *e = (ts + d as i64, P::Nacked, e.2, e.3);
                    }
                }
                Op::Reject(k) => {
                    if let Some(e) = self.m.get_mut(&k).filter(|e| e.1 != P::Dispatched) {
                        *e = (ts, P::Rejected, e.2, e.3);
                    }
                }
                Op::Advance(_) => {}
            }
        }

        /// Due deliveries as sorted (key, attempt, cause) triples.
        pub fn expire(&mut self, now: i64) -> Vec<(i64, u32, Cause)> {
            let mut out = Vec::new();
            for (k, e) in self.m.iter_mut() {
                if e.1 != P::Dispatched && e.0 <= now {
                    let cause = match e.1 {
                        P::Nacked => Cause::Nacked,
                        P::Rejected => Cause::Rejected("r".into()),
                        _ => Cause::Timeout,
                    };
                    out.push((*k, e.3, cause));
                    e.1 = P::Dispatched;
                }
            }
            out
        }

        /// The tracker holds a delivery it just took: waiting again until `until`.
        pub fn hold(&mut self, k: i64, until: i64) {
            if let Some(e) = self.m.get_mut(&k).filter(|e| e.1 == P::Dispatched) {
                e.0 = until;
                e.1 = P::Waiting;
            }
        }

        pub fn commit(&self, next: i64) -> i64 {
            self.m.values().map(|e| e.2).min().unwrap_or(next)
        }

        pub fn len(&self) -> usize {
            self.m.len()
        }
    }

    pub fn marker(op: &Op) -> Option<Marker> {
        Some(match *op {
            Op::Start(k, t, a) => Marker::Start {
                source: src(k),
                timeout_ms: t,
                attempt: a,
            },
            Op::KeepAlive(k, t) => Marker::KeepAlive {
                source: src(k),
                timeout_ms: t,
            },
            Op::End(k) => Marker::End { source: src(k) },
            Op::Nack(k, d) => Marker::Nack {
                source: src(k),
                delay_ms: d,
            },
            Op::Reject(k) => Marker::Reject {
                source: src(k),
                reason: "r".into(),
            },
            Op::Advance(_) => return None,
        })
    }
}

/// One marker of a generated sequence: a version 1 marker, or a version 2 marker standing for
/// several of them (the model applies those one by one, in the documented order).
#[derive(Debug, Clone)]
enum Step {
    One(model::Op),
    Starts(Vec<model::Op>),
    /// A batch Start of keys `first..first + len` but those whose bit is set in the mask,
    /// all with the batch's timeout (100) and attempt 1: what a poll batch looks like, and what
    /// the state keeps as a group.
    Run(i64, i64, u32),
    Settle(Vec<model::Op>),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    let starts = proptest::collection::vec(
        (0..6i64, 1..300u32, 1..4u32).prop_map(|(k, t, a)| model::Op::Start(k, t, a)),
        1..5,
    );
    let settles = proptest::collection::vec(model::settlement(), 1..12);
    let run = (0..24i64, 1..20i64, any::<u32>()).prop_map(|(f, n, mask)| Step::Run(f, n, mask));
    prop_oneof![
        4 => model::op().prop_map(Step::One),
        1 => starts.prop_map(Step::Starts),
        2 => run,
        2 => settles.prop_map(Step::Settle),
    ]
}

/// A batch Start of no record yet, with the batch timeout 100 the model's batches use.
fn empty_batch() -> crate::marker::StartBatch {
    crate::marker::StartBatch {
        topic: "orders".into(),
        partition: 0,
        timeout_ms: 100,
        offsets: crate::marker::Offsets::new(),
        attempts: vec![],
        timeouts: vec![],
    }
}

/// Keeps the last op per key of each kind, ascending by key: what a writer's list holds.
fn last_per_key(ops: &[model::Op], kind: fn(&model::Op) -> Option<i64>) -> Vec<model::Op> {
    let mut by_key = std::collections::BTreeMap::new();
    for op in ops {
        if let Some(k) = kind(op) {
            by_key.insert(k, op.clone());
        }
    }
    by_key.into_values().collect()
}

impl Step {
    /// The ops in the order the tracker applies them, and the marker (through the wire).
    fn ops_and_marker(&self) -> (Vec<model::Op>, Option<Marker>) {
        use model::Op;
        let marker = match self {
            Step::One(op) => return (vec![op.clone()], model::marker(op)),
            Step::Starts(ops) => {
                let ops = last_per_key(ops, |op| match op {
                    Op::Start(k, ..) => Some(*k),
                    _ => None,
                });
                let mut b = empty_batch();
                for op in &ops {
                    if let Op::Start(k, t, a) = *op {
                        b.offsets.push(k);
                        b.timeouts.push((k, t));
                        if a != 1 {
                            b.attempts.push((k, a));
                        }
                    }
                }
                (ops, Marker::StartBatch(Box::new(b)))
            }
            Step::Run(first, len, mask) => {
                let mut b = empty_batch();
                let keys = (*first..first + len).filter(|k| mask & (1 << (k - first)) == 0);
                let ops: Vec<Op> = keys.map(|k| Op::Start(k, 100, 1)).collect();
                for op in &ops {
                    if let Op::Start(k, ..) = op {
                        b.offsets.push(*k);
                    }
                }
                (ops, Marker::StartBatch(Box::new(b)))
            }
            Step::Settle(ops) => {
                let keep = last_per_key(ops, |op| match op {
                    Op::KeepAlive(k, _) => Some(*k),
                    _ => None,
                });
                let nacks = last_per_key(ops, |op| match op {
                    Op::Nack(k, _) => Some(*k),
                    _ => None,
                });
                let rejects = last_per_key(ops, |op| match op {
                    Op::Reject(k) => Some(*k),
                    _ => None,
                });
                let ends = last_per_key(ops, |op| match op {
                    Op::End(k) => Some(*k),
                    _ => None,
                });
                let mut settle = crate::marker::Settle::new("orders", 0);
                for op in keep.iter().chain(&nacks).chain(&rejects).chain(&ends) {
                    match *op {
                        Op::KeepAlive(k, t) => settle.keep_alives.push((k, t)),
                        Op::Nack(k, d) => settle.nacks.push((k, d)),
                        Op::Reject(k) => settle.rejects.push((k, "r".into())),
                        Op::End(k) => {
                            settle.ends.push(k);
                        }
                        _ => {}
                    }
                }
                let ordered = keep.into_iter().chain(nacks).chain(rejects).chain(ends);
                (ordered.collect(), Marker::Settle(Box::new(settle)))
            }
        };
        let (ops, marker) = marker;
        let wire = crate::marker::decode(&crate::marker::encode(&marker)).ok();
        (ops, wire)
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]
    /// The state against the model, fed version 1 and version 2 markers mixed: a version 2
    /// marker must do exactly what the version 1 markers it stands for would. Records are
    /// listed for reading ahead now and then, which must change nothing, and some due ones
    /// are held (made due again later), as `--source-group` does.
    #[test]
    fn behaves_like_the_model(steps in proptest::collection::vec(step(), 1..200)) {
        let mut real = PartitionState::new();
        let mut m = model::Model::default();
        let mut now = 0i64;
        for (offset, step) in steps.iter().enumerate() {
            let offset = offset as i64;
            if let Step::One(model::Op::Advance(dt)) = step {
                now += dt;
            }
            let (ops, marker) = step.ops_and_marker();
            if let Some(marker) = marker {
                match step {
                    Step::One(_) => {
                        real.on_marker(offset, now, &marker);
                    }
                    _ => real.on_batch(offset, now, &marker, |_, _| {}),
                }
                for op in &ops {
                    m.apply(offset, now, op);
                }
            }
            // Listing records for reading ahead, over windows of 0 to 150 ms, must never
            // change what falls due, or when.
            if offset % 2 == 0 {
                real.read_ahead(now + (offset * 37) % 151, usize::MAX);
            }
            let mut got: Vec<_> = real
                .expired(now, usize::MAX)
                .into_iter()
                .map(|e| (e.source.offset, e.attempt, e.cause))
                .collect();
            got.sort_by_key(|g| g.0);
            proptest::prop_assert_eq!(&got, &m.expire(now));
            // Now and then the tracker holds some of what fell due (`--source-group`): each
            // is waiting again, until a later deadline, in both.
            if offset % 3 == 0 {
                let until = now + 1 + offset % 50;
                for (k, _, _) in got.iter().filter(|g| g.0 % 2 == 1) {
                    proptest::prop_assert!(real.hold(&src(*k), until));
                    m.hold(*k, until);
                }
            }
            proptest::prop_assert_eq!(real.in_flight(), m.len());
            let next = offset + 1;
            proptest::prop_assert_eq!(real.summary(next, now).commit_offset, m.commit(next));
            if let Some(d) = real.next_deadline() {
                proptest::prop_assert!(d > now, "a due delivery was left behind");
            }
        }
    }
}

#[test]
fn next_deadlines_lists_the_soonest_distinct_live_ones() {
    let mut s = PartitionState::new();
    for (i, t) in [(1, 500u32), (2, 100), (3, 300), (4, 100), (5, 200), (6, 50)] {
        s.on_marker(i, 0, &start(i, t, 1));
    }
    s.on_marker(7, 0, &Marker::End { source: src(6) });
    assert_eq!(s.next_deadlines(3), vec![100, 200, 300]);
    assert_eq!(s.next_deadlines(10), vec![100, 200, 300, 500]);
    assert!(PartitionState::new().next_deadlines(3).is_empty());
}

fn schedule(not_before_ms: i64, delay_ms: u64) -> Marker {
    Marker::Schedule {
        not_before_ms,
        delay_ms,
        record: Box::new(crate::marker::ScheduledRecord {
            topic: "orders".into(),
            partition: None,
            key: None,
            payload: Some(b"later".to_vec()),
            headers: vec![],
        }),
    }
}

#[test]
fn a_schedule_is_due_at_the_later_of_its_time_and_delay_and_named_by_its_marker() {
    let mut s = PartitionState::at("orders.markers", 3);
    assert_eq!(
        s.on_marker(40, 1_000, &schedule(0, 500)),
        Applied::Scheduled
    );
    assert_eq!(
        s.on_marker(41, 1_000, &schedule(9_000, 500)),
        Applied::Scheduled
    );
    assert_eq!(
        s.on_marker(42, 1_000, &schedule(200, 0)),
        Applied::Scheduled
    );
    let summary = s.summary(43, 1_000);
    assert_eq!((summary.scheduled, summary.in_flight), (3, 0));
    assert_eq!(
        summary.commit_offset, 40,
        "the commit stays behind a schedule"
    );
    let due = s.expired(1_500, 10);
    let ids: Vec<(String, i64, i64)> = due
        .iter()
        .map(|e| (e.source.to_string(), e.deadline_ms, i64::from(e.attempt)))
        .collect();
    assert_eq!(
        ids,
        vec![
            ("orders.markers/3@42".to_string(), 1_000, 0),
            ("orders.markers/3@40".to_string(), 1_500, 0)
        ]
    );
    assert!(due.iter().all(|e| e.cause == Cause::Scheduled));
    assert_eq!(s.next_deadline(), Some(9_000));
    let summary = s.summary(43, 1_500);
    assert_eq!(
        (summary.scheduled, summary.in_flight),
        (1, 2),
        "dispatched schedules count as in flight until their End"
    );
    let end = |offset| Marker::End {
        source: SourceRef::new("orders.markers", 3, offset),
    };
    assert_eq!(s.on_marker(50, 1_600, &end(40)), Applied::Ended);
    assert_eq!(s.on_marker(51, 1_600, &end(41)), Applied::Cancelled);
    assert!(s
        .expired(i64::MAX, 10)
        .iter()
        .all(|e| e.source.offset != 41));
    assert_eq!(
        s.on_marker(52, 1_600, &end(41)),
        Applied::Odd(Oddity::EndWithoutStart)
    );
}

#[test]
fn settling_markers_cannot_touch_a_pending_schedule() {
    let mut s = PartitionState::at("m", 0);
    s.on_marker(7, 0, &schedule(0, 1_000));
    let id = SourceRef::new("m", 0, 7);
    let nack = Marker::Nack {
        source: id.clone(),
        delay_ms: 0,
    };
    assert_eq!(
        s.on_marker(8, 0, &nack),
        Applied::Odd(Oddity::SettleWithoutStart)
    );
    let start = Marker::Start {
        source: id,
        timeout_ms: 1,
        attempt: 1,
    };
    assert_eq!(
        s.on_marker(9, 0, &start),
        Applied::Odd(Oddity::SettleWithoutStart)
    );
    assert!(s.expired(999, 10).is_empty(), "still due at its own time");
    assert_eq!(s.expired(1_000, 10).len(), 1);
}

#[test]
fn a_pending_schedule_holds_the_commit_but_is_not_an_old_delivery() {
    let mut s = PartitionState::at("m", 0);
    s.on_marker(10, 0, &schedule(0, 7 * 24 * 3600 * 1000));
    s.on_marker(11, 50_000, &start(1, 60_000, 1));
    let summary = s.summary(12, 60_000);
    assert_eq!(summary.commit_offset, 10);
    assert_eq!(
        summary.oldest_age_ms, 10_000,
        "the delivery's age, not the schedule's"
    );
    s.on_marker(12, 61_000, &Marker::End { source: src(1) });
    assert_eq!(s.summary(13, 61_000).oldest_age_ms, 0);
}

fn batch_start(offsets: std::ops::Range<i64>, timeout_ms: u32) -> Marker {
    let mut b = crate::marker::StartBatch {
        topic: "orders".into(),
        partition: 0,
        timeout_ms,
        offsets: crate::marker::Offsets::new(),
        attempts: vec![],
        timeouts: vec![],
    };
    for o in offsets {
        b.offsets.push(o);
    }
    Marker::StartBatch(Box::new(b))
}

#[test]
fn a_grouped_batch_expires_in_steps_of_the_limit_and_holds_the_commit_until_its_ends() {
    let mut s = PartitionState::new();
    s.on_marker(7, 1_000, &batch_start(0..1_000, 500));
    assert_eq!(s.in_flight(), 1_000);
    assert_eq!(s.next_deadline(), Some(1_500));
    assert!(s.expired(1_499, usize::MAX).is_empty());
    let mut seen = Vec::new();
    for _ in 0..4 {
        let due = s.expired(1_500, 300);
        assert!(due
            .iter()
            .all(|e| e.attempt == 1 && e.cause == Cause::Timeout));
        seen.extend(due.into_iter().map(|e| e.source.offset));
    }
    assert_eq!(seen, (0..1_000).collect::<Vec<_>>(), "each once, in order");
    assert!(s.expired(10_000, usize::MAX).is_empty());
    assert_eq!(s.next_deadline(), None);
    // Dispatched, not forgotten: the commit stays at the batch Start until the Ends come back.
    assert_eq!(s.summary(8, 2_000).commit_offset, 7);
    let mut ends = crate::marker::Settle::new("orders", 0);
    for o in 0..1_000 {
        ends.ends.push(o);
    }
    s.on_marker(8, 2_000, &Marker::Settle(Box::new(ends)));
    assert_eq!(s.in_flight(), 0);
    assert_eq!(s.summary(9, 2_000).commit_offset, 9);
}

#[test]
fn a_record_treated_apart_from_its_batch_goes_on_alone() {
    let mut s = PartitionState::new();
    s.on_marker(0, 0, &batch_start(0..10, 100));
    let mut settle = crate::marker::Settle::new("orders", 0);
    settle.keep_alives.push((1, 1_000));
    settle.nacks.push((2, 50));
    settle.rejects.push((3, "bad".into()));
    settle.ends.push(4);
    s.on_marker(1, 10, &Marker::Settle(Box::new(settle)));
    assert_eq!(s.in_flight(), 9);
    let due = |s: &mut PartitionState, now| {
        let mut d: Vec<_> = s
            .expired(now, usize::MAX)
            .into_iter()
            .map(|e| (e.source.offset, e.cause))
            .collect();
        d.sort_by_key(|e| e.0);
        d
    };
    assert_eq!(due(&mut s, 10), vec![(3, Cause::Rejected("bad".into()))]);
    assert_eq!(due(&mut s, 60), vec![(2, Cause::Nacked)]);
    let rest: Vec<_> = [0, 5, 6, 7, 8, 9].map(|o| (o, Cause::Timeout)).into();
    assert_eq!(due(&mut s, 100), rest);
    assert_eq!(due(&mut s, 1_010), vec![(1, Cause::Timeout)]);
    // A Start for a record already being redelivered changes nothing.
    assert_eq!(
        s.on_marker(2, 1_020, &start(5, 100, 1)),
        Applied::Odd(Oddity::LateForRedelivery)
    );
    assert_eq!(s.summary(3, 1_020).commit_offset, 0);
}

#[test]
fn a_batch_started_again_refreshes_its_records_one_by_one() {
    let mut s = PartitionState::new();
    s.on_marker(0, 0, &batch_start(0..8, 100));
    let mut outcomes = Vec::new();
    s.on_batch(1, 50, &batch_start(0..8, 100), |a, o| outcomes.push((o, a)));
    assert!(outcomes.iter().all(|(_, a)| *a == Applied::Restarted));
    assert!(
        s.expired(100, usize::MAX).is_empty(),
        "deadlines moved to 150"
    );
    assert_eq!(s.expired(150, usize::MAX).len(), 8);
    assert_eq!(
        s.summary(2, 150).commit_offset,
        0,
        "the first Start still holds"
    );
}

#[test]
fn a_held_delivery_falls_due_again_and_a_new_start_takes_it_over() {
    let mut s = PartitionState::new();
    s.on_marker(0, 0, &start(1, 100, 1));
    s.on_marker(1, 0, &batch_start(10..13, 100));
    let due: Vec<i64> = s
        .expired(100, 10)
        .into_iter()
        .map(|e| e.source.offset)
        .collect();
    assert_eq!(due, vec![1, 10, 11, 12]);
    // Held: a slot's delivery and one record of a batch Start.
    assert!(s.hold(&src(1), 1_100));
    assert!(s.hold(&src(11), 1_100));
    assert!(!s.hold(&src(11), 1_200), "only what was just taken");
    assert!(!s.hold(&src(99), 1_100), "nothing to hold");
    assert_eq!(s.next_deadline(), Some(1_100));
    assert!(
        s.read_ahead(2_000, 10).is_empty(),
        "a held record is not read ahead again"
    );
    assert!(s.expired(1_099, 10).is_empty());
    // The next owner re-reads record 1: its Start refreshes the held delivery (a dispatched
    // one would have called it late) and its End ends it.
    assert_eq!(s.on_marker(2, 600, &start(1, 100, 1)), Applied::Restarted);
    assert_eq!(
        s.on_marker(3, 650, &Marker::End { source: src(1) }),
        Applied::Ended
    );
    // Record 11 nobody took over: due again, with its attempt.
    let again = s.expired(1_100, 10);
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].source.offset, again[0].attempt), (11, 1));
    assert_eq!(again[0].cause, Cause::Timeout);
    assert_eq!(s.in_flight(), 3, "10 and 12 (dispatched) and 11");
}

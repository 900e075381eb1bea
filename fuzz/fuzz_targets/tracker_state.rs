//! The tracker state fed whatever the decoder makes of arbitrary bytes (versions 1 and 2), with
//! time moving forward and some due deliveries held instead of handed out: it must never panic,
//! never hand out a delivery twice for the same attempt, and never commit past a Start still in
//! flight.
#![no_main]

use kafka_redelivery::marker::{decode, Marker, SourceRef};
use kafka_redelivery::tracker::state::PartitionState;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut state = PartitionState::new();
    let mut now = 0i64;
    // Deliveries handed out for redelivery and not yet ended: none may be handed out again.
    let mut dispatched = std::collections::HashSet::new();
    // Each chunk: 1 byte of time step, 1 byte of length, then a marker.
    let mut rest = data;
    let mut offset = 0i64;
    while rest.len() >= 2 {
        now += i64::from(rest[0]) * 10;
        let len = usize::from(rest[1]).min(rest.len() - 2);
        let bytes = &rest[2..2 + len];
        rest = &rest[2 + len..];
        if let Ok(marker) = decode(bytes) {
            state.on_marker(offset, now, &marker);
            match &marker {
                Marker::End { source } => {
                    dispatched.remove(source);
                }
                // Version 2: the same rule for each End a Settle carries.
                Marker::Settle(s) => {
                    for o in s.ends.iter() {
                        dispatched.remove(&SourceRef::new(s.topic.clone(), s.partition, o));
                    }
                }
                _ => {}
            }
        }
        // An odd time step: the tracker holds what fell due (`--source-group`), so it was not
        // handed out, and falls due again later.
        let hold = rest.first().is_some_and(|b| b % 2 == 1);
        for e in state.expired(now, usize::MAX) {
            if hold {
                assert!(state.hold(&e.source, now + 10), "a just-taken delivery is held: {e:?}");
                continue;
            }
            assert!(dispatched.insert(e.source.clone()), "handed out twice without an End: {e:?}");
        }
        let summary = state.summary(offset + 1, now);
        assert!(summary.commit_offset <= offset + 1);
        if let Some(d) = state.next_deadline() {
            assert!(d > now, "a due delivery was left behind");
        }
        offset += 1;
    }
});

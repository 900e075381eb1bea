use super::*;
use proptest::prelude::*;

const SPEC: &str = include_str!("../../docs/markers.md");

fn orders() -> SourceRef {
    SourceRef::new("orders", 3, 42)
}

/// The hex column of the row whose first cell is `name`, from docs/markers.md.
fn vector(name: &str) -> Vec<u8> {
    let prefix = format!("| {name} |");
    let row = SPEC
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("docs/markers.md has no vector `{name}`"));
    let hex = row
        .split('`')
        .rfind(|cell| cell.len() >= 5 && cell.chars().all(|c| c.is_ascii_hexdigit() || c == ' '))
        .unwrap_or_else(|| panic!("vector `{name}` has no hex bytes"));
    hex.split(' ')
        .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
        .collect()
}

#[test]
fn documented_vectors() {
    let cases = [
        (
            "start",
            Marker::Start {
                source: orders(),
                timeout_ms: 30_000,
                attempt: 1,
            },
        ),
        (
            "keepalive",
            Marker::KeepAlive {
                source: orders(),
                timeout_ms: 60_000,
            },
        ),
        ("end", Marker::End { source: orders() }),
        (
            "nack",
            Marker::Nack {
                source: orders(),
                delay_ms: 5_000,
            },
        ),
        (
            "reject",
            Marker::Reject {
                source: orders(),
                reason: "bad".into(),
            },
        ),
        (
            "tick",
            Marker::Tick {
                nonce: 0x0102_0304_0506_0708,
            },
        ),
        (
            "schedule-at",
            Marker::Schedule {
                not_before_ms: 1_767_225_600_000,
                delay_ms: 0,
                record: Box::new(ScheduledRecord {
                    topic: "orders".into(),
                    partition: Some(3),
                    key: Some(b"k".to_vec()),
                    payload: Some(b"hi".to_vec()),
                    headers: vec![("h".into(), Some(b"v".to_vec()))],
                }),
            },
        ),
        (
            "schedule-after",
            Marker::Schedule {
                not_before_ms: 0,
                delay_ms: 5_000,
                record: Box::new(ScheduledRecord {
                    topic: "orders".into(),
                    partition: None,
                    key: None,
                    payload: None,
                    headers: vec![],
                }),
            },
        ),
    ];
    for (name, marker) in cases.into_iter().chain(documented_v2()) {
        assert_eq!(encode(&marker), vector(name), "encoding of `{name}`");
        assert_eq!(decode(&vector(name)), Ok(marker), "decoding of `{name}`");
    }
}

fn documented_v2() -> [(&'static str, Marker); 2] {
    [
        (
            "start-batch",
            Marker::StartBatch(Box::new(StartBatch {
                topic: "orders".into(),
                partition: 3,
                timeout_ms: 30_000,
                offsets: Offsets::collect([42, 43, 44, 50]),
                attempts: vec![(50, 2)],
                timeouts: vec![(43, 60_000)],
            })),
        ),
        (
            "settle",
            Marker::Settle(Box::new(Settle {
                topic: "orders".into(),
                partition: 3,
                keep_alives: vec![(45, 60_000)],
                nacks: vec![(46, 5_000)],
                rejects: vec![(47, "bad".into())],
                ends: Offsets::collect([42, 43, 44]),
            })),
        ),
    ]
}

#[test]
fn documented_rejections() {
    for (name, kind) in [
        ("bad-version", "unknown_version"),
        ("bad-type", "unknown_type"),
        ("cut-start", "truncated"),
        ("zero-attempt", "invalid_value"),
        ("trailing", "trailing_bytes"),
        ("bad-target-partition", "invalid_value"),
        ("v2-bad-type", "unknown_type"),
        ("v2-cut-start", "truncated"),
        ("v2-start-without-offsets", "invalid_value"),
        ("v2-exception-outside-batch", "invalid_value"),
        ("v2-attempt-one", "invalid_value"),
        ("v2-runs-touch", "invalid_value"),
        ("v2-long-varint", "invalid_value"),
        ("v2-too-many-records", "invalid_value"),
        ("v2-empty-settle", "invalid_value"),
        ("v2-trailing", "trailing_bytes"),
    ] {
        let err = decode(&vector(name)).expect_err(name);
        assert_eq!(err.kind(), kind, "vector `{name}`: {err}");
        assert!(DecodeError::KINDS.contains(&kind), "KINDS lacks {kind}");
    }
    assert_eq!(decode(&[]), Err(DecodeError::Empty));
}

#[test]
fn invalid_utf8_topic_is_reported() {
    let bytes = [1, 3, 0, 2, 0xff, 0xfe, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(decode(&bytes), Err(DecodeError::InvalidUtf8("topic")));
}

#[test]
fn long_reasons_are_cut_on_a_char_boundary() {
    let reason = "é".repeat(MAX_REASON_BYTES); // 2 bytes each
    let m = Marker::Reject {
        source: orders(),
        reason,
    };
    match decode(&encode(&m)) {
        Ok(Marker::Reject { reason, .. }) => {
            assert_eq!(reason.len(), MAX_REASON_BYTES);
            assert!(reason.chars().all(|c| c == 'é'));
        }
        other => panic!("unexpected {other:?}"),
    }
}

fn source_strategy() -> impl Strategy<Value = SourceRef> {
    ("[a-zA-Z0-9._-]{1,249}", 0..i32::MAX, 0..i64::MAX)
        .prop_map(|(topic, partition, offset)| SourceRef::new(topic, partition, offset))
}

fn bytes_strategy() -> impl Strategy<Value = Option<Vec<u8>>> {
    proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64))
}

fn record_strategy() -> impl Strategy<Value = ScheduledRecord> {
    (
        "[a-zA-Z0-9._-]{1,249}",
        proptest::option::of(0..i32::MAX),
        bytes_strategy(),
        bytes_strategy(),
        proptest::collection::vec((".{0,20}", bytes_strategy()), 0..4),
    )
        .prop_map(
            |(topic, partition, key, payload, headers)| ScheduledRecord {
                topic,
                partition,
                key,
                payload,
                headers: headers.into_iter().map(|(k, v)| (k.into(), v)).collect(),
            },
        )
}

fn offsets_strategy(min: usize) -> impl Strategy<Value = Offsets> {
    (
        0..i64::MAX / 2,
        proptest::collection::vec((0u64..1_000, 1u64..50), min..6),
    )
        .prop_map(|(base, gaps)| {
            let mut set = Offsets::new();
            let mut at = base;
            for (gap, len) in gaps {
                at += gap as i64 + 1;
                for i in 0..len as i64 {
                    set.push(at + i);
                }
                at += len as i64;
            }
            set
        })
}

/// Values for a subset of `offsets`, ascending: what exception and settlement lists hold.
fn per_offset<T: std::fmt::Debug + Clone>(
    offsets: Offsets,
    value: impl Strategy<Value = T>,
) -> impl Strategy<Value = Vec<(i64, T)>> {
    let all: Vec<i64> = offsets.iter().collect();
    let n = all.len();
    proptest::collection::vec((any::<bool>(), value), n).prop_map(move |picks| {
        all.iter()
            .zip(picks)
            .filter(|(_, (keep, _))| *keep)
            .map(|(o, (_, v))| (*o, v))
            .collect()
    })
}

fn start_batch_strategy() -> impl Strategy<Value = Marker> {
    (
        "[a-zA-Z0-9._-]{1,249}",
        0..i32::MAX,
        any::<u32>(),
        offsets_strategy(1),
    )
        .prop_flat_map(|(topic, partition, timeout_ms, offsets)| {
            (
                per_offset(offsets.clone(), 2..=8191u32),
                per_offset(offsets.clone(), any::<u32>()),
            )
                .prop_map(move |(attempts, timeouts)| {
                    Marker::StartBatch(Box::new(StartBatch {
                        topic: topic.clone(),
                        partition,
                        timeout_ms,
                        offsets: offsets.clone(),
                        attempts,
                        timeouts,
                    }))
                })
        })
}

fn settle_strategy() -> impl Strategy<Value = Marker> {
    (
        "[a-zA-Z0-9._-]{1,249}",
        0..i32::MAX,
        offsets_strategy(0),
        offsets_strategy(1),
    )
        .prop_flat_map(|(topic, partition, others, ends)| {
            (
                per_offset(others.clone(), any::<u32>()),
                per_offset(others.clone(), any::<u64>()),
                per_offset(others, ".{0,20}"),
            )
                .prop_map(move |(keep_alives, nacks, rejects)| {
                    Marker::Settle(Box::new(Settle {
                        topic: topic.clone(),
                        partition,
                        keep_alives,
                        nacks,
                        rejects,
                        ends: ends.clone(),
                    }))
                })
        })
}

fn marker_strategy() -> impl Strategy<Value = Marker> {
    prop_oneof![
        start_batch_strategy(),
        settle_strategy(),
        (source_strategy(), any::<u32>(), 1..u32::MAX).prop_map(|(source, timeout_ms, attempt)| {
            Marker::Start {
                source,
                timeout_ms,
                attempt,
            }
        }),
        (source_strategy(), any::<u32>())
            .prop_map(|(source, timeout_ms)| Marker::KeepAlive { source, timeout_ms }),
        source_strategy().prop_map(|source| Marker::End { source }),
        (source_strategy(), any::<u64>())
            .prop_map(|(source, delay_ms)| Marker::Nack { source, delay_ms }),
        (source_strategy(), ".{0,200}")
            .prop_map(|(source, reason)| Marker::Reject { source, reason }),
        any::<u64>().prop_map(|nonce| Marker::Tick { nonce }),
        (0..i64::MAX, any::<u64>(), record_strategy()).prop_map(
            |(not_before_ms, delay_ms, record)| Marker::Schedule {
                not_before_ms,
                delay_ms,
                record: Box::new(record),
            }
        ),
    ]
}

proptest! {
    #[test]
    fn round_trip(marker in marker_strategy()) {
        prop_assert_eq!(decode(&encode(&marker)), Ok(marker));
    }

    #[test]
    fn varints_round_trip_in_their_shortest_form(value in any::<u64>()) {
        let mut out = Vec::new();
        encode::put_varint(&mut out, value);
        prop_assert_eq!(out.len(), (64 - value.leading_zeros() as usize).div_ceil(7).max(1));
        prop_assert_eq!(Reader::new(&out).varint("v"), Ok(value));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn corrupting_a_valid_marker_never_panics(
        marker in marker_strategy(),
        index in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = encode(&marker);
        let i = index.index(bytes.len());
        bytes[i] = byte;
        let _ = decode(&bytes);
        bytes.truncate(cut.index(bytes.len() + 1));
        let _ = decode(&bytes);
    }
}

/// `docs/marker-vectors.json`, the machine-readable vectors other clients test against, says
/// exactly what docs/markers.md says, and the Rust codec agrees with both.
#[test]
fn json_vectors_match_the_spec() {
    let json: serde_json::Value =
        serde_json::from_str(include_str!("../../docs/marker-vectors.json")).unwrap();
    let hex = |v: &serde_json::Value| -> Vec<u8> {
        v.as_str()
            .unwrap()
            .split(' ')
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect()
    };
    let mut named = std::collections::BTreeSet::new();
    for v in json["markers"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        named.insert(name.to_string());
        let bytes = hex(&v["hex"]);
        assert_eq!(
            bytes,
            vector(name),
            "`{name}`: the JSON and docs/markers.md differ"
        );
        let marker = marker_from_json(&v["marker"]);
        assert_eq!(encode(&marker), bytes, "encoding of `{name}`");
        assert_eq!(decode(&bytes), Ok(marker), "decoding of `{name}`");
    }
    for v in json["rejections"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        named.insert(name.to_string());
        let bytes = hex(&v["hex"]);
        assert_eq!(
            bytes,
            vector(name),
            "`{name}`: the JSON and docs/markers.md differ"
        );
        let kind = decode(&bytes).expect_err(name).kind();
        assert_eq!(kind, v["kind"].as_str().unwrap(), "`{name}`");
    }
    // Every vector of the spec is in the JSON: a row whose last code cell is hex bytes.
    for line in SPEC.lines().filter(|l| l.starts_with("| ")) {
        let is_vector = line
            .split('`')
            .any(|cell| cell.len() >= 5 && cell.chars().all(|c| c.is_ascii_hexdigit() || c == ' '));
        let name = line.split('|').nth(1).unwrap_or("").trim();
        if is_vector {
            assert!(
                named.contains(name),
                "docs/markers.md vector `{name}` is not in the JSON"
            );
        }
    }
    for p in json["partitions"].as_array().unwrap() {
        let got = markers_partition(
            p["topic"].as_str().unwrap(),
            p["partition"].as_i64().unwrap() as i32,
            p["partitions"].as_i64().unwrap() as i32,
        );
        assert_eq!(
            i64::from(got),
            p["markers_partition"].as_i64().unwrap(),
            "{p}"
        );
    }
}

/// A marker described the way docs/marker-vectors.json describes it.
fn marker_from_json(m: &serde_json::Value) -> Marker {
    let s = |k: &str| m[k].as_str().unwrap().to_string();
    let i = |k: &str| m[k].as_i64().unwrap();
    let u = |k: &str| m[k].as_u64().unwrap();
    let source = || SourceRef::new(s("topic"), i("partition") as i32, i("offset"));
    let pairs = |k: &str| -> Vec<(i64, u64)> {
        m[k].as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_i64().unwrap(), p[1].as_u64().unwrap()))
            .collect()
    };
    let offsets =
        |k: &str| Offsets::collect(m[k].as_array().unwrap().iter().map(|o| o.as_i64().unwrap()));
    let bytes = |v: &serde_json::Value| {
        v.as_str().map(|h| {
            (0..h.len())
                .step_by(2)
                .map(|j| u8::from_str_radix(&h[j..j + 2], 16).unwrap())
                .collect::<Vec<u8>>()
        })
    };
    match m["type"].as_str().unwrap() {
        "start" => Marker::Start {
            source: source(),
            timeout_ms: u("timeout_ms") as u32,
            attempt: u("attempt") as u32,
        },
        "keep_alive" => Marker::KeepAlive {
            source: source(),
            timeout_ms: u("timeout_ms") as u32,
        },
        "end" => Marker::End { source: source() },
        "nack" => Marker::Nack {
            source: source(),
            delay_ms: u("delay_ms"),
        },
        "reject" => Marker::Reject {
            source: source(),
            reason: s("reason"),
        },
        "tick" => Marker::Tick { nonce: u("nonce") },
        "schedule" => {
            let r = &m["record"];
            Marker::Schedule {
                not_before_ms: i("not_before_ms"),
                delay_ms: u("delay_ms"),
                record: Box::new(ScheduledRecord {
                    topic: r["topic"].as_str().unwrap().to_string(),
                    partition: r["partition"].as_i64().map(|p| p as i32),
                    key: bytes(&r["key"]),
                    payload: bytes(&r["value"]),
                    headers: r["headers"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|h| (h[0].as_str().unwrap().into(), bytes(&h[1])))
                        .collect(),
                }),
            }
        }
        "start_batch" => Marker::StartBatch(Box::new(StartBatch {
            topic: s("topic"),
            partition: i("partition") as i32,
            timeout_ms: u("timeout_ms") as u32,
            offsets: offsets("offsets"),
            attempts: pairs("attempts")
                .into_iter()
                .map(|(o, a)| (o, a as u32))
                .collect(),
            timeouts: pairs("timeouts")
                .into_iter()
                .map(|(o, t)| (o, t as u32))
                .collect(),
        })),
        "settle" => Marker::Settle(Box::new(Settle {
            topic: s("topic"),
            partition: i("partition") as i32,
            keep_alives: pairs("keep_alives")
                .into_iter()
                .map(|(o, t)| (o, t as u32))
                .collect(),
            nacks: pairs("nacks"),
            rejects: m["rejects"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r[0].as_i64().unwrap(), r[1].as_str().unwrap().to_string()))
                .collect(),
            ends: offsets("ends"),
        })),
        other => panic!("unknown marker type {other} in the JSON vectors"),
    }
}

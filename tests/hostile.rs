//! Bad input on the markers topic, and source records that are gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use kafka_redelivery::headers;
use kafka_redelivery::marker::{encode, Marker, SourceRef};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::FutureRecord;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Writes a raw value (or a tombstone) to markers partition 0.
async fn raw(markers: &str, value: Option<&[u8]>) {
    let mut r = FutureRecord::<(), [u8]>::to(markers).partition(0);
    if let Some(v) = value {
        r = r.payload(v);
    }
    producer()
        .send(r, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_unknown_versions_and_tombstones_are_skipped_and_counted() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    tracker.wait_ready().await;
    raw(&t.markers, Some(b"")).await;
    raw(&t.markers, None).await;
    raw(&t.markers, Some(&[0xde, 0xad, 0xbe, 0xef])).await; // version 0xde
    raw(&t.markers, Some(&[9, 1, 0, 0])).await;
    raw(&t.markers, Some(&[1, 0x7f])).await;
    raw(&t.markers, Some(&[1, 1, 0, 6, b'o'])).await;
    let end_for_nothing = encode(&Marker::End {
        source: SourceRef::new("nowhere", 0, 1),
    });
    raw(&t.markers, Some(&end_for_nothing)).await;

    let expect = [
        ("empty", 1.0),
        ("tombstone", 1.0),
        ("unknown_version", 2.0),
        ("unknown_type", 1.0),
        ("truncated", 1.0),
    ];
    for (kind, n) in expect {
        tracker
            .wait_metric(
                &format!("redelivery_marker_errors_total{{kind=\"{kind}\"}}"),
                n,
            )
            .await;
    }
    tracker
        .wait_metric(
            "redelivery_odd_markers_total{kind=\"end_without_start\"}",
            1.0,
        )
        .await;
    assert!(tracker.ready.is_ready(), "still ready");

    // And it still does its job.
    let mut c = consumer(&t, Duration::from_millis(500)).await;
    produce(&t.source, None, "after-garbage", b"v", &[]).await;
    next_delivery(&mut c, "delivery").await.abandon();
    let again = next_delivery(&mut c, "redelivery after garbage").await;
    assert_eq!(again.attempt(), 2);
    again.ack().await.unwrap();
    tracker.stop().await;
}

/// A Start marker written by hand, as a client would, for `source`.
async fn start_for(markers: &str, source: SourceRef, timeout_ms: u32) {
    let m = Marker::Start {
        source,
        timeout_ms,
        attempt: 1,
    };
    raw(markers, Some(&encode(&m))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_removed_by_retention_takes_the_dead_letter_path() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    tracker.wait_ready().await;
    for i in 0..3 {
        produce(&t.source, Some(0), &format!("k{i}"), b"v", &[]).await;
    }
    // Offsets 0 and 1 are deleted, as retention would; offset 7 was never written.
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&t.source, 0, Offset::Offset(2))
        .unwrap();
    admin
        .delete_records(&tpl, &AdminOptions::new())
        .await
        .unwrap();
    start_for(&t.markers, SourceRef::new(t.source.clone(), 0, 1), 100).await;
    start_for(&t.markers, SourceRef::new(t.source.clone(), 0, 7), 100).await;

    let dlq = read(&t.dlq, 2, Duration::from_secs(60));
    assert_eq!(dlq.len(), 2, "both unreadable records are dead-lettered");
    let mut offsets = Vec::new();
    for m in &dlq {
        assert_eq!(
            header(m, headers::DLQ_REASON).as_deref(),
            Some("source-unreadable")
        );
        let detail = header(m, headers::DLQ_DETAIL).unwrap();
        assert!(
            detail.contains("out of range") || detail.contains("past the end"),
            "{detail}"
        );
        offsets.push(header(m, headers::ORIGINAL_OFFSET).unwrap());
    }
    offsets.sort();
    assert_eq!(offsets, vec!["1", "7"]);
    let series = format!(
        "redelivery_dead_lettered_total{{reason=\"source-unreadable\",topic=\"{}\"}}",
        t.source
    );
    tracker.wait_metric(&series, 2.0).await;
    tracker.stop().await;
}

/// Random bytes, so compression cannot shrink them below a size limit.
fn noise(n: usize) -> Vec<u8> {
    (0..n).map(|_| rand::random::<u8>()).collect()
}

/// Produces the largest record `topic` accepts (found by trying), with key `k`; returns its
/// payload and offset. Its redelivered copy, carrying more headers, cannot fit.
async fn largest_record(topic: &str, limit: usize) -> (Vec<u8>, i64) {
    let p = producer();
    for size in (limit - 200..limit).rev().step_by(4) {
        let payload = noise(size);
        let sent = p
            .send(
                FutureRecord::to(topic)
                    .key("k")
                    .payload(&payload)
                    .partition(0),
                Duration::from_secs(10),
            )
            .await;
        if let Ok(d) = sent {
            return (payload, d.offset);
        }
    }
    panic!("no record fitted under {limit} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_too_large_for_its_topic_goes_to_the_dead_letter_topic_whole() {
    let t = topics(1, 1).await;
    let source = unique("small");
    let limit = 4_000;
    create_topic(&source, 1, &[("max.message.bytes", &limit.to_string())]).await;
    create_topic(&format!("{source}.dlq"), 1, &[]).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    tracker.wait_ready().await;
    let (payload, offset) = largest_record(&source, limit).await;
    start_for(&t.markers, SourceRef::new(source.clone(), 0, offset), 100).await;

    let dlq = read(&format!("{source}.dlq"), 1, Duration::from_secs(60));
    assert_eq!(dlq.len(), 1, "the refused copy is dead-lettered");
    let m = &dlq[0];
    assert_eq!(
        header(m, headers::DLQ_REASON).as_deref(),
        Some("copy-rejected")
    );
    let detail = header(m, headers::DLQ_DETAIL).unwrap();
    assert!(
        detail.contains("refused") && detail.contains("too large"),
        "{detail}"
    );
    use rdkafka::message::Message;
    assert_eq!(m.payload(), Some(&payload[..]), "payload intact");
    assert_eq!(m.key(), Some(&b"k"[..]));
    let series =
        format!("redelivery_dead_lettered_total{{reason=\"copy-rejected\",topic=\"{source}\"}}");
    tracker.wait_metric(&series, 1.0).await;
    assert!(tracker.metric("redelivery_produce_errors_total{what=\"copy\"}") >= 1.0);
    tracker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_refused_everywhere_stays_in_flight_without_blocking_others() {
    let t = topics(1, 1).await;
    let source = unique("small");
    let limit = 4_000;
    create_topic(&source, 1, &[("max.message.bytes", &limit.to_string())]).await;
    // The dead-letter topic is just as small, so the copy fits nowhere.
    create_topic(
        &format!("{source}.dlq"),
        1,
        &[("max.message.bytes", &limit.to_string())],
    )
    .await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    tracker.wait_ready().await;
    let (_, offset) = largest_record(&source, limit).await;
    start_for(&t.markers, SourceRef::new(source.clone(), 0, offset), 100).await;
    tracker
        .wait_metric("redelivery_parked_deliveries", 1.0)
        .await;

    // Another delivery, due after the refused one, is still redelivered.
    let (_, ok) = produce(&t.source, Some(0), "fine", b"v", &[]).await;
    start_for(&t.markers, SourceRef::new(t.source.clone(), 0, ok), 100).await;
    let copies = read(&t.source, 2, Duration::from_secs(60));
    assert_eq!(copies.len(), 2, "the original and its copy");
    assert_eq!(header(&copies[1], headers::ATTEMPT).as_deref(), Some("2"));
    // The refused one is still in flight, holding the markers commit.
    assert_eq!(tracker.metric("redelivery_parked_deliveries"), 1.0);
    assert!(tracker.metric_sum("redelivery_in_flight") >= 1.0);
    assert!(tracker.metric("redelivery_produce_errors_total{what=\"dead_letter\"}") >= 1.0);
    tracker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_topic_deleted_in_flight_is_dead_lettered_with_the_reason() {
    let t = topics(1, 1).await;
    // Long enough for the topic to be gone before the deadline, even on a loaded machine: the
    // read must find it deleted, not copy it back (this broker auto-creates topics).
    let mut c = consumer(&t, Duration::from_secs(10)).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    tracker.wait_ready().await;
    produce(&t.source, Some(0), "doomed", b"payload", &[]).await;
    let d = c.recv().await.unwrap();
    d.abandon();
    c.close().await.unwrap();
    delete_topic(&t.source).await;

    let dlq = read(&t.dlq, 1, Duration::from_secs(90));
    assert_eq!(dlq.len(), 1, "the in-flight delivery is dead-lettered");
    assert_eq!(
        header(&dlq[0], headers::DLQ_REASON).as_deref(),
        Some("source-unreadable")
    );
    let detail = header(&dlq[0], headers::DLQ_DETAIL).unwrap();
    assert!(detail.contains("exist"), "{detail}");
    tracker.stop().await;
}

/// A record whose header name is not UTF-8 (the C, Go and Java clients write such names) used
/// to panic the client's poll thread and stop its partition for good. It is now delivered with
/// the header as written, the records around it are acked, and its redelivered copy carries the
/// header byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_name_that_is_not_utf8_is_carried_byte_for_byte() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    tracker.wait_ready().await;
    let odd: headers::HeaderList = vec![
        (
            vec![0xff, 0xfe, b'k', b'e', b'y'].into(),
            Some(vec![0x80, 0]),
        ),
        ("trace".into(), Some(b"t-1".to_vec())),
    ];
    produce(&t.source, Some(0), "before", b"1", &[]).await;
    let record = FutureRecord::to(&t.source)
        .partition(0)
        .key("odd")
        .payload("2")
        .headers(headers::to_kafka(&odd));
    producer()
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    produce(&t.source, Some(0), "after", b"3", &[]).await;

    let mut c = consumer(&t, Duration::from_secs(2)).await;
    let mut keys = Vec::new();
    for _ in 0..3 {
        let d = c
            .recv_timeout(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("the consumer stopped after {keys:?}: {:?}", c.failure()));
        let key = String::from_utf8_lossy(d.key().unwrap()).into_owned();
        keys.push(key.clone());
        if key == "odd" {
            assert_eq!(d.headers(), &odd, "headers as the producer wrote them");
            assert_eq!(d.headers()[0].0.as_str(), None);
            d.abandon(); // redelivered after its 2 s timeout
        } else {
            d.ack().await.unwrap();
        }
    }
    assert_eq!(keys, ["before", "odd", "after"]);
    let copy = c
        .recv_timeout(Duration::from_secs(30))
        .await
        .expect("the tracker redelivers the odd record");
    assert_eq!(copy.attempt(), 2);
    assert_eq!(
        &copy.headers()[..2],
        &odd[..],
        "the copy carries the headers byte for byte"
    );
    copy.ack().await.unwrap();
    c.close().await.unwrap();
}

/// A poll thread that dies is an error the application sees, with the reason: the example
/// worker exits non-zero and says why, instead of exiting 0 having acked nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_thread_that_dies_is_reported_not_a_silent_exit() {
    let t = topics(1, 1).await;
    produce_many(&t.source, 1, "p", 3).await;
    let out = worker_command(&t, &unique("workers"))
        .env("KR_FAILPOINT", "panic:after-poll")
        .stdout(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit status {:?}", out.status);
    assert!(
        stderr.contains("the poll thread died: failpoint after-poll: panicking on purpose"),
        "stderr: {stderr}"
    );
}

/// A producer's `kr-*` headers are validated, not trusted: out of range they are clamped or
/// ignored, and each such record is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kr_headers_out_of_range_are_clamped_or_ignored_and_counted() {
    let t = topics(1, 1).await;
    let default = Duration::from_secs(20);
    let cases: [(&str, &str, Duration); 4] = [
        (headers::TIMEOUT_MS, "30", headers::checked::MIN_TIMEOUT), // seconds meant
        (headers::TIMEOUT_MS, "-5", default),
        (headers::TIMEOUT_MS, "0", default),
        (headers::MAX_DELIVERIES, "100000", default),
    ];
    for (i, (name, value, _)) in cases.iter().enumerate() {
        produce(
            &t.source,
            Some(0),
            &format!("h-{i}"),
            b"x",
            &[(name, value)],
        )
        .await;
    }
    let mut c = consumer(&t, default).await;
    for (name, value, timeout) in cases {
        let d = c.recv_timeout(Duration::from_secs(30)).await.unwrap();
        assert_eq!(d.timeout(), timeout, "{name}: {value}");
        d.ack().await.unwrap();
    }
    assert_eq!(c.odd_headers(), 4);
    c.close().await.unwrap();
}

/// One marker stamped 50 minutes ahead (a broker clock step, or any writer on a `CreateTime`
/// markers topic; brokers refuse more than an hour by default) used to move partition time
/// that far forward, so every later delivery was due
/// the moment it started. It is now counted and ignored: a delivery acked within its timeout
/// is not redelivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_future_marker_timestamp_does_not_make_deliveries_due() {
    let source = unique("src");
    let t = Topics {
        markers: format!("{source}.markers"),
        dlq: format!("{source}.dlq"),
        source,
    };
    create_topic(&t.source, 1, &[]).await;
    // CreateTime, so the test can stamp a marker as it likes.
    create_topic(&t.markers, 1, &[("message.timestamp.type", "CreateTime")]).await;
    create_topic(&t.dlq, 1, &[]).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    tracker.wait_ready().await;
    // Its own Tick came back stamped by the writer, not the broker: said, and counted once.
    tracker
        .wait_metric(
            "redelivery_problems_total{kind=\"markers_not_broker_stamped\"}",
            1.0,
        )
        .await;

    let ahead = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        + 50 * 60_000;
    let forged = encode(&Marker::End {
        source: SourceRef::new("nowhere", 0, 1),
    });
    producer()
        .send(
            FutureRecord::<(), [u8]>::to(&t.markers)
                .partition(0)
                .payload(&forged)
                .timestamp(ahead),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    tracker
        .wait_metric("redelivery_clock_jumps_total{kind=\"outlier\"}", 1.0)
        .await;

    let mut c = consumer(&t, Duration::from_secs(5)).await;
    produce(&t.source, Some(0), "held", b"v", &[]).await;
    let d = c.recv_timeout(Duration::from_secs(30)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await; // well within its 5 s timeout
    d.ack().await.unwrap();
    assert!(
        c.recv_timeout(Duration::from_secs(3)).await.is_none(),
        "a delivery acked in time was redelivered: the clock jumped"
    );
    assert_eq!(tracker.metric_sum("redelivery_redelivered_total"), 0.0);
    c.close().await.unwrap();
    tracker.stop().await;
}

//! The redelivery worker against librdkafka's mock cluster: real reads by offset, real
//! produces and real Ends, without a broker process. What only a real broker shows
//! (durability across restarts, rebalances) stays in `tests/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;
use std::thread::JoinHandle;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use super::*;
use crate::kafka::producer::QuietProducer;
use crate::marker::{decode, Marker};
use crate::tracker::core::state::Cause;

/// A mock cluster with a source topic `src` (one record at offset 0), its dead-letter topic and
/// a markers topic `m`, and a worker that owns markers partition 0.
struct Rig {
    mock: MockCluster<'static, DefaultProducerContext>,
    fence: Arc<Fence>,
    metrics: Metrics,
    jobs: Option<mpsc::Sender<Job>>,
    worker: Option<JoinHandle<()>>,
}

impl Rig {
    async fn start(max_deliveries: u32) -> Rig {
        let mock = MockCluster::new(1).unwrap();
        for topic in ["src", "src.dlq", "m"] {
            mock.create_topic(topic, 1, 1).unwrap();
        }
        let mut config = TrackerConfig::new(mock.bootstrap_servers(), "m");
        config.max_deliveries = max_deliveries;
        let config = Arc::new(config);
        let producer: QuietProducer = config
            .client_config(&crate::kafka::DURABLE_PRODUCER)
            .create()
            .unwrap();
        producer
            .send(
                FutureRecord::to("src")
                    .partition(0)
                    .key("k")
                    .payload("v")
                    .headers(rdkafka::message::OwnedHeaders::new().insert(
                        rdkafka::message::Header {
                            key: "h",
                            value: Some("1"),
                        },
                    )),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        let fence = Arc::new(Fence::default());
        let metrics = Metrics::new();
        let worker = Redeliverer::new(
            config,
            Producers::one(producer),
            metrics.clone(),
            Arc::new(AtomicBool::new(false)),
            fence.clone(),
            None,
        )
        .unwrap();
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || worker.run(rx, &AtomicUsize::new(0)));
        Rig {
            mock,
            fence,
            metrics,
            jobs: Some(tx),
            worker: Some(thread),
        }
    }

    /// Hands the worker the record at `src/0@0` as due, with `attempt` and `cause`.
    fn due(&self, generation: u64, attempt: u32, cause: Cause) {
        let expiry = Expiry {
            source: SourceRef::new("src", 0, 0),
            attempt,
            cause,
            deadline_ms: 0,
            due_before_takeover: false,
        };
        let job = Job {
            markers_partition: 0,
            generation,
            expiries: vec![expiry],
            taken_at_ms: 0,
            taken_at: Instant::now(),
        };
        self.jobs.as_ref().unwrap().send(job).unwrap();
    }

    /// Every record of `topic` once it holds at least `n`, or what it holds after `wait`.
    fn read(&self, topic: &str, n: usize, wait: Duration) -> Vec<OwnedMessage> {
        let c: BaseConsumer = crate::kafka::client_config(
            &self.mock.bootstrap_servers(),
            &[("group.id", "reader"), ("enable.auto.commit", "false")],
            &[],
        )
        .create()
        .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Beginning)
            .unwrap();
        c.assign(&tpl).unwrap();
        let mut out = Vec::new();
        let deadline = Instant::now() + wait;
        while out.len() < n && Instant::now() < deadline {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                out.push(m.detach());
            }
        }
        out
    }

    /// The Ends the worker wrote (version 1 Ends and the ends of Settle markers), as source
    /// coordinates, from the first `n` markers.
    fn ends(&self, n: usize, wait: Duration) -> Vec<SourceRef> {
        self.read("m", n, wait)
            .iter()
            .flat_map(|m| match m.payload().map(decode) {
                Some(Ok(Marker::End { source })) => vec![source],
                Some(Ok(Marker::Settle(s))) => s
                    .ends
                    .iter()
                    .map(|o| SourceRef::new(s.topic.as_str(), s.partition, o))
                    .collect(),
                _ => Vec::new(),
            })
            .collect()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

use crate::headers::record_text as header;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_delivery_becomes_a_copy_with_the_next_attempt_then_an_end() {
    let rig = Rig::start(5).await;
    let generation = rig.fence.grant(0);
    rig.due(generation, 1, Cause::Timeout);
    let source = rig.read("src", 2, Duration::from_secs(20));
    assert_eq!(source.len(), 2, "the original and its copy");
    let copy = &source[1];
    assert_eq!(copy.key(), Some(&b"k"[..]));
    assert_eq!(copy.payload(), Some(&b"v"[..]));
    assert_eq!(header(copy, "h").as_deref(), Some("1"));
    assert_eq!(header(copy, "kr-attempt").as_deref(), Some("2"));
    assert_eq!(header(copy, "kr-original-offset").as_deref(), Some("0"));
    assert_eq!(
        rig.ends(1, Duration::from_secs(20)),
        vec![SourceRef::new("src", 0, 0)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_allowed_delivery_goes_to_the_dead_letter_topic_with_its_reason() {
    let rig = Rig::start(3).await;
    let generation = rig.fence.grant(0);
    rig.due(generation, 3, Cause::Timeout);
    let dead = rig.read("src.dlq", 1, Duration::from_secs(20));
    assert_eq!(dead.len(), 1);
    assert_eq!(
        header(&dead[0], "kr-dlq-reason").as_deref(),
        Some("max-deliveries")
    );
    assert_eq!(
        rig.ends(1, Duration::from_secs(20)),
        vec![SourceRef::new("src", 0, 0)]
    );
    assert_eq!(
        rig.read("src", 2, Duration::from_secs(1)).len(),
        1,
        "no copy to the source"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_delivery_is_dead_lettered_with_the_consumers_reason() {
    let rig = Rig::start(5).await;
    let generation = rig.fence.grant(0);
    rig.due(generation, 1, Cause::Rejected("bad input".into()));
    let dead = rig.read("src.dlq", 1, Duration::from_secs(20));
    assert_eq!(dead.len(), 1);
    assert_eq!(
        header(&dead[0], "kr-dlq-reason").as_deref(),
        Some("rejected")
    );
    assert_eq!(
        header(&dead[0], "kr-dlq-detail").as_deref(),
        Some("bad input")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_partitions_job_is_dropped_and_counted() {
    let rig = Rig::start(5).await;
    let generation = rig.fence.grant(0);
    assert!(rig.fence.revoke(&[0], Duration::ZERO));
    rig.due(generation, 1, Cause::Timeout);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !rig
        .metrics
        .render()
        .contains("redelivery_fenced_deliveries_total{stage=\"queued\"} 1")
    {
        assert!(Instant::now() < deadline, "the stale job was not counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        rig.read("src", 2, Duration::from_secs(1)).len(),
        1,
        "nothing copied for a partition this worker no longer owns"
    );
    assert!(
        rig.ends(1, Duration::from_secs(1)).is_empty(),
        "and no End written for it"
    );
}

/// A pass's Ends: one Settle per markers partition and source partition, offsets ascending;
/// a schedule's End stays a version 1 End, which clients' schedule look-ups read.
#[test]
fn a_passs_ends_are_one_settle_per_source_partition_and_a_schedules_end_stays_v1() {
    let sources = [
        (0, SourceRef::new("orders", 1, 9)),
        (0, SourceRef::new("orders", 1, 3)),
        (0, SourceRef::new("orders", 2, 5)),
        (1, SourceRef::new("orders", 1, 4)),
        (0, SourceRef::new("m", 0, 17)),
        (0, SourceRef::new("orders", 1, 3)),
    ];
    let (partitions, out) = super::end_markers("m", sources.iter().map(|(p, s)| (*p, s)));
    assert_eq!(partitions, [0, 1]);
    let decoded: Vec<(Option<i32>, Marker)> = out
        .iter()
        .map(|o| (o.partition, decode(o.payload.as_deref().unwrap()).unwrap()))
        .collect();
    let settles: Vec<(Option<i32>, String, i32, Vec<i64>)> = decoded
        .iter()
        .filter_map(|(p, m)| match m {
            Marker::Settle(s) => Some((*p, s.topic.clone(), s.partition, s.ends.iter().collect())),
            _ => None,
        })
        .collect();
    assert_eq!(
        settles,
        [
            (Some(0), "orders".to_string(), 1, vec![3, 9]),
            (Some(0), "orders".to_string(), 2, vec![5]),
            (Some(1), "orders".to_string(), 1, vec![4]),
        ]
    );
    assert!(decoded.iter().any(|(p, m)| *p == Some(0)
        && *m
            == Marker::End {
                source: SourceRef::new("m", 0, 17)
            }));
    assert_eq!(decoded.len(), 4);
}

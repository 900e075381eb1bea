//! Restarting the fetch of a replaying partition that has read nothing, not even its own Tick
//! (`partition::OwnedPartition::silent_since_tick`).
//!
//! The tracker pauses a partition right after librdkafka assigns it, while its snapshot is
//! looked up, and resumes it when the answer comes. librdkafka has open issues (2190, 5591) in
//! which a pause that closely follows an assignment outdates the assignment's own fetch start:
//! the partition is then never fetched, and a resume alone does not start it; their workaround
//! is a seek after the resume. On a partition that fetches well, the same seek goes to where it
//! already is, so doing it for a partition merely slow to answer costs one re-fetch.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};

/// How long the committed-offset look-up and the seek may block the markers loop.
const WAIT: Duration = Duration::from_secs(5);

/// Resumes `topic`/`partition` and seeks it to where it should be fetching: `next` (after the
/// last record read), else the group's committed offset, else the start (`auto.offset.reset`
/// is `earliest` for the tracker). Returns the offset sought, or why there was no seek (the
/// caller tries again at the next Tick retry).
pub(crate) fn restart_fetch<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
    next: Option<i64>,
) -> Result<Offset, String> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    // A failed resume is not the end: the seek below may still start the fetch.
    let resumed = consumer.resume(&tpl).err();
    let to = match next {
        Some(next) => Offset::Offset(next),
        None => {
            let committed = consumer
                .committed_offsets(tpl, WAIT)
                .map_err(|e| format!("looking up the committed offset: {e}"))?;
            match committed
                .find_partition(topic, partition)
                .map(|e| e.offset())
            {
                Some(Offset::Offset(o)) => Offset::Offset(o),
                _ => Offset::Beginning,
            }
        }
    };
    consumer.seek(topic, partition, to, WAIT).map_err(|e| {
        let resumed = resumed.map_or(String::new(), |r| format!(" (the resume failed too: {r})"));
        // "Erroneous state" says the partition's fetch never started at all.
        format!("seeking to {to:?}: {e}{resumed}")
    })?;
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::consumer::CommitMode;
    use rdkafka::message::Message;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use std::time::Instant;

    /// A mock cluster whose topic `m` holds offsets 0..3 of partition 0, and a consumer of
    /// group `g` that read offset 0 and then paused the partition.
    fn a_paused_partition() -> (
        MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
        BaseConsumer,
    ) {
        let mock = MockCluster::new(1).expect("mock cluster");
        mock.create_topic("m", 1, 1).expect("topic");
        let brokers = mock.bootstrap_servers();
        let producer: BaseProducer = crate::kafka::client_config(&brokers, &[], &[])
            .create()
            .expect("producer");
        for i in 0..3 {
            let payload = format!("r{i}");
            producer
                .send(BaseRecord::<(), _>::to("m").partition(0).payload(&payload))
                .expect("queued");
        }
        producer.flush(Duration::from_secs(10)).expect("flushed");
        let consumer: BaseConsumer =
            crate::kafka::client_config(&brokers, &[("group.id", "g")], &[])
                .create()
                .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("m", 0, Offset::Beginning)
            .expect("offset");
        consumer.assign(&tpl).expect("assigned");
        assert_eq!(next_offset(&consumer), Some(0));
        consumer.pause(&tpl).expect("paused");
        (mock, consumer)
    }

    /// The offset of the next record polled within 10 s.
    fn next_offset(consumer: &BaseConsumer) -> Option<i64> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                return Some(m.offset());
            }
        }
        None
    }

    #[test]
    fn a_paused_partition_fetches_again_from_after_its_last_record() {
        let (_mock, consumer) = a_paused_partition();
        assert_eq!(
            restart_fetch(&consumer, "m", 0, Some(2)),
            Ok(Offset::Offset(2))
        );
        assert_eq!(next_offset(&consumer), Some(2));
    }

    #[test]
    fn with_nothing_read_it_fetches_from_the_committed_offset_or_the_start() {
        let (_mock, consumer) = a_paused_partition();
        assert_eq!(
            restart_fetch(&consumer, "m", 0, None),
            Ok(Offset::Beginning),
            "nothing committed"
        );
        assert_eq!(next_offset(&consumer), Some(0));

        let mut commit = TopicPartitionList::new();
        commit
            .add_partition_offset("m", 0, Offset::Offset(1))
            .expect("offset");
        consumer
            .commit(&commit, CommitMode::Sync)
            .expect("committed");
        assert_eq!(
            restart_fetch(&consumer, "m", 0, None),
            Ok(Offset::Offset(1))
        );
        assert_eq!(next_offset(&consumer), Some(1));
    }
}

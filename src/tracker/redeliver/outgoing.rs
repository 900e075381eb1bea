//! Producing the tracker's own records (copies, dead letters, Ends) and telling apart the
//! errors worth retrying from those the broker will repeat forever.
//!
//! A broker away or a leader moving passes, so those sends are retried with back-off until
//! they succeed. A record the broker refuses for what it is (too large for the topic, a topic
//! the tracker may not write, an invalid record) will be refused again, so retrying it would
//! only stall every other redelivery behind it: it is reported back as refused, and the caller
//! decides where else it may go.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::kafka::producer::DeliveryFuture;
use futures::executor::block_on;
use futures::future::join_all;
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureRecord;
use rdkafka::types::RDKafkaErrorCode;

use crate::headers::{self, HeaderList};
use crate::marker::{encode, Marker, Settle, SourceRef};

use crate::tracker::metrics::work::{ProduceFailed, ProduceRefused};
use crate::tracker::metrics::Metrics;
use crate::tracker::redeliver::producers::Producers;

/// A record to produce, owned so it can be retried.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// What it is (`copy`, `dead_letter`, `end`), for the `what` label of produce errors.
    pub what: &'static str,
    /// Target topic.
    pub topic: String,
    /// Target partition; `None` lets the partitioner choose.
    pub partition: Option<i32>,
    /// Key, as in the original record.
    pub key: Option<Vec<u8>>,
    /// Payload, as in the original record.
    pub payload: Option<Vec<u8>>,
    /// Headers.
    pub headers: HeaderList,
}

/// The End marker that lets the tracker forget `source`.
pub fn end_marker(markers_topic: &str, partition: i32, source: &SourceRef) -> Outgoing {
    Outgoing {
        what: "end",
        topic: markers_topic.to_string(),
        partition: Some(partition),
        key: None,
        payload: Some(encode(&Marker::End {
            source: source.clone(),
        })),
        headers: Vec::new(),
    }
}

/// One Settle marker (format version 2) ending `offsets` (ascending, no repeats) of source
/// partition `topic`/`source_partition`, for markers partition `partition`.
pub fn settle_ends_marker(
    markers_topic: &str,
    partition: i32,
    topic: &str,
    source_partition: i32,
    offsets: &[i64],
) -> Outgoing {
    let mut settle = Settle::new(topic, source_partition);
    for &o in offsets {
        settle.ends.push(o);
    }
    Outgoing {
        what: "end",
        topic: markers_topic.to_string(),
        partition: Some(partition),
        key: None,
        payload: Some(encode(&Marker::Settle(Box::new(settle)))),
        headers: Vec::new(),
    }
}

/// True for errors that retrying the same record cannot fix.
pub fn refused_for_good(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::InvalidRequiredAcks
                // librdkafka reports these only after waiting for the topic to appear
                // (`topic.metadata.propagation.max.ms`): the topic is gone.
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownPartition
        )
    )
}

const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Sends records and waits until each is durable or refused for good.
pub struct Sender<'a> {
    /// The idempotent, `acks=all` producers (`producers.rs`).
    pub producers: &'a Producers,
    /// Where failures are logged and counted.
    pub metrics: &'a Metrics,
    /// Set when the tracker stops; retrying ends then.
    pub stop: &'a AtomicBool,
}

/// A record handed to the producer: its delivery report to come, or why it was not queued.
pub enum Started {
    /// Queued; the future resolves once the broker acknowledged it or librdkafka gave up.
    Queued(DeliveryFuture),
    /// librdkafka did not take it (its queue full, for one); sent again by [`Sender::settle`].
    NotQueued(KafkaError),
}

impl Sender<'_> {
    /// Produces every record, retrying errors that may pass with back-off. Returns, per
    /// record, `Ok` once durable or `Err(reason)` if the broker refused it for good; `None`
    /// if a stop was requested before everything was settled.
    pub fn send_all(&self, records: &[Outgoing]) -> Option<Vec<Result<(), String>>> {
        self.settle(records, self.start(records))
    }

    /// Hands every record to the producer without waiting for any of it: the worker starts a
    /// pass's copies and goes on to the next pass while they travel (`landing.rs`).
    pub fn start(&self, records: &[Outgoing]) -> Vec<Started> {
        records.iter().map(|r| self.start_one(r)).collect()
    }

    fn start_one(&self, r: &Outgoing) -> Started {
        let producer = self.producers.for_target(&r.topic, r.partition);
        match producer.send_result(future_record(r)) {
            Ok(delivery) => Started::Queued(delivery),
            Err((e, _)) => Started::NotQueued(e),
        }
    }

    /// Waits for the records [`Self::start`] handed over, then sends again, with back-off,
    /// those that failed in a way that may pass; results as for [`Self::send_all`].
    pub fn settle(
        &self,
        records: &[Outgoing],
        started: Vec<Started>,
    ) -> Option<Vec<Result<(), String>>> {
        let mut results: Vec<Option<Result<(), String>>> = vec![None; records.len()];
        let mut backoff = Duration::from_millis(100);
        let mut round: Vec<(usize, Started)> = started.into_iter().enumerate().collect();
        loop {
            let sent = block_on(join_all(round.into_iter().map(|(i, s)| async move {
                let outcome = match s {
                    Started::Queued(delivery) => match delivery.await {
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err((e, _))) => Err(e),
                        Err(_) => Err(KafkaError::Canceled),
                    },
                    Started::NotQueued(e) => Err(e),
                };
                (i, outcome)
            })));
            let mut retry = false;
            for (i, result) in sent {
                match result {
                    Ok(()) => results[i] = Some(Ok(())),
                    Err(e) if refused_for_good(&e) => {
                        self.metrics.emit(ProduceRefused {
                            what: records[i].what,
                            target: &records[i].topic,
                            error: &e,
                        });
                        results[i] = Some(Err(e.to_string()));
                    }
                    Err(e) => {
                        self.metrics.emit(ProduceFailed {
                            what: records[i].what,
                            target: &records[i].topic,
                            error: &e,
                        });
                        retry = true;
                    }
                }
            }
            let left: Vec<usize> = (0..records.len())
                .filter(|&i| results[i].is_none())
                .collect();
            if left.is_empty() {
                return Some(results.into_iter().flatten().collect());
            }
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            if retry {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            round = left
                .into_iter()
                .map(|i| (i, self.start_one(&records[i])))
                .collect();
        }
    }
}

/// `r` as librdkafka takes it.
fn future_record(r: &Outgoing) -> FutureRecord<'_, [u8], [u8]> {
    let mut record = FutureRecord::to(&r.topic).headers(headers::to_kafka(&r.headers));
    if let Some(p) = r.partition {
        record = record.partition(p);
    }
    if let Some(k) = &r.key {
        record = record.key(k.as_slice());
    }
    if let Some(v) = &r.payload {
        record = record.payload(v.as_slice());
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_and_authorisation_errors_are_for_good_transport_errors_are_not() {
        let produce = |c| KafkaError::MessageProduction(c);
        assert!(refused_for_good(&produce(
            RDKafkaErrorCode::MessageSizeTooLarge
        )));
        assert!(refused_for_good(&produce(
            RDKafkaErrorCode::TopicAuthorizationFailed
        )));
        assert!(!refused_for_good(&produce(
            RDKafkaErrorCode::BrokerTransportFailure
        )));
        assert!(!refused_for_good(&produce(
            RDKafkaErrorCode::MessageTimedOut
        )));
        assert!(!refused_for_good(&produce(
            RDKafkaErrorCode::NotLeaderForPartition
        )));
    }
}

//! The tracker's producers for copies, dead letters and Ends: a few, each target partition
//! always written through the same one.
//!
//! Why more than one: librdkafka sends each partition's records in a produce request of its own
//! (confluentinc/librdkafka#1700), and a broker works through one connection's requests one at
//! a time, in order. A pass copying records of eight source partitions so queued eight requests
//! behind each other on one connection, and the pass (so the deadline-to-redelivery time of
//! every record in it) waited for the last. With the partitions spread over a few producers,
//! each with its own connections, the broker serves those requests side by side
//! (BENCHMARKS.md, "Copies over more than one connection" and "Producers that sleep while
//! idle").
//!
//! One partition always goes through the same producer, so its records keep their order and
//! each producer's idempotence covers them, as with a single producer.

use std::sync::Arc;

use crate::kafka::producer::QuietProducer;
use crate::tracker::config::TrackerConfig;
use crate::tracker::error::TrackerError;

/// How many producers the tracker writes its copies, dead letters and Ends through. Four took
/// the p99 of the copies' produce round trip at 1,000 redeliveries a second over eight source
/// partitions from a median of 13 ms to 7 ms in five alternating pairs against one, and the
/// deadline-to-redelivery p99 to ≤ 10 ms in four runs of five against none (BENCHMARKS.md,
/// "Producers that sleep while idle"). Each costs a librdkafka instance (a few threads, a
/// connection to each broker it writes to) and, being a `QuietProducer`, no CPU while idle.
pub const COPY_PRODUCERS: usize = 4;
const _: () = assert!(COPY_PRODUCERS > 0);

/// A fixed set of producers; cheap to clone.
#[derive(Clone)]
pub struct Producers {
    all: Arc<[QuietProducer]>,
}

impl Producers {
    /// [`COPY_PRODUCERS`] producers with `settings` (and the operator's `-X` overrides).
    pub fn create(config: &TrackerConfig, settings: &[(&str, &str)]) -> Result<Self, TrackerError> {
        let all = (0..COPY_PRODUCERS)
            .map(|_| {
                config
                    .client_config(settings)
                    .create()
                    .map_err(TrackerError::kafka("creating a producer"))
            })
            .collect::<Result<Vec<QuietProducer>, _>>()?;
        Ok(Producers { all: all.into() })
    }

    /// One producer alone.
    #[cfg(test)]
    pub fn one(producer: QuietProducer) -> Self {
        Producers {
            all: Arc::new([producer]),
        }
    }

    /// The first producer: for the tracker's writes that are not per partition (snapshots).
    pub fn first(&self) -> &QuietProducer {
        // Never empty: `create` makes `COPY_PRODUCERS` of them, `one` one.
        &self.all[0]
    }

    /// The producer for records to `topic`'s `partition`; records left to the partitioner
    /// (`None`) all go through the first.
    pub fn for_target(&self, topic: &str, partition: Option<i32>) -> &QuietProducer {
        &self.all[slot(topic, partition, self.all.len())]
    }
}

/// The index of the producer for `topic`'s `partition` among `n`: consecutive partitions of one
/// topic go to consecutive producers, so a topic's partitions spread evenly over the set.
fn slot(topic: &str, partition: Option<i32>, n: usize) -> usize {
    let Some(partition) = partition else {
        return 0;
    };
    if n <= 1 {
        return 0;
    }
    // FNV-1a of the name: stable across runs, so a restarted tracker spreads as before.
    let seed = topic.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let index = seed.wrapping_add(u64::from(partition.unsigned_abs()));
    // `n` fits in a u64 and the remainder is below `n`: both conversions are exact.
    (index % n as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_partition_always_gets_the_same_producer() {
        for p in 0..64 {
            assert_eq!(slot("orders", Some(p), 4), slot("orders", Some(p), 4));
        }
    }

    #[test]
    fn a_topics_partitions_spread_evenly() {
        let mut counts = [0usize; 4];
        for p in 0..8 {
            counts[slot("orders", Some(p), 4)] += 1;
        }
        assert_eq!(counts, [2, 2, 2, 2]);
    }

    #[test]
    fn records_left_to_the_partitioner_and_a_single_producer_use_the_first() {
        assert_eq!(slot("orders", None, 4), 0);
        assert_eq!(slot("orders", Some(7), 1), 0);
        assert_eq!(slot("orders", Some(7), 0), 0);
    }
}

//! Step 1 of the protocol: the Start markers of a poll batch.

use std::time::{Duration, Instant};

use futures::future::join_all;

use crate::client::config::MarkerFormat;
use crate::failpoint;
use crate::marker::{duration_to_ms_u32, Marker, Offsets, StartBatch, MAX_BATCH_RECORDS};

use super::{InFlight, Polled, Poller};

impl Poller {
    /// Step 1 for one batch: queues its Start markers, one per record (version 1) or one per
    /// source partition (version 2).
    pub(super) fn start(&self, batch: Vec<Polled>) -> InFlight {
        failpoint::hit("after-poll");
        // Read before the Starts go: the tracker's deadlines count from their broker
        // timestamps, later still, so a delivery expired by this reading is due there too.
        let started_at = Instant::now();
        let markers = match self.config.marker_format {
            MarkerFormat::V1 => batch
                .iter()
                .enumerate()
                .map(|(i, p)| (vec![i], start_v1(p)))
                .collect(),
            _ => start_batches(&batch, self.config.default_timeout),
        };
        let futures: Vec<_> = markers
            .into_iter()
            .map(|(records, marker)| {
                // A failpoint can make a Start fail as the broker would: never written.
                let sent = (!failpoint::fails("start")).then(|| self.settler.send(&marker));
                (records, sent)
            })
            .collect();
        failpoint::hit("after-start-sent");
        let count = batch.len();
        let starts = async move {
            let mut durable = vec![false; count];
            let answers = join_all(futures.into_iter().map(|(records, sent)| async move {
                let ok = match sent {
                    Some(Ok(f)) => matches!(f.await, Ok(Ok(_))),
                    Some(Err(_)) | None => false,
                };
                (records, ok)
            }))
            .await;
            for (records, ok) in answers {
                for i in records {
                    durable[i] = ok;
                }
            }
            durable
        };
        InFlight {
            batch,
            starts: Box::pin(starts),
            rewound: Vec::new(),
            revoked: Vec::new(),
            revoked_at: None,
            started_at,
        }
    }
}

/// The version 1 Start of one record.
fn start_v1(p: &Polled) -> Marker {
    Marker::Start {
        source: p.source.clone(),
        timeout_ms: duration_to_ms_u32(p.timeout),
        attempt: p.attempt,
    }
}

/// Version 2 Starts for a poll batch: one per source partition (split at
/// [`MAX_BATCH_RECORDS`]), each with the positions in `batch` of the records it covers. The
/// default timeout is the consumer's; records with their own timeout or attempt are listed.
fn start_batches(batch: &[Polled], default: Duration) -> Vec<(Vec<usize>, Marker)> {
    let timeout_ms = duration_to_ms_u32(default);
    let mut groups: Vec<(Vec<usize>, StartBatch)> = Vec::new();
    for (i, p) in batch.iter().enumerate() {
        let s = &p.source;
        // A partition's records come in offset order; one that does not (a seek back between
        // polls) goes into a marker of its own.
        let open = groups.iter().rposition(|(records, b)| {
            b.partition == s.partition
                && *b.topic == *s.topic
                && records.len() < MAX_BATCH_RECORDS
                && b.offsets.last().is_some_and(|last| last < s.offset)
        });
        let g = open.unwrap_or_else(|| {
            groups.push((
                Vec::new(),
                StartBatch {
                    topic: s.topic.to_string(),
                    partition: s.partition,
                    timeout_ms,
                    offsets: Offsets::new(),
                    attempts: Vec::new(),
                    timeouts: Vec::new(),
                },
            ));
            groups.len() - 1
        });
        let (records, b) = &mut groups[g];
        b.offsets.push(s.offset);
        if p.attempt != 1 {
            b.attempts.push((s.offset, p.attempt));
        }
        let own = duration_to_ms_u32(p.timeout);
        if own != timeout_ms {
            b.timeouts.push((s.offset, own));
        }
        records.push(i);
    }
    groups
        .into_iter()
        .map(|(records, b)| (records, Marker::StartBatch(Box::new(b))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::poller::tests::polled;

    #[test]
    fn a_poll_batch_gives_one_start_per_source_partition_with_its_exceptions() {
        let mut batch = vec![
            polled("a", 0, 10),
            polled("a", 1, 5),
            polled("a", 0, 11),
            polled("a", 0, 13),
            polled("a", 0, 3), // a seek back between polls: a marker of its own
        ];
        batch[2].attempt = 3;
        batch[3].timeout = Duration::from_secs(9);
        let starts = start_batches(&batch, Duration::from_secs(1));
        let got: Vec<_> = starts
            .iter()
            .map(|(records, m)| match m {
                Marker::StartBatch(b) => (
                    records.clone(),
                    b.partition,
                    b.offsets.iter().collect::<Vec<_>>(),
                    b.attempts.clone(),
                    b.timeouts.clone(),
                    b.timeout_ms,
                ),
                other => panic!("not a batch Start: {other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    vec![0, 2, 3],
                    0,
                    vec![10, 11, 13],
                    vec![(11, 3)],
                    vec![(13, 9000)],
                    1000
                ),
                (vec![1], 1, vec![5], vec![], vec![], 1000),
                (vec![4], 0, vec![3], vec![], vec![], 1000),
            ]
        );
    }
}

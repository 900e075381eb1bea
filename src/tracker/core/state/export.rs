//! A partition state as plain data, for snapshots, and back.
//!
//! The snapshot format (`tracker::snapshot`) turns an [`Exported`] into bytes; this module
//! only moves entries out of and into the slab, index and heap, which it can see.

use super::{Key, Meta, PartitionState, Phase, Slot};

/// What an exported entry is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A delivery waiting for its deadline.
    Waiting = 0,
    /// A nacked delivery waiting for its delay.
    Nacked = 1,
    /// A rejected delivery, due for the dead-letter topic.
    Rejected = 2,
    /// A schedule waiting for its due time.
    Scheduled = 3,
}

impl EntryKind {
    /// The kind for a wire byte.
    pub fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            0 => EntryKind::Waiting,
            1 => EntryKind::Nacked,
            2 => EntryKind::Rejected,
            3 => EntryKind::Scheduled,
            _ => return None,
        })
    }

    fn phase(self) -> Phase {
        match self {
            EntryKind::Waiting => Phase::Waiting,
            EntryKind::Nacked => Phase::Nacked,
            EntryKind::Rejected => Phase::Rejected,
            EntryKind::Scheduled => Phase::Scheduled,
        }
    }
}

/// One tracked entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedEntry {
    /// Index into [`Exported::topics`].
    pub topic: u32,
    /// Source partition (a schedule: its markers partition).
    pub partition: i32,
    /// Source offset (a schedule: its marker's offset).
    pub offset: i64,
    /// When it is due, partition time in ms.
    pub deadline_ms: i64,
    /// Offset of the marker that began it: the commit never passes it without a snapshot.
    pub start_offset: i64,
    /// Delivery attempt; 0 for a schedule.
    pub attempt: u32,
    /// What it waits for.
    pub kind: EntryKind,
    /// A rejected delivery's reason.
    pub reason: Option<String>,
}

/// A whole partition state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exported {
    /// Topic names, indexed by [`ExportedEntry::topic`].
    pub topics: Vec<String>,
    /// Every tracked entry.
    pub entries: Vec<ExportedEntry>,
    /// (Start offset, timestamp) samples for the age of the oldest delivery.
    pub time_samples: Vec<(i64, i64)>,
}

impl PartitionState {
    /// Everything this state tracks. A delivery being redelivered right now is exported as
    /// due at its old deadline: restored, it is redelivered again unless its End follows (a
    /// duplicate at worst; a rejected one in that moment comes back as timed out).
    pub fn export(&self) -> Exported {
        let topics: Vec<String> = (0..)
            .map_while(|i| self.topics.get_name(i).map(str::to_string))
            .collect();
        let home_topic = self.topics.get(&self.home.0);
        let mut entries = Vec::with_capacity(self.in_flight());
        for slot in &self.slots {
            let kind = match slot.meta.phase() {
                Phase::Free => continue,
                Phase::Waiting => EntryKind::Waiting,
                Phase::Nacked => EntryKind::Nacked,
                Phase::Rejected => EntryKind::Rejected,
                Phase::Scheduled => EntryKind::Scheduled,
                Phase::Dispatched
                    if Some(slot.key.topic) == home_topic && slot.key.partition == self.home.1 =>
                {
                    EntryKind::Scheduled
                }
                Phase::Dispatched => EntryKind::Waiting,
            };
            entries.push(ExportedEntry {
                topic: slot.key.topic,
                partition: slot.key.partition,
                offset: slot.key.offset,
                deadline_ms: slot.deadline_ms,
                start_offset: slot.meta.start_offset(),
                attempt: slot.meta.attempt(),
                kind,
                reason: self.reject_reasons.get(&slot.key).cloned(),
            });
        }
        // Grouped records come back as slots of their own: the same deliveries, dearer to hold
        // until they end, and a snapshot's format needs no new entry kind.
        for g in self.groups.iter() {
            entries.extend(g.records().map(|(offset, _dispatched)| ExportedEntry {
                topic: g.topic,
                partition: g.partition,
                offset,
                deadline_ms: g.deadline_ms,
                start_offset: g.start_offset,
                attempt: 1,
                kind: EntryKind::Waiting,
                reason: None,
            }));
        }
        Exported {
            topics,
            entries,
            time_samples: self.time_index.samples().collect(),
        }
    }

    /// A state for markers partition `partition` of `markers_topic` holding `data`. Entries
    /// naming a topic index `data` does not have are skipped and counted in the result.
    pub fn import(markers_topic: &str, partition: i32, data: Exported) -> (Self, usize) {
        let mut state = PartitionState::at(markers_topic, partition);
        let ids: Vec<u32> = data.topics.iter().map(|t| state.topics.intern(t)).collect();
        let mut skipped = 0;
        for e in data.entries {
            let Some(&topic) = ids.get(e.topic as usize) else {
                skipped += 1;
                continue;
            };
            let key = Key {
                topic,
                partition: e.partition,
                offset: e.offset,
            };
            if state.find(&key).is_some() {
                skipped += 1;
                continue;
            }
            let i = state.insert(Slot {
                key,
                deadline_ms: e.deadline_ms,
                meta: Meta::new(e.start_offset, e.attempt, e.kind.phase()),
            });
            state.push_deadline(e.deadline_ms, i);
            if let Some(reason) = e.reason {
                state.reject_reasons.insert(key, reason);
            }
        }
        state.time_index = super::TimeIndex::from_samples(data.time_samples);
        (state, skipped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marker::{Marker, ScheduledRecord, SourceRef};

    #[test]
    fn a_state_survives_export_and_import() {
        let mut s = PartitionState::at("m", 2);
        let src = |o| SourceRef::new("orders", 1, o);
        s.on_marker(
            0,
            1_000,
            &Marker::Start {
                source: src(5),
                timeout_ms: 500,
                attempt: 3,
            },
        );
        s.on_marker(
            1,
            1_000,
            &Marker::Start {
                source: src(6),
                timeout_ms: 500,
                attempt: 1,
            },
        );
        s.on_marker(
            2,
            1_100,
            &Marker::Reject {
                source: src(6),
                reason: "bad".into(),
            },
        );
        s.on_marker(
            3,
            1_200,
            &Marker::Schedule {
                not_before_ms: 0,
                delay_ms: 9_000,
                record: Box::new(ScheduledRecord::to("t")),
            },
        );
        let (mut back, skipped) = PartitionState::import("m", 2, s.export());
        assert_eq!(skipped, 0);
        assert_eq!(back.summary(4, 2_000), s.summary(4, 2_000));
        let mut due = back.expired(1_500, 10);
        due.sort_by_key(|e| e.source.offset);
        assert_eq!(
            due,
            s.expired(1_500, 10).into_iter().rev().collect::<Vec<_>>()
        );
        assert_eq!(back.next_deadline(), Some(10_200));
        let e = back.expired(10_200, 10);
        assert_eq!(e[0].source, SourceRef::new("m", 2, 3));
    }

    #[test]
    fn a_dispatched_entry_comes_back_due() {
        let mut s = PartitionState::at("m", 0);
        let src = SourceRef::new("orders", 0, 1);
        s.on_marker(
            0,
            0,
            &Marker::Start {
                source: src.clone(),
                timeout_ms: 10,
                attempt: 1,
            },
        );
        assert_eq!(s.expired(10, 10).len(), 1);
        let (mut back, _) = PartitionState::import("m", 0, s.export());
        let again = back.expired(10, 10);
        assert_eq!((again[0].source.clone(), again[0].attempt), (src, 1));
    }

    #[test]
    fn entries_with_unknown_topics_are_skipped_and_counted() {
        let data = Exported {
            topics: vec!["a".into()],
            entries: vec![ExportedEntry {
                topic: 7,
                partition: 0,
                offset: 0,
                deadline_ms: 0,
                start_offset: 0,
                attempt: 1,
                kind: EntryKind::Waiting,
                reason: None,
            }],
            time_samples: vec![],
        };
        let (s, skipped) = PartitionState::import("m", 0, data);
        assert_eq!((s.in_flight(), skipped), (0, 1));
    }
}

//! Records started together by one version 2 Start and not yet treated apart: a *group*.
//!
//! A batch Start names hundreds of records of one source partition that share a Start offset,
//! a deadline and attempt 1, and most of them are then acked within one settle window. Giving
//! each its own 32-byte slot, index entry and heap entry (about 59 bytes in all) would waste
//! the batching, so such records live in a group instead: one bit each over the span of their
//! offsets, and one heap entry for the group's deadline. A record leaves its group only when it
//! is treated differently from the rest (kept alive, nacked, rejected, started again): it is
//! then *promoted* to a slot of its own and goes on exactly as a version 1 delivery would. An
//! End just clears its bit.
//!
//! When the deadline passes, the group's waiting records are handed to the redelivery worker
//! in offset order, up to the caller's limit at a time: `cursor` says how far that has gone,
//! so the records before it are dispatched (they stay, holding the commit back, until their
//! End comes back) and the rest still wait.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

/// A group's span may be at most this many times its record count (plus a little): a sparse
/// batch (a compacted topic) would spend more on its bitmap than on slots.
const MAX_SPAN_PER_RECORD: usize = 8;

/// Fewer records than this get slots: a group's fixed cost (about 100 bytes) is worth it only
/// for several.
pub(super) const MIN_RECORDS: usize = 4;

/// One group: records `first + i` for every set bit `i`.
#[derive(Debug)]
pub(super) struct Group {
    pub topic: u32,
    pub partition: i32,
    /// Source offset of bit 0.
    pub first: i64,
    /// Offset of the batch Start marker that began every record here.
    pub start_offset: i64,
    pub deadline_ms: i64,
    bits: Box<[u64]>,
    /// Number of offsets the bits cover.
    span: u32,
    /// Set bits.
    live: u32,
    /// Bits below this index are dispatched; the rest wait for the deadline.
    cursor: u32,
}

impl Group {
    fn has(&self, i: u32) -> bool {
        i < self.span && self.bits[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn clear(&mut self, i: u32) {
        self.bits[(i / 64) as usize] &= !(1 << (i % 64));
        self.live -= 1;
    }

    /// The next set bit at or after `i`.
    fn next_set(&self, i: u32) -> Option<u32> {
        let mut word = (i / 64) as usize;
        let mut bits = *self.bits.get(word)? & (u64::MAX << (i % 64));
        loop {
            if bits != 0 {
                let found = word as u32 * 64 + bits.trailing_zeros();
                return (found < self.span).then_some(found);
            }
            word += 1;
            bits = *self.bits.get(word)?;
        }
    }

    /// Whether any record still waits for the deadline.
    pub fn waiting(&self) -> bool {
        self.next_set(self.cursor).is_some()
    }

    /// Offsets of the records still waiting for the deadline (not dispatched), ascending.
    pub fn waiting_offsets(&self) -> impl Iterator<Item = i64> + '_ {
        let mut i = self.cursor;
        std::iter::from_fn(move || {
            let at = self.next_set(i)?;
            i = at + 1;
            Some(self.first + i64::from(at))
        })
    }

    /// The lowest live source offset.
    pub fn first_live(&self) -> Option<i64> {
        self.next_set(0).map(|i| self.first + i64::from(i))
    }

    /// Live records as (source offset, dispatched).
    pub fn records(&self) -> impl Iterator<Item = (i64, bool)> + '_ {
        let mut i = 0;
        std::iter::from_fn(move || {
            let at = self.next_set(i)?;
            i = at + 1;
            Some((self.first + i64::from(at), at < self.cursor))
        })
    }
}

/// Where a record is in a group.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member {
    pub group: u32,
    index: u32,
}

/// Every group of one partition state, found by source partition and offset.
#[derive(Debug, Default)]
pub(super) struct Groups {
    all: Vec<Option<Group>>,
    free: Vec<u32>,
    /// Per (topic, partition): group number by its first offset. Spans never overlap.
    by_first: HashMap<(u32, i32), BTreeMap<i64, u32>>,
    live: usize,
}

impl Groups {
    /// Makes a group of `offsets` (ascending, distinct, not tracked anywhere else), or gives
    /// them back when a group does not suit them: too few, too sparse, or a span that overlaps
    /// another group's.
    pub fn insert(
        &mut self,
        topic: u32,
        partition: i32,
        offsets: &[i64],
        start_offset: i64,
        deadline_ms: i64,
    ) -> Option<u32> {
        let (&first, &last) = (offsets.first()?, offsets.last()?);
        let span = usize::try_from(last.checked_sub(first)?)
            .ok()?
            .checked_add(1)?;
        if offsets.len() < MIN_RECORDS
            || span > MAX_SPAN_PER_RECORD * offsets.len() + 64
            || self.overlaps(topic, partition, first, last)
        {
            return None;
        }
        let span = u32::try_from(span).ok()?;
        let mut bits = vec![0u64; span.div_ceil(64) as usize].into_boxed_slice();
        for o in offsets {
            let i = (o - first) as usize;
            bits[i / 64] |= 1 << (i % 64);
        }
        let group = Group {
            topic,
            partition,
            first,
            start_offset,
            deadline_ms,
            bits,
            span,
            live: u32::try_from(offsets.len()).ok()?,
            cursor: 0,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.all[id as usize] = Some(group);
                id
            }
            None => {
                self.all.push(Some(group));
                u32::try_from(self.all.len() - 1).ok()?
            }
        };
        self.by_first
            .entry((topic, partition))
            .or_default()
            .insert(first, id);
        self.live += offsets.len();
        Some(id)
    }

    fn overlaps(&self, topic: u32, partition: i32, first: i64, last: i64) -> bool {
        let Some(groups) = self.by_first.get(&(topic, partition)) else {
            return false;
        };
        groups.range(..=last).next_back().is_some_and(|(_, &id)| {
            self.get(id)
                .is_some_and(|g| g.first + i64::from(g.span) > first)
        })
    }

    /// The group holding live record `offset` of (topic, partition), if any.
    pub fn find(&self, topic: u32, partition: i32, offset: i64) -> Option<Member> {
        let (_, &id) = self
            .by_first
            .get(&(topic, partition))?
            .range(..=offset)
            .next_back()?;
        let g = self.get(id)?;
        let index = u32::try_from(offset - g.first).ok()?;
        g.has(index).then_some(Member { group: id, index })
    }

    /// The group `id`, if it still exists.
    pub fn get(&self, id: u32) -> Option<&Group> {
        self.all.get(id as usize)?.as_ref()
    }

    /// Whether member `m` was already handed to the redelivery worker.
    pub fn is_dispatched(&self, m: Member) -> bool {
        self.get(m.group).is_some_and(|g| m.index < g.cursor)
    }

    /// Takes member `m` out of its group (an End, or a promotion to a slot of its own); an
    /// emptied group is dropped.
    pub fn take(&mut self, m: Member) {
        let Some(g) = self.all.get_mut(m.group as usize).and_then(Option::as_mut) else {
            return;
        };
        g.clear(m.index);
        self.live -= 1;
        if g.live == 0 {
            let key = (g.topic, g.partition);
            let first = g.first;
            self.all[m.group as usize] = None;
            self.free.push(m.group);
            if let Some(groups) = self.by_first.get_mut(&key) {
                groups.remove(&first);
                if groups.is_empty() {
                    self.by_first.remove(&key);
                }
            }
        }
    }

    /// Whether a heap entry (deadline, group `id`) still stands for waiting records.
    pub fn is_due_at(&self, id: u32, deadline_ms: i64) -> bool {
        self.get(id)
            .is_some_and(|g| g.deadline_ms == deadline_ms && g.waiting())
    }

    /// Dispatches up to `limit` waiting records of group `id`, lowest offsets first; returns
    /// their offsets, and whether records still wait.
    pub fn dispatch(&mut self, id: u32, limit: usize) -> (Vec<i64>, bool) {
        let Some(g) = self.all.get_mut(id as usize).and_then(Option::as_mut) else {
            return (Vec::new(), false);
        };
        let mut out = Vec::new();
        while out.len() < limit {
            let Some(i) = g.next_set(g.cursor) else {
                g.cursor = g.span;
                break;
            };
            out.push(g.first + i64::from(i));
            g.cursor = i + 1;
        }
        (out, g.waiting())
    }

    /// Live records over all groups.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Every group.
    pub fn iter(&self) -> impl Iterator<Item = &Group> {
        self.all.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_found_taken_and_an_empty_group_dropped() {
        let mut g = Groups::default();
        let offsets: Vec<i64> = (100..110).chain(200..205).collect();
        let id = g.insert(0, 3, &offsets, 7, 1_000).expect("a group");
        assert_eq!(g.live(), 15);
        assert!(g.find(0, 3, 150).is_none(), "a gap is not a member");
        assert!(g.find(0, 4, 100).is_none(), "another partition");
        for o in &offsets {
            let m = g.find(0, 3, *o).expect("member");
            g.take(m);
            assert!(g.find(0, 3, *o).is_none());
        }
        assert_eq!(g.live(), 0);
        assert!(g.get(id).is_none());
        assert!(g.by_first.is_empty());
    }

    #[test]
    fn overlapping_sparse_and_small_batches_are_refused() {
        let mut g = Groups::default();
        let run = |a: i64, b: i64| (a..b).collect::<Vec<_>>();
        assert!(g.insert(0, 0, &run(10, 20), 0, 0).is_some());
        assert!(g.insert(0, 0, &run(15, 30), 1, 0).is_none(), "overlap");
        assert!(
            g.insert(0, 0, &[0, 5, 25], 1, 0).is_none(),
            "overlap and small"
        );
        assert!(
            g.insert(0, 0, &run(20, 30), 1, 0).is_some(),
            "adjacent is fine"
        );
        assert!(g.insert(0, 1, &run(0, 3), 1, 0).is_none(), "too few");
        assert!(
            g.insert(0, 1, &[0, 1, 2, 1_000_000], 1, 0).is_none(),
            "too sparse"
        );
        assert!(
            g.insert(1, 0, &run(10, 20), 1, 0).is_some(),
            "another topic"
        );
    }

    #[test]
    fn dispatch_moves_a_cursor_and_respects_its_limit() {
        let mut g = Groups::default();
        let offsets: Vec<i64> = (0..130).collect();
        let id = g.insert(0, 0, &offsets, 0, 500).expect("a group");
        g.take(g.find(0, 0, 1).expect("member"));
        assert!(g.is_due_at(id, 500));
        assert!(!g.is_due_at(id, 499));
        let (first, more) = g.dispatch(id, 3);
        assert_eq!((first, more), (vec![0, 2, 3], true));
        assert!(g.is_dispatched(g.find(0, 0, 3).expect("member")));
        assert!(!g.is_dispatched(g.find(0, 0, 4).expect("member")));
        let (rest, more) = g.dispatch(id, usize::MAX);
        assert_eq!(rest.len(), 126);
        assert!(!more);
        assert!(!g.is_due_at(id, 500), "nothing waits any more");
        assert_eq!(g.live(), 129, "dispatched records stay until their End");
        let records: Vec<_> = g.get(id).expect("group").records().take(2).collect();
        assert_eq!(records, vec![(0, true), (2, true)]);
    }
}

//! The deadline heap of one partition state, in two parts: entries not yet *announced*, and
//! entries announced for reading ahead.
//!
//! Reading ahead (`redeliver/read_ahead.rs`) fetches the records that fall due in the next
//! few tens of milliseconds while their deliveries are still in flight, so that a redelivery
//! pass only has to produce the copies. To list those records without scanning the whole heap,
//! [`Deadlines::announce`] pops the entries due by a given time off the main heap, soonest
//! first, and keeps them in a second, small heap of their own. Both heaps together are the
//! deadline heap: peeking and popping take the sooner of their two tops, so what is due, and
//! when, is exactly what it would be with one heap. An entry is announced at most once; it goes
//! stale in either heap the same way (a keep-alive, a settlement), and is skipped when popped.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A (deadline in partition time, slot or group number) pair.
pub(super) type Entry = (i64, u32);

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct Deadlines {
    main: BinaryHeap<Reverse<Entry>>,
    announced: BinaryHeap<Reverse<Entry>>,
}

impl Deadlines {
    pub(super) fn push(&mut self, entry: Entry) {
        self.main.push(Reverse(entry));
    }

    /// Adds an entry as already announced: its record is not listed for reading ahead again
    /// (a delivery the tracker holds back and looks at again, `PartitionState::hold`).
    pub(super) fn push_announced(&mut self, entry: Entry) {
        self.announced.push(Reverse(entry));
    }

    /// The soonest entry of both heaps.
    pub(super) fn peek(&self) -> Option<Entry> {
        match (self.main.peek(), self.announced.peek()) {
            (Some(Reverse(m)), Some(Reverse(a))) => Some(*m.min(a)),
            (Some(Reverse(e)), None) | (None, Some(Reverse(e))) => Some(*e),
            (None, None) => None,
        }
    }

    /// Removes the soonest entry of both heaps.
    pub(super) fn pop(&mut self) -> Option<Entry> {
        let from_main = match (self.main.peek(), self.announced.peek()) {
            (Some(Reverse(m)), Some(Reverse(a))) => m <= a,
            (Some(_), None) => true,
            (None, _) => false,
        };
        let heap = if from_main {
            &mut self.main
        } else {
            &mut self.announced
        };
        heap.pop().map(|Reverse(e)| e)
    }

    /// The soonest entry not yet announced.
    pub(super) fn peek_unannounced(&self) -> Option<Entry> {
        self.main.peek().map(|Reverse(e)| *e)
    }

    /// Moves the soonest unannounced entry to the announced ones and returns it.
    pub(super) fn announce_next(&mut self) -> Option<Entry> {
        let Reverse(e) = self.main.pop()?;
        self.announced.push(Reverse(e));
        Some(e)
    }

    /// Drops the soonest unannounced entry (a stale one).
    pub(super) fn drop_unannounced(&mut self) {
        self.main.pop();
    }

    pub(super) fn len(&self) -> usize {
        self.main.len() + self.announced.len()
    }

    /// Every entry, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.main
            .iter()
            .chain(self.announced.iter())
            .map(|Reverse(e)| e)
    }

    /// Keeps only the entries `live` accepts, once each (an entry announced and pushed again,
    /// which a reused slot can do, stays only among the announced).
    pub(super) fn sweep(&mut self, mut live: impl FnMut(&Entry) -> bool) {
        let mut announced: Vec<_> = std::mem::take(&mut self.announced).into_vec();
        announced.retain(|Reverse(e)| live(e));
        announced.sort_unstable();
        announced.dedup();
        let mut main: Vec<_> = std::mem::take(&mut self.main).into_vec();
        main.retain(|r| live(&r.0) && announced.binary_search(r).is_err());
        main.sort_unstable();
        main.dedup();
        self.main = BinaryHeap::from(main);
        self.announced = BinaryHeap::from(announced);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_and_pop_take_the_sooner_of_both_parts() {
        let mut d = Deadlines::default();
        for e in [(30, 1), (10, 2), (20, 3), (40, 4)] {
            d.push(e);
        }
        assert_eq!(d.announce_next(), Some((10, 2)));
        assert_eq!(d.announce_next(), Some((20, 3)));
        d.push((15, 5));
        assert_eq!(d.peek_unannounced(), Some((15, 5)));
        let mut order = Vec::new();
        while let Some(e) = d.pop() {
            order.push(e);
        }
        assert_eq!(order, vec![(10, 2), (15, 5), (20, 3), (30, 1), (40, 4)]);
    }

    #[test]
    fn a_sweep_keeps_live_entries_of_both_parts_once() {
        let mut d = Deadlines::default();
        for e in [(10, 1), (10, 1), (20, 2), (30, 3)] {
            d.push(e);
        }
        d.announce_next();
        d.sweep(|&(_, i)| i != 2);
        assert_eq!(d.len(), 2);
        assert_eq!(d.pop(), Some((10, 1)));
        assert_eq!(d.pop(), Some((30, 3)));
        assert_eq!(d.pop(), None);
    }
}

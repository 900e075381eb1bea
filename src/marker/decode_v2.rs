//! Bytes to marker for format version 2. Like version 1, total: every input gives a marker or a
//! typed error, and no count read from the input reserves memory before the data behind it is
//! read (a lying count runs out of bytes first).

use super::decode::{invalid, Reader};
use super::{DecodeError, Marker, MarkerType, Offsets, Settle, StartBatch, MAX_BATCH_RECORDS};

/// Reads the fields of a version 2 marker of type `kind`, after the two header bytes.
pub(super) fn fields(r: &mut Reader<'_>, kind: MarkerType) -> Result<Marker, DecodeError> {
    let (topic, partition) = r.source_partition()?;
    let mut budget = MAX_BATCH_RECORDS;
    if kind == MarkerType::StartBatch {
        let timeout_ms = r.u32("timeout_ms")?;
        let offsets = r.offsets("offsets", &mut budget)?;
        if offsets.is_empty() {
            return Err(invalid("offsets", "none"));
        }
        let attempts = r.exceptions("attempts", &offsets, |v| {
            u32::try_from(v).ok().filter(|a| *a >= 2)
        })?;
        let timeouts = r.exceptions("timeouts", &offsets, |v| u32::try_from(v).ok())?;
        return Ok(Marker::StartBatch(Box::new(StartBatch {
            topic,
            partition,
            timeout_ms,
            offsets,
            attempts,
            timeouts,
        })));
    }
    let mut settle = Settle::new(topic, partition);
    let keep = r.offsets("keep_alives", &mut budget)?;
    for offset in keep.iter() {
        let timeout = r.varint("keep_alive_timeout_ms")?;
        let timeout =
            u32::try_from(timeout).map_err(|_| invalid("keep_alive_timeout_ms", timeout))?;
        settle.keep_alives.push((offset, timeout));
    }
    let nacks = r.offsets("nacks", &mut budget)?;
    for offset in nacks.iter() {
        settle.nacks.push((offset, r.varint("nack_delay_ms")?));
    }
    let rejects = r.offsets("rejects", &mut budget)?;
    for offset in rejects.iter() {
        settle.rejects.push((offset, r.string("reject_reason")?));
    }
    settle.ends = r.offsets("ends", &mut budget)?;
    if settle.is_empty() {
        return Err(invalid("settle", "no records"));
    }
    Ok(Marker::Settle(Box::new(settle)))
}

impl Reader<'_> {
    /// An unsigned LEB128 integer: seven bits per byte, least significant group first, the high
    /// bit set on every byte but the last. At most ten bytes, and in its shortest form.
    pub(crate) fn varint(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let mut value: u64 = 0;
        for i in 0..10 {
            let byte = self.u8(field)?;
            let bits = u64::from(byte & 0x7f);
            if i == 9 && byte > 1 {
                return Err(invalid(field, "varint beyond 64 bits"));
            }
            value |= bits << (7 * i);
            if byte & 0x80 == 0 {
                if i > 0 && byte == 0 {
                    return Err(invalid(field, "varint not in its shortest form"));
                }
                return Ok(value);
            }
        }
        Err(invalid(field, "varint longer than 10 bytes"))
    }

    /// A topic (not empty) and a partition (not negative): the start of every source. The
    /// topic comes as a `String` or a shared `Arc<str>`, copied once out of the marker.
    pub(super) fn source_partition<T: for<'s> From<&'s str>>(
        &mut self,
    ) -> Result<(T, i32), DecodeError> {
        let topic = self.text("topic")?;
        if topic.is_empty() {
            return Err(invalid("topic", "\"\""));
        }
        let partition = self.i32("partition")?;
        if partition < 0 {
            return Err(invalid("partition", partition));
        }
        Ok((topic.into(), partition))
    }

    /// A set of offsets: the number of runs, then the first offset and the first run's length,
    /// then for each further run the gap before it (at least 1) and its length (at least 1).
    /// Counts against `budget`, the records a marker may still name.
    fn offsets(&mut self, field: &'static str, budget: &mut usize) -> Result<Offsets, DecodeError> {
        let count = self.varint(field)?;
        if count == 0 {
            return Ok(Offsets::new());
        }
        if count > *budget as u64 {
            return Err(invalid(field, format!("{count} runs")));
        }
        let mut runs = Vec::new();
        let mut total: usize = 0;
        let mut next: i64 = 0;
        for i in 0..count {
            let skip = self.varint(field)?;
            if i > 0 && skip == 0 {
                return Err(invalid(field, "runs not separated"));
            }
            let len = self.varint(field)?;
            if len == 0 {
                return Err(invalid(field, "empty run"));
            }
            total = total.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
            if total > *budget {
                return Err(invalid(field, "more records than a marker may name"));
            }
            // Offsets stay within i64: first + len - 1 <= i64::MAX.
            let first = i64::try_from(skip)
                .ok()
                .and_then(|s| next.checked_add(s))
                .ok_or_else(|| invalid(field, "offset beyond i64"))?;
            let last = i64::try_from(len - 1)
                .ok()
                .and_then(|l| first.checked_add(l))
                .ok_or_else(|| invalid(field, "offset beyond i64"))?;
            runs.push((first, len));
            next = last.saturating_add(1);
        }
        *budget -= total;
        Ok(Offsets::from_runs(runs, total))
    }

    /// Per-offset exceptions to a batch default: a count, then `(offset delta, value)` pairs.
    /// The first delta counts from the batch's first offset, each later one from the previous
    /// entry (at least 1). Each entry must name an offset of `batch`; `check` accepts a value.
    fn exceptions<T>(
        &mut self,
        field: &'static str,
        batch: &Offsets,
        check: impl Fn(u64) -> Option<T>,
    ) -> Result<Vec<(i64, T)>, DecodeError> {
        let count = self.varint(field)?;
        if count > batch.len() as u64 {
            return Err(invalid(field, format!("{count} entries")));
        }
        let mut out = Vec::new();
        let mut at = batch.runs().first().map_or(0, |r| r.0);
        for i in 0..count {
            let delta = self.varint(field)?;
            if i > 0 && delta == 0 {
                return Err(invalid(field, "entries not ascending"));
            }
            at = i64::try_from(delta)
                .ok()
                .and_then(|d| at.checked_add(d))
                .filter(|o| batch.contains(*o))
                .ok_or_else(|| invalid(field, "offset not in the batch"))?;
            let raw = self.varint(field)?;
            let value = check(raw).ok_or_else(|| invalid(field, raw))?;
            out.push((at, value));
        }
        Ok(out)
    }
}

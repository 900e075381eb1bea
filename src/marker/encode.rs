//! Marker to bytes. See `docs/markers.md` for the layout.

use super::{Marker, Offsets, ScheduledRecord, Settle, SourceRef, StartBatch, MAX_REASON_BYTES};

/// Encodes a marker into its wire form.
///
/// Encoding cannot fail for markers this crate builds: topic names are at most 249 bytes (Kafka's
/// limit), and reasons longer than [`MAX_REASON_BYTES`] are cut at a character boundary.
///
/// ```
/// use kafka_redelivery::marker::{decode, encode, Marker, SourceRef};
/// let m = Marker::End { source: SourceRef::new("orders", 3, 42) };
/// assert_eq!(decode(&encode(&m)).unwrap(), m);
/// ```
pub fn encode(marker: &Marker) -> Vec<u8> {
    let mut out = Vec::with_capacity(match marker {
        Marker::Schedule { record, .. } => 64 + record.payload.as_ref().map_or(0, Vec::len),
        _ => 32,
    });
    let (version, type_byte) = marker.marker_type().wire();
    out.push(version);
    out.push(type_byte);
    match marker {
        Marker::StartBatch(b) => put_start_batch(&mut out, b),
        Marker::Settle(s) => put_settle(&mut out, s),
        Marker::Start {
            source,
            timeout_ms,
            attempt,
        } => {
            put_source(&mut out, source);
            out.extend_from_slice(&timeout_ms.to_be_bytes());
            out.extend_from_slice(&attempt.to_be_bytes());
        }
        Marker::KeepAlive { source, timeout_ms } => {
            put_source(&mut out, source);
            out.extend_from_slice(&timeout_ms.to_be_bytes());
        }
        Marker::End { source } => put_source(&mut out, source),
        Marker::Nack { source, delay_ms } => {
            put_source(&mut out, source);
            out.extend_from_slice(&delay_ms.to_be_bytes());
        }
        Marker::Reject { source, reason } => {
            put_source(&mut out, source);
            put_str(&mut out, truncate(reason, MAX_REASON_BYTES));
        }
        Marker::Schedule {
            not_before_ms,
            delay_ms,
            record,
        } => {
            out.extend_from_slice(&not_before_ms.to_be_bytes());
            out.extend_from_slice(&delay_ms.to_be_bytes());
            put_record(&mut out, record);
        }
        Marker::Tick { nonce } => out.extend_from_slice(&nonce.to_be_bytes()),
    }
    out
}

/// Version 2 Start. Writers keep a batch within [`super::MAX_BATCH_RECORDS`] records (the client
/// splits larger ones); exceptions must name offsets of the batch, ascending.
fn put_start_batch(out: &mut Vec<u8>, b: &StartBatch) {
    put_str(out, truncate(&b.topic, u16::MAX as usize));
    out.extend_from_slice(&b.partition.to_be_bytes());
    out.extend_from_slice(&b.timeout_ms.to_be_bytes());
    put_offsets(out, &b.offsets);
    let first = b.offsets.runs().first().map_or(0, |r| r.0);
    for list in [&b.attempts, &b.timeouts] {
        let mut list = canonical(list);
        list.retain(|(offset, _)| b.offsets.contains(*offset));
        put_varint(out, list.len() as u64);
        let mut at = first;
        for (offset, value) in list {
            put_varint(out, offset.saturating_sub(at).max(0) as u64);
            put_varint(out, u64::from(value));
            at = offset;
        }
    }
}

/// Version 2 settlement: keep-alives, nacks, rejects, ends, each an offset set followed by
/// one value per offset (none for ends).
fn put_settle(out: &mut Vec<u8>, s: &Settle) {
    put_str(out, truncate(&s.topic, u16::MAX as usize));
    out.extend_from_slice(&s.partition.to_be_bytes());
    let keep_alives = canonical(&s.keep_alives);
    put_offsets(out, &Offsets::collect(keep_alives.iter().map(|e| e.0)));
    for (_, timeout) in keep_alives {
        put_varint(out, u64::from(timeout));
    }
    let nacks = canonical(&s.nacks);
    put_offsets(out, &Offsets::collect(nacks.iter().map(|e| e.0)));
    for (_, delay) in nacks {
        put_varint(out, delay);
    }
    let rejects = canonical(&s.rejects);
    put_offsets(out, &Offsets::collect(rejects.iter().map(|e| e.0)));
    for (_, reason) in &rejects {
        put_str(out, truncate(reason, MAX_REASON_BYTES));
    }
    put_offsets(out, &s.ends);
}

/// `(offset, value)` entries ascending by offset, one per offset (the last one given wins, as
/// the later of two version 1 markers would), negative offsets dropped.
fn canonical<T: Clone>(list: &[(i64, T)]) -> Vec<(i64, T)> {
    let mut out: Vec<(i64, T)> = list.iter().filter(|e| e.0 >= 0).cloned().collect();
    out.reverse();
    out.sort_by_key(|e| e.0); // stable: the last given comes first among equals
    out.dedup_by_key(|e| e.0);
    out
}

/// The number of runs, then per run the offsets skipped since the previous run's end (since
/// offset 0 for the first run) and the run's length.
fn put_offsets(out: &mut Vec<u8>, offsets: &Offsets) {
    put_varint(out, offsets.runs().len() as u64);
    let mut next = 0i64;
    for &(first, count) in offsets.runs() {
        put_varint(out, (first - next) as u64);
        put_varint(out, count);
        next = first + count as i64;
    }
}

/// Unsigned LEB128: seven bits per byte, least significant first, high bit = more follows.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_source(out: &mut Vec<u8>, source: &SourceRef) {
    put_str(out, truncate(&source.topic, u16::MAX as usize));
    out.extend_from_slice(&source.partition.to_be_bytes());
    out.extend_from_slice(&source.offset.to_be_bytes());
}

fn put_record(out: &mut Vec<u8>, record: &ScheduledRecord) {
    put_str(out, truncate(&record.topic, u16::MAX as usize));
    out.extend_from_slice(&record.partition.unwrap_or(-1).to_be_bytes());
    put_bytes(out, record.key.as_deref());
    put_bytes(out, record.payload.as_deref());
    // Callers check the count (see `client::Scheduler`); more than 65535 headers are cut.
    let count = record.headers.len().min(u16::MAX as usize);
    out.extend_from_slice(&(count as u16).to_be_bytes());
    for (name, value) in &record.headers[..count] {
        // The format carries names as text; `client::Scheduler` refuses any other name.
        put_str(out, truncate(&name.to_string_lossy(), u16::MAX as usize));
        put_bytes(out, value.as_deref());
    }
}

/// An `i32` length (-1 for none) and the bytes. Kafka records are far below 2 GiB; the
/// scheduler refuses anything larger before it gets here.
fn put_bytes(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        Some(b) => {
            let len = b.len().min(i32::MAX as usize);
            out.extend_from_slice(&(len as i32).to_be_bytes());
            out.extend_from_slice(&b[..len]);
        }
    }
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    // `truncate` has already bounded the length, so the cast cannot lose bits.
    let len = s.len().min(u16::MAX as usize) as u16;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&s.as_bytes()[..len as usize]);
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

//! Marker to bytes. See `docs/markers.md` for the layout.

use super::{Marker, ScheduledRecord, SourceRef, MAX_REASON_BYTES, VERSION};

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
    out.push(VERSION);
    out.push(marker.marker_type() as u8);
    match marker {
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

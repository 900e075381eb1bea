//! A record's key and payload, copied out of librdkafka's buffer into chunks shared by the
//! records of one poll batch.
//!
//! The poll thread copies every record it hands out, and the application drops the delivery
//! on another thread. An allocation made on one thread and freed on another never comes back
//! through either thread's cache, so each one takes glibc's slow path both ways (about 540
//! instructions a record to allocate and copy in the client's profile; BENCHMARKS.md, "Bodies
//! in shared chunks"). So the bodies of a poll batch are copied one after another into a
//! scratch buffer, and each [`CHUNK_BYTES`] of them become one shared allocation: a record
//! then costs a copy and a reference count, not an allocation and a free.
//!
//! The price is memory held: a chunk is freed when the last delivery in it is dropped, so one
//! delivery kept for long keeps its neighbours' bytes too, at most [`CHUNK_BYTES`] (or its
//! own size, if larger) per delivery kept.

use std::sync::Arc;

/// Bytes of bodies gathered into one shared chunk before another is started. Small enough
/// that a delivery kept for long holds little beside itself; large enough that the
/// allocation is shared by a few hundred 100-byte records.
pub(crate) const CHUNK_BYTES: usize = 32 * 1024;

/// A scratch buffer that grew past this for one huge record is given back after the batch.
const SCRATCH_KEEP: usize = 4 * CHUNK_BYTES;

/// A key and a payload, each present or not, in a chunk shared with other records.
pub(crate) struct Body {
    /// `None` while its batch is still being polled ([`Chunks::seal`] fills it in); may stay
    /// `None` for a record with neither key bytes nor payload bytes.
    chunk: Option<Arc<[u8]>>,
    /// Which chunk of its batch, until the batch is sealed.
    chunk_no: usize,
    start: usize,
    /// Length of the key at `start`; `None` for a record without a key.
    key_len: Option<usize>,
    /// Length of the payload after the key; `None` for a tombstone.
    payload_len: Option<usize>,
}

impl Body {
    /// A body in a chunk of its own, for tests that build deliveries one at a time.
    #[cfg(test)]
    pub(crate) fn new(key: Option<&[u8]>, payload: Option<&[u8]>) -> Self {
        let mut chunks = Chunks::default();
        let mut body = chunks.add(key, payload);
        chunks.seal(std::iter::once(&mut body));
        body
    }

    /// The record key, if it has one.
    pub(crate) fn key(&self) -> Option<&[u8]> {
        let len = self.key_len?;
        Some(self.bytes(self.start, len))
    }

    /// The record value, if it has one.
    pub(crate) fn payload(&self) -> Option<&[u8]> {
        let len = self.payload_len?;
        Some(self.bytes(self.start + self.key_len.unwrap_or(0), len))
    }

    fn bytes(&self, from: usize, len: usize) -> &[u8] {
        // `len` is zero whenever the chunk is missing; `get` keeps a bug here from panicking.
        self.chunk
            .as_deref()
            .and_then(|c| c.get(from..from + len))
            .unwrap_or_default()
    }
}

/// Copies the bodies of one poll batch into shared chunks: [`add`](Self::add) each record,
/// then [`seal`](Self::seal) the batch before its bodies are read.
#[derive(Default)]
pub(crate) struct Chunks {
    scratch: Vec<u8>,
    sealed: Vec<Arc<[u8]>>,
}

impl Chunks {
    /// Copies a record's key and payload; the body reads nothing until sealed.
    pub(crate) fn add(&mut self, key: Option<&[u8]>, payload: Option<&[u8]>) -> Body {
        let key_len = key.map(<[u8]>::len);
        let payload_len = payload.map(<[u8]>::len);
        let size = key_len.unwrap_or(0) + payload_len.unwrap_or(0);
        if !self.scratch.is_empty() && self.scratch.len() + size > CHUNK_BYTES {
            self.close_chunk();
        }
        let start = self.scratch.len();
        self.scratch.extend_from_slice(key.unwrap_or_default());
        self.scratch.extend_from_slice(payload.unwrap_or_default());
        Body {
            chunk: None,
            chunk_no: self.sealed.len(),
            start,
            key_len,
            payload_len,
        }
    }

    /// Makes the bytes added so far shared chunks and gives each of `bodies` (those added
    /// since the last seal, in any order, any of them left out) its chunk.
    pub(crate) fn seal<'a>(&mut self, bodies: impl IntoIterator<Item = &'a mut Body>) {
        if !self.scratch.is_empty() {
            self.close_chunk();
        }
        for body in bodies {
            if body.chunk.is_none() {
                body.chunk = self.sealed.get(body.chunk_no).cloned();
            }
        }
        self.sealed.clear();
        if self.scratch.capacity() > SCRATCH_KEEP {
            self.scratch = Vec::new();
        }
    }

    /// One allocation of exactly the bytes gathered; the scratch buffer is kept for the next.
    /// This copies each byte a second time (a few instructions a record), so that a chunk is
    /// no larger than its bytes: a batch of one small record must not hold 32 KiB.
    fn close_chunk(&mut self) {
        self.sealed.push(Arc::from(&self.scratch[..]));
        self.scratch.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Bytes<'a> = Option<&'a [u8]>;

    const ODD_CASES: [(Bytes, Bytes); 7] = [
        (Some(b"key"), Some(b"payload")),
        (None, Some(b"payload")),
        (Some(b"key"), None),
        (None, None),
        (Some(b""), Some(b"")),
        (Some(b""), None),
        (None, Some(b"")),
    ];

    #[test]
    fn key_and_payload_come_back_as_given_whichever_is_missing_or_empty() {
        for (key, payload) in ODD_CASES {
            let body = Body::new(key, payload);
            assert_eq!(body.key(), key, "key of {key:?} / {payload:?}");
            assert_eq!(body.payload(), payload, "payload of {key:?} / {payload:?}");
        }
    }

    #[test]
    fn bytes_that_are_not_text_are_carried_as_they_are() {
        let key = [0xff, 0x00, 0xc3];
        let payload = [0x00, 0xfe, 0xff, 0x80];
        let body = Body::new(Some(&key), Some(&payload));
        assert_eq!(body.key(), Some(&key[..]));
        assert_eq!(body.payload(), Some(&payload[..]));
    }

    /// A batch of many records, of odd and large sizes, spread over several chunks and sealed
    /// in two rounds with bodies dropped in between: each reads back exactly its own bytes,
    /// no chunk is larger than the limit unless one record is, and a dropped body's neighbours
    /// are unharmed.
    #[test]
    fn every_body_of_a_batch_reads_back_its_own_bytes_across_chunks() {
        let record = |i: usize| -> (Vec<u8>, Vec<u8>) {
            let size = match i % 5 {
                0 => 0,
                1 => 7,
                2 => 1_000,
                3 => 9_000,
                _ => CHUNK_BYTES + 11,
            };
            (
                format!("k{i}").into_bytes(),
                (0..size).map(|b| (b * 31 + i) as u8).collect(),
            )
        };
        let mut chunks = Chunks::default();
        for round in 0..2 {
            let records: Vec<_> = (0..40).map(|i| record(i + round * 40)).collect();
            let mut bodies: Vec<Body> = records
                .iter()
                .map(|(k, p)| chunks.add(Some(k), Some(p)))
                .collect();
            bodies.extend(ODD_CASES.iter().map(|(k, p)| chunks.add(*k, *p)));
            // Sealed in reverse order: the order of bodies does not matter.
            chunks.seal(bodies.iter_mut().rev());
            let odd = bodies.split_off(records.len());
            for (body, (key, payload)) in odd.iter().zip(ODD_CASES) {
                assert_eq!((body.key(), body.payload()), (key, payload));
            }
            // Drop every other body; the rest still read their own bytes.
            let kept: Vec<_> = bodies
                .into_iter()
                .enumerate()
                .filter(|(i, _)| i % 2 == 0)
                .collect();
            for (i, body) in &kept {
                let (key, payload) = &records[*i];
                assert_eq!(body.key(), Some(&key[..]), "key of record {i}");
                assert_eq!(body.payload(), Some(&payload[..]), "payload of record {i}");
                let chunk = body.chunk.as_ref().expect("sealed");
                assert!(
                    chunk.len() <= CHUNK_BYTES.max(key.len() + payload.len()),
                    "chunk of {} bytes",
                    chunk.len()
                );
            }
        }
    }

    #[test]
    fn a_huge_record_does_not_keep_its_scratch_buffer() {
        let mut chunks = Chunks::default();
        let huge = vec![7u8; SCRATCH_KEEP * 2];
        let mut body = chunks.add(None, Some(&huge));
        chunks.seal([&mut body]);
        assert_eq!(body.payload(), Some(&huge[..]));
        assert!(chunks.scratch.capacity() <= SCRATCH_KEEP);
    }
}

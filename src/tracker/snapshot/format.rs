//! The snapshot format: a partition state as a few Kafka records.
//!
//! A snapshot lets a restarted tracker skip replaying markers whose effect it already holds
//! (see ARCHITECTURE.md, "Bounded replay"). It is cut into chunks of at most
//! [`CHUNK_ENTRIES`] entries, each a self-contained record under 1 MB, the broker's default
//! record limit. Every chunk repeats the header (markers partition, epoch, the markers offset
//! the snapshot covers, its index and the chunk count), so a reader can tell a complete
//! snapshot from chunks of another one. Integers are big-endian, strings are a `u16` length
//! and UTF-8, as in the marker format.
//!
//! Decoding is total: any bytes give a chunk or a [`SnapshotError`].

use crate::marker::{put_str, Reader};

use crate::tracker::core::state::{EntryKind, Exported, ExportedEntry};

/// The only format version written.
pub const FORMAT: u8 = 1;
/// Entries per chunk: 38 bytes each plus a short reason, well under 1 MB.
pub const CHUNK_ENTRIES: usize = 20_000;
/// Most age samples kept in a snapshot; more are thinned evenly (ages stay within a few
/// seconds of the truth for what is pending a day).
pub const MAX_SAMPLES: usize = 4096;

/// What a snapshot chunk says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// The markers partition the state belongs to.
    pub markers_partition: i32,
    /// Which snapshot of that partition: grows by one per snapshot.
    pub epoch: u64,
    /// Every marker before this offset is reflected in the state; replay resumes here.
    pub covers_until: i64,
    /// This chunk's place, from 0.
    pub index: u32,
    /// Chunks in the snapshot.
    pub count: u32,
}

/// One decoded chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Its header.
    pub header: ChunkHeader,
    /// The topic table (the same in every chunk).
    pub topics: Vec<String>,
    /// Age samples (only in chunk 0).
    pub time_samples: Vec<(i64, i64)>,
    /// Its share of the entries.
    pub entries: Vec<ExportedEntry>,
}

/// Why snapshot bytes could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The bytes are not a chunk this version can read.
    #[error("unreadable snapshot chunk: {0}")]
    Unreadable(String),
    /// The chunks do not make up one whole snapshot.
    #[error("incomplete snapshot: {0}")]
    Incomplete(String),
}

fn unreadable(e: impl std::fmt::Display) -> SnapshotError {
    SnapshotError::Unreadable(e.to_string())
}

/// Cuts `state` into encoded chunks (at least one, even for an empty state).
pub fn encode(
    markers_partition: i32,
    epoch: u64,
    covers_until: i64,
    state: &Exported,
) -> Vec<Vec<u8>> {
    let pieces: Vec<&[ExportedEntry]> = if state.entries.is_empty() {
        vec![&[]]
    } else {
        state.entries.chunks(CHUNK_ENTRIES).collect()
    };
    let samples = thin(&state.time_samples, MAX_SAMPLES);
    let count = pieces.len() as u32;
    pieces
        .into_iter()
        .enumerate()
        .map(|(i, entries)| {
            let header = ChunkHeader {
                markers_partition,
                epoch,
                covers_until,
                index: i as u32,
                count,
            };
            let samples = if i == 0 { &samples[..] } else { &[] };
            encode_chunk(&header, &state.topics, samples, entries)
        })
        .collect()
}

fn encode_chunk(
    h: &ChunkHeader,
    topics: &[String],
    samples: &[(i64, i64)],
    entries: &[ExportedEntry],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + entries.len() * 40);
    out.push(FORMAT);
    out.extend_from_slice(&h.markers_partition.to_be_bytes());
    out.extend_from_slice(&h.epoch.to_be_bytes());
    out.extend_from_slice(&h.covers_until.to_be_bytes());
    out.extend_from_slice(&h.index.to_be_bytes());
    out.extend_from_slice(&h.count.to_be_bytes());
    out.extend_from_slice(&(topics.len() as u32).to_be_bytes());
    for t in topics {
        put_str(&mut out, t);
    }
    out.extend_from_slice(&(samples.len() as u32).to_be_bytes());
    for (offset, ts) in samples {
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&ts.to_be_bytes());
    }
    out.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for e in entries {
        out.extend_from_slice(&e.topic.to_be_bytes());
        out.extend_from_slice(&e.partition.to_be_bytes());
        out.extend_from_slice(&e.offset.to_be_bytes());
        out.extend_from_slice(&e.deadline_ms.to_be_bytes());
        out.extend_from_slice(&e.start_offset.to_be_bytes());
        out.extend_from_slice(&e.attempt.to_be_bytes());
        out.push(e.kind as u8);
        match &e.reason {
            None => out.push(0),
            Some(r) => {
                out.push(1);
                put_str(&mut out, r);
            }
        }
    }
    out
}

/// Decodes one chunk.
pub fn decode_chunk(bytes: &[u8]) -> Result<Chunk, SnapshotError> {
    let mut r = Reader::new(bytes);
    let format = r.u8("format").map_err(unreadable)?;
    if format != FORMAT {
        return Err(unreadable(format!("format {format}")));
    }
    let header = ChunkHeader {
        markers_partition: r.i32("markers_partition").map_err(unreadable)?,
        epoch: r.u64("epoch").map_err(unreadable)?,
        covers_until: r.i64("covers_until").map_err(unreadable)?,
        index: r.u32("index").map_err(unreadable)?,
        count: r.u32("count").map_err(unreadable)?,
    };
    if header.index >= header.count {
        return Err(unreadable(format!(
            "chunk {} of {}",
            header.index, header.count
        )));
    }
    // Counts are checked against what is left, so a lying count cannot reserve memory.
    let topics_n = r.u32("topics").map_err(unreadable)? as usize;
    let mut topics = Vec::with_capacity(topics_n.min(r.remaining() / 2));
    for _ in 0..topics_n {
        topics.push(r.string("topic").map_err(unreadable)?);
    }
    let samples_n = r.u32("samples").map_err(unreadable)? as usize;
    let mut time_samples = Vec::with_capacity(samples_n.min(r.remaining() / 16));
    for _ in 0..samples_n {
        let offset = r.i64("sample_offset").map_err(unreadable)?;
        time_samples.push((offset, r.i64("sample_ts").map_err(unreadable)?));
    }
    let entries_n = r.u32("entries").map_err(unreadable)? as usize;
    let mut entries = Vec::with_capacity(entries_n.min(r.remaining() / 38));
    for _ in 0..entries_n {
        entries.push(decode_entry(&mut r)?);
    }
    if r.remaining() > 0 {
        return Err(unreadable(format!("{} trailing bytes", r.remaining())));
    }
    Ok(Chunk {
        header,
        topics,
        time_samples,
        entries,
    })
}

fn decode_entry(r: &mut Reader<'_>) -> Result<ExportedEntry, SnapshotError> {
    let topic = r.u32("entry_topic").map_err(unreadable)?;
    let partition = r.i32("entry_partition").map_err(unreadable)?;
    let offset = r.i64("entry_offset").map_err(unreadable)?;
    let deadline_ms = r.i64("entry_deadline").map_err(unreadable)?;
    let start_offset = r.i64("entry_start").map_err(unreadable)?;
    let attempt = r.u32("entry_attempt").map_err(unreadable)?;
    let kind_byte = r.u8("entry_kind").map_err(unreadable)?;
    let kind = EntryKind::from_byte(kind_byte)
        .ok_or_else(|| unreadable(format!("entry kind {kind_byte}")))?;
    let reason = match r.u8("entry_reason_flag").map_err(unreadable)? {
        0 => None,
        1 => Some(r.string("entry_reason").map_err(unreadable)?),
        other => return Err(unreadable(format!("reason flag {other}"))),
    };
    Ok(ExportedEntry {
        topic,
        partition,
        offset,
        deadline_ms,
        start_offset,
        attempt,
        kind,
        reason,
    })
}

/// Puts the chunks of snapshot `epoch` of `markers_partition` back together. Chunks of other
/// snapshots are ignored; a missing chunk is an error.
pub fn assemble(
    markers_partition: i32,
    epoch: u64,
    chunks: Vec<Chunk>,
) -> Result<(ChunkHeader, Exported), SnapshotError> {
    let mut mine: Vec<Chunk> = chunks
        .into_iter()
        .filter(|c| c.header.markers_partition == markers_partition && c.header.epoch == epoch)
        .collect();
    mine.sort_by_key(|c| c.header.index);
    mine.dedup_by_key(|c| c.header.index);
    let Some(first) = mine.first() else {
        return Err(SnapshotError::Incomplete(format!(
            "no chunk of epoch {epoch}"
        )));
    };
    let header = first.header;
    let complete = mine.len() == header.count as usize
        && mine.iter().enumerate().all(|(i, c)| {
            c.header.index == i as u32
                && c.header.count == header.count
                && c.header.covers_until == header.covers_until
        });
    if !complete {
        return Err(SnapshotError::Incomplete(format!(
            "{} of {} chunks of epoch {epoch}",
            mine.len(),
            header.count
        )));
    }
    let mut out = Exported::default();
    for c in mine {
        if c.header.index == 0 {
            out.topics = c.topics;
            out.time_samples = c.time_samples;
        }
        out.entries.extend(c.entries);
    }
    Ok((header, out))
}

/// At most `max` samples, evenly spread, keeping the first (the oldest still needed).
fn thin(samples: &[(i64, i64)], max: usize) -> Vec<(i64, i64)> {
    if samples.len() <= max {
        return samples.to_vec();
    }
    let step = samples.len().div_ceil(max);
    samples.iter().step_by(step).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(i: i64) -> ExportedEntry {
        ExportedEntry {
            topic: (i % 2) as u32,
            partition: 3,
            offset: i,
            deadline_ms: 1_000 + i,
            start_offset: 10 + i,
            attempt: 1,
            kind: if i % 7 == 0 {
                EntryKind::Scheduled
            } else {
                EntryKind::Waiting
            },
            reason: (i % 5 == 0).then(|| format!("r{i}")),
        }
    }

    fn state(n: i64) -> Exported {
        Exported {
            topics: vec!["a".into(), "b".into()],
            entries: (0..n).map(entry).collect(),
            time_samples: vec![(10, 5), (20, 1_005)],
        }
    }

    #[test]
    fn a_large_state_is_cut_into_chunks_and_reassembled() {
        let s = state(CHUNK_ENTRIES as i64 * 2 + 5);
        let chunks = encode(4, 9, 777, &s);
        assert_eq!(chunks.len(), 3);
        assert!(chunks.iter().all(|c| c.len() < 1_000_000));
        let decoded: Vec<Chunk> = chunks.iter().map(|c| decode_chunk(c).unwrap()).collect();
        let (header, back) = assemble(4, 9, decoded).unwrap();
        assert_eq!((header.covers_until, header.count), (777, 3));
        assert_eq!(back, s);
    }

    #[test]
    fn an_empty_state_is_one_chunk() {
        let chunks = encode(0, 1, 5, &Exported::default());
        assert_eq!(chunks.len(), 1);
        let (h, back) = assemble(0, 1, vec![decode_chunk(&chunks[0]).unwrap()]).unwrap();
        assert_eq!((h.covers_until, back), (5, Exported::default()));
    }

    #[test]
    fn chunks_of_other_snapshots_or_a_missing_chunk_are_refused() {
        let s = state(CHUNK_ENTRIES as i64 + 1);
        let decode_all = |chunks: Vec<Vec<u8>>| -> Vec<Chunk> {
            chunks.iter().map(|c| decode_chunk(c).unwrap()).collect()
        };
        let mut old = decode_all(encode(4, 8, 100, &s));
        let mut new = decode_all(encode(4, 9, 200, &s));
        new.remove(1);
        new.append(&mut old);
        assert!(matches!(
            assemble(4, 9, new),
            Err(SnapshotError::Incomplete(_))
        ));
        assert!(assemble(5, 8, decode_all(encode(4, 8, 100, &s))).is_err());
    }

    #[test]
    fn samples_are_thinned_keeping_the_oldest() {
        let many: Vec<(i64, i64)> = (0..10_000).map(|i| (i, i * 1000)).collect();
        let thinned = thin(&many, MAX_SAMPLES);
        assert!(thinned.len() <= MAX_SAMPLES);
        assert_eq!(thinned[0], (0, 0));
    }

    proptest! {
        #[test]
        fn corrupt_chunks_never_panic(
            n in 0i64..50,
            index in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut bytes = encode(1, 2, 3, &state(n)).remove(0);
            let i = index.index(bytes.len());
            bytes[i] = byte;
            let _ = decode_chunk(&bytes);
            bytes.truncate(cut.index(bytes.len() + 1));
            let _ = decode_chunk(&bytes);
        }
    }
}

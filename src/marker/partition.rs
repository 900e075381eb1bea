//! Which markers partition carries the markers of a source partition.
//!
//! Every marker about one source (topic, partition) must land in the same markers partition, so
//! that one tracker sees a delivery's Start, KeepAlives and End in the order they were written.
//! The choice must also be the same in every client, in every language, forever: it is
//! FNV-1a (32 bit) over the topic's UTF-8 bytes followed by the partition as 4 big-endian bytes,
//! taken modulo the markers partition count. `docs/markers.md` gives test vectors.

const FNV_OFFSET: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;

/// The markers partition for source `(topic, partition)` when the markers topic has
/// `markers_partitions` partitions. A count below 1 is treated as 1.
///
/// Changing the markers topic's partition count moves sources to other markers partitions, so
/// it must only be done with no delivery in flight.
///
/// ```
/// use kafka_redelivery::marker::markers_partition;
/// let p = markers_partition("orders", 0, 8);
/// assert!((0..8).contains(&p));
/// assert_eq!(p, markers_partition("orders", 0, 8));
/// ```
pub fn markers_partition(topic: &str, partition: i32, markers_partitions: i32) -> i32 {
    let hash = fnv1a(topic.as_bytes().iter().chain(&partition.to_be_bytes()));
    let count = markers_partitions.max(1) as u32;
    // The remainder is below `count`, which came from a positive i32.
    (hash % count) as i32
}

fn fnv1a<'a>(bytes: impl Iterator<Item = &'a u8>) -> u32 {
    bytes.fold(FNV_OFFSET, |h, &b| (h ^ b as u32).wrapping_mul(FNV_PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_vectors() {
        // Vectors from the FNV reference (http://www.isthe.com/chongo/tech/comp/fnv/).
        assert_eq!(fnv1a(b"".iter()), 0x811c9dc5);
        assert_eq!(fnv1a(b"a".iter()), 0xe40c292c);
        assert_eq!(fnv1a(b"foobar".iter()), 0xbf9cf968);
    }

    #[test]
    fn documented_partition_vectors() {
        // The same table is in docs/markers.md.
        assert_eq!(markers_partition("orders", 0, 8), 4);
        assert_eq!(markers_partition("orders", 1, 8), 7);
        assert_eq!(markers_partition("payments", 7, 16), 15);
        assert_eq!(markers_partition("orders", 5, 1), 0);
    }

    #[test]
    fn nonpositive_count_is_one_partition() {
        assert_eq!(markers_partition("t", 3, 0), 0);
        assert_eq!(markers_partition("t", 3, -4), 0);
    }
}

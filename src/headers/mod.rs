//! Header names the tracker puts on redelivered and dead-lettered copies, and the client reads.
//!
//! They are part of the public contract: applications and operators read them, so they never
//! change meaning. Values are UTF-8 decimal numbers or text.
//!
//! Headers of the records we carry are opaque: names and values are copied byte for byte and
//! never assumed to be UTF-8 (see [`HeaderName`]).

pub mod checked;
mod name;
mod raw;

pub use name::HeaderName;
use rdkafka::message::{BorrowedHeaders, OwnedHeaders};

/// Delivery attempt of this copy: "2" on the first redelivery. Absent on an original record,
/// which is attempt 1.
pub const ATTEMPT: &str = "kr-attempt";
/// Topic of the original record this copy stands for.
pub const ORIGINAL_TOPIC: &str = "kr-original-topic";
/// Partition of the original record.
pub const ORIGINAL_PARTITION: &str = "kr-original-partition";
/// Offset of the original record.
pub const ORIGINAL_OFFSET: &str = "kr-original-offset";
/// On a dead-lettered copy: why (`rejected`, `max-deliveries`, `source-unreadable`,
/// `copy-rejected`).
pub const DLQ_REASON: &str = "kr-dlq-reason";
/// On a dead-lettered copy: detail in words (the reject reason, the read error, ...).
pub const DLQ_DETAIL: &str = "kr-dlq-detail";
/// On a dead-lettered copy: the topic, partition and offset it was read from, as
/// `topic/partition@offset`; for a redelivered copy this differs from the original.
pub const DLQ_SOURCE: &str = "kr-dlq-source";
/// On a record sent back by `redelivery-tracker dlq redrive`: the dead-letter record it came
/// from, as `topic/partition@offset`.
pub const REDRIVEN_FROM: &str = "kr-redriven-from";
/// Optional, set by a producer: this record's delivery timeout in milliseconds, overriding the
/// consumer's default. Read within 1 s ..= 7 days ([`checked::timeout`]).
pub const TIMEOUT_MS: &str = "kr-timeout-ms";
/// Optional, set by a producer: the most deliveries this record gets (decimal), lowering the
/// consumer's retry policy. Copies keep it, so it holds for every redelivery. Read within
/// 1 ..= 8191 ([`checked::max_deliveries`]).
pub const MAX_DELIVERIES: &str = "kr-max-deliveries";

/// On a record delivered from a schedule: where its Schedule marker is, as
/// `markers-topic/partition@offset` (the part after the `/` is its
/// [`crate::client::ScheduleId`]).
pub const SCHEDULE_ID: &str = "kr-schedule-id";

/// Whether the tracker writes this header, so a copy of a copy replaces it rather than
/// repeating it. [`TIMEOUT_MS`] belongs to the producer and is kept.
pub fn written_by_tracker(name: &HeaderName) -> bool {
    [
        ATTEMPT,
        ORIGINAL_TOPIC,
        ORIGINAL_PARTITION,
        ORIGINAL_OFFSET,
        DLQ_REASON,
        DLQ_DETAIL,
        DLQ_SOURCE,
    ]
    .iter()
    .any(|n| name == *n)
}

/// Record headers as plain owned pairs, in order. A header may have no value. Names are bytes
/// ([`HeaderName`]): Kafka does not promise UTF-8, and other clients write any bytes.
pub type HeaderList = Vec<(HeaderName, Option<Vec<u8>>)>;

/// Copies librdkafka headers into a [`HeaderList`], names and values byte for byte. Never
/// panics, whatever bytes a producer put in a name (rdkafka's own `Headers::iter` does).
pub fn from_kafka<H: KafkaHeaders + ?Sized>(headers: Option<&H>) -> HeaderList {
    headers.map_or_else(Vec::new, |h| raw::read(h.borrowed()))
}

/// librdkafka headers, borrowed from a polled record or owned by a detached one.
pub trait KafkaHeaders {
    /// A read-only view.
    fn borrowed(&self) -> &BorrowedHeaders;
}

impl KafkaHeaders for BorrowedHeaders {
    fn borrowed(&self) -> &BorrowedHeaders {
        self
    }
}

impl KafkaHeaders for OwnedHeaders {
    fn borrowed(&self) -> &BorrowedHeaders {
        self.as_borrowed()
    }
}

/// The value of the last header named `name` of a record, as text (bytes that are not UTF-8
/// replaced): for reading the `kr-*` headers of a copy or a dead letter, for example
/// `kr-dlq-reason`. Read byte for byte, so a header name that is not UTF-8 elsewhere in the
/// record does no harm.
pub fn record_text<M>(record: &M, name: &str) -> Option<String>
where
    M: rdkafka::message::Message,
    M::Headers: KafkaHeaders,
{
    let list = from_kafka(record.headers());
    value(&list, name).map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Builds librdkafka headers from a [`HeaderList`], names and values byte for byte.
pub fn to_kafka(headers: &HeaderList) -> OwnedHeaders {
    raw::build(headers)
}

/// The value of the last header named `name`, if there is one with a value.
pub fn value<'a>(headers: &'a HeaderList, name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.as_deref())
}

/// The value of the last header named `name`, as UTF-8 text.
pub fn text<'a>(headers: &'a HeaderList, name: &str) -> Option<&'a str> {
    value(headers, name).and_then(|v| std::str::from_utf8(v).ok())
}

/// The original coordinates a redelivered or dead-lettered copy carries; `None` on an original
/// record (or if the headers are malformed).
pub fn original(headers: &HeaderList) -> Option<crate::marker::SourceRef> {
    Some(crate::marker::SourceRef {
        topic: text(headers, ORIGINAL_TOPIC)?.into(),
        partition: text(headers, ORIGINAL_PARTITION)?.parse().ok()?,
        offset: text(headers, ORIGINAL_OFFSET)?.parse().ok()?,
    })
}

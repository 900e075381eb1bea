//! Bytes to marker. Total: any input gives a marker or a typed error.

use super::{Marker, MarkerType, ScheduledRecord, SourceRef, VERSION, VERSION_2};

/// Why a byte string is not a marker this version understands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The record had a value of zero bytes.
    #[error("empty marker")]
    Empty,
    /// The first byte names a format version this build does not know.
    #[error("unknown marker version {0}")]
    UnknownVersion(u8),
    /// The type byte names a marker type this build does not know.
    #[error("unknown marker type 0x{0:02x}")]
    UnknownType(u8),
    /// The bytes ended inside a field.
    #[error("marker truncated in field `{0}`")]
    Truncated(&'static str),
    /// A text field is not UTF-8.
    #[error("field `{0}` is not valid UTF-8")]
    InvalidUtf8(&'static str),
    /// A field holds a value no real marker can have.
    #[error("field `{field}` has invalid value {value}")]
    InvalidValue {
        /// Name of the field.
        field: &'static str,
        /// The value found, as text.
        value: String,
    },
    /// Bytes remain after the last field of a known type.
    #[error("{0} unexpected bytes after the marker")]
    TrailingBytes(usize),
}

impl DecodeError {
    /// Every value [`DecodeError::kind`] can return.
    pub const KINDS: [&'static str; 7] = [
        "empty",
        "unknown_version",
        "unknown_type",
        "truncated",
        "invalid_utf8",
        "invalid_value",
        "trailing_bytes",
    ];

    /// Short stable name for metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::Empty => "empty",
            DecodeError::UnknownVersion(_) => "unknown_version",
            DecodeError::UnknownType(_) => "unknown_type",
            DecodeError::Truncated(_) => "truncated",
            DecodeError::InvalidUtf8(_) => "invalid_utf8",
            DecodeError::InvalidValue { .. } => "invalid_value",
            DecodeError::TrailingBytes(_) => "trailing_bytes",
        }
    }
}

/// Decodes one marker from a record value.
///
/// ```
/// use kafka_redelivery::marker::{decode, DecodeError};
/// assert_eq!(decode(&[9, 1]), Err(DecodeError::UnknownVersion(9)));
/// ```
pub fn decode(bytes: &[u8]) -> Result<Marker, DecodeError> {
    let mut r = Reader { bytes, pos: 0 };
    let version = r.u8("version").map_err(|_| DecodeError::Empty)?;
    if version != VERSION && version != VERSION_2 {
        return Err(DecodeError::UnknownVersion(version));
    }
    let type_byte = r.u8("type")?;
    let kind =
        MarkerType::from_wire(version, type_byte).ok_or(DecodeError::UnknownType(type_byte))?;
    let marker = match kind {
        MarkerType::StartBatch | MarkerType::Settle => super::decode_v2::fields(&mut r, kind)?,
        MarkerType::Start => {
            let source = r.source()?;
            let timeout_ms = r.u32("timeout_ms")?;
            let attempt = r.u32("attempt")?;
            if attempt == 0 {
                return Err(invalid("attempt", attempt));
            }
            Marker::Start {
                source,
                timeout_ms,
                attempt,
            }
        }
        MarkerType::KeepAlive => Marker::KeepAlive {
            source: r.source()?,
            timeout_ms: r.u32("timeout_ms")?,
        },
        MarkerType::End => Marker::End {
            source: r.source()?,
        },
        MarkerType::Nack => Marker::Nack {
            source: r.source()?,
            delay_ms: r.u64("delay_ms")?,
        },
        MarkerType::Reject => Marker::Reject {
            source: r.source()?,
            reason: r.string("reason")?,
        },
        MarkerType::Schedule => {
            let not_before_ms = r.i64("not_before_ms")?;
            if not_before_ms < 0 {
                return Err(invalid("not_before_ms", not_before_ms));
            }
            Marker::Schedule {
                not_before_ms,
                delay_ms: r.u64("delay_ms")?,
                record: Box::new(r.record()?),
            }
        }
        MarkerType::Tick => Marker::Tick {
            nonce: r.u64("nonce")?,
        },
    };
    match bytes.len() - r.pos {
        0 => Ok(marker),
        extra => Err(DecodeError::TrailingBytes(extra)),
    }
}

pub(super) fn invalid(field: &'static str, value: impl ToString) -> DecodeError {
    DecodeError::InvalidValue {
        field,
        value: value.to_string(),
    }
}

/// A cursor over the input that never indexes out of bounds. Also reads the tracker's
/// snapshot format, which uses the same integer and string encodings.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(DecodeError::Truncated(field))?;
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, field)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        self.array(field).map(u16::from_be_bytes)
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        self.array(field).map(u32::from_be_bytes)
    }

    pub(crate) fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        self.array(field).map(i32::from_be_bytes)
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        self.array(field).map(u64::from_be_bytes)
    }

    pub(crate) fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        self.array(field).map(i64::from_be_bytes)
    }

    pub(crate) fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        self.text(field).map(str::to_owned)
    }

    /// A string as [`Self::string`] reads it, borrowed from the marker's bytes.
    pub(crate) fn text(&mut self, field: &'static str) -> Result<&'a str, DecodeError> {
        let len = self.u16(field)? as usize;
        let raw = self.take(len, field)?;
        std::str::from_utf8(raw).map_err(|_| DecodeError::InvalidUtf8(field))
    }

    /// `i32` length, -1 for none.
    fn bytes(&mut self, field: &'static str) -> Result<Option<Vec<u8>>, DecodeError> {
        match self.i32(field)? {
            -1 => Ok(None),
            len if len < 0 => Err(invalid(field, len)),
            len => Ok(Some(self.take(len as usize, field)?.to_vec())),
        }
    }

    fn record(&mut self) -> Result<ScheduledRecord, DecodeError> {
        let topic = self.string("target_topic")?;
        if topic.is_empty() {
            return Err(invalid("target_topic", "\"\""));
        }
        let partition = match self.i32("target_partition")? {
            -1 => None,
            p if p < 0 => return Err(invalid("target_partition", p)),
            p => Some(p),
        };
        let key = self.bytes("key")?;
        let payload = self.bytes("payload")?;
        let count = self.u16("header_count")?;
        // No pre-allocation from the count: a lying count must not reserve memory.
        let mut headers = Vec::new();
        for _ in 0..count {
            let name = self.string("header_name")?;
            headers.push((name.into(), self.bytes("header_value")?));
        }
        Ok(ScheduledRecord {
            topic,
            partition,
            key,
            payload,
            headers,
        })
    }

    fn source(&mut self) -> Result<SourceRef, DecodeError> {
        let (topic, partition) = self.source_partition()?;
        let offset = self.i64("offset")?;
        if offset < 0 {
            return Err(invalid("offset", offset));
        }
        Ok(SourceRef {
            topic,
            partition,
            offset,
        })
    }
}

//! A header name as the bytes a producer wrote.

use std::borrow::Cow;
use std::fmt;

/// The name of a record header: bytes, usually but not necessarily UTF-8.
///
/// Kafka's protocol calls header names strings, but brokers do not check them and the C, Go
/// and Java clients write any bytes. A consumer that assumed UTF-8 could not even read such a
/// record, so names are kept as bytes and compared with text where that is what's wanted.
///
/// ```
/// use kafka_redelivery::headers::HeaderName;
/// let trace = HeaderName::from("trace");
/// assert!(trace == "trace");
/// assert_eq!(trace.as_str(), Some("trace"));
///
/// let odd = HeaderName::from(vec![0xff, 0xfe, b'k']);
/// assert_eq!(odd.as_str(), None);
/// assert_eq!(odd.as_bytes(), &[0xff, 0xfe, b'k']);
/// assert_eq!(odd.to_string_lossy(), "\u{fffd}\u{fffd}k");
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeaderName(Vec<u8>);

impl HeaderName {
    /// The name's bytes, exactly as the producer wrote them.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The name as text, if it is UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// The name as text, with any byte that is not UTF-8 replaced by U+FFFD; for logs.
    pub fn to_string_lossy(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.0)
    }

    /// The name's bytes, taken out.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

impl From<&str> for HeaderName {
    fn from(name: &str) -> Self {
        HeaderName(name.as_bytes().to_vec())
    }
}

impl From<String> for HeaderName {
    fn from(name: String) -> Self {
        HeaderName(name.into_bytes())
    }
}

impl From<Vec<u8>> for HeaderName {
    fn from(name: Vec<u8>) -> Self {
        HeaderName(name)
    }
}

impl From<&[u8]> for HeaderName {
    fn from(name: &[u8]) -> Self {
        HeaderName(name.to_vec())
    }
}

impl PartialEq<str> for HeaderName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl PartialEq<&str> for HeaderName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl fmt::Debug for HeaderName {
    /// Text in quotes when the name is UTF-8, else the bytes with non-ASCII ones escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_str() {
            Some(s) => fmt::Debug::fmt(s, f),
            None => write!(f, "b\"{}\"", self.0.escape_ascii()),
        }
    }
}

impl fmt::Display for HeaderName {
    /// Lossy text (U+FFFD for bytes that are not UTF-8).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_string_lossy())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_text_or_escaped_bytes() {
        assert_eq!(format!("{:?}", HeaderName::from("a")), "\"a\"");
        assert_eq!(
            format!("{:?}", HeaderName::from(vec![0xff, b'k'])),
            "b\"\\xffk\""
        );
    }
}

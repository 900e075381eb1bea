//! A record's key and payload, copied out of librdkafka's buffer into one allocation.
//!
//! The poll thread copies every record it hands out, and the application frees it on another
//! thread when it drops the delivery. An allocation made on one thread and freed on another
//! never comes back through either thread's cache, so each one costs glibc its slow path:
//! about 300 instructions to allocate and as much again to free in the client's profile
//! (BENCHMARKS.md, "One allocation per record"). A key and a payload in two `Vec`s paid that
//! twice per record; here they share one buffer, the key first.

/// A key and a payload, each present or not, in one buffer.
pub(crate) struct Body {
    bytes: Box<[u8]>,
    /// Length of the key at the front of `bytes`; `None` for a record without a key.
    key_len: Option<usize>,
    /// Whether the record has a payload (the rest of `bytes`); a tombstone has none.
    has_payload: bool,
}

impl Body {
    /// Copies `key` and `payload` into one buffer of exactly their size (none for an empty
    /// record).
    pub(crate) fn new(key: Option<&[u8]>, payload: Option<&[u8]>) -> Self {
        let key_len = key.map(<[u8]>::len);
        let size = key_len.unwrap_or(0) + payload.map_or(0, <[u8]>::len);
        let mut bytes = Vec::with_capacity(size);
        bytes.extend_from_slice(key.unwrap_or_default());
        bytes.extend_from_slice(payload.unwrap_or_default());
        Body {
            bytes: bytes.into_boxed_slice(),
            key_len,
            has_payload: payload.is_some(),
        }
    }

    /// The record key, if it has one.
    pub(crate) fn key(&self) -> Option<&[u8]> {
        self.key_len.and_then(|n| self.bytes.get(..n))
    }

    /// The record value, if it has one.
    pub(crate) fn payload(&self) -> Option<&[u8]> {
        if !self.has_payload {
            return None;
        }
        self.bytes.get(self.key_len.unwrap_or(0)..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_and_payload_come_back_as_given_whichever_is_missing_or_empty() {
        type Bytes<'a> = Option<&'a [u8]>;
        let cases: [(Bytes, Bytes); 7] = [
            (Some(b"key"), Some(b"payload")),
            (None, Some(b"payload")),
            (Some(b"key"), None),
            (None, None),
            (Some(b""), Some(b"")),
            (Some(b""), None),
            (None, Some(b"")),
        ];
        for (key, payload) in cases {
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
}

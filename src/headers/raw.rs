//! Reading and writing librdkafka headers byte for byte.
//!
//! One of the three places this crate uses `unsafe` (with `tracker/memory.rs` and
//! `kafka/producer.rs`), for a
//! measured need: rdkafka 0.39 exposes header names only as `&str` and unwraps the UTF-8
//! check (`CStr::to_str().unwrap()` in `BorrowedHeaders::try_get`), so a record whose header
//! name is not UTF-8 panics the thread that reads it. Seen: the client's poll thread died on
//! such a record and the partition never moved again. librdkafka itself stores names as bytes;
//! these functions call it directly.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CStr};
use std::ptr;

use rdkafka::bindings as rd;
use rdkafka::message::{BorrowedHeaders, OwnedHeaders};
use rdkafka::types::RDKafkaErrorCode;

use super::{HeaderList, HeaderName};

/// The librdkafka headers object behind `headers`.
///
/// rdkafka's `BorrowedHeaders` is a zero-sized view whose address *is* the `rd_kafka_headers_t`
/// pointer (rdkafka builds it by casting that pointer, and casts it back the same way in its
/// own `as_native_ptr`), valid as long as the borrow.
fn native(headers: &BorrowedHeaders) -> *mut rd::rd_kafka_headers_t {
    ptr::from_ref(headers).cast_mut().cast()
}

/// Every header of `headers`, in order.
pub(super) fn read(headers: &BorrowedHeaders) -> HeaderList {
    let hdrs = native(headers);
    // SAFETY: `hdrs` is a live headers object for the duration of the borrow (see `native`).
    let count = unsafe { rd::rd_kafka_header_cnt(hdrs) };
    let mut out = Vec::with_capacity(count);
    for idx in 0..count {
        let mut name: *const c_char = ptr::null();
        let mut value: *const c_void = ptr::null();
        let mut size: usize = 0;
        // SAFETY: `idx < count`; librdkafka writes a NUL-terminated name pointer and a value
        // pointer and size, all owned by `hdrs` and valid while it is.
        let err =
            unsafe { rd::rd_kafka_header_get_all(hdrs, idx, &mut name, &mut value, &mut size) };
        if RDKafkaErrorCode::from(err) != RDKafkaErrorCode::NoError || name.is_null() {
            continue;
        }
        // SAFETY: librdkafka keeps a NUL terminator after every name it stores.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes().to_vec();
        let value = (!value.is_null()).then(|| {
            // SAFETY: `value` points at `size` bytes owned by `hdrs`.
            unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec()
        });
        out.push((HeaderName::from(name), value));
    }
    out
}

/// New librdkafka headers holding `headers`, in order.
pub(super) fn build(headers: &HeaderList) -> OwnedHeaders {
    let owned = OwnedHeaders::new_with_capacity(headers.len());
    let hdrs = native(owned.as_borrowed());
    for (name, value) in headers {
        let name = name.as_bytes();
        let (value_ptr, value_len) = match value {
            Some(v) => (v.as_ptr().cast::<c_void>(), isize::try_from(v.len())),
            None => (ptr::null(), Ok(0)),
        };
        let (Ok(name_len), Ok(value_len)) = (isize::try_from(name.len()), value_len) else {
            continue; // larger than memory can be: cannot happen for a Vec
        };
        // SAFETY: `hdrs` belongs to `owned`, which nothing else references yet; librdkafka
        // copies `name_len` bytes of the name and `value_len` bytes of the value.
        let err = unsafe {
            rd::rd_kafka_header_add(
                hdrs,
                name.as_ptr().cast::<c_char>(),
                name_len,
                value_ptr,
                value_len,
            )
        };
        // librdkafka refuses only read-only headers, and these are new.
        debug_assert_eq!(RDKafkaErrorCode::from(err), RDKafkaErrorCode::NoError);
    }
    owned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_round_trip_byte_for_byte() {
        let list: HeaderList = vec![
            (
                HeaderName::from(vec![0xff, 0xfe, b'k', b'e', b'y']),
                Some(vec![0, 159, 255]),
            ),
            (HeaderName::from("trace"), None),
            (HeaderName::from("empty"), Some(Vec::new())),
            (HeaderName::from("trace"), Some(b"second".to_vec())),
        ];
        let owned = build(&list);
        assert_eq!(read(owned.as_borrowed()), list);
    }
}

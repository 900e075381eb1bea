//! The marker decoder on arbitrary bytes: it must never panic, and whatever it accepts must
//! encode back to exactly the same bytes (the format has one encoding per marker).
#![no_main]

use kafka_redelivery::marker::{decode, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(marker) = decode(data) {
        assert_eq!(encode(&marker), data, "decode/encode is not the identity for {marker:?}");
    }
});

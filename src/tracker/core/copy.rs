//! The headers of a redelivered or dead-lettered copy. Pure, so the rules are tested directly.
//!
//! A copy keeps every header of the record it copies, except the ones the tracker writes, which
//! it replaces. The original coordinates always name the very first record, however many times
//! it has been redelivered, so an application can deduplicate on them.

use crate::headers::{self, HeaderList};
use crate::marker::SourceRef;

use crate::tracker::core::action::DlqReason;

/// Headers for a copy of the record read at `source`, now at delivery `attempt`.
/// `dead_letter` carries the reason and detail when the copy goes to a dead-letter topic.
pub fn copy_headers(
    original: &HeaderList,
    source: &SourceRef,
    attempt: u32,
    dead_letter: Option<(DlqReason, &str)>,
) -> HeaderList {
    let first = headers::original(original).unwrap_or_else(|| source.clone());
    let mut out: HeaderList = original
        .iter()
        .filter(|(k, _)| !headers::written_by_tracker(k))
        .cloned()
        .collect();
    let mut put = |k: &str, v: String| out.push((k.into(), Some(v.into_bytes())));
    put(headers::ATTEMPT, attempt.to_string());
    put(headers::ORIGINAL_TOPIC, first.topic.to_string());
    put(headers::ORIGINAL_PARTITION, first.partition.to_string());
    put(headers::ORIGINAL_OFFSET, first.offset.to_string());
    if let Some((reason, detail)) = dead_letter {
        put(headers::DLQ_REASON, reason.name().to_string());
        put(headers::DLQ_DETAIL, detail.to_string());
        put(headers::DLQ_SOURCE, source.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::HeaderName;

    fn h(k: &str, v: &str) -> (HeaderName, Option<Vec<u8>>) {
        (k.into(), Some(v.as_bytes().to_vec()))
    }

    #[test]
    fn first_copy_names_the_record_it_was_read_from() {
        let original = vec![h("trace", "abc"), ("empty".into(), None)];
        let out = copy_headers(&original, &SourceRef::new("orders", 2, 7), 2, None);
        assert_eq!(&out[..2], &original[..]);
        assert_eq!(headers::text(&out, headers::ATTEMPT), Some("2"));
        assert_eq!(
            headers::original(&out),
            Some(SourceRef::new("orders", 2, 7))
        );
        assert_eq!(headers::text(&out, headers::DLQ_REASON), None);
    }

    #[test]
    fn copy_of_a_copy_keeps_the_first_original_and_replaces_our_headers() {
        let first = copy_headers(
            &vec![h("trace", "abc")],
            &SourceRef::new("orders", 2, 7),
            2,
            None,
        );
        let second = copy_headers(&first, &SourceRef::new("orders", 2, 90), 3, None);
        assert_eq!(headers::text(&second, headers::ATTEMPT), Some("3"));
        assert_eq!(
            headers::original(&second),
            Some(SourceRef::new("orders", 2, 7))
        );
        let attempts = second.iter().filter(|(k, _)| k == headers::ATTEMPT).count();
        assert_eq!(attempts, 1);
    }

    #[test]
    fn dead_letter_copy_says_why_and_from_where() {
        let out = copy_headers(
            &vec![h(headers::TIMEOUT_MS, "500")],
            &SourceRef::new("orders", 0, 3),
            5,
            Some((DlqReason::MaxDeliveries, "delivered 5 times")),
        );
        assert_eq!(headers::text(&out, headers::TIMEOUT_MS), Some("500"));
        assert_eq!(
            headers::text(&out, headers::DLQ_REASON),
            Some("max-deliveries")
        );
        assert_eq!(
            headers::text(&out, headers::DLQ_DETAIL),
            Some("delivered 5 times")
        );
        assert_eq!(headers::text(&out, headers::DLQ_SOURCE), Some("orders/0@3"));
    }
}

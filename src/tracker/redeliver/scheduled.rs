//! Turning a due Schedule marker back into the record it carries.
//!
//! The tracker keeps nothing of a schedule in memory but its slot; when it falls due, the
//! redelivery worker reads the marker back by offset like any source record, and this module
//! unpacks it into the record to produce. From there on a schedule goes through the same
//! produce, dead-letter and park paths as a redelivery.

use rdkafka::message::{Message, OwnedMessage, Timestamp};

use crate::headers;
use crate::marker::{decode, Marker};

/// The record inside the Schedule marker `marker`, addressed to its target topic (partition
/// -1 when the producer chose none). An error says why the marker is not a readable Schedule;
/// the caller dead-letters it as unreadable.
pub fn unpack(marker: &OwnedMessage) -> Result<OwnedMessage, String> {
    let at = format!(
        "{}/{}@{}",
        marker.topic(),
        marker.partition(),
        marker.offset()
    );
    let bytes = marker
        .payload()
        .ok_or_else(|| format!("the marker at {at} has no value"))?;
    match decode(bytes) {
        Ok(Marker::Schedule { record, .. }) => {
            let record = *record;
            Ok(OwnedMessage::new(
                record.payload,
                record.key,
                record.topic,
                Timestamp::NotAvailable,
                record.partition.unwrap_or(-1),
                -1,
                Some(headers::to_kafka(&record.headers)),
            ))
        }
        Ok(other) => Err(format!(
            "the marker at {at} is a {} marker, not a schedule",
            other.marker_type().name()
        )),
        Err(e) => Err(format!(
            "the schedule marker at {at} cannot be decoded: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marker::{encode, ScheduledRecord, SourceRef};

    fn marker_record(bytes: Vec<u8>) -> OwnedMessage {
        OwnedMessage::new(
            Some(bytes),
            None,
            "m".into(),
            Timestamp::NotAvailable,
            2,
            7,
            None,
        )
    }

    #[test]
    fn unpacks_key_value_headers_and_target() {
        let schedule = Marker::Schedule {
            not_before_ms: 0,
            delay_ms: 10,
            record: Box::new(ScheduledRecord {
                topic: "orders".into(),
                partition: Some(4),
                key: Some(b"k".to_vec()),
                payload: None,
                headers: vec![("a".into(), Some(b"1".to_vec())), ("b".into(), None)],
            }),
        };
        let m = unpack(&marker_record(encode(&schedule))).unwrap();
        assert_eq!(
            (m.topic(), m.partition(), m.key(), m.payload()),
            ("orders", 4, Some(&b"k"[..]), None)
        );
        assert_eq!(
            headers::from_kafka(m.headers()),
            vec![("a".into(), Some(b"1".to_vec())), ("b".into(), None)]
        );
    }

    #[test]
    fn other_markers_and_garbage_are_explained() {
        let end = encode(&Marker::End {
            source: SourceRef::new("t", 0, 1),
        });
        let err = unpack(&marker_record(end)).unwrap_err();
        assert!(err.contains("m/2@7") && err.contains("end marker"), "{err}");
        let err = unpack(&marker_record(vec![1, 6, 0])).unwrap_err();
        assert!(err.contains("cannot be decoded"), "{err}");
    }
}

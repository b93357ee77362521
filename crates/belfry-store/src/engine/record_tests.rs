//! Tests of `record.rs`: round trips, bounds, and refusals of damaged frames.

use super::*;

pub(crate) fn samples() -> Vec<Record> {
    vec![
        Record::Put(PutRecord {
            seq: 7,
            due_at_ms: 1_000,
            priority: Priority::High,
            payload_kind: PayloadKind::Binary,
            late_policy: LatePolicy::Dead { after_ms: 5 },
            idempotency_key: Some("k-1".into()),
            target: None,
            headers: vec![("a".into(), "b".into())],
            payload: Bytes::from_static(b"{\"x\":1}"),
        }),
        Record::Put(PutRecord {
            seq: 8,
            due_at_ms: 2_000,
            priority: Priority::Normal,
            payload_kind: PayloadKind::Json,
            late_policy: LatePolicy::Fire,
            idempotency_key: None,
            target: Some("https://hooks.example.com/t?x=1".into()),
            headers: Vec::new(),
            payload: Bytes::from_static(b"{}"),
        }),
        Record::Put(PutRecord {
            seq: 9,
            due_at_ms: 3_000,
            priority: Priority::Normal,
            payload_kind: PayloadKind::Json,
            late_policy: LatePolicy::Skip { after_ms: 1 },
            idempotency_key: Some("k-2".into()),
            target: Some("http://example.com/".into()),
            headers: vec![("h".into(), "v".into())],
            payload: Bytes::new(),
        }),
        Record::Cancel { seq: 1 },
        Record::Reschedule {
            seq: 2,
            due_at_ms: 3,
        },
        Record::Lease {
            seq: 4,
            lease_id: 5,
            until_ms: 6,
            attempts: 7,
        },
        Record::Done { seq: 8 },
        Record::Skipped { seq: 8 },
        Record::Nack {
            seq: 9,
            due_at_ms: 10,
        },
        Record::Extend {
            seq: 11,
            lease_id: 12,
            until_ms: 13,
        },
        Record::Dead {
            seq: 14,
            reason: "gone".into(),
            attempts: None,
        },
        Record::Dead {
            seq: 17,
            reason: "no answer".into(),
            attempts: Some(2),
        },
        Record::Redrive {
            seq: 15,
            due_at_ms: 16,
        },
    ]
}

#[test]
fn records_round_trip_and_detect_damage() {
    for record in samples() {
        let mut bytes = Vec::new();
        encode(&mut bytes, &record);
        let (decoded, len) = decode(&bytes).unwrap();
        assert_eq!(decoded, record);
        assert_eq!(len, bytes.len());
        for cut in 0..bytes.len() {
            assert!(matches!(
                decode(&bytes[..cut]),
                Err(DecodeError::Truncated { .. })
            ));
        }
        for i in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x40;
            assert!(decode(&damaged).is_err(), "flip at {i} accepted");
        }
    }
}

#[test]
fn wal_frames_wrap_bucket_frames() {
    let mut batch = WalBatch::new();
    let target = WalTarget {
        queue_uid: 9,
        bucket: 42,
    };
    let mut expected = Vec::new();
    for record in samples() {
        let range = batch.push(target, &record);
        expected.push(range);
    }
    let wal = batch.finish();
    let (entries, len) = decode_wal(&wal).unwrap();
    assert_eq!(len, wal.len());
    assert_eq!(entries.len(), expected.len());
    for ((got_target, inner), range) in entries.into_iter().zip(expected) {
        assert_eq!(got_target, target);
        assert_eq!(inner, &wal[range]);
    }
    for cut in 0..wal.len() {
        assert!(decode_wal(&wal[..cut]).is_err());
    }
}

fn meta_changes() -> Vec<MetaChange> {
    vec![
        MetaChange::put("schedules", "s-1", Bytes::from_static(b"cursor01")),
        MetaChange::delete("schedules", "s-2"),
        MetaChange::put("", "", Bytes::new()),
    ]
}

#[test]
fn meta_records_round_trip_and_detect_damage() {
    let changes = meta_changes();
    check_meta(&changes).unwrap();
    let mut bytes = Vec::new();
    encode_meta(&mut bytes, &changes);
    assert_eq!(bytes.len(), meta_size_hint(&changes));
    assert_eq!(decode_meta(&bytes).unwrap(), (changes, bytes.len()));
    for cut in 0..bytes.len() {
        assert!(matches!(
            decode_meta(&bytes[..cut]),
            Err(DecodeError::Truncated { .. })
        ));
    }
    for i in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[i] ^= 0x40;
        assert!(decode_meta(&damaged).is_err(), "flip at {i} accepted");
    }
    // A metadata record is not a bucket record, and the other way round.
    assert_eq!(decode(&bytes), Err(DecodeError::Kind(KIND_META)));
    let mut done = Vec::new();
    encode(&mut done, &Record::Done { seq: 1 });
    assert_eq!(decode_meta(&done), Err(DecodeError::Kind(KIND_DONE)));
}

#[test]
fn a_wal_frame_holds_a_meta_record_whole() {
    let mut batch = WalBatch::new();
    batch.push_meta(&meta_changes());
    let wal = batch.finish();
    let (entries, len) = decode_wal(&wal).unwrap();
    assert_eq!(len, wal.len());
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].0.queue_uid, META_TARGET_UID);
    assert_eq!(decode_meta(entries[0].1).unwrap().0, meta_changes());
    for cut in 0..wal.len() {
        assert!(decode_wal(&wal[..cut]).is_err());
    }
}

#[test]
fn meta_changes_beyond_the_format_are_refused() {
    let long = "k".repeat(META_NAME_BYTES_MAX + 1);
    assert!(check_meta(&[MetaChange::delete("ns", &long)]).is_err());
    assert!(check_meta(&[MetaChange::delete(&long, "k")]).is_err());
    let huge = Bytes::from(vec![0u8; FRAME_BODY_BYTES_MAX]);
    assert!(check_meta(&[MetaChange::put("ns", "k", huge)]).is_err());
}

#[test]
fn a_target_is_kept_by_full_reads_and_left_on_disk_by_bucket_loads() {
    for record in samples() {
        let Record::Put(put) = &record else { continue };
        let mut frame = Vec::new();
        encode(&mut frame, &record);
        let (light, _) = decode_light(&frame).expect("a valid frame");
        let Record::Put(light) = light else {
            panic!("a put decodes as a put")
        };
        assert_eq!(light.target, None);
        assert_eq!(light.idempotency_key, put.idempotency_key);
        let shared = decode_put_shared(&Bytes::from(frame)).expect("a valid frame");
        assert_eq!(&shared, put);
    }
}

#[test]
fn a_put_without_a_target_is_written_as_before_targets_existed() {
    let Record::Put(mut put) = samples().remove(0) else {
        panic!("the first sample is a put")
    };
    put.target = None;
    let mut frame = Vec::new();
    encode(&mut frame, &Record::Put(put));
    // version, kind, seq, due, priority, payload kind, late tag, late after: then the
    // optional-strings byte, which is the old key flag (1: a key follows).
    assert_eq!(frame[FRAME_HEADER_BYTES + 1 + 1 + 8 + 8 + 1 + 1 + 1 + 8], 1);
    let mut bad = frame.clone();
    bad[FRAME_HEADER_BYTES + 1 + 1 + 8 + 8 + 1 + 1 + 1 + 8] = 4;
    let body_start = FRAME_HEADER_BYTES;
    let crc = crc32fast::hash(&bad[body_start..]);
    bad[4..8].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(
        decode(&bad).map(|_| ()),
        Err(DecodeError::Malformed("key flag")),
        "an unknown optional-string bit is refused, not skipped"
    );
}

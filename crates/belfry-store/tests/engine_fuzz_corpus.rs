//! Replays the fuzz seed corpus (`fuzz/corpus/record_decode/`) through the record decoders,
//! plus a few thousand deterministic mutations of each seed, checking what the fuzz target
//! checks: no panic, and a record that decodes encodes back to the same bytes.

use std::fs;
use std::path::PathBuf;

use belfry_core::{LatePolicy, PayloadKind, Priority};
use belfry_store::engine::record::{self, PutRecord, Record, WalBatch, WalTarget};
use belfry_store::MetaChange;
use bytes::Bytes;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/record_decode")
}

fn check(data: &[u8]) {
    if let Ok((decoded, len)) = record::decode(data) {
        let mut again = Vec::new();
        record::encode(&mut again, &decoded);
        assert_eq!(
            &again[..],
            &data[..len],
            "re-encoding differs for {decoded:?}"
        );
    }
    if let Ok((changes, len)) = record::decode_meta(data) {
        let mut again = Vec::new();
        record::encode_meta(&mut again, &changes);
        assert_eq!(
            &again[..],
            &data[..len],
            "re-encoding differs for {changes:?}"
        );
    }
    if let Ok((entries, len)) = record::decode_wal(data) {
        assert!(len <= data.len());
        for (target, inner) in entries {
            if target.queue_uid == record::META_TARGET_UID {
                assert!(record::decode_meta(inner).is_ok());
            } else {
                assert!(record::decode(inner).is_ok());
            }
        }
    }
}

/// xorshift64*: deterministic, so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut data = seed.to_vec();
    for _ in 0..=rng.below(3) {
        match rng.below(5) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] = rng.next() as u8;
            }
            2 => data.truncate(rng.below(data.len() + 1)),
            3 => {
                let i = rng.below(data.len() + 1);
                data.insert(i, rng.next() as u8);
            }
            _ if data.len() >= 4 => {
                // Overwrite a length-sized field with an extreme value.
                let i = rng.below(data.len() - 3);
                let value = [0u32, 1, u32::MAX, 0x8000_0000][rng.below(4)];
                data[i..i + 4].copy_from_slice(&value.to_le_bytes());
            }
            _ => {}
        }
    }
    data
}

#[test]
fn seed_corpus_and_mutations_never_panic() {
    let mut seeds = Vec::new();
    for entry in fs::read_dir(corpus_dir()).expect("the seed corpus is committed") {
        seeds.push(fs::read(entry.unwrap().path()).unwrap());
    }
    assert!(seeds.len() >= 5, "seed corpus missing");
    let mut decoded = 0;
    for seed in &seeds {
        check(seed);
        decoded += usize::from(
            record::decode(seed).is_ok()
                || record::decode_wal(seed).is_ok()
                || record::decode_meta(seed).is_ok(),
        );
    }
    assert_eq!(
        decoded,
        seeds.len(),
        "every seed is a valid record or WAL frame"
    );
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for seed in &seeds {
        for _ in 0..500 {
            check(&mutate(&mut rng, seed));
        }
    }
}

fn sample_records() -> Vec<Record> {
    vec![
        Record::Put(PutRecord {
            seq: 1,
            due_at_ms: 1_700_000_000_000,
            priority: Priority::High,
            payload_kind: PayloadKind::Json,
            late_policy: LatePolicy::Skip { after_ms: 60_000 },
            idempotency_key: Some("order-42".into()),
            target: Some("https://hooks.example.com/orders".into()),
            headers: vec![("content-type".into(), "application/json".into())],
            payload: Bytes::from_static(b"{\"order\":42}"),
        }),
        Record::Put(PutRecord {
            seq: 2,
            due_at_ms: 0,
            priority: Priority::Normal,
            payload_kind: PayloadKind::Binary,
            late_policy: LatePolicy::Fire,
            idempotency_key: None,
            target: None,
            headers: vec![],
            payload: Bytes::new(),
        }),
        Record::Lease {
            seq: 1,
            lease_id: 9,
            until_ms: 1_700_000_030_000,
            attempts: 1,
        },
        Record::Dead {
            seq: 1,
            reason: "webhook answered 410".into(),
            attempts: None,
        },
        Record::Nack {
            seq: 1,
            due_at_ms: 1_700_000_060_000,
        },
        Record::Cancel { seq: 2 },
    ]
}

/// Regenerates the seed corpus: `cargo test -p belfry-store --test engine_fuzz_corpus --
/// --ignored write_seed_corpus`.
#[test]
#[ignore]
fn write_seed_corpus() {
    let dir = corpus_dir();
    fs::create_dir_all(&dir).unwrap();
    let records = sample_records();
    for (i, r) in records.iter().enumerate() {
        let mut bytes = Vec::new();
        record::encode(&mut bytes, r);
        fs::write(dir.join(format!("record-{i}")), bytes).unwrap();
    }
    let mut batch = WalBatch::new();
    for r in &records {
        batch.push(
            WalTarget {
                queue_uid: 3,
                bucket: 0x0100_0000_0001_c3a0,
            },
            r,
        );
    }
    fs::write(dir.join("wal-batch"), batch.finish()).unwrap();
    let changes = vec![
        MetaChange::put(
            "schedules",
            "nightly-report",
            Bytes::from_static(b"\x00\x01\x02\x03\x04\x05\x06\x07"),
        ),
        MetaChange::delete("schedules", "retired"),
    ];
    let mut bytes = Vec::new();
    record::encode_meta(&mut bytes, &changes);
    fs::write(dir.join("meta-record"), bytes).unwrap();
    let mut batch = WalBatch::new();
    batch.push_meta(&changes);
    fs::write(dir.join("wal-meta"), batch.finish()).unwrap();
}

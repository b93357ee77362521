//! Fuzzes the engine's record decoders: `cargo +nightly fuzz run record_decode`.
//! The seed corpus is `fuzz/corpus/record_decode/`; the normal test suite replays it
//! (`crates/belfry-store/tests/engine_fuzz_corpus.rs`).
#![no_main]

use belfry_store::engine::record;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Must never panic; a record that decodes must encode back to the same bytes.
    if let Ok((decoded, len)) = record::decode(data) {
        let mut again = Vec::new();
        record::encode(&mut again, &decoded);
        assert_eq!(&again[..], &data[..len]);
    }
    if let Ok((changes, len)) = record::decode_meta(data) {
        let mut again = Vec::new();
        record::encode_meta(&mut again, &changes);
        assert_eq!(&again[..], &data[..len]);
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
});

//! Subscriber sets in the engine: a model test against `MemoryStore` with tiny memtable and
//! compaction thresholds (so every few calls write a run and checkpoints merge them), with
//! clean reopens and crashes; and damaged run files.

use std::path::{Path, PathBuf};

use belfry_core::UserId;
use belfry_store::{Engine, EngineOptions, MemoryStore, Store, StoreError};
use proptest::prelude::*;

#[path = "support/damage.rs"]
mod damage;

const SETS: u64 = 4;
const POOL: usize = 24;

/// Users: numbers (stored as 8 bytes) and text ids, in a small pool so calls collide.
fn user(i: usize) -> UserId {
    let text = match i % 3 {
        0 => format!("u{i}"),
        1 => (i * 1_000_003).to_string(),
        _ => i.to_string(),
    };
    UserId::new(text).unwrap()
}

fn tiny() -> EngineOptions {
    EngineOptions {
        subs_memtable_bytes: 1_024,
        subs_compaction_min_runs: 2,
        background_checkpoints: false,
        ..EngineOptions::default()
    }
}

#[derive(Debug, Clone)]
enum Op {
    Subscribe(u64, Vec<usize>),
    Unsubscribe(u64, Vec<usize>),
    Drop(u64),
    Flush,
    Reopen,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    let set = 0..SETS;
    let users = proptest::collection::vec(0..POOL, 0..12);
    prop_oneof![
        6 => (set.clone(), users.clone()).prop_map(|(s, u)| Op::Subscribe(s, u)),
        3 => (set.clone(), users).prop_map(|(s, u)| Op::Unsubscribe(s, u)),
        1 => set.prop_map(Op::Drop),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
    ]
}

/// Every read of both stores agrees: counts, pages (of 3), membership and each user's sets.
fn compare(engine: &Engine, model: &MemoryStore) {
    for set in 0..SETS {
        assert_eq!(
            engine.subscriber_count(set).unwrap(),
            model.subscriber_count(set).unwrap(),
            "count of {set}"
        );
        let mut after: Option<UserId> = None;
        loop {
            let got = engine.subscribers(set, after.as_ref(), 3).unwrap();
            let want = model.subscribers(set, after.as_ref(), 3).unwrap();
            assert_eq!(got, want, "page of {set} after {after:?}");
            if got.len() < 3 {
                break;
            }
            after = got.last().cloned();
        }
        for i in 0..POOL {
            let u = user(i);
            assert_eq!(
                engine.is_subscribed(set, &u).unwrap(),
                model.is_subscribed(set, &u).unwrap(),
                "{u} in {set}"
            );
        }
    }
    for i in 0..POOL {
        let u = user(i);
        assert_eq!(
            engine.user_sets(&u, 10).unwrap(),
            model.user_sets(&u, 10).unwrap(),
            "sets of {u}"
        );
        assert_eq!(
            engine.user_sets(&u, 1).unwrap(),
            model.user_sets(&u, 1).unwrap()
        );
    }
}

fn run_ops(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::open(dir.path(), tiny()).unwrap();
    let model = MemoryStore::new();
    for op in ops {
        match op {
            Op::Subscribe(set, users) => {
                let users: Vec<UserId> = users.into_iter().map(user).collect();
                assert_eq!(
                    engine.subscribe(set, &users).unwrap(),
                    model.subscribe(set, &users).unwrap()
                );
            }
            Op::Unsubscribe(set, users) => {
                let users: Vec<UserId> = users.into_iter().map(user).collect();
                assert_eq!(
                    engine.unsubscribe(set, &users).unwrap(),
                    model.unsubscribe(set, &users).unwrap()
                );
            }
            Op::Drop(set) => {
                assert_eq!(engine.drop_set(set).unwrap(), model.drop_set(set).unwrap());
            }
            Op::Flush => engine.flush().unwrap(),
            Op::Reopen => {
                drop(engine);
                engine = Engine::open(dir.path(), tiny()).unwrap();
            }
            Op::Crash => {
                engine.abandon();
                engine = Engine::open(dir.path(), tiny()).unwrap();
            }
        }
        compare(&engine, &model);
    }
    drop(engine);
    let engine = Engine::open(dir.path(), tiny()).unwrap();
    compare(&engine, &model);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn subscriptions_match_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        run_ops(ops);
    }
}

/// A fixed sequence through the paths that matter: many runs merged, a drop while the set's
/// members are spread over runs and the memtable, a crash, and a new incarnation of the set
/// that must not bring old members back.
#[test]
fn drop_then_resubscribe_across_runs_and_crashes() {
    let mut ops = Vec::new();
    for round in 0..30 {
        ops.push(Op::Subscribe(
            1,
            (0..POOL).filter(|i| i % 2 == round % 2).collect(),
        ));
        ops.push(Op::Unsubscribe(1, vec![round % POOL, (round * 7) % POOL]));
        ops.push(Op::Subscribe(2, vec![round % POOL]));
        match round % 10 {
            3 => ops.push(Op::Crash),
            5 => ops.push(Op::Drop(1)),
            6 => ops.push(Op::Subscribe(1, vec![1, 2])),
            7 => ops.push(Op::Reopen),
            9 => ops.push(Op::Flush),
            _ => {}
        }
    }
    run_ops(ops);
}

/// The run files of a directory, after a flush that wrote (and merged) them.
fn runs(dir: &Path) -> Vec<PathBuf> {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(dir.join("subs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "run"))
        .collect();
    runs.sort();
    runs
}

fn filled(dir: &Path) -> Vec<UserId> {
    let engine = Engine::open(dir, EngineOptions::default()).unwrap();
    let users: Vec<UserId> = (0..5_000u64)
        .map(|i| UserId::new(i.to_string()).unwrap())
        .collect();
    assert_eq!(engine.subscribe(3, &users).unwrap(), 5_000);
    engine.flush().unwrap();
    users
}

fn flip(path: &Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, offset).unwrap();
    byte[0] ^= 0x5a;
    file.write_all_at(&byte, offset).unwrap();
}

fn assert_corrupt<T: std::fmt::Debug>(result: Result<T, StoreError>, file: &Path) {
    match result {
        Err(StoreError::Corrupt { location, .. }) => {
            let name = file.file_name().unwrap().to_str().unwrap();
            assert!(location.contains(name), "{location}");
            assert!(location.contains("offset"), "{location}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn a_damaged_block_is_corrupt_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let users = filled(dir.path());
    let run = runs(dir.path()).pop().expect("a run file");
    flip(&run, 100);
    // Open reads footers, indexes and bloom filters only: it succeeds.
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    assert_eq!(engine.subscriber_count(3).unwrap(), 5_000);
    assert_corrupt(engine.subscribers(3, None, 10), &run);
    assert_corrupt(engine.is_subscribed(3, &users[0]), &run);
    assert_corrupt(engine.subscribe(3, &users[..1]), &run);
    // The engine is not stopped by a bad read: other sets still work.
    assert_eq!(engine.subscribe(4, &users[..3]).unwrap(), 3);
}

#[test]
fn a_damaged_footer_or_a_missing_run_is_corrupt_at_open() {
    let dir = tempfile::tempdir().unwrap();
    filled(dir.path());
    let run = runs(dir.path()).pop().unwrap();
    let len = std::fs::metadata(&run).unwrap().len();
    flip(&run, len - 20);
    assert_corrupt(Engine::open(dir.path(), EngineOptions::default()), &run);
    std::fs::remove_file(&run).unwrap();
    assert_corrupt(Engine::open(dir.path(), EngineOptions::default()), &run);
}

#[test]
fn stray_run_files_are_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    filled(dir.path());
    let stray = dir.path().join("subs").join("00000000000000ff.run");
    std::fs::write(&stray, b"left by a checkpoint that did not finish").unwrap();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    assert!(!stray.exists());
    assert_eq!(engine.subscriber_count(3).unwrap(), 5_000);
}

/// A zeroed block reads as an error from every path, never as a block with no members: paging
/// (which the fan-out uses) and membership alike, and a merge does not copy it away.
#[test]
fn a_zeroed_block_is_corrupt_for_pages_lookups_and_merges() {
    let dir = tempfile::tempdir().unwrap();
    let users = filled(dir.path());
    let run = runs(dir.path()).pop().expect("a run file");
    let (offset, len) = damage::run_block(&run, 3);
    damage::zero(&run, offset, len);
    let engine = Engine::open(dir.path(), tiny()).unwrap();
    let mut after: Option<UserId> = None;
    let mut seen = 0;
    let paged = loop {
        match engine.subscribers(3, after.as_ref(), 1_000) {
            Ok(page) if page.is_empty() => break Ok(seen),
            Ok(page) => {
                seen += page.len();
                after = page.last().cloned();
            }
            Err(error) => break Err(error),
        }
    };
    assert_corrupt(paged, &run);
    assert!(seen < users.len());
    let lookups: Vec<_> = users.iter().map(|u| engine.is_subscribed(3, u)).collect();
    assert!(
        lookups.iter().all(|r| !matches!(r, Ok(false))),
        "a member read as absent"
    );
    assert_corrupt(lookups.into_iter().find(|r| r.is_err()).unwrap(), &run);
    // A merge of that run with a new one fails rather than write a run without the block.
    // (Larger than the damaged run, so that the size-tiered policy merges the two.)
    let more: Vec<UserId> = (0..6_000u64)
        .map(|i| UserId::new(format!("m{i}")).unwrap())
        .collect();
    // (The tiny memtable may make the subscribe itself checkpoint and merge.)
    let merged = engine.subscribe(4, &more).and_then(|_| engine.flush());
    let name = run.file_name().unwrap().to_str().unwrap();
    let wanted = format!("{name} at offset {offset}");
    assert!(
        merged
            .as_ref()
            .is_err_and(|e| e.to_string().contains(&wanted)),
        "{merged:?}"
    );
}

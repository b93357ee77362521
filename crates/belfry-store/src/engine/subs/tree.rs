//! The checkpoint's part of the tree: freeze the memtable at the WAL switch and write it to a
//! run; after the checkpoint, merge runs (size-tiered); and the runs a reopen starts from.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::keys::{split_by_set, split_by_user, SPACE_BY_SET, SPACE_BY_USER};
use super::memtable::{Memtable, SlabSource};
use super::{Subs, SUBS_DIR};
use crate::engine::lsm::merge::{Merge, RunCursor, Source};
use crate::engine::lsm::run::{Run, RunKind};
use crate::engine::lsm::{
    self, merge_output_bound, open_listed_runs, pick, postpone_full_merge, release_free_memory,
};
use crate::engine::persist::{sync_dir, SubsPersisted};
use crate::engine::Core;
use crate::store::{Result, StoreError};

/// What phase A of a checkpoint took from the tree.
#[derive(Debug, Default)]
pub(crate) struct SubsPlan {
    frozen: Option<Arc<Memtable>>,
    /// Set → epoch of every set with members as of the WAL switch: an entry of any other
    /// epoch is dead for good (epochs only grow).
    epochs: FxHashMap<u64, u64>,
    /// Counters as of the WAL switch; runs filled in once written.
    pub(crate) persisted: SubsPersisted,
    /// Run files merged away: deleted once this checkpoint, which no longer lists them, is
    /// written.
    pub(crate) obsolete: Vec<PathBuf>,
}

impl Subs {
    /// Phase A (under the subs lock, before the WAL switch): freezes the memtable and
    /// copies the counters.
    pub(crate) fn freeze(&mut self) -> SubsPlan {
        let mem = std::mem::take(&mut self.mem);
        let frozen = (!mem.is_empty()).then(|| Arc::new(mem));
        self.frozen.clone_from(&frozen);
        let mut sets: Vec<(u64, u64, u64)> = self
            .sets
            .iter()
            .map(|(&set, info)| (set, info.epoch, info.count))
            .collect();
        sets.sort_unstable();
        SubsPlan {
            frozen,
            epochs: self.sets.iter().map(|(&s, i)| (s, i.epoch)).collect(),
            persisted: SubsPersisted {
                next_epoch: self.next_epoch,
                sets,
                ..SubsPersisted::default()
            },
            obsolete: Vec::new(),
        }
    }
}

impl Core {
    /// Phase B: writes the frozen memtable to a run and notes the runs the checkpoint lists.
    /// Reads go on meanwhile (the subs lock is taken only to swap).
    pub(crate) fn subs_write_runs(&self, plan: &mut SubsPlan) -> Result<()> {
        let dir = self.subs.lock().dir.clone();
        if let Some(frozen) = plan.frozen.take() {
            let (id, bottom) = {
                let mut subs = self.subs.lock();
                subs.next_run += 1;
                (subs.next_run - 1, subs.runs.is_empty())
            };
            let set_keys = frozen.count_below(&[SPACE_BY_USER]);
            let sources: Vec<Box<dyn Source + '_>> = frozen
                .slabs
                .iter()
                .map(|s| Box::new(SlabSource::new(s, &[])) as Box<dyn Source + '_>)
                .collect();
            let run = write_merged(
                &dir,
                id,
                Merge::new(sources),
                set_keys,
                &plan.epochs,
                bottom,
            )?;
            sync_dir(&dir)?;
            let mut subs = self.subs.lock();
            if let Some(run) = run {
                self.space.wrote(run.file_bytes);
                subs.runs.insert(0, Arc::new(run));
            }
            subs.frozen = None;
        }
        // The runs as of now, merged ones included, and the files merges replaced (which
        // this checkpoint no longer lists, so it deletes them once written).
        let mut subs = self.subs.lock();
        plan.persisted.runs = subs.runs.iter().map(|r| r.id).collect();
        plan.persisted.next_run = subs.next_run;
        plan.obsolete = std::mem::take(&mut subs.retired);
        Ok(())
    }

    /// Merges runs while the policy picks some; returns whether it merged any. Runs after a
    /// checkpoint, holding `compacting` but not the checkpoint guard: a merge of large runs
    /// takes seconds, and writers that outran the checkpoint thread wait for a checkpoint,
    /// never for a merge. Reads go on meanwhile (the subs lock is taken only to pick and to
    /// swap). A failure stops the engine, as a checkpoint's does.
    pub(crate) fn subs_compact(&self) -> Result<bool> {
        let _guard = self.compacting.lock();
        let dir = self.subs.lock().dir.clone();
        let mut merged = false;
        loop {
            match self.subs_compact_once(&dir, false) {
                Ok(true) => merged = true,
                Ok(false) => {
                    if merged {
                        release_free_memory();
                    }
                    return Ok(merged);
                }
                Err(error) => return Err(self.state.lock().poison(&error)),
            }
        }
    }

    /// Merges the runs into one or two ([`settle_pick`]) if the tree saw no change since
    /// the last look (`changes_seen`, updated here); returns whether it merged any.
    pub(crate) fn subs_settle(&self, changes_seen: &mut u64) -> Result<bool> {
        let _guard = self.compacting.lock();
        let (dir, changes) = {
            let subs = self.subs.lock();
            (subs.dir.clone(), subs.changes)
        };
        let idle = changes == std::mem::replace(changes_seen, changes);
        if !idle {
            return Ok(false);
        }
        let merged = self
            .subs_compact_once(&dir, true)
            .map_err(|error| self.state.lock().poison(&error))?;
        if merged {
            release_free_memory();
        }
        Ok(merged)
    }

    /// Merges the newest runs if the policy picks some (`settle`: the settle policy); returns
    /// whether it did.
    fn subs_compact_once(&self, dir: &Path, settle: bool) -> Result<bool> {
        let (inputs, bottom, id, epochs) = {
            let mut subs = self.subs.lock();
            let k = match settle {
                true => settle_pick(&subs.runs),
                false => pick(&subs.runs, self.options.subs_compaction_min_runs),
            };
            if k == 0 {
                return Ok(false);
            }
            // Its output is written beside its inputs, which go only once the next
            // checkpoint stops listing them: it needs room for a copy (issue #12).
            let output = merge_output_bound(&subs.runs[..k]);
            if !self
                .space
                .room_for_merge(output, "a merge of subscription runs")
            {
                return Ok(false);
            }
            subs.next_run += 1;
            let inputs: Vec<Arc<Run>> = subs.runs[..k].to_vec();
            // Entries of any other epoch are dead for good (epochs only grow), and entries
            // of sets made later are in newer runs than these.
            let epochs: FxHashMap<u64, u64> =
                subs.sets.iter().map(|(&s, i)| (s, i.epoch)).collect();
            (inputs, k == subs.runs.len(), subs.next_run - 1, epochs)
        };
        #[cfg(test)]
        drop(self.merge_gate.lock());
        let set_keys = inputs.iter().map(|r| r.filtered_keys_hint()).sum();
        let mut sources: Vec<Box<dyn Source + '_>> = Vec::with_capacity(inputs.len());
        for run in &inputs {
            sources.push(Box::new(RunCursor::new(run, &[])?));
        }
        let out = match write_merged(dir, id, Merge::new(sources), set_keys, &epochs, bottom) {
            Ok(out) => out,
            Err(error) if postpone_full_merge(dir, id, &error) => return Ok(false),
            Err(error) => return Err(error),
        };
        sync_dir(dir)?;
        let mut subs = self.subs.lock();
        if let Some(run) = &out {
            self.space.wrote(run.file_bytes);
        }
        // Checkpoints only add runs in front and merges run one at a time, so the inputs
        // are still next to each other (and still the oldest if they were).
        let at = subs
            .runs
            .iter()
            .position(|r| Arc::ptr_eq(r, &inputs[0]))
            .ok_or_else(|| StoreError::Corrupt {
                location: format!("subscription runs under {}", dir.display()),
                detail: "a run being merged left the tree".into(),
            })?;
        subs.runs.splice(at..at + inputs.len(), out.map(Arc::new));
        subs.retired.extend(inputs.iter().map(|r| r.path.clone()));
        Ok(true)
    }
}

/// How many of the newest runs a quiet tree merges (0: none): all of them once the newer
/// runs hold a quarter of the oldest's entries, else all but the oldest, so that a tree
/// settles to one or two runs and a small change after a large load rewrites the small runs,
/// not the load.
fn settle_pick(runs: &[Arc<Run>]) -> usize {
    settle_count(&runs.iter().map(|r| r.entries).collect::<Vec<_>>())
}

fn settle_count(entries: &[u64]) -> usize {
    let Some((&oldest, newer)) = entries.split_last() else {
        return 0;
    };
    let newer_total: u64 = newer.iter().sum();
    if !newer.is_empty() && newer_total.saturating_mul(4) >= oldest {
        entries.len()
    } else if newer.len() >= 2 {
        newer.len()
    } else {
        0
    }
}

/// Whether an entry belongs to a set incarnation that still has members.
fn is_current(key: &[u8], epochs: &FxHashMap<u64, u64>) -> Option<bool> {
    let (set, epoch) = match *key.first()? {
        SPACE_BY_SET => split_by_set(key).map(|(s, e, _)| (s, e))?,
        SPACE_BY_USER => split_by_user(key, 2 + *key.get(1)? as usize)?,
        _ => return None,
    };
    Some(epochs.get(&set) == Some(&epoch))
}

/// Writes the merged entries to run `id`, leaving out dead sets' entries and, at the bottom
/// (no older run), tombstones. `None` (and no file) if nothing is left.
fn write_merged(
    dir: &Path,
    id: u64,
    merge: Merge<'_>,
    set_keys: usize,
    epochs: &FxHashMap<u64, u64>,
    bottom: bool,
) -> Result<Option<Run>> {
    lsm::write_merged(dir, id, RunKind::Subs, set_keys, merge, |key, live| {
        let current = is_current(key, epochs).ok_or_else(|| StoreError::Corrupt {
            location: format!("subscription runs under {}", dir.display()),
            detail: format!("malformed key {key:?}"),
        })?;
        // An old epoch's entry is dead for good; a removal has nothing left to hide in the
        // bottom run.
        Ok((current && (live || !bottom)).then_some(live))
    })
}

/// Opens the runs a checkpoint lists and removes the other files of the runs directory
/// ([`open_listed_runs`]).
pub(crate) fn open_runs(data_dir: &Path, persisted: &SubsPersisted) -> Result<Vec<Arc<Run>>> {
    open_listed_runs(&data_dir.join(SUBS_DIR), RunKind::Subs, &persisted.runs)
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use belfry_core::UserId;

    use crate::engine::{Engine, EngineOptions};
    use crate::store::Store;

    #[test]
    fn a_quiet_tree_settles_to_one_or_two_runs() {
        use super::settle_count;
        assert_eq!(settle_count(&[]), 0);
        assert_eq!(settle_count(&[100]), 0);
        // Newer runs with a quarter of the oldest's entries or more: all merge.
        assert_eq!(settle_count(&[10, 15, 100]), 3);
        assert_eq!(settle_count(&[30, 100]), 2);
        // Less: the newer ones merge among themselves, the oldest stays.
        assert_eq!(settle_count(&[1, 2, 3, 100]), 3);
        assert_eq!(settle_count(&[5, 100]), 0);
    }

    fn users(batch: usize) -> Vec<UserId> {
        (0..50)
            .map(|i| UserId::new(format!("user-{batch}-{i}")).unwrap())
            .collect()
    }

    /// Run merges take seconds on large runs. They run after a checkpoint without its
    /// guard, so writers that outran the checkpoint thread (and run a checkpoint themselves)
    /// go on while a merge is held.
    #[test]
    fn writers_go_on_while_a_merge_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let options = EngineOptions {
            subs_memtable_bytes: 2_048,
            subs_compaction_min_runs: 2,
            background_checkpoints: true,
            ..EngineOptions::default()
        };
        let engine = Engine::open(dir.path(), options).unwrap();
        let mut gate = Some(engine.core.merge_gate.lock());
        let held = std::thread::scope(|scope| {
            let (done, finished) = mpsc::channel();
            let engine = &engine;
            scope.spawn(move || {
                for batch in 0..200 {
                    engine.subscribe(batch % 3, &users(batch as usize)).unwrap();
                }
                let _ = done.send(());
            });
            let held = finished.recv_timeout(Duration::from_secs(30));
            if held.is_err() {
                // Let the writers finish so that the failure is reported.
                gate = None;
            }
            held
        });
        assert!(held.is_ok(), "writers waited for the held merge");
        // A merge was due and is waiting at the gate (it holds `compacting` meanwhile).
        let deadline = Instant::now() + Duration::from_secs(10);
        while engine.core.compacting.try_lock().is_some() {
            assert!(Instant::now() < deadline, "no merge was held");
            std::thread::yield_now();
        }
        let runs_held = engine.core.subs.lock().runs.len();
        drop(gate);
        engine.flush().unwrap();
        let runs_after = engine.core.subs.lock().runs.len();
        assert!(
            runs_after < runs_held,
            "{runs_after} runs after the merges, {runs_held} before"
        );
        assert_batches(&engine, 200, 3);
        // Only the runs the last checkpoint lists are on disk. Merged runs are deleted by the
        // checkpoint after the merge; the checkpoint thread may be running that one, and a
        // second flush waits for it.
        engine.flush().unwrap();
        assert_eq!(run_files(dir.path()), runs_after);
    }

    /// Batch `b` of `batches` went to set `b % sets`: each batch's users are in their set
    /// alone, and every set holds its batches' users.
    fn assert_batches(engine: &Engine, batches: u64, sets: u64) {
        for batch in 0..batches {
            let user = &users(batch as usize)[7];
            assert_eq!(engine.user_sets(user, 10).unwrap(), vec![batch % sets]);
        }
        for set in 0..sets {
            let in_set = (0..batches).filter(|b| b % sets == set).count() as u64;
            assert_eq!(engine.subscriber_count(set).unwrap(), in_set * 50);
        }
    }

    fn run_files(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir.join(super::SUBS_DIR))
            .unwrap()
            .count()
    }

    /// A tree that stops changing is merged into one run by the checkpoint thread, which
    /// the next checkpoint lists; one that keeps changing is left to size-tiered merges.
    #[test]
    fn a_quiet_tree_is_merged_into_one_run() {
        let dir = tempfile::tempdir().unwrap();
        let options = EngineOptions {
            subs_memtable_bytes: 2_048,
            // No size-tiered merge below 24 runs: what merges here is the settle.
            subs_compaction_min_runs: 1_000,
            background_checkpoints: true,
            subs_settle_after: Some(Duration::from_millis(50)),
            ..EngineOptions::default()
        };
        let engine = Engine::open(dir.path(), options).unwrap();
        for batch in 0..6 {
            engine.subscribe(batch % 2, &users(batch as usize)).unwrap();
            engine.flush().unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while engine.core.subs.lock().runs.len() > 1 {
            assert!(Instant::now() < deadline, "the runs were not merged");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_batches(&engine, 6, 2);
        // The checkpoint after the merge lists it and deletes the rest (a flush waits for
        // one in progress).
        engine.flush().unwrap();
        assert_eq!(run_files(dir.path()), 1);
        drop(engine);
        let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
        assert_eq!(engine.subscriber_count(0).unwrap(), 3 * 50);
    }
}

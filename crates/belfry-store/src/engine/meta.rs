//! Small metadata (`put_meta`, `delete_meta`, `write_meta`): schedules and their cursors.
//!
//! A metadata call costs one small WAL record (kind 10, every change of the call in one frame,
//! so a `write_meta` survives a crash whole or not at all), group-committed and fsync'd like a
//! put. The entries live in memory under their own lock (`Core::meta`), not the state lock:
//! a call takes the state lock only to queue its frame, so a storm of cursor writes never
//! makes a claim wait for an fsync or for a copy of the metadata. A checkpoint writes the
//! whole map into the checkpoint file, so replay at open reads only the metadata records
//! written since.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use parking_lot::MutexGuard;

use super::persist::MetaEntries;
use super::record::{self, WalBatch};
use super::space::Use;
use super::Engine;
use crate::store::{MetaChange, Result, StoreError};

impl Engine {
    /// Applies `changes` in order as one durable WAL frame.
    pub(super) fn meta_write(&self, changes: Vec<MetaChange>) -> Result<()> {
        if changes.is_empty() {
            return self.check_open();
        }
        let frame = meta_frame(&changes)?;
        // Deletes alone only shrink the entries; any put grows them (in the WAL now, in the
        // checkpoint later) and respects the free-space reserve.
        if changes.iter().any(|c| c.value.is_some()) {
            self.core.space.admit(2 * frame.len() as u64, Use::Growth)?;
        }
        let meta = self.core.meta.lock();
        self.commit_meta(meta, &frame, changes)
    }

    /// Deletes one entry; writes nothing (and returns `false`) if there is none.
    pub(super) fn meta_delete(&self, namespace: &str, key: &str) -> Result<bool> {
        let changes = vec![MetaChange::delete(namespace, key)];
        let meta = self.core.meta.lock();
        if !meta.contains_key(&(namespace.to_owned(), key.to_owned())) {
            drop(meta);
            self.check_open()?;
            return Ok(false);
        }
        let frame = meta_frame(&changes)?;
        self.commit_meta(meta, &frame, changes)?;
        Ok(true)
    }

    pub(super) fn meta_get(&self, namespace: &str, key: &str) -> Result<Option<Bytes>> {
        self.check_open()?;
        let meta = self.core.meta.lock();
        Ok(meta.get(&(namespace.to_owned(), key.to_owned())).cloned())
    }

    pub(super) fn meta_get_many(
        &self,
        namespace: &str,
        keys: &[&str],
    ) -> Result<Vec<Option<Bytes>>> {
        self.check_open()?;
        let meta = self.core.meta.lock();
        // One key buffer for all the lookups (the map's keys are owned pairs).
        let mut probe = (namespace.to_owned(), String::new());
        Ok(keys
            .iter()
            .map(|key| {
                probe.1.clear();
                probe.1.push_str(key);
                meta.get(&probe).cloned()
            })
            .collect())
    }

    pub(super) fn meta_list(&self, namespace: &str) -> Result<Vec<(String, Bytes)>> {
        self.check_open()?;
        let meta = self.core.meta.lock();
        Ok(meta
            .range((namespace.to_owned(), String::new())..)
            .take_while(|((ns, _), _)| ns == namespace)
            .map(|((_, key), value)| (key.clone(), value.clone()))
            .collect())
    }

    /// Queues the frame (holding the state lock for just that), applies the changes to
    /// memory, releases the metadata lock, then waits for the frame's fsync (group commit).
    /// The metadata lock is held from queueing to applying, so memory and the WAL see a key's
    /// changes in the same order, and a checkpoint (which takes the metadata lock before the
    /// WAL switch) copies exactly the changes of the frames before the switch.
    fn commit_meta(
        &self,
        mut meta: MutexGuard<'_, MetaEntries>,
        frame: &[u8],
        changes: Vec<MetaChange>,
    ) -> Result<()> {
        let (ticket, need) = {
            let mut state = self.lock_state()?;
            let ticket = state.enqueue(frame);
            (ticket, self.checkpoint_due(&state))
        };
        apply(&mut meta, changes);
        drop(meta);
        self.finish(ticket, false, need)
    }

    /// `Poisoned` if the engine stopped after a fatal error, without taking the state lock
    /// unless it did.
    pub(super) fn check_open(&self) -> Result<()> {
        let stopped = self.core.poisoned.load(Ordering::Acquire)
            || self.core.wal.failed.load(Ordering::Acquire);
        if stopped {
            // Reports why (and records a failed background fsync as the reason).
            drop(self.lock_state()?);
        }
        Ok(())
    }
}

/// The WAL frame of one metadata call, or `Invalid` if the changes do not fit the format.
fn meta_frame(changes: &[MetaChange]) -> Result<Vec<u8>> {
    record::check_meta(changes).map_err(StoreError::Invalid)?;
    let mut batch = WalBatch::with_capacity(16 + record::meta_size_hint(changes));
    batch.push_meta(changes);
    Ok(batch.finish())
}

/// Applies changes in order: a put sets the value, a delete removes the key.
pub(super) fn apply(entries: &mut MetaEntries, changes: Vec<MetaChange>) {
    for change in changes {
        let key = (change.namespace, change.key);
        match change.value {
            Some(value) => {
                entries.insert(key, value);
            }
            None => {
                entries.remove(&key);
            }
        }
    }
}

//! What a tick gathers before it writes: the firings due, and the cursors to write once they
//! are stored, each with the ownership lease under which the tick took up its schedule.
//!
//! With several nodes on one store, a node decides to fire a schedule when it owns the
//! schedule's key, then writes (the firing's tasks, then the cursor) a moment later. A node
//! paused in between for longer than its lease (`SIGSTOP`, a VM pause) loses the schedule to
//! another node, which fires it too. Within the store's memory of finished keys the firing's
//! idempotency keys absorb that; after it, the paused node's put would make a second task for
//! the same fire time, and its stale cursor would roll the new owner's back (a `catch_up`
//! schedule would fire again everything since). So every write is checked against the lease
//! it was decided under ([`still_owned`]), right before it is made: a lease that lapsed or
//! changed hands (even back to this node) drops the write, and the new owner's stands.

use std::sync::Arc;

use belfry_core::UnixMs;
use belfry_store::{MetaChange, Store};

use crate::service::Parsed;

/// The ownership lease a schedule was taken up under (`Store::ownership`).
pub(crate) type Lease = Arc<str>;

/// One fire time of a schedule, to be stored as its tasks.
pub(crate) type Firing = (Arc<Parsed>, UnixMs, Lease);

/// Firings gathered by a tick, in order, with the number of tasks they make, and the cursors
/// to write once they are stored.
#[derive(Default)]
pub(crate) struct Firings {
    pub(crate) due: Vec<Firing>,
    pub(crate) tasks: usize,
    pub(crate) cursors: Vec<(Arc<Parsed>, Lease, MetaChange)>,
}

impl Firings {
    pub(crate) fn add(&mut self, parsed: &Arc<Parsed>, fire_ms: UnixMs, lease: &Lease) {
        self.tasks += parsed.spec.shard_count() as usize;
        self.due.push((parsed.clone(), fire_ms, lease.clone()));
    }

    /// The cursors whose schedules are still owned under their leases; the others are
    /// dropped (their new owner writes its own).
    pub(crate) fn owned_cursors(&mut self, store: &dyn Store) -> Vec<MetaChange> {
        std::mem::take(&mut self.cursors)
            .into_iter()
            .filter(|(parsed, lease, _)| still_owned(store, parsed, lease))
            .map(|(_, _, change)| change)
            .collect()
    }
}

/// Whether this node still owns `parsed`'s schedule under `lease`, the lease it was taken up
/// under.
pub(crate) fn still_owned(store: &dyn Store, parsed: &Parsed, lease: &str) -> bool {
    store.ownership(parsed.owner_key()).as_deref() == Some(lease)
}

/// Keeps the firings whose schedules are still owned under their leases; answers how many
/// were dropped.
pub(crate) fn keep_owned(store: &dyn Store, batch: &mut Vec<Firing>) -> usize {
    let before = batch.len();
    batch.retain(|(parsed, _, lease)| still_owned(store, parsed, lease));
    before - batch.len()
}

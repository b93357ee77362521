//! Belfry's [`Store`](belfry_store::Store) on Redis or Redis Cluster.
//!
//! **Layout.** The store cuts every queue into `partitions` (256 by default) by hash tag:
//! partition `p` of every queue lives in one slot, `{ns/p}`, so each task call is one Lua
//! script on one slot (`lua/`), atomic there. A task's id names its queue incarnation,
//! partition and sequence (`keys.rs`). Per queue and partition there are two due-time sorted
//! sets of 8-byte sequences (high and normal priority), one of leases by deadline, a hash of
//! records (header + payload, `record.rs`), idempotency keys, dead letters and recently
//! finished tasks (kept a minute without payload, so reads and idempotency keys still see
//! them for that long, and not after, whether or not a script forgot them yet). Tasks due far ahead (`RedisOptions::far_after_ms`) wait instead in far-future
//! bucket lists of a few bytes per task, which claims promote into the sorted sets shortly
//! before they are due (`lua/prelude.lua`). A per-queue *hint* sorted set says, for each partition, the earliest instant a claim
//! there could return work (or has a bucket to promote), so a claim visits only partitions
//! with due work; a claim sets the entries it visited only where no put lowered them since it
//! read the hint (`lua/hint_claim.lua`). A reminder's subscriber set is cut into `subscriber_shards` sorted sets by a
//! hash of the user id, each in its own slot, so a big set spreads over the masters (`subs.rs`).
//!
//! **Atomicity is per slot, not per call.** A `put` of tasks that land in several partitions
//! is one script per partition: a crash (or a failover) between them may keep some and not
//! others. Tasks with the same idempotency key always land in one partition, so their
//! de-duplication is exact. ARCHITECTURE.md records this decision.
//!
//! **Errors.** Timeouts, refused connections and failovers are
//! [`StoreError::Unavailable`](belfry_store::StoreError::Unavailable) (transient: the server
//! answers 503 with `Retry-After`); an unexpected reply or a damaged record is
//! `StoreError::Corrupt`, never a panic.

mod change_many;
mod claim;
mod claim_many;
mod conn;
mod each;
mod events;
mod health;
mod inflight;
mod keys;
mod layout;
mod list;
pub mod ownership;
mod record;
mod reply;
mod scripts;
mod store;
mod subs;
mod subs_page;
mod target;
mod tasks;
#[cfg(feature = "testing")]
pub mod testing;

pub use conn::Timeouts;
pub use ownership::{Ownership, OwnershipOptions, OwnershipStats};
pub use store::{
    RedisOptions, RedisStore, FAR_AFTER_MS_MIN, SUBSCRIBER_SHARDS_CLUSTER, SUBSCRIBER_SHARDS_MAX,
};
pub use target::{RedisTarget, TargetError};

/// The partition of a byte string (an idempotency key, an encoded user id): stable across
/// processes and versions, since data is placed by it.
pub(crate) fn partition_of(bytes: &[u8], partitions: u16) -> u16 {
    use std::hash::Hasher;
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0x6265_6c66_7279, 0x7061_7274);
    h.write(bytes);
    (h.finish() % u64::from(partitions.max(1))) as u16
}

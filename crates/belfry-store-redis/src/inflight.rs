//! A queue's in-flight cap held across every node on the store (`lua/inflight.lua`).
//!
//! One sorted set per queue, in its own slot, holds the queue's leases by deadline. A claim
//! reserves room first (one member that holds its places, so two nodes never grant the same
//! room), claims, then settles: the reservation gives way to the leases it took. Ending a lease (ack, nack,
//! dead letter) removes it in the same pipeline as the lease scripts, an extension moves its
//! deadline, and a lease nobody ends is pruned once its deadline passes, as its task is due
//! again then. A queue without a cap has no set, and the release is one cheap script call
//! that finds nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use belfry_core::{LeaseId, QueueName, TaskId, UnixMs};
use belfry_store::InFlightRoom;

use crate::conn::{unexpected, Result};
use crate::reply::{as_array, as_i64};
use crate::scripts;
use crate::store::RedisStore;

/// Reservation tokens: unique within the process, from a random start so that nodes' tokens
/// do not meet either.
static NEXT_TOKEN: LazyLock<AtomicU64> = LazyLock::new(|| {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    AtomicU64::new(h.finish())
});

/// A new reservation token (or waiter name).
pub(crate) fn next_token() -> u64 {
    NEXT_TOKEN.fetch_add(1, Ordering::Relaxed)
}

impl RedisStore {
    pub(crate) fn reserve_room(
        &self,
        queue: &QueueName,
        want: u64,
        cap: u64,
        now_ms: UnixMs,
        until_ms: UnixMs,
    ) -> Result<InFlightRoom> {
        let token = next_token();
        self.with_queue(queue, |this, c, uid| {
            let keys = this.room_keys(uid);
            let args = [
                b"reserve".to_vec(),
                now_ms.to_string().into_bytes(),
                token.to_string().into_bytes(),
                want.to_string().into_bytes(),
                cap.to_string().into_bytes(),
                until_ms.to_string().into_bytes(),
                this.waiter.to_string().into_bytes(),
            ];
            let v = this.script(
                c,
                &scripts::INFLIGHT,
                &keys,
                &args,
                "reserve in-flight room",
            )?;
            let bad = || unexpected("reserve in-flight room", &v);
            let [granted, earliest] = as_array(&v).ok_or_else(bad)? else {
                return Err(bad());
            };
            let granted = as_i64(granted).ok_or_else(bad)?.max(0) as u64;
            let earliest = as_i64(earliest).ok_or_else(bad)?;
            Ok(InFlightRoom {
                granted: granted.min(want),
                token,
                earliest_until_ms: (earliest >= 0).then_some(earliest as u64),
            })
        })
    }

    pub(crate) fn settle_room(
        &self,
        queue: &QueueName,
        room: &InFlightRoom,
        leases: &[(LeaseId, UnixMs)],
        now_ms: UnixMs,
    ) -> Result<()> {
        if room.granted == 0 && leases.is_empty() {
            return Ok(());
        }
        self.with_queue(queue, |this, c, uid| {
            let keys = this.room_keys(uid);
            let mut args = Vec::with_capacity(4 + 2 * leases.len());
            args.push(b"settle".to_vec());
            args.push(now_ms.to_string().into_bytes());
            args.push(room.token.to_string().into_bytes());
            args.push(room.granted.to_string().into_bytes());
            for (lease, until) in leases {
                args.push(lease.0.to_string().into_bytes());
                args.push(until.to_string().into_bytes());
            }
            this.script(c, &scripts::INFLIGHT, &keys, &args, "settle in-flight room")?;
            Ok(())
        })
    }

    /// The script call that frees (`ack`, `nack`, `dead`, `dead_untried`) or moves (`extend`, whose values
    /// are the new deadlines) the in-flight room of the leases in a lease call, to run in the
    /// same pipeline as the lease scripts (`lua/inflight_end.lua`). A lease the scripts refuse
    /// is, in the set, either gone already or past its deadline (which `extend` leaves
    /// alone), so the call need not wait for their answers.
    pub(crate) fn room_cmd(
        &self,
        queue: &QueueName,
        uid: u64,
        op: &str,
        items: &[(TaskId, LeaseId, Vec<u8>)],
        now_ms: UnixMs,
    ) -> Option<redis::Cmd> {
        let keys = self.room_keys(uid);
        let mut args = vec![op.as_bytes().to_vec(), now_ms.to_string().into_bytes()];
        match op {
            "ack" | "nack" | "dead" | "dead_untried" => {
                args[0] = b"release".to_vec(); // the four ops end the lease alike
                args.push(self.keys.events().into_bytes());
                args.push(crate::events::wake_message(queue));
                args.extend(items.iter().map(|(_, l, _)| l.0.to_string().into_bytes()));
            }
            "extend" => {
                for (_, lease, until) in items {
                    args.push(lease.0.to_string().into_bytes());
                    args.push(until.clone());
                }
            }
            _ => return None,
        }
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(scripts::INFLIGHT_END)
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        Some(cmd)
    }

    fn room_keys(&self, uid: u64) -> Vec<Vec<u8>> {
        self.keys
            .in_flight(uid)
            .into_iter()
            .map(String::into_bytes)
            .collect()
    }
}

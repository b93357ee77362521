//! Listing a queue's live tasks in id order ([`belfry_store::Store::list_tasks`]): partition
//! after partition, and within one in sequence order, a page at a time.
//!
//! Nothing in a partition orders its live tasks by sequence (its ready and lease sets are
//! ordered by time, its bucket lists by arrival), and the listing adds no index for every put
//! to write. The read script's `live` op reads a partition's page one of two ways instead
//! (`lua/read.lua`):
//!
//! - a **probe** reads the record hash sequence by sequence from the cursor on, a bounded
//!   number of sequences a call, and stops once it has the page: its cost is the sequences
//!   it passes, cheap where live tasks are dense among the sequences the partition gave out
//!   (to tasks, and to leases), whatever the partition holds;
//! - a **scan** reads the partition's ready sets, lease set and bucket lists whole, a chunk at
//!   a time, keeping only the page's smallest sequences after the cursor: its cost is the
//!   live tasks of the partition, every page, and it is one script (an atomic read, so that a
//!   task moving between the sets is seen once).
//!
//! A page probes first and turns to scanning once it has probed as many sequences as the
//! partition holds live tasks (a partition holding few is scanned at once), so a page costs at
//! most about twice the cheaper of the two. Either way a call answers the live tasks of a
//! range of sequences just after the cursor and where the range ends, so the calls of a walk
//! cover every sequence once: a task live throughout the walk is listed once.

use belfry_core::{QueueName, Task, TaskId, UnixMs};

use crate::conn::{unexpected, Conn, Result};
use crate::keys::listing_start;
use crate::reply::{as_array, as_i64};
use crate::store::RedisStore;
use crate::tasks::task_of;

/// Sequences one probe call reads at most: a few milliseconds of Redis's time.
const PROBE_STEP: u64 = 1024;

impl RedisStore {
    pub(crate) fn list_live_tasks(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
        now_ms: UnixMs,
    ) -> Result<Vec<Task>> {
        self.with_queue(queue, |this, c, uid| {
            let mut out = Vec::new();
            let Some((first_p, mut after_seq)) = listing_start(after, uid) else {
                return Ok(out);
            };
            for p in first_p..this.keys.partitions {
                if out.len() >= limit {
                    break;
                }
                let from = after_seq.take().unwrap_or(0);
                let page = Page {
                    queue,
                    uid,
                    p,
                    limit,
                    now_ms,
                };
                this.list_partition(c, &page, from, &mut out)?;
            }
            Ok(out)
        })
    }

    /// Appends to `out` the live tasks of partition `page.p` after sequence `after`, in
    /// sequence order, until `out` holds `page.limit` tasks or the partition has no more.
    fn list_partition(
        &self,
        c: &mut Conn,
        page: &Page<'_>,
        mut after: u64,
        out: &mut Vec<Task>,
    ) -> Result<()> {
        let part = self.part(page.p, page.uid);
        // Sequences this page probed in the partition, and the live tasks it holds (unknown
        // before the first call).
        let (mut probed, mut live) = (0u64, u64::MAX);
        while out.len() < page.limit {
            let want = page.limit - out.len();
            let budget = if probed >= live { 0 } else { PROBE_STEP };
            let args = [
                b"live".to_vec(),
                after.to_string().into_bytes(),
                want.to_string().into_bytes(),
                budget.to_string().into_bytes(),
            ];
            let v = self.read(c, &part, &args)?;
            let bad = || unexpected("list live tasks", &v);
            let items = as_array(&v).ok_or_else(bad)?;
            let [next, count, found @ ..] = items else {
                return Err(bad());
            };
            if found.len() % 2 != 0 || found.len() / 2 > want {
                return Err(bad());
            }
            let Page {
                queue,
                uid,
                p,
                now_ms,
                ..
            } = *page;
            for pair in found.chunks(2) {
                out.push(task_of(queue, uid, p, &pair[0], &pair[1], None, now_ms)?);
            }
            live = as_i64(count)
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(bad)?;
            let next = as_i64(next).ok_or_else(bad)?;
            if next < 0 {
                return Ok(());
            }
            // Each call covers at least one sequence past the cursor: a reply that does not
            // would never end the walk.
            let next = u64::try_from(next)
                .ok()
                .filter(|n| *n > after)
                .ok_or_else(bad)?;
            if budget > 0 {
                probed += next - after;
            }
            after = next;
        }
        Ok(())
    }
}

/// What every call of one page shares: the queue, its uid, the partition read, the page's
/// size and its now (by which an ended lease reads as scheduled).
#[derive(Clone, Copy)]
struct Page<'a> {
    queue: &'a QueueName,
    uid: u64,
    p: u16,
    limit: usize,
    now_ms: UnixMs,
}

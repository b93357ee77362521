//! Listing a queue's live tasks in id order ([`belfry_store::Store::list_tasks`]): partition
//! after partition, and within one in sequence order, a page at a time.
//!
//! Nothing in a partition orders its live tasks by sequence (its ready and lease sets are
//! ordered by time, its bucket lists by arrival), and the listing adds no index for every put
//! to write. A page reads a partition one of three ways instead (`lua/read.lua`):
//!
//! - a **probe** reads the record hash sequence by sequence from the cursor on, up to
//!   [`PROBE_STEP`] sequences a call, and stops once it has the page: its cost is the
//!   sequences it passes, cheap where live tasks are dense among the sequences the partition
//!   gave out (to tasks, and to leases), however many the partition holds;
//! - a **scan** reads the partition's ready sets, lease set and bucket lists whole in one
//!   call (an atomic read, so a task moving between them is seen once), keeping only the
//!   page's smallest sequences after the cursor: its cost is the partition's live tasks;
//! - a **pass** over the record hash (`HSCAN`, [`PASS_STEP`] records a call) collects the
//!   page's smallest live sequences after the cursor here, then reads them: its cost is the
//!   partition's records (live, dead, and finished in the last minute), in calls that each
//!   hold Redis briefly. `HSCAN` returns every record present for the whole pass, so a task
//!   live throughout is found, though tasks move between sets meanwhile.
//!
//! A page probes first. A partition holding at most [`SCAN_MAX`] live tasks is scanned once
//! the page has probed as many sequences as it holds live tasks (at once when it holds few);
//! a bigger one, whose scan would hold Redis too long (0.4 s for a million), is passed over
//! once the page has probed a quarter as many sequences as it holds records (a pass costs a
//! few times a probe per record). So no page costs much more than the cheaper of probing its
//! way and the other, and no call holds Redis for more than a few milliseconds. Each call
//! answers the live tasks of a range of sequences just after the cursor and where the range
//! ends, so the calls of a walk cover every sequence once.

use std::collections::BTreeSet;

use belfry_core::{QueueName, Task, TaskId, UnixMs};
use belfry_store::StoreError;
use redis::Value;

use crate::conn::{unexpected, Conn, Result};
use crate::keys::listing_start;
use crate::reply::{as_array, as_bytes, as_i64, as_seq};
use crate::store::{Part, RedisStore};
use crate::tasks::task_of;

/// Sequences one probe call reads at most: a few milliseconds of Redis's time.
const PROBE_STEP: u64 = 1024;
/// The most live tasks a partition is scanned with, in one call (a few ms of Redis's time).
const SCAN_MAX: u64 = 8_192;
/// Records one call of a pass over the record hash reads, about (`HSCAN`'s `COUNT`).
const PASS_STEP: u64 = 1024;

/// How a page reads a partition next (the module's comment says why).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    Probe,
    Scan,
    Pass,
}

/// What a page has seen of a partition so far.
#[derive(Debug, Default)]
struct Seen {
    /// The partition's live tasks and records, as the last call found them (none before the
    /// first).
    sizes: Option<(u64, u64)>,
    /// Sequences probed, and the live tasks found among them.
    probed: u64,
    listed: u64,
}

impl Seen {
    /// How to read on, `want` tasks short of a full page: a probe, until it has cost about
    /// what a scan would (a partition of at most [`SCAN_MAX`] live tasks), or until it has
    /// probed a quarter as many sequences as the partition holds records and finding the rest
    /// at the rate found so far would cost more than a pass (about three probes a record).
    fn how(&self, want: usize) -> How {
        let Some((live, records)) = self.sizes else {
            return How::Probe;
        };
        if live <= SCAN_MAX {
            return if self.probed >= live {
                How::Scan
            } else {
                How::Probe
            };
        }
        let rest = u128::from(self.probed) * want as u128;
        if self.probed >= records / 4 && rest > 3 * u128::from(records) * u128::from(self.listed) {
            return How::Pass;
        }
        How::Probe
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
        let mut seen = Seen::default();
        while out.len() < page.limit {
            let how = seen.how(page.limit - out.len());
            let next = if how == How::Pass {
                self.pass(c, &part, page, after, out)?
            } else {
                let budget = if how == How::Scan { 0 } else { PROBE_STEP };
                let before = out.len();
                let (next, live, records) =
                    self.probe_or_scan(c, &part, page, after, budget, out)?;
                seen.sizes = Some((live, records));
                if let Some(next) = next.filter(|_| budget > 0) {
                    seen.probed += next - after;
                    seen.listed += (out.len() - before) as u64;
                }
                next
            };
            match next {
                Some(next) => after = next,
                None => return Ok(()),
            }
        }
        Ok(())
    }

    /// One call of the read script's `live` op: a probe of up to `budget` sequences after
    /// `after` (a scan when 0, or when the partition holds few live tasks). Appends the live
    /// tasks found and answers the last sequence the call covered (none: the partition has
    /// nothing more), with the partition's live tasks and records.
    fn probe_or_scan(
        &self,
        c: &mut Conn,
        part: &Part,
        page: &Page<'_>,
        after: u64,
        budget: u64,
        out: &mut Vec<Task>,
    ) -> Result<(Option<u64>, u64, u64)> {
        let want = page.limit - out.len();
        let args = [
            b"live".to_vec(),
            after.to_string().into_bytes(),
            want.to_string().into_bytes(),
            budget.to_string().into_bytes(),
        ];
        let v = self.read(c, part, &args)?;
        let bad = || unexpected("list live tasks", &v);
        let items = as_array(&v).ok_or_else(bad)?;
        let [next, live, records, found @ ..] = items else {
            return Err(bad());
        };
        push_tasks(page, found, want, out, bad)?;
        let count = |v: &Value| as_i64(v).and_then(|n| u64::try_from(n).ok());
        let (live, records) = count(live).zip(count(records)).ok_or_else(bad)?;
        let next = match as_i64(next).ok_or_else(bad)? {
            n if n < 0 => None,
            // Each call covers at least one sequence past the cursor: a reply that does not
            // would never end the walk.
            n => Some(
                u64::try_from(n)
                    .ok()
                    .filter(|n| *n > after)
                    .ok_or_else(bad)?,
            ),
        };
        Ok((next, live, records))
    }

    /// A pass over the partition's record hash for the page's smallest live sequences after
    /// `after` (a few more than the page wants, as a task may finish before it is read), then
    /// a read of those. Appends the live tasks and answers the last sequence covered (none:
    /// the partition has nothing more), as [`RedisStore::probe_or_scan`] does.
    fn pass(
        &self,
        c: &mut Conn,
        part: &Part,
        page: &Page<'_>,
        after: u64,
        out: &mut Vec<Task>,
    ) -> Result<Option<u64>> {
        let want = page.limit - out.len();
        let take = want + 64 + want / 8;
        let mut smallest = BTreeSet::<u64>::new();
        let mut cursor = b"0".to_vec();
        loop {
            // Once `take` are held, only smaller ones matter.
            let below = match smallest.last() {
                Some(max) if smallest.len() == take => max.to_string().into_bytes(),
                _ => Vec::new(),
            };
            let args = [
                b"live_records".to_vec(),
                cursor,
                after.to_string().into_bytes(),
                PASS_STEP.to_string().into_bytes(),
                below,
            ];
            let v = self.read(c, part, &args)?;
            let bad = || unexpected("list live records", &v);
            let [next, seqs @ ..] = as_array(&v).ok_or_else(bad)? else {
                return Err(bad());
            };
            for seq in seqs {
                smallest.insert(as_seq(seq).ok_or_else(bad)?);
                if smallest.len() > take {
                    smallest.pop_last();
                }
            }
            cursor = as_bytes(next).ok_or_else(bad)?.to_vec();
            if cursor == b"0" {
                break;
            }
        }
        let mut args = vec![b"live_read".to_vec(), want.to_string().into_bytes()];
        args.extend(smallest.iter().map(|s| s.to_string().into_bytes()));
        let v = self.read(c, part, &args)?;
        let bad = || unexpected("read live tasks", &v);
        let found = as_array(&v).ok_or_else(bad)?;
        push_tasks(page, found, want, out, bad)?;
        Ok(match smallest.last() {
            _ if found.len() / 2 == want => out.last().map(|t| t.id.0 as u64),
            Some(last) if smallest.len() == take => Some(*last),
            _ => None,
        })
    }
}

/// Appends to `out` the tasks of `found`, a reply's sequence and record pairs (at most
/// `want`); `bad` when the reply is not so shaped.
fn push_tasks(
    page: &Page<'_>,
    found: &[Value],
    want: usize,
    out: &mut Vec<Task>,
    bad: impl Fn() -> StoreError,
) -> Result<()> {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(live: u64, records: u64, probed: u64, listed: u64) -> Seen {
        Seen {
            sizes: Some((live, records)),
            probed,
            listed,
        }
    }

    #[test]
    fn a_page_probes_then_scans_a_small_partition() {
        assert_eq!(Seen::default().how(10), How::Probe);
        assert_eq!(seen(5_000, 9_000, 1_024, 3).how(10), How::Probe);
        assert_eq!(seen(5_000, 9_000, 5_120, 3).how(10), How::Scan);
    }

    #[test]
    fn a_page_passes_over_a_big_partition_only_where_probing_finds_little() {
        let (live, records) = (1_000_000, 1_200_000);
        // Not before a quarter of the records' count is probed.
        assert_eq!(seen(live, records, 200_000, 0).how(1_000), How::Probe);
        // A run with nothing live, or next to nothing.
        assert_eq!(seen(live, records, 300_000, 0).how(1_000), How::Pass);
        assert_eq!(seen(live, records, 300_000, 10).how(1_000), How::Pass);
        // Dense: a big page goes on probing.
        assert_eq!(
            seen(live, records, 300_000, 150_000).how(200_000),
            How::Probe
        );
    }
}

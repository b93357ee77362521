//! Listing pages whose memory is bounded by bytes as well as by count: a page of 1,000 tasks
//! at the 1 MiB payload limit would be a gigabyte in the server (and again in its answer).

use belfry_core::{Task, TaskId};

use super::Result;

/// Payload bytes a listing page gathers before it ends early (the caller reads on with
/// `next_after`, as after a full page).
pub const PAGE_PAYLOAD_BYTES_MAX: usize = 16 << 20;

/// Tasks the first store call of a page asks for: small, so that large payloads are seen
/// before many are read; later calls are sized by the payloads seen.
const FIRST_CALL_TASKS: usize = 16;

/// A page of up to `limit` tasks after `after`, read by `read(after, n)` (a store listing that
/// answers up to `n` tasks, a short answer being its last), ending early once its payloads
/// reach [`PAGE_PAYLOAD_BYTES_MAX`]. Returns the tasks and whether more may follow.
pub(crate) fn read_page(
    limit: usize,
    mut after: Option<TaskId>,
    mut read: impl FnMut(Option<TaskId>, usize) -> Result<Vec<Task>>,
) -> Result<(Vec<Task>, bool)> {
    let mut tasks: Vec<Task> = Vec::new();
    let mut bytes = 0usize;
    let mut ask = limit.min(FIRST_CALL_TASKS);
    while ask > 0 {
        let got = read(after, ask)?;
        let last = got.len() < ask;
        bytes += got.iter().map(|t| t.payload.len()).sum::<usize>();
        after = got.last().map(|t| t.id).or(after);
        tasks.extend(got);
        if last {
            return Ok((tasks, false));
        }
        if tasks.len() >= limit || bytes >= PAGE_PAYLOAD_BYTES_MAX {
            return Ok((tasks, true));
        }
        let per_task = bytes / tasks.len() + 1;
        let room = (PAGE_PAYLOAD_BYTES_MAX - bytes) / per_task;
        ask = (limit - tasks.len()).min(room.max(1));
    }
    Ok((tasks, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use belfry_core::QueueName;
    use bytes::Bytes;

    fn tasks(n: usize, payload: usize) -> Vec<Task> {
        let queue = QueueName::new("q").unwrap();
        (0..n)
            .map(|i| Task {
                id: TaskId(i as u128 + 1),
                queue: queue.clone(),
                due_at_ms: 0,
                payload: Bytes::from(vec![b'x'; payload]),
                payload_kind: belfry_core::PayloadKind::Binary,
                payload_dropped: false,
                headers: Vec::new(),
                priority: belfry_core::Priority::Normal,
                idempotency_key: None,
                late_policy: belfry_core::LatePolicy::Fire,
                target: None,
                state: belfry_core::TaskState::Scheduled,
                attempts: 0,
                lease_until_ms: None,
                dead_reason: None,
            })
            .collect()
    }

    /// A listing over `all`, in id order, counting its calls.
    fn page(all: &[Task], limit: usize, calls: &mut usize) -> (usize, bool) {
        let (got, more) = read_page(limit, None, |after, n| {
            *calls += 1;
            let from = after.map_or(0, |a| a.0 as usize);
            Ok(all.iter().skip(from).take(n).cloned().collect())
        })
        .unwrap();
        (got.len(), more)
    }

    #[test]
    fn small_payloads_fill_the_page_in_two_calls() {
        let all = tasks(2_500, 200);
        let mut calls = 0;
        assert_eq!(page(&all, 1_000, &mut calls), (1_000, true));
        assert_eq!(calls, 2);
        let mut calls = 0;
        assert_eq!(page(&all[..700], 1_000, &mut calls), (700, false));
    }

    #[test]
    fn large_payloads_end_the_page_early_with_more_to_read() {
        let all = tasks(100, 1 << 20);
        let mut calls = 0;
        let (n, more) = page(&all, 1_000, &mut calls);
        assert!(more);
        assert!(
            n * (1 << 20) <= PAGE_PAYLOAD_BYTES_MAX + (1 << 20),
            "{n} tasks"
        );
        assert_eq!(n, 16);
    }
}

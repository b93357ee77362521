//! Webhook tasks due at a steady rate, fired by several nodes into one receiver here:
//! firing lateness, and the takeover after one node is `kill -9`ed.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::BenchError;
use crate::servers::WebhookReceiver;
use crate::spawn::SpawnedServer;
use crate::stats::{DeliverySummary, DeliveryTracker};
use crate::sys::{unix_ms, unix_us};
use crate::workload::{due_times, Bodies};

/// A task first received more than this after its due time counts as late for the
/// takeover measure (normal lateness on this machine stays far below it).
pub const LATE_US: u64 = 1_000_000;

/// How long the run waits for the last deliveries after the last due time.
const GRACE: Duration = Duration::from_secs(20);

/// One steady-rate run.
pub struct Plan {
    pub rate_per_s: u64,
    pub seconds: u64,
    pub batch: usize,
    pub clients: usize,
    pub payload_bytes: usize,
    /// Submit rate measured earlier in the run, to give the submits enough lead time.
    pub submit_rate_hint: f64,
    /// Kill node `.0` (SIGKILL) this long after the first due time.
    pub kill: Option<(usize, Duration)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Takeover {
    pub killed_node: usize,
    /// Tasks due at or after the kill.
    pub due_after_kill: u64,
    pub lateness_max_after_kill_us: u64,
    /// From the kill to the receipt of the last task due after the kill that was more than
    /// [`LATE_US`] late (0 when none was).
    pub recovered_after_us: u64,
    pub late_after_kill: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Firing {
    pub summary: DeliverySummary,
    pub submit_s: f64,
    /// Whether all submits finished before the first task was due.
    pub submitted_in_time: bool,
    pub takeover: Option<Takeover>,
}

struct Inbox {
    tracker: DeliveryTracker,
    first_us: Vec<u64>,
}

/// Runs `plan` on `nodes` (all already serving one namespace).
pub async fn run(
    nodes: &mut [SpawnedServer],
    plan: &Plan,
    bar: &indicatif::ProgressBar,
) -> Result<Firing, BenchError> {
    let tasks = plan.rate_per_s * plan.seconds;
    let estimate_s = tasks as f64 / plan.submit_rate_hint.max(100.0);
    let lead_ms = (estimate_s * 1_500.0) as u64 + 3_000;
    let first_due = unix_ms() + lead_ms;
    let due = due_times(tasks, first_due, plan.seconds * 1_000);
    let inbox = Arc::new(Mutex::new(Inbox {
        tracker: DeliveryTracker::new(due.clone()),
        first_us: vec![0; due.len()],
    }));
    let receiver = {
        let (inbox, bar) = (inbox.clone(), bar.clone());
        WebhookReceiver::start(move |body, _headers, receipt_us| {
            let Some(index) = crate::workload::parse_index(&body) else {
                return;
            };
            if let Ok(mut inbox) = inbox.lock() {
                inbox.tracker.record(index, receipt_us);
                if let Some(slot) = usize::try_from(index)
                    .ok()
                    .and_then(|i| inbox.first_us.get_mut(i))
                {
                    if *slot == 0 {
                        *slot = receipt_us;
                        bar.inc(1);
                    }
                }
            }
        })
        .await?
    };
    let targets: Vec<_> = nodes.iter().map(|n| n.target.clone()).collect();
    let queue = format!("bench-fire-{}", unix_ms());
    let config = format!(
        "{{\"delivery\":{{\"type\":\"webhook\",\"url\":\"http://{}/hook\"}}}}",
        receiver.addr
    );
    super::nodes::create_queue(&targets, &queue, &config).await?;
    bar.set_length(tasks);
    let bodies = Arc::new(Bodies::build(&due, plan.batch, plan.payload_bytes));
    let submitted = Instant::now();
    let hidden = indicatif::ProgressBar::hidden();
    let submit = super::nodes::ingest(&targets, &queue, bodies, plan.clients, &hidden).await;
    let submit_s = submitted.elapsed().as_secs_f64();
    let submitted_in_time = unix_ms() < first_due;
    let last_due = due.last().copied().unwrap_or(first_due);
    let deadline_ms = last_due + GRACE.as_millis() as u64;
    let mut killed_at_us = None;
    loop {
        let now = unix_ms();
        if let Some((node, after)) = plan.kill {
            if killed_at_us.is_none() && now >= first_due + after.as_millis() as u64 {
                if let Some(n) = nodes.get_mut(node) {
                    n.kill9();
                }
                killed_at_us = Some(unix_us());
            }
        }
        let all = inbox
            .lock()
            .map(|i| i.tracker.delivered() >= submit.tasks)
            .unwrap_or(true);
        if (all && now > last_due) || now > deadline_ms {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Late duplicates (a redelivery after a lease expired) still count.
    tokio::time::sleep(Duration::from_secs(1)).await;
    receiver.stop().await;
    let inbox = inbox
        .lock()
        .map_err(|_| BenchError::Server("receiver state poisoned".into()))?;
    let takeover = match (plan.kill, killed_at_us) {
        (Some((node, _)), Some(kill_us)) => Some(takeover(node, kill_us, &due, &inbox.first_us)),
        _ => None,
    };
    Ok(Firing {
        summary: inbox.tracker.summary(),
        submit_s,
        submitted_in_time,
        takeover,
    })
}

fn takeover(node: usize, kill_us: u64, due_ms: &[u64], first_us: &[u64]) -> Takeover {
    let mut out = Takeover {
        killed_node: node,
        due_after_kill: 0,
        lateness_max_after_kill_us: 0,
        recovered_after_us: 0,
        late_after_kill: 0,
    };
    for (&due, &first) in due_ms.iter().zip(first_us) {
        let due_us = due * 1_000;
        if due_us < kill_us || first == 0 {
            out.due_after_kill += u64::from(due_us >= kill_us);
            continue;
        }
        out.due_after_kill += 1;
        let late = first.saturating_sub(due_us);
        out.lateness_max_after_kill_us = out.lateness_max_after_kill_us.max(late);
        if late > LATE_US {
            out.late_after_kill += 1;
            out.recovered_after_us = out.recovered_after_us.max(first - kill_us);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takeover_is_the_last_late_receipt_after_the_kill() {
        // kill at 10 s; tasks due 9 s (before), 10 s (2.5 s late), 11 s (on time), 12 s (lost)
        let due = [9_000, 10_000, 11_000, 12_000];
        let first = [9_100_000, 12_500_000, 11_010_000, 0];
        let t = takeover(2, 10_000_000, &due, &first);
        assert_eq!(t.due_after_kill, 3);
        assert_eq!(t.late_after_kill, 1);
        assert_eq!(t.recovered_after_us, 2_500_000);
        assert_eq!(t.lateness_max_after_kill_us, 2_500_000);
    }
}

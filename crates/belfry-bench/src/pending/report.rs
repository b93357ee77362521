//! The `pending` report: fill, disk, memory and restart rows, each group from the run's
//! outcome against the brief's targets.

use serde_json::json;

use super::{
    extrapolate_rss, growth_per_task, mean_key_bytes, point_ops, rss_at_fraction, PendingArgs,
    PendingOutcome, RedisPendingOutcome, DISK_RATIO_TARGET, GROWTH_FIT_FROM,
    RAW_TASK_OVERHEAD_BYTES, RESTART_TARGET, RSS_BYTES_TARGET_AT_100M, RSS_REPORT_FRACTIONS,
    TARGET_PENDING,
};
use crate::load::IngestOutcome;
use crate::report::{dash, thousands, Report, Table};
use crate::sys::Machine;

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

pub(super) fn build_report(
    args: &PendingArgs,
    machine: Machine,
    belfry: Option<PendingOutcome>,
    redis: Option<RedisPendingOutcome>,
) -> Report {
    let b = belfry.clone().unwrap_or_default();
    let r = redis.clone().unwrap_or_default();
    let cx = ReportContext::new(args, &b, &r, redis.is_some());
    let mut table = Table::new(
        cx.title(),
        &[
            "measure",
            "belfry",
            "Redis ZSET + HASH (seeds' design)",
            "target",
        ],
    );
    cx.fill_rows(&mut table);
    cx.disk_row(&mut table);
    cx.memory_rows(&mut table);
    cx.restart_rows(&mut table);
    let mut notes = cx.fill_notes();
    notes.extend(cx.target_notes());
    if belfry
        .as_ref()
        .is_some_and(|b| b.rss_filled_bytes.is_none())
    {
        notes.push("no server RSS: pass --spawn, or --server-pid for a server at --url.".into());
    }
    let mut tables = vec![table];
    if let Some(p) = &b.point_ops {
        let pending = b.submit.as_ref().map_or(args.tasks, |s| s.accepted);
        tables.push(point_ops::table(p, pending));
        let fill_rate = b.submit.as_ref().map(|s| s.tasks_per_s);
        notes.extend(point_ops::notes(p, pending, fill_rate));
    }
    Report {
        scenario: "pending".into(),
        command: crate::command_line(),
        machine,
        tables,
        notes,
        picture: None,
        data: json!({
            "tasks": args.tasks,
            "payload_bytes": args.payload_bytes,
            "due_in_days": args.due_in_days,
            "spread_days": args.spread_days,
            "idempotency_keys": args.idempotency_keys,
            "point_ops": args.point_ops,
            "point_connections": args.point_connections,
            "raw_bytes_per_task": cx.raw_per_task,
            "rss_growth_per_task_bytes": cx.growth,
            "belfry": belfry,
            "redis": redis,
        }),
    }
}

/// What the rows and notes of the pending report share: the run's size, the raw bytes a
/// task is measured against, the RSS slope, and both systems' outcomes (default when a
/// system was not run).
struct ReportContext<'a> {
    args: &'a PendingArgs,
    n: f64,
    key_bytes: u64,
    raw_per_task: u64,
    /// The first task count of the fitted part of the fill.
    fit_from: u64,
    growth: Option<f64>,
    b: &'a PendingOutcome,
    r: &'a RedisPendingOutcome,
    redis_ran: bool,
}

impl<'a> ReportContext<'a> {
    fn new(
        args: &'a PendingArgs,
        b: &'a PendingOutcome,
        r: &'a RedisPendingOutcome,
        redis_ran: bool,
    ) -> Self {
        let n = args.tasks as f64;
        let key_bytes = if args.idempotency_keys {
            mean_key_bytes(args.tasks)
        } else {
            0
        };
        let fit_from = (n * GROWTH_FIT_FROM) as u64;
        ReportContext {
            args,
            n,
            key_bytes,
            raw_per_task: args.payload_bytes as u64 + RAW_TASK_OVERHEAD_BYTES + key_bytes,
            fit_from,
            growth: growth_per_task(&b.rss_samples, fit_from),
            b,
            r,
            redis_ran,
        }
    }

    fn title(&self) -> String {
        format!(
            "pending: {} far-future tasks of {} B{} (raw {} B/task)",
            thousands(self.n),
            self.args.payload_bytes,
            if self.key_bytes > 0 {
                format!(" with a {} B idempotency key", self.key_bytes)
            } else {
                String::new()
            },
            self.raw_per_task
        )
    }

    /// How fast each system took the tasks, and what the server says it holds.
    fn fill_rows(&self, table: &mut Table) {
        let (b, r) = (self.b, self.r);
        let rate =
            |o: &Option<IngestOutcome>| o.as_ref().map_or_else(dash, |s| thousands(s.tasks_per_s));
        table.row(vec![
            "fill tasks/s".into(),
            rate(&b.submit),
            rate(&r.submit),
            dash(),
        ]);
        if let Some(p) = b.point_ops.as_ref() {
            table.row(vec![
                "cancels/s by id (--point-ops, beside fill tasks/s)".into(),
                p.phase(point_ops::PointOp::Cancel)
                    .map_or_else(dash, |c| thousands(c.ops_per_s)),
                dash(),
                dash(),
            ]);
        }
        table.row(vec![
            "pending reported by the server".into(),
            b.pending_reported
                .map_or_else(dash, |p| thousands(p as f64)),
            dash(),
            thousands(self.n),
        ]);
    }

    fn disk_row(&self, table: &mut Table) {
        let (b, n, raw_per_task) = (self.b, self.n, self.raw_per_task);
        table.row(vec![
            "disk bytes/task (allocated; file length)".into(),
            match (b.disk_allocated_bytes, b.disk_length_bytes) {
                (Some(a), Some(l)) => format!(
                    "{:.0} B; {:.0} B ({:.2}× raw)",
                    a as f64 / n,
                    l as f64 / n,
                    a as f64 / n / raw_per_task as f64
                ),
                _ => dash(),
            },
            "in RAM only (AOF not measured)".into(),
            format!(
                "≤ {DISK_RATIO_TARGET}× raw = {:.0} B",
                DISK_RATIO_TARGET * raw_per_task as f64
            ),
        ]);
    }

    /// Server RSS through the fill: idle to filled, at fill levels, the slope, the step.
    fn memory_rows(&self, table: &mut Table) {
        let (b, r, n) = (self.b, self.r, self.n);
        table.row(vec![
            "server RSS idle → filled (peak)".into(),
            match (b.rss_idle_bytes, b.rss_filled_bytes, b.rss_peak_bytes) {
                (Some(i), Some(f), Some(p)) => format!("{} → {} ({})", mib(i), mib(f), mib(p)),
                _ => dash(),
            },
            r.rss_bytes.map_or_else(dash, mib),
            format!("≤ {} at 100M, flat in N", mib(RSS_BYTES_TARGET_AT_100M)),
        ]);
        table.row(vec![
            format!(
                "server RSS at {} of the fill",
                RSS_REPORT_FRACTIONS
                    .map(|f| format!("{:.0}%", f * 100.0))
                    .join(" / ")
            ),
            if b.rss_samples.is_empty() {
                dash()
            } else {
                RSS_REPORT_FRACTIONS
                    .map(|f| {
                        rss_at_fraction(&b.rss_samples, self.args.tasks, f)
                            .map_or_else(dash, |s| mib(s.rss_bytes))
                    })
                    .join(" / ")
            },
            dash(),
            "flat".into(),
        ]);
        table.row(vec![
            format!(
                "RSS growth per pending task (fit over the last {:.0}% of the fill)",
                (1.0 - GROWTH_FIT_FROM) * 100.0
            ),
            self.growth.map_or_else(dash, |g| format!("{g:.2} B")),
            dash(),
            format!("≤ {:.1} B", RSS_BYTES_TARGET_AT_100M as f64 / 1e8),
        ]);
        table.row(vec![
            "RSS idle → filled, per task (with the one-off step)".into(),
            match (b.rss_idle_bytes, b.rss_filled_bytes) {
                (Some(i), Some(f)) => {
                    format!("{:.1} B (RSS growth)", f.saturating_sub(i) as f64 / n)
                }
                _ => dash(),
            },
            if self.redis_ran {
                format!(
                    "{:.1} B (used_memory growth)",
                    r.used_memory_delta_bytes as f64 / n
                )
            } else {
                dash()
            },
            "- (the slope above is what the target bounds)".into(),
        ]);
    }

    /// What `kill -9` and the restart cost, and what survived it.
    fn restart_rows(&self, table: &mut Table) {
        let b = self.b;
        table.row(vec![
            "kill -9 → /readyz 200".into(),
            b.restart_ready_ms
                .map_or_else(dash, |ms| format!("{ms:.0} ms")),
            dash(),
            format!("≤ {} s at 100M", RESTART_TARGET.as_secs()),
        ]);
        table.row(vec![
            "pending after restart".into(),
            b.pending_after_restart
                .map_or_else(dash, |p| thousands(p as f64)),
            dash(),
            "all acknowledged".into(),
        ]);
        table.row(vec![
            "RSS after restart".into(),
            b.rss_after_restart_bytes.map_or_else(dash, mib),
            dash(),
            dash(),
        ]);
    }

    /// Rejected tasks in the fill, and acknowledged tasks lost in the restart.
    fn fill_notes(&self) -> Vec<String> {
        let b = self.b;
        let mut notes = Vec::new();
        if let Some(s) = &b.submit {
            if let Some(e) = &s.first_error {
                notes.push(format!(
                    "belfry fill: {} rejected tasks; first error: {e}",
                    s.rejected
                ));
            }
            if let (Some(after), true) = (b.pending_after_restart, b.restart_ready_ms.is_some()) {
                let lost = s.accepted.saturating_sub(after);
                notes.push(format!(
                    "after kill -9 and restart: {} of {} acknowledged tasks pending ({} lost).",
                    thousands(after as f64),
                    thousands(s.accepted as f64),
                    lost
                ));
            }
        }
        notes
    }

    /// The disk, RSS and restart targets: met or missed.
    fn target_notes(&self) -> Vec<String> {
        let (b, n) = (self.b, self.n);
        let mut notes = Vec::new();
        if let Some(a) = b.disk_allocated_bytes {
            let ratio = a as f64 / n / self.raw_per_task as f64;
            notes.push(format!(
                "disk target ≤ {DISK_RATIO_TARGET}× raw task bytes: {} ({ratio:.2}×).",
                if ratio <= DISK_RATIO_TARGET {
                    "met"
                } else {
                    "missed"
                }
            ));
        }
        if let (Some(g), Some(filled)) = (self.growth, b.rss_filled_bytes) {
            let at_target = extrapolate_rss(filled, self.args.tasks, g, TARGET_PENDING);
            notes.push(format!(
                "RSS grew {g:.2} B per pending task over the last {:.0}% of the fill ({} samples); \
                 going on at that rate, {} pending would take {} (target ≤ {}): {}.",
                (1.0 - GROWTH_FIT_FROM) * 100.0,
                b.rss_samples
                    .iter()
                    .filter(|s| s.tasks >= self.fit_from)
                    .count(),
                thousands(TARGET_PENDING as f64),
                mib(at_target as u64),
                mib(RSS_BYTES_TARGET_AT_100M),
                if at_target <= RSS_BYTES_TARGET_AT_100M as f64 {
                    "met (extrapolated)"
                } else {
                    "missed (extrapolated)"
                }
            ));
        }
        if let Some(ms) = b.restart_ready_ms {
            notes.push(format!(
                "restart target ≤ {} s (stated for 100M pending; this run: {}): {} ({ms:.0} ms).",
                RESTART_TARGET.as_secs(),
                thousands(n),
                if ms <= RESTART_TARGET.as_secs_f64() * 1_000.0 {
                    "met"
                } else {
                    "missed"
                }
            ));
        }
        notes
    }
}

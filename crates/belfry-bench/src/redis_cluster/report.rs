//! The tables of `belfry bench redis`, with each target of issue #14 met or missed.

use super::{firing::Firing, Outcome, RedisArgs, Throughput};
use crate::report::{ratio, thousands, Report, Table};
use crate::stats::format_us;

/// Throughput of belfry through its nodes against the in-process store.
const RATIO_TARGET: f64 = 0.80;
/// Takeover after kill -9 of one node.
const TAKEOVER_TARGET_US: u64 = 5_000_000;
/// Redis bytes per pending task beyond its payload.
const MEMORY_TARGET_BYTES: f64 = 100.0;

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "missed"
    }
}

pub fn build(args: &RedisArgs, o: Outcome) -> Report {
    let mut notes = Vec::new();
    let mut targets = Table::new("Targets (issue #14)", &["target", "measured", "verdict"]);
    let tables = vec![
        throughput_table(&o, &mut targets),
        firing_table(&o, &mut targets, &mut notes),
        takeover_table(&o, &mut targets),
        memory_table(&o, &mut targets),
    ];
    let mut all = tables;
    all.push(targets);
    notes.push(format!(
        "Redis Cluster: {} masters, no replicas, appendonly yes, appendfsync everysec, on the \
         same machine as the nodes, the clients and the webhook receiver.",
        o.masters
    ));
    notes.push(format!(
        "Baseline: belfry's Redis store (`belfry-store-redis`) called in-process from {} \
         threads with the same batches ({} tasks a put, claim and ack) on the same cluster: the \
         same Lua scripts and keys without HTTP, JSON or the server; ratios are belfry ÷ it.",
        args.clients, args.batch
    ));
    notes.push(
        "A server coalesces the batches that arrive together into one store call (one Lua \
         script per partition touched), so its calls are bigger than the clients' batches: the \
         second row is the store in-process with bigger batches, for scale; ratios stay \
         against the same-batch row."
            .into(),
    );
    notes.push(format!(
        "belfry: {} HTTP clients spread round-robin over the nodes, {} tasks of {} B payload; \
         ingest is `POST /v1/queues/{{q}}/tasks:batch`, drain is `POST …/lease` + batch \
         `POST …/ack` of tasks already due. Each stage has a fresh namespace on an emptied cluster.",
        args.clients, args.tasks, args.payload_bytes
    ));
    Report {
        scenario: "redis".into(),
        command: crate::command_line(),
        machine: crate::sys::Machine::describe(),
        tables: all,
        notes,
        picture: None,
        data: serde_json::to_value(&o).unwrap_or(serde_json::Value::Null),
    }
}

fn row(t: &Throughput, base: &Throughput) -> Vec<String> {
    vec![
        t.label.clone(),
        thousands(t.ingest.per_s),
        ratio(t.ingest.per_s, base.ingest.per_s),
        thousands(t.drain.per_s),
        ratio(t.drain.per_s, base.drain.per_s),
        format!("{} / {}", t.ingest.errors, t.drain.errors),
    ]
}

fn throughput_table(o: &Outcome, targets: &mut Table) -> Table {
    let mut t = Table::new(
        "Batched ingest and burst drain (tasks/s)",
        &[
            "system",
            "ingest/s",
            "× baseline",
            "drain/s (lease+ack)",
            "× baseline",
            "errors (ingest / drain)",
        ],
    );
    let mut base_row = row(&o.baseline, &o.baseline);
    base_row[2] = "1.00×".into();
    base_row[4] = "1.00×".into();
    t.row(base_row);
    t.row(row(&o.baseline_big, &o.baseline));
    for b in &o.belfry {
        t.row(row(b, &o.baseline));
        for (what, mine, base) in [
            ("ingest", b.ingest.per_s, o.baseline.ingest.per_s),
            ("drain", b.drain.per_s, o.baseline.drain.per_s),
        ] {
            let r = if base > 0.0 { mine / base } else { 0.0 };
            targets.row(vec![
                format!("{what} through {} ≥ {RATIO_TARGET:.2}× baseline", b.label),
                format!("{r:.2}×"),
                met(r >= RATIO_TARGET).into(),
            ]);
        }
    }
    t
}

fn firing_row(f: &Firing, rate: u64) -> Vec<String> {
    let s = &f.summary;
    vec![
        format!("{}/s", thousands(rate as f64)),
        thousands(s.expected as f64),
        format_us(s.lateness.p50_us),
        format_us(s.lateness.p99_us),
        format_us(s.lateness.max_us),
        s.early.to_string(),
        s.lost.to_string(),
        s.duplicates.to_string(),
    ]
}

fn firing_table(o: &Outcome, targets: &mut Table, notes: &mut Vec<String>) -> Table {
    let mut t = Table::new(
        format!(
            "Firing lateness across 3 nodes (webhook to a receiver in the bench, {} s of due tasks)",
            o.fire_seconds
        ),
        &["due rate", "tasks", "p50", "p99", "max", "early", "lost", "duplicates"],
    );
    t.row(firing_row(&o.firing, o.fire_rate));
    let s = &o.firing.summary;
    let delivered_rate = s.delivered as f64 / (s.receipt_span_us as f64 / 1e6).max(1e-6);
    if !o.firing.submitted_in_time {
        notes.push(format!(
            "Firing run: submitting took {:.1} s, longer than the lead the run allowed, so the \
             first tasks were already due when submitted and their lateness includes that.",
            o.firing.submit_s
        ));
    }
    notes.push(format!(
        "Firing run: receipts spread over {:.1} s for {} s of due tasks ({} delivered/s).",
        s.receipt_span_us as f64 / 1e6,
        o.fire_seconds,
        thousands(delivered_rate)
    ));
    targets.row(vec![
        format!(
            "{}/s due across 3 nodes: p99 ≤ 20 ms, never early, none lost",
            thousands(o.fire_rate as f64)
        ),
        format!(
            "p99 {}, early {}, lost {}",
            format_us(s.lateness.p99_us),
            s.early,
            s.lost
        ),
        met(s.lateness.p99_us <= FIRING_P99_TARGET_US && s.early == 0 && s.lost == 0).into(),
    ]);
    t
}

/// Issue #14: firing lateness across 3 nodes at 10k due/s, p99 at most 20 ms.
const FIRING_P99_TARGET_US: u64 = 20_000;

fn takeover_table(o: &Outcome, targets: &mut Table) -> Table {
    let mut t = Table::new(
        format!(
            "Takeover: kill -9 of 1 of 3 nodes, {}/s due (late = more than {} after due)",
            thousands(o.takeover_rate as f64),
            format_us(super::firing::LATE_US)
        ),
        &[
            "tasks due after kill",
            "max lateness after kill",
            "late after kill",
            "kill → last late receipt",
            "p99 (whole run)",
            "early",
            "lost",
            "duplicates",
        ],
    );
    let s = &o.takeover.summary;
    match &o.takeover.takeover {
        Some(k) => {
            t.row(vec![
                thousands(k.due_after_kill as f64),
                format_us(k.lateness_max_after_kill_us),
                thousands(k.late_after_kill as f64),
                format_us(k.recovered_after_us),
                format_us(s.lateness.p99_us),
                s.early.to_string(),
                s.lost.to_string(),
                s.duplicates.to_string(),
            ]);
            targets.row(vec![
                "takeover after kill -9 ≤ 5 s, nothing lost".into(),
                format!("{}, lost {}", format_us(k.recovered_after_us), s.lost),
                met(k.recovered_after_us <= TAKEOVER_TARGET_US && s.lost == 0).into(),
            ]);
        }
        None => t.row(vec!["node was not killed".into()]),
    }
    t
}

fn memory_table(o: &Outcome, targets: &mut Table) -> Table {
    let m = &o.memory;
    let per_task = (m.used_after as f64 - m.used_before as f64) / m.tasks.max(1) as f64;
    let beyond = per_task - m.payload_bytes as f64;
    let mut t = Table::new(
        "Redis memory per pending task (used_memory summed over the masters)",
        &[
            "tasks",
            "payload",
            "before",
            "after",
            "bytes/task",
            "beyond payload",
        ],
    );
    t.row(vec![
        thousands(m.tasks as f64),
        format!("{} B", m.payload_bytes),
        format!("{:.1} MiB", m.used_before as f64 / 1_048_576.0),
        format!("{:.1} MiB", m.used_after as f64 / 1_048_576.0),
        format!("{per_task:.0} B"),
        format!("{beyond:.0} B"),
    ]);
    targets.row(vec![
        format!("≤ {MEMORY_TARGET_BYTES:.0} B per pending task beyond its payload"),
        format!("{beyond:.0} B"),
        met(beyond <= MEMORY_TARGET_BYTES).into(),
    ]);
    t
}

//! The stream run's report: tables, targets and notes.

use super::*;
use crate::report::part_of;

pub(super) fn report(args: &StreamArgs, machine: Machine, outcome: StreamOutcome) -> Report {
    let burst = args.window_s == 0;
    let mut table = Table::new(
        title(args, &outcome),
        &[
            "system",
            "delivered",
            "delivered/s",
            "÷ raw publish",
            "p50",
            "p99",
            "p99.9",
            "max",
            "early",
            "lost",
            "duplicates",
            "due-time metadata wrong",
        ],
    );
    phase_rows(&mut table, &outcome);

    let mut notes = cost_notes(args, &outcome);
    if let Some((raw, published)) = &outcome.raw {
        notes.push(raw_publish_note(args, raw, published));
        if burst {
            notes.push(burst_target_note(&outcome.belfry, raw));
        }
    }
    if !burst {
        notes.push(lateness_target_note(args, &outcome.belfry));
    }
    notes.push(
        "delivered/s = distinct tasks received ÷ (last receipt − first due time; for the raw publish, − the first publish); lateness = the consumer's receipt − the task's due time, on this machine's clock; due-time metadata wrong = entries whose due_at_ms field / belfry-due-at header differs from the submitted due time. The broker was started by the run on a free loopback port and stopped by its pid.".into(),
    );

    Report {
        scenario: format!(
            "stream-{}{}",
            outcome.sink.name(),
            if burst { "-burst" } else { "" }
        ),
        command: crate::command_line(),
        machine,
        tables: vec![table],
        notes,
        picture: None,
        data: serde_json::to_value(&outcome).unwrap_or(serde_json::Value::Null),
    }
}

fn title(args: &StreamArgs, outcome: &StreamOutcome) -> String {
    if args.window_s == 0 {
        format!(
            "{}: {} tasks all due at once, read back by a consumer",
            outcome.sink.title(),
            thousands(args.tasks as f64)
        )
    } else {
        format!(
            "{}: {} tasks due over {} s ({} due/s), read back by a consumer",
            outcome.sink.title(),
            thousands(args.tasks as f64),
            args.window_s,
            thousands(args.tasks as f64 / args.window_s as f64)
        )
    }
}

/// Belfry's phase, then the raw publish's when it ran (its lateness and due-time metadata
/// are not measured).
fn phase_rows(table: &mut Table, outcome: &StreamOutcome) {
    let raw_rate = outcome.raw.as_ref().map(|(p, _)| p.delivered_per_s);
    let phases = std::iter::once(&outcome.belfry).chain(outcome.raw.as_ref().map(|(p, _)| p));
    for phase in phases {
        let d = &phase.delivery;
        let is_raw = !std::ptr::eq(phase, &outcome.belfry);
        let lateness = |v: u64| {
            if is_raw {
                "-".to_string()
            } else {
                format_us(v)
            }
        };
        table.row(vec![
            phase.label.clone(),
            part_of(d.delivered, d.expected),
            thousands(phase.delivered_per_s),
            raw_rate.map_or("-".into(), |r| ratio(phase.delivered_per_s, r)),
            lateness(d.lateness.p50_us),
            lateness(d.lateness.p99_us),
            lateness(d.lateness.p999_us),
            lateness(d.lateness.max_us),
            d.early.to_string(),
            d.lost.to_string(),
            d.duplicates.to_string(),
            if is_raw {
                "-".into()
            } else {
                phase.due_mismatches.to_string()
            },
        ]);
    }
}

/// The submit, the CPU each process used during belfry's phase, and consumer read errors.
fn cost_notes(args: &StreamArgs, outcome: &StreamOutcome) -> Vec<String> {
    let mut notes = Vec::new();
    let b = &outcome.belfry;
    let s = &outcome.submit;
    notes.push(format!(
        "submit: {} tasks in {} requests over {} connections in {:.2} s ({} failed requests, {} rejected); {} answered after their due time.",
        thousands(s.accepted as f64),
        thousands(s.requests as f64),
        args.connections,
        s.elapsed_s,
        s.failed_requests,
        s.rejected,
        s.answered_after_due
    ));
    notes.push(format!(
        "belfry: from the first due time to the end of the consumer ({:.2} s, including {} ms of watching for duplicates) the server used {} CPU s, the broker {}, the bench (consumer) {:.2}; the queue then showed {}.",
        b.cpu_wall_s,
        DUPLICATE_WATCH.as_millis(),
        b.cpu
            .server_cores
            .map_or("?".into(), |c| format!("{:.2}", c * b.cpu_wall_s)),
        outcome
            .broker_cpu_s
            .map_or("?".into(), |c| format!("{c:.2}")),
        b.cpu.client_cores * b.cpu_wall_s,
        outcome.queue_state
    ));
    for phase in std::iter::once(b).chain(outcome.raw.as_ref().map(|(p, _)| p)) {
        if phase.read_errors > 0 || phase.unreadable > 0 {
            notes.push(format!(
                "{}: {} consumer read errors (first: {}), {} unreadable messages.",
                phase.label,
                phase.read_errors,
                phase.first_read_error.as_deref().unwrap_or("-"),
                phase.unreadable
            ));
        }
    }
    notes
}

fn raw_publish_note(args: &StreamArgs, raw: &PhaseOutcome, published: &Published) -> String {
    format!(
        "{}: {} messages with the sink's metadata in batches of {}, {} batches in flight; {} acknowledged in {:.2} s ({} tasks/s by acknowledgement), {} failed batches{}; the broker used {} CPU s, the bench {:.2}, until the consumer's end.",
        raw.label,
        thousands(args.tasks as f64),
        args.publish_batch,
        args.publish_in_flight,
        thousands(published.acknowledged as f64),
        published.elapsed_s,
        thousands(published.acknowledged as f64 / published.elapsed_s.max(1e-9)),
        published.failed_batches,
        published
            .first_error
            .as_deref()
            .map_or(String::new(), |e| format!(" (first: {e})")),
        raw.cpu
            .server_cores
            .map_or("?".into(), |c| format!("{:.2}", c * raw.cpu_wall_s)),
        raw.cpu.client_cores * raw.cpu_wall_s
    )
}

fn burst_target_note(b: &PhaseOutcome, raw: &PhaseOutcome) -> String {
    let share = b.delivered_per_s / raw.delivered_per_s.max(1e-9);
    format!(
        "target (issue #11) burst ≥ {:.0}% of the raw publish rate: {} ({:.0}%).",
        BURST_SHARE_OF_RAW_TARGET * 100.0,
        if share >= BURST_SHARE_OF_RAW_TARGET && b.delivery.lost == 0 {
            "met"
        } else {
            "MISSED"
        },
        share * 100.0
    )
}

fn lateness_target_note(args: &StreamArgs, b: &PhaseOutcome) -> String {
    let p99 = b.delivery.lateness.p99_us;
    format!(
        "target (issue #11) lateness p99 ≤ {} at 10k due/s (this run: {} due/s), never early: p99 {} ({}), early {} ({}).",
        format_us(LATENESS_P99_US_TARGET),
        thousands(args.tasks as f64 / args.window_s as f64),
        if p99 <= LATENESS_P99_US_TARGET && b.delivery.lost == 0 { "met" } else { "MISSED" },
        format_us(p99),
        b.delivery.early,
        if b.delivery.early == 0 { "met" } else { "MISSED" }
    )
}

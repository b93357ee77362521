//! Tables for the terminal and for BENCHMARKS.md, and the rewrite of the engine section.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};
use belfry_store_bench::{probe, workload::Workload};

use crate::compare::EngineResult;
use crate::pending::{PendingRow, TARGET_PENDING};
use crate::CompareArgs;

const SECTION_BEGIN: &str = "<!-- engine:begin -->";
const SECTION_END: &str = "<!-- engine:end -->";

/// Brief targets (see the numbers table of the product brief and issue #2).
const TARGET_INGEST_VS_RAW: f64 = 0.70;
const TARGET_INGEST_PER_SEC: f64 = 1_000_000.0;
const TARGET_DRAIN_PER_SEC: f64 = 500_000.0;
const TARGET_DISK_VS_RAW: f64 = 1.5;
const TARGET_RSS_BYTES: f64 = 512.0 * 1024.0 * 1024.0;
const TARGET_REOPEN_SECS: f64 = 2.0;

/// The two parts of the engine section, each rewritten by its own mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    Compare,
    Pending,
}

impl Block {
    fn markers(self) -> (&'static str, &'static str) {
        match self {
            Block::Compare => (
                "<!-- engine-compare:begin -->",
                "<!-- engine-compare:end -->",
            ),
            Block::Pending => (
                "<!-- engine-pending:begin -->",
                "<!-- engine-pending:end -->",
            ),
        }
    }
}

fn rate(value: Option<f64>) -> String {
    match value {
        Some(v) if v >= 10_000.0 => format!("{:.0}k", v / 1000.0),
        Some(v) => format!("{v:.0}"),
        None => "n/a".into(),
    }
}

fn bytes(value: Option<u64>) -> String {
    match value {
        None => "n/a".into(),
        Some(v) => {
            let v = v as f64;
            if v >= 1024.0 * 1024.0 * 1024.0 {
                format!("{:.2} GiB", v / (1024.0 * 1024.0 * 1024.0))
            } else if v >= 1024.0 * 1024.0 {
                format!("{:.1} MiB", v / (1024.0 * 1024.0))
            } else if v >= 1024.0 {
                format!("{:.1} KiB", v / 1024.0)
            } else {
                format!("{v:.0} B")
            }
        }
    }
}

fn secs(value: Option<f64>) -> String {
    match value {
        Some(v) if v < 1.0 => format!("{:.0} ms", v * 1000.0),
        Some(v) => format!("{v:.2} s"),
        None => "n/a".into(),
    }
}

fn ratio(value: Option<f64>) -> String {
    value.map_or("n/a".into(), |v| format!("{v:.2}×"))
}

fn per_task(total: Option<u64>, tasks: u64) -> Option<f64> {
    total.filter(|_| tasks > 0).map(|t| t as f64 / tasks as f64)
}

fn bytes_f(value: Option<f64>) -> String {
    value.map_or("n/a".into(), |v| format!("{v:.0} B"))
}

fn divide(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// One row of the comparison, with ratios against the raw row when there is one.
fn compare_rows(workload: &Workload, results: &[EngineResult]) -> Vec<Vec<String>> {
    let raw = results.iter().find(|r| r.engine == "raw");
    let raw_bytes = workload.raw_record_bytes() as f64;
    results
        .iter()
        .map(|r| {
            let write_per_task = per_task(r.ingest_write_bytes, r.tasks);
            let disk_per_task = per_task(r.disk_after_ingest_bytes, r.tasks);
            vec![
                r.engine.clone(),
                rate(r.ingest_rate()),
                ratio(divide(
                    r.ingest_rate(),
                    raw.and_then(EngineResult::ingest_rate),
                )),
                rate(r.drain_rate()),
                ratio(divide(
                    r.drain_rate(),
                    raw.and_then(EngineResult::drain_rate),
                )),
                rate(r.durable_ack_drain_rate()),
                bytes_f(write_per_task),
                ratio(write_per_task.map(|w| w / raw_bytes)),
                bytes_f(disk_per_task),
                ratio(disk_per_task.map(|d| d / raw_bytes)),
                bytes(r.disk_after_drain_bytes),
                secs(r.reopen_secs),
                bytes(r.rss_after_ingest_bytes),
                bytes(r.peak_rss_bytes),
                if r.order_violations + r.verify_failures == 0 && r.drained == r.tasks {
                    "ok".into()
                } else {
                    format!(
                        "drained {}/{}, {} out of order, {} bad",
                        r.drained, r.tasks, r.order_violations, r.verify_failures
                    )
                },
            ]
        })
        .collect()
}

const COMPARE_HEADER: [&str; 15] = [
    "engine",
    "ingest tasks/s",
    "÷ raw",
    "drain tasks/s",
    "÷ raw",
    "drain, fsync per ack",
    "written B/task",
    "write amp.",
    "disk B/task",
    "disk ÷ raw",
    "disk after drain",
    "reopen",
    "RSS after ingest",
    "peak RSS",
    "check",
];

fn text_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i] - cell.chars().count();
            let _ = write!(out, "{}{}  ", " ".repeat(pad), cell);
        }
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for row in rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

fn markdown_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n", header.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}

fn workload_line(workload: &Workload) -> String {
    format!(
        "{} tasks of {} B payload, due times spread over {} days, {} tasks per fsync'd commit; \
         a raw record is {} B (payload + due, id, length, CRC)",
        workload.tasks,
        workload.payload_bytes,
        workload.due_spread_ms / belfry_store_bench::workload::DAY_MS,
        workload.batch,
        workload.raw_record_bytes(),
    )
}

fn range_lines(results: &[EngineResult]) -> Vec<String> {
    results
        .iter()
        .filter(|r| r.repetitions > 1)
        .map(|r| {
            let range = |range: Option<(f64, f64)>| match range {
                Some((low, high)) => format!("{}–{}", rate(Some(low)), rate(Some(high))),
                None => "n/a".into(),
            };
            let paired = match r.ingest_vs_raw_paired {
                Some(ratio) if r.engine != "raw" => {
                    format!("; ingest ÷ raw of the same repetition: median {ratio:.2}×")
                }
                _ => String::new(),
            };
            format!(
                "- {}: median of {} runs; ingest {} tasks/s, drain {} tasks/s over the runs{paired}",
                r.engine,
                r.repetitions,
                range(r.ingest_range),
                range(r.drain_range)
            )
        })
        .collect()
}

pub fn compare_table(workload: &Workload, results: &[EngineResult]) -> String {
    let mut out = format!("workload: {}\n\n", workload_line(workload));
    out.push_str(&text_table(
        &COMPARE_HEADER,
        &compare_rows(workload, results),
    ));
    for line in range_lines(results) {
        let _ = writeln!(out, "{line}");
    }
    for verdict in compare_verdicts(workload, results) {
        let _ = writeln!(out, "{verdict}");
    }
    out
}

fn verdict(name: &str, reached: bool, detail: String) -> String {
    let word = if reached { "REACHED" } else { "MISSED" };
    format!("- {name}: **{word}** — {detail}")
}

fn compare_verdicts(workload: &Workload, results: &[EngineResult]) -> Vec<String> {
    let Some(belfry) = results.iter().find(|r| r.engine == "belfry") else {
        return vec!["- belfry was not part of this run: no verdict on the targets.".into()];
    };
    let raw = results.iter().find(|r| r.engine == "raw");
    let mut out = Vec::new();
    if let (Some(ingest), Some(raw_ingest)) = (
        belfry.ingest_rate(),
        raw.and_then(EngineResult::ingest_rate),
    ) {
        // With repetitions, judge by the paired ratio (same repetition, moments apart).
        let (share, how) = match belfry
            .ingest_vs_raw_paired
            .filter(|_| belfry.repetitions > 1)
        {
            Some(paired) => (paired, "median of per-repetition ratios"),
            None => (ingest / raw_ingest, "ratio of the rows above"),
        };
        out.push(verdict(
            "ingest ≥ 70% of raw fsync'd append",
            share >= TARGET_INGEST_VS_RAW,
            format!(
                "{:.0}%, {how} (rows: {} vs {} tasks/s)",
                share * 100.0,
                rate(Some(ingest)),
                rate(Some(raw_ingest))
            ),
        ));
    }
    for row in results.iter().filter(|r| r.engine.starts_with("belfry, ")) {
        if let (Some(ingest), Some(raw_ingest)) =
            (row.ingest_rate(), raw.and_then(EngineResult::ingest_rate))
        {
            out.push(format!(
                "- ({}: {:.0}% of raw, {} tasks/s: the same commits from concurrent writers, which share fsyncs)",
                row.engine,
                ingest / raw_ingest * 100.0,
                rate(Some(ingest))
            ));
        }
    }
    if let Some(ingest) = belfry.ingest_rate() {
        out.push(verdict(
            "ingest ≥ 1,000,000 tasks/s (brief)",
            ingest >= TARGET_INGEST_PER_SEC,
            format!(
                "{} tasks/s, {:.0}% of the target",
                rate(Some(ingest)),
                ingest / TARGET_INGEST_PER_SEC * 100.0
            ),
        ));
    }
    if let Some(drain) = belfry.drain_rate() {
        out.push(verdict(
            "drain ≥ 500,000 tasks/s (page cache)",
            drain >= TARGET_DRAIN_PER_SEC,
            format!(
                "{} tasks/s, {:.0}% of the target",
                rate(Some(drain)),
                drain / TARGET_DRAIN_PER_SEC * 100.0
            ),
        ));
    }
    if let Some(disk) = per_task(belfry.disk_after_ingest_bytes, belfry.tasks) {
        let vs_raw = disk / workload.raw_record_bytes() as f64;
        out.push(verdict(
            "disk ≤ 1.5× raw task bytes",
            vs_raw <= TARGET_DISK_VS_RAW,
            format!("{vs_raw:.2}× ({disk:.0} B per pending task)"),
        ));
    }
    out
}

pub fn git_commit() -> String {
    let output = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output();
    match output {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        _ => "unknown".into(),
    }
}

fn date_utc() -> String {
    let output = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output();
    match output {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        _ => "unknown date".into(),
    }
}

fn provenance() -> String {
    let command: Vec<String> = std::env::args().collect();
    let mut shown = vec!["belfry-store-bench".to_string()];
    shown.extend(command.into_iter().skip(1));
    // The machine is shared: the load average says how much else was running.
    let load = fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_string))
        .map(|one_minute| format!(", 1-minute load average {one_minute} at the end of the run"))
        .unwrap_or_default();
    format!(
        "Command: `cargo run --release -p belfry-store-bench -- {}`  \nCommit `{}`, {}, on {}{load}.\n",
        shown[1..].join(" "),
        git_commit(),
        date_utc(),
        probe::machine(),
    )
}

pub fn compare_markdown(
    _args: &CompareArgs,
    workload: &Workload,
    results: &[EngineResult],
) -> String {
    let mut out =
        String::from("### Ingest, drain, write amplification (raw vs belfry vs fjall)\n\n");
    out.push_str(&provenance());
    let _ = writeln!(out, "Workload: {}.\n", workload_line(workload));
    out.push_str(&markdown_table(
        &COMPARE_HEADER,
        &compare_rows(workload, results),
    ));
    let ranges = range_lines(results);
    if !ranges.is_empty() {
        out.push_str(
            "\nEach row is the run with the median ingest rate; the spread over all runs:\n\n",
        );
        for line in ranges {
            let _ = writeln!(out, "{line}");
        }
    }
    out.push_str(
        "\nEach engine runs in its own child process (peak RSS is its own). Ingest: `put` batches \
         through the `Store` trait (fjall: one write batch per commit with `SyncData`). Drain: \
         `claim` (1,000 at a time) + `ack` (one call per task; one thread, or N threads for \
         \"N writers\" rows) in due order with \
         the clock past every due time, right after a reopen, data in page cache, then one flush \
         (belfry with its default options: policy `always`, delivery state written to the OS \
         before each call returns and fsync'd in groups by the next durable call or a \
         background flusher; fjall: range scan from a cursor + batch delete, not fsync'd per \
         batch; raw: a sequential read-and-check, its ceiling). \"drain, fsync per ack\": the \
         first 2,000 tasks drained with belfry's `sync_delivery` on, where each ack waits for \
         its own fsync. Bytes written come from `/proc/self/io` (`write_bytes`), \
         disk from allocated file sizes. \"÷ raw\" columns divide by the raw row or by the raw \
         record size.\n\nTargets:\n\n",
    );
    for line in compare_verdicts(workload, results) {
        let _ = writeln!(out, "{line}");
    }
    out
}

fn pending_rows(workload: &Workload, rows: &[PendingRow]) -> Vec<Vec<String>> {
    let raw_bytes = (workload.raw_record_bytes()) as f64;
    rows.iter()
        .map(|row| {
            let disk_per_task = per_task(row.fill.disk_after_ingest_bytes, row.fill.tasks);
            vec![
                row.fill.engine.clone(),
                row.fill.tasks.to_string(),
                rate(row.fill.ingest_rate()),
                bytes(row.fill.rss_after_ingest_bytes),
                bytes(row.fill.peak_rss_bytes),
                bytes_f(disk_per_task),
                ratio(disk_per_task.map(|d| d / raw_bytes)),
                secs(row.reopen.reopen_secs),
                secs(row.reopen.first_claim_secs),
                bytes(row.reopen.rss_after_reopen_bytes),
            ]
        })
        .collect()
}

const PENDING_HEADER: [&str; 10] = [
    "engine",
    "pending",
    "fill tasks/s",
    "RSS after fill",
    "peak RSS fill",
    "disk B/task",
    "disk ÷ raw",
    "reopen",
    "serving (1st claim)",
    "RSS after reopen",
];

/// Linear extrapolation from the two sizes of one engine to the target pending count.
fn extrapolate(workload: &Workload, rows: &[PendingRow]) -> Vec<String> {
    let mut out = Vec::new();
    for pair in rows.chunks(2) {
        let [small, large] = pair else { continue };
        let span = (large.fill.tasks - small.fill.tasks) as f64;
        if span <= 0.0 {
            continue;
        }
        out.extend(growth_verdicts(small, large, span));
        out.extend(reopen_records_note(small, large));
        if let Some(disk) = per_task(large.fill.disk_after_ingest_bytes, large.fill.tasks) {
            let vs_raw = disk / workload.raw_record_bytes() as f64;
            out.push(verdict(
                &format!("{}: disk ≤ 1.5× raw task bytes pending", large.fill.engine),
                vs_raw <= TARGET_DISK_VS_RAW,
                format!("{vs_raw:.2}× at {} pending", large.fill.tasks),
            ));
        }
    }
    out
}

/// RSS after reopen, peak RSS while filling and the time to serve again, each on a straight
/// line through the two sizes (`span` tasks apart) to the target pending count.
fn growth_verdicts(small: &PendingRow, large: &PendingRow, span: f64) -> Vec<String> {
    let engine = &large.fill.engine;
    let project = |a: Option<f64>, b: Option<f64>| -> Option<(f64, f64)> {
        let (a, b) = (a?, b?);
        // A negative slope is noise (nothing shrinks as tasks are added): project from
        // the larger measurement with no growth instead of extrapolating a decrease.
        let slope = ((b - a) / span).max(0.0);
        let remaining = TARGET_PENDING.saturating_sub(large.fill.tasks) as f64;
        Some((slope, a.max(b) + slope * remaining))
    };
    let as_f = |v: Option<u64>| v.map(|v| v as f64);
    let per_task_bytes = |(slope, at_target): (f64, f64)| {
        (
            at_target <= TARGET_RSS_BYTES,
            format!(
                "{:.1} B per extra pending task → {} at 100M",
                slope,
                bytes(Some(at_target.max(0.0) as u64))
            ),
        )
    };
    let mut out = Vec::new();
    if let Some(line) = project(
        as_f(small.reopen.rss_after_reopen_bytes),
        as_f(large.reopen.rss_after_reopen_bytes),
    ) {
        let (met, detail) = per_task_bytes(line);
        out.push(verdict(
            &format!("{engine}: RSS after reopen with 100M pending ≤ 512 MiB (extrapolated)"),
            met,
            detail,
        ));
    }
    if let Some(line) = project(
        as_f(small.fill.peak_rss_bytes),
        as_f(large.fill.peak_rss_bytes),
    ) {
        let (met, detail) = per_task_bytes(line);
        out.push(verdict(
            &format!("{engine}: peak RSS while filling 100M ≤ 512 MiB (extrapolated)"),
            met,
            detail,
        ));
    }
    if let Some((slope, at_target)) =
        project(small.reopen.first_claim_secs, large.reopen.first_claim_secs)
    {
        out.push(verdict(
            &format!(
                "{engine}: serving again after kill -9 with 100M pending ≤ 2 s (extrapolated)"
            ),
            at_target <= TARGET_REOPEN_SECS,
            format!(
                "{:.1} ms per extra million pending → {} at 100M",
                slope * 1e6 * 1000.0,
                secs(Some(at_target.max(0.0)))
            ),
        ));
    }
    out
}

/// Time on a shared machine is noisy; the engine's own count of what it read at reopen is
/// not. When that count did not grow with ten times the tasks, say so next to the
/// straight-line verdict.
fn reopen_records_note(small: &PendingRow, large: &PendingRow) -> Option<String> {
    let engine = &large.fill.engine;
    let (a, b) = (
        small.reopen.reopen_records_read?,
        large.reopen.reopen_records_read?,
    );
    if b > a.saturating_mul(2) {
        return Some(format!(
            "- {engine}: records read at reopen grew with the pending count ({a} at {} → {b} at {})",
            small.fill.tasks, large.fill.tasks,
        ));
    }
    let measured = match (small.reopen.first_claim_secs, large.reopen.first_claim_secs) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    Some(format!(
        "- {engine}: records read at reopen did not grow with the pending count ({a} at {} → {b} at {}): \
         by that measure reopen at 100M stays near the measured {}, whatever a straight line through two noisy timings says \
         (reopen also fsyncs what the killed process left unsynced, bounded by the checkpoint interval)",
        small.fill.tasks,
        large.fill.tasks,
        secs(measured),
    ))
}

pub fn pending_table(workload: &Workload, rows: &[PendingRow]) -> String {
    let mut out = text_table(&PENDING_HEADER, &pending_rows(workload, rows));
    for row in rows {
        if let Some(work) = &row.reopen.reopen_work {
            let _ = writeln!(
                out,
                "{} reopen at {} pending: {work}",
                row.reopen.engine, row.fill.tasks
            );
        }
    }
    for line in extrapolate(workload, rows) {
        let _ = writeln!(out, "{line}");
    }
    out
}

pub fn pending_markdown(workload: &Workload, rows: &[PendingRow]) -> String {
    let mut out =
        String::from("### Far-future pending tasks: memory, disk, restart after kill -9\n\n");
    out.push_str(&provenance());
    let _ = writeln!(
        out,
        "Workload: far-future tasks (due from 7 days ahead, spread over {} days) of {} B payload, {} per \
         fsync'd commit. The fill process exits without closing the engine (as after `kill -9`); a \
         fresh process then reopens it and answers a first claim.\n",
        workload.due_spread_ms / belfry_store_bench::workload::DAY_MS,
        workload.payload_bytes,
        workload.batch,
    );
    out.push_str(&markdown_table(
        &PENDING_HEADER,
        &pending_rows(workload, rows),
    ));
    let work: Vec<String> = rows
        .iter()
        .filter_map(|row| {
            let work = row.reopen.reopen_work.as_ref()?;
            Some(format!(
                "- {} at {} pending: {work}",
                row.reopen.engine, row.fill.tasks
            ))
        })
        .collect();
    if !work.is_empty() {
        out.push_str("\nWork done by each reopen (the engine's counters):\n\n");
        for line in work {
            let _ = writeln!(out, "{line}");
        }
    }
    out.push_str("\nTargets (100M pending is extrapolated linearly from the two sizes above, not measured; a \
         straight line through two points overstates costs that are bounded, such as WAL replay \
         since the last checkpoint, and would miss a cost that grows faster than linearly):\n\n");
    for line in extrapolate(workload, rows) {
        let _ = writeln!(out, "{line}");
    }
    out
}

/// Replaces `block` inside the engine section of `path`, keeping the other block as it is.
pub fn rewrite_engine_section(path: &Path, block: Block, content: &str) -> anyhow::Result<()> {
    let text = fs::read_to_string(path).context("read the markdown file")?;
    let (Some(start), Some(end)) = (text.find(SECTION_BEGIN), text.find(SECTION_END)) else {
        bail!(
            "{} has no {SECTION_BEGIN} … {SECTION_END} section",
            path.display()
        );
    };
    if end < start {
        bail!("{SECTION_END} comes before {SECTION_BEGIN}");
    }
    let inner = &text[start + SECTION_BEGIN.len()..end];
    let keep = |b: Block| -> String {
        let (open, close) = b.markers();
        match (inner.find(open), inner.find(close)) {
            (Some(s), Some(e)) if s < e => inner[s + open.len()..e].trim().to_string(),
            _ => "(not measured yet)".into(),
        }
    };
    let mut compare = keep(Block::Compare);
    let mut pending = keep(Block::Pending);
    match block {
        Block::Compare => compare = content.trim().to_string(),
        Block::Pending => pending = content.trim().to_string(),
    }
    let (c_open, c_close) = Block::Compare.markers();
    let (p_open, p_close) = Block::Pending.markers();
    let new_inner = format!(
        "\nWritten by `crates/belfry-store-bench` (see its `--help`); each part below is rewritten by \
         the mode that produced it.\n\n{c_open}\n{compare}\n{c_close}\n\n{p_open}\n{pending}\n{p_close}\n"
    );
    let mut out = String::with_capacity(text.len() + new_inner.len());
    out.push_str(&text[..start + SECTION_BEGIN.len()]);
    out.push_str(&new_inner);
    out.push_str(&text[end..]);
    fs::write(path, out).context("write the markdown file")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_only_its_block_inside_the_engine_section() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("BENCHMARKS.md");
        let original = "# B\n\n<!-- engine:begin -->\n(not measured yet)\n<!-- engine:end -->\n\n\
                        <!-- server:begin -->\nkeep me\n<!-- server:end -->\n";
        fs::write(&path, original).unwrap();
        rewrite_engine_section(&path, Block::Compare, "compare v1").unwrap();
        rewrite_engine_section(&path, Block::Pending, "pending v1").unwrap();
        rewrite_engine_section(&path, Block::Compare, "compare v2").unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# B\n\n<!-- engine:begin -->"));
        assert!(text.contains("compare v2") && !text.contains("compare v1"));
        assert!(text.contains("pending v1"));
        assert!(text.ends_with("<!-- server:begin -->\nkeep me\n<!-- server:end -->\n"));
        assert_eq!(text.matches(SECTION_BEGIN).count(), 1);
    }

    #[test]
    fn refuses_a_file_without_the_section() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.md");
        fs::write(&path, "nothing here").unwrap();
        assert!(rewrite_engine_section(&path, Block::Compare, "x").is_err());
    }
}

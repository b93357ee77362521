//! Pending mode: fill far-future tasks, "crash" (exit without closing), reopen in a fresh
//! process, and report memory, disk per task and time to serve again, at two sizes so the
//! growth with the pending count shows.

use anyhow::Context;
use belfry_store_bench::workload::DAY_MS;

use crate::compare::{self, BenchDir, EngineResult, Phase};
use crate::engines::EngineKind;
use crate::report;
use crate::PendingArgs;

/// Far-future tasks start this long after now: well past any near window an engine keeps in
/// memory, so what is measured is the cost of tasks that are only waiting.
const PENDING_DUE_AFTER_MS: u64 = 7 * DAY_MS;

/// The brief's target pending count, used for the extrapolation.
pub const TARGET_PENDING: u64 = 100_000_000;

/// One engine at one size.
#[derive(Debug, Clone)]
pub struct PendingRow {
    pub fill: EngineResult,
    pub reopen: EngineResult,
}

pub fn run(args: &PendingArgs) -> anyhow::Result<()> {
    let parent = BenchDir::new(args.dir.as_deref())?;
    let sizes = [(args.pending / 10).max(1), args.pending.max(1)];
    let mut rows = Vec::new();
    for name in &args.engines {
        let kind = EngineKind::parse(name)?;
        anyhow::ensure!(
            matches!(kind, EngineKind::Belfry | EngineKind::Fjall),
            "pending mode runs belfry or fjall"
        );
        for &tasks in &sizes {
            let dir = parent.path().join(format!("{}-{tasks}", kind.name()));
            let workload = args
                .workload
                .workload(tasks, compare::wall_ms() + PENDING_DUE_AFTER_MS);
            eprintln!("filling {tasks} far-future tasks into {}", kind.name());
            let fill =
                compare::spawn_child(kind, &dir, Phase::PendingFill, &workload, &args.workload)?;
            eprintln!("reopening {}", kind.name());
            let reopen =
                compare::spawn_child(kind, &dir, Phase::PendingReopen, &workload, &args.workload)?;
            compare::remove_dir_if_exists(&dir)?;
            rows.push(PendingRow { fill, reopen });
        }
    }
    let workload = args.workload.workload(args.pending, 0);
    println!("{}", report::pending_table(&workload, &rows));
    if let Some(path) = &args.write_markdown {
        let markdown = report::pending_markdown(&workload, &rows);
        report::rewrite_engine_section(path, report::Block::Pending, &markdown)
            .with_context(|| format!("rewrite {}", path.display()))?;
        println!("wrote the engine section of {}", path.display());
    }
    Ok(())
}

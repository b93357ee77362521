//! `belfry bench stages`: where a profiled process's CPU went, by stage, per unit of work.
//!
//! It reads folded stacks (`frame;frame;…;leaf COUNT` per line, what `inferno-collapse-perf`
//! makes of `perf script`), puts every sample in the first stage of [`STAGES`] that one of its
//! frames belongs to, and prints each stage's share. With `--units N` (the requests or tasks
//! the profile covers) it also prints microseconds per unit: the counts are then read as
//! nanoseconds of CPU, which is what `perf record -e cpu-clock` records (each sample's period
//! is the CPU time it stands for). `--against` prints a second profile beside the first, for
//! a server beside its baseline. `scripts/profile.sh` makes the profiles.
//!
//! A sample in the allocator is the allocator's, whoever called it; a sample in the kernel
//! belongs to the system call it is under (a wake-up inside a socket send is the send); any
//! other belongs to the innermost library on its stack that names a stage (JSON inside a
//! handler inside axum inside hyper inside tokio is JSON). [`classify`] says it exactly.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use crate::error::BenchError;
use crate::report::Table;

/// How a stage recognises one of its frames.
#[derive(Debug, Clone, Copy)]
pub enum Frame {
    /// The whole frame name (kernel and libc symbols).
    Exact(&'static str),
    /// The frame name starts with this.
    Prefix(&'static str),
    /// The frame name contains this (Rust paths, which appear inside generic instances).
    Contains(&'static str),
}

impl Frame {
    fn matches(self, frame: &str) -> bool {
        match self {
            Frame::Exact(name) => frame == name,
            Frame::Prefix(start) => frame.starts_with(start),
            Frame::Contains(part) => frame.contains(part),
        }
    }
}

/// Which part of a stack decides for a stage (see [`classify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Anywhere on the stack: these frames are on it only while the sample is inside them.
    Allocator,
    /// The outermost kernel frame that names a stage: the system call the thread made, even
    /// when the sample fell in what it called (a wake-up inside a socket send is the send).
    Kernel,
    /// Kernel frames no [`Kind::Kernel`] stage claims.
    KernelOther,
    /// The innermost user-space frame that names a stage: the library the thread was in
    /// (serde_json called by a handler called by axum is JSON).
    User,
}

/// One stage: its name in the table and the frames that put a sample in it.
#[derive(Debug)]
pub struct Stage {
    pub name: &'static str,
    pub kind: Kind,
    pub frames: &'static [Frame],
}

use Frame::{Contains, Exact, Prefix};

/// Every stage; within a [`Kind`], the first that matches a frame wins. A sample no stage
/// claims is counted as "other".
pub const STAGES: &[Stage] = &[
    Stage {
        name: "allocator (malloc, free)",
        kind: Kind::Allocator,
        frames: &[
            Exact("malloc"),
            Exact("free"),
            Exact("realloc"),
            Exact("calloc"),
            Exact("cfree"),
            Prefix("_int_"),
            Prefix("__libc_malloc"),
            Prefix("__libc_free"),
            Prefix("__libc_realloc"),
            Prefix("__libc_calloc"),
            Prefix("malloc_consolidate"),
            Prefix("tcache_"),
            Prefix("__rdl_"),
            Prefix("__rust_alloc"),
            Prefix("__rust_dealloc"),
            Prefix("__rust_realloc"),
        ],
    },
    Stage {
        name: "kernel: fdatasync",
        kind: Kind::Kernel,
        frames: &[
            Exact("__x64_sys_fdatasync"),
            Exact("__x64_sys_fsync"),
            Exact("do_fsync"),
            Exact("file_write_and_wait_range"),
            Prefix("ext4_sync_file"),
        ],
    },
    Stage {
        name: "kernel: socket send (on loopback, with the receiver's TCP work)",
        kind: Kind::Kernel,
        frames: &[
            Exact("tcp_sendmsg"),
            Exact("sock_write_iter"),
            Exact("__sys_sendto"),
            Exact("__x64_sys_sendto"),
            Exact("__x64_sys_sendmsg"),
            Exact("do_writev"),
            Exact("__x64_sys_writev"),
        ],
    },
    Stage {
        name: "kernel: socket receive",
        kind: Kind::Kernel,
        frames: &[
            Exact("tcp_recvmsg"),
            Exact("sock_read_iter"),
            Exact("sock_recvmsg"),
            Exact("__sys_recvfrom"),
            Exact("__x64_sys_recvfrom"),
        ],
    },
    Stage {
        name: "kernel: file writes and reads",
        kind: Kind::Kernel,
        frames: &[
            Exact("ksys_pwrite64"),
            Exact("__x64_sys_pwrite64"),
            Exact("ksys_pread64"),
            Exact("__x64_sys_pread64"),
            Prefix("ext4_file_write"),
            Prefix("ext4_buffered_write"),
            Exact("filemap_read"),
        ],
    },
    Stage {
        name: "kernel: accept and close",
        kind: Kind::Kernel,
        frames: &[
            Exact("__sys_accept4"),
            Exact("__x64_sys_accept4"),
            Exact("__x64_sys_close"),
            Exact("tcp_close"),
            Exact("inet_release"),
        ],
    },
    Stage {
        name: "kernel: epoll",
        kind: Kind::Kernel,
        frames: &[
            Exact("do_epoll_wait"),
            Exact("ep_poll"),
            Exact("__x64_sys_epoll_wait"),
            Exact("__x64_sys_epoll_pwait"),
            Exact("do_epoll_ctl"),
            Exact("__x64_sys_epoll_ctl"),
        ],
    },
    Stage {
        name: "kernel: futex, wake-ups, context switches",
        kind: Kind::Kernel,
        frames: &[
            Exact("__x64_sys_futex"),
            Exact("do_futex"),
            Exact("futex_wake"),
            Exact("futex_wait"),
            Exact("schedule"),
            Exact("__schedule"),
            Prefix("finish_task_switch"),
            Exact("try_to_wake_up"),
            Exact("__x64_sys_sched_yield"),
            Exact("do_sched_yield"),
        ],
    },
    Stage {
        name: "kernel: other (syscall entry, page faults, interrupts)",
        kind: Kind::KernelOther,
        frames: &[
            Prefix("entry_SYSCALL_64"),
            Prefix("asm_exc_"),
            Prefix("asm_sysvec_"),
            Prefix("asm_common_interrupt"),
            Exact("exc_page_fault"),
            Prefix("irq_exit"),
        ],
    },
    Stage {
        name: "JSON (serde_json)",
        kind: Kind::User,
        frames: &[Contains("serde_json::")],
    },
    Stage {
        name: "store (engine or Redis client)",
        kind: Kind::User,
        frames: &[
            Contains("belfry_store::"),
            Contains("belfry_store_redis::"),
            Contains("redis::"),
        ],
    },
    Stage {
        name: "submit coalescer (hand-off to the writer thread)",
        kind: Kind::User,
        frames: &[Contains("belfry_server::coalesce::")],
    },
    Stage {
        name: "HTTP/1 parse and encode (hyper, httparse, http)",
        kind: Kind::User,
        frames: &[
            Contains("httparse::"),
            Contains("hyper::proto::h1::role"),
            Contains("hyper::proto::h1::encode"),
            Contains("hyper::proto::h1::decode"),
            Contains("http::header::"),
        ],
    },
    Stage {
        name: "metrics",
        kind: Kind::User,
        frames: &[Contains("metrics::"), Contains("metrics_exporter")],
    },
    Stage {
        name: "belfry: handlers, service, runners",
        kind: Kind::User,
        frames: &[Contains("belfry_")],
    },
    Stage {
        name: "axum and tower (routing, extractors, layers)",
        kind: Kind::User,
        frames: &[
            Contains("axum::"),
            Contains("axum_core::"),
            Contains("tower::"),
            Contains("tower_http::"),
            Contains("tower_service::"),
            Contains("matchit::"),
        ],
    },
    Stage {
        name: "hyper: connection state and buffers",
        kind: Kind::User,
        frames: &[Contains("hyper::"), Contains("hyper_util::")],
    },
    Stage {
        name: "tokio runtime (scheduler, timers, I/O driver)",
        kind: Kind::User,
        frames: &[Contains("tokio::")],
    },
];

/// Name of the row for samples no stage claims.
pub const OTHER: &str = "other";

/// The stage of `frames` (a stack, root first): an allocator frame anywhere; else the
/// outermost kernel frame that names a stage, or "kernel: other" for any other kernel frame;
/// else the innermost user-space frame that names a stage; else [`OTHER`].
pub fn classify(frames: &[&str]) -> &'static str {
    let stage_of = |kind: Kind, frame: &str| {
        STAGES
            .iter()
            .filter(|stage| stage.kind == kind)
            .find(|stage| stage.frames.iter().any(|f| f.matches(frame)))
            .map(|stage| stage.name)
    };
    let anywhere = |kind: Kind| frames.iter().find_map(|f| stage_of(kind, f));
    anywhere(Kind::Allocator)
        .or_else(|| anywhere(Kind::Kernel))
        .or_else(|| anywhere(Kind::KernelOther))
        .or_else(|| frames.iter().rev().find_map(|f| stage_of(Kind::User, f)))
        .unwrap_or(OTHER)
}

/// A profile's counts by stage, and the heaviest leaves of what no stage claimed.
#[derive(Debug, Default)]
pub struct Profile {
    pub total: u64,
    pub by_stage: HashMap<&'static str, u64>,
    pub unclaimed_leaves: HashMap<String, u64>,
}

impl Profile {
    /// Reads folded stacks. A line that is not `stack COUNT` is an error naming its number.
    pub fn read(input: impl BufRead) -> Result<Profile, String> {
        let mut profile = Profile::default();
        for (i, line) in input.lines().enumerate() {
            let line = line.map_err(|e| format!("line {}: {e}", i + 1))?;
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            let (stack, count) = line
                .rsplit_once(' ')
                .ok_or_else(|| format!("line {}: no count after the stack", i + 1))?;
            let count: u64 = count
                .parse()
                .map_err(|_| format!("line {}: {count:?} is not a count", i + 1))?;
            let frames: Vec<&str> = stack.split(';').collect();
            let stage = classify(&frames);
            profile.total += count;
            *profile.by_stage.entry(stage).or_default() += count;
            if stage == OTHER {
                let leaf = stack.rsplit(';').next().unwrap_or(stack);
                *profile
                    .unclaimed_leaves
                    .entry(leaf.to_string())
                    .or_default() += count;
            }
        }
        Ok(profile)
    }

    /// CPU counted in `row` (a stage's name; `None`: the whole profile).
    fn count(&self, row: Option<&str>) -> u64 {
        match row {
            Some(stage) => self.by_stage.get(stage).copied().unwrap_or(0),
            None => self.total,
        }
    }

    fn share(&self, row: Option<&str>) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.count(row) as f64 / self.total as f64
        }
    }

    /// Microseconds of CPU per unit in `row` (counts read as nanoseconds).
    fn us_per_unit(&self, row: Option<&str>, units: u64) -> f64 {
        self.count(row) as f64 / 1_000.0 / units as f64
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct StagesArgs {
    /// Folded stacks of the profile (`-` reads standard input).
    pub folded: PathBuf,
    /// Units of work the profile covers (requests, tasks): adds microseconds of CPU per unit,
    /// reading the counts as nanoseconds (`perf record -e cpu-clock`).
    #[arg(long)]
    pub units: Option<u64>,
    /// A second profile printed beside the first (a baseline).
    #[arg(long)]
    pub against: Option<PathBuf>,
    /// Units of work of the --against profile (default: --units).
    #[arg(long)]
    pub against_units: Option<u64>,
    /// Column titles of the two profiles.
    #[arg(long, default_value = "profile")]
    pub name: String,
    #[arg(long, default_value = "baseline")]
    pub against_name: String,
    /// Print a Markdown table instead of text.
    #[arg(long)]
    pub markdown: bool,
    /// Also list this many of the heaviest leaf frames that no stage claims.
    #[arg(long, default_value_t = 0)]
    pub unclaimed: usize,
}

fn read_profile(path: &Path) -> anyhow::Result<Profile> {
    let profile = if path.as_os_str() == "-" {
        Profile::read(std::io::stdin().lock())
    } else {
        let file = std::fs::File::open(path).map_err(|e| BenchError::io("open", path, e))?;
        Profile::read(std::io::BufReader::new(file))
    };
    profile.map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The table of `main` (and `against`) by stage, heaviest stage of `main` first.
pub fn table(args: &StagesArgs, main: &Profile, against: Option<(&Profile, Option<u64>)>) -> Table {
    let mut headers = vec!["stage".to_string(), format!("{} share", args.name)];
    if args.units.is_some() {
        headers.push(format!("{} µs/unit", args.name));
    }
    if let Some((_, units)) = against {
        headers.push(format!("{} share", args.against_name));
        if units.is_some() {
            headers.push(format!("{} µs/unit", args.against_name));
        }
        if args.units.is_some() && units.is_some() {
            headers.push("difference µs/unit".to_string());
        }
    }
    let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut table = Table::new("CPU by stage", &header_refs);
    let mut names: Vec<&'static str> = STAGES.iter().map(|s| s.name).chain([OTHER]).collect();
    names.retain(|n| {
        main.by_stage.contains_key(n) || against.is_some_and(|(p, _)| p.by_stage.contains_key(n))
    });
    names.sort_by_key(|name| std::cmp::Reverse(main.count(Some(name))));
    let percent = |x: f64| format!("{:.1}%", 100.0 * x);
    let us = |x: f64| format!("{x:.2}");
    for row in names.into_iter().map(Some).chain([None]) {
        let mut cells = vec![row.unwrap_or("total").to_string(), percent(main.share(row))];
        if let Some(u) = args.units {
            cells.push(us(main.us_per_unit(row, u)));
        }
        if let Some((other, other_units)) = against {
            cells.push(percent(other.share(row)));
            if let Some(v) = other_units {
                cells.push(us(other.us_per_unit(row, v)));
            }
            if let (Some(u), Some(v)) = (args.units, other_units) {
                cells.push(format!(
                    "{:+.2}",
                    main.us_per_unit(row, u) - other.us_per_unit(row, v)
                ));
            }
        }
        table.row(cells);
    }
    table
}

pub fn run(args: StagesArgs) -> anyhow::Result<()> {
    if args.units == Some(0) {
        return Err(BenchError::invalid("--units", "must be at least 1").into());
    }
    if args.against_units == Some(0) {
        return Err(BenchError::invalid("--against-units", "must be at least 1").into());
    }
    let main = read_profile(&args.folded)?;
    if main.total == 0 {
        anyhow::bail!("{}: no samples", args.folded.display());
    }
    let against = match &args.against {
        Some(path) => Some(read_profile(path)?),
        None => None,
    };
    let against_units = args.against_units.or(args.units);
    let table = table(&args, &main, against.as_ref().map(|p| (p, against_units)));
    if args.markdown {
        print!("{}", table.render_markdown());
    } else {
        print!("{}", table.render_text());
    }
    if args.units.is_some() {
        println!(
            "(µs/unit: the counts read as nanoseconds of CPU, as `perf record -e cpu-clock` \
             records them, divided by the units)"
        );
    }
    if args.unclaimed > 0 {
        let mut leaves: Vec<_> = main.unclaimed_leaves.iter().collect();
        leaves.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        println!("heaviest leaves no stage claims:");
        for (leaf, count) in leaves.into_iter().take(args.unclaimed) {
            println!(
                "  {:5.2}%  {leaf}",
                100.0 * *count as f64 / main.total as f64
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage_of(stack: &str) -> &'static str {
        classify(&stack.split(';').collect::<Vec<_>>())
    }

    #[test]
    fn the_innermost_library_wins_over_the_ones_around_it() {
        let handler = "tokio::runtime::worker::run;hyper::proto::h1::dispatch::poll;\
                       axum::routing::Router::call;belfry_server::api::tasks::submit";
        assert_eq!(stage_of(handler), "belfry: handlers, service, runners");
        let json = format!("{handler};serde_json::de::from_slice");
        assert_eq!(stage_of(&json), "JSON (serde_json)");
        // A belfry layer around axum does not claim axum's own work inside it.
        let layered = "tokio::runtime::worker::run;hyper::proto::h1::dispatch::poll;\
                       belfry_server::api::TrackLatencyFuture::poll;axum::routing::Route::call";
        assert_eq!(
            stage_of(layered),
            "axum and tower (routing, extractors, layers)"
        );
        assert_eq!(
            stage_of("tokio::runtime::worker::run;hyper::proto::h1::conn::poll_read;memcpy"),
            "hyper: connection state and buffers"
        );
        assert_eq!(
            stage_of("tokio::runtime::worker::run;tokio::runtime::park"),
            "tokio runtime (scheduler, timers, I/O driver)"
        );
        assert_eq!(stage_of("main;mystery"), OTHER);
    }

    #[test]
    fn the_allocator_and_system_calls_claim_what_runs_inside_them() {
        let json = "tokio::run;belfry_server::api::submit;serde_json::de::from_slice";
        let alloc = format!("{json};alloc::raw_vec::finish_grow;malloc;_int_malloc");
        assert_eq!(stage_of(&alloc), "allocator (malloc, free)");
        let fault = format!("{alloc};asm_exc_page_fault;exc_page_fault");
        assert_eq!(stage_of(&fault), "allocator (malloc, free)");
        // The receiver's wake-up inside a loopback send is the send's cost.
        let send = "hyper::proto::h1::io::poll_flush;__GI___writev;entry_SYSCALL_64;\
                    do_syscall_64;do_writev;sock_write_iter;tcp_sendmsg;sock_def_readable;\
                    try_to_wake_up";
        assert_eq!(
            stage_of(send),
            "kernel: socket send (on loopback, with the receiver's TCP work)"
        );
        // Blocking inside fdatasync is fdatasync's.
        let fsync = "belfry_store::engine::wal::sync;fdatasync;entry_SYSCALL_64;\
                     __x64_sys_fdatasync;do_fsync;ext4_sync_file;schedule";
        assert_eq!(stage_of(fsync), "kernel: fdatasync");
        assert_eq!(
            stage_of("belfry_server::x;asm_sysvec_apic_timer_interrupt;irq_exit_rcu"),
            "kernel: other (syscall entry, page faults, interrupts)"
        );
        // A Rust path that merely contains a kernel symbol's name is not that symbol.
        assert_eq!(
            stage_of("tokio::runtime::scheduler::multi_thread::worker::run"),
            "tokio runtime (scheduler, timers, I/O driver)"
        );
    }

    #[test]
    fn a_profile_is_read_by_stage_and_bad_lines_are_named() {
        let folded = "tokio::run;serde_json::parse 3000\n\
                      main;mystery_leaf 1000\n\
                      \n\
                      tokio::run;tokio::park 6000\n";
        let p = Profile::read(folded.as_bytes()).unwrap();
        assert_eq!(p.total, 10_000);
        assert_eq!(p.by_stage["JSON (serde_json)"], 3_000);
        assert_eq!(p.unclaimed_leaves["mystery_leaf"], 1_000);
        assert!((p.share(Some(OTHER)) - 0.1).abs() < 1e-9);
        assert!((p.us_per_unit(Some("JSON (serde_json)"), 3) - 1.0).abs() < 1e-9);

        let err = Profile::read("a;b 10\na;b ten\n".as_bytes()).unwrap_err();
        assert!(err.contains("line 2"), "{err}");
        let err = Profile::read("lonely\n".as_bytes()).unwrap_err();
        assert!(err.contains("line 1") && err.contains("no count"), "{err}");
    }

    #[test]
    fn the_table_puts_two_profiles_side_by_side_with_their_difference() {
        let server = Profile::read("belfry_server::x 6000\ntokio::y 4000\n".as_bytes()).unwrap();
        let baseline = Profile::read("tokio::y 2000\n".as_bytes()).unwrap();
        let args = StagesArgs {
            folded: PathBuf::from("-"),
            units: Some(2),
            against: Some(PathBuf::from("-")),
            against_units: Some(1),
            name: "belfry".into(),
            against_name: "trivial".into(),
            markdown: false,
            unclaimed: 0,
        };
        let t = table(&args, &server, Some((&baseline, Some(1))));
        assert_eq!(
            t.headers,
            [
                "stage",
                "belfry share",
                "belfry µs/unit",
                "trivial share",
                "trivial µs/unit",
                "difference µs/unit"
            ]
        );
        let row = |name: &str| t.rows.iter().find(|r| r[0] == name).unwrap().clone();
        // 6,000 ns over 2 units is 3 µs each; the baseline has none of it.
        assert_eq!(
            row("belfry: handlers, service, runners"),
            [
                "belfry: handlers, service, runners",
                "60.0%",
                "3.00",
                "0.0%",
                "0.00",
                "+3.00"
            ]
        );
        assert_eq!(
            row("total"),
            ["total", "100.0%", "5.00", "100.0%", "2.00", "+3.00"]
        );
        // Heaviest stage of the first profile first, the total last.
        assert_eq!(t.rows[0][0], "belfry: handlers, service, runners");
        assert_eq!(t.rows.last().unwrap()[0], "total");
    }
}

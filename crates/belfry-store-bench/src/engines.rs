//! The engines under test and how to open them.

use std::path::Path;

use anyhow::{bail, Context};
use belfry_store::engine::{Engine, EngineOptions};
use belfry_store::{MemoryStore, Store};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// Sequential append + fsync of the raw records: the disk's limit, not a store.
    Raw,
    /// The belfry timeline engine, through the `Store` trait.
    Belfry,
    /// fjall, a general-purpose LSM: key = due || seq, value = payload.
    Fjall,
    /// The in-memory reference store, through the `Store` trait (nothing durable).
    Memory,
}

impl EngineKind {
    pub fn parse(name: &str) -> anyhow::Result<Self> {
        Ok(match name {
            "raw" => EngineKind::Raw,
            "belfry" => EngineKind::Belfry,
            "fjall" => EngineKind::Fjall,
            "memory" => EngineKind::Memory,
            other => bail!("unknown engine {other:?}: expected raw, belfry, fjall or memory"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Raw => "raw",
            EngineKind::Belfry => "belfry",
            EngineKind::Fjall => "fjall",
            EngineKind::Memory => "memory",
        }
    }
}

/// An engine as named on the command line: `belfry`, or `belfry@4` for the same engine fed
/// by 4 concurrent writer threads (to show group commit), overriding `--writers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineSpec {
    pub kind: EngineKind,
    pub writers: Option<usize>,
}

impl EngineSpec {
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let (name, writers) = match text.split_once('@') {
            Some((name, writers)) => {
                let writers: usize =
                    writers.parse().ok().filter(|&w| w > 0).with_context(|| {
                        format!("{text:?}: the writer count after @ must be at least 1")
                    })?;
                (name, Some(writers))
            }
            None => (text, None),
        };
        let kind = EngineKind::parse(name)?;
        if writers.is_some() && kind == EngineKind::Raw {
            bail!("raw append is one stream; it takes no @writers");
        }
        Ok(EngineSpec { kind, writers })
    }

    /// The row label: the kind's name, with the writer count when it was given.
    pub fn label(self) -> String {
        match self.writers {
            Some(writers) => format!("{}, {writers} writers", self.kind.name()),
            None => self.kind.name().to_string(),
        }
    }
}

/// Opens a `Store` engine in `dir` (created if missing) with its default options: fsync
/// policy `always`, the durability the brief promises by default. `sync_delivery` also makes
/// belfry's delivery-state calls (claim, ack, ...) wait for their own fsync; by default they
/// return once their record is written to the OS (it survives a process crash) and are
/// fsync'd by the next durable call or a background flusher.
pub fn open_store(
    kind: EngineKind,
    dir: &Path,
    sync_delivery: bool,
) -> anyhow::Result<Box<dyn Store>> {
    match kind {
        EngineKind::Belfry => Ok(Box::new(open_belfry_engine(dir, sync_delivery)?)),
        EngineKind::Memory => Ok(Box::new(MemoryStore::default())),
        EngineKind::Raw | EngineKind::Fjall => bail!("{} is not a Store", kind.name()),
    }
}

/// The belfry engine itself, for callers that also read its work counters.
pub fn open_belfry_engine(dir: &Path, sync_delivery: bool) -> anyhow::Result<Engine> {
    let options = EngineOptions {
        sync_delivery,
        ..EngineOptions::default()
    };
    Engine::open(dir, options)
        .with_context(|| format!("open the belfry engine in {}", dir.display()))
}

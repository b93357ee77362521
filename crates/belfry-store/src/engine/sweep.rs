//! What an open removes from the engine's directories: files the engine wrote and no longer
//! lists (bucket files and runs written after the checkpoint, the directory of a deleted
//! queue), and nothing else. A name the engine never makes (a note, a backup copied in, a
//! directory) is left where it is with a WARN naming it: the operator put it there, and
//! the engine cannot tell whether it matters. What it removes is logged too, one line per
//! directory, so a file that disappeared can be traced to the open that removed it.

use std::fs;
use std::path::Path;

use super::io_at;
use crate::store::Result;

/// Names listed in full in a log line; beyond, only counted.
const NAMES_LOGGED_MAX: usize = 10;

/// Removes the files of `dir` whose names the engine makes (`ours`) and that it does not
/// list (`listed`); warns about the entries whose names it does not make. `what` says what
/// the removed files are, for the log. Returns whether entries other than listed ones were
/// left in `dir`.
pub(super) fn sweep(
    dir: &Path,
    ours: impl Fn(&str) -> bool,
    listed: impl Fn(&str) -> bool,
    what: &str,
) -> Result<bool> {
    let mut removed = Vec::new();
    let mut foreign = false;
    for entry in fs::read_dir(dir).map_err(io_at("list a directory", dir))? {
        let entry = entry.map_err(io_at("list a directory", dir))?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_str().unwrap_or_default();
        if listed(name) {
            continue;
        }
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if ours(name) && is_file {
            fs::remove_file(&path)
                .map_err(io_at("remove a file the checkpoint does not list", &path))?;
            removed.push(name.to_owned());
        } else {
            foreign = true;
            tracing::warn!(
                path = %path.display(),
                "leaving an entry whose name belfry never writes in its data directory; \
                 move it out of the data directory if it is yours"
            );
        }
    }
    if !removed.is_empty() {
        let count = removed.len();
        removed.truncate(NAMES_LOGGED_MAX);
        tracing::info!(
            dir = %dir.display(),
            count,
            files = removed.join(" "),
            "removed {what}"
        );
    }
    Ok(foreign)
}

/// Removes the directory of a deleted queue: its bucket files (`ours`), then the directory,
/// unless entries the engine did not write are left in it (warned about by [`sweep`]).
pub(super) fn remove_queue_dir(dir: &Path, ours: impl Fn(&str) -> bool) -> Result<()> {
    let foreign = sweep(dir, ours, |_| false, "the bucket files of a deleted queue")?;
    if foreign {
        tracing::warn!(
            dir = %dir.display(),
            "leaving the directory of a deleted queue: it holds entries belfry did not write"
        );
        return Ok(());
    }
    fs::remove_dir(dir).map_err(io_at("remove the directory of a deleted queue", dir))?;
    tracing::info!(dir = %dir.display(), "removed the directory of a deleted queue");
    Ok(())
}

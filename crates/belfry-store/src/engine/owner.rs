//! Whose directory is this? The engine takes a data directory over completely: it creates its
//! files there and, on open, removes queue directories it does not know. Pointed at the wrong
//! path (a home directory, another program's data), that would destroy someone's files. So a
//! directory is opened only if it is missing, empty, or already belfry's; anything else is
//! refused before a single file is written.
//!
//! A directory is belfry's when it holds the [`MARKER_FILE`], which `open` writes into every
//! directory it creates or adopts. Directories made before the marker existed are recognised
//! by the WAL directory beside the lock file, `meta` or `checkpoint` that every engine has
//! always written, and are adopted.

use std::fs;
use std::io::{ErrorKind, Write};
use std::path::Path;

use super::recovery::LOCK_FILE;
use super::{io_at, CHECKPOINT_FILE, META_FILE, WAL_DIR};
use crate::store::{Result, StoreError};

/// Written into every data directory the engine owns.
pub(super) const MARKER_FILE: &str = "BELFRY";

const MARKER_TEXT: &str = "This directory is a belfry data directory. Do not edit its files.\n";

/// Entries a fresh filesystem has of its own, which do not make a directory someone's data.
const IGNORED: &[&str] = &["lost+found"];

/// How many foreign entries an error names, so that the operator recognises the directory.
const NAMED_MAX: usize = 5;

/// Refuses a directory that exists, is not empty and is not belfry's.
pub(super) fn check(dir: &Path) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(StoreError::io_at("list the data directory", dir, source)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_at("list the data directory", dir))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    let has = |name: &str| names.iter().any(|n| n == name);
    let older_belfry = has(WAL_DIR) && (has(LOCK_FILE) || has(META_FILE) || has(CHECKPOINT_FILE));
    if has(MARKER_FILE) || older_belfry {
        return Ok(());
    }
    names.retain(|n| !IGNORED.contains(&n.as_str()));
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    let more = names.len().saturating_sub(NAMED_MAX);
    names.truncate(NAMED_MAX);
    let mut found = names.join(", ");
    if more > 0 {
        found.push_str(&format!(" and {more} more"));
    }
    Err(StoreError::ForeignDataDir {
        dir: dir.display().to_string(),
        found,
    })
}

/// Marks `dir` as belfry's (once; the directory must exist and be locked by the caller).
pub(super) fn mark(dir: &Path) -> Result<()> {
    let path = dir.join(MARKER_FILE);
    if path.exists() {
        return Ok(());
    }
    let mut file =
        fs::File::create(&path).map_err(io_at("mark the data directory as belfry's", &path))?;
    file.write_all(MARKER_TEXT.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io_at("mark the data directory as belfry's", &path))
}

//! Readings of this process's own resources from `/proc`, and of a directory's size on disk.
//! Linux only; on other systems readings are `None` and the report says "n/a".

use std::fs;
use std::io;
use std::path::Path;

/// Bytes this process (all its threads) caused to be written to storage so far: `write_bytes`
/// of `/proc/self/io`. It counts what reached the block layer, so it includes fsync'd data,
/// background compaction and file-system metadata, and excludes writes still in the page cache.
pub fn write_bytes() -> Option<u64> {
    let text = fs::read_to_string("/proc/self/io").ok()?;
    field(&text, "write_bytes:")
}

/// Peak resident set size in bytes (`VmHWM`).
pub fn peak_rss_bytes() -> Option<u64> {
    status_kib("VmHWM:").map(|kib| kib * 1024)
}

/// Current resident set size in bytes (`VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    status_kib("VmRSS:").map(|kib| kib * 1024)
}

fn status_kib(name: &str) -> Option<u64> {
    let text = fs::read_to_string("/proc/self/status").ok()?;
    field(&text, name)
}

fn field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
}

/// Sum of the allocated sizes of every file under `dir` (what `du` reports), so sparse or
/// preallocated files count for what they occupy. Directories themselves are not counted.
pub fn disk_usage_bytes(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in fs::read_dir(&path)? {
            let entry = entry?;
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                // A file deleted by a background thread while we walk is simply gone.
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => return Err(error),
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += allocated_bytes(&meta);
            }
        }
    }
    Ok(total)
}

#[cfg(unix)]
fn allocated_bytes(meta: &fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    // st_blocks is in 512-byte units whatever the file system's block size.
    meta.blocks() * 512
}

#[cfg(not(unix))]
fn allocated_bytes(meta: &fs::Metadata) -> u64 {
    meta.len()
}

/// Number of CPUs and total memory, for the machine line of the report.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get().to_string())
        .unwrap_or_else(|_| "?".into());
    let memory = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| field(&text, "MemTotal:"))
        .map(|kib| format!("{:.1} GiB RAM", kib as f64 / (1024.0 * 1024.0)))
        .unwrap_or_else(|| "? RAM".into());
    let model = fs::read_to_string("/proc/cpuinfo").ok().and_then(|text| {
        text.lines()
            .find_map(|line| line.strip_prefix("model name"))
            .and_then(|rest| rest.split(':').nth(1))
            .map(|name| name.trim().to_string())
    });
    match model {
        Some(model) => format!("{cpus} CPUs ({model}), {memory}"),
        None => format!("{cpus} CPUs, {memory}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields() {
        let text = "rchar: 1\nwrite_bytes: 4096\nVmHWM:\t  1234 kB\n";
        assert_eq!(field(text, "write_bytes:"), Some(4096));
        assert_eq!(field(text, "VmHWM:"), Some(1234));
        assert_eq!(field(text, "missing:"), None);
    }

    #[test]
    fn counts_files_in_subdirectories() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("a"), vec![1u8; 10_000]).unwrap();
        fs::write(dir.path().join("sub/b"), vec![1u8; 10_000]).unwrap();
        assert!(disk_usage_bytes(dir.path()).unwrap() >= 20_000);
    }
}

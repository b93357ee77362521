//! Damage as disks do it, for the tests of damaged files: zeroed stretches.
#![allow(dead_code)] // each test file uses its own part

use std::os::unix::fs::FileExt;
use std::path::Path;

/// Where data block `index` of a run file starts and how long its frame is: blocks are CRC
/// frames (`[len u32][crc u32][body]`) one after another from offset 0
/// (`engine/lsm/run.rs`).
pub fn run_block(path: &Path, index: usize) -> (u64, u64) {
    let bytes = std::fs::read(path).unwrap();
    let mut offset = 0usize;
    for _ in 0..index {
        let len = u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap()) as usize;
        offset += 8 + len;
    }
    let len = u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap()) as u64;
    (offset as u64, 8 + len)
}

/// Overwrites `len` bytes of `path` from `offset` with zeros (a sector that reads back as
/// zeros: an unwritten extent after a crash, a failing SSD).
pub fn zero(path: &Path, offset: u64, len: u64) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(&vec![0u8; len as usize], offset).unwrap();
}

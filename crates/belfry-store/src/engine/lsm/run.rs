//! Run files: immutable sorted files of byte-string keys, each with a live/tombstone flag.
//! The subscription tree keeps its entries in them (`subs/<id>.run`, [`RunKind::Subs`]) and
//! the idempotency-key index its keys (`keys/<id>.run`, [`RunKind::Keys`]).
//!
//! Layout (integers little-endian unless said otherwise):
//! - data blocks, each one CRC frame (`[len u32][crc32 u32][body]`) of about
//!   [`BLOCK_BYTES`]: entries `[shared: varint][suffix_len << 1 | live: varint][suffix]`, keys
//!   prefix-compressed against the previous key of the block (the first one in full);
//! - the index, one frame: `[blocks: u32]`, per block `[offset: u64][frame len: u32]
//!   [first key len: u8][first key]`, then `[len: u8][largest filtered key]`;
//! - the blocked bloom filter (`bloom.rs`) over the filtered part of each key
//!   ([`RunKind::filtered`]), one frame of u64 words, a whole number of 512-bit blocks;
//! - the footer, [`FOOTER_BYTES`]: magic (`"BLFYSUBR"` or `"BLFYKEYR"`, by kind), version
//!   u8, index offset u64, index len u64, bloom offset u64, bloom len u64, entries u64, crc32
//!   of the footer before it.
//!
//! Opening a run reads only its footer, index and bloom filter; blocks are read with `pread`
//! when needed (the page cache caches them). Damage is `StoreError::Corrupt` naming the file
//! and the offset, never a panic.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::bloom::{Bloom, BloomHash};
use super::{get_varint, put_varint};
use crate::engine::record::{split_frame_limited, write_frame_header, FRAME_HEADER_BYTES};
use crate::engine::subs::keys::SPACE_BY_SET;
use crate::store::{Result, StoreError};

/// Target size of a data block.
pub(crate) const BLOCK_BYTES: usize = 4096;
/// 2: blocked bloom filter (1, a plain one, is no longer read).
const RUN_VERSION: u8 = 2;
pub(crate) const FOOTER_BYTES: usize = 8 + 1 + 8 * 5 + 4;
/// Largest index or bloom frame read at open (a run of a billion keys stays below).
const META_FRAME_BYTES_MAX: usize = 2 << 30;

pub(crate) fn run_name(id: u64) -> String {
    format!("{id:016x}.run")
}

pub(crate) fn parse_run_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".run")?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

/// What a run file holds, which decides its magic and which keys its bloom filter covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunKind {
    /// Subscription entries: by-set keys (which sort first) are filtered whole.
    Subs,
    /// Idempotency keys: every key's first [`KEYS_FILTERED_BYTES`] (queue and key hash).
    Keys,
}

/// The filtered prefix of an idempotency-key run's keys (`engine::keys::runs`).
pub(crate) const KEYS_FILTERED_BYTES: usize = 16;

impl RunKind {
    fn magic(self) -> &'static [u8; 8] {
        match self {
            RunKind::Subs => b"BLFYSUBR",
            RunKind::Keys => b"BLFYKEYR",
        }
    }

    /// The part of `key` the bloom filter holds (`None`: the key is not filtered). Filtered
    /// keys sort before the others, so they are the run's first keys.
    pub(crate) fn filtered(self, key: &[u8]) -> Option<&[u8]> {
        match self {
            RunKind::Subs => (key.first() == Some(&SPACE_BY_SET)).then_some(key),
            RunKind::Keys => key.get(..KEYS_FILTERED_BYTES),
        }
    }
}

pub(crate) fn corrupt(path: &Path, offset: u64, detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        location: format!("{} at offset {offset}", path.display()),
        detail: detail.into(),
    }
}

/// An I/O error naming the run file at `path` (copied only if there is an error).
fn io<'a>(context: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::io_at(context, path, source)
}

/// Where a block is and the first key it holds (in `Run::index_keys`).
#[derive(Debug, Clone, Copy)]
struct BlockRef {
    offset: u64,
    len: u32,
    key_start: u32,
    key_end: u32,
}

/// An open run: its file, its index and its bloom filter.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) id: u64,
    pub(crate) path: PathBuf,
    file: File,
    index_keys: Vec<u8>,
    blocks: Vec<BlockRef>,
    bloom: Bloom,
    /// The largest filtered key (empty if the run holds none).
    max_filtered: Vec<u8>,
    pub(crate) entries: u64,
    pub(crate) file_bytes: u64,
}

/// A decoded data block: keys in one buffer, each entry's range and liveness.
#[derive(Debug, Default)]
pub(crate) struct Block {
    keys: Vec<u8>,
    entries: Vec<(u32, u32, bool)>,
}

impl Block {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn get(&self, i: usize) -> (&[u8], bool) {
        let (s, e, live) = self.entries[i];
        (&self.keys[s as usize..e as usize], live)
    }

    /// The first entry whose key is `>= key`.
    pub(crate) fn seek(&self, key: &[u8]) -> usize {
        self.entries
            .partition_point(|&(s, e, _)| &self.keys[s as usize..e as usize] < key)
    }

    fn decode(body: &[u8]) -> std::result::Result<Block, &'static str> {
        let mut block = Block::default();
        let mut entries = Entries::new(body);
        let mut key = Vec::new();
        while let Some((live, _)) = entries.next(&mut key)? {
            let start = block.keys.len();
            block.keys.extend_from_slice(&key);
            block
                .entries
                .push((start as u32, block.keys.len() as u32, live));
        }
        Ok(block)
    }
}

/// A block body's entries, decoded one at a time into a key buffer the caller keeps (each
/// entry's key is the previous one's first `shared` bytes and its own suffix).
pub(crate) struct Entries<'a> {
    rest: &'a [u8],
}

impl<'a> Entries<'a> {
    pub(crate) fn new(body: &'a [u8]) -> Entries<'a> {
        Entries { rest: body }
    }

    /// The next entry: its key in `key` (which must hold the previous entry's key, empty
    /// at the start of the block), whether it is live, and how many leading bytes it shares
    /// with the previous key; `None` at the end of the block.
    pub(crate) fn next(
        &mut self,
        key: &mut Vec<u8>,
    ) -> std::result::Result<Option<(bool, usize)>, &'static str> {
        if self.rest.is_empty() {
            return Ok(None);
        }
        let (shared, n) = get_varint(self.rest).ok_or("entry prefix")?;
        let rest = &self.rest[n..];
        let (tail, n) = get_varint(rest).ok_or("entry length")?;
        let rest = &rest[n..];
        let (shared, suffix) = (shared as usize, (tail >> 1) as usize);
        if shared > key.len() || suffix > rest.len() || shared + suffix == 0 {
            return Err("entry runs past its block");
        }
        key.truncate(shared);
        key.extend_from_slice(&rest[..suffix]);
        self.rest = &rest[suffix..];
        Ok(Some((tail & 1 == 1, shared)))
    }
}

/// One block of a run read for point lookups in ascending key order: its frame is read once
/// (into a reused buffer) and its entries are decoded one at a time as lookups move forward,
/// so a batch of sorted keys decodes each block it touches at most once, and a bloom false
/// positive decodes only the entries before the key.
#[derive(Debug, Default)]
pub(crate) struct BlockScan {
    /// The block read into `frame` (`None`: nothing read yet).
    block: Option<usize>,
    frame: Vec<u8>,
    /// Where the next entry starts in `frame`.
    pos: usize,
    /// The key and flag of the entry before `pos` (`key` empty: none decoded yet).
    key: Vec<u8>,
    live: bool,
    /// How the keys looked up relate to the run's by-set key range (set by a batch that
    /// knows its first and last key).
    pub(crate) overlap: Overlap,
}

/// How a batch of lookups relates to a run's by-set key range.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overlap {
    /// Unknown: each key is checked.
    #[default]
    PerKey,
    /// Every key is in the range.
    Inside,
    /// No key is in the range.
    Outside,
}

impl Run {
    /// The flag of `key` if block `index` holds it; `scan` keeps the block and the position
    /// between calls.
    pub(crate) fn lookup_in_block(
        &self,
        index: usize,
        key: &[u8],
        scan: &mut BlockScan,
    ) -> Result<Option<bool>> {
        let b = self.blocks[index];
        if scan.block != Some(index) {
            scan.block = None;
            self.read_block_frame(b, &mut scan.frame)?;
            scan.block = Some(index);
            scan.pos = FRAME_HEADER_BYTES;
            scan.key.clear();
        } else if key < scan.key.as_slice() {
            // Backwards: start over.
            scan.pos = FRAME_HEADER_BYTES;
            scan.key.clear();
        }
        // `m`: how many leading bytes the scan's key shares with `key`. An entry sharing
        // more than `m` bytes with the previous key still sorts below `key`, one sharing fewer
        // sorts above it: only an entry sharing exactly `m` bytes is compared, from byte `m`.
        let mut m = shared_prefix(&scan.key, key);
        loop {
            if !scan.key.is_empty() {
                match scan.key.get(m) {
                    None if m == key.len() => return Ok(Some(scan.live)),
                    // The scan's key is a proper prefix of `key`: below it.
                    None => {}
                    Some(_) if m == key.len() => return Ok(None),
                    Some(&b) if b > key[m] => return Ok(None),
                    Some(_) => {}
                }
            }
            let rest = &scan.frame[scan.pos..];
            if rest.is_empty() {
                return Ok(None);
            }
            let damaged = |d: &str| corrupt(&self.path, b.offset, d.to_string());
            let (shared, n) = get_varint(rest).ok_or_else(|| damaged("entry prefix"))?;
            let rest = &rest[n..];
            let (tail, l) = get_varint(rest).ok_or_else(|| damaged("entry length"))?;
            let rest = &rest[l..];
            let (shared, suffix) = (shared as usize, (tail >> 1) as usize);
            if shared > scan.key.len() || suffix > rest.len() || shared + suffix == 0 {
                return Err(damaged("entry runs past its block"));
            }
            scan.key.truncate(shared);
            scan.key.extend_from_slice(&rest[..suffix]);
            scan.live = tail & 1 == 1;
            scan.pos += n + l + suffix;
            if shared < m {
                m = shared;
            } else if shared == m {
                m += shared_prefix(&scan.key[m..], &key[m..]);
            }
        }
    }

    pub(crate) fn block_count(&self) -> usize {
        self.blocks.len()
    }

    fn first_key(&self, i: usize) -> &[u8] {
        let b = &self.blocks[i];
        &self.index_keys[b.key_start as usize..b.key_end as usize]
    }

    /// The block that would hold `key`: the last whose first key is `<= key` (0 if none).
    pub(crate) fn block_for(&self, key: &[u8]) -> usize {
        let (mut lo, mut hi) = (0, self.blocks.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.first_key(mid) <= key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.saturating_sub(1)
    }

    /// Whether a filtered key may be in this run's range of filtered keys.
    pub(crate) fn in_filtered_range(&self, key: &[u8]) -> bool {
        !self.blocks.is_empty() && key <= self.max_filtered.as_slice() && key >= self.first_key(0)
    }

    /// How the filtered keys `first..=last` relate to this run's range of them.
    pub(crate) fn filtered_overlap(&self, first: &[u8], last: &[u8]) -> Overlap {
        if self.blocks.is_empty()
            || last < self.first_key(0)
            || first > self.max_filtered.as_slice()
        {
            Overlap::Outside
        } else if first >= self.first_key(0) && last <= self.max_filtered.as_slice() {
            Overlap::Inside
        } else {
            Overlap::PerKey
        }
    }

    /// Whether the bloom filter lets a filtered key (of this hash) through.
    pub(crate) fn bloom_may_hold(&self, hash: &BloomHash) -> bool {
        self.bloom.may_contain(hash)
    }

    fn read_frame(&self, b: BlockRef, buf: &mut [u8]) -> Result<()> {
        self.file
            .read_exact_at(buf, b.offset)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => {
                    corrupt(&self.path, b.offset, "block cut short")
                }
                _ => StoreError::io_at("read a run file", &self.path, e),
            })
    }

    /// Reads block `b`'s frame into `frame` and checks it: the frame must fill exactly the
    /// length the index records for it and hold at least one entry. The length check is what
    /// catches zeroed sectors: a header of zeros declares an empty body whose checksum (0)
    /// matches, so without it a zeroed block would read as a valid block holding nothing,
    /// and its keys would silently be missing (duplicates let in, subscribers skipped). Every
    /// reader of a data block comes through here. Returns the body's range in `frame`.
    fn read_block_frame(&self, b: BlockRef, frame: &mut Vec<u8>) -> Result<std::ops::Range<usize>> {
        frame.resize(b.len as usize, 0);
        self.read_frame(b, frame)?;
        let (body, total) = split_frame_limited(frame, b.len as usize)
            .map_err(|e| corrupt(&self.path, b.offset, format!("block: {e}")))?;
        if total != b.len as usize || body.is_empty() {
            return Err(corrupt(
                &self.path,
                b.offset,
                format!(
                    "block: its frame declares {} bytes where the index records {} (zeroed or \
                     overwritten on disk)",
                    total, b.len
                ),
            ));
        }
        Ok(FRAME_HEADER_BYTES..total)
    }

    pub(crate) fn read_block(&self, i: usize) -> Result<Block> {
        let b = self.blocks[i];
        let mut frame = Vec::new();
        let body = self.read_block_frame(b, &mut frame)?;
        Block::decode(&frame[body]).map_err(|d| corrupt(&self.path, b.offset, d))
    }

    /// Calls `f` with each entry whose key starts with `prefix`, in key order, reading the
    /// blocks that hold them into `frame` (a buffer the caller reuses) and decoding no
    /// entry past the last match. Stops after `cap` entries: returns whether it saw them all.
    pub(crate) fn scan_prefix(
        &self,
        prefix: &[u8],
        frame: &mut Vec<u8>,
        cap: usize,
        mut f: impl FnMut(&[u8], bool),
    ) -> Result<bool> {
        if self.blocks.is_empty() {
            return Ok(true);
        }
        let mut key = Vec::with_capacity(prefix.len() + 16);
        let mut taken = 0;
        // The last block whose first key is `<= prefix`, then the blocks after it while
        // they start inside the prefix.
        let mut index = self.block_for(prefix);
        loop {
            let b = self.blocks[index];
            let body = self.read_block_frame(b, frame)?;
            let mut entries = Entries::new(&frame[body]);
            key.clear();
            // `m`: how many leading bytes the current key shares with `prefix`. An entry that
            // shares more than `m` bytes with the previous key (which sorted below `prefix`)
            // still sorts below it; only the others are compared, from where they differ.
            let mut m = 0;
            while let Some((live, shared)) = entries
                .next(&mut key)
                .map_err(|d| corrupt(&self.path, b.offset, d))?
            {
                if shared <= m {
                    m = shared + shared_prefix(&key[shared..], &prefix[shared.min(prefix.len())..]);
                }
                if m < prefix.len() {
                    if m == key.len() || key[m] < prefix[m] {
                        continue; // below the prefix
                    }
                    return Ok(true); // past it
                }
                if taken == cap {
                    return Ok(false);
                }
                f(&key, live);
                taken += 1;
            }
            index += 1;
            if index == self.blocks.len() || !self.first_key(index).starts_with(prefix) {
                return Ok(true);
            }
        }
    }

    /// Opens a run of `kind`, reading its footer, index and bloom filter only.
    pub(crate) fn open(path: &Path, id: u64, kind: RunKind) -> Result<Run> {
        let file = File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                corrupt(path, 0, "run file listed by the checkpoint is missing")
            }
            _ => StoreError::io_at("open a run file", path, e),
        })?;
        let file_bytes = file.metadata().map_err(io("stat a run file", path))?.len();
        if file_bytes < FOOTER_BYTES as u64 {
            return Err(corrupt(path, 0, "run file shorter than its footer"));
        }
        let footer_at = file_bytes - FOOTER_BYTES as u64;
        let mut footer = [0u8; FOOTER_BYTES];
        file.read_exact_at(&mut footer, footer_at)
            .map_err(io("read a run file", path))?;
        let f = Footer::decode(&footer, kind).map_err(|d| corrupt(path, footer_at, d))?;
        let read = |offset: u64, len: u64| -> Result<Vec<u8>> {
            if len as usize > META_FRAME_BYTES_MAX || offset + len > footer_at {
                return Err(corrupt(path, footer_at, "footer points outside the file"));
            }
            let mut buf = vec![0; len as usize];
            file.read_exact_at(&mut buf, offset)
                .map_err(io("read a run file", path))?;
            let (body, total) = split_frame_limited(&buf, META_FRAME_BYTES_MAX)
                .map_err(|e| corrupt(path, offset, format!("frame: {e}")))?;
            // As for blocks (`read_block_frame`): zeros would pass as an empty frame.
            if total as u64 != len {
                return Err(corrupt(
                    path,
                    offset,
                    format!("frame declares {total} bytes where the footer records {len}"),
                ));
            }
            Ok(body.to_vec())
        };
        let index = read(f.index_offset, f.index_len)?;
        let bloom = read(f.bloom_offset, f.bloom_len)?;
        let mut run = Run {
            id,
            path: path.to_path_buf(),
            file,
            index_keys: Vec::new(),
            blocks: Vec::new(),
            bloom: decode_bloom(&bloom).ok_or_else(|| corrupt(path, f.bloom_offset, "bloom"))?,
            max_filtered: Vec::new(),
            entries: f.entries,
            file_bytes,
        };
        run.decode_index(&index, f.index_offset)
            .map_err(|d| corrupt(path, f.index_offset, d))?;
        Ok(run)
    }

    fn decode_index(&mut self, body: &[u8], limit: u64) -> std::result::Result<(), &'static str> {
        let mut r = crate::engine::record::Reader { bytes: body };
        let count = r.u32().map_err(|_| "index count")?;
        for _ in 0..count {
            let offset = r.u64().map_err(|_| "index entry")?;
            let len = r.u32().map_err(|_| "index entry")?;
            let key_len = r.u8().map_err(|_| "index entry")?;
            let key = r.take(key_len as usize).map_err(|_| "index key")?;
            // A block holds at least one entry: its frame is longer than a header.
            if offset.saturating_add(u64::from(len)) > limit || (len as usize) <= FRAME_HEADER_BYTES
            {
                return Err("index points outside the data blocks");
            }
            let key_start = self.index_keys.len() as u32;
            self.index_keys.extend_from_slice(key);
            self.blocks.push(BlockRef {
                offset,
                len,
                key_start,
                key_end: self.index_keys.len() as u32,
            });
        }
        let len = r.u8().map_err(|_| "largest key")?;
        self.max_filtered = r.take(len as usize).map_err(|_| "largest key")?.to_vec();
        if !r.bytes.is_empty() {
            return Err("trailing bytes in the index");
        }
        Ok(())
    }
}

fn decode_bloom(body: &[u8]) -> Option<Bloom> {
    if !body.len().is_multiple_of(8) {
        return None;
    }
    let words = body
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    Bloom::from_words(words)
}

struct Footer {
    kind: RunKind,
    index_offset: u64,
    index_len: u64,
    bloom_offset: u64,
    bloom_len: u64,
    entries: u64,
}

impl Footer {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FOOTER_BYTES);
        out.extend_from_slice(self.kind.magic());
        out.push(RUN_VERSION);
        for v in [
            self.index_offset,
            self.index_len,
            self.bloom_offset,
            self.bloom_len,
            self.entries,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8; FOOTER_BYTES], kind: RunKind) -> std::result::Result<Footer, String> {
        let (body, crc) = bytes.split_at(FOOTER_BYTES - 4);
        if crc32fast::hash(body).to_le_bytes() != crc {
            return Err("footer checksum mismatch".into());
        }
        if &body[..8] != kind.magic() {
            return Err(format!("not a {kind:?} run file (wrong magic)"));
        }
        if body[8] != RUN_VERSION {
            return Err(format!("unknown run version {}", body[8]));
        }
        let field = |i: usize| {
            let at = 9 + 8 * i;
            u64::from_le_bytes(body[at..at + 8].try_into().unwrap_or_default())
        };
        Ok(Footer {
            kind,
            index_offset: field(0),
            index_len: field(1),
            bloom_offset: field(2),
            bloom_len: field(3),
            entries: field(4),
        })
    }
}

/// Writes a run from entries added in ascending key order.
pub(crate) struct RunWriter {
    kind: RunKind,
    id: u64,
    path: PathBuf,
    out: BufWriter<File>,
    offset: u64,
    block: Vec<u8>,
    block_first: Vec<u8>,
    last: Vec<u8>,
    /// The index as the run will hold it (so `finish` opens the run without reading back).
    index_keys: Vec<u8>,
    blocks: Vec<BlockRef>,
    bloom: Bloom,
    max_filtered: Vec<u8>,
    entries: u64,
}

/// How many leading bytes `a` and `b` share (8 at a time).
fn shared_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_le_bytes(a[i..i + 8].try_into().unwrap_or_default());
        let y = u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        if x != y {
            return i + ((x ^ y).trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i + a[i..n]
        .iter()
        .zip(&b[i..n])
        .take_while(|(x, y)| x == y)
        .count()
}

impl RunWriter {
    /// A writer for run `id` of `kind` in `dir`, its bloom filter sized for
    /// `filtered_keys` filtered keys.
    pub(crate) fn create(
        dir: &Path,
        id: u64,
        kind: RunKind,
        filtered_keys: usize,
    ) -> Result<RunWriter> {
        let path = dir.join(run_name(id));
        let file = File::create(&path).map_err(io("create a run file", &path))?;
        Ok(RunWriter {
            kind,
            id,
            path,
            out: BufWriter::with_capacity(256 * 1024, file),
            offset: 0,
            block: Vec::with_capacity(BLOCK_BYTES + 256),
            block_first: Vec::new(),
            last: Vec::new(),
            index_keys: Vec::new(),
            blocks: Vec::new(),
            bloom: Bloom::with_keys(filtered_keys),
            max_filtered: Vec::new(),
            entries: 0,
        })
    }

    pub(crate) fn add(&mut self, key: &[u8], live: bool) -> Result<()> {
        debug_assert!(self.entries == 0 || key > self.last.as_slice());
        let shared = if self.block.is_empty() {
            self.block_first.clear();
            self.block_first.extend_from_slice(key);
            0
        } else {
            shared_prefix(key, &self.last)
        };
        put_varint(&mut self.block, shared as u64);
        put_varint(
            &mut self.block,
            (((key.len() - shared) as u64) << 1) | u64::from(live),
        );
        self.block.extend_from_slice(&key[shared..]);
        self.last.truncate(shared);
        self.last.extend_from_slice(&key[shared..]);
        if let Some(filtered) = self.kind.filtered(key) {
            self.bloom.insert(filtered);
            // Filtered keys sort first: the last of them is the largest.
            self.max_filtered.clone_from(&self.last);
        }
        self.entries += 1;
        if self.block.len() >= BLOCK_BYTES {
            self.end_block()?;
        }
        Ok(())
    }

    fn end_block(&mut self) -> Result<()> {
        if self.block.is_empty() {
            return Ok(());
        }
        let mut header = Vec::with_capacity(FRAME_HEADER_BYTES);
        write_frame_header(&mut header, &self.block);
        self.write(&header)?;
        let block = std::mem::take(&mut self.block);
        let written = self.write(&block);
        self.block = block;
        written?;
        let key_start = self.index_keys.len() as u32;
        self.index_keys.extend_from_slice(&self.block_first);
        self.blocks.push(BlockRef {
            offset: self.offset,
            len: (FRAME_HEADER_BYTES + self.block.len()) as u32,
            key_start,
            key_end: self.index_keys.len() as u32,
        });
        self.offset += (FRAME_HEADER_BYTES + self.block.len()) as u64;
        self.block.clear();
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out
            .write_all(bytes)
            .map_err(io("write a run file", &self.path))
    }

    /// Writes the index, bloom filter and footer, fsyncs the file and opens it as a run
    /// (keeping the index and bloom filter it built). The caller fsyncs the directory before
    /// listing the run anywhere.
    pub(crate) fn finish(mut self) -> Result<Run> {
        self.end_block()?;
        let max_filtered = std::mem::take(&mut self.max_filtered);
        let mut index = Vec::with_capacity(self.index_keys.len() + 17 * self.blocks.len() + 170);
        index.extend_from_slice(&(self.blocks.len() as u32).to_le_bytes());
        for b in &self.blocks {
            index.extend_from_slice(&b.offset.to_le_bytes());
            index.extend_from_slice(&b.len.to_le_bytes());
            index.push((b.key_end - b.key_start) as u8);
            index.extend_from_slice(&self.index_keys[b.key_start as usize..b.key_end as usize]);
        }
        index.push(max_filtered.len() as u8);
        index.extend_from_slice(&max_filtered);
        let mut header = Vec::with_capacity(FRAME_HEADER_BYTES);
        write_frame_header(&mut header, &index);
        self.write(&header)?;
        self.write(&index)?;
        let (index_offset, index_len) = (self.offset, (FRAME_HEADER_BYTES + index.len()) as u64);
        self.offset += index_len;
        drop(index);
        // The bloom filter's frame, streamed (it can be tens of MiB).
        let words = self.bloom.words();
        let mut crc = crc32fast::Hasher::new();
        for w in words {
            crc.update(&w.to_le_bytes());
        }
        let body_len = words.len() * 8;
        let mut frame = Vec::with_capacity(64 * 1024);
        frame.extend_from_slice(&(body_len as u32).to_le_bytes());
        frame.extend_from_slice(&crc.finalize().to_le_bytes());
        for chunk in words.chunks(8 * 1024) {
            frame.extend(chunk.iter().flat_map(|w| w.to_le_bytes()));
            self.out
                .write_all(&frame)
                .map_err(io("write a run file", &self.path))?;
            frame.clear();
        }
        let (bloom_offset, bloom_len) = (self.offset, (FRAME_HEADER_BYTES + body_len) as u64);
        self.offset += bloom_len;
        let footer = Footer {
            kind: self.kind,
            index_offset,
            index_len,
            bloom_offset,
            bloom_len,
            entries: self.entries,
        };
        self.write(&footer.encode())?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| StoreError::io_at("write a run file", &self.path, e.into_error()))?;
        file.sync_all()
            .map_err(io("fsync a run file", &self.path))?;
        drop(file);
        let file = File::open(&self.path).map_err(io("open a run file", &self.path))?;
        Ok(Run {
            id: self.id,
            path: self.path,
            file,
            index_keys: self.index_keys,
            blocks: self.blocks,
            bloom: self.bloom,
            max_filtered,
            entries: self.entries,
            file_bytes: self.offset + FOOTER_BYTES as u64,
        })
    }
}

impl Run {
    /// About how many filtered keys the run holds (from its bloom filter's size), to size the
    /// bloom filter of a merge.
    pub(crate) fn filtered_keys_hint(&self) -> usize {
        self.bloom.words().len() * 64 / super::bloom::BLOOM_BITS_PER_KEY
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::lsm::merge::{Merge, RunCursor, Source};

    #[test]
    fn shared_prefix_counts_common_leading_bytes() {
        let keys: [&[u8]; 6] = [
            b"",
            b"a",
            b"abcdefgh",
            b"abcdefghij",
            b"abcdefgxij",
            b"abcdefghijklmnopq",
        ];
        for a in keys {
            for b in keys {
                let want = a.iter().zip(b).take_while(|(x, y)| x == y).count();
                assert_eq!(shared_prefix(a, b), want, "{a:?} {b:?}");
            }
        }
    }

    /// Prefix scans against a filter of every key: users of 1 to 900 entries (some spanning
    /// blocks), prefixes that are other users' prefixes' prefixes, absent users, the caps.
    #[test]
    fn a_prefix_scan_finds_exactly_the_keys_under_the_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for user in 0u32..400 {
            // "u1", "u10", "u100"...: one user's name is a prefix of others'.
            let name = format!("u{user}");
            for set in 0..(1 + user % 7 + if user % 50 == 0 { 900 } else { 0 }) {
                let mut key = vec![1, name.len() as u8];
                key.extend_from_slice(name.as_bytes());
                key.extend_from_slice(&(u64::from(set) * 7_919).to_be_bytes());
                keys.push(key);
            }
        }
        keys.sort();
        let mut writer = RunWriter::create(dir.path(), 1, RunKind::Subs, 0).unwrap();
        for (n, key) in keys.iter().enumerate() {
            writer.add(key, n % 5 != 0).unwrap();
        }
        let run = writer.finish().unwrap();
        assert!(run.block_count() > 4, "{} blocks", run.block_count());
        let mut frame = Vec::new();
        let mut prefixes: Vec<Vec<u8>> = (0u32..420)
            .map(|user| {
                let name = format!("u{user}");
                let mut prefix = vec![1, name.len() as u8];
                prefix.extend_from_slice(name.as_bytes());
                prefix
            })
            .collect();
        prefixes.extend([vec![1], vec![0], vec![1, 2, b'u'], vec![2]]);
        for prefix in &prefixes {
            let want: Vec<(Vec<u8>, bool)> = keys
                .iter()
                .enumerate()
                .filter(|(_, k)| k.starts_with(prefix))
                .map(|(n, k)| (k.clone(), n % 5 != 0))
                .collect();
            let mut got = Vec::new();
            let whole = run
                .scan_prefix(prefix, &mut frame, usize::MAX, |k, live| {
                    got.push((k.to_vec(), live))
                })
                .unwrap();
            assert!(whole);
            assert_eq!(got, want, "prefix {prefix:?}");
            if want.len() > 3 {
                let mut got = 0;
                let whole = run.scan_prefix(prefix, &mut frame, 3, |_, _| got += 1);
                assert!(!whole.unwrap());
                assert_eq!(got, 3);
            }
        }
    }

    #[test]
    fn a_written_run_reads_back_as_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = RunWriter::create(dir.path(), 1, RunKind::Subs, 1_000).unwrap();
        let mut keys = Vec::new();
        for i in 0u32..1_000 {
            let mut key = vec![SPACE_BY_SET];
            key.extend_from_slice(&i.to_be_bytes());
            keys.push(key);
        }
        for i in 0u32..1_000 {
            let mut key = vec![1];
            key.extend_from_slice(&i.to_be_bytes());
            keys.push(key);
        }
        for (n, key) in keys.iter().enumerate() {
            writer.add(key, n % 3 != 0).unwrap();
        }
        let written = writer.finish().unwrap();
        let reopened = Run::open(&written.path, 1, RunKind::Subs).unwrap();
        for run in [&written, &reopened] {
            assert_eq!(run.entries, 2_000);
            assert_eq!(run.max_filtered, keys[999]);
            assert_eq!(run.index_keys, written.index_keys);
            assert_eq!(run.bloom.words(), written.bloom.words());
            assert_eq!(run.file_bytes, reopened.file_bytes);
            let mut n = 0;
            for b in 0..run.block_count() {
                let block = run.read_block(b).unwrap();
                for i in 0..block.len() {
                    assert_eq!(block.get(i), (keys[n].as_slice(), n % 3 != 0));
                    n += 1;
                }
            }
            assert_eq!(n, 2_000);
            // Point lookups: forward (present, and absent between keys), then backwards.
            let mut scan = BlockScan::default();
            for (n, key) in keys.iter().enumerate() {
                let b = run.block_for(key);
                assert_eq!(
                    run.lookup_in_block(b, key, &mut scan).unwrap(),
                    Some(n % 3 != 0)
                );
                let mut after = key.clone();
                after.push(7);
                let b = run.block_for(&after);
                assert_eq!(run.lookup_in_block(b, &after, &mut scan).unwrap(), None);
            }
            for n in [1_999, 1_000, 3, 0] {
                let b = run.block_for(&keys[n]);
                let found = run.lookup_in_block(b, &keys[n], &mut scan).unwrap();
                assert_eq!(found, Some(n % 3 != 0));
            }
            assert_eq!(run.lookup_in_block(0, &[0], &mut scan).unwrap(), None);
            let hash = BloomHash::of(&keys[5]);
            assert!(run.in_filtered_range(&keys[5]) && run.bloom_may_hold(&hash));
            assert!(!run.in_filtered_range(&keys[1_005]));
        }
    }

    /// A zeroed block (a header of zeros declares an empty body whose checksum matches) or a
    /// block whose frame is shorter than the index says is `Corrupt` naming the file and the
    /// block's offset, from every reader of blocks: a block read, a prefix scan, a point
    /// lookup and a merge's cursor. Never an empty block.
    #[test]
    fn a_zeroed_or_shortened_block_is_corrupt_for_every_reader() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<Vec<u8>> = (0u32..3_000)
            .map(|i| {
                let mut key = vec![1, 4];
                key.extend_from_slice(&i.to_be_bytes());
                key.extend_from_slice(&i.wrapping_mul(2_654_435_761).to_le_bytes());
                key
            })
            .collect();
        let mut writer = RunWriter::create(dir.path(), 1, RunKind::Subs, 0).unwrap();
        for key in &keys {
            writer.add(key, true).unwrap();
        }
        let run = writer.finish().unwrap();
        assert!(run.block_count() > 3);
        let b = run.blocks[2];
        let first = run.first_key(2).to_vec();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&run.path)
            .unwrap();
        let check = |name: &str, result: Result<()>| match result {
            Err(StoreError::Corrupt { location, detail }) => {
                assert!(
                    location.ends_with(&format!("0000000000000001.run at offset {}", b.offset)),
                    "{name}: {location}"
                );
                assert!(detail.contains("the index records"), "{name}: {detail}");
            }
            other => panic!("{name}: expected Corrupt, got {other:?}"),
        };
        // The whole block zeroed, then a valid frame shorter than the block (as if an
        // empty block had been written there).
        let mut short = Vec::new();
        write_frame_header(&mut short, &[]);
        short.resize(b.len as usize, 0);
        for bytes in [vec![0u8; b.len as usize], short] {
            file.write_all_at(&bytes, b.offset).unwrap();
            let reopened = Run::open(&run.path, 1, RunKind::Subs).unwrap();
            check("read_block", reopened.read_block(2).map(|_| ()));
            let mut frame = Vec::new();
            let scanned = reopened.scan_prefix(&first[..3], &mut frame, usize::MAX, |_, _| {});
            check("scan_prefix", scanned.map(|_| ()));
            let mut scan = BlockScan::default();
            check(
                "lookup_in_block",
                reopened.lookup_in_block(2, &first, &mut scan).map(|_| ()),
            );
            // A merge reads the run from its first key on: it stops at the block.
            let mut copied = 0;
            let merged = RunCursor::new(&reopened, &keys[0]).and_then(|cursor| {
                let mut merge = Merge::new(vec![Box::new(cursor) as Box<dyn Source>]);
                let mut key = Vec::new();
                while merge.next(&mut key)?.is_some() {
                    copied += 1;
                }
                Ok(())
            });
            check("merge", merged);
            assert!(copied < keys.len());
        }
    }
}

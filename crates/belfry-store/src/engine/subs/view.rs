//! Reading the subscription tree: point lookups and ordered scans over the memtables and the
//! runs, newest first.

use super::memtable::{Memtable, SlabSource};
use crate::engine::lsm::bloom::BloomHash;
use crate::engine::lsm::merge::{Merge, RunCursor, Source};
use crate::engine::lsm::run::{BlockScan, Overlap, Run};
use crate::store::Result;

/// The memtables (active first, then frozen) and runs (newest first) of the tree, as one
/// view to read.
pub(crate) struct View<'a> {
    pub(crate) mems: Vec<&'a Memtable>,
    pub(crate) runs: &'a [std::sync::Arc<Run>],
}

impl<'a> View<'a> {
    /// Every source, positioned at `from`.
    pub(crate) fn merge(&self, from: &[u8]) -> Result<Merge<'a>> {
        let mut sources: Vec<Box<dyn Source + 'a>> = Vec::new();
        for mem in &self.mems {
            for slab in &mem.slabs {
                sources.push(Box::new(SlabSource::new(slab, from)));
            }
        }
        for run in self.runs {
            sources.push(Box::new(RunCursor::new(run, from)?));
        }
        Ok(Merge::new(sources))
    }

    /// The newest version of a by-set key: `Some(live)`, or `None` if no source holds it.
    /// `scans` holds one block scan per run, which sorted lookups move forward.
    pub(crate) fn get(&self, key: &[u8], scans: &mut [BlockScan]) -> Result<Option<bool>> {
        for mem in &self.mems {
            if let Some(live) = mem.get(key) {
                return Ok(Some(live));
            }
        }
        // One hash of the key serves every run's bloom filter.
        let mut hash = None;
        for (run, scan) in self.runs.iter().zip(scans.iter_mut()) {
            let in_range = match scan.overlap {
                Overlap::Outside => false,
                Overlap::Inside => true,
                Overlap::PerKey => run.in_filtered_range(key),
            };
            if !in_range || !run.bloom_may_hold(hash.get_or_insert_with(|| BloomHash::of(key))) {
                continue;
            }
            if let Some(live) = run.lookup_in_block(run.block_for(key), key, scan)? {
                return Ok(Some(live));
            }
        }
        Ok(None)
    }
}

//! Ordered scans that merge sorted sources (memtables, runs), newest first: for a key held
//! by several, the newest version wins.

use super::run::{Block, Run};
use crate::store::Result;

/// One sorted source of entries, positioned at its current entry.
pub(crate) trait Source {
    fn peek(&self) -> Option<(&[u8], bool)>;
    fn advance(&mut self) -> Result<()>;
}

/// A run read block by block from a key on.
pub(crate) struct RunCursor<'a> {
    run: &'a Run,
    block_index: usize,
    block: Block,
    pos: usize,
}

impl<'a> RunCursor<'a> {
    pub(crate) fn new(run: &'a Run, from: &[u8]) -> Result<RunCursor<'a>> {
        let mut cursor = RunCursor {
            run,
            block_index: 0,
            block: Block::default(),
            pos: 0,
        };
        if run.block_count() == 0 {
            return Ok(cursor);
        }
        cursor.block_index = run.block_for(from);
        cursor.block = run.read_block(cursor.block_index)?;
        cursor.pos = cursor.block.seek(from);
        cursor.settle()?;
        Ok(cursor)
    }

    /// Moves past the end of exhausted blocks.
    fn settle(&mut self) -> Result<()> {
        while self.pos >= self.block.len() && self.block_index + 1 < self.run.block_count() {
            self.block_index += 1;
            self.block = self.run.read_block(self.block_index)?;
            self.pos = 0;
        }
        Ok(())
    }
}

impl Source for RunCursor<'_> {
    fn peek(&self) -> Option<(&[u8], bool)> {
        (self.pos < self.block.len()).then(|| self.block.get(self.pos))
    }
    fn advance(&mut self) -> Result<()> {
        self.pos += 1;
        self.settle()
    }
}

/// Sources merged in key order; for equal keys the first source (the newest) wins.
///
/// After a full comparison the source holding the smallest key becomes the *lead* and the
/// next smallest key of the others the *bound*: the lead's keys below the bound are the next
/// keys of the merge, each taken with one comparison (runs whose key ranges barely overlap,
/// like those of ascending ids, merge at the cost of a copy).
pub(crate) struct Merge<'a> {
    sources: Vec<Box<dyn Source + 'a>>,
    lead: Option<usize>,
    /// The smallest key of the sources other than the lead (`None`: they are exhausted).
    bound: Option<Vec<u8>>,
}

impl<'a> Merge<'a> {
    pub(crate) fn new(sources: Vec<Box<dyn Source + 'a>>) -> Merge<'a> {
        Merge {
            sources,
            lead: None,
            bound: None,
        }
    }

    /// The next key (into `key`) and whether its newest version is live; `None` at the end.
    pub(crate) fn next(&mut self, key: &mut Vec<u8>) -> Result<Option<bool>> {
        if let Some(lead) = self.lead {
            if let Some((k, live)) = self.sources[lead].peek() {
                if self.bound.as_deref().is_none_or(|b| k < b) {
                    key.clear();
                    key.extend_from_slice(k);
                    self.sources[lead].advance()?;
                    return Ok(Some(live));
                }
            }
            self.lead = None;
        }
        // The smallest key (the first source holding it) and the next smallest of the others.
        let mut best: Option<(usize, &[u8], bool)> = None;
        let mut second: Option<&[u8]> = None;
        for (i, source) in self.sources.iter().enumerate() {
            let Some((k, live)) = source.peek() else {
                continue;
            };
            match best {
                Some((_, bk, _)) if k >= bk => {
                    if second.is_none_or(|s| k < s) {
                        second = Some(k);
                    }
                }
                _ => {
                    if let Some((_, bk, _)) = best {
                        second = Some(bk);
                    }
                    best = Some((i, k, live));
                }
            }
        }
        let Some((b, bk, live)) = best else {
            return Ok(None);
        };
        key.clear();
        key.extend_from_slice(bk);
        if second.is_some_and(|s| s == bk) {
            // Older versions of the key: skip them.
            for source in &mut self.sources {
                while source.peek().is_some_and(|(k, _)| k == key.as_slice()) {
                    source.advance()?;
                }
            }
            return Ok(Some(live));
        }
        match (second, &mut self.bound) {
            (None, bound) => *bound = None,
            (Some(s), Some(bound)) => {
                bound.clear();
                bound.extend_from_slice(s);
            }
            (Some(s), bound) => *bound = Some(s.to_vec()),
        }
        self.lead = Some(b);
        self.sources[b].advance()?;
        Ok(Some(live))
    }
}

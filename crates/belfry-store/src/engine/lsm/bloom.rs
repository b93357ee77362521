//! A blocked bloom filter over the by-set keys of a run: about 10 bits and 7 probes per key,
//! all probes of a key in one 512-bit block (one cache line), so a check costs one cache miss
//! rather than seven; about 1% of the membership checks of absent pairs read a block.
//!
//! A key's block is picked from the high bits of one 64-bit hash (`(h * blocks) >> 64`), its
//! 7 bits in the block from 9-bit slices of a second hash. [`BloomHash`] is computed once per
//! key and checked against every run's filter.

/// Bits per key.
pub(crate) const BLOOM_BITS_PER_KEY: usize = 10;
/// Words of a block (512 bits).
pub(crate) const BLOCK_WORDS: usize = 8;
const PROBES: u32 = 7;

#[derive(Debug, Clone)]
pub(crate) struct Bloom {
    bits: Vec<u64>,
}

/// The hashes of one key, valid for any filter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BloomHash {
    block: u64,
    probes: u64,
}

fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

impl BloomHash {
    /// Two hashes of `key` (FxHash-style mixing, then avalanched twice).
    pub(crate) fn of(key: &[u8]) -> BloomHash {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut chunks = key.chunks_exact(8);
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
            h = (h.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
        for &b in chunks.remainder() {
            h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
        let h = fmix(h ^ key.len() as u64);
        BloomHash {
            block: h,
            probes: fmix(h ^ 0x9e37_79b9_7f4a_7c15),
        }
    }
}

impl Bloom {
    pub(crate) fn with_keys(keys: usize) -> Bloom {
        let blocks = (keys * BLOOM_BITS_PER_KEY)
            .div_ceil(64 * BLOCK_WORDS)
            .max(1);
        Bloom {
            bits: vec![0; blocks * BLOCK_WORDS],
        }
    }

    /// A filter of these words (`None` if they are not whole blocks).
    pub(crate) fn from_words(bits: Vec<u64>) -> Option<Bloom> {
        (!bits.is_empty() && bits.len().is_multiple_of(BLOCK_WORDS)).then_some(Bloom { bits })
    }

    pub(crate) fn words(&self) -> &[u64] {
        &self.bits
    }

    /// The block of `hash`: its first word.
    fn block(&self, hash: &BloomHash) -> usize {
        let blocks = (self.bits.len() / BLOCK_WORDS) as u128;
        ((u128::from(hash.block) * blocks) >> 64) as usize * BLOCK_WORDS
    }

    pub(crate) fn insert(&mut self, key: &[u8]) {
        let hash = BloomHash::of(key);
        let at = self.block(&hash);
        let block = &mut self.bits[at..at + BLOCK_WORDS];
        let mut p = hash.probes;
        for _ in 0..PROBES {
            let bit = (p & 511) as usize;
            block[bit / 64] |= 1 << (bit % 64);
            p >>= 9;
        }
    }

    pub(crate) fn may_contain(&self, hash: &BloomHash) -> bool {
        let at = self.block(hash);
        let block = &self.bits[at..at + BLOCK_WORDS];
        let mut p = hash.probes;
        for _ in 0..PROBES {
            let bit = (p & 511) as usize;
            if block[bit / 64] & (1 << (bit % 64)) == 0 {
                return false;
            }
            p >>= 9;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let mut bloom = Bloom::with_keys(10_000);
        for i in 0u64..10_000 {
            bloom.insert(&i.to_be_bytes());
        }
        let has = |i: u64| bloom.may_contain(&BloomHash::of(&i.to_be_bytes()));
        assert!((0u64..10_000).all(has));
        let false_positives = (10_000u64..110_000).filter(|&i| has(i)).count();
        assert!(false_positives < 2_000, "{false_positives} of 100,000");
    }

    #[test]
    fn whole_blocks_only() {
        assert!(Bloom::from_words(vec![0; 7]).is_none());
        assert!(Bloom::from_words(vec![]).is_none());
        assert!(Bloom::from_words(vec![0; 16]).is_some());
    }
}

//! A bloom filter over the by-set keys of a run: about 10 bits and 7 probes per key, so about
//! 1% of the membership checks of absent pairs read a block.

/// Bits per key.
pub(crate) const BLOOM_BITS_PER_KEY: usize = 10;
const PROBES: u32 = 7;

#[derive(Debug, Clone)]
pub(crate) struct Bloom {
    bits: Vec<u64>,
}

fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Two hashes of `key` for double hashing (FxHash-style mixing, then avalanched twice).
fn hashes(key: &[u8]) -> (u64, u64) {
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
    (h, fmix(h ^ 0x9e37_79b9_7f4a_7c15) | 1)
}

impl Bloom {
    pub(crate) fn with_keys(keys: usize) -> Bloom {
        let words = (keys * BLOOM_BITS_PER_KEY).div_ceil(64).max(1);
        Bloom {
            bits: vec![0; words],
        }
    }

    pub(crate) fn from_words(bits: Vec<u64>) -> Option<Bloom> {
        (!bits.is_empty()).then_some(Bloom { bits })
    }

    pub(crate) fn words(&self) -> &[u64] {
        &self.bits
    }

    fn len_bits(&self) -> u64 {
        self.bits.len() as u64 * 64
    }

    pub(crate) fn insert(&mut self, key: &[u8]) {
        let (mut h, delta) = hashes(key);
        let n = self.len_bits();
        for _ in 0..PROBES {
            let bit = h % n;
            self.bits[(bit / 64) as usize] |= 1 << (bit % 64);
            h = h.wrapping_add(delta);
        }
    }

    pub(crate) fn may_contain(&self, key: &[u8]) -> bool {
        let (mut h, delta) = hashes(key);
        let n = self.len_bits();
        for _ in 0..PROBES {
            let bit = h % n;
            if self.bits[(bit / 64) as usize] & (1 << (bit % 64)) == 0 {
                return false;
            }
            h = h.wrapping_add(delta);
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
        assert!((0u64..10_000).all(|i| bloom.may_contain(&i.to_be_bytes())));
        let false_positives = (10_000u64..110_000)
            .filter(|i| bloom.may_contain(&i.to_be_bytes()))
            .count();
        assert!(false_positives < 2_000, "{false_positives} of 100,000");
    }
}

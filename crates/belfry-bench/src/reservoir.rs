//! A uniform random sample of a stream of unknown length (reservoir sampling, Vitter's
//! algorithm R), and the small seeded generator behind it. `pending` keeps the ids of the
//! tasks it fills this way: a 10M fill holds a bounded sample instead of 10M ids.

/// splitmix64: small, fast and good enough to pick sample slots and shuffle; seeded, so a
/// test can replay it.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound` > 0). The modulo bias is at most bound / 2^64, under
    /// 10^-9 for any count a bench reaches: far below what a sample could show.
    pub fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0, "below(0) has no value to return");
        self.next_u64() % bound.max(1)
    }
}

/// Keeps at most `capacity` of the items offered, each offered item equally likely to be
/// kept whatever the stream's length.
#[derive(Debug, Clone)]
pub struct Reservoir<T> {
    capacity: usize,
    seen: u64,
    items: Vec<T>,
    rng: SplitMix64,
}

impl<T> Reservoir<T> {
    pub fn new(capacity: usize, seed: u64) -> Self {
        Reservoir {
            capacity,
            seen: 0,
            items: Vec::with_capacity(capacity.min(1 << 20)),
            rng: SplitMix64::new(seed),
        }
    }

    /// Offers one item, built by `make` only when it is kept (most of a long stream is not).
    pub fn offer_with(&mut self, make: impl FnOnce() -> T) {
        self.seen += 1;
        if self.items.len() < self.capacity {
            self.items.push(make());
            return;
        }
        // Item number `seen` replaces a random slot with probability capacity / seen.
        let slot = self.rng.below(self.seen);
        if let Some(kept) = self.items.get_mut(slot as usize) {
            *kept = make();
        }
    }

    /// Items offered so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The sample in random order (the first `capacity` items would otherwise stay in stream
    /// order, and a prefix of the sample would not be a random pick).
    pub fn into_shuffled(mut self) -> Vec<T> {
        for i in (1..self.items.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            self.items.swap(i, j);
        }
        self.items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_stream_is_kept_whole() {
        let mut r = Reservoir::new(10, 1);
        for i in 0..7 {
            r.offer_with(|| i);
        }
        assert_eq!(r.seen(), 7);
        let mut kept = r.into_shuffled();
        kept.sort_unstable();
        assert_eq!(kept, (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn a_long_stream_keeps_capacity_distinct_items() {
        let mut r = Reservoir::new(100, 7);
        for i in 0..100_000u64 {
            r.offer_with(|| i);
        }
        assert_eq!(r.seen(), 100_000);
        let mut kept = r.into_shuffled();
        assert_eq!(kept.len(), 100);
        kept.sort_unstable();
        kept.dedup();
        assert_eq!(kept.len(), 100);
        // Not just the head of the stream: a uniform sample of 100 from 100,000 has about
        // half its items past 50,000.
        let late = kept.iter().filter(|&&i| i >= 50_000).count();
        assert!((30..=70).contains(&late), "{late} of 100 past the middle");
    }

    #[test]
    fn every_position_is_kept_about_equally_often() {
        // 2,000 seeded runs keeping 10 of 100: each position is kept 200 times on average.
        let mut counts = [0u32; 100];
        for seed in 0..2_000 {
            let mut r = Reservoir::new(10, seed);
            for i in 0..100usize {
                r.offer_with(|| i);
            }
            for i in r.into_shuffled() {
                counts[i] += 1;
            }
        }
        let (low, high) = (counts.iter().min(), counts.iter().max());
        assert!(low >= Some(&140) && high <= Some(&260), "{low:?}..{high:?}");
        // The first and last tenth are kept alike (algorithm R has no bias to either end).
        let first: u32 = counts[..10].iter().sum();
        let last: u32 = counts[90..].iter().sum();
        assert!(first.abs_diff(last) < 300, "{first} vs {last}");
    }

    #[test]
    fn items_not_kept_are_never_built() {
        let mut r = Reservoir::new(3, 5);
        let mut built = 0;
        for i in 0..1_000 {
            r.offer_with(|| {
                built += 1;
                i
            });
        }
        // 3 + sum over n in 4..=1000 of 3/n is about 3 + 3 * (ln 1000 - ln 3) ≈ 20.
        assert!(built < 60, "{built} built");
    }

    #[test]
    fn shuffling_moves_a_stream_ordered_sample() {
        let mut r = Reservoir::new(1_000, 3);
        for i in 0..1_000 {
            r.offer_with(|| i);
        }
        let shuffled = r.into_shuffled();
        let in_place = shuffled.iter().enumerate().filter(|(i, v)| i == *v).count();
        assert!(in_place < 20, "{in_place} items stayed in place");
    }
}

//! One page of a sharded subscriber set in member order: a merge of per-shard pages.
//!
//! A user's shard is a hash of their id, so the first `limit` members of the whole set come
//! about evenly from every shard. The first round reads a little more than `limit / shards`
//! from each shard (three standard deviations over the mean), which is nearly always enough;
//! every member up to the smallest last member of a shard that has more (the *frontier*) is
//! then known, and the page is the first `limit` of those. When too few are known, only the
//! shards that could still hold members of the page read on, each twice as much as before.
//! So a page costs about 1.2 × `limit` members read and, nearly always, one round trip.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::conn::Result;

/// One read of a shard: at most `count` members after `after` (exclusive; `None` reads
/// from the start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Read {
    pub(crate) shard: usize,
    pub(crate) after: Option<Vec<u8>>,
    pub(crate) count: usize,
}

struct Shard {
    /// What was read, in order: a prefix of the shard's members after the page's start.
    got: Vec<Vec<u8>>,
    /// The last read returned less than it asked for: `got` holds all of the shard's rest.
    exhausted: bool,
    next_count: usize,
}

/// Up to `limit` members after `after` over `shards` shards, in ascending byte order.
/// `read` answers a round of reads, one list of members (ascending) per read, in order.
pub(crate) fn page(
    shards: usize,
    after: Option<&[u8]>,
    limit: usize,
    mut read: impl FnMut(&[Read]) -> Result<Vec<Vec<Vec<u8>>>>,
) -> Result<Vec<Vec<u8>>> {
    if limit == 0 || shards == 0 {
        return Ok(Vec::new());
    }
    let piece = first_piece(limit, shards);
    let mut state: Vec<Shard> = (0..shards)
        .map(|_| Shard {
            got: Vec::new(),
            exhausted: false,
            next_count: piece,
        })
        .collect();
    let mut wanted: Vec<usize> = (0..shards).collect();
    loop {
        let reads: Vec<Read> = wanted
            .iter()
            .map(|&k| Read {
                shard: k,
                after: state[k]
                    .got
                    .last()
                    .cloned()
                    .or_else(|| after.map(<[u8]>::to_vec)),
                count: state[k].next_count,
            })
            .collect();
        let replies = read(&reads)?;
        crate::reply::one_reply_each("redis subscriber set", replies.len(), reads.len())?;
        for (r, members) in reads.iter().zip(replies) {
            let s = &mut state[r.shard];
            s.exhausted = members.len() < r.count;
            s.got.extend(members);
            s.next_count = r.count.saturating_mul(2).min(limit);
        }
        // Every member up to the frontier is known, from every shard.
        let open: Vec<&[u8]> = state
            .iter()
            .filter(|s| !s.exhausted)
            .map(|s| s.got.last().map_or(&[][..], Vec::as_slice))
            .collect();
        let frontier = open.iter().min().copied();
        let known = merge(&state, frontier, limit);
        if known.len() >= limit || frontier.is_none() {
            return Ok(take(&mut state, &known));
        }
        wanted = still_wanted(&state, limit);
        if wanted.is_empty() {
            // Unreachable by the argument above; never loop without reading.
            return Ok(take(&mut state, &known));
        }
    }
}

/// The shards to read on from when too few members are known: the page ends at or before
/// the `limit`-th member read so far (when that many were read), so a shard whose last member
/// is past it has nothing more the page needs. Never empty while members are missing: were
/// every open shard's last member past that end, the frontier would be too, and the page
/// known.
fn still_wanted(state: &[Shard], limit: usize) -> Vec<usize> {
    let all = merge(state, None, limit);
    let end = (all.len() == limit).then(|| {
        let (k, i) = all[limit - 1];
        state[k].got[i].as_slice()
    });
    state
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.exhausted)
        .filter(|(_, s)| end.is_none_or(|end| s.got.last().is_none_or(|l| l.as_slice() < end)))
        .map(|(k, _)| k)
        .collect()
}

/// The first read per shard: the mean share of a page plus three standard deviations (of the
/// binomial count of a page's members that fall in one shard), and a few.
fn first_piece(limit: usize, shards: usize) -> usize {
    if shards == 1 {
        return limit;
    }
    let mean = limit.div_ceil(shards);
    let spread = (3.0 * (mean as f64).sqrt()).ceil() as usize;
    mean.saturating_add(spread).saturating_add(4).min(limit)
}

/// Moves the members at `at` (shard, index) out of `state`, in that order.
fn take(state: &mut [Shard], at: &[(usize, usize)]) -> Vec<Vec<u8>> {
    at.iter()
        .map(|&(k, i)| std::mem::take(&mut state[k].got[i]))
        .collect()
}

/// Where the first `limit` members read are, over all shards, in order, up to `upto`
/// (inclusive) when given: (shard, index in its `got`).
fn merge(state: &[Shard], upto: Option<&[u8]>, limit: usize) -> Vec<(usize, usize)> {
    let within = |m: &[u8]| upto.is_none_or(|u| m <= u);
    let mut heap = BinaryHeap::with_capacity(state.len());
    for (k, s) in state.iter().enumerate() {
        if let Some(first) = s.got.first().filter(|m| within(m)) {
            heap.push(Reverse((first.as_slice(), k, 0usize)));
        }
    }
    let mut out = Vec::with_capacity(limit.min(1 << 16));
    while out.len() < limit {
        let Some(Reverse((_, k, i))) = heap.pop() else {
            break;
        };
        out.push((k, i));
        if let Some(next) = state[k].got.get(i + 1).filter(|m| within(m)) {
            heap.push(Reverse((next.as_slice(), k, i + 1)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shards as plain sorted lists, answering reads as `ZRANGE … BYLEX LIMIT` would; counts
    /// the rounds and members read.
    struct Fake {
        shards: Vec<Vec<Vec<u8>>>,
        rounds: usize,
        members_read: usize,
    }

    impl Fake {
        fn new(members: &[Vec<u8>], shards: usize, place: impl Fn(&[u8]) -> usize) -> Fake {
            let mut lists = vec![Vec::new(); shards];
            for m in members {
                lists[place(m)].push(m.clone());
            }
            for l in &mut lists {
                l.sort();
            }
            Fake {
                shards: lists,
                rounds: 0,
                members_read: 0,
            }
        }

        fn page(&mut self, after: Option<&[u8]>, limit: usize) -> Vec<Vec<u8>> {
            let n = self.shards.len();
            page(n, after, limit, |reads| {
                self.rounds += 1;
                Ok(reads
                    .iter()
                    .map(|r| {
                        let got: Vec<Vec<u8>> = self.shards[r.shard]
                            .iter()
                            .filter(|m| r.after.as_ref().is_none_or(|a| *m > a))
                            .take(r.count)
                            .cloned()
                            .collect();
                        self.members_read += got.len();
                        got
                    })
                    .collect())
            })
            .unwrap()
        }
    }

    fn ids(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("u{i:06}").into_bytes()).collect()
    }

    fn hashed(m: &[u8], shards: usize) -> usize {
        crate::keys::shard_of(m, shards as u16) as usize
    }

    /// Pages through everything with `limit`, checking each page against the sorted whole.
    fn page_all(fake: &mut Fake, all: &[Vec<u8>], limit: usize) {
        let mut want = all.to_vec();
        want.sort();
        let mut after: Option<Vec<u8>> = None;
        let mut at = 0;
        loop {
            let got = fake.page(after.as_deref(), limit);
            let end = (at + limit).min(want.len());
            assert_eq!(got, want[at..end], "page at {at}, limit {limit}");
            at = end;
            if got.len() < limit {
                break;
            }
            after = got.last().cloned();
        }
        assert_eq!(at, want.len());
    }

    #[test]
    fn pages_of_hashed_shards_come_in_order_and_mostly_in_one_round() {
        let all = ids(20_000);
        let mut fake = Fake::new(&all, 16, |m| hashed(m, 16));
        page_all(&mut fake, &all, 1_001);
        let pages = 20;
        assert!(
            fake.rounds <= pages + 3,
            "{} rounds for {pages} pages",
            fake.rounds
        );
        assert!(
            fake.members_read < all.len() * 3 / 2,
            "read {} members to page {}",
            fake.members_read,
            all.len()
        );
    }

    #[test]
    fn lopsided_shards_still_page_exactly() {
        // Everything in one shard but a few: the full shard reads on, doubling, until the
        // page is known; the others are exhausted at once.
        let all = ids(3_000);
        for limit in [1, 2, 7, 100, 999, 5_000] {
            let mut fake = Fake::new(&all, 8, |m| if m.ends_with(b"7") { 3 } else { 5 });
            page_all(&mut fake, &all, limit);
        }
        // Members alternate between two shards in runs of 50.
        let mut fake = Fake::new(&all, 4, |m| {
            let i: usize = std::str::from_utf8(&m[1..]).unwrap().parse().unwrap();
            (i / 50) % 2
        });
        page_all(&mut fake, &all, 333);
    }

    #[test]
    fn small_and_empty_sets_and_edges() {
        let all = ids(5);
        let mut fake = Fake::new(&all, 16, |m| hashed(m, 16));
        page_all(&mut fake, &all, 3);
        assert_eq!(fake.page(None, 0), Vec::<Vec<u8>>::new());
        assert_eq!(fake.page(Some(b"zzz"), 10), Vec::<Vec<u8>>::new());
        assert_eq!(fake.page(Some(b"u000002"), 10), all[3..].to_vec());
        let mut empty = Fake::new(&[], 16, |_| 0);
        assert!(empty.page(None, 5).is_empty());
        assert_eq!(empty.rounds, 1);
        let mut one = Fake::new(&all, 1, |_| 0);
        page_all(&mut one, &all, 2);
    }

    #[test]
    fn first_piece_is_a_little_over_the_mean_share() {
        assert_eq!(first_piece(5_001, 1), 5_001);
        let p = first_piece(5_001, 16);
        assert!((313..=380).contains(&p), "{p}");
        assert_eq!(first_piece(3, 16), 3);
        // No overflow on absurd limits.
        assert!(first_piece(usize::MAX, 16) >= usize::MAX / 16);
    }
}

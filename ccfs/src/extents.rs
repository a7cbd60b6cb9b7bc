//! Sets of block numbers kept as ranges: the blocks of a file held by block
//! (`overlay/blocks.rs`) that the cache has, and those written here. Pure.

use std::collections::BTreeMap;

/// The size of a block of a file held by block: the unit the cache copies from the
/// share and the logout sends. SQLite's pages (4 KiB to 64 KiB, Firefox uses 32 KiB) are
/// whole blocks, so a page written never reads its neighbours from the share.
pub const BLOCK: u64 = 4096;

/// A set of block numbers as disjoint, non-touching ranges `[start, end)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extents {
    /// start -> end; no two ranges overlap or touch.
    ranges: BTreeMap<u64, u64>,
}

impl Extents {
    pub fn new() -> Self {
        Self::default()
    }

    /// The set of the given ranges (empty ones ignored).
    pub fn of(ranges: &[(u64, u64)]) -> Self {
        let mut e = Self::new();
        for &(s, t) in ranges {
            e.insert(s, t);
        }
        e
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Adds the blocks `[start, end)`.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut t) = (start, end);
        // A range that starts at or before `start` and reaches it joins.
        if let Some((&ps, &pe)) = self.ranges.range(..=s).next_back() {
            if pe >= s {
                s = ps;
                t = t.max(pe);
            }
        }
        // Every range that starts within [s, t] joins.
        let joined: Vec<(u64, u64)> = self.ranges.range(s..=t).map(|(&a, &b)| (a, b)).collect();
        for (a, b) in joined {
            self.ranges.remove(&a);
            t = t.max(b);
        }
        self.ranges.insert(s, t);
    }

    /// Adds every block of `other`.
    pub fn insert_all(&mut self, other: &Extents) {
        for (s, t) in other.iter() {
            self.insert(s, t);
        }
    }

    /// Whether block `b` is in the set.
    pub fn contains(&self, b: u64) -> bool {
        self.ranges
            .range(..=b)
            .next_back()
            .is_some_and(|(_, &e)| e > b)
    }

    /// The ranges, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&s, &e)| (s, e))
    }

    /// How many blocks the set holds.
    pub fn count(&self) -> u64 {
        self.iter().map(|(s, e)| e - s).sum()
    }

    /// The blocks of `[start, end)` not in the set, as ranges in order.
    pub fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        if start >= end {
            return out;
        }
        let mut at = start;
        let first = self
            .ranges
            .range(..=start)
            .next_back()
            .map_or(start, |(&s, _)| s);
        for (&s, &e) in self.ranges.range(first..end) {
            if e <= at {
                continue;
            }
            if s > at {
                out.push((at, s.min(end)));
            }
            at = e;
            if at >= end {
                break;
            }
        }
        if at < end {
            out.push((at, end));
        }
        out
    }

    /// Removes the blocks `[start, end)`.
    pub fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let kept: Vec<(u64, u64)> = self.iter().collect();
        self.ranges.clear();
        for (s, e) in kept {
            if e <= start || s >= end {
                self.ranges.insert(s, e);
                continue;
            }
            if s < start {
                self.ranges.insert(s, start);
            }
            if e > end {
                self.ranges.insert(end, e);
            }
        }
    }

    /// Removes every block from `from` on.
    pub fn remove_from(&mut self, from: u64) {
        let after: Vec<u64> = self.ranges.range(from..).map(|(&s, _)| s).collect();
        for s in after {
            self.ranges.remove(&s);
        }
        if let Some((&s, e)) = self.ranges.range_mut(..from).next_back() {
            if *e > from {
                *e = from;
            }
            if *e <= s {
                self.ranges.remove(&s);
            }
        }
    }

    /// The ranges as the journal writes them: `a-b,c-d` (`-` when empty).
    pub fn encode(&self) -> String {
        if self.is_empty() {
            return "-".into();
        }
        self.iter()
            .map(|(s, e)| format!("{s}-{e}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// What [`Extents::encode`] wrote; None when it is not that.
    pub fn decode(s: &str) -> Option<Self> {
        if s == "-" {
            return Some(Self::new());
        }
        let mut e = Self::new();
        for part in s.split(',') {
            let (a, b) = part.split_once('-')?;
            let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
            if a >= b {
                return None;
            }
            e.insert(a, b);
        }
        Some(e)
    }
}

/// The blocks `[first, end)` that hold the bytes `[offset, offset + len)`.
pub fn blocks_of(offset: u64, len: u64) -> (u64, u64) {
    if len == 0 {
        return (offset / BLOCK, offset / BLOCK);
    }
    (offset / BLOCK, (offset + len).div_ceil(BLOCK))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranges_join_when_they_touch_or_overlap() {
        let mut e = Extents::new();
        e.insert(10, 20);
        e.insert(30, 40);
        e.insert(20, 25);
        assert_eq!(e.iter().collect::<Vec<_>>(), [(10, 25), (30, 40)]);
        e.insert(5, 35);
        assert_eq!(e.iter().collect::<Vec<_>>(), [(5, 40)]);
        e.insert(41, 42);
        assert_eq!(e.count(), 36);
        assert!(e.contains(5) && e.contains(39) && !e.contains(40) && e.contains(41));
    }

    #[test]
    fn gaps_are_what_a_range_lacks() {
        let e = Extents::of(&[(2, 4), (6, 8)]);
        assert_eq!(e.gaps(0, 10), [(0, 2), (4, 6), (8, 10)]);
        assert_eq!(e.gaps(3, 7), [(4, 6)]);
        assert_eq!(e.gaps(2, 4), []);
        assert_eq!(Extents::new().gaps(1, 3), [(1, 3)]);
        assert_eq!(e.gaps(5, 3), [], "an empty range lacks nothing");
    }

    #[test]
    fn removing_from_a_block_cuts_the_range_it_falls_in() {
        let mut e = Extents::of(&[(0, 4), (6, 9), (12, 14)]);
        e.remove_from(7);
        assert_eq!(e.iter().collect::<Vec<_>>(), [(0, 4), (6, 7)]);
        e.remove_from(6);
        assert_eq!(e.iter().collect::<Vec<_>>(), [(0, 4)]);
        e.remove_from(0);
        assert!(e.is_empty());
    }

    #[test]
    fn blocks_of_a_byte_range_cover_it() {
        assert_eq!(blocks_of(0, 4096), (0, 1));
        assert_eq!(blocks_of(4095, 2), (0, 2));
        assert_eq!(blocks_of(8192, 0), (2, 2));
        assert_eq!(blocks_of(32768, 32768), (8, 16));
    }

    #[test]
    fn the_journal_form_reads_back_and_refuses_what_it_never_writes() {
        let e = Extents::of(&[(1, 3), (7, 9)]);
        assert_eq!(e.encode(), "1-3,7-9");
        assert_eq!(Extents::decode(&e.encode()), Some(e));
        assert_eq!(Extents::decode("-"), Some(Extents::new()));
        for bad in ["", "3-1", "1-", "a-b", "1-2;3-4"] {
            assert_eq!(Extents::decode(bad), None, "{bad:?}");
        }
    }

    proptest! {
        /// The set behaves as the set of its blocks.
        #[test]
        fn extents_are_a_set_of_blocks(ops in prop::collection::vec((0u64..64, 0u64..64, any::<bool>()), 0..40)) {
            let mut e = Extents::new();
            let mut set = std::collections::BTreeSet::new();
            for (a, b, cut) in ops {
                if cut && a % 2 == 0 {
                    e.remove_from(a);
                    set.retain(|&x| x < a);
                } else if cut {
                    let (s, t) = (a.min(b), a.max(b));
                    e.remove(s, t);
                    set.retain(|&x| x < s || x >= t);
                } else {
                    let (s, t) = (a.min(b), a.max(b));
                    e.insert(s, t);
                    set.extend(s..t);
                }
                for b in 0..70 {
                    prop_assert_eq!(e.contains(b), set.contains(&b));
                }
                prop_assert_eq!(e.count(), set.len() as u64);
                let gaps: u64 = e.gaps(0, 70).iter().map(|(s, t)| t - s).sum();
                prop_assert_eq!(gaps, 70 - set.len() as u64);
                // Disjoint and not touching.
                let r: Vec<_> = e.iter().collect();
                for w in r.windows(2) {
                    prop_assert!(w[0].1 < w[1].0);
                }
            }
        }
    }
}

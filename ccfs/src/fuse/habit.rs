//! Whether a listing's first reply carries its entries' attributes (READDIRPLUS).
//!
//! With attributes, a program that looks at every entry after listing a directory (`ls
//! -l`, a file manager, a profile scan) finds them all known to the kernel: one reply
//! instead of a LOOKUP per entry. Without, a program that only wants the names (`find`,
//! `ls` without colours, a file picker) does not pay for a look at each entry on the share
//! and an inode the kernel makes for each. The kernel asks for attributes on a
//! directory's first read (and on later reads once entries were looked up meanwhile); the
//! daemon answers that first read with every entry's attributes only while the programs
//! of this mount look at the entries of what they list. Otherwise the first reply holds
//! `.` and `..` alone: the kernel then reads the rest without attributes, and a program
//! that looks at the entries after all sends LOOKUPs, which this records (as it records
//! the kernel reading on with attributes, which it does once entries of the part it read
//! were looked at: `ls -l` looks at each part before reading on). While entries
//! are looked at, a listing now and then (less often each time it confirms that) leaves
//! its last quarter without attributes, to see whether they still are.
//!
//! Pure logic: the caller says what was listed and what was looked up.

use std::collections::VecDeque;

/// How many directories listed without attributes are remembered.
const WINDOW: usize = 8;

/// While entries are looked at, a listing in this many at first (then twice as many
/// after each that confirms it, up to [`PROBE_MOST`]) leaves its last quarter without
/// attributes: lookups of that quarter tell whether entries are still looked at.
const PROBE_FIRST: u32 = 8;
const PROBE_MOST: u32 = 256;

/// The first reply of a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstReply {
    /// Every entry with its attributes.
    All,
    /// `.` and `..` and this many entries with their attributes; the rest goes without.
    First(usize),
}

/// What the lookups after the latest listings without attributes say.
#[derive(Debug)]
pub struct ListingHabit {
    /// Directories listed lately with entries left without attributes, the latest last:
    /// (node, entries left without, lookups of its entries since).
    bare: VecDeque<(u64, u32, u32)>,
    /// Listings with every attribute since the last probe.
    full_since_probe: u32,
    /// Listings with every attribute between two probes, now.
    probe_every: u32,
}

impl Default for ListingHabit {
    fn default() -> Self {
        Self {
            bare: VecDeque::new(),
            full_since_probe: 0,
            probe_every: PROBE_FIRST,
        }
    }
}

impl ListingHabit {
    /// The first reply of the listing of `dir` (`entries` entries besides `.` and
    /// `..`); one that leaves entries without attributes is recorded.
    pub fn first_reply(&mut self, dir: u64, entries: usize) -> FirstReply {
        if entries == 0 {
            return FirstReply::All;
        }
        let looked_at = self.entries_looked_at();
        if looked_at && self.full_since_probe + 1 < self.probe_every {
            self.full_since_probe += 1;
            return FirstReply::All;
        }
        let with = if looked_at {
            // A probe: the entries are still looked at (the last probe's were, or the
            // listing before it without attributes); the next comes later.
            self.probe_every = (self.probe_every * 2).min(PROBE_MOST);
            entries - entries.div_ceil(4)
        } else {
            self.probe_every = PROBE_FIRST;
            0
        };
        self.full_since_probe = 0;
        self.bare.retain(|(d, ..)| *d != dir);
        if self.bare.len() == WINDOW {
            self.bare.pop_front();
        }
        let without = u32::try_from(entries - with).unwrap_or(u32::MAX);
        self.bare.push_back((dir, without, 0));
        FirstReply::First(with)
    }

    /// The kernel asks for a later part of the listing of `dir` with attributes: it
    /// does so only once an entry was looked up or found still valid meanwhile (a
    /// program that reads a part and looks at its entries before reading on, as `ls -l`
    /// does), so the entries are looked at.
    pub fn read_on_with_attributes(&mut self, dir: u64) {
        if let Some(e) = self.bare.iter_mut().rev().find(|(d, ..)| *d == dir) {
            e.2 = e.1;
        }
    }

    /// The kernel looked up an entry of `parent`.
    pub fn looked_up(&mut self, parent: u64) {
        if let Some(e) = self.bare.iter_mut().rev().find(|(d, ..)| *d == parent) {
            e.2 = e.2.saturating_add(1).min(e.1);
        }
    }

    /// Whether at least half the entries the latest listing left without attributes
    /// were looked up since.
    fn entries_looked_at(&self) -> bool {
        self.bare
            .back()
            .is_some_and(|(_, without, looked)| u64::from(*looked) * 2 >= u64::from(*without))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look_all(h: &mut ListingHabit, dir: u64, n: usize) {
        for _ in 0..n {
            h.looked_up(dir);
        }
    }

    #[test]
    fn names_alone_until_entries_are_looked_at() {
        let mut h = ListingHabit::default();
        // Nothing known yet: names alone.
        assert_eq!(h.first_reply(10, 200), FirstReply::First(0));
        assert_eq!(h.first_reply(11, 200), FirstReply::First(0));
        // The program looks at every entry of what it listed: attributes from now on.
        look_all(&mut h, 11, 200);
        assert_eq!(h.first_reply(12, 200), FirstReply::All);
        assert_eq!(h.first_reply(13, 200), FirstReply::All);
    }

    #[test]
    fn a_few_lookups_do_not_switch_attributes_on() {
        let mut h = ListingHabit::default();
        assert_eq!(h.first_reply(10, 200), FirstReply::First(0));
        look_all(&mut h, 10, 99);
        h.looked_up(99); // another directory's entry
        assert_eq!(h.first_reply(11, 200), FirstReply::First(0));
    }

    /// Listings until the next probe; returns how many went with every attribute and
    /// the probe's directory.
    fn to_probe(h: &mut ListingHabit, dir: &mut u64) -> (u32, FirstReply) {
        let mut with = 0;
        loop {
            *dir += 1;
            match h.first_reply(*dir, 100) {
                FirstReply::All => with += 1,
                probe => return (with, probe),
            }
        }
    }

    #[test]
    fn probes_come_less_often_while_entries_are_still_looked_at() {
        let mut h = ListingHabit::default();
        assert_eq!(h.first_reply(1, 100), FirstReply::First(0));
        look_all(&mut h, 1, 100);
        let mut dir = 1;
        let mut every = PROBE_FIRST;
        for _ in 0..8 {
            let (with, probe) = to_probe(&mut h, &mut dir);
            assert_eq!(with, every - 1);
            // A probe leaves the last quarter without attributes.
            assert_eq!(probe, FirstReply::First(75));
            look_all(&mut h, dir, 25);
            every = (every * 2).min(PROBE_MOST);
        }
    }

    #[test]
    fn a_probe_read_on_with_attributes_is_confirmed() {
        let mut h = ListingHabit::default();
        assert_eq!(h.first_reply(1, 100), FirstReply::First(0));
        look_all(&mut h, 1, 100);
        let mut dir = 1;
        let mut every = PROBE_FIRST;
        for _ in 0..4 {
            let (with, probe) = to_probe(&mut h, &mut dir);
            assert_eq!((with, probe), (every - 1, FirstReply::First(75)));
            // The program looked at the first part's entries before reading on: the
            // kernel reads the rest with attributes (no lookups come).
            h.read_on_with_attributes(dir);
            every = (every * 2).min(PROBE_MOST);
        }
        // Another directory's later part says nothing of this one.
        let (_, probe) = to_probe(&mut h, &mut dir);
        assert_eq!(probe, FirstReply::First(75));
        h.read_on_with_attributes(dir + 100);
        assert_eq!(h.first_reply(dir + 1, 100), FirstReply::First(0));
    }

    #[test]
    fn a_probe_nobody_looks_at_switches_attributes_off() {
        let mut h = ListingHabit::default();
        assert_eq!(h.first_reply(1, 100), FirstReply::First(0));
        look_all(&mut h, 1, 100);
        let mut dir = 1;
        let (_, probe) = to_probe(&mut h, &mut dir);
        assert_eq!(probe, FirstReply::First(75));
        // Nobody looked at the probe's last quarter: names alone go on.
        assert_eq!(h.first_reply(dir + 1, 100), FirstReply::First(0));
        assert_eq!(h.first_reply(dir + 2, 100), FirstReply::First(0));
        // Until entries are looked at again; probes start over as often as at first.
        look_all(&mut h, dir + 2, 100);
        let (with, _) = to_probe(&mut h, &mut (dir + 2));
        assert_eq!(with, PROBE_FIRST - 1);
    }

    #[test]
    fn an_empty_directory_is_listed_as_asked_and_not_recorded() {
        let mut h = ListingHabit::default();
        assert_eq!(h.first_reply(5, 0), FirstReply::All);
        assert!(h.bare.is_empty());
    }

    #[test]
    fn the_window_keeps_the_latest_directories() {
        let mut h = ListingHabit::default();
        for d in 0..(WINDOW as u64 + 3) {
            assert_eq!(h.first_reply(d, 4), FirstReply::First(0));
        }
        assert_eq!(h.bare.len(), WINDOW);
        assert_eq!(h.bare.front().map(|e| e.0), Some(3));
        // Listed again: one record, the latest.
        assert_eq!(h.first_reply(5, 4), FirstReply::First(0));
        assert_eq!(h.bare.iter().filter(|e| e.0 == 5).count(), 1);
        assert_eq!(h.bare.back().map(|e| e.0), Some(5));
    }
}

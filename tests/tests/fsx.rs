//! An fsx-style random I/O checker (after xfstests' fsx): seeded random reads, writes,
//! truncates, fallocates (extend, keep size, punch a hole), reads and writes through
//! `MAP_SHARED` mappings (some written after their descriptor was closed and a sync ran,
//! as mmap users and kernel passthrough make it), each checked byte for byte against a
//! shadow copy, on a file of each class through a real ccfs mount (a cached dotfile,
//! whose data goes to the cache through kernel passthrough, and a document on the share),
//! with syncs, remounts, and kill -9 of the daemon followed by `ccfs recover` in between.
//! After every crash and at the end the share's file is compared with the shadow too.
//!
//! `CCFS_FSX_OPS` sets the operations per file (default 600), `CCFS_FSX_SEED` the seed
//! (default: a new one, printed, so that a failure can be replayed).

use e2e::*;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The largest the file grows.
const MAX_LEN: u64 = 256 * 1024;

/// What one step did, for the failure message.
#[derive(Debug, Clone)]
enum Op {
    Read(u64, u64),
    Write(u64, u64),
    Truncate(u64),
    Fallocate(i32, u64, u64),
    MapRead(u64, u64),
    MapWrite(u64, u64, bool),
    Sync,
    Remount,
    Crash,
}

/// The file under test and its shadow.
struct Fsx<'a> {
    fx: &'a Fixture,
    rel: &'a str,
    shadow: Vec<u8>,
    rng: Rng,
    log: Vec<Op>,
    mount: Option<Mount<'a>>,
}

impl<'a> Fsx<'a> {
    fn path(&self) -> std::path::PathBuf {
        self.fx.m(self.rel)
    }

    fn fail(&self, what: String) -> ! {
        let last: Vec<String> = self
            .log
            .iter()
            .rev()
            .take(12)
            .rev()
            .map(|o| format!("{o:?}"))
            .collect();
        panic!(
            "{} ({} bytes): {what}\nlast operations:\n{}",
            self.rel,
            self.shadow.len(),
            last.join("\n")
        );
    }

    /// Compares `got` (read at `off`) with the shadow.
    fn check(&self, off: u64, got: &[u8], how: &str) {
        let want = &self.shadow[off as usize..off as usize + got.len()];
        if got != want {
            let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            self.fail(format!(
                "{how} at {off}: byte {} is {:#04x}, the shadow has {:#04x}",
                off as usize + at,
                got[at],
                want[at]
            ));
        }
    }

    fn bytes(&mut self, len: u64) -> Vec<u8> {
        (0..len).map(|_| self.rng.below(256) as u8).collect()
    }

    /// An offset and a length within the file (a non-empty file).
    fn range(&mut self) -> (u64, u64) {
        let size = self.shadow.len() as u64;
        let off = self.rng.below(size);
        let len = 1 + self.rng.below((size - off).min(16 * 1024));
        (off, len)
    }

    fn open(&self, write: bool) -> fs::File {
        fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(self.path())
            .unwrap_or_else(|e| self.fail(format!("open: {e}")))
    }

    fn step(&mut self) {
        let size = self.shadow.len() as u64;
        let pick = self.rng.below(100);
        // Reads and mappings need bytes to work on.
        let needs_bytes = matches!(pick, 0..=19 | 60..=86);
        let op = match pick {
            _ if size == 0 && needs_bytes => {
                let len = 1 + self.rng.below(32 * 1024);
                Op::Write(0, len)
            }
            0..=19 => {
                let (o, l) = self.range();
                Op::Read(o, l)
            }
            20..=44 => {
                let off = self.rng.below(MAX_LEN - 1);
                let len = 1 + self.rng.below((MAX_LEN - off).min(32 * 1024));
                Op::Write(off, len)
            }
            45..=51 => Op::Truncate(self.rng.below(MAX_LEN)),
            52..=59 => {
                let modes = [
                    0,
                    libc::FALLOC_FL_KEEP_SIZE,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                ];
                let mode = modes[self.rng.below(3) as usize];
                let off = self.rng.below(MAX_LEN - 1);
                let len = 1 + self.rng.below((MAX_LEN - off).min(32 * 1024));
                Op::Fallocate(mode, off, len)
            }
            60..=69 => {
                let (o, l) = self.range();
                Op::MapRead(o, l)
            }
            70..=86 => {
                let (o, l) = self.range();
                Op::MapWrite(o, l, self.rng.below(3) == 0)
            }
            87..=94 => Op::Sync,
            95..=97 => Op::Remount,
            _ => Op::Crash,
        };
        self.log.push(op.clone());
        self.run(op);
    }

    fn run(&mut self, op: Op) {
        match op {
            Op::Read(off, len) => {
                let mut buf = vec![0u8; len as usize];
                self.open(false)
                    .read_exact_at(&mut buf, off)
                    .unwrap_or_else(|e| self.fail(format!("read: {e}")));
                self.check(off, &buf, "read");
            }
            Op::Write(off, len) => {
                let data = self.bytes(len);
                self.open(true)
                    .write_all_at(&data, off)
                    .unwrap_or_else(|e| self.fail(format!("write: {e}")));
                let end = (off + len) as usize;
                if self.shadow.len() < end {
                    self.shadow.resize(end, 0);
                }
                self.shadow[off as usize..end].copy_from_slice(&data);
            }
            Op::Truncate(len) => {
                self.open(true)
                    .set_len(len)
                    .unwrap_or_else(|e| self.fail(format!("truncate: {e}")));
                self.shadow.resize(len as usize, 0);
            }
            Op::Fallocate(mode, off, len) => {
                let f = self.open(true);
                // SAFETY: fallocate on a descriptor this function owns.
                let rc = unsafe {
                    libc::fallocate(f.as_raw_fd(), mode, off as libc::off_t, len as libc::off_t)
                };
                if rc != 0 {
                    let e = std::io::Error::last_os_error();
                    // A filesystem without the mode (punching a hole on some shares):
                    // nothing changed, as fallocate promises.
                    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                        return;
                    }
                    self.fail(format!("fallocate({mode}): {e}"));
                }
                let end = (off + len) as usize;
                if mode & libc::FALLOC_FL_PUNCH_HOLE != 0 {
                    let stop = end.min(self.shadow.len());
                    if (off as usize) < stop {
                        self.shadow[off as usize..stop].fill(0);
                    }
                } else if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && self.shadow.len() < end {
                    self.shadow.resize(end, 0);
                }
            }
            Op::MapRead(off, len) => {
                let f = self.open(false);
                let map = SharedMap::of_file(&f, self.shadow.len(), false);
                drop(f);
                let got = map.read(off as usize, len as usize);
                self.check(off, &got, "read through a mapping");
            }
            Op::MapWrite(off, len, sync_between) => {
                let f = self.open(true);
                let map = SharedMap::of_file(&f, self.shadow.len(), true);
                // The descriptor goes first, as mmap users close it: under kernel
                // passthrough the kernel releases the open now, and the mapping writes
                // the cache's file without the daemon.
                drop(f);
                if sync_between {
                    self.sync();
                }
                let data = self.bytes(len);
                map.write(off as usize, &data);
                map.sync();
                drop(map);
                self.shadow[off as usize..(off + len) as usize].copy_from_slice(&data);
            }
            Op::Sync => self.sync(),
            Op::Remount => {
                let m = self.mount.take().expect("mounted");
                let out = m.umount();
                if !out.status.success() {
                    self.fail(format!("logout: {}", text(&out)));
                }
                self.share_matches("after a logout");
                self.mount = Some(self.fx.mount());
            }
            Op::Crash => {
                self.mount.take().expect("mounted").crash();
                let out = ccfs(&[
                    "recover".as_ref(),
                    "--cache-dir".as_ref(),
                    self.fx.cache.as_os_str(),
                ]);
                if !out.status.success() {
                    self.fail(format!("recover: {}", text(&out)));
                }
                self.share_matches("after kill -9 and ccfs recover");
                self.mount = Some(self.fx.mount());
            }
        }
    }

    fn sync(&self) {
        let out = ccfs(&["sync".as_ref(), self.fx.mnt.as_os_str()]);
        let said = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() && !said.contains("left unsynced") {
            self.fail(format!("sync: {}", text(&out)));
        }
    }

    /// The share's file is the shadow.
    fn share_matches(&self, when: &str) {
        let got = fs::read(self.fx.s(self.rel))
            .unwrap_or_else(|e| self.fail(format!("{when}: the share: {e}")));
        if got.len() != self.shadow.len() {
            self.fail(format!(
                "{when}: the share's file has {} bytes, the shadow {}",
                got.len(),
                self.shadow.len()
            ));
        }
        if got != self.shadow {
            let at = got
                .iter()
                .zip(&self.shadow)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            self.fail(format!("{when}: the share's file differs at byte {at}"));
        }
    }
}

fn seed() -> u64 {
    std::env::var("CCFS_FSX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

fn ops() -> usize {
    std::env::var("CCFS_FSX_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600)
}

/// Runs the checker on `rel` (made on the share first, empty) and checks the share's file
/// after the last logout and what the next login reads.
fn fsx(rel: &str, tmpfs_cache: bool) {
    let fx = Fixture::new();
    let _cache = tmpfs_cache.then(|| SmallTmpfs::mount(&fx.cache, "256m"));
    if let Some(parent) = Path::new(rel).parent() {
        fs::create_dir_all(fx.s(&parent.to_string_lossy())).expect("mkdir");
    }
    fs::write(fx.s(rel), b"").expect("share file");
    let seed = seed();
    eprintln!("fsx {rel}: seed {seed} (CCFS_FSX_SEED={seed} replays it)");
    let mut t = Fsx {
        fx: &fx,
        rel,
        shadow: Vec::new(),
        rng: Rng::new(seed),
        log: Vec::new(),
        mount: Some(fx.mount()),
    };
    for _ in 0..ops() {
        t.step();
    }
    let out = t.mount.take().expect("mounted").umount();
    assert!(out.status.success(), "{}", text(&out));
    t.share_matches("after the last logout");
    let m = fx.mount();
    let got = fs::read(fx.m(rel)).expect("the next login");
    assert!(got == t.shadow, "{rel}: the next login reads another file");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn fsx_on_a_cached_dotfile_through_kernel_passthrough() {
    fsx(".fsx", false);
}

#[test]
fn fsx_on_a_cached_dotfile_with_the_cache_on_tmpfs() {
    fsx(".config/fsx", true);
}

#[test]
fn fsx_on_a_document_on_the_share() {
    fsx("Documents/fsx", false);
}

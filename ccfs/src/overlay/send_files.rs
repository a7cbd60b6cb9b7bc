//! Regular files the sync sends itself, as rsync `--delay-updates` would put them, with
//! fewer requests to the share. rsync asks a replicated share for about 140 calls a small
//! file (its temporary file made, written, given mode and times one call each, renamed
//! into the holding directory, renamed into place, the holding directory's removal tried
//! after each file); the logout of a class sends thousands of such files at once, and the
//! server's CPU sets how long that takes. Here each file is made in the holding directory
//! of its directory with its mode, written, given its mtime, put on disk; once every file
//! is there, each is renamed over the share's file, and each holding directory is removed
//! once. A sync cut short leaves the share's files as they were, or some of them new:
//! never a file half written (the holding directories are cleaned up as rsync's are).
//!
//! Only what rsync would carry no differently goes this way: a regular file of one name,
//! not open for writing when handed over, without extended attributes or ACLs, whose
//! directory the share has (writable by its owner) and whose name there is no directory,
//! and short enough for the name of its copy. Everything else (and every file, when the configuration gives rsync
//! arguments of its own) goes to rsync.
//!
//! The copy of `NAME` is `NAME~ccfs-HOST-CACHE` in the holding directory (`CACHE`: a
//! number of the workstation's cache), a name of this workstation's own: rsync (`NAME` there) or another workstation sending the same file
//! at the same time never takes or replaces it, so the file renamed into place is the
//! one made here. Only a copy of that name left by this workstation's sync cut short is
//! ever replaced.

use std::collections::BTreeSet;

use super::*;
use crate::rsync::Put;

/// A file copied into its holding directory on the share, on disk, not yet in place.
#[derive(Debug)]
pub struct Staged {
    /// The path in the home.
    pub rel: PathBuf,
    /// Its copy in the holding directory.
    tmp: PathBuf,
    /// The cache file's mtime the copy has (whole seconds, as rsync reports it).
    mtime: i64,
}

/// The files [`Overlay::stage_files`] copied into place (in the order given), and the
/// holding directories it used.
#[derive(Debug, Default)]
pub struct StagedFiles {
    pub files: Vec<Staged>,
    dirs: BTreeSet<PathBuf>,
}

/// What [`Overlay::send_files`] put on the share, and why the others did not get there.
#[derive(Debug, Default)]
pub struct FilesSent {
    pub put: HashMap<PathBuf, Put>,
    pub errors: Vec<String>,
}

impl Overlay {
    /// Whether the sync may send the cache's `rel` itself (see the module documentation),
    /// as far as the cache tells: `m` is its look as handed over, `quiet` whether nothing
    /// had it open for writing then. The share is asked later, by
    /// [`Overlay::share_takes_directly`].
    pub(super) fn may_send_directly(&self, rel: &Path, m: &Stat, quiet: bool) -> bool {
        quiet
            && m.is_file()
            && m.nlink() == 1
            && self
                .cache
                .listxattr(&up(rel))
                .is_ok_and(|names| names.is_empty())
    }

    /// Of `files` (which [`Overlay::may_send_directly`] took), those the share takes as
    /// the sync sends them: their directory is one on the share that its owner may write
    /// (asked once a directory) and their name there is no directory as the conflict
    /// checks found it (`dirs_there`; rsync replaces a directory it may remove; one made
    /// there since fails the rename, and the next sync's check finds it).
    /// The others are handed to rsync.
    pub(super) fn share_takes_directly(
        &self,
        files: Vec<PathBuf>,
        dirs_there: &HashSet<PathBuf>,
    ) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let mut dirs: HashMap<PathBuf, bool> = HashMap::new();
        files.into_iter().partition(|p| {
            if p.file_name().and_then(|n| self.copy_name(n)).is_none() {
                return false;
            }
            let parent = p.parent().unwrap_or(Path::new("")).to_path_buf();
            // (A directory its owner may not write rsync makes writable while it sends.)
            let dir_there = *dirs.entry(parent).or_insert_with_key(|d| {
                matches!(self.share.stat(d), Ok(Some(m)) if m.is_dir() && m.mode() & 0o200 != 0)
            });
            // (Its name there as the conflict checks found it.)
            dir_there && !dirs_there.contains(p)
        })
    }

    /// Sends `files` (see the module documentation): every one copied into place beside
    /// the share's file first, then every one renamed over it.
    pub fn send_files(&self, files: &[PathBuf]) -> FilesSent {
        let mut sent = FilesSent::default();
        let staged = self.stage_files(files, &mut sent.errors);
        self.put_staged(staged, &mut sent);
        sent
    }

    /// The first half of [`Overlay::send_files`]: each file copied into the holding
    /// directory of its directory on the share, with its mode, owner (when root) and
    /// mtime, on disk. A file that cannot be leaves nothing there and is named in `errors`.
    pub fn stage_files(&self, files: &[PathBuf], errors: &mut Vec<String>) -> StagedFiles {
        let mut holding: HashMap<PathBuf, Result<PathBuf, String>> = HashMap::new();
        let mut staged = StagedFiles::default();
        for rel in files {
            let (Some(name), parent) = (
                rel.file_name().and_then(|n| self.copy_name(n)),
                rel.parent().unwrap_or(Path::new("")),
            ) else {
                errors.push(format!(
                    "cannot send {}: its name is too long for a copy",
                    session::shown(rel)
                ));
                continue;
            };
            let dir = holding
                .entry(parent.to_path_buf())
                .or_insert_with(|| self.holding_dir(parent).map_err(|e| e.to_string()));
            let dir = match dir {
                Ok(d) => d.clone(),
                Err(e) => {
                    errors.push(format!(
                        "cannot send {}: cannot make its holding directory: {e}",
                        session::shown(rel)
                    ));
                    continue;
                }
            };
            let tmp = dir.join(name);
            staged.dirs.insert(dir);
            match self.stage(rel, &tmp) {
                Ok(mtime) => staged.files.push(Staged {
                    rel: rel.clone(),
                    tmp,
                    mtime,
                }),
                Err(e) => {
                    let _ = self.share.unlink(&tmp);
                    errors.push(format!("cannot send {}: {e}", session::shown(rel)));
                }
            }
        }
        staged
    }

    /// The second half of [`Overlay::send_files`]: each staged file renamed over the
    /// share's, in the order given, then the holding directories removed (one that holds
    /// something else stays).
    pub fn put_staged(&self, staged: StagedFiles, sent: &mut FilesSent) {
        for s in staged.files {
            match self.share.rename(&s.tmp, &s.rel, 0) {
                Ok(()) => {
                    sent.put.insert(s.rel, Put::File(s.mtime));
                }
                Err(e) => {
                    let _ = self.share.unlink(&s.tmp);
                    sent.errors
                        .push(format!("cannot send {}: {e}", session::shown(&s.rel)));
                }
            }
        }
        for d in staged.dirs {
            let _ = self.share.rmdir(&d);
        }
        #[cfg(test)]
        super::send_files_tests::after_own_puts(self);
    }

    /// Copies the cache's `rel` to `tmp` on the share (whatever was there goes): made
    /// with its permission bits (the holding directory lets no one else in), its data
    /// (holes kept), owner (when root), mode, mtime, then written to disk. Returns the
    /// mtime's seconds.
    fn stage(&self, rel: &Path, tmp: &Path) -> io::Result<i64> {
        let (src, meta) = self.cache_file_to_send(rel)?;
        let want = meta.mode() & 0o7777;
        let create = |root: &Root| {
            root.open_file(
                tmp,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                want & 0o777,
            )
        };
        let dst = match create(&self.share) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                // Left by a send of this workstation's cut short (the name is ours).
                self.share.unlink(tmp)?;
                create(&self.share)?
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                // The holding directory, which another workstation's sync used too,
                // removed by it once it was done: made again.
                self.holding_dir(rel.parent().unwrap_or(Path::new("")))?;
                create(&self.share)?
            }
            r => r?,
        };
        sys::copy_into_new(&src, &dst, meta.len())?;
        #[cfg(test)]
        super::send_files_tests::after_own_copy(self);
        // Written while it was copied (a program opened it after the hand-over): not put
        // in place half old, half new (rsync fails such a file's check too); the file
        // stays unsynced work, and the next sync sends it.
        let after = sys::fstat(&src)?;
        if (after.len(), after.mtime(), after.ctime()) != (meta.len(), meta.mtime(), meta.ctime()) {
            return Err(io::Error::other("it changed while it was copied"));
        }
        let mut made = sys::fstat(&dst)?;
        if self.as_root || made.gid() != meta.gid() {
            if self.as_root {
                self.share.fchown(&dst, meta.uid(), meta.gid())?;
            } else {
                // Its group, as rsync --archive keeps it (a directory may hand out its
                // own): where the user may give it (one of their groups), as rsync.
                let _ = self.share.fchown(&dst, u32::MAX, meta.gid());
            }
            made = sys::fstat(&dst)?;
        }
        // The bits the umask took, or that a change of owner or group clears (set-id).
        if made.mode() & 0o7777 != want {
            sys::fchmod(&dst, want)?;
        }
        let (secs, nsecs) = meta.mtime();
        sys::futimens(&dst, sys::SetTime::Omit, sys::SetTime::At { secs, nsecs })?;
        dst.sync_all()?;
        Ok(secs)
    }

    /// Gives the share's directories among `dirs` the mtime of the cache's again: rsync
    /// set it when it sent them, and the files the sync sent itself into them afterwards
    /// (a holding directory made and removed, renames) changed it.
    pub fn restore_dir_times(&self, dirs: &[&Path]) {
        for d in dirs {
            if let Ok(Some(m)) = self.upper_stat(d) {
                if m.is_dir() {
                    let (secs, nsecs) = m.mtime();
                    let at = sys::SetTime::At { secs, nsecs };
                    if let Err(e) = self.share.utimens(d, sys::SetTime::Omit, at) {
                        tracing::debug!(path = %session::shown(d), "cannot set its mtime again: {e}");
                    }
                }
            }
        }
    }

    /// The name of the copy of a file named `name` in the holding directory, this
    /// workstation's own (see the module documentation; the host is the one the sync was
    /// given, this machine's name); None when it would be too long.
    pub(super) fn copy_name(&self, name: &OsStr) -> Option<OsString> {
        let host = self.sync_host.locked().clone();
        let mut copy = name.to_os_string();
        copy.push("~ccfs-");
        if host.is_empty() {
            copy.push(crate::sync::hostname());
        } else {
            copy.push(host);
        }
        // And the cache's own number: two caches of one machine (two users' mounts of
        // one home, a test's two workstations) are two workstations here.
        let id = match self.cache.stat(Path::new("")) {
            Ok(Some(m)) => m.ino() ^ m.dev(),
            _ => 0,
        };
        copy.push(format!("-{:08x}", id & 0xffff_ffff));
        (copy.len() <= 255).then_some(copy)
    }
}

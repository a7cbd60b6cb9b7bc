//! Root's record of a user's sessions, `/run/ccfs/sessions/UID.json`, with `UID.lock`
//! serializing that user's hooks.

use std::ffi::OsStr;
use std::io::{self, Read};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::daemon::{self};
use crate::sys::{self, DirFd};

use super::*;

/// Root's state of one user's sessions: `/run/ccfs/sessions/UID.json`, with `UID.lock`
/// serializing the hooks of that user.
pub(super) struct StateFile {
    dir: DirFd,
    uid: u32,
}

impl StateFile {
    pub(super) fn open(uid: u32) -> Result<Self, String> {
        let mut cur = DirFd::open(Path::new("/run")).map_err(|e| format!("/run: {e}"))?;
        for name in ["ccfs", "sessions"] {
            let n = OsStr::new(name);
            match cur.mkdir(n, 0o700) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("cannot create the session state {STATE_DIR}: {e}")),
            }
            cur = cur
                .open_dir(n)
                .map_err(|e| format!("session state {STATE_DIR}: {e}"))?;
            let st = cur.stat().map_err(|e| format!("{STATE_DIR}: {e}"))?;
            if st.uid() != 0 || st.mode() & 0o022 != 0 {
                return Err(format!(
                    "the session state {STATE_DIR} is not root's alone (uid {}, mode {:o}); remove it",
                    st.uid(),
                    st.mode() & 0o7777
                ));
            }
        }
        Ok(Self { dir: cur, uid })
    }

    pub(super) fn lock(&self, limit: Duration) -> Result<std::fs::File, String> {
        let name = format!("{}.lock", self.uid);
        let f = self
            .dir
            .open_file(
                OsStr::new(&name),
                libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW,
                0o600,
            )
            .map_err(|e| format!("session lock {STATE_DIR}/{name}: {e}"))?;
        let until = Instant::now() + limit;
        loop {
            match sys::try_lock_exclusive(&f) {
                Ok(true) => return Ok(f),
                Ok(false) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Ok(false) => {
                    return Err(format!(
                        "another login or logout of uid {} held {STATE_DIR}/{name} for {} s; nothing done",
                        self.uid,
                        limit.as_secs()
                    ))
                }
                Err(e) => return Err(format!("session lock {STATE_DIR}/{name}: {e}")),
            }
        }
    }

    pub(super) fn load(&self) -> Option<UserState> {
        let name = format!("{}.json", self.uid);
        let mut f = self
            .dir
            .open_file(OsStr::new(&name), libc::O_RDONLY | libc::O_NOFOLLOW, 0)
            .ok()?;
        let mut text = String::new();
        let _ = (&mut f).take(1 << 20).read_to_string(&mut text);
        match serde_json::from_str(&text) {
            Ok(st) => Some(st),
            Err(e) => {
                error(&format!(
                    "{STATE_DIR}/{name} is unreadable ({e}); the sessions it counted are forgotten"
                ));
                None
            }
        }
    }

    pub(super) fn save(&self, st: &Option<UserState>) -> Result<(), String> {
        let name = format!("{}.json", self.uid);
        let path = Path::new(STATE_DIR).join(&name);
        match st {
            None => match std::fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(format!("{}: {e}", path.display())),
            },
            Some(st) => {
                let text = serde_json::to_vec_pretty(st).map_err(|e| e.to_string())?;
                daemon::write_atomic(&path, &text).map_err(|e| format!("{}: {e}", path.display()))
            }
        }
    }
}

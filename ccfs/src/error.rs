//! Errors: the filesystem's and their one mapping to errno, the user's (one line naming
//! the problem and the fix), and how text that may quote file names goes into a log line.

use std::io;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error(transparent)]
    Io(#[from] io::Error),
    /// Refused by ccfs itself (a check, not a failed system call): logged with the
    /// system's text for the number, as a failed call's error is.
    #[error("{}", io::Error::from_raw_os_error(*.0))]
    Errno(i32),
    #[error("journal write failed: {0}")]
    Journal(io::Error),
}

impl FsError {
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            FsError::Errno(n) => *n,
            // The change was not recorded, so it was not made: report an I/O error.
            FsError::Journal(e) => match e.raw_os_error() {
                Some(libc::ENOSPC) => libc::ENOSPC,
                Some(libc::EDQUOT) => libc::EDQUOT,
                _ => libc::EIO,
            },
        }
    }

    pub fn enoent() -> Self {
        FsError::Errno(libc::ENOENT)
    }
}

pub type FsResult<T> = Result<T, FsError>;

pub fn errno(n: i32) -> FsError {
    FsError::Errno(n)
}

/// A problem with what the user asked for: one line naming it and the fix. Exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{problem}; {fix}")]
pub struct UserError {
    pub problem: String,
    pub fix: String,
}

pub fn user_error(problem: impl Into<String>, fix: impl Into<String>) -> UserError {
    UserError {
        problem: problem.into(),
        fix: fix.into(),
    }
}

/// A path or file name in a log line or message: printable ASCII only
/// ([`crate::journal::escape`]: `\xHH` for spaces, newlines, backslashes and anything
/// else), so a name cannot start a line of its own or pose as another field.
pub struct LogPath<'a>(pub &'a Path);

impl std::fmt::Display for LogPath<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::journal::escape(self.0))
    }
}

/// Free text that may quote file names (an rsync error, an error message) in a log line:
/// control characters, backslashes and anything outside ASCII become `\xHH`.
pub struct LogText<'a>(pub &'a str);

impl std::fmt::Display for LogText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for &b in self.0.as_bytes() {
            if (b == b' ' || b.is_ascii_graphic()) && b != b'\\' {
                write!(f, "{}", b as char)?;
            } else {
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping() {
        assert_eq!(
            FsError::from(io::Error::from_raw_os_error(libc::EACCES)).errno(),
            libc::EACCES
        );
        assert_eq!(FsError::from(io::Error::other("x")).errno(), libc::EIO);
        assert_eq!(
            FsError::Journal(io::Error::from_raw_os_error(libc::ENOSPC)).errno(),
            libc::ENOSPC
        );
        assert_eq!(errno(libc::EXDEV).errno(), libc::EXDEV);
        // The log says what the number means.
        assert!(
            errno(libc::EXDEV).to_string().contains("cross-device link"),
            "{}",
            errno(libc::EXDEV)
        );
    }
}

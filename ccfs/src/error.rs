//! Filesystem errors and the one mapping from them to errno.

use std::io;

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

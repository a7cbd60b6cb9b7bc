//! Why the kernel or the system refused the ring, and what to do about it.

use std::fmt;
use std::io;
use std::time::Duration;

/// The ring could not be started; nothing is left registered and the classic `/dev/fuse`
/// reads of the session serve every request.
#[derive(Debug)]
pub enum Refused {
    /// The fuse module's `enable_uring` parameter is off.
    ModuleDisabled,
    /// io_uring is disabled for this process (sysctl `kernel.io_uring_disabled`).
    IoUringDisabled { sysctl: Option<String> },
    /// io_uring_setup failed for another reason.
    IoUringSetup(io::Error),
    /// The connection was not initialized (INIT not answered) within the registration timeout.
    NotInitialized { waited: Duration },
    /// The kernel rejected the REGISTER command with this errno.
    Rejected { errno: i32, payload_len: usize },
    /// The connection is gone (unmounted or aborted).
    NotConnected { errno: i32 },
    /// The number of queues (possible CPUs) could not be read.
    Queues(String),
    /// A thread or an eventfd could not be created.
    Resources(io::Error),
    /// The ring was refused after INIT offered it, and the kernel could not be told to
    /// give up waiting for it: requests to the connection are held. The caller must end
    /// the connection (close the session), or the mount hangs.
    Stranded(Box<Refused>),
}

impl Refused {
    /// Whether the kernel still holds the connection's requests for the ring.
    pub fn stranded(&self) -> bool {
        matches!(self, Refused::Stranded(_))
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::ModuleDisabled => write!(
                f,
                "the fuse module's enable_uring is off: echo 1 > /sys/module/fuse/parameters/enable_uring \
                 (or load fuse with enable_uring=1) and mount again"
            ),
            Refused::IoUringDisabled { sysctl } => write!(
                f,
                "io_uring is disabled for this process (kernel.io_uring_disabled = {}): \
                 sysctl -w kernel.io_uring_disabled=0, or add the daemon's group to kernel.io_uring_group",
                sysctl.as_deref().unwrap_or("unknown")
            ),
            Refused::IoUringSetup(e) => write!(
                f,
                "io_uring_setup failed ({e}): check RLIMIT_MEMLOCK and that the kernel has io_uring \
                 with 128-byte SQEs (Linux 6.14+)"
            ),
            Refused::NotInitialized { waited } => write!(
                f,
                "the FUSE connection was still not initialized after {waited:?} (REGISTER kept failing with EAGAIN): \
                 call start after the INIT reply has been sent, or raise register_timeout"
            ),
            Refused::Rejected { errno, payload_len } => {
                let e = io::Error::from_raw_os_error(*errno);
                if *errno == libc::EINVAL {
                    write!(
                        f,
                        "the kernel rejected the ring registration ({e}): the payload buffer of {payload_len} bytes \
                         may be smaller than the connection's max(max_write, max_pages * page size); pass the \
                         negotiated max_write and max_pages in RingOptions"
                    )
                } else if *errno == libc::EOPNOTSUPP {
                    write!(f, "the kernel does not serve FUSE over io_uring on this connection ({e}): {}", Refused::ModuleDisabled)
                } else {
                    write!(f, "the kernel rejected the ring registration ({e}); the session keeps serving /dev/fuse")
                }
            }
            Refused::NotConnected { errno } => write!(
                f,
                "the FUSE connection is gone ({}): it was unmounted or aborted before the ring started",
                io::Error::from_raw_os_error(*errno)
            ),
            Refused::Queues(why) => write!(
                f,
                "cannot tell the number of ring queues from /sys/devices/system/cpu/possible ({why}): is sysfs mounted?"
            ),
            Refused::Resources(e) => write!(f, "cannot create a serving thread or eventfd ({e}): check process limits"),
            Refused::Stranded(why) => write!(
                f,
                "{why}; and the kernel could not be told to give up waiting for the ring, so the \
                 connection must end"
            ),
        }
    }
}

impl std::error::Error for Refused {}

impl Refused {
    /// Maps a failed REGISTER completion to its reason.
    pub(crate) fn from_register(errno: i32, payload_len: usize) -> Refused {
        match errno {
            libc::EOPNOTSUPP => Refused::ModuleDisabled,
            libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV => Refused::NotConnected { errno },
            _ => Refused::Rejected { errno, payload_len },
        }
    }

    /// Maps a failed io_uring_setup to its reason.
    pub(crate) fn from_setup(e: io::Error) -> Refused {
        if e.raw_os_error() == Some(libc::EPERM) {
            let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
                .ok()
                .map(|s| s.trim().to_string());
            Refused::IoUringDisabled { sysctl }
        } else {
            Refused::IoUringSetup(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_reason_and_remedy() {
        let s = Refused::ModuleDisabled.to_string();
        assert!(s.contains("enable_uring") && s.contains("echo 1 >"), "{s}");
        let s = Refused::from_register(libc::EOPNOTSUPP, 0).to_string();
        assert!(s.contains("enable_uring"), "{s}");
        let s = Refused::from_register(libc::EINVAL, 4096).to_string();
        assert!(s.contains("4096") && s.contains("max_write"), "{s}");
        let s = Refused::IoUringDisabled {
            sysctl: Some("2".into()),
        }
        .to_string();
        assert!(s.contains("io_uring_disabled = 2"), "{s}");
        assert!(matches!(
            Refused::from_register(libc::ENOTCONN, 0),
            Refused::NotConnected { .. }
        ));
    }
}

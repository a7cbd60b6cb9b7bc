//! Both transports' trait impls over the shared bodies of `Mem`, and the tests.

use super::*;
use fuser::{
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request,
};
use std::path::Path;

pub struct Classic(pub Arc<Mem>, pub bool);

impl Classic {
    fn n(&self) -> &Mem {
        self.0.classic.fetch_add(1, Ordering::Relaxed);
        &self.0
    }
}

#[allow(clippy::too_many_arguments)]
impl fuser::Filesystem for Classic {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        if self.1
            && config
                .capabilities()
                .contains(InitFlags::FUSE_OVER_IO_URING)
        {
            let _ = config.add_capabilities(InitFlags::FUSE_OVER_IO_URING);
        }
        Ok(())
    }
    fn lookup(&self, _: &Request, p: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.n().lookup(p, name, reply)
    }
    fn getattr(&self, _: &Request, ino: INodeNo, _: Option<FileHandle>, reply: ReplyAttr) {
        self.n().getattr(ino, reply)
    }
    fn setattr(
        &self,
        _: &Request,
        ino: INodeNo,
        _: Option<u32>,
        _: Option<u32>,
        _: Option<u32>,
        size: Option<u64>,
        _: Option<fuser::TimeOrNow>,
        _: Option<fuser::TimeOrNow>,
        _: Option<SystemTime>,
        _: Option<FileHandle>,
        _: Option<SystemTime>,
        _: Option<SystemTime>,
        _: Option<SystemTime>,
        _: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.n().setattr(ino, size, reply)
    }
    fn create(
        &self,
        _: &Request,
        _: INodeNo,
        name: &OsStr,
        _: u32,
        _: u32,
        _: i32,
        reply: ReplyCreate,
    ) {
        self.n().create(name, reply)
    }
    fn open(&self, _: &Request, ino: INodeNo, _: OpenFlags, reply: ReplyOpen) {
        self.n().open(ino, reply)
    }
    fn opendir(&self, _: &Request, ino: INodeNo, _: OpenFlags, reply: ReplyOpen) {
        self.n().open(ino, reply)
    }
    fn read(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        off: u64,
        size: u32,
        _: OpenFlags,
        _: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        self.n().read(ino, off, size, reply)
    }
    fn write(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        off: u64,
        data: &[u8],
        _: fuser::WriteFlags,
        _: OpenFlags,
        _: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        self.n().write(ino, off, data, reply)
    }
    fn flush(
        &self,
        _: &Request,
        _: INodeNo,
        _: FileHandle,
        _: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        self.n().empty(reply)
    }
    fn release(
        &self,
        _: &Request,
        _: INodeNo,
        _: FileHandle,
        _: OpenFlags,
        _: Option<fuser::LockOwner>,
        _: bool,
        reply: ReplyEmpty,
    ) {
        self.n().empty(reply)
    }
    fn releasedir(&self, _: &Request, _: INodeNo, _: FileHandle, _: OpenFlags, reply: ReplyEmpty) {
        self.n().empty(reply)
    }
    fn unlink(&self, _: &Request, _: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.n().unlink(name, reply)
    }
    fn rename(
        &self,
        _: &Request,
        _: INodeNo,
        name: &OsStr,
        _: INodeNo,
        newname: &OsStr,
        _: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.n().rename(name, newname, reply)
    }
    fn readdir(&self, _: &Request, _: INodeNo, _: FileHandle, off: u64, reply: ReplyDirectory) {
        self.n().readdir(off, reply)
    }
    fn statfs(&self, _: &Request, _: INodeNo, reply: ReplyStatfs) {
        self.n().statfs(reply)
    }
    fn setxattr(
        &self,
        _: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        _: i32,
        _: u32,
        reply: ReplyEmpty,
    ) {
        self.n().setxattr(ino, name, value, reply)
    }
    fn getxattr(&self, _: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.n().getxattr(ino, name, size, reply)
    }
    fn listxattr(&self, _: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.n().listxattr(ino, size, reply)
    }
}

impl Mem {
    fn n(&self) -> &Mem {
        self.ring.fetch_add(1, Ordering::Relaxed);
        self
    }
}

#[allow(clippy::too_many_arguments)]
impl RingFilesystem for Mem {
    fn lookup(&self, _: &Caller, p: INodeNo, name: &OsStr, reply: RingReply) {
        self.n().lookup(p, name, reply)
    }
    fn getattr(&self, _: &Caller, ino: INodeNo, _: Option<FileHandle>, reply: RingReply) {
        self.n().getattr(ino, reply)
    }
    fn setattr(
        &self,
        _: &Caller,
        ino: INodeNo,
        _: Option<u32>,
        _: Option<u32>,
        _: Option<u32>,
        size: Option<u64>,
        _: Option<fuser::TimeOrNow>,
        _: Option<fuser::TimeOrNow>,
        _: Option<SystemTime>,
        _: Option<FileHandle>,
        _: Option<SystemTime>,
        _: Option<SystemTime>,
        _: Option<SystemTime>,
        _: Option<fuser::BsdFileFlags>,
        reply: RingReply,
    ) {
        self.n().setattr(ino, size, reply)
    }
    fn create(
        &self,
        _: &Caller,
        _: INodeNo,
        name: &OsStr,
        _: u32,
        _: u32,
        _: i32,
        reply: RingReply,
    ) {
        self.n().create(name, reply)
    }
    fn open(&self, _: &Caller, ino: INodeNo, _: OpenFlags, reply: RingReply) {
        self.n().open(ino, reply)
    }
    fn opendir(&self, _: &Caller, ino: INodeNo, _: OpenFlags, reply: RingReply) {
        self.n().open(ino, reply)
    }
    fn read(
        &self,
        _: &Caller,
        ino: INodeNo,
        _: FileHandle,
        off: u64,
        size: u32,
        _: OpenFlags,
        _: Option<fuser::LockOwner>,
        reply: RingReply,
    ) {
        self.n().read(ino, off, size, reply)
    }
    fn write(
        &self,
        _: &Caller,
        ino: INodeNo,
        _: FileHandle,
        off: u64,
        data: &[u8],
        _: fuser::WriteFlags,
        _: OpenFlags,
        _: Option<fuser::LockOwner>,
        reply: RingReply,
    ) {
        self.n().write(ino, off, data, reply)
    }
    fn flush(&self, _: &Caller, _: INodeNo, _: FileHandle, _: fuser::LockOwner, reply: RingReply) {
        self.n().empty(reply)
    }
    fn release(
        &self,
        _: &Caller,
        _: INodeNo,
        _: FileHandle,
        _: OpenFlags,
        _: Option<fuser::LockOwner>,
        _: bool,
        reply: RingReply,
    ) {
        self.n().empty(reply)
    }
    fn releasedir(&self, _: &Caller, _: INodeNo, _: FileHandle, _: OpenFlags, reply: RingReply) {
        self.n().empty(reply)
    }
    fn unlink(&self, _: &Caller, _: INodeNo, name: &OsStr, reply: RingReply) {
        self.n().unlink(name, reply)
    }
    fn rename(
        &self,
        _: &Caller,
        _: INodeNo,
        name: &OsStr,
        _: INodeNo,
        newname: &OsStr,
        _: fuser::RenameFlags,
        reply: RingReply,
    ) {
        self.n().rename(name, newname, reply)
    }
    fn readdir(&self, _: &Caller, _: INodeNo, _: FileHandle, off: u64, reply: RingReply) {
        self.n().readdir(off, reply)
    }
    fn statfs(&self, _: &Caller, _: INodeNo, reply: RingReply) {
        self.n().statfs(reply)
    }
    fn setxattr(
        &self,
        _: &Caller,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        _: i32,
        _: u32,
        reply: RingReply,
    ) {
        self.n().setxattr(ino, name, value, reply)
    }
    fn getxattr(&self, _: &Caller, ino: INodeNo, name: &OsStr, size: u32, reply: RingReply) {
        self.n().getxattr(ino, name, size, reply)
    }
    fn listxattr(&self, _: &Caller, ino: INodeNo, size: u32, reply: RingReply) {
        self.n().listxattr(ino, size, reply)
    }
}

static MODULE_PARAM: Mutex<()> = Mutex::new(());
const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Holds the process-wide lock on the module parameter and restores it on drop.
pub struct Param {
    old: String,
    _g: MutexGuard<'static, ()>,
}

impl Param {
    pub fn set(on: bool) -> Param {
        let g = MODULE_PARAM.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::fs::read_to_string(PARAM).expect("fuse enable_uring parameter");
        std::fs::write(PARAM, if on { "1" } else { "0" }).expect("set enable_uring");
        Param { old, _g: g }
    }
}

impl Drop for Param {
    fn drop(&mut self) {
        let v = if self.old.trim() == "Y" { "1" } else { "0" };
        let _ = std::fs::write(PARAM, v);
    }
}

pub struct Mounted {
    pub fs: Arc<Mem>,
    pub dir: tempfile::TempDir,
    pub bg: Option<fuser::BackgroundSession>,
    pub ring: Result<fuse_ring::Ring, fuse_ring::Refused>,
}

pub fn mount(use_ring: bool) -> Mounted {
    let fs = Arc::new(Mem::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![fuser::MountOption::FSName("ringtest".into())];
    let session =
        fuser::Session::new(Classic(Arc::clone(&fs), use_ring), dir.path(), &cfg).expect("mount");
    let dev = session.as_fd().try_clone_to_owned().expect("dup");
    let bg = session.spawn().expect("spawn");
    let ring = if use_ring {
        let opts = RingOptions {
            max_write: 1 << 20,
            max_pages: 257,
            ..RingOptions::default()
        };
        fuse_ring::start(dev, Arc::clone(&fs), opts)
    } else {
        Err(fuse_ring::Refused::ModuleDisabled)
    };
    Mounted {
        fs,
        dir,
        bg: Some(bg),
        ring,
    }
}

pub fn exercise(root: &Path) {
    let f = root.join("a.txt");
    std::fs::write(&f, b"hello ring").expect("create+write");
    assert_eq!(std::fs::read(&f).expect("read"), b"hello ring");
    assert_eq!(std::fs::metadata(&f).expect("stat").len(), 10);
    for i in 0..300 {
        std::fs::write(root.join(format!("file-with-a-longish-name-{i:04}")), b"x")
            .expect("create many");
    }
    let names: Vec<_> = std::fs::read_dir(root)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names.len(), 301, "every entry across several READDIR calls");
    std::fs::rename(&f, root.join("b.txt")).expect("rename");
    assert!(!f.exists());
    assert_eq!(
        std::fs::read(root.join("b.txt")).expect("read renamed"),
        b"hello ring"
    );
    let b =
        std::ffi::CString::new(root.join("b.txt").as_os_str().as_encoded_bytes()).expect("cstr");
    xattr_roundtrip(&b);
    std::fs::remove_file(root.join("b.txt")).expect("unlink");
    assert!(!root.join("b.txt").exists());
    let st = nix_statfs(root);
    assert_eq!((st.0, st.1), (100, 4096));
}

fn xattr_roundtrip(path: &std::ffi::CStr) {
    let name = c"user.k";
    // SAFETY (test): valid C strings and buffers with their lengths.
    let rc = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), b"v1".as_ptr().cast(), 2, 0) };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
    let mut buf = [0u8; 16];
    // SAFETY (test): as above.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert_eq!(&buf[..n as usize], b"v1");
    // SAFETY (test): as above.
    let n = unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(&buf[..n as usize], b"user.k\0");
}

fn nix_statfs(p: &Path) -> (u64, u64) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("cstr");
    // SAFETY (test): zeroed statfs is valid; the path is a C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY (test): as above.
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut st) }, 0);
    (st.f_blocks, st.f_bsize as u64)
}

pub fn unmount_and_join(mut m: Mounted) {
    drop(m.bg.take());
    if let Ok(ring) = m.ring {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            ring.join();
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(5))
            .expect("ring threads end within 5 s of unmount");
    }
}

#[test]
fn ring_serves_file_operations() {
    let _p = Param::set(true);
    let m = mount(true);
    let ring = m.ring.as_ref().expect("ring started");
    assert!(ring.threads() >= ring.queues() && ring.queues() >= 1);
    let classic_before = m.fs.classic.load(Ordering::Relaxed);
    exercise(m.dir.path());
    let classic = m.fs.classic.load(Ordering::Relaxed) - classic_before;
    let on_ring = m.fs.ring.load(Ordering::Relaxed);
    assert!(on_ring > 600, "ring served {on_ring}");
    assert!(classic <= 2, "classic served {classic} after start");
    assert!(ring.served() >= on_ring);
    unmount_and_join(m);
}

#[test]
fn refused_when_enable_uring_is_off_and_dev_fuse_serves() {
    let _p = Param::set(false);
    let m = mount(true);
    match &m.ring {
        Err(e) => assert!(e.to_string().contains("enable_uring"), "{e}"),
        Ok(_) => panic!("ring started with enable_uring off"),
    }
    let start = Instant::now();
    exercise(m.dir.path());
    assert!(m.fs.classic.load(Ordering::Relaxed) > 600);
    assert_eq!(m.fs.ring.load(Ordering::Relaxed), 0);
    assert!(start.elapsed() < Duration::from_secs(20));
    unmount_and_join(m);
}

#[test]
fn unmount_ends_the_threads() {
    let _p = Param::set(true);
    let m = mount(true);
    assert!(m.ring.is_ok());
    let before = thread_names();
    assert!(
        before.iter().any(|n| n.starts_with("fuse-ring-")),
        "{before:?}"
    );
    unmount_and_join(m);
    let after = thread_names();
    assert!(
        !after.iter().any(|n| n.starts_with("fuse-ring-")),
        "{after:?}"
    );
}

fn thread_names() -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/task")
        .expect("tasks")
        .flatten()
    {
        if let Ok(s) = std::fs::read_to_string(e.path().join("comm")) {
            v.push(s.trim().to_string());
        }
    }
    v
}

/// `cargo test -p fuse-ring --release -- --ignored per_request_cost`
#[test]
#[ignore]
fn per_request_cost() {
    let n = 20_000;
    let mut results = Vec::new();
    for use_ring in [false, true] {
        let _p = Param::set(use_ring);
        let m = mount(use_ring);
        assert_eq!(m.ring.is_ok(), use_ring);
        let root = m.dir.path();
        std::fs::write(root.join("s"), b"x").expect("create");
        let t = Instant::now();
        for _ in 0..n {
            std::fs::metadata(root.join("s")).expect("stat");
        }
        let stat = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let t = Instant::now();
        for i in 0..n / 4 {
            let p = root.join(format!("c{i}"));
            std::fs::File::create(&p).expect("create");
            std::fs::remove_file(&p).expect("unlink");
        }
        let cu = t.elapsed().as_secs_f64() * 1e6 / (n / 4) as f64;
        println!(
            "{}: stat {stat:.2} us, create+unlink {cu:.2} us",
            if use_ring { "ring" } else { "classic" }
        );
        results.push((stat, cu));
        unmount_and_join(m);
    }
    println!(
        "ratio ring/classic: stat {:.2}, create+unlink {:.2}",
        results[1].0 / results[0].0,
        results[1].1 / results[0].1
    );
}

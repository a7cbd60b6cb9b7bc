//! A file a program keeps writing, cutting short and extending while syncs run (a log, a
//! database, fsx): every sync
//! sends a version of it and finishes (rsync, reading a file that changes under it,
//! discarded the transfer, so the syncs failed one after another and the session's work
//! waited for the logout); the logout, once the program is done, sends the last version.

use e2e::*;
use std::fs;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const LEN: usize = 256 * 1024;

#[test]
fn every_sync_sends_a_file_that_keeps_changing_and_the_logout_sends_the_last_version() {
    let fx = Fixture::new();
    fs::write(fx.s(".busy"), vec![0u8; LEN]).expect("share file");
    let m = fx.mount();
    let stop = Arc::new(AtomicBool::new(false));
    let generation = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, generation) = (stop.clone(), generation.clone());
        let path = fx.m(".busy");
        std::thread::spawn(move || {
            let f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .expect("open");
            let mut g = 0u64;
            while !stop.load(Ordering::Relaxed) {
                g += 1;
                // Cut short, then every block written again, one write each (fsx
                // truncates and extends as programs do).
                f.set_len((g as usize % 7 * 4096) as u64).expect("truncate");
                for block in 0..LEN / 4096 {
                    f.write_all_at(&[(g % 251) as u8 + 1; 4096], (block * 4096) as u64)
                        .expect("write");
                }
                generation.store(g, Ordering::Relaxed);
            }
            g
        })
    };
    wait_until("a few versions written", Duration::from_secs(20), || {
        generation.load(Ordering::Relaxed) > 3
    });
    let mut seen = Vec::new();
    for i in 0..8 {
        let out = ccfs(&["sync".as_ref(), fx.mnt.as_os_str()]);
        let said = text(&out);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("sent 1 paths")
                && !said.contains("rsync")
                && !said.contains("not sent"),
            "sync {i} did not send the file being written: {said}"
        );
        let share = fs::read(fx.s(".busy")).expect("share");
        assert!(
            share.len() <= LEN && share.len().is_multiple_of(4096),
            "sync {i}: {} bytes",
            share.len()
        );
        seen.push(share);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        seen.windows(2).any(|w| w[0] != w[1]),
        "the syncs sent no newer version while the file changed"
    );
    stop.store(true, Ordering::Relaxed);
    let last = writer.join().expect("writer");
    let out = m.umount();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        fs::read(fx.s(".busy")).expect("share"),
        vec![(last % 251) as u8 + 1; LEN],
        "the logout did not send the last version"
    );
}

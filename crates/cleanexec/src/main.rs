//! `ccfs-clean-exec PROGRAM [ARGS...]`: runs PROGRAM (an absolute path) with PAM's items
//! and a fixed PATH as its whole environment; see the library's documentation for why.
//! Built statically for the musl target (`scripts/package`); the PAM profile names it.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some(problem) = cleanexec::check_args(&args) {
        eprintln!("ccfs-clean-exec: {problem}");
        return ExitCode::from(2);
    }
    let environ: Vec<OsString> = std::env::vars_os()
        .map(|(k, v)| {
            let mut e = k;
            e.push("=");
            e.push(v);
            e
        })
        .collect();
    let kept = cleanexec::kept_environment(environ.iter().map(OsString::as_os_str));
    let c = |s: &OsString| CString::new(s.as_bytes()).ok();
    let (Some(argv), Some(envp)) = (
        args[1..].iter().map(c).collect::<Option<Vec<CString>>>(),
        kept.iter().map(c).collect::<Option<Vec<CString>>>(),
    ) else {
        eprintln!("ccfs-clean-exec: an argument holds a NUL byte");
        return ExitCode::from(2);
    };
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut envp_p: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    envp_p.push(std::ptr::null());
    // SAFETY: both arrays are NULL-terminated and point into CStrings that live until
    // execve returns (it returns only on failure).
    unsafe { libc::execve(argv_p[0], argv_p.as_ptr(), envp_p.as_ptr()) };
    eprintln!(
        "ccfs-clean-exec: cannot run {}: {}",
        args[1].to_string_lossy(),
        std::io::Error::last_os_error()
    );
    ExitCode::from(127)
}

//! The sections of loadgen's man pages that clap does not make: examples and exit codes.

use clidocs::Section;

const EXAMPLES: &str = "\
compilebench's own workload on a mounted share, with 6 clients, results as JSON:

```
loadgen compilebench /mnt/share/bench --clients 6 --json nfs-6.json
```

The same at several client counts, then the charts and a page from every result:

```
loadgen sweep /mnt/share/bench --clients 1,6,13,40 --json sweep.json
loadgen report sweep.json -o report/
```

A class of 25 logging in at once, without and with ccfs (as root):

```
loadgen login-storm --share /netshare/scratch --users 25 --compare --repeat 3
```";

const EXIT_STATUS: &str = "\
0
    The run finished and its results were written.

1
    The run failed: a client's error, a target that stopped answering (named), a result \
    file that could not be written. The results so far are written and printed.

2
    Bad input: one line names the problem and what to do; nothing was run or made.

130
    Stopped by Ctrl-C (SIGINT) or SIGTERM: the clients stopped, what the run made was \
    removed (a storm's users logged out first), the results so far were written.";

const STORM_EXAMPLES: &str = "\
30 users without then with ccfs, two timed runs a mode in ABBA order, the CPU of the \
file server's processes measured, results as JSON:

```
loadgen login-storm --share /mnt/gluster/storm --users 30 --compare --repeat 2 \\
    --server-pids-file /run/gluster.pids --json storm.json
```

Returning users, whose workstations hold what an earlier session left:

```
loadgen login-storm --share /mnt/gluster/storm --users 30 --compare --returning-users
```";

/// The sections, each on its page.
pub(crate) fn sections() -> Vec<Section> {
    let on = |page, title, text: &str| Section {
        page,
        title,
        text: text.to_string(),
    };
    let mut all = vec![
        on("loadgen", "EXAMPLES", EXAMPLES),
        on("loadgen-login-storm", "EXAMPLES", STORM_EXAMPLES),
    ];
    for page in [
        "loadgen",
        "loadgen-compilebench",
        "loadgen-sweep",
        "loadgen-stream",
        "loadgen-access",
        "loadgen-login-storm",
        "loadgen-report",
    ] {
        all.push(on(page, "EXIT STATUS", EXIT_STATUS));
    }
    all
}

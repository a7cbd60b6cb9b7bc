//! A class across hosts (`login-storm --hosts`): one `loadgen storm-agent` a host, started
//! over SSH for each run, plays its part of the class on its own share client (and, with
//! ccfs, its own ccfs mounts); the coordinator holds every host at the run's gates (all
//! prepared, then all go; every session over before any logout; every logout over), reads
//! the server's counters and CPU there, and merges the hosts' results into one report with
//! each host's part beside it.
//!
//! The protocol, a JSON object a line from the agent (other lines, a login banner, are
//! passed over) and a word a line to it: `ping` -> `{"pong": NS}` (the agent's clock) five
//! times, then `run`; at each gate `{"gate": "start"|"sessions"|"logouts"}` -> `go` (or
//! `stop`); at the end `{"result": ...}` ([`AgentResult`]).

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin};
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{
    cpu_seconds, read_server_counts, sleep_until, HostPart, RunSpec, ServerCounts, StormConfig,
    StormReport, Summary,
};
use crate::engine::Latencies;
use crate::report::latency_report;

/// What an agent sends.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentLine {
    Pong(u64),
    Gate(String),
    Result(Box<AgentResult>),
}

/// A host's part of one run, as its agent sends it.
#[derive(Debug, Serialize, Deserialize)]
pub struct AgentResult {
    pub report: StormReport,
    /// When the agent let its users go, on its clock (nanoseconds since it started).
    pub go_ns: u64,
    pub login_latencies: Vec<(String, Vec<(u64, u64)>)>,
    pub session_latencies: Vec<(String, Vec<(u64, u64)>)>,
}

/// The gate names on the wire.
pub fn gate_word(g: super::Gate) -> &'static str {
    match g {
        super::Gate::Start => "start",
        super::Gate::SessionsDone => "sessions",
        super::Gate::LogoutsDone => "logouts",
    }
}

/// How the coordinator reaches the hosts.
#[derive(Debug, Clone)]
pub struct Hosts {
    pub names: Vec<String>,
    /// The launcher and its options (`ssh -o BatchMode=yes`); the host and the agent's
    /// command follow.
    pub ssh: Vec<String>,
    pub remote_loadgen: String,
    /// The agent's options that are the same on every host and in every run (the share,
    /// the session, the profile, ...).
    pub agent_args: Vec<String>,
}

/// How many of `class` users host `k` of `hosts` plays (the first hosts one more when the
/// class does not divide), and the number of its first user.
pub fn share_of_class(class: usize, hosts: usize, k: usize) -> (usize, usize) {
    let (each, extra) = (class / hosts, class % hosts);
    let users = each + usize::from(k < extra);
    let first = k * each + k.min(extra);
    (first, users)
}

struct Agent {
    host: String,
    first_user: usize,
    users: usize,
    child: Child,
    stdin: ChildStdin,
}

impl Agent {
    fn say(&mut self, word: &str) {
        crate::remote::tell(&mut self.stdin, word);
    }
}

/// The agents of one run and what they say, an agent's number with each line.
struct Crew {
    agents: Vec<Agent>,
    rx: Receiver<(usize, Result<AgentLine, String>)>,
    /// Interrupted: every agent was told to stop, and is not answered at its gates any
    /// more (it goes through them on its own, logging its users out).
    stopping: bool,
}

/// The longest a gate waits for every host (a login, a session, a logout of a class).
const GATE_WAIT: Duration = Duration::from_secs(3600);

impl Crew {
    fn start(hosts: &Hosts, class: usize, run_args: &[String]) -> Result<Crew, String> {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut agents = Vec::new();
        for (k, host) in hosts.names.iter().enumerate() {
            let (first_user, users) = share_of_class(class, hosts.names.len(), k);
            let mut parts = vec![hosts.remote_loadgen.clone(), "storm-agent".to_string()];
            parts.extend(hosts.agent_args.iter().cloned());
            parts.extend(run_args.iter().cloned());
            parts.extend([
                "--host-name".to_string(),
                host.clone(),
                "--users".to_string(),
                users.to_string(),
                "--user-base".to_string(),
                first_user.to_string(),
            ]);
            let (child, stdin, stdout) = crate::remote::spawn_on(&hosts.ssh, host, &parts)?;
            listen(k, host.clone(), stdout, tx.clone());
            agents.push(Agent {
                host: host.clone(),
                first_user,
                users,
                child,
                stdin,
            });
        }
        Ok(Crew {
            agents,
            rx,
            stopping: false,
        })
    }

    fn say_all(&mut self, word: &str) {
        for a in &mut self.agents {
            a.say(word);
        }
    }

    /// Lets every agent through its gate, unless the class is stopping.
    fn go_on(&mut self) {
        if !self.stopping {
            self.say_all("go");
        }
    }

    /// On an interrupt, tells every agent once to stop.
    fn heed_interrupt(&mut self) {
        if super::interrupted() && !self.stopping {
            self.say_all("stop");
            self.stopping = true;
        }
    }

    /// Waits for a line of every agent that `want` takes (`Some`), in any order.
    fn hear_all<T>(
        &mut self,
        what: &str,
        mut want: impl FnMut(AgentLine) -> Result<T, AgentLine>,
    ) -> Result<Vec<T>, String> {
        let mut got: Vec<Option<T>> = (0..self.agents.len()).map(|_| None).collect();
        let deadline = Instant::now() + GATE_WAIT;
        while got.iter().any(Option::is_none) {
            if Instant::now() > deadline {
                return Err(format!(
                    "the hosts did not {what} within {} s",
                    GATE_WAIT.as_secs()
                ));
            }
            self.heed_interrupt();
            let Ok((k, line)) = self.rx.recv_timeout(Duration::from_millis(200)) else {
                continue;
            };
            let host = &self.agents[k].host;
            // An agent that said what was wanted may end before the others have.
            if line.is_err() && got[k].is_some() {
                continue;
            }
            match line.map(&mut want) {
                Ok(Ok(v)) => got[k] = Some(v),
                Ok(Err(other)) => {
                    return Err(format!("{host}: expected to {what}, got {other:?}"));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(got.into_iter().flatten().collect())
    }

    /// Every agent told to stop, and waited for.
    fn end(mut self) {
        self.say_all("stop");
        for mut a in self.agents {
            drop(a.stdin);
            let _ = a.child.wait();
        }
    }
}

/// Reads an agent's stdout on a thread of its own: each protocol line goes to `tx`; the
/// end of its output as an error naming the host.
fn listen(
    k: usize,
    host: String,
    stdout: std::process::ChildStdout,
    tx: Sender<(usize, Result<AgentLine, String>)>,
) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = tx.send((k, Err(format!("{host}: the storm agent ended"))));
                    return;
                }
                Ok(_) => {
                    if let Ok(msg) = serde_json::from_str::<AgentLine>(line.trim()) {
                        if tx.send((k, Ok(msg))).is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
}

/// Each agent's clock against ours: five pings, the shortest round trip kept; the
/// offset (theirs minus ours, nanoseconds since `origin`).
fn clock_offsets(crew: &mut Crew, origin: Instant) -> Result<Vec<i128>, String> {
    let mut best: Vec<(i128, u128)> = vec![(0, u128::MAX); crew.agents.len()];
    for _ in 0..5 {
        let sent = origin.elapsed().as_nanos();
        crew.say_all("ping");
        let pongs = crew.hear_all("answer a ping", |l| match l {
            AgentLine::Pong(ns) => Ok((ns, origin.elapsed().as_nanos())),
            other => Err(other),
        })?;
        for (k, (theirs, back)) in pongs.into_iter().enumerate() {
            let rtt = back.saturating_sub(sent);
            if rtt < best[k].1 {
                best[k] = (i128::from(theirs) - (back - rtt / 2) as i128, rtt);
            }
        }
    }
    Ok(best.into_iter().map(|b| b.0).collect())
}

/// One run of the class across the hosts: the agents started, held at each gate
/// together, the server read there, and their parts merged.
pub fn run_across(
    cfg: &StormConfig,
    hosts: &Hosts,
    spec: RunSpec,
    index: usize,
    run_args: &[String],
) -> Result<StormReport, String> {
    let origin = Instant::now();
    let mut crew = Crew::start(hosts, cfg.users, run_args)?;
    let outcome = conduct_across(cfg, &mut crew, spec, origin);
    let firsts: Vec<(String, usize, usize)> = crew
        .agents
        .iter()
        .map(|a| (a.host.clone(), a.first_user, a.users))
        .collect();
    crew.end();
    let (offsets, results, server, cpu) = outcome?;
    Ok(merge(
        cfg, spec, index, &firsts, &offsets, results, server, cpu,
    ))
}

/// The hosts' clock offsets and results, with what the coordinator read at the gates:
/// the server's counters (start, sessions' end, logouts' end) and the server's CPU over
/// the window with the window.
type Across = (
    Vec<i128>,
    Vec<AgentResult>,
    [Option<ServerCounts>; 3],
    Option<(f64, f64)>,
);

/// The coordinator's part of a run across hosts: the clocks, then every gate.
fn conduct_across(
    cfg: &StormConfig,
    crew: &mut Crew,
    spec: RunSpec,
    origin: Instant,
) -> Result<Across, String> {
    let offsets = clock_offsets(crew, origin)?;
    crew.say_all("run");
    let gate = |crew: &mut Crew, word: &str| {
        crew.hear_all(&format!("reach the {word} gate"), |l| match l {
            AgentLine::Gate(g) if g == word => Ok(()),
            other => Err(other),
        })
    };
    let server = |i: usize, reads: &mut [Option<ServerCounts>; 3]| -> Result<(), String> {
        if let Some(cmd) = &cfg.server_counts {
            reads[i] = Some(read_server_counts(cmd)?);
        }
        Ok(())
    };
    let mut reads: [Option<ServerCounts>; 3] = Default::default();
    gate(crew, "start")?;
    server(0, &mut reads)?;
    let cpu0 = cpu_seconds(&cfg.server_pids);
    crew.go_on();
    let t0 = Instant::now();
    gate(crew, "sessions")?;
    server(1, &mut reads)?;
    crew.go_on();
    gate(crew, "logouts")?;
    server(2, &mut reads)?;
    crew.go_on();
    let measure = !spec.metered && !cfg.server_pids.is_empty();
    let cpu = if measure {
        if let Some(w) = cfg.cpu_window {
            sleep_until(t0 + w);
        }
        Some((
            cpu_seconds(&cfg.server_pids) - cpu0,
            t0.elapsed().as_secs_f64(),
        ))
    } else {
        None
    };
    let results = crew.hear_all("send its results", |l| match l {
        AgentLine::Result(r) => Ok(*r),
        other => Err(other),
    })?;
    Ok((offsets, results, reads, cpu))
}

/// The class's report from its hosts' parts (`firsts`: each host, its first user and
/// its users), the server's reads and the CPU.
#[allow(clippy::too_many_arguments)]
fn merge(
    cfg: &StormConfig,
    spec: RunSpec,
    index: usize,
    firsts: &[(String, usize, usize)],
    offsets: &[i128],
    results: Vec<AgentResult>,
    server: [Option<ServerCounts>; 3],
    cpu: Option<(f64, f64)>,
) -> StormReport {
    let go_on_ours: Vec<i128> = results
        .iter()
        .zip(offsets)
        .map(|(r, off)| i128::from(r.go_ns) - off)
        .collect();
    let first_go = go_on_ours.iter().copied().min().unwrap_or(0);
    let mut login = Latencies::new();
    let mut session = Latencies::new();
    let mut per_user = Vec::new();
    let mut parts = Vec::new();
    let mut share: [Option<super::ShareCounts>; 3] = Default::default();
    let mut client_cpu: Option<f64> = None;
    let mut ccfs_cpu: Option<f64> = None;
    let mut error = None;
    for (k, r) in results.iter().enumerate() {
        login.merge(&Latencies::from_wire(&r.login_latencies));
        session.merge(&Latencies::from_wire(&r.session_latencies));
        let shift = (go_on_ours[k] - first_go) as f64 / 1e9;
        for u in &r.report.per_user {
            let mut u = u.clone();
            u.start_s += shift;
            per_user.push(u);
        }
        let mine = [
            &r.report.share_login,
            &r.report.share_session,
            &r.report.share_logout,
        ];
        for (sum, part) in share.iter_mut().zip(mine) {
            if let Some(p) = part {
                sum.get_or_insert_with(Default::default).add(p);
            }
        }
        if let Some(c) = r.report.client_cpu_s {
            *client_cpu.get_or_insert(0.0) += c;
        }
        if let Some(c) = r.report.ccfs_cpu_s {
            *ccfs_cpu.get_or_insert(0.0) += c;
        }
        if error.is_none() {
            error = r
                .report
                .error
                .as_ref()
                .map(|e| format!("{}: {e}", firsts[k].0));
        }
        parts.push(HostPart {
            host: firsts[k].0.clone(),
            first_user: firsts[k].1,
            users: firsts[k].2,
            time_to_login: r.report.time_to_login.clone(),
            logout: r.report.logout.clone(),
            share_whole: r.report.share_whole(),
            client_cpu_s: r.report.client_cpu_s,
            start_offset_ms: shift * 1000.0,
            error: r.report.error.clone(),
        });
    }
    per_user.sort_by_key(|u| u.user);
    let of =
        |f: fn(&super::UserResult) -> f64| Summary::of(&per_user.iter().map(f).collect::<Vec<_>>());
    let delta = |a: &Option<ServerCounts>, b: &Option<ServerCounts>| match (a, b) {
        (Some(a), Some(b)) => Some(b.minus(a)),
        _ => None,
    };
    let base = results.first().map(|r| &r.report);
    let [share_login, share_session, share_logout] = share;
    StormReport {
        schema: super::SCHEMA.into(),
        tool: "loadgen".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        started_at_unix: super::now_unix(),
        label: cfg.label.clone(),
        share: cfg.share.display().to_string(),
        environment: base.map(|b| b.environment.clone()).unwrap_or_else(|| {
            crate::report::Environment::probe(&crate::store::Target::Local(cfg.share.clone()))
        }),
        users: per_user.len(),
        with_ccfs: spec.with_ccfs,
        metered: spec.metered,
        run_index: index,
        mode_run: 0,
        baseline: cfg.baseline,
        session_s: cfg.session.as_secs_f64(),
        profile: cfg.profile_name.clone(),
        returning_users: cfg.returning_users,
        settled: base.map(|b| b.settled.clone()).unwrap_or_default(),
        time_to_login: of(|u| u.login_s),
        logout: of(|u| u.logout_s),
        login_plus_logout: of(|u| u.login_s + u.logout_s),
        complete: error.is_none() && per_user.len() == cfg.users,
        error,
        latency_login: latency_report(&login),
        latency_session: latency_report(&session),
        latencies_raw: Some((login, session)),
        share_login,
        share_session,
        share_logout,
        server_login_session: delta(&server[0], &server[1]),
        server_logout: delta(&server[1], &server[2]),
        server_cpu_s: cpu.map(|c| c.0),
        client_cpu_s: client_cpu,
        ccfs_cpu_s: ccfs_cpu,
        cpu_window_s: cpu.map(|c| c.1),
        per_user,
        hosts: parts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_is_shared_out_evenly_the_first_hosts_taking_the_rest() {
        let parts: Vec<(usize, usize)> = (0..3).map(|k| share_of_class(10, 3, k)).collect();
        assert_eq!(parts, [(0, 4), (4, 3), (7, 3)]);
        assert_eq!(share_of_class(6, 3, 2), (4, 2));
        assert_eq!(
            share_of_class(2, 3, 2),
            (2, 0),
            "more hosts than users: none left"
        );
    }
}

//! Multi-host runs: one `loadgen agent` per host (started over SSH by default), each
//! running its clients with the engine; every phase starts on all hosts together.
//!
//! Protocol, one JSON object a line. Agent to coordinator: `{"ready":I}` once its clients
//! prepared phase I, then `{"result":PHASE}` when the phase ends, and `{"pong":NS}` (its
//! clock) for every `ping`; coordinator to agent: `ping`, `go` (start phase I) or `stop`.
//! Latency histograms travel as their recorded values, so the merged percentiles are
//! exact. Clients' times travel on the agent's clock and are put on the coordinator's with
//! the offset its pings measured (the best of five: within half a round trip).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::engine::{ClientResult, Latencies, PhaseResult};
use crate::locks::Locked;
use crate::workload::Round;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientWire {
    pub client: usize,
    pub bytes: u64,
    pub files: u64,
    /// On the agent's clock (nanoseconds since the agent started).
    pub start_ns: u64,
    pub end_ns: u64,
    #[serde(default)]
    pub dirs: u64,
    pub error: Option<String>,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseWire {
    pub phase: String,
    pub tree: u32,
    pub clients: Vec<ClientWire>,
    /// The host's histograms, as their recorded values.
    pub latencies: Vec<(String, Vec<(u64, u64)>)>,
    /// Whether the agent dropped its host's caches as asked (None: not asked).
    #[serde(default)]
    pub caches_dropped: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentMsg {
    Ready(usize),
    Result(PhaseWire),
    Pong(u64),
}

/// Whether this agent dropped its host's caches as asked: 0 not asked, 1 dropped, 2 not
/// (not root there).
static AGENT_DROPPED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The agent notes whether it could drop its host's caches, as it was asked to.
pub fn agent_caches_dropped(dropped: bool) {
    AGENT_DROPPED.store(if dropped { 1 } else { 2 }, Ordering::Relaxed);
}

/// The agent's clock: nanoseconds since it started.
static AGENT_EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn agent_now_ns() -> u64 {
    AGENT_EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn agent_ns(t: Instant) -> u64 {
    t.saturating_duration_since(*AGENT_EPOCH.get_or_init(Instant::now))
        .as_nanos() as u64
}

pub fn to_wire(p: &PhaseResult) -> PhaseWire {
    PhaseWire {
        phase: p.phase.name().to_string(),
        tree: p.tree,
        latencies: p.latencies.to_wire(),
        caches_dropped: match AGENT_DROPPED.load(Ordering::Relaxed) {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        },
        clients: p
            .clients
            .iter()
            .map(|c| ClientWire {
                client: c.client,
                bytes: c.bytes,
                files: c.files,
                dirs: c.dirs,
                start_ns: p.released.map(|r| agent_ns(r + c.start)).unwrap_or(0),
                end_ns: p.released.map(|r| agent_ns(r + c.end)).unwrap_or(0),
                error: c.error.clone(),
                warnings: c.warnings.clone(),
            })
            .collect(),
    }
}

/// An agent's clients, their times put on the coordinator's clock (nanoseconds since its
/// origin) with the agent's measured offset.
fn from_wire(w: &PhaseWire, offset_ns: i128) -> Vec<ClientResult> {
    let on_ours = |ns: u64| Duration::from_nanos((i128::from(ns) - offset_ns).max(0) as u64);
    w.clients
        .iter()
        .map(|c| ClientResult {
            client: c.client,
            bytes: c.bytes,
            files: c.files,
            dirs: c.dirs,
            start: on_ours(c.start_ns),
            end: on_ours(c.end_ns),
            error: c.error.clone(),
            warnings: c.warnings.clone(),
        })
        .collect()
}

/// What the coordinator said, as the agent's stdin reader passes it on.
static GO: std::sync::Mutex<Option<std::sync::mpsc::Receiver<bool>>> = std::sync::Mutex::new(None);

/// The agent's side of the protocol on stdin: a thread reads it, passes each `go` to the
/// gate, and on `stop` or the end of stdin (the coordinator went away) sets the run's
/// stop flag, so that the clients stop at their next unit and the agent cleans up and
/// ends instead of running on.
pub fn agent_listen(stop: &'static std::sync::atomic::AtomicBool) {
    AGENT_EPOCH.get_or_init(Instant::now);
    let (tx, rx) = std::sync::mpsc::channel();
    *GO.locked() = Some(rx);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            line.clear();
            match stdin.lock().read_line(&mut line) {
                Ok(n) if n > 0 && line.trim() == "go" => {
                    let _ = tx.send(true);
                }
                Ok(n) if n > 0 && line.trim() == "ping" => {
                    let pong = AgentMsg::Pong(agent_now_ns());
                    if let Ok(msg) = serde_json::to_string(&pong) {
                        let mut out = std::io::stdout().lock();
                        let _ = writeln!(out, "{msg}").and_then(|()| out.flush());
                    }
                }
                Ok(n) if n > 0 && line.trim() != "stop" => {}
                _ => {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    let _ = tx.send(false);
                    return;
                }
            }
        }
    });
}

/// The agent side of the gate: say ready, wait for `go`.
pub fn agent_gate(phase: usize) -> bool {
    let msg = serde_json::to_string(&AgentMsg::Ready(phase)).unwrap_or_default();
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{msg}").and_then(|()| out.flush()).is_err() {
        return false;
    }
    drop(out);
    let go = GO.locked();
    match go.as_ref() {
        Some(rx) => rx.recv().unwrap_or(false),
        None => false,
    }
}

/// The agent side of a finished phase.
pub fn agent_report(p: &PhaseResult) {
    if let Ok(msg) = serde_json::to_string(&AgentMsg::Result(to_wire(p))) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{msg}").and_then(|()| out.flush());
    }
}

struct Agent {
    host: String,
    child: Child,
    stdin: ChildStdin,
}

impl Agent {
    fn send(&mut self, word: &str) {
        tell(&mut self.stdin, word);
    }
}

/// One word of the protocol to an agent, a line of its own, sent at once (an agent gone
/// is found by its output's end, not here).
pub fn tell(stdin: &mut ChildStdin, word: &str) {
    let _ = writeln!(stdin, "{word}").and_then(|()| stdin.flush());
}

/// Reads an agent's stdout on a thread of its own: each protocol line (anything else, a
/// login banner, is passed over) goes to `tx` with the agent's number; the end of its
/// output as an error.
fn read_agent(
    k: usize,
    host: String,
    stdout: ChildStdout,
    tx: Sender<(usize, Result<AgentMsg, String>)>,
) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) => {
                    let _ = tx.send((k, Err(format!("{host}: the agent ended"))));
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    let _ = tx.send((k, Err(format!("{host}: {e}"))));
                    return;
                }
            }
            if let Ok(m) = serde_json::from_str::<AgentMsg>(line.trim()) {
                if tx.send((k, Ok(m))).is_err() {
                    return;
                }
            }
        }
    });
}

/// How to reach the hosts.
#[derive(Debug, Clone)]
pub struct Hosts {
    pub names: Vec<String>,
    /// The launcher and its options; the host name and the agent command follow.
    pub ssh: Vec<String>,
    /// loadgen's path on the hosts.
    pub remote_loadgen: String,
    pub clients_per_host: usize,
}

/// What came from an agent before the others had sent theirs (its next round's ready,
/// or its end after its last result), kept for the next [`from_all`].
type Early = Vec<VecDeque<Result<AgentMsg, String>>>;

/// Waits for one message from every agent, each checked by `want`; fails naming the host
/// that did not answer within `timeout`, or when `stop` is set.
fn from_all(
    agents: &[Agent],
    rx: &Receiver<(usize, Result<AgentMsg, String>)>,
    early: &mut Early,
    timeout: Duration,
    stop: &AtomicBool,
    what: &str,
    mut want: impl FnMut(usize, &AgentMsg) -> Result<Take, String>,
) -> Result<(), String> {
    let start = Instant::now();
    let mut got = vec![false; agents.len()];
    // What is not for this wait goes back to `early`, each agent's in its order.
    let mut kept: Early = vec![VecDeque::new(); agents.len()];
    let mut offer = |k: usize,
                     m: Result<AgentMsg, String>,
                     got: &mut Vec<bool>,
                     kept: &mut Early|
     -> Result<(), String> {
        let m = m?;
        if !got[k] && want(k, &m)? == Take::Mine {
            got[k] = true;
        } else {
            kept[k].push_back(Ok(m));
        }
        Ok(())
    };
    for (k, q) in early.iter_mut().enumerate() {
        while let Some(m) = q.pop_front() {
            offer(k, m, &mut got, &mut kept)?;
        }
    }
    let result = (|| {
        while got.iter().any(|g| !g) {
            if stop.load(Ordering::Relaxed) {
                return Err("interrupted".to_string());
            }
            match rx.recv_timeout(Duration::from_millis(100)) {
                // An agent's end after it answered this wait is for the next one.
                Ok((k, Err(e))) if got[k] => kept[k].push_back(Err(e)),
                Ok((k, m)) => offer(k, m, &mut got, &mut kept)?,
                Err(RecvTimeoutError::Timeout) => {
                    if start.elapsed() > timeout {
                        let late: Vec<&str> = agents
                            .iter()
                            .zip(&got)
                            .filter(|(_, g)| !**g)
                            .map(|(a, _)| a.host.as_str())
                            .collect();
                        return Err(format!(
                            "{} did not {what} within {} s (--phase-timeout)",
                            late.join(", "),
                            timeout.as_secs()
                        ));
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return Err("every agent ended".into()),
            }
        }
        Ok(())
    })();
    *early = kept;
    result
}

/// Whether a message is the one a wait is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Take {
    Mine,
    /// Not this wait's (a ready that came with the pongs): kept for the next.
    Later,
}

/// The coordinator's side of a multi-host run: the agents, what they send, how long a
/// wait may take, and the stop flag.
struct Crew<'a> {
    agents: Vec<Agent>,
    rx: Receiver<(usize, Result<AgentMsg, String>)>,
    early: Early,
    timeout: Duration,
    stop: &'a AtomicBool,
}

impl Crew<'_> {
    /// [`from_all`] over this crew's agents; `want` gets each message with its agent's
    /// number and host.
    fn hear_all(
        &mut self,
        what: &str,
        mut want: impl FnMut(usize, &str, &AgentMsg) -> Result<Take, String>,
    ) -> Result<(), String> {
        let agents = &self.agents;
        from_all(
            agents,
            &self.rx,
            &mut self.early,
            self.timeout,
            self.stop,
            what,
            |k, m| want(k, &agents[k].host, m),
        )
    }

    fn send_all(&mut self, word: &str) {
        for a in self.agents.iter_mut() {
            a.send(word);
        }
    }
}

/// Runs `rounds` on every host at once: each agent gets `agent_args` (the workload
/// options, from which it makes the same rounds) and the number of its first client.
/// Calls `on_phase` with the merged result of each round. A host that does not answer
/// within `timeout` (a round's deadline) ends the run with its name; `stop` (a signal)
/// ends it too. Either way every agent is told to stop (it then cleans up and ends).
pub fn run(
    hosts: &Hosts,
    rounds: &[Round],
    agent_args: &[String],
    timeout: Duration,
    stop: &AtomicBool,
    mut on_phase: impl FnMut(&PhaseResult),
) -> Result<Vec<PhaseResult>, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let agents = start_agents(hosts, agent_args, &tx)?;
    drop(tx);
    let mut crew = Crew {
        early: vec![VecDeque::new(); agents.len()],
        agents,
        rx,
        timeout,
        stop,
    };
    let mut results = Vec::new();
    let outcome = clock_offsets(&mut crew).and_then(|offsets| {
        for (i, round) in rounds.iter().enumerate() {
            let pr = play_round(&mut crew, i, round, &offsets)?;
            on_phase(&pr);
            let failed = pr.error().is_some();
            results.push(pr);
            if failed {
                return Ok(());
            }
        }
        Ok(())
    });
    stop_agents(crew);
    match outcome {
        Err(e) if e == "interrupted" => Ok(results),
        other => other.map(|()| results),
    }
}

/// The command a launcher runs on a host, as one word of the remote shell's: each part
/// quoted (ssh hands its command to the host's shell, which would otherwise split a
/// `--remount` of several words, or run what follows a `;` or a `>` in it).
pub fn remote_command<S: AsRef<str>>(parts: &[S]) -> String {
    parts
        .iter()
        .map(|p| format!("'{}'", p.as_ref().replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Starts `parts` on `host` through the launcher `ssh` (its program and options), with
/// pipes to its standard input and output; its standard error is ours.
pub fn spawn_on(
    ssh: &[String],
    host: &str,
    parts: &[String],
) -> Result<(Child, ChildStdin, ChildStdout), String> {
    let (prog, pre) = ssh
        .split_first()
        .ok_or_else(|| "--ssh-command is empty".to_string())?;
    let mut child = Command::new(prog)
        .args(pre)
        .arg(host)
        .arg(remote_command(parts))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {prog} for {host}: {e}"))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(format!("{host}: no pipes to the agent"));
    };
    Ok((child, stdin, stdout))
}

/// Seconds a host has to answer the check before the run.
const HOST_CHECK_SECS: u64 = 30;

/// Checks, before anything runs, that loadgen runs on every host (`loadgen --version`
/// through the launcher, all hosts at once); the hosts that did not, each with what the
/// launcher said.
pub fn check_hosts(hosts: &Hosts) -> Result<(), String> {
    let Some((prog, pre)) = hosts.ssh.split_first() else {
        return Err("--ssh-command is empty".to_string());
    };
    let failed: Vec<String> = std::thread::scope(|s| {
        let checks: Vec<_> = hosts
            .names
            .iter()
            .map(|host| {
                s.spawn(move || {
                    let mut cmd = Command::new(prog);
                    cmd.args(pre).arg(host).arg(remote_command(&[
                        hosts.remote_loadgen.as_str(),
                        "--version",
                    ]));
                    answer_within(cmd, Duration::from_secs(HOST_CHECK_SECS))
                        .err()
                        .map(|why| format!("{host}: {why}"))
                })
            })
            .collect();
        checks
            .into_iter()
            .filter_map(|c| c.join().unwrap_or_else(|_| Some("a check panicked".into())))
            .collect()
    });
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// Runs `cmd` and waits at most `limit` for it to succeed; why not, with the last line
/// it wrote on stderr.
fn answer_within(mut cmd: Command, limit: Duration) -> Result<(), String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the launcher: {e}"))?;
    // Read as it comes: a launcher saying much would otherwise wait on a full pipe.
    let said = child.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut e, &mut text);
            text
        })
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} s", limit.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(e.to_string()),
        }
    };
    if status.success() {
        return Ok(());
    }
    let err = said.and_then(|t| t.join().ok()).unwrap_or_default();
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    Err(match status.code() {
        Some(c) => format!(
            "{} (exit {c})",
            if last.is_empty() {
                "failed"
            } else {
                last.trim()
            }
        ),
        None => "killed by a signal".to_string(),
    })
}

/// Starts an agent on every host (through the launcher), each reading its stdout on a
/// thread of its own into `tx`.
fn start_agents(
    hosts: &Hosts,
    agent_args: &[String],
    tx: &Sender<(usize, Result<AgentMsg, String>)>,
) -> Result<Vec<Agent>, String> {
    let mut agents = Vec::new();
    for (k, host) in hosts.names.iter().enumerate() {
        let mut parts = vec![hosts.remote_loadgen.clone(), "agent".to_string()];
        parts.extend(agent_args.iter().cloned());
        parts.extend([
            "--clients".to_string(),
            hosts.clients_per_host.to_string(),
            "--client-base".to_string(),
            (k * hosts.clients_per_host).to_string(),
        ]);
        let (child, stdin, stdout) = spawn_on(&hosts.ssh, host, &parts)?;
        read_agent(k, host.clone(), stdout, tx.clone());
        agents.push(Agent {
            host: host.clone(),
            child,
            stdin,
        });
    }
    Ok(agents)
}

/// Each agent's clock against ours: five pings, the shortest round trip kept. Returns,
/// an agent each, its clock's offset (nanoseconds) and that round trip.
fn clock_offsets(crew: &mut Crew) -> Result<Vec<(i128, u64)>, String> {
    let origin = Instant::now();
    let mut offsets: Vec<(i128, u64)> = vec![(0, u64::MAX); crew.agents.len()];
    for _ in 0..5 {
        let sent = origin.elapsed().as_nanos();
        crew.send_all("ping");
        crew.hear_all("answer a ping", |k, _, m| match m {
            AgentMsg::Pong(theirs) => {
                let back = origin.elapsed().as_nanos();
                let rtt = back.saturating_sub(sent);
                let mid = (back - rtt / 2) as i128;
                if (rtt as u64) < offsets[k].1 {
                    offsets[k] = (i128::from(*theirs) - mid, rtt as u64);
                }
                Ok(Take::Mine)
            }
            _ => Ok(Take::Later),
        })?;
    }
    Ok(offsets)
}

/// Round `i` on every host: each gets ready, all go at once (the cross-host barrier),
/// and their results are merged on the coordinator's clock.
fn play_round(
    crew: &mut Crew,
    i: usize,
    round: &Round,
    offsets: &[(i128, u64)],
) -> Result<PhaseResult, String> {
    let phase = round.timed.phase;
    // Preparing can take as long as a round.
    crew.hear_all("get ready", |_, host, m| match m {
        AgentMsg::Ready(n) if *n == i => Ok(Take::Mine),
        other => Err(format!("{}: expected ready {i}, got {other:?}", host)),
    })?;
    // The cross-host barrier: every host prepared, all start now.
    crew.send_all("go");
    let mut clients = Vec::new();
    let mut latencies = Latencies::new();
    let mut not_dropped = Vec::new();
    crew.hear_all("finish the round", |k, host, m| match m {
        AgentMsg::Result(w) if w.phase == phase.name() && w.tree == round.timed.tree => {
            clients.extend(from_wire(w, offsets[k].0));
            latencies.merge(&Latencies::from_wire(&w.latencies));
            if w.caches_dropped == Some(false) {
                not_dropped.push(host.to_string());
            }
            Ok(Take::Mine)
        }
        other => Err(format!(
            "{}: expected the {} result, got {other:?}",
            host,
            phase.name()
        )),
    })?;
    clients.sort_by_key(|c| c.client);
    // From the first client's start, on the coordinator's clock.
    let first = clients.iter().map(|c| c.start).min().unwrap_or_default();
    for c in clients.iter_mut() {
        c.start -= first;
        c.end = c.end.saturating_sub(first);
    }
    let mut pr = PhaseResult::new(phase, round.timed.tree, clients, latencies);
    pr.caches_not_dropped = not_dropped;
    Ok(pr)
}

/// Tells every agent to stop; agents clean up, then end; one that does not within the
/// timeout is ended here.
fn stop_agents(mut crew: Crew) {
    crew.send_all("stop");
    let start = Instant::now();
    for mut a in crew.agents {
        drop(a.stdin);
        loop {
            match a.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if start.elapsed() > crew.timeout => {
                    let _ = a.child.kill();
                    let _ = a.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_command_reaches_the_host_s_shell_word_for_word() {
        let parts = ["printf", "%s|", "two words", "it's", "a;b >c", "$HOME"];
        let line = remote_command(&parts);
        let o = std::process::Command::new("sh")
            .args(["-c", &line])
            .output()
            .expect("sh");
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "two words|it's|a;b >c|$HOME|"
        );
    }
}

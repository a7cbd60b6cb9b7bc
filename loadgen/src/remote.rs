//! Multi-host runs: one `loadgen agent` per host (started over SSH by default), each
//! running its clients with the engine; every phase starts on all hosts together.
//!
//! Protocol, one JSON object a line. Agent to coordinator: `{"ready":I}` once its clients
//! prepared phase I, then `{"result":PHASE}` when the phase ends; coordinator to agent:
//! `go` (start phase I) or `stop`. Latency histograms travel as their recorded values, so
//! the merged percentiles are exact.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::engine::{ClientResult, Latencies, PhaseResult};
use crate::workload::Round;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientWire {
    pub client: usize,
    pub bytes: u64,
    pub files: u64,
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
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentMsg {
    Ready(usize),
    Result(PhaseWire),
}

pub fn to_wire(p: &PhaseResult) -> PhaseWire {
    PhaseWire {
        phase: p.phase.name().to_string(),
        tree: p.tree,
        latencies: p.latencies.to_wire(),
        clients: p
            .clients
            .iter()
            .map(|c| ClientWire {
                client: c.client,
                bytes: c.bytes,
                files: c.files,
                dirs: c.dirs,
                start_ns: c.start.as_nanos() as u64,
                end_ns: c.end.as_nanos() as u64,
                error: c.error.clone(),
                warnings: c.warnings.clone(),
            })
            .collect(),
    }
}

fn from_wire(w: &PhaseWire) -> Vec<ClientResult> {
    w.clients
        .iter()
        .map(|c| ClientResult {
            client: c.client,
            bytes: c.bytes,
            files: c.files,
            dirs: c.dirs,
            start: Duration::from_nanos(c.start_ns),
            end: Duration::from_nanos(c.end_ns),
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
    let (tx, rx) = std::sync::mpsc::channel();
    *GO.lock().unwrap_or_else(|p| p.into_inner()) = Some(rx);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            line.clear();
            match stdin.lock().read_line(&mut line) {
                Ok(n) if n > 0 && line.trim() == "go" => {
                    let _ = tx.send(true);
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
    let go = GO.lock().unwrap_or_else(|p| p.into_inner());
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
        let _ = writeln!(self.stdin, "{word}").and_then(|()| self.stdin.flush());
    }
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

/// Waits for one message from every agent, each checked by `want`; fails naming the host
/// that did not answer within `timeout`, or when `stop` is set.
/// What came from an agent before the others had sent theirs (its next round's ready,
/// or its end after its last result), kept for the next [`from_all`].
type Early = Vec<VecDeque<Result<AgentMsg, String>>>;

fn from_all(
    agents: &[Agent],
    rx: &Receiver<(usize, Result<AgentMsg, String>)>,
    early: &mut Early,
    timeout: Duration,
    stop: &AtomicBool,
    what: &str,
    mut want: impl FnMut(usize, AgentMsg) -> Result<(), String>,
) -> Result<(), String> {
    let start = Instant::now();
    let mut got = vec![false; agents.len()];
    for (k, q) in early.iter_mut().enumerate() {
        if let Some(m) = q.pop_front() {
            want(k, m?)?;
            got[k] = true;
        }
    }
    while got.iter().any(|g| !g) {
        if stop.load(Ordering::Relaxed) {
            return Err("interrupted".into());
        }
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((k, m)) if got[k] => early[k].push_back(m),
            Ok((k, Ok(m))) => {
                want(k, m)?;
                got[k] = true;
            }
            Ok((_, Err(e))) => return Err(e),
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
    let mut agents = Vec::new();
    let (tx, rx) = std::sync::mpsc::channel();
    for (k, host) in hosts.names.iter().enumerate() {
        let (prog, pre) = hosts
            .ssh
            .split_first()
            .ok_or_else(|| "--ssh-command is empty".to_string())?;
        let mut cmd = Command::new(prog);
        cmd.args(pre)
            .arg(host)
            .arg(&hosts.remote_loadgen)
            .arg("agent")
            .args(agent_args)
            .arg("--clients")
            .arg(hosts.clients_per_host.to_string())
            .arg("--client-base")
            .arg((k * hosts.clients_per_host).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {prog} for {host}: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(format!("{host}: no pipes to the agent"));
        };
        read_agent(k, host.clone(), stdout, tx.clone());
        agents.push(Agent {
            host: host.clone(),
            child,
            stdin,
        });
    }
    drop(tx);
    let mut early: Early = vec![VecDeque::new(); agents.len()];
    let mut results = Vec::new();
    let outcome = (|| -> Result<(), String> {
        for (i, round) in rounds.iter().enumerate() {
            let phase = round.timed.phase;
            // Preparing can take as long as a round.
            from_all(
                &agents,
                &rx,
                &mut early,
                timeout,
                stop,
                "get ready",
                |k, m| match m {
                    AgentMsg::Ready(n) if n == i => Ok(()),
                    other => Err(format!(
                        "{}: expected ready {i}, got {other:?}",
                        agents[k].host
                    )),
                },
            )?;
            // The cross-host barrier: every host prepared, all start now.
            for a in agents.iter_mut() {
                a.send("go");
            }
            let mut clients = Vec::new();
            let mut latencies = Latencies::new();
            from_all(
                &agents,
                &rx,
                &mut early,
                timeout,
                stop,
                "finish the round",
                |k, m| match m {
                    AgentMsg::Result(w)
                        if w.phase == phase.name() && w.tree == round.timed.tree =>
                    {
                        clients.extend(from_wire(&w));
                        latencies.merge(&Latencies::from_wire(&w.latencies));
                        Ok(())
                    }
                    other => Err(format!(
                        "{}: expected the {} result, got {other:?}",
                        agents[k].host,
                        phase.name()
                    )),
                },
            )?;
            clients.sort_by_key(|c| c.client);
            let pr = PhaseResult::new(phase, round.timed.tree, clients, latencies);
            on_phase(&pr);
            let failed = pr.error().is_some();
            results.push(pr);
            if failed {
                return Ok(());
            }
        }
        Ok(())
    })();
    for a in agents.iter_mut() {
        a.send("stop");
    }
    // Agents clean up, then end; one that does not within the timeout is ended here.
    let start = Instant::now();
    for mut a in agents {
        drop(a.stdin);
        loop {
            match a.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if start.elapsed() > timeout => {
                    let _ = a.child.kill();
                    let _ = a.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    match outcome {
        Err(e) if e == "interrupted" => Ok(results),
        other => other.map(|()| results),
    }
}

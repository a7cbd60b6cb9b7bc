//! Multi-host runs: one `loadgen agent` per host (started over SSH by default), each
//! running its clients with the engine; every phase starts on all hosts together.
//!
//! Protocol, one JSON object a line. Agent to coordinator: `{"ready":I}` once its clients
//! prepared phase I, then `{"result":PHASE}` when the phase ends; coordinator to agent:
//! `go` (start phase I) or `stop`. Latency histograms travel as their recorded values, so
//! the merged percentiles are exact.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

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

/// The agent side of the gate: say ready, wait for `go`.
pub fn agent_gate(phase: usize) -> bool {
    let msg = serde_json::to_string(&AgentMsg::Ready(phase)).unwrap_or_default();
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{msg}").and_then(|()| out.flush()).is_err() {
        return false;
    }
    drop(out);
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(n) if n > 0 => line.trim() == "go",
        _ => false,
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
    stdout: BufReader<ChildStdout>,
}

impl Agent {
    fn read(&mut self) -> Result<AgentMsg, String> {
        let mut line = String::new();
        loop {
            line.clear();
            match self.stdout.read_line(&mut line) {
                Ok(0) => return Err(format!("{}: the agent ended", self.host)),
                Ok(_) => {}
                Err(e) => return Err(format!("{}: {e}", self.host)),
            }
            // Anything that is not a protocol line (a login banner) is passed over.
            if let Ok(m) = serde_json::from_str::<AgentMsg>(line.trim()) {
                return Ok(m);
            }
        }
    }

    fn send(&mut self, word: &str) {
        let _ = writeln!(self.stdin, "{word}").and_then(|()| self.stdin.flush());
    }
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

/// Runs `rounds` on every host at once: each agent gets `agent_args` (the workload
/// options, from which it makes the same rounds) and the number of its first client.
/// Calls `on_phase` with the merged result of each round.
pub fn run(
    hosts: &Hosts,
    rounds: &[Round],
    agent_args: &[String],
    mut on_phase: impl FnMut(&PhaseResult),
) -> Result<Vec<PhaseResult>, String> {
    let mut agents = Vec::new();
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
        agents.push(Agent {
            host: host.clone(),
            child,
            stdin,
            stdout: BufReader::new(stdout),
        });
    }
    let mut results = Vec::new();
    let outcome = (|| -> Result<(), String> {
        for (i, round) in rounds.iter().enumerate() {
            let phase = round.timed.phase;
            for a in agents.iter_mut() {
                match a.read()? {
                    AgentMsg::Ready(n) if n == i => {}
                    other => return Err(format!("{}: expected ready {i}, got {other:?}", a.host)),
                }
            }
            // The cross-host barrier: every host prepared, all start now.
            for a in agents.iter_mut() {
                a.send("go");
            }
            let mut clients = Vec::new();
            let mut latencies = Latencies::new();
            for a in agents.iter_mut() {
                match a.read()? {
                    AgentMsg::Result(w)
                        if w.phase == phase.name() && w.tree == round.timed.tree =>
                    {
                        clients.extend(from_wire(&w));
                        latencies.merge(&Latencies::from_wire(&w.latencies));
                    }
                    other => {
                        return Err(format!(
                            "{}: expected the {} result, got {other:?}",
                            a.host,
                            phase.name()
                        ))
                    }
                }
            }
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
    for mut a in agents {
        drop(a.stdin);
        let _ = a.child.wait();
    }
    outcome.map(|()| results)
}

//! The worker pool: a fixed set of threads taking the clients in turn, a unit of work at
//! a time, one pass per round part; owned, so that workers stuck in a call that never
//! returns can be left behind.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::task::{Aligned, Ctx, Cursor, Task, Worker};
use super::{data_buffer, ClientResult, Config, Latencies, Progress};
use crate::locks::{self, Locked};
use crate::workload::Lists;

/// The shared state of the workers.
#[derive(Default)]
pub(super) struct Board {
    pub(super) queue: VecDeque<usize>,
    /// Clients of the current pass not yet done.
    pub(super) remaining: usize,
    pub(super) shutdown: bool,
}

/// The workers' shared state: owned (not borrowed), so that workers stuck in a call that
/// never returns (a hung server) can be left behind when a round's deadline passes.
pub(super) struct Pool {
    pub(super) cfg: Config,
    pub(super) lists: Lists,
    pub(super) tasks: Vec<Mutex<Task>>,
    pub(super) workers: Vec<Mutex<Worker>>,
    pub(super) board: Mutex<Board>,
    pub(super) work: Condvar,
    pub(super) done: Condvar,
    /// The moment the current pass was released.
    pub(super) epoch: Mutex<Instant>,
    /// Set to make every client stop at its next unit (an interrupt).
    pub(super) halt: AtomicBool,
    pub(super) files_done: AtomicU64,
}

/// How a pass ended.
pub(super) struct Pass {
    pub(super) clients: Vec<ClientResult>,
    pub(super) latencies: Latencies,
    pub(super) released: Instant,
    /// The deadline passed with calls still in flight: the pool cannot be used again.
    pub(super) hung: bool,
}

impl Pool {
    pub(super) fn worker(&self, w: usize) {
        loop {
            let id = {
                let mut b = self.board.locked();
                loop {
                    if b.shutdown {
                        return;
                    }
                    if let Some(id) = b.queue.pop_front() {
                        break id;
                    }
                    b = locks::wait(&self.work, b);
                }
            };
            let finished = {
                let mut task = self.tasks[id].locked();
                let mut worker = self.workers[w].locked();
                let epoch = *self.epoch.locked();
                if !task.started {
                    task.started = true;
                    task.result.start = epoch.elapsed();
                }
                let r = if self.halt.load(Ordering::Relaxed) {
                    Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted"))
                } else {
                    let mut ctx = Ctx {
                        cfg: &self.cfg,
                        lists: &self.lists,
                        worker: &mut worker,
                        progress: &self.files_done,
                    };
                    task.unit(&mut ctx)
                };
                let finished = match r {
                    Ok(true) => false,
                    Ok(false) => true,
                    Err(e) => {
                        task.result.error = Some(e.to_string());
                        task.jobs.clear();
                        task.cur = None;
                        true
                    }
                };
                if finished {
                    task.done = true;
                    task.result.end = epoch.elapsed();
                }
                finished
            };
            let mut b = self.board.locked();
            if finished {
                b.remaining -= 1;
                if b.remaining == 0 {
                    self.done.notify_all();
                }
            } else {
                b.queue.push_back(id);
                self.work.notify_one();
            }
        }
    }

    /// Gives every client its jobs and runs them to the end, or until `deadline` (then
    /// the clients still at work are reported as not answering); `stop` makes every
    /// client stop at its next unit. Returns the clients' results and the workers'
    /// histograms (taken, so the next pass starts afresh).
    pub(super) fn pass(
        &self,
        jobs: impl Fn(usize) -> Vec<Cursor>,
        deadline: Option<Duration>,
        stop: &AtomicBool,
        progress: &Progress,
    ) -> Pass {
        let n = self.tasks.len();
        for (id, t) in self.tasks.iter().enumerate() {
            let mut t = t.locked();
            t.jobs = jobs(id).into();
            t.cur = None;
            t.started = false;
            t.done = false;
            t.result = ClientResult {
                client: self.cfg.client_base + t.id,
                ..ClientResult::default()
            };
        }
        for w in &self.workers {
            w.locked().lat = Latencies::new();
        }
        self.files_done.store(0, Ordering::Relaxed);
        let released = Instant::now();
        *self.epoch.locked() = released;
        let mut hung = false;
        {
            let mut b = self.board.locked();
            b.queue = (0..n).collect();
            b.remaining = n;
            self.work.notify_all();
            while b.remaining > 0 {
                let (g, _) = locks::wait_timeout(&self.done, b, Duration::from_millis(100));
                b = g;
                progress.set_files(self.files_done.load(Ordering::Relaxed));
                if stop.load(Ordering::Relaxed) {
                    self.halt.store(true, Ordering::Relaxed);
                }
                if deadline.is_some_and(|d| released.elapsed() > d) {
                    hung = true;
                    self.halt.store(true, Ordering::Relaxed);
                    b.queue.clear();
                    break;
                }
            }
        }
        let mut clients = Vec::with_capacity(n);
        for (id, t) in self.tasks.iter().enumerate() {
            // A task still held is in a call that has not returned.
            match t.try_lock() {
                Ok(mut t) if t.done || !hung => clients.push(std::mem::take(&mut t.result)),
                Ok(mut t) => {
                    let mut r = std::mem::take(&mut t.result);
                    r.end = released.elapsed();
                    r.error = Some(no_answer(deadline));
                    clients.push(r);
                }
                Err(_) => clients.push(ClientResult {
                    client: self.cfg.client_base + id,
                    end: released.elapsed(),
                    error: Some(no_answer(deadline)),
                    ..ClientResult::default()
                }),
            }
        }
        let mut latencies = Latencies::new();
        for w in &self.workers {
            if let Ok(mut w) = w.try_lock() {
                latencies.merge(&std::mem::take(&mut w.lat));
            }
        }
        Pass {
            clients,
            latencies,
            released,
            hung,
        }
    }

    pub(super) fn shutdown(&self) {
        self.board.locked().shutdown = true;
        self.work.notify_all();
    }
}

pub(super) fn no_answer(deadline: Option<Duration>) -> String {
    format!(
        "no answer within the phase timeout ({} s): a call to the target has not returned",
        deadline.map(|d| d.as_secs()).unwrap_or(0)
    )
}

impl Pool {
    /// A pool of `threads` workers for `cfg`'s clients, each working through `lists`.
    pub(super) fn new(cfg: &Config, lists: Lists, threads: usize) -> Self {
        let buf = data_buffer(cfg.write_size);
        Pool {
            cfg: cfg.clone(),
            lists,
            tasks: (0..cfg.clients)
                .map(|id| {
                    Mutex::new(Task {
                        id,
                        store: None,
                        jobs: VecDeque::new(),
                        cur: None,
                        result: ClientResult::default(),
                        started: false,
                        done: false,
                    })
                })
                .collect(),
            workers: (0..threads)
                .map(|_| {
                    Mutex::new(Worker {
                        buf: Aligned::new(&buf),
                        rbuf: Aligned::new(&vec![0u8; buf.len() / 2]),
                        lat: Latencies::new(),
                    })
                })
                .collect(),
            board: Mutex::new(Board::default()),
            work: Condvar::new(),
            done: Condvar::new(),
            epoch: Mutex::new(Instant::now()),
            halt: AtomicBool::new(false),
            files_done: AtomicU64::new(0),
        }
    }
}

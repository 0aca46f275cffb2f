//! A dispatch thread with worker threads (seeds/003 §6.1 "dispatch thread", §6.2 workers):
//! the thread that owns the [`ScaleServer`] polls it, copies each request to a worker, and
//! posts the responses the workers hand back.
//!
//! ```text
//!  dispatch thread (owns ScaleServer)            N worker threads
//!  poll ─ recv ─ copy into a free job ─ jobs ──▶ handler(&request, &mut response)
//!  reply ◀──────────────────────────── done ◀─┘
//! ```
//!
//! **Copies are the price of workers.** A request lives in a pool slot that only the
//! dispatch thread may touch (the server is single-threaded, and the slot is reused by the
//! client as soon as its response arrives), so each request is copied into a job buffer for
//! the worker, and the worker's response is copied from the job into the pool slot by
//! [`ScaleServer::reply`]. A handler cheap enough to run inline should run on the dispatch
//! thread ([`ScaleServer::recv`] + [`ScaleServer::reply`], zero copies); workers pay off
//! when handlers are long or block.
//!
//! Jobs (a request buffer of the largest request a slot holds, and a response buffer of
//! [`ScaleServer::max_response`] bytes) are allocated once, at [`WorkerPool::spawn`], and
//! recycled: the steady state allocates nothing. There are `depth` of them: at most `depth`
//! requests are with the workers; further ones wait in the server's ready queue
//! (backpressure). Workers share one bounded MPMC queue, so an idle worker takes the next
//! request (better balance than the seed's round robin when handler times vary); responses
//! come back in completion order, i.e. out of order across workers, which ScaleRPC permits
//! (each request has its own slot and token).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::ScaleError;
use super::protocol::{REQUEST_HEADER_SIZE, TRAILER_SIZE};
use super::server::{ScaleServer, ScaleToken};

/// Worker pool configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Worker threads (at least 1).
    pub workers: usize,
    /// Jobs (requests with the workers at once; preallocated buffers). 0: 32 per worker.
    pub depth: usize,
}

/// Counters of a [`WorkerPool`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Requests copied to workers.
    pub dispatched: u64,
    /// Responses posted with [`ScaleServer::reply`] (successfully).
    pub replied: u64,
    /// Replies the server refused ([`ScaleError::ConnFailed`]: the client is gone; others
    /// are counted too).
    pub reply_errors: u64,
    /// Times a ready request had to wait because every job was with the workers.
    pub backpressure: u64,
}

/// One request in flight to a worker, with its buffers (recycled).
struct Job {
    tok: Option<ScaleToken>,
    req: Box<[u8]>,
    req_len: usize,
    resp: Box<[u8]>,
    /// Response bytes the handler wrote; `None`: the handler panicked.
    resp_len: Option<usize>,
}

/// Worker threads running a request handler for one [`ScaleServer`], fed by the thread that
/// polls the server (module docs). Dropping the pool closes the queue and joins the workers
/// (requests still with them are answered never: drain with [`WorkerPool::in_flight`]
/// first).
pub struct WorkerPool {
    jobs: Option<Sender<Job>>,
    done: Receiver<Job>,
    free: Vec<Job>,
    threads: Vec<JoinHandle<()>>,
    per_worker: Arc<[AtomicU64]>,
    in_flight: usize,
    stats: WorkerStats,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("workers", &self.threads.len())
            .field("in_flight", &self.in_flight)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl WorkerPool {
    /// Spawns `workers` threads running `handler` for `server`'s requests, with 32 jobs per
    /// worker. `handler(request, response)` writes the response into `response` (its length
    /// is [`ScaleServer::max_response`]) and returns how many bytes it wrote (clamped to
    /// that). Each worker owns a clone of `handler`.
    ///
    /// # Errors
    /// [`ScaleError::Config`] for 0 workers or when a thread cannot be spawned.
    pub fn spawn<H>(server: &ScaleServer, workers: usize, handler: H) -> Result<Self, ScaleError>
    where
        H: Fn(&[u8], &mut [u8]) -> usize + Send + Clone + 'static,
    {
        Self::with_config(server, WorkerConfig { workers, depth: 0 }, handler)
    }

    /// [`WorkerPool::spawn`] with a configuration.
    ///
    /// # Errors
    /// As [`WorkerPool::spawn`].
    pub fn with_config<H>(
        server: &ScaleServer,
        cfg: WorkerConfig,
        handler: H,
    ) -> Result<Self, ScaleError>
    where
        H: Fn(&[u8], &mut [u8]) -> usize + Send + Clone + 'static,
    {
        Self::with_config_typed(server, cfg, move |_, req: &[u8], resp: &mut [u8]| {
            handler(req, resp)
        })
    }

    /// [`WorkerPool::with_config`] with a handler that also gets the request's `rpc_type`
    /// (seeds/003 §6.2: workers dispatch on it): `handler(rpc_type, request, response)`.
    ///
    /// # Errors
    /// As [`WorkerPool::spawn`].
    pub fn with_config_typed<H>(
        server: &ScaleServer,
        cfg: WorkerConfig,
        handler: H,
    ) -> Result<Self, ScaleError>
    where
        H: Fn(u16, &[u8], &mut [u8]) -> usize + Send + Clone + 'static,
    {
        if cfg.workers == 0 {
            return Err(ScaleError::Config(
                "a worker pool needs at least one worker",
            ));
        }
        let depth = if cfg.depth == 0 {
            32 * cfg.workers
        } else {
            cfg.depth
        };
        let max_req = server.slot_size() as usize - REQUEST_HEADER_SIZE - TRAILER_SIZE;
        let max_resp = server.max_response();
        let free = (0..depth)
            .map(|_| Job {
                tok: None,
                req: vec![0u8; max_req].into_boxed_slice(),
                req_len: 0,
                resp: vec![0u8; max_resp].into_boxed_slice(),
                resp_len: None,
            })
            .collect();
        // Both queues hold at most `depth` jobs: sends never block.
        let (jobs_tx, jobs_rx) = crossbeam_channel::bounded::<Job>(depth);
        let (done_tx, done_rx) = crossbeam_channel::bounded::<Job>(depth);
        let per_worker: Arc<[AtomicU64]> = (0..cfg.workers).map(|_| AtomicU64::new(0)).collect();
        let mut pool = WorkerPool {
            jobs: Some(jobs_tx),
            done: done_rx,
            free,
            threads: Vec::with_capacity(cfg.workers),
            per_worker: per_worker.clone(),
            in_flight: 0,
            stats: WorkerStats::default(),
        };
        for w in 0..cfg.workers {
            let (rx, tx, h, count) = (
                jobs_rx.clone(),
                done_tx.clone(),
                handler.clone(),
                per_worker.clone(),
            );
            let t = std::thread::Builder::new()
                .name(format!("scalerpc-worker-{w}"))
                .spawn(move || {
                    for mut job in rx.iter() {
                        let ty = job.tok.map_or(0, |t| t.rpc_type());
                        let r = catch_unwind(AssertUnwindSafe(|| {
                            h(ty, &job.req[..job.req_len], &mut job.resp)
                        }));
                        job.resp_len = r.ok().map(|n| n.min(job.resp.len()));
                        count[w].fetch_add(1, Ordering::Relaxed);
                        if tx.send(job).is_err() {
                            break; // the pool is gone
                        }
                    }
                })
                .map_err(|_| ScaleError::Config("cannot spawn a worker thread"))?;
            pool.threads.push(t);
        }
        Ok(pool)
    }

    /// One round of the dispatch loop: polls `server`, copies ready requests to free jobs
    /// (as many as there are free jobs), and posts the responses the workers finished
    /// (doorbells rung before returning). Returns how many responses were posted.
    ///
    /// # Panics
    /// If the handler panicked on a worker (the panic is reported here, on the dispatch
    /// thread, as it would be had the handler run inline).
    pub fn poll(&mut self, server: &mut ScaleServer) -> usize {
        server.poll();
        self.dispatch(server);
        let n = self.complete(server);
        if n > 0 {
            server.flush();
        }
        n
    }

    /// Copies ready requests from `server` to workers, while jobs are free.
    fn dispatch(&mut self, server: &mut ScaleServer) {
        let Some(jobs) = &self.jobs else { return };
        while server.pending_requests() > 0 {
            let Some(mut job) = self.free.pop() else {
                self.stats.backpressure += 1;
                return;
            };
            let Some((tok, req)) = server.recv() else {
                self.free.push(job);
                return;
            };
            let n = req.len().min(job.req.len());
            job.req[..n].copy_from_slice(&req[..n]);
            job.req_len = n;
            job.tok = Some(tok);
            job.resp_len = None;
            // Never blocks: the channel holds `depth` jobs and there are `depth` in all.
            if let Err(e) = jobs.try_send(job) {
                // Workers gone (they only exit when the queue closes): keep the job.
                let job = e.into_inner();
                self.free.push(job);
                return;
            }
            self.in_flight += 1;
            self.stats.dispatched += 1;
        }
    }

    /// Posts finished responses.
    fn complete(&mut self, server: &mut ScaleServer) -> usize {
        let mut n = 0;
        while let Ok(mut job) = self.done.try_recv() {
            self.in_flight -= 1;
            let tok = job.tok.take().expect("a dispatched job has a token");
            let Some(len) = job.resp_len else {
                self.free.push(job);
                panic!("scalerpc worker: the request handler panicked");
            };
            let resp = &job.resp[..len];
            match server.reply(tok, len, |b| {
                b[..len].copy_from_slice(resp);
                len
            }) {
                Ok(()) => {
                    n += 1;
                    self.stats.replied += 1;
                }
                Err(_) => self.stats.reply_errors += 1,
            }
            self.free.push(job);
        }
        n
    }

    /// Requests with the workers (dispatched, response not yet posted).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Worker threads.
    pub fn workers(&self) -> usize {
        self.threads.len()
    }

    /// Requests each worker has handled so far (index: worker; threads are named
    /// `scalerpc-worker-{index}`).
    pub fn handled_per_worker(&self) -> Vec<u64> {
        self.per_worker
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Counters.
    pub fn stats(&self) -> &WorkerStats {
        &self.stats
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.jobs = None; // closes the queue: workers finish their job and exit
        // Unblock workers waiting to hand a job back (the done queue never fills, but be
        // safe): drain while joining.
        for t in self.threads.drain(..) {
            while !t.is_finished() {
                while self.done.try_recv().is_ok() {}
                std::thread::yield_now();
            }
            let _ = t.join();
        }
    }
}

//! Variable-length arguments on every transport against tarpc (issue 15 §3): throughput and
//! latency of one `&[u8]` call at several sizes, in one run.
//!
//! The service is one method, `Sink::put(data: &[u8]) -> u64`, declared with
//! `max_var_bytes = 1 MiB + 4 KiB` ([`MAX_VAR_BYTES`]) so that a 1 MiB argument fits; the
//! server answers with a digest of the bytes it received ([`digest`]: the length and the first
//! and last 8 bytes), which the client checks against the buffer it sent, so every response
//! proves that its call's bytes arrived and that it was matched to its call. The server runs the
//! zero-copy path (`SinkService::dispatch_raw`: the handler borrows the argument from the
//! receive buffer) on its own thread ([`rpc::Server::spawn_raw_with`]); one client thread
//! keeps `--qd` calls in flight (`issue(tag).put(..)` / `poll`; a call refused with
//! `RpcError::WouldBlock`, back-pressure, is issued again after the next poll). Both sides
//! spin, then yield the CPU between empty polls (server: `IdlePolicy::Backoff` with
//! `max_sleep` 0), so that on an oversubscribed machine a waiting thread lets its peer run;
//! `--busy-poll` never yields. `--repeat N` runs the whole suite N times, interleaved, and
//! keeps each point's run with the highest throughput. Transports:
//! - `delegation`: the shared-memory MPSC ring (`/dev/shm`), 2 clients at most, `--qd`
//!   request and response slots (each request slot holds the service's largest request,
//!   ~1 MiB, so the segment is about `max(2, qd)` MiB);
//! - `ipc`: per-client shared-memory rings, 2 clients at most, depth `--qd`;
//! - `copyrpc`: on the device model (`rpc::mlx5::sim::Fabric`), rings of `--copyrpc-ring`
//!   bytes on both sides (payload cap about `ring / 4 - 44` B: 1 MiB needs an 8 MiB ring);
//! - `erpc`: eRPC over UDP loopback (multi-packet messages above one MTU), `--qd` calls in
//!   flight (one session per 8), congestion control as `--erpc-cc` says (default on, eRPC's);
//! - `scalerpc`: on the device model, slot size derived from the service
//!   (`ScaleRpcServer::new`) unless `--scalerpc-slot-size` says otherwise, `max_conns` 2,
//!   `qd + 1` slots per connection (one for the liveness probe);
//! - `tarpc` (0.38, the baseline): the same method (`put(data: Bytes) -> u64`) over TCP
//!   loopback, `tarpc::serde_transport` with length-delimited bincode frames and
//!   `TCP_NODELAY`, server and client each on a `current_thread` tokio runtime in its own OS
//!   thread (as `examples/erpc_bench.rs`), `--qd` calls in flight from one task.
//!
//! The handler reads only the first and last 8 bytes of its argument, so the figures are the
//! cost of moving the bytes to the server (tarpc's include deserializing the frame into a
//! `Bytes`, a copy of the whole argument; the zero-copy transports hand the handler a slice of
//! their receive buffer).
//!
//! The device model executes each RDMA operation inside the sender's doorbell (the copy of the
//! payload included), so copyrpc and ScaleRPC figures measure the protocol plus the model on
//! this machine, not a NIC.
//!
//! A transport that cannot carry a size gets a row saying why instead of figures: its setup
//! error (`RpcError::CapacityMismatch`, naming the setting to raise, e.g. copyrpc with
//! `--copyrpc-ring 1048576`) or the call's error (`RpcError::MessageTooLarge` for a size above
//! `max_var_bytes`).
//!
//! ```text
//! cargo run --release --example varlen_bench                       # CSV on stdout, ~15 s
//! cargo run --release --example varlen_bench -- --repeat 3 --csv docs/varlen_bench.csv --svg docs/varlen_bench.svg
//! cargo run --release --example varlen_bench -- --transports copyrpc --copyrpc-ring 1048576
//! cargo run --release --example varlen_bench -- --quick            # smoke run, ~2 s
//! ```
//!
//! CSV columns: `transport,size,qd,calls` (completions inside the measured window),
//! `ops_per_s`, `gbit_per_s` (argument payload), `p50_us,p99_us` (issue to completion, at the
//! queue depth), `ratio_vs_tarpc` (throughput over tarpc's at the same size), `error` (empty,
//! or why the transport has no figures at this size). Each point runs a warm-up of a fifth of
//! `--duration`, then the measured window; the human summary goes to stderr.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use crossbeam_utils::Backoff;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use hdrhistogram::Histogram;
use plotters::prelude::*;
use rpc::copyrpc::{ContextConfig, Copyrpc, CopyrpcAddr, CopyrpcServer, EndpointConfig};
use rpc::delegation::{Delegation, DelegationConfig, DelegationServer};
use rpc::erpc::{Erpc, ErpcConfig, ErpcServer};
use rpc::ipc::{Ipc, IpcConfig, IpcServer};
use rpc::mlx5::sim::{Fabric, SimConfig};
use rpc::scalerpc::{ScaleRpc, ScaleRpcAddr, ScaleRpcServer, ServerConfig};
use rpc::{
    ClientTransport, IdlePolicy, RpcError, RunnerConfig, Server, ServerTransport, Service,
    rpc_service,
};
use tarpc::server::Channel;
use tarpc::tokio_serde::formats::Bincode;
use tarpc::tokio_util::codec::LengthDelimitedCodec;
use tarpc::{client, context, serde_transport, server};

/// Bytes of variable-length data per message: 1 MiB plus 4 KiB of headroom.
pub(crate) const MAX_VAR_BYTES: usize = (1 << 20) + 4096;

#[rpc_service(transport = "delegation", max_var_bytes = 1052672)]
pub trait Sink {
    /// Takes `data` and returns its [`digest`].
    fn put(&mut self, data: &[u8]) -> u64;
}

const _: () = assert!(MAX_VAR_BYTES == 1052672);

/// The digest the server returns: the length, the first 8 and the last 8 bytes (fewer for
/// shorter data), mixed. Cheap at any size, and different for each call slot's buffer
/// ([`payload`]).
pub(crate) fn digest(data: &[u8]) -> u64 {
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    let n = data.len();
    let head = word(&data[..n.min(8)]);
    let tail = word(&data[n.saturating_sub(8)..]);
    (n as u64) ^ head.rotate_left(13) ^ tail.rotate_left(41)
}

/// The request payload of call slot `k`: `size` bytes of a pattern that depends on `k`.
pub(crate) fn payload(size: usize, k: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i.wrapping_mul(7).wrapping_add(k.wrapping_mul(131))) as u8)
        .collect()
}

/// The server's state: nothing but a count of calls.
#[derive(Default)]
struct Store {
    calls: u64,
}

impl SinkServer for Store {
    fn put(&mut self, data: &[u8]) -> u64 {
        self.calls += 1;
        digest(data)
    }
}

/// The systems measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum System {
    /// tarpc over TCP loopback (the baseline).
    Tarpc,
    /// The delegation ring (shared memory).
    Delegation,
    /// Per-client shared-memory rings.
    Ipc,
    /// copyrpc on the device model.
    Copyrpc,
    /// eRPC over UDP loopback.
    Erpc,
    /// ScaleRPC on the device model.
    Scalerpc,
}

impl System {
    /// The name in the CSV and the plot.
    pub(crate) fn name(self) -> &'static str {
        match self {
            System::Tarpc => "tarpc",
            System::Delegation => "delegation",
            System::Ipc => "ipc",
            System::Copyrpc => "copyrpc",
            System::Erpc => "erpc",
            System::Scalerpc => "scalerpc",
        }
    }
}

/// The command line of `varlen_bench`.
#[derive(Parser, Debug, Clone)]
#[command(about = "&[u8] arguments of 32 B .. 1 MiB on every transport against tarpc")]
pub(crate) struct Args {
    /// Argument sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "32,4096,65536,1048576")]
    pub sizes: Vec<usize>,
    /// Systems to run (tarpc first, for the ratios).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tarpc,delegation,ipc,copyrpc,erpc,scalerpc"
    )]
    pub transports: Vec<System>,
    /// Calls in flight per client (1: p50/p99 are round-trip latencies; tarpc's throughput
    /// at 1 MiB drops at higher depths on loopback).
    #[arg(long, default_value_t = 1)]
    pub qd: usize,
    /// Seconds measured per point (after a warm-up of a fifth of it).
    #[arg(long, default_value_t = 0.5)]
    pub duration: f64,
    /// copyrpc ring size in bytes, both sides (power of two). Messages up to ring/4 − 44 B go
    /// inline through the ring (1 MiB messages need 8 MiB); larger ones by rendezvous (RDMA
    /// READ) up to `--copyrpc-large`.
    #[arg(long, default_value_t = 8 << 20)]
    pub copyrpc_ring: usize,
    /// copyrpc `EndpointConfig::max_large_message` in bytes, both sides: the largest message
    /// sent by rendezvous (0: inline only).
    #[arg(long, default_value_t = 8 << 20)]
    pub copyrpc_large: u32,
    /// eRPC congestion control (Timely rate computation and pacing), both ends: eRPC's
    /// default is on; `--erpc-cc false` keeps sessions at the link rate (see
    /// `rpc-runtime/src/erpc/core/cc.rs`: on a loaded VM, scheduling noise in the RTT samples
    /// slows large messages down).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub erpc_cc: bool,
    /// ScaleRPC slot size in bytes (a multiple of 64); default: derived from the service.
    #[arg(long)]
    pub scalerpc_slot_size: Option<u32>,
    /// Server never yields and the client never backs off (one core each at 100%): for
    /// dedicated cores. Default: both spin briefly, then yield the CPU between empty polls,
    /// so that on an oversubscribed machine a waiting thread lets its peer run.
    #[arg(long)]
    pub busy_poll: bool,
    /// Runs of the whole suite (interleaved: every system once, then again); each point keeps
    /// its run with the highest throughput (on a shared machine, the run least disturbed by
    /// other processes).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Smoke run: 32 B and 4 KiB, 50 ms per point.
    #[arg(long)]
    pub quick: bool,
    /// Write the CSV here instead of stdout.
    #[arg(long)]
    pub csv: Option<String>,
    /// Write an SVG plot (throughput vs size, one line per transport) here.
    #[arg(long)]
    pub svg: Option<String>,
}

impl Args {
    /// The defaults (as on the command line without arguments).
    #[allow(
        dead_code,
        reason = "used by tests/varlen_bench.rs, which includes this file"
    )]
    pub(crate) fn defaults() -> Self {
        Args::parse_from(["varlen_bench"])
    }
}

/// One point: a system at one size.
pub(crate) struct Row {
    /// The system.
    pub system: System,
    /// Argument bytes.
    pub size: usize,
    /// Calls in flight.
    pub qd: usize,
    /// Completions inside the measured window.
    pub calls: u64,
    /// Completions of the whole point (warm-up and drain included), each digest checked: at
    /// least the calls in flight whenever the point has no error, however the threads were
    /// scheduled.
    pub completed: u64,
    /// The window, seconds.
    pub secs: f64,
    /// Issue-to-completion latency, ns.
    pub hist: Histogram<u64>,
    /// Why there are no figures (setup or call error).
    pub error: Option<String>,
}

impl std::fmt::Debug for Row {
    /// The figures, without the histogram's buckets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Row")
            .field("system", &self.system)
            .field("size", &self.size)
            .field("qd", &self.qd)
            .field("calls", &self.calls)
            .field("completed", &self.completed)
            .field("secs", &self.secs)
            .field("p50_us", &self.quantile_us(0.5))
            .field("error", &self.error)
            .finish()
    }
}

impl Row {
    fn failed(system: System, size: usize, qd: usize, why: String) -> Row {
        Row {
            system,
            size,
            qd,
            calls: 0,
            completed: 0,
            secs: 0.0,
            hist: new_hist(),
            error: Some(why),
        }
    }

    /// Calls per second.
    pub(crate) fn ops_per_s(&self) -> f64 {
        if self.secs > 0.0 {
            self.calls as f64 / self.secs
        } else {
            0.0
        }
    }

    /// Argument payload throughput, Gbit/s.
    pub(crate) fn gbit_per_s(&self) -> f64 {
        self.ops_per_s() * self.size as f64 * 8.0 / 1e9
    }

    /// Latency quantile `q` in µs; `None` if no call both started and ended in the window.
    pub(crate) fn quantile_us(&self, q: f64) -> Option<f64> {
        (!self.hist.is_empty()).then(|| self.hist.value_at_quantile(q) as f64 / 1e3)
    }
}

/// What a closed loop measured.
struct Measured {
    /// Completions inside the window.
    calls: u64,
    /// All completions.
    completed: u64,
    /// Latencies of the calls issued and completed inside the window, ns.
    hist: Histogram<u64>,
}

/// Longest latency recorded, ns.
const HIST_MAX_NS: u64 = 60_000_000_000;
/// Longest a run may take to drain its calls after the window, and to connect.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Most clients of the shared-memory servers (one is used; 2 keeps the segment small).
const SHM_CLIENTS: u32 = 2;

fn new_hist() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, HIST_MAX_NS, 3).expect("histogram")
}

/// Runs every system of `a` at every size; returns the rows in run order.
pub(crate) fn run(a: &Args) -> Vec<Row> {
    let (sizes, dur) = if a.quick {
        (vec![32, 4096], Duration::from_millis(50))
    } else {
        (
            a.sizes.clone(),
            Duration::from_secs_f64(a.duration.max(0.01)),
        )
    };
    let p = Point {
        qd: a.qd.clamp(1, 64),
        warm: dur / 5,
        dur,
        busy: a.busy_poll,
    };
    let mut rows: Vec<Row> = Vec::new();
    for rep in 0..a.repeat.max(1) {
        for &sys in &a.transports {
            let t0 = Instant::now();
            let got: Vec<Row> = match sys {
                System::Tarpc => sizes.iter().map(|&s| tarpc_run(p, s)).collect(),
                System::Delegation => delegation(p, &sizes),
                System::Ipc => ipc(p, &sizes),
                System::Copyrpc => copyrpc(a, p, &sizes),
                System::Erpc => erpc(a, p, &sizes),
                System::Scalerpc => scalerpc(a, p, &sizes),
            };
            eprintln!(
                "run {}: {}: {:.1} s",
                rep + 1,
                sys.name(),
                t0.elapsed().as_secs_f64()
            );
            for r in got {
                match rows
                    .iter_mut()
                    .find(|o| o.system == r.system && o.size == r.size)
                {
                    None => rows.push(r),
                    Some(o) => {
                        if o.error.is_some() || (r.error.is_none() && r.calls > o.calls) {
                            *o = r;
                        }
                    }
                }
            }
        }
    }
    rows
}

/// How each point runs.
#[derive(Clone, Copy, Debug)]
struct Point {
    /// Calls in flight.
    qd: usize,
    /// Warm-up before the window.
    warm: Duration,
    /// The measured window.
    dur: Duration,
    /// Busy polling (no yielding) on both sides.
    busy: bool,
}

/// Rows of `sys` at every size, all failed with `e` (a setup error).
fn all_failed(sys: System, p: Point, sizes: &[usize], e: &RpcError) -> Vec<Row> {
    sizes
        .iter()
        .map(|&s| Row::failed(sys, s, p.qd, e.to_string()))
        .collect()
}

/// A `/dev/shm` name of this process, new at each call (runs may share a process: tests).
fn shm_name(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let k = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("rpc-varlen-bench-{}-{tag}-{k}", std::process::id())
}

/// A server thread (zero-copy dispatch) and a client, measured at each size.
fn measure_all<T, C>(
    sys: System,
    server: Server<SinkService, T>,
    mut client: SinkClient<C>,
    p: Point,
    sizes: &[usize],
) -> Vec<Row>
where
    T: ServerTransport + Send + 'static,
    C: ClientTransport,
{
    let mut store = Store::default();
    let runner = RunnerConfig {
        idle: if p.busy {
            IdlePolicy::BusyPoll
        } else {
            IdlePolicy::Backoff {
                max_sleep: Duration::ZERO,
            }
        },
        thread_name: None,
    };
    let h = match server.spawn_raw_with(runner, move |msg, out| {
        SinkService::dispatch_raw(&mut store, msg, out)
    }) {
        Ok(h) => h,
        Err(e) => {
            let why = format!("server thread: {e}");
            return sizes
                .iter()
                .map(|&s| Row::failed(sys, s, p.qd, why.clone()))
                .collect();
        }
    };
    let rows = sizes
        .iter()
        .map(|&size| match drive(&mut client, p, size) {
            Ok(m) => Row {
                system: sys,
                size,
                qd: p.qd,
                calls: m.calls,
                completed: m.completed,
                secs: p.dur.as_secs_f64(),
                hist: m.hist,
                error: None,
            },
            Err(why) => Row::failed(sys, size, p.qd, why),
        })
        .collect();
    drop(client);
    if let Err(e) = h.join() {
        eprintln!("{}: server thread: {e}", sys.name());
    }
    rows
}

/// The closed loop: keeps `p.qd` calls of `size` bytes in flight, checks each digest; returns
/// the completions inside the window and their latencies. A call the transport cannot take
/// yet (`RpcError::WouldBlock`: copyrpc ring space or response credit, ScaleRPC group not
/// scheduled) waits and is issued again after the next poll; its latency counts from its
/// first attempt. Any other call error, a wrong digest or calls that do not drain end the
/// point with the reason.
fn drive<C: ClientTransport>(
    c: &mut SinkClient<C>,
    p: Point,
    size: usize,
) -> Result<Measured, String> {
    let qd = p.qd.min(c.max_in_flight()).max(1);
    let bufs: Vec<Vec<u8>> = (0..qd).map(|k| payload(size, k)).collect();
    let want: Vec<u64> = bufs.iter().map(|b| digest(b)).collect();
    let mut issued_at = vec![Instant::now(); qd];
    // Call slots waiting to be issued (back-pressure), oldest first.
    let mut pending: Vec<usize> = Vec::with_capacity(qd);
    let mut hist = new_hist();
    let backoff = Backoff::new();
    let start = Instant::now();
    let warm_end = start + p.warm;
    let end = warm_end + p.dur;
    let give_up = end + DRAIN_TIMEOUT;
    // Issues the pending slots in order until the transport pushes back.
    let issue_pending = |c: &mut SinkClient<C>, pending: &mut Vec<usize>| -> Result<(), String> {
        while let Some(&k) = pending.first() {
            match c.issue(k as u64).put(&bufs[k]) {
                Ok(()) => {
                    pending.remove(0);
                }
                Err(RpcError::WouldBlock) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    };
    pending.extend(0..qd);
    issued_at.fill(Instant::now());
    issue_pending(c, &mut pending)?;
    let (mut outstanding, mut calls, mut completed, mut idle) = (qd, 0u64, 0u64, 0u32);
    while outstanding > 0 {
        let polled = c.poll().map_err(|e| e.to_string())?;
        let Some((tag, SinkResponse::Put(d))) = polled else {
            if !pending.is_empty() {
                issue_pending(c, &mut pending)?;
            }
            idle = idle.wrapping_add(1);
            if idle % 4096 == 0 && Instant::now() > give_up {
                return Err(format!("{outstanding} calls did not drain"));
            }
            if !p.busy {
                backoff.snooze();
            }
            continue;
        };
        backoff.reset();
        let t = Instant::now();
        let k = tag as usize;
        if d != want[k] {
            return Err(format!("wrong digest for call slot {k}: {d:#x}"));
        }
        outstanding -= 1;
        completed += 1;
        if t > warm_end && t <= end {
            calls += 1;
            if issued_at[k] >= warm_end {
                let ns = (t - issued_at[k]).as_nanos() as u64;
                hist.record(ns.clamp(1, HIST_MAX_NS)).expect("record");
            }
        }
        if t <= end {
            pending.push(k);
            issued_at[k] = Instant::now();
            outstanding += 1;
            issue_pending(c, &mut pending)?;
        }
    }
    Ok(Measured {
        calls,
        completed,
        hist,
    })
}

/// Connects on another thread while this one polls `server` (copyrpc and ScaleRPC accept in
/// `poll`, eRPC runs its handshake there). Polls for at most [`DRAIN_TIMEOUT`], then waits for
/// the connect's own timeout.
fn connect_polling<T: ServerTransport, C: Send + 'static>(
    server: &mut Server<SinkService, T>,
    connect: impl FnOnce() -> Result<C, RpcError> + Send + 'static,
) -> Result<C, RpcError> {
    let h = thread::spawn(connect);
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while !h.is_finished() && Instant::now() < deadline {
        server.poll();
        thread::yield_now();
    }
    h.join().expect("connect thread panicked")
}

fn delegation(p: Point, sizes: &[usize]) -> Vec<Row> {
    let n = shm_name("deleg");
    let depth = (p.qd as u32).next_power_of_two();
    let cfg = DelegationConfig {
        max_clients: SHM_CLIENTS,
        ring_depth: depth.max(2),
        resp_depth: depth,
        ..DelegationConfig::default()
    };
    let server = match DelegationServer::serve::<SinkService>(&n, cfg) {
        Ok(s) => s,
        Err(e) => return all_failed(System::Delegation, p, sizes, &e),
    };
    match SinkClient::<Delegation>::connect(&n) {
        Ok(c) => measure_all(System::Delegation, server, c, p, sizes),
        Err(e) => all_failed(System::Delegation, p, sizes, &e),
    }
}

fn ipc(p: Point, sizes: &[usize]) -> Vec<Row> {
    let n = shm_name("ipc");
    let cfg = IpcConfig {
        max_clients: SHM_CLIENTS,
        depth: (p.qd as u32).next_power_of_two(),
        ..IpcConfig::default()
    };
    let server = match IpcServer::serve::<SinkService>(&n, cfg) {
        Ok(s) => s,
        Err(e) => return all_failed(System::Ipc, p, sizes, &e),
    };
    match SinkClient::<Ipc>::connect(&n) {
        Ok(c) => measure_all(System::Ipc, server, c, p, sizes),
        Err(e) => all_failed(System::Ipc, p, sizes, &e),
    }
}

fn copyrpc(a: &Args, p: Point, sizes: &[usize]) -> Vec<Row> {
    let fabric = Fabric::new(SimConfig::default());
    let endpoint = EndpointConfig {
        ring_size: a.copyrpc_ring,
        max_large_message: a.copyrpc_large,
        ..EndpointConfig::default()
    };
    let mut server = match CopyrpcServer::serve::<SinkService>(
        &fabric.open(),
        ContextConfig::default(),
        endpoint,
    ) {
        Ok(s) => s,
        Err(e) => return all_failed(System::Copyrpc, p, sizes, &e),
    };
    let mut addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    addr.endpoint = endpoint;
    addr.max_in_flight = p.qd as u32;
    match connect_polling(&mut server, move || SinkClient::<Copyrpc>::connect(&addr)) {
        Ok(c) => measure_all(System::Copyrpc, server, c, p, sizes),
        Err(e) => all_failed(System::Copyrpc, p, sizes, &e),
    }
}

fn erpc(a: &Args, p: Point, sizes: &[usize]) -> Vec<Row> {
    let mut cfg = ErpcConfig {
        max_in_flight: p.qd,
        ..ErpcConfig::default()
    };
    cfg.core.cc_rate_comp = a.erpc_cc;
    cfg.core.cc_pacing = a.erpc_cc;
    let t = match ErpcServer::bind_with(
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        SinkService::DESCRIPTOR,
        &cfg,
    ) {
        Ok(t) => t,
        Err(e) => return all_failed(System::Erpc, p, sizes, &e.into()),
    };
    let addr = t.local_addr();
    let mut server = Server::<SinkService, _>::new(t);
    let connect = move || {
        Erpc::connect_with(&addr, SinkService::DESCRIPTOR, &cfg)
            .map(SinkClient::<Erpc>::from_transport)
            .map_err(RpcError::from)
    };
    match connect_polling(&mut server, connect) {
        Ok(c) => measure_all(System::Erpc, server, c, p, sizes),
        Err(e) => all_failed(System::Erpc, p, sizes, &e),
    }
}

fn scalerpc(a: &Args, p: Point, sizes: &[usize]) -> Vec<Row> {
    let fabric = Fabric::new(SimConfig::default());
    let cfg = ServerConfig {
        max_conns: 2,
        slots_per_conn: p.qd as u32 + 1,
        slot_size: a.scalerpc_slot_size,
        ..ServerConfig::default()
    };
    let mut server = match ScaleRpcServer::serve::<SinkService>(&fabric.open(), cfg) {
        Ok(s) => s,
        Err(e) => return all_failed(System::Scalerpc, p, sizes, &e),
    };
    let addr = ScaleRpcAddr::new(fabric.open(), server.transport().listener());
    match connect_polling(&mut server, move || SinkClient::<ScaleRpc>::connect(&addr)) {
        Ok(c) => measure_all(System::Scalerpc, server, c, p, sizes),
        Err(e) => all_failed(System::Scalerpc, p, sizes, &e),
    }
}

// ---------------------------------------------------------------------------------------------
// tarpc
// ---------------------------------------------------------------------------------------------

/// The tarpc service: the same method.
#[tarpc::service]
trait TSink {
    /// Returns the [`digest`] of `data`.
    async fn put(data: Bytes) -> u64;
}

#[derive(Clone)]
struct TSinkServer;

impl TSink for TSinkServer {
    async fn put(self, _: context::Context, data: Bytes) -> u64 {
        digest(&data)
    }
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A length-delimited bincode tarpc transport over `stream` (with `TCP_NODELAY`), frames up to
/// `max_frame` bytes.
fn tarpc_transport<In, Out>(
    stream: tokio::net::TcpStream,
    max_frame: usize,
) -> serde_transport::Transport<tokio::net::TcpStream, In, Out, Bincode<In, Out>>
where
    In: for<'de> serde::Deserialize<'de>,
    Out: serde::Serialize,
{
    stream.set_nodelay(true).expect("TCP_NODELAY");
    let framed = LengthDelimitedCodec::builder()
        .max_frame_length(max_frame)
        .new_framed(stream);
    serde_transport::new(framed, Bincode::default())
}

/// tarpc at depth `p.qd` with `size`-byte arguments: server and client each on a
/// `current_thread` runtime in its own thread.
fn tarpc_run(p: Point, size: usize) -> Row {
    let (qd, warm, dur) = (p.qd, p.warm, p.dur);
    let max_frame = size + 64 * 1024;
    let listener = match std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
    {
        Ok(l) => l,
        Err(e) => return Row::failed(System::Tarpc, size, qd, format!("TCP listener: {e}")),
    };
    let addr = listener.local_addr().expect("local addr");
    let server = thread::Builder::new()
        .name("tarpc-server".into())
        .spawn(move || {
            current_thread_runtime().block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let (stream, _) = listener.accept().await.expect("accept");
                let channel =
                    server::BaseChannel::with_defaults(tarpc_transport(stream, max_frame));
                // Ends when the client closes the connection.
                channel
                    .execute(TSinkServer.serve())
                    .for_each(|resp| async move {
                        tokio::spawn(resp);
                    })
                    .await;
            });
        })
        .expect("spawn tarpc server");
    let client = thread::Builder::new()
        .name("tarpc-client".into())
        .spawn(move || {
            current_thread_runtime().block_on(tarpc_client(addr, max_frame, qd, size, warm, dur))
        })
        .expect("spawn tarpc client");
    let got = client.join().expect("tarpc client thread");
    server.join().expect("tarpc server thread");
    match got {
        Ok(m) => Row {
            system: System::Tarpc,
            size,
            qd,
            calls: m.calls,
            completed: m.completed,
            secs: dur.as_secs_f64(),
            hist: m.hist,
            error: None,
        },
        Err(why) => Row::failed(System::Tarpc, size, qd, why),
    }
}

/// The tarpc client: `qd` calls in flight from one task, each call slot sending its own
/// [`payload`] (a shared `Bytes`: no copy per call) and checking the digest.
async fn tarpc_client(
    addr: SocketAddr,
    max_frame: usize,
    qd: usize,
    size: usize,
    warm: Duration,
    dur: Duration,
) -> Result<Measured, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let cli = TSinkClient::new(
        client::Config::default(),
        tarpc_transport(stream, max_frame),
    )
    .spawn();
    let bufs: Vec<Bytes> = (0..qd).map(|k| Bytes::from(payload(size, k))).collect();
    let want: Vec<u64> = bufs.iter().map(|b| digest(b)).collect();
    let one = |k: usize| {
        let cli = &cli;
        let data = bufs[k].clone();
        async move {
            let t0 = Instant::now();
            let r = cli.put(context::current(), data).await;
            (k, t0, r)
        }
    };
    let mut hist = new_hist();
    let start = Instant::now();
    let warm_end = start + warm;
    let end = warm_end + dur;
    let mut inflight: FuturesUnordered<_> = (0..qd).map(one).collect();
    let (mut calls, mut completed) = (0u64, 0u64);
    let drain = async {
        while let Some((k, t0, r)) = inflight.next().await {
            let d = r.map_err(|e| format!("tarpc put: {e}"))?;
            if d != want[k] {
                return Err(format!("wrong digest for call slot {k}: {d:#x}"));
            }
            completed += 1;
            let t = Instant::now();
            if t > warm_end && t <= end {
                calls += 1;
                if t0 >= warm_end {
                    let ns = (t - t0).as_nanos() as u64;
                    hist.record(ns.clamp(1, HIST_MAX_NS)).expect("record");
                }
            }
            if t <= end {
                inflight.push(one(k));
            }
        }
        Ok(())
    };
    tokio::time::timeout(dur + warm + DRAIN_TIMEOUT, drain)
        .await
        .map_err(|_| "tarpc calls did not drain".to_string())??;
    Ok(Measured {
        calls,
        completed,
        hist,
    })
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

/// The CSV header.
pub(crate) const CSV_HEADER: &str =
    "transport,size,qd,calls,ops_per_s,gbit_per_s,p50_us,p99_us,ratio_vs_tarpc,error";

/// The CSV text of `rows` (header included): each row's throughput relative to tarpc's at the
/// same size (empty when tarpc has no figures there).
pub(crate) fn csv(rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str(CSV_HEADER);
    s.push('\n');
    for r in rows {
        let base = rows
            .iter()
            .find(|t| t.system == System::Tarpc && t.size == r.size && t.error.is_none())
            .map(Row::ops_per_s)
            .filter(|&b| b > 0.0);
        let ratio = match (base, &r.error) {
            (Some(b), None) => format!("{:.3}", r.ops_per_s() / b),
            _ => String::new(),
        };
        let error = r
            .error
            .as_deref()
            .map(|e| format!("\"{}\"", e.replace('"', "'")))
            .unwrap_or_default();
        let q = |q: f64| {
            r.quantile_us(q)
                .map(|v| format!("{v:.2}"))
                .unwrap_or_default()
        };
        let _ = writeln!(
            s,
            "{},{},{},{},{:.0},{:.4},{},{},{},{}",
            r.system.name(),
            r.size,
            r.qd,
            r.calls,
            r.ops_per_s(),
            r.gbit_per_s(),
            q(0.5),
            q(0.99),
            ratio,
            error
        );
    }
    s
}

fn size_label(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// Plots Gbit/s against size (both axes log) for each system with figures into the SVG file
/// `path`.
///
/// # Errors
/// No row has figures, or plotters' error (the file cannot be written).
pub(crate) fn plot(path: &str, rows: &[Row], qd: usize) -> Result<(), Box<dyn std::error::Error>> {
    let ok: Vec<&Row> = rows
        .iter()
        .filter(|r| r.error.is_none() && r.calls > 0)
        .collect();
    if ok.is_empty() {
        return Err("no figures to plot".into());
    }
    let lx = |r: &Row| (r.size as f64).log2();
    let ly = |r: &Row| r.gbit_per_s().log10();
    let (xmin, xmax) = ok
        .iter()
        .map(|r| lx(r))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
    let (ymin, ymax) = ok
        .iter()
        .map(|r| ly(r))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
            (a.min(y), b.max(y))
        });
    let (ymin, ymax) = (ymin.floor(), ymax.ceil().max(ymin.floor() + 1.0));
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut ch = ChartBuilder::on(&root)
        .caption(
            format!("put(&[u8]) throughput, QD {qd}, one client (tarpc: TCP loopback)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((xmin - 0.5)..(xmax + 0.5), ymin..ymax)?;
    ch.configure_mesh()
        .x_desc("argument size (log2)")
        .y_desc("Gbit/s of argument payload (log10)")
        .x_labels(((xmax - xmin) as usize + 2).min(24))
        .x_label_formatter(&|x| {
            let n = 2f64.powf(*x);
            if (n.log2() - n.log2().round()).abs() < 1e-6 {
                size_label(n.round() as usize)
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| {
            let v = 10f64.powf(*y);
            if v >= 1.0 {
                format!("{v:.0}")
            } else {
                format!("{v}")
            }
        })
        .draw()?;
    let palette = [
        BLACK,
        RED,
        BLUE,
        RGBColor(0, 150, 0),
        RGBColor(200, 0, 200),
        RGBColor(230, 140, 0),
    ];
    let mut systems: Vec<System> = Vec::new();
    for r in &ok {
        if !systems.contains(&r.system) {
            systems.push(r.system);
        }
    }
    for (i, sys) in systems.into_iter().enumerate() {
        let color = palette[i % palette.len()];
        let series: Vec<(f64, f64)> = ok
            .iter()
            .filter(|r| r.system == sys)
            .map(|r| (lx(r), ly(r)))
            .collect();
        let style = if sys == System::Tarpc {
            color.stroke_width(3)
        } else {
            color.stroke_width(2)
        };
        ch.draw_series(LineSeries::new(series.clone(), style))?
            .label(sys.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        ch.draw_series(
            series
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    ch.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn summary(rows: &[Row]) {
    for r in rows {
        match &r.error {
            None => eprintln!(
                "{:>10} {:>8}: {:>10.0} ops/s {:>8.3} Gbit/s  p50 {:>8.1} us  p99 {:>8.1} us",
                r.system.name(),
                size_label(r.size),
                r.ops_per_s(),
                r.gbit_per_s(),
                r.quantile_us(0.5).unwrap_or(f64::NAN),
                r.quantile_us(0.99).unwrap_or(f64::NAN)
            ),
            Some(e) => eprintln!(
                "{:>10} {:>8}: no figures: {e}",
                r.system.name(),
                size_label(r.size)
            ),
        }
    }
}

fn main() -> io::Result<()> {
    let a = Args::parse();
    let t0 = Instant::now();
    let rows = run(&a);
    summary(&rows);
    let text = csv(&rows);
    match &a.csv {
        Some(p) => File::create(p)?.write_all(text.as_bytes())?,
        None => io::stdout().write_all(text.as_bytes())?,
    }
    if let Some(p) = &a.svg {
        if let Err(e) = plot(p, &rows, a.qd.clamp(1, 64)) {
            eprintln!("plot failed: {e}");
            std::process::exit(1);
        }
        eprintln!("plot written to {p}");
    }
    eprintln!("total {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}

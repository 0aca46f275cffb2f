//! copyrpc on the device model: throughput at a fixed queue depth over 1, 4 and 16 endpoints,
//! ping-pong latency, batch-size distribution, and a single-threaded lock-step mode shaped
//! for callgrind (instructions per RPC on the client and server paths, excluding the model:
//! `scripts/callgrind-copyrpc.sh`).
//!
//! Workload: echo RPCs with `--size` byte requests and responses (default 32 B), raw copyrpc
//! API (`Context::call`/`poll`/`recv`/`reply`), one client context (one thread) driving
//! `--endpoints` endpoints round-robin with `--qd` calls in flight in total, one server
//! context (one thread) replying to each request at once. Every response is checked (length
//! and the call's sequence number in its first 8 bytes).
//!
//! ```text
//! cargo run --release --example copyrpc_bench -- throughput            # E = 1, 4, 16 at QD 256
//! cargo run --release --example copyrpc_bench -- throughput --endpoints 4 --qd 64 --json
//! cargo run --release --example copyrpc_bench -- pingpong --duration 2
//! cargo run --release --example copyrpc_bench -- lockstep 100000       # for callgrind
//! ```
//! The model executes every WQE inside the doorbell under one fabric mutex, so its figures
//! measure the protocol plus the model on this machine, not a NIC; compare ratios within one
//! run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use rpc::copyrpc::stats::BATCH_BUCKETS;
use rpc::copyrpc::{
    CallError, CallErrorKind, Context, ContextConfig, EndpointConfig, EndpointId, Stats,
};
use rpc::mlx5::sim::{Fabric, SimConfig};

#[derive(Parser, Debug)]
#[command(about = "copyrpc throughput, latency and instruction counts on the device model")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Closed-loop throughput with `qd` calls in flight over `endpoints` endpoints.
    Throughput {
        /// Endpoints (comma-separated list runs each in turn).
        #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
        endpoints: Vec<usize>,
        /// Calls in flight in total.
        #[arg(long, default_value_t = 256)]
        qd: usize,
        /// Request and response payload bytes (>= 8).
        #[arg(long, default_value_t = 32)]
        size: usize,
        /// Ring size in bytes per endpoint.
        #[arg(long, default_value_t = 1 << 20)]
        ring: usize,
        /// Seconds per configuration.
        #[arg(long, default_value_t = 2.0)]
        duration: f64,
        /// JSON lines instead of CSV.
        #[arg(long)]
        json: bool,
    },
    /// One call in flight: round-trip latency.
    Pingpong {
        /// Payload bytes (>= 8).
        #[arg(long, default_value_t = 32)]
        size: usize,
        /// Seconds.
        #[arg(long, default_value_t = 2.0)]
        duration: f64,
        /// JSON instead of CSV.
        #[arg(long)]
        json: bool,
    },
    /// Single thread, client and server polled alternately; `rpcs` RPCs at depth `qd`.
    Lockstep {
        /// RPCs to run (measured; a warm-up of 4096 precedes them).
        #[arg(default_value_t = 100_000)]
        rpcs: u64,
        /// Calls issued per round.
        #[arg(long, default_value_t = 1)]
        qd: usize,
        /// Payload bytes (>= 8).
        #[arg(long, default_value_t = 32)]
        size: usize,
        /// How the server answers: `copy` (`recv`, copy the request out, `reply`: the raw
        /// API's two-step path) or `in-place` (`serve_next`: the request read in the
        /// receive ring and the reply written in the send ring, the typed server's path).
        #[arg(long, value_enum, default_value_t = Serve::Copy)]
        serve: Serve,
    },
}

/// How the lock-step server answers (see `Lockstep::serve`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Serve {
    Copy,
    InPlace,
}

fn main() {
    match Cli::parse().cmd {
        Cmd::Throughput {
            endpoints,
            qd,
            size,
            ring,
            duration,
            json,
        } => {
            if !json {
                println!(
                    "endpoints,qd,size,mops,mean_batch,doorbells_per_rpc,wrap_markers,{}",
                    (0..BATCH_BUCKETS)
                        .map(|i| format!("batches_le_{}", Stats::bucket_limit(i)))
                        .collect::<Vec<_>>()
                        .join(",")
                );
            }
            for e in endpoints {
                let r = throughput(e, qd, size.max(8), ring, Duration::from_secs_f64(duration));
                r.print(json);
            }
        }
        Cmd::Pingpong {
            size,
            duration,
            json,
        } => pingpong(size.max(8), Duration::from_secs_f64(duration), json),
        Cmd::Lockstep {
            rpcs,
            qd,
            size,
            serve,
        } => lockstep(rpcs, qd.max(1), size.max(8), serve),
    }
}

/// A connected client/server pair of contexts with `n` endpoints each.
fn setup(fabric: &Fabric, n: usize, ring: usize) -> (Context<u64>, Context<()>, Vec<EndpointId>) {
    let (dc, ds) = (fabric.open(), fabric.open());
    let mut c = Context::<u64>::new(&dc, ContextConfig::default()).expect("client context");
    let mut s = Context::<()>::new(&ds, ContextConfig::default()).expect("server context");
    let cfg = EndpointConfig {
        ring_size: ring,
        ..EndpointConfig::default()
    };
    let mut eps = Vec::with_capacity(n);
    for _ in 0..n {
        let ec = c.create_endpoint(&cfg).expect("endpoint");
        let es = s.create_endpoint(&cfg).expect("endpoint");
        let (ic, is) = (c.local_info(ec).unwrap(), s.local_info(es).unwrap());
        c.connect(ec, &is).expect("connect");
        s.connect(es, &ic).expect("connect");
        eps.push(ec);
    }
    (c, s, eps)
}

/// Echoes every available request (`scratch`: a buffer of at least the payload size, since
/// the request borrows the context that the reply needs; with [`Serve::InPlace`] only the
/// spare buffer of a reply that cannot be written).
#[inline(never)]
fn server_serve(s: &mut Context<()>, scratch: &mut [u8], serve: Serve) -> usize {
    s.poll(|_, _| {});
    let mut n = 0;
    if serve == Serve::InPlace {
        let max = scratch.len() as u32;
        while let Some(r) = s.serve_next(max, scratch, |req, out| {
            let len = req.len().min(out.len());
            out[..len].copy_from_slice(&req[..len]);
            len
        }) {
            r.expect("reply");
            n += 1;
        }
        if n > 0 {
            s.flush();
        }
        return n;
    }
    while let Some((h, req)) = s.recv() {
        let len = req.len().min(scratch.len());
        scratch[..len].copy_from_slice(&req[..len]);
        s.reply(h, &scratch[..len]).expect("reply");
        n += 1;
    }
    if n > 0 {
        s.flush();
    }
    n
}

/// Issues call `seq` on endpoint `ep`; false if copyrpc asked to poll first.
#[inline(never)]
fn client_issue(c: &mut Context<u64>, ep: EndpointId, seq: u64, size: usize) -> bool {
    let r = c.call_with(ep, size as u32, seq, size as u32, |b| {
        b[..8].copy_from_slice(&seq.to_le_bytes());
        size
    });
    match r {
        Ok(_) => true,
        Err(CallError {
            kind: CallErrorKind::InsufficientCredit | CallErrorKind::RingFull,
            ..
        }) => false,
        Err(e) => panic!("call failed: {e}"),
    }
}

/// Polls the client context; checks every response. Returns how many completed.
#[inline(never)]
fn client_poll(c: &mut Context<u64>, size: usize) -> usize {
    let mut n = 0;
    c.poll(|seq, resp| {
        let resp = resp.expect("call failed");
        assert!(
            resp.len() == size && resp[..8] == seq.to_le_bytes(),
            "bad response to call {seq}"
        );
        n += 1;
    });
    n
}

struct ThroughputResult {
    endpoints: usize,
    qd: usize,
    size: usize,
    mops: f64,
    stats: Stats,
    server_stats: Stats,
}

impl ThroughputResult {
    fn print(&self, json: bool) {
        let rpcs = self.stats.calls.max(1) as f64;
        let doorbells = (self.stats.doorbells + self.server_stats.doorbells) as f64 / rpcs;
        let mean_batch = (self.stats.mean_batch() + self.server_stats.mean_batch()) / 2.0;
        // Batch sizes of both directions.
        let buckets: Vec<u64> = (0..BATCH_BUCKETS)
            .map(|i| self.stats.batch_sizes[i] + self.server_stats.batch_sizes[i])
            .collect();
        if json {
            println!(
                "{{\"endpoints\":{},\"qd\":{},\"size\":{},\"mops\":{:.4},\"mean_batch\":{:.2},\"doorbells_per_rpc\":{:.4},\"wrap_markers\":{},\"batch_buckets\":{:?},\"client_mean_batch\":{:.2},\"server_mean_batch\":{:.2}}}",
                self.endpoints,
                self.qd,
                self.size,
                self.mops,
                mean_batch,
                doorbells,
                self.stats.wrap_markers + self.server_stats.wrap_markers,
                buckets,
                self.stats.mean_batch(),
                self.server_stats.mean_batch(),
            );
        } else {
            println!(
                "{},{},{},{:.4},{:.2},{:.4},{},{}",
                self.endpoints,
                self.qd,
                self.size,
                self.mops,
                mean_batch,
                doorbells,
                self.stats.wrap_markers + self.server_stats.wrap_markers,
                buckets
                    .iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            );
        }
    }
}

fn throughput(
    endpoints: usize,
    qd: usize,
    size: usize,
    ring: usize,
    dur: Duration,
) -> ThroughputResult {
    let fabric = Fabric::new(SimConfig::default());
    let (mut c, mut s, eps) = setup(&fabric, endpoints, ring);
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut scratch = vec![0u8; size];
            while !stop.load(Ordering::Relaxed) {
                server_serve(&mut s, &mut scratch, Serve::Copy);
            }
            *s.stats()
        })
    };
    let mut seq = 0u64;
    let mut in_flight = 0usize;
    let mut next_ep = 0usize;
    let mut done = 0u64;
    let warm = Instant::now() + dur / 5;
    let mut t0 = None;
    let mut start_done = 0;
    let mut start_stats = Stats::default();
    loop {
        while in_flight < qd {
            if !client_issue(&mut c, eps[next_ep], seq, size) {
                break;
            }
            next_ep = (next_ep + 1) % eps.len();
            seq += 1;
            in_flight += 1;
        }
        let n = client_poll(&mut c, size);
        in_flight -= n;
        done += n as u64;
        let now = Instant::now();
        match t0 {
            None if now >= warm => {
                t0 = Some(now);
                start_done = done;
                start_stats = *c.stats();
            }
            Some(t) if now - t >= dur => break,
            _ => {}
        }
    }
    let elapsed = t0.unwrap().elapsed().as_secs_f64();
    let measured = done - start_done;
    stop.store(true, Ordering::Relaxed);
    let server_stats = server.join().expect("server");
    let mut stats = *c.stats();
    // Client counters over the measured window only.
    stats.calls -= start_stats.calls;
    stats.doorbells -= start_stats.doorbells;
    stats.batches_sent -= start_stats.batches_sent;
    for i in 0..BATCH_BUCKETS {
        stats.batch_sizes[i] -= start_stats.batch_sizes[i];
    }
    ThroughputResult {
        endpoints,
        qd,
        size,
        mops: measured as f64 / elapsed / 1e6,
        stats,
        server_stats,
    }
}

fn pingpong(size: usize, dur: Duration, json: bool) {
    let fabric = Fabric::new(SimConfig::default());
    let (mut c, mut s, eps) = setup(&fabric, 1, 1 << 20);
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut scratch = vec![0u8; size];
            while !stop.load(Ordering::Relaxed) {
                server_serve(&mut s, &mut scratch, Serve::Copy);
            }
        })
    };
    let mut hist = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).unwrap();
    let end = Instant::now() + dur;
    let mut seq = 0u64;
    while Instant::now() < end {
        let t = Instant::now();
        assert!(client_issue(&mut c, eps[0], seq, size));
        while client_poll(&mut c, size) == 0 {}
        hist.record(t.elapsed().as_nanos() as u64).unwrap();
        seq += 1;
    }
    stop.store(true, Ordering::Relaxed);
    server.join().expect("server");
    let (p50, p99, p999) = (
        hist.value_at_quantile(0.5),
        hist.value_at_quantile(0.99),
        hist.value_at_quantile(0.999),
    );
    if json {
        println!(
            "{{\"size\":{size},\"rpcs\":{seq},\"p50_ns\":{p50},\"p99_ns\":{p99},\"p999_ns\":{p999},\"mean_ns\":{:.0}}}",
            hist.mean()
        );
    } else {
        println!("size,rpcs,p50_ns,p99_ns,p999_ns,mean_ns");
        println!("{size},{seq},{p50},{p99},{p999},{:.0}", hist.mean());
    }
}

/// One lock-step round: the client issues `qd` calls, the server serves them, the client
/// collects the responses. The function callgrind toggles on.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn round(
    c: &mut Context<u64>,
    s: &mut Context<()>,
    scratch: &mut [u8],
    ep: EndpointId,
    seq: &mut u64,
    qd: usize,
    size: usize,
    serve: Serve,
) {
    for _ in 0..qd {
        assert!(client_issue(c, ep, *seq, size));
        *seq += 1;
    }
    let mut got = client_poll(c, size); // flushes the requests
    let mut served = 0;
    while served < qd {
        served += server_serve(s, scratch, serve);
    }
    while got < qd {
        got += client_poll(c, size);
    }
}

fn lockstep(rpcs: u64, qd: usize, size: usize, serve: Serve) {
    // No progress thread: callgrind's instruction counts must come from this thread only.
    let fabric = Fabric::new(SimConfig::deterministic());
    let (mut c, mut s, eps) = setup(&fabric, 1, 1 << 20);
    let mut seq = 0u64;
    let mut scratch = vec![0u8; size];
    let mut step = || {
        round(
            &mut c,
            &mut s,
            &mut scratch,
            eps[0],
            &mut seq,
            qd,
            size,
            serve,
        )
    };
    for _ in 0..4096 / qd {
        step();
    }
    let rounds = rpcs.div_ceil(qd as u64);
    let t = Instant::now();
    for _ in 0..rounds {
        step();
    }
    let el = t.elapsed();
    let n = rounds * qd as u64;
    println!(
        "{n} rpcs verified at depth {qd}, {size} B; {:.0} ns/rpc; client batches {}, server batches {}",
        el.as_nanos() as f64 / n as f64,
        c.stats().batches_sent,
        s.stats().batches_sent
    );
}

//! `kv`: the key-value benchmark of seeds/004 on one node, over typed `#[rpc_service]` stubs
//! and the shared-memory delegation ring.
//!
//! Topology (seeds/004 §1.3, §7, §9, single rank): `D` daemon threads each own a shard
//! (`key % D`) and serve it through their own delegation ring in `/dev/shm`; `C` client
//! threads run a closed loop with `QD` calls in flight each, sending every request to the
//! owner daemon's ring. Access patterns (key, read/write) are pre-generated per client
//! (seeds/004 §9 step 2): uniform or zipfian (θ = 0.99 by default) keys, with a read ratio.
//!
//! Correctness: a client only writes keys `k` with `k % C == its id`, so every key has one
//! writer, whose successive calls reach the owner daemon in issue order (one client's
//! `fetch_add`s on a ring are ordered). Values encode `(writer << 48) | seq`, so every read
//! is checked for a plausible writer during the run, and at the end a sample of written keys
//! is read back and must return the last value written.
//!
//! ```text
//! cargo run --release --example kv                      # all in one process, ~10 s
//! cargo run --release --example kv -- --help
//! kv serve --shm kvbench --daemons 2                    # process 1: daemons
//! kv client --shm kvbench --clients 2                   # process 2: clients + check
//! ```

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use crossbeam_utils::{Backoff, CachePadded};
use hdrhistogram::Histogram;
use idl::kv::{KvClient, KvResponse, KvServer, KvService, owner_daemon};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Zipf};
use rpc::delegation::{Delegation, DelegationConfig, DelegationServer};
use rpc::{RpcError, Server};
use rustc_hash::FxHashMap;

#[derive(Parser, Debug)]
#[command(
    about = "Distributed key-value benchmark (seeds/004) over the delegation ring",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Daemons and clients in this process (the default when no subcommand is given).
    Run(RunArgs),
    /// Only the daemons: create `<shm>-0 .. <shm>-{D-1}` and serve until SIGINT/SIGTERM or
    /// `--duration`.
    Serve(ServeArgs),
    /// Only the clients, attached to the rings of a `kv serve` process.
    Client(ClientArgs),
}

#[derive(Args, Debug, Clone)]
struct RunArgs {
    /// Daemon (shard server) threads.
    #[arg(long, short = 'd', default_value_t = 1)]
    daemons: usize,
    #[command(flatten)]
    ring: RingArgs,
    #[command(flatten)]
    load: LoadArgs,
    #[command(flatten)]
    out: OutArgs,
}

#[derive(Args, Debug, Clone)]
struct ServeArgs {
    /// Base name of the rings in /dev/shm.
    #[arg(long)]
    shm: String,
    /// Daemon (shard server) threads.
    #[arg(long, short = 'd', default_value_t = 1)]
    daemons: usize,
    #[command(flatten)]
    ring: RingArgs,
    /// Stop after this many seconds (0: until SIGINT/SIGTERM).
    #[arg(long, default_value_t = 0.0)]
    duration: f64,
}

#[derive(Args, Debug, Clone)]
struct ClientArgs {
    /// Base name of the rings in /dev/shm (as given to `kv serve`).
    #[arg(long)]
    shm: String,
    #[command(flatten)]
    load: LoadArgs,
    #[command(flatten)]
    out: OutArgs,
}

#[derive(Args, Debug, Clone)]
struct RingArgs {
    /// Request slots per ring (power of two; seeds/004 §9: 1024).
    #[arg(long, default_value_t = 1024)]
    ring_depth: u32,
    /// Most clients per ring.
    #[arg(long, default_value_t = 64)]
    max_clients: u32,
    /// Response slots per client (power of two, at least the largest queue depth used).
    #[arg(long, default_value_t = 64)]
    resp_depth: u32,
}

#[derive(Args, Debug, Clone)]
struct LoadArgs {
    /// Client threads.
    #[arg(long, short = 'c', default_value_t = 1)]
    clients: usize,
    /// Calls in flight per client thread (closed loop).
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// Fraction of gets (the rest are puts).
    #[arg(long, default_value_t = 0.5)]
    read_ratio: f64,
    /// Key range: keys are 0..keys.
    #[arg(long, default_value_t = 1 << 20)]
    keys: u64,
    /// Key distribution.
    #[arg(long, value_enum, default_value_t = Dist::Uniform)]
    dist: Dist,
    /// Zipf exponent θ (with --dist zipf).
    #[arg(long, default_value_t = 0.99)]
    theta: f64,
    /// Measured run time in seconds.
    #[arg(long, default_value_t = 8.0)]
    duration: f64,
    /// Pre-generated operations per client (the pattern is replayed cyclically).
    #[arg(long, default_value_t = 1 << 20)]
    pattern_len: usize,
    /// RNG seed (same seed, same access patterns).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Written keys read back by the end-of-run correctness check.
    #[arg(long, default_value_t = 10_000)]
    check_samples: usize,
}

#[derive(Args, Debug, Clone)]
struct OutArgs {
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Print the summary as CSV (header + one row) on stdout.
    #[arg(long, conflicts_with = "json")]
    csv: bool,
    /// No per-second progress lines.
    #[arg(long)]
    quiet: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Dist {
    Uniform,
    Zipf,
}

/// One shard: the daemon's store, served through the generated `KvServer` trait.
#[derive(Default)]
struct Shard {
    map: FxHashMap<u64, u64>,
}

impl KvServer for Shard {
    fn put(&mut self, _rank: u32, key: u64, value: u64) {
        self.map.insert(key, value);
    }
    fn get(&mut self, _rank: u32, key: u64) -> Option<u64> {
        self.map.get(&key).copied()
    }
}

/// A pre-generated operation.
#[derive(Clone, Copy, Debug)]
struct Op {
    key: u64,
    read: bool,
}

const SEQ_BITS: u32 = 48;

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd.unwrap_or(Cmd::Run(cli.run)) {
        Cmd::Run(a) => run_all(a),
        Cmd::Serve(a) => serve(a),
        Cmd::Client(a) => client_only(a),
    };
    std::process::exit(code);
}

fn ring_name(base: &str, d: usize) -> String {
    format!("{}-{d}", base.trim_start_matches('/'))
}

fn delegation_config(r: &RingArgs, qd: usize) -> Result<DelegationConfig, String> {
    if !r.resp_depth.is_power_of_two() || (r.resp_depth as usize) < qd.max(1) {
        return Err(format!(
            "--resp-depth {} must be a power of two >= --qd {qd}",
            r.resp_depth
        ));
    }
    Ok(DelegationConfig {
        max_clients: r.max_clients,
        ring_depth: r.ring_depth,
        resp_depth: r.resp_depth,
        ..DelegationConfig::default()
    })
}

type KvServerCore = Server<KvService, DelegationServer>;

/// Creates one ring per daemon and starts the daemon threads.
fn start_daemons(
    base: &str,
    daemons: usize,
    cfg: DelegationConfig,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<thread::JoinHandle<DaemonReport>>, RpcError> {
    let mut servers = Vec::with_capacity(daemons);
    for d in 0..daemons {
        servers.push(DelegationServer::serve::<KvService>(
            &ring_name(base, d),
            cfg,
        )?);
    }
    Ok(servers
        .into_iter()
        .enumerate()
        .map(|(d, server)| {
            let stop = stop.clone();
            thread::Builder::new()
                .name(format!("daemon-{d}"))
                .spawn(move || daemon_loop(server, &stop))
                .expect("spawn daemon")
        })
        .collect())
}

#[derive(Debug, Default)]
struct DaemonReport {
    requests: u64,
    bad_requests: u64,
    dropped_replies: u64,
    keys: usize,
}

/// The daemon event loop (seeds/004 §6, single rank: only the local ring).
fn daemon_loop(mut server: KvServerCore, stop: &AtomicBool) -> DaemonReport {
    let mut shard = Shard::default();
    let backoff = Backoff::new();
    while !stop.load(Ordering::Relaxed) {
        if server.serve_once(|req| KvService::dispatch(&mut shard, req)) == 0 {
            backoff.snooze();
        } else {
            backoff.reset();
        }
    }
    let s = server.stats();
    DaemonReport {
        requests: s.requests,
        bad_requests: s.bad_requests,
        dropped_replies: s.dropped_replies,
        keys: shard.map.len(),
    }
}

fn run_all(a: RunArgs) -> i32 {
    let cfg = match delegation_config(&a.ring, a.load.qd) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    if a.daemons == 0 {
        return fail("--daemons must be at least 1");
    }
    let base = format!("kv-{}", std::process::id());
    let stop = Arc::new(AtomicBool::new(false));
    let daemons = match start_daemons(&base, a.daemons, cfg, &stop) {
        Ok(d) => d,
        Err(e) => return fail(&format!("creating the rings: {e}")),
    };
    let names: Vec<String> = (0..a.daemons).map(|d| ring_name(&base, d)).collect();
    let result = run_clients(&names, &a.load, &a.out);
    stop.store(true, Ordering::Relaxed);
    let mut reports = Vec::new();
    for d in daemons {
        reports.push(d.join().expect("daemon panicked"));
    }
    finish(result, &reports, &a.load, &a.out, a.daemons)
}

fn serve(a: ServeArgs) -> i32 {
    let cfg = match delegation_config(&a.ring, 1) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            return fail(&format!("installing the signal handler: {e}"));
        }
    }
    let daemons = match start_daemons(&a.shm, a.daemons, cfg, &stop) {
        Ok(d) => d,
        Err(e) => return fail(&format!("creating the rings: {e}")),
    };
    println!(
        "ready shm={} daemons={}",
        a.shm.trim_start_matches('/'),
        a.daemons
    );
    let _ = std::io::stdout().flush();
    let t0 = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(20));
        if a.duration > 0.0 && t0.elapsed().as_secs_f64() >= a.duration {
            stop.store(true, Ordering::Relaxed);
        }
    }
    for (d, h) in daemons.into_iter().enumerate() {
        let r = h.join().expect("daemon panicked");
        println!(
            "daemon {d}: requests={} bad_requests={} dropped_replies={} keys={}",
            r.requests, r.bad_requests, r.dropped_replies, r.keys
        );
    }
    0
}

fn client_only(a: ClientArgs) -> i32 {
    let mut names = Vec::new();
    while std::path::Path::new(&format!("/dev/shm/{}", ring_name(&a.shm, names.len()))).exists() {
        names.push(ring_name(&a.shm, names.len()));
    }
    if names.is_empty() {
        return fail(&format!(
            "no ring /dev/shm/{} (start `kv serve --shm {}` first)",
            ring_name(&a.shm, 0),
            a.shm
        ));
    }
    let daemons = names.len();
    let result = run_clients(&names, &a.load, &a.out);
    finish(result, &[], &a.load, &a.out, daemons)
}

fn fail(msg: &str) -> i32 {
    eprintln!("kv: {msg}");
    2
}

/// What one client thread measured.
struct ClientReport {
    ops: u64,
    gets: u64,
    hits: u64,
    errors: u64,
    hist: Histogram<u64>,
    /// Last value written to each sampled key (keys `k % SAMPLE_EVERY == 0`).
    written: FxHashMap<u64, u64>,
}

const SAMPLE_EVERY: u64 = 8;

struct RunResult {
    elapsed: Duration,
    clients: Vec<ClientReport>,
    check: Result<CheckReport, String>,
}

struct CheckReport {
    checked: usize,
    mismatches: usize,
    /// The run wrote no sampled key, so the checker wrote (and read back) its own.
    self_written: bool,
}

fn gen_pattern(load: &LoadArgs, client: usize) -> Vec<Op> {
    let mut rng =
        SmallRng::seed_from_u64(load.seed ^ (client as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let zipf = Zipf::new(load.keys as f64, load.theta).expect("zipf parameters");
    let c = load.clients as u64;
    (0..load.pattern_len.max(1))
        .map(|_| {
            let mut key = match load.dist {
                Dist::Uniform => rng.random_range(0..load.keys),
                // Zipf ranks 1..=n, scattered over the key space so hot keys spread over shards.
                Dist::Zipf => {
                    ((zipf.sample(&mut rng) as u64 - 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                        % load.keys
                }
            };
            let read = rng.random_bool(load.read_ratio.clamp(0.0, 1.0));
            if !read {
                // Single writer per key: this client writes only keys congruent to its id.
                key = key - key % c + client as u64;
                if key >= load.keys {
                    key -= c;
                }
            }
            Op { key, read }
        })
        .collect()
}

fn run_clients(names: &[String], load: &LoadArgs, out: &OutArgs) -> RunResult {
    if load.clients == 0 || load.qd == 0 || load.keys < load.clients as u64 {
        eprintln!("kv: need --clients >= 1, --qd >= 1 and --keys >= --clients");
        std::process::exit(2);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let counters: Arc<Vec<CachePadded<AtomicU64>>> = Arc::new(
        (0..load.clients)
            .map(|_| CachePadded::new(AtomicU64::new(0)))
            .collect(),
    );
    let start = Arc::new(std::sync::Barrier::new(load.clients + 1));
    let mut handles = Vec::new();
    for c in 0..load.clients {
        let (names, load, stop, counters, start) = (
            names.to_vec(),
            load.clone(),
            stop.clone(),
            counters.clone(),
            start.clone(),
        );
        handles.push(
            thread::Builder::new()
                .name(format!("client-{c}"))
                .spawn(move || {
                    let pattern = gen_pattern(&load, c);
                    let rings = names
                        .iter()
                        .map(|n| KvClient::<Delegation>::connect(n))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| e.to_string());
                    start.wait();
                    let rings = rings?;
                    // Every call of the closed loop may go to the same ring.
                    if let Some(r) = rings.iter().find(|r| r.max_in_flight() < load.qd) {
                        return Err(format!(
                            "--qd {} exceeds the ring's {} response slots per client (kv serve --resp-depth)",
                            load.qd,
                            r.max_in_flight()
                        ));
                    }
                    client_loop(c, rings, &pattern, &load, &stop, &counters[c]).map_err(|e| e.to_string())
                })
                .expect("spawn client"),
        );
    }
    start.wait();
    let t0 = Instant::now();
    let mut last = 0u64;
    let mut tick = t0;
    while t0.elapsed().as_secs_f64() < load.duration {
        let left = load.duration - t0.elapsed().as_secs_f64();
        thread::sleep(Duration::from_secs_f64(left.clamp(0.0, 1.0)));
        let total: u64 = counters.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        let now = Instant::now();
        if !out.quiet {
            eprintln!(
                "[{:5.1} s] {:8.3} Mops/s",
                t0.elapsed().as_secs_f64(),
                (total - last) as f64 / now.duration_since(tick).as_secs_f64() / 1e6
            );
        }
        last = total;
        tick = now;
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = t0.elapsed();
    let mut clients = Vec::new();
    let mut failure = None;
    for h in handles {
        match h.join().expect("client panicked") {
            Ok(r) => clients.push(r),
            Err(e) => failure = Some(format!("client failed: {e}")),
        }
    }
    let check = match failure {
        Some(f) => Err(f),
        None => check_written(names, &clients, load.check_samples),
    };
    RunResult {
        elapsed,
        clients,
        check,
    }
}

/// The closed loop of one client thread (seeds/004 §7, single rank: every call is local and
/// goes to the owner daemon's ring).
fn client_loop(
    id: usize,
    mut rings: Vec<KvClient>,
    pattern: &[Op],
    load: &LoadArgs,
    stop: &AtomicBool,
    counter: &AtomicU64,
) -> Result<ClientReport, RpcError> {
    let qd = load.qd;
    let d = rings.len();
    let writers = load.clients as u64;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let mut written = FxHashMap::default();
    // Per tag (0..qd): when it was issued and what it was.
    let mut inflight: Vec<(Instant, Op)> = vec![(Instant::now(), Op { key: 0, read: true }); qd];
    let mut done: Vec<u64> = Vec::with_capacity(qd);
    let (mut next, mut seq, mut ops, mut gets, mut hits, mut errors) =
        (0usize, 0u64, 0u64, 0u64, 0u64, 0u64);
    let mut outstanding = 0usize;

    let mut issue = |tag: u64,
                     rings: &mut [KvClient],
                     written: &mut FxHashMap<u64, u64>,
                     inflight: &mut [(Instant, Op)]|
     -> Result<(), RpcError> {
        let op = pattern[next];
        next = if next + 1 == pattern.len() {
            0
        } else {
            next + 1
        };
        let ring = &mut rings[owner_daemon(op.key, d)];
        inflight[tag as usize] = (Instant::now(), op);
        if op.read {
            ring.issue(tag).get(0, op.key)
        } else {
            seq += 1;
            let value = ((id as u64) << SEQ_BITS) | (seq & ((1 << SEQ_BITS) - 1));
            if op.key % SAMPLE_EVERY == 0 {
                written.insert(op.key, value);
            }
            ring.issue(tag).put(0, op.key, value)
        }
    };

    for tag in 0..qd as u64 {
        issue(tag, &mut rings, &mut written, &mut inflight)?;
        outstanding += 1;
    }
    let backoff = Backoff::new();
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if stopping && outstanding == 0 {
            break;
        }
        for ring in rings.iter_mut() {
            ring.poll_with(|tag, r| {
                let (t, op) = inflight[tag as usize];
                let ns = t.elapsed().as_nanos() as u64;
                let _ = hist.record(ns.max(1));
                ops += 1;
                match r {
                    Ok(KvResponse::Get(v)) if op.read => {
                        gets += 1;
                        if let Some(v) = v {
                            hits += 1;
                            // Single writer per key: the value must come from the key's writer.
                            if v >> SEQ_BITS != op.key % writers {
                                errors += 1;
                            }
                        }
                    }
                    Ok(KvResponse::Put(())) if !op.read => {}
                    _ => errors += 1,
                }
                done.push(tag);
            })?;
        }
        if done.is_empty() {
            backoff.snooze();
            continue;
        }
        backoff.reset();
        counter.store(ops, Ordering::Relaxed);
        outstanding -= done.len();
        if !stopping {
            for &tag in &done {
                issue(tag, &mut rings, &mut written, &mut inflight)?;
                outstanding += 1;
            }
        }
        done.clear();
    }
    counter.store(ops, Ordering::Relaxed);
    Ok(ClientReport {
        ops,
        gets,
        hits,
        errors,
        hist,
        written,
    })
}

/// Reads back a sample of written keys through fresh clients (blocking calls) and compares
/// them with the last value each key's single writer wrote. A run that wrote nothing
/// (`--read-ratio 1`) has nothing to compare, so the checker then writes its own sample keys
/// (values with writer id `clients`, which no run client uses) and reads them back.
fn check_written(
    names: &[String],
    clients: &[ClientReport],
    samples: usize,
) -> Result<CheckReport, String> {
    let mut rings = names
        .iter()
        .map(|n| KvClient::<Delegation>::connect(n))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("check client: {e}"))?;
    let mut all: Vec<(u64, u64)> = clients
        .iter()
        .flat_map(|c| c.written.iter().map(|(&k, &v)| (k, v)))
        .collect();
    let self_written = all.is_empty();
    if self_written {
        let writer = (clients.len() as u64) << SEQ_BITS;
        for i in 0..samples.max(1) as u64 {
            let (key, value) = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20, writer | i);
            rings[owner_daemon(key, names.len())]
                .put(0, key, value)
                .map_err(|e| format!("check put({key}): {e}"))?;
            all.push((key, value));
        }
        // Later writes of a repeated key win.
        all.reverse();
        all.dedup_by_key(|kv| kv.0);
    }
    let step = (all.len() / samples.max(1)).max(1);
    let (mut checked, mut mismatches) = (0, 0);
    for &(key, want) in all.iter().step_by(step).take(samples) {
        let got = rings[owner_daemon(key, names.len())]
            .get(0, key)
            .map_err(|e| format!("check get({key}): {e}"))?;
        checked += 1;
        if got != Some(want) {
            if mismatches < 5 {
                eprintln!("kv: check: key {key}: read {got:?}, last written Some({want})");
            }
            mismatches += 1;
        }
    }
    Ok(CheckReport {
        checked,
        mismatches,
        self_written,
    })
}

fn finish(
    r: RunResult,
    daemons: &[DaemonReport],
    load: &LoadArgs,
    out: &OutArgs,
    ndaemons: usize,
) -> i32 {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let (mut ops, mut gets, mut hits, mut errors) = (0, 0, 0, 0);
    for c in &r.clients {
        hist.add(&c.hist).expect("histogram merge");
        ops += c.ops;
        gets += c.gets;
        hits += c.hits;
        errors += c.errors;
    }
    let secs = r.elapsed.as_secs_f64();
    let mops = ops as f64 / secs / 1e6;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1e3;
    let bad_requests: u64 = daemons.iter().map(|d| d.bad_requests).sum();
    let (check_ok, checked, mismatches, check_msg) = match &r.check {
        Ok(c) => (
            c.mismatches == 0 && c.checked > 0,
            c.checked,
            c.mismatches,
            if c.self_written {
                "the run wrote nothing: keys written by the checker".to_string()
            } else {
                String::new()
            },
        ),
        Err(e) => (false, 0, 0, e.clone()),
    };
    let pass = check_ok && errors == 0 && bad_requests == 0;
    let dist = match load.dist {
        Dist::Uniform => "uniform".to_string(),
        Dist::Zipf => format!("zipf({})", load.theta),
    };
    if out.json {
        let v = serde_json::json!({
            "transport": "delegation", "daemons": ndaemons, "clients": load.clients, "qd": load.qd,
            "read_ratio": load.read_ratio, "keys": load.keys, "dist": dist, "seconds": secs,
            "ops": ops, "mops": mops, "p50_us": us(0.5), "p99_us": us(0.99), "p999_us": us(0.999),
            "gets": gets, "get_hits": hits, "errors": errors, "bad_requests": bad_requests,
            "check_samples": checked, "check_mismatches": mismatches, "check_passed": pass,
            "check_note": check_msg,
        });
        println!("{v}");
    } else if out.csv {
        println!(
            "transport,daemons,clients,qd,read_ratio,keys,dist,seconds,ops,mops,p50_us,p99_us,p999_us,gets,get_hits,errors,check_samples,check_mismatches,check_passed"
        );
        println!(
            "delegation,{ndaemons},{},{},{},{},{dist},{secs:.3},{ops},{mops:.4},{:.2},{:.2},{:.2},{gets},{hits},{errors},{checked},{mismatches},{pass}",
            load.clients,
            load.qd,
            load.read_ratio,
            load.keys,
            us(0.5),
            us(0.99),
            us(0.999)
        );
    } else {
        println!(
            "kv over delegation: {ndaemons} daemon(s), {} client(s), QD {}, {:.0}% gets, {} keys {dist}, {secs:.1} s",
            load.clients,
            load.qd,
            load.read_ratio * 100.0,
            load.keys
        );
        println!("  throughput  {mops:.3} Mops/s ({ops} ops)");
        println!(
            "  latency     p50 {:.2} us   p99 {:.2} us   p999 {:.2} us",
            us(0.5),
            us(0.99),
            us(0.999)
        );
        println!(
            "  gets        {gets} ({hits} found)   errors {errors}   bad requests {bad_requests}"
        );
        println!(
            "  check       {}: {checked} written keys read back, {mismatches} mismatches{}",
            if pass { "PASSED" } else { "FAILED" },
            if check_msg.is_empty() {
                String::new()
            } else {
                format!(" ({check_msg})")
            }
        );
    }
    if pass { 0 } else { 1 }
}

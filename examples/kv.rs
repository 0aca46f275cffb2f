//! `kv`: the key-value benchmark of seeds/004, over typed `#[rpc_service]` stubs, the
//! shared-memory delegation ring and, across ranks, copyrpc on the device model.
//!
//! Topology of one rank (seeds/004 §1.3, §7, §9): `D` daemon threads each own a shard
//! (`key % D`) and serve it through their own delegation ring in `/dev/shm`; `C` client
//! threads run a closed loop with `QD` calls in flight each, sending every request for their
//! own rank to the owner daemon's ring. Access patterns (rank, key, read/write) are
//! pre-generated per client (seeds/004 §9 step 2): uniform or zipfian (θ = 0.99 by default)
//! keys, with a read ratio, and (with `--ranks R > 1`) a target rank uniform over the ranks.
//!
//! `--ranks R` runs `R` ranks in this process (threads, with the in-process bootstrap
//! `rpc::bootstrap::threads`), each with its own simulated NIC on one shared device-model
//! fabric. Daemon 0 of each rank is the node's delegate
//! ([`rpc::delegation::Delegate`], seeds/004 §5): it serves shard 0, serves the calls other
//! ranks send it over copyrpc (handing those for other shards to their daemon's ring), and,
//! in the delegation backend, forwards its clients' remote calls. How a client reaches
//! another rank (`--backend`):
//! - `delegation` (seeds/004 §1.2, §4): into its own rank's daemon-0 ring; daemon 0 forwards
//!   it over copyrpc to the target rank's daemon 0 (one endpoint per remote rank).
//! - `direct` (seeds/004 §7 dual-path routing, with copyrpc as the remote path): each client
//!   thread has its own copyrpc context with one endpoint per remote rank, connected to that
//!   rank's daemon 0, and polls it alongside its rings.
//! - `both`: the two, one after the other in this process, and their ratio.
//!
//! `--transport scalerpc` (one rank) replaces the delegation rings by ScaleRPC (seeds/003): each
//! daemon serves its shard through a `ScaleRpcServer` on its own simulated NIC, and each client
//! thread, on a NIC of its own, connects a `KvClient<ScaleRpc>` to every daemon
//! (`--scalerpc-group`, `--scalerpc-slice-us` set the connection grouping). ScaleRPC may execute
//! two calls outstanding on one connection in either order, so a client then never has two
//! writes of one key outstanding.
//!
//! `--transport erpc` (one rank; several under `--mpi`, below) does the same over eRPC on UDP
//! loopback (seeds/000, 002):
//! each daemon serves its shard through an `ErpcServer` on its own UDP socket, and each client
//! thread connects a `KvClient<Erpc>` (`--qd` calls in flight, over `ceil(qd / 8)` sessions) to
//! every daemon. eRPC too may execute a client's outstanding calls in either order.
//!
//! Ranks as MPI processes (`--mpi`, a build with `--features mpi`): under `mpirun -np N` each
//! process is one rank of the same topology (its daemons, its rings in `/dev/shm`, its clients,
//! copyrpc to the other ranks; `--backend delegation|direct|both`), running exactly the per-rank
//! code of `--ranks R`, whose ranks are threads: the ranks exchange copyrpc endpoint information
//! through the bootstrap ([`rpc::bootstrap`]: `MPI_Allgather`), connect, and meet at a barrier
//! before any traffic. On one host the ranks' simulated NICs share one device-model fabric
//! ([`Fabric::join`], named after the pid of the host's first rank), so the device model needs
//! every rank on one host; `--device mlx5_0 [--port 1]` opens a real NIC through rdma-core
//! instead. `--mpi --transport erpc` runs eRPC over UDP across the processes: each rank's
//! daemons serve `ErpcServer`s (on 127.0.0.1 when all ranks share a host, else on `--erpc-ip`
//! or the address the host name resolves to), and every client thread connects a
//! `KvClient<Erpc>` to every daemon of every rank. Rank 0 prints the totals: throughput overall and per rank, requests served per rank,
//! latency percentiles merged over all ranks (each rank's histogram travels in hdrhistogram's V2
//! encoding), and the correctness check; every rank exits nonzero if any rank failed.
//!
//! Correctness: every client has a global id `g = rank * C + c` and only writes keys `k` with
//! `k % (R * C) == g` (on any rank), so every (rank, key) has one writer, whose successive
//! calls reach the owner daemon in issue order (one client's `fetch_add`s on a ring are
//! ordered; the delegate forwards a client's calls in ring order, and copyrpc and the
//! hand-off ring keep that order). Values encode `(writer << 48) | seq`, so every read is
//! checked for a plausible writer during the run, and at the end a sample of written keys,
//! local and remote, is read back from the owner daemon of the owner rank and must return the
//! last value written. The check runs where the keys live: each rank samples the keys its
//! clients wrote, sends every sampled key to its owner rank (an all-gather), and each rank reads
//! the keys it owns back from their owner daemon; the counts are summed over the ranks.
//!
//! `kv serve` lists its rings in a ring manifest, `/dev/shm/<shm>.rings`
//! ([`rpc::delegation::RingManifest`]: this user's file, mode 0600), and `kv client` attaches
//! to exactly the rings listed there, never to whatever `<shm>-N` names exist, so a ring file
//! another local user creates is never taken for a daemon (and is refused if named).
//!
//! `kv client` shares its daemons with any other `kv client` process, before, after or at the
//! same time, so there a client's writer id is instead its client id on ring 0, which the ring
//! hands out at attach (unique among the clients attached at once, whatever their process),
//! and it writes the keys `k` with `k % max_clients == id` (`kv serve --max-clients`, which
//! `--keys` must reach): every key still has one writer among the processes, and a value a
//! read finds, written by any process, names it. A client thread stays attached until the
//! check has read its keys back.
//!
//! Faults: every call has a deadline (`--deadline-ms`, 1000 by default); one with no
//! completion by then (a lost reply, a stopped daemon) counts as an error and is given up (its
//! tag comes back only if a late completion arrives, which is dropped), so the stop loop and
//! the check always end; the summary names how many expired. A client thread that fails
//! (a call's error, a daemon gone) ends the run at once: the other threads stop, the summary
//! keeps what every thread did and names the failure, and the exit code is 1.
//!
//! ```text
//! cargo run --release --example kv                      # all in one process, ~10 s
//! cargo run --release --example kv -- --ranks 2 --backend both --duration 5
//! cargo run --release --example kv -- --transport scalerpc --clients 4 --scalerpc-group 2
//! cargo run --release --example kv -- --transport erpc --clients 2 --daemons 2
//! cargo run --release --example kv -- --help
//! cargo build --release --features mpi --example kv   # then, ranks as processes:
//! mpirun -np 4 target/release/examples/kv --mpi --backend both --duration 5
//! mpirun -np 2 target/release/examples/kv --mpi --transport erpc --duration 5
//! mpirun -np 2 --host a,b target/release/examples/kv --mpi --device mlx5_0 --port 1
//! kv serve --shm kvbench --daemons 2                    # process 1: daemons (one rank)
//! kv client --shm kvbench --clients 2                   # process 2: clients + check
//! ```

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use crossbeam_utils::{Backoff, CachePadded};
use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use idl::kv::{KvClient, KvRequest, KvResponse, KvServer, KvService, owner_daemon};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Zipf};
use rpc::bootstrap::threads::{ThreadGroup, ThreadRank};
use rpc::bootstrap::wire::{self, encode_socket_addr};
use rpc::bootstrap::{Bootstrap, BootstrapError};
use rpc::copyrpc::info::INFO_BYTES;
use rpc::copyrpc::{
    CallError, Context, ContextConfig, EndpointConfig, EndpointId, EndpointInfo, SetupError,
};
use rpc::delegation::{
    DelegToken, Delegate, Delegation, DelegationConfig, DelegationServer, ForwardStats, RingError,
    RingManifest, Target, read_manifest,
};
use rpc::erpc::typed::MAX_IN_FLIGHT_LIMIT as ERPC_MAX_IN_FLIGHT;
use rpc::erpc::{Erpc, ErpcConfig, ErpcServer};
use rpc::mlx5::sim::{Fabric, SimConfig};
use rpc::scalerpc::{ScaleRpc, ScaleRpcAddr, ScaleRpcServer, ServerConfig as ScaleServerConfig};
use rpc::{ClientTransport, RpcError, Server, ServerTransport, Service};
use rustc_hash::FxHashMap;

#[derive(Parser, Debug)]
#[command(
    about = "Distributed key-value benchmark (seeds/004) over the delegation ring and copyrpc, ScaleRPC or eRPC",
    long_about = "Distributed key-value benchmark (seeds/004) over the delegation ring and \
        copyrpc.\n\nWithout a subcommand (or with `run`), daemons and clients of every rank run \
        in this process; `--ranks R` runs R in-process ranks connected by copyrpc on the \
        device model. `--mpi` (a build with `--features mpi`) makes every process of \
        `mpirun -np N` one rank of the same topology, with copyrpc between the processes on \
        the device model shared by the processes of a host (or on an RDMA NIC: `--device`), \
        or eRPC over UDP between them (`--transport erpc`): \
        `mpirun -np 4 target/release/examples/kv --mpi --backend both`. The `serve`/`client` \
        subcommands split one rank's daemons and clients into two processes. \
        `--transport scalerpc` (`--transport erpc`) serves the daemons of one rank over \
        ScaleRPC on the device model (eRPC over UDP loopback) instead of the delegation rings.",
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
    /// Daemons and clients of every rank in this process (the default when no subcommand is
    /// given).
    Run(RunArgs),
    /// Only the daemons of one rank: create `<shm>-0 .. <shm>-{D-1}`, list them in the ring
    /// manifest `<shm>.rings`, and serve until SIGINT/SIGTERM or `--duration` (one rank; for
    /// ranks as processes, see `--mpi`).
    Serve(ServeArgs),
    /// Only the clients of one rank, attached to the rings a `kv serve` process listed in its
    /// ring manifest `<shm>.rings`.
    Client(ClientArgs),
}

#[derive(Args, Debug, Clone)]
struct RunArgs {
    /// Daemon (shard server) threads per rank.
    #[arg(long, short = 'd', default_value_t = 1)]
    daemons: usize,
    /// In-process ranks, each with its own simulated NIC on one device-model fabric; requests
    /// target a rank chosen uniformly. 1: a single node, no copyrpc. (With `--mpi`, the ranks
    /// are the MPI processes.)
    #[arg(long, default_value_t = 1)]
    ranks: usize,
    /// This process is one rank of an MPI job (`mpirun -np N .../kv --mpi`): the ranks are the
    /// MPI processes, connected by copyrpc (delegation transport) or eRPC over UDP (`--transport
    /// erpc`). Needs a build with `--features mpi`.
    #[arg(long)]
    mpi: bool,
    /// Open this RDMA device (e.g. `mlx5_0`) through rdma-core for copyrpc between ranks,
    /// instead of the software device model.
    #[arg(long)]
    device: Option<String>,
    /// The port of `--device` (1-based).
    #[arg(long, default_value_t = 1, requires = "device")]
    port: u8,
    /// `--mpi --transport erpc`: the IP address the daemons' UDP sockets bind to and advertise
    /// (default: 127.0.0.1 when every rank runs on one host, else the first non-loopback address
    /// the host name resolves to).
    #[arg(long)]
    erpc_ip: Option<std::net::IpAddr>,
    /// How clients reach other ranks: through their rank's daemon 0 (delegation), with their
    /// own copyrpc endpoints (direct), or each in turn (both).
    #[arg(long, value_enum, default_value_t = Backend::Delegation)]
    backend: Backend,
    /// copyrpc send and receive ring size per endpoint, bytes (power of two, >= 1024).
    #[arg(long, default_value_t = 1 << 20)]
    copyrpc_ring: usize,
    /// How clients reach the daemons of their rank: the shared-memory delegation ring,
    /// ScaleRPC on the device model (one simulated NIC per daemon and per client thread), or
    /// eRPC over UDP loopback (one socket per daemon and per client connection). ScaleRPC runs
    /// one rank only; eRPC one rank, or the ranks of `--mpi`.
    #[arg(long, value_enum, default_value_t = Transport::Delegation)]
    transport: Transport,
    #[command(flatten)]
    scale: ScaleArgs,
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
    /// Test hook (hidden): daemon 0 executes its N-th request (1-based) but drops the reply,
    /// as a lost reply would (tests/kv_faults.rs).
    #[arg(long, hide = true)]
    drop_reply: Option<u64>,
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
struct ScaleArgs {
    /// ScaleRPC: connections per group; each daemon serves one group per time slice (0:
    /// grouping off). The seeds/003 default is 400.
    #[arg(long, default_value_t = 400)]
    scalerpc_group: u32,
    /// ScaleRPC: a group's time slice, microseconds (warm-up: a quarter of it).
    #[arg(long, default_value_t = 200)]
    scalerpc_slice_us: u64,
    /// ScaleRPC: message pool slot size, bytes (a multiple of 64; KV messages fit 128).
    #[arg(long, default_value_t = 128)]
    scalerpc_slot: u32,
}

#[derive(Args, Debug, Clone)]
struct LoadArgs {
    /// Client threads (per rank).
    #[arg(long, short = 'c', default_value_t = 1)]
    clients: usize,
    /// Calls in flight per client thread (closed loop).
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// Fraction of gets (the rest are puts).
    #[arg(long, default_value_t = 0.5)]
    read_ratio: f64,
    /// Key range: keys are 0..keys (on every rank).
    #[arg(long, default_value_t = 1 << 20)]
    keys: u64,
    /// Key distribution.
    #[arg(long, value_enum, default_value_t = Dist::Uniform)]
    dist: Dist,
    /// Zipf exponent θ (with --dist zipf).
    #[arg(long, default_value_t = 0.99)]
    theta: f64,
    /// Measured run time in seconds (per backend).
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
    /// Per-call deadline, milliseconds: a call with no reply this long after it was issued
    /// (a lost reply, a stopped daemon) counts as an error and is given up (a late reply is
    /// dropped), so the run and its check always end.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    deadline_ms: u64,
    /// Test hook (hidden): client thread 0 of rank 0 fails on purpose once it has completed
    /// this many operations, as a fault would make it fail (tests/kv_faults.rs).
    #[arg(long, hide = true)]
    fail_client_after: Option<u64>,
    /// Test hook (hidden): client thread 0 of rank 0 ignores the N-th (1-based) completion of
    /// its raw copyrpc calls (`--backend direct`), as if the reply were lost
    /// (tests/kv_faults.rs).
    #[arg(long, hide = true)]
    lose_direct_reply: Option<u64>,
}

#[derive(Args, Debug, Clone)]
struct OutArgs {
    /// Print the summary as one JSON object on stdout (one line per backend run).
    #[arg(long)]
    json: bool,
    /// Print the summary as CSV (header + one row per backend run) on stdout.
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

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    /// The shared-memory delegation ring of seeds/004 (`/dev/shm`).
    Delegation,
    /// ScaleRPC (seeds/003) on the device model: every daemon is a ScaleRPC server.
    Scalerpc,
    /// eRPC (seeds/000, 002) over UDP loopback: every daemon is an eRPC server.
    Erpc,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    /// Remote calls go through the client's rank's daemon 0 (seeds/004 §1.2, §4).
    Delegation,
    /// Each client thread has its own copyrpc endpoints to every remote rank's daemon 0.
    Direct,
    /// `delegation`, then `direct`, in one process.
    Both,
}

/// The topology of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Topology {
    Delegation,
    Direct,
}

impl Topology {
    fn name(self) -> &'static str {
        match self {
            Topology::Delegation => "delegation",
            Topology::Direct => "direct",
        }
    }
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
    rank: u32,
    read: bool,
}

const SEQ_BITS: u32 = 48;

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd.unwrap_or(Cmd::Run(cli.run)) {
        Cmd::Run(a) if a.mpi => run_mpi(a),
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

/// Creates one ring per daemon.
fn create_rings(
    base: &str,
    daemons: usize,
    cfg: DelegationConfig,
) -> Result<Vec<DelegationServer>, RpcError> {
    (0..daemons)
        .map(|d| DelegationServer::create(&ring_name(base, d), KvService::DESCRIPTOR, cfg))
        .collect()
}

/// Starts one plain daemon thread per ring (single rank: seeds/004 §6, only the local ring).
fn start_daemons(
    servers: Vec<DelegationServer>,
    rank: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<thread::JoinHandle<DaemonReport>> {
    servers
        .into_iter()
        .enumerate()
        .map(|(d, server)| spawn_daemon(rank, d, Server::new(server), stop))
        .collect()
}

fn spawn_daemon(
    rank: usize,
    d: usize,
    mut server: KvServerCore,
    stop: &Arc<AtomicBool>,
) -> thread::JoinHandle<DaemonReport> {
    let stop = stop.clone();
    thread::Builder::new()
        .name(format!("daemon-{rank}.{d}"))
        .spawn(move || daemon_loop(&mut server, &stop))
        .expect("spawn daemon")
}

#[derive(Debug, Default)]
struct DaemonReport {
    /// Requests the daemon's handler executed.
    requests: u64,
    bad_requests: u64,
    dropped_replies: u64,
    keys: usize,
    /// Daemon 0 of a multi-rank run: the delegate's counters.
    forward: Option<ForwardStats>,
    /// A ScaleRPC daemon: its server's counters.
    scale: Option<ScaleDaemon>,
    /// An eRPC daemon: its endpoint's counters.
    erpc: Option<ErpcFigures>,
}

/// The daemon event loop (seeds/004 §6: only the local ring; or a ScaleRPC server).
fn daemon_loop<T: ServerTransport>(
    server: &mut Server<KvService, T>,
    stop: &AtomicBool,
) -> DaemonReport {
    daemon_loop_observing(server, stop, |_| {})
}

/// [`daemon_loop`] that also calls `observe` with the server whenever a round found nothing
/// to do (to sample transport state, e.g. the connections a ScaleRPC server holds).
fn daemon_loop_observing<T: ServerTransport>(
    server: &mut Server<KvService, T>,
    stop: &AtomicBool,
    mut observe: impl FnMut(&Server<KvService, T>),
) -> DaemonReport {
    let mut shard = Shard::default();
    let backoff = Backoff::new();
    while !stop.load(Ordering::Relaxed) {
        if server.serve_once(|req| KvService::dispatch(&mut shard, req)) == 0 {
            observe(server);
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
        forward: None,
        scale: None,
        erpc: None,
    }
}

/// [`daemon_loop`] for the test hook `kv serve --drop-reply N`: the `drop`-th request
/// (1-based; 0: none) is executed and its reply dropped (counted in `dropped_replies`).
fn daemon_loop_dropping(server: &mut KvServerCore, stop: &AtomicBool, drop: u64) -> DaemonReport {
    let mut shard = Shard::default();
    let (mut seen, mut dropped) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        if server.poll() == 0 {
            thread::yield_now();
            continue;
        }
        while let Some((token, req)) = server.recv() {
            let resp = KvService::dispatch(&mut shard, req);
            seen += 1;
            if seen == drop {
                dropped += 1;
            } else {
                let _ = server.reply(token, &resp);
            }
        }
        server.release();
    }
    let s = server.stats();
    DaemonReport {
        requests: s.requests,
        bad_requests: s.bad_requests,
        dropped_replies: s.dropped_replies + dropped,
        keys: shard.map.len(),
        ..DaemonReport::default()
    }
}

/// Where a KV request is served: its `rank` field, and the daemon `key % daemons` there
/// (seeds/004 §7, §8).
fn kv_route(daemons: usize) -> impl FnMut(&KvRequest) -> Target + Send + 'static {
    move |req: &KvRequest| {
        let (rank, key) = match req {
            KvRequest::Get(a) => (a.rank(), a.key()),
            KvRequest::Put(a) => (a.rank(), a.key()),
        };
        Target {
            rank,
            daemon: owner_daemon(key, daemons) as u32,
        }
    }
}

/// The delegate's event loop: daemon 0 of a rank in a multi-rank run (seeds/004 §5).
fn delegate_loop<R: FnMut(&KvRequest) -> Target>(
    mut dlg: Delegate<KvService, R>,
    stop: &AtomicBool,
) -> DaemonReport {
    let mut shard = Shard::default();
    let backoff = Backoff::new();
    while !stop.load(Ordering::Relaxed) {
        if dlg.run_once(|req| KvService::dispatch(&mut shard, req)) == 0 {
            backoff.snooze();
        } else {
            backoff.reset();
        }
    }
    let f = *dlg.stats();
    DaemonReport {
        // The requests its handler executed (the hand-offs execute on the other daemons).
        requests: f.ring_local + f.remote_served,
        bad_requests: f.bad_requests,
        dropped_replies: f.dropped_replies,
        keys: shard.map.len(),
        forward: Some(f),
        scale: None,
        erpc: None,
    }
}

fn run_all(a: RunArgs) -> i32 {
    match a.transport {
        Transport::Scalerpc => run_scalerpc(&a),
        Transport::Erpc => run_erpc(&a),
        Transport::Delegation => run_threads(&a),
    }
}

/// Checks the arguments of the delegation transport for `ranks` ranks; the rings'
/// configuration.
fn delegation_args(a: &RunArgs, ranks: usize) -> Result<DelegationConfig, String> {
    let cfg = delegation_config(&a.ring, a.load.qd)?;
    if a.daemons == 0 {
        return Err("--daemons must be at least 1".into());
    }
    if ranks > 1 {
        if !a.copyrpc_ring.is_power_of_two() || a.copyrpc_ring < 1024 {
            return Err("--copyrpc-ring must be a power of two >= 1024".into());
        }
        // Each ring: the rank's clients, the checker and (daemons 1..) the delegate.
        if a.load.clients + 2 > a.ring.max_clients as usize {
            return Err(
                "--max-clients must be at least --clients + 2 with more than one rank".into(),
            );
        }
    }
    load_args(&a.load, ranks)?;
    Ok(cfg)
}

/// Checks the client load for `ranks` ranks.
fn load_args(load: &LoadArgs, ranks: usize) -> Result<(), String> {
    if load.clients == 0 || load.qd == 0 || load.keys < (load.clients * ranks) as u64 {
        return Err("need --clients >= 1, --qd >= 1 and --keys >= --clients * ranks".into());
    }
    Ok(())
}

/// The backends `b` measures, in order.
fn topologies(b: Backend) -> &'static [Topology] {
    match b {
        Backend::Delegation => &[Topology::Delegation],
        Backend::Direct => &[Topology::Direct],
        Backend::Both => &[Topology::Delegation, Topology::Direct],
    }
}

/// The device model of multi-rank runs.
fn sim_config() -> SimConfig {
    SimConfig {
        // Steps the model now and then, so that a sender stalled on a full receive queue
        // resumes even when nobody rings a doorbell.
        progress_thread: Some(Duration::from_millis(1)),
        ..SimConfig::default()
    }
}

/// Where the NICs of a job's ranks come from.
#[derive(Clone)]
enum Nic {
    /// A simulated NIC per rank on the device-model fabric (one fabric for the ranks of this
    /// process, or for the processes of a host that joined it).
    Sim(Fabric),
    /// `--device`: the RDMA device through rdma-core.
    Hw { device: String, port: u8 },
}

impl Nic {
    /// Opens one NIC (a device context).
    fn open(&self) -> Result<rpc::mlx5::verbs::Context, String> {
        match self {
            Nic::Sim(fabric) => Ok(fabric.open()),
            Nic::Hw { device, port } => rpc::mlx5::hw::open(Some(device), *port)
                .map_err(|e| format!("opening RDMA device {device} port {port}: {e}")),
        }
    }
}

/// `--device`, if given: the NIC, opened once here so that a missing device fails before
/// anything else (every rank of an MPI job fails alike).
fn hw_nic(a: &RunArgs) -> Result<Option<Nic>, String> {
    let Some(device) = &a.device else {
        return Ok(None);
    };
    let nic = Nic::Hw {
        device: device.clone(),
        port: a.port,
    };
    nic.open()?;
    Ok(Some(nic))
}

/// What the ranks of a job share.
struct Job {
    /// Prefix of the rings in /dev/shm: `kv-<pid>`, with the pid of this host's first rank.
    base: String,
    /// The ranks' NICs (`None`: a single rank, no copyrpc).
    nic: Option<Nic>,
    /// The ranks are MPI processes (else threads of this process).
    mpi: bool,
}

/// `--ranks R` with the delegation transport: every rank is a thread of this process with
/// the in-process bootstrap ([`ThreadGroup`]), running the per-rank code of `--mpi`.
fn run_threads(a: &RunArgs) -> i32 {
    if a.ranks == 0 || a.ranks > 64 {
        return fail("--ranks must be in 1..=64");
    }
    let cfg = match delegation_args(a, a.ranks) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let hw = match hw_nic(a) {
        Ok(n) => n,
        Err(e) => return fail(&e),
    };
    let nic = (a.ranks > 1).then(|| hw.unwrap_or_else(|| Nic::Sim(Fabric::new(sim_config()))));
    let job = Arc::new(Job {
        base: format!("kv-{}", std::process::id()),
        nic,
        mpi: false,
    });
    let args = Arc::new(a.clone());
    let ranks: Vec<_> = ThreadGroup::ranks(a.ranks)
        .into_iter()
        .map(|b| {
            let (job, args) = (job.clone(), args.clone());
            thread::Builder::new()
                .name(format!("rank-{}", b.rank()))
                .spawn(move || run_ranks(&b, &job, &args, cfg))
                .expect("spawn rank")
        })
        .collect();
    let mut code = 0;
    for h in ranks {
        match h.join().expect("rank panicked") {
            Ok(true) => {}
            Ok(false) => code = code.max(1),
            Err(e) => {
                eprintln!("kv: {e}");
                code = 2;
            }
        }
    }
    code
}

/// `--mpi`: this process is one rank of an MPI job.
#[cfg(feature = "mpi")]
fn run_mpi(a: RunArgs) -> i32 {
    let b = match rpc::bootstrap::mpi::MpiBootstrap::init() {
        Ok(b) => b,
        Err(e) => return fail(&format!("MPI initialization: {e}")),
    };
    // Only this (the main) thread calls MPI: every collective of the run is made here, never
    // from a daemon or client thread.
    let code = mpi_job::run(&b, &a);
    // Finalizes MPI: every thread of the run has ended.
    drop(b);
    code
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_a: RunArgs) -> i32 {
    fail(
        "--mpi needs MPI support: rebuild with --features mpi \
         (cargo build --release --features mpi --example kv)",
    )
}

/// Every backend of `a.backend`, one after the other, as rank `b.rank()` of `b.size()`
/// (rank 0 prints the summaries); whether every run passed.
fn run_ranks<B: Bootstrap>(
    b: &B,
    job: &Job,
    a: &RunArgs,
    cfg: DelegationConfig,
) -> Result<bool, String> {
    let mut summaries = Vec::new();
    for (i, &topo) in topologies(a.backend).iter().enumerate() {
        let s = run_rank(b, job, a, cfg, topo)?;
        if b.rank() == 0 {
            print_summary(&s, &a.out, i == 0);
        }
        summaries.push(s);
    }
    if let [d, x] = &summaries[..] {
        if b.rank() == 0 && !a.out.json && !a.out.csv && d.mops > 0.0 {
            println!(
                "direct vs delegation: throughput x{:.2}, p50 x{:.2}, p99 x{:.2}",
                x.mops / d.mops,
                x.p50_us / d.p50_us.max(1e-9),
                x.p99_us / d.p99_us.max(1e-9)
            );
        }
    }
    Ok(summaries.iter().all(|s| s.pass))
}

/// What a client thread uses to reach other ranks.
enum Remote {
    /// Single rank: no remote requests.
    None,
    /// Through daemon 0's ring (`rings[0]`), which forwards over copyrpc.
    Delegation,
    /// Own copyrpc context with an endpoint to each remote rank's daemon 0 (`eps[rank]`).
    Direct {
        ctx: Box<Context<u32>>,
        eps: Vec<Option<EndpointId>>,
    },
    /// The client's rings reach the daemons of every rank, rank-major, `daemons` per rank
    /// (eRPC across ranks).
    Rings { daemons: usize },
}

/// Ends a setup step on every rank together: its outcome here, or an error on every rank if
/// it failed on any, so that no rank goes on to a collective that the failed ones never join.
fn agree<B: Bootstrap, T>(b: &B, step: &str, r: Result<T, String>) -> Result<T, String> {
    let mut failed = [u64::from(r.is_err())];
    b.all_reduce_sum_u64(&mut failed)
        .map_err(|e| format!("{step}: {}", boot(e)))?;
    match r {
        Err(e) => Err(e),
        Ok(_) if failed[0] > 0 => Err(format!("{step} failed on {} other rank(s)", failed[0])),
        Ok(v) => Ok(v),
    }
    .map_err(|e| on_rank(b, e))
}

/// `msg`, prefixed with the rank if there are several.
fn on_rank<B: Bootstrap>(b: &B, msg: String) -> String {
    if b.size() > 1 {
        format!("rank {}: {msg}", b.rank())
    } else {
        msg
    }
}

fn boot(e: BootstrapError) -> String {
    format!("bootstrap: {e}")
}

/// The daemon threads of a rank and their stop flag (also set when this is dropped on an
/// error path).
#[derive(Default)]
struct DaemonThreads {
    stop: Arc<AtomicBool>,
    handles: Vec<thread::JoinHandle<DaemonReport>>,
}

impl DaemonThreads {
    /// Stops the daemons; their reports.
    fn finish(mut self) -> Vec<DaemonReport> {
        self.stop.store(true, Ordering::Relaxed);
        std::mem::take(&mut self.handles)
            .into_iter()
            .map(|h| h.join().expect("daemon panicked"))
            .collect()
    }
}

impl Drop for DaemonThreads {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A rank's copyrpc contexts and endpoints (seeds/004 §9, steps 6-9): the delegate's context
/// with its endpoints, and each client thread's remote path (direct backend: its own context
/// with an endpoint to each other rank). Created, then connected to the other ranks'.
struct Wiring {
    ranks: usize,
    clients: usize,
    /// The delegate's context.
    dlg: Context<DelegToken>,
    /// Delegation backend: the delegate's endpoint to each other rank's delegate.
    peers: Vec<Option<EndpointId>>,
    /// Direct backend: the delegate's endpoint serving client `c` of rank `s`, at
    /// `s * clients + c`.
    served: Vec<Option<EndpointId>>,
    /// Each client thread's remote path.
    remotes: Vec<Remote>,
}

impl Wiring {
    /// Opens the rank's NIC and creates its contexts and endpoints.
    fn new(
        nic: &Nic,
        (rank, ranks): (usize, usize),
        clients: usize,
        ring_size: usize,
        topo: Topology,
    ) -> Result<Wiring, String> {
        let device = nic.open()?;
        let ecfg = EndpointConfig {
            ring_size,
            fingerprint: KvService::DESCRIPTOR.fingerprint,
            ..EndpointConfig::default()
        };
        let setup = |e: SetupError| format!("copyrpc setup: {e}");
        let mut dlg =
            Context::<DelegToken>::new(&device, ContextConfig::default()).map_err(setup)?;
        let (mut peers, mut served) = (vec![None; ranks], vec![None; ranks * clients]);
        let mut remotes = Vec::with_capacity(clients);
        let others = || (0..ranks).filter(move |&s| s != rank);
        match topo {
            Topology::Delegation => {
                for s in others() {
                    peers[s] = Some(dlg.create_endpoint(&ecfg).map_err(setup)?);
                }
                remotes.extend((0..clients).map(|_| Remote::Delegation));
            }
            Topology::Direct => {
                for s in others() {
                    for c in 0..clients {
                        let ep = dlg.create_endpoint(&ecfg).map_err(setup)?;
                        served[s * clients + c] = Some(ep);
                    }
                }
                for _ in 0..clients {
                    let ctx = Context::<u32>::new(&device, ContextConfig::default());
                    let mut ctx = Box::new(ctx.map_err(setup)?);
                    let mut eps = vec![None; ranks];
                    for s in others() {
                        eps[s] = Some(ctx.create_endpoint(&ecfg).map_err(setup)?);
                    }
                    remotes.push(Remote::Direct { ctx, eps });
                }
            }
        }
        Ok(Wiring {
            ranks,
            clients,
            dlg,
            peers,
            served,
            remotes,
        })
    }

    /// What the other ranks need to connect to this one's endpoints, in a fixed layout
    /// (the same length on every rank): `peers` (R slots), `served` (R × C, rank-major),
    /// then the clients' endpoints (C × R, client-major); `None` where there is no endpoint.
    fn infos(&self) -> Vec<Option<EndpointInfo>> {
        let mut v: Vec<_> = (self.peers.iter().chain(&self.served))
            .map(|ep| ep.and_then(|ep| self.dlg.local_info(ep)))
            .collect();
        for r in &self.remotes {
            if let Remote::Direct { ctx, eps } = r {
                v.extend(eps.iter().map(|ep| ep.and_then(|ep| ctx.local_info(ep))));
            }
        }
        v.resize(self.ranks + 2 * self.ranks * self.clients, None);
        v
    }

    /// Connects every endpoint of rank `rank` to its counterpart in `all` (every rank's
    /// [`Wiring::infos`]).
    fn connect(&mut self, rank: usize, all: &[Vec<Option<EndpointInfo>>]) -> Result<(), String> {
        let (r, c) = (self.ranks, self.clients);
        let info = |s: usize, slot: usize| {
            all[s][slot]
                .ok_or_else(|| format!("rank {s} sent no endpoint information for this rank"))
        };
        let connect = |e: SetupError| format!("copyrpc connect: {e}");
        for (s, ep) in self.peers.iter().enumerate() {
            if let Some(ep) = *ep {
                self.dlg.connect(ep, &info(s, rank)?).map_err(connect)?;
            }
        }
        for (i, ep) in self.served.iter().enumerate() {
            if let Some(ep) = *ep {
                let (s, client) = (i / c, i % c);
                let remote = info(s, r + r * c + client * r + rank)?;
                self.dlg.connect(ep, &remote).map_err(connect)?;
            }
        }
        for (client, remote) in self.remotes.iter_mut().enumerate() {
            if let Remote::Direct { ctx, eps } = remote {
                for (s, ep) in eps.iter().enumerate() {
                    if let Some(ep) = *ep {
                        let remote = info(s, r + rank * c + client)?;
                        ctx.connect(ep, &remote).map_err(connect)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// All-gathers every rank's endpoint information ([`Wiring::infos`], the same number of
/// slots everywhere) in its fixed-size encoding; by rank, then slot.
fn exchange_infos<B: Bootstrap>(
    b: &B,
    mine: &[Option<EndpointInfo>],
) -> Result<Vec<Vec<Option<EndpointInfo>>>, String> {
    let mut buf = vec![0u8; mine.len() * INFO_BYTES];
    for (slot, info) in buf.chunks_exact_mut(INFO_BYTES).zip(mine) {
        if let Some(info) = info {
            slot.copy_from_slice(&info.to_bytes());
        }
    }
    let all = b.all_gather(&buf).map_err(boot)?;
    decode_infos(&all, b.size(), mine.len())
}

/// Every rank's endpoint slots from [`exchange_infos`]'s all-gather (`ranks` contributions of
/// `slots` encodings): an all-zero slot is no endpoint; any other slot must decode
/// ([`EndpointInfo::from_bytes`]), else the error names the rank and slot (issue 14: bytes
/// from other processes are checked, never trusted).
fn decode_infos(
    all: &[u8],
    ranks: usize,
    slots: usize,
) -> Result<Vec<Vec<Option<EndpointInfo>>>, String> {
    wire::decode_slots(all, ranks, slots, INFO_BYTES, EndpointInfo::from_bytes)
        .map_err(|e| format!("endpoint information: {e}"))
}

/// One rank of a delegation-transport run (seeds/004 §9): creates its rings, opens its NIC
/// and creates its copyrpc endpoints, exchanges their information with the other ranks
/// through `b`, connects, meets the others at a barrier, starts its daemons, runs its
/// clients and its part of the check, and combines the figures of all ranks (every rank
/// returns the same summary). Every rank thread of `--ranks R` and every process of `--mpi`
/// runs this. A setup step that fails on any rank fails on every rank ([`agree`]).
fn run_rank<B: Bootstrap>(
    b: &B,
    job: &Job,
    a: &RunArgs,
    cfg: DelegationConfig,
    topo: Topology,
) -> Result<Summary, String> {
    let (rank, ranks, daemons) = (b.rank(), b.size(), a.daemons);
    let base = if ranks == 1 {
        job.base.clone()
    } else {
        format!("{}-{}-r{rank}", job.base, topo.name())
    };
    let names: Vec<String> = (0..daemons).map(|d| ring_name(&base, d)).collect();
    let servers = create_rings(&base, daemons, cfg).map_err(|e| format!("creating the rings: {e}"));
    let servers = agree(b, "creating the rings", servers)?;
    let mut threads = DaemonThreads::default();
    let remotes = match (&job.nic, ranks) {
        (_, 1) => {
            threads.handles = start_daemons(servers, rank, &threads.stop);
            (0..a.load.clients).map(|_| Remote::None).collect()
        }
        (None, _) => return Err(on_rank(b, "no NIC for copyrpc between ranks".into())),
        (Some(nic), _) => {
            let clients = a.load.clients;
            let wiring = Wiring::new(nic, (rank, ranks), clients, a.copyrpc_ring, topo);
            let mut wiring = agree(b, "copyrpc setup", wiring)?;
            let all = exchange_infos(b, &wiring.infos()).map_err(|e| on_rank(b, e))?;
            let mut rings = servers.into_iter();
            let ring0 = rings.next().expect("daemon 0");
            let delegate = wiring.connect(rank, &all).and_then(|()| {
                let Wiring {
                    dlg: ctx,
                    peers,
                    remotes,
                    ..
                } = wiring;
                let mut dlg = Delegate::<KvService, _>::new(
                    ring0,
                    ctx,
                    rank as u32,
                    ranks as u32,
                    daemons as u32,
                    kv_route(daemons),
                )
                .map_err(|e| format!("delegate: {e}"))?;
                for (s, ep) in peers.into_iter().enumerate() {
                    if let Some(ep) = ep {
                        dlg.set_peer(s as u32, ep).map_err(|e| e.to_string())?;
                    }
                }
                for (d, name) in names.iter().enumerate().skip(1) {
                    dlg.attach_daemon(d as u32, name)
                        .map_err(|e| format!("daemon {d}: {e}"))?;
                }
                Ok((dlg, remotes))
            });
            let (dlg, remotes) = agree(b, "connecting the ranks", delegate)?;
            // Every endpoint of every rank is connected before any traffic: an RC send to a
            // QP that is not connected yet fails once the transport retries run out, as on
            // hardware.
            b.barrier().map_err(|e| on_rank(b, boot(e)))?;
            let stop = threads.stop.clone();
            threads.handles.push(
                thread::Builder::new()
                    .name(format!("daemon-{rank}.0"))
                    .spawn(move || delegate_loop(dlg, &stop))
                    .expect("spawn delegate"),
            );
            for (d, server) in rings.enumerate() {
                let h = spawn_daemon(rank, d + 1, Server::new(server), &threads.stop);
                threads.handles.push(h);
            }
            remotes
        }
    };
    let rings = Arc::new(Rings::new(rank, names, false));
    let (mut s, _) = clients_and_check(b, rings, remotes, threads, &a.load, &a.out, daemons)?;
    s.backend = topo.name();
    s.mpi = job.mpi;
    Ok(s)
}

/// The rest of a run on every rank: the clients, the check, a barrier (no rank stops its
/// daemons, or tears down its endpoints, while another still calls them), the daemons'
/// stop, and the figures of all ranks combined. The summary, and this rank's daemon reports.
fn clients_and_check<B: Bootstrap, D: Daemons>(
    b: &B,
    daemons: Arc<D>,
    remotes: Vec<Remote>,
    threads: DaemonThreads,
    load: &LoadArgs,
    out: &OutArgs,
    ndaemons: usize,
) -> Result<(Summary, Vec<DaemonReport>), String> {
    let mut run = run_clients(b, daemons.clone(), remotes, load, out);
    let failure = run.failure.take();
    let check = check_written(b, &*daemons, &run.clients, failure, load);
    // The client threads' connections, if kept for the check, close before any daemon stops.
    daemons.release();
    let check = check.map_err(|e| on_rank(b, e))?;
    b.barrier().map_err(|e| on_rank(b, boot(e)))?;
    let reports = threads.finish();
    let s = combine(b, &run, &reports, check, load, ndaemons).map_err(|e| on_rank(b, e))?;
    Ok((s, reports))
}

/// How client threads and the checker reach the daemons of a rank.
trait Daemons: Send + Sync + 'static {
    /// The client transport.
    type T: ClientTransport;
    /// Whether one client's calls on one connection execute in issue order. If not, a client
    /// never has two writes of one key outstanding (their order would be unknown).
    const ORDERED: bool;
    /// Connects one client (a client thread, or the checker) to every daemon of `rank`, in
    /// daemon order.
    fn connect(&self, rank: usize) -> Result<Vec<KvClient<Self::T>>, RpcError>;
    /// Lets connections without calls in flight make progress (called when a client is
    /// idle).
    #[inline]
    fn keepalive(_rings: &mut [KvClient<Self::T>]) {}
    /// The writer id of the client connected through `conns` (from [`Daemons::connect`]) and
    /// the number of writer ids `W`: the client writes only keys `k` with `k % W == id`.
    /// `None` (the default): the daemons serve this job alone, and a client's writer id is
    /// its global id among the job's `clients * ranks` client threads.
    fn writer(&self, _conns: &[KvClient<Self::T>]) -> Option<(u64, u64)> {
        None
    }
    /// A client thread's connections once its closed loop has ended; by default they close
    /// here. [`Daemons::release`] closes the ones an implementation keeps.
    fn finished(&self, conns: Vec<KvClient<Self::T>>) {
        drop(conns);
    }
    /// Closes the connections [`Daemons::finished`] kept (after the check).
    fn release(&self) {}
}

/// The delegation rings of this rank's daemons, by name (they reach this rank only).
struct Rings {
    rank: usize,
    names: Vec<String>,
    /// `kv client`: the daemons are another process's, which other `kv client` processes may
    /// use before, after or alongside this one. Writer ids are then the client ids ring 0
    /// hands out at attach (unique among the clients attached to it, whatever their
    /// process), over `max_clients` writer ids; and a client thread's connections stay
    /// attached until the check is done, so that no other process takes its id (and writes
    /// its keys) before this one has read them back.
    shared: bool,
    /// Connections of finished client threads (`shared`), closed by [`Daemons::release`].
    held: std::sync::Mutex<Vec<Vec<KvClient>>>,
}

impl Rings {
    fn new(rank: usize, names: Vec<String>, shared: bool) -> Self {
        Rings {
            rank,
            names,
            shared,
            held: Default::default(),
        }
    }
}

impl Daemons for Rings {
    type T = Delegation;
    const ORDERED: bool = true;
    fn connect(&self, rank: usize) -> Result<Vec<KvClient>, RpcError> {
        debug_assert_eq!(rank, self.rank, "the rings of another rank");
        self.names
            .iter()
            .map(|n| KvClient::<Delegation>::connect(n))
            .collect()
    }

    fn writer(&self, conns: &[KvClient]) -> Option<(u64, u64)> {
        let ring = conns.first().filter(|_| self.shared)?.transport().ring();
        Some((
            u64::from(ring.client_id()),
            u64::from(ring.info().max_clients),
        ))
    }

    fn finished(&self, conns: Vec<KvClient>) {
        if self.shared {
            self.held.lock().expect("held connections").push(conns);
        }
    }

    fn release(&self) {
        self.held.lock().expect("held connections").clear();
    }
}

/// The ScaleRPC daemons of the (single) rank: each client opens a NIC of its own on `fabric`
/// and connects to every daemon's listener.
struct ScaleDaemons {
    fabric: Fabric,
    addrs: Vec<ScaleRpcAddr>,
}

impl Daemons for ScaleDaemons {
    type T = ScaleRpc;
    const ORDERED: bool = false;
    fn connect(&self, _rank: usize) -> Result<Vec<KvClient<ScaleRpc>>, RpcError> {
        let device = self.fabric.open();
        self.addrs
            .iter()
            .map(|a| {
                let mut a = a.clone();
                a.device = device.clone();
                KvClient::<ScaleRpc>::connect(&a)
            })
            .collect()
    }

    /// A ScaleRPC client acknowledges a stop notice only when it polls; one with nothing in
    /// flight is not polled by `poll_with`, so poll its transport here (it has nothing to
    /// deliver).
    #[inline]
    fn keepalive(rings: &mut [KvClient<ScaleRpc>]) {
        for r in rings.iter_mut().filter(|r| r.in_flight() == 0) {
            let _ = r.transport_mut().poll(usize::MAX, |_, _| {});
        }
    }
}

/// One ScaleRPC daemon's server counters.
#[derive(Clone, Copy, Debug, Default)]
struct ScaleDaemon {
    conns: u32,
    groups: u32,
    sched: rpc::scalerpc::SchedStats,
    server: rpc::scalerpc::ServerStats,
    probes: u64,
}

/// ScaleRPC figures of a run: the daemons' counters summed, and the QPC caches.
#[derive(Clone, Copy, Debug, Default)]
struct ScaleFigures {
    group_size: u32,
    slice_us: u64,
    slot_size: u32,
    conns: u32,
    /// Most groups on one daemon.
    groups: u32,
    switches: u64,
    warmup_delays: u64,
    acks: u64,
    evictions: u64,
    failed_conns: u64,
    requests: u64,
    doorbells: u64,
    notices: u64,
    probes: u64,
    /// QPC cache of the daemons' NICs (hits, misses), and of every NIC of the fabric.
    qpc_server: (u64, u64),
    qpc_all: (u64, u64),
}

/// `--transport scalerpc`: one rank whose daemons are ScaleRPC servers, each on its own NIC
/// of one device-model fabric; then the summary.
fn run_scalerpc(a: &RunArgs) -> i32 {
    if a.ranks != 1 {
        return fail(
            "--transport scalerpc runs one rank (--ranks 1): ranks over ScaleRPC are not supported",
        );
    }
    if a.backend != Backend::Delegation {
        return fail("--backend applies to --ranks > 1; --transport scalerpc runs one rank");
    }
    if a.device.is_some() {
        return fail("--device applies to copyrpc between ranks (the delegation transport)");
    }
    if a.daemons == 0 {
        return fail("--daemons must be at least 1");
    }
    if a.load.qd == 0 || a.load.qd >= u16::MAX as usize - 1 {
        return fail("--qd must be in 1..65534 with --transport scalerpc");
    }
    if let Err(e) = load_args(&a.load, 1) {
        return fail(&e);
    }
    let sc = &a.scale;
    if sc.scalerpc_slice_us == 0 {
        return fail("--scalerpc-slice-us must be at least 1");
    }
    let slice = Duration::from_micros(sc.scalerpc_slice_us);
    let cfg = ScaleServerConfig {
        // The rank's clients and the checker, one connection each.
        max_conns: a.load.clients as u32 + 1,
        group_size: if sc.scalerpc_group > 0 {
            rpc::scalerpc::GroupSize::Fixed(sc.scalerpc_group)
        } else {
            rpc::scalerpc::GroupSize::Off
        },
        // One slot per call in flight, plus the client's liveness probe.
        slots_per_conn: a.load.qd as u32 + 1,
        slot_size: sc.scalerpc_slot,
        slice,
        warmup: slice / 4,
        // Every client polls all the time and one that is gone fails its connection, so the
        // ack timeout only guards against a client thread the OS does not run for a while
        // (eviction is final).
        ack_timeout: Duration::from_secs(1),
        ..ScaleServerConfig::default()
    };
    let fabric = Fabric::new(SimConfig {
        // Steps the model now and then, so that retries towards a client that is gone
        // (its connection dropped at the end of the run) complete without other traffic.
        progress_thread: Some(Duration::from_millis(1)),
        ..SimConfig::default()
    });
    let mut servers = Vec::with_capacity(a.daemons);
    let mut addrs = Vec::with_capacity(a.daemons);
    let mut lids = Vec::with_capacity(a.daemons);
    for d in 0..a.daemons {
        let device = fabric.open();
        match ScaleRpcServer::serve::<KvService>(&device, cfg) {
            Ok(s) => {
                let mut addr = ScaleRpcAddr::new(device.clone(), s.transport().listener());
                // A benchmark's clients wait for their group however long an oversubscribed
                // machine takes; a dead server is still detected by the probe.
                addr.activation_timeout = Some(Duration::from_secs(60));
                addrs.push(addr);
                lids.push(device.port().lid);
                servers.push(s);
            }
            Err(e) => return fail(&format!("daemon {d}: scalerpc server: {e}")),
        }
    }
    let mut threads = DaemonThreads::default();
    threads.handles = servers
        .into_iter()
        .enumerate()
        .map(|(d, mut server)| {
            let stop = threads.stop.clone();
            thread::Builder::new()
                .name(format!("daemon-0.{d}"))
                .spawn(move || {
                    // Clients disconnect (and their connections are reclaimed) before the
                    // daemons stop: report the connections accepted over the run (held now
                    // or reclaimed) and the most groups seen at once.
                    let mut groups = 0;
                    let mut r = daemon_loop_observing(&mut server, &stop, |server| {
                        let s = server.transport().scale_server();
                        groups = groups.max(s.scheduler().num_groups());
                    });
                    let t = server.transport();
                    let s = t.scale_server();
                    r.scale = Some(ScaleDaemon {
                        conns: s.num_conns()
                            + u32::try_from(s.stats().reclaimed).unwrap_or(u32::MAX),
                        groups,
                        sched: *s.scheduler().stats(),
                        server: *s.stats(),
                        probes: t.probes_answered(),
                    });
                    r
                })
                .expect("spawn daemon")
        })
        .collect();
    let remotes = (0..a.load.clients).map(|_| Remote::None).collect();
    let daemons = Arc::new(ScaleDaemons {
        fabric: fabric.clone(),
        addrs,
    });
    let (mut s, reports) = match clients_and_check(
        &solo(),
        daemons,
        remotes,
        threads,
        &a.load,
        &a.out,
        a.daemons,
    ) {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    let mut f = ScaleFigures {
        group_size: match cfg.group_size {
            rpc::scalerpc::GroupSize::Fixed(g) => g,
            _ => 0,
        },
        slice_us: sc.scalerpc_slice_us,
        slot_size: cfg.slot_size,
        ..ScaleFigures::default()
    };
    for d in reports.iter().filter_map(|r| r.scale) {
        f.conns += d.conns;
        f.groups = f.groups.max(d.groups);
        f.switches += d.sched.switches;
        f.warmup_delays += d.sched.warmup_delays;
        f.acks += d.sched.acks;
        f.evictions += d.sched.evictions;
        f.failed_conns += d.server.failed_conns;
        f.requests += d.server.requests;
        f.doorbells += d.server.doorbells;
        f.notices += d.server.notices;
        f.probes += d.probes;
    }
    for lid in lids {
        if let Some(q) = fabric.qpc_stats(lid) {
            f.qpc_server.0 += q.hits;
            f.qpc_server.1 += q.misses;
        }
    }
    let all = fabric.stats();
    f.qpc_all = (all.qpc_hits, all.qpc_misses);
    s.transport = "scalerpc";
    s.backend = "scalerpc";
    s.scale = Some(f);
    print_summary(&s, &a.out, true);
    if s.pass { 0 } else { 1 }
}

/// The eRPC daemons of every rank: each client connection opens a UDP socket of its own and
/// connects to a daemon's address.
struct ErpcDaemons {
    /// The daemons' addresses, by rank.
    addrs: Vec<Vec<SocketAddr>>,
    /// Calls in flight per connection: the client's queue depth (all may go to one daemon).
    qd: usize,
}

impl Daemons for ErpcDaemons {
    type T = Erpc;
    const ORDERED: bool = false;
    fn connect(&self, rank: usize) -> Result<Vec<KvClient<Erpc>>, RpcError> {
        let cfg = ErpcConfig {
            max_in_flight: self.qd,
            ..ErpcConfig::default()
        };
        self.addrs[rank]
            .iter()
            .map(|a| {
                Ok(KvClient::from_transport(Erpc::connect_with(
                    a,
                    KvService::DESCRIPTOR,
                    &cfg,
                )?))
            })
            .collect()
    }

    /// eRPC keeps a session alive by running its event loop (keepalive pings, seeds/002 §10);
    /// `poll_with` runs it only with calls in flight, so run the idle connections' here
    /// (they have nothing to deliver).
    #[inline]
    fn keepalive(rings: &mut [KvClient<Erpc>]) {
        for r in rings.iter_mut().filter(|r| r.in_flight() == 0) {
            let _ = r.transport_mut().poll(usize::MAX, |_, _| {});
        }
    }
}

/// eRPC figures of a run: the daemons' endpoint counters, summed.
#[derive(Clone, Copy, Debug, Default)]
struct ErpcFigures {
    /// Sessions the daemons served at the end of the run (the checker's included).
    sessions: u64,
    /// Server sessions freed (clients disconnected, or silent for the failure timeout).
    sessions_closed: u64,
    /// Requests handed to the handlers (each executed once).
    requests: u64,
    /// Duplicate request packets answered from the at-most-once cache.
    dup_requests: u64,
    /// Datagrams dropped by the cores as invalid, stale or out of window.
    dropped_pkts: u64,
    rx_pkts: u64,
    tx_pkts: u64,
    /// `recvmmsg`/`sendmmsg` calls that moved datagrams.
    rx_calls: u64,
    tx_calls: u64,
}

/// Checks the arguments of `--transport erpc`.
fn erpc_args(a: &RunArgs, ranks: usize) -> Result<(), String> {
    if a.backend != Backend::Delegation {
        return Err("--backend applies to copyrpc between ranks, not to --transport erpc".into());
    }
    if a.device.is_some() {
        return Err("--device applies to copyrpc between ranks (the delegation transport)".into());
    }
    if a.daemons == 0 {
        return Err("--daemons must be at least 1".into());
    }
    if a.load.qd == 0 || a.load.qd > ERPC_MAX_IN_FLIGHT {
        return Err(format!(
            "--qd must be in 1..={ERPC_MAX_IN_FLIGHT} with --transport erpc"
        ));
    }
    load_args(&a.load, ranks)
}

/// `--transport erpc` in one process: one rank whose daemons are eRPC servers on UDP
/// loopback; then the summary.
fn run_erpc(a: &RunArgs) -> i32 {
    if a.ranks != 1 {
        return fail(
            "--transport erpc runs one rank in a process (--ranks 1); eRPC across ranks runs \
             under MPI (--mpi)",
        );
    }
    if let Err(e) = erpc_args(a, 1) {
        return fail(&e);
    }
    let ip = a.erpc_ip.unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
    match erpc_rank(&solo(), a, ip) {
        Ok(s) => {
            print_summary(&s, &a.out, true);
            if s.pass { 0 } else { 1 }
        }
        Err(e) => fail(&e),
    }
}

fn spawn_erpc_daemon(
    rank: usize,
    d: usize,
    mut server: Server<KvService, ErpcServer>,
    stop: &Arc<AtomicBool>,
) -> thread::JoinHandle<DaemonReport> {
    let stop = stop.clone();
    thread::Builder::new()
        .name(format!("daemon-{rank}.{d}"))
        .spawn(move || {
            let mut r = daemon_loop(&mut server, &stop);
            let t = server.transport();
            let ep = t.endpoint();
            let core = ep.core_stats();
            let udp = rpc::erpc::transport::DatagramTransport::stats(ep.transport());
            r.erpc = Some(ErpcFigures {
                sessions: ep.rpc().num_sessions() as u64,
                sessions_closed: t.stats().sessions_closed,
                requests: core.requests_dispatched,
                dup_requests: core.dup_req_answered,
                dropped_pkts: core.drop_truncated
                    + core.drop_bad_hdr
                    + core.drop_unknown_session
                    + core.drop_out_of_window
                    + core.drop_msg_too_large
                    + core.drop_bad_len
                    + core.drop_bad_sm,
                rx_pkts: udp.rx_pkts,
                tx_pkts: udp.tx_pkts,
                rx_calls: udp.rx_calls,
                tx_calls: udp.tx_calls,
            });
            r
        })
        .expect("spawn daemon")
}

/// One rank of an eRPC run (`--transport erpc`; every process of `--mpi --transport erpc`):
/// its daemons serve eRPC on UDP sockets bound to `ip`, the ranks all-gather the daemons'
/// addresses, and every client thread connects to every daemon of every rank and sends each
/// operation to the owner daemon of its target rank. Every rank returns the same summary.
fn erpc_rank<B: Bootstrap>(b: &B, a: &RunArgs, ip: std::net::IpAddr) -> Result<Summary, String> {
    let (rank, daemons) = (b.rank(), a.daemons);
    let servers = (0..daemons)
        .map(|d| {
            ErpcServer::serve::<KvService>(SocketAddr::new(ip, 0))
                .map_err(|e| format!("daemon {d}: erpc server on {ip}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>();
    let servers = agree(b, "starting the eRPC servers", servers)?;
    let mine: Vec<u8> = servers
        .iter()
        .flat_map(|s| encode_socket_addr(s.transport().local_addr()))
        .collect();
    let all = b.all_gather(&mine).map_err(|e| on_rank(b, boot(e)))?;
    // Addresses from other ranks are checked (issue 14): a bad one is an error naming its rank.
    let addrs = wire::decode_socket_addrs(&all, b.size(), daemons)
        .map_err(|e| on_rank(b, format!("daemon addresses: {e}")))?;
    let mut threads = DaemonThreads::default();
    for (d, server) in servers.into_iter().enumerate() {
        let h = spawn_erpc_daemon(rank, d, server, &threads.stop);
        threads.handles.push(h);
    }
    // Every rank's daemons run before any client connects to them.
    b.barrier().map_err(|e| on_rank(b, boot(e)))?;
    let remotes = (0..a.load.clients)
        .map(|_| Remote::Rings { daemons })
        .collect();
    let erpc = Arc::new(ErpcDaemons {
        addrs,
        qd: a.load.qd,
    });
    let (mut s, _) = clients_and_check(b, erpc, remotes, threads, &a.load, &a.out, daemons)?;
    s.transport = "erpc";
    s.backend = "erpc";
    Ok(s)
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
    let daemons = match create_rings(&a.shm, a.daemons, cfg) {
        Ok(s) => match a.drop_reply {
            None => start_daemons(s, 0, &stop),
            Some(n) => s
                .into_iter()
                .enumerate()
                .map(|(d, server)| {
                    let (mut server, stop) = (Server::new(server), stop.clone());
                    let drop = if d == 0 { n } else { 0 };
                    thread::Builder::new()
                        .name(format!("daemon-0.{d}"))
                        .spawn(move || daemon_loop_dropping(&mut server, &stop, drop))
                        .expect("spawn daemon")
                })
                .collect(),
        },
        Err(e) => return fail(&format!("creating the rings: {e}")),
    };
    // The rings' manifest, written once they all exist: `kv client` attaches only to the
    // rings it lists (never to whatever `<shm>-N` names another user may create).
    let names: Vec<String> = (0..a.daemons).map(|d| ring_name(&a.shm, d)).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let _manifest = match RingManifest::publish(&a.shm, &names) {
        Ok(m) => m,
        Err(e) => {
            stop.store(true, Ordering::Relaxed);
            for h in daemons {
                let _ = h.join();
            }
            return fail(&format!("publishing the ring manifest: {e}"));
        }
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
    // The rings `kv serve` listed in its manifest (this user's file, mode 0600, validated),
    // not whichever `<shm>-N` names happen to exist.
    let names = match read_manifest(&a.shm) {
        Ok(n) => n,
        Err(RingError::NotFound { path }) => {
            return fail(&format!(
                "no ring manifest {} (start `kv serve --shm {}` first)",
                path.display(),
                a.shm
            ));
        }
        Err(e) => return fail(&format!("reading the ring manifest: {e}")),
    };
    if let Err(e) = load_args(&a.load, 1) {
        return fail(&e);
    }
    // Writer ids are ring 0's client ids: every key class `k % max_clients` needs keys.
    match rpc::delegation::RingClient::attach(&names[0]) {
        Ok(r) if a.load.keys < u64::from(r.info().max_clients) => {
            return fail(&format!(
                "--keys {} is fewer than the rings' client ids (kv serve --max-clients {}): \
                 each client of any kv client process writes the keys k with \
                 k % max_clients == its client id on ring 0",
                a.load.keys,
                r.info().max_clients
            ));
        }
        Ok(_) => {}
        Err(e) => return fail(&format!("attaching to {}: {e}", names[0])),
    }
    let daemons = names.len();
    let remotes = (0..a.load.clients).map(|_| Remote::None).collect();
    let rings = Arc::new(Rings::new(0, names, true));
    let threads = DaemonThreads::default();
    match clients_and_check(&solo(), rings, remotes, threads, &a.load, &a.out, daemons) {
        Ok((s, _)) => {
            print_summary(&s, &a.out, true);
            if s.pass { 0 } else { 1 }
        }
        Err(e) => fail(&e),
    }
}

fn fail(msg: &str) -> i32 {
    eprintln!("kv: {msg}");
    2
}

/// The bootstrap of a job of one rank (this thread): its collectives return at once.
fn solo() -> ThreadRank {
    ThreadGroup::ranks(1).pop().expect("one rank")
}

/// What one client thread measured.
struct ClientReport {
    ops: u64,
    /// Operations on another rank than the client's.
    ops_remote: u64,
    gets: u64,
    hits: u64,
    errors: u64,
    hist: Histogram<u64>,
    /// Latencies of the remote operations only.
    hist_remote: Histogram<u64>,
    /// Calls given up at `--deadline-ms` (also counted in `errors`).
    expired: u64,
    /// Completions of calls given up that came late (dropped): raw ones seen by the loop,
    /// typed ones counted by their clients.
    late: u64,
    /// Last value written to each sampled (rank, key): keys `k` with
    /// `(k / writers) % SAMPLE_EVERY == 0`, so that every writer has some (it writes only
    /// keys `k % writers == gid`).
    written: FxHashMap<(u32, u64), u64>,
}

const SAMPLE_EVERY: u64 = 8;

impl ClientReport {
    /// A client thread that has done nothing yet.
    fn new() -> Self {
        ClientReport {
            ops: 0,
            ops_remote: 0,
            gets: 0,
            hits: 0,
            errors: 0,
            expired: 0,
            late: 0,
            hist: new_hist(),
            hist_remote: new_hist(),
            written: FxHashMap::default(),
        }
    }
}

/// What the client threads of one rank did.
struct RankRun {
    elapsed: Duration,
    clients: Vec<ClientReport>,
    /// Why a client thread failed, if one did.
    failure: Option<String>,
}

/// The correctness check over all ranks (the same on every rank).
struct CheckReport {
    checked: usize,
    /// Of `checked`, keys on another rank than their writer's.
    checked_remote: usize,
    mismatches: usize,
    /// The run wrote no sampled key, so the checkers wrote (and read back) their own.
    self_written: bool,
    /// What failed (a client thread, a check call), on any rank.
    failures: Vec<String>,
}

/// The operations of client `gid` (global id: `rank * clients + c`; it seeds the RNG) over
/// `ranks` ranks, for writer `me.writer` of `me.writers` (it writes only the keys `k` with
/// `k % writers == writer`). With one rank the pattern is exactly the single-node one (no
/// rank is drawn).
fn gen_pattern(load: &LoadArgs, me: Me, ranks: usize) -> Vec<Op> {
    let mut rng =
        SmallRng::seed_from_u64(load.seed ^ (me.gid as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let zipf = Zipf::new(load.keys as f64, load.theta).expect("zipf parameters");
    let (writer, writers) = (me.writer, me.writers);
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
                key = key - key % writers + writer;
                if key >= load.keys {
                    key -= writers;
                }
            }
            let rank = if ranks > 1 {
                rng.random_range(0..ranks as u32)
            } else {
                0
            };
            Op { key, rank, read }
        })
        .collect()
}

/// Runs this rank's client threads, one per entry of `remotes` (reaching the rank's daemons
/// through `daemons`), for `--duration` seconds. The ranks start together (a barrier once
/// every client is connected), and each second every rank sums the operations done and the
/// client threads failed over all ranks (a reduction on every rank: each makes the same number
/// of them); rank 0 prints the throughput. A client thread that fails wakes this thread at
/// once, and the run of every rank ends at that rank's next reduction (at once with one rank):
/// the other client threads stop, and what every thread did up to then is kept.
fn run_clients<B: Bootstrap, D: Daemons>(
    b: &B,
    daemons: Arc<D>,
    remotes: Vec<Remote>,
    load: &LoadArgs,
    out: &OutArgs,
) -> RankRun {
    let (rank, ranks) = (b.rank(), b.size());
    let n = remotes.len();
    let stop = Arc::new(AtomicBool::new(false));
    let counters: Arc<Vec<CachePadded<AtomicU64>>> = Arc::new(
        (0..n)
            .map(|_| CachePadded::new(AtomicU64::new(0)))
            .collect(),
    );
    // `ready`: every client connected; `go`: every rank's clients are.
    let ready = Arc::new(std::sync::Barrier::new(n + 1));
    let go = Arc::new(std::sync::Barrier::new(n + 1));
    // A client thread that fails says so here (and stops the others).
    let (failed_tx, failed_rx) = crossbeam_channel::bounded::<()>(n);
    let mut handles = Vec::new();
    for (c, remote) in remotes.into_iter().enumerate() {
        let gid = rank * load.clients + c;
        let (daemons, load, stop, counters, ready, go, failed) = (
            daemons.clone(),
            load.clone(),
            stop.clone(),
            counters.clone(),
            ready.clone(),
            go.clone(),
            failed_tx.clone(),
        );
        handles.push(
            thread::Builder::new()
                .name(format!("client-{rank}.{c}"))
                .spawn(move || {
                    let mut report = ClientReport::new();
                    let r = client_thread::<D>(
                        gid,
                        (rank, ranks),
                        &*daemons,
                        remote,
                        &load,
                        (&ready, &go),
                        &stop,
                        &counters[c],
                        &mut report,
                    );
                    if r.is_err() {
                        stop.store(true, Ordering::Relaxed);
                        let _ = failed.send(());
                    }
                    (report, r.err())
                })
                .expect("spawn client"),
        );
    }
    ready.wait();
    // The clients of every rank start together.
    let met = b.barrier();
    go.wait();
    let t0 = Instant::now();
    let mut last = 0u64;
    let mut tick = t0;
    let mut failure = met.err().map(boot);
    // One reduction per second (the last one at `--duration`), on every rank.
    let ticks = if failure.is_some() {
        0
    } else {
        load.duration.max(0.0).ceil() as u64
    };
    for k in 1..=ticks {
        let at = t0 + Duration::from_secs_f64((k as f64).min(load.duration));
        // Wakes early if a client thread fails.
        let failed_here = failed_rx.recv_deadline(at).is_ok();
        // Operations done, and whether a client thread failed, over all ranks.
        let mut total = [
            counters
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .sum::<u64>(),
            u64::from(failed_here),
        ];
        if let Err(e) = b.all_reduce_sum_u64(&mut total) {
            failure = Some(boot(e));
            break;
        }
        let now = Instant::now();
        if rank == 0 && !out.quiet {
            eprintln!(
                "[{:5.1} s] {:8.3} Mops/s",
                t0.elapsed().as_secs_f64(),
                (total[0] - last) as f64 / now.duration_since(tick).as_secs_f64() / 1e6
            );
        }
        if total[1] > 0 {
            break;
        }
        last = total[0];
        tick = now;
    }
    if ticks == 0 {
        let end = t0 + Duration::from_secs_f64(load.duration.max(0.0));
        let _ = failed_rx.recv_deadline(end);
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = t0.elapsed();
    let mut clients = Vec::new();
    for (c, h) in handles.into_iter().enumerate() {
        let (report, err) = h.join().expect("client panicked");
        clients.push(report);
        if let Some(e) = err {
            let e = format!("client {rank}.{c} failed: {e}");
            eprintln!("kv: {e}");
            failure.get_or_insert(e);
        }
    }
    RankRun {
        elapsed,
        clients,
        failure,
    }
}

/// One client thread: connects to the daemons, waits for the run to start (`ready`, then
/// `go`: the barriers every client thread of the rank meets, connected or not), and runs the
/// closed loop until `stop`, accumulating into `report` (so that what it did is kept if it
/// fails).
///
/// # Errors
/// Why the thread failed: connecting, a call, or the test hook `--fail-client-after`.
#[allow(clippy::too_many_arguments)]
fn client_thread<D: Daemons>(
    gid: usize,
    (rank, ranks): (usize, usize),
    daemons: &D,
    remote: Remote,
    load: &LoadArgs,
    (ready, go): (&std::sync::Barrier, &std::sync::Barrier),
    stop: &AtomicBool,
    counter: &AtomicU64,
    report: &mut ClientReport,
) -> Result<(), String> {
    let rings = match remote {
        // Connections to the daemons of every rank, rank-major.
        Remote::Rings { .. } => (0..ranks)
            .map(|r| daemons.connect(r))
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.into_iter().flatten().collect()),
        _ => daemons.connect(rank),
    };
    let rings = rings.map_err(|e| e.to_string()).and_then(|mut rings| {
        set_deadline(&mut rings, load);
        let (writer, writers) = daemons
            .writer(&rings)
            .unwrap_or((gid as u64, (load.clients * ranks) as u64));
        if writers > load.keys || writers > 1 << (64 - SEQ_BITS) {
            return Err(format!(
                "{writers} writer ids do not fit --keys {} (or {} bits)",
                load.keys,
                64 - SEQ_BITS
            ));
        }
        let me = Me {
            gid,
            rank,
            writer,
            writers,
        };
        Ok((rings, me, gen_pattern(load, me, ranks)))
    });
    ready.wait();
    go.wait();
    let (mut rings, me, pattern) = rings?;
    // Every call of the closed loop may go to the same ring.
    if let Some(r) = rings.iter().find(|r| r.max_in_flight() < load.qd) {
        return Err(format!(
            "--qd {} exceeds the ring's {} response slots per client (kv serve --resp-depth)",
            load.qd,
            r.max_in_flight()
        ));
    }
    let r = client_loop::<D>(
        me, &mut rings, remote, &pattern, load, stop, counter, report,
    );
    // Late responses of expired typed calls, dropped by their clients.
    report.late += rings.iter().map(|c| c.stats().late_responses).sum::<u64>();
    daemons.finished(rings);
    r
}

/// Who a client thread is.
#[derive(Clone, Copy)]
struct Me {
    /// Global client id (`rank * clients + c`).
    gid: usize,
    rank: usize,
    /// The writer id in values: the client writes only keys `k` with
    /// `k % writers == writer` ([`Daemons::writer`]; by default `gid`).
    writer: u64,
    /// Number of writer ids (by default all clients of all ranks).
    writers: u64,
}

/// A completed call: its tag and response, or how it failed.
type Done = (u64, Result<KvResponse, Failed>);

/// How a call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failed {
    /// No completion within `--deadline-ms` (the typed client's `DeadlineExceeded`).
    Deadline,
    /// An error response, or one that did not decode.
    Error,
}

/// How a typed call failed.
#[cold]
fn failed(e: RpcError) -> Failed {
    match e {
        RpcError::DeadlineExceeded { .. } => Failed::Deadline,
        _ => Failed::Error,
    }
}

/// What [`issue`] did with an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sent {
    /// Nothing: the transport cannot take the call now; poll and issue it again.
    Later,
    /// A typed call (its client enforces its deadline).
    Typed,
    /// A raw copyrpc call over a direct endpoint (the client loop enforces its deadline).
    Raw,
}

/// The method id of an operation.
#[inline]
fn method_of(op: &Op) -> u16 {
    if op.read {
        KvService::GET
    } else {
        KvService::PUT
    }
}

/// Sends `op` with tag `tag`: to the owner daemon's ring if it is for this rank, else over
/// the remote path. Direct calls that find the copyrpc ring full poll (completions go to
/// `done`) and retry, until `deadline` after the call's issue time (then the thread fails).
/// Returns [`Sent::Later`] if the daemon's transport cannot take the call now (ScaleRPC: the
/// connection's group is not scheduled): poll and issue it again.
#[inline]
fn issue<T: ClientTransport>(
    me: Me,
    (tag, op, value): (u64, Op, u64),
    rings: &mut [KvClient<T>],
    remote: &mut Remote,
    inflight: &[(Instant, Op)],
    done: &mut Vec<Done>,
    deadline: Duration,
) -> Result<Sent, String> {
    let ring = match remote {
        Remote::Rings { daemons } => op.rank as usize * *daemons + owner_daemon(op.key, *daemons),
        _ if op.rank as usize == me.rank => owner_daemon(op.key, rings.len()),
        Remote::None | Remote::Delegation => 0,
        Remote::Direct { ctx, eps } => {
            let Some(ep) = eps.get(op.rank as usize).copied().flatten() else {
                return Err(format!("no endpoint to rank {}", op.rank));
            };
            let req = if op.read {
                KvRequest::get(op.rank, op.key)
            } else {
                KvRequest::put(op.rank, op.key, value)
            };
            let d = KvService::DESCRIPTOR;
            loop {
                match ctx.call_with(
                    ep,
                    d.max_request_bytes as u32,
                    tag as u32,
                    d.max_response_bytes as u32,
                    |buf| KvService::encode_request(&req, buf),
                ) {
                    Ok(_) => return Ok(Sent::Raw),
                    Err(e) if e.is_retryable() => {
                        ctx.poll(|t, r| done.push(direct_done(inflight, t, r)));
                        if done.is_empty() && inflight[tag as usize].0.elapsed() >= deadline {
                            return Err(no_room(op.rank, deadline));
                        }
                    }
                    Err(CallError::Failed(_)) => {
                        return Err(format!("endpoint to rank {} failed", op.rank));
                    }
                    Err(e) => return Err(format!("copyrpc call to rank {}: {e}", op.rank)),
                }
            }
        }
    };
    let ring = &mut rings[ring];
    let r = if op.read {
        ring.issue(tag).get(op.rank, op.key)
    } else {
        ring.issue(tag).put(op.rank, op.key, value)
    };
    match r {
        Ok(()) => Ok(Sent::Typed),
        Err(RpcError::WouldBlock) => Ok(Sent::Later),
        Err(e) => Err(e.to_string()),
    }
}

/// A direct call that found no room on its endpoint to rank `rank` for `deadline`.
#[cold]
fn no_room(rank: u32, deadline: Duration) -> String {
    format!(
        "copyrpc call to rank {rank}: no room on the endpoint within --deadline-ms {}",
        deadline.as_millis()
    )
}

/// Decodes a direct (copyrpc) response for the call with tag `t`.
#[inline]
fn direct_done(
    inflight: &[(Instant, Op)],
    t: u32,
    r: Result<&[u8], rpc::copyrpc::EndpointFailure>,
) -> Done {
    let op = inflight[t as usize].1;
    let resp = r
        .ok()
        .and_then(|b| KvService::decode_response(method_of(&op), b).ok())
        .ok_or(Failed::Error);
    (t as u64, resp)
}

/// The closed loop of one client thread (seeds/004 §7): requests for its rank go to the owner
/// daemon's ring, the others over `remote`; every ring and the copyrpc context (if any) are
/// polled, and each completion is replaced by the next operation of the pattern. An operation
/// the transport cannot take yet (or, on a transport that does not keep a connection's calls
/// in order, a write of a key with a write outstanding) waits, and the ones after it too.
#[allow(clippy::too_many_arguments)]
fn client_loop<D: Daemons>(
    me: Me,
    rings: &mut [KvClient<D::T>],
    mut remote: Remote,
    pattern: &[Op],
    load: &LoadArgs,
    stop: &AtomicBool,
    counter: &AtomicU64,
    rep: &mut ClientReport,
) -> Result<(), String> {
    let qd = load.qd;
    // The test hook `--fail-client-after`: client 0 fails once it has done this many.
    let fail_after = match load.fail_client_after {
        Some(n) if me.gid == 0 => n,
        _ => u64::MAX,
    };
    // Per tag (0..qd): the raw calls' state (`Tag`; typed calls' tags stay `Free`: their
    // clients track them), when it was issued and what it was.
    let mut state = vec![Tag::Free; qd];
    let deadline = Duration::from_millis(load.deadline_ms);
    // Raw (direct copyrpc) calls in flight, whose deadlines this loop enforces; none of them
    // expires before `next_expiry` (the clock is read only when polls find nothing).
    // `tracked`: tags not `Free` (raw calls in flight or expired); 0 on the typed-only path,
    // which then never reads `state`.
    let (mut raw_out, mut tracked) = (0usize, 0usize);
    let mut next_expiry = Instant::now() + deadline;
    // The test hook `--lose-direct-reply`: raw completions seen, and which one to ignore.
    let mut raw_seen = 0u64;
    let lose_at = match load.lose_direct_reply {
        Some(n) if me.gid == 0 => n,
        _ => 0,
    };
    let mut inflight: Vec<(Instant, Op)> = vec![
        (
            Instant::now(),
            Op {
                key: 0,
                rank: 0,
                read: true
            }
        );
        qd
    ];
    let mut done: Vec<Done> = Vec::with_capacity(qd);
    let mut free: Vec<u64> = (0..qd as u64).collect();
    let (mut next, mut seq) = (0usize, 0u64);
    let mut outstanding = 0usize;
    // The next operation, taken from the pattern but not issued yet, and its value.
    let mut waiting: Option<(Op, u64)> = None;
    // Unordered transports: (rank, key) of the writes outstanding.
    let mut writes_out: rustc_hash::FxHashSet<(u32, u64)> = Default::default();
    let backoff = Backoff::new();
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if !stopping {
            while let Some(&tag) = free.last() {
                let (op, value) = match waiting.take() {
                    Some(w) => w,
                    None => {
                        let op = pattern[next];
                        next = if next + 1 == pattern.len() {
                            0
                        } else {
                            next + 1
                        };
                        let mut value = 0;
                        if !op.read {
                            seq += 1;
                            value = (me.writer << SEQ_BITS) | (seq & ((1 << SEQ_BITS) - 1));
                        }
                        (op, value)
                    }
                };
                if !D::ORDERED && !op.read && !writes_out.insert((op.rank, op.key)) {
                    // A write of this key is outstanding: the two could execute in either order.
                    waiting = Some((op, value));
                    break;
                }
                inflight[tag as usize] = (Instant::now(), op);
                let sent = issue(
                    me,
                    (tag, op, value),
                    rings,
                    &mut remote,
                    &inflight,
                    &mut done,
                    deadline,
                )?;
                if sent == Sent::Later {
                    if !D::ORDERED && !op.read {
                        writes_out.remove(&(op.rank, op.key));
                    }
                    waiting = Some((op, value));
                    break;
                }
                free.pop();
                if sent == Sent::Raw {
                    state[tag as usize] = Tag::Raw;
                    raw_out += 1;
                    tracked += 1;
                }
                if !op.read && (op.key / me.writers) % SAMPLE_EVERY == 0 {
                    rep.written.insert((op.rank, op.key), value);
                }
                outstanding += 1;
            }
        } else if outstanding == 0 {
            break;
        }
        for ring in rings.iter_mut() {
            ring.poll_with(|tag, r| done.push((tag, r.map_err(failed))))
                .map_err(|e| e.to_string())?;
        }
        if let Remote::Direct { ctx, .. } = &mut remote {
            ctx.poll(|t, r| done.push(direct_done(&inflight, t, r)));
        }
        if done.is_empty() {
            D::keepalive(rings);
            if raw_out > 0 {
                let now = Instant::now();
                if now >= next_expiry {
                    let (n, next) = expire(
                        (&inflight, &mut state),
                        (now, deadline),
                        rep,
                        (!D::ORDERED).then_some(&mut writes_out),
                    );
                    outstanding -= n;
                    raw_out -= n;
                    next_expiry = next;
                }
            }
            backoff.snooze();
            continue;
        }
        backoff.reset();
        for (tag, r) in done.drain(..) {
            if tracked > 0 && state[tag as usize] != Tag::Free {
                let was = std::mem::replace(&mut state[tag as usize], Tag::Free);
                if was == Tag::Raw {
                    raw_seen += 1;
                    if raw_seen == lose_at {
                        // Test hook: as if this reply were lost.
                        state[tag as usize] = Tag::Raw;
                        continue;
                    }
                    raw_out -= 1;
                    tracked -= 1;
                } else {
                    // A late completion of a call given up: dropped; its tag is free again.
                    rep.late += 1;
                    tracked -= 1;
                    free.push(tag);
                    continue;
                }
            }
            let (t, op) = inflight[tag as usize];
            if !D::ORDERED && !op.read {
                writes_out.remove(&(op.rank, op.key));
            }
            if r == Err(Failed::Deadline) {
                // The typed client gave the call up at its deadline.
                expired(op, rep);
                outstanding -= 1;
                free.push(tag);
                continue;
            }
            let ns = (t.elapsed().as_nanos() as u64).max(1);
            let _ = rep.hist.record(ns);
            if op.rank as usize != me.rank {
                rep.ops_remote += 1;
                let _ = rep.hist_remote.record(ns);
            }
            rep.ops += 1;
            match r {
                Ok(KvResponse::Get(v)) if op.read => {
                    rep.gets += 1;
                    if let Some(v) = v {
                        rep.hits += 1;
                        // Single writer per key: the value must come from the key's writer.
                        if v >> SEQ_BITS != op.key % me.writers {
                            rep.errors += 1;
                        }
                    }
                }
                Ok(KvResponse::Put(())) if !op.read => {}
                _ => rep.errors += 1,
            }
            outstanding -= 1;
            free.push(tag);
        }
        counter.store(rep.ops, Ordering::Relaxed);
        if rep.ops >= fail_after {
            return Err(failed_on_purpose(rep.ops));
        }
    }
    Ok(())
}

/// Where a tag of a client thread stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tag {
    /// No raw call on it (free, or a typed call in flight: its client delivers it, or its
    /// expiry at `--deadline-ms` as `RpcError::DeadlineExceeded`, and drops a late response
    /// itself).
    Free,
    /// A raw copyrpc call in flight over a direct endpoint: [`expire`] gives it up at
    /// `--deadline-ms`.
    Raw,
    /// Its raw call got no completion within `--deadline-ms`: counted as an error and given
    /// up; the tag is reused once that call's late completion arrives (dropped), if ever.
    Expired,
}

/// A call given up at its deadline: an error, counted in `rep.expired`; its write (whether it
/// executed is unknown) leaves the sampled keys.
#[cold]
fn expired(op: Op, rep: &mut ClientReport) {
    rep.errors += 1;
    rep.expired += 1;
    if !op.read {
        rep.written.remove(&(op.rank, op.key));
    }
}

/// Gives up every raw call in flight (`Tag::Raw`) issued `deadline` or more before `now`
/// (`inflight`: issue time and operation by tag; see [`expired`]), and, for unordered
/// transports, forgets its write from `writes_out`. Returns how many expired and the earliest
/// instant another raw call in flight can expire.
#[cold]
fn expire(
    (inflight, state): (&[(Instant, Op)], &mut [Tag]),
    (now, deadline): (Instant, Duration),
    rep: &mut ClientReport,
    mut writes_out: Option<&mut rustc_hash::FxHashSet<(u32, u64)>>,
) -> (usize, Instant) {
    let (mut n, mut next) = (0, now + deadline);
    for (s, &(at, op)) in state.iter_mut().zip(inflight) {
        if *s != Tag::Raw {
            continue;
        }
        if at + deadline > now {
            next = next.min(at + deadline);
            continue;
        }
        *s = Tag::Expired;
        n += 1;
        expired(op, rep);
        if let Some(w) = writes_out.as_deref_mut().filter(|_| !op.read) {
            w.remove(&(op.rank, op.key));
        }
    }
    (n, next)
}

/// The error of the test hook `--fail-client-after`.
#[cold]
fn failed_on_purpose(ops: u64) -> String {
    format!("failed on purpose after {ops} operations (test hook --fail-client-after)")
}

/// Bytes of a sampled key in the check's exchange: its rank (4), key (8), value (8).
const SAMPLE_BYTES: usize = 20;

/// The correctness check, on every rank together. Each rank samples
/// `ceil(--check-samples / ranks)` of the keys its clients wrote (on any rank) and
/// all-gathers them, so that every rank reads the keys it owns back from their owner daemon
/// (blocking calls, each bounded by `--deadline-ms`, through a fresh client of its own
/// daemons) and compares them with the
/// last value their single writer wrote; the counts and failures are summed over the ranks.
/// A run that wrote nothing (`--read-ratio 1`) has nothing to compare, so each rank's
/// checker then writes its own sample keys on its rank (values with writer id
/// `clients * ranks`, which no run client uses) and reads them back. `failure`: a client
/// thread of this rank failed; the rank still takes part, and the check fails.
fn check_written<B: Bootstrap, D: Daemons>(
    b: &B,
    daemons: &D,
    clients: &[ClientReport],
    mut failure: Option<String>,
    load: &LoadArgs,
) -> Result<CheckReport, String> {
    let (me, ranks) = (b.rank(), b.size());
    let quota = load.check_samples.div_ceil(ranks);
    // (rank, key, value): one writer per (rank, key), so no key twice.
    let mut written: Vec<(u32, u64, u64)> = clients
        .iter()
        .flat_map(|c| c.written.iter().map(|(&(r, k), &v)| (r, k, v)))
        .collect();
    written.sort_unstable();
    let mut total = [written.len() as u64];
    b.all_reduce_sum_u64(&mut total).map_err(boot)?;
    let self_written = total[0] == 0;
    let mut rings = None;
    if failure.is_none() {
        match daemons.connect(me) {
            Ok(mut r) => {
                set_deadline(&mut r, load);
                rings = Some(r)
            }
            Err(e) => failure = Some(format!("check client: {e}")),
        }
    }
    if let (true, Some(rings)) = (self_written, rings.as_mut()) {
        // A writer id of its own: past the run's clients, or the one the daemons hand out
        // (then only keys of its class, which no other client writes).
        let (id, class) = match daemons.writer(rings) {
            Some((id, writers)) => (id, Some(writers)),
            None => ((load.clients * ranks) as u64, None),
        };
        let writer = id << SEQ_BITS;
        let n = rings.len();
        for i in 0..quota.max(1) as u64 {
            let mut key = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20;
            if let Some(writers) = class {
                key = key - key % writers + id;
            }
            let value = writer | i;
            if let Err(e) = rings[owner_daemon(key, n)].put(me as u32, key, value) {
                failure = Some(format!("check put({me}, {key}): {e}"));
                break;
            }
            D::keepalive(rings);
            written.push((me as u32, key, value));
        }
        // Later writes of a repeated key win.
        written.reverse();
        written.sort_by_key(|w| (w.0, w.1));
        written.dedup_by_key(|w| (w.0, w.1));
    }
    let step = (written.len() / quota.max(1)).max(1);
    let mut sample = Vec::with_capacity(quota * SAMPLE_BYTES);
    for &(rank, key, value) in written.iter().step_by(step).take(quota) {
        sample.extend(rank.to_le_bytes());
        sample.extend(key.to_le_bytes());
        sample.extend(value.to_le_bytes());
    }
    let all = gather_var(b, &sample)?;
    let (mut checked, mut checked_remote, mut mismatches) = (0u64, 0u64, 0u64);
    if let (None, Some(rings)) = (&failure, rings.as_mut()) {
        let n = rings.len();
        'read: for (writer_rank, part) in all.iter().enumerate() {
            if part.len() % SAMPLE_BYTES != 0 {
                failure = Some(format!(
                    "check: rank {writer_rank} sent {} sample bytes, not a multiple of {SAMPLE_BYTES}",
                    part.len()
                ));
                break 'read;
            }
            for rec in part.chunks_exact(SAMPLE_BYTES) {
                let (Some(rank), Some(key), Some(want)) = (
                    wire::le_u32(rec, 0),
                    wire::le_u64(rec, 4),
                    wire::le_u64(rec, 12),
                ) else {
                    continue; // unreachable: every chunk is SAMPLE_BYTES long
                };
                if rank as usize != me {
                    continue;
                }
                let got = match rings[owner_daemon(key, n)].get(rank, key) {
                    Ok(got) => got,
                    Err(e) => {
                        failure = Some(format!("check get({rank}, {key}): {e}"));
                        break 'read;
                    }
                };
                D::keepalive(rings);
                checked += 1;
                checked_remote += u64::from(writer_rank != me);
                if got != Some(want) {
                    if mismatches < 5 {
                        eprintln!(
                            "kv: check: rank {rank} key {key}: read {got:?}, last written Some({want})"
                        );
                    }
                    mismatches += 1;
                }
            }
        }
    }
    // The checker's connections close before any daemon stops.
    drop(rings);
    let mut counts = [checked, checked_remote, mismatches];
    b.all_reduce_sum_u64(&mut counts).map_err(boot)?;
    let failure = failure.map(|f| on_rank(b, f)).unwrap_or_default();
    let failures = gather_var(b, failure.as_bytes())?
        .into_iter()
        .filter(|f| !f.is_empty())
        .map(|f| String::from_utf8_lossy(&f).into_owned())
        .collect();
    Ok(CheckReport {
        checked: counts[0] as usize,
        checked_remote: counts[1] as usize,
        mismatches: counts[2] as usize,
        self_written,
        failures,
    })
}

/// Gives every call of `conns` the deadline `--deadline-ms` (the typed clients' default).
fn set_deadline<T: ClientTransport>(conns: &mut [KvClient<T>], load: &LoadArgs) {
    for c in conns {
        c.set_default_deadline(Duration::from_millis(load.deadline_ms));
    }
}

/// Longest byte string a rank may contribute to [`gather_var`] (256 MiB): a length read from
/// another rank never sizes an allocation beyond it.
const GATHER_MAX_BYTES: usize = 256 << 20;

/// All-gathers a byte string of any length from every rank ([`wire::gather_var`], at most
/// [`GATHER_MAX_BYTES`]); the strings by rank.
fn gather_var<B: Bootstrap>(b: &B, mine: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    wire::gather_var(b, mine, GATHER_MAX_BYTES).map_err(boot)
}

/// A latency histogram: 1 ns to 60 s, 3 significant digits.
fn new_hist() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram")
}

/// The sum over all ranks of every rank's histogram `h`: each rank's serialized with
/// hdrhistogram's V2 encoding, all-gathered, deserialized and added.
fn merge_hist<B: Bootstrap>(b: &B, h: &Histogram<u64>) -> Result<Histogram<u64>, String> {
    let mut buf = Vec::new();
    V2Serializer::new()
        .serialize(h, &mut buf)
        .map_err(|e| format!("serializing a histogram: {e:?}"))?;
    let mut sum = new_hist();
    for part in gather_var(b, &buf)? {
        let h: Histogram<u64> = Deserializer::new()
            .deserialize(&mut &part[..])
            .map_err(|e| format!("deserializing a rank's histogram: {e:?}"))?;
        sum.add(&h)
            .map_err(|e| format!("merging the histograms: {e:?}"))?;
    }
    Ok(sum)
}

/// Counter structs summed field by field (over a rank's daemons, and over the ranks by a
/// reduction).
trait Counters: Default {
    fn to_vec(&self) -> Vec<u64>;
    fn from_slice(v: &[u64]) -> Self;
    fn add(&mut self, o: &Self) {
        let sum: Vec<u64> = (self.to_vec().iter().zip(o.to_vec()))
            .map(|(a, b)| a + b)
            .collect();
        *self = Self::from_slice(&sum);
    }
}

macro_rules! counters {
    ($t:ty { $($f:ident),+ $(,)? }) => {
        impl Counters for $t {
            fn to_vec(&self) -> Vec<u64> {
                vec![$(self.$f),+]
            }
            fn from_slice(v: &[u64]) -> Self {
                let mut v = v.iter().copied();
                let mut s = Self::default();
                $(s.$f = v.next().expect("a value per counter");)+
                s
            }
        }
    };
}

counters!(ForwardStats {
    ring_local,
    forwarded,
    responses,
    remote_served,
    handed_off,
    handoff_replies,
    bad_requests,
    unroutable,
    failed_calls,
    corrupt_responses,
    dropped_replies,
    ring_full_retries,
    daemon_busy_waits,
});

counters!(ErpcFigures {
    sessions,
    sessions_closed,
    requests,
    dup_requests,
    dropped_pkts,
    rx_pkts,
    tx_pkts,
    rx_calls,
    tx_calls,
});

/// The figures of one run, over all ranks.
struct Summary {
    /// How clients reach the daemons of their rank (`delegation`, `scalerpc`, `erpc`).
    transport: &'static str,
    /// ScaleRPC runs: scheduler and QPC figures.
    scale: Option<ScaleFigures>,
    /// eRPC runs: the daemons' endpoint counters.
    erpc: Option<ErpcFigures>,
    backend: &'static str,
    ranks: usize,
    /// The ranks were MPI processes.
    mpi: bool,
    daemons: usize,
    clients: usize,
    qd: usize,
    read_ratio: f64,
    keys: u64,
    dist: String,
    secs: f64,
    ops: u64,
    mops: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
    ops_remote: u64,
    remote_p50_us: f64,
    remote_p99_us: f64,
    rank_ops: Vec<u64>,
    rank_mops: Vec<f64>,
    /// Requests the daemons of each rank executed.
    rank_served: Vec<u64>,
    gets: u64,
    hits: u64,
    /// Failed operations: error responses, implausible reads, calls expired.
    errors: u64,
    /// Calls given up at `--deadline-ms`.
    expired: u64,
    /// Late responses of calls given up (dropped).
    late: u64,
    bad_requests: u64,
    forward: Option<ForwardStats>,
    checked: usize,
    checked_remote: usize,
    mismatches: usize,
    check_msg: String,
    pass: bool,
}

/// The summary of a run over all ranks, from this rank's clients and daemons (every rank
/// gets the same one): counters summed, latency histograms merged ([`merge_hist`]),
/// throughput and requests served per rank, the check. The run's time is the longest of
/// the ranks'.
fn combine<B: Bootstrap>(
    b: &B,
    run: &RankRun,
    reports: &[DaemonReport],
    check: CheckReport,
    load: &LoadArgs,
    ndaemons: usize,
) -> Result<Summary, String> {
    let (mut hist, mut hist_remote) = (new_hist(), new_hist());
    // ops, ops_remote, gets, hits, errors, bad requests, calls expired, late responses.
    let mut sums = vec![0u64; 8];
    for c in &run.clients {
        hist.add(&c.hist)
            .map_err(|e| format!("histogram merge: {e:?}"))?;
        hist_remote
            .add(&c.hist_remote)
            .map_err(|e| format!("histogram merge: {e:?}"))?;
        for (s, v) in sums
            .iter_mut()
            .zip([c.ops, c.ops_remote, c.gets, c.hits, c.errors])
        {
            *s += v;
        }
        sums[6] += c.expired;
        sums[7] += c.late;
    }
    let rank_ops = sums[0];
    sums[5] = reports.iter().map(|d| d.bad_requests).sum();
    let served: u64 = reports.iter().map(|d| d.requests).sum();
    let (mut forward, mut erpc) = (None::<ForwardStats>, None::<ErpcFigures>);
    for d in reports {
        if let Some(f) = &d.forward {
            forward.get_or_insert_with(Default::default).add(f);
        }
        if let Some(e) = &d.erpc {
            erpc.get_or_insert_with(Default::default).add(e);
        }
    }
    let nf = ForwardStats::default().to_vec().len();
    sums.push(u64::from(forward.is_some()));
    sums.extend(forward.unwrap_or_default().to_vec());
    sums.push(u64::from(erpc.is_some()));
    sums.extend(erpc.unwrap_or_default().to_vec());
    b.all_reduce_sum_u64(&mut sums).map_err(boot)?;
    let [
        ops,
        ops_remote,
        gets,
        hits,
        errors,
        bad_requests,
        expired,
        late,
    ] = sums[..8]
    else {
        unreachable!("eight sums")
    };
    let forward = (sums[8] > 0).then(|| ForwardStats::from_slice(&sums[9..9 + nf]));
    let erpc = (sums[9 + nf] > 0).then(|| ErpcFigures::from_slice(&sums[10 + nf..]));
    // Per rank: operations, requests served, seconds.
    let mut mine = Vec::with_capacity(24);
    mine.extend(rank_ops.to_le_bytes());
    mine.extend(served.to_le_bytes());
    mine.extend(run.elapsed.as_secs_f64().to_le_bytes());
    let per = b.all_gather(&mine).map_err(boot)?;
    let per = wire::split_ranks(&per, b.size(), 24).map_err(boot)?;
    let (mut rank_ops, mut rank_served, mut rank_mops, mut secs) = (vec![], vec![], vec![], 0.0);
    for (rank, r) in per.iter().enumerate() {
        let (Some(o), Some(s), Some(t)) =
            (wire::le_u64(r, 0), wire::le_u64(r, 8), wire::le_u64(r, 16))
        else {
            return Err(format!("rank {rank} sent a short figures record"));
        };
        let t = f64::from_bits(t);
        rank_ops.push(o);
        rank_served.push(s);
        rank_mops.push(o as f64 / t / 1e6);
        secs = f64::max(secs, t);
    }
    let hist = merge_hist(b, &hist)?;
    let hist_remote = merge_hist(b, &hist_remote)?;
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e3;
    let forward_errors = forward.map_or(0, |f| {
        f.unroutable + f.failed_calls + f.corrupt_responses + f.dropped_replies
    });
    let check_ok = check.mismatches == 0 && check.checked > 0 && check.failures.is_empty();
    let mut notes = Vec::new();
    if expired > 0 {
        notes.push(format!(
            "{expired} call(s) got no reply within --deadline-ms {}",
            load.deadline_ms
        ));
    }
    if !check.failures.is_empty() {
        let mut m = check.failures[..check.failures.len().min(3)].join("; ");
        if check.failures.len() > 3 {
            m += &format!("; and {} more", check.failures.len() - 3);
        }
        notes.push(m);
    } else if check.self_written {
        notes.push("the run wrote nothing: keys written by the checker".to_string());
    }
    let check_msg = notes.join("; ");
    Ok(Summary {
        transport: "delegation",
        scale: None,
        erpc,
        backend: "delegation",
        ranks: b.size(),
        mpi: false,
        daemons: ndaemons,
        clients: load.clients,
        qd: load.qd,
        read_ratio: load.read_ratio,
        keys: load.keys,
        dist: match load.dist {
            Dist::Uniform => "uniform".to_string(),
            Dist::Zipf => format!("zipf({})", load.theta),
        },
        secs,
        ops,
        mops: ops as f64 / secs / 1e6,
        p50_us: us(&hist, 0.5),
        p99_us: us(&hist, 0.99),
        p999_us: us(&hist, 0.999),
        max_us: hist.max() as f64 / 1e3,
        ops_remote,
        remote_p50_us: us(&hist_remote, 0.5),
        remote_p99_us: us(&hist_remote, 0.99),
        rank_ops,
        rank_mops,
        rank_served,
        gets,
        hits,
        errors,
        expired,
        late,
        bad_requests,
        forward,
        checked: check.checked,
        checked_remote: check.checked_remote,
        mismatches: check.mismatches,
        check_msg,
        pass: check_ok && errors == 0 && bad_requests == 0 && forward_errors == 0,
    })
}

fn print_summary(s: &Summary, out: &OutArgs, first: bool) {
    let Summary {
        ranks,
        daemons,
        clients,
        qd,
        read_ratio,
        keys,
        secs,
        ops,
        mops,
        ops_remote,
        gets,
        hits,
        errors,
        bad_requests,
        checked,
        checked_remote,
        mismatches,
        pass,
        ..
    } = *s;
    let (dist, backend, check_msg) = (&s.dist, s.backend, &s.check_msg);
    let f = s.forward.unwrap_or_default();
    if out.json {
        let mut v = serde_json::json!({
            "transport": s.transport, "daemons": daemons, "clients": clients, "qd": qd,
            "read_ratio": read_ratio, "keys": keys, "dist": dist, "seconds": secs,
            "ops": ops, "mops": mops, "p50_us": s.p50_us, "p99_us": s.p99_us,
            "p999_us": s.p999_us, "gets": gets, "get_hits": hits, "errors": errors,
            "bad_requests": bad_requests, "check_samples": checked,
            "check_mismatches": mismatches, "check_passed": pass, "check_note": check_msg,
        });
        let more = serde_json::json!({
            "ranks": ranks, "mpi": s.mpi, "backend": backend, "clients_total": clients * ranks,
            "max_us": s.max_us, "rank_served": s.rank_served,
            "ops_local": ops - ops_remote, "ops_remote": ops_remote,
            "remote_p50_us": s.remote_p50_us, "remote_p99_us": s.remote_p99_us,
            "rank_ops": s.rank_ops, "rank_mops": s.rank_mops,
            "check_samples_remote": checked_remote, "deadline_exceeded": s.expired,
            "late_responses": s.late,
        });
        let forward = s.forward.map(|f| {
            serde_json::json!({
                "ring_local": f.ring_local, "forwarded": f.forwarded, "responses": f.responses,
                "remote_served": f.remote_served, "handed_off": f.handed_off,
                "handoff_replies": f.handoff_replies, "bad_requests": f.bad_requests,
                "unroutable": f.unroutable, "failed_calls": f.failed_calls,
                "corrupt_responses": f.corrupt_responses, "dropped_replies": f.dropped_replies,
                "ring_full_retries": f.ring_full_retries,
                "daemon_busy_waits": f.daemon_busy_waits,
            })
        });
        let obj = v.as_object_mut().expect("an object");
        obj.extend(more.as_object().expect("an object").clone());
        obj.insert("forward".into(), forward.unwrap_or(serde_json::Value::Null));
        if let Some(sc) = &s.scale {
            obj.insert(
                "scalerpc".into(),
                serde_json::json!({
                    "group_size": sc.group_size, "slice_us": sc.slice_us,
                    "slot_size": sc.slot_size, "conns": sc.conns, "groups": sc.groups,
                    "switches": sc.switches, "warmup_delays": sc.warmup_delays,
                    "acks": sc.acks, "evictions": sc.evictions,
                    "failed_conns": sc.failed_conns, "requests": sc.requests,
                    "doorbells": sc.doorbells, "notices": sc.notices, "probes": sc.probes,
                    "qpc_server_hits": sc.qpc_server.0, "qpc_server_misses": sc.qpc_server.1,
                    "qpc_hits": sc.qpc_all.0, "qpc_misses": sc.qpc_all.1,
                }),
            );
        }
        if let Some(e) = &s.erpc {
            obj.insert(
                "erpc".into(),
                serde_json::json!({
                    "sessions": e.sessions, "sessions_closed": e.sessions_closed,
                    "requests": e.requests, "dup_requests": e.dup_requests,
                    "dropped_pkts": e.dropped_pkts, "rx_pkts": e.rx_pkts, "tx_pkts": e.tx_pkts,
                    "rx_calls": e.rx_calls, "tx_calls": e.tx_calls,
                }),
            );
        }
        println!("{v}");
    } else if out.csv {
        if first {
            println!(
                "transport,daemons,clients,qd,read_ratio,keys,dist,seconds,ops,mops,p50_us,p99_us,p999_us,gets,get_hits,errors,check_samples,check_mismatches,check_passed,ranks,backend,ops_local,ops_remote,remote_p50_us,remote_p99_us,rank_mops,forwarded,remote_served,handed_off,unroutable,failed_calls,corrupt_responses,ring_full_retries,max_us,rank_served,mpi"
            );
        }
        let rank_served: Vec<String> = s.rank_served.iter().map(|n| n.to_string()).collect();
        let rank_mops: Vec<String> = s.rank_mops.iter().map(|m| format!("{m:.4}")).collect();
        println!(
            "{},{daemons},{clients},{qd},{read_ratio},{keys},{dist},{secs:.3},{ops},{mops:.4},{:.2},{:.2},{:.2},{gets},{hits},{errors},{checked},{mismatches},{pass},{ranks},{backend},{},{ops_remote},{:.2},{:.2},{},{},{},{},{},{},{},{},{:.2},{},{}",
            s.transport,
            s.p50_us,
            s.p99_us,
            s.p999_us,
            ops - ops_remote,
            s.remote_p50_us,
            s.remote_p99_us,
            rank_mops.join(";"),
            f.forwarded,
            f.remote_served,
            f.handed_off,
            f.unroutable,
            f.failed_calls,
            f.corrupt_responses,
            f.ring_full_retries,
            s.max_us,
            rank_served.join(";"),
            s.mpi,
        );
    } else {
        if ranks == 1 {
            println!(
                "kv over {}: {daemons} daemon(s), {clients} client(s), QD {qd}, {:.0}% gets, {keys} keys {dist}, {secs:.1} s",
                s.transport,
                read_ratio * 100.0,
            );
        } else {
            let kind = if s.mpi { "MPI ranks" } else { "ranks" };
            let over = match s.transport {
                "delegation" => format!("backend {backend}"),
                t => format!("over {t}"),
            };
            println!(
                "kv, {ranks} {kind}, {over}: {daemons} daemon(s) and {clients} client(s) per rank, QD {qd}, {:.0}% gets, {keys} keys {dist} per rank, {secs:.1} s",
                read_ratio * 100.0,
            );
        }
        println!("  throughput  {mops:.3} Mops/s ({ops} ops)");
        if ranks > 1 {
            let per: Vec<String> = s
                .rank_mops
                .iter()
                .enumerate()
                .map(|(r, m)| format!("{r}: {m:.3}"))
                .collect();
            println!("  per rank    {} Mops/s", per.join("   "));
            let served: Vec<String> = s
                .rank_served
                .iter()
                .enumerate()
                .map(|(r, n)| format!("{r}: {n}"))
                .collect();
            println!("  served      {} requests", served.join("   "));
        }
        println!(
            "  latency     p50 {:.2} us   p99 {:.2} us   p999 {:.2} us   max {:.2} us",
            s.p50_us, s.p99_us, s.p999_us, s.max_us
        );
        if ranks > 1 {
            println!(
                "  remote      {ops_remote} ops ({:.0}%), {} local   p50 {:.2} us   p99 {:.2} us",
                ops_remote as f64 * 100.0 / ops.max(1) as f64,
                ops - ops_remote,
                s.remote_p50_us,
                s.remote_p99_us
            );
        }
        if ranks > 1 && s.forward.is_some() {
            println!(
                "  delegates   forwarded {}   served remote {}   handed to daemons {}   ring-full retries {}   unroutable {}   failed {}   corrupt {}",
                f.forwarded,
                f.remote_served,
                f.handed_off,
                f.ring_full_retries,
                f.unroutable,
                f.failed_calls,
                f.corrupt_responses
            );
        }
        if let Some(sc) = &s.scale {
            let group = if sc.group_size == 0 {
                "off".to_string()
            } else {
                sc.group_size.to_string()
            };
            println!(
                "  scalerpc    {} connections, group size {group} ({} group(s) per daemon), slice {} us, slot {} B",
                sc.conns, sc.groups, sc.slice_us, sc.slot_size
            );
            println!(
                "  schedule    switches {}   warm-up delays {}   acks {}   evictions {}   conns failed or closed {}   probes {}",
                sc.switches, sc.warmup_delays, sc.acks, sc.evictions, sc.failed_conns, sc.probes
            );
            let ratio = |(h, m): (u64, u64)| m as f64 * 100.0 / (h + m).max(1) as f64;
            println!(
                "  qpc cache   daemon NICs: {} hits, {} misses ({:.2}%)   all NICs: {} hits, {} misses ({:.2}%)",
                sc.qpc_server.0,
                sc.qpc_server.1,
                ratio(sc.qpc_server),
                sc.qpc_all.0,
                sc.qpc_all.1,
                ratio(sc.qpc_all)
            );
        }
        if let Some(e) = &s.erpc {
            println!(
                "  erpc        {} sessions open at the end ({} closed)   requests {}   duplicates answered {}   packets dropped {}",
                e.sessions, e.sessions_closed, e.requests, e.dup_requests, e.dropped_pkts
            );
            println!(
                "  udp         daemons rx {} pkts in {} calls, tx {} pkts in {} calls",
                e.rx_pkts, e.rx_calls, e.tx_pkts, e.tx_calls
            );
        }
        println!(
            "  gets        {gets} ({hits} found)   errors {errors}   bad requests {bad_requests}"
        );
        println!(
            "  check       {}: {checked} written keys read back{}, {mismatches} mismatches{}",
            if pass { "PASSED" } else { "FAILED" },
            if ranks > 1 {
                format!(" ({checked_remote} written from another rank)")
            } else {
                String::new()
            },
            if check_msg.is_empty() {
                String::new()
            } else {
                format!(" ({check_msg})")
            }
        );
    }
}

/// `--mpi`: the setup of this process's rank of an MPI job, up to the per-rank code it shares
/// with the in-process ranks. Generic over the bootstrap; every call into it is made from
/// the main thread.
#[cfg(feature = "mpi")]
mod mpi_job {
    use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};

    use super::*;

    /// Runs this process's rank; the exit code, the same on every rank: 0 if every run passed
    /// its check, 1 if one did not, 2 on an error.
    pub(super) fn run<B: Bootstrap>(b: &B, a: &RunArgs) -> i32 {
        // The arguments are the same on every rank: rank 0 says what is wrong.
        if let Err(e) = args(a, b.size()) {
            return if b.rank() == 0 { fail(&e) } else { 2 };
        }
        let result = host(b).and_then(|host| match a.transport {
            Transport::Erpc => erpc(b, a, &host),
            _ => delegation(b, a, &host),
        });
        match result {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(e) => fail(&e),
        }
    }

    fn args(a: &RunArgs, ranks: usize) -> Result<(), String> {
        if a.ranks != 1 {
            return Err(
                "--ranks does not apply with --mpi: the ranks are the MPI processes (mpirun -np N)"
                    .into(),
            );
        }
        match a.transport {
            Transport::Scalerpc => {
                Err("--transport scalerpc runs one rank in one process, not under --mpi".into())
            }
            Transport::Erpc => erpc_args(a, ranks),
            Transport::Delegation => delegation_args(a, ranks).map(drop),
        }
    }

    /// What the ranks of this host agree on.
    struct Host {
        /// Hosts the job runs on.
        hosts: usize,
        /// The pid of this host's first rank: names the rings and the device model.
        pid: u32,
    }

    /// Every rank's host name and pid, all-gathered ([`wire::encode_host`]; the records of
    /// other ranks are checked by [`wire::decode_hosts`], issue 14).
    fn host<B: Bootstrap>(b: &B) -> Result<Host, String> {
        let mine = wire::encode_host(&b.hostname(), std::process::id());
        let all = b.all_gather(&mine).map_err(|e| on_rank(b, boot(e)))?;
        let (hosts, pid) =
            wire::decode_hosts(&all, b.size(), b.rank()).map_err(|e| on_rank(b, boot(e)))?;
        Ok(Host { hosts, pid })
    }

    /// The delegation transport: copyrpc between the ranks, on the device model shared by
    /// the processes of this host, or on `--device`.
    fn delegation<B: Bootstrap>(b: &B, a: &RunArgs, host: &Host) -> Result<bool, String> {
        let cfg = delegation_args(a, b.size())?;
        let hw = agree(b, "opening the RDMA device", hw_nic(a))?;
        let nic = match hw {
            _ if b.size() == 1 => None,
            Some(hw) => Some(hw),
            None if host.hosts > 1 => {
                return Err(format!(
                    "the ranks run on {} hosts, and the device model connects the processes \
                     of one host: give --device (RDMA NICs), or use --transport erpc",
                    host.hosts
                ));
            }
            None => {
                // Before any DMA buffer or copyrpc context exists: from here on, this
                // process's DMA buffers live in the host's shared memory.
                let fabric = Fabric::join(&format!("kv-{}", host.pid), sim_config())
                    .map_err(|e| format!("joining the device model of this host: {e}"));
                Some(Nic::Sim(agree(b, "joining the device model", fabric)?))
            }
        };
        let job = Job {
            base: format!("kv-{}", host.pid),
            nic,
            mpi: true,
        };
        run_ranks(b, &job, a, cfg)
    }

    /// eRPC over UDP between the ranks.
    fn erpc<B: Bootstrap>(b: &B, a: &RunArgs, host: &Host) -> Result<bool, String> {
        let ip = match a.erpc_ip {
            Some(ip) => ip,
            None if host.hosts == 1 => Ipv4Addr::LOCALHOST.into(),
            None => agree(b, "finding this host's address", host_ip(&b.hostname()))?,
        };
        let mut s = erpc_rank(b, a, ip)?;
        s.mpi = true;
        if b.rank() == 0 {
            print_summary(&s, &a.out, true);
        }
        Ok(s.pass)
    }

    /// The first address other than loopback that `name` resolves to.
    fn host_ip(name: &str) -> Result<IpAddr, String> {
        (name, 0)
            .to_socket_addrs()
            .map_err(|e| format!("resolving {name}: {e} (give --erpc-ip)"))?
            .map(|a| a.ip())
            .find(|ip| !ip.is_loopback())
            .ok_or_else(|| format!("{name} resolves to loopback addresses only: give --erpc-ip"))
    }
}

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
//! `--ranks R` runs `R` ranks in this process, each with its own simulated NIC on one shared
//! device-model fabric. Daemon 0 of each rank is the node's delegate
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
//! `--transport erpc` (one rank) does the same over eRPC on UDP loopback (seeds/000, 002):
//! each daemon serves its shard through an `ErpcServer` on its own UDP socket, and each client
//! thread connects a `KvClient<Erpc>` (`--qd` calls in flight, over `ceil(qd / 8)` sessions) to
//! every daemon. eRPC too may execute a client's outstanding calls in either order.
//!
//! Correctness: every client has a global id `g = rank * C + c` and only writes keys `k` with
//! `k % (R * C) == g` (on any rank), so every (rank, key) has one writer, whose successive
//! calls reach the owner daemon in issue order (one client's `fetch_add`s on a ring are
//! ordered; the delegate forwards a client's calls in ring order, and copyrpc and the
//! hand-off ring keep that order). Values encode `(writer << 48) | seq`, so every read is
//! checked for a plausible writer during the run, and at the end a sample of written keys,
//! local and remote, is read back from the owner daemon of the owner rank and must return the
//! last value written.
//!
//! ```text
//! cargo run --release --example kv                      # all in one process, ~10 s
//! cargo run --release --example kv -- --ranks 2 --backend both --duration 5
//! cargo run --release --example kv -- --transport scalerpc --clients 4 --scalerpc-group 2
//! cargo run --release --example kv -- --transport erpc --clients 2 --daemons 2
//! cargo run --release --example kv -- --help
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
use idl::kv::{KvClient, KvRequest, KvResponse, KvServer, KvService, owner_daemon};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Zipf};
use rpc::copyrpc::{CallError, Context, ContextConfig, EndpointConfig, EndpointId};
use rpc::delegation::{
    DelegToken, Delegate, Delegation, DelegationConfig, DelegationServer, ForwardStats, Target,
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
        device model. The `serve`/`client` subcommands split one rank's daemons and clients \
        into two processes; multi-rank runs across processes (MPI) are a later issue. \
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
    /// Only the daemons of one rank: create `<shm>-0 .. <shm>-{D-1}` and serve until
    /// SIGINT/SIGTERM or `--duration` (one rank; multi-rank across processes is a later issue).
    Serve(ServeArgs),
    /// Only the clients of one rank, attached to the rings of a `kv serve` process.
    Client(ClientArgs),
}

#[derive(Args, Debug, Clone)]
struct RunArgs {
    /// Daemon (shard server) threads per rank.
    #[arg(long, short = 'd', default_value_t = 1)]
    daemons: usize,
    /// In-process ranks, each with its own simulated NIC on one device-model fabric; requests
    /// target a rank chosen uniformly. 1: a single node, no copyrpc.
    #[arg(long, default_value_t = 1)]
    ranks: usize,
    /// How clients reach other ranks: through their rank's daemon 0 (delegation), with their
    /// own copyrpc endpoints (direct), or each in turn (both).
    #[arg(long, value_enum, default_value_t = Backend::Delegation)]
    backend: Backend,
    /// copyrpc send and receive ring size per endpoint, bytes (power of two, >= 1024).
    #[arg(long, default_value_t = 1 << 20)]
    copyrpc_ring: usize,
    /// How clients reach the daemons of their rank: the shared-memory delegation ring,
    /// ScaleRPC on the device model (one simulated NIC per daemon and per client thread), or
    /// eRPC over UDP loopback (one socket per daemon and per client connection). ScaleRPC and
    /// eRPC run one rank only.
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
        forward: None,
        scale: None,
        erpc: None,
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
        requests: f.ring_local + f.forwarded + f.remote_served + f.handed_off,
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
        Transport::Scalerpc => return run_scalerpc(&a),
        Transport::Erpc => return run_erpc(&a),
        Transport::Delegation => {}
    }
    let cfg = match delegation_config(&a.ring, a.load.qd) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    if a.daemons == 0 {
        return fail("--daemons must be at least 1");
    }
    if a.ranks == 0 || a.ranks > 64 {
        return fail("--ranks must be in 1..=64");
    }
    if a.ranks > 1 {
        if !a.copyrpc_ring.is_power_of_two() || a.copyrpc_ring < 1024 {
            return fail("--copyrpc-ring must be a power of two >= 1024");
        }
        // Each ring: the rank's clients, the checker and (daemons 1..) the delegate.
        if a.load.clients + 2 > a.ring.max_clients as usize {
            return fail("--max-clients must be at least --clients + 2 with --ranks > 1");
        }
    }
    let topologies: &[Topology] = match a.backend {
        Backend::Delegation => &[Topology::Delegation],
        Backend::Direct => &[Topology::Direct],
        Backend::Both => &[Topology::Delegation, Topology::Direct],
    };
    let mut summaries = Vec::new();
    for (i, &topo) in topologies.iter().enumerate() {
        let (result, reports) = match run_topology(&a, cfg, topo) {
            Ok(r) => r,
            Err(e) => return fail(&e),
        };
        let s = summarize(result, &reports, &a.load, a.daemons, a.ranks, topo.name());
        print_summary(&s, &a.out, i == 0);
        summaries.push(s);
    }
    if let [d, x] = &summaries[..] {
        if !a.out.json && !a.out.csv && d.mops > 0.0 {
            println!(
                "direct vs delegation: throughput x{:.2}, p50 x{:.2}, p99 x{:.2}",
                x.mops / d.mops,
                x.p50_us / d.p50_us.max(1e-9),
                x.p99_us / d.p99_us.max(1e-9)
            );
        }
    }
    if summaries.iter().all(|s| s.pass) {
        0
    } else {
        1
    }
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
}

/// Builds the ranks of one run (rings, devices, copyrpc contexts and connections), starts the
/// daemons, runs the clients and the check, stops the daemons.
fn run_topology(
    a: &RunArgs,
    cfg: DelegationConfig,
    topo: Topology,
) -> Result<(RunResult, Vec<DaemonReport>), String> {
    let (ranks, daemons, clients) = (a.ranks, a.daemons, a.load.clients);
    let pid = std::process::id();
    let bases: Vec<String> = if ranks == 1 {
        vec![format!("kv-{pid}")]
    } else {
        (0..ranks)
            .map(|r| format!("kv-{pid}-{}-r{r}", topo.name()))
            .collect()
    };
    let names: Vec<Vec<String>> = bases
        .iter()
        .map(|b| (0..daemons).map(|d| ring_name(b, d)).collect())
        .collect();
    let mut servers = Vec::with_capacity(ranks);
    for b in &bases {
        servers
            .push(create_rings(b, daemons, cfg).map_err(|e| format!("creating the rings: {e}"))?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let mut remotes: Vec<Vec<Remote>> = Vec::with_capacity(ranks);
    // Kept alive until the run ends (the devices reference it anyway).
    let _fabric;
    if ranks == 1 {
        handles.extend(start_daemons(servers.pop().expect("one rank"), 0, &stop));
        remotes.push((0..clients).map(|_| Remote::None).collect());
    } else {
        let fabric = Fabric::new(SimConfig {
            // Steps the model now and then, so that a sender stalled on a full receive queue
            // resumes even when nobody rings a doorbell.
            progress_thread: Some(Duration::from_millis(1)),
            ..SimConfig::default()
        });
        let devs: Vec<_> = (0..ranks).map(|_| fabric.open()).collect();
        let ecfg = EndpointConfig {
            ring_size: a.copyrpc_ring,
            fingerprint: KvService::DESCRIPTOR.fingerprint,
            ..EndpointConfig::default()
        };
        let setup = |e: rpc::copyrpc::SetupError| format!("copyrpc setup: {e}");
        let mut ctxs = devs
            .iter()
            .map(|d| Context::<DelegToken>::new(d, ContextConfig::default()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(setup)?;
        let mut peers = vec![vec![None; ranks]; ranks];
        for r in 0..ranks {
            let mut mine = Vec::with_capacity(clients);
            for _ in 0..clients {
                mine.push(match topo {
                    Topology::Delegation => Remote::Delegation,
                    Topology::Direct => {
                        let mut ctx = Box::new(
                            Context::<u32>::new(&devs[r], ContextConfig::default())
                                .map_err(setup)?,
                        );
                        let mut eps = vec![None; ranks];
                        for (s, ep) in eps.iter_mut().enumerate() {
                            if s == r {
                                continue;
                            }
                            let (ec, ed) = (
                                ctx.create_endpoint(&ecfg).map_err(setup)?,
                                ctxs[s].create_endpoint(&ecfg).map_err(setup)?,
                            );
                            let ic = ctx.local_info(ec).expect("endpoint");
                            let id = ctxs[s].local_info(ed).expect("endpoint");
                            ctx.connect(ec, &id).map_err(setup)?;
                            ctxs[s].connect(ed, &ic).map_err(setup)?;
                            *ep = Some(ec);
                        }
                        Remote::Direct { ctx, eps }
                    }
                });
            }
            remotes.push(mine);
            if topo == Topology::Delegation {
                for s in r + 1..ranks {
                    let (ers, esr) = (
                        ctxs[r].create_endpoint(&ecfg).map_err(setup)?,
                        ctxs[s].create_endpoint(&ecfg).map_err(setup)?,
                    );
                    let irs = ctxs[r].local_info(ers).expect("endpoint");
                    let isr = ctxs[s].local_info(esr).expect("endpoint");
                    ctxs[r].connect(ers, &isr).map_err(setup)?;
                    ctxs[s].connect(esr, &irs).map_err(setup)?;
                    peers[r][s] = Some(ers);
                    peers[s][r] = Some(esr);
                }
            }
        }
        for (r, ((rings, ctx), peers)) in servers.into_iter().zip(ctxs).zip(peers).enumerate() {
            let mut rings = rings.into_iter();
            let ring0 = rings.next().expect("daemon 0");
            let mut dlg = Delegate::<KvService, _>::new(
                ring0,
                ctx,
                r as u32,
                ranks as u32,
                daemons as u32,
                kv_route(daemons),
            )
            .map_err(|e| format!("rank {r}: delegate: {e}"))?;
            for (s, ep) in peers.into_iter().enumerate() {
                if let Some(ep) = ep {
                    dlg.set_peer(s as u32, ep)
                        .map_err(|e| format!("rank {r}: {e}"))?;
                }
            }
            for (d, name) in names[r].iter().enumerate().skip(1) {
                dlg.attach_daemon(d as u32, name)
                    .map_err(|e| format!("rank {r}: daemon {d}: {e}"))?;
            }
            let stop2 = stop.clone();
            handles.push(
                thread::Builder::new()
                    .name(format!("daemon-{r}.0"))
                    .spawn(move || delegate_loop(dlg, &stop2))
                    .expect("spawn delegate"),
            );
            for (d, server) in rings.enumerate() {
                handles.push(spawn_daemon(r, d + 1, Server::new(server), &stop));
            }
        }
        _fabric = fabric;
    }
    let result = run_clients(Arc::new(Rings(names)), remotes, &a.load, &a.out);
    stop.store(true, Ordering::Relaxed);
    let reports = handles
        .into_iter()
        .map(|h| h.join().expect("daemon panicked"))
        .collect();
    Ok((result, reports))
}

/// How client threads and the checker reach the daemons of each rank.
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
}

/// The delegation rings of each rank, by name.
struct Rings(Vec<Vec<String>>);

impl Daemons for Rings {
    type T = Delegation;
    const ORDERED: bool = true;
    fn connect(&self, rank: usize) -> Result<Vec<KvClient>, RpcError> {
        self.0[rank]
            .iter()
            .map(|n| KvClient::<Delegation>::connect(n))
            .collect()
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
    if a.daemons == 0 {
        return fail("--daemons must be at least 1");
    }
    if a.load.qd == 0 || a.load.qd >= u16::MAX as usize - 1 {
        return fail("--qd must be in 1..65534 with --transport scalerpc");
    }
    let sc = &a.scale;
    if sc.scalerpc_slice_us == 0 {
        return fail("--scalerpc-slice-us must be at least 1");
    }
    let slice = Duration::from_micros(sc.scalerpc_slice_us);
    let cfg = ScaleServerConfig {
        // The rank's clients and the checker, one connection each.
        max_conns: a.load.clients as u32 + 1,
        group_size: (sc.scalerpc_group > 0).then_some(sc.scalerpc_group),
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
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = servers
        .into_iter()
        .enumerate()
        .map(|(d, mut server)| {
            let stop = stop.clone();
            thread::Builder::new()
                .name(format!("daemon-0.{d}"))
                .spawn(move || {
                    let mut r = daemon_loop(&mut server, &stop);
                    let t = server.transport();
                    let s = t.scale_server();
                    r.scale = Some(ScaleDaemon {
                        conns: s.num_conns(),
                        groups: s.scheduler().num_groups(),
                        sched: *s.scheduler().stats(),
                        server: *s.stats(),
                        probes: t.probes_answered(),
                    });
                    r
                })
                .expect("spawn daemon")
        })
        .collect();
    let remotes = vec![(0..a.load.clients).map(|_| Remote::None).collect()];
    let daemons = Arc::new(ScaleDaemons {
        fabric: fabric.clone(),
        addrs,
    });
    let result = run_clients(daemons, remotes, &a.load, &a.out);
    stop.store(true, Ordering::Relaxed);
    let reports: Vec<DaemonReport> = handles
        .into_iter()
        .map(|h| h.join().expect("daemon panicked"))
        .collect();
    let mut f = ScaleFigures {
        group_size: cfg.group_size.unwrap_or(0),
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
    let mut s = summarize(result, &reports, &a.load, a.daemons, 1, "scalerpc");
    s.transport = "scalerpc";
    s.scale = Some(f);
    print_summary(&s, &a.out, true);
    if s.pass { 0 } else { 1 }
}

/// The eRPC daemons of the (single) rank: each client connection opens a UDP socket of its
/// own and connects to a daemon's address.
struct ErpcDaemons {
    addrs: Vec<SocketAddr>,
    /// Calls in flight per connection: the client's queue depth (all may go to one daemon).
    qd: usize,
}

impl Daemons for ErpcDaemons {
    type T = Erpc;
    const ORDERED: bool = false;
    fn connect(&self, _rank: usize) -> Result<Vec<KvClient<Erpc>>, RpcError> {
        let cfg = ErpcConfig {
            max_in_flight: self.qd,
            ..ErpcConfig::default()
        };
        self.addrs
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
    sessions: usize,
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

/// `--transport erpc`: one rank whose daemons are eRPC servers on UDP loopback; then the
/// summary.
fn run_erpc(a: &RunArgs) -> i32 {
    if a.ranks != 1 {
        return fail(
            "--transport erpc runs one rank (--ranks 1): ranks over eRPC are not supported",
        );
    }
    if a.backend != Backend::Delegation {
        return fail("--backend applies to --ranks > 1; --transport erpc runs one rank");
    }
    if a.daemons == 0 {
        return fail("--daemons must be at least 1");
    }
    if a.load.qd == 0 || a.load.qd > ERPC_MAX_IN_FLIGHT {
        return fail(&format!(
            "--qd must be in 1..={ERPC_MAX_IN_FLIGHT} with --transport erpc"
        ));
    }
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut servers = Vec::with_capacity(a.daemons);
    let mut addrs = Vec::with_capacity(a.daemons);
    for d in 0..a.daemons {
        match ErpcServer::serve::<KvService>(loopback) {
            Ok(s) => {
                addrs.push(s.transport().local_addr());
                servers.push(s);
            }
            Err(e) => return fail(&format!("daemon {d}: erpc server: {e}")),
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = servers
        .into_iter()
        .enumerate()
        .map(|(d, mut server)| {
            let stop = stop.clone();
            thread::Builder::new()
                .name(format!("daemon-0.{d}"))
                .spawn(move || {
                    let mut r = daemon_loop(&mut server, &stop);
                    let t = server.transport();
                    let ep = t.endpoint();
                    let core = ep.core_stats();
                    let udp = rpc::erpc::transport::DatagramTransport::stats(ep.transport());
                    r.erpc = Some(ErpcFigures {
                        sessions: ep.rpc().num_sessions(),
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
        })
        .collect();
    let remotes = vec![(0..a.load.clients).map(|_| Remote::None).collect()];
    let daemons = Arc::new(ErpcDaemons {
        addrs,
        qd: a.load.qd,
    });
    let result = run_clients(daemons, remotes, &a.load, &a.out);
    stop.store(true, Ordering::Relaxed);
    let reports: Vec<DaemonReport> = handles
        .into_iter()
        .map(|h| h.join().expect("daemon panicked"))
        .collect();
    let mut f = ErpcFigures::default();
    for d in reports.iter().filter_map(|r| r.erpc) {
        f.sessions += d.sessions;
        f.sessions_closed += d.sessions_closed;
        f.requests += d.requests;
        f.dup_requests += d.dup_requests;
        f.dropped_pkts += d.dropped_pkts;
        f.rx_pkts += d.rx_pkts;
        f.tx_pkts += d.tx_pkts;
        f.rx_calls += d.rx_calls;
        f.tx_calls += d.tx_calls;
    }
    let mut s = summarize(result, &reports, &a.load, a.daemons, 1, "erpc");
    s.transport = "erpc";
    s.erpc = Some(f);
    print_summary(&s, &a.out, true);
    if s.pass { 0 } else { 1 }
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
        Ok(s) => start_daemons(s, 0, &stop),
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
    let remotes = vec![(0..a.load.clients).map(|_| Remote::None).collect()];
    let result = run_clients(Arc::new(Rings(vec![names])), remotes, &a.load, &a.out);
    let s = summarize(result, &[], &a.load, daemons, 1, "delegation");
    print_summary(&s, &a.out, true);
    if s.pass { 0 } else { 1 }
}

fn fail(msg: &str) -> i32 {
    eprintln!("kv: {msg}");
    2
}

/// What one client thread measured.
struct ClientReport {
    rank: usize,
    ops: u64,
    /// Operations on another rank than the client's.
    ops_remote: u64,
    gets: u64,
    hits: u64,
    errors: u64,
    hist: Histogram<u64>,
    /// Latencies of the remote operations only.
    hist_remote: Histogram<u64>,
    /// Last value written to each sampled (rank, key) (keys `k % SAMPLE_EVERY == 0`).
    written: FxHashMap<(u32, u64), u64>,
}

const SAMPLE_EVERY: u64 = 8;

struct RunResult {
    elapsed: Duration,
    clients: Vec<ClientReport>,
    check: Result<CheckReport, String>,
}

struct CheckReport {
    checked: usize,
    /// Of `checked`, keys on another rank than their writer's.
    checked_remote: usize,
    mismatches: usize,
    /// The run wrote no sampled key, so the checker wrote (and read back) its own.
    self_written: bool,
}

/// The operations of client `gid` (global id: `rank * clients + c`) over `ranks` ranks.
/// With one rank the pattern is exactly the single-node one (no rank is drawn).
fn gen_pattern(load: &LoadArgs, gid: usize, ranks: usize) -> Vec<Op> {
    let mut rng =
        SmallRng::seed_from_u64(load.seed ^ (gid as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let zipf = Zipf::new(load.keys as f64, load.theta).expect("zipf parameters");
    let writers = (load.clients * ranks) as u64;
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
                key = key - key % writers + gid as u64;
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

/// Runs `remotes[r].len()` client threads on each rank `r` (reaching its daemons through
/// `daemons`), then the correctness check.
fn run_clients<D: Daemons>(
    daemons: Arc<D>,
    remotes: Vec<Vec<Remote>>,
    load: &LoadArgs,
    out: &OutArgs,
) -> RunResult {
    let ranks = remotes.len();
    if load.clients == 0 || load.qd == 0 || load.keys < (load.clients * ranks) as u64 {
        eprintln!("kv: need --clients >= 1, --qd >= 1 and --keys >= --clients * --ranks");
        std::process::exit(2);
    }
    let total = load.clients * ranks;
    let stop = Arc::new(AtomicBool::new(false));
    let counters: Arc<Vec<CachePadded<AtomicU64>>> = Arc::new(
        (0..total)
            .map(|_| CachePadded::new(AtomicU64::new(0)))
            .collect(),
    );
    let start = Arc::new(std::sync::Barrier::new(total + 1));
    let mut handles = Vec::new();
    for (rank, rank_remotes) in remotes.into_iter().enumerate() {
        for (c, remote) in rank_remotes.into_iter().enumerate() {
            let gid = rank * load.clients + c;
            let (daemons, load, stop, counters, start) = (
                daemons.clone(),
                load.clone(),
                stop.clone(),
                counters.clone(),
                start.clone(),
            );
            handles.push(
                thread::Builder::new()
                    .name(format!("client-{rank}.{c}"))
                    .spawn(move || {
                        let pattern = gen_pattern(&load, gid, ranks);
                        let rings = daemons.connect(rank).map_err(|e| e.to_string());
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
                        let me = Me { gid, rank, writers: (load.clients * ranks) as u64 };
                        client_loop::<D>(me, rings, remote, &pattern, &load, &stop, &counters[gid])
                    })
                    .expect("spawn client"),
            );
        }
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
        None => check_written(&*daemons, ranks, &clients, load),
    };
    RunResult {
        elapsed,
        clients,
        check,
    }
}

/// Who a client thread is.
#[derive(Clone, Copy)]
struct Me {
    /// Global client id (`rank * clients + c`): the writer id in values.
    gid: usize,
    rank: usize,
    /// Number of writers (all clients of all ranks).
    writers: u64,
}

/// A completed call: its tag and response (`None`: the call failed).
type Done = (u64, Option<KvResponse>);

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
/// `done`) and retry. Returns `false` if the daemon's transport cannot take the call now
/// (ScaleRPC: the connection's group is not scheduled): poll and issue it again.
#[inline]
fn issue<T: ClientTransport>(
    me: Me,
    (tag, op, value): (u64, Op, u64),
    rings: &mut [KvClient<T>],
    remote: &mut Remote,
    inflight: &[(Instant, Op)],
    done: &mut Vec<Done>,
) -> Result<bool, String> {
    let ring = match remote {
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
                    Ok(_) => return Ok(true),
                    Err(e) if e.is_retryable() => {
                        ctx.poll(|t, r| done.push(direct_done(inflight, t, r)));
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
        Ok(()) => Ok(true),
        Err(RpcError::WouldBlock) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
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
        .and_then(|b| KvService::decode_response(method_of(&op), b).ok());
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
    mut rings: Vec<KvClient<D::T>>,
    mut remote: Remote,
    pattern: &[Op],
    load: &LoadArgs,
    stop: &AtomicBool,
    counter: &AtomicU64,
) -> Result<ClientReport, String> {
    let qd = load.qd;
    let new_hist = || Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let (mut hist, mut hist_remote) = (new_hist(), new_hist());
    let mut written = FxHashMap::default();
    // Per tag (0..qd): when it was issued and what it was.
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
    let (mut next, mut seq, mut ops, mut ops_remote, mut gets, mut hits, mut errors) =
        (0usize, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
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
                            value = ((me.gid as u64) << SEQ_BITS) | (seq & ((1 << SEQ_BITS) - 1));
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
                    &mut rings,
                    &mut remote,
                    &inflight,
                    &mut done,
                )?;
                if !sent {
                    if !D::ORDERED && !op.read {
                        writes_out.remove(&(op.rank, op.key));
                    }
                    waiting = Some((op, value));
                    break;
                }
                free.pop();
                if !op.read && op.key % SAMPLE_EVERY == 0 {
                    written.insert((op.rank, op.key), value);
                }
                outstanding += 1;
            }
        } else if outstanding == 0 {
            break;
        }
        for ring in rings.iter_mut() {
            ring.poll_with(|tag, r| done.push((tag, r.ok())))
                .map_err(|e| e.to_string())?;
        }
        if let Remote::Direct { ctx, .. } = &mut remote {
            ctx.poll(|t, r| done.push(direct_done(&inflight, t, r)));
        }
        if done.is_empty() {
            D::keepalive(&mut rings);
            backoff.snooze();
            continue;
        }
        backoff.reset();
        for (tag, r) in done.drain(..) {
            let (t, op) = inflight[tag as usize];
            if !D::ORDERED && !op.read {
                writes_out.remove(&(op.rank, op.key));
            }
            let ns = (t.elapsed().as_nanos() as u64).max(1);
            let _ = hist.record(ns);
            if op.rank as usize != me.rank {
                ops_remote += 1;
                let _ = hist_remote.record(ns);
            }
            ops += 1;
            match r {
                Some(KvResponse::Get(v)) if op.read => {
                    gets += 1;
                    if let Some(v) = v {
                        hits += 1;
                        // Single writer per key: the value must come from the key's writer.
                        if v >> SEQ_BITS != op.key % me.writers {
                            errors += 1;
                        }
                    }
                }
                Some(KvResponse::Put(())) if !op.read => {}
                _ => errors += 1,
            }
            outstanding -= 1;
            free.push(tag);
        }
        counter.store(ops, Ordering::Relaxed);
    }
    counter.store(ops, Ordering::Relaxed);
    Ok(ClientReport {
        rank: me.rank,
        ops,
        ops_remote,
        gets,
        hits,
        errors,
        hist,
        hist_remote,
        written,
    })
}

/// Reads back a sample of written keys, local and remote, from the owner daemon of the owner
/// rank (blocking calls through fresh clients on its ring), and compares them with the last
/// value each key's single writer wrote. A run that wrote nothing (`--read-ratio 1`) has
/// nothing to compare, so the checker then writes its own sample keys (values with writer id
/// `clients * ranks`, which no run client uses) and reads them back.
fn check_written<D: Daemons>(
    daemons: &D,
    ranks: usize,
    clients: &[ClientReport],
    load: &LoadArgs,
) -> Result<CheckReport, String> {
    let samples = load.check_samples;
    let mut rings = (0..ranks)
        .map(|r| daemons.connect(r))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("check client: {e}"))?;
    let daemons = rings[0].len();
    // (rank, key) -> value, and whether the writer was on another rank.
    let mut all: Vec<((u32, u64), u64, bool)> = clients
        .iter()
        .flat_map(|c| {
            c.written
                .iter()
                .map(move |(&k, &v)| (k, v, k.0 as usize != c.rank))
        })
        .collect();
    let self_written = all.is_empty();
    if self_written {
        let writer = ((load.clients * ranks) as u64) << SEQ_BITS;
        for i in 0..samples.max(1) as u64 {
            let (key, value) = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20, writer | i);
            let rank = (i % ranks as u64) as u32;
            rings[rank as usize][owner_daemon(key, daemons)]
                .put(rank, key, value)
                .map_err(|e| format!("check put({rank}, {key}): {e}"))?;
            D::keepalive(&mut rings[rank as usize]);
            all.push(((rank, key), value, false));
        }
        // Later writes of a repeated key win.
        all.reverse();
        all.sort_by_key(|kv| kv.0);
        all.dedup_by_key(|kv| kv.0);
    }
    let step = (all.len() / samples.max(1)).max(1);
    let (mut checked, mut checked_remote, mut mismatches) = (0, 0, 0);
    for &((rank, key), want, remote) in all.iter().step_by(step).take(samples) {
        let got = rings[rank as usize][owner_daemon(key, daemons)]
            .get(rank, key)
            .map_err(|e| format!("check get({rank}, {key}): {e}"))?;
        D::keepalive(&mut rings[rank as usize]);
        checked += 1;
        checked_remote += remote as usize;
        if got != Some(want) {
            if mismatches < 5 {
                eprintln!(
                    "kv: check: rank {rank} key {key}: read {got:?}, last written Some({want})"
                );
            }
            mismatches += 1;
        }
    }
    Ok(CheckReport {
        checked,
        checked_remote,
        mismatches,
        self_written,
    })
}

/// The figures of one run.
struct Summary {
    /// How clients reach the daemons of their rank (`delegation`, `scalerpc`).
    transport: &'static str,
    /// ScaleRPC runs: scheduler and QPC figures.
    scale: Option<ScaleFigures>,
    /// eRPC runs: the daemons' endpoint counters.
    erpc: Option<ErpcFigures>,
    backend: &'static str,
    ranks: usize,
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
    ops_remote: u64,
    remote_p50_us: f64,
    remote_p99_us: f64,
    rank_ops: Vec<u64>,
    rank_mops: Vec<f64>,
    gets: u64,
    hits: u64,
    errors: u64,
    bad_requests: u64,
    forward: Option<ForwardStats>,
    checked: usize,
    checked_remote: usize,
    mismatches: usize,
    check_msg: String,
    pass: bool,
}

fn summarize(
    r: RunResult,
    daemons: &[DaemonReport],
    load: &LoadArgs,
    ndaemons: usize,
    ranks: usize,
    backend: &'static str,
) -> Summary {
    let new_hist = || Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let (mut hist, mut hist_remote) = (new_hist(), new_hist());
    let (mut ops, mut ops_remote, mut gets, mut hits, mut errors) = (0, 0, 0, 0, 0);
    let mut rank_ops = vec![0u64; ranks];
    for c in &r.clients {
        hist.add(&c.hist).expect("histogram merge");
        hist_remote.add(&c.hist_remote).expect("histogram merge");
        ops += c.ops;
        ops_remote += c.ops_remote;
        gets += c.gets;
        hits += c.hits;
        errors += c.errors;
        rank_ops[c.rank] += c.ops;
    }
    let secs = r.elapsed.as_secs_f64();
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e3;
    let mut forward: Option<ForwardStats> = None;
    for f in daemons.iter().filter_map(|d| d.forward) {
        let t = forward.get_or_insert_with(ForwardStats::default);
        t.ring_local += f.ring_local;
        t.forwarded += f.forwarded;
        t.responses += f.responses;
        t.remote_served += f.remote_served;
        t.handed_off += f.handed_off;
        t.handoff_replies += f.handoff_replies;
        t.bad_requests += f.bad_requests;
        t.unroutable += f.unroutable;
        t.failed_calls += f.failed_calls;
        t.corrupt_responses += f.corrupt_responses;
        t.dropped_replies += f.dropped_replies;
        t.ring_full_retries += f.ring_full_retries;
        t.daemon_busy_waits += f.daemon_busy_waits;
    }
    let bad_requests: u64 = daemons.iter().map(|d| d.bad_requests).sum();
    let forward_errors = forward.map_or(0, |f| {
        f.unroutable + f.failed_calls + f.corrupt_responses + f.dropped_replies
    });
    let (check_ok, checked, checked_remote, mismatches, check_msg) = match &r.check {
        Ok(c) => (
            c.mismatches == 0 && c.checked > 0,
            c.checked,
            c.checked_remote,
            c.mismatches,
            if c.self_written {
                "the run wrote nothing: keys written by the checker".to_string()
            } else {
                String::new()
            },
        ),
        Err(e) => (false, 0, 0, 0, e.clone()),
    };
    Summary {
        transport: "delegation",
        scale: None,
        erpc: None,
        backend,
        ranks,
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
        ops_remote,
        remote_p50_us: us(&hist_remote, 0.5),
        remote_p99_us: us(&hist_remote, 0.99),
        rank_mops: rank_ops.iter().map(|&o| o as f64 / secs / 1e6).collect(),
        rank_ops,
        gets,
        hits,
        errors,
        bad_requests,
        forward,
        checked,
        checked_remote,
        mismatches,
        check_msg,
        pass: check_ok && errors == 0 && bad_requests == 0 && forward_errors == 0,
    }
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
            "ranks": ranks, "backend": backend, "clients_total": clients * ranks,
            "ops_local": ops - ops_remote, "ops_remote": ops_remote,
            "remote_p50_us": s.remote_p50_us, "remote_p99_us": s.remote_p99_us,
            "rank_ops": s.rank_ops, "rank_mops": s.rank_mops,
            "check_samples_remote": checked_remote,
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
                "transport,daemons,clients,qd,read_ratio,keys,dist,seconds,ops,mops,p50_us,p99_us,p999_us,gets,get_hits,errors,check_samples,check_mismatches,check_passed,ranks,backend,ops_local,ops_remote,remote_p50_us,remote_p99_us,rank_mops,forwarded,remote_served,handed_off,unroutable,failed_calls,corrupt_responses,ring_full_retries"
            );
        }
        let rank_mops: Vec<String> = s.rank_mops.iter().map(|m| format!("{m:.4}")).collect();
        println!(
            "{},{daemons},{clients},{qd},{read_ratio},{keys},{dist},{secs:.3},{ops},{mops:.4},{:.2},{:.2},{:.2},{gets},{hits},{errors},{checked},{mismatches},{pass},{ranks},{backend},{},{ops_remote},{:.2},{:.2},{},{},{},{},{},{},{},{}",
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
        );
    } else {
        if ranks == 1 {
            println!(
                "kv over {}: {daemons} daemon(s), {clients} client(s), QD {qd}, {:.0}% gets, {keys} keys {dist}, {secs:.1} s",
                s.transport,
                read_ratio * 100.0,
            );
        } else {
            println!(
                "kv, {ranks} ranks, backend {backend}: {daemons} daemon(s) and {clients} client(s) per rank, QD {qd}, {:.0}% gets, {keys} keys {dist} per rank, {secs:.1} s",
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
        }
        println!(
            "  latency     p50 {:.2} us   p99 {:.2} us   p999 {:.2} us",
            s.p50_us, s.p99_us, s.p999_us
        );
        if ranks > 1 {
            println!(
                "  remote      {ops_remote} ops ({:.0}%), {} local   p50 {:.2} us   p99 {:.2} us",
                ops_remote as f64 * 100.0 / ops.max(1) as f64,
                ops - ops_remote,
                s.remote_p50_us,
                s.remote_p99_us
            );
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

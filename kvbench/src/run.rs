//! Running a job: the command line's entry point ([`main`]), an in-process run of any
//! transport ([`run_all`]: one thread per rank, returning the summaries without printing
//! them), a rank of an MPI job (`--mpi`, behind the `mpi` feature), the `kv serve` daemons
//! and the `kv client` clients ([`client_only`]). The transport of a run is chosen in one
//! `match` for in-process runs ([`run_all`]) and one for MPI ranks.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use rpc::bootstrap::Bootstrap;
use rpc::bootstrap::threads::ThreadGroup;
use rpc::bootstrap::wire::{self, encode_socket_addr};
use rpc::delegation::{Delegate, DelegationConfig, RingError, RingManifest, read_manifest};
use rpc::erpc::ErpcServer;
use rpc::mlx5::sim::{Fabric, SimConfig};
use rpc::scalerpc::{ScaleRpcAddr, ScaleRpcServer, ServerConfig as ScaleServerConfig};
use rpc::{Server, Service};

use crate::api::{Api, Fixed, Var};
use crate::check::*;
use crate::client::*;
use crate::config::*;
use crate::daemon::*;
use crate::pinning::{Pinning, pin_current};
use crate::report::*;
use crate::wiring::*;

/// Why a run ended without its summaries (exit code 2): a bad argument, a setup step or a
/// collective that failed. A run whose check fails is not an error: its summary says so.
#[derive(Debug, Default)]
pub struct RunError {
    /// What failed, one message per failing rank (naming the rank when there are several).
    pub messages: Vec<String>,
    /// The summaries of the runs that ended before the failure (`--backend all`, `--preset`).
    pub completed: Vec<Summary>,
}

impl From<String> for RunError {
    fn from(msg: String) -> Self {
        RunError {
            messages: vec![msg],
            completed: Vec::new(),
        }
    }
}

impl From<&str> for RunError {
    fn from(msg: &str) -> Self {
        RunError::from(msg.to_string())
    }
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.messages.join("; "))
    }
}

impl std::error::Error for RunError {}

/// Runs the command line `cli` (printing the summaries on stdout and errors on stderr);
/// the process exit code: 0 if every run passed its check, 1 if one did not, 2 on an error.
pub fn main(cli: Cli) -> i32 {
    match cli.into_command() {
        Cmd::Run(a) if a.mpi => run_mpi(a),
        Cmd::Run(a) => {
            let r = run_all(&a);
            report(r, &a.out, true, a.preset)
        }
        Cmd::Serve(a) => serve(a),
        Cmd::Client(a) => {
            let r = client_only(&a).map(|s| vec![s]).map_err(RunError::from);
            report(r, &a.out, true, None)
        }
    }
}

/// The exit code of a run's outcome: 0 if every run passed its check, 1 if one did not, 2
/// on an error.
pub fn exit_code(r: &Result<Vec<Summary>, RunError>) -> i32 {
    match r {
        Ok(v) if v.iter().all(|s| s.pass) => 0,
        Ok(_) => 1,
        Err(_) => 2,
    }
}

/// Prints the outcome `r` (the summaries if `print`, then with `--preset seed004` in text
/// the seed's table beside ours; the errors, `kv: ` first, on stderr); its exit code
/// ([`exit_code`]).
fn report(
    r: Result<Vec<Summary>, RunError>,
    out: &OutArgs,
    print: bool,
    preset: Option<Preset>,
) -> i32 {
    let code = exit_code(&r);
    match r {
        Ok(v) if print => {
            print_summaries(&v, out);
            if preset == Some(Preset::Seed004) && Format::of(out) == Format::Text {
                print!("{}", seed004_table(&v));
            }
        }
        Ok(_) => {}
        Err(e) => {
            if print {
                print_summaries(&e.completed, out);
            }
            for m in &e.messages {
                eprintln!("kv: {m}");
            }
        }
    }
    code
}

/// Runs `a` in this process (every rank a thread; not `--mpi`), without printing the
/// summaries (progress lines, unless `--quiet`, go to stderr): one summary per backend run,
/// in order.
///
/// # Errors
/// A bad argument, or a setup step that failed (see [`RunError`]).
pub fn run_all(a: &RunArgs) -> Result<Vec<Summary>, RunError> {
    if a.preset == Some(Preset::Seed004) {
        // seeds/004 §10: Meta and Delegation, on one node and on two.
        let mut all = Vec::new();
        for ranks in [1, 2] {
            let r = match a.load.sizes()? {
                None => run_threads::<Fixed>(&a.seed004(ranks)),
                Some(_) => run_threads::<Var>(&a.seed004(ranks)),
            };
            match r {
                Ok(v) => all.extend(v),
                Err(mut e) => {
                    all.append(&mut e.completed);
                    e.completed = all;
                    return Err(e);
                }
            }
        }
        return Ok(all);
    }
    // The service: fixed-size `Kv`, or `KvVar` with --value-size/--key-size.
    match a.load.sizes()? {
        None => run_service::<Fixed>(a),
        Some(_) => run_service::<Var>(a),
    }
}

/// [`run_all`] over the service `A`.
fn run_service<A: Api>(a: &RunArgs) -> Result<Vec<Summary>, RunError> {
    // The one place a transport is chosen for an in-process run (`--mpi`: `mpi_job::run`).
    match a.transport {
        Transport::Scalerpc => run_scalerpc::<A>(a)
            .map(|s| vec![s])
            .map_err(RunError::from),
        Transport::Erpc => run_erpc::<A>(a).map(|s| vec![s]).map_err(RunError::from),
        Transport::Delegation => run_threads::<A>(a),
    }
}

/// `--ranks R` with the delegation transport: every rank is a thread of this process with
/// the in-process bootstrap ([`ThreadGroup`]), running the per-rank code of `--mpi`.
fn run_threads<A: Api>(a: &RunArgs) -> Result<Vec<Summary>, RunError> {
    if a.ranks == 0 || a.ranks > 64 {
        return Err("--ranks must be in 1..=64".into());
    }
    let cfg = delegation_args(a, a.ranks)?;
    let hw = hw_nic(a)?;
    let nic = (a.ranks > 1).then(|| hw.unwrap_or_else(|| Nic::Sim(Fabric::new(sim_config()))));
    let job = Arc::new(Job {
        base: run_base(),
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
                .spawn(move || run_ranks::<A, _>(&b, &job, &args, cfg))
                .expect("spawn rank")
        })
        .collect();
    // Every rank has the same summaries: rank 0's are the run's.
    let mut outcome = Ok(Vec::new());
    for (rank, h) in ranks.into_iter().enumerate() {
        match (h.join().expect("rank panicked"), &mut outcome) {
            (Ok(v), Ok(mine)) if rank == 0 => *mine = v,
            (Ok(_), _) => {}
            (Err(e), Ok(mine)) => {
                let completed = if rank == 0 {
                    e.completed
                } else {
                    std::mem::take(mine)
                };
                outcome = Err(RunError {
                    messages: e.messages,
                    completed,
                });
            }
            (Err(e), Err(all)) => all.messages.extend(e.messages),
        }
    }
    outcome
}

/// The prefix of an in-process run's rings in /dev/shm: `kv-<pid>` for the first run of this
/// process, `kv-<pid>.<n>` for the n-th after it (runs of one process, e.g. tests calling
/// [`run_all`] at once, never share ring names).
fn run_base() -> String {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    match RUNS.fetch_add(1, Ordering::Relaxed) {
        0 => format!("kv-{}", std::process::id()),
        n => format!("kv-{}.{n}", std::process::id()),
    }
}

/// `--mpi`: this process is one rank of an MPI job.
#[cfg(feature = "mpi")]
pub(crate) fn run_mpi(a: RunArgs) -> i32 {
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
pub(crate) fn run_mpi(_a: RunArgs) -> i32 {
    fail(
        "--mpi needs MPI support: rebuild with --features mpi \
         (cargo build --release --features mpi --example kv)",
    )
}

/// Every backend of `a.backend`, one after the other, as rank `b.rank()` of `b.size()`;
/// their summaries (the same on every rank).
///
/// # Errors
/// The failure of a run, with the summaries of the runs before it.
fn run_ranks<A: Api, B: Bootstrap>(
    b: &B,
    job: &Job,
    a: &RunArgs,
    cfg: DelegationConfig,
) -> Result<Vec<Summary>, RunError> {
    let mut completed = Vec::new();
    for &topo in topologies_of(a) {
        let r = match topo {
            Topology::Meta | Topology::Delegation => A::run_seed_rank(b, job, a, topo),
            Topology::Direct => run_rank::<A, B>(b, job, a, cfg),
        };
        match r {
            Ok(s) => completed.push(s),
            Err(e) => {
                return Err(RunError {
                    messages: vec![e],
                    completed,
                });
            }
        }
    }
    Ok(completed)
}

/// One rank of a `direct`-backend run (upstream's baseline): creates its rings, opens its NIC
/// and creates its copyrpc endpoints, exchanges their information with the other ranks
/// through `b`, connects, meets the others at a barrier, starts its daemons, runs its
/// clients and its part of the check, and combines the figures of all ranks (every rank
/// returns the same summary). Every rank thread of `--ranks R` and every process of `--mpi`
/// runs this. A setup step that fails on any rank fails on every rank ([`agree`]).
pub(crate) fn run_rank<A: Api, B: Bootstrap>(
    b: &B,
    job: &Job,
    a: &RunArgs,
    cfg: DelegationConfig,
) -> Result<Summary, String> {
    let topo = Topology::Direct;
    let (rank, ranks, daemons) = (b.rank(), b.size(), a.daemons);
    let pin = Pinning::plan(b, !a.load.no_pin, daemons, a.load.clients);
    let pin = agree(b, "planning the CPU pinning", pin)?;
    let core0 = pin.daemon(0);
    let base = format!("{}-{}-r{rank}", job.base, topo.name());
    let names: Vec<String> = (0..daemons).map(|d| ring_name(&base, d)).collect();
    let servers =
        create_rings::<A>(&base, daemons, cfg).map_err(|e| format!("creating the rings: {e}"));
    let servers = agree(b, "creating the rings", servers)?;
    let mut threads = DaemonThreads::default();
    let remotes = match (&job.nic, ranks) {
        (_, 1) => {
            threads.handles = start_daemons::<A>(servers, rank, &threads.stop, &pin);
            (0..a.load.clients).map(|_| Remote::None).collect()
        }
        (None, _) => return Err(on_rank(b, "no NIC for copyrpc between ranks".into())),
        (Some(nic), _) => {
            let clients = a.load.clients;
            let wiring = Wiring::<A>::new(nic, (rank, ranks), clients, a.copyrpc_ring);
            let mut wiring = agree(b, "copyrpc setup", wiring)?;
            let all = exchange_infos(b, &wiring.infos()).map_err(|e| on_rank(b, e))?;
            let mut rings = servers.into_iter();
            let ring0 = rings.next().expect("daemon 0");
            let delegate = wiring.connect(rank, &all).and_then(|()| {
                let lose = a.load.lose_direct_call;
                let (ctx, remotes) = wiring.into_parts(rank, a.load.qd, lose)?;
                let mut dlg = Delegate::<A::S, _>::new(
                    ring0,
                    ctx,
                    rank as u32,
                    ranks as u32,
                    daemons as u32,
                    A::route(daemons),
                )
                .map_err(|e| format!("delegate: {e}"))?;
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
                    .spawn(move || {
                        pin_current(core0);
                        delegate_loop::<A, _>(dlg, &stop)
                    })
                    .expect("spawn delegate"),
            );
            for (d, server) in rings.enumerate() {
                let h = spawn_daemon::<A>(rank, d + 1, Server::new(server), &threads.stop, &pin);
                threads.handles.push(h);
            }
            remotes
        }
    };
    let rings = Arc::new(Rings::<A>::new(rank, names, false));
    let (mut s, _) =
        clients_and_check::<B, A, _>(b, rings, remotes, threads, (&a.load, &a.out, &pin), daemons)?;
    s.backend = topo.name();
    s.mpi = job.mpi;
    (s.pinned, s.pin_note) = (pin.pinned(), pin.note());
    Ok(s)
}

/// The rest of a run on every rank: the clients, the check, a barrier (no rank stops its
/// daemons, or tears down its endpoints, while another still calls them), the daemons'
/// stop, and the figures of all ranks combined. The summary, and this rank's daemon reports.
pub(crate) fn clients_and_check<B: Bootstrap, A: Api, D: Daemons<A>>(
    b: &B,
    daemons: Arc<D>,
    remotes: Vec<Remote<A>>,
    threads: DaemonThreads,
    (load, out, pin): (&LoadArgs, &OutArgs, &Pinning),
    ndaemons: usize,
) -> Result<(Summary, Vec<DaemonReport>), String> {
    let mut run = run_clients(b, daemons.clone(), remotes, load, out, pin);
    let failure = run.failure.take();
    let check = check_written::<B, A, D>(b, &*daemons, &run.clients, failure, load);
    // The client threads' connections, if kept for the check, close before any daemon stops.
    daemons.release();
    let check = check.map_err(|e| on_rank(b, e))?;
    b.barrier().map_err(|e| on_rank(b, boot(e)))?;
    let reports = threads.finish();
    let s = combine(b, &run, &reports, check, load, ndaemons).map_err(|e| on_rank(b, e))?;
    Ok((s, reports))
}

/// `--transport scalerpc`: one rank whose daemons are ScaleRPC servers, each on its own NIC
/// of one device-model fabric; then the summary.
fn run_scalerpc<A: Api>(a: &RunArgs) -> Result<Summary, String> {
    if a.ranks != 1 {
        return Err(
            "--transport scalerpc runs one rank (--ranks 1): ranks over ScaleRPC are not supported"
                .into(),
        );
    }
    if a.backend != Backend::Delegation {
        return Err("--backend applies to --ranks > 1; --transport scalerpc runs one rank".into());
    }
    if a.device.is_some() {
        return Err("--device applies to copyrpc between ranks (the delegation transport)".into());
    }
    if a.daemons == 0 {
        return Err("--daemons must be at least 1".into());
    }
    if a.load.qd == 0 || a.load.qd >= u16::MAX as usize - 1 {
        return Err("--qd must be in 1..65534 with --transport scalerpc".into());
    }
    load_args(&a.load, 1)?;
    let sc = &a.scale;
    if sc.scalerpc_slice_us == 0 {
        return Err("--scalerpc-slice-us must be at least 1".into());
    }
    let slice = Duration::from_micros(sc.scalerpc_slice_us);
    // 128 B holds the fixed-size messages; `KvVar`'s slot is the one ScaleRPC derives from
    // its largest messages.
    let derived = rpc::scalerpc::transport::derive_slot_size(A::S::DESCRIPTOR);
    let slot_size = match (sc.scalerpc_slot, derived) {
        (Some(s), _) => s,
        (None, Some(d)) => d.max(128),
        (None, None) => {
            return Err(format!(
                "{}'s messages do not fit a ScaleRPC slot",
                A::S::DESCRIPTOR.name
            ));
        }
    };
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
        slot_size: Some(slot_size),
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
        match ScaleRpcServer::serve::<A::S>(&device, cfg) {
            Ok(s) => {
                let mut addr = ScaleRpcAddr::new(device.clone(), s.transport().listener());
                // A benchmark's clients wait for their group however long an oversubscribed
                // machine takes; a dead server is still detected by the probe.
                addr.activation_timeout = Some(Duration::from_secs(60));
                addrs.push(addr);
                lids.push(device.port().lid);
                servers.push(s);
            }
            Err(e) => return Err(format!("daemon {d}: scalerpc server: {e}")),
        }
    }
    let mut threads = DaemonThreads::default();
    threads.handles = servers
        .into_iter()
        .enumerate()
        .map(|(d, server)| spawn_scale_daemon::<A>(0, d, server, &threads.stop))
        .collect();
    let remotes = (0..a.load.clients).map(|_| Remote::None).collect();
    let daemons = Arc::new(ScaleDaemons {
        fabric: fabric.clone(),
        addrs,
    });
    let (mut s, reports) = clients_and_check::<_, A, _>(
        &solo(),
        daemons,
        remotes,
        threads,
        (&a.load, &a.out, &Pinning::off("ScaleRPC")),
        a.daemons,
    )?;
    let mut f = ScaleFigures {
        group_size: match cfg.group_size {
            rpc::scalerpc::GroupSize::Fixed(g) => g,
            _ => 0,
        },
        slice_us: sc.scalerpc_slice_us,
        slot_size,
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
            f.qpc_server_hits += q.hits;
            f.qpc_server_misses += q.misses;
        }
    }
    let all = fabric.stats();
    (f.qpc_hits, f.qpc_misses) = (all.qpc_hits, all.qpc_misses);
    s.transport = "scalerpc";
    s.backend = "scalerpc";
    s.scale = Some(f);
    Ok(s)
}

/// `--transport erpc` in one process: one rank whose daemons are eRPC servers on UDP
/// loopback; then the summary.
fn run_erpc<A: Api>(a: &RunArgs) -> Result<Summary, String> {
    if a.ranks != 1 {
        return Err(
            "--transport erpc runs one rank in a process (--ranks 1); eRPC across ranks runs \
             under MPI (--mpi)"
                .into(),
        );
    }
    erpc_args(a, 1)?;
    let ip = a.erpc_ip.unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
    erpc_rank::<A, _>(&solo(), a, ip)
}

/// One rank of an eRPC run (`--transport erpc`; every process of `--mpi --transport erpc`):
/// its daemons serve eRPC on UDP sockets bound to `ip`, the ranks all-gather the daemons'
/// addresses, and every client thread connects to every daemon of every rank and sends each
/// operation to the owner daemon of its target rank. Every rank returns the same summary.
pub(crate) fn erpc_rank<A: Api, B: Bootstrap>(
    b: &B,
    a: &RunArgs,
    ip: std::net::IpAddr,
) -> Result<Summary, String> {
    let (rank, daemons) = (b.rank(), a.daemons);
    let servers = (0..daemons)
        .map(|d| {
            ErpcServer::serve::<A::S>(SocketAddr::new(ip, 0))
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
        let h = spawn_erpc_daemon::<A>(rank, d, server, &threads.stop);
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
    let (mut s, _) = clients_and_check::<B, A, _>(
        b,
        erpc,
        remotes,
        threads,
        (&a.load, &a.out, &Pinning::off("eRPC")),
        daemons,
    )?;
    s.transport = "erpc";
    s.backend = "erpc";
    Ok(s)
}

pub(crate) fn serve(a: ServeArgs) -> i32 {
    if a.variable {
        serve_service::<Var>(a)
    } else {
        serve_service::<Fixed>(a)
    }
}

/// `kv serve` of the service `A`.
fn serve_service<A: Api>(a: ServeArgs) -> i32 {
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
    let daemons = match create_rings::<A>(&a.shm, a.daemons, cfg) {
        Ok(s) => match a.drop_reply {
            None => start_daemons::<A>(s, 0, &stop, &Pinning::off("kv serve")),
            Some(n) => s
                .into_iter()
                .enumerate()
                .map(|(d, server)| {
                    let (mut server, stop) = (Server::new(server), stop.clone());
                    let drop = if d == 0 { n } else { 0 };
                    thread::Builder::new()
                        .name(format!("daemon-0.{d}"))
                        .spawn(move || daemon_loop_dropping::<A>(&mut server, &stop, drop))
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

/// `kv client`: this process's client threads and the check against the rings a `kv serve`
/// process listed in its manifest; the summary (not printed).
///
/// # Errors
/// No manifest, a bad one, a bad argument, or a ring that cannot be attached.
pub fn client_only(a: &ClientArgs) -> Result<Summary, String> {
    match a.load.sizes()? {
        None => client_service::<Fixed>(a),
        Some(_) => client_service::<Var>(a),
    }
}

/// [`client_only`] over the service `A`.
fn client_service<A: Api>(a: &ClientArgs) -> Result<Summary, String> {
    // The rings `kv serve` listed in its manifest (this user's file, mode 0600, validated),
    // not whichever `<shm>-N` names happen to exist.
    let names = match read_manifest(&a.shm) {
        Ok(n) => n,
        Err(RingError::NotFound { path }) => {
            return Err(format!(
                "no ring manifest {} (start `kv serve --shm {}` first)",
                path.display(),
                a.shm
            ));
        }
        Err(e) => return Err(format!("reading the ring manifest: {e}")),
    };
    load_args(&a.load, 1)?;
    // Writer ids are ring 0's client ids: every key class `k % max_clients` needs keys.
    match rpc::delegation::RingClient::attach(&names[0]) {
        Ok(r) if a.load.keys < u64::from(r.info().max_clients) => {
            return Err(format!(
                "--keys {} is fewer than the rings' client ids (kv serve --max-clients {}): \
                 each client of any kv client process writes the keys k with \
                 k % max_clients == its client id on ring 0",
                a.load.keys,
                r.info().max_clients
            ));
        }
        Ok(r) if r.info().fingerprint != A::S::DESCRIPTOR.fingerprint => {
            let served = if r.info().fingerprint == Var::fingerprint() {
                "KvVar (kv serve --variable)"
            } else if r.info().fingerprint == Fixed::fingerprint() {
                "Kv (kv serve without --variable)"
            } else {
                "another service"
            };
            return Err(format!(
                "the rings of {} serve {served}, not {}: variable sizes (--value-size other \
                 than 8, --key-size) need `kv serve --variable`, fixed-size u64 values a \
                 `kv serve` without it",
                a.shm,
                A::S::DESCRIPTOR.name
            ));
        }
        Ok(_) => {}
        Err(e) => return Err(format!("attaching to {}: {e}", names[0])),
    }
    let daemons = names.len();
    let remotes = (0..a.load.clients).map(|_| Remote::None).collect();
    let rings = Arc::new(Rings::<A>::new(0, names, true));
    let threads = DaemonThreads::default();
    clients_and_check::<_, A, _>(
        &solo(),
        rings,
        remotes,
        threads,
        (&a.load, &a.out, &Pinning::off("kv client")),
        daemons,
    )
    .map(|(s, _)| s)
}

pub(crate) fn fail(msg: &str) -> i32 {
    eprintln!("kv: {msg}");
    2
}

/// `--mpi`: the setup of this process's rank of an MPI job, up to the per-rank code it shares
/// with the in-process ranks. Generic over the bootstrap; every call into it is made from
/// the main thread.
#[cfg(feature = "mpi")]
pub(crate) mod mpi_job {
    use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};

    use super::*;

    /// Runs this process's rank; the exit code, the same on every rank: 0 if every run passed
    /// its check, 1 if one did not, 2 on an error.
    pub(super) fn run<B: Bootstrap>(b: &B, a: &RunArgs) -> i32 {
        // `--preset seed004`: its configuration at this job's rank count.
        let preset = a.preset.map(|_| a.seed004(1));
        let a = preset.as_ref().unwrap_or(a);
        // The arguments are the same on every rank: rank 0 says what is wrong.
        if let Err(e) = args(a, b.size()) {
            return if b.rank() == 0 { fail(&e) } else { 2 };
        }
        // The one place a transport is chosen for a rank of an MPI job.
        let result =
            host(b)
                .map_err(RunError::from)
                .and_then(|host| match (a.transport, a.load.sizes()?) {
                    (Transport::Erpc, None) => erpc::<Fixed, B>(b, a, &host)
                        .map(|s| vec![s])
                        .map_err(RunError::from),
                    (Transport::Erpc, Some(_)) => erpc::<Var, B>(b, a, &host)
                        .map(|s| vec![s])
                        .map_err(RunError::from),
                    (_, None) => delegation::<Fixed, B>(b, a, &host),
                    (_, Some(_)) => delegation::<Var, B>(b, a, &host),
                });
        // Rank 0 prints the summaries (the same on every rank); every rank its errors.
        report(result, &a.out, b.rank() == 0, a.preset)
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
    fn delegation<A: Api, B: Bootstrap>(
        b: &B,
        a: &RunArgs,
        host: &Host,
    ) -> Result<Vec<Summary>, RunError> {
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
                )
                .into());
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
        run_ranks::<A, B>(b, &job, a, cfg)
    }

    /// eRPC over UDP between the ranks.
    fn erpc<A: Api, B: Bootstrap>(b: &B, a: &RunArgs, host: &Host) -> Result<Summary, String> {
        let ip = match a.erpc_ip {
            Some(ip) => ip,
            None if host.hosts == 1 => Ipv4Addr::LOCALHOST.into(),
            None => agree(b, "finding this host's address", host_ip(&b.hostname()))?,
        };
        let mut s = erpc_rank::<A, B>(b, a, ip)?;
        s.mpi = true;
        Ok(s)
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

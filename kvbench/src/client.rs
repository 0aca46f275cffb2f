//! The client threads of a rank: how they reach the daemons (`Daemons`: the delegation
//! rings, ScaleRPC or eRPC), the run of a rank's client threads (start together, one
//! reduction per second, a failing thread stops the others), the closed loop with
//! `--qd` calls in flight and a deadline per call, and what each thread measured.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::{Backoff, CachePadded};
use hdrhistogram::Histogram;
use rpc::bootstrap::Bootstrap;
use rpc::delegation::Delegation;
use rpc::erpc::{Erpc, ErpcConfig};
use rpc::mlx5::sim::Fabric;
use rpc::scalerpc::{ScaleRpc, ScaleRpcAddr};
use rpc::{ClientTransport, RpcError, Service};

use crate::api::{Api, Ctx, Outcome, Read, plausible};
use rustc_hash::FxHashMap;

use crate::config::*;
use crate::pinning::{Pinning, pin_current};
use crate::report::*;
use crate::wiring::*;
use crate::workload::*;

/// How client threads and the checker reach the daemons of a rank.
pub(crate) trait Daemons<A: Api>: Send + Sync + 'static {
    /// The client transport.
    type T: ClientTransport + Send;
    /// Whether one client's calls on one connection execute in issue order. If not, a client
    /// never has two writes of one key outstanding (their order would be unknown).
    const ORDERED: bool;
    /// Connects one client (a client thread, or the checker) to every daemon of `rank`, in
    /// daemon order.
    fn connect(&self, rank: usize) -> Result<Vec<A::Conn<Self::T>>, RpcError>;
    /// Lets connections without calls in flight make progress (called when a client is
    /// idle).
    #[inline]
    fn keepalive(_rings: &mut [A::Conn<Self::T>]) {}
    /// A client whose only connections are `rings` has polled them without a response for
    /// `waited`, past its backoff: the transport may block until a response may have arrived
    /// (at most 1 ms; [`rpc::ClientTransport::wait_for_response`]). Returns whether it did;
    /// `false` (the default): the client yields.
    #[inline]
    fn idle_wait(_rings: &mut [A::Conn<Self::T>], _waited: Duration) -> bool {
        false
    }
    /// The writer id of the client connected through `conns` (from [`Daemons::connect`]) and
    /// the number of writer ids `W`: the client writes only keys `k` with `k % W == id`.
    /// `None` (the default): the daemons serve this job alone, and a client's writer id is
    /// its global id among the job's `clients * ranks` client threads.
    fn writer(&self, _conns: &mut [A::Conn<Self::T>]) -> Option<(u64, u64)> {
        None
    }
    /// A client thread's connections once its closed loop has ended; by default they close
    /// here. [`Daemons::release`] closes the ones an implementation keeps.
    fn finished(&self, conns: Vec<A::Conn<Self::T>>) {
        drop(conns);
    }
    /// Closes the connections [`Daemons::finished`] kept (after the check).
    fn release(&self) {}
}

/// The delegation rings of this rank's daemons, by name (they reach this rank only).
pub(crate) struct Rings<A: Api> {
    pub(crate) rank: usize,
    pub(crate) names: Vec<String>,
    /// `kv client`: the daemons are another process's, which other `kv client` processes may
    /// use before, after or alongside this one. Writer ids are then the client ids ring 0
    /// hands out at attach (unique among the clients attached to it, whatever their
    /// process), over `max_clients` writer ids; and a client thread's connections stay
    /// attached until the check is done, so that no other process takes its id (and writes
    /// its keys) before this one has read them back.
    pub(crate) shared: bool,
    /// Connections of finished client threads (`shared`), closed by [`Daemons::release`].
    pub(crate) held: std::sync::Mutex<Vec<Vec<A::Conn<Delegation>>>>,
}

impl<A: Api> Rings<A> {
    pub(crate) fn new(rank: usize, names: Vec<String>, shared: bool) -> Self {
        Rings {
            rank,
            names,
            shared,
            held: Default::default(),
        }
    }
}

impl<A: Api> Daemons<A> for Rings<A> {
    type T = Delegation;
    const ORDERED: bool = true;
    fn connect(&self, rank: usize) -> Result<Vec<A::Conn<Delegation>>, RpcError> {
        debug_assert_eq!(rank, self.rank, "the rings of another rank");
        self.names
            .iter()
            .map(|n| A::connect::<Delegation>(n))
            .collect()
    }

    /// With one connection (one daemon), its sleep on the ring (`Delegation`'s `CallWait`:
    /// while the machine is oversubscribed, or after 200 µs without a response). With several,
    /// a sleep on one ring's word would hold up the others' responses: the client yields.
    fn idle_wait(rings: &mut [A::Conn<Delegation>], waited: Duration) -> bool {
        match rings {
            [one] => A::core(one)
                .transport_mut()
                .wait_for_response(waited, Duration::from_millis(1)),
            _ => false,
        }
    }

    fn writer(&self, conns: &mut [A::Conn<Delegation>]) -> Option<(u64, u64)> {
        let conn = conns.first_mut().filter(|_| self.shared)?;
        let ring = A::core(conn).transport().ring();
        Some((
            u64::from(ring.client_id()),
            u64::from(ring.info().max_clients),
        ))
    }

    fn finished(&self, conns: Vec<A::Conn<Delegation>>) {
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
pub(crate) struct ScaleDaemons {
    pub(crate) fabric: Fabric,
    pub(crate) addrs: Vec<ScaleRpcAddr>,
}

impl<A: Api> Daemons<A> for ScaleDaemons {
    type T = ScaleRpc;
    const ORDERED: bool = false;
    fn connect(&self, _rank: usize) -> Result<Vec<A::Conn<ScaleRpc>>, RpcError> {
        let device = self.fabric.open();
        self.addrs
            .iter()
            .map(|a| {
                let mut a = a.clone();
                a.device = device.clone();
                A::connect::<ScaleRpc>(&a)
            })
            .collect()
    }

    /// A ScaleRPC client acknowledges a stop notice only when it polls; one with nothing in
    /// flight is not polled by `poll_with`, so poll its transport here (it has nothing to
    /// deliver).
    #[inline]
    fn keepalive(rings: &mut [A::Conn<ScaleRpc>]) {
        for r in rings.iter_mut().map(A::core).filter(|r| r.in_flight() == 0) {
            let _ = r.transport_mut().poll(|_, _| {});
        }
    }
}

/// The eRPC daemons of every rank: each client connection opens a UDP socket of its own and
/// connects to a daemon's address.
pub(crate) struct ErpcDaemons {
    /// The daemons' addresses, by rank.
    pub(crate) addrs: Vec<Vec<SocketAddr>>,
    /// Calls in flight per connection: the client's queue depth (all may go to one daemon).
    pub(crate) qd: usize,
}

impl<A: Api> Daemons<A> for ErpcDaemons {
    type T = Erpc;
    const ORDERED: bool = false;
    fn connect(&self, rank: usize) -> Result<Vec<A::Conn<Erpc>>, RpcError> {
        let cfg = ErpcConfig {
            max_in_flight: self.qd,
            ..ErpcConfig::default()
        };
        self.addrs[rank]
            .iter()
            .map(|a| {
                Ok(A::from_transport(Erpc::connect_with(
                    a,
                    A::S::DESCRIPTOR,
                    &cfg,
                )?))
            })
            .collect()
    }

    /// eRPC keeps a session alive by running its event loop (keepalive pings, seeds/002 §10);
    /// `poll_with` runs it only with calls in flight, so run the idle connections' here
    /// (they have nothing to deliver).
    #[inline]
    fn keepalive(rings: &mut [A::Conn<Erpc>]) {
        for r in rings.iter_mut().map(A::core).filter(|r| r.in_flight() == 0) {
            let _ = r.transport_mut().poll(|_, _| {});
        }
    }

    /// With one connection (one daemon), its socket wait (`Erpc`'s `CallWait`: while the
    /// machine is oversubscribed, or after 200 µs without a response); with several, one
    /// `ppoll` over all their sockets ([`rpc::erpc::wait_for_any_response`]), so that a
    /// response from any daemon ends it.
    fn idle_wait(rings: &mut [A::Conn<Erpc>], waited: Duration) -> bool {
        let max = Duration::from_millis(1);
        match rings {
            [one] => A::core(one).transport_mut().wait_for_response(waited, max),
            many => rpc::erpc::wait_for_any_response(
                many.iter_mut().map(|r| A::core(r).transport_mut()),
                waited,
                max,
            ),
        }
    }
}

/// What one client thread measured.
pub(crate) struct ClientReport {
    pub(crate) ops: u64,
    /// Operations on another rank than the client's.
    pub(crate) ops_remote: u64,
    pub(crate) gets: u64,
    pub(crate) hits: u64,
    pub(crate) errors: u64,
    pub(crate) hist: Histogram<u64>,
    /// Latencies of the remote operations only.
    pub(crate) hist_remote: Histogram<u64>,
    /// Calls given up at `--deadline-ms` (also counted in `errors`).
    pub(crate) expired: u64,
    /// Reads that found a damaged value (wrong length or bytes; also counted in `errors`).
    pub(crate) damaged: u64,
    /// Completions of calls given up that came late (dropped): raw ones seen by the loop,
    /// typed ones counted by their clients.
    pub(crate) late: u64,
    /// Last value written to each sampled (rank, key): keys `k` with
    /// `(k / writers) % SAMPLE_EVERY == 0`, so that every writer has some (it writes only
    /// keys `k % writers == gid`).
    pub(crate) written: FxHashMap<(u32, u64), u64>,
}

pub(crate) const SAMPLE_EVERY: u64 = 8;

impl ClientReport {
    /// A client thread that has done nothing yet.
    pub(crate) fn new() -> Self {
        ClientReport {
            ops: 0,
            ops_remote: 0,
            gets: 0,
            hits: 0,
            errors: 0,
            expired: 0,
            damaged: 0,
            late: 0,
            hist: new_hist(),
            hist_remote: new_hist(),
            written: FxHashMap::default(),
        }
    }
}

/// What the client threads of one rank did.
pub(crate) struct RankRun {
    /// From the clients' start to their stop (warm-up and every run).
    pub(crate) elapsed: Duration,
    /// Each measured run (seeds/004 §9 step 12): the operations completed by the clients of
    /// every rank between the run's start and its stop time, and its length in seconds.
    pub(crate) runs: Vec<(u64, f64)>,
    pub(crate) clients: Vec<ClientReport>,
    /// Why a client thread failed, if one did.
    pub(crate) failure: Option<String>,
}

/// Runs this rank's client threads, one per entry of `remotes` (reaching the rank's daemons
/// through `daemons`), for `--duration` seconds. The ranks start together (a barrier once
/// every client is connected), and each second every rank sums the operations done and the
/// client threads failed over all ranks (a reduction on every rank: each makes the same number
/// of them); rank 0 prints the throughput. A client thread that fails wakes this thread at
/// once, and the run of every rank ends at that rank's next reduction (at once with one rank):
/// the other client threads stop, and what every thread did up to then is kept.
pub(crate) fn run_clients<B: Bootstrap, A: Api, D: Daemons<A>>(
    b: &B,
    daemons: Arc<D>,
    remotes: Vec<Remote<A>>,
    load: &LoadArgs,
    out: &OutArgs,
    pin: &Pinning,
) -> RankRun {
    let (rank, ranks) = (b.rank(), b.size());
    let n = remotes.len();
    let stop = Arc::new(AtomicBool::new(false));
    // Set while a run is measured: clients record latencies only then.
    let measuring = Arc::new(AtomicBool::new(false));
    let counters: Arc<Vec<CachePadded<AtomicU64>>> = Arc::new(
        (0..n)
            .map(|_| CachePadded::new(AtomicU64::new(0)))
            .collect(),
    );
    // `ready`: every client connected; `go`: every rank's clients are.
    let ready = Arc::new(PollBarrier::new(n + 1));
    let go = Arc::new(PollBarrier::new(n + 1));
    // A client thread that fails says so here (and stops the others).
    let (failed_tx, failed_rx) = crossbeam_channel::bounded::<()>(n);
    let mut handles = Vec::new();
    for (c, remote) in remotes.into_iter().enumerate() {
        let gid = rank * load.clients + c;
        let (daemons, load, stop, measuring, counters, ready, go, failed) = (
            daemons.clone(),
            load.clone(),
            stop.clone(),
            measuring.clone(),
            counters.clone(),
            ready.clone(),
            go.clone(),
            failed_tx.clone(),
        );
        let core = pin.client(c);
        handles.push(
            thread::Builder::new()
                .name(format!("client-{rank}.{c}"))
                .spawn(move || {
                    pin_current(core);
                    let mut report = ClientReport::new();
                    let r = client_thread::<A, D>(
                        gid,
                        (rank, ranks),
                        &*daemons,
                        remote,
                        &load,
                        (&ready, &go),
                        (&stop, &measuring),
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
    ready.wait(|| {});
    // The clients of every rank start together.
    let met = b.barrier();
    go.wait(|| {});
    let t0 = Instant::now();
    let mut runs = Vec::new();
    let mut failure = met.err().map(boot);
    if failure.is_none() {
        let sum = || {
            counters
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .sum::<u64>()
        };
        failure = measure(b, load, (out, rank), sum, &failed_rx, &measuring, &mut runs);
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
        runs,
        clients,
        failure,
    }
}

/// The warm-up and the measured runs of seeds/004 §9 step 12, while the clients run: the
/// warm-up (`--warmup`, not measured), then `--runs` runs of `--duration` seconds, each
/// after a barrier of all ranks. Within a run, every second (and at its end) each rank sums
/// the operations its clients completed since the run started and whether a client thread
/// failed, over all ranks (a reduction on every rank, so each makes the same number of
/// them); rank 0 prints the rate. A run's figure is the operations completed up to its stop
/// time (`sum`, the clients' counters, read at that instant: completions after it do not
/// count) and its measured length. A client thread that fails (`failed`) ends the
/// measurement at every rank's next reduction. Returns a bootstrap failure, if any.
fn measure<B: Bootstrap>(
    b: &B,
    load: &LoadArgs,
    (out, rank): (&OutArgs, usize),
    sum: impl Fn() -> u64,
    failed: &crossbeam_channel::Receiver<()>,
    measuring: &AtomicBool,
    runs: &mut Vec<(u64, f64)>,
) -> Option<String> {
    let warm_end = Instant::now() + Duration::from_secs_f64(load.warmup.max(0.0));
    let mut flag = [u64::from(failed.recv_deadline(warm_end).is_ok())];
    if let Err(e) = b.all_reduce_sum_u64(&mut flag) {
        return Some(boot(e));
    }
    if flag[0] > 0 {
        return None;
    }
    let duration = load.duration.max(0.0);
    let ticks = (duration.ceil() as u64).max(1);
    for run in 0..load.runs {
        if let Err(e) = b.barrier() {
            return Some(boot(e));
        }
        measuring.store(true, Ordering::Relaxed);
        let (t0, start) = (Instant::now(), sum());
        let (mut last, mut tick) = (0u64, t0);
        for k in 1..=ticks {
            let at = t0 + Duration::from_secs_f64((k as f64).min(duration));
            // Wakes early if a client thread fails.
            let failed_here = failed.recv_deadline(at).is_ok();
            let (ops, now) = (sum() - start, Instant::now());
            let mut total = [ops, u64::from(failed_here)];
            if let Err(e) = b.all_reduce_sum_u64(&mut total) {
                measuring.store(false, Ordering::Relaxed);
                return Some(boot(e));
            }
            if rank == 0 && !out.quiet {
                let label = if load.runs > 1 {
                    format!("run {}/{}", run + 1, load.runs)
                } else {
                    "run".to_owned()
                };
                eprintln!(
                    "[{label} {:5.1} s] {:8.3} Mops/s",
                    now.duration_since(t0).as_secs_f64(),
                    (total[0] - last) as f64 / now.duration_since(tick).as_secs_f64() / 1e6
                );
            }
            if total[1] > 0 {
                measuring.store(false, Ordering::Relaxed);
                return None;
            }
            if k == ticks {
                runs.push((total[0], now.duration_since(t0).as_secs_f64()));
            }
            last = total[0];
            tick = now;
        }
        measuring.store(false, Ordering::Relaxed);
    }
    None
}

/// A connected client thread's setup: its deadlines, its writer id and its pattern. Generating
/// the pattern takes a while (`gen_pattern`): the connections are kept polled meanwhile
/// (`Daemons::keepalive`; see `client_thread`).
pub(crate) fn prepare<A: Api, D: Daemons<A>>(
    daemons: &D,
    rings: &mut [A::Conn<D::T>],
    gid: usize,
    (rank, ranks): (usize, usize),
    load: &LoadArgs,
) -> Result<(Me, Vec<Op>), String> {
    set_deadline::<A, _>(rings, load);
    let (writer, writers) = daemons
        .writer(rings)
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
    let pattern = gen_pattern(load, me, ranks, || D::keepalive(rings));
    Ok((me, pattern))
}

/// A one-shot barrier of `n` threads whose waiters run `poll` (then sleep briefly) until all
/// arrived: client threads keep their connections polled while they wait (`client_thread`).
pub(crate) struct PollBarrier {
    n: usize,
    arrived: std::sync::atomic::AtomicUsize,
}

impl PollBarrier {
    pub(crate) fn new(n: usize) -> Self {
        PollBarrier {
            n,
            arrived: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Arrives and waits for the other threads, running `poll` meanwhile. One-shot: each of
    /// the `n` threads waits once.
    pub(crate) fn wait(&self, mut poll: impl FnMut()) {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        while self.arrived.load(Ordering::Acquire) < self.n {
            poll();
            thread::sleep(Duration::from_micros(50));
        }
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
pub(crate) fn client_thread<A: Api, D: Daemons<A>>(
    gid: usize,
    (rank, ranks): (usize, usize),
    daemons: &D,
    remote: Remote<A>,
    load: &LoadArgs,
    (ready, go): (&PollBarrier, &PollBarrier),
    stop: (&AtomicBool, &AtomicBool),
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
        let (me, pattern) = prepare::<A, D>(daemons, &mut rings, gid, (rank, ranks), load)?;
        Ok((rings, me, pattern))
    });
    // Connected, the thread keeps polling its connections until its closed loop polls them:
    // a ScaleRPC server may stop the connection's group right after it connected (another
    // group joined), and a ScaleRPC client acknowledges the stop only when it is polled; one
    // that is not polled for the server's ack timeout is evicted (connecting every client,
    // generating the patterns and meeting the other ranks can take that long on a loaded
    // machine). Nothing is in flight, so nothing can be delivered.
    let mut rings = rings;
    let mut keepalive = || {
        if let Ok((rings, ..)) = &mut rings {
            D::keepalive(rings);
        }
    };
    ready.wait(&mut keepalive);
    go.wait(&mut keepalive);
    let (mut rings, me, pattern) = rings?;
    // Every call of the closed loop may go to the same ring.
    if let Some(r) = rings
        .iter_mut()
        .map(A::core)
        .find(|r| r.max_in_flight() < load.qd)
    {
        return Err(format!(
            "--qd {} exceeds the ring's {} response slots per client (kv serve --resp-depth)",
            load.qd,
            r.max_in_flight()
        ));
    }
    let mut remote = remote;
    if let Remote::Direct { conns } = &mut remote {
        for c in conns.iter_mut().flatten() {
            A::core(c).set_default_deadline(Duration::from_millis(load.deadline_ms));
        }
    }
    if let Remote::Ring(ring) = &mut remote {
        let ring = A::core(ring);
        ring.set_default_deadline(Duration::from_millis(load.deadline_ms));
        if ring.max_in_flight() < load.qd {
            return Err(format!(
                "--qd {} exceeds Daemon#0's ring's {} response slots per client",
                load.qd,
                ring.max_in_flight()
            ));
        }
    }
    let r = client_loop::<A, D>(
        me,
        &mut rings,
        &mut remote,
        &pattern,
        load,
        stop,
        counter,
        report,
    );
    // Late responses of expired typed calls, dropped by their clients.
    report.late += rings
        .iter_mut()
        .map(|c| A::core(c).stats().late_responses)
        .sum::<u64>();
    match &mut remote {
        Remote::Ring(ring) => report.late += A::core(ring).stats().late_responses,
        Remote::Direct { conns } => {
            report.late += (conns.iter_mut().flatten())
                .map(|c| A::core(c).stats().late_responses)
                .sum::<u64>();
        }
        _ => {}
    }
    daemons.finished(rings);
    r
}

/// A completed call: its tag and what its response says of its operation
/// ([`crate::api::Outcome`]), or how it failed.
pub(crate) type Done = (u64, Result<Outcome, Failed>);

/// How a call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failed {
    /// No completion within `--deadline-ms` (the typed client's `DeadlineExceeded`).
    Deadline,
    /// An error response, or one that did not decode.
    Error,
}

/// How a typed call failed.
#[cold]
pub(crate) fn failed(e: RpcError) -> Failed {
    match e {
        RpcError::DeadlineExceeded { .. } => Failed::Deadline,
        _ => Failed::Error,
    }
}

/// What [`issue`] did with an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Nothing: the transport cannot take the call now; poll and issue it again.
    Later,
    /// A typed call (its client enforces its deadline).
    Typed,
}

/// Sends `op` with tag `tag`: to the owner daemon's ring if it is for this rank, else over
/// the remote path. Returns [`Sent::Later`] if the transport cannot take the call now
/// (ScaleRPC: the connection's group is not scheduled; copyrpc: no credit or ring space):
/// poll and issue it again.
#[inline]
pub(crate) fn issue<A: Api, T: ClientTransport + Send>(
    me: Me,
    (tag, op, value): (u64, Op, u64),
    rings: &mut [A::Conn<T>],
    remote: &mut Remote<A>,
    ctx: &mut Ctx,
) -> Result<Sent, String> {
    let ring = match remote {
        Remote::Rings { daemons } => op.rank as usize * *daemons + A::owner(op.key, *daemons, ctx),
        _ if op.rank as usize == me.rank => A::owner(op.key, rings.len(), ctx),
        Remote::Ring(ring) => return typed_issue::<A, _>(ring, tag, op, value, ctx),
        Remote::None => 0,
        Remote::Meta => A::owner(op.key, rings.len(), ctx),
        Remote::Direct { conns } => {
            return match conns.get_mut(op.rank as usize) {
                Some(Some(conn)) => typed_issue::<A, _>(conn, tag, op, value, ctx),
                _ => Err(format!("no endpoint to rank {}", op.rank)),
            };
        }
    };
    typed_issue::<A, T>(&mut rings[ring], tag, op, value, ctx)
}

/// Issues `op` with tag `tag` on a typed connection.
#[inline]
fn typed_issue<A: Api, T: ClientTransport + Send>(
    conn: &mut A::Conn<T>,
    tag: u64,
    op: Op,
    value: u64,
    ctx: &mut Ctx,
) -> Result<Sent, String> {
    match A::issue(conn, tag, op, value, ctx) {
        Ok(()) => Ok(Sent::Typed),
        Err(RpcError::WouldBlock) => Ok(Sent::Later),
        Err(e) => Err(e.to_string()),
    }
}

/// The closed loop of one client thread (seeds/004 §7): requests for its rank go to the owner
/// daemon's ring, the others over `remote`; every connection is polled, and each completion is replaced by the next operation of the pattern. An operation
/// the transport cannot take yet (or, on a transport that does not keep a connection's calls
/// in order, a write of a key with a write outstanding) waits, and the ones after it too.
#[allow(clippy::too_many_arguments)]
pub(crate) fn client_loop<A: Api, D: Daemons<A>>(
    me: Me,
    rings: &mut [A::Conn<D::T>],
    remote: &mut Remote<A>,
    pattern: &[Op],
    load: &LoadArgs,
    (stop, measuring): (&AtomicBool, &AtomicBool),
    counter: &AtomicU64,
    rep: &mut ClientReport,
) -> Result<(), String> {
    let qd = load.qd;
    // The test hook `--fail-client-after`: client 0 fails once it has done this many.
    let fail_after = match load.fail_client_after {
        Some(n) if me.gid == 0 => n,
        _ => u64::MAX,
    };
    // Per tag (0..qd): when its call was issued and what it was. Every call is typed: its
    // client enforces its deadline and drops a late response.
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
    // Keys and values of the variable-size service (the test hook `--corrupt-puts`: client
    // 0's values are damaged).
    let sizes = load.sizes()?.unwrap_or(crate::api::Sizes {
        value: load.value_size,
        key: load.value_size,
    });
    let corrupt = load.corrupt_puts.filter(|_| me.gid == 0);
    let mut ctx = Ctx::new(sizes, corrupt);
    let mut free: Vec<u64> = (0..qd as u64).collect();
    let (mut next, mut seq) = (0usize, 0u64);
    let mut outstanding = 0usize;
    // The next operation, taken from the pattern but not issued yet, and its value.
    let mut waiting: Option<(Op, u64)> = None;
    // Unordered transports: (rank, key) of the writes outstanding.
    let mut writes_out: rustc_hash::FxHashSet<(u32, u64)> = Default::default();
    let backoff = Backoff::new();
    // When the current run of polls without a response began (after the backoff).
    let mut idle_since: Option<Instant> = None;
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
                let sent = issue::<A, D::T>(me, (tag, op, value), rings, remote, &mut ctx)?;
                if sent == Sent::Later {
                    if !D::ORDERED && !op.read {
                        writes_out.remove(&(op.rank, op.key));
                    }
                    waiting = Some((op, value));
                    break;
                }
                free.pop();
                if !op.read && (op.key / me.writers) % SAMPLE_EVERY == 0 {
                    rep.written.insert((op.rank, op.key), value);
                }
                outstanding += 1;
            }
        } else if outstanding == 0 {
            break;
        }
        // Each response is checked where it was received (`Api::poll_outcomes`).
        for ring in rings.iter_mut() {
            A::poll_outcomes(ring, &inflight, &ctx, |tag, r| done.push((tag, r)))
                .map_err(|e| e.to_string())?;
        }
        if let Remote::Ring(ring) = remote {
            A::poll_outcomes(ring, &inflight, &ctx, |tag, r| done.push((tag, r)))
                .map_err(|e| e.to_string())?;
        }
        if let Remote::Direct { conns } = remote {
            for conn in conns.iter_mut().flatten() {
                A::poll_outcomes(conn, &inflight, &ctx, |tag, r| done.push((tag, r)))
                    .map_err(|e| e.to_string())?;
            }
        }
        if done.is_empty() {
            D::keepalive(rings);
            // Past the backoff, with nothing but `rings` to poll: the transport may block.
            if backoff.is_completed()
                && matches!(remote, Remote::None | Remote::Meta | Remote::Rings { .. })
            {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if D::idle_wait(rings, since.elapsed()) {
                    continue;
                }
            }
            backoff.snooze();
            continue;
        }
        idle_since = None;
        backoff.reset();
        for (tag, r) in done.drain(..) {
            let (t, op) = inflight[tag as usize];
            if !D::ORDERED && !op.read {
                writes_out.remove(&(op.rank, op.key));
            }
            if matches!(r, Err(Failed::Deadline)) {
                // The typed client gave the call up at its deadline.
                expired(op, rep);
                outstanding -= 1;
                free.push(tag);
                continue;
            }
            // Latency only while a run is measured (not in the warm-up, seeds/004 §9).
            let measured = measuring.load(Ordering::Relaxed);
            let ns = (t.elapsed().as_nanos() as u64).max(1);
            if measured {
                let _ = rep.hist.record(ns);
            }
            if op.rank as usize != me.rank {
                rep.ops_remote += 1;
                if measured {
                    let _ = rep.hist_remote.record(ns);
                }
            }
            rep.ops += 1;
            match r {
                Ok(Ok(Some(read))) => {
                    rep.gets += 1;
                    if let Read::Hit { version, intact } = read {
                        rep.hits += 1;
                        // Single writer per key: the value must come from the key's writer,
                        // and be intact (every byte and the length, `KvVar`).
                        if !intact || !plausible(version, op.key, me.writers) {
                            rep.errors += 1;
                            rep.damaged += u64::from(!intact);
                        }
                    }
                }
                Ok(Ok(None)) => {}
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

/// A call given up at its deadline: an error, counted in `rep.expired`; its write (whether it
/// executed is unknown) leaves the sampled keys.
#[cold]
pub(crate) fn expired(op: Op, rep: &mut ClientReport) {
    rep.errors += 1;
    rep.expired += 1;
    if !op.read {
        rep.written.remove(&(op.rank, op.key));
    }
}

/// The error of the test hook `--fail-client-after`.
#[cold]
pub(crate) fn failed_on_purpose(ops: u64) -> String {
    format!("failed on purpose after {ops} operations (test hook --fail-client-after)")
}

/// Gives every call of `conns` the deadline `--deadline-ms` (the typed clients' default).
pub(crate) fn set_deadline<A: Api, T: ClientTransport + Send>(
    conns: &mut [A::Conn<T>],
    load: &LoadArgs,
) {
    for c in conns {
        A::core(c).set_default_deadline(Duration::from_millis(load.deadline_ms));
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use rpc::Server;
    use rpc::mlx5::sim::SimConfig;
    use rpc::scalerpc::{ConnState, GroupSize, ScaleRpcServer, Scheduler, ServerConfig};

    use super::*;
    use crate::api::Fixed;

    #[derive(Parser)]
    struct Load {
        #[command(flatten)]
        load: LoadArgs,
    }

    type Daemon = Server<<Fixed as Api>::S, ScaleRpcServer>;

    /// Connects one client thread's connections (`ScaleDaemons::connect`) while this thread
    /// polls the server, which answers the connect requests.
    fn connect(daemons: &ScaleDaemons, server: &mut Daemon) -> Vec<<Fixed as Api>::Conn<ScaleRpc>> {
        thread::scope(|s| {
            let h = s.spawn(|| <ScaleDaemons as Daemons<Fixed>>::connect(daemons, 0));
            while !h.is_finished() {
                server.poll();
            }
            h.join().expect("connect panicked").expect("connect")
        })
    }

    fn sched(server: &Daemon) -> &Scheduler {
        server.transport().scale_server().scheduler()
    }

    /// Regression: kv over ScaleRPC on a loaded machine evicted every connection of the
    /// first group about a second into the run, with no acknowledgement at all. A client
    /// thread connects, then generates its pattern (2^20 operations by default: more than a
    /// second in a debug build under load), then meets the start barriers, and only then
    /// polls; meanwhile its server stopped its group (the next group joined) and, the stop
    /// never read, evicted it after the 1 s ack timeout. The setup now keeps the connections
    /// polled: a stop that arrives while it runs is acknowledged by the time it returns.
    /// Deterministic: the device model executes a WQE at its doorbell, so the stop is in the
    /// client's CQ once the server's poll that sent it returns, and the acknowledgement in
    /// the server's once the client's poll that sent it returns.
    #[test]
    fn a_client_acknowledges_a_stop_while_it_prepares_its_pattern() {
        let fabric = Fabric::new(SimConfig::deterministic());
        let device = fabric.open();
        let cfg = ServerConfig {
            max_conns: 2,
            group_size: GroupSize::Fixed(1),
            slots_per_conn: 2,
            slot_size: Some(128),
            slice: Duration::from_micros(1),
            warmup: Duration::from_micros(1),
            // Never evicts within the test: only the acknowledgement is checked.
            ack_timeout: Duration::from_secs(3600),
            ..ServerConfig::default()
        };
        let mut server = ScaleRpcServer::serve::<<Fixed as Api>::S>(&device, cfg).unwrap();
        let daemons = ScaleDaemons {
            fabric: fabric.clone(),
            addrs: vec![ScaleRpcAddr::new(
                device.clone(),
                server.transport().listener(),
            )],
        };
        // Connection 0 (group 0, active at once), then connection 1 (group 1).
        let mut first = connect(&daemons, &mut server);
        let _second = connect(&daemons, &mut server);
        // The server warms group 1 up and stops group 0.
        let t = Instant::now();
        while !matches!(
            sched(&server).conn_state(0),
            Some(ConnState::Stopping { .. })
        ) {
            server.poll();
            assert!(t.elapsed() < Duration::from_secs(60), "no switch");
        }
        assert_eq!(sched(&server).stats().acks, 0);
        let load = Load::parse_from(["kv", "--clients", "2", "--pattern-len", "4096"]).load;
        let (_, pattern) =
            prepare::<Fixed, ScaleDaemons>(&daemons, &mut first, 0, (0, 1), &load).unwrap();
        assert_eq!(pattern.len(), 4096);
        // Nothing polls the first client from here on: its acknowledgement was sent by the
        // setup.
        server.poll();
        assert_eq!(
            sched(&server).stats().acks,
            1,
            "the stop was not acknowledged"
        );
        // Drained (and perhaps warmed up again by the same poll).
        assert!(
            matches!(
                sched(&server).conn_state(0),
                Some(ConnState::Idle | ConnState::Active { .. })
            ),
            "{:?}",
            sched(&server).conn_state(0)
        );
    }

    /// Threads waiting at a `PollBarrier` run their poll until the last one arrives: the last
    /// thread arrives only once the waiter has polled.
    #[test]
    fn poll_barrier_waiters_poll_until_all_arrived() {
        let barrier = PollBarrier::new(2);
        let polled = AtomicBool::new(false);
        thread::scope(|s| {
            s.spawn(|| barrier.wait(|| polled.store(true, Ordering::Release)));
            while !polled.load(Ordering::Acquire) {
                thread::yield_now();
            }
            barrier.wait(|| {});
        });
    }
}

//! The two backends of seeds/004, **Meta** and **Delegation** (§1, §4-§7), on one rank.
//!
//! Every daemon `d` of a rank serves shard `d` (`key % D`) to the rank's clients over its own
//! local server (the seed's ipc: per-client SPSC rings in `/dev/shm`, §4.4) and talks to the
//! rank's other daemons over Flux (§4.3); each runs [`rpc::delegation::node::NodeDaemon`],
//! whose module docs state the routing and the phase order (§5, §6). The backends differ in
//! where the copyrpc endpoints to the other ranks live and in how a client reaches them
//! (§1.4, §7):
//! - **Meta**: daemon `d` holds the endpoints of the remote ranks `s` with `s % D == d`; a
//!   client sends every call, remote ones too, over ipc to the daemon owning the key's shard,
//!   which passes a remote call over Flux to the endpoint's holder (3 hops: client → ipc →
//!   Daemon#N → Flux → Daemon#h → copyrpc).
//! - **Delegation**: Daemon#0 holds every endpoint and a delegation ring (`ring_depth`, one
//!   response slot per call in flight: `resp_depth = QD`, §9 step 4) into which the clients
//!   write their remote calls directly (1 hop).
//!
//! The rank's endpoint information is all-gathered through the bootstrap (§9 step 8: one
//! record per rank pair, from whichever daemon holds the endpoint), every endpoint connected,
//! and the ranks meet at a barrier before any traffic (§9 steps 9-10).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use rpc::bootstrap::Bootstrap;
use rpc::copyrpc::{Context, ContextConfig, EndpointConfig, EndpointId, EndpointInfo, SetupError};
use rpc::delegation::node::{NodeConfig, NodeDaemon, Placement};
use rpc::delegation::{Delegation, DelegationConfig, DelegationServer};
use rpc::erpc::idle::{CallWait, IdleConfig, may_migrate, runnable_threads, usable_cpus};
use rpc::flux::{self, FluxConfig};
use rpc::ipc::{Ipc, IpcConfig, IpcServer};
use rpc::{ClientTransport, RpcError, Service};

use crate::api::{Api, Router};

use crate::client::Daemons;
use crate::config::{RunArgs, Topology};
use crate::daemon::{DaemonReport, DaemonThreads};
use crate::pinning::{Pinning, pin_current};
use crate::report::Summary;
use crate::run::clients_and_check;
use crate::wiring::{Job, Nic, Remote, agree, boot, exchange_infos, on_rank};

/// The local server of a daemon: the seed's ipc server (per-client SPSC rings, §4.4).
pub(crate) type LocalServer = IpcServer;
/// A client's connection to a daemon's local server.
pub(crate) type LocalClient = Ipc;

/// A daemon of service `A` whose Flux messages hold `N` bytes.
type KvNode<A, const N: usize> = NodeDaemon<<A as Api>::S, LocalServer, Router, N>;

/// Where the copyrpc endpoints live for `topo` (seeds/004 §1.4).
pub(crate) fn placement(topo: Topology) -> Placement {
    match topo {
        Topology::Meta => Placement::Distributed,
        _ => Placement::Aggregated,
    }
}

/// The local servers of this rank's daemons, by name.
pub(crate) struct LocalServers {
    rank: usize,
    names: Vec<String>,
}

impl<A: Api> Daemons<A> for LocalServers {
    type T = LocalClient;
    const ORDERED: bool = true;
    fn connect(&self, rank: usize) -> Result<Vec<A::Conn<LocalClient>>, RpcError> {
        debug_assert_eq!(rank, self.rank, "the local servers of another rank");
        self.names
            .iter()
            .map(|n| A::connect::<LocalClient>(n))
            .collect()
    }

    /// A sleep on the client's ipc words (`Ipc`'s `CallWait`: while the machine is
    /// oversubscribed, or after 200 µs without a response; never from a pinned thread), with
    /// one daemon on its connection's word, with several on all of them at once
    /// (`rpc::ipc::sleep_for_any_response`).
    fn idle_wait(rings: &mut [A::Conn<LocalClient>], waited: std::time::Duration) -> bool {
        let max = std::time::Duration::from_millis(1);
        match rings {
            [one] => A::core(one).transport_mut().wait_for_response(waited, max),
            many => rpc::ipc::sleep_for_any_response(
                many.iter_mut().map(|r| A::core(r).transport_mut()),
                waited,
                max,
            ),
        }
    }
}

/// One rank of a Meta or Delegation run (seeds/004 §9): creates the daemons' local servers
/// (and, Delegation, Daemon#0's ring), the Flux network, and (several ranks) the copyrpc
/// endpoints, exchanges and connects them, starts the daemons, runs the clients and the
/// check, and combines the figures of all ranks. A setup step that fails on any rank fails on
/// every rank ([`agree`]).
pub(crate) fn run_seed_rank<A: Api, B: Bootstrap, const N: usize>(
    b: &B,
    job: &Job,
    a: &RunArgs,
    topo: Topology,
) -> Result<Summary, String> {
    let (rank, ranks, daemons) = (b.rank(), b.size(), a.daemons);
    let clients = a.load.clients;
    let placement = placement(topo);
    let base = format!("{}-{}-r{rank}", job.base, topo.name());
    // seeds/004 §9 step 3: one ipc server per daemon.
    let names: Vec<String> = (0..daemons).map(|d| format!("{base}-ipc{d}")).collect();
    let ring_name = format!("{base}-ring");
    // seeds/004 §9 step 3: every client of the rank (and the checker), `QD` calls each.
    let local_cfg = IpcConfig {
        max_clients: a.ring.max_clients,
        depth: a.ring.resp_depth,
        ..IpcConfig::default()
    };
    // seeds/004 §9 step 4: Daemon#0's ring, resp_depth = QD.
    let ring_cfg = DelegationConfig {
        max_clients: (clients as u32).max(1),
        ring_depth: a.ring.ring_depth,
        resp_depth: (a.load.qd.max(1) as u32).next_power_of_two(),
        ..DelegationConfig::default()
    };
    let pin = Pinning::plan(b, !a.load.no_pin, daemons, clients);
    let pin = agree(b, "planning the CPU pinning", pin)?;
    let nodes = build_nodes::<A, N>(
        (rank, ranks, daemons),
        placement,
        &names,
        (&ring_name, ring_cfg),
        local_cfg,
    );
    let mut nodes = agree(b, "creating the daemons", nodes)?;
    if ranks > 1 {
        let Some(nic) = &job.nic else {
            return Err(on_rank(b, "no NIC for copyrpc between ranks".into()));
        };
        let eps =
            create_endpoints::<A, N>(nic, (rank, ranks), &mut nodes, a.copyrpc_ring, placement);
        let (eps, infos) = agree(b, "copyrpc setup", eps)?;
        let all = exchange_infos(b, &infos).map_err(|e| on_rank(b, e))?;
        let connected = connect_endpoints::<A, N>(&mut nodes, rank, placement, &eps, &all);
        agree(b, "connecting the ranks", connected)?;
        // Every endpoint of every rank is connected before any traffic (§9 steps 9-10).
        b.barrier().map_err(|e| on_rank(b, boot(e)))?;
    }
    let remotes: Result<Vec<Remote<A>>, String> = (0..clients)
        .map(|_| match (ranks, placement) {
            (1, _) => Ok(Remote::None),
            (_, Placement::Distributed) => Ok(Remote::Meta),
            (_, Placement::Aggregated) => A::connect::<Delegation>(&ring_name)
                .map(|c| Remote::Ring(Box::new(c)))
                .map_err(|e| format!("attaching to Daemon#0's ring: {e}")),
        })
        .collect();
    let mut threads = DaemonThreads::default();
    for (d, node) in nodes.into_iter().enumerate() {
        let (stop, core) = (threads.stop.clone(), pin.daemon(d));
        threads.handles.push(
            thread::Builder::new()
                .name(format!("daemon-{rank}.{d}"))
                .spawn(move || {
                    pin_current(core);
                    node_loop::<A, N>(node, &stop)
                })
                .expect("spawn daemon"),
        );
    }
    let remotes = agree(b, "connecting the clients", remotes)?;
    let locals = Arc::new(LocalServers { rank, names });
    let (mut s, _) = clients_and_check(
        b,
        locals,
        remotes,
        threads,
        (&a.load, &a.out, &pin),
        daemons,
    )?;
    s.backend = topo.name();
    s.mpi = job.mpi;
    (s.pinned, s.pin_note) = (pin.pinned(), pin.note());
    Ok(s)
}

/// The daemons of a rank, with their local servers, Flux nodes and (Delegation) Daemon#0's
/// ring; no copyrpc yet.
fn build_nodes<A: Api, const N: usize>(
    (rank, ranks, daemons): (usize, usize, usize),
    placement: Placement,
    names: &[String],
    (ring_name, ring_cfg): (&str, DelegationConfig),
    local_cfg: IpcConfig,
) -> Result<Vec<KvNode<A, N>>, String> {
    // seeds/004 §9 step 5: capacity 1024, max_inflight 256.
    let fluxes = flux::network(daemons, FluxConfig::default()).map_err(|e| e.to_string())?;
    let mut nodes = Vec::with_capacity(daemons);
    for ((d, f), name) in fluxes.into_iter().enumerate().zip(names) {
        let local = LocalServer::create(name, A::S::DESCRIPTOR, local_cfg)
            .map_err(|e| format!("daemon {d}: creating its ipc server: {e}"))?;
        let cfg = NodeConfig::new(
            placement,
            (rank as u32, ranks as u32),
            (d as u32, daemons as u32),
        );
        let route = A::route(daemons);
        let mut node =
            KvNode::<A, N>::new(cfg, local, f, route).map_err(|e| format!("daemon {d}: {e}"))?;
        if placement == Placement::Aggregated && d == 0 {
            let ring = DelegationServer::create(ring_name, A::S::DESCRIPTOR, ring_cfg)
                .map_err(|e| format!("creating Daemon#0's ring: {e}"))?;
            node = node.with_ring(ring).map_err(|e| e.to_string())?;
        }
        nodes.push(node);
    }
    Ok(nodes)
}

/// Creates a copyrpc context on every daemon that holds an endpoint and the endpoints
/// themselves (seeds/004 §1.4, §9 step 6): the endpoint towards each other rank `s` on
/// daemon `placement.holder(s)`. Returns the endpoint by rank, and its information by rank
/// (what the other ranks need: slot `s` is this rank's endpoint towards `s`).
#[allow(clippy::type_complexity)]
fn create_endpoints<A: Api, const N: usize>(
    nic: &Nic,
    (rank, ranks): (usize, usize),
    nodes: &mut [KvNode<A, N>],
    ring_size: usize,
    placement: Placement,
) -> Result<(Vec<Option<EndpointId>>, Vec<Option<EndpointInfo>>), String> {
    let device = nic.open()?;
    let ecfg = EndpointConfig {
        ring_size,
        fingerprint: A::S::DESCRIPTOR.fingerprint,
        ..EndpointConfig::default()
    };
    let setup = |e: SetupError| format!("copyrpc setup: {e}");
    let daemons = nodes.len() as u32;
    let (mut eps, mut infos) = (vec![None; ranks], vec![None; ranks]);
    for s in (0..ranks).filter(|&s| s != rank) {
        let d = placement.holder(s as u32, daemons) as usize;
        let node = &mut nodes[d];
        if node.context().is_none() {
            node.set_context(Context::new(&device, ContextConfig::default()).map_err(setup)?);
        }
        let ctx = node.context_mut().ok_or("daemon without a context")?;
        let ep = ctx.create_endpoint(&ecfg).map_err(setup)?;
        infos[s] = ctx.local_info(ep);
        eps[s] = Some(ep);
    }
    Ok((eps, infos))
}

/// Connects this rank's endpoint towards each rank `s` to that rank's endpoint towards this
/// one (`all[s][rank]`) and registers it with its daemon.
fn connect_endpoints<A: Api, const N: usize>(
    nodes: &mut [KvNode<A, N>],
    rank: usize,
    placement: Placement,
    eps: &[Option<EndpointId>],
    all: &[Vec<Option<EndpointInfo>>],
) -> Result<(), String> {
    let daemons = nodes.len() as u32;
    for (s, ep) in eps.iter().enumerate() {
        let Some(ep) = *ep else { continue };
        let remote = all[s][rank]
            .ok_or_else(|| format!("rank {s} sent no endpoint information for this rank"))?;
        let node = &mut nodes[placement.holder(s as u32, daemons) as usize];
        let ctx = node.context_mut().ok_or("daemon without a context")?;
        ctx.connect(ep, &remote)
            .map_err(|e| format!("copyrpc connect: {e}"))?;
        node.set_peer(s as u32, ep).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A daemon's event loop (seeds/004 §5 for a daemon with copyrpc, §6 otherwise) until
/// `stop`; its report.
///
/// Past its backoff, a daemon whose every input can wake it (no copyrpc context, nothing in
/// its backlog: `NodeDaemon::wait_for_work`) sleeps on its ipc server's, ring's and Flux
/// node's futex words, at most 1 ms, when `CallWait` says so (an oversubscribed machine, or 200 µs without
/// work); a daemon pinned to one CPU never does (rule 5 of `rpc::erpc::idle`).
fn node_loop<A: Api, const N: usize>(mut node: KvNode<A, N>, stop: &AtomicBool) -> DaemonReport {
    let mut shard = A::Shard::default();
    let backoff = Backoff::new();
    let mut wait = may_migrate().then(|| CallWait::new(IdleConfig::default(), usable_cpus()));
    let base = Instant::now();
    let mut idle_since = None;
    while !stop.load(Ordering::Relaxed) {
        // In place: no request or response value per call (`NodeDaemon::run_once_raw`).
        if node.run_once_raw(|msg, out| A::dispatch_raw(&mut shard, msg, out)) == 0 {
            if let Some(w) = wait.as_mut().filter(|_| backoff.is_completed()) {
                let now = base.elapsed().as_nanos() as u64;
                let since = *idle_since.get_or_insert(now);
                if w.should_block(now, now - since, runnable_threads)
                    && node.wait_for_work(Duration::from_millis(1))
                {
                    continue;
                }
            }
            backoff.snooze();
        } else {
            idle_since = None;
            backoff.reset();
        }
    }
    let s = *node.stats();
    DaemonReport {
        requests: s.local_served + s.ring_served + s.remote_served + s.flux_served,
        bad_requests: s.bad_requests,
        dropped_replies: s.dropped_replies,
        keys: A::keys(&shard),
        node: Some(s),
        ..DaemonReport::default()
    }
}

//! The daemon threads of a rank: their rings, their event loops (plain, observing, the
//! `kv serve --drop-reply` test hook, and the delegate of seeds/004 §5), one spawn function
//! per kind of daemon (delegation ring, delegate, ScaleRPC, eRPC), their stop flag, and what
//! each reports when it stops (`DaemonReport`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use rpc::delegation::{Delegate, DelegationConfig, DelegationServer, ForwardStats, Target};
use rpc::erpc::ErpcServer;
use rpc::erpc::idle::{CallWait, IdleConfig, may_migrate, runnable_threads, usable_cpus};
use rpc::scalerpc::ScaleRpcServer;
use rpc::wire::WireError;
use rpc::{RpcError, Server, ServerTransport, Service};

use crate::api::Api;

use crate::pinning::{Pinning, pin_current};
use crate::report::*;

pub(crate) fn ring_name(base: &str, d: usize) -> String {
    format!("{}-{d}", base.trim_start_matches('/'))
}

pub(crate) type KvServerCore<A> = Server<<A as Api>::S, DelegationServer>;

/// Creates one ring per daemon.
pub(crate) fn create_rings<A: Api>(
    base: &str,
    daemons: usize,
    cfg: DelegationConfig,
) -> Result<Vec<DelegationServer>, RpcError> {
    (0..daemons)
        .map(|d| DelegationServer::create(&ring_name(base, d), A::S::DESCRIPTOR, cfg))
        .collect()
}

/// Starts one plain daemon thread per ring (single rank: seeds/004 §6, only the local ring).
pub(crate) fn start_daemons<A: Api>(
    servers: Vec<DelegationServer>,
    rank: usize,
    stop: &Arc<AtomicBool>,
    pin: &Pinning,
) -> Vec<thread::JoinHandle<DaemonReport>> {
    servers
        .into_iter()
        .enumerate()
        .map(|(d, server)| spawn_daemon::<A>(rank, d, Server::new(server), stop, pin))
        .collect()
}

pub(crate) fn spawn_daemon<A: Api>(
    rank: usize,
    d: usize,
    mut server: KvServerCore<A>,
    stop: &Arc<AtomicBool>,
    pin: &Pinning,
) -> thread::JoinHandle<DaemonReport> {
    let stop = stop.clone();
    let core = pin.daemon(d);
    thread::Builder::new()
        .name(format!("daemon-{rank}.{d}"))
        .spawn(move || {
            pin_current(core);
            ring_daemon_loop::<A>(&mut server, &stop)
        })
        .expect("spawn daemon")
}

#[derive(Debug, Default)]
pub(crate) struct DaemonReport {
    /// Requests the daemon's handler executed.
    pub(crate) requests: u64,
    pub(crate) bad_requests: u64,
    pub(crate) dropped_replies: u64,
    pub(crate) keys: usize,
    /// Daemon 0 of a multi-rank `direct` run: the delegate's counters.
    pub(crate) forward: Option<ForwardStats>,
    /// A daemon of the Meta or Delegation backend: its counters.
    pub(crate) node: Option<rpc::delegation::node::NodeStats>,
    /// A ScaleRPC daemon: its server's counters.
    pub(crate) scale: Option<ScaleDaemon>,
    /// An eRPC daemon: its endpoint's counters.
    pub(crate) erpc: Option<ErpcFigures>,
}

/// The daemon event loop (seeds/004 §6: only the local ring; or a ScaleRPC server) that
/// spins and yields while idle, and calls `observe` with the server whenever a round found
/// nothing to do (to sample transport state, e.g. the connections a ScaleRPC server holds).
pub(crate) fn daemon_loop_observing<A: Api, T: ServerTransport>(
    server: &mut Server<A::S, T>,
    stop: &AtomicBool,
    observe: impl FnMut(&Server<A::S, T>),
) -> DaemonReport {
    daemon_loop_with::<A, T>(server, stop, observe, None)
}

/// The eRPC daemon's event loop: once a round of nothing has outlasted the backoff's
/// spinning and yielding, the daemon blocks in its socket
/// ([`ServerTransport::wait_for_request`], at most 1 ms) when [`CallWait`] says so: while the
/// machine has more runnable threads than CPUs, or after 200 µs without a request (the
/// module `rpc::erpc::idle`). A polling daemon next to a busy process holds a CPU its
/// clients need.
pub(crate) fn erpc_daemon_loop<A: Api>(
    server: &mut Server<A::S, ErpcServer>,
    stop: &AtomicBool,
) -> DaemonReport {
    let wait = CallWait::new(IdleConfig::default(), usable_cpus());
    daemon_loop_with::<A, ErpcServer>(server, stop, |_| {}, Some(wait))
}

/// The delegation ring daemon's event loop (seeds/004 §6: only the local ring): as
/// [`erpc_daemon_loop`], but it sleeps on the ring's futex word
/// ([`ServerTransport::wait_for_request`]: `RingServer::wait_for_request`, at most 1 ms) until
/// a client commits a request. A polling daemon next to a busy process
/// holds a CPU its clients need. A daemon pinned to one CPU never sleeps (rule 5 of
/// `rpc::erpc::idle`).
pub(crate) fn ring_daemon_loop<A: Api>(
    server: &mut KvServerCore<A>,
    stop: &AtomicBool,
) -> DaemonReport {
    // Rule 5 of `rpc::erpc::idle`: a daemon pinned to one CPU polls on.
    let wait = may_migrate().then(|| CallWait::new(IdleConfig::default(), usable_cpus()));
    let r = daemon_loop_with::<A, DelegationServer>(server, stop, |_| {}, wait);
    let st = server.transport().ring().stats();
    tracing::debug!(
        idle_waits = st.idle_waits,
        clients_woken = st.clients_woken,
        "kv: ring daemon stopped"
    );
    r
}

/// [`daemon_loop_observing`] with an optional wait policy (see [`erpc_daemon_loop`]).
fn daemon_loop_with<A: Api, T: ServerTransport>(
    server: &mut Server<A::S, T>,
    stop: &AtomicBool,
    mut observe: impl FnMut(&Server<A::S, T>),
    mut wait: Option<CallWait>,
) -> DaemonReport {
    let mut shard = A::Shard::default();
    let backoff = Backoff::new();
    let base = Instant::now();
    // Start of the current run of rounds without work (ns since `base`).
    let mut idle_since = None;
    while !stop.load(Ordering::Relaxed) {
        if A::serve(server, &mut shard) == 0 {
            observe(server);
            if let Some(w) = wait.as_mut().filter(|_| backoff.is_completed()) {
                let now = base.elapsed().as_nanos() as u64;
                let since = *idle_since.get_or_insert(now);
                if w.should_block(now, now - since, runnable_threads)
                    && server
                        .transport_mut()
                        .wait_for_request(Duration::from_millis(1))
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
    let s = server.stats();
    DaemonReport {
        requests: s.requests,
        bad_requests: s.bad_requests,
        dropped_replies: s.dropped_replies,
        keys: A::keys(&shard),
        forward: None,
        node: None,
        scale: None,
        erpc: None,
    }
}

/// [`ring_daemon_loop`] for the test hook `kv serve --drop-reply N`: the `drop`-th request
/// (1-based; 0: none) is executed and its reply dropped (counted in `dropped_replies`).
pub(crate) fn daemon_loop_dropping<A: Api>(
    server: &mut KvServerCore<A>,
    stop: &AtomicBool,
    drop: u64,
) -> DaemonReport {
    let mut shard = A::Shard::default();
    let (mut seen, mut dropped) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        if server.poll() == 0 {
            thread::yield_now();
            continue;
        }
        while let Some((token, req)) = server.recv() {
            let resp = A::dispatch(&mut shard, req);
            seen += 1;
            if seen == drop {
                dropped += 1;
            } else {
                let _ = server.reply(token, &resp);
            }
        }
        server.flush();
    }
    let s = server.stats();
    DaemonReport {
        requests: s.requests,
        bad_requests: s.bad_requests,
        dropped_replies: s.dropped_replies + dropped,
        keys: A::keys(&shard),
        ..DaemonReport::default()
    }
}

/// The delegate's event loop: daemon 0 of a rank in a multi-rank run (seeds/004 §5).
pub(crate) fn delegate_loop<A: Api, R: FnMut(&[u8]) -> Result<Target, WireError>>(
    mut dlg: Delegate<A::S, R>,
    stop: &AtomicBool,
) -> DaemonReport {
    let mut shard = A::Shard::default();
    let backoff = Backoff::new();
    while !stop.load(Ordering::Relaxed) {
        // In place: no request or response value per call (`Delegate::run_once_raw`).
        if dlg.run_once_raw(|msg, out| A::dispatch_raw(&mut shard, msg, out)) == 0 {
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
        keys: A::keys(&shard),
        forward: Some(f),
        node: None,
        scale: None,
        erpc: None,
    }
}

/// The daemon threads of a rank and their stop flag (also set when this is dropped on an
/// error path).
#[derive(Default)]
pub(crate) struct DaemonThreads {
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) handles: Vec<thread::JoinHandle<DaemonReport>>,
}

impl DaemonThreads {
    /// Stops the daemons; their reports.
    pub(crate) fn finish(mut self) -> Vec<DaemonReport> {
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

pub(crate) fn spawn_erpc_daemon<A: Api>(
    rank: usize,
    d: usize,
    mut server: Server<A::S, ErpcServer>,
    stop: &Arc<AtomicBool>,
) -> thread::JoinHandle<DaemonReport> {
    let stop = stop.clone();
    thread::Builder::new()
        .name(format!("daemon-{rank}.{d}"))
        .spawn(move || {
            let mut r = erpc_daemon_loop::<A>(&mut server, &stop);
            let t = server.transport();
            let ep = t.endpoint();
            let core = ep.core_stats();
            let udp = rpc::erpc::datagram::DatagramTransport::stats(ep.transport());
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
                idle_waits: t.stats().idle_waits,
            });
            r
        })
        .expect("spawn daemon")
}

/// One ScaleRPC daemon's server counters.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ScaleDaemon {
    pub(crate) conns: u32,
    pub(crate) groups: u32,
    pub(crate) sched: rpc::scalerpc::SchedStats,
    pub(crate) server: rpc::scalerpc::ScaleServerStats,
    pub(crate) probes: u64,
}

/// Spawns the thread of ScaleRPC daemon `d` of `rank`: the [`daemon_loop_observing`] of
/// `server`, sampling the most groups its scheduler held at once, then its counters
/// ([`ScaleDaemon`]) in its report.
pub(crate) fn spawn_scale_daemon<A: Api>(
    rank: usize,
    d: usize,
    mut server: Server<A::S, ScaleRpcServer>,
    stop: &Arc<AtomicBool>,
) -> thread::JoinHandle<DaemonReport> {
    let stop = stop.clone();
    thread::Builder::new()
        .name(format!("daemon-{rank}.{d}"))
        .spawn(move || {
            // Clients disconnect (and their connections are reclaimed) before the daemons
            // stop: report the connections accepted over the run (held now or reclaimed) and
            // the most groups seen at once.
            let mut groups = 0;
            let mut r = daemon_loop_observing::<A, _>(&mut server, &stop, |server| {
                let s = server.transport().scale_server();
                groups = groups.max(s.scheduler().num_groups());
            });
            let t = server.transport();
            let s = t.scale_server();
            r.scale = Some(ScaleDaemon {
                conns: s.num_conns() + u32::try_from(s.stats().reclaimed).unwrap_or(u32::MAX),
                groups,
                sched: *s.scheduler().stats(),
                server: *s.stats(),
                probes: t.probes_answered(),
            });
            r
        })
        .expect("spawn daemon")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Fixed;

    /// An eRPC daemon with nothing to serve blocks in its socket once it has been idle for
    /// 200 µs (it would poll on forever before): within 200 ms of a loop that runs in this
    /// thread, it must have done so.
    #[test]
    fn an_idle_erpc_daemon_waits_in_its_socket() {
        let t = ErpcServer::bind(
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            <Fixed as Api>::S::DESCRIPTOR,
        )
        .unwrap();
        let mut server = Server::new(t);
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let h = thread::spawn(move || {
            thread::sleep(Duration::from_millis(200));
            s2.store(true, Ordering::Relaxed);
        });
        let r = erpc_daemon_loop::<Fixed>(&mut server, &stop);
        h.join().unwrap();
        assert_eq!(r.requests, 0);
        let waits = server.transport().stats().idle_waits;
        assert!(waits >= 1, "{waits} idle waits");
        // With no datagram and no session timer each wait lasts its full 1 ms, so a 200 ms
        // loop has about 200 at most: the daemon sleeps in them rather than spinning.
        assert!(waits <= 400, "{waits} idle waits");
    }
}

//! Generated stubs and server traits end to end over ScaleRPC, on the software device model.

mod typed_common;

use typed_common::connect_polling_to as connect_polling;
use typed_common::scenarios::{self, Fixture};
use typed_common::{Store, spawn_kv};

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use idl::echo::EchoService;
use idl::kv::{KvClient, KvResponse, KvService};
use rpc::mlx5::sim::{Fabric, SimConfig};
use rpc::scalerpc::{
    ClientConfig, ConnectRefusal, GroupSize, ScaleClient, ScaleRpc, ScaleRpcAddr, ScaleRpcServer,
    ScaleRpcSetupError, ServerConfig,
};

use rpc::{ClientTransport, RpcError, Server, Service};

/// Small pools: 1 KiB slots (the echo service needs 264 B requests), 8 slots per connection
/// (7 calls in flight plus the liveness probe's).
/// Bound on how long calls to a dropped server take to fail: the probe interval, RC retry
/// exhaustion and activation timeouts are well under a second, but on a loaded 2-core
/// machine this test once took over 10 s (2026-11-29, three callgrind runs beside it). A
/// hang still fails it.
const FAILS_WITHIN: Duration = Duration::from_secs(60);

fn small() -> ServerConfig {
    ServerConfig {
        max_conns: 16,
        slot_size: Some(1024),
        slots_per_conn: 8,
        ..ServerConfig::default()
    }
}

/// A server of `S` on its own device, and the address clients on `fabric` connect to.
fn server<S: Service>(
    fabric: &Fabric,
    cfg: ServerConfig,
) -> (Server<S, ScaleRpcServer>, ScaleRpcAddr) {
    let server = ScaleRpcServer::serve::<S>(&fabric.open(), cfg).unwrap();
    let addr = ScaleRpcAddr::new(fabric.open(), server.transport().listener());
    (server, addr)
}

/// ScaleRPC on one software fabric, servers with [`small`] pools.
struct Fx(Fabric);

impl Fixture for Fx {
    type Client = ScaleRpc;
    type Server = ScaleRpcServer;
    type Addr = ScaleRpcAddr;
    fn server<S: Service>(&mut self) -> (Server<S, ScaleRpcServer>, ScaleRpcAddr) {
        server::<S>(&self.0, small())
    }
}

fn fx() -> Fx {
    Fx(Fabric::new(SimConfig::default()))
}

#[test]
fn blocking_calls() {
    let mut fx = fx();
    let b = scenarios::blocking_calls(&mut fx);
    assert_eq!(b.kv.max_in_flight(), 7);
    assert_eq!(b.server.transport().scale_server().num_conns(), 1);
}

#[test]
fn pipelined_calls_all_matched() {
    let mut fx = fx();
    // Every eighth call carries a 256 B payload (sent from the staging slot; the small ones
    // are inline).
    let p = scenarios::pipelined_echo(&mut fx, 20_000, Duration::from_secs(300));
    assert_eq!(p.echo.max_in_flight(), 7);
    let stats = p.server.transport().scale_server().stats();
    assert!(
        stats.writes > 0 && stats.inline_writes < stats.writes,
        "{stats:?}"
    );
}

#[test]
fn clients_in_small_groups_switch_during_the_run() {
    // Groups of two connections with 300 us slices: six clients make three groups, and every
    // client waits for its group's turn several times during the test.
    const CLIENTS: u64 = 6;
    const CALLS: u64 = 1_500;
    let fabric = Fabric::new(SimConfig::default());
    let cfg = ServerConfig {
        group_size: GroupSize::Fixed(2),
        slice: Duration::from_micros(300),
        warmup: Duration::from_micros(50),
        // Generous: a loaded machine may not run a client thread for a while.
        ack_timeout: Duration::from_secs(5),
        ..small()
    };
    let (server, addr) = server::<KvService>(&fabric, cfg);
    // Three groups switching every 300 us from `poll`, served by the runner's default idle
    // backoff: a parked server switches late (up to its 1 ms park), but every call completes.
    let h = typed_common::spawn_kv_with(server, rpc::RunnerConfig::default());
    let finished = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let mut addr = addr.clone();
            addr.device = fabric.open();
            addr.activation_timeout = Some(Duration::from_secs(30));
            let finished = finished.clone();
            thread::spawn(move || {
                let mut kv = KvClient::<ScaleRpc>::connect(&addr).unwrap();
                // The blocking gets below wait for their group's turn; with 8 threads per
                // core (several test binaries at once) a rotation of three groups can take
                // longer than the 1 s default deadline. This test is about switching, not
                // latency: bound each call by the test's own deadline instead.
                kv.set_default_deadline(Duration::from_secs(60));
                let depth = kv.max_in_flight();
                let key = |i: u64| (c << 32) | i;
                // Pipelined puts (each key written once, so their order does not matter),
                // then blocking gets of every key.
                let (mut next, mut done, mut would_block) = (0u64, 0u64, 0u64);
                let deadline = Instant::now() + Duration::from_secs(120);
                while done < CALLS {
                    assert!(Instant::now() < deadline, "client {c} stalled at {done}");
                    while next < CALLS && kv.in_flight() < depth {
                        match kv.issue(next).put(0, key(next), next * 7) {
                            Ok(()) => next += 1,
                            Err(RpcError::WouldBlock) => {
                                would_block += 1;
                                break;
                            }
                            Err(e) => panic!("client {c}: {e}"),
                        }
                    }
                    let n = kv
                        .poll_with(|_, r| assert_eq!(r.unwrap(), KvResponse::Put(())))
                        .unwrap() as u64;
                    if n == 0 {
                        // More threads than cores: let the server and the others run.
                        thread::yield_now();
                    }
                    done += n;
                }
                for i in (0..CALLS).step_by(3) {
                    assert_eq!(
                        kv.get(0, key(i)).unwrap(),
                        Some(i * 7),
                        "client {c} key {i}"
                    );
                }
                // A client that stops calling keeps polling while the others run: a stopped
                // client acknowledges only when it polls, and until it does its group's bank
                // cannot be reused (the ack timeout would evict it).
                finished.fetch_add(1, Ordering::Relaxed);
                while finished.load(Ordering::Relaxed) < CLIENTS as usize {
                    // A client that panicked never counts itself: fail instead of spinning.
                    assert!(
                        Instant::now() < deadline,
                        "client {c}: the others never finished"
                    );
                    assert_eq!(kv.transport_mut().poll(|_, _| {}).unwrap(), 0);
                    thread::yield_now();
                }
                (kv, would_block)
            })
        })
        .collect();
    let clients: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let would_block: u64 = clients.iter().map(|c| c.1).sum();
    let server = h.join().unwrap();
    assert_eq!(
        server.stats().requests,
        CLIENTS * (CALLS + CALLS.div_ceil(3))
    );
    let s = server.transport().scale_server();
    let sched = s.scheduler();
    eprintln!(
        "groups {} {:?} would_block {would_block} {:?}",
        sched.num_groups(),
        sched.stats(),
        s.stats()
    );
    assert_eq!(sched.num_groups(), 3);
    assert!(sched.stats().switches >= 3, "{:?}", sched.stats());
    assert_eq!(sched.stats().evictions, 0);
    assert!(would_block > 0);
    assert_eq!(s.stats().failed_conns, 0);
}

#[test]
fn deferred_replies_out_of_order() {
    let fabric = Fabric::new(SimConfig::default());
    let (mut server, addr) = server::<KvService>(&fabric, small());
    let mut kv = connect_polling(&mut server, &addr, KvClient::<ScaleRpc>::connect).unwrap();
    let taken = scenarios::take_deferred_gets(&mut kv, &mut server, 6, true);
    // Answer the odd keys first, in reverse, then the even ones; a second reply with the same
    // token is refused.
    let order: Vec<_> = taken
        .iter()
        .rev()
        .filter(|t| t.1 % 2 == 1)
        .chain(taken.iter().filter(|t| t.1 % 2 == 0))
        .copied()
        .collect();
    let mut got = Vec::new();
    for (i, &(token, key)) in order.iter().enumerate() {
        server
            .reply(token, &KvResponse::Get(Some(key * 10)))
            .unwrap();
        assert!(matches!(
            server.reply(token, &KvResponse::Get(None)),
            Err(RpcError::ReplyDropped(_))
        ));
        if i == 2 {
            // Replies go out with the next flush (or poll): the first three arrive alone.
            server.flush();
            scenarios::await_deferred_replies(&mut kv, &mut got, 3, || {});
            // Delivered in slot order (the client scans its slots), not reply order.
            got.sort_unstable();
            assert_eq!(got, [1, 3, 5]);
        }
    }
    server.flush();
    scenarios::await_deferred_replies(&mut kv, &mut got, 6, || {});
    got[3..].sort_unstable();
    assert_eq!(got, [1, 3, 5, 0, 2, 4]);
    assert_eq!(server.stats().dropped_replies, 6);
}

#[test]
fn schema_mismatch_fails_at_connect() {
    let mut fx = fx();
    let server = scenarios::schema_mismatch_fails_at_connect(&mut fx, |_, _| {});
    // The refused client left no connection behind.
    assert_eq!(server.transport().scale_server().num_conns(), 1);
}

#[test]
fn capacity_is_checked() {
    let fabric = Fabric::new(SimConfig::default());
    // A 256 B slot carries requests of at most 256 - 32 - 8 = 216 B; echo256 requests are
    // 264 B.
    let tiny = ServerConfig {
        slot_size: Some(256),
        ..small()
    };
    match ScaleRpcServer::serve::<EchoService>(&fabric.open(), tiny) {
        Err(RpcError::CapacityMismatch {
            service: "Echo",
            what: rpc::MessageKind::Request,
            side: rpc::LimitSide::ThisServer,
            setting: "ScaleRPC ServerConfig::slot_size",
            cap: 216,
            need: 264,
            min: Some(min),
        }) => assert_eq!(
            Some(min as u32),
            rpc::scalerpc::derive_slot_size(EchoService::DESCRIPTOR)
        ),
        Err(e) => panic!("expected CapacityMismatch, got {e}"),
        Ok(_) => panic!("expected CapacityMismatch, got a server"),
    }
    // A slot size that is not a multiple of 64 is the core's configuration error.
    match ScaleRpcServer::serve::<KvService>(
        &fabric.open(),
        ServerConfig {
            slot_size: Some(1000),
            ..small()
        },
    ) {
        Err(RpcError::Transport(e)) => {
            let e = e
                .downcast_ref::<ScaleRpcSetupError>()
                .expect("a ScaleRpcSetupError");
            assert!(matches!(*e, ScaleRpcSetupError::Core(_)), "{e}")
        }
        Err(e) => panic!("expected a configuration error, got {e}"),
        Ok(_) => panic!("expected a configuration error, got a server"),
    }
    // A client with smaller or fewer slots than the server's is refused before the server
    // creates anything; the server's geometry connects.
    let (srv, mut addr) = server::<KvService>(&fabric, small());
    let h = spawn_kv(srv);
    for (slot_size, slots) in [(512, 8), (1024, 4)] {
        addr.config.slot_size = Some(slot_size);
        addr.config.slots_per_conn = slots;
        match KvClient::<ScaleRpc>::connect(&addr) {
            Err(RpcError::Transport(e)) => assert!(
                matches!(
                    e.downcast_ref::<ScaleRpcSetupError>(),
                    Some(ScaleRpcSetupError::Refused(ConnectRefusal::Slots {
                        slot_size: 1024,
                        slots_per_conn: 8
                    }))
                ),
                "{e}"
            ),
            Err(e) => panic!("expected a refusal, got {e}"),
            Ok(_) => panic!("expected a refusal, connected"),
        }
    }
    // Larger and more slots are fine.
    addr.config.slot_size = Some(2048);
    addr.config.slots_per_conn = 16;
    let mut kv = KvClient::<ScaleRpc>::connect(&addr).unwrap();
    assert_eq!(kv.max_in_flight(), 7);
    kv.put(0, 1, 1).unwrap();
    // One slot per connection leaves none for the probe.
    let one = ServerConfig {
        slots_per_conn: 1,
        ..small()
    };
    let (_one, mut addr1) = server::<KvService>(&fabric, one);
    match KvClient::<ScaleRpc>::connect(&addr1) {
        Err(RpcError::Transport(e)) => {
            let e = e
                .downcast_ref::<ScaleRpcSetupError>()
                .expect("a ScaleRpcSetupError");
            assert!(matches!(*e, ScaleRpcSetupError::Config(_)), "{e}")
        }
        Err(e) => panic!("expected a configuration error, got {e}"),
        Ok(_) => panic!("expected a configuration error, connected"),
    }
    addr1.probe_interval = None;
    addr1.timeout = Duration::from_millis(100);
    // Without a probe it would connect (nobody polls that server here: a timeout).
    match KvClient::<ScaleRpc>::connect(&addr1) {
        Err(RpcError::Transport(e)) => {
            let e = e
                .downcast_ref::<ScaleRpcSetupError>()
                .expect("a ScaleRpcSetupError");
            assert!(matches!(*e, ScaleRpcSetupError::Timeout(_)), "{e}")
        }
        Err(e) => panic!("expected a timeout, got {e}"),
        Ok(_) => panic!("expected a timeout, connected"),
    }
    let server = h.join().unwrap();
    assert_eq!(server.transport().scale_server().num_conns(), 1);
}

#[test]
fn undecodable_requests_get_error_status() {
    let fabric = Fabric::new(SimConfig::default());
    let (mut server, mut addr) = server::<KvService>(&fabric, small());
    // No liveness probe of our own: the only probe the server answers is the one below.
    addr.probe_interval = None;
    let raw = connect_polling(&mut server, &addr, |a| {
        ScaleRpc::connect(a, KvService::DESCRIPTOR)
    })
    .unwrap();
    // A liveness probe is told by its rpc_type (`RPC_TYPE_PROBE`), not by being empty: the
    // empty call request is a truncated message, answered with an error status.
    scenarios::undecodable_requests_get_error_status(raw, &mut server, |_, server| {
        assert_eq!(server.transport().probes_answered(), 0);
    });
}

#[test]
fn connect_times_out_when_the_server_does_not_poll() {
    scenarios::connect_times_out_when_the_server_does_not_poll(
        &mut fx(),
        |addr| addr.timeout = Duration::from_millis(200),
        |e| {
            matches!(
                e.transport::<ScaleRpcSetupError>(),
                Some(ScaleRpcSetupError::Timeout(_))
            )
        },
    );
}

#[test]
fn bootstrap_from_exchanged_connection_info() {
    let fabric = Fabric::new(SimConfig::default());
    let (mut srv, _) = server::<KvService>(&fabric, small());
    // What an MPI bootstrap does: create, exchange the infos, connect.
    let cfg = ClientConfig {
        max_conns: 1,
        slots_per_conn: 8,
        slot_size: Some(1024),
        fingerprint: KvService::DESCRIPTOR.fingerprint,
        ..ClientConfig::default()
    };
    let mut client = ScaleClient::<u32>::new(&fabric.open(), cfg).unwrap();
    let (c, info) = client.create_conn().unwrap();
    // A mismatching fingerprint is refused by add_client.
    let wrong = rpc::scalerpc::ClientConnInfo {
        fingerprint: 1,
        ..info
    };
    assert!(matches!(
        srv.transport_mut().add_client(&wrong),
        Err(RpcError::SchemaMismatch { found: 1, .. })
    ));
    let theirs = srv.transport_mut().add_client(&info).unwrap();
    client.connect(c, &theirs).unwrap();
    // The wrong service, an unknown connection.
    assert!(matches!(
        ScaleRpc::from_client(
            ScaleClient::<u32>::new(&fabric.open(), cfg).unwrap(),
            0,
            &theirs,
            KvService::DESCRIPTOR
        ),
        Err(e) if e.transport::<ScaleRpcSetupError>().is_some()
    ));
    let t = ScaleRpc::from_client(client, c, &theirs, KvService::DESCRIPTOR)
        .unwrap()
        .with_liveness(Some(Duration::from_millis(100)), None)
        .unwrap();
    assert_eq!(t.max_in_flight(), 7);
    let h = spawn_kv(srv);
    let mut kv = KvClient::from_transport(t);
    kv.put(3, 4, 5).unwrap();
    assert_eq!(kv.get(3, 4).unwrap(), Some(5));
    h.join().unwrap();

    let (mut server2, _) = server::<KvService>(&fabric, small());
    let mut client = ScaleClient::<u32>::new(&fabric.open(), cfg).unwrap();
    let (c, info) = client.create_conn().unwrap();
    let theirs = server2.transport_mut().add_client(&info).unwrap();
    client.connect(c, &theirs).unwrap();
    match ScaleRpc::from_client(client, c, &theirs, EchoService::DESCRIPTOR) {
        Err(RpcError::SchemaMismatch {
            service: "Echo", ..
        }) => {}
        other => panic!("expected SchemaMismatch, got {other:?}"),
    }
}

#[test]
fn server_dropped_mid_run_fails_pending_and_later_calls() {
    // The progress thread stands in for the NIC's retransmission timer: a WQE towards a
    // dead QP fails with retry-exceeded after `retry_cnt` retries.
    let fabric = Fabric::new(SimConfig {
        progress_thread: Some(Duration::from_millis(1)),
        ..SimConfig::default()
    });
    let (mut server, mut addr) = server::<KvService>(&fabric, small());
    addr.probe_interval = Some(Duration::from_millis(20));
    let mut busy = connect_polling(&mut server, &addr, KvClient::<ScaleRpc>::connect).unwrap();
    let mut idle = {
        let mut a = addr.clone();
        a.device = fabric.open();
        connect_polling(&mut server, &a, KvClient::<ScaleRpc>::connect).unwrap()
    };
    // Both work; `busy` has every one of its calls taken by the server, which never answers.
    let depth = busy.max_in_flight() as u64;
    scenarios::both_work_then_busy_unanswered(&mut server, &mut busy, &mut idle, depth, |_, _| {});
    drop(server);
    let t0 = Instant::now();
    // Pending calls: the client sends nothing more, the probe finds the server gone.
    loop {
        match busy.poll() {
            Ok(None) => assert!(t0.elapsed() < FAILS_WITHIN, "pending calls never failed"),
            Err(RpcError::ServerDisconnected) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(busy.transport().probes_sent() >= 1);
    assert!(matches!(busy.get(0, 1), Err(RpcError::ServerDisconnected)));
    assert!(matches!(
        busy.issue(9).get(0, 1),
        Err(RpcError::ServerDisconnected)
    ));
    // The idle client learns it on its next call: its WRITE exhausts its retries.
    assert!(matches!(idle.get(0, 1), Err(RpcError::ServerDisconnected)));
    assert!(matches!(
        idle.put(0, 1, 2),
        Err(RpcError::ServerDisconnected)
    ));
    assert_eq!(idle.transport().probes_sent(), 0);
    assert!(t0.elapsed() < FAILS_WITHIN, "{:?}", t0.elapsed());
}

#[test]
fn server_dropped_with_several_groups_no_client_hangs() {
    // One connection per group, and a slice far longer than the test: the first client's
    // group stays active, the second waits for its turn. After the server is gone, the active one's WRITE fails and the waiting one, never scheduled again, gives up
    // after its activation timeout: both get ServerDisconnected.
    let fabric = Fabric::new(SimConfig {
        progress_thread: Some(Duration::from_millis(1)),
        ..SimConfig::default()
    });
    let cfg = ServerConfig {
        group_size: GroupSize::Fixed(1),
        slice: Duration::from_secs(3600),
        ..small()
    };
    let (mut server, mut addr) = server::<KvService>(&fabric, cfg);
    addr.activation_timeout = Some(Duration::from_millis(300));
    let mut active = connect_polling(&mut server, &addr, KvClient::<ScaleRpc>::connect).unwrap();
    addr.device = fabric.open();
    let mut waiting = connect_polling(&mut server, &addr, KvClient::<ScaleRpc>::connect).unwrap();
    assert!(active.transport().is_active());
    assert!(!waiting.transport().is_active());
    assert_eq!(
        server.transport().scale_server().scheduler().num_groups(),
        2
    );
    drop(server);
    let t0 = Instant::now();
    assert!(matches!(
        active.get(0, 1),
        Err(RpcError::ServerDisconnected)
    ));
    let t1 = Instant::now();
    assert!(matches!(
        waiting.get(0, 1),
        Err(RpcError::ServerDisconnected)
    ));
    assert!(t1.elapsed() >= Duration::from_millis(300));
    assert!(t0.elapsed() < FAILS_WITHIN, "{:?}", t0.elapsed());
    // Later calls fail at once.
    let t2 = Instant::now();
    assert!(matches!(
        waiting.put(0, 1, 1),
        Err(RpcError::ServerDisconnected)
    ));
    assert!(t2.elapsed() < Duration::from_millis(100));
}

#[test]
fn late_replies_are_dropped_and_a_stopped_server_fails_calls_by_deadline() {
    let fabric = Fabric::new(SimConfig::default());
    let (server, addr) = server::<KvService>(&fabric, small());
    let late = typed_common::spawn_late(server);
    let mut kv = KvClient::<ScaleRpc>::connect(&addr).unwrap();
    let took = typed_common::late_and_stopped_server(&mut kv, &late);
    eprintln!("scalerpc: call to a stopped server failed after {took:?} (deadline 100 ms)");
    late.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    late.handle.join().unwrap();
}

/// Typed clients that connect, call and are dropped, many more than `max_conns` while one
/// resident client holds a connection: dropping a `ScaleRpc` says goodbye, and the server
/// reclaims the connection (QP, slots, id), so every new client is accepted.
#[test]
fn typed_client_churn_beyond_max_conns() {
    const MAX: u32 = 2;
    let fabric = Fabric::new(SimConfig::default());
    let cfg = ServerConfig {
        max_conns: MAX,
        ..small()
    };
    let (server, addr) = server::<KvService>(&fabric, cfg);
    let h = spawn_kv(server);
    let mut resident = KvClient::<ScaleRpc>::connect(&addr).unwrap();
    resident.put(0, 0, 1).unwrap();
    let rounds = 5 * MAX as u64;
    for round in 0..rounds {
        let mut kv = KvClient::<ScaleRpc>::connect(&addr)
            .unwrap_or_else(|e| panic!("round {round}: connect refused: {e}"));
        kv.put(0, round + 1, round).unwrap();
        assert_eq!(kv.get(0, round + 1).unwrap(), Some(round));
        assert_eq!(resident.get(0, 0).unwrap(), Some(1));
    }
    drop(resident);
    let mut server = h.join().unwrap();
    // The last goodbyes are in the server's CQ (a dropped client waits until its goodbye
    // completed): one more poll reads them.
    server.poll();
    let st = *server.transport().scale_server().stats();
    assert_eq!(st.disconnects, rounds + 1, "{st:?}");
    assert_eq!(st.reclaimed, rounds + 1, "{st:?}");
    assert_eq!(st.failed_conns, 0, "{st:?}");
    assert_eq!(server.transport().scale_server().num_conns(), 0);
}

/// A typed client that stops polling through its group's stop is evicted; its next call
/// fails at once with the eviction error (before: `WouldBlock` while the connection sat
/// "stopped" for ever, until the activation timeout).
#[test]
fn evicted_typed_client_fails_with_a_clear_error() {
    let fabric = Fabric::new(SimConfig::default());
    let cfg = ServerConfig {
        group_size: GroupSize::Fixed(1),
        slice: Duration::from_micros(200),
        warmup: Duration::from_micros(50),
        ack_timeout: Duration::from_millis(20),
        ..small()
    };
    let (mut server, mut addr) = server::<KvService>(&fabric, cfg);
    // No activation timeout: only the eviction notice can end the wait.
    addr.activation_timeout = None;
    let mut sleeper = connect_polling(&mut server, &addr, KvClient::<ScaleRpc>::connect).unwrap();
    let mut addr2 = addr.clone();
    addr2.device = fabric.open();
    let mut worker = connect_polling(&mut server, &addr2, KvClient::<ScaleRpc>::connect).unwrap();
    let mut store = Store::default();
    let conn = sleeper.transport().conn();
    assert_eq!(conn, 0);
    // The sleeper stops polling; the server and the other client keep running until the
    // sleeper (which never acknowledges its stop) is evicted.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut k = 0;
    while server.transport().scale_server().stats().reclaimed == 0 {
        assert!(Instant::now() < deadline, "never evicted");
        if worker.in_flight() == 0 {
            match worker.issue(k).put(0, k, k) {
                Ok(()) => k += 1,
                Err(RpcError::WouldBlock) => {} // its group is not scheduled yet
                Err(e) => panic!("worker: {e}"),
            }
        }
        server.serve_once(|req| KvService::dispatch(&mut store, req));
        worker.poll().unwrap();
    }
    assert!(k > 0);
    assert_eq!(
        server
            .transport()
            .scale_server()
            .scheduler()
            .stats()
            .evictions,
        1
    );
    match sleeper.get(0, 1) {
        Err(e)
            if matches!(
                e.transport::<ScaleRpcSetupError>(),
                Some(ScaleRpcSetupError::Evicted)
            ) => {}
        other => panic!("expected the eviction error, got {other:?}"),
    }
    assert!(matches!(
        sleeper.put(0, 1, 1),
        Err(e) if matches!(e.transport::<ScaleRpcSetupError>(), Some(ScaleRpcSetupError::Evicted))
    ));
}

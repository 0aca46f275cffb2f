//! Generated stubs and server traits end to end over copyrpc, on the software device model.

mod typed_common;

use typed_common::connect_polling_to as connect_polling;
use typed_common::scenarios::{self, Fixture};
use typed_common::{Store, spawn, spawn_kv};

use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use idl::echo::{EchoClient, EchoRequest, EchoResponse, EchoService};
use idl::kv::{KvClient, KvResponse, KvService};
use rpc::copyrpc::{
    ClientContext, ConnectRefusal, Context, ContextConfig, Copyrpc, CopyrpcAddr, CopyrpcServer,
    CopyrpcSetupError, EndpointConfig, EndpointFailure, EndpointState,
};
use rpc::mlx5::sim::{Fabric, SimConfig};
use rpc::wire::Status;
use rpc::{Client, ClientTransport, RpcError, Server, Service};

/// Rings of 64 KiB keep the many contexts of these tests small; the default is 1 MiB.
fn small_rings() -> EndpointConfig {
    EndpointConfig {
        ring_size: 1 << 16,
        ..EndpointConfig::default()
    }
}

/// A server of `S` on its own device, and the address clients on `fabric` connect to.
fn server<S: Service>(fabric: &Fabric) -> (Server<S, CopyrpcServer>, CopyrpcAddr) {
    let server =
        CopyrpcServer::serve::<S>(&fabric.open(), ContextConfig::default(), small_rings()).unwrap();
    let mut addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    addr.endpoint = small_rings();
    (server, addr)
}

/// A raw (untyped) copyrpc client transport of `S`, connected while this thread polls
/// `server`.
fn raw_client<S: Service>(server: &mut Server<S, CopyrpcServer>, addr: &CopyrpcAddr) -> Copyrpc {
    let addr = addr.clone();
    typed_common::connect_polling(server, move || {
        Copyrpc::connect(&addr, S::DESCRIPTOR).unwrap()
    })
}

/// copyrpc on one software fabric, servers with 64 KiB rings ([`server`]).
struct Fx(Fabric);

impl Fixture for Fx {
    type Client = Copyrpc;
    type Server = CopyrpcServer;
    type Addr = CopyrpcAddr;
    fn server<S: Service>(&mut self) -> (Server<S, CopyrpcServer>, CopyrpcAddr) {
        server::<S>(&self.0)
    }
}

fn fx() -> Fx {
    Fx(Fabric::new(SimConfig::default()))
}

#[test]
fn blocking_calls() {
    let mut fx = fx();
    let b = scenarios::blocking_calls(&mut fx);
    assert_eq!(b.server.transport().context().num_endpoints(), 1);
}

#[test]
fn pipelined_depth_32_100k_calls_all_matched() {
    let mut fx = fx();
    let p = scenarios::pipelined_echo(&mut fx, 100_000, Duration::from_secs(300));
    assert_eq!(p.echo.max_in_flight(), 32);
    let stats = *p.echo.transport().context().stats();
    assert!(
        stats.wrap_markers > 0,
        "the send ring never wrapped: {stats:?}"
    );
    eprintln!("would_block = {}, client stats: {stats:?}", p.would_block);
}

#[test]
fn deferred_replies_in_reverse_order() {
    let fabric = Fabric::new(SimConfig::default());
    let (mut server, addr) = server::<KvService>(&fabric);
    let mut kv = connect_polling(&mut server, &addr, KvClient::<Copyrpc>::connect).unwrap();
    let taken = scenarios::take_deferred_gets(&mut kv, &mut server, 8, true);
    assert_eq!(
        taken.iter().map(|t| t.1).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    for &(token, key) in taken.iter().rev() {
        server
            .reply(token, &KvResponse::Get(Some(key * 10)))
            .unwrap();
    }
    // Replies go out with the next flush (or poll).
    server.flush();
    let mut got = Vec::new();
    scenarios::await_deferred_replies(&mut kv, &mut got, 8, || {});
    // All eight came in one batch, in reply order: one delivered per poll, the rest stashed.
    assert_eq!(got, (0..8).rev().collect::<Vec<_>>());
}

#[test]
fn eight_clients_on_one_server() {
    const CLIENTS: u64 = 8;
    const CALLS: u64 = 10_000;
    let fabric = Fabric::new(SimConfig::default());
    let (server, mut addr) = server::<EchoService>(&fabric);
    addr.max_in_flight = 16;
    let h = spawn(server, |req| {
        EchoService::dispatch(&mut idl::echo::Echoer, req)
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let mut addr = addr.clone();
            addr.device = fabric.open();
            thread::spawn(move || {
                let mut echo = EchoClient::<Copyrpc>::connect(&addr).unwrap();
                let depth = echo.max_in_flight();
                let mut seen = vec![false; CALLS as usize];
                let (mut next, mut done) = (0u64, 0u64);
                while done < CALLS {
                    while next < CALLS && echo.in_flight() < depth {
                        match echo.issue(next).ping((c << 32) | next) {
                            Ok(()) => next += 1,
                            Err(RpcError::WouldBlock) => break,
                            Err(e) => panic!("{e}"),
                        }
                    }
                    done += echo
                        .poll_with(|tag, r| {
                            let EchoResponse::Ping(v) = r.unwrap() else {
                                panic!("wrong variant")
                            };
                            assert_eq!(v, (c << 32) | tag, "response matched to the wrong call");
                            assert!(
                                !std::mem::replace(&mut seen[tag as usize], true),
                                "duplicate response"
                            );
                        })
                        .unwrap() as u64;
                }
                // Blocking calls on the same connection still work.
                assert_eq!(echo.ping(c).unwrap(), c);
                done
            })
        })
        .collect();
    let total: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert_eq!(total, CLIENTS * CALLS);
    let server = h.join().unwrap();
    assert_eq!(server.stats().requests, CLIENTS * (CALLS + 1));
    assert_eq!(
        server.transport().context().num_endpoints(),
        CLIENTS as usize
    );
}

#[test]
fn schema_mismatch_fails_at_connect() {
    let mut fx = fx();
    let server = scenarios::schema_mismatch_fails_at_connect(&mut fx, |_, _| {});
    // The refused client left no endpoint behind.
    assert_eq!(server.transport().context().num_endpoints(), 1);
}

#[test]
fn capacity_is_checked() {
    let fabric = Fabric::new(SimConfig::default());
    // A 1 KiB ring (256 B of credit) carries requests of at most
    // ((512 - 256 - 32) & !31) - 12 = 212 B (`max_payload_for`); echo256 requests are 264 B.
    let tiny = EndpointConfig {
        ring_size: 1024,
        ..EndpointConfig::default()
    };
    match CopyrpcServer::serve::<EchoService>(&fabric.open(), ContextConfig::default(), tiny) {
        Err(RpcError::CapacityMismatch {
            service: "Echo",
            what: rpc::MessageKind::Request,
            side: rpc::LimitSide::ThisServer,
            setting: "copyrpc EndpointConfig::ring_size",
            cap: 212,
            need: 264,
            // 2 KiB: ((1024 - 512 - 32) & !31) - 12 = 468 B of payload, 512 B of credit.
            min: Some(2048),
        }) => {}
        Err(e) => panic!("expected CapacityMismatch, got {e}"),
        Ok(_) => panic!("expected CapacityMismatch, got a server"),
    }
    // A 2 KiB ring limited to 256 B of credit carries the messages (724 B) but its credit
    // does not cover one echo256 response (320 B with its metadata).
    let stingy = EndpointConfig {
        ring_size: 2048,
        max_resp_reservation: Some(256),
        ..EndpointConfig::default()
    };
    match CopyrpcServer::serve::<EchoService>(&fabric.open(), ContextConfig::default(), stingy) {
        Err(RpcError::CapacityMismatch {
            service: "Echo",
            what: rpc::MessageKind::Response,
            side: rpc::LimitSide::ThisServer,
            setting: "copyrpc EndpointConfig::max_resp_reservation (credit: at most ring_size / 4)",
            cap: 256,
            need: 320,
            min: Some(320),
        }) => {}
        Err(e) => panic!("expected CapacityMismatch, got {e}"),
        Ok(_) => panic!("expected CapacityMismatch, got a server"),
    }
    // A client ring too small for the 16 KiB of credit the server (64 KiB rings) announces
    // is refused; so is a client ring larger than the server's (its credit does not fit).
    let (server, mut addr) = server::<KvService>(&fabric);
    let h = spawn_kv(server);
    addr.endpoint = tiny;
    match KvClient::<Copyrpc>::connect(&addr) {
        Err(RpcError::CapacityMismatch {
            service: "Kv",
            what: rpc::MessageKind::Response,
            side: rpc::LimitSide::ThisClient,
            setting: "copyrpc EndpointConfig::ring_size",
            cap: 256,
            need: 16384,
            min: Some(65536),
        }) => {}
        Err(e) => panic!("expected CapacityMismatch, got {e}"),
        Ok(_) => panic!("expected CapacityMismatch, connected"),
    }
    addr.endpoint.ring_size = 1 << 20;
    match KvClient::<Copyrpc>::connect(&addr) {
        Err(RpcError::Transport(e)) => {
            let e = e
                .downcast_ref::<CopyrpcSetupError>()
                .expect("a CopyrpcSetupError");
            assert!(
                matches!(e, CopyrpcSetupError::Refused(ConnectRefusal::Setup(_))),
                "{e}"
            )
        }
        Err(e) => panic!("expected a refusal, got {e}"),
        Ok(_) => panic!("expected a refusal, connected"),
    }
    // Neither left an endpoint behind; matching rings connect.
    addr.endpoint = small_rings();
    KvClient::<Copyrpc>::connect(&addr)
        .unwrap()
        .put(0, 1, 1)
        .unwrap();
    let server = h.join().unwrap();
    assert_eq!(server.transport().context().num_endpoints(), 1);
}

#[test]
fn undecodable_requests_get_error_status() {
    let fabric = Fabric::new(SimConfig::default());
    let (mut server, addr) = server::<KvService>(&fabric);
    let raw = raw_client(&mut server, &addr);
    scenarios::undecodable_requests_get_error_status(raw, &mut server, |_, _| {});
}

#[test]
fn connect_times_out_when_the_server_does_not_poll() {
    scenarios::connect_times_out_when_the_server_does_not_poll(
        &mut fx(),
        |addr| addr.timeout = Duration::from_millis(200),
        |e| {
            matches!(
                e.transport::<CopyrpcSetupError>(),
                Some(CopyrpcSetupError::Timeout(_))
            )
        },
    );
}

#[test]
fn bootstrap_from_exchanged_endpoint_info() {
    let fabric = Fabric::new(SimConfig::default());
    let (mut server, _) = server::<KvService>(&fabric);
    // What an MPI bootstrap does: create, exchange the 96-byte infos, connect.
    let mut ctx = Context::<u32>::new(&fabric.open(), ContextConfig::default()).unwrap();
    let ep = ctx
        .create_endpoint(&EndpointConfig {
            fingerprint: KvService::DESCRIPTOR.fingerprint,
            ..small_rings()
        })
        .unwrap();
    let mine = ctx.local_info(ep).unwrap().to_bytes();
    let client_info = rpc::copyrpc::EndpointInfo::from_bytes(&mine).unwrap();
    let (_, theirs) = server.transport_mut().add_endpoint(&client_info).unwrap();
    ctx.connect(ep, &theirs).unwrap();
    // A mismatching fingerprint is refused by add_endpoint.
    let wrong = rpc::copyrpc::EndpointInfo {
        fingerprint: 1,
        ..client_info
    };
    assert!(matches!(
        server.transport_mut().add_endpoint(&wrong),
        Err(RpcError::SchemaMismatch { found: 1, .. })
    ));
    let t = Copyrpc::from_context(ctx, ep, KvService::DESCRIPTOR, 8)
        .unwrap()
        .with_probe(&theirs, Duration::from_millis(100))
        .unwrap();
    let h = spawn_kv(server);
    let mut kv = KvClient::from_transport(t);
    kv.put(3, 4, 5).unwrap();
    assert_eq!(kv.get(3, 4).unwrap(), Some(5));
    assert_eq!(kv.max_in_flight(), 8);
    h.join().unwrap();
}

#[test]
fn from_context_rejects_the_wrong_service() {
    let fabric = Fabric::new(SimConfig::default());
    let (mut server, _) = server::<KvService>(&fabric);
    let mut ctx = Context::<u32>::new(&fabric.open(), ContextConfig::default()).unwrap();
    let ep = ctx
        .create_endpoint(&EndpointConfig {
            fingerprint: KvService::DESCRIPTOR.fingerprint,
            ..small_rings()
        })
        .unwrap();
    // Not connected yet.
    let (_, theirs) = server
        .transport_mut()
        .add_endpoint(&ctx.local_info(ep).unwrap())
        .unwrap();
    ctx.connect(ep, &theirs).unwrap();
    match Copyrpc::from_context(ctx, ep, EchoService::DESCRIPTOR, 8) {
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
    let (mut server, mut addr) = server::<KvService>(&fabric);
    addr.probe_interval = Some(Duration::from_millis(20));
    let mut busy = connect_polling(&mut server, &addr, KvClient::<Copyrpc>::connect).unwrap();
    let mut idle = {
        let mut a = addr.clone();
        a.device = fabric.open();
        connect_polling(&mut server, &a, KvClient::<Copyrpc>::connect).unwrap()
    };
    // Both work; `busy` has four calls the server took and never answers.
    scenarios::both_work_then_busy_unanswered(&mut server, &mut busy, &mut idle, 4, |_, _| {});
    drop(server);
    let t0 = Instant::now();
    // Pending calls: the client sends nothing more, the probe finds the server gone.
    loop {
        match busy.poll() {
            Ok(None) => assert!(
                t0.elapsed() < Duration::from_secs(10),
                "pending calls never failed"
            ),
            Err(RpcError::ServerDisconnected) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(matches!(busy.get(0, 1), Err(RpcError::ServerDisconnected)));
    assert!(matches!(
        busy.issue(9).get(0, 1),
        Err(RpcError::ServerDisconnected)
    ));
    // The idle client learns it on its next call: its WRITE+IMM exhausts its retries.
    assert!(matches!(idle.get(0, 1), Err(RpcError::ServerDisconnected)));
    assert!(matches!(
        idle.put(0, 1, 2),
        Err(RpcError::ServerDisconnected)
    ));
    assert!(t0.elapsed() < Duration::from_secs(10));
    for (who, kv) in [("busy", &busy), ("idle", &idle)] {
        let t = kv.transport();
        let state = t.context().endpoint_state(t.endpoint());
        eprintln!("{who}: {state:?} {:?}", t.context().stats());
        assert!(
            matches!(
                state,
                Some(EndpointState::Failed(EndpointFailure::Completion(_)))
            ),
            "{who}: {state:?}"
        );
    }
    // The busy client noticed through its probe READ.
    assert!(busy.transport().context().stats().raw_posted >= 1);
    assert_eq!(idle.transport().context().stats().raw_posted, 0);
}

#[test]
fn credit_exhaustion_is_backpressure() {
    // 8 KiB rings: 2 KiB of response credit covers 6 echo256 responses (320 B each), far
    // fewer than the 32 tokens; calls beyond that get WouldBlock until credit returns.
    const CALLS: u64 = 20_000;
    let fabric = Fabric::new(SimConfig::default());
    let cfg = EndpointConfig {
        ring_size: 8192,
        ..EndpointConfig::default()
    };
    let server =
        CopyrpcServer::serve::<EchoService>(&fabric.open(), ContextConfig::default(), cfg).unwrap();
    let mut addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    addr.endpoint = cfg;
    let h = spawn(server, |req| {
        EchoService::dispatch(&mut idl::echo::Echoer, req)
    });
    let mut echo = EchoClient::<Copyrpc>::connect(&addr).unwrap();
    let (mut next, mut done, mut would_block) = (0u64, 0u64, 0u64);
    let mut max_in_flight = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while done < CALLS {
        assert!(Instant::now() < deadline, "stalled at {done}");
        while next < CALLS {
            match echo.issue(next).echo256([next as u8; 256]) {
                Ok(()) => next += 1,
                Err(RpcError::WouldBlock) => {
                    would_block += 1;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        max_in_flight = max_in_flight.max(echo.in_flight());
        if next % 1000 == 0 {
            // Blocking calls wait out the back-pressure themselves.
            assert_eq!(echo.ping(next).unwrap(), next);
        }
        done += echo
            .poll_with(|tag, r| assert_eq!(r.unwrap(), EchoResponse::Echo256([tag as u8; 256])))
            .unwrap() as u64;
    }
    h.join().unwrap();
    let stats = *echo.transport().context().stats();
    assert!(
        would_block > 0 && stats.insufficient_credit > 0,
        "{stats:?}"
    );
    assert!(
        max_in_flight <= 7,
        "{max_in_flight} calls in flight on 2 KiB of credit"
    );
    assert_eq!(stats.failed_endpoints, 0);
}

#[test]
fn client_dropped_mid_run_does_not_disturb_the_server() {
    let fabric = Fabric::new(SimConfig {
        progress_thread: Some(Duration::from_millis(1)),
        ..SimConfig::default()
    });
    let (mut server, addr) = server::<KvService>(&fabric);
    let mut gone = connect_polling(&mut server, &addr, KvClient::<Copyrpc>::connect).unwrap();
    let mut stays = {
        let mut a = addr.clone();
        a.device = fabric.open();
        connect_polling(&mut server, &a, KvClient::<Copyrpc>::connect).unwrap()
    };
    for k in 0..4 {
        gone.issue(k).get(0, k).unwrap();
    }
    let mut taken = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while taken.len() < 4 {
        assert!(Instant::now() < deadline, "requests did not arrive");
        assert!(gone.poll().unwrap().is_none());
        server.poll();
        while let Some((token, _)) = server.recv() {
            taken.push(token);
        }
    }
    drop(gone);
    // The first reply is written (the server cannot know yet); its WRITE+IMM fails with
    // retry-exceeded, which fails that client's endpoint only. Wait (bounded) until the
    // server has noticed: replying twice to one token would also be refused (stale token),
    // so only a noticed failure makes the remaining replies a test of a dead client.
    server.reply(taken[0], &KvResponse::Get(None)).unwrap();
    server.flush();
    let mut store = Store::default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.transport().context().stats().failed_endpoints == 0 {
        assert!(
            Instant::now() < deadline,
            "the dead client was never noticed"
        );
        server.poll();
        thread::sleep(Duration::from_millis(1));
    }
    let mut dropped = 0;
    for &t in &taken[1..] {
        if server.reply(t, &KvResponse::Get(None)).is_err() {
            dropped += 1;
        }
    }
    assert_eq!(dropped, 3);
    assert_eq!(server.stats().dropped_replies, 3);
    // The other client is served as before.
    stays.issue(1).put(0, 5, 6).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline);
        server.serve_once(|req| KvService::dispatch(&mut store, req));
        if let Some(r) = stays.poll().unwrap() {
            assert_eq!(r, (1, KvResponse::Put(())));
            break;
        }
    }
    assert_eq!(server.transport().context().stats().failed_endpoints, 1);
}

#[test]
fn late_replies_are_dropped_and_a_stopped_server_fails_calls_by_deadline() {
    let fabric = Fabric::new(SimConfig::default());
    let (server, mut addr) = server::<KvService>(&fabric);
    // Two tokens: the calls after the two expired ones must reuse theirs.
    addr.max_in_flight = 2;
    let late = typed_common::spawn_late(server);
    let mut kv = KvClient::<Copyrpc>::connect(&addr).unwrap();
    let took = typed_common::late_and_stopped_server(&mut kv, &late);
    eprintln!("copyrpc: call to a stopped server failed after {took:?} (deadline 100 ms)");
    late.stop.store(true, Ordering::Relaxed);
    late.handle.join().unwrap();
}

/// A service whose request and response each carry 1 MiB (issue 15): four times the
/// inline limit of the default 1 MiB ring, so both travel by rendezvous.
#[rpc::rpc_service(transport = "copyrpc")]
pub trait Blob {
    /// Sum of the bytes of `data`.
    fn digest(&self, data: [u8; 1048576]) -> u64;
    /// 1 MiB of bytes derived from `seed`.
    fn fill(&self, seed: u64) -> [u8; 1048576];
    /// `x + 1`: a small call of the same service.
    fn inc(&self, x: u64) -> u64;
}

struct BlobStore;

fn blob_byte(seed: u64, i: usize) -> u8 {
    (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 253) as u8
}

impl BlobServer for BlobStore {
    fn digest(&self, data: [u8; 1048576]) -> u64 {
        data.iter().map(|&b| u64::from(b)).sum()
    }
    fn fill(&self, seed: u64) -> [u8; 1048576] {
        let mut out = [0u8; 1048576];
        for (i, b) in out.iter_mut().enumerate() {
            *b = blob_byte(seed, i);
        }
        out
    }
    fn inc(&self, x: u64) -> u64 {
        x + 1
    }
}

/// Requests and responses of 1 MiB over the typed `Copyrpc` client with the default
/// configuration (1 MiB rings, 8 MiB large-message limit): the service is accepted at
/// connect, contents arrive intact in both directions, each large message is one
/// rendezvous READ, and a small call of the same service stays inline. The client and the
/// server run on threads with 64 MiB stacks (the 1 MiB arrays travel by value).
#[test]
fn one_mib_arguments_and_results_by_rendezvous() {
    const STACK: usize = 64 << 20;
    let fabric = Fabric::new(SimConfig::default());
    let cap = 262_100; // inline limit of the default ring
    assert!(BlobService::DESCRIPTOR.max_request_bytes > 4 * cap);
    assert!(BlobService::DESCRIPTOR.max_response_bytes > 4 * cap);
    let server = CopyrpcServer::serve::<BlobService>(
        &fabric.open(),
        ContextConfig::default(),
        EndpointConfig::default(),
    )
    .unwrap();
    let mut addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    // The client keeps one response buffer of max_response_bytes per call in flight.
    addr.max_in_flight = 2;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    let srv = thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || {
            let mut server = server;
            let limit = Instant::now() + Duration::from_secs(120);
            while !st.load(Ordering::Acquire) && Instant::now() < limit {
                server.serve_once(|req| BlobService::dispatch(&mut BlobStore, req));
            }
            server
        })
        .unwrap();
    let client = thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || {
            let mut blob = BlobClient::<Copyrpc>::connect(&addr).unwrap();
            let mut data = Box::new([0u8; 1048576]);
            for (i, b) in data.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            let want: u64 = data.iter().map(|&b| u64::from(b)).sum();
            assert_eq!(blob.digest(*data).unwrap(), want);
            data[1048575] = 250;
            let last = (1048575 % 251) as u64;
            assert_eq!(blob.digest(*data).unwrap(), want - last + 250);
            for seed in [1u64, 2] {
                let got = blob.fill(seed).unwrap();
                assert!(
                    got.iter()
                        .enumerate()
                        .all(|(i, &b)| b == blob_byte(seed, i)),
                    "fill({seed}) arrives intact"
                );
            }
            let before = *blob.transport().context().stats();
            assert_eq!(blob.inc(41).unwrap(), 42);
            let s = *blob.transport().context().stats();
            assert_eq!(
                s.rendezvous_sent, before.rendezvous_sent,
                "a small call stays inline"
            );
            assert_eq!(s.rendezvous_read, before.rendezvous_read);
            // Two large requests sent, two large responses read.
            assert_eq!((s.rendezvous_sent, s.rendezvous_read), (2, 2));
            // Each response: the 1 MiB array plus the wire header.
            assert_eq!(
                s.rendezvous_bytes,
                2 * BlobService::DESCRIPTOR.max_response_bytes as u64
            );
            assert_eq!(s.bad_descriptors + s.rendezvous_read_errors, 0);
        })
        .unwrap();
    let r = client.join();
    stop.store(true, Ordering::Release);
    let server = srv.join().unwrap();
    r.unwrap();
    let s = server.transport().context().stats();
    assert_eq!((s.rendezvous_sent, s.rendezvous_read), (2, 2));
    assert_eq!(s.bad_descriptors + s.rendezvous_read_errors, 0);
}

/// Variable-length data beyond the inline limit of 4 KiB rings (980 B): replies and
/// requests of this service go inline or by rendezvous depending on their size (issue 15).
#[rpc::rpc_service(transport = "copyrpc", derive(Debug, PartialEq), max_var_bytes = 2048)]
pub trait Var {
    /// Returns `data`.
    fn echo(&self, data: &[u8]) -> Vec<u8>;
    /// `n` bytes of `7`.
    fn fill(&self, n: u32) -> Vec<u8>;
    /// Sum of the bytes of `data`.
    fn total(&self, data: &[u8]) -> u64;
}

/// Variable-length data whose largest reply fits inline on 4 KiB rings: every reply is
/// written straight into the send ring.
#[rpc::rpc_service(transport = "copyrpc", derive(Debug, PartialEq), max_var_bytes = 900)]
pub trait Short {
    /// Returns `data`.
    fn echo(&self, data: &[u8]) -> Vec<u8>;
    /// `n` bytes of `7`.
    fn fill(&self, n: u32) -> Vec<u8>;
}

/// Counts the calls its handlers ran.
#[derive(Default)]
struct VarState(std::cell::Cell<u64>);

impl VarServer for VarState {
    fn echo(&self, data: &[u8]) -> Vec<u8> {
        self.0.set(self.0.get() + 1);
        data.to_vec()
    }
    fn fill(&self, n: u32) -> Vec<u8> {
        self.0.set(self.0.get() + 1);
        vec![7; n as usize]
    }
    fn total(&self, data: &[u8]) -> u64 {
        self.0.set(self.0.get() + 1);
        data.iter().map(|&b| u64::from(b)).sum()
    }
}

impl ShortServer for VarState {
    fn echo(&self, data: &[u8]) -> Vec<u8> {
        self.0.set(self.0.get() + 1);
        data.to_vec()
    }
    fn fill(&self, n: u32) -> Vec<u8> {
        self.0.set(self.0.get() + 1);
        vec![7; n as usize]
    }
}

fn rings_4k() -> EndpointConfig {
    EndpointConfig {
        ring_size: 4096,
        ..EndpointConfig::default()
    }
}

fn var_pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

/// A server of `S` on 4 KiB rings (`server_cfg`) and a client of it connected on this
/// thread's fabric.
fn server_4k<S: Service>(
    fabric: &Fabric,
    server_cfg: EndpointConfig,
) -> (Server<S, CopyrpcServer>, CopyrpcAddr) {
    let server =
        CopyrpcServer::serve::<S>(&fabric.open(), ContextConfig::default(), server_cfg).unwrap();
    let mut addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    addr.endpoint = rings_4k();
    (server, addr)
}

/// Serves `server` with `Server::serve_once_raw` on this thread until `poll` yields
/// something (at most 10 s) and returns it.
fn serve_raw_until<S: Service, R>(
    server: &mut Server<S, CopyrpcServer>,
    state: &mut VarState,
    mut dispatch: impl FnMut(&mut VarState, &[u8], &mut [u8]) -> Result<usize, rpc::wire::WireError>,
    mut poll: impl FnMut() -> Option<R>,
) -> R {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no response within 10 s");
        server.serve_once_raw(|msg, out| dispatch(state, msg, out));
        if let Some(r) = poll() {
            return r;
        }
    }
}

/// One pipelined call of `Var` served with `serve_once_raw` on this thread.
fn var_call(
    server: &mut Server<VarService, CopyrpcServer>,
    state: &mut VarState,
    c: &mut VarClient<Copyrpc>,
    issue: impl FnOnce(&mut VarClient<Copyrpc>),
) -> Result<VarResponse, RpcError> {
    issue(c);
    serve_raw_until(server, state, VarService::dispatch_raw, || {
        c.poll().transpose()
    })
    .map(|(_, r)| r)
}

/// The copyrpc server's zero-copy `serve_next` through a typed server's `serve_once_raw`,
/// for a service whose largest reply exceeds the inline limit (the client accepts
/// rendezvous replies): echoes of 0 B, 1 B, the largest reply that fits inline, one byte
/// more (by rendezvous, with a rendezvous request too) and the service's largest; a large
/// reply to a small request and a small reply to a large request; and a result over
/// `max_var_bytes`, answered `ResponseTooLarge` and counted. The ring positions show each
/// request's space released.
#[test]
fn zero_copy_serve_with_replies_beyond_the_inline_limit() {
    let fabric = Fabric::new(SimConfig::default());
    let (mut server, addr) = server_4k::<VarService>(&fabric, rings_4k());
    let mut c = connect_polling(&mut server, &addr, VarClient::<Copyrpc>::connect).unwrap();
    let mut state = VarState::default();
    let ep = c.transport().endpoint();
    let (large_call_credit, max_payload) = {
        let ctx = c.transport().context();
        let core = ctx.endpoint(ep).unwrap();
        (core.large_call_credit(), core.max_payload())
    };
    // The largest reply that fits the allowance a call accepting rendezvous replies
    // reserves: its payload plus header, padded, plus one flow metadata.
    use rpc::copyrpc::encoding::{FLOW_METADATA_SIZE, HEADER_SIZE};
    let inline_max = large_call_credit as usize - FLOW_METADATA_SIZE as usize - HEADER_SIZE;
    assert_eq!(inline_max, max_payload as usize);
    let overhead = VarService::DESCRIPTOR.max_response_bytes - 2048;
    assert_eq!(overhead, VarService::DESCRIPTOR.max_request_bytes - 2048);
    assert!(VarService::DESCRIPTOR.max_response_bytes > inline_max);
    let d_max = inline_max - overhead;

    let server_stats = |s: &Server<VarService, CopyrpcServer>| *s.transport().context().stats();
    let mut answered = 0;
    for (n, large) in [
        (0, false),
        (1, false),
        (d_max, false),
        (d_max + 1, true),
        (2048, true),
    ] {
        let before = (server_stats(&server), *c.transport().context().stats());
        let released = |s: &Server<VarService, CopyrpcServer>| {
            s.transport().context().endpoint(0).unwrap().positions().2
        };
        let released_before = released(&server);
        let d = var_pattern(n);
        let got = var_call(&mut server, &mut state, &mut c, |c| {
            c.issue(n as u64).echo(&d).unwrap();
        })
        .unwrap();
        answered += 1;
        assert_eq!(got, VarResponse::Echo(d), "echo of {n} B");
        let (s, cs) = (server_stats(&server), *c.transport().context().stats());
        let by_rdv = u64::from(large);
        assert_eq!(
            s.rendezvous_sent - before.0.rendezvous_sent,
            by_rdv,
            "{n} B reply"
        );
        assert_eq!(
            cs.rendezvous_read - before.1.rendezvous_read,
            by_rdv,
            "{n} B reply"
        );
        // The request is exactly as large as the reply.
        assert_eq!(
            cs.rendezvous_sent - before.1.rendezvous_sent,
            by_rdv,
            "{n} B request"
        );
        assert_eq!(
            s.rendezvous_read - before.0.rendezvous_read,
            by_rdv,
            "{n} B request"
        );
        // Answered, then its ring space released.
        assert!(
            released(&server) > released_before,
            "{n} B: request released"
        );
    }
    // A large reply to a small request, a small reply to a large request.
    let before = server_stats(&server);
    let n = (d_max + 1) as u32;
    let got = var_call(&mut server, &mut state, &mut c, |c| {
        c.issue(1).fill(n).unwrap();
    });
    assert_eq!(got.unwrap(), VarResponse::Fill(vec![7; n as usize]));
    let data = var_pattern(2048);
    let got = var_call(&mut server, &mut state, &mut c, |c| {
        c.issue(2).total(&data).unwrap();
    });
    let want: u64 = data.iter().map(|&b| u64::from(b)).sum();
    assert_eq!(got.unwrap(), VarResponse::Total(want));
    answered += 2;
    let s = server_stats(&server);
    assert_eq!(s.rendezvous_sent - before.rendezvous_sent, 1);
    assert_eq!(s.rendezvous_read - before.rendezvous_read, 1);
    // A result over max_var_bytes: refused with ResponseTooLarge, counted, no panic.
    match var_call(&mut server, &mut state, &mut c, |c| {
        c.issue(3).fill(2049).unwrap();
    }) {
        Err(RpcError::BadRequest {
            status: Some(Status::ResponseTooLarge),
            ..
        }) => {}
        other => panic!("expected ResponseTooLarge, got {other:?}"),
    }
    // The server still serves.
    let got = var_call(&mut server, &mut state, &mut c, |c| {
        c.issue(4).echo(b"after").unwrap();
    });
    assert_eq!(got.unwrap(), VarResponse::Echo(b"after".to_vec()));
    answered += 1;
    let st = *server.stats();
    // The refused result counts as oversized, not as a request; its handler ran.
    assert_eq!(st.requests, answered, "{st:?}");
    assert_eq!(st.oversized_responses, 1, "{st:?}");
    assert_eq!((st.bad_requests, st.dropped_replies), (0, 0), "{st:?}");
    assert_eq!(state.0.get(), answered + 1);
    let s = server_stats(&server);
    assert_eq!(s.replies, answered + 1);
    assert_eq!(s.backlogged_replies, 0);
}

/// The copyrpc server's zero-copy `serve_next` for a service whose largest reply fits
/// inline: echoes of 0 B, 1 B and the largest allowed are written straight into the send
/// ring (a new buffer for each reply, no large-message buffer ever registered), one byte
/// more is refused at the client, and a result over `max_var_bytes` is answered
/// `ResponseTooLarge` and counted.
#[test]
fn zero_copy_serve_with_inline_replies() {
    let fabric = Fabric::new(SimConfig::default());
    let (mut server, addr) = server_4k::<ShortService>(&fabric, rings_4k());
    let mut c = connect_polling(&mut server, &addr, ShortClient::<Copyrpc>::connect).unwrap();
    let mut state = VarState::default();
    let ep = c.transport().endpoint();
    let max_payload = c.transport().context().endpoint(ep).unwrap().max_payload();
    assert!(ShortService::DESCRIPTOR.max_response_bytes <= max_payload as usize);
    // Where the handler was asked to write each reply.
    let mut reply_bufs = Vec::new();
    let mut call = |c: &mut ShortClient<Copyrpc>,
                    server: &mut Server<ShortService, CopyrpcServer>,
                    issue: &dyn Fn(&mut ShortClient<Copyrpc>)| {
        issue(c);
        serve_raw_until(
            server,
            &mut state,
            |s, m, o| {
                reply_bufs.push((o.as_ptr() as usize, o.len()));
                ShortService::dispatch_raw(s, m, o)
            },
            || c.poll().transpose(),
        )
        .map(|(_, r)| r)
    };
    for n in [0, 1, 900] {
        let d = var_pattern(n);
        let got = call(&mut c, &mut server, &|c| c.issue(0).echo(&d).unwrap());
        assert_eq!(
            got.unwrap(),
            ShortResponse::Echo(d.clone()),
            "echo of {n} B"
        );
    }
    match c.echo(&var_pattern(901)) {
        Err(RpcError::MessageTooLarge { .. }) => {}
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    match call(&mut c, &mut server, &|c| c.issue(0).fill(901).unwrap()) {
        Err(RpcError::BadRequest {
            status: Some(Status::ResponseTooLarge),
            ..
        }) => {}
        other => panic!("expected ResponseTooLarge, got {other:?}"),
    }
    let got = call(&mut c, &mut server, &|c| c.issue(0).fill(900).unwrap());
    assert_eq!(got.unwrap(), ShortResponse::Fill(vec![7; 900]));
    // Each reply buffer is the service's largest response, at the send ring's producer: a
    // new place for each reply (a staging buffer would be the same every time).
    assert_eq!(reply_bufs.len(), 5);
    assert!(
        reply_bufs
            .iter()
            .all(|&(_, len)| len == ShortService::DESCRIPTOR.max_response_bytes)
    );
    let mut at: Vec<usize> = reply_bufs.iter().map(|&(p, _)| p).collect();
    at.sort_unstable();
    at.dedup();
    assert_eq!(at.len(), 5, "reply buffers {reply_bufs:x?}");
    let st = *server.stats();
    assert_eq!((st.requests, st.oversized_responses), (4, 1), "{st:?}");
    assert_eq!((st.bad_requests, st.dropped_replies), (0, 0), "{st:?}");
    let s = server.transport().context().stats();
    assert_eq!(
        s.large_buffers, 0,
        "no reply was staged in a large-message buffer"
    );
    assert_eq!((s.rendezvous_sent, s.backlogged_replies), (0, 0));
    assert_eq!(s.replies, 5);
}

/// A reply the copyrpc server cannot write (here: no large-message buffer for a reply
/// beyond the inline allowance) is dropped and counted, and the handler still ran, as it
/// does with `recv` + `reply`: the request is not lost.
#[test]
fn zero_copy_serve_runs_the_handler_when_the_reply_is_refused() {
    let fabric = Fabric::new(SimConfig::default());
    let cfg = EndpointConfig {
        large_buffers: 0,
        ..rings_4k()
    };
    let (mut server, addr) = server_4k::<VarService>(&fabric, cfg);
    let mut c = connect_polling(&mut server, &addr, VarClient::<Copyrpc>::connect).unwrap();
    let mut state = VarState::default();
    c.issue(0).echo(b"lost reply").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stats().dropped_replies == 0 {
        assert!(Instant::now() < deadline, "the request never arrived");
        server.serve_once_raw(|m, o| VarService::dispatch_raw(&mut state, m, o));
        assert_eq!(c.poll().unwrap(), None, "no reply can be sent");
    }
    let st = *server.stats();
    assert_eq!((st.requests, st.dropped_replies), (1, 1), "{st:?}");
    assert_eq!(state.0.get(), 1, "the handler ran");
    let s = server.transport().context().stats();
    assert_eq!((s.large_buffers_busy, s.replies), (1, 0));
    // Released although unanswered.
    let (_, _, released, _) = server
        .transport()
        .context()
        .endpoint(0)
        .unwrap()
        .positions();
    assert!(released > 0);
}

/// Credit by each method's largest result (issue 16, seeds/004 §3.4): on 8 KiB rings the
/// 2 KiB of response credit covers at most 6 `echo256` calls (a 264 B result) but many
/// more `ping` calls (a 16 B result), which used to reserve `echo256`'s size too. With the
/// server not serving, pings stop at the tokens or the credit, echo256 calls at the credit;
/// both complete with the right results once it serves.
#[test]
fn small_results_reserve_small_credit() {
    let fabric = Fabric::new(SimConfig::default());
    let cfg = EndpointConfig {
        ring_size: 8192,
        ..EndpointConfig::default()
    };
    let mut server =
        CopyrpcServer::serve::<EchoService>(&fabric.open(), ContextConfig::default(), cfg).unwrap();
    let mut addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    addr.endpoint = cfg;
    let mut echo = connect_polling(&mut server, &addr, EchoClient::<Copyrpc>::connect).unwrap();
    let serve_all = |server: &mut Server<EchoService, CopyrpcServer>,
                     echo: &mut EchoClient<Copyrpc>,
                     calls: u64,
                     check: &dyn Fn(u64, EchoResponse)| {
        let mut done = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while done < calls {
            assert!(Instant::now() < deadline, "stalled at {done} of {calls}");
            server.serve_once(|req| EchoService::dispatch(&mut idl::echo::Echoer, req));
            done += echo.poll_with(|tag, r| check(tag, r.unwrap())).unwrap() as u64;
        }
    };
    let issue_all = |echo: &mut EchoClient<Copyrpc>, big: bool| {
        let mut n = 0u64;
        loop {
            let r = if big {
                echo.issue(n).echo256([n as u8; 256])
            } else {
                echo.issue(n).ping(n)
            };
            match r {
                Ok(()) => n += 1,
                Err(RpcError::WouldBlock) => return n,
                Err(e) => panic!("{e}"),
            }
        }
    };
    let pings = issue_all(&mut echo, false);
    serve_all(&mut server, &mut echo, pings, &|tag, r| {
        assert_eq!(r, EchoResponse::Ping(tag))
    });
    let echos = issue_all(&mut echo, true);
    serve_all(&mut server, &mut echo, echos, &|tag, r| {
        assert_eq!(r, EchoResponse::Echo256([tag as u8; 256]))
    });
    eprintln!("in flight on 2 KiB of credit: {pings} pings, {echos} echo256 calls");
    assert!((1..=6).contains(&echos), "{echos} echo256 calls");
    assert!(
        pings >= 4 * echos && pings >= 24,
        "{pings} pings against {echos} echo256 calls"
    );
    assert_eq!(server.stats().dropped_replies, 0);
    assert_eq!(server.stats().requests, pings + echos);
}

/// A caller that reserves credit for one method and asks another: a raw client sends an
/// `echo256` request with `ping`'s allowance (16 B of result room, against the 264 B it
/// needs). The server runs the handler, drops the reply it cannot fit (counted, no panic,
/// nothing written beyond the allowance) and keeps serving; a proper call then succeeds.
#[test]
fn a_reply_beyond_the_callers_allowance_is_dropped() {
    let fabric = Fabric::new(SimConfig::default());
    let (mut server, addr) = server::<EchoService>(&fabric);
    let mut raw = raw_client(&mut server, &addr);
    let req = EchoRequest::Echo256(idl::echo::EchoEcho256Args { payload: [7; 256] });
    raw.send(Duration::from_secs(5), EchoService::PING, |b| {
        EchoService::encode_request(&req, b)
    })
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stats().dropped_replies == 0 {
        assert!(Instant::now() < deadline, "the request was not served");
        server.serve_once(|req| EchoService::dispatch(&mut idl::echo::Echoer, req));
        raw.poll(|_, _| panic!("a reply beyond the allowance was delivered"))
            .unwrap();
    }
    assert_eq!(server.stats().requests, 1);
    assert_eq!(server.stats().dropped_replies, 1);
    // The connection is intact: a call that reserved for its own method is answered.
    let mut echo = Client::<EchoService, Copyrpc>::from_transport(raw);
    echo.issue(9, EchoService::ECHO256, &[9u8; 256]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        assert!(Instant::now() < deadline, "no answer");
        server.serve_once(|req| EchoService::dispatch(&mut idl::echo::Echoer, req));
        if let Some(r) = echo.poll().unwrap() {
            break r;
        }
    };
    assert_eq!(got, (9, EchoResponse::Echo256([9; 256])));
}

/// A kv server and an echo server on `fabric`, a [`ClientContext`], and the two servers'
/// addresses set to connect clients into that context.
#[allow(clippy::type_complexity)]
fn shared_context_rig(
    fabric: &Fabric,
) -> (
    (Server<KvService, CopyrpcServer>, CopyrpcAddr),
    (Server<EchoService, CopyrpcServer>, CopyrpcAddr),
    ClientContext,
) {
    let (kv_server, mut kv_addr) = server::<KvService>(fabric);
    let (echo_server, mut echo_addr) = server::<EchoService>(fabric);
    let ctx = ClientContext::new(&fabric.open(), ContextConfig::default()).unwrap();
    kv_addr.shared = Some(ctx.clone());
    echo_addr.shared = Some(ctx.clone());
    ((kv_server, kv_addr), (echo_server, echo_addr), ctx)
}

/// Two clients of two services on one thread share one [`ClientContext`] (one CQ pair and
/// SRQ, seeds/001): polling either sends both clients' requests and takes both clients'
/// responses; each response reaches the client (and the call) that made it. Also checks
/// that a client on a shared context is `Send` (made on another thread by
/// `connect_polling`).
#[test]
fn clients_of_one_thread_share_one_context() {
    let fabric = Fabric::new(SimConfig::default());
    let ((mut kv_server, kv_addr), (mut echo_server, echo_addr), ctx) = shared_context_rig(&fabric);
    let mut kv = connect_polling(&mut kv_server, &kv_addr, KvClient::<Copyrpc>::connect).unwrap();
    let mut echo =
        connect_polling(&mut echo_server, &echo_addr, EchoClient::<Copyrpc>::connect).unwrap();
    assert_eq!(ctx.clients(), 2);
    assert_eq!(ctx.with(|c| c.num_endpoints()), 2);
    assert_eq!((kv.transport().slot(), echo.transport().slot()), (0, 1));

    // The echo call is sent by the kv client's poll, and its response taken by it too: the
    // echo client is not polled until its response waits in its stash.
    echo.issue(7).ping(70).unwrap();
    kv.issue(1).put(0, 1, 10).unwrap();
    assert!(kv.poll().unwrap().is_none());
    let deadline = Instant::now() + Duration::from_secs(10);
    while echo_server.stats().requests == 0 || kv_server.stats().requests == 0 {
        assert!(Instant::now() < deadline, "the requests never arrived");
        echo_server.serve_once(|req| EchoService::dispatch(&mut idl::echo::Echoer, req));
        kv_server.serve_once(|req| KvService::dispatch(&mut Store::default(), req));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut kv_got = None;
    while kv_got.is_none() || ctx.stats().responses < 2 {
        assert!(Instant::now() < deadline, "the responses never arrived");
        if let Some(r) = kv.poll().unwrap() {
            kv_got = Some(r);
        }
    }
    assert_eq!(kv_got, Some((1, KvResponse::Put(()))));
    assert_eq!(echo.poll().unwrap(), Some((7, EchoResponse::Ping(70))));
    assert_eq!(ctx.stats().responses, 2);

    // Both clients pipelined, polled in turn, every response matched to its call.
    let kv_h = spawn_kv(kv_server);
    let echo_h = spawn(echo_server, |req| {
        EchoService::dispatch(&mut idl::echo::Echoer, req)
    });
    let (mut kv_sent, mut echo_sent, mut kv_done, mut echo_done) = (0u64, 0u64, 0u64, 0u64);
    const N: u64 = 3000;
    let mut round = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while kv_done < N || echo_done < N {
        assert!(
            Instant::now() < deadline,
            "stalled at {kv_done}/{echo_done}"
        );
        while kv_sent < N && kv.issue(kv_sent).put(1, kv_sent, kv_sent * 3).is_ok() {
            kv_sent += 1;
        }
        while echo_sent < N && echo.issue(echo_sent).ping(echo_sent * 5).is_ok() {
            echo_sent += 1;
        }
        // Poll one client at a time, in an order that varies, so that each takes the
        // other's responses part of the time.
        round += 1;
        if round % 3 != 0 {
            kv_done += kv
                .poll_with(|tag, r| {
                    assert!(tag < kv_sent);
                    assert_eq!(r.unwrap(), KvResponse::Put(()));
                })
                .unwrap() as u64;
        }
        echo_done += echo
            .poll_with(|tag, r| assert_eq!(r.unwrap(), EchoResponse::Ping(tag * 5)))
            .unwrap() as u64;
    }
    for k in (0..N).step_by(97) {
        assert_eq!(kv.get(1, k).unwrap(), Some(k * 3));
    }
    assert_eq!(ctx.orphaned_responses(), 0);
    assert_eq!(ctx.stats().responses, 2 + 2 * N + N.div_ceil(97));
    drop((kv_h, echo_h));
}

/// A client dropped with a call in flight: its response arrives at the shared context and
/// is dropped and counted; the other client on the context is not disturbed.
#[test]
fn responses_for_a_dropped_client_on_a_shared_context_are_orphaned() {
    let fabric = Fabric::new(SimConfig::default());
    let ((kv_server, kv_addr), (mut echo_server, echo_addr), ctx) = shared_context_rig(&fabric);
    let _kv_h = spawn_kv(kv_server);
    let mut kv = KvClient::<Copyrpc>::connect(&kv_addr).unwrap();
    let mut echo =
        connect_polling(&mut echo_server, &echo_addr, EchoClient::<Copyrpc>::connect).unwrap();
    echo.issue(1).ping(1).unwrap();
    assert!(echo.poll().unwrap().is_none()); // sends it
    drop(echo);
    assert_eq!(ctx.clients(), 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while echo_server.stats().requests == 0 {
        assert!(Instant::now() < deadline, "the echo request never arrived");
        echo_server.serve_once(|req| EchoService::dispatch(&mut idl::echo::Echoer, req));
    }
    // The kv client's calls poll the context, which takes the orphaned response.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut k = 0;
    while ctx.orphaned_responses() == 0 {
        assert!(
            Instant::now() < deadline,
            "the orphaned response never arrived"
        );
        kv.put(0, k, k).unwrap();
        k += 1;
    }
    kv.put(0, 5, 6).unwrap();
    assert_eq!(kv.get(0, 5).unwrap(), Some(6));
    assert_eq!(ctx.orphaned_responses(), 1);
}

/// Two clients on one shared context; one's server dies with a call pending. That client's
/// probe finds it (`ServerDisconnected`), by its own responses only (the other client's
/// steady responses do not count as its server's liveness), and the other client keeps
/// working.
#[test]
fn a_dead_server_fails_only_its_client_on_a_shared_context() {
    let fabric = Fabric::new(SimConfig {
        progress_thread: Some(Duration::from_millis(1)),
        ..SimConfig::default()
    });
    let ((kv_server, mut kv_addr), (mut echo_server, mut echo_addr), ctx) =
        shared_context_rig(&fabric);
    for a in [&mut kv_addr.probe_interval, &mut echo_addr.probe_interval] {
        *a = Some(Duration::from_millis(20));
    }
    let _kv_h = spawn_kv(kv_server);
    let mut kv = KvClient::<Copyrpc>::connect(&kv_addr).unwrap();
    let mut echo =
        connect_polling(&mut echo_server, &echo_addr, EchoClient::<Copyrpc>::connect).unwrap();
    echo.issue(1).ping(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "the echo request never arrived");
        assert!(echo.poll().unwrap().is_none());
        echo_server.poll();
        if echo_server.recv().is_some() {
            break;
        }
    }
    drop(echo_server);
    let t0 = Instant::now();
    let mut k = 0;
    loop {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the pending call never failed"
        );
        // The kv client answers all along.
        kv.put(0, k, k).unwrap();
        k += 1;
        match echo.poll() {
            Ok(None) => {}
            Err(RpcError::ServerDisconnected) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    eprintln!(
        "echo failed after {:?}, {k} kv calls meanwhile",
        t0.elapsed()
    );
    assert!(matches!(echo.ping(2), Err(RpcError::ServerDisconnected)));
    assert_eq!(kv.get(0, 0).unwrap(), Some(0));
    assert!(ctx.stats().raw_posted >= 1, "found by the probe");
}

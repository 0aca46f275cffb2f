//! Generated stubs and server traits end to end over eRPC on UDP loopback
//! (`rpc::erpc::{Erpc, ErpcServer}`): blocking and pipelined calls, multi-packet messages,
//! handler `Option`s and undecodable requests, deferred replies, schema and capacity checks,
//! a server that goes away, idle clients, many clients, a connect flood from one socket, and
//! loss; and the same stubs over the
//! mlx5 UD transport on the software device model.

mod typed_common;

use typed_common::connect_polling;

use typed_common::scenarios::{self, Fixture};
use typed_common::{Store, spawn, spawn_kv};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use idl::echo::{EchoClient, EchoResponse, EchoService};
use idl::kv::{KvClient, KvRequest, KvResponse, KvService};
use rpc::erpc::core::{Config, MS};
use rpc::erpc::datagram::DatagramTransport;
use rpc::erpc::datagram::lossy::{LossConfig, LossyTransport};
use rpc::erpc::datagram::ud::{UdConfig, UdTransport};
use rpc::erpc::datagram::udp::{UdpConfig, UdpTransport};
use rpc::erpc::event_loop::Endpoint;
use rpc::erpc::transport::{ErpcSetupError, UdConnectAddr, service_config};
use rpc::erpc::{Erpc, ErpcConfig, ErpcServer};
use rpc::mlx5::sim::{Fabric, SimConfig};
use rpc::rpc_service;

use rpc::{ClientTransport, MessageKind, RpcError, Server, Service};

/// Counts the heap allocations of threads that opted in (`COUNTING`), for the allocation
/// test; other threads and tests are not affected.
struct CountingAlloc;

static ALLOCS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

thread_local! {
    static COUNTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

// SAFETY: forwards every call unchanged to the system allocator; the counter only reads a
// const-initialized thread-local `Cell` (no allocation, no destructor) and bumps an atomic.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if COUNTING.with(|c| c.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        if COUNTING.with(|c| c.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// A service whose messages span several packets (8 KiB bodies: 6 packets at the default
/// 1472 B MTU), declared with eRPC as its default transport.
#[rpc_service(transport = "erpc", derive(Debug, PartialEq, Eq))]
pub trait Blob {
    /// Returns `data` with every byte incremented.
    fn bump(&self, data: [u8; 8192]) -> [u8; 8192];
    /// Returns the sum of the bytes of `data`, or `None` for all zeros.
    fn sum(&self, data: [u8; 8192]) -> Option<u64>;
}

struct Bumper;

impl BlobServer for Bumper {
    fn bump(&self, mut data: [u8; 8192]) -> [u8; 8192] {
        for b in &mut data {
            *b = b.wrapping_add(1);
        }
        data
    }
    fn sum(&self, data: [u8; 8192]) -> Option<u64> {
        let s: u64 = data.iter().map(|&b| u64::from(b)).sum();
        (s != 0).then_some(s)
    }
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Short timeouts (failure after 100 ms of silence, keepalive pings after 20 ms) for the
/// tests where a peer goes away.
fn short_timeouts() -> ErpcConfig {
    ErpcConfig {
        core: Config {
            failure_timeout: 100 * MS,
            keepalive: 20 * MS,
            ..Config::default()
        },
        ..ErpcConfig::default()
    }
}

/// A server of `S` on loopback, and its address.
fn server<S: Service>(cfg: &ErpcConfig) -> (Server<S, ErpcServer>, SocketAddr) {
    let t = ErpcServer::bind_with(loopback(), S::DESCRIPTOR, cfg).unwrap();
    let addr = t.local_addr();
    assert_ne!(addr.port(), 0);
    (Server::new(t), addr)
}

/// eRPC over UDP loopback with one configuration for servers and clients.
struct Fx(ErpcConfig);

impl Fixture for Fx {
    type Client = Erpc;
    type Server = ErpcServer;
    type Addr = SocketAddr;
    fn server<S: Service>(&mut self) -> (Server<S, ErpcServer>, SocketAddr) {
        server::<S>(&self.0)
    }
}

#[test]
fn blocking_calls() {
    let mut fx = Fx(ErpcConfig::default());
    let b = scenarios::blocking_calls(&mut fx);
    let kv = &b.kv;
    assert_eq!(kv.max_in_flight(), 32);
    assert_eq!(kv.transport().num_sessions(), 4);
    assert_eq!(kv.transport().server_addr(), b.addr);
    let st = kv.transport().stats();
    assert_eq!((st.calls, st.responses, st.failed_calls), (2003, 2003, 0));
    assert_eq!(st.sessions_opened, 4);
    let server = &b.server;
    assert_eq!(server.transport().stats().replies, 2003);
    // Every request is a single packet: all were lent out in place from the receive ring.
    assert_eq!(server.transport().stats().zero_copy_requests, 2003);
    assert_eq!(server.transport().endpoint().rpc().num_sessions(), 4);
}

#[test]
fn pipelined_calls_all_matched() {
    let mut fx = Fx(ErpcConfig::default());
    let p = scenarios::pipelined_echo(&mut fx, 20_000, Duration::from_secs(120));
    let depth = p.echo.max_in_flight();
    assert_eq!(depth, 32);
    // Eight credits per session, four sessions: an issue never has to wait.
    assert_eq!(p.would_block, 0);
    assert_eq!(p.most_in_flight, depth);
    let st = p.echo.transport().stats();
    assert_eq!(st.stray_events, 0);
    assert_eq!(st.sessions_opened, 4, "{st:?}");
}

#[test]
fn multi_packet_messages_and_options() {
    // Ethernet-sized datagrams on the server, so an 8 KiB message spans 6 packets.
    let eth = ErpcConfig {
        udp_mtu: Some(1472),
        ..ErpcConfig::default()
    };
    let (server, addr) = server::<BlobService>(&eth);
    let h = spawn(server, |req| BlobService::dispatch(&mut Bumper, req));
    // `transport = "erpc"`: the generated client's default transport. Its derived datagram
    // size (8972 B on loopback with room in the receive buffer) is refused by the server,
    // and it reconnects with the server's.
    let mut blob: BlobClient = BlobClient::connect(&addr).unwrap();
    assert_eq!(blob.transport().endpoint().transport().mtu(), 1472);
    let data: [u8; 8192] = std::array::from_fn(|i| (i * 7) as u8);
    let bumped = blob.bump(data).unwrap();
    assert!(
        bumped
            .iter()
            .zip(&data)
            .all(|(b, d)| *b == d.wrapping_add(1))
    );
    assert_eq!(blob.sum([0; 8192]).unwrap(), None);
    assert_eq!(blob.sum([1; 8192]).unwrap(), Some(8192));
    // Pipelined: 40 multi-packet calls, 32 in flight at most.
    let (mut next, mut done) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(60);
    while done < 40 {
        assert!(Instant::now() < deadline, "stalled at {done}");
        while next < 40 && blob.in_flight() < blob.max_in_flight() {
            blob.issue(next).bump([next as u8; 8192]).unwrap();
            next += 1;
        }
        done += blob
            .poll_with(|tag, r| {
                assert_eq!(r.unwrap(), BlobResponse::Bump([tag as u8 + 1; 8192]));
            })
            .unwrap() as u64;
    }
    let core = blob.transport().endpoint().core_stats().clone();
    // Each request spans 6 packets (five answered by explicit credit returns), and so does
    // each `bump` response (five fetched by requests for response).
    assert!(core.rfr_tx >= 41 * 5, "{core:?}");
    let server = h.join().unwrap();
    assert_eq!(server.stats().requests, 43);
    assert!(server.transport().endpoint().core_stats().cr_tx >= 43 * 5);
    // Multi-packet requests go through the copying path.
    assert_eq!(server.transport().stats().zero_copy_requests, 0);
}

#[test]
fn undecodable_requests_get_error_status() {
    let (mut server, addr) = server::<KvService>(&ErpcConfig::default());
    let raw = connect_polling(&mut server, move || {
        <Erpc as ClientTransport>::connect(&addr, KvService::DESCRIPTOR).unwrap()
    });
    // The empty request is a zero-byte eRPC message. An encoder claiming more than the
    // request buffer is refused before anything is sent. The handler's `Option` comes back
    // as such through the typed client.
    let mut kv = scenarios::undecodable_requests_get_error_status(raw, &mut server, |raw, _| {
        assert!(matches!(
            raw.send(std::time::Duration::from_secs(5), 0, |_| 1 << 20),
            Err(RpcError::MessageTooLarge { len: 1048576, .. })
        ));
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut store = Store::default();
    kv.issue_request(6, &KvRequest::get(0, 9)).unwrap();
    kv.issue_request(7, &KvRequest::put(0, 9, 90)).unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        assert!(Instant::now() < deadline, "no answer");
        server.serve_once(|req| KvService::dispatch(&mut store, req));
        if let Some(r) = kv.poll().unwrap() {
            got.push(r);
        }
    }
    got.sort_by_key(|r| r.0);
    // The two calls used different sessions, so the put may have run first.
    assert_eq!(got[1], (7, KvResponse::Put(())));
    assert!(matches!(got[0], (6, KvResponse::Get(None | Some(90)))));
}

#[test]
fn deferred_replies_out_of_order() {
    let (mut server, addr) = server::<KvService>(&ErpcConfig::default());
    let mut kv = connect_polling(&mut server, move || {
        KvClient::<Erpc>::connect(&addr).unwrap()
    });
    let taken = scenarios::take_deferred_gets(&mut kv, &mut server, 12, true);
    // Answer in reverse; a second reply with the same token is refused.
    let mut got = Vec::new();
    for (i, &(token, key)) in taken.iter().rev().enumerate() {
        server
            .reply(token, &KvResponse::Get(Some(key * 10)))
            .unwrap();
        assert!(matches!(
            server.reply(token, &KvResponse::Get(None)),
            Err(RpcError::ReplyDropped(_))
        ));
        if i == 2 {
            // Replies leave with the next flush (or poll): the first three arrive alone.
            server.flush();
            scenarios::await_deferred_replies(&mut kv, &mut got, 3, || {});
            let mut first: Vec<u64> = taken.iter().rev().take(3).map(|t| t.1).collect();
            first.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, first);
        }
    }
    server.flush();
    scenarios::await_deferred_replies(&mut kv, &mut got, 12, || {
        server.poll();
    });
    got.sort_unstable();
    assert_eq!(got, (0..12).collect::<Vec<_>>());
    assert_eq!(server.stats().dropped_replies, 12);
    assert_eq!(server.transport().stats().replies, 12);
}

#[test]
fn schema_mismatch_fails_at_connect() {
    let mut fx = Fx(ErpcConfig::default());
    let server = scenarios::schema_mismatch_fails_at_connect(&mut fx, |e, addr| {
        // The server's real fingerprint comes back in its connect response, and the
        // message shows it (before 2471105 it printed 0x0000000000000000, issue 17).
        let msg = e.to_string();
        let theirs = format!("the peer's is {:#018x}", KvService::DESCRIPTOR.fingerprint);
        let ours = format!("{:#018x}", EchoService::DESCRIPTOR.fingerprint);
        assert!(msg.contains(&theirs) && msg.contains(&ours), "{msg}");
        match Erpc::<UdpTransport>::connect_with(
            addr,
            EchoService::DESCRIPTOR,
            &ErpcConfig::default(),
        ) {
            Err(
                e @ ErpcSetupError::SchemaMismatch {
                    service: "Echo",
                    expected,
                    found,
                },
            ) => {
                assert_eq!(expected, EchoService::DESCRIPTOR.fingerprint);
                assert_eq!(found, KvService::DESCRIPTOR.fingerprint);
                let theirs = format!(
                    "the server's is {:#018x}",
                    KvService::DESCRIPTOR.fingerprint
                );
                assert!(e.to_string().contains(&theirs), "{e}");
            }
            other => panic!("expected SchemaMismatch, got {other:?}"),
        }
    });
    // The refused clients left no session behind.
    assert_eq!(server.transport().endpoint().rpc().num_sessions(), 4);
}

#[test]
fn capacity_and_configuration_are_checked() {
    let small = ErpcConfig {
        core: Config {
            max_msg_size: 4096,
            ..Config::default()
        },
        ..ErpcConfig::default()
    };
    // 8 KiB messages do not fit a 4 KiB max_msg_size: refused before anything is bound.
    match ErpcServer::bind_with(loopback(), BlobService::DESCRIPTOR, &small) {
        Err(ErpcSetupError::Capacity {
            service: "Blob",
            side: rpc::LimitSide::ThisServer,
            what: MessageKind::Request,
            cap: 4096,
            need,
        }) => assert_eq!(need, BlobService::DESCRIPTOR.max_request_bytes),
        other => panic!("expected Capacity, got {other:?}"),
    }
    let (server, addr) = server::<BlobService>(&ErpcConfig::default());
    let h = spawn(server, |req| BlobService::dispatch(&mut Bumper, req));
    match Erpc::<UdpTransport>::connect_with(&addr, BlobService::DESCRIPTOR, &small) {
        Err(e @ ErpcSetupError::Capacity { .. }) => match e.into_rpc_error() {
            RpcError::CapacityMismatch {
                service: "Blob",
                what: MessageKind::Request,
                side: rpc::LimitSide::ThisClient,
                setting: "eRPC Config::max_msg_size",
                cap: 4096,
                min: Some(min),
                ..
            } => assert_eq!(min, BlobService::DESCRIPTOR.max_request_bytes as u64),
            other => panic!("expected CapacityMismatch, got {other:?}"),
        },
        other => panic!("expected Capacity, got {other:?}"),
    }
    for bad in [0, rpc::erpc::transport::MAX_IN_FLIGHT_LIMIT + 1] {
        let cfg = ErpcConfig {
            max_in_flight: bad,
            ..ErpcConfig::default()
        };
        assert!(matches!(
            Erpc::<UdpTransport>::connect_with(&addr, BlobService::DESCRIPTOR, &cfg),
            Err(ErpcSetupError::Invalid(_))
        ));
    }
    // One call in flight: one session; a second pipelined call waits for a token.
    let cfg = ErpcConfig {
        max_in_flight: 1,
        ..ErpcConfig::default()
    };
    let t = Erpc::<UdpTransport>::connect_with(&addr, BlobService::DESCRIPTOR, &cfg).unwrap();
    assert_eq!((t.max_in_flight(), t.num_sessions()), (1, 1));
    let mut blob = BlobClient::from_transport(t);
    blob.issue(1).sum([2; 8192]).unwrap();
    assert!(matches!(
        blob.issue(2).sum([2; 8192]),
        Err(RpcError::WouldBlock)
    ));
    // A blocking call waits for the token (keeping the pipelined call's completion).
    assert_eq!(blob.sum([1; 8192]).unwrap(), Some(8192));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline);
        if let Some(done) = blob.poll().unwrap() {
            assert_eq!(done, (1, BlobResponse::Sum(Some(2 * 8192))));
            break;
        }
    }
    h.join().unwrap();
}

#[test]
fn bootstrap_from_endpoints() {
    // What an MPI bootstrap does: create both endpoints, exchange their addresses.
    let udp = || {
        UdpTransport::bind(UdpConfig {
            socket_buf_bytes: Some(4 << 20),
            ..UdpConfig::default()
        })
        .unwrap()
    };
    let kv_cfg = service_config(KvService::DESCRIPTOR, &Config::default());
    let sep = Endpoint::new(udp(), kv_cfg.clone()).unwrap();
    // The wrong service's endpoint is refused.
    let wrong = Endpoint::new(udp(), Config::default()).unwrap();
    assert!(matches!(
        ErpcServer::from_endpoint(wrong, KvService::DESCRIPTOR),
        Err(ErpcSetupError::Invalid(_))
    ));
    let server =
        Server::<KvService, _>::new(ErpcServer::from_endpoint(sep, KvService::DESCRIPTOR).unwrap());
    let server_addr = server.transport().local_addr();
    let h = spawn_kv(server);
    let cep = Endpoint::new(udp(), kv_cfg).unwrap();
    let t = Erpc::from_endpoint(
        cep,
        server_addr,
        KvService::DESCRIPTOR,
        8,
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!((t.max_in_flight(), t.num_sessions()), (8, 1));
    let mut kv = KvClient::from_transport(t);
    kv.put(3, 4, 5).unwrap();
    assert_eq!(kv.get(3, 4).unwrap(), Some(5));
    let wrong = Endpoint::new(udp(), Config::default()).unwrap();
    assert!(matches!(
        Erpc::from_endpoint(
            wrong,
            server_addr,
            KvService::DESCRIPTOR,
            8,
            Duration::from_secs(5)
        ),
        Err(ErpcSetupError::Invalid(_))
    ));
    h.join().unwrap();
}

#[test]
fn connecting_to_nothing_fails_within_the_failure_timeout() {
    // A bound socket that never answers.
    let silent = std::net::UdpSocket::bind(loopback()).unwrap();
    let addr = silent.local_addr().unwrap();
    let t0 = Instant::now();
    match Erpc::<UdpTransport>::connect_with(&addr, KvService::DESCRIPTOR, &short_timeouts()) {
        Err(ErpcSetupError::NoAnswer) => {}
        other => panic!("expected NoAnswer, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(matches!(
        KvClient::<Erpc>::connect(&addr),
        Err(e) if matches!(e.transport::<ErpcSetupError>(), Some(ErpcSetupError::NoAnswer))
    ));
    // A connect timeout too long for the clock is bounded by the failure timeout (it used to
    // overflow `Instant + Duration` and panic).
    let cfg = ErpcConfig {
        connect_timeout: Duration::MAX,
        ..short_timeouts()
    };
    let t0 = Instant::now();
    match Erpc::<UdpTransport>::connect_with(&addr, KvService::DESCRIPTOR, &cfg) {
        Err(ErpcSetupError::NoAnswer) => {}
        other => panic!("expected NoAnswer, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // The connect timeout applies when the core's failure timeout is longer.
    let cfg = ErpcConfig {
        connect_timeout: Duration::from_millis(100),
        ..ErpcConfig::default()
    };
    let mut cfg = cfg;
    cfg.core.failure_timeout = 60_000 * MS;
    match Erpc::<UdpTransport>::connect_with(&addr, KvService::DESCRIPTOR, &cfg) {
        Err(ErpcSetupError::Timeout(d)) => assert_eq!(d, Duration::from_millis(100)),
        other => panic!("expected Timeout, got {other:?}"),
    }
}

#[test]
fn server_gone_fails_pending_and_later_calls() {
    let cfg = short_timeouts();
    let (mut server, addr) = server::<KvService>(&cfg);
    let c = cfg.clone();
    let mut busy = connect_polling(&mut server, move || {
        KvClient::from_transport(
            Erpc::<UdpTransport>::connect_with(&addr, KvService::DESCRIPTOR, &c).unwrap(),
        )
    });
    let c = cfg.clone();
    let mut idle = connect_polling(&mut server, move || {
        KvClient::from_transport(
            Erpc::<UdpTransport>::connect_with(&addr, KvService::DESCRIPTOR, &c).unwrap(),
        )
    });
    // Both work; `busy` has 20 calls (on all four sessions) that the server took and never
    // answers; the idle client keeps its sessions alive meanwhile.
    scenarios::both_work_then_busy_unanswered(&mut server, &mut busy, &mut idle, 20, |s, idle| {
        s.flush();
        assert!(idle.poll().unwrap().is_none());
        idle.transport_mut().poll(|_, _| {}).unwrap();
    });
    drop(server);
    let t0 = Instant::now();
    // Pending calls: the client retransmits and pings, then fails them.
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
    assert!(busy.transport().is_failed());
    // The other sessions' calls fail too (each session on its own timer); polls keep
    // reporting the failure meanwhile.
    while busy.transport().stats().failed_calls < 20 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "some calls never failed"
        );
        assert!(matches!(busy.poll(), Err(RpcError::ServerDisconnected)));
    }
    let st = busy.transport().stats();
    assert_eq!((st.failed_calls, st.responses), (20, 1), "{st:?}");
    // Later calls fail at once.
    let t1 = Instant::now();
    assert!(matches!(busy.get(0, 1), Err(RpcError::ServerDisconnected)));
    assert!(matches!(
        busy.issue(9).get(0, 1),
        Err(RpcError::ServerDisconnected)
    ));
    assert!(t1.elapsed() < Duration::from_secs(1));
    // The idle client learns it on its next call, within the failure timeout.
    assert!(matches!(idle.get(0, 1), Err(RpcError::ServerDisconnected)));
    assert!(matches!(
        idle.put(0, 1, 2),
        Err(RpcError::ServerDisconnected)
    ));
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn idle_clients_get_new_sessions() {
    let cfg = short_timeouts();
    let (server, addr) = server::<KvService>(&cfg);
    let h = spawn_kv(server);
    let mut kv = KvClient::from_transport(
        Erpc::<UdpTransport>::connect_with(&addr, KvService::DESCRIPTOR, &cfg).unwrap(),
    );
    kv.put(0, 7, 70).unwrap();
    // Idle (no polls) for far longer than the failure timeout: both ends give the sessions
    // up; the next calls run on new ones.
    for round in 1..=3u64 {
        thread::sleep(Duration::from_millis(300));
        assert_eq!(kv.get(0, 7).unwrap(), Some(70 + round - 1), "round {round}");
        kv.put(0, 7, 70 + round).unwrap();
    }
    let st = kv.transport().stats();
    assert_eq!(st.stale_renewals, 3, "{st:?}");
    assert_eq!(st.failed_calls, 0, "{st:?}");
    // A new session for the token used, each round (blocking calls use one token).
    assert!(st.sessions_opened >= 4 + 3, "{st:?}");
    // Pipelined calls after an idle gap: spread over all four sessions.
    thread::sleep(Duration::from_millis(300));
    for k in 0..32 {
        kv.issue(k).put(0, 100 + k, k).unwrap();
    }
    let mut done = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while done < 32 {
        assert!(Instant::now() < deadline);
        done += kv
            .poll_with(|_, r| assert_eq!(r.unwrap(), KvResponse::Put(())))
            .unwrap();
    }
    assert_eq!(kv.transport().stats().stale_renewals, 4);
    // A client that polls now and then keeps its sessions.
    let opened = kv.transport().stats().sessions_opened;
    for _ in 0..30 {
        thread::sleep(Duration::from_millis(10));
        kv.transport_mut().poll(|_, _| {}).unwrap();
    }
    assert_eq!(kv.get(0, 100).unwrap(), Some(0));
    assert_eq!(kv.transport().stats().sessions_opened, opened);
    let server = h.join().unwrap();
    // The server freed the sessions given up on (disconnected, or reaped after silence).
    assert!(server.transport().stats().sessions_closed >= 4);
    assert_eq!(server.stats().bad_requests, 0);
}

#[test]
fn dropped_clients_disconnect() {
    // A long failure timeout: sessions can only be freed by the clients' disconnects.
    let mut cfg = ErpcConfig::default();
    cfg.core.failure_timeout = 30_000 * MS;
    cfg.core.keepalive = 1_000 * MS;
    let (server, addr) = server::<KvService>(&cfg);
    let h = spawn_kv(server);
    for i in 0..3 {
        let mut kv = KvClient::from_transport(
            Erpc::<UdpTransport>::connect_with(&addr, KvService::DESCRIPTOR, &cfg).unwrap(),
        );
        kv.put(0, i, i).unwrap();
    }
    let mut server = h.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.transport().endpoint().rpc().num_sessions() > 0 {
        assert!(Instant::now() < deadline, "sessions were not closed");
        server.poll();
        thread::yield_now();
    }
    assert_eq!(server.transport().stats().sessions_closed, 12);
}

/// A connect request as an unprivileged sender builds it from the documented wire layout
/// (`rpc::erpc::pkthdr` and the SM body table of `core/sm.rs`): kind 1, the public schema
/// fingerprint and the server's public settings, connect token `token`.
fn forged_connect(token: u64, client_sess: u16, fingerprint: u64, core: &Config) -> Vec<u8> {
    let word0: u64 = 1 | 64 << 8 | 0xffff << 32; // ConnectReq, 64-byte body, SM session
    let word1: u64 = 11 << 44; // magic
    let mut p = Vec::with_capacity(80);
    p.extend_from_slice(&word0.to_le_bytes());
    p.extend_from_slice(&word1.to_le_bytes());
    let mut body = [0u8; 64];
    body[0..8].copy_from_slice(&token.to_le_bytes());
    body[8..10].copy_from_slice(&client_sess.to_le_bytes());
    body[14..16].copy_from_slice(&0x1234u16.to_le_bytes());
    body[16..24].copy_from_slice(&fingerprint.to_le_bytes());
    body[24..28].copy_from_slice(&(core.mtu as u32).to_le_bytes());
    body[28..32].copy_from_slice(&(core.max_msg_size as u32).to_le_bytes());
    body[32..34].copy_from_slice(&(core.session_credits as u16).to_le_bytes());
    body[36..40].copy_from_slice(&u32::MAX.to_le_bytes());
    p.extend_from_slice(&body);
    p
}

/// Issue 14: a flood of connect requests from one ordinary UDP socket (distinct connect
/// tokens, the public fingerprint and settings) gets at most the server's per-source share
/// of sessions (default half of what its receive ring admits: here 4 of 8) and is refused
/// beyond it with `SourceLimit` on the wire; a second client then connects and is served.
/// Before, the flood took all 8 sessions and the second client was refused
/// (`NoRingEntries`).
#[test]
fn connect_flood_from_one_socket_leaves_other_clients_served() {
    const FLOOD: u64 = 32;
    let mut cfg = ErpcConfig {
        max_in_flight: 8,
        ..ErpcConfig::default()
    };
    // Room for 8 sessions of 8 credits.
    cfg.core.rx_ring_entries = Some(64);
    let (mut server, addr) = server::<EchoService>(&cfg);
    let core = server.transport().endpoint().rpc().config().clone();
    assert_eq!(core.source_session_limit(), 4);
    let attacker = std::net::UdpSocket::bind(loopback()).unwrap();
    for i in 0..FLOOD {
        let p = forged_connect(
            0x5eed_0000 + i,
            i as u16,
            EchoService::DESCRIPTOR.fingerprint,
            &core,
        );
        attacker.send_to(&p, addr).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.transport().endpoint().rpc().stats().rx_pkts < FLOOD {
        assert!(Instant::now() < deadline, "flood not received");
        server.poll();
        thread::yield_now();
    }
    // Let the answers leave.
    for _ in 0..100 {
        server.poll();
    }
    let st = server.transport().endpoint().rpc().stats().clone();
    assert_eq!(server.transport().endpoint().rpc().num_sessions(), 4);
    assert_eq!(st.connects_refused_source_limit, FLOOD - 4, "{st:?}");
    // The answers on the wire: 4 accepted, the rest refused with status 6 (`SourceLimit`).
    attacker
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut statuses = HashMap::new();
    let mut buf = [0u8; 2048];
    for _ in 0..FLOOD {
        let (n, _) = attacker.recv_from(&mut buf).unwrap();
        assert_eq!(n, 80);
        *statuses.entry(buf[16 + 12]).or_insert(0u64) += 1;
    }
    assert_eq!(statuses, HashMap::from([(0, 4), (6, FLOOD - 4)]));
    // Another client connects and is served.
    let h = spawn(server, |req| {
        EchoService::dispatch(&mut idl::echo::Echoer, req)
    });
    let mut echo = EchoClient::from_transport(
        Erpc::<UdpTransport>::connect_with(&addr, EchoService::DESCRIPTOR, &cfg).unwrap(),
    );
    assert_eq!(echo.ping(41).unwrap(), 41);
    let server = h.join().unwrap();
    assert_eq!(server.transport().endpoint().rpc().num_sessions(), 5);
}

#[test]
fn many_clients_on_one_server() {
    const CLIENTS: u64 = 8;
    const CALLS: u64 = 2_000;
    let (server, addr) = server::<EchoService>(&ErpcConfig::default());
    let h = spawn(server, |req| {
        EchoService::dispatch(&mut idl::echo::Echoer, req)
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            thread::spawn(move || {
                let cfg = ErpcConfig {
                    max_in_flight: 16,
                    ..ErpcConfig::default()
                };
                let mut echo = EchoClient::from_transport(
                    Erpc::<UdpTransport>::connect_with(&addr, EchoService::DESCRIPTOR, &cfg)
                        .unwrap(),
                );
                let depth = echo.max_in_flight();
                let mut seen = vec![false; CALLS as usize];
                let (mut next, mut done) = (0u64, 0u64);
                let deadline = Instant::now() + Duration::from_secs(120);
                while done < CALLS {
                    assert!(Instant::now() < deadline, "client {c} stalled at {done}");
                    while next < CALLS && echo.in_flight() < depth {
                        echo.issue(next).ping((c << 32) | next).unwrap();
                        next += 1;
                    }
                    let n = echo
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
                    if n == 0 {
                        // More threads than cores: let the server and the others run.
                        thread::yield_now();
                    }
                    done += n;
                }
                assert_eq!(echo.ping(c).unwrap(), c);
                done
            })
        })
        .collect();
    let total: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert_eq!(total, CLIENTS * CALLS);
    let server = h.join().unwrap();
    assert_eq!(server.stats().requests, CLIENTS * (CALLS + 1));
    assert_eq!(server.stats().dropped_replies, 0);
}

#[test]
fn lossy_network_every_call_executes_once() {
    // 10% loss in each direction of the client's socket, duplicates, delays and shuffled
    // bursts; at-most-once execution means each put runs exactly once.
    const CALLS: u64 = 2_000;
    let mut cfg = ErpcConfig::default();
    // Generous: a loaded machine plus loss must not look like a dead server.
    cfg.core.failure_timeout = 2_000 * MS;
    cfg.core.keepalive = 100 * MS;
    let t = ErpcServer::bind_with(loopback(), KvService::DESCRIPTOR, &cfg).unwrap();
    let addr = t.local_addr();
    let runs: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let r2 = runs.clone();
    let mut store = Store::default();
    let h = spawn(Server::<KvService, _>::new(t), move |req| {
        if let KvRequest::Put(a) = &req {
            *r2.lock().unwrap().entry(a.key()).or_insert(0) += 1;
        }
        KvService::dispatch(&mut store, req)
    });
    let loss = LossConfig {
        drop: 0.1,
        dup: 0.05,
        delay: 0.1,
        max_delay_calls: 4,
        shuffle: 0.2,
        seed: 7,
    };
    let t = Erpc::<LossyTransport<UdpTransport>>::connect_with(
        &(addr, loss),
        KvService::DESCRIPTOR,
        &cfg,
    )
    .unwrap();
    let mut kv = KvClient::from_transport(t);
    let (mut next, mut done) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(60);
    while done < CALLS {
        assert!(Instant::now() < deadline, "stalled at {done}");
        while next < CALLS && kv.in_flight() < kv.max_in_flight() {
            kv.issue(next).put(0, next, next + 1).unwrap();
            next += 1;
        }
        done += kv
            .poll_with(|_, r| assert_eq!(r.unwrap(), KvResponse::Put(())))
            .unwrap() as u64;
    }
    for k in (0..CALLS).step_by(97) {
        assert_eq!(kv.get(0, k).unwrap(), Some(k + 1));
    }
    let lossy = kv.transport().endpoint().transport().loss_stats();
    let core = kv.transport().endpoint().core_stats().clone();
    eprintln!("{lossy:?}\n{core:?}");
    assert!(lossy.tx_dropped > 0 && lossy.rx_dropped > 0, "{lossy:?}");
    assert!(core.retransmitted_pkts > 0, "{core:?}");
    h.join().unwrap();
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len() as u64, CALLS);
    assert!(runs.values().all(|&n| n == 1), "a put ran twice");
}

#[test]
fn typed_calls_over_mlx5_ud_on_the_device_model() {
    let fabric = Fabric::new(SimConfig::deterministic());
    let serve = |service: &'static rpc::ServiceDescriptor| {
        let dev = fabric.open();
        let t = UdTransport::new(&dev, UdConfig::for_port(&dev.port())).unwrap();
        let ep = Endpoint::new(t, service_config(service, &Config::default())).unwrap();
        ErpcServer::from_endpoint(ep, service).unwrap()
    };
    let kv_server = serve(KvService::DESCRIPTOR);
    let kv_addr = kv_server.local_addr();
    let mut store = Store::default();
    let kv_h = spawn(Server::<KvService, _>::new(kv_server), move |req| {
        KvService::dispatch(&mut store, req)
    });
    let blob_server = serve(BlobService::DESCRIPTOR);
    let blob_addr = blob_server.local_addr();
    let blob_h = spawn(Server::<BlobService, _>::new(blob_server), |req| {
        BlobService::dispatch(&mut Bumper, req)
    });

    let mut kv =
        KvClient::<Erpc<UdTransport>>::connect(&UdConnectAddr::new(fabric.open(), kv_addr))
            .unwrap();
    assert_eq!(kv.get(0, 1).unwrap(), None);
    for k in 0..500 {
        kv.issue(k)
            .put(0, k, k + 1)
            .unwrap_or_else(|e| panic!("{k}: {e}"));
        if kv.in_flight() == kv.max_in_flight() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while kv.in_flight() > 0 {
                assert!(Instant::now() < deadline);
                kv.poll_with(|_, r| assert_eq!(r.unwrap(), KvResponse::Put(())))
                    .unwrap();
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while kv.in_flight() > 0 {
        assert!(Instant::now() < deadline);
        kv.poll_with(|_, r| assert_eq!(r.unwrap(), KvResponse::Put(())))
            .unwrap();
    }
    for k in (0..500).step_by(7) {
        assert_eq!(kv.get(0, k).unwrap(), Some(k + 1));
    }
    // Another service's server refuses the session.
    assert!(matches!(
        EchoClient::<Erpc<UdTransport>>::connect(&UdConnectAddr::new(fabric.open(), kv_addr)),
        Err(RpcError::SchemaMismatch {
            service: "Echo",
            ..
        })
    ));
    // Multi-packet messages (3 packets of at most 3840 B each way).
    let mut blob =
        BlobClient::<Erpc<UdTransport>>::connect(&UdConnectAddr::new(fabric.open(), blob_addr))
            .unwrap();
    for i in 0..20u8 {
        assert_eq!(blob.bump([i; 8192]).unwrap(), [i + 1; 8192]);
    }
    assert!(blob.transport().endpoint().core_stats().rfr_tx >= 20 * 2);
    assert_eq!(kv_h.join().unwrap().stats().requests, 1 + 500 + 72);
    assert_eq!(blob_h.join().unwrap().stats().requests, 20);
}

/// `calls` pipelined `echo256` calls (one message size: the cores' free lists hand back
/// buffers of the right capacity once warm; mixed sizes grow each pooled buffer once).
fn echo_round(echo: &mut EchoClient<Erpc>, calls: u64) {
    let (mut next, mut done) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(60);
    while done < calls {
        assert!(Instant::now() < deadline, "stalled at {done}");
        while next < calls && echo.in_flight() < echo.max_in_flight() {
            echo.issue(next).echo256([next as u8; 256]).unwrap();
            next += 1;
        }
        done += echo
            .poll_with(|tag, r| assert_eq!(r.unwrap(), EchoResponse::Echo256([tag as u8; 256])))
            .unwrap() as u64;
    }
}

#[test]
fn steady_state_calls_allocate_nothing() {
    // Both sides count their own thread's allocations after a warm-up: requests are encoded
    // into the binding's buffers and copied into the session slots' reused buffers; every
    // received message's buffer comes from the core's free list and goes back to it
    // (`Endpoint::recycle`). The free lists grow to the most messages ever out at once (here
    // 32: one per call in flight), so the warm-up includes bursts of 32 received together.
    // Congestion control off: this measures the binding and the core's message path, not
    // the timing wheel.
    let mut cfg = ErpcConfig::default();
    cfg.core.cc_rate_comp = false;
    cfg.core.cc_pacing = false;
    // Not a failure-detection test: a server thread descheduled for a second on a loaded
    // machine (a full `cargo test --workspace` next to other builds) must not end the run
    // with `ServerDisconnected` (the default failure timeout is 1 s).
    cfg.core.failure_timeout = 60_000 * MS;
    let (mut server, addr) = server::<EchoService>(&cfg);
    let stop = Arc::new(AtomicBool::new(false));
    let count_server = Arc::new(AtomicBool::new(false));
    // Pause request (set by the client) and acknowledgement (set by the server).
    let pause = Arc::new((AtomicBool::new(false), AtomicBool::new(false)));
    let (st, cs, pz) = (stop.clone(), count_server.clone(), pause.clone());
    let h = thread::spawn(move || {
        let mut counting = false;
        while !st.load(Ordering::Relaxed) {
            if pz.0.load(Ordering::Relaxed) {
                pz.1.store(true, Ordering::Relaxed);
                thread::sleep(Duration::from_millis(1));
                continue;
            }
            pz.1.store(false, Ordering::Relaxed);
            if !counting && cs.load(Ordering::Relaxed) {
                counting = true;
                COUNTING.with(|c| c.set(true));
            }
            server.serve_once(|req| EchoService::dispatch(&mut idl::echo::Echoer, req));
        }
        COUNTING.with(|c| c.set(false));
        server
    });
    let mut echo = EchoClient::from_transport(
        Erpc::<UdpTransport>::connect_with(&addr, EchoService::DESCRIPTOR, &cfg).unwrap(),
    );
    echo_round(&mut echo, 20_000);
    for round in 0..3u64 {
        // 32 requests reach the paused server together, 32 responses reach the client
        // together.
        pause.0.store(true, Ordering::Relaxed);
        while !pause.1.load(Ordering::Relaxed) {
            thread::yield_now();
        }
        for k in 0..32 {
            echo.issue(k).echo256([k as u8; 256]).unwrap();
        }
        assert_eq!(echo.poll_with(|_, _| panic!("no answer yet")).unwrap(), 0);
        thread::sleep(Duration::from_millis(20));
        pause.0.store(false, Ordering::Relaxed);
        thread::sleep(Duration::from_millis(50));
        let mut done = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while done < 32 {
            assert!(Instant::now() < deadline, "burst {round} stalled at {done}");
            done += echo
                .poll_with(|tag, r| assert_eq!(r.unwrap(), EchoResponse::Echo256([tag as u8; 256])))
                .unwrap();
        }
    }
    count_server.store(true, Ordering::Relaxed);
    // Let the server pass its next round with counting on.
    echo_round(&mut echo, 1_000);
    // Up to three measured phases of 10000 calls: an allocation per call (or per poll)
    // shows in every phase; a one-off growth of a core queue to a new peak (a burst of
    // retransmissions when a thread of this oversubscribed test binary was descheduled)
    // shows in one.
    let mut phases = Vec::new();
    for _ in 0..3 {
        let before = ALLOCS.load(Ordering::Relaxed);
        COUNTING.with(|c| c.set(true));
        echo_round(&mut echo, 10_000);
        COUNTING.with(|c| c.set(false));
        phases.push(ALLOCS.load(Ordering::Relaxed) - before);
        if phases.last() == Some(&0) {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    assert_eq!(
        phases.last(),
        Some(&0),
        "allocations per phase of 10000 calls (client and server threads): {phases:?}"
    );
}

#[test]
fn late_replies_are_dropped_and_a_stopped_server_fails_calls_by_deadline() {
    // A failure timeout far above the 100 ms pause, so that only the deadline can end the
    // call to the stopped server, however slowly a loaded machine runs the test.
    let cfg = ErpcConfig {
        core: Config {
            failure_timeout: 10_000 * MS,
            ..Config::default()
        },
        ..ErpcConfig::default()
    };
    let (server, addr) = server::<KvService>(&cfg);
    let late = typed_common::spawn_late(server);
    let mut kv = KvClient::from_transport(
        Erpc::<UdpTransport>::connect_with(&addr, KvService::DESCRIPTOR, &cfg).unwrap(),
    );
    let took = typed_common::late_and_stopped_server(&mut kv, &late);
    eprintln!("erpc: call to a stopped server failed after {took:?} (deadline 100 ms)");
    late.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    late.handle.join().unwrap();
}

/// Issue 12: a client that saw its server die reconnects explicitly (`Erpc::reconnect`) to a
/// new server at the same address and its calls succeed again; until it does, calls fail at
/// once with `ServerDisconnected` (and `last_failure` says why).
#[test]
fn client_reconnects_after_server_restart() {
    let cfg = short_timeouts();
    let (server, addr) = server::<KvService>(&cfg);
    let h = spawn_kv(server);
    let mut kv = KvClient::from_transport(
        Erpc::<UdpTransport>::connect_with(&addr, KvService::DESCRIPTOR, &cfg).unwrap(),
    );
    kv.put(0, 1, 10).unwrap();
    assert_eq!(kv.get(0, 1).unwrap(), Some(10));
    // The server dies (its socket is closed).
    drop(h.join().unwrap());
    let t0 = Instant::now();
    assert!(matches!(kv.get(0, 1), Err(RpcError::ServerDisconnected)));
    eprintln!(
        "server dead: call failed after {:?} (failure_timeout {} ms)",
        t0.elapsed(),
        cfg.core.failure_timeout / MS
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(kv.transport().is_failed());
    assert_eq!(
        kv.transport().last_failure(),
        Some(rpc::erpc::core::SessionError::PeerFailed)
    );
    // Not reconnected: later calls fail at once.
    let t1 = Instant::now();
    assert!(matches!(
        kv.put(0, 1, 11),
        Err(RpcError::ServerDisconnected)
    ));
    assert!(t1.elapsed() < Duration::from_millis(50));
    // A new server at the same address; the client reconnects and its calls succeed.
    let t = ErpcServer::bind_with(addr, KvService::DESCRIPTOR, &cfg).unwrap();
    assert_eq!(t.local_addr(), addr);
    let h = spawn_kv(Server::new(t));
    kv.transport_mut().reconnect().unwrap();
    assert!(!kv.transport().is_failed());
    assert_eq!(
        kv.get(0, 1).unwrap(),
        None,
        "the new server's store is empty"
    );
    kv.put(0, 2, 20).unwrap();
    assert_eq!(kv.get(0, 2).unwrap(), Some(20));
    // Pipelined calls over every session.
    for k in 0..32 {
        kv.issue(k).put(0, 100 + k, k).unwrap();
    }
    let mut done = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while done < 32 {
        assert!(Instant::now() < deadline);
        done += kv
            .poll_with(|_, r| assert_eq!(r.unwrap(), KvResponse::Put(())))
            .unwrap();
    }
    let st = kv.transport().stats();
    assert_eq!(st.reconnects, 1, "{st:?}");
    assert_eq!(st.failed_calls, 1, "{st:?}");
    let server = h.join().unwrap();
    assert_eq!(server.stats().bad_requests, 0);
    // Reconnecting to nothing: the next call fails within the failure timeout.
    drop(server);
    kv.transport_mut().reconnect().unwrap();
    let t2 = Instant::now();
    assert!(matches!(kv.get(0, 2), Err(RpcError::ServerDisconnected)));
    eprintln!(
        "reconnected to nothing: call failed after {:?}",
        t2.elapsed()
    );
    assert!(t2.elapsed() < Duration::from_secs(5), "{:?}", t2.elapsed());
    assert_eq!(
        kv.transport().last_failure(),
        Some(rpc::erpc::core::SessionError::PeerFailed)
    );
}

/// Issue 12: a client whose UDP MTU differs from the server's is refused at connect with an
/// error naming the field, both values and the client setting to change (before, it
/// connected and its calls were retransmitted forever: the server's full-size response
/// packets exceed the client's MTU).
#[test]
fn mtu_mismatch_refused_at_connect() {
    let (server, addr) = server::<BlobService>(&ErpcConfig::default());
    let server_mtu = server.transport().endpoint().transport().mtu() as u64;
    let h = spawn(server, |req| BlobService::dispatch(&mut Bumper, req));
    // The client re-sends an unanswered connect request every `sm_rto` (10 ms by default),
    // and the server refuses and counts each copy; on a loaded machine the refusal can take
    // longer than that to arrive. A re-send interval longer than any scheduling delay keeps
    // the count below exact: one request per session.
    let base = ErpcConfig::default();
    let cfg = ErpcConfig {
        udp_mtu: Some(1200),
        core: Config {
            sm_rto: 20_000 * MS,
            failure_timeout: 30_000 * MS,
            ..base.core
        },
        connect_timeout: Duration::from_secs(30),
        ..base
    };
    match Erpc::<UdpTransport>::connect_with(&addr, BlobService::DESCRIPTOR, &cfg) {
        Err(
            e @ ErpcSetupError::Refused(rpc::erpc::core::SessionError::ConfigMismatch {
                field: rpc::erpc::core::ConfigField::Mtu,
                client: 1200,
                server,
            }),
        ) if server == server_mtu => {
            // A size set explicitly is not replaced by the server's.
            let msg = e.to_string();
            assert!(
                msg.contains(&format!(
                    "mtu differs: client 1200 bytes, server {server_mtu} bytes"
                )),
                "{msg}"
            );
            assert!(msg.contains("ErpcConfig::udp_mtu"), "{msg}");
        }
        other => panic!("expected an MTU mismatch, got {other:?}"),
    }
    // The matching client works.
    let mut blob = BlobClient::<Erpc>::connect(&addr).unwrap();
    assert_eq!(blob.sum([1; 8192]).unwrap(), Some(8192));
    let server = h.join().unwrap();
    // The refused client asked for its four sessions; the server created none of them.
    assert_eq!(
        server.transport().endpoint().core_stats().connects_refused,
        4
    );
}

/// Issue 12: admission control. A server whose UDP receive buffer holds `E` full-size
/// datagrams admits `E / 8` sessions of 8 credits and refuses the next at the client's
/// connect, with an error saying so, instead of letting bursts overflow its socket buffer.
#[test]
fn server_admits_only_what_its_receive_ring_absorbs() {
    let small = ErpcConfig {
        udp_socket_buf_bytes: Some(64 << 10),
        ..ErpcConfig::default()
    };
    let (server, addr) = server::<KvService>(&small);
    let entries = server.transport().endpoint().transport().rx_ring_entries();
    let admitted = entries / 8;
    assert!((1..64).contains(&admitted), "{entries} entries");
    let h = spawn_kv(server);
    // One session per client (8 calls in flight).
    let cfg = ErpcConfig {
        max_in_flight: 8,
        ..ErpcConfig::default()
    };
    let mut clients = Vec::new();
    for i in 0..admitted {
        let mut kv = KvClient::from_transport(
            Erpc::<UdpTransport>::connect_with(&addr, KvService::DESCRIPTOR, &cfg).unwrap(),
        );
        kv.put(0, i as u64, 1).unwrap();
        clients.push(kv);
    }
    match Erpc::<UdpTransport>::connect_with(&addr, KvService::DESCRIPTOR, &cfg) {
        Err(
            e @ ErpcSetupError::Refused(rpc::erpc::core::SessionError::NoRingEntries {
                ring_entries,
                sessions,
                credits: 8,
            }),
        ) => {
            assert_eq!(ring_entries, entries as u64);
            assert_eq!(sessions, admitted as u64);
            let msg = e.to_string();
            assert!(msg.contains("receive ring holds"), "{msg}");
        }
        other => panic!("expected NoRingEntries, got {other:?}"),
    }
    // The admitted clients keep working.
    for kv in &mut clients {
        assert_eq!(kv.get(0, 0).unwrap(), Some(1));
    }
    let server = h.join().unwrap();
    // At least the one refusal. (The client re-sends its connect request every `sm_rto`, 10
    // ms, until an answer arrives; on a loaded machine a copy can reach the server before the
    // refusal reaches the client, and each copy is refused and counted.)
    let st = server.transport().endpoint().core_stats();
    assert!(st.connects_refused >= 1, "{st:?}");
    assert_eq!(st.connects_refused_source_limit, 0, "{st:?}");
}

/// `ErpcServer::wait_for_request` (the runner's park for an idle eRPC server): waits in the
/// UDP socket until its timeout with nothing to receive, returns when a datagram waits, and
/// declines (so the runner parks) on mlx5 UD, which cannot wait. Calls to a runner-spawned
/// server that went idle are answered.
#[test]
fn an_idle_server_waits_in_its_socket() {
    use rpc::ServerTransport;
    let (mut server, addr) = server::<KvService>(&ErpcConfig::default());
    let t = server.transport_mut();
    let start = Instant::now();
    assert!(t.wait_for_request(Duration::from_millis(2)));
    assert!(
        start.elapsed() >= Duration::from_millis(2),
        "no session, no timer: the full wait"
    );
    assert_eq!(t.stats().idle_waits, 1);

    // A datagram in the socket (not even eRPC: it is dropped when polled) ends the wait.
    let sock = std::net::UdpSocket::bind(loopback()).unwrap();
    sock.send_to(&[0u8; 32], addr).unwrap();
    let start = Instant::now();
    assert!(t.wait_for_request(Duration::from_secs(60)));
    assert!(start.elapsed() < Duration::from_secs(30));
    assert_eq!(t.stats().idle_waits, 2);

    let mut store = Store::default();
    let h = spawn(server, move |req| KvService::dispatch(&mut store, req));
    let mut kv = KvClient::<Erpc>::connect(&addr).unwrap();
    // The server goes idle (its runner's park is now the socket wait; the runner's own test
    // checks that deterministically) and answers the next calls.
    thread::sleep(Duration::from_millis(20));
    assert_eq!(kv.put(0, 1, 2).unwrap(), ());
    assert_eq!(kv.get(0, 1).unwrap(), Some(2));
    h.join().unwrap();

    let fabric = Fabric::new(SimConfig::deterministic());
    let dev = fabric.open();
    let ud = UdTransport::new(&dev, UdConfig::for_port(&dev.port())).unwrap();
    let ep = Endpoint::new(
        ud,
        service_config(KvService::DESCRIPTOR, &Config::default()),
    )
    .unwrap();
    let mut ud_server = ErpcServer::from_endpoint(ep, KvService::DESCRIPTOR).unwrap();
    assert!(
        !ud_server.wait_for_request(Duration::from_secs(60)),
        "UD cannot wait"
    );
    assert_eq!(ud_server.stats().idle_waits, 0);
}

/// A blocking call whose handler takes a while blocks in its socket once it has waited
/// `max_spin` (200 µs) on this machine, and is answered; with `client_idle: None` it polls
/// and yields throughout. (Blocking on an oversubscribed machine, the policy's other case,
/// is tested in virtual time in `rpc::erpc::idle`.)
#[test]
fn a_blocking_call_to_a_slow_handler_waits_in_its_socket() {
    use rpc::erpc::idle::IdleConfig;
    let (server, addr) = server::<KvService>(&ErpcConfig::default());
    let mut store = Store::default();
    let h = spawn(server, move |req| {
        if let KvRequest::Put(_) = &req {
            // The call waits 20 ms: past `max_spin` it blocks, in steps of at most 1 ms
            // (its retransmissions every RTO, 5 ms, are answered as duplicates).
            thread::sleep(Duration::from_millis(20));
        }
        KvService::dispatch(&mut store, req)
    });
    for idle in [Some(IdleConfig::default()), None] {
        let cfg = ErpcConfig {
            client_idle: idle,
            ..ErpcConfig::default()
        };
        let t = Erpc::<UdpTransport>::connect_with(&addr, KvService::DESCRIPTOR, &cfg).unwrap();
        let mut kv = KvClient::from_transport(t);
        kv.put(0, 1, 2).unwrap();
        assert_eq!(kv.get(0, 1).unwrap(), Some(2));
        let waits = kv.transport().stats().idle_waits;
        match kv.transport().call_wait_stats() {
            Some(s) => {
                assert!(waits >= 1, "blocked in the socket: {s:?}");
                assert!(s.blocks >= waits);
            }
            None => {
                assert!(idle.is_none());
                assert_eq!(waits, 0);
            }
        }
    }
    h.join().unwrap();
}

/// A client of two servers waits in both sockets at once (`rpc::erpc::wait_for_any_response`,
/// one `ppoll`): a call in flight to the slow second server completes through waits the
/// first connection counts, and no wait outlives its bound. With the first connection's
/// policy off, the function declines at once.
#[test]
fn a_client_of_two_servers_waits_in_both_sockets() {
    let (fast, fast_addr) = server::<KvService>(&ErpcConfig::default());
    let (slow, slow_addr) = server::<KvService>(&ErpcConfig::default());
    let hf = spawn_kv(fast);
    let mut store = Store::default();
    let hs = spawn(slow, move |req| {
        if let KvRequest::Put(_) = &req {
            thread::sleep(Duration::from_millis(20));
        }
        KvService::dispatch(&mut store, req)
    });
    let connect = |addr: &SocketAddr| {
        KvClient::from_transport(
            Erpc::<UdpTransport>::connect_with(addr, KvService::DESCRIPTOR, &ErpcConfig::default())
                .unwrap(),
        )
    };
    let mut a = connect(&fast_addr);
    let mut b = connect(&slow_addr);
    a.put(0, 1, 1).unwrap();
    b.put(0, 2, 2).unwrap();
    b.issue(7).put(0, 3, 3).unwrap();
    // The blocking put above waited in `b`'s socket on its own.
    let (a0, b0) = (
        a.transport().stats().idle_waits,
        b.transport().stats().idle_waits,
    );
    let t = Instant::now();
    let mut done = None;
    let mut waits = 0;
    while done.is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the slow call never ended"
        );
        // Waited past `max_spin`: the policy says block.
        let clients = [a.transport_mut(), b.transport_mut()];
        if rpc::erpc::wait_for_any_response(clients, Duration::from_secs(1), Duration::from_secs(1))
        {
            waits += 1;
        }
        // The idle connection's event loop runs too (its timers), as `kv`'s clients run
        // theirs (`Daemons::keepalive`): the typed `poll` of a client with nothing in flight
        // does not run it.
        assert_eq!(a.transport_mut().poll(|_, _| {}).unwrap(), 0);
        done = b.poll().unwrap();
    }
    assert_eq!(done.unwrap().0, 7);
    // `true` also when a connection had work at once (not a wait, not counted).
    let counted = a.transport().stats().idle_waits - a0;
    assert!((1..=waits).contains(&counted), "{counted} of {waits}");
    assert_eq!(
        b.transport().stats().idle_waits,
        b0,
        "counted on the first only"
    );
    // The first connection's policy off: declined without waiting.
    a.transport_mut().set_client_idle(None);
    let clients = [a.transport_mut(), b.transport_mut()];
    assert!(!rpc::erpc::wait_for_any_response(
        clients,
        Duration::from_secs(1),
        Duration::from_secs(60)
    ));
    drop((a, b));
    hf.join().unwrap();
    hs.join().unwrap();
}

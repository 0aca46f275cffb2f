//! Issue 17 point 3: the same service meets the same limits on every transport, and every
//! limit error names whose configuration it is and the setting to change.
//!
//! - The typed default client has [`rpc::DEFAULT_CALLS_IN_FLIGHT`] (32) calls in flight on
//!   delegation, ipc, copyrpc, eRPC and ScaleRPC, and the 33rd issued call gets `WouldBlock`
//!   (the server never polls after the connect, so nothing is answered: not timing-dependent).
//! - A service with a 64 KiB argument works on ScaleRPC with the default configuration (slot
//!   size derived from the service).
//! - Capacity errors say "this server's" / "this client's" / "the server's" and name the
//!   setting and the least value that works.

mod typed_common;

use typed_common::connect_polling;

use idl::kv::{KvClient, KvService};
use rpc::copyrpc::{ContextConfig, Copyrpc, CopyrpcAddr, CopyrpcServer, EndpointConfig};
use rpc::delegation::{Delegation, DelegationConfig, DelegationServer, RingConfig, RingServer};
use rpc::erpc::{Erpc, ErpcConfig, ErpcServer, ErpcSetupError, core::Config};
use rpc::ipc::{Ipc, IpcConfig, IpcServer};
use rpc::mlx5::sim::{Fabric, SimConfig};
use rpc::scalerpc::{
    DEFAULT_MAX_CONNS, DEFAULT_SLOTS_PER_CONN, ScaleRpc, ScaleRpcAddr, ScaleRpcServer,
    ServerConfig, derive_slot_size,
};
use rpc::{
    ClientTransport, DEFAULT_CALLS_IN_FLIGHT, LimitSide, MessageKind, RpcError, Server, Service,
    rpc_service,
};

/// A service whose request carries 64 KiB.
#[rpc_service(transport = "scalerpc", derive(Debug, PartialEq, Eq))]
pub trait Big {
    /// Returns the sum of the bytes of `data`.
    fn digest(&self, data: [u8; 65536]) -> u64;
}

struct Summer;

impl BigServer for Summer {
    fn digest(&self, data: [u8; 65536]) -> u64 {
        data.iter().map(|&b| u64::from(b)).sum()
    }
}

fn shm_name(tag: &str) -> String {
    format!("rpc-limits-{}-{tag}", std::process::id())
}

/// With the server not polling: the client reports 32 calls in flight, 32 pipelined calls are
/// accepted, and the 33rd is refused with `WouldBlock`, whose message says it is the
/// client's calls-in-flight limit.
fn thirty_third_call_would_block<T: ClientTransport>(kv: &mut KvClient<T>) {
    assert_eq!(DEFAULT_CALLS_IN_FLIGHT, 32);
    assert_eq!(kv.max_in_flight(), DEFAULT_CALLS_IN_FLIGHT);
    assert_eq!(kv.transport().max_in_flight(), DEFAULT_CALLS_IN_FLIGHT);
    for k in 0..DEFAULT_CALLS_IN_FLIGHT as u64 {
        kv.issue(k)
            .put(0, k, k)
            .unwrap_or_else(|e| panic!("call {k}: {e}"));
    }
    match kv.issue(99).put(0, 99, 99) {
        Err(e @ RpcError::WouldBlock) => {
            let msg = e.to_string();
            assert!(msg.contains("calls-in-flight limit"), "{msg}");
            assert!(msg.contains("max_in_flight()"), "{msg}");
        }
        other => panic!("expected WouldBlock at the 33rd call, got {other:?}"),
    }
}

#[test]
fn delegation_default_is_32_calls_in_flight() {
    let n = shm_name("deleg-depth");
    let _server = DelegationServer::serve::<KvService>(&n, DelegationConfig::default()).unwrap();
    let mut kv = KvClient::<Delegation>::connect(&n).unwrap();
    thirty_third_call_would_block(&mut kv);
}

#[test]
fn ipc_default_is_32_calls_in_flight() {
    let n = shm_name("ipc-depth");
    let _server = IpcServer::serve::<KvService>(&n, IpcConfig::default()).unwrap();
    let mut kv = KvClient::<Ipc>::connect(&n).unwrap();
    thirty_third_call_would_block(&mut kv);
}

#[test]
fn copyrpc_default_is_32_calls_in_flight() {
    let fabric = Fabric::new(SimConfig::default());
    let mut server = CopyrpcServer::serve::<KvService>(
        &fabric.open(),
        ContextConfig::default(),
        EndpointConfig::default(),
    )
    .unwrap();
    let addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    let mut kv = connect_polling(&mut server, move || {
        KvClient::<Copyrpc>::connect(&addr).unwrap()
    });
    thirty_third_call_would_block(&mut kv);
}

#[test]
fn erpc_default_is_32_calls_in_flight() {
    let t = ErpcServer::bind("127.0.0.1:0".parse().unwrap(), KvService::DESCRIPTOR).unwrap();
    let addr = t.local_addr();
    let mut server = Server::<KvService, _>::new(t);
    let mut kv = connect_polling(&mut server, move || {
        KvClient::<Erpc>::connect(&addr).unwrap()
    });
    thirty_third_call_would_block(&mut kv);
}

#[test]
fn scalerpc_default_is_32_calls_in_flight() {
    let fabric = Fabric::new(SimConfig::default());
    let cfg = ServerConfig::default();
    assert_eq!(cfg.slots_per_conn, 33);
    assert_eq!(cfg.slots_per_conn, DEFAULT_SLOTS_PER_CONN);
    assert_eq!(cfg.max_conns, 256);
    assert_eq!(cfg.max_conns, DEFAULT_MAX_CONNS);
    assert_eq!(cfg.slot_size, None);
    let mut server = ScaleRpcServer::serve::<KvService>(&fabric.open(), cfg).unwrap();
    // Derived from the service, not the untyped 4096.
    assert_eq!(
        Some(server.transport().scale_server().slot_size()),
        derive_slot_size(KvService::DESCRIPTOR)
    );
    let addr = ScaleRpcAddr::new(fabric.open(), server.transport().listener());
    let mut kv = connect_polling(&mut server, move || {
        KvClient::<ScaleRpc>::connect(&addr).unwrap()
    });
    // One group (256 connections fit the model's derived group size of 400): the
    // connection is active from the connect on, so only the calls-in-flight limit refuses.
    assert!(kv.transport().is_active());
    thirty_third_call_would_block(&mut kv);
}

/// A 64 KiB argument on ScaleRPC's default configuration: the slot size is derived from the
/// service (the smallest multiple of 64 B carrying its request: 65544 B of message, 40 B of
/// header and trailer), and the request's length travels beyond the seed's 16-bit field.
#[test]
fn scalerpc_carries_a_64_kib_argument_at_the_default_configuration() {
    let need = BigService::DESCRIPTOR.max_request_bytes;
    assert!(need > 65536, "{need}");
    let derived = derive_slot_size(BigService::DESCRIPTOR).unwrap();
    assert_eq!(derived as usize, (need + 40).next_multiple_of(64));
    assert_eq!(ServerConfig::default().slot_size, None);
    let fabric = Fabric::new(SimConfig::default());
    // Only max_conns lowered, to keep the pool small (the default 256 connections × 33
    // slots × 65600 B would register 554 MB).
    let cfg = ServerConfig {
        max_conns: 2,
        ..ServerConfig::default()
    };
    let server = ScaleRpcServer::serve::<BigService>(&fabric.open(), cfg).unwrap();
    assert_eq!(server.transport().scale_server().slot_size(), derived);
    let addr = ScaleRpcAddr::new(fabric.open(), server.transport().listener());
    let h = typed_common::spawn(server, |req| BigService::dispatch(&mut Summer, req));
    let mut big = BigClient::<ScaleRpc>::connect(&addr).unwrap();
    assert_eq!(big.max_in_flight(), 32);
    let mut data = [0u8; 65536];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let want: u64 = data.iter().map(|&b| u64::from(b)).sum();
    assert_eq!(big.digest(data).unwrap(), want);
    // The last byte counts: the whole 64 KiB arrived.
    data[65535] = 250;
    assert_eq!(
        big.digest(data).unwrap(),
        want - u64::from(65535u32 % 251) + 250
    );
    drop(big);
    h.join().unwrap();
}

/// ScaleRPC with `slot_size: Some(4096)`: refused at server start, naming this server's
/// configuration, the setting and the least slot size.
#[test]
fn scalerpc_explicit_slot_size_too_small_names_the_server_setting() {
    let fabric = Fabric::new(SimConfig::default());
    let cfg = ServerConfig {
        max_conns: 2,
        slot_size: Some(4096),
        ..ServerConfig::default()
    };
    let derived = derive_slot_size(BigService::DESCRIPTOR).unwrap();
    match ScaleRpcServer::serve::<BigService>(&fabric.open(), cfg) {
        Err(
            e @ RpcError::CapacityMismatch {
                what: MessageKind::Request,
                side: LimitSide::ThisServer,
                cap: 4056,
                min: Some(min),
                ..
            },
        ) => {
            assert_eq!(min, u64::from(derived));
            let msg = e.to_string();
            let want = format!(
                "service Big: this server's request capacity is 4056 B, the service needs {} B: \
                 set ScaleRPC ServerConfig::slot_size to at least {derived}",
                BigService::DESCRIPTOR.max_request_bytes
            );
            assert_eq!(msg, want);
        }
        Err(e) => panic!("expected CapacityMismatch, got {e}"),
        Ok(_) => panic!("expected CapacityMismatch, got a server"),
    }
    // The size named is the least that works.
    for (size, ok) in [(derived - 64, false), (derived, true)] {
        let cfg = ServerConfig {
            max_conns: 2,
            slot_size: Some(size),
            ..ServerConfig::default()
        };
        let r = ScaleRpcServer::serve::<BigService>(&fabric.open(), cfg);
        assert_eq!(r.is_ok(), ok, "slot_size {size}");
    }
}

/// The least ring size that carries `need` bytes of payload inline with the default
/// reservation: the payload cap is `ring / 4 - 44` B.
fn min_ring(need: usize) -> u64 {
    (4 * (need as u64 + 44)).next_power_of_two()
}

/// copyrpc with large messages off (`max_large_message: 0`, issue 15): a ring too small for
/// the inline message, at the server (at creation) and at the client (before it sends
/// anything), names the side, `EndpointConfig::ring_size` and the least ring size.
#[test]
fn copyrpc_ring_too_small_names_side_and_setting() {
    let need = BigService::DESCRIPTOR.max_request_bytes;
    let want_min = min_ring(need);
    let fabric = Fabric::new(SimConfig::default());
    let small = EndpointConfig {
        ring_size: 64 << 10,
        max_large_message: 0,
        ..EndpointConfig::default()
    };
    match CopyrpcServer::serve::<BigService>(&fabric.open(), ContextConfig::default(), small) {
        Err(
            e @ RpcError::CapacityMismatch {
                what: MessageKind::Request,
                side: LimitSide::ThisServer,
                setting: "copyrpc EndpointConfig::ring_size",
                min: Some(min),
                ..
            },
        ) => {
            assert_eq!(min, want_min);
            let msg = e.to_string();
            assert!(
                msg.starts_with("service Big: this server's request capacity is"),
                "{msg}"
            );
            assert!(
                msg.ends_with(&format!(
                    "set copyrpc EndpointConfig::ring_size to at least {want_min}"
                )),
                "{msg}"
            );
        }
        Err(e) => panic!("expected CapacityMismatch, got {e}"),
        Ok(_) => panic!("expected CapacityMismatch, got a server"),
    }
    // A server whose 1 MiB rings carry the service; a client with 64 KiB rings.
    let server = CopyrpcServer::serve::<BigService>(
        &fabric.open(),
        ContextConfig::default(),
        EndpointConfig::default(),
    )
    .unwrap();
    let mut addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    addr.endpoint = small;
    match BigClient::<Copyrpc>::connect(&addr) {
        Err(
            e @ RpcError::CapacityMismatch {
                side: LimitSide::ThisClient,
                setting: "copyrpc EndpointConfig::ring_size",
                min: Some(min),
                ..
            },
        ) => {
            assert_eq!(min, want_min);
            let msg = e.to_string();
            assert!(msg.contains("this client's request capacity"), "{msg}");
            assert!(
                msg.ends_with(&format!(
                    "set copyrpc EndpointConfig::ring_size to at least {want_min}"
                )),
                "{msg}"
            );
        }
        Err(e) => panic!("expected CapacityMismatch, got {e}"),
        Ok(_) => panic!("expected CapacityMismatch, connected"),
    }
    // The ring size named is the least that works.
    for (ring, ok) in [(want_min / 2, false), (want_min, true)] {
        let cfg = EndpointConfig {
            ring_size: ring as usize,
            max_large_message: 0,
            ..EndpointConfig::default()
        };
        let r = CopyrpcServer::serve::<BigService>(&fabric.open(), ContextConfig::default(), cfg);
        assert_eq!(r.is_ok(), ok, "ring_size {ring}");
    }
}

/// copyrpc with large messages (issue 15): 64 KiB rings, whose inline limit is 16 340 B,
/// carry the 64 KiB argument by rendezvous at the default large-message limit (8 MiB); a
/// large-message limit below the service's request is refused at the server and at the
/// client, naming the side, `EndpointConfig::max_large_message` and the least value.
#[test]
fn copyrpc_large_message_limit_names_side_and_setting() {
    let need = BigService::DESCRIPTOR.max_request_bytes;
    let fabric = Fabric::new(SimConfig::default());
    let rings = EndpointConfig {
        ring_size: 64 << 10,
        ..EndpointConfig::default()
    };
    let server =
        CopyrpcServer::serve::<BigService>(&fabric.open(), ContextConfig::default(), rings)
            .unwrap();
    let mut addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    addr.endpoint = rings;
    let h = typed_common::spawn(server, |req| BigService::dispatch(&mut Summer, req));
    let mut big = BigClient::<Copyrpc>::connect(&addr).unwrap();
    let cap = big
        .transport()
        .context()
        .endpoint(big.transport().endpoint())
        .unwrap()
        .max_payload() as usize;
    assert!(cap < need, "inline limit {cap} B, request {need} B");
    let mut data = [0u8; 65536];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let want: u64 = data.iter().map(|&b| u64::from(b)).sum();
    assert_eq!(big.digest(data).unwrap(), want);
    data[65535] = 250;
    assert_eq!(
        big.digest(data).unwrap(),
        want - u64::from(65535u32 % 251) + 250
    );
    assert_eq!(big.transport().context().stats().rendezvous_sent, 2);
    drop(big);
    h.join().unwrap();

    let limited = EndpointConfig {
        max_large_message: 32 << 10,
        ..rings
    };
    let want_msg = |side: &str| {
        format!(
            "service Big: {side} request capacity is 32768 B, the service needs {need} B: \
             set copyrpc EndpointConfig::max_large_message to at least {need}"
        )
    };
    match CopyrpcServer::serve::<BigService>(&fabric.open(), ContextConfig::default(), limited) {
        Err(
            e @ RpcError::CapacityMismatch {
                what: MessageKind::Request,
                side: LimitSide::ThisServer,
                setting: "copyrpc EndpointConfig::max_large_message",
                cap: 32768,
                ..
            },
        ) => assert_eq!(e.to_string(), want_msg("this server's")),
        Err(e) => panic!("expected CapacityMismatch, got {e}"),
        Ok(_) => panic!("expected CapacityMismatch, got a server"),
    }
    let server =
        CopyrpcServer::serve::<BigService>(&fabric.open(), ContextConfig::default(), rings)
            .unwrap();
    let mut addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    addr.endpoint = limited;
    match BigClient::<Copyrpc>::connect(&addr) {
        Err(
            e @ RpcError::CapacityMismatch {
                side: LimitSide::ThisClient,
                ..
            },
        ) => assert_eq!(e.to_string(), want_msg("this client's")),
        Err(e) => panic!("expected CapacityMismatch, got {e}"),
        Ok(_) => panic!("expected CapacityMismatch, connected"),
    }
    // The limit named is the least that works.
    for (limit, ok) in [(need - 1, false), (need, true)] {
        let cfg = EndpointConfig {
            max_large_message: limit as u32,
            ..rings
        };
        let r = CopyrpcServer::serve::<BigService>(&fabric.open(), ContextConfig::default(), cfg);
        assert_eq!(r.is_ok(), ok, "max_large_message {limit}");
    }
}

/// eRPC: a service whose messages exceed `max_msg_size` is refused at the server and at the
/// client, naming the side, `Config::max_msg_size` and the least value.
#[test]
fn erpc_message_over_max_msg_size_names_side_and_setting() {
    let need = BigService::DESCRIPTOR.max_request_bytes;
    let small = ErpcConfig {
        core: Config {
            max_msg_size: 32 << 10,
            ..Config::default()
        },
        ..ErpcConfig::default()
    };
    let e = ErpcServer::bind_with(
        "127.0.0.1:0".parse().unwrap(),
        BigService::DESCRIPTOR,
        &small,
    )
    .err()
    .unwrap();
    assert!(
        matches!(
            e,
            ErpcSetupError::Capacity {
                side: LimitSide::ThisServer,
                cap: 32768,
                ..
            }
        ),
        "{e}"
    );
    let msg = e.into_rpc_error().to_string();
    assert_eq!(
        msg,
        format!(
            "service Big: this server's request capacity is 32768 B, the service needs {need} B: \
             set eRPC Config::max_msg_size to at least {need}"
        )
    );
    let e = Erpc::<rpc::erpc::datagram::udp::UdpTransport>::connect_with(
        &"127.0.0.1:9".parse().unwrap(),
        BigService::DESCRIPTOR,
        &small,
    )
    .err()
    .unwrap();
    let msg = e.into_rpc_error().to_string();
    assert!(
        msg.starts_with("service Big: this client's request capacity is 32768 B"),
        "{msg}"
    );
    assert!(
        msg.ends_with(&format!("set eRPC Config::max_msg_size to at least {need}")),
        "{msg}"
    );
}

/// Delegation and ipc size their slots from the server's service: a ring made with smaller
/// capacities (another definition of the service) is refused at attach, naming the server's
/// capacity and where it comes from.
#[test]
fn delegation_and_ipc_capacity_errors_name_the_server() {
    let d = KvService::DESCRIPTOR;
    let n = shm_name("deleg-cap");
    let _ring = RingServer::create(
        &n,
        &RingConfig {
            req_payload_cap: 4,
            fingerprint: d.fingerprint,
            ..RingConfig::default()
        },
    )
    .unwrap();
    let msg = match <Delegation as ClientTransport>::connect(n.as_str(), d) {
        Err(
            e @ RpcError::CapacityMismatch {
                side: LimitSide::PeerServer,
                cap: 4,
                min: None,
                ..
            },
        ) => e.to_string(),
        Err(e) => panic!("expected CapacityMismatch, got {e}"),
        Ok(_) => panic!("expected CapacityMismatch, attached"),
    };
    assert!(
        msg.starts_with("service Kv: the server's request capacity is 4 B"),
        "{msg}"
    );
    assert!(
        msg.contains("derived from its own service descriptor"),
        "{msg}"
    );
    let n = shm_name("ipc-cap");
    let _ipc = IpcServer::create_raw(&n, IpcConfig::default(), d.fingerprint, 64, 4).unwrap();
    let msg = match <Ipc as ClientTransport>::connect(n.as_str(), d) {
        Err(
            e @ RpcError::CapacityMismatch {
                what: MessageKind::Response,
                side: LimitSide::PeerServer,
                cap: 4,
                ..
            },
        ) => e.to_string(),
        Err(e) => panic!("expected CapacityMismatch, got {e}"),
        Ok(_) => panic!("expected CapacityMismatch, attached"),
    };
    assert!(
        msg.starts_with("service Kv: the server's response capacity is 4 B"),
        "{msg}"
    );
}

//! The README's RDMA setup, exactly as shown there (`Fabric::new(Default::default())`, default
//! context, endpoint and server configurations, no progress thread asked for), detects a dead
//! server: a blocking call to a server that was dropped, or that took the call and was then
//! dropped, ends with `RpcError::ServerDisconnected` within [`BOUND`] (issue 17, point 2).
//!
//! Real RC hardware reports retry-exceeded on its own (its retransmission timer); the device
//! model does the same by default through its progress thread
//! (`SimConfig::default().progress_thread`). Each blocking call runs on its own thread and the
//! test waits for it at most [`BOUND`], so a call that would hang fails the test instead.

mod typed_common;

use typed_common::Store;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use idl::kv::{KvClient, KvService};
use rpc::copyrpc::{ContextConfig, Copyrpc, CopyrpcAddr, CopyrpcServer, EndpointConfig};
use rpc::scalerpc::{ScaleRpc, ScaleRpcAddr, ScaleRpcServer, ServerConfig};
use rpc::{RpcError, Server, ServerTransport, Service};

/// The longest a blocking call to a dead server may take (the model reports retry-exceeded
/// in about 0.1 s; the bound leaves room for a loaded machine).
const BOUND: Duration = Duration::from_secs(5);

/// Connects with `connect` on another thread while this one polls `server`.
fn connect_polling<S: Service, T: ServerTransport, C: Send + 'static, A: Clone + Send + 'static>(
    server: &mut Server<S, T>,
    addr: &A,
    connect: fn(&A) -> Result<C, RpcError>,
) -> C {
    let addr = addr.clone();
    typed_common::connect_polling_within(server, BOUND, move || connect(&addr)).expect("connect")
}

/// One put and get through `server` (served on this thread), proving the connection works.
fn works<T: ServerTransport, C: rpc::ClientTransport + Send + 'static>(
    server: &mut Server<KvService, T>,
    kv: KvClient<C>,
) -> KvClient<C> {
    let mut store = Store::default();
    let h = thread::spawn(move || {
        let mut kv = kv;
        kv.put(0, 1, 7).unwrap();
        assert_eq!(kv.get(0, 1).unwrap(), Some(7));
        kv
    });
    let deadline = Instant::now() + BOUND;
    while !h.is_finished() {
        assert!(
            Instant::now() < deadline,
            "calls to a live server did not finish"
        );
        server.serve_once(|req| KvService::dispatch(&mut store, req));
        thread::yield_now();
    }
    h.join().unwrap()
}

/// Runs a blocking `get` on its own thread and returns its result, or fails the test if it
/// has not ended within [`BOUND`] (the thread is then left blocked; the test has failed).
fn blocking_get_ends<C: rpc::ClientTransport + Send + 'static>(
    mut kv: KvClient<C>,
    before_waiting: impl FnOnce(),
) -> (Result<Option<u64>, RpcError>, Duration) {
    let (tx, rx) = mpsc::channel();
    let t0 = Instant::now();
    thread::spawn(move || {
        let r = kv.get(0, 1);
        let _ = tx.send((r, t0.elapsed()));
    });
    before_waiting();
    match rx.recv_timeout(BOUND) {
        Ok(r) => r,
        Err(_) => panic!("a blocking call to a dead server was still waiting after {BOUND:?}"),
    }
}

/// Takes one request from `server` (never answering it), then drops the server.
fn take_one_and_drop<T: ServerTransport>(mut server: Server<KvService, T>) {
    let deadline = Instant::now() + BOUND;
    loop {
        assert!(Instant::now() < deadline, "the request did not arrive");
        server.poll();
        if server.recv().is_some() {
            break;
        }
        thread::yield_now();
    }
    drop(server);
}

/// The README's copyrpc setup, line for line (`KvService` from the `idl` crate).
fn readme_copyrpc() -> (
    rpc::mlx5::sim::Fabric,
    Server<KvService, CopyrpcServer>,
    KvClient<Copyrpc>,
) {
    let fabric = rpc::mlx5::sim::Fabric::new(Default::default());
    let mut server = CopyrpcServer::serve::<KvService>(
        &fabric.open(),
        ContextConfig::default(),
        EndpointConfig::default(),
    )
    .unwrap();
    let addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    let kv = connect_polling(&mut server, &addr, KvClient::<Copyrpc>::connect);
    let kv = works(&mut server, kv);
    (fabric, server, kv)
}

/// The same with ScaleRPC (`ScaleRpcServer::serve` with `ServerConfig::default()`).
fn readme_scalerpc() -> (
    rpc::mlx5::sim::Fabric,
    Server<KvService, ScaleRpcServer>,
    KvClient<ScaleRpc>,
) {
    let fabric = rpc::mlx5::sim::Fabric::new(Default::default());
    let mut server =
        ScaleRpcServer::serve::<KvService>(&fabric.open(), ServerConfig::default()).unwrap();
    let addr = ScaleRpcAddr::new(fabric.open(), server.transport().listener());
    let kv = connect_polling(&mut server, &addr, KvClient::<ScaleRpc>::connect);
    let kv = works(&mut server, kv);
    (fabric, server, kv)
}

fn assert_disconnected(r: (Result<Option<u64>, RpcError>, Duration)) {
    let (r, took) = r;
    eprintln!("blocking call ended after {took:?}: {r:?}");
    assert!(
        matches!(r, Err(RpcError::ServerDisconnected)),
        "expected ServerDisconnected, got {r:?}"
    );
    assert!(took < BOUND);
}

#[test]
fn copyrpc_blocking_call_to_dropped_server_ends() {
    let (_fabric, server, kv) = readme_copyrpc();
    drop(server);
    assert_disconnected(blocking_get_ends(kv, || {}));
}

#[test]
fn copyrpc_blocking_call_pending_when_server_dies_ends() {
    let (_fabric, server, kv) = readme_copyrpc();
    assert_disconnected(blocking_get_ends(kv, move || take_one_and_drop(server)));
}

#[test]
fn scalerpc_blocking_call_to_dropped_server_ends() {
    let (_fabric, server, kv) = readme_scalerpc();
    drop(server);
    assert_disconnected(blocking_get_ends(kv, || {}));
}

#[test]
fn scalerpc_blocking_call_pending_when_server_dies_ends() {
    let (_fabric, server, kv) = readme_scalerpc();
    assert_disconnected(blocking_get_ends(kv, move || take_one_and_drop(server)));
}

/// Issues a pipelined `get` with a [`BOUND`] deadline, lets `server` take it and die, then
/// polls once every 20 ms, as a client doing other work between polls would. Returns what the
/// polls ended with and how many there were. A liveness check gated on a count of empty polls
/// alone (1024 of them: 20 s here) would let the call's deadline pass first; the check runs
/// by time ([`rpc::ClientTransport::idle_tick`]), so the dead server is reported.
fn slow_poller_sees<C: rpc::ClientTransport, T: ServerTransport>(
    server: Server<KvService, T>,
    mut kv: KvClient<C>,
) -> (RpcError, u32) {
    let mut server = server;
    kv.issue(9).with_deadline(BOUND).get(0, 1).unwrap();
    // The client's polls send what it issued; the server takes the request and dies.
    let deadline = Instant::now() + BOUND;
    loop {
        assert!(Instant::now() < deadline, "the request did not arrive");
        assert!(matches!(kv.poll(), Ok(None)));
        server.poll();
        if server.recv().is_some() {
            break;
        }
    }
    drop(server);
    let mut polls = 0;
    loop {
        polls += 1;
        match kv.poll() {
            Ok(None) => thread::sleep(Duration::from_millis(20)),
            Ok(Some(r)) => panic!("a dead server answered: {r:?}"),
            Err(e) => return (e, polls),
        }
    }
}

#[test]
fn copyrpc_slow_poller_notices_dead_server() {
    let (_fabric, server, kv) = readme_copyrpc();
    let (e, polls) = slow_poller_sees(server, kv);
    eprintln!("ended after {polls} polls: {e:?}");
    assert!(matches!(e, RpcError::ServerDisconnected), "got {e:?}");
}

#[test]
fn scalerpc_slow_poller_notices_dead_server() {
    let (_fabric, server, kv) = readme_scalerpc();
    let (e, polls) = slow_poller_sees(server, kv);
    eprintln!("ended after {polls} polls: {e:?}");
    assert!(matches!(e, RpcError::ServerDisconnected), "got {e:?}");
}

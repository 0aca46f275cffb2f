//! Instructions per call of a 32 B `&[u8]` argument against the same call with a `[u8; 32]`
//! argument (issue 15 §3), for `scripts/callgrind-varlen.sh`.
//!
//! Two one-method services differ only in the argument's type:
//! `SlicePut::put(data: &[u8]) -> u64` (variable-length: the request carries a
//! [`rpc::varlen::WireSlice`] and the bytes after it, default `max_var_bytes`) and
//! `ArrayPut::put(data: [u8; 32]) -> u64` (fixed-size). Both run on the delegation ring (the
//! default) or on copyrpc over the device model (`copyrpc`, no progress thread), queue depth
//! 1, the server on the zero-copy path (`dispatch_raw`), and both handlers compute the same
//! value from the same 32 bytes. One thread does everything in lock step (issue, then server
//! round and client poll until the response is there: one round on the ring; on copyrpc the
//! client's first poll sends the request), so a count has no spin-wait in it; each step is an
//! `#[inline(never)]` function (`client_issue_*`, `server_serve_*`, `client_complete_*`) that
//! callgrind counts alone (`--toggle-collect`).
//!
//! ```text
//! cargo build --release --example varlen_lockstep
//! target/release/examples/varlen_lockstep slice 100000            # or: array
//! target/release/examples/varlen_lockstep slice 100000 copyrpc    # on the device model
//! scripts/callgrind-varlen.sh 100000 [delegation|copyrpc]         # instructions per call
//! ```
//! Without valgrind the binary prints its own wall-clock figure per lock-step call.

use std::cell::RefCell;
use std::hint::black_box;
use std::time::{Duration, Instant};

use rpc::copyrpc::{ContextConfig, Copyrpc, CopyrpcAddr, CopyrpcServer, EndpointConfig};
use rpc::delegation::{Delegation, DelegationConfig, DelegationServer};
use rpc::mlx5::sim::{Fabric, SimConfig};
use rpc::{ClientTransport, Server, ServerTransport, Service, rpc_service};

/// Argument bytes.
const N: usize = 32;
/// copyrpc ring size, bytes (seeds/001 default).
const COPYRPC_RING: usize = 1 << 20;

#[rpc_service(transport = "delegation")]
pub trait SlicePut {
    /// Returns [`value`] of `data`.
    fn put(&mut self, data: &[u8]) -> u64;
}

#[rpc_service(transport = "delegation")]
pub trait ArrayPut {
    /// Returns [`value`] of `data`.
    fn put(&mut self, data: [u8; 32]) -> u64;
}

/// What both handlers return: the length and the first and last bytes, mixed.
fn value(d: &[u8]) -> u64 {
    let (first, last) = (d.first().copied(), d.last().copied());
    d.len() as u64 ^ (u64::from(first.unwrap_or(0)) << 8) ^ (u64::from(last.unwrap_or(0)) << 16)
}

struct Handler;

impl SlicePutServer for Handler {
    fn put(&mut self, data: &[u8]) -> u64 {
        value(data)
    }
}

impl ArrayPutServer for Handler {
    fn put(&mut self, data: [u8; 32]) -> u64 {
        value(&data)
    }
}

/// Most rounds (server round + client poll) one call may take before the driver gives up.
const MAX_ROUNDS: u32 = 64;

#[inline(never)]
fn client_issue_slice<T: ClientTransport>(c: &mut SlicePutClient<T>, tag: u64, data: &[u8]) {
    c.issue(tag).put(data).unwrap();
}

#[inline(never)]
fn server_serve_slice<T: ServerTransport>(s: &mut Server<SlicePutService, T>, h: &mut Handler) {
    s.serve_once_raw(|msg, out| SlicePutService::dispatch_raw(h, msg, out));
}

#[inline(never)]
fn client_complete_slice<T: ClientTransport>(c: &mut SlicePutClient<T>) -> Option<(u64, u64)> {
    c.poll()
        .unwrap()
        .map(|(tag, SlicePutResponse::Put(v))| (tag, v))
}

#[inline(never)]
fn client_issue_array<T: ClientTransport>(c: &mut ArrayPutClient<T>, tag: u64, data: &[u8; N]) {
    c.issue(tag).put(*data).unwrap();
}

#[inline(never)]
fn server_serve_array<T: ServerTransport>(s: &mut Server<ArrayPutService, T>, h: &mut Handler) {
    s.serve_once_raw(|msg, out| ArrayPutService::dispatch_raw(h, msg, out));
}

#[inline(never)]
fn client_complete_array<T: ClientTransport>(c: &mut ArrayPutClient<T>) -> Option<(u64, u64)> {
    c.poll()
        .unwrap()
        .map(|(tag, ArrayPutResponse::Put(v))| (tag, v))
}

/// Runs `n` lock-step calls: issue, then server round and client poll until the response is
/// there (delegation: one round; copyrpc: the client's first poll sends the request).
fn lockstep(
    n: u64,
    data: &mut [u8; N],
    mut issue: impl FnMut(u64, &[u8; N]),
    mut serve: impl FnMut(),
    mut complete: impl FnMut() -> Option<(u64, u64)>,
) -> u64 {
    let mut sum = 0u64;
    for i in 0..n {
        data[0] = i as u8;
        issue(i, data);
        let mut rounds = 0;
        let (tag, v) = loop {
            serve();
            if let Some(r) = complete() {
                break r;
            }
            rounds += 1;
            assert!(
                rounds < MAX_ROUNDS,
                "call {i}: no response after {rounds} rounds"
            );
        };
        assert_eq!((tag, v), (i, value(data)));
        sum = sum.wrapping_add(v);
    }
    sum
}

/// A connected copyrpc server and client of service `S` on the model (no progress thread),
/// rings of `ring` bytes, one call in flight.
fn copyrpc_pair<S: Service, C: Send + 'static>(
    fabric: &Fabric,
    ring: usize,
    connect: impl FnOnce(&CopyrpcAddr) -> C + Send + 'static,
) -> (Server<S, CopyrpcServer>, C) {
    let endpoint = EndpointConfig {
        ring_size: ring,
        ..EndpointConfig::default()
    };
    let mut server =
        CopyrpcServer::serve::<S>(&fabric.open(), ContextConfig::default(), endpoint).unwrap();
    let mut addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    addr.endpoint = endpoint;
    addr.max_in_flight = 1;
    addr.probe_interval = None;
    let h = std::thread::spawn(move || connect(&addr));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !h.is_finished() {
        assert!(Instant::now() < deadline, "copyrpc connect did not finish");
        server.poll();
        fabric.progress();
        std::thread::yield_now();
    }
    (server, h.join().unwrap())
}

fn main() {
    let mut args = std::env::args().skip(1);
    let variant = args.next().unwrap_or_else(|| "slice".into());
    let n: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let transport = args.next().unwrap_or_else(|| "delegation".into());
    let name = format!("varlen-lockstep-{}", std::process::id());
    let fabric = Fabric::new(SimConfig::deterministic());
    let mut data = [0u8; N];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i * 7 + 1) as u8;
    }
    let h = RefCell::new(Handler);
    let t0 = Instant::now();
    let sum = match (variant.as_str(), transport.as_str()) {
        ("slice", "delegation") => {
            let mut s =
                DelegationServer::serve::<SlicePutService>(&name, DelegationConfig::default())
                    .unwrap();
            let c = RefCell::new(SlicePutClient::<Delegation>::connect(&name).unwrap());
            lockstep(
                n,
                &mut data,
                |i, d| client_issue_slice(&mut c.borrow_mut(), i, d),
                || server_serve_slice(&mut s, &mut h.borrow_mut()),
                || client_complete_slice(&mut c.borrow_mut()),
            )
        }
        ("array", "delegation") => {
            let mut s =
                DelegationServer::serve::<ArrayPutService>(&name, DelegationConfig::default())
                    .unwrap();
            let c = RefCell::new(ArrayPutClient::<Delegation>::connect(&name).unwrap());
            lockstep(
                n,
                &mut data,
                |i, d| client_issue_array(&mut c.borrow_mut(), i, d),
                || server_serve_array(&mut s, &mut h.borrow_mut()),
                || client_complete_array(&mut c.borrow_mut()),
            )
        }
        ("slice", "copyrpc") => {
            let (mut s, c) = copyrpc_pair::<SlicePutService, _>(&fabric, COPYRPC_RING, |a| {
                SlicePutClient::<Copyrpc>::connect(a).unwrap()
            });
            let c = RefCell::new(c);
            lockstep(
                n,
                &mut data,
                |i, d| client_issue_slice(&mut c.borrow_mut(), i, d),
                || server_serve_slice(&mut s, &mut h.borrow_mut()),
                || client_complete_slice(&mut c.borrow_mut()),
            )
        }
        ("array", "copyrpc") => {
            let (mut s, c) = copyrpc_pair::<ArrayPutService, _>(&fabric, COPYRPC_RING, |a| {
                ArrayPutClient::<Copyrpc>::connect(a).unwrap()
            });
            let c = RefCell::new(c);
            lockstep(
                n,
                &mut data,
                |i, d| client_issue_array(&mut c.borrow_mut(), i, d),
                || server_serve_array(&mut s, &mut h.borrow_mut()),
                || client_complete_array(&mut c.borrow_mut()),
            )
        }
        (v, t) => {
            eprintln!(
                "usage: varlen_lockstep slice|array [calls] [delegation|copyrpc]  (got {v} {t})"
            );
            std::process::exit(2);
        }
    };
    black_box(sum);
    let el = t0.elapsed();
    let request_bytes = match variant.as_str() {
        "slice" => SlicePutService::DESCRIPTOR.max_request_bytes,
        _ => ArrayPutService::DESCRIPTOR.max_request_bytes,
    };
    println!(
        "{variant} on {transport}: {n} calls verified in {:.3} s ({:.1} ns per lock-step call incl. server), largest request {request_bytes} B",
        el.as_secs_f64(),
        el.as_nanos() as f64 / n as f64,
    );
}

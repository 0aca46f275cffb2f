//! Instructions per call of a 32 B `&[u8]` argument against the same call with a `[u8; 32]`
//! argument (issue 15 §3), for `scripts/callgrind-varlen.sh`.
//!
//! Two one-method services differ only in the argument's type:
//! `SlicePut::put(data: &[u8]) -> u64` (variable-length: the request carries a
//! [`rpc::varlen::WireSlice`] and the bytes after it, default `max_var_bytes`) and
//! `ArrayPut::put(data: [u8; 32]) -> u64` (fixed-size). Both run on the delegation ring, queue
//! depth 1, the server on the zero-copy path (`dispatch_raw`), and both handlers compute the
//! same value from the same 32 bytes. One thread does everything in lock step (issue → one
//! server round → complete), so a count has no spin-wait in it; each step is an
//! `#[inline(never)]` function (`client_issue_*`, `server_serve_*`, `client_complete_*`) that
//! callgrind counts alone (`--toggle-collect`).
//!
//! ```text
//! cargo build --release --example varlen_lockstep
//! target/release/examples/varlen_lockstep slice 100000    # or: array
//! scripts/callgrind-varlen.sh 100000                      # instructions per call, both
//! ```
//! Without valgrind the binary prints its own wall-clock figure per lock-step call.

use std::hint::black_box;
use std::time::Instant;

use rpc::delegation::{Delegation, DelegationConfig, DelegationServer};
use rpc::{Server, Service, rpc_service};

/// Argument bytes.
const N: usize = 32;

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

#[inline(never)]
fn client_issue_slice(c: &mut SlicePutClient<Delegation>, tag: u64, data: &[u8]) {
    c.issue(tag).put(data).unwrap();
}

#[inline(never)]
fn server_serve_slice(s: &mut Server<SlicePutService, DelegationServer>, h: &mut Handler) {
    let n = s.serve_once_raw(|msg, out| SlicePutService::dispatch_raw(h, msg, out));
    assert_eq!(n, 1);
}

#[inline(never)]
fn client_complete_slice(c: &mut SlicePutClient<Delegation>) -> (u64, u64) {
    match c.poll().unwrap() {
        Some((tag, SlicePutResponse::Put(v))) => (tag, v),
        None => panic!("no response after a server round"),
    }
}

#[inline(never)]
fn client_issue_array(c: &mut ArrayPutClient<Delegation>, tag: u64, data: &[u8; N]) {
    c.issue(tag).put(*data).unwrap();
}

#[inline(never)]
fn server_serve_array(s: &mut Server<ArrayPutService, DelegationServer>, h: &mut Handler) {
    let n = s.serve_once_raw(|msg, out| ArrayPutService::dispatch_raw(h, msg, out));
    assert_eq!(n, 1);
}

#[inline(never)]
fn client_complete_array(c: &mut ArrayPutClient<Delegation>) -> (u64, u64) {
    match c.poll().unwrap() {
        Some((tag, ArrayPutResponse::Put(v))) => (tag, v),
        None => panic!("no response after a server round"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let variant = args.next().unwrap_or_else(|| "slice".into());
    let n: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let name = format!("varlen-lockstep-{}", std::process::id());
    let mut data = [0u8; N];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i * 7 + 1) as u8;
    }
    let mut h = Handler;
    let t0 = Instant::now();
    let mut sum = 0u64;
    let request_bytes;
    match variant.as_str() {
        "slice" => {
            let mut server =
                DelegationServer::serve::<SlicePutService>(&name, DelegationConfig::default())
                    .unwrap();
            let mut c = SlicePutClient::<Delegation>::connect(&name).unwrap();
            for i in 0..n {
                data[0] = i as u8;
                client_issue_slice(&mut c, i, &data);
                server_serve_slice(&mut server, &mut h);
                let (tag, v) = client_complete_slice(&mut c);
                assert_eq!((tag, v), (i, value(&data)));
                sum = sum.wrapping_add(v);
            }
            request_bytes = SlicePutService::DESCRIPTOR.max_request_bytes;
        }
        "array" => {
            let mut server =
                DelegationServer::serve::<ArrayPutService>(&name, DelegationConfig::default())
                    .unwrap();
            let mut c = ArrayPutClient::<Delegation>::connect(&name).unwrap();
            for i in 0..n {
                data[0] = i as u8;
                client_issue_array(&mut c, i, &data);
                server_serve_array(&mut server, &mut h);
                let (tag, v) = client_complete_array(&mut c);
                assert_eq!((tag, v), (i, value(&data)));
                sum = sum.wrapping_add(v);
            }
            request_bytes = ArrayPutService::DESCRIPTOR.max_request_bytes;
        }
        v => {
            eprintln!("usage: varlen_lockstep slice|array [calls]  (unknown variant {v})");
            std::process::exit(2);
        }
    }
    black_box(sum);
    let el = t0.elapsed();
    println!(
        "{variant}: {n} calls verified in {:.3} s ({:.1} ns per lock-step call incl. server), largest request {request_bytes} B",
        el.as_secs_f64(),
        el.as_nanos() as f64 / n as f64,
    );
}

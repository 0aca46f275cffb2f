//! Instructions per call: the generated stub vs a hand-written call on the raw delegation ring.
//!
//! Both variants send the same bytes (`Kv::get(rank, key)`: 8 B header + 12 B arguments; the
//! response is 8 B header + 9 B `Option<u64>`) through the same ring to the same typed server.
//!
//! - `stub`: `kv.issue(tag).get(rank, key)` then `kv.poll()` (generated code + `rpc::Client`).
//! - `raw`:  a `#[repr(C, packed)]` message written with `RingClient::try_call`, and the
//!   response parsed by hand in `RingClient::poll`'s callback, tags kept in a local array.
//!
//! One thread does everything in lock step (issue → server step → complete), so the count has
//! no spin-wait noise; the client side sits in `#[inline(never)]` functions `client_issue_*` /
//! `client_complete_*` that callgrind counts alone:
//!
//! ```text
//! cargo build --release --example stub_vs_raw
//! for v in stub raw; do valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$v \
//!   --collect-atstart=no --toggle-collect='stub_vs_raw::client_*' \
//!   target/release/examples/stub_vs_raw $v 100000; done
//! callgrind_annotate /tmp/cg.stub | head; callgrind_annotate /tmp/cg.raw | head
//! ```
//! `scripts/callgrind-stub-vs-raw.sh` runs exactly that and prints instructions per call.
//! Without valgrind the binary just runs and prints its own wall-clock figures.

use std::hint::black_box;
use std::time::Instant;

use idl::kv::{KvClient, KvResponse, KvServer, KvService};
use rpc::delegation::{Delegation, DelegationConfig, DelegationServer, RingClient};
use rpc::wire::{HEADER_BYTES, MsgHeader};
use rpc::{Server, Service};
use zerocopy::{Immutable, IntoBytes};

struct Store;

impl KvServer for Store {
    fn put(&mut self, _rank: u32, _key: u64, _value: u64) {}
    fn get(&mut self, _rank: u32, key: u64) -> Option<u64> {
        Some(key + 1)
    }
}

/// The hand-written request: header + `rank` + `key`, packed, exactly the generated wire bytes.
#[derive(IntoBytes, Immutable)]
#[repr(C, packed)]
struct RawGet {
    hdr: MsgHeader,
    rank: u32,
    key: u64,
}

#[inline(never)]
fn client_issue_stub(kv: &mut KvClient<Delegation>, tag: u64, key: u64) {
    kv.issue(tag).get(0, key).unwrap();
}

#[inline(never)]
fn client_complete_stub(kv: &mut KvClient<Delegation>) -> (u64, u64) {
    match kv.poll().unwrap() {
        Some((tag, KvResponse::Get(Some(v)))) => (tag, v),
        other => panic!("unexpected {other:?}"),
    }
}

#[inline(never)]
fn client_issue_raw(ring: &mut RingClient, tags: &mut [u64], tag: u64, key: u64) {
    let msg = RawGet {
        hdr: MsgHeader {
            method_id: KvService::GET,
            status: 0,
            len: 12,
        },
        rank: 0,
        key,
    };
    let slot = ring.try_call(msg.as_bytes()).unwrap();
    tags[slot as usize] = tag;
}

#[inline(never)]
fn client_complete_raw(ring: &mut RingClient, tags: &[u64]) -> (u64, u64) {
    let mut out = (0, 0);
    ring.poll(|slot, bytes| {
        // Hand-written decode: header checks, Option tag, value.
        assert!(bytes.len() >= HEADER_BYTES + 9);
        let method = u16::from_ne_bytes([bytes[0], bytes[1]]);
        let status = u16::from_ne_bytes([bytes[2], bytes[3]]);
        let len = u32::from_ne_bytes(bytes[4..8].try_into().unwrap());
        assert!(method == KvService::GET && status == 0 && len == 9 && bytes[8] == 1);
        out = (
            tags[slot as usize],
            u64::from_ne_bytes(bytes[9..17].try_into().unwrap()),
        );
    })
    .unwrap();
    out
}

fn main() {
    let mut args = std::env::args().skip(1);
    let variant = args.next().unwrap_or_else(|| "stub".into());
    let n: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let name = format!("stub-vs-raw-{}", std::process::id());
    let mut server: Server<KvService, DelegationServer> =
        DelegationServer::serve::<KvService>(&name, DelegationConfig::default()).unwrap();
    let mut store = Store;
    let mut step = |server: &mut Server<KvService, DelegationServer>| {
        let k = server.serve_once(|req| KvService::dispatch(&mut store, req));
        assert_eq!(k, 1);
    };
    let t0 = Instant::now();
    let mut sum = 0u64;
    match variant.as_str() {
        "stub" => {
            let mut kv = KvClient::<Delegation>::connect(&name).unwrap();
            for i in 0..n {
                client_issue_stub(&mut kv, i, i);
                step(&mut server);
                let (tag, v) = client_complete_stub(&mut kv);
                assert_eq!((tag, v), (i, i + 1));
                sum += v;
            }
        }
        "raw" => {
            let mut ring = RingClient::attach(&name).unwrap();
            let mut tags = vec![0u64; ring.info().resp_depth as usize];
            for i in 0..n {
                client_issue_raw(&mut ring, &mut tags, i, i);
                step(&mut server);
                let (tag, v) = client_complete_raw(&mut ring, &tags);
                assert_eq!((tag, v), (i, i + 1));
                sum += v;
            }
        }
        v => {
            eprintln!("usage: stub_vs_raw stub|raw [calls]  (unknown variant {v})");
            std::process::exit(2);
        }
    }
    black_box(sum);
    let el = t0.elapsed();
    println!(
        "{variant}: {n} calls in {:.3} s ({:.1} ns per lock-step call incl. server), request {} B, fingerprint {:#x}",
        el.as_secs_f64(),
        el.as_nanos() as f64 / n as f64,
        <KvService as Service>::DESCRIPTOR.methods[KvService::GET as usize].request_bytes,
        <KvService as Service>::DESCRIPTOR.fingerprint
    );
}

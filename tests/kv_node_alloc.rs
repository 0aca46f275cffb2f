//! The routing daemons' variable-length path allocates nothing per request once warm
//! (issue 15): `KvVar` puts and gets from a typed ipc client to one rank's two daemons
//! ([`NodeDaemon::run_once_raw`] with the generated `dispatch_raw`, a router reading the key
//! in place, half the keys served by the other daemon over Flux), their responses read with
//! `poll_ref` (a get's value checked in the receive buffer), all run on the test thread, make
//! no heap allocation on that thread.
//!
//! Own test binary: a counting global allocator that counts only on the thread that switched
//! counting on (the pattern of `rpc-runtime/tests/copyrpc_alloc.rs`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use idl::kv::{
    KvVarClient, KvVarResponseRef, KvVarServer, KvVarService, kv_var_target, owner_daemon_of,
};
use rpc::delegation::Target;
use rpc::delegation::node::{NodeConfig, NodeDaemon, Placement};
use rpc::flux::{self, FluxConfig};
use rpc::ipc::{Ipc, IpcConfig, IpcServer};
use rpc::wire::WireError;
use rpc::{RpcError, Service};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNT_HERE: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if COUNT_HERE.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.load(Ordering::Relaxed);
    COUNT_HERE.with(|c| c.set(true));
    f();
    COUNT_HERE.with(|c| c.set(false));
    ALLOCS.load(Ordering::Relaxed) - before
}

const DAEMONS: u32 = 2;
const KEYS: u64 = 64;

/// A shard whose puts of a stored key reuse the value's buffer (as kvbench's).
#[derive(Default)]
struct Shard {
    map: std::collections::HashMap<String, Vec<u8>>,
}

impl KvVarServer for Shard {
    fn put(&mut self, _rank: u32, key: &str, value: &[u8]) {
        match self.map.get_mut(key) {
            Some(v) => {
                v.clear();
                v.extend_from_slice(value);
            }
            None => {
                self.map.insert(key.to_owned(), value.to_vec());
            }
        }
    }
    fn get(&self, _rank: u32, key: &str) -> Option<&[u8]> {
        self.map.get(key).map(Vec::as_slice)
    }
}

type Router = fn(&[u8]) -> Result<Target, WireError>;
type Daemon = NodeDaemon<KvVarService, IpcServer, Router, 4480>;

fn route(msg: &[u8]) -> Result<Target, WireError> {
    let (rank, key) = kv_var_target(msg)?;
    Ok(Target {
        rank,
        daemon: owner_daemon_of(key.as_bytes(), DAEMONS as usize) as u32,
    })
}

/// Key `id`'s text, `k` and four digits, in `buf`.
fn key(id: u64, buf: &mut [u8; 5]) -> &str {
    buf[0] = b'k';
    let mut n = id;
    for b in buf[1..].iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
    std::str::from_utf8(buf).unwrap()
}

/// Key `id`'s value at `version`: a length fixed per key (so a put reuses the stored
/// buffer), the key id and version in its first 16 bytes, then a pattern of both.
fn value(id: u64, version: u64, buf: &mut [u8]) -> usize {
    let len = 16 + (id as usize * 61) % 4000;
    buf[..8].copy_from_slice(&id.to_le_bytes());
    buf[8..16].copy_from_slice(&version.to_le_bytes());
    for (i, b) in buf[16..len].iter_mut().enumerate() {
        *b = (id as usize + version as usize + i) as u8;
    }
    len
}

/// Whether `v` is a value `value` writes for key `id` (at the version it names).
fn intact(id: u64, v: &[u8]) -> bool {
    let mut want = [0u8; 4096];
    v.len() >= 16 && {
        let version = u64::from_le_bytes(v[8..16].try_into().unwrap());
        let n = value(id, version, &mut want);
        v == &want[..n]
    }
}

struct Bench {
    daemons: Vec<Daemon>,
    shards: Vec<Shard>,
    client: KvVarClient<Ipc>,
    /// Key id and kind (get: true) of the call in flight on each tag.
    tags: Vec<Option<(u64, bool)>>,
    free: Vec<u64>,
    next: u64,
    /// Responses: puts, gets that found an intact value, anything else.
    puts: u64,
    hits: u64,
    bad: u64,
    value: Box<[u8]>,
}

impl Bench {
    /// One step: the client issues calls while it has free tags (alternately a put and a get
    /// of the next key), every daemon runs a round (daemon 0 twice: it passes the other
    /// shard's calls over Flux and then relays the answers), the client polls.
    fn step(&mut self) {
        while let Some(&tag) = self.free.last() {
            let id = self.next % KEYS;
            let get = (self.next / KEYS) % 2 == 1;
            let mut kb = [0u8; 5];
            let k = key(id, &mut kb);
            let r = if get {
                self.client.issue(tag).get(0, k)
            } else {
                let n = value(id, self.next, &mut self.value);
                self.client.issue(tag).put(0, k, &self.value[..n])
            };
            match r {
                Ok(()) => {}
                Err(RpcError::WouldBlock) => break,
                Err(e) => panic!("issue: {e}"),
            }
            self.free.pop();
            self.tags[tag as usize] = Some((id, get));
            self.next += 1;
        }
        for d in [0, 1, 0] {
            let shard = &mut self.shards[d];
            self.daemons[d].run_once_raw(|msg, out| KvVarService::dispatch_raw(shard, msg, out));
        }
        let (tags, free) = (&mut self.tags, &mut self.free);
        let (puts, hits, bad) = (&mut self.puts, &mut self.hits, &mut self.bad);
        self.client
            .poll_ref(|tag, r| {
                let call = tags.get_mut(tag as usize).and_then(Option::take);
                match (call, r) {
                    (Some((_, false)), Ok(KvVarResponseRef::Put(()))) => *puts += 1,
                    (Some((id, true)), Ok(KvVarResponseRef::Get(Some(v)))) if intact(id, v) => {
                        *hits += 1
                    }
                    _ => *bad += 1,
                }
                free.push(tag);
            })
            .expect("poll");
    }
}

#[test]
fn kv_var_puts_and_gets_through_the_daemons_allocate_nothing_once_warm() {
    let base = format!("kvalloc-{}", std::process::id());
    let cfg = IpcConfig {
        max_clients: 2,
        depth: 16,
        ..IpcConfig::default()
    };
    let fluxes = flux::network(DAEMONS as usize, FluxConfig::default()).unwrap();
    let mut daemons = Vec::new();
    for (d, f) in (0..DAEMONS).zip(fluxes) {
        let local = IpcServer::create(&format!("{base}-{d}"), KvVarService::DESCRIPTOR, cfg)
            .expect("ipc server");
        let ncfg = NodeConfig::new(Placement::Aggregated, (0, 1), (d, DAEMONS));
        daemons.push(Daemon::new(ncfg, local, f, route as Router).unwrap());
    }
    // Every call goes to daemon 0: the other shard's keys are passed over Flux.
    let client = KvVarClient::<Ipc>::connect(&format!("{base}-0")).expect("connect");
    let depth = client.max_in_flight();
    let mut b = Bench {
        daemons,
        shards: vec![Shard::default(), Shard::default()],
        client,
        tags: vec![None; depth],
        free: (0..depth as u64).collect(),
        next: 0,
        puts: 0,
        hits: 0,
        bad: 0,
        value: vec![0u8; 4096].into_boxed_slice(),
    };
    // Warm-up: every key stored (with its final length), queues at their working sizes.
    for _ in 0..3000 {
        b.step();
    }
    assert_eq!(b.bad, 0, "bad responses in the warm-up");
    let (puts0, hits0) = (b.puts, b.hits);
    let n = allocations(|| {
        for _ in 0..3000 {
            b.step();
        }
    });
    let (puts, hits) = (b.puts - puts0, b.hits - hits0);
    assert_eq!(b.bad, 0, "bad responses");
    assert!(puts > 2000 && hits > 2000, "puts {puts}, gets {hits}");
    let s: Vec<_> = b.daemons.iter().map(|d| *d.stats()).collect();
    assert!(
        s[1].flux_served > 1000,
        "the other shard over Flux: {:?}",
        s[1]
    );
    assert_eq!(
        (
            s[0].bad_requests,
            s[0].oversized_responses,
            s[0].dropped_replies
        ),
        (0, 0, 0)
    );
    assert_eq!(n, 0, "allocations in {puts} puts and {hits} gets");
}

/// The counter sees allocations: decoding a `KvVar` put into its owned request (what
/// `run_once` hands its handler) allocates its key and value.
#[test]
fn the_owned_request_allocates() {
    let mut buf = vec![0u64; 64];
    let out = rpc::__private::zerocopy::IntoBytes::as_mut_bytes(&mut buf[..]);
    let n = KvVarService::__rpc_put_req_write(out, 0, "k0001", b"some value");
    let msg = &out[..n];
    let mut req = None;
    let allocs = allocations(|| req = Some(KvVarService::decode_request(msg).unwrap()));
    assert!(allocs >= 2, "{allocs} allocations for a String and a Vec");
    drop(req);
}

//! The routing daemons' `KvVar` path (issue 15), owned against in place, on one thread: a
//! typed ipc client calls daemon 0 of a rank of two [`NodeDaemon`]s (half the keys belong to
//! daemon 1 and are passed over Flux), alternately 64 puts and 64 gets of values of 16 to
//! 4015 bytes, up to the client's depth in flight; the client and the daemons are stepped in
//! turn on the calling thread, so the figures do not depend on scheduling.
//!
//! - `owned`: `NodeDaemon::run_once` with `KvVarService::dispatch` (each request decoded into
//!   a `KvVarRequest`: the key into a `String`, a put's value into a `Vec`) and `poll_with`
//!   (a get's value copied into a `Vec`);
//! - `raw`: `NodeDaemon::run_once_raw` with `KvVarService::dispatch_raw` and a router reading
//!   the key in the request ([`idl::kv::kv_var_target`]), and `poll_ref` (a get's value
//!   checked in the receive buffer).
//!
//! `fixed-owned` and `fixed-raw` run the same over the fixed-size `Kv` service (`u64` keys and
//! values; the router decodes the request by a validated cast either way).
//!
//! Every response is checked (every byte of a value got). Prints, per mode, the calls made,
//! nanoseconds per call (the best of `--reps` timed rounds) and heap allocations per call
//! (a counting global allocator, counting on this thread only, per thread).
//!
//! ```text
//! cargo run --release --example kv_daemon_path -- [STEPS] [owned|raw|fixed-owned|fixed-raw|both|all] [REPS]
//! ```
//!
//! `tests/kv_node_alloc.rs` includes this file: the `raw` mode must allocate nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Instant;

use idl::kv::{
    KvClient, KvRequest, KvResponse, KvServer, KvService, KvVarClient, KvVarRequest, KvVarResponse,
    KvVarResponseRef, KvVarServer, KvVarService, kv_var_target, owner_daemon, owner_daemon_of,
};
use rpc::delegation::Target;
use rpc::delegation::node::{NodeConfig, NodeDaemon, Placement};
use rpc::flux::{self, FluxConfig};
use rpc::ipc::{Ipc, IpcConfig, IpcServer};
use rpc::wire::WireError;
use rpc::{RpcError, Service};

struct Counting;

thread_local! {
    /// Whether allocations on this thread are counted.
    static COUNT_HERE: Cell<bool> = const { Cell::new(false) };
    /// Allocations counted on this thread (per thread: tests counting at the same time on
    /// other threads do not disturb each other).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    if COUNT_HERE.try_with(Cell::get).unwrap_or(false) {
        let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
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

/// Heap allocations `f` makes on this thread.
pub(crate) fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.with(Cell::get);
    COUNT_HERE.with(|c| c.set(true));
    f();
    COUNT_HERE.with(|c| c.set(false));
    ALLOCS.with(Cell::get) - before
}

/// Daemons of the rank.
pub(crate) const DAEMONS: u32 = 2;
/// Keys, `k0000..`.
pub(crate) const KEYS: u64 = 64;
/// Flux message capacity: a `KvVar` message (as kvbench's `VAR_MSG_CAP`).
pub(crate) const MSG_CAP: usize = 4480;

/// A shard whose puts of a stored key reuse the value's buffer (as kvbench's).
#[derive(Default)]
pub(crate) struct Shard {
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

/// A router that reads the target from the encoded request ([`raw_route`]).
pub(crate) type RawRouter = fn(&[u8]) -> Result<Target, WireError>;
type OwnedRouter = fn(&KvVarRequest) -> Target;
type RawDaemon = NodeDaemon<KvVarService, IpcServer, RawRouter, MSG_CAP>;
type OwnedDaemon = NodeDaemon<KvVarService, IpcServer, OwnedRouter, MSG_CAP>;

fn target(rank: u32, key: &str) -> Target {
    Target {
        rank,
        daemon: owner_daemon_of(key.as_bytes(), DAEMONS as usize) as u32,
    }
}

/// The rank and daemon of an encoded `KvVar` request, read without decoding it.
///
/// # Errors
/// The [`WireError`] of a message that is not a well-formed `KvVar` request.
pub(crate) fn raw_route(msg: &[u8]) -> Result<Target, WireError> {
    let (rank, key) = kv_var_target(msg)?;
    Ok(target(rank, key))
}

fn owned_route(req: &KvVarRequest) -> Target {
    match req {
        KvVarRequest::Put(a) => target(a.rank, &a.key),
        KvVarRequest::Get(a) => target(a.rank, &a.key),
    }
}

/// Key `id`'s text, `k` and four digits, in `buf`.
pub(crate) fn key(id: u64, buf: &mut [u8; 5]) -> &str {
    buf[0] = b'k';
    let mut n = id;
    for b in buf[1..].iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
    std::str::from_utf8(buf).unwrap_or("k")
}

/// Key `id`'s value at `version` in `buf`: a length fixed per key (so a put reuses the
/// stored buffer), the key id and version in its first 16 bytes, then a pattern of both.
pub(crate) fn value(id: u64, version: u64, buf: &mut [u8]) -> usize {
    let len = 16 + (id as usize * 61) % 4000;
    buf[..8].copy_from_slice(&id.to_le_bytes());
    buf[8..16].copy_from_slice(&version.to_le_bytes());
    for (i, b) in buf[16..len].iter_mut().enumerate() {
        *b = (id as usize + version as usize + i) as u8;
    }
    len
}

/// Whether `v` is a value [`value`] writes for key `id` (at the version it names).
pub(crate) fn intact(id: u64, v: &[u8]) -> bool {
    let mut want = [0u8; 4096];
    v.len() >= 16 && {
        let version = u64::from_le_bytes(v[8..16].try_into().unwrap_or([0; 8]));
        let n = value(id, version, &mut want);
        v == &want[..n]
    }
}

/// How the daemons serve and the client reads responses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `run_once` + `dispatch`, `poll_with`.
    Owned,
    /// `run_once_raw` + `dispatch_raw`, `poll_ref`.
    Raw,
}

enum Daemons {
    Owned(Vec<OwnedDaemon>),
    Raw(Vec<RawDaemon>),
}

/// The client, the two daemons and their shards, and what the client saw.
pub(crate) struct Bench {
    daemons: Daemons,
    shards: Vec<Shard>,
    client: KvVarClient<Ipc>,
    /// Key id and kind (get: true) of the call in flight on each tag.
    tags: Vec<Option<(u64, bool)>>,
    free: Vec<u64>,
    next: u64,
    /// Puts answered.
    pub puts: u64,
    /// Gets that found an intact value.
    pub hits: u64,
    /// Any other response (an error, a miss, a damaged value).
    pub bad: u64,
    value: Box<[u8]>,
}

impl Bench {
    /// One rank of [`DAEMONS`] daemons over ipc servers named after `base`, and a client of
    /// daemon 0.
    ///
    /// # Panics
    /// If a server, the Flux network or the client cannot be set up.
    pub(crate) fn new(base: &str, mode: Mode) -> Bench {
        let cfg = IpcConfig {
            max_clients: 2,
            depth: 16,
            ..IpcConfig::default()
        };
        let fluxes = flux::network(DAEMONS as usize, FluxConfig::default()).expect("flux");
        let mut owned = Vec::new();
        let mut raw = Vec::new();
        for (d, f) in (0..DAEMONS).zip(fluxes) {
            let local = IpcServer::create(&format!("{base}-{d}"), KvVarService::DESCRIPTOR, cfg)
                .expect("ipc server");
            let ncfg = NodeConfig::new(Placement::Aggregated, (0, 1), (d, DAEMONS));
            match mode {
                Mode::Owned => owned.push(
                    OwnedDaemon::new(ncfg, local, f, owned_route as OwnedRouter).expect("daemon"),
                ),
                Mode::Raw => raw
                    .push(RawDaemon::new(ncfg, local, f, raw_route as RawRouter).expect("daemon")),
            }
        }
        // Every call goes to daemon 0: the other shard's keys are passed over Flux.
        let client = KvVarClient::<Ipc>::connect(&format!("{base}-0")).expect("connect");
        let depth = client.max_in_flight();
        Bench {
            daemons: match mode {
                Mode::Owned => Daemons::Owned(owned),
                Mode::Raw => Daemons::Raw(raw),
            },
            shards: vec![Shard::default(), Shard::default()],
            client,
            tags: vec![None; depth],
            free: (0..depth as u64).collect(),
            next: 0,
            puts: 0,
            hits: 0,
            bad: 0,
            value: vec![0u8; 4096].into_boxed_slice(),
        }
    }

    /// The daemons' counters.
    #[allow(
        dead_code,
        reason = "used by tests/kv_node_alloc.rs, which includes this file"
    )]
    pub(crate) fn stats(&self) -> Vec<rpc::delegation::node::NodeStats> {
        match &self.daemons {
            Daemons::Owned(v) => v.iter().map(|d| *d.stats()).collect(),
            Daemons::Raw(v) => v.iter().map(|d| *d.stats()).collect(),
        }
    }

    /// One step: the client issues calls while it has free tags (64 puts, then 64 gets, of
    /// keys in turn), every daemon runs a round (daemon 0 twice: it passes the other shard's
    /// calls over Flux and then relays the answers), the client polls and checks.
    ///
    /// # Panics
    /// If the client fails.
    pub(crate) fn step(&mut self) {
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
            match &mut self.daemons {
                Daemons::Owned(v) => {
                    v[d].run_once(|req| KvVarService::dispatch(shard, req));
                }
                Daemons::Raw(v) => {
                    v[d].run_once_raw(|msg, out| KvVarService::dispatch_raw(shard, msg, out));
                }
            }
        }
        let (tags, free) = (&mut self.tags, &mut self.free);
        let (puts, hits, bad) = (&mut self.puts, &mut self.hits, &mut self.bad);
        let mut seen = |tag: u64, put: bool, got: Option<&[u8]>| {
            match (tags.get_mut(tag as usize).and_then(Option::take), got) {
                (Some((_, false)), _) if put => *puts += 1,
                (Some((id, true)), Some(v)) if !put && intact(id, v) => *hits += 1,
                _ => *bad += 1,
            }
            free.push(tag);
        };
        let r = match &self.daemons {
            Daemons::Owned(_) => self.client.poll_with(|tag, r| match r {
                Ok(KvVarResponse::Put(())) => seen(tag, true, None),
                Ok(KvVarResponse::Get(v)) => seen(tag, false, v.as_deref()),
                Err(_) => seen(tag, false, None),
            }),
            Daemons::Raw(_) => self.client.poll_ref(|tag, r| match r {
                Ok(KvVarResponseRef::Put(())) => seen(tag, true, None),
                Ok(KvVarResponseRef::Get(v)) => seen(tag, false, v),
                Err(_) => seen(tag, false, None),
            }),
        };
        r.expect("poll");
    }

    /// Calls answered so far.
    pub(crate) fn calls(&self) -> u64 {
        self.puts + self.hits + self.bad
    }
}

/// A shard of the fixed-size service.
#[derive(Default)]
struct FixedShard {
    map: std::collections::HashMap<u64, u64>,
}

impl KvServer for FixedShard {
    fn put(&mut self, _rank: u32, key: u64, value: u64) {
        self.map.insert(key, value);
    }
    fn get(&mut self, _rank: u32, key: u64) -> Option<u64> {
        self.map.get(&key).copied()
    }
}

type FixedRaw = NodeDaemon<KvService, IpcServer, RawRouter>;
type FixedOwned = NodeDaemon<KvService, IpcServer, fn(&KvRequest) -> Target>;

fn fixed_target(req: &KvRequest) -> Target {
    let (rank, key) = match req {
        KvRequest::Get(a) => (a.rank(), a.key()),
        KvRequest::Put(a) => (a.rank(), a.key()),
    };
    Target {
        rank,
        daemon: owner_daemon(key, DAEMONS as usize) as u32,
    }
}

fn fixed_raw_route(msg: &[u8]) -> Result<Target, WireError> {
    KvService::decode_request(msg).map(|r| fixed_target(&r))
}

enum FixedDaemons {
    Owned(Vec<FixedOwned>),
    Raw(Vec<FixedRaw>),
}

/// [`Bench`] over the fixed-size `Kv` service: a put writes the key's id times the call
/// number, a get must find a value the key's puts wrote.
struct FixedBench {
    daemons: FixedDaemons,
    shards: Vec<FixedShard>,
    client: KvClient<Ipc>,
    tags: Vec<Option<(u64, bool)>>,
    free: Vec<u64>,
    next: u64,
    calls: u64,
    bad: u64,
}

impl FixedBench {
    fn new(base: &str, raw: bool) -> FixedBench {
        let cfg = IpcConfig {
            max_clients: 2,
            depth: 16,
            ..IpcConfig::default()
        };
        let fluxes = flux::network(DAEMONS as usize, FluxConfig::default()).expect("flux");
        let (mut owned, mut raws) = (Vec::new(), Vec::new());
        for (d, f) in (0..DAEMONS).zip(fluxes) {
            let local = IpcServer::create(&format!("{base}-{d}"), KvService::DESCRIPTOR, cfg)
                .expect("ipc server");
            let ncfg = NodeConfig::new(Placement::Aggregated, (0, 1), (d, DAEMONS));
            if raw {
                raws.push(
                    FixedRaw::new(ncfg, local, f, fixed_raw_route as RawRouter).expect("daemon"),
                );
            } else {
                let route: fn(&KvRequest) -> Target = fixed_target;
                owned.push(FixedOwned::new(ncfg, local, f, route).expect("daemon"));
            }
        }
        let client = KvClient::<Ipc>::connect(&format!("{base}-0")).expect("connect");
        let depth = client.max_in_flight();
        FixedBench {
            daemons: if raw {
                FixedDaemons::Raw(raws)
            } else {
                FixedDaemons::Owned(owned)
            },
            shards: vec![FixedShard::default(), FixedShard::default()],
            client,
            tags: vec![None; depth],
            free: (0..depth as u64).collect(),
            next: 0,
            calls: 0,
            bad: 0,
        }
    }

    fn step(&mut self) {
        while let Some(&tag) = self.free.last() {
            let id = self.next % KEYS;
            let get = (self.next / KEYS) % 2 == 1;
            let r = if get {
                self.client.issue(tag).get(0, id)
            } else {
                self.client.issue(tag).put(0, id, id * self.next)
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
            match &mut self.daemons {
                FixedDaemons::Owned(v) => {
                    v[d].run_once(|req| KvService::dispatch(shard, req));
                }
                FixedDaemons::Raw(v) => {
                    v[d].run_once_raw(|msg, out| KvService::dispatch_raw(shard, msg, out));
                }
            }
        }
        let (tags, free, calls, bad) = (
            &mut self.tags,
            &mut self.free,
            &mut self.calls,
            &mut self.bad,
        );
        self.client
            .poll_with(|tag, r| {
                *calls += 1;
                let ok = match (tags.get_mut(tag as usize).and_then(Option::take), r) {
                    (Some((_, false)), Ok(KvResponse::Put(()))) => true,
                    (Some((id, true)), Ok(KvResponse::Get(Some(v)))) => id == 0 || v % id == 0,
                    _ => false,
                };
                *bad += u64::from(!ok);
                free.push(tag);
            })
            .expect("poll");
    }
}

/// Runs `step` `steps` times after a warm-up, `reps` times; prints the calls of a rep, the
/// best nanoseconds per call and the allocations per call.
fn measure(name: &str, steps: u64, reps: u32, mut step: impl FnMut(), calls: impl Fn() -> u64) {
    for _ in 0..steps.min(3000) {
        step();
    }
    let (mut best, mut n, mut allocs) = (f64::MAX, 0, 0);
    for _ in 0..reps {
        let c0 = calls();
        let t = Instant::now();
        allocs = allocations(|| {
            for _ in 0..steps {
                step();
            }
        });
        let dt = t.elapsed().as_nanos() as f64;
        n = calls() - c0;
        best = best.min(dt / n.max(1) as f64);
    }
    println!(
        "{name:<11} {n:>9}  {best:>10.0}              {:.2}",
        allocs as f64 / n.max(1) as f64
    );
}

#[allow(dead_code)]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let steps: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let which = args.get(1).map(String::as_str).unwrap_or("both");
    let reps: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    println!("mode        calls/rep  ns/call(best of {reps})  allocs/call");
    let pid = std::process::id();
    for (name, mode) in [("owned", Mode::Owned), ("raw", Mode::Raw)] {
        if !matches!(which, "both" | "all") && which != name {
            continue;
        }
        let b = std::cell::RefCell::new(Bench::new(&format!("kvpath-{pid}-{name}"), mode));
        measure(
            name,
            steps,
            reps,
            || b.borrow_mut().step(),
            || b.borrow().calls(),
        );
        assert_eq!(b.borrow().bad, 0, "{name}: bad responses");
    }
    for (name, raw) in [("fixed-owned", false), ("fixed-raw", true)] {
        if which != "all" && which != name {
            continue;
        }
        let b = std::cell::RefCell::new(FixedBench::new(&format!("kvpath-{pid}-{name}"), raw));
        measure(
            name,
            steps,
            reps,
            || b.borrow_mut().step(),
            || b.borrow().calls,
        );
        assert_eq!(b.borrow().bad, 0, "{name}: bad responses");
    }
}

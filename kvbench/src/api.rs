//! The two KV services a run can use, behind one trait (`Api`), and the keys and values of
//! the variable-size one.
//!
//! - `Fixed`: `idl::kv::Kv`, `u64` keys and `u64` values (seeds/004 §8): the default, and
//!   the service of every run with `--value-size 8` and no `--key-size`.
//! - `Var`: `idl::kv::KvVar`, keys and values as byte strings of the lengths `--key-size` and
//!   `--value-size` give (issue 15).
//!
//! Both keep the correctness scheme of the crate docs ("Correctness"): a client writes a key
//! id `k` with a *version* `(writer << SEQ_BITS) | seq`; a `Fixed` value is the version
//! itself, a `Var` value is derived from the key id and the version ([`fill_value`]), so a
//! reader recovers the version from what it read and checks every byte of it, its length
//! included ([`verify_value`]). A `Var` key is the string `k` followed by the key id in
//! decimal, zero-padded to the key's length ([`render_key`]; the length is a function of the
//! key id), and its owner daemon is a hash of those bytes ([`idl::kv::owner_daemon_of`]).

use std::time::Instant;

use idl::kv::{
    KvClient, KvRequest, KvResponse, KvServer, KvService, KvVarClient, KvVarRequest, KvVarResponse,
    KvVarResponseRef, KvVarServer, KvVarService, MAX_KEY_BYTES, kv_var_target, owner_daemon,
    owner_daemon_of,
};
use rpc::delegation::Target;
use rpc::wire::WireError;
use rpc::{ClientTransport, RpcError, Server, ServerTransport, Service};
use rustc_hash::FxHashMap;

use crate::client::{Failed, failed};
use crate::config::{RunArgs, Topology};
use crate::report::Summary;
use crate::wiring::Job;
use crate::workload::{Op, SEQ_BITS};

/// A length in bytes, or a range of them (`--value-size`, `--key-size`): `N` or `LO-HI`
/// (inclusive), a length drawn uniformly from `LO..=HI`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeRange {
    /// Shortest, bytes.
    pub lo: usize,
    /// Longest, bytes (`>= lo`).
    pub hi: usize,
}

impl std::str::FromStr for SizeRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{s}`: expected a size in bytes, N or LO-HI"))
        };
        let (lo, hi) = match s.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(s)?, num(s)?),
        };
        if lo > hi {
            return Err(format!("`{s}`: LO must not exceed HI"));
        }
        Ok(SizeRange { lo, hi })
    }
}

impl std::fmt::Display for SizeRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

impl SizeRange {
    /// The length picked by the 64-bit hash `h`: `lo + h % (hi - lo + 1)` (uniform over the
    /// range up to a bias below `range / 2^64`).
    #[inline]
    pub fn pick(self, h: u64) -> usize {
        self.lo + (h % (self.hi - self.lo + 1) as u64) as usize
    }
}

/// Shortest variable-size value: its key id (8 B) and version (8 B).
pub const MIN_VALUE_BYTES: usize = 16;

/// The key and value sizes of a `Var` run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// Value bytes, `MIN_VALUE_BYTES..=MAX_VALUE_BYTES`.
    pub value: SizeRange,
    /// Key bytes, at most `MAX_KEY_BYTES`, at least `1 +` the digits of the largest key id.
    pub key: SizeRange,
}

/// The splitmix64 finalizer: a bijective 64-bit mix.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Decimal digits of `n` (1 for 0).
pub fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Writes the key of key id `id` into `out`: `k`, then `id` in decimal zero-padded to the key's
/// length `sizes.key.pick(mix(id))` (e.g. `k0000042`); returns the length. A length too short
/// for the digits of `id` ([`Sizes`] rules it out) is stretched to fit them.
#[inline]
pub fn render_key(id: u64, sizes: &Sizes, out: &mut [u8; MAX_KEY_BYTES]) -> usize {
    let want = sizes.key.pick(mix(id)).min(MAX_KEY_BYTES);
    let len = want.max(1 + digits(id)).min(MAX_KEY_BYTES);
    out[0] = b'k';
    let mut n = id;
    for b in out[1..len].iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
    len
}

/// The value key id `key` holds at `version`, written into `buf` (cleared first): its length
/// is `sizes.value.pick(..)` of a hash of both, its first 8 bytes the version and the next 8
/// the key id (little-endian), and every byte after them a pattern word of a hash of both.
#[inline]
pub fn fill_value(key: u64, version: u64, sizes: &Sizes, buf: &mut Vec<u8>) {
    let seed = mix(key ^ mix(version));
    let len = sizes.value.pick(seed);
    buf.clear();
    buf.resize(len.max(MIN_VALUE_BYTES), 0);
    buf[..8].copy_from_slice(&version.to_le_bytes());
    buf[8..16].copy_from_slice(&key.to_le_bytes());
    let mut words = buf[MIN_VALUE_BYTES..].chunks_exact_mut(8);
    let mut i = 0u64;
    for w in &mut words {
        w.copy_from_slice(&mix(seed.wrapping_add(i)).to_le_bytes());
        i += 1;
    }
    let tail = words.into_remainder();
    let n = tail.len();
    tail.copy_from_slice(&mix(seed.wrapping_add(i)).to_le_bytes()[..n]);
    buf.truncate(len);
}

/// What a read found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// The key has no value.
    Miss,
    /// A value was found.
    Hit {
        /// The version the value was written with.
        version: u64,
        /// Every byte (and the length) is the one [`fill_value`] gives for this key and
        /// version (always true for a `Fixed` value).
        intact: bool,
    },
}

impl Read {
    /// The version read, if the value is intact; `None` for a miss or a damaged value.
    pub fn version(self) -> Option<u64> {
        match self {
            Read::Hit {
                version,
                intact: true,
            } => Some(version),
            _ => None,
        }
    }
}

/// Checks a value read for key id `key`: its version is its first 8 bytes, and it is intact if
/// it is exactly what [`fill_value`] writes for `key` at that version (length, key id and
/// every byte of the pattern).
#[inline]
pub fn verify_value(key: u64, v: &[u8], sizes: &Sizes) -> Read {
    let word = |at: usize| {
        v.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    };
    let (Some(version), Some(k)) = (word(0), word(8)) else {
        return Read::Hit {
            version: 0,
            intact: false,
        };
    };
    let seed = mix(key ^ mix(version));
    let mut intact = k == key && v.len() == sizes.value.pick(seed);
    if intact {
        // Word by word (no per-chunk memcmp): every byte after the first 16.
        let mut words = v[MIN_VALUE_BYTES..].chunks_exact(8);
        let mut i = 0u64;
        let mut diff = 0u64;
        for w in &mut words {
            let got = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
            diff |= got ^ mix(seed.wrapping_add(i));
            i += 1;
        }
        let tail = words.remainder();
        intact = diff == 0 && tail == &mix(seed.wrapping_add(i)).to_le_bytes()[..tail.len()];
    }
    Read::Hit { version, intact }
}

/// A test hook (`--corrupt-puts`): how client thread 0 of rank 0 damages every value it writes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corrupt {
    /// The last byte flipped.
    Flip,
    /// One byte short.
    Short,
}

/// A client's state for encoding keys and values: the sizes (unused by [`Fixed`]), a buffer
/// for the value being written (reused: no allocation once it has grown to the largest value)
/// and the test hook `--corrupt-puts`.
pub(crate) struct Ctx {
    pub(crate) sizes: Sizes,
    pub(crate) buf: Vec<u8>,
    pub(crate) corrupt: Option<Corrupt>,
}

impl Ctx {
    pub(crate) fn new(sizes: Sizes, corrupt: Option<Corrupt>) -> Self {
        Ctx {
            sizes,
            buf: Vec::with_capacity(sizes.value.hi),
            corrupt,
        }
    }

    /// Writes the value of `key` at `version` into `self.buf`, damaged as `--corrupt-puts`
    /// says.
    #[inline]
    fn value(&mut self, key: u64, version: u64) -> &[u8] {
        fill_value(key, version, &self.sizes, &mut self.buf);
        match self.corrupt {
            None => {}
            Some(Corrupt::Flip) => {
                if let Some(b) = self.buf.last_mut() {
                    *b ^= 0x5a;
                }
            }
            Some(Corrupt::Short) => {
                self.buf.pop();
            }
        }
        &self.buf
    }
}

/// What a response says of its operation: `Ok(None)` for a put, `Ok(Some(read))` for a get;
/// `Err(())` if it is not a response to the operation's method.
pub(crate) type Outcome = Result<Option<Read>, ()>;

/// The operation in flight on `tag` (`None`: not a tag of this client).
#[inline]
fn op_of(inflight: &[(Instant, Op)], tag: u64) -> Option<&Op> {
    inflight.get(usize::try_from(tag).ok()?).map(|(_, op)| op)
}

/// The request router of the routing daemons (Meta, Delegation, the delegate): where a
/// request message is served (seeds/004 §7, §8), read in place; an error for a request that
/// does not decode.
pub(crate) type Router = Box<dyn FnMut(&[u8]) -> Result<Target, WireError> + Send>;

/// A KV service the benchmark runs over (see the module docs): its typed client, its shard,
/// and how an operation of the workload becomes a call.
pub(crate) trait Api: Send + Sync + Sized + 'static {
    /// The service.
    type S: Service<Request: Send + 'static, Response: Send + std::fmt::Debug + 'static>;
    /// Its typed client over transport `T`.
    type Conn<T: ClientTransport + Send>: Send;
    /// One daemon's store.
    type Shard: Default + Send + 'static;

    /// Connects a typed client.
    fn connect<T: ClientTransport + Send>(addr: &T::Addr) -> Result<Self::Conn<T>, RpcError>;
    /// A typed client over a connected transport.
    fn from_transport<T: ClientTransport + Send>(t: T) -> Self::Conn<T>;
    /// The client core (polling, counters, deadlines).
    fn core<T: ClientTransport + Send>(c: &mut Self::Conn<T>) -> &mut rpc::Client<Self::S, T>;
    /// The daemon among `daemons` that owns key id `key`.
    fn owner(key: u64, daemons: usize, ctx: &Ctx) -> usize;
    /// Issues `op` (a put writes `version`) with tag `tag`.
    fn issue<T: ClientTransport + Send>(
        c: &mut Self::Conn<T>,
        tag: u64,
        op: Op,
        version: u64,
        ctx: &mut Ctx,
    ) -> Result<(), RpcError>;
    /// A blocking put of `version` under key id `key` on rank `rank`.
    fn put<T: ClientTransport + Send>(
        c: &mut Self::Conn<T>,
        rank: u32,
        key: u64,
        version: u64,
        ctx: &mut Ctx,
    ) -> Result<(), RpcError>;
    /// A blocking get of key id `key` on rank `rank`.
    fn get<T: ClientTransport + Send>(
        c: &mut Self::Conn<T>,
        rank: u32,
        key: u64,
        ctx: &mut Ctx,
    ) -> Result<Read, RpcError>;
    /// What the response `r` to `op` says: `Ok(None)` for a put, `Ok(Some(read))` for a get;
    /// `Err(())` if it is not a response to `op`'s method.
    fn outcome(r: &<Self::S as Service>::Response, op: &Op, ctx: &Ctx) -> Outcome;
    /// Polls the typed connection `c` (never blocks): passes each completed call's tag and
    /// what its response says of the operation in flight on that tag (`inflight[tag]`), as
    /// [`Api::outcome`] says it, or how the call failed, to `f`. Returns how many calls
    /// completed. `Var` reads each response where it was received ([`KvVarClient::poll_ref`]):
    /// a get's value is checked in place, not copied into a `Vec`.
    fn poll_outcomes<T: ClientTransport + Send>(
        c: &mut Self::Conn<T>,
        inflight: &[(Instant, Op)],
        ctx: &Ctx,
        f: impl FnMut(u64, Result<Outcome, Failed>),
    ) -> Result<usize, RpcError>;
    /// Serves what `server` has received from `shard`; how many requests.
    fn serve<T: ServerTransport>(server: &mut Server<Self::S, T>, shard: &mut Self::Shard)
    -> usize;
    /// Executes `req` on `shard` (the daemons whose runtime hands them owned requests).
    fn dispatch(
        shard: &mut Self::Shard,
        req: <Self::S as Service>::Request,
    ) -> <Self::S as Service>::Response;
    /// Executes the request message `msg` on `shard` in place and writes the response
    /// message into `out`: the service's generated `dispatch_raw` (the routing daemons'
    /// `run_once_raw`).
    fn dispatch_raw(
        shard: &mut Self::Shard,
        msg: &[u8],
        out: &mut [u8],
    ) -> Result<usize, WireError>;
    /// The router of `daemons` daemons per rank, reading a request message in place.
    fn route(daemons: usize) -> Router;
    /// Keys in `shard`.
    fn keys(shard: &Self::Shard) -> usize;
    /// The service's schema fingerprint.
    fn fingerprint() -> u64 {
        Self::S::DESCRIPTOR.fingerprint
    }
    /// One rank of a Meta or Delegation run of this service (`seed::run_seed_rank` with the
    /// service's Flux message capacity).
    fn run_seed_rank<B: rpc::bootstrap::Bootstrap>(
        b: &B,
        job: &Job,
        a: &RunArgs,
        topo: Topology,
    ) -> Result<Summary, String>;
}

/// `idl::kv::Kv`: `u64` keys and values.
pub(crate) struct Fixed;

/// One [`Fixed`] shard.
#[derive(Default)]
pub(crate) struct FixedShard {
    pub(crate) map: FxHashMap<u64, u64>,
}

impl KvServer for FixedShard {
    fn put(&mut self, _rank: u32, key: u64, value: u64) {
        self.map.insert(key, value);
    }
    fn get(&mut self, _rank: u32, key: u64) -> Option<u64> {
        self.map.get(&key).copied()
    }
}

impl Api for Fixed {
    type S = KvService;
    type Conn<T: ClientTransport + Send> = KvClient<T>;
    type Shard = FixedShard;

    fn connect<T: ClientTransport + Send>(addr: &T::Addr) -> Result<KvClient<T>, RpcError> {
        KvClient::connect(addr)
    }
    fn from_transport<T: ClientTransport + Send>(t: T) -> KvClient<T> {
        KvClient::from_transport(t)
    }
    #[inline]
    fn core<T: ClientTransport + Send>(c: &mut KvClient<T>) -> &mut rpc::Client<KvService, T> {
        c.core_mut()
    }
    #[inline]
    fn owner(key: u64, daemons: usize, _ctx: &Ctx) -> usize {
        owner_daemon(key, daemons)
    }
    #[inline]
    fn issue<T: ClientTransport + Send>(
        c: &mut KvClient<T>,
        tag: u64,
        op: Op,
        version: u64,
        _ctx: &mut Ctx,
    ) -> Result<(), RpcError> {
        if op.read {
            c.issue(tag).get(op.rank, op.key)
        } else {
            c.issue(tag).put(op.rank, op.key, version)
        }
    }
    fn put<T: ClientTransport + Send>(
        c: &mut KvClient<T>,
        rank: u32,
        key: u64,
        version: u64,
        _ctx: &mut Ctx,
    ) -> Result<(), RpcError> {
        c.put(rank, key, version)
    }
    fn get<T: ClientTransport + Send>(
        c: &mut KvClient<T>,
        rank: u32,
        key: u64,
        _ctx: &mut Ctx,
    ) -> Result<Read, RpcError> {
        Ok(match c.get(rank, key)? {
            Some(version) => Read::Hit {
                version,
                intact: true,
            },
            None => Read::Miss,
        })
    }
    #[inline]
    fn poll_outcomes<T: ClientTransport + Send>(
        c: &mut KvClient<T>,
        inflight: &[(Instant, Op)],
        ctx: &Ctx,
        mut f: impl FnMut(u64, Result<Outcome, Failed>),
    ) -> Result<usize, RpcError> {
        // `KvResponse` is `Copy`: nothing to borrow.
        c.poll_with(|tag, r| {
            let o = r.map_err(failed).map(|r| match op_of(inflight, tag) {
                Some(op) => Self::outcome(&r, op, ctx),
                None => Err(()),
            });
            f(tag, o)
        })
    }
    #[inline]
    fn outcome(r: &KvResponse, op: &Op, _ctx: &Ctx) -> Outcome {
        match r {
            KvResponse::Get(v) if op.read => Ok(Some(match *v {
                Some(version) => Read::Hit {
                    version,
                    intact: true,
                },
                None => Read::Miss,
            })),
            KvResponse::Put(()) if !op.read => Ok(None),
            _ => Err(()),
        }
    }
    #[inline]
    fn serve<T: ServerTransport>(
        server: &mut Server<KvService, T>,
        shard: &mut FixedShard,
    ) -> usize {
        server.serve_once(|req| KvService::dispatch(shard, req))
    }
    #[inline]
    fn dispatch(shard: &mut FixedShard, req: KvRequest) -> KvResponse {
        KvService::dispatch(shard, req)
    }
    #[inline]
    fn dispatch_raw(
        shard: &mut FixedShard,
        msg: &[u8],
        out: &mut [u8],
    ) -> Result<usize, WireError> {
        KvService::dispatch_raw(shard, msg, out)
    }
    fn route(daemons: usize) -> Router {
        // A fixed-size request decodes by a validated cast (no allocation, `KvRequest` is
        // `Copy`).
        Box::new(move |msg: &[u8]| {
            let (rank, key) = match KvService::decode_request(msg)? {
                KvRequest::Get(a) => (a.rank(), a.key()),
                KvRequest::Put(a) => (a.rank(), a.key()),
            };
            Ok(Target {
                rank,
                daemon: owner_daemon(key, daemons) as u32,
            })
        })
    }
    fn keys(shard: &FixedShard) -> usize {
        shard.map.len()
    }
    fn run_seed_rank<B: rpc::bootstrap::Bootstrap>(
        b: &B,
        job: &Job,
        a: &RunArgs,
        topo: Topology,
    ) -> Result<Summary, String> {
        crate::seed::run_seed_rank::<Self, B, { rpc::delegation::node::DEFAULT_MSG_CAP }>(
            b, job, a, topo,
        )
    }
}

/// `idl::kv::KvVar`: byte-string keys and values (see the module docs).
pub(crate) struct Var;

/// Flux message capacity of `Var` runs, bytes: its largest message (a put of the longest
/// key and value) fits.
pub const VAR_MSG_CAP: usize = 4480;

/// One [`Var`] shard. A put of a key already stored reuses the value's buffer.
#[derive(Default)]
pub(crate) struct VarShard {
    pub(crate) map: FxHashMap<String, Vec<u8>>,
}

impl KvVarServer for VarShard {
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

/// The key of key id `id` as a `&str` in `buf`.
#[inline]
fn key_str<'a>(id: u64, sizes: &Sizes, buf: &'a mut [u8; MAX_KEY_BYTES]) -> &'a str {
    let n = render_key(id, sizes, buf);
    // `k` and decimal digits: ASCII.
    std::str::from_utf8(&buf[..n]).unwrap_or("k")
}

impl Api for Var {
    type S = KvVarService;
    type Conn<T: ClientTransport + Send> = KvVarClient<T>;
    type Shard = VarShard;

    fn connect<T: ClientTransport + Send>(addr: &T::Addr) -> Result<KvVarClient<T>, RpcError> {
        KvVarClient::connect(addr)
    }
    fn from_transport<T: ClientTransport + Send>(t: T) -> KvVarClient<T> {
        KvVarClient::from_transport(t)
    }
    #[inline]
    fn core<T: ClientTransport + Send>(
        c: &mut KvVarClient<T>,
    ) -> &mut rpc::Client<KvVarService, T> {
        c.core_mut()
    }
    #[inline]
    fn owner(key: u64, daemons: usize, ctx: &Ctx) -> usize {
        let mut k = [0u8; MAX_KEY_BYTES];
        let n = render_key(key, &ctx.sizes, &mut k);
        owner_daemon_of(&k[..n], daemons)
    }
    #[inline]
    fn issue<T: ClientTransport + Send>(
        c: &mut KvVarClient<T>,
        tag: u64,
        op: Op,
        version: u64,
        ctx: &mut Ctx,
    ) -> Result<(), RpcError> {
        let mut k = [0u8; MAX_KEY_BYTES];
        let key = key_str(op.key, &ctx.sizes, &mut k);
        if op.read {
            c.issue(tag).get(op.rank, key)
        } else {
            let value = ctx.value(op.key, version);
            c.issue(tag).put(op.rank, key, value)
        }
    }
    fn put<T: ClientTransport + Send>(
        c: &mut KvVarClient<T>,
        rank: u32,
        key: u64,
        version: u64,
        ctx: &mut Ctx,
    ) -> Result<(), RpcError> {
        let mut k = [0u8; MAX_KEY_BYTES];
        let ks = key_str(key, &ctx.sizes, &mut k);
        let value = ctx.value(key, version);
        c.put(rank, ks, value)
    }
    fn get<T: ClientTransport + Send>(
        c: &mut KvVarClient<T>,
        rank: u32,
        key: u64,
        ctx: &mut Ctx,
    ) -> Result<Read, RpcError> {
        let mut k = [0u8; MAX_KEY_BYTES];
        let ks = key_str(key, &ctx.sizes, &mut k);
        let sizes = ctx.sizes;
        // The lending stub: the value is checked in the response buffer, not copied.
        c.get_with(rank, ks, |v| match v {
            Some(v) => verify_value(key, v, &sizes),
            None => Read::Miss,
        })
    }
    #[inline]
    fn poll_outcomes<T: ClientTransport + Send>(
        c: &mut KvVarClient<T>,
        inflight: &[(Instant, Op)],
        ctx: &Ctx,
        mut f: impl FnMut(u64, Result<Outcome, Failed>),
    ) -> Result<usize, RpcError> {
        // The lending poll: a get's value is checked where it was received (the same check as
        // `outcome`, every byte and the length), never copied.
        c.poll_ref(|tag, r| {
            let o = r.map_err(failed).map(|r| match (r, op_of(inflight, tag)) {
                (KvVarResponseRef::Get(v), Some(op)) if op.read => Ok(Some(match v {
                    Some(v) => verify_value(op.key, v, &ctx.sizes),
                    None => Read::Miss,
                })),
                (KvVarResponseRef::Put(()), Some(op)) if !op.read => Ok(None),
                _ => Err(()),
            });
            f(tag, o)
        })
    }
    #[inline]
    fn outcome(r: &KvVarResponse, op: &Op, ctx: &Ctx) -> Outcome {
        match r {
            KvVarResponse::Get(v) if op.read => Ok(Some(match v {
                Some(v) => verify_value(op.key, v, &ctx.sizes),
                None => Read::Miss,
            })),
            KvVarResponse::Put(()) if !op.read => Ok(None),
            _ => Err(()),
        }
    }
    #[inline]
    fn serve<T: ServerTransport>(
        server: &mut Server<KvVarService, T>,
        shard: &mut VarShard,
    ) -> usize {
        // Zero copy: the handler reads the key and value in the receive buffer and writes the
        // value it returns straight into the response.
        server.serve_once_raw(|msg, out| KvVarService::dispatch_raw(shard, msg, out))
    }
    #[inline]
    fn dispatch(shard: &mut VarShard, req: KvVarRequest) -> KvVarResponse {
        KvVarService::dispatch(shard, req)
    }
    #[inline]
    fn dispatch_raw(shard: &mut VarShard, msg: &[u8], out: &mut [u8]) -> Result<usize, WireError> {
        // The key and value are read in the request, the value got is written straight into
        // the response.
        KvVarService::dispatch_raw(shard, msg, out)
    }
    fn route(daemons: usize) -> Router {
        // The key is read in the request (no `String`).
        Box::new(move |msg: &[u8]| {
            let (rank, key) = kv_var_target(msg)?;
            Ok(Target {
                rank,
                daemon: owner_daemon_of(key.as_bytes(), daemons) as u32,
            })
        })
    }
    fn keys(shard: &VarShard) -> usize {
        shard.map.len()
    }
    fn run_seed_rank<B: rpc::bootstrap::Bootstrap>(
        b: &B,
        job: &Job,
        a: &RunArgs,
        topo: Topology,
    ) -> Result<Summary, String> {
        crate::seed::run_seed_rank::<Self, B, VAR_MSG_CAP>(b, job, a, topo)
    }
}

/// Whether `version` could have been written to key id `key` (its writer id is the key's
/// class among `writers`).
#[inline]
pub(crate) fn plausible(version: u64, key: u64, writers: u64) -> bool {
    version >> SEQ_BITS == key % writers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(v: &str, k: &str) -> Sizes {
        Sizes {
            value: v.parse().unwrap(),
            key: k.parse().unwrap(),
        }
    }

    #[test]
    fn size_ranges_parse() {
        assert_eq!("64".parse(), Ok(SizeRange { lo: 64, hi: 64 }));
        assert_eq!("16-4096".parse(), Ok(SizeRange { lo: 16, hi: 4096 }));
        assert!("4096-16".parse::<SizeRange>().is_err());
        assert!("x".parse::<SizeRange>().is_err());
        assert!("1-".parse::<SizeRange>().is_err());
        assert_eq!(SizeRange { lo: 16, hi: 4096 }.to_string(), "16-4096");
    }

    #[test]
    fn values_round_trip_and_cover_the_range() {
        let s = sizes("16-4096", "8");
        let mut buf = Vec::new();
        let (mut min, mut max) = (usize::MAX, 0);
        for key in 0..2000u64 {
            let version = (3 << SEQ_BITS) | (key * 7);
            fill_value(key, version, &s, &mut buf);
            assert!((16..=4096).contains(&buf.len()));
            (min, max) = (min.min(buf.len()), max.max(buf.len()));
            assert_eq!(
                verify_value(key, &buf, &s),
                Read::Hit {
                    version,
                    intact: true
                }
            );
        }
        // Uniform over 16..=4096: 2000 draws reach both ends' neighbourhoods.
        assert!(min < 16 + 100 && max > 4096 - 100, "{min}..{max}");
    }

    #[test]
    fn damaged_values_are_detected() {
        let s = sizes("16-4096", "8");
        let mut buf = Vec::new();
        let (key, version) = (77u64, (1 << SEQ_BITS) | 5);
        fill_value(key, version, &s, &mut buf);
        let bad = |v: &[u8]| verify_value(key, v, &s).version().is_none();
        // Every single byte flipped, anywhere.
        for i in 0..buf.len() {
            let mut v = buf.clone();
            v[i] ^= 1;
            let r = verify_value(key, &v, &s);
            if i < 8 {
                // The version itself changed: its value is checked against another pattern.
                assert_ne!(r.version(), Some(version), "byte {i}");
            } else {
                assert!(bad(&v), "byte {i}");
            }
        }
        // One byte short, one byte long, empty, 15 bytes.
        assert!(bad(&buf[..buf.len() - 1]));
        let mut long = buf.clone();
        long.push(0);
        assert!(bad(&long));
        assert!(bad(&[]));
        assert!(bad(&buf[..15]));
        // The value of another key, or another version (same writer).
        fill_value(key + 1, version, &s, &mut buf);
        assert!(bad(&buf));
        fill_value(key, version + 1, &s, &mut buf);
        assert_eq!(verify_value(key, &buf, &s).version(), Some(version + 1));
    }

    #[test]
    fn the_corrupt_puts_hook_damages_values() {
        let s = sizes("16-64", "8");
        for c in [Corrupt::Flip, Corrupt::Short] {
            let mut ctx = Ctx::new(s, Some(c));
            let v = ctx.value(5, 9).to_vec();
            assert_eq!(verify_value(5, &v, &s).version(), None, "{c:?}");
        }
    }

    #[test]
    fn keys_are_unique_with_their_lengths() {
        let s = sizes("8", "8-40");
        let mut seen = std::collections::HashSet::new();
        let mut k = [0u8; MAX_KEY_BYTES];
        let (mut min, mut max) = (usize::MAX, 0);
        for id in 0..5000u64 {
            let n = render_key(id, &s, &mut k);
            assert!((8..=40).contains(&n));
            (min, max) = (min.min(n), max.max(n));
            assert!(seen.insert(k[..n].to_vec()), "key {id} twice");
            let text = std::str::from_utf8(&k[..n]).unwrap();
            assert_eq!(text[1..].parse::<u64>().unwrap(), id);
            // The same id, the same key.
            let mut again = [0u8; MAX_KEY_BYTES];
            let m = render_key(id, &s, &mut again);
            assert_eq!(&again[..m], &k[..n]);
        }
        assert_eq!((min, max), (8, 40));
        let n = render_key(42, &sizes("8", "8"), &mut k);
        assert_eq!(&k[..n], b"k0000042");
    }
}

//! The daemons of one rank in the seeds/004 system, for both of its backends: every daemon
//! serves its shard to the rank's clients over a per-daemon local server (the seed's `ipc`,
//! per-client SPSC rings), talks to the other daemons of its rank over [`crate::flux`], and
//! the daemons that hold copyrpc endpoints send and receive the calls between ranks.
//! Source: seeds/004 §1 (the two backends), §1.3 (the threads of a rank), §1.4 (where the
//! copyrpc endpoints live), §4 (data flows), §5 (Daemon#0's loop), §6 (the worker loop), §8
//! (`DelegatePayload`).
//!
//! # The two backends ([`Placement`])
//! - **Delegation** ([`Placement::Aggregated`], seeds/004 §1.2): Daemon#0 holds one endpoint
//!   per remote rank and a delegation ring ([`DelegationServer`]) into which every client of
//!   the rank writes its calls for other ranks (one hop to the daemon that sends them).
//! - **Meta** ([`Placement::Distributed`], seeds/004 §1.1, §1.4): daemon `d` holds the
//!   endpoints of the remote ranks `s` with `s % D == d`. A client sends every call, remote or
//!   not, over ipc to the daemon owning the key's shard (`key % D`), which passes a call for
//!   another rank over Flux to the daemon holding that rank's endpoint (three hops: client →
//!   ipc → Daemon#N → Flux → Daemon#h → copyrpc; none when `N == h`).
//!
//! A [`NodeDaemon`] routes by the same rules whatever it holds, so one type runs every daemon
//! of both backends: a request is **served** here if it is for this rank and this daemon's
//! shard; passed over **Flux** to the owning daemon if it is for this rank and another shard;
//! sent over **copyrpc** if it is for another rank whose endpoint this daemon holds; and passed
//! over **Flux** to the holder of that endpoint otherwise ([`Placement::holder`]).
//!
//! # One round ([`NodeDaemon::run_once`], [`NodeDaemon::run_once_raw`]), in the seed's phase order (§5, §6)
//! 1. **copyrpc** (a daemon with a context): `ctx.poll`; each response goes back to whoever
//!    waits for it (a ring client's response slot, a local client, or the daemon that passed
//!    the call over Flux); then each request received over copyrpc is served, or passed over
//!    Flux to the shard owner (§4.3 steps 1-3).
//! 2. **delegation ring** (Delegation backend, Daemon#0): the calls queued for copyrpc by an
//!    earlier round go first (see "Back-pressure"), then the ring's entries, sent with
//!    `copyrpc call` to their rank's endpoint (§4.1 steps 2-3); then `advance_tail`.
//! 3. **ipc** (the local server): each local client's call is served (§4.4), or (Meta, or a
//!    call the client routed here anyway) sent on towards its rank.
//! 4. **Flux**: responses to this daemon's Flux calls go back to the copyrpc caller
//!    (`copyrpc reply`, §4.3 steps 7-8) or the local client; requests from other daemons are
//!    served (§6 Phase 2) or, at an endpoint holder, sent with `copyrpc call`.
//!
//! A worker (Daemon#1..K of the Delegation backend) has no context and no ring, so its round
//! is the seed's worker loop: ipc, then Flux (§6).
//!
//! # Sleeping (extension, seed: none)
//! The seed's daemons poll forever. [`NodeDaemon::wait_for_work`] lets a daemon whose rounds
//! found nothing sleep until one of its clients or another daemon sends, with one
//! `futex_waitv` over its local server's, its ring's and its Flux node's words (the ipc,
//! ring and Flux wake protocols, [`ServerTransport::prepare_sleep`],
//! [`Flux::prepare_sleep`]). Only a daemon every input of which can wake it sleeps: no
//! copyrpc context, nothing in its backlog.
//! The `kv` daemons call it when `rpc::erpc::idle::CallWait` says so, never when pinned.
//!
//! # Back-pressure (seeds/004 §5 "バックプレッシャ処理")
//! The seed retries a `copyrpc call` that finds the send ring full after a nested `ctx.poll`,
//! and parks the responses of that nested poll. Here a call that finds no room — copyrpc ring
//! full or credit short, a Flux queue full or the Flux in-flight limit reached — is copied
//! (cold path) into the daemon's **backlog**, one FIFO per destination (each copyrpc
//! endpoint, each other daemon), retried at the start of Phase 2 of later rounds, after
//! Phase 1 has returned credit. While a destination's FIFO is not empty every new call
//! towards it joins the FIFO too, so the calls of one client towards one destination leave
//! in the order the client issued them (a single writer's puts to a key are applied in issue
//! order, which the KV benchmark's check relies on). One FIFO per destination, not one for
//! all: a call waiting for copyrpc credit must not hold back a hand-off over Flux, whose
//! answer is what returns the credit the peer waits for (with one FIFO, two daemons 0
//! waiting for each other's credit would wait for ever). No phase waits, and none nests
//! another.
//! The seed's second rule, a copyrpc *reply* that finds the ring full in Phase 4 (a nested
//! poll whose responses wait in `nested_resp_buf`), has no counterpart: this copyrpc core
//! never refuses a reply for lack of space (the caller's credit reserved it, see
//! [`crate::copyrpc::endpoint`]), so Phase 4 replies at once and buffers nothing.
//! The backlog holds at most [`NodeConfig::backlog`] calls; one more is answered
//! [`Status::Unreachable`] ([`NodeStats::backlog_full`]).
//!
//! # Every call ends
//! A call that waits in the backlog, or has been passed over Flux, longer than
//! [`NodeConfig::wait_timeout`] (a stopped daemon or peer) is given up and its caller answered
//! [`Status::Unreachable`] ([`NodeStats::wait_timeouts`]); a late Flux response to it is
//! dropped and counted by Flux ([`crate::flux::FluxStats::stale_responses`]). The sweep runs
//! every [`SWEEP_ROUNDS`] rounds. A copyrpc call whose endpoint fails is answered
//! `Unreachable` when the context reports the failure ([`NodeStats::failed_calls`]).
//!
//! # Bad input
//! Nothing a client, another daemon or a peer sends makes a daemon panic. A request that does
//! not decode is answered with its decode error's status ([`NodeStats::bad_requests`]); one
//! for a rank that does not exist, a daemon that does not exist, or a rank whose endpoint is
//! missing, with [`Status::Unreachable`] ([`NodeStats::unroutable`]); a forwarded response
//! that is not a wire message or does not fit the caller, with
//! [`Status::BadForwardedResponse`] ([`NodeStats::corrupt_responses`]).
//!
//! Messages travel as the raw wire messages they are ([`crate::wire`]): the bytes of a
//! client's call go verbatim into `copyrpc call` or a Flux [`WireMsg`], a response verbatim
//! back. A request is decoded only to route it and to serve it.
//!
//! # Serving the shard: owned or in place
//! [`NodeDaemon::run_once`] decodes a request of the shard into a `S::Request` for its
//! handler (variable-length arguments copied into `String`/`Vec`s) and encodes the
//! `S::Response` it returns; the daemon's router reads the decoded request.
//! [`NodeDaemon::run_once_raw`] allocates nothing per request: its router reads the target
//! from the message and its handler (the generated `<Trait>Service::dispatch_raw`) decodes
//! the request in place and writes the reply straight into the reply buffer. Either way the
//! handler reads the daemon's **private** copy of the request, never memory a client or peer
//! can write while it runs ([`crate::ServerTransport::recv_into`]).

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use super::forward::Target;
use super::shard::{Owned, Raw, Shard, is_oversized, method_id_of, serve_into};
use super::{DelegationServer, ReplyToken, RingServer};
use crate::copyrpc::{Context, EndpointId, RecvHandle};
use crate::error::{RpcError, sat_u32};
use crate::flux::{Flux, FluxError, FluxToken};
use crate::server::{ServerTransport, SleepPrep};
use crate::service::Service;
use crate::varlen::AlignedBuf;
use crate::wire::{self, Status, WireError};

/// Default capacity of a [`WireMsg`], bytes: room for any message of the seeds/004 KV service
/// (a header and at most 56 bytes of arguments or result).
pub const DEFAULT_MSG_CAP: usize = 64;

/// Rounds between two sweeps for calls that waited longer than the wait timeout.
pub const SWEEP_ROUNDS: u64 = 1024;

/// Default bound on how long a call waits in a daemon's backlog or for a Flux response: 1 s,
/// the typed clients' default deadline.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(1);

/// Default backlog capacity, calls (see the module docs, "Back-pressure").
pub const DEFAULT_BACKLOG: usize = 4096;

/// One wire message of at most `N` bytes, by value: what a Flux channel carries
/// (seeds/004 §8 `DelegatePayload`, here with the message bytes instead of the typed enum, so
/// error statuses travel too).
///
/// Only the message's own bytes are written: the rest of the `N`-byte array stays
/// uninitialised (a `KvVar` message holds 4480 bytes, most of them unused by a get), so a
/// hop costs a copy of the message, not a zero-fill of `N` bytes. Invariant: `bytes[..len]`
/// are initialised and `len <= N`; nothing past `len` is ever read (copies of the whole value
/// move the uninitialised bytes as `MaybeUninit`, which is sound). The bytes start on an
/// 8-byte boundary ([`crate::varlen::MAX_SLICE_ALIGN`]), so a message decoded in place from
/// a `WireMsg` needs no realignment.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub struct WireMsg<const N: usize = DEFAULT_MSG_CAP> {
    bytes: [MaybeUninit<u8>; N],
    len: u16,
}

impl<const N: usize> WireMsg<N> {
    /// A copy of `msg`; `None` if it is longer than `N` (or 65535) bytes. Writes
    /// `msg.len()` bytes only.
    #[inline]
    pub fn new(msg: &[u8]) -> Option<Self> {
        if msg.len() > N {
            return None;
        }
        let len = u16::try_from(msg.len()).ok()?;
        let mut m = WireMsg {
            bytes: [const { MaybeUninit::uninit() }; N],
            len: 0,
        };
        for (d, s) in m.bytes[..msg.len()].iter_mut().zip(msg) {
            d.write(*s);
        }
        // `bytes[..len]` were written just above: the invariant holds.
        m.len = len;
        Some(m)
    }

    /// A message written in place by `encode` into `N` zeroed bytes; its return value
    /// (clamped to `N`) is the length. Zero-fills all `N` bytes first: on a hot path, encode
    /// into a reused buffer and copy with [`WireMsg::new`] instead.
    #[inline]
    pub fn encoded(encode: impl FnOnce(&mut [u8]) -> usize) -> Self {
        let mut bytes = [0u8; N];
        let len = encode(&mut bytes).min(N).min(u16::MAX as usize);
        let mut m = WireMsg {
            bytes: [const { MaybeUninit::uninit() }; N],
            len: 0,
        };
        for (d, s) in m.bytes[..len].iter_mut().zip(&bytes[..len]) {
            d.write(*s);
        }
        m.len = len as u16;
        m
    }

    /// The message bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        let len = usize::from(self.len).min(N);
        // SAFETY: by the type's invariant `bytes[..len]` are initialised (`new` and `encoded`
        // write them before setting `len`, nothing else writes `len` or `bytes`), and
        // `MaybeUninit<u8>` has the layout of `u8`; the slice lies inside `self.bytes`.
        unsafe { std::slice::from_raw_parts(self.bytes.as_ptr().cast::<u8>(), len) }
    }
}

impl<const N: usize> std::fmt::Debug for WireMsg<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireMsg").field("len", &self.len).finish()
    }
}

/// What a Flux channel between daemons carries (seeds/004 §8 `DelegatePayload`).
#[derive(Clone, Copy, Debug)]
pub enum DelegatePayload<const N: usize = DEFAULT_MSG_CAP> {
    /// A request passed to another daemon (seeds/004 §4.3 step 3).
    Req(WireMsg<N>),
    /// Its response (seeds/004 §4.3 step 6).
    Resp(WireMsg<N>),
}

/// Where the copyrpc endpoints of a rank live (seeds/004 §1.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Delegation backend: Daemon#0 holds an endpoint to every remote rank.
    Aggregated,
    /// Meta backend: daemon `d` holds the endpoints of the remote ranks `s` with
    /// `s % daemons == d`.
    Distributed,
}

impl Placement {
    /// The daemon of a rank that holds the endpoint towards `rank` (seeds/004 §1.4).
    #[inline]
    pub fn holder(self, rank: u32, daemons: u32) -> u32 {
        match self {
            Placement::Aggregated => 0,
            Placement::Distributed => rank % daemons.max(1),
        }
    }
}

/// Who waits for the response to a call this daemon passed on: the copyrpc user data
/// (seeds/004 §4.1 `DelegToken`) and the Flux user token (the seed's
/// `pending_copyrpc_handles` index, §4.3 step 3), generalised to every way a call reaches a
/// daemon.
#[derive(Clone, Copy, Debug)]
pub enum Caller<T> {
    /// A request received over copyrpc: answered with `copyrpc reply`.
    Remote(RecvHandle),
    /// A client of this daemon's local server.
    Local(T),
    /// A client of the delegation ring: its response slot.
    Ring(ReplyToken),
    /// Another daemon that passed the call over Flux.
    Flux(FluxToken),
}

/// The user data of a call this daemon sent over copyrpc.
#[derive(Clone, Copy, Debug)]
pub struct Origin<T> {
    caller: Caller<T>,
    /// The request's method id (echoed in an error status).
    method_id: u16,
}

/// The copyrpc context type of a daemon whose local server is `L`.
pub type NodeContext<L> = Context<Origin<<L as ServerTransport>::ReplyToken>>;

/// The user token of a call this daemon passed over Flux.
#[derive(Clone, Copy, Debug)]
pub struct FluxOrigin<T> {
    caller: Caller<T>,
    method_id: u16,
    /// When the call was passed on (for the wait-timeout sweep).
    issued: Instant,
}

/// The Flux node type of a daemon whose local server is `L`.
pub type NodeFlux<L, const N: usize = DEFAULT_MSG_CAP> =
    Flux<DelegatePayload<N>, FluxOrigin<<L as ServerTransport>::ReplyToken>>;

/// Where a daemon is and what it may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    /// This daemon's rank.
    pub rank: u32,
    /// Ranks in the job.
    pub ranks: u32,
    /// This daemon's index in its rank (its shard).
    pub daemon: u32,
    /// Daemons per rank (= Flux nodes).
    pub daemons: u32,
    /// Where the copyrpc endpoints live (the backend).
    pub placement: Placement,
    /// Bound on a call's wait in the backlog or for a Flux response.
    pub wait_timeout: Duration,
    /// Most calls the backlog holds.
    pub backlog: usize,
}

impl NodeConfig {
    /// Daemon `daemon` of `daemons` on `rank` of `ranks`, with the default wait timeout and
    /// backlog.
    pub fn new(
        placement: Placement,
        (rank, ranks): (u32, u32),
        (daemon, daemons): (u32, u32),
    ) -> Self {
        NodeConfig {
            rank,
            ranks,
            daemon,
            daemons,
            placement,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            backlog: DEFAULT_BACKLOG,
        }
    }
}

/// Setting up a [`NodeDaemon`] failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The configuration is inconsistent (named).
    #[error("node daemon: {0}")]
    Config(String),
    /// A ring serves a different interface or cannot carry the service's messages.
    #[error(transparent)]
    Ring(#[from] RpcError),
}

/// Counters of a [`NodeDaemon`] (numbers of requests or responses).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Local clients' requests served by this daemon's handler (§4.4).
    pub local_served: u64,
    /// Delegation-ring entries for this daemon's shard, served by the handler.
    pub ring_served: u64,
    /// Requests received over copyrpc and served by the handler.
    pub remote_served: u64,
    /// Requests received over Flux and served by the handler (§6 Phase 2).
    pub flux_served: u64,
    /// Calls sent with `copyrpc call` (from the ring, local clients or Flux).
    pub copyrpc_calls: u64,
    /// Their responses, passed back to the caller.
    pub copyrpc_responses: u64,
    /// Requests passed to another daemon over Flux.
    pub flux_calls: u64,
    /// Their responses, passed back to the caller.
    pub flux_responses: u64,
    /// Calls that found no room (copyrpc ring or credit, Flux queue or in-flight limit), or
    /// came while the backlog was not empty, and waited in the backlog.
    pub backlogged: u64,
    /// Calls refused because the backlog was full, answered [`Status::Unreachable`].
    pub backlog_full: u64,
    /// Calls given up after the wait timeout (backlog or Flux), answered
    /// [`Status::Unreachable`].
    pub wait_timeouts: u64,
    /// Requests that did not decode (to route them, or in the handler), answered with their
    /// decode error's status.
    pub bad_requests: u64,
    /// Requests of this shard whose response did not fit the reply buffer (a
    /// variable-length result over the service's `max_var_bytes`, or a handler that returned
    /// more than the buffer holds), answered [`Status::ResponseTooLarge`].
    pub oversized_responses: u64,
    /// Requests for a rank or daemon that does not exist or a rank whose endpoint is missing,
    /// answered [`Status::Unreachable`].
    pub unroutable: u64,
    /// Calls whose copyrpc endpoint failed or refused them, answered [`Status::Unreachable`].
    pub failed_calls: u64,
    /// Forwarded responses that were not wire messages or did not fit the caller, answered
    /// [`Status::BadForwardedResponse`].
    pub corrupt_responses: u64,
    /// Replies the transport refused (client gone, endpoint failed, Flux queue full).
    pub dropped_replies: u64,
    /// Sleeps in [`NodeDaemon::wait_for_work`].
    pub idle_waits: u64,
}

/// A call waiting for room (the backlog).
struct Pending<T, const N: usize> {
    msg: WireMsg<N>,
    to: Hop,
    from: Caller<T>,
    method_id: u16,
    issued: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hop {
    /// `copyrpc call` on the endpoint `ep` towards `rank`.
    Copyrpc { rank: u32, ep: EndpointId },
    /// `flux.call` to daemon `d`.
    Flux(u32),
}

/// The calls waiting for room: one FIFO per destination (module docs, "Back-pressure").
struct Backlog<T, const N: usize> {
    /// Flux to daemon `d` at `d`; copyrpc towards rank `r` at `daemons + r`.
    queues: Box<[VecDeque<Pending<T, N>>]>,
    daemons: usize,
    /// Calls waiting, all FIFOs.
    len: usize,
    /// Most calls waiting, all FIFOs.
    cap: usize,
}

impl<T, const N: usize> Backlog<T, N> {
    fn new(cap: usize, daemons: u32, ranks: u32) -> Self {
        Backlog {
            queues: (0..daemons + ranks).map(|_| VecDeque::new()).collect(),
            daemons: daemons as usize,
            len: 0,
            cap,
        }
    }

    #[inline]
    fn index(&self, hop: Hop) -> usize {
        match hop {
            Hop::Flux(d) => d as usize,
            Hop::Copyrpc { rank, .. } => self.daemons + rank as usize,
        }
    }

    /// Whether calls towards `hop` wait (a new one must queue behind them).
    #[inline]
    fn waiting(&self, hop: Hop) -> bool {
        self.len > 0
            && self
                .queues
                .get(self.index(hop))
                .is_some_and(|q| !q.is_empty())
    }

    /// Queues `p` behind the calls towards its destination; `p` back if the backlog is full.
    fn push_back(&mut self, p: Pending<T, N>) -> Result<(), Pending<T, N>> {
        let i = self.index(p.to);
        match self.queues.get_mut(i) {
            Some(q) if self.len < self.cap => {
                q.push_back(p);
                self.len += 1;
                Ok(())
            }
            _ => Err(p),
        }
    }

    fn pop_front(&mut self, q: usize) -> Option<Pending<T, N>> {
        let p = self.queues.get_mut(q)?.pop_front()?;
        self.len -= 1;
        Some(p)
    }

    fn push_front(&mut self, q: usize, p: Pending<T, N>) {
        if let Some(queue) = self.queues.get_mut(q) {
            queue.push_front(p);
            self.len += 1;
        }
    }

    /// Removes every call queued before `cutoff` (each FIFO is in issue order), passing each
    /// to `out`.
    fn expire(&mut self, cutoff: Instant, mut out: impl FnMut(Pending<T, N>)) {
        for q in self.queues.iter_mut() {
            while q.front().is_some_and(|p| p.issued < cutoff) {
                if let Some(p) = q.pop_front() {
                    self.len -= 1;
                    out(p);
                }
            }
        }
    }
}

/// One daemon of a rank in the seeds/004 system, for service `S`, serving its shard to local
/// clients over `L`, routing with `R`, with Flux messages of up to `N` bytes. See the module
/// docs.
pub struct NodeDaemon<S: Service, L: ServerTransport, R, const N: usize = DEFAULT_MSG_CAP> {
    cfg: NodeConfig,
    local: L,
    ring: Option<DelegationServer>,
    ctx: Option<NodeContext<L>>,
    /// Endpoint towards each rank this daemon holds (`None` elsewhere).
    peers: Box<[Option<EndpointId>]>,
    flux: NodeFlux<L, N>,
    route: R,
    backlog: Backlog<L::ReplyToken, N>,
    stats: NodeStats,
    rounds: u64,
    bufs: Bufs,
    /// A transport or the kernel refused to sleep: `wait_for_work` no longer tries.
    sleep_off: bool,
    _service: PhantomData<fn() -> S>,
}

/// The daemon's private request and reply buffers (sized at construction; the request
/// buffers are swapped with the transports' own, [`ServerTransport::recv_into`]).
struct Bufs {
    /// A local client's request.
    local: AlignedBuf,
    /// A delegation-ring entry.
    ring: AlignedBuf,
    /// A copy of a request received over copyrpc.
    remote: AlignedBuf,
    /// The reply to a request received over Flux (`max_response_bytes`).
    reply: AlignedBuf,
}

impl<S: Service, L: ServerTransport, R, const N: usize> std::fmt::Debug for NodeDaemon<S, L, R, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeDaemon")
            .field("service", &S::DESCRIPTOR.name)
            .field("cfg", &self.cfg)
            .field("ring", &self.ring.is_some())
            .field("context", &self.ctx.is_some())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<S: Service, L: ServerTransport, R, const N: usize> NodeDaemon<S, L, R, N> {
    /// Daemon `cfg.daemon` of its rank, serving `local` (this daemon's shard, created for
    /// `S`), with its node `flux` of the rank's Flux network (`flux.id() == cfg.daemon`,
    /// `flux.nodes() == cfg.daemons`), routing with `route`: either a function of the
    /// decoded request (`FnMut(&S::Request) -> Target`, for [`NodeDaemon::run_once`]) or of
    /// the request message (`FnMut(&[u8]) -> Result<Target, WireError>`, for
    /// [`NodeDaemon::run_once_raw`]). Add a ring with [`NodeDaemon::with_ring`] and a
    /// context with [`NodeDaemon::with_context`] + [`NodeDaemon::set_peer`].
    ///
    /// # Errors
    /// [`NodeError::Config`] if the rank or daemon is out of range, the Flux node does not
    /// match, the wait timeout or backlog is zero, or `S`'s largest request or response does
    /// not fit a [`WireMsg<N>`].
    pub fn new(
        cfg: NodeConfig,
        local: L,
        flux: NodeFlux<L, N>,
        route: R,
    ) -> Result<Self, NodeError> {
        let bad = |m: String| Err(NodeError::Config(m));
        if cfg.rank >= cfg.ranks {
            return bad(format!("rank {} out of range 0..{}", cfg.rank, cfg.ranks));
        }
        if cfg.daemon >= cfg.daemons {
            return bad(format!(
                "daemon {} out of range 0..{}",
                cfg.daemon, cfg.daemons
            ));
        }
        if flux.id() != cfg.daemon as usize || flux.nodes() != cfg.daemons as usize {
            return bad(format!(
                "flux node {} of {} for daemon {} of {}",
                flux.id(),
                flux.nodes(),
                cfg.daemon,
                cfg.daemons
            ));
        }
        if cfg.wait_timeout.is_zero() || cfg.backlog == 0 {
            return bad("wait_timeout and backlog must be > 0".into());
        }
        let d = S::DESCRIPTOR;
        if d.max_request_bytes.max(d.max_response_bytes) > N.min(u16::MAX as usize) {
            return bad(format!(
                "{}'s messages ({} B request, {} B response) exceed the Flux message capacity {N} B",
                d.name, d.max_request_bytes, d.max_response_bytes
            ));
        }
        Ok(NodeDaemon {
            cfg,
            local,
            ring: None,
            ctx: None,
            peers: vec![None; cfg.ranks as usize].into_boxed_slice(),
            flux,
            route,
            backlog: Backlog::new(cfg.backlog, cfg.daemons, cfg.ranks),
            stats: NodeStats::default(),
            rounds: 0,
            sleep_off: false,
            bufs: Bufs {
                local: AlignedBuf::new(d.max_request_bytes),
                ring: AlignedBuf::new(d.max_request_bytes),
                remote: AlignedBuf::new(d.max_request_bytes),
                reply: AlignedBuf::new(d.max_response_bytes),
            },
            _service: PhantomData,
        })
    }

    /// Adds the delegation ring into which the rank's clients write their remote calls
    /// (Delegation backend, Daemon#0: seeds/004 §1.2, §2).
    ///
    /// # Errors
    /// [`NodeError::Config`] unless this daemon holds endpoints under its placement
    /// (Aggregated: daemon 0); [`NodeError::Ring`] if the ring was not created for `S`.
    pub fn with_ring(mut self, ring: DelegationServer) -> Result<Self, NodeError> {
        if self.cfg.placement != Placement::Aggregated || self.cfg.daemon != 0 {
            return Err(NodeError::Config(
                "only Daemon#0 of the Delegation backend (Aggregated placement) serves a ring"
                    .into(),
            ));
        }
        let info = ring.ring().info();
        super::forward::check_ring::<S>(
            info.fingerprint,
            info.req_payload_cap,
            info.resp_payload_cap,
        )?;
        self.ring = Some(ring);
        Ok(self)
    }

    /// Adds the copyrpc context holding this daemon's endpoints; register each with
    /// [`NodeDaemon::set_peer`] once connected.
    pub fn with_context(mut self, ctx: NodeContext<L>) -> Self {
        self.set_context(ctx);
        self
    }

    /// [`NodeDaemon::with_context`] in place (replaces any earlier context and forgets the
    /// endpoints registered with it).
    pub fn set_context(&mut self, ctx: NodeContext<L>) {
        self.peers.iter_mut().for_each(|p| *p = None);
        self.ctx = Some(ctx);
    }

    /// Routes calls for `rank` over endpoint `ep` of the context (connected to the daemon of
    /// `rank` that holds this rank's endpoint).
    ///
    /// # Errors
    /// [`NodeError::Config`] for this daemon's own rank, a rank out of range, a rank this
    /// daemon does not hold under its placement, no context, or an endpoint the context does
    /// not have.
    pub fn set_peer(&mut self, rank: u32, ep: EndpointId) -> Result<(), NodeError> {
        let c = self.cfg;
        if rank >= c.ranks || rank == c.rank || c.placement.holder(rank, c.daemons) != c.daemon {
            return Err(NodeError::Config(format!(
                "daemon {} of rank {} does not hold the endpoint of rank {rank}",
                c.daemon, c.rank
            )));
        }
        match &self.ctx {
            Some(ctx) if (ep as usize) < ctx.num_endpoints() => {
                self.peers[rank as usize] = Some(ep);
                Ok(())
            }
            _ => Err(NodeError::Config(format!(
                "no endpoint {ep} in the daemon's context"
            ))),
        }
    }

    /// Counters.
    pub fn stats(&self) -> &NodeStats {
        &self.stats
    }

    /// The configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.cfg
    }

    /// The local server.
    pub fn local(&self) -> &L {
        &self.local
    }

    /// The delegation ring, if any.
    pub fn ring(&self) -> Option<&DelegationServer> {
        self.ring.as_ref()
    }

    /// The copyrpc context, if any.
    pub fn context(&self) -> Option<&NodeContext<L>> {
        self.ctx.as_ref()
    }

    /// The copyrpc context, mutably (create and connect endpoints).
    pub fn context_mut(&mut self) -> Option<&mut NodeContext<L>> {
        self.ctx.as_mut()
    }

    /// The Flux node (its counters).
    pub fn flux(&self) -> &NodeFlux<L, N> {
        &self.flux
    }

    /// Calls waiting in the backlog.
    pub fn backlog_len(&self) -> usize {
        self.backlog.len
    }

    /// Sleeps until a client of the local server or of the ring, or another daemon over Flux,
    /// may have sent a request, at most `bound`, for a daemon whose rounds found nothing (the caller decides when:
    /// `rpc::erpc::idle::CallWait`, never from a thread pinned to one CPU). One
    /// `futex_waitv` over the local server's, the ring's and the Flux node's words
    /// ([`ServerTransport::prepare_sleep`]); see the ipc and delegation module docs,
    /// "Sleeping".
    ///
    /// Only a daemon every input of which can wake it sleeps: no copyrpc context (the NIC's
    /// completions cannot wake a thread on the device model) and nothing in the backlog
    /// (its retries need rounds); Flux wakes it through its node's word
    /// ([`Flux::prepare_sleep`]). Returns `true` if it slept, `false` without sleeping: such
    /// an input exists, work is waiting, or a transport or the kernel cannot sleep this way
    /// (then never again).
    pub fn wait_for_work(&mut self, bound: std::time::Duration) -> bool {
        if self.sleep_off || self.ctx.is_some() || self.backlog.len > 0 {
            return false;
        }
        let NodeDaemon {
            local,
            ring,
            flux,
            sleep_off,
            ..
        } = self;
        let has_ring = ring.is_some();
        // At most three words: no allocation per sleep.
        let mut words = Words::default();
        let armed_local = arm_sleep(local.prepare_sleep(), &mut words, sleep_off);
        let armed_ring = armed_local
            && ring
                .as_mut()
                .is_some_and(|r| arm_sleep(r.prepare_sleep(), &mut words, sleep_off));
        let armed_flux = armed_local
            && (armed_ring || !has_ring)
            && arm_sleep(flux.prepare_sleep(), &mut words, sleep_off);
        let slept = armed_flux && {
            let end = crate::futex::wait_any(words.as_slice(), bound);
            if end == crate::futex::WaitEnd::Unsupported {
                *sleep_off = true;
            }
            end == crate::futex::WaitEnd::Returned
        };
        if armed_local {
            local.end_sleep(slept);
        }
        if let Some(r) = ring.as_mut().filter(|_| armed_ring) {
            r.end_sleep(slept);
        }
        if armed_flux {
            flux.end_sleep();
        }
        if slept {
            self.stats.idle_waits += 1;
            // Calls passed over Flux wait for answers: time has passed, so the next round
            // sweeps for those past `wait_timeout` (rounds count slower while sleeping).
            if self.flux.in_flight() > 0 {
                self.rounds |= SWEEP_ROUNDS - 1;
            }
        }
        slept
    }

    /// Counts a round; every [`SWEEP_ROUNDS`] rounds, sweeps for calls that waited too long.
    #[inline]
    fn tick(&mut self) {
        self.rounds = self.rounds.wrapping_add(1);
        if self.rounds.is_multiple_of(SWEEP_ROUNDS) {
            self.sweep();
        }
    }

    /// The parts a round uses: the phases' shared parts, the router, the buffers.
    #[inline]
    fn parts(&mut self) -> (Io<'_, S, L, N>, &mut R, &mut Bufs) {
        let NodeDaemon {
            cfg,
            local,
            ring,
            ctx,
            peers,
            flux,
            route,
            backlog,
            stats,
            bufs,
            ..
        } = self;
        let io = Io::<S, L, N> {
            cfg: *cfg,
            local,
            ring: ring.as_mut().map(DelegationServer::ring_mut),
            has_ctx: ctx.is_some(),
            ctx: ctx.as_mut(),
            peers,
            flux,
            backlog,
            stats,
            _service: PhantomData,
        };
        (io, route, bufs)
    }
    /// Gives up the calls that waited longer than the wait timeout (cold).
    #[cold]
    #[inline(never)]
    fn sweep(&mut self) {
        let Some(cutoff) = Instant::now().checked_sub(self.cfg.wait_timeout) else {
            return;
        };
        let mut expired = Vec::new();
        self.flux.cancel_where(
            |o| o.issued < cutoff,
            |o| expired.push((o.caller, o.method_id)),
        );
        self.backlog
            .expire(cutoff, |p| expired.push((p.from, p.method_id)));
        let mut io = self.io();
        for (caller, method_id) in expired {
            io.stats.wait_timeouts += 1;
            io.status(caller, method_id, Status::Unreachable);
        }
    }

    /// The parts the phases share.
    #[inline]
    fn io(&mut self) -> Io<'_, S, L, N> {
        self.parts().0
    }
}

impl<S: Service, L: ServerTransport, R: FnMut(&S::Request) -> Target, const N: usize>
    NodeDaemon<S, L, R, N>
{
    /// One round of the event loop, Phases 1-4 (module docs); `handler` serves this daemon's
    /// shard from owned requests, routed by the daemon's router of decoded requests. Returns
    /// the number of requests and responses handled (0: idle).
    ///
    /// A request of the shard is decoded into a `S::Request` (its variable-length arguments
    /// copied into `String`/`Vec`s); [`NodeDaemon::run_once_raw`] serves without that.
    /// The response is encoded straight into the reply buffer; one longer than it is
    /// answered [`Status::ResponseTooLarge`] ([`NodeStats::oversized_responses`]). A request
    /// whose reply cannot be delivered (the client is gone) is not run
    /// ([`NodeStats::dropped_replies`]).
    #[inline]
    pub fn run_once(&mut self, mut handler: impl FnMut(S::Request) -> S::Response) -> usize {
        self.tick();
        let (io, route, bufs) = self.parts();
        let mut shard = Owned::<S, R, _> {
            route,
            handler: &mut handler,
            req: None,
        };
        io.round(&mut shard, bufs)
    }
}

impl<S: Service, L: ServerTransport, R: FnMut(&[u8]) -> Result<Target, WireError>, const N: usize>
    NodeDaemon<S, L, R, N>
{
    /// One round of the event loop, Phases 1-4 (module docs), serving this daemon's shard
    /// in place: the daemon's router reads a request's target from its message (an error:
    /// the request does not decode), and `handler(request, reply_buf)` (e.g.
    /// `|msg, out| KvVarService::dispatch_raw(&mut shard, msg, out)`) decodes the request in
    /// place, runs it and writes the response message into `reply_buf`, returning its length.
    /// Returns the number of requests and responses handled (0: idle).
    ///
    /// No request or response value is built and nothing is allocated: `request` is the
    /// daemon's private copy (taken over from the local server or the delegation ring without
    /// a copy where the transport allows, [`ServerTransport::recv_into`]; copied out of the
    /// copyrpc receive ring; the Flux message itself), so a client cannot change it while the
    /// handler reads it; `reply_buf` is the client's response slot (local server, ring), the
    /// copyrpc reply buffer, or (a request received over Flux) a daemon buffer copied into
    /// the Flux message. `reply_buf` holds at least the service's `max_response_bytes`.
    ///
    /// A handler error is answered with its status and counted: a request that does not
    /// decode in [`NodeStats::bad_requests`], a response that does not fit (including a
    /// returned length above `reply_buf.len()`) as [`Status::ResponseTooLarge`] in
    /// [`NodeStats::oversized_responses`]. A request whose reply cannot be delivered (the
    /// client is gone) is not run ([`NodeStats::dropped_replies`]).
    #[inline]
    pub fn run_once_raw(
        &mut self,
        mut handler: impl FnMut(&[u8], &mut [u8]) -> Result<usize, WireError>,
    ) -> usize {
        self.tick();
        let (io, route, bufs) = self.parts();
        let mut shard = Raw {
            route,
            handler: &mut handler,
        };
        io.round::<_>(&mut shard, bufs)
    }
}

/// The words [`NodeDaemon::wait_for_work`] sleeps on (the local server's, the ring's, the
/// Flux node's), in place: the first `len` of `words`.
struct Words<'a> {
    words: [&'a std::sync::atomic::AtomicU32; 3],
    len: usize,
}

/// What fills the unused entries of [`Words`] (never waited on).
static NO_WORD: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Default for Words<'_> {
    fn default() -> Self {
        Words {
            words: [&NO_WORD; 3],
            len: 0,
        }
    }
}

impl<'a> Words<'a> {
    fn as_slice(&self) -> &[&'a std::sync::atomic::AtomicU32] {
        &self.words[..self.len]
    }
}

/// One input's half of [`NodeDaemon::wait_for_work`]: an armed word joins `words` (`true`);
/// `NotNow` or `Unsupported` (which also sets `off`) stop the sleep (`false`).
fn arm_sleep<'a>(prep: SleepPrep<'a>, words: &mut Words<'a>, off: &mut bool) -> bool {
    match prep {
        SleepPrep::Sleep(w) => {
            words.words[words.len] = w;
            words.len += 1;
            true
        }
        SleepPrep::NotNow => false,
        SleepPrep::Unsupported => {
            *off = true;
            false
        }
    }
}

/// The parts of a daemon the phases share.
struct Io<'a, S: Service, L: ServerTransport, const N: usize> {
    cfg: NodeConfig,
    local: &'a mut L,
    ring: Option<&'a mut RingServer>,
    ctx: Option<&'a mut NodeContext<L>>,
    has_ctx: bool,
    peers: &'a [Option<EndpointId>],
    flux: &'a mut NodeFlux<L, N>,
    backlog: &'a mut Backlog<L::ReplyToken, N>,
    stats: &'a mut NodeStats,
    _service: PhantomData<fn() -> S>,
}

/// Where a decoded request goes from here.
#[derive(Clone, Copy)]
enum Route {
    /// This daemon's shard.
    Serve,
    /// Onward: over copyrpc or Flux.
    Send(Hop),
    /// Nowhere (answered `Unreachable`).
    Unroutable,
}

/// The routing rule of the module docs for a request addressed to `t`, at a daemon with
/// `cfg`, the endpoints `peers` (by rank), and a context if `has_ctx`.
#[inline]
fn route_to(cfg: &NodeConfig, peers: &[Option<EndpointId>], has_ctx: bool, t: Target) -> Route {
    if t.rank == cfg.rank {
        return match t.daemon {
            d if d == cfg.daemon => Route::Serve,
            d if d < cfg.daemons => Route::Send(Hop::Flux(d)),
            _ => Route::Unroutable,
        };
    }
    if t.rank >= cfg.ranks {
        return Route::Unroutable;
    }
    let holder = cfg.placement.holder(t.rank, cfg.daemons);
    if holder != cfg.daemon {
        return Route::Send(Hop::Flux(holder));
    }
    match peers.get(t.rank as usize).copied().flatten() {
        Some(ep) if has_ctx => Route::Send(Hop::Copyrpc { rank: t.rank, ep }),
        _ => Route::Unroutable,
    }
}

impl<S: Service, L: ServerTransport, const N: usize> Io<'_, S, L, N> {
    /// Phase 1, first half (§4.2 steps 3-4): `ctx.poll`, each response back to its caller.
    #[inline]
    fn poll_copyrpc(&mut self) -> usize {
        let Some(ctx) = self.ctx.as_deref_mut() else {
            return 0;
        };
        let mut n = 0;
        let mut out = Sinks::<S, L, N> {
            local: &mut *self.local,
            ring: self.ring.as_deref_mut(),
            // A call sent over copyrpc never has a copyrpc caller (module docs).
            ctx: None,
            flux: Some(&mut *self.flux),
            stats: &mut *self.stats,
            _service: PhantomData,
        };
        ctx.poll(|o, resp| {
            n += 1;
            match resp {
                Ok(bytes) => {
                    out.stats.copyrpc_responses += 1;
                    out.deliver(o.caller, o.method_id, bytes);
                }
                Err(why) => {
                    out.stats.failed_calls += 1;
                    tracing::debug!(error = %why, "node daemon: copyrpc call failed");
                    out.status(o.caller, o.method_id, Status::Unreachable);
                }
            }
        });
        n
    }

    /// One round, Phases 1-4 (module docs), serving this daemon's shard with `shard`.
    #[inline]
    fn round<H: Shard<S>>(mut self, shard: &mut H, bufs: &mut Bufs) -> usize {
        let mut work = 0;
        // Phase 1 (§5 Phase 1): copyrpc completions and incoming requests.
        if self.ctx.is_some() {
            work += self.poll_copyrpc();
            work += self.serve_incoming(shard, &mut bufs.remote);
        }
        // Phase 2 (§5 Phase 2): the backlog, then the delegation ring.
        if self.backlog.len > 0 {
            work += self.drain_backlog();
        }
        if self.ring.is_some() {
            work += self.serve_ring(shard, &mut bufs.ring);
        }
        // Phase 3 (§5 Phase 3, §6 Phase 1): local clients.
        work += self.serve_local(shard, &mut bufs.local);
        // Phase 4 (§5 Phase 4, §6 Phase 2): Flux.
        work += self.serve_flux(shard, &mut bufs.reply);
        if work > 0 {
            if let Some(ctx) = self.ctx.as_mut() {
                ctx.flush();
            }
            self.local.flush();
        }
        work
    }

    /// Counts the outcome of serving one request of the shard: whether it was served
    /// (`err` is `None`), else the error it was answered with.
    #[inline]
    fn tally(&mut self, err: Option<WireError>) -> bool {
        match err {
            None => true,
            Some(e) => {
                if is_oversized(&e) {
                    self.stats.oversized_responses += 1;
                } else {
                    self.stats.bad_requests += 1;
                }
                false
            }
        }
    }

    /// A request that did not decode (to route it): answered with its status (cold).
    #[cold]
    fn bad_request(&mut self, caller: Caller<L::ReplyToken>, method_id: u16, e: WireError) {
        self.stats.bad_requests += 1;
        self.status(caller, method_id, e.status());
    }

    /// Phase 1, second half (§4.3 steps 1-3): requests received over copyrpc. Each is copied
    /// into `buf` first: the daemon's private copy, which a peer cannot change while the
    /// handler reads it, aligned, and readable while the reply borrows the context.
    #[inline]
    fn serve_incoming<H: Shard<S>>(&mut self, shard: &mut H, buf: &mut AlignedBuf) -> usize {
        let mut n = 0;
        loop {
            let Some((h, len)) = self.ctx.as_deref_mut().and_then(|ctx| {
                let (h, msg) = ctx.recv()?;
                if buf.len() < msg.len() {
                    // Cold: `buf` holds `max_request_bytes`, and the context refuses longer
                    // requests.
                    *buf = AlignedBuf::new(msg.len());
                }
                buf[..msg.len()].copy_from_slice(msg);
                Some((h, msg.len()))
            }) else {
                return n;
            };
            n += 1;
            let msg = &buf[..len];
            let caller = Caller::Remote(h);
            let method_id = method_id_of(msg);
            let t = match shard.route(msg) {
                Ok(t) => t,
                Err(e) => {
                    self.bad_request(caller, method_id, e);
                    continue;
                }
            };
            let to = if t.rank == self.cfg.rank {
                route_to(&self.cfg, self.peers, self.has_ctx, t)
            } else {
                // A peer sends only calls for this rank.
                Route::Unroutable
            };
            match to {
                Route::Serve => {
                    let mut err = None;
                    // The method's largest reply (what a typed caller's allowance covers;
                    // `reply_with` checks the buffer's size against the allowance).
                    let max = sat_u32(S::DESCRIPTOR.max_reply_bytes(method_id) as u64);
                    let r = self.ctx.as_deref_mut().map(|ctx| {
                        ctx.reply_with(h, max, |out| serve_into(shard, msg, out, &mut err))
                    });
                    if self.tally(err) {
                        self.stats.remote_served += 1;
                    }
                    if !matches!(r, Some(Ok(()))) {
                        self.stats.dropped_replies += 1;
                    }
                }
                Route::Send(hop @ Hop::Flux(_)) => {
                    let m = WireMsg::<N>::new(msg);
                    self.send(hop, m, caller, method_id);
                }
                Route::Send(Hop::Copyrpc { .. }) | Route::Unroutable => {
                    self.unroutable(caller, method_id)
                }
            }
        }
    }

    /// Phase 2 (§4.1 steps 2-3): the delegation ring's entries, each taken over into `buf`
    /// without a copy ([`RingServer::recv_into`]).
    #[inline]
    fn serve_ring<H: Shard<S>>(&mut self, shard: &mut H, buf: &mut AlignedBuf) -> usize {
        if self.ring.as_deref_mut().is_none_or(|r| r.poll() == 0) {
            return 0;
        }
        let mut n = 0;
        while let Some((token, len)) = self.ring.as_deref_mut().and_then(|r| r.recv_into(buf)) {
            n += 1;
            let msg = &buf[..len];
            let caller = Caller::Ring(token);
            let method_id = method_id_of(msg);
            let t = match shard.route(msg) {
                Ok(t) => t,
                Err(e) => {
                    self.bad_request(caller, method_id, e);
                    continue;
                }
            };
            match route_to(&self.cfg, self.peers, self.has_ctx, t) {
                Route::Serve => {
                    let mut err = None;
                    let r = self.ring.as_deref_mut().map(|ring| {
                        ring.reply_with(token, |out| serve_into(shard, msg, out, &mut err))
                    });
                    if self.tally(err) {
                        self.stats.ring_served += 1;
                    }
                    if !matches!(r, Some(Ok(()))) {
                        self.stats.dropped_replies += 1;
                    }
                }
                Route::Send(hop) => {
                    let m = WireMsg::<N>::new(msg);
                    self.send(hop, m, caller, method_id);
                }
                Route::Unroutable => self.unroutable(caller, method_id),
            }
        }
        if let Some(ring) = self.ring.as_deref_mut() {
            ring.advance_tail();
        }
        n
    }

    /// Phase 3 (§4.4 step 2): the local clients' calls, each taken over into `buf`
    /// ([`ServerTransport::recv_into`]).
    #[inline]
    fn serve_local<H: Shard<S>>(&mut self, shard: &mut H, buf: &mut AlignedBuf) -> usize {
        if self.local.poll() == 0 {
            return 0;
        }
        let mut n = 0;
        while let Some((token, len)) = self.local.recv_into(buf) {
            n += 1;
            let msg = &buf[..len];
            let caller = Caller::Local(token);
            let method_id = method_id_of(msg);
            let t = match shard.route(msg) {
                Ok(t) => t,
                Err(e) => {
                    self.bad_request(caller, method_id, e);
                    continue;
                }
            };
            match route_to(&self.cfg, self.peers, self.has_ctx, t) {
                Route::Serve => {
                    let mut err = None;
                    let r =
                        self.local
                            .reply(token, S::DESCRIPTOR.max_reply_bytes(method_id), |out| {
                                serve_into(shard, msg, out, &mut err)
                            });
                    if self.tally(err) {
                        self.stats.local_served += 1;
                    }
                    if r.is_err() {
                        self.stats.dropped_replies += 1;
                    }
                }
                Route::Send(hop) => {
                    let m = WireMsg::<N>::new(msg);
                    self.send(hop, m, caller, method_id);
                }
                Route::Unroutable => self.unroutable(caller, method_id),
            }
        }
        self.local.flush();
        n
    }

    /// Phase 4 (§4.3 steps 4-8, §6 Phase 2): Flux responses, then Flux requests. A request
    /// is served from the received message itself (the daemon's own copy) into `reply`
    /// (`max_response_bytes`), whose used bytes are copied into the response message.
    #[inline]
    fn serve_flux<H: Shard<S>>(&mut self, shard: &mut H, reply: &mut AlignedBuf) -> usize {
        let mut out = Sinks::<S, L, N> {
            local: &mut *self.local,
            ring: self.ring.as_deref_mut(),
            ctx: self.ctx.as_deref_mut(),
            // A call passed over Flux never has a Flux caller (module docs).
            flux: None,
            stats: &mut *self.stats,
            _service: PhantomData,
        };
        let mut n = self.flux.poll(|o, payload| {
            out.stats.flux_responses += 1;
            match payload {
                DelegatePayload::Resp(m) => out.deliver(o.caller, o.method_id, m.as_bytes()),
                DelegatePayload::Req(_) => {
                    out.stats.corrupt_responses += 1;
                    out.status(o.caller, o.method_id, Status::BadForwardedResponse);
                }
            }
        });
        while let Some((_, ftok, payload)) = self.flux.try_recv_raw() {
            n += 1;
            let caller = Caller::Flux(ftok);
            let DelegatePayload::Req(m) = payload else {
                // A response where a request belongs: answered, never served.
                self.stats.corrupt_responses += 1;
                self.status(caller, u16::MAX, Status::BadForwardedResponse);
                continue;
            };
            let msg = m.as_bytes();
            let method_id = method_id_of(msg);
            let t = match shard.route(msg) {
                Ok(t) => t,
                Err(e) => {
                    self.bad_request(caller, method_id, e);
                    continue;
                }
            };
            match route_to(&self.cfg, self.peers, self.has_ctx, t) {
                Route::Serve => {
                    let mut err = None;
                    let cap = S::DESCRIPTOR.max_response_bytes.min(reply.len());
                    let len = serve_into(shard, msg, &mut reply[..cap], &mut err);
                    if self.tally(err) {
                        self.stats.flux_served += 1;
                    }
                    // `len <= max_response_bytes <= N` (checked at construction).
                    let sent = WireMsg::<N>::new(&reply[..len])
                        .is_some_and(|r| self.flux.reply(ftok, DelegatePayload::Resp(r)).is_ok());
                    if !sent {
                        self.stats.dropped_replies += 1;
                    }
                }
                // A daemon passes over Flux only what the receiver serves or sends over
                // copyrpc; passing it on over Flux again could loop.
                Route::Send(hop @ Hop::Copyrpc { .. }) => {
                    self.send(hop, Some(m), caller, method_id)
                }
                Route::Send(Hop::Flux(_)) | Route::Unroutable => self.unroutable(caller, method_id),
            }
        }
        n
    }

    /// Sends `m` on `hop` for `caller`, or parks it in the backlog if there is no room or
    /// the backlog is not empty (order). `None` (a message over the Flux capacity):
    /// unroutable.
    #[inline]
    fn send(
        &mut self,
        hop: Hop,
        m: Option<WireMsg<N>>,
        caller: Caller<L::ReplyToken>,
        method_id: u16,
    ) {
        let Some(m) = m else {
            return self.unroutable(caller, method_id);
        };
        if self.backlog.waiting(hop) {
            return self.park(m, hop, caller, method_id, None);
        }
        if let Err(m) = self.try_send(hop, m, caller, method_id, None) {
            self.park(m, hop, caller, method_id, None);
        }
    }

    /// One attempt to send; the message back if there is no room (retry later).
    #[inline]
    fn try_send(
        &mut self,
        hop: Hop,
        m: WireMsg<N>,
        caller: Caller<L::ReplyToken>,
        method_id: u16,
        issued: Option<Instant>,
    ) -> Result<(), WireMsg<N>> {
        match hop {
            Hop::Copyrpc { ep, .. } => {
                let Some(ctx) = self.ctx.as_deref_mut() else {
                    self.unroutable(caller, method_id);
                    return Ok(());
                };
                let allowance = S::DESCRIPTOR.max_response_bytes as u32;
                match ctx.call(ep, m.as_bytes(), Origin { caller, method_id }, allowance) {
                    Ok(_) => {
                        self.stats.copyrpc_calls += 1;
                        Ok(())
                    }
                    Err(e) if e.kind.is_retryable() => Err(m),
                    Err(_) => {
                        self.stats.failed_calls += 1;
                        self.status(caller, method_id, Status::Unreachable);
                        Ok(())
                    }
                }
            }
            Hop::Flux(d) => {
                let o = FluxOrigin {
                    caller,
                    method_id,
                    issued: issued.unwrap_or_else(Instant::now),
                };
                match self.flux.call(d as usize, DelegatePayload::Req(m), o) {
                    Ok(_) => {
                        self.stats.flux_calls += 1;
                        Ok(())
                    }
                    Err(FluxError::NoSuchNode { .. }) => {
                        self.unroutable(caller, method_id);
                        Ok(())
                    }
                    Err(e) => match e.into_payload() {
                        DelegatePayload::Req(m) | DelegatePayload::Resp(m) => Err(m),
                    },
                }
            }
        }
    }

    /// Puts a call that found no room into the backlog (cold).
    #[cold]
    #[inline(never)]
    fn park(
        &mut self,
        msg: WireMsg<N>,
        to: Hop,
        from: Caller<L::ReplyToken>,
        method_id: u16,
        issued: Option<Instant>,
    ) {
        let p = Pending {
            msg,
            to,
            from,
            method_id,
            issued: issued.unwrap_or_else(Instant::now),
        };
        match self.backlog.push_back(p) {
            Ok(()) => self.stats.backlogged += 1,
            Err(p) => {
                self.stats.backlog_full += 1;
                self.status(p.from, method_id, Status::Unreachable);
            }
        }
    }

    /// Phase 2, first part: retries each destination's FIFO in order until a call finds no
    /// room.
    #[cold]
    #[inline(never)]
    fn drain_backlog(&mut self) -> usize {
        let mut n = 0;
        for q in 0..self.backlog.queues.len() {
            while let Some(p) = self.backlog.pop_front(q) {
                match self.try_send(p.to, p.msg, p.from, p.method_id, Some(p.issued)) {
                    Ok(()) => n += 1,
                    Err(msg) => {
                        self.backlog.push_front(q, Pending { msg, ..p });
                        break;
                    }
                }
            }
        }
        n
    }

    #[cold]
    fn unroutable(&mut self, caller: Caller<L::ReplyToken>, method_id: u16) {
        self.stats.unroutable += 1;
        self.status(caller, method_id, Status::Unreachable);
    }

    /// Answers `caller` with an error status (cold).
    #[cold]
    fn status(&mut self, caller: Caller<L::ReplyToken>, method_id: u16, status: Status) {
        Sinks::<S, L, N> {
            local: &mut *self.local,
            ring: self.ring.as_deref_mut(),
            ctx: self.ctx.as_deref_mut(),
            flux: Some(&mut *self.flux),
            stats: &mut *self.stats,
            _service: PhantomData,
        }
        .status(caller, method_id, status);
    }
}

/// Where replies go: the four kinds of caller (a part may be absent while it is borrowed by
/// the poll whose callback replies, or on a daemon without it).
struct Sinks<'a, S, L: ServerTransport, const N: usize> {
    local: &'a mut L,
    ring: Option<&'a mut RingServer>,
    ctx: Option<&'a mut NodeContext<L>>,
    flux: Option<&'a mut NodeFlux<L, N>>,
    stats: &'a mut NodeStats,
    _service: PhantomData<fn() -> S>,
}

impl<S: Service, L: ServerTransport, const N: usize> Sinks<'_, S, L, N> {
    /// A forwarded response for `caller`: verbatim if it is a wire message that fits the
    /// caller, else [`Status::BadForwardedResponse`].
    #[inline]
    fn deliver(&mut self, caller: Caller<L::ReplyToken>, method_id: u16, bytes: &[u8]) {
        let fits =
            bytes.len() <= S::DESCRIPTOR.max_response_bytes && wire::read_header(bytes).is_ok();
        if !fits {
            self.stats.corrupt_responses += 1;
            return self.status(caller, method_id, Status::BadForwardedResponse);
        }
        if !self.reply(caller, bytes) {
            self.stats.dropped_replies += 1;
        }
    }

    /// Answers `caller` with an error status.
    #[cold]
    fn status(&mut self, caller: Caller<L::ReplyToken>, method_id: u16, status: Status) {
        let mut buf = [0u8; wire::HEADER_BYTES];
        let len = wire::encode_status(method_id, status, &mut buf);
        if !self.reply(caller, &buf[..len]) {
            self.stats.dropped_replies += 1;
        }
    }

    /// Writes `bytes` (a checked wire message) as the reply to `caller`; whether it was
    /// taken.
    #[inline]
    fn reply(&mut self, caller: Caller<L::ReplyToken>, bytes: &[u8]) -> bool {
        let copy = |buf: &mut [u8]| match buf.get_mut(..bytes.len()) {
            Some(b) => {
                b.copy_from_slice(bytes);
                bytes.len()
            }
            None => 0,
        };
        match caller {
            Caller::Local(t) => self.local.reply(t, bytes.len(), copy).is_ok(),
            Caller::Ring(t) => self
                .ring
                .as_deref_mut()
                .is_some_and(|r| r.reply_with(t, copy).is_ok()),
            Caller::Remote(h) => self
                .ctx
                .as_deref_mut()
                .is_some_and(|c| c.reply(h, bytes).is_ok()),
            Caller::Flux(t) => match (self.flux.as_deref_mut(), WireMsg::<N>::new(bytes)) {
                (Some(f), Some(m)) => f.reply(t, DelegatePayload::Resp(m)).is_ok(),
                _ => false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    //! Two in-process ranks of two daemons each on the device model, for both placements.
    //! The local servers are delegation rings (any [`ServerTransport`] serves); clients call
    //! them, and (Aggregated) Daemon#0's ring, with raw ring clients. Every request is
    //! answered once, by the shard that owns it; tiny copyrpc rings make the backlog work;
    //! a stopped daemon's calls end by the wait timeout; bad input gets statuses and counters.

    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::thread;

    use crossbeam_utils::Backoff;
    use mlx5::sim::{Fabric, SimConfig};

    use super::*;
    use crate::copyrpc::{ContextConfig, EndpointConfig};
    use crate::delegation::forward::tests::{Args, Svc, encode, name, ring_calls, status_of};
    use crate::delegation::{DelegationConfig, RingClient};
    use crate::flux::{self, FluxConfig};

    const RANKS: u32 = 2;
    const DAEMONS: u32 = 2;

    type Route = fn(&Args) -> Target;
    type Daemon = NodeDaemon<Svc, DelegationServer, Route>;

    fn route(a: &Args) -> Target {
        Target {
            rank: a.rank,
            daemon: (a.key % u64::from(DAEMONS)) as u32,
        }
    }

    /// Who serves `(rank, daemon)`: the value added to `key * 100` in its answers.
    fn who(rank: u32, daemon: u32) -> u64 {
        u64::from(rank * 10 + daemon + 1)
    }

    fn expected(a: &Args) -> u64 {
        let (rank, key) = (a.rank, a.key);
        key * 100 + who(rank, (key % u64::from(DAEMONS)) as u32)
    }

    struct Rank {
        daemons: Vec<Daemon>,
        /// The local server of each daemon.
        locals: Vec<String>,
        /// Daemon#0's delegation ring (Aggregated).
        ring: Option<String>,
    }

    /// Both ranks, built and connected; `wait` is every daemon's wait timeout.
    fn setup(placement: Placement, ring_size: usize, wait: Duration) -> (Vec<Rank>, Fabric) {
        let fabric = Fabric::new(SimConfig {
            progress_thread: Some(Duration::from_millis(1)),
            ..SimConfig::default()
        });
        let rcfg = DelegationConfig {
            max_clients: 8,
            ring_depth: 64,
            resp_depth: 64,
            ..DelegationConfig::default()
        };
        let ecfg = EndpointConfig {
            ring_size,
            ..EndpointConfig::default()
        };
        let mut ranks = Vec::new();
        for rank in 0..RANKS {
            let dev = fabric.open();
            let fluxes = flux::network(DAEMONS as usize, FluxConfig::default()).unwrap();
            let mut daemons = Vec::new();
            let mut locals = Vec::new();
            let mut ring = None;
            for (d, f) in (0..DAEMONS).zip(fluxes) {
                let local_name = name(&format!("n{rank}{d}"));
                let local = DelegationServer::create(&local_name, Svc::DESCRIPTOR, rcfg).unwrap();
                locals.push(local_name);
                let mut cfg = NodeConfig::new(placement, (rank, RANKS), (d, DAEMONS));
                cfg.wait_timeout = wait;
                let mut n = Daemon::new(cfg, local, f, route as Route).unwrap();
                let holds = (0..RANKS).any(|s| s != rank && placement.holder(s, DAEMONS) == d);
                if holds {
                    n = n.with_context(Context::new(&dev, ContextConfig::default()).unwrap());
                }
                if placement == Placement::Aggregated && d == 0 {
                    let ring_name = name(&format!("g{rank}"));
                    let r = DelegationServer::create(&ring_name, Svc::DESCRIPTOR, rcfg).unwrap();
                    n = n.with_ring(r).unwrap();
                    ring = Some(ring_name);
                }
                daemons.push(n);
            }
            ranks.push(Rank {
                daemons,
                locals,
                ring,
            });
        }
        // One endpoint pair per pair of ranks, between the holders (seeds/004 §1.4).
        let (h0, h1) = (placement.holder(1, DAEMONS), placement.holder(0, DAEMONS));
        let (a, b) = ranks.split_at_mut(1);
        let (n0, n1) = (
            &mut a[0].daemons[h0 as usize],
            &mut b[0].daemons[h1 as usize],
        );
        let e0 = n0.context_mut().unwrap().create_endpoint(&ecfg).unwrap();
        let e1 = n1.context_mut().unwrap().create_endpoint(&ecfg).unwrap();
        let i0 = n0.context().unwrap().local_info(e0).unwrap();
        let i1 = n1.context().unwrap().local_info(e1).unwrap();
        n0.context_mut().unwrap().connect(e0, &i1).unwrap();
        n1.context_mut().unwrap().connect(e1, &i0).unwrap();
        n0.set_peer(1, e0).unwrap();
        n1.set_peer(0, e1).unwrap();
        (ranks, fabric)
    }

    /// Daemon#0 of a one-rank node with its ring (Aggregated); the names of its local server
    /// and its ring, and the other daemons' Flux nodes.
    fn single_daemon(
        tag: &str,
        daemons: u32,
    ) -> (Daemon, String, String, Vec<NodeFlux<DelegationServer>>) {
        let rcfg = DelegationConfig {
            max_clients: 4,
            ring_depth: 8,
            resp_depth: 4,
            ..DelegationConfig::default()
        };
        let (local_name, ring_name) = (name(&format!("{tag}l")), name(&format!("{tag}r")));
        let local = DelegationServer::create(&local_name, Svc::DESCRIPTOR, rcfg).unwrap();
        let ring = DelegationServer::create(&ring_name, Svc::DESCRIPTOR, rcfg).unwrap();
        let mut others = flux::network(daemons as usize, FluxConfig::default()).unwrap();
        let f = others.remove(0);
        let cfg = NodeConfig::new(Placement::Aggregated, (0, 1), (0, daemons));
        let d = Daemon::new(cfg, local, f, route as Route)
            .unwrap()
            .with_ring(ring)
            .unwrap();
        (d, local_name, ring_name, others)
    }

    /// The server sleep word of ring file `name`, through a mapping of the test's own.
    fn server_sleep_word(name: &str) -> (memmap2::MmapRaw, usize) {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(std::path::Path::new(crate::delegation::SHM_DIR).join(name))
            .unwrap();
        (
            memmap2::MmapRaw::map_raw(&file).unwrap(),
            crate::delegation::layout::OFF_SERVER_SLEEP,
        )
    }

    fn word_of(m: &(memmap2::MmapRaw, usize)) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: a 4-aligned offset inside the header of a live mapping; the ring's users
        // access the word atomically only.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(m.0.as_mut_ptr().add(m.1).cast()) }
    }

    /// A daemon whose every input can wake it (no context) sleeps on its local server's, its
    /// ring's and its Flux node's words at once (`futex_waitv`), and a request committed to
    /// either shared segment, or a Flux call from another daemon, wakes it; a lost wake would
    /// take the whole 10 s bound.
    #[test]
    fn a_daemon_sleeps_until_a_request_on_any_input() {
        if !crate::futex::waitv_supported() {
            eprintln!("skipped: this kernel refuses futex_waitv (Linux >= 5.16 needed)");
            return;
        }
        for via in ["local", "ring", "flux"] {
            let (mut d, local, ring, mut others) = single_daemon(&format!("z{via}"), 2);
            let words = [server_sleep_word(&local), server_sleep_word(&ring)];
            let h = thread::spawn(move || {
                let t = std::time::Instant::now();
                let slept = d.wait_for_work(Duration::from_secs(10));
                (d, slept, t.elapsed())
            });
            // All three words armed.
            let t = std::time::Instant::now();
            while !(words.iter().all(|w| word_of(w).load(Ordering::SeqCst) == 1)
                && others[0].is_armed(0))
            {
                assert!(t.elapsed() < Duration::from_secs(5), "never armed");
                thread::yield_now();
            }
            if via == "flux" {
                let msg = DelegatePayload::Req(WireMsg::new(&[0; 8]).unwrap());
                let origin = FluxOrigin {
                    caller: Caller::Local(ReplyToken {
                        client_id: 0,
                        generation: 0,
                        resp_slot_idx: 0,
                        call_tag: 0,
                    }),
                    method_id: 0,
                    issued: std::time::Instant::now(),
                };
                assert!(others[0].call(0, msg, origin).is_ok());
            } else {
                let name = if via == "ring" { &ring } else { &local };
                RingClient::attach(name).unwrap().try_call(&[0; 8]).unwrap();
            }
            let (d, slept, took) = h.join().unwrap();
            assert!(slept, "via {via}");
            assert!(
                took < Duration::from_secs(5),
                "woken, not timed out: {took:?}"
            );
            assert_eq!(d.stats().idle_waits, 1);
            assert!(!others[0].is_armed(0));
            assert!(words.iter().all(|w| word_of(w).load(Ordering::SeqCst) == 0));
        }
    }

    /// Runs `d` until `stop`, serving with `who(rank, daemon)`.
    fn run(mut d: Daemon, stop: Arc<AtomicBool>) -> thread::JoinHandle<Daemon> {
        thread::spawn(move || {
            let (rank, daemon) = (d.config().rank, d.config().daemon);
            let backoff = Backoff::new();
            while !stop.load(Ordering::Acquire) {
                if d.run_once(|a: Args| a.key * 100 + who(rank, daemon)) == 0 {
                    backoff.snooze();
                } else {
                    backoff.reset();
                }
            }
            d
        })
    }

    /// Rank 0's client calls: see [`rank_calls`].
    fn client_calls(r0: &Rank, placement: Placement, args: &[Args]) -> Vec<Vec<u8>> {
        rank_calls(r0, 0, placement, args)
    }

    /// Client calls on rank `me`: local ones to the owner daemon's local server, remote ones
    /// to the owner daemon's local server (Distributed) or Daemon#0's ring (Aggregated).
    fn rank_calls(r0: &Rank, me: u32, placement: Placement, args: &[Args]) -> Vec<Vec<u8>> {
        let mut out = vec![Vec::new(); args.len()];
        let mut lanes: Vec<(String, Vec<usize>)> =
            r0.locals.iter().map(|n| (n.clone(), Vec::new())).collect();
        if let Some(ring) = &r0.ring {
            lanes.push((ring.clone(), Vec::new()));
        }
        for (i, a) in args.iter().enumerate() {
            let lane = if a.rank != me && placement == Placement::Aggregated {
                lanes.len() - 1
            } else {
                (a.key % u64::from(DAEMONS)) as usize
            };
            lanes[lane].1.push(i);
        }
        for (lane, idx) in lanes {
            let mut c = RingClient::attach(&lane).unwrap();
            let reqs: Vec<Vec<u8>> = idx.iter().map(|&i| encode(args[i])).collect();
            for (i, r) in idx.iter().zip(ring_calls(&mut c, &reqs)) {
                out[*i] = r;
            }
        }
        out
    }

    fn start(
        ranks: Vec<Rank>,
        stop: &Arc<AtomicBool>,
    ) -> (Vec<Rank>, Vec<thread::JoinHandle<Daemon>>) {
        let mut handles = Vec::new();
        let mut left = Vec::new();
        for mut r in ranks {
            for d in r.daemons.drain(..) {
                handles.push(run(d, stop.clone()));
            }
            left.push(r);
        }
        (left, handles)
    }

    fn every_call_answered_by_its_owner(placement: Placement) {
        let (ranks, _fabric) = setup(placement, 4096, DEFAULT_WAIT_TIMEOUT);
        let stop = Arc::new(AtomicBool::new(false));
        let (ranks, handles) = start(ranks, &stop);
        let args: Vec<Args> = (0..2000u64)
            .map(|key| Args {
                rank: u32::from(key % 4 != 0),
                key,
            })
            .collect();
        let resps = client_calls(&ranks[0], placement, &args);
        for (a, r) in args.iter().zip(&resps) {
            let key = a.key;
            assert_eq!(Svc::decode_response(0, r), Ok(expected(a)), "key {key}");
        }
        stop.store(true, Ordering::Release);
        let stats: Vec<NodeStats> = handles
            .into_iter()
            .map(|h| *h.join().unwrap().stats())
            .collect();
        let (r0d0, r0d1, r1d0, r1d1) = (stats[0], stats[1], stats[2], stats[3]);
        let remote = args.iter().filter(|a| a.rank == 1).count() as u64;
        let remote_odd = args
            .iter()
            .filter(|a| a.rank == 1 && a.key % 2 == 1)
            .count() as u64;
        let local = args.len() as u64 - remote;
        assert_eq!(r0d0.local_served + r0d1.local_served, local);
        // Rank 1 serves every remote call: its daemon 0 (the holder on both placements)
        // serves even keys itself and passes odd ones over Flux to daemon 1.
        assert_eq!(r1d0.remote_served, remote - remote_odd, "{r1d0:?}");
        assert_eq!(r1d0.flux_calls, remote_odd, "{r1d0:?}");
        assert_eq!(r1d1.flux_served, remote_odd, "{r1d1:?}");
        let sent = r0d0.copyrpc_calls + r0d1.copyrpc_calls;
        assert_eq!(sent, remote);
        match placement {
            Placement::Aggregated => {
                // One hop: the ring to Daemon#0, no Flux on rank 0.
                assert_eq!(r0d0.copyrpc_calls, remote);
                assert_eq!(r0d0.flux_calls + r0d1.flux_calls, 0);
            }
            Placement::Distributed => {
                // Rank 1's endpoint is on daemon 1: the even keys' owner (daemon 0) passes
                // its remote calls over Flux.
                assert_eq!(r0d1.copyrpc_calls, remote);
                assert_eq!(r0d0.flux_calls, remote - remote_odd, "{r0d0:?}");
                assert_eq!(r0d1.flux_served, 0);
            }
        }
        assert!(
            stats.iter().any(|s| s.backlogged > 0),
            "4 KiB copyrpc rings never filled: {stats:?}"
        );
        for s in &stats {
            assert_eq!(
                (
                    s.bad_requests,
                    s.unroutable,
                    s.failed_calls,
                    s.corrupt_responses
                ),
                (0, 0, 0, 0),
                "{s:?}"
            );
            assert_eq!(
                (s.dropped_replies, s.wait_timeouts, s.backlog_full),
                (0, 0, 0),
                "{s:?}"
            );
        }
    }

    #[test]
    fn delegation_backend_answers_every_call_from_its_owner() {
        every_call_answered_by_its_owner(Placement::Aggregated);
    }

    #[test]
    fn meta_backend_answers_every_call_from_its_owner() {
        every_call_answered_by_its_owner(Placement::Distributed);
    }

    /// Both ranks call each other at once, deeply pipelined, over 4 KiB copyrpc rings and
    /// with two daemons, so both Daemons#0 wait for credit while holding hand-offs to their
    /// daemon 1: calls waiting for copyrpc credit must not hold back the Flux hand-offs whose
    /// answers return the peer's credit (with one backlog FIFO for all destinations this
    /// deadlocked until every call timed out).
    #[test]
    fn symmetric_load_on_tiny_rings_completes() {
        for placement in [Placement::Aggregated, Placement::Distributed] {
            let (ranks, _fabric) = setup(placement, 4096, Duration::from_secs(30));
            let stop = Arc::new(AtomicBool::new(false));
            let (ranks, handles) = start(ranks, &stop);
            let callers: Vec<_> = (0..RANKS)
                .map(|me| {
                    let r = &ranks[me as usize];
                    let mine = Rank {
                        daemons: Vec::new(),
                        locals: r.locals.clone(),
                        ring: r.ring.clone(),
                    };
                    thread::spawn(move || {
                        let args: Vec<Args> =
                            (0..1500u64).map(|key| Args { rank: 1 - me, key }).collect();
                        let resps = rank_calls(&mine, me, placement, &args);
                        for (a, r) in args.iter().zip(&resps) {
                            let key = a.key;
                            assert_eq!(Svc::decode_response(0, r), Ok(expected(a)), "key {key}");
                        }
                    })
                })
                .collect();
            for c in callers {
                c.join().unwrap();
            }
            stop.store(true, Ordering::Release);
            let stats: Vec<NodeStats> = handles
                .into_iter()
                .map(|h| *h.join().unwrap().stats())
                .collect();
            assert!(stats.iter().any(|s| s.backlogged > 0), "{stats:?}");
            assert!(stats.iter().all(|s| s.wait_timeouts == 0), "{stats:?}");
        }
    }

    /// Rank 1's daemon 1 never runs (a stopped daemon): calls for its shard that reach rank
    /// 1 over copyrpc wait in Flux, and are answered `Unreachable` by the wait-timeout sweep;
    /// the other calls are unaffected.
    #[test]
    fn a_stopped_daemon_costs_its_calls_the_wait_timeout_only() {
        let (mut ranks, _fabric) = setup(Placement::Aggregated, 1 << 16, Duration::from_millis(50));
        let stopped = ranks[1].daemons.pop().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (ranks, handles) = start(ranks, &stop);
        let args: Vec<Args> = (0..40u64).map(|key| Args { rank: 1, key }).collect();
        let resps = client_calls(&ranks[0], Placement::Aggregated, &args);
        for (a, r) in args.iter().zip(&resps) {
            let key = a.key;
            if key % 2 == 1 {
                assert_eq!(status_of(r), Status::Unreachable as u16, "key {key}");
            } else {
                assert_eq!(Svc::decode_response(0, r), Ok(expected(a)), "key {key}");
            }
        }
        stop.store(true, Ordering::Release);
        let stats: Vec<NodeStats> = handles
            .into_iter()
            .map(|h| *h.join().unwrap().stats())
            .collect();
        assert_eq!(stats[2].wait_timeouts, 20, "{:?}", stats[2]);
        drop(stopped);
    }

    /// Bad input from a local client, on every path, gets an error status and a counter.
    #[test]
    fn bad_input_gets_error_statuses() {
        let (ranks, _fabric) = setup(Placement::Distributed, 1 << 16, DEFAULT_WAIT_TIMEOUT);
        let stop = Arc::new(AtomicBool::new(false));
        let (ranks, handles) = start(ranks, &stop);
        let mut garbage = encode(Args { rank: 0, key: 2 });
        garbage[0] = 0x7f; // unknown method id
        let reqs = vec![
            encode(Args { rank: 7, key: 2 }),
            garbage,
            vec![1, 2, 3],
            encode(Args { rank: 1, key: 2 }),
            encode(Args { rank: 0, key: 4 }),
            encode(Args { rank: 0, key: 5 }),
        ];
        let mut c = RingClient::attach(&ranks[0].locals[0]).unwrap();
        let r = ring_calls(&mut c, &reqs);
        assert_eq!(status_of(&r[0]), Status::Unreachable as u16);
        assert_eq!(status_of(&r[1]), Status::UnknownMethod as u16);
        assert_ne!(status_of(&r[2]), Status::Ok as u16);
        assert_eq!(Svc::decode_response(0, &r[3]), Ok(2 * 100 + who(1, 0)));
        assert_eq!(Svc::decode_response(0, &r[4]), Ok(4 * 100 + who(0, 0)));
        // Key 5 belongs to daemon 1: a client that sends it to daemon 0 still gets the
        // owner's answer (passed over Flux).
        assert_eq!(Svc::decode_response(0, &r[5]), Ok(5 * 100 + who(0, 1)));
        drop(c);
        stop.store(true, Ordering::Release);
        let s0 = *handles.into_iter().next().unwrap().join().unwrap().stats();
        assert_eq!((s0.unroutable, s0.bad_requests), (1, 2), "{s0:?}");
    }

    type RawRoute = fn(&[u8]) -> Result<Target, WireError>;
    type RawDaemon = NodeDaemon<Svc, DelegationServer, RawRoute>;

    fn raw_route(msg: &[u8]) -> Result<Target, WireError> {
        Svc::decode_request(msg).map(|a| route(&a))
    }

    /// Keys the raw handler of [`raw_handler`] misbehaves on.
    const CLAIMS_TOO_MUCH: u64 = 1000;
    const TOO_LARGE: u64 = 1001;
    const UNDECODABLE: u64 = 1002;

    /// A raw handler serving `Svc` as [`run`]'s does, `key * 100 + who`, written straight into
    /// the reply buffer; on the keys above it claims more bytes than the buffer holds,
    /// reports a result too large (as a generated `dispatch_raw` does), or fails to decode.
    fn raw_handler(
        who: u64,
        served: &mut Vec<u64>,
    ) -> impl FnMut(&[u8], &mut [u8]) -> Result<usize, WireError> + '_ {
        move |msg, out| {
            let a = Svc::decode_request(msg)?;
            let key = a.key;
            match key {
                CLAIMS_TOO_MUCH => Ok(out.len() + 1),
                TOO_LARGE => Err(WireError::ResponseTooLarge {
                    method_id: 0,
                    len: 1 << 20,
                    cap: out.len(),
                }),
                UNDECODABLE => Err(WireError::BadValue { method_id: 0 }),
                _ => {
                    served.push(key);
                    Ok(wire::encode(0, 0, &(key * 100 + who), out))
                }
            }
        }
    }

    /// `run_once_raw` on one rank of two daemons: daemon 0's local clients' calls are served
    /// in place by the owner (daemon 1's over Flux); a reply that does not fit is answered
    /// `ResponseTooLarge` and counted in `oversized_responses`, a request that does not
    /// decode (to route it, or in the handler) is answered with its status and counted in
    /// `bad_requests`; nothing panics.
    #[test]
    fn run_once_raw_serves_in_place_and_answers_errors_with_statuses() {
        let rcfg = DelegationConfig {
            max_clients: 4,
            ring_depth: 64,
            resp_depth: 64,
            ..DelegationConfig::default()
        };
        let fluxes = flux::network(DAEMONS as usize, FluxConfig::default()).unwrap();
        let mut locals = Vec::new();
        let mut daemons = Vec::new();
        for (d, f) in (0..DAEMONS).zip(fluxes) {
            let local_name = name(&format!("raw{d}"));
            let local = DelegationServer::create(&local_name, Svc::DESCRIPTOR, rcfg).unwrap();
            locals.push(local_name);
            let cfg = NodeConfig::new(Placement::Aggregated, (0, 1), (d, DAEMONS));
            daemons.push(RawDaemon::new(cfg, local, f, raw_route as RawRoute).unwrap());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = daemons
            .into_iter()
            .map(|mut d| {
                let stop = stop.clone();
                thread::spawn(move || {
                    let who = who(0, d.config().daemon);
                    let mut served = Vec::new();
                    let backoff = Backoff::new();
                    while !stop.load(Ordering::Acquire) {
                        if d.run_once_raw(raw_handler(who, &mut served)) == 0 {
                            backoff.snooze();
                        } else {
                            backoff.reset();
                        }
                    }
                    (*d.stats(), served)
                })
            })
            .collect();
        let args: Vec<Args> = (0..400u64).map(|key| Args { rank: 0, key }).collect();
        let mut reqs: Vec<Vec<u8>> = args.iter().map(|a| encode(*a)).collect();
        let mut garbage = encode(Args { rank: 0, key: 2 });
        garbage[0] = 0x7f; // unknown method id
        for key in [CLAIMS_TOO_MUCH, TOO_LARGE, UNDECODABLE] {
            reqs.push(encode(Args { rank: 0, key }));
        }
        reqs.push(garbage);
        reqs.push(vec![1, 2, 3]);
        let mut c = RingClient::attach(&locals[0]).unwrap();
        let r = ring_calls(&mut c, &reqs);
        for (a, r) in args.iter().zip(&r) {
            let key = a.key;
            let owner = (key % u64::from(DAEMONS)) as u32;
            assert_eq!(
                Svc::decode_response(0, r),
                Ok(key * 100 + who(0, owner)),
                "key {key}"
            );
        }
        let n = args.len();
        let too_large = Status::ResponseTooLarge as u16;
        assert_eq!(status_of(&r[n]), too_large, "a length above the buffer");
        assert_eq!(status_of(&r[n + 1]), too_large, "served over Flux");
        assert_eq!(status_of(&r[n + 2]), Status::BadArguments as u16);
        assert_eq!(status_of(&r[n + 3]), Status::UnknownMethod as u16);
        assert_ne!(status_of(&r[n + 4]), Status::Ok as u16);
        drop(c);
        stop.store(true, Ordering::Release);
        let out: Vec<(NodeStats, Vec<u64>)> =
            handles.into_iter().map(|h| h.join().unwrap()).collect();
        let (s0, s1) = (out[0].0, out[1].0);
        // Each shard ran its own keys only, each once.
        let mut served: Vec<u64> = out.iter().flat_map(|(_, v)| v.iter().copied()).collect();
        served.sort_unstable();
        assert_eq!(served, (0..400).collect::<Vec<u64>>());
        assert!(out[1].1.iter().all(|k| k % 2 == 1));
        assert_eq!(
            (s0.local_served, s0.flux_calls, s1.flux_served),
            (200, 201, 200),
            "{s0:?} {s1:?}"
        );
        assert_eq!((s0.oversized_responses, s0.bad_requests), (1, 3), "{s0:?}");
        assert_eq!((s1.oversized_responses, s1.bad_requests), (1, 0), "{s1:?}");
        assert_eq!((s0.dropped_replies, s1.dropped_replies), (0, 0));
    }

    /// [`WireMsg`] copies only the message: its bytes read back exactly, at any length up to
    /// the capacity, 8-byte aligned; longer ones are refused.
    #[test]
    fn wire_msg_holds_exactly_its_bytes() {
        let data: Vec<u8> = (0..=255u8).cycle().take(4480).collect();
        for len in [0, 1, 7, 8, 63, 64, 1000, 4480] {
            let m = WireMsg::<4480>::new(&data[..len]).unwrap();
            assert_eq!(m.as_bytes(), &data[..len]);
            assert_eq!(m.as_bytes().as_ptr() as usize % 8, 0);
            let copy = m;
            assert_eq!(copy.as_bytes(), &data[..len]);
            let e = WireMsg::<4480>::encoded(|b| {
                b[..len].copy_from_slice(&data[..len]);
                len
            });
            assert_eq!(e.as_bytes(), &data[..len]);
        }
        assert!(WireMsg::<64>::new(&data[..65]).is_none());
        // `encoded` clamps a length above the capacity.
        assert_eq!(WireMsg::<64>::encoded(|_| 1000).as_bytes(), &[0u8; 64][..]);
    }

    /// A configuration that cannot work is refused at construction, with the reason.
    #[test]
    fn inconsistent_configuration_is_refused() {
        let fluxes = || flux::network(2, FluxConfig::default()).unwrap();
        let local = || {
            DelegationServer::create(&name("cfg"), Svc::DESCRIPTOR, DelegationConfig::default())
                .unwrap()
        };
        let mk = |cfg: NodeConfig, node: usize| {
            let f = fluxes().into_iter().nth(node).unwrap();
            Daemon::new(cfg, local(), f, route as Route)
        };
        let ok = NodeConfig::new(Placement::Aggregated, (0, 2), (1, 2));
        assert!(mk(ok, 1).is_ok());
        assert!(mk(ok, 0).is_err(), "flux node of another daemon");
        assert!(mk(NodeConfig { rank: 2, ..ok }, 1).is_err());
        assert!(mk(NodeConfig { daemon: 2, ..ok }, 1).is_err());
        assert!(mk(NodeConfig { backlog: 0, ..ok }, 1).is_err());
        // Only Daemon#0 of the Aggregated placement takes a ring.
        let ring = local();
        assert!(mk(ok, 1).unwrap().with_ring(ring).is_err());
        // A daemon refuses an endpoint for a rank it does not hold.
        let mut d = mk(
            NodeConfig {
                placement: Placement::Distributed,
                ..ok
            },
            1,
        )
        .unwrap();
        assert!(d.set_peer(0, 0).is_err(), "own rank");
        assert!(d.set_peer(1, 0).is_err(), "no context");
    }
}

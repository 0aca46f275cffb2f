//! The node delegate: Daemon#0 of seeds/004, which serves its own shard, forwards the calls its
//! rank's clients address to other ranks over copyrpc, and serves (or hands to the owning
//! daemon of its rank) the calls other ranks send it (seeds/004 §1.2, §1.3, §4, §5).
//!
//! A [`Delegate`] owns
//! - its delegation ring ([`DelegationServer`]): every client thread of the rank writes into it
//!   the calls for this daemon's shard *and* the calls for other ranks (seeds/004 §1.2, §7);
//! - a copyrpc [`Context`] whose pending calls carry a [`DelegToken`] (seeds/004 §4.1), and a
//!   rank → endpoint table for the peer delegates (seeds/004 §1.4: Daemon#0 holds one endpoint
//!   per remote rank). The context may hold further endpoints that only *receive* calls (the
//!   clients of other ranks in a direct topology, seeds/004 §7): every request arriving on
//!   any endpoint is served alike;
//! - one delegation-ring client ([`RingClient`]) per other daemon of the rank, through which
//!   it hands remote calls for their shards to them. The seed uses a "Flux" channel for this
//!   (seeds/004 §4.3); here each daemon already serves a delegation ring, and Daemon#0 is
//!   simply one more client of it, with a deferred copyrpc reply when the response comes back.
//!
//! It is generic over the service `S`: the application supplies a routing function
//! (decoded request → [`Target`] rank and daemon, e.g. `request.rank` and `key % daemons` for
//! the KV store of seeds/004 §8) and, at each [`Delegate::run_once`], the handler of its own
//! shard ([`Delegate::run_once_raw`]: a router of request messages and a handler that serves
//! in place, such as the generated `dispatch_raw`; nothing is allocated per request).
//! Requests and responses are forwarded as the raw wire messages they are
//! ([`crate::wire`]): the bytes taken from the ring go verbatim into `copyrpc call`, the bytes
//! of a copyrpc response verbatim into the client's response slot, and likewise between
//! copyrpc and the other daemons' rings. Requests are decoded only to route them (a validated
//! cast), never re-encoded.
//!
//! # One round ([`Delegate::run_once`]), phase by phase
//! - **Phase 1** (seeds/004 §5 Phase 1; §4.2 steps 3-4; §4.3 steps 1-3): `ctx.poll`; each
//!   response goes into the response slot its [`DelegToken`] names (`reply` on the ring).
//!   Then every request received over copyrpc is served by the handler if it is for this
//!   daemon's shard, else handed to the owning daemon's ring (its [`RecvHandle`] is kept under
//!   the response slot the ring client used, the seed's `pending_copyrpc_handles`).
//! - **Phase 2** (seeds/004 §5 Phase 2; §4.1 steps 2-3) and **Phase 3** (§5 Phase 3, §4.4):
//!   the ring is polled; an entry for another rank is sent by `copyrpc call` to that rank's
//!   endpoint with a [`DelegToken`] as user data; an entry for this rank is served by the
//!   handler and answered in its response slot. The seed keeps local calls of shard 0 in a
//!   separate ipc ring (Phase 3); here both kinds share the daemon's one delegation ring, so
//!   Phases 2 and 3 are one pass over it, in ring order. Then `advance_tail`.
//! - **Phase 4** (seeds/004 §5 Phase 4; §4.3 steps 7-8): the responses of the other daemons
//!   to forwarded calls are sent back with `copyrpc reply` (verbatim).
//!
//! # Back-pressure (seeds/004 §5 "バックプレッシャ処理")
//! - **copyrpc send ring full (Phase 2).** When `call` reports [`crate::copyrpc::CallErrorKind::RingFull`] or
//!   [`crate::copyrpc::CallErrorKind::InsufficientCredit`], the entry stays in the delegate's own buffer (taken over
//!   from the ring, [`RingServer::recv_into`]) and the delegate makes nested progress — `ctx.poll` whose responses are
//!   delivered to their clients at once (the seed's nested `ctx.poll(|token, data| …)`) —
//!   then retries, until the call is written or fails for good. Unlike the seed, the nested
//!   round also serves the requests received meanwhile (Phase 1's second half) and drains the
//!   other daemons' responses (Phase 4): in this copyrpc core receive-ring space is returned
//!   to the sender only when a request is taken by `recv`, so two delegates that both wait in
//!   Phase 2 for each other's ring would otherwise wait forever.
//! - **copyrpc response ring full (Phase 4).** The seed retries `reply` after a nested poll
//!   and parks the responses that arrive meanwhile in `nested_resp_buf`. This copyrpc core
//!   never reports a full ring on `reply` (the caller's credit reserved the space, see
//!   [`crate::copyrpc::endpoint`]), so there is no nested poll there and nothing to buffer.
//! - **Another daemon's ring full (Phase 1).** A hand-off that finds all of this delegate's
//!   response slots on that ring in use ([`RingCallError::WouldBlock`]) copies the request out
//!   (cold path) and drains that daemon's responses (Phase 4 for it) until a slot is free.
//!   Daemons never wait for the delegate, so this terminates unless the daemon is stopped.
//!
//! Both waits are bounded by the delegate's wait timeout ([`Delegate::set_wait_timeout`],
//! default [`DEFAULT_WAIT_TIMEOUT`]): a stopped (SIGSTOP) daemon or peer must not stop the
//! delegate, which serves every other client and rank. A wait that reaches it answers its
//! request with [`Status::Unreachable`] ([`ForwardStats::wait_timeouts`]).
//!
//! Order: the calls of one client to one destination are forwarded in the order the client
//! issued them (the ring is consumed in order; a retried call blocks the pass), so a single
//! writer's writes to a key are applied in issue order on every path.
//!
//! # Bad input
//! Nothing a peer or client sends makes the delegate panic. A request that does not decode is
//! answered with its [`crate::wire::WireError::status`] ([`ForwardStats::bad_requests`]); a
//! request for a rank that does not exist, for which there is no endpoint, or (arriving from
//! a peer) for another rank or a daemon that does not exist, or (taken from the ring) for this
//! rank but a daemon other than the delegate — ring clients call the other daemons of their
//! rank on those daemons' own rings (seeds/004 §4.4), so the delegate's ring carries only
//! shard-0 and remote-rank calls — with [`Status::Unreachable`] ([`ForwardStats::unroutable`]); a call whose endpoint or daemon failed, with
//! [`Status::Unreachable`] ([`ForwardStats::failed_calls`]); a response that is not a wire
//! message or does not fit the client's slot, with [`Status::BadForwardedResponse`]
//! ([`ForwardStats::corrupt_responses`]).
//!
//! The hot path does not allocate: scratch buffers and tables are sized at construction.

use std::marker::PhantomData;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use super::shard::{Owned, Raw, Shard, is_oversized, method_id_of, serve_into};
use super::{DelegationServer, ReplyToken, RingCallError, RingClient, RingServer};
use crate::copyrpc::{Context, EndpointFailure, EndpointId, RecvHandle, ReplyError};
use crate::error::{MessageKind, RpcError, sat_u32};
use crate::service::Service;
use crate::varlen::AlignedBuf;
use crate::wire::{self, Status, WireError};

/// Default bound on a delegate's back-pressure waits ([`Delegate::set_wait_timeout`]): 1 s,
/// the default call deadline suggested for the typed clients.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(1);

/// Where a request must be served: a rank, and the daemon (shard) within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// The rank (seeds/004 §8: the request's `rank` field).
    pub rank: u32,
    /// The daemon of that rank owning the request's shard (seeds/004 §7: `key % daemons`).
    pub daemon: u32,
}

/// The user data of a forwarded copyrpc call: which client response slot its response goes
/// to (seeds/004 §4.1 `DelegToken { client_id, resp_slot_idx }`), plus the ring's generation
/// of that client id (so a response to a client that has gone away is refused, not
/// misdelivered) and the request's method id (echoed in an error status).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DelegToken {
    /// The delegation-ring client id of the caller.
    pub client_id: u32,
    /// The caller's response slot.
    pub resp_slot_idx: u32,
    /// Generation of the caller's client record when the request was received.
    pub generation: u32,
    /// Method id of the request.
    pub method_id: u16,
    /// The ring entry's call tag ([`ReplyToken::call_tag`]).
    pub call_tag: u16,
}

impl DelegToken {
    /// The token of a ring entry, with the request's method id.
    #[inline]
    pub fn new(token: ReplyToken, method_id: u16) -> Self {
        DelegToken {
            client_id: token.client_id,
            resp_slot_idx: token.resp_slot_idx,
            generation: token.generation,
            method_id,
            call_tag: token.call_tag,
        }
    }

    /// The ring's reply token for the caller's response slot.
    #[inline]
    pub fn reply_token(&self) -> ReplyToken {
        ReplyToken {
            client_id: self.client_id,
            generation: self.generation,
            resp_slot_idx: self.resp_slot_idx,
            call_tag: self.call_tag,
        }
    }
}

/// Counters of a [`Delegate`] (each a number of requests or responses).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardStats {
    /// Ring entries for this rank, served by the handler (Phase 3).
    pub ring_local: u64,
    /// Ring entries for other ranks, sent with `copyrpc call` (Phase 2).
    pub forwarded: u64,
    /// Responses to those calls, delivered into the callers' response slots (Phase 1).
    pub responses: u64,
    /// Requests received over copyrpc and served by the handler (Phase 1).
    pub remote_served: u64,
    /// Requests received over copyrpc and handed to another daemon of this rank (Phase 1).
    pub handed_off: u64,
    /// Those daemons' responses sent back with `copyrpc reply` (Phase 4).
    pub handoff_replies: u64,
    /// Requests that did not decode (to route them, or in the handler), answered with the
    /// decode error's status.
    pub bad_requests: u64,
    /// Requests of this daemon's shard whose response did not fit the reply buffer (a
    /// variable-length result over the service's `max_var_bytes`, or a handler that returned
    /// more than the buffer holds), answered [`Status::ResponseTooLarge`].
    pub oversized_responses: u64,
    /// Requests for a rank or daemon that does not exist or has no endpoint, (from a peer)
    /// for another rank, or (from the ring) for a daemon of this rank other than the
    /// delegate, answered with [`Status::Unreachable`].
    pub unroutable: u64,
    /// Forwarded calls whose endpoint or daemon failed (or refused them), answered with
    /// [`Status::Unreachable`].
    pub failed_calls: u64,
    /// Responses that could not be passed on (not a wire message, or too large for the
    /// caller), answered with [`Status::BadForwardedResponse`].
    pub corrupt_responses: u64,
    /// Replies the ring or copyrpc refused (the client is gone, the endpoint failed).
    pub dropped_replies: u64,
    /// Phase 2 `call`s that found the copyrpc ring full or credit short and were retried
    /// after nested progress (seeds/004 §5 back-pressure).
    pub ring_full_retries: u64,
    /// Phase 1 hand-offs that found all response slots on the daemon's ring in use and
    /// waited for its responses.
    pub daemon_busy_waits: u64,
    /// Phase 1 hand-offs and Phase 2 calls that gave up after waiting the delegate's wait
    /// timeout for room (a stopped daemon or peer), answered with [`Status::Unreachable`].
    pub wait_timeouts: u64,
}

/// Setting up a [`Delegate`] failed.
#[derive(Debug, thiserror::Error)]
pub enum DelegateError {
    /// `rank >= ranks`, or a peer rank that is out of range or the delegate's own.
    #[error("rank {rank} is out of range (ranks: {ranks}) or the delegate's own ({own})")]
    BadRank {
        /// The rank given.
        rank: u32,
        /// Number of ranks.
        ranks: u32,
        /// The delegate's rank.
        own: u32,
    },
    /// A daemon index that is 0 (the delegate itself) or `>= daemons`.
    #[error("daemon {daemon} is out of range 1..{daemons}")]
    BadDaemon {
        /// The daemon given.
        daemon: u32,
        /// Daemons per rank.
        daemons: u32,
    },
    /// No such endpoint in the delegate's context.
    #[error("endpoint {0} does not exist in the delegate's context")]
    BadEndpoint(EndpointId),
    /// A ring serves a different interface or cannot carry the service's messages, or
    /// attaching to it failed.
    #[error(transparent)]
    Ring(#[from] RpcError),
}

/// The node delegate (Daemon#0 of seeds/004) for service `S`, routing with `R`. See the
/// module docs.
pub struct Delegate<S: Service, R> {
    rank: u32,
    ring: DelegationServer,
    ctx: Context<DelegToken>,
    /// Endpoint towards each rank's delegate (`None`: own rank, or not connected).
    peers: Box<[Option<EndpointId>]>,
    /// Ring client of each other daemon of this rank (`[0]`, the delegate itself: `None`).
    daemons: Box<[Option<RingClient>]>,
    /// Per daemon, per response slot of its ring: the copyrpc request being served there.
    pending: Box<[Box<[Option<RecvHandle>]>]>,
    route: R,
    /// The ring's response payload capacity, bytes.
    resp_cap: usize,
    /// The ring entry being handled, taken over from the ring ([`RingServer::recv_into`]).
    ring_req: AlignedBuf,
    /// Private copy of the copyrpc request being handled (`max_request_bytes`).
    remote_req: AlignedBuf,
    /// Copy of one copyrpc request for the Phase 1 hand-off retry path (`max_request_bytes`).
    handoff_scratch: Box<[u8]>,
    stats: ForwardStats,
    /// Bound on the back-pressure waits (see [`Delegate::set_wait_timeout`]).
    wait_timeout: Duration,
    _service: PhantomData<fn() -> S>,
}

impl<S: Service, R> std::fmt::Debug for Delegate<S, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delegate")
            .field("service", &S::DESCRIPTOR.name)
            .field("rank", &self.rank)
            .field("peers", &self.peers)
            .field("daemons", &self.daemons.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<S: Service, R> Delegate<S, R> {
    /// A delegate for `rank` of `ranks` with `daemons` daemons per rank (itself daemon 0),
    /// serving `ring` (created for `S`) and forwarding over `ctx`, routing with `route`:
    /// either a function of the decoded request (`FnMut(&S::Request) -> Target`, for
    /// [`Delegate::run_once`]) or of the request message
    /// (`FnMut(&[u8]) -> Result<Target, WireError>`, for [`Delegate::run_once_raw`]). Connect endpoints on
    /// [`Delegate::context_mut`] and register them with [`Delegate::set_peer`]; attach the
    /// other daemons' rings with [`Delegate::attach_daemon`].
    ///
    /// # Errors
    /// [`DelegateError::BadRank`] if `rank >= ranks`; [`DelegateError::BadDaemon`] if
    /// `daemons == 0`; [`DelegateError::Ring`] if `ring` was not created for `S` (schema
    /// fingerprint or message capacities).
    pub fn new(
        ring: DelegationServer,
        ctx: Context<DelegToken>,
        rank: u32,
        ranks: u32,
        daemons: u32,
        route: R,
    ) -> Result<Self, DelegateError> {
        if rank >= ranks {
            return Err(DelegateError::BadRank {
                rank,
                ranks,
                own: rank,
            });
        }
        if daemons == 0 {
            return Err(DelegateError::BadDaemon { daemon: 0, daemons });
        }
        let info = ring.ring().info();
        check_ring::<S>(
            info.fingerprint,
            info.req_payload_cap,
            info.resp_payload_cap,
        )?;
        Ok(Delegate {
            rank,
            ring,
            ctx,
            peers: vec![None; ranks as usize].into_boxed_slice(),
            daemons: (0..daemons).map(|_| None).collect(),
            pending: (0..daemons).map(|_| Box::default()).collect(),
            route,
            resp_cap: info.resp_payload_cap as usize,
            ring_req: AlignedBuf::new(S::DESCRIPTOR.max_request_bytes),
            remote_req: AlignedBuf::new(S::DESCRIPTOR.max_request_bytes),
            handoff_scratch: vec![0u8; S::DESCRIPTOR.max_request_bytes].into_boxed_slice(),
            stats: ForwardStats::default(),
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            _service: PhantomData,
        })
    }

    /// Routes calls for `rank` over endpoint `ep` of the context (connected to that rank's
    /// delegate, seeds/004 §1.4).
    ///
    /// # Errors
    /// [`DelegateError::BadRank`] for the own rank or one out of range;
    /// [`DelegateError::BadEndpoint`] for an endpoint the context does not have.
    pub fn set_peer(&mut self, rank: u32, ep: EndpointId) -> Result<(), DelegateError> {
        if rank as usize >= self.peers.len() || rank == self.rank {
            return Err(DelegateError::BadRank {
                rank,
                ranks: self.peers.len() as u32,
                own: self.rank,
            });
        }
        if ep as usize >= self.ctx.num_endpoints() {
            return Err(DelegateError::BadEndpoint(ep));
        }
        self.peers[rank as usize] = Some(ep);
        Ok(())
    }

    /// Attaches to the ring `/dev/shm/<name>` of daemon `daemon` of this rank, to hand it
    /// the remote calls for its shard (the seed's Flux channel, seeds/004 §4.3).
    ///
    /// # Errors
    /// [`DelegateError::BadDaemon`] unless `1 <= daemon < daemons`; [`DelegateError::Ring`] if
    /// attaching fails or the ring serves another schema or smaller messages.
    pub fn attach_daemon(&mut self, daemon: u32, name: &str) -> Result<(), DelegateError> {
        if daemon == 0 || daemon as usize >= self.daemons.len() {
            return Err(DelegateError::BadDaemon {
                daemon,
                daemons: self.daemons.len() as u32,
            });
        }
        let client = RingClient::attach(name).map_err(RpcError::from)?;
        let info = client.info();
        check_ring::<S>(
            info.fingerprint,
            info.req_payload_cap,
            info.resp_payload_cap,
        )?;
        self.pending[daemon as usize] = vec![None; info.resp_depth as usize].into_boxed_slice();
        self.daemons[daemon as usize] = Some(client);
        Ok(())
    }

    /// Sets the bound on each back-pressure wait (default [`DEFAULT_WAIT_TIMEOUT`]): a Phase 1
    /// hand-off waiting for a free response slot on another daemon's ring, and a Phase 2
    /// `copyrpc call` waiting for ring space or credit. A wait that reaches it answers its
    /// request with [`Status::Unreachable`] ([`ForwardStats::wait_timeouts`]).
    pub fn set_wait_timeout(&mut self, timeout: Duration) {
        self.wait_timeout = timeout;
    }

    /// This delegate's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Counters.
    pub fn stats(&self) -> &ForwardStats {
        &self.stats
    }

    /// The copyrpc context (counters, endpoint states).
    pub fn context(&self) -> &Context<DelegToken> {
        &self.ctx
    }

    /// The copyrpc context, mutably (create and connect endpoints).
    pub fn context_mut(&mut self) -> &mut Context<DelegToken> {
        &mut self.ctx
    }

    /// The delegate's own ring (its counters: `ring().ring().stats()`).
    pub fn ring(&self) -> &DelegationServer {
        &self.ring
    }

    /// One round with `shard` serving this daemon's shard.
    #[inline]
    fn round<'s, H: Shard<S>>(&'s mut self, make: impl FnOnce(&'s mut R) -> H) -> usize {
        let Delegate {
            rank,
            ring,
            ctx,
            peers,
            daemons,
            pending,
            route,
            resp_cap,
            ring_req,
            remote_req,
            handoff_scratch,
            stats,
            wait_timeout,
            ..
        } = self;
        let ring = ring.ring_mut();
        let mut io = Io {
            rank: *rank,
            resp_cap: *resp_cap,
            ctx,
            daemons,
            pending,
            handoff_scratch,
            remote_req,
            stats,
            wait_timeout: *wait_timeout,
        };
        let mut shard = make(route);
        // Phase 1 (seeds/004 §5 Phase 1): copyrpc completions and incoming requests.
        let mut work = io.poll_copyrpc(ring);
        work += io.serve_incoming::<S, H>(&mut shard);
        // Phases 2 and 3 (seeds/004 §5 Phase 2, Phase 3): the ring.
        work += io.serve_ring::<S, H>(ring, peers, &mut shard, ring_req);
        // Phase 4 (seeds/004 §5 Phase 4): the other daemons' responses.
        work += io.drain_daemons();
        work
    }
}

impl<S: Service, R: FnMut(&S::Request) -> Target> Delegate<S, R> {
    /// One round of the event loop (seeds/004 §5): Phase 1, Phases 2+3, Phase 4 (module
    /// docs). `handler` serves this daemon's shard from owned requests (a request's
    /// variable-length arguments are copied into `String`/`Vec`s; [`Delegate::run_once_raw`]
    /// serves in place). Returns the number of requests and responses handled (0: idle).
    /// The response is encoded straight into the reply buffer; one longer than it is
    /// answered [`Status::ResponseTooLarge`] ([`ForwardStats::oversized_responses`]). A
    /// request whose reply cannot be delivered (the client is gone) is not run
    /// ([`ForwardStats::dropped_replies`]).
    #[inline]
    pub fn run_once(&mut self, mut handler: impl FnMut(S::Request) -> S::Response) -> usize {
        self.round(|route| Owned::<S, R, _> {
            route,
            handler: &mut handler,
            req: None,
        })
    }
}

impl<S: Service, R: FnMut(&[u8]) -> Result<Target, WireError>> Delegate<S, R> {
    /// One round of the event loop (seeds/004 §5), serving this daemon's shard in place: the
    /// delegate's router reads a request's target from its message (an error: the request
    /// does not decode), and `handler(request, reply_buf)` (e.g.
    /// `|msg, out| KvVarService::dispatch_raw(&mut shard, msg, out)`) decodes the request in
    /// place, runs it and writes the response message into `reply_buf`, returning its
    /// length. Returns the number of requests and responses handled (0: idle).
    ///
    /// Nothing is allocated: `request` is the delegate's private copy (a ring entry taken
    /// over from the ring without a copy, [`RingServer::recv_into`]; a copyrpc request copied
    /// out of the receive ring), so a client or peer cannot change it while the handler
    /// reads it; `reply_buf` is the client's response slot or the copyrpc reply buffer.
    ///
    /// A handler error is answered with its status and counted: a request that does not
    /// decode in [`ForwardStats::bad_requests`], a response that does not fit (including a
    /// returned length above `reply_buf.len()`) as [`Status::ResponseTooLarge`] in
    /// [`ForwardStats::oversized_responses`]. A request whose reply cannot be delivered (the
    /// client is gone) is not run ([`ForwardStats::dropped_replies`]).
    #[inline]
    pub fn run_once_raw(
        &mut self,
        mut handler: impl FnMut(&[u8], &mut [u8]) -> Result<usize, WireError>,
    ) -> usize {
        self.round(|route| Raw {
            route,
            handler: &mut handler,
        })
    }
}

/// Checks that a ring was made for `S`.
pub(super) fn check_ring<S: Service>(
    fingerprint: u64,
    req_cap: u32,
    resp_cap: u32,
) -> Result<(), RpcError> {
    let d = S::DESCRIPTOR;
    if fingerprint != d.fingerprint {
        return Err(RpcError::SchemaMismatch {
            service: d.name,
            expected: d.fingerprint,
            found: fingerprint,
        });
    }
    for (what, cap, need) in [
        (MessageKind::Request, req_cap, d.max_request_bytes),
        (MessageKind::Response, resp_cap, d.max_response_bytes),
    ] {
        if (cap as usize) < need {
            return Err(RpcError::CapacityMismatch {
                service: d.name,
                what,
                side: crate::error::LimitSide::PeerServer,
                setting: crate::error::SETTING_DERIVED_FROM_SERVICE,
                cap,
                need: u32::try_from(need).unwrap_or(u32::MAX),
                min: None,
            });
        }
    }
    Ok(())
}

/// The parts of a [`Delegate`] the phases share (disjoint from the ring and the router, so
/// that a nested round can borrow them while a ring entry is being handled).
struct Io<'a> {
    rank: u32,
    /// The ring's response payload capacity, bytes.
    resp_cap: usize,
    ctx: &'a mut Context<DelegToken>,
    daemons: &'a mut [Option<RingClient>],
    pending: &'a mut [Box<[Option<RecvHandle>]>],
    handoff_scratch: &'a mut [u8],
    /// Private copy of the copyrpc request being handled.
    remote_req: &'a mut AlignedBuf,
    stats: &'a mut ForwardStats,
    /// Bound on each back-pressure wait.
    wait_timeout: Duration,
}

impl Io<'_> {
    /// Phase 1, first half (seeds/004 §4.2 steps 3-4): `ctx.poll`, every response into the
    /// response slot its token names. Also flushes what the previous round wrote.
    #[inline]
    fn poll_copyrpc(&mut self, ring: &mut RingServer) -> usize {
        let (stats, cap) = (&mut *self.stats, self.resp_cap);
        let mut n = 0;
        self.ctx.poll(|tok, resp| {
            n += 1;
            deliver_response(ring, cap, stats, tok, resp);
        });
        n
    }

    /// Counts the outcome of serving one request of the shard: whether it was served
    /// (`err` is `None`), else the error it was answered with.
    #[inline]
    fn tally(&mut self, err: Option<WireError>) -> bool {
        tally(self.stats, err)
    }

    /// Phase 1, second half (seeds/004 §4.3 steps 1-3): serves each request received over
    /// copyrpc with `shard` if it is for this daemon, else hands it to the owning daemon.
    /// Each request is copied into the delegate's private buffer first (a peer cannot change
    /// it while the handler reads it; aligned; readable while the reply borrows the context).
    #[inline]
    fn serve_incoming<S: Service, H: Shard<S>>(&mut self, shard: &mut H) -> usize {
        let mut n = 0;
        loop {
            let buf = &mut *self.remote_req;
            let Some((h, len)) = self.ctx.recv().map(|(h, msg)| {
                if buf.len() < msg.len() {
                    // Cold: `buf` holds `max_request_bytes`, and the context refuses longer
                    // requests.
                    *buf = AlignedBuf::new(msg.len());
                }
                buf[..msg.len()].copy_from_slice(msg);
                (h, msg.len())
            }) else {
                return n;
            };
            n += 1;
            // Moved out while the request is handled (no allocation: the default is empty);
            // nothing below touches `remote_req` (hand-offs copy into `handoff_scratch`).
            let req = std::mem::take(self.remote_req);
            let msg = &req[..len];
            self.serve_remote::<S, H>(shard, h, msg);
            *self.remote_req = req;
        }
    }

    /// One request received over copyrpc (see [`Io::serve_incoming`]).
    #[inline]
    fn serve_remote<S: Service, H: Shard<S>>(&mut self, shard: &mut H, h: RecvHandle, msg: &[u8]) {
        let method_id = method_id_of(msg);
        let t = match shard.route(msg) {
            Ok(t) => t,
            Err(e) => {
                self.stats.bad_requests += 1;
                self.reply_status(h, method_id, e.status());
                return;
            }
        };
        if t.rank != self.rank {
            self.stats.unroutable += 1;
            self.reply_status(h, method_id, Status::Unreachable);
            return;
        }
        if t.daemon == 0 {
            // The method's largest reply, which a typed caller's allowance covers
            // (`copyrpc::transport` module docs, "Messages"): `reply_with` checks the
            // buffer's size, not the reply's, against the allowance.
            let max = sat_u32(S::DESCRIPTOR.max_reply_bytes(method_id) as u64);
            let mut err = None;
            let r = self
                .ctx
                .reply_with(h, max, |out| serve_into(shard, msg, out, &mut err));
            if self.tally(err) {
                self.stats.remote_served += 1;
            }
            match r {
                Ok(()) => {}
                Err(ReplyError::TooLarge { .. }) => {
                    self.stats.corrupt_responses += 1;
                    self.reply_status(h, method_id, Status::BadForwardedResponse);
                }
                Err(ReplyError::Failed | ReplyError::Stale | ReplyError::NoLargeBuffer) => {
                    self.stats.dropped_replies += 1
                }
            }
            return;
        }
        let d = t.daemon as usize;
        let Some(client) = self.daemons.get_mut(d).and_then(Option::as_mut) else {
            self.stats.unroutable += 1;
            self.reply_status(h, method_id, Status::Unreachable);
            return;
        };
        // seeds/004 §4.3 step 3: keep the handle under the slot the hand-off uses.
        match client.try_call(msg) {
            Ok(slot) => {
                self.stats.handed_off += 1;
                self.pending[d][slot as usize] = Some(h);
            }
            Err(RingCallError::WouldBlock) => {
                let len = msg.len().min(self.handoff_scratch.len());
                self.handoff_scratch[..len].copy_from_slice(&msg[..len]);
                self.hand_off_when_free(d, h, method_id, len);
            }
            Err(_) => {
                self.stats.failed_calls += 1;
                self.reply_status(h, method_id, Status::Unreachable);
            }
        }
    }

    /// Back-pressure of a hand-off (cold): drains daemon `d`'s responses (Phase 4 for it)
    /// until one of this delegate's response slots on its ring is free, then hands `msg` off.
    #[cold]
    #[inline(never)]
    fn hand_off_when_free(&mut self, d: usize, h: RecvHandle, method_id: u16, len: usize) {
        self.stats.daemon_busy_waits += 1;
        let deadline = Instant::now() + self.wait_timeout;
        let backoff = Backoff::new();
        loop {
            if self.drain_daemon(d) == 0 {
                backoff.snooze();
            }
            let Some(client) = self.daemons[d].as_mut() else {
                self.stats.failed_calls += 1;
                self.reply_status(h, method_id, Status::Unreachable);
                return;
            };
            if Instant::now() >= deadline {
                self.stats.wait_timeouts += 1;
                self.reply_status(h, method_id, Status::Unreachable);
                return;
            }
            let msg = &self.handoff_scratch[..len];
            match client.try_call_with_deadline(deadline, |buf| {
                buf[..msg.len()].copy_from_slice(msg);
                msg.len()
            }) {
                Ok(slot) => {
                    self.stats.handed_off += 1;
                    self.pending[d][slot as usize] = Some(h);
                    return;
                }
                Err(RingCallError::WouldBlock) => {}
                Err(RingCallError::Timeout) => {
                    self.stats.wait_timeouts += 1;
                    self.reply_status(h, method_id, Status::Unreachable);
                    return;
                }
                Err(_) => {
                    self.stats.failed_calls += 1;
                    self.reply_status(h, method_id, Status::Unreachable);
                    return;
                }
            }
        }
    }

    /// Phases 2 and 3 (seeds/004 §4.1 steps 2-3, §4.4): one pass over the ring, each entry
    /// taken over into `buf` without a copy ([`RingServer::recv_into`]).
    #[inline]
    fn serve_ring<S: Service, H: Shard<S>>(
        &mut self,
        ring: &mut RingServer,
        peers: &[Option<EndpointId>],
        shard: &mut H,
        buf: &mut AlignedBuf,
    ) -> usize {
        if ring.poll() == 0 {
            return 0;
        }
        let allowance = S::DESCRIPTOR.max_response_bytes as u32;
        let mut n = 0;
        while let Some((token, len)) = ring.recv_into(buf) {
            n += 1;
            let msg = &buf[..len];
            let method_id = method_id_of(msg);
            let t = match shard.route(msg) {
                Ok(t) => t,
                Err(e) => {
                    self.stats.bad_requests += 1;
                    ring_status(ring, self.stats, token, method_id, e.status());
                    continue;
                }
            };
            if t.rank == self.rank {
                if t.daemon != 0 {
                    // Another daemon's shard (or no such daemon): the ring's clients reach the
                    // other daemons of their rank through those daemons' own rings (seeds/004
                    // §4.4), so this entry is misaddressed. Answered, never served here.
                    self.misaddressed(ring, token, method_id, t.daemon);
                    continue;
                }
                // Phase 3: this daemon's shard.
                let mut err = None;
                let r = ring.reply_with(token, |out| serve_into(shard, msg, out, &mut err));
                if self.tally(err) {
                    self.stats.ring_local += 1;
                }
                if r.is_err() {
                    self.stats.dropped_replies += 1;
                }
                continue;
            }
            let Some(ep) = peers.get(t.rank as usize).copied().flatten() else {
                self.stats.unroutable += 1;
                ring_status(ring, self.stats, token, method_id, Status::Unreachable);
                continue;
            };
            // Phase 2: the entry's bytes, verbatim, to the target rank's delegate.
            let tok = DelegToken::new(token, method_id);
            match self.ctx.call(ep, msg, tok, allowance) {
                Ok(_) => self.stats.forwarded += 1,
                // `msg` is the delegate's own buffer: the nested progress of the retry does
                // not touch it.
                Err(e) if e.kind.is_retryable() => {
                    self.call_when_ready::<S, H>(ring, ep, tok, msg, shard)
                }
                Err(_) => {
                    self.stats.failed_calls += 1;
                    ring_status(ring, self.stats, token, method_id, Status::Unreachable);
                }
            }
        }
        ring.advance_tail();
        n
    }

    /// A ring entry for this rank but another daemon (cold): [`Status::Unreachable`],
    /// counted in [`ForwardStats::unroutable`].
    #[cold]
    #[inline(never)]
    fn misaddressed(
        &mut self,
        ring: &mut RingServer,
        token: ReplyToken,
        method_id: u16,
        daemon: u32,
    ) {
        self.stats.unroutable += 1;
        tracing::debug!(
            daemon,
            daemons = self.daemons.len(),
            "delegate: ring entry for another daemon of this rank refused"
        );
        ring_status(ring, self.stats, token, method_id, Status::Unreachable);
    }

    /// seeds/004 §5 "copyrpc 送信リング満杯 (Phase 2)" (cold): nested progress — `ctx.poll`
    /// delivering responses, serving incoming requests, draining the other daemons — then
    /// retry, until the call is written or fails for good.
    #[cold]
    #[inline(never)]
    fn call_when_ready<S: Service, H: Shard<S>>(
        &mut self,
        ring: &mut RingServer,
        ep: EndpointId,
        tok: DelegToken,
        msg: &[u8],
        shard: &mut H,
    ) {
        let allowance = S::DESCRIPTOR.max_response_bytes as u32;
        let deadline = Instant::now() + self.wait_timeout;
        let backoff = Backoff::new();
        loop {
            self.stats.ring_full_retries += 1;
            let mut work = self.poll_copyrpc(ring);
            work += self.serve_incoming::<S, H>(shard);
            work += self.drain_daemons();
            match self.ctx.call(ep, msg, tok, allowance) {
                Ok(_) => {
                    self.stats.forwarded += 1;
                    return;
                }
                Err(e) if e.kind.is_retryable() => {}
                Err(_) => {
                    self.stats.failed_calls += 1;
                    break;
                }
            }
            if Instant::now() >= deadline {
                self.stats.wait_timeouts += 1;
                break;
            }
            if work == 0 {
                backoff.snooze();
            } else {
                backoff.reset();
            }
        }
        // Failed for good, or no room before the wait timeout: the caller gets `Unreachable`.
        ring_status(
            ring,
            self.stats,
            tok.reply_token(),
            tok.method_id,
            Status::Unreachable,
        );
    }

    /// Phase 4 (seeds/004 §4.3 steps 7-8) for every other daemon.
    #[inline]
    fn drain_daemons(&mut self) -> usize {
        let mut n = 0;
        for d in 1..self.daemons.len() {
            n += self.drain_daemon(d);
        }
        n
    }

    /// Phase 4 for daemon `d`: each response, verbatim, as the `copyrpc reply` of the request
    /// it answers.
    #[inline]
    fn drain_daemon(&mut self, d: usize) -> usize {
        let Some(client) = self.daemons[d].as_mut() else {
            return 0;
        };
        if client.in_flight() == 0 {
            return 0;
        }
        let (ctx, stats, pending) = (&mut *self.ctx, &mut *self.stats, &mut self.pending[d]);
        let r = client.poll(|slot, resp| {
            let Some(h) = pending.get_mut(slot as usize).and_then(Option::take) else {
                // The ring client only reports slots it used; nothing to answer.
                stats.corrupt_responses += 1;
                return;
            };
            stats.handoff_replies += 1;
            match ctx.reply(h, resp) {
                Ok(()) => {}
                Err(ReplyError::TooLarge { .. }) => {
                    stats.corrupt_responses += 1;
                    reply_status(
                        ctx,
                        stats,
                        h,
                        method_id_of(resp),
                        Status::BadForwardedResponse,
                    );
                }
                Err(ReplyError::Failed | ReplyError::Stale | ReplyError::NoLargeBuffer) => {
                    stats.dropped_replies += 1
                }
            }
        });
        match r {
            Ok(n) => n,
            Err(_) => self.daemon_failed(d),
        }
    }

    /// Daemon `d`'s ring is gone (cold): every request handed to it is answered with
    /// [`Status::Unreachable`] and later hand-offs to it are refused.
    #[cold]
    #[inline(never)]
    fn daemon_failed(&mut self, d: usize) -> usize {
        tracing::warn!(daemon = d, "delegate: daemon ring disconnected");
        self.daemons[d] = None;
        let mut n = 0;
        for slot in self.pending[d].iter_mut() {
            if let Some(h) = slot.take() {
                n += 1;
                self.stats.failed_calls += 1;
                reply_status(self.ctx, self.stats, h, u16::MAX, Status::Unreachable);
            }
        }
        n
    }

    fn reply_status(&mut self, h: RecvHandle, method_id: u16, status: Status) {
        reply_status(self.ctx, self.stats, h, method_id, status);
    }
}

/// Counts the outcome of serving one request of the shard: whether it was served (`err` is
/// `None`), else the error it was answered with.
#[inline]
fn tally(stats: &mut ForwardStats, err: Option<WireError>) -> bool {
    match err {
        None => true,
        Some(e) => {
            if is_oversized(&e) {
                stats.oversized_responses += 1;
            } else {
                stats.bad_requests += 1;
            }
            false
        }
    }
}

/// Answers copyrpc request `h` with an error status (cold).
#[cold]
fn reply_status(
    ctx: &mut Context<DelegToken>,
    stats: &mut ForwardStats,
    h: RecvHandle,
    method_id: u16,
    status: Status,
) {
    let r = ctx.reply_with(h, wire::HEADER_BYTES as u32, |buf| {
        wire::encode_status(method_id, status, buf)
    });
    if r.is_err() {
        stats.dropped_replies += 1;
    }
}

/// Answers a ring entry with an error status (cold).
#[cold]
fn ring_status(
    ring: &mut RingServer,
    stats: &mut ForwardStats,
    token: ReplyToken,
    method_id: u16,
    status: Status,
) {
    if ring
        .reply_with(token, |buf| wire::encode_status(method_id, status, buf))
        .is_err()
    {
        stats.dropped_replies += 1;
    }
}

/// seeds/004 §4.2 step 4: a copyrpc response, verbatim, into the caller's response slot;
/// a failed call or a response that is not a wire message fitting the slot becomes an error
/// status.
#[inline]
fn deliver_response(
    ring: &mut RingServer,
    cap: usize,
    stats: &mut ForwardStats,
    tok: DelegToken,
    resp: Result<&[u8], EndpointFailure>,
) {
    let token = tok.reply_token();
    match resp {
        Ok(bytes) if bytes.len() <= cap && wire::read_header(bytes).is_ok() => {
            stats.responses += 1;
            let r = ring.reply_with(token, |buf| {
                buf[..bytes.len()].copy_from_slice(bytes);
                bytes.len()
            });
            if r.is_err() {
                stats.dropped_replies += 1;
            }
        }
        Ok(_) => {
            stats.corrupt_responses += 1;
            ring_status(
                ring,
                stats,
                token,
                tok.method_id,
                Status::BadForwardedResponse,
            );
        }
        Err(why) => {
            stats.failed_calls += 1;
            tracing::debug!(error = %why, "delegate: forwarded call failed");
            ring_status(ring, stats, token, tok.method_id, Status::Unreachable);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    //! Two in-process ranks on the device model with tiny copyrpc rings (4 KiB: the Phase 2
    //! `RingFull`/credit path runs constantly) and a tiny hand-off ring on rank 1 (4 response
    //! slots per client: the Phase 1 hand-off waits too). Every request is answered exactly
    //! once, by the right shard; bad input gets error statuses and counters.

    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::thread;
    use std::time::{Duration, Instant};

    use mlx5::sim::{Fabric, SimConfig};
    use zerocopy::{Immutable, IntoBytes, KnownLayout, TryFromBytes};

    use super::*;
    use crate::copyrpc::{ContextConfig, EndpointConfig};
    use crate::delegation::{DelegationConfig, RingConfig};
    use crate::service::{ArgDescriptor, MethodDescriptor, ServiceDescriptor};
    use crate::wire::WireError;

    #[derive(
        Clone, Copy, Debug, PartialEq, Eq, TryFromBytes, IntoBytes, KnownLayout, Immutable,
    )]
    #[repr(C, packed)]
    pub(crate) struct Args {
        pub(crate) rank: u32,
        pub(crate) key: u64,
    }

    /// `lookup(rank, key) -> u64`: answered with `key * 100 + who`, where `who` names the
    /// shard that served it.
    pub(crate) struct Svc;

    const ARGS: &[ArgDescriptor] = &[
        ArgDescriptor {
            name: "rank",
            ty: "u32",
            size: 4,
        },
        ArgDescriptor {
            name: "key",
            ty: "u64",
            size: 8,
        },
    ];
    const METHODS: &[MethodDescriptor] = &[MethodDescriptor {
        id: 0,
        name: "lookup",
        args: ARGS,
        ret_ty: "u64",
        ret_size: 8,
        request_bytes: wire::HEADER_BYTES + 12,
        response_bytes: wire::HEADER_BYTES + 8,
        var_request: false,
        var_response: false,
        var_align: 1,
    }];
    static DESCRIPTOR: ServiceDescriptor = ServiceDescriptor::new("ForwardTest", METHODS);

    impl Service for Svc {
        type Request = Args;
        type Response = u64;
        const DESCRIPTOR: &'static ServiceDescriptor = &DESCRIPTOR;
        fn encode_request(req: &Args, out: &mut [u8]) -> usize {
            wire::encode(0, 0, req, out)
        }
        fn decode_request(msg: &[u8]) -> Result<Args, WireError> {
            let hdr = wire::read_request_header(msg)?;
            if hdr.method_id != 0 {
                return Err(WireError::UnknownMethod(hdr.method_id));
            }
            wire::decode_body(hdr, msg)
        }
        fn encode_response(resp: &u64, out: &mut [u8]) -> usize {
            wire::encode(0, 0, resp, out)
        }
        fn decode_response(method_id: u16, msg: &[u8]) -> Result<u64, WireError> {
            wire::decode_response(method_id, msg)
        }
        fn request_method_id(_: &Args) -> u16 {
            0
        }
        fn request_len(_: &Args) -> usize {
            METHODS[0].request_bytes
        }
        fn response_len(_: &u64) -> usize {
            METHODS[0].response_bytes
        }
    }

    /// Served by rank 0's delegate (its own shard).
    const WHO_R0: u64 = 1;
    /// Served by rank 1's delegate (daemon 0 of rank 1).
    const WHO_R1D0: u64 = 2;
    /// Served by daemon 1 of rank 1.
    const WHO_R1D1: u64 = 3;
    /// Daemon 1 answers this key with bytes that are not a wire message.
    const POISON: u64 = 1_000_001;

    pub(crate) fn name(tag: &str) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        format!(
            "fwd-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn expected(a: Args) -> u64 {
        let (rank, key) = (a.rank, a.key);
        let who = match (rank, key % 2) {
            (0, _) => WHO_R0,
            (_, 0) => WHO_R1D0,
            _ => WHO_R1D1,
        };
        key * 100 + who
    }

    type Route = Box<dyn FnMut(&Args) -> Target + Send>;

    /// The two delegates, daemon 1 of rank 1, and a direct client context connected to rank
    /// 1's delegate, all built and connected; nothing running yet.
    /// A router of request messages (for `run_once_raw`).
    type RawRoute = Box<dyn FnMut(&[u8]) -> Result<Target, WireError> + Send>;

    struct Setup<R = Route> {
        d0: Delegate<Svc, R>,
        d1: Delegate<Svc, R>,
        daemon1: RingServer,
        direct: Context<u32>,
        direct_ep: EndpointId,
        ring0: String,
        _fabric: Fabric,
    }

    fn setup(ring_size: usize) -> Setup {
        let route0: Route = Box::new(|a: &Args| Target {
            rank: a.rank,
            daemon: 0,
        });
        let route1: Route = Box::new(|a: &Args| Target {
            rank: a.rank,
            daemon: (a.key % 2) as u32,
        });
        setup_with(ring_size, route0, route1)
    }

    /// Rank 0's delegate (one daemon) routing with `route0`, rank 1's (two daemons, the
    /// second served by the test at the byte level) with `route1`.
    fn setup_with<R>(ring_size: usize, route0: R, route1: R) -> Setup<R> {
        let fabric = Fabric::new(SimConfig {
            progress_thread: Some(Duration::from_millis(1)),
            ..SimConfig::default()
        });
        let (dev0, dev1) = (fabric.open(), fabric.open());
        let cfg = DelegationConfig {
            max_clients: 8,
            ring_depth: 64,
            resp_depth: 64,
            ..DelegationConfig::default()
        };
        let (ring0, ring1, ring1d1) = (name("r0"), name("r1"), name("r1d1"));
        let s0 = DelegationServer::create(&ring0, Svc::DESCRIPTOR, cfg).unwrap();
        let s1 = DelegationServer::create(&ring1, Svc::DESCRIPTOR, cfg).unwrap();
        // Four response slots per client: the hand-off from rank 1's delegate waits often.
        // Served at the byte level by the test, to be able to answer with garbage.
        let daemon1 = RingServer::create(
            &ring1d1,
            &RingConfig {
                max_clients: 8,
                ring_depth: 64,
                resp_depth: 4,
                req_payload_cap: Svc::DESCRIPTOR.max_request_bytes as u32,
                resp_payload_cap: Svc::DESCRIPTOR.max_response_bytes as u32,
                fingerprint: Svc::DESCRIPTOR.fingerprint,
                ..RingConfig::default()
            },
        )
        .unwrap();
        let mut c0 = Context::new(&dev0, ContextConfig::default()).unwrap();
        let mut c1 = Context::new(&dev1, ContextConfig::default()).unwrap();
        let mut direct = Context::<u32>::new(&dev0, ContextConfig::default()).unwrap();
        let ecfg = EndpointConfig {
            ring_size,
            ..EndpointConfig::default()
        };
        let (e01, e10) = (
            c0.create_endpoint(&ecfg).unwrap(),
            c1.create_endpoint(&ecfg).unwrap(),
        );
        let (i01, i10) = (c0.local_info(e01).unwrap(), c1.local_info(e10).unwrap());
        c0.connect(e01, &i10).unwrap();
        c1.connect(e10, &i01).unwrap();
        let (ed, e1d) = (
            direct.create_endpoint(&ecfg).unwrap(),
            c1.create_endpoint(&ecfg).unwrap(),
        );
        let (ied, ie1d) = (direct.local_info(ed).unwrap(), c1.local_info(e1d).unwrap());
        direct.connect(ed, &ie1d).unwrap();
        c1.connect(e1d, &ied).unwrap();

        let mut d0 = Delegate::new(s0, c0, 0, 2, 1, route0).unwrap();
        d0.set_peer(1, e01).unwrap();
        let mut d1 = Delegate::new(s1, c1, 1, 2, 2, route1).unwrap();
        d1.set_peer(0, e10).unwrap();
        d1.attach_daemon(1, &ring1d1).unwrap();
        Setup {
            d0,
            d1,
            daemon1,
            direct,
            direct_ep: ed,
            ring0,
            _fabric: fabric,
        }
    }

    fn run_delegate(
        mut d: Delegate<Svc, Route>,
        who: u64,
        stop: Arc<AtomicBool>,
    ) -> thread::JoinHandle<Delegate<Svc, Route>> {
        thread::spawn(move || {
            let backoff = Backoff::new();
            while !stop.load(Ordering::Acquire) {
                if d.run_once(|a: Args| a.key * 100 + who) == 0 {
                    backoff.snooze();
                } else {
                    backoff.reset();
                }
            }
            d
        })
    }

    fn run_daemon1(mut s: RingServer, stop: Arc<AtomicBool>) -> thread::JoinHandle<u64> {
        thread::spawn(move || {
            let backoff = Backoff::new();
            let mut served = 0;
            while !stop.load(Ordering::Acquire) {
                if s.poll() == 0 {
                    backoff.snooze();
                    continue;
                }
                while let Some(e) = s.recv() {
                    let token = e.token;
                    let a = Svc::decode_request(e.payload).expect("daemon 1: valid request");
                    served += 1;
                    let key = a.key;
                    if key == POISON {
                        s.reply(token, b"xyz").unwrap();
                    } else {
                        s.reply_with(token, |b| Svc::encode_response(&(key * 100 + WHO_R1D1), b))
                            .unwrap();
                    }
                }
                s.advance_tail();
            }
            served
        })
    }

    /// Issues every request of `reqs` through the ring client with up to `resp_depth` in
    /// flight; returns each request's response bytes, in request order.
    pub(crate) fn ring_calls(c: &mut RingClient, reqs: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let depth = c.info().resp_depth as usize;
        let mut slot_req = vec![usize::MAX; depth];
        let mut out: Vec<Option<Vec<u8>>> = vec![None; reqs.len()];
        let (mut next, mut done) = (0, 0);
        let t0 = Instant::now();
        while done < reqs.len() {
            while next < reqs.len() && c.in_flight() < depth {
                match c.try_call(&reqs[next]) {
                    Ok(slot) => {
                        slot_req[slot as usize] = next;
                        next += 1;
                    }
                    // The shared request ring is full (the delegate is behind), or the server
                    // skipped this client's slot because the thread stalled between reserving
                    // and committing (descheduled on a loaded machine): nothing was
                    // delivered, so poll and send the same request again.
                    Err(RingCallError::WouldBlock | RingCallError::Skipped) => break,
                    Err(e) => panic!("call {next}: {e:?}"),
                }
            }
            c.poll(|slot, resp| {
                let i = std::mem::replace(&mut slot_req[slot as usize], usize::MAX);
                assert_ne!(i, usize::MAX, "response on an idle slot {slot}");
                assert!(out[i].is_none(), "request {i} answered twice");
                out[i] = Some(resp.to_vec());
                done += 1;
            })
            .expect("poll");
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "stuck: {done} of {} answered",
                reqs.len()
            );
        }
        out.into_iter().map(Option::unwrap).collect()
    }

    pub(crate) fn encode(a: Args) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        let n = Svc::encode_request(&a, &mut b);
        b.truncate(n);
        b
    }

    pub(crate) fn status_of(resp: &[u8]) -> u16 {
        wire::read_header(resp).expect("a wire message").status
    }

    #[test]
    fn back_pressure_answers_every_request_once() {
        let s = setup(4096);
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = run_delegate(s.d0, WHO_R0, stop.clone());
        let t1 = run_delegate(s.d1, WHO_R1D0, stop.clone());
        let td = run_daemon1(s.daemon1, stop.clone());

        // 3000 requests, 64 in flight: mostly for rank 1 (both shards), some local.
        let args: Vec<Args> = (0..3000u64)
            .map(|key| Args {
                rank: u32::from(key % 8 != 0),
                key,
            })
            .collect();
        let reqs: Vec<Vec<u8>> = args.iter().map(|&a| encode(a)).collect();
        let mut c = RingClient::attach(&s.ring0).unwrap();
        let resps = ring_calls(&mut c, &reqs);
        for (a, r) in args.iter().zip(&resps) {
            let key = a.key;
            assert_eq!(Svc::decode_response(0, r), Ok(expected(*a)), "key {key}");
        }
        drop(c);
        stop.store(true, Ordering::Release);
        let (d0, d1, served1) = (t0.join().unwrap(), t1.join().unwrap(), td.join().unwrap());
        let (s0, s1) = (*d0.stats(), *d1.stats());
        let remote = args.iter().filter(|a| a.rank == 1).count() as u64;
        assert_eq!(s0.ring_local, 3000 - remote, "{s0:?}");
        assert_eq!(s0.forwarded, remote, "{s0:?}");
        assert_eq!(s0.responses, remote, "{s0:?}");
        assert!(s0.ring_full_retries > 0, "4 KiB rings never filled: {s0:?}");
        let odd = args
            .iter()
            .filter(|a| a.rank == 1 && a.key % 2 == 1)
            .count() as u64;
        assert_eq!(s1.remote_served, remote - odd, "{s1:?}");
        assert_eq!(s1.handed_off, odd, "{s1:?}");
        assert_eq!(s1.handoff_replies, odd, "{s1:?}");
        assert_eq!(served1, odd);
        assert!(
            s1.daemon_busy_waits > 0,
            "4 hand-off slots never ran out: {s1:?}"
        );
        for s in [s0, s1] {
            assert_eq!(
                (
                    s.bad_requests,
                    s.unroutable,
                    s.failed_calls,
                    s.corrupt_responses,
                    s.dropped_replies
                ),
                (0, 0, 0, 0, 0),
                "{s:?}"
            );
        }
    }

    /// Keys the raw handler of [`raw_delegate`] misbehaves on.
    const CLAIMS_TOO_MUCH: u64 = 1000;
    const UNDECODABLE: u64 = 1002;

    /// Runs `d` with `run_once_raw` until `stop`: `key * 100 + who`, written into the reply
    /// buffer; on the keys above it claims more bytes than the buffer holds, or fails to
    /// decode.
    fn raw_delegate(
        mut d: Delegate<Svc, RawRoute>,
        who: u64,
        stop: Arc<AtomicBool>,
    ) -> thread::JoinHandle<Delegate<Svc, RawRoute>> {
        thread::spawn(move || {
            let backoff = Backoff::new();
            let mut handler = |msg: &[u8], out: &mut [u8]| {
                let a = Svc::decode_request(msg)?;
                match a.key {
                    CLAIMS_TOO_MUCH => Ok(out.len() + 1),
                    UNDECODABLE => Err(WireError::BadValue { method_id: 0 }),
                    key => Ok(wire::encode(0, 0, &(key * 100 + who), out)),
                }
            };
            while !stop.load(Ordering::Acquire) {
                if d.run_once_raw(&mut handler) == 0 {
                    backoff.snooze();
                } else {
                    backoff.reset();
                }
            }
            d
        })
    }

    /// `run_once_raw` on both delegates: ring entries of the own shard and requests received
    /// over copyrpc are served in place, the others forwarded or handed off as by
    /// `run_once`; a reply that does not fit is answered `ResponseTooLarge` and counted in
    /// `oversized_responses`, a request that does not decode (to route it, or in the handler)
    /// with its status in `bad_requests`.
    #[test]
    fn run_once_raw_serves_in_place_and_answers_errors_with_statuses() {
        let route0: RawRoute = Box::new(|msg: &[u8]| {
            Svc::decode_request(msg).map(|a| Target {
                rank: a.rank,
                daemon: 0,
            })
        });
        let route1: RawRoute = Box::new(|msg: &[u8]| {
            Svc::decode_request(msg).map(|a| Target {
                rank: a.rank,
                daemon: (a.key % 2) as u32,
            })
        });
        let s = setup_with(1 << 16, route0, route1);
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = raw_delegate(s.d0, WHO_R0, stop.clone());
        let t1 = raw_delegate(s.d1, WHO_R1D0, stop.clone());
        let td = run_daemon1(s.daemon1, stop.clone());
        let mut garbage = encode(Args { rank: 0, key: 6 });
        garbage[0] = 0x7f; // unknown method id
        let mut reqs: Vec<Vec<u8>> = (0..200u64)
            .map(|key| {
                encode(Args {
                    rank: (key % 3 == 0) as u32,
                    key,
                })
            })
            .collect();
        for (rank, key) in [(0, CLAIMS_TOO_MUCH), (1, CLAIMS_TOO_MUCH), (1, UNDECODABLE)] {
            reqs.push(encode(Args { rank, key }));
        }
        reqs.push(garbage);
        let mut c = RingClient::attach(&s.ring0).unwrap();
        let r = ring_calls(&mut c, &reqs);
        for (key, r) in (0..200u64).zip(&r) {
            let a = Args {
                rank: (key % 3 == 0) as u32,
                key,
            };
            assert_eq!(Svc::decode_response(0, r), Ok(expected(a)), "key {key}");
        }
        let too_large = Status::ResponseTooLarge as u16;
        assert_eq!(status_of(&r[200]), too_large, "ring path");
        assert_eq!(
            status_of(&r[201]),
            too_large,
            "copyrpc path, forwarded back"
        );
        assert_eq!(status_of(&r[202]), Status::BadArguments as u16);
        assert_eq!(status_of(&r[203]), Status::UnknownMethod as u16);
        drop(c);
        stop.store(true, Ordering::Release);
        let (d0, d1) = (t0.join().unwrap(), t1.join().unwrap());
        td.join().unwrap();
        let (s0, s1) = (*d0.stats(), *d1.stats());
        let remote = (0..200u64).filter(|k| k % 3 == 0).count() as u64;
        let remote_even = (0..200u64).filter(|k| k % 3 == 0 && k % 2 == 0).count() as u64;
        assert_eq!(s0.ring_local, 200 - remote, "{s0:?}");
        assert_eq!(s0.forwarded, remote + 2, "{s0:?}");
        assert_eq!((s0.oversized_responses, s0.bad_requests), (1, 1), "{s0:?}");
        assert_eq!(s1.remote_served, remote_even, "{s1:?}");
        assert_eq!((s1.oversized_responses, s1.bad_requests), (1, 1), "{s1:?}");
        assert_eq!(s0.dropped_replies + s1.dropped_replies, 0);
    }

    #[test]
    fn bad_input_gets_error_statuses() {
        let mut s = setup(1 << 16);
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = run_delegate(s.d0, WHO_R0, stop.clone());
        let t1 = run_delegate(s.d1, WHO_R1D0, stop.clone());
        let td = run_daemon1(s.daemon1, stop.clone());

        // Through rank 0's ring: a rank that does not exist, garbage, a poisoned response,
        // and a good request on each path.
        let mut garbage = encode(Args { rank: 1, key: 5 });
        garbage[0] = 0x7f; // unknown method id
        let reqs = vec![
            encode(Args { rank: 7, key: 1 }),
            garbage,
            encode(Args {
                rank: 1,
                key: POISON,
            }),
            encode(Args { rank: 1, key: 4 }),
            encode(Args { rank: 1, key: 5 }),
            encode(Args { rank: 0, key: 6 }),
        ];
        let mut c = RingClient::attach(&s.ring0).unwrap();
        let r = ring_calls(&mut c, &reqs);
        assert_eq!(status_of(&r[0]), Status::Unreachable as u16);
        assert_eq!(status_of(&r[1]), Status::UnknownMethod as u16);
        assert_eq!(status_of(&r[2]), Status::BadForwardedResponse as u16);
        assert_eq!(Svc::decode_response(0, &r[3]), Ok(4 * 100 + WHO_R1D0));
        assert_eq!(Svc::decode_response(0, &r[4]), Ok(5 * 100 + WHO_R1D1));
        assert_eq!(Svc::decode_response(0, &r[5]), Ok(6 * 100 + WHO_R0));
        drop(c);

        // Directly to rank 1's delegate over copyrpc (seeds/004 §7 direct path): a request
        // for another rank, a truncated one, and good ones for both shards.
        let direct_reqs = [
            encode(Args { rank: 0, key: 1 }),
            vec![1, 2, 3],
            encode(Args { rank: 1, key: 10 }),
            encode(Args { rank: 1, key: 11 }),
        ];
        for (i, m) in direct_reqs.iter().enumerate() {
            s.direct.call(s.direct_ep, m, i as u32, 64).unwrap();
        }
        let mut got: Vec<Option<Vec<u8>>> = vec![None; direct_reqs.len()];
        let t = Instant::now();
        while got.iter().any(Option::is_none) {
            s.direct.poll(|i, r| {
                assert!(got[i as usize].is_none(), "answered twice");
                got[i as usize] = Some(r.expect("endpoint alive").to_vec());
            });
            assert!(t.elapsed() < Duration::from_secs(30), "direct calls stuck");
            thread::yield_now();
        }
        let got: Vec<Vec<u8>> = got.into_iter().map(Option::unwrap).collect();
        assert_eq!(status_of(&got[0]), Status::Unreachable as u16);
        assert_eq!(status_of(&got[1]), Status::Truncated as u16);
        assert_eq!(Svc::decode_response(0, &got[2]), Ok(10 * 100 + WHO_R1D0));
        assert_eq!(Svc::decode_response(0, &got[3]), Ok(11 * 100 + WHO_R1D1));

        stop.store(true, Ordering::Release);
        let (d0, d1) = (t0.join().unwrap(), t1.join().unwrap());
        td.join().unwrap();
        let (s0, s1) = (*d0.stats(), *d1.stats());
        assert_eq!((s0.unroutable, s0.bad_requests), (1, 1), "{s0:?}");
        assert_eq!(s0.corrupt_responses, 1, "{s0:?}");
        assert_eq!((s1.unroutable, s1.bad_requests), (1, 1), "{s1:?}");
        assert_eq!(s1.remote_served, 2, "{s1:?}"); // keys 4, 10
        assert_eq!(s1.handed_off, 3, "{s1:?}"); // keys POISON, 5, 11
        assert_eq!(s0.dropped_replies + s1.dropped_replies, 0);
    }

    /// A ring entry for the delegate's own rank is served only if it is for daemon 0: one for
    /// another daemon of the rank (which the ring's clients must call on that daemon's own
    /// ring, seeds/004 §4.4) or for a daemon that does not exist is answered with
    /// `Unreachable` and counted, never handed to the shard-0 handler.
    #[test]
    fn ring_entry_for_another_daemon_is_refused() {
        let fabric = Fabric::new(SimConfig::default());
        let dev = fabric.open();
        let ring_name = name("own-rank");
        let ring = DelegationServer::create(
            &ring_name,
            Svc::DESCRIPTOR,
            DelegationConfig {
                max_clients: 2,
                ring_depth: 8,
                resp_depth: 8,
                ..DelegationConfig::default()
            },
        )
        .unwrap();
        let ctx = Context::new(&dev, ContextConfig::default()).unwrap();
        // One rank, two daemons; key % 4 names the daemon (2 and 3 do not exist).
        let route: Route = Box::new(|a: &Args| Target {
            rank: a.rank,
            daemon: (a.key % 4) as u32,
        });
        let mut d = Delegate::<Svc, Route>::new(ring, ctx, 0, 1, 2, route).unwrap();
        let mut c = RingClient::attach(&ring_name).unwrap();
        let keys = [4u64, 5, 6, 7, u64::MAX, 8];
        let mut slot_key = [u64::MAX; 8];
        for &key in &keys {
            let slot = c.try_call(&encode(Args { rank: 0, key })).unwrap();
            slot_key[slot as usize] = key;
        }
        let mut served = Vec::new();
        let mut got = Vec::new();
        let t = Instant::now();
        while got.len() < keys.len() {
            assert!(t.elapsed() < Duration::from_secs(10), "stuck: {got:?}");
            d.run_once(|a: Args| {
                served.push(a.key);
                a.key * 100 + WHO_R0
            });
            c.poll(|slot, r| got.push((slot_key[slot as usize], r.to_vec())))
                .unwrap();
        }
        got.sort_by_key(|(k, _)| *k);
        for (key, r) in &got {
            if key % 4 == 0 {
                assert_eq!(Svc::decode_response(0, r), Ok(key * 100 + WHO_R0));
            } else {
                assert_eq!(status_of(r), Status::Unreachable as u16, "key {key}");
            }
        }
        assert_eq!(served, vec![4, 8], "only daemon 0's keys reach the handler");
        let s = *d.stats();
        assert_eq!((s.ring_local, s.unroutable), (2, 4), "{s:?}");
        assert_eq!(s.dropped_replies, 0);
    }

    /// A daemon that stops draining its ring (stopped, not dead) makes the delegate's Phase 1
    /// hand-off wait for a free response slot: the wait ends at the delegate's wait timeout
    /// with `Unreachable`, the delegate keeps serving, and once the daemon runs again the
    /// calls handed to it are answered.
    #[test]
    fn hand_off_wait_is_bounded() {
        let s = setup(1 << 16);
        let Setup {
            mut d1,
            daemon1,
            mut direct,
            direct_ep,
            ..
        } = s;
        d1.set_wait_timeout(Duration::from_millis(100));
        // Daemon 1 not running: its ring takes 4 hand-offs (4 response slots per client).
        let keys = [1u64, 3, 5, 7, 9, 2];
        for (i, &key) in keys.iter().enumerate() {
            direct
                .call(direct_ep, &encode(Args { rank: 1, key }), i as u32, 64)
                .unwrap();
        }
        let mut got: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        let t = Instant::now();
        // Key 9 waits, times out; key 2 (daemon 0) is served after it.
        while got[4].is_none() || got[5].is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "stuck: {:?}",
                d1.stats()
            );
            d1.run_once(|a: Args| a.key * 100 + WHO_R1D0);
            direct.poll(|i, r| got[i as usize] = Some(r.expect("endpoint alive").to_vec()));
        }
        let waited = t.elapsed();
        assert_eq!(
            status_of(got[4].as_ref().unwrap()),
            Status::Unreachable as u16
        );
        assert_eq!(
            Svc::decode_response(0, got[5].as_ref().unwrap()),
            Ok(2 * 100 + WHO_R1D0)
        );
        assert!(got[..4].iter().all(Option::is_none));
        let st = *d1.stats();
        assert_eq!((st.wait_timeouts, st.handed_off), (1, 4), "{st:?}");
        assert!(waited >= Duration::from_millis(100), "{waited:?}");
        // The daemon runs again: the four hand-offs are answered.
        let stop = Arc::new(AtomicBool::new(false));
        let td = run_daemon1(daemon1, stop.clone());
        while got[..4].iter().any(Option::is_none) {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "stuck: {:?}",
                d1.stats()
            );
            d1.run_once(|a: Args| a.key * 100 + WHO_R1D0);
            direct.poll(|i, r| got[i as usize] = Some(r.expect("endpoint alive").to_vec()));
        }
        stop.store(true, Ordering::Release);
        assert_eq!(td.join().unwrap(), 4);
        for (k, r) in keys[..4].iter().zip(&got) {
            assert_eq!(
                Svc::decode_response(0, r.as_ref().unwrap()),
                Ok(k * 100 + WHO_R1D1)
            );
        }
    }

    #[test]
    fn setup_errors() {
        let s = setup(4096);
        let mut d0 = s.d0;
        assert!(matches!(
            d0.set_peer(0, 0),
            Err(DelegateError::BadRank { .. })
        ));
        assert!(matches!(
            d0.set_peer(2, 0),
            Err(DelegateError::BadRank { .. })
        ));
        assert!(matches!(
            d0.set_peer(1, 9),
            Err(DelegateError::BadEndpoint(9))
        ));
        assert!(matches!(
            d0.attach_daemon(1, "nope"),
            Err(DelegateError::BadDaemon { .. })
        ));
    }
}

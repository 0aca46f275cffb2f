//! copyrpc as an RPC transport: [`Copyrpc`] (client) and [`CopyrpcServer`] implement
//! [`ClientTransport`](crate::client::ClientTransport)/[`ServerTransport`] on top of a copyrpc [`Context`] (seeds/001;
//! seeds/004 §3).
//!
//! # Messages
//! Each copyrpc request carries one [`crate::wire`] request message of at most the service's
//! `max_request_bytes`, and reserves response credit for one response message of at most its
//! method's `response_bytes` (the call's *response allowance*, seeds/004 §3.4 "call() 時の
//! クレジット消費": the largest response that method can return, known when the call is
//! sent; an error response is a bare header and always fits); the server writes its reply
//! into that allowance. A service whose methods return results of different sizes therefore
//! keeps more small calls in flight than its largest result would allow. The peer's ring
//! geometry and initial credit are checked against the service's largest sizes when the
//! client connects, so a connected client never sends a message the server cannot take.
//!
//! # Large messages (issue 15)
//! A message larger than the ring's inline limit ([`super::EndpointCore::max_payload`]:
//! `ring_size / 4 - 44` B with the default reservation, 262 100 B on 1 MiB rings) travels by
//! rendezvous up to [`EndpointConfig::max_large_message`] (default 8 MiB, both sides'
//! smaller value): the sender encodes it into a registered buffer of its endpoint and sends a
//! 16 B descriptor inline; the receiver RDMA-READs it into a buffer of its own and delivers
//! it as usual (see [`super::encoding`] for the wire format). A service is therefore refused
//! at connect only if a message exceeds that limit ([`RpcError::CapacityMismatch`] naming
//! `copyrpc EndpointConfig::max_large_message`), or, with `max_large_message: 0` or rings
//! too small for rendezvous (inline limit below 256 B), the inline limit (naming
//! `ring_size`, as before).
//!
//! Costs: a service whose largest messages fit inline runs exactly as before. For a service
//! whose largest request (response) exceeds the inline limit, every request (reply) is
//! encoded into a large-message buffer first, because its size is known only after
//! encoding; one that turns out to fit is copied into the ring (one extra copy of a small
//! message), the rest go by descriptor. Such a call reserves 4 KiB of response credit
//! instead of its largest response. Buffers are registered once per endpoint when first
//! needed and reused (at most [`EndpointConfig::large_buffers`] per direction); the
//! client's stash keeps `max_in_flight × max_response_bytes` bytes, so lower
//! [`CopyrpcAddr::max_in_flight`] for megabyte responses.
//!
//! A large request's buffer is reused only after the server reports it read (its next
//! batch), or once the endpoint failed (its buffers are deregistered, then unmapped). A call
//! that expires at the client stays pending in copyrpc until its response or the endpoint's
//! failure, so its buffer is never reused while the server may still read it. A server
//! that never reads (or never reports) holds at most `large_buffers` of the client's
//! buffers; further large calls get [`RpcError::WouldBlock`] until the call's deadline.
//!
//! # Connecting
//! copyrpc needs no handshake message: each side creates an endpoint and hands the peer its
//! [`EndpointInfo`] out of band (seeds/004 §3.8 "エンドポイント交換"). In one process the
//! out-of-band channel is a [`Listener`]: [`Copyrpc::connect`](crate::client::ClientTransport::connect) sends its info (carrying the
//! service's schema fingerprint) through the server's listener and waits for the server's;
//! [`CopyrpcServer::poll`] answers pending requests ([`CopyrpcServer::accept`]), refusing a
//! different fingerprint or a ring too small for the service. Across processes (MPI), exchange
//! [`EndpointInfo::to_bytes`] yourself and use [`Copyrpc::from_context`] and
//! [`CopyrpcServer::add_endpoint`].
//!
//! # Progress
//! Nothing is sent until the context is polled (seeds/004 §3.7 step 3: poll flushes every
//! endpoint). [`Copyrpc`] polls inside [`ClientTransport::poll`](crate::client::ClientTransport::poll) (which `Client` calls while it
//! waits) and when a call finds no credit or ring space. [`CopyrpcServer`] sends the replies
//! of one [`crate::Server::serve_once`] round at the end of that round
//! ([`ServerTransport::flush`]); replies given later through [`crate::Server::reply`] go out
//! at the next [`crate::Server::poll`] or [`crate::Server::flush`].
//!
//! # A server that disappears
//! An RC queue pair notices a dead peer only when it sends to it: the NIC retries `retry_cnt`
//! times, then completes the operation with a transport-retry-exceeded error, which fails the
//! endpoint; every pending call then ends with [`RpcError::ServerDisconnected`]. A client whose
//! requests were all delivered before the server died sends nothing more, so [`Copyrpc`]
//! probes: while calls are outstanding and no response arrived for
//! [`CopyrpcAddr::probe_interval`], it posts one 8-byte RDMA READ of the server's consumer
//! position (a word the server exposes for the seed's READ fallback anyway). On the software
//! device model, retries advance with progress steps (doorbells anywhere on the fabric); the
//! fabric's progress thread ([`mlx5::sim::SimConfig::progress_thread`], on by default) plays
//! the part of the NIC's retry timer.

use std::time::{Duration, Instant};

use mlx5::mem::DmaBuf;
use mlx5::verbs::{Access, Mr};
use mlx5::wqe::{RaddrSeg, Sge};

use super::context::{Context, ContextConfig, EndpointConfig, EndpointId, RecvHandle};
use super::endpoint::EndpointState;
use super::error::{CallError, CallErrorKind, ReplyError, SetupError};
use super::info::EndpointInfo;
use super::shared::{ClientContext, ContextGuard, ContextGuardMut, Handle, TOKEN_BITS};
use crate::error::{LimitSide, MessageKind, RpcError, sat_u32};
use crate::rc::rendezvous::{Inbox, Rendezvous, rendezvous};
use crate::server::ServerTransport;
use crate::service::{Service, ServiceDescriptor};

/// Default [`CopyrpcAddr::max_in_flight`]: calls one client can have outstanding, the shared
/// [`crate::client::DEFAULT_CALLS_IN_FLIGHT`] (32).
pub const DEFAULT_MAX_IN_FLIGHT: u32 = crate::client::DEFAULT_CALLS_IN_FLIGHT as u32;
/// Largest accepted `max_in_flight` (bounds the per-client response buffer).
pub const MAX_IN_FLIGHT_LIMIT: u32 = 1 << 16;
use crate::rc::client::{RcClient, Unsent};
use crate::rc::{self, liveness::ProbeClock};
pub use crate::rc::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_PROBE_INTERVAL};

pub use crate::rc::ConnectRefusal;

pub use crate::rc::RcSetupError;

/// Setting up a copyrpc client or server failed (beyond what [`RpcError`] names directly):
/// the RC transports' one setup error over copyrpc's [`SetupError`] (never
/// [`RcSetupError::Evicted`]).
pub type CopyrpcSetupError = RcSetupError<SetupError>;

impl rc::RcCore for SetupError {
    const TRANSPORT: &'static str = "copyrpc";

    fn schema_mismatch(&self) -> Option<(u64, u64)> {
        match *self {
            SetupError::SchemaMismatch { ours, theirs } => Some((ours, theirs)),
            _ => None,
        }
    }
}

/// In-process rendezvous through which clients connect to one [`CopyrpcServer`]
/// ([`CopyrpcServer::listener`]): a channel of connect requests plus a count of pending ones,
/// so that the server's poll costs one relaxed load while nobody connects.
///
/// Cheap to clone; `Send + Sync`. Across processes use an out-of-band exchange of
/// [`EndpointInfo`] instead (module docs).
#[derive(Clone, Debug)]
pub struct Listener {
    rv: Rendezvous<EndpointInfo, EndpointInfo, ConnectRefusal>,
}

impl Listener {
    /// Sends `info` (a created, unconnected endpoint; its fingerprint names the service) to
    /// the server and waits up to `timeout` for the server's endpoint info; connect to it
    /// with [`Context::connect`].
    ///
    /// # Errors
    /// [`CopyrpcSetupError::Refused`] (fingerprint or capacity, checked by the server);
    /// [`CopyrpcSetupError::Timeout`] if the server does not poll within `timeout`;
    /// [`CopyrpcSetupError::ServerGone`] if the server was dropped.
    pub fn exchange(
        &self,
        info: &EndpointInfo,
        timeout: Duration,
    ) -> Result<EndpointInfo, CopyrpcSetupError> {
        Ok(self.rv.exchange(*info, timeout)?)
    }

    /// Connect requests sent and not yet taken by the server.
    pub fn pending(&self) -> usize {
        self.rv.pending()
    }
}

/// Where and how a [`Copyrpc`] client connects: `KvClient::<Copyrpc>::connect(&addr)`.
#[derive(Clone, Debug)]
pub struct CopyrpcAddr {
    /// The device the client's context is created on (hardware or the software model).
    pub device: mlx5::verbs::Context,
    /// The server's rendezvous ([`CopyrpcServer::listener`]).
    pub listener: Listener,
    /// Sizing of the client's own context (one per client; default: seeds/001 constants).
    pub context: ContextConfig,
    /// Sizing of the client's endpoint (its `fingerprint` is replaced by the service's).
    /// Default: 1 MiB rings (seeds/001 `DEFAULT_RING_SIZE`). Use the server's ring size: each
    /// side announces a quarter of its ring as response credit, which must fit in a quarter of
    /// the smaller ring, so different sizes are refused unless `max_resp_reservation` lowers
    /// the larger side's credit.
    pub endpoint: EndpointConfig,
    /// Calls in flight at once (tokens `0..max_in_flight`), `1..=`[`MAX_IN_FLIGHT_LIMIT`];
    /// the client keeps `max_in_flight * max_response_bytes` bytes of response buffer.
    pub max_in_flight: u32,
    /// How long [`Copyrpc::connect`](crate::client::ClientTransport::connect) waits for the server's answer.
    pub timeout: Duration,
    /// With calls outstanding and no response for this long, probe the server with an RDMA
    /// READ so that a dead server is noticed (module docs). `None`: no probing.
    pub probe_interval: Option<Duration>,
    /// The context the client's endpoint is created in: `None` (the default) creates one of
    /// its own (sized by `context`); `Some` adds the endpoint to a [`ClientContext`] shared
    /// with the thread's other clients, whose polls then serve this one too (one completion
    /// queue pair per thread, seeds/001; [`super::shared`]).
    pub shared: Option<ClientContext>,
}

impl CopyrpcAddr {
    /// An address with the defaults: [`ContextConfig::default`], [`EndpointConfig::default`]
    /// (1 MiB rings), [`DEFAULT_MAX_IN_FLIGHT`], [`DEFAULT_CONNECT_TIMEOUT`],
    /// [`DEFAULT_PROBE_INTERVAL`].
    pub fn new(device: mlx5::verbs::Context, listener: Listener) -> Self {
        CopyrpcAddr {
            device,
            listener,
            context: ContextConfig::default(),
            endpoint: EndpointConfig::default(),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            timeout: DEFAULT_CONNECT_TIMEOUT,
            probe_interval: Some(DEFAULT_PROBE_INTERVAL),
            shared: None,
        }
    }
}

/// The liveness probe of a [`Copyrpc`] client. Field order is drop order: the registration
/// before the buffer it covers.
struct Probe {
    mr: Mr,
    _buf: DmaBuf,
    remote: RaddrSeg,
    clock: ProbeClock,
}

/// Client transport over one copyrpc endpoint, in a context of its own or in a
/// [`ClientContext`] shared with the thread's other clients (seeds/001 client side; module
/// docs; [`super::shared`]).
///
/// Tokens are a preallocated free list of `0..max_in_flight`; a call's copyrpc user data is
/// its token and the client's slot in the context. copyrpc delivers responses in batches
/// inside [`Context::poll`]; those beyond the `max` a [`ClientTransport::poll`](crate::client::ClientTransport::poll) asked for,
/// and those of the context's other clients, are copied into a preallocated per-token buffer
/// of their client and delivered first by its next poll. No allocation after construction.
pub struct Copyrpc {
    // Field order is drop order: the probe's registration before the context's PD.
    probe: Option<Probe>,
    ctx: Handle,
    /// This client's slot in the context (user data `slot << 16 | token`).
    slot: u32,
    ep: EndpointId,
    service: &'static ServiceDescriptor,
    max_req: u32,
    max_resp: u32,
    /// Response allowance of each method's calls, by method id: the method's
    /// `response_bytes` (module docs, "Messages").
    allowances: Box<[u32]>,
    max_in_flight: u32,
}

impl std::fmt::Debug for Copyrpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.ctx.get();
        let mut d = f.debug_struct("Copyrpc");
        d.field("service", &self.service.name)
            .field("ep", &self.ep)
            .field("slot", &self.slot)
            .field("state", &g.endpoint_state(self.ep))
            .field("max_in_flight", &self.max_in_flight);
        drop(g);
        d.finish_non_exhaustive()
    }
}

impl Drop for Copyrpc {
    /// Closes the client's slot: responses still arriving for it are dropped and counted
    /// ([`ClientContext::orphaned_responses`]).
    fn drop(&mut self) {
        let slot = self.slot;
        self.ctx.with(|s| s.close_slot(slot));
    }
}

impl Copyrpc {
    /// Wraps endpoint `ep` of `ctx`, already connected to a server of `service` through an
    /// exchange of [`EndpointInfo`] done by the caller (MPI bootstrap), with `max_in_flight`
    /// tokens. Checks what [`Copyrpc::connect`](crate::client::ClientTransport::connect) checks. No liveness probe (add one with
    /// [`Copyrpc::with_probe`]).
    ///
    /// # Errors
    /// [`RpcError::SchemaMismatch`] if the endpoint was created with another fingerprint;
    /// [`RpcError::CapacityMismatch`] if the rings cannot carry the service's largest request
    /// or response, or the server's initial credit does not cover one response;
    /// [`RpcError::Transport`] ([`CopyrpcSetupError::Config`]) for `max_in_flight` outside
    /// `1..=`[`MAX_IN_FLIGHT_LIMIT`] or an unknown or unconnected endpoint.
    pub fn from_context(
        ctx: Context<u32>,
        ep: EndpointId,
        service: &'static ServiceDescriptor,
        max_in_flight: u32,
    ) -> Result<Self, RpcError> {
        Self::check(&ctx, ep, service, max_in_flight)?;
        Self::in_slot(Handle::own(ctx), ep, service, max_in_flight)
    }

    /// Wraps endpoint `ep` of the shared context `ctx`, already connected to a server of
    /// `service` through an exchange of [`EndpointInfo`] done by the caller (create it with
    /// [`ClientContext::with`]), with `max_in_flight` tokens; the client rides on `ctx` with
    /// its other clients ([`super::shared`]). Checks what [`Copyrpc::from_context`] checks.
    ///
    /// # Errors
    /// As [`Copyrpc::from_context`], and [`RpcError::Transport`] ([`CopyrpcSetupError`])
    /// ([`CopyrpcSetupError::Config`]) once the context has served
    /// [`super::shared::MAX_CLIENTS_PER_CONTEXT`] clients.
    pub fn on(
        ctx: &ClientContext,
        ep: EndpointId,
        service: &'static ServiceDescriptor,
        max_in_flight: u32,
    ) -> Result<Self, RpcError> {
        ctx.with(|c| Self::check(c, ep, service, max_in_flight))?;
        Self::in_slot(Handle::shared(ctx), ep, service, max_in_flight)
    }

    /// Opens this client's slot in `ctx` and builds the transport.
    fn in_slot(
        mut ctx: Handle,
        ep: EndpointId,
        service: &'static ServiceDescriptor,
        max_in_flight: u32,
    ) -> Result<Self, RpcError> {
        let slot = ctx.with(|s| s.open_slot(max_in_flight, service.max_response_bytes))?;
        Ok(Copyrpc {
            probe: None,
            ctx,
            slot,
            ep,
            service,
            max_req: service.max_request_bytes as u32,
            max_resp: service.max_response_bytes as u32,
            allowances: (0..service.methods.len())
                .map(|id| sat_u32(service.max_reply_bytes(id as u16)))
                .collect(),
            max_in_flight,
        })
    }

    /// The checks of [`Copyrpc::from_context`].
    fn check(
        ctx: &Context<u32>,
        ep: EndpointId,
        service: &'static ServiceDescriptor,
        max_in_flight: u32,
    ) -> Result<(), RpcError> {
        if !(1..=MAX_IN_FLIGHT_LIMIT).contains(&max_in_flight) {
            return Err(CopyrpcSetupError::Config("max_in_flight must be in 1..=65536").into());
        }
        let (Some(core), Some(info)) = (ctx.endpoint(ep), ctx.local_info(ep)) else {
            return Err(CopyrpcSetupError::Config("no such endpoint").into());
        };
        if core.state() != EndpointState::Connected {
            return Err(CopyrpcSetupError::Config("the endpoint is not connected").into());
        }
        if info.fingerprint != service.fingerprint {
            return Err(RpcError::SchemaMismatch {
                service: service.name,
                expected: service.fingerprint,
                found: info.fingerprint,
            });
        }
        let inline = core.max_payload() as usize;
        let large = core.large_limit() as usize;
        // The negotiated capacity is the smaller ring's: the server's if it is below ours;
        // the large-message limit is the smaller of both sides' too.
        let (side, setting) = if large != 0 {
            let side = if core.large_limit() < info.max_large_message {
                LimitSide::PeerServer
            } else {
                LimitSide::ThisClient
            };
            (side, SETTING_LARGE)
        } else if core.capacity() < info.recv_ring_size {
            (LimitSide::PeerServer, SETTING_RING_SIZE)
        } else {
            (LimitSide::ThisClient, SETTING_RING_SIZE)
        };
        let max = inline.max(large) as u64;
        if let Some(gap) = rc::gap(service, max, max) {
            return Err(gap.error(service, side, setting, None));
        }
        let need = super::endpoint::call_credit_for(
            core.capacity(),
            core.max_payload(),
            core.large_limit(),
            service.max_response_bytes as u64,
        );
        if core.peer_credit() < need {
            return Err(RpcError::CapacityMismatch {
                service: service.name,
                what: MessageKind::Response,
                side: LimitSide::PeerServer,
                setting: SETTING_CREDIT,
                cap: sat_u32(core.peer_credit()),
                need: sat_u32(need),
                min: None,
            });
        }
        Ok(())
    }

    /// Adds the liveness probe (module docs): with calls outstanding and no response for
    /// `interval`, one RDMA READ of the 8-byte consumer position of `server` (the server
    /// endpoint's info, as exchanged).
    ///
    /// `server` must be the info the endpoint was connected with: a READ the server's NIC
    /// refuses (wrong rkey) fails the endpoint like a dead server.
    ///
    /// # Errors
    /// [`RpcError::Transport`] ([`CopyrpcSetupError`]) if the 8-byte landing buffer cannot be allocated or registered.
    pub fn with_probe(
        mut self,
        server: &EndpointInfo,
        interval: Duration,
    ) -> Result<Self, RpcError> {
        let buf = DmaBuf::with_normal_pages(64).map_err(SetupError::from)?;
        // SAFETY: `buf` is owned by the probe, which drops the registration first.
        let mr = unsafe {
            self.ctx
                .get_mut()
                .reg_mr(buf.as_mut_ptr(), 64, Access::LOCAL_WRITE)
        }?;
        let slot = self.slot as usize;
        let seen = self.ctx.with(|s| s.slots[slot].responses);
        self.probe = Some(Probe {
            mr,
            _buf: buf,
            remote: RaddrSeg {
                raddr: server.consumer_addr,
                rkey: server.consumer_rkey,
            },
            clock: ProbeClock::new(interval, Instant::now(), seen),
        });
        Ok(self)
    }

    /// The copyrpc context (counters: [`Context::stats`]; of every client on it if shared).
    /// Holds the [`ClientContext`]'s lock while the guard lives.
    pub fn context(&self) -> ContextGuard<'_> {
        self.ctx.get()
    }

    /// The copyrpc context, mutably (e.g. for raw RDMA operations, seeds/004 §3.9). Make no
    /// calls on it directly: a response whose user data names no client of the context is
    /// dropped as orphaned.
    pub fn context_mut(&mut self) -> ContextGuardMut<'_> {
        self.ctx.get_mut()
    }

    /// This client's slot in its context ([`super::shared`]; 0 for a context of its own).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The endpoint connected to the server.
    pub fn endpoint(&self) -> EndpointId {
        self.ep
    }

    /// The service this transport was connected for.
    pub fn service(&self) -> &'static ServiceDescriptor {
        self.service
    }
}

crate::rc::client::rc_client_transport!(Copyrpc, CopyrpcAddr);

impl RcClient for Copyrpc {
    type Refusal = CallError<u32>;
    type Addr = CopyrpcAddr;

    /// Creates a context of its own on `addr.device` (or uses `addr.shared`) with one
    /// endpoint carrying the service's fingerprint, exchanges endpoint info with the server
    /// through `addr.listener` (waiting up to `addr.timeout`), connects, and checks message
    /// sizes and credit ([`Copyrpc::from_context`]).
    ///
    /// # Errors
    /// [`RpcError::SchemaMismatch`] / [`RpcError::CapacityMismatch`] (the server's refusal or
    /// our own check); [`RpcError::ServerDisconnected`] if the server was dropped;
    /// [`RpcError::Transport`] ([`CopyrpcSetupError`]) for a timeout, a device error or a bad configuration.
    fn open(addr: &CopyrpcAddr, service: &'static ServiceDescriptor) -> Result<Self, RpcError> {
        if !(1..=MAX_IN_FLIGHT_LIMIT).contains(&addr.max_in_flight) {
            return Err(CopyrpcSetupError::Config("max_in_flight must be in 1..=65536").into());
        }
        check_endpoint_config(service, &addr.endpoint, LimitSide::ThisClient)?;
        let cfg = EndpointConfig {
            fingerprint: service.fingerprint,
            ..addr.endpoint
        };
        // The endpoint is created and connected apart from the exchange, so that a shared
        // context is not locked while the server answers.
        let exchange = |info: Option<EndpointInfo>| {
            let info = info.ok_or(CopyrpcSetupError::Config("no such endpoint"))?;
            addr.listener
                .exchange(&info, addr.timeout)
                .map_err(|e| rc::connect_error(e, service))
        };
        let (t, server) = match &addr.shared {
            None => {
                let mut ctx = Context::<u32>::new(&addr.device, addr.context)?;
                let ep = ctx.create_endpoint(&cfg)?;
                let server = exchange(ctx.local_info(ep))?;
                ctx.connect(ep, &server)
                    .map_err(|e| rc::core_error(e, service))?;
                let t = Copyrpc::from_context(ctx, ep, service, addr.max_in_flight)?;
                (t, server)
            }
            Some(shared) => {
                let (ep, info) =
                    shared.with(|c| c.create_endpoint(&cfg).map(|ep| (ep, c.local_info(ep))))?;
                let server = exchange(info)?;
                shared
                    .with(|c| c.connect(ep, &server))
                    .map_err(|e| rc::core_error(e, service))?;
                (
                    Copyrpc::on(shared, ep, service, addr.max_in_flight)?,
                    server,
                )
            }
        };
        match addr.probe_interval {
            Some(i) => t.with_probe(&server, i),
            None => Ok(t),
        }
    }

    #[inline]
    fn tokens(&self) -> usize {
        self.max_in_flight as usize
    }

    /// Takes a token of this client's slot and writes the request into the send ring with
    /// the method's response allowance.
    #[inline(always)]
    fn issue(
        &mut self,
        method_id: u16,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, Unsent<CallError<u32>>> {
        // The method's largest response (an unknown id, which the typed client never sends,
        // gets the service's).
        let allowance = self
            .allowances
            .get(usize::from(method_id))
            .copied()
            .unwrap_or(self.max_resp);
        let (me, ep, max_req) = (self.slot, self.ep, self.max_req);
        self.ctx.with(|s| {
            let Some(tok) = s.slots[me as usize].tokens.take() else {
                return Err(Unsent::NoToken);
            };
            let user = me << TOKEN_BITS | tok;
            match s.ctx.call_with(ep, max_req, user, allowance, encode) {
                Ok(_) => Ok(tok),
                Err(e) => Err(Unsent::Refused(e)),
            }
        })
    }

    /// The slot's stashed responses first, then one poll of the context (which also sends
    /// what was written, and stashes the responses of the context's other clients).
    #[inline(always)]
    fn deliver(&mut self, on_response: &mut impl FnMut(u32, &[u8])) -> usize {
        let me = self.slot;
        self.ctx.with(|s| {
            let mut n = 0;
            let tokens = &mut s.slots[me as usize].tokens;
            if tokens.stashed() != 0 {
                n = tokens.drain(on_response);
            }
            n + s.pump(me, true, on_response)
        })
    }

    fn progress(&mut self) {
        let me = self.slot;
        self.ctx.with(|s| s.pump(me, false, &mut |_, _| {}));
    }

    /// Whether the endpoint of this client failed (the server is gone or sent garbage),
    /// and whether it has calls in flight.
    #[inline(always)]
    fn state(&mut self) -> (bool, bool) {
        let (ep, slot, mif) = (self.ep, self.slot as usize, self.max_in_flight as usize);
        self.ctx.with(|s| {
            let failed = !matches!(s.ctx.endpoint_state(ep), Some(EndpointState::Connected));
            (failed, s.slots[slot].tokens.free() < mif)
        })
    }

    #[cold]
    fn failed_error(&mut self) -> RpcError {
        RpcError::ServerDisconnected
    }

    fn refusal_error(&mut self, e: &CallError<u32>) -> RpcError {
        match e.kind {
            CallErrorKind::InsufficientCredit | CallErrorKind::RingFull => RpcError::WouldBlock,
            CallErrorKind::MessageTooLarge => {
                let ep = self.ep;
                RpcError::MessageTooLarge {
                    len: self.max_req as usize,
                    cap: self.ctx.with(|s| {
                        s.ctx.endpoint(ep).map_or(0, |c| {
                            (c.max_payload() as usize).max(c.large_limit() as usize)
                        })
                    }),
                    setting: SETTING_LARGE,
                }
            }
            CallErrorKind::NotConnected | CallErrorKind::Failed => RpcError::ServerDisconnected,
        }
    }

    fn give_back(&mut self, e: CallError<u32>) {
        let me = self.slot as usize;
        self.ctx.with(|s| {
            s.slots[me]
                .tokens
                .give_back(e.into_inner() & super::shared::TOKEN_MASK)
        });
    }

    #[inline(always)]
    fn probe_clock(&mut self) -> Option<&mut ProbeClock> {
        self.probe.as_mut().map(|p| &mut p.clock)
    }

    fn responses(&mut self) -> u64 {
        let slot = self.slot as usize;
        self.ctx.with(|s| s.slots[slot].responses)
    }

    /// One RDMA READ of the server's consumer word, unless a raw operation is in flight.
    fn send_probe(&mut self) {
        let Some(p) = &self.probe else { return };
        let ep = self.ep;
        self.ctx.with(|s| {
            // One raw operation at a time per context (in a shared context, another client's
            // probe may be in flight: this one follows at a later check).
            if s.ctx.raw_rdma_pending() == 0 {
                let local = Sge {
                    addr: p.mr.addr,
                    len: 8,
                    lkey: p.mr.lkey,
                };
                // Send queue full: the endpoint is busy sending, which detects a dead peer
                // too.
                // SAFETY: the probe's 8-byte landing buffer (`p.mr`) is never read, and it
                // outlives the context's QPs (the probe is dropped first, field order, after
                // its READ is no longer pending or the context is gone).
                let _ = unsafe { s.ctx.post_rdma_read(ep, local, p.remote) };
            }
        });
    }
}

/// Server transport over a copyrpc context of its own: one endpoint per connected client, all
/// sharing the context's SRQ and CQs (seeds/001 "Context"; module docs).
///
/// `ReplyToken` is [`RecvHandle`]; a handle answers exactly one request, once.
pub struct CopyrpcServer {
    ctx: Context<()>,
    inbox: Inbox<EndpointInfo, EndpointInfo, ConnectRefusal>,
    listener: Listener,
    service: &'static ServiceDescriptor,
    endpoint: EndpointConfig,
}

impl std::fmt::Debug for CopyrpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyrpcServer")
            .field("service", &self.service.name)
            .field("endpoints", &self.ctx.num_endpoints())
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl CopyrpcServer {
    /// Creates a server of `service` on `device`: a context sized by `context`, endpoints
    /// created from `endpoint` (its `fingerprint` is replaced by the service's) as clients
    /// connect.
    ///
    /// # Errors
    /// [`RpcError::CapacityMismatch`] if rings of `endpoint.ring_size` cannot carry the
    /// service's largest request or response, or its credit (`max_resp_reservation`) does not
    /// cover one response; [`RpcError::Transport`] ([`CopyrpcSetupError`]) for a ring size that is not a power of two
    /// `>= 1 KiB` or a device error.
    pub fn new(
        device: &mlx5::verbs::Context,
        service: &'static ServiceDescriptor,
        context: ContextConfig,
        endpoint: EndpointConfig,
    ) -> Result<Self, RpcError> {
        let ring = endpoint.ring_size as u64;
        if !ring.is_power_of_two() || ring < 1024 {
            return Err(CopyrpcSetupError::Config(
                "ring_size must be a power of two >= 1024 bytes",
            )
            .into());
        }
        check_endpoint_config(service, &endpoint, LimitSide::ThisServer)?;
        let ctx = Context::new(device, context)?;
        let (rv, inbox) = rendezvous();
        Ok(CopyrpcServer {
            ctx,
            inbox,
            listener: Listener { rv },
            service,
            endpoint: EndpointConfig {
                fingerprint: service.fingerprint,
                ..endpoint
            },
        })
    }

    /// [`CopyrpcServer::new`] for service `S`, wrapped in a typed [`crate::Server`].
    ///
    /// # Errors
    /// As [`CopyrpcServer::new`].
    pub fn serve<S: Service>(
        device: &mlx5::verbs::Context,
        context: ContextConfig,
        endpoint: EndpointConfig,
    ) -> Result<crate::Server<S, Self>, RpcError> {
        Ok(crate::Server::new(Self::new(
            device,
            S::DESCRIPTOR,
            context,
            endpoint,
        )?))
    }

    /// The rendezvous clients connect through (put it in a [`CopyrpcAddr`]).
    pub fn listener(&self) -> Listener {
        self.listener.clone()
    }

    /// Answers every pending connect request (done by [`ServerTransport::poll`] whenever some
    /// are pending): refuses another fingerprint or a ring that cannot carry the service,
    /// else creates an endpoint, connects it to the client and sends back its info. Returns
    /// how many clients were connected.
    ///
    /// A request whose client stopped waiting (timeout) still gets an endpoint, which stays
    /// idle: the context cannot remove endpoints.
    pub fn accept(&mut self) -> usize {
        rc::accept(self)
    }

    /// Creates an endpoint for the client described by `client` (exchanged out of band, e.g.
    /// through MPI) and connects it; returns the endpoint and the info to send back to the
    /// client, which then connects with [`Context::connect`] and [`Copyrpc::from_context`].
    ///
    /// # Errors
    /// [`RpcError::SchemaMismatch`] if the client's fingerprint is not the service's;
    /// [`RpcError::CapacityMismatch`] if the negotiated ring (the smaller of the two) cannot
    /// carry the service's messages or the credit this server announces; [`RpcError::Transport`] ([`CopyrpcSetupError`])
    /// for unusable ring parameters (e.g. a client ring larger than ours, whose credit our ring
    /// cannot take) or a device error. Only a device error or a connect failure after these
    /// checks leaves an endpoint behind (unused: the context cannot remove endpoints).
    pub fn add_endpoint(
        &mut self,
        client: &EndpointInfo,
    ) -> Result<(EndpointId, EndpointInfo), RpcError> {
        if client.fingerprint != self.service.fingerprint {
            return Err(RpcError::SchemaMismatch {
                service: self.service.name,
                expected: self.service.fingerprint,
                found: client.fingerprint,
            });
        }
        if !client.recv_ring_size.is_power_of_two() || client.recv_ring_size < 1024 {
            return Err(SetupError::Protocol(super::ProtocolError::BadEndpointInfo(
                "receive ring size",
            ))
            .into());
        }
        // Requests travel client send ring (same size as its receive ring) → our receive
        // ring; responses our send ring → the client's receive ring.
        let ours = self.endpoint.ring_size as u64;
        let cap = client.recv_ring_size.min(ours);
        // The checks `Context::connect` makes on credit (seeds/004 §3.4: a grant never
        // exceeds a quarter of the capacity), made before an endpoint exists, so that rings
        // of different sizes are refused without leaving an unusable endpoint behind.
        let our_credit = initial_credit(&self.endpoint);
        if our_credit > cap / 4 {
            // Only a client ring smaller than ours gets here (our credit is at most a
            // quarter of our ring).
            return Err(RpcError::CapacityMismatch {
                service: self.service.name,
                what: MessageKind::Response,
                side: LimitSide::PeerClient,
                setting: SETTING_RING_SIZE,
                cap: sat_u32(cap / 4),
                need: sat_u32(our_credit),
                min: Some(ours),
            });
        }
        if client.initial_credit > ours / 4 || !client.initial_credit.is_multiple_of(32) {
            return Err(SetupError::Protocol(super::ProtocolError::BadEndpointInfo(
                "the client's initial credit exceeds a quarter of the server's ring \
                 (ring sizes differ?) or is not 32-byte aligned",
            ))
            .into());
        }
        let our_large = self.endpoint.max_large_message;
        let large = our_large.min(client.max_large_message);
        if let Some(gap) = capacity_gap(
            self.service,
            cap,
            client.initial_credit,
            max_resp_of(&self.endpoint),
            large,
        ) {
            let (side, min) = if gap.setting == SETTING_LARGE {
                if client.max_large_message < our_large {
                    (LimitSide::PeerClient, Some(gap.gap.need as u64))
                } else {
                    (LimitSide::ThisServer, Some(gap.gap.need as u64))
                }
            } else if client.recv_ring_size < ours {
                (LimitSide::PeerClient, Some(ours))
            } else {
                (
                    LimitSide::ThisServer,
                    min_ring_size(self.service, &self.endpoint),
                )
            };
            return Err(gap.gap.error(self.service, side, gap.setting, min));
        }
        let ep = self.ctx.create_endpoint(&self.endpoint)?;
        self.ctx
            .connect(ep, client)
            .map_err(|e| rc::core_error(e, self.service))?;
        let info = self
            .ctx
            .local_info(ep)
            .ok_or(CopyrpcSetupError::Config("no such endpoint"))?;
        Ok((ep, info))
    }

    /// The copyrpc context (counters: [`Context::stats`]).
    pub fn context(&self) -> &Context<()> {
        &self.ctx
    }

    /// The copyrpc context, mutably (e.g. to create and connect endpoints for a symmetric
    /// out-of-band exchange; give them [`CopyrpcServer::endpoint_config`]).
    pub fn context_mut(&mut self) -> &mut Context<()> {
        &mut self.ctx
    }

    /// The configuration endpoints are created with (fingerprint set to the service's).
    pub fn endpoint_config(&self) -> &EndpointConfig {
        &self.endpoint
    }

    /// The service served.
    pub fn service(&self) -> &'static ServiceDescriptor {
        self.service
    }
}

/// [`RpcError::CapacityMismatch::setting`] for a ring too small.
const SETTING_RING_SIZE: &str = "copyrpc EndpointConfig::ring_size";
/// [`RpcError::CapacityMismatch::setting`] for a message beyond the large-message limit
/// (issue 15: messages beyond the ring's inline limit go by rendezvous up to it).
const SETTING_LARGE: &str = "copyrpc EndpointConfig::max_large_message";
/// [`RpcError::CapacityMismatch::setting`] for response credit too small.
const SETTING_CREDIT: &str =
    "copyrpc EndpointConfig::max_resp_reservation (credit: at most ring_size / 4)";

/// Checks that an endpoint created from `cfg` (this process's, on `side`) can carry the
/// service's largest request and response and announces enough credit for one response,
/// before anything is created. The error names the setting to change and its least working
/// value: the smallest power-of-two `ring_size` that passes every check
/// ([`min_ring_size`]; with the default reservation, the payload cap is about
/// `ring_size / 4 - 44` B), or, when a `max_resp_reservation` that is too small is what
/// limits the credit, that reservation.
fn check_endpoint_config(
    service: &'static ServiceDescriptor,
    cfg: &EndpointConfig,
    side: LimitSide,
) -> Result<(), RpcError> {
    let ring = cfg.ring_size as u64;
    let max_resp = max_resp_of(cfg);
    if let Some(gap) = capacity_gap(service, ring, max_resp, max_resp, cfg.max_large_message) {
        let min = if gap.setting == SETTING_LARGE {
            Some(gap.gap.need as u64)
        } else {
            min_ring_size(service, cfg)
        };
        return Err(gap.gap.error(service, side, gap.setting, min));
    }
    let credit = initial_credit(cfg);
    let need = call_credit(service, ring, max_resp, cfg.max_large_message);
    if credit < need {
        // The credit is min(max_resp_reservation, ring / 4): name whichever limits it.
        let (setting, min) = match cfg.max_resp_reservation {
            Some(r) if r < ring / 4 => (SETTING_CREDIT, Some(need.next_multiple_of(32))),
            _ => (SETTING_RING_SIZE, min_ring_size(service, cfg)),
        };
        return Err(RpcError::CapacityMismatch {
            service: service.name,
            what: MessageKind::Response,
            side,
            setting,
            cap: sat_u32(credit),
            need: sat_u32(need),
            min,
        });
    }
    Ok(())
}

/// The smallest power-of-two ring size (at least 1 KiB, the core's minimum) with which an
/// endpoint otherwise configured as `cfg` carries the service's messages and credit; `None`
/// if none up to 2^40 B does (a `max_resp_reservation` too small for one response).
fn min_ring_size(service: &'static ServiceDescriptor, cfg: &EndpointConfig) -> Option<u64> {
    (10..=40).map(|k| 1u64 << k).find(|&ring| {
        let c = EndpointConfig {
            ring_size: ring as usize,
            ..*cfg
        };
        let max_resp = max_resp_of(&c);
        capacity_gap(service, ring, max_resp, max_resp, c.max_large_message).is_none()
            && initial_credit(&c) >= call_credit(service, ring, max_resp, c.max_large_message)
    })
}

/// Credit one call of the service reserves on rings of capacity `cap` whose caller grants at
/// most `client_max_resp`, with large-message limit `large` (both sides' smaller):
/// [`super::endpoint::call_credit_for`] as the client's core computes it.
fn call_credit(
    service: &'static ServiceDescriptor,
    cap: u64,
    client_max_resp: u64,
    large: u32,
) -> u64 {
    let inline = super::endpoint::max_payload_for(cap, client_max_resp);
    super::endpoint::call_credit_for(
        cap,
        inline,
        super::endpoint::large_limit_for(inline, large),
        service.max_response_bytes as u64,
    )
}

/// A message kind the rings do not carry ([`capacity_gap`]), and the setting that limits
/// it: the ring size, or the large-message limit once rendezvous is possible.
struct Gap {
    gap: rc::Gap,
    setting: &'static str,
}

/// Whether rings of capacity `cap` carry the service's largest messages, with the same
/// limit the sending core enforces ([`super::endpoint::max_payload_for`]): requests are sent
/// by a client granting `client_max_resp`, responses by a server granting `server_max_resp`.
/// Returns the first message kind that does not fit, with the largest payload the rings
/// carry and the bytes needed.
fn capacity_gap(
    service: &'static ServiceDescriptor,
    cap: u64,
    client_max_resp: u64,
    server_max_resp: u64,
    large: u32,
) -> Option<Gap> {
    // The largest payload a side granting `max_resp` sends, and the setting that limits it.
    let carried = |max_resp: u64| {
        let inline = super::endpoint::max_payload_for(cap, max_resp);
        let large = super::endpoint::large_limit_for(inline, large);
        let setting = if large != 0 {
            SETTING_LARGE
        } else {
            SETTING_RING_SIZE
        };
        (u64::from(inline.max(large)), setting)
    };
    let (request, request_setting) = carried(client_max_resp);
    let (response, response_setting) = carried(server_max_resp);
    let gap = rc::gap(service, request, response)?;
    Some(Gap {
        gap,
        setting: match gap.what {
            MessageKind::Request => request_setting,
            MessageKind::Response => response_setting,
        },
    })
}

/// Response credit an endpoint of `cfg` announces: `min(max_resp_reservation, ring / 4)`,
/// 32-byte aligned (mirrors [`super::EndpointCore::initial_credit`]; seeds/001 "初期クレジット
/// 設計").
/// The most credit an endpoint created from `cfg` grants (as `EndpointCore::new` sets it).
fn max_resp_of(cfg: &EndpointConfig) -> u64 {
    let ring = cfg.ring_size as u64;
    initial_credit(cfg).max(cfg.max_resp_reservation.unwrap_or(ring / 4) & !31)
}

fn initial_credit(cfg: &EndpointConfig) -> u64 {
    let ring = cfg.ring_size as u64;
    cfg.max_resp_reservation.unwrap_or(ring / 4).min(ring / 4) & !31
}

impl rc::Admit for CopyrpcServer {
    type Request = EndpointInfo;
    type Answer = EndpointInfo;
    const TRANSPORT: &'static str = "copyrpc";

    fn inbox(&mut self) -> &mut Inbox<EndpointInfo, EndpointInfo, ConnectRefusal> {
        &mut self.inbox
    }

    fn service_name(&self) -> &'static str {
        self.service.name
    }

    /// [`CopyrpcServer::add_endpoint`]; its error as the client learns it.
    fn admit(&mut self, client: &EndpointInfo) -> Result<EndpointInfo, ConnectRefusal> {
        self.add_endpoint(client)
            .map(|(_, info)| info)
            .map_err(rc::refusal)
    }
}

impl ServerTransport for CopyrpcServer {
    type ReplyToken = RecvHandle;

    /// Answers pending connect requests (one relaxed load when there are none), then polls
    /// the context (a server context issues no calls, so no responses arrive; the poll
    /// parses requests and sends replies written since the last poll). Returns the requests
    /// available to `recv`.
    #[inline]
    fn poll(&mut self) -> usize {
        if self.inbox.has_pending() {
            self.accept();
        }
        self.ctx.poll(|_, _| {});
        self.ctx.pending_requests()
    }

    #[inline]
    fn recv(&mut self) -> Option<(RecvHandle, &[u8])> {
        self.ctx.recv()
    }

    /// Writes the reply of `len` bytes into the client's endpoint; it is sent by the next
    /// poll or flush.
    ///
    /// # Errors
    /// [`RpcError::ReplyDropped`] if the client's endpoint failed (client gone), the handle
    /// names no endpoint, or the client's allowance is smaller than `len` (a client that is
    /// not a [`Copyrpc`] of this service, or one that reserved for another method).
    #[inline]
    fn reply(
        &mut self,
        token: RecvHandle,
        len: usize,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), RpcError> {
        self.ctx
            .reply_with(token, sat_u32(len as u64), encode)
            .map_err(reply_error)
    }

    /// Frees the large-message landing buffers of requests received so far (issue 15; also
    /// done by the next poll; copyrpc releases a request's ring space when `recv` hands it
    /// out, and the credit return rides on the next batch sent to that client, seeds/004
    /// §3.4), then sends the replies written so far (one WRITE+IMM per client with
    /// replies): [`Context::flush`], which posts the dirty endpoints' batches without
    /// polling the completion queues again (the round's `poll` did; the next one will).
    #[inline]
    fn flush(&mut self) {
        self.ctx.release_large();
        self.ctx.flush();
    }

    /// Zero copy both ways ([`Context::serve_next_sized`]): `handle` reads the request in
    /// place in the endpoint's receive ring (or in the landing buffer of a request read by
    /// rendezvous) and writes the reply straight into the send ring, with a reply buffer of
    /// the request's method's largest reply ([`ServiceDescriptor::max_reply_bytes`] of the
    /// method id in its header; a header-only error status for a request too short to name
    /// one), which is what the client's allowance covers (module docs, "Messages"). The
    /// request's ring space is released (credit returned with the next batch, seeds/004
    /// §3.4) only after `handle` returned.
    ///
    /// For a service whose largest response exceeds the ring's inline limit, the caller
    /// accepts a rendezvous response and `handle` writes into a large-message send buffer;
    /// a reply that turns out to fit inline is then copied into the ring (one copy, as
    /// [`ServerTransport::reply`] does), a larger one is sent by descriptor without a copy.
    /// If the reply cannot be written (the errors of [`ServerTransport::reply`]), `handle`
    /// still runs, with `scratch` as its reply buffer, and the reply is dropped, as with
    /// `recv` followed by a failing `reply`.
    #[inline]
    fn serve_next(
        &mut self,
        scratch: &mut [u8],
        handle: impl FnOnce(&[u8], &mut [u8]) -> usize,
    ) -> Option<Result<(), RpcError>> {
        let service = self.service;
        self.ctx
            .serve_next_sized(
                |req| {
                    let id = req
                        .get(..2)
                        .map_or(u16::MAX, |b| u16::from_le_bytes([b[0], b[1]]));
                    sat_u32(service.max_reply_bytes(id) as u64)
                },
                scratch,
                handle,
            )
            .map(|r| r.map_err(reply_error))
    }
}

#[cold]
fn reply_error(e: ReplyError) -> RpcError {
    RpcError::ReplyDropped(match e {
        ReplyError::TooLarge { .. } => "the caller's response allowance is too small",
        ReplyError::Failed => "the client's endpoint failed or the token names no endpoint",
        ReplyError::Stale => "the request was already answered (stale token)",
        ReplyError::NoLargeBuffer => {
            "every large-message buffer holds a response the client has not read yet"
        }
    })
}

//! ScaleRPC as an RPC transport: [`ScaleRpc`] (client) and [`ScaleRpcServer`] implement
//! [`ClientTransport`](crate::client::ClientTransport)/[`ServerTransport`] on top of a [`ScaleClient`] with one connection and
//! a [`ScaleServer`] (seeds/003).
//!
//! # Messages
//! A call writes one [`crate::wire`] request message of at most the service's
//! `max_request_bytes` into the server's pool slot its connection is mapped to; the reply (at
//! most `max_response_bytes`) comes back in the client's response slot. By default
//! ([`ServerConfig::slot_size`] `None`) [`ScaleRpcServer::new`] sizes the slots from the
//! service: the smallest multiple of 64 B that carries its largest request and response
//! ([`derive_slot_size`]). A slot size given explicitly is checked against the service when
//! the server is created, and the server's slots again when a client connects; the client's
//! slots must be at least as large and as many as the server's (the core's rule: a response
//! may fill a server slot), which [`ScaleRpcAddr::new`] and [`ScaleRpc::connect`](crate::client::ClientTransport::connect) arrange by
//! taking the server's.
//!
//! # Limits and memory
//! Calls in flight: [`ServerConfig::slots_per_conn`] (default 33) minus the slot kept for the
//! liveness probe, i.e. the shared [`crate::client::DEFAULT_CALLS_IN_FLIGHT`] (32). The
//! server's pool is registered memory of up to `max_conns × slots_per_conn × slot_size` bytes
//! (twice that when the connections form more than one group: [`ServerConfig`]'s "Memory and
//! scan cost"); each client registers `2 × slots_per_conn × slot_size` bytes (response and
//! staging slots).
//!
//! # Connecting
//! In one process clients connect through the server's [`Listener`]: [`ScaleRpc::connect`](crate::client::ClientTransport::connect)
//! creates a client context with one connection, sends its [`ClientConnInfo`] (carrying the
//! service's schema fingerprint and the client's slot geometry) and waits for the server's
//! [`ServerConnInfo`]; [`ScaleRpcServer::poll`](ServerTransport::poll) answers pending
//! requests ([`ScaleRpcServer::accept`]), refusing another fingerprint or slots smaller than
//! its own before it creates anything. Across processes (MPI), exchange the infos yourself:
//! [`ScaleRpcServer::add_client`] on the server, [`ScaleClient::connect`] and
//! [`ScaleRpc::from_client`] on the client.
//!
//! # Scheduling and back-pressure
//! The server serves one *group* of connections per time slice (connection grouping,
//! [`super::sched`]). A connection whose group is not scheduled cannot issue: [`ScaleRpc`]'s
//! `send` then returns [`RpcError::WouldBlock`], as it does when every slot of the connection
//! has a call outstanding. Blocking calls wait this out by themselves; a pipelined caller
//! polls and retries. With `n` groups a client may wait up to about `(n - 1)` slices (plus
//! warm-up extensions while the other bank drains) before its group comes round again; with
//! one group (fewer connections than the group size, [`ServerConfig::group_size`]; derived
//! from the NIC's QP-context cache by default, 400 on the default device model) it never
//! waits for the schedule.
//!
//! **Ordering.** Calls outstanding together on one connection sit in different slots, which
//! the server scans in slot order: two such calls may execute in either order (copyrpc and
//! the delegation ring execute one client's calls in issue order). A caller that needs order
//! between two calls waits for the first one's response before issuing the second.
//!
//! # Progress
//! Requests are written when issued and sent when the doorbell batch fills
//! ([`super::DOORBELL_BATCH_SIZE`]) or at the next poll, which [`crate::Client`] makes while
//! it waits. The server sends the replies of one [`crate::Server::serve_once`] round at the
//! end of that round ([`ServerTransport::flush`]); replies given later through
//! [`crate::Server::reply`] go out at the next poll or flush.
//!
//! **Idle clients.** A stopped client acknowledges (so that its group's bank can be reused)
//! only when it polls, and [`crate::Client`] polls only while calls are in flight. With more
//! than one group, a client that neither calls nor polls for [`ServerConfig::ack_timeout`]
//! after its group was stopped holds up the next switch until then, and is evicted: the
//! server tells it, and its calls then fail with [`ScaleRpcSetupError::Evicted`] (inside
//! [`RpcError::Transport`]); connect again. A client that pauses while others
//! run should poll its transport now and then (`client.transport_mut().poll(
//! |_, _| {})` with nothing in flight delivers nothing) or be dropped (dropping polls once
//! more, acknowledging a pending stop). For the same reason, keep the ack timeout above the
//! longest time a handler defers a reply.
//! [`ScaleRpc`] processes the server's notices before each call it makes with nothing
//! outstanding, so that a client idle since its last call does not act on a stale schedule.
//!
//! # A server that disappears
//! An RC connection notices a dead peer only when it sends to it (the NIC retries, then fails
//! the operation with transport-retry-exceeded; on the software device model retries advance
//! with progress steps, see [`mlx5::sim::SimConfig::progress_thread`]). A call issued after
//! the server died therefore fails the connection, and every pending call ends with
//! [`RpcError::ServerDisconnected`]. Two other cases are covered by [`ScaleRpc`]:
//! - *Calls outstanding, the server died after taking them.* With
//!   [`ScaleRpcAddr::probe_interval`], one slot of the connection is kept for a liveness probe:
//!   while calls are outstanding and no response arrived for the interval, the client sends
//!   an empty request, which [`ScaleRpcServer`] answers itself (never handing it to the
//!   service); a dead server fails its WRITE. A probe needs the connection to be active; a
//!   client stopped with calls outstanding is not probed.
//! - *Not scheduled any more.* With [`ScaleRpcAddr::activation_timeout`], a client that keeps
//!   trying to call while its connection stays inactive for that long reports
//!   [`RpcError::ServerDisconnected`]: the server is gone (a server that evicts a client
//!   tells it: [`ScaleRpcSetupError::Evicted`] at once).
//!
//! # Disconnecting
//! Dropping a [`ScaleRpc`] says goodbye ([`ScaleClient::disconnect`]) and waits up to
//! [`DISCONNECT_WAIT`] for it to leave; the server then reclaims the connection, so clients
//! may come and go indefinitely within [`ServerConfig::max_conns`] at a time.

use std::time::{Duration, Instant};

use super::ScaleError;
use super::client::{CallFailure, ClientConfig, ScaleCallError, ScaleCallErrorKind, ScaleClient};
use super::info::{ClientConnInfo, ServerConnInfo};
use super::protocol::{REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE, TRAILER_SIZE};
use super::server::{DEFAULT_SLOT_SIZE, ScaleServer, ScaleToken, ServerConfig};
use crate::error::{LimitSide, RpcError};
use crate::rc::rendezvous::{Inbox, Rendezvous, rendezvous};
use crate::server::ServerTransport;
use crate::service::{Service, ServiceDescriptor};
use crate::tokens::Tokens;

pub use crate::rc::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_PROBE_INTERVAL};
/// Default [`ScaleRpcAddr::activation_timeout`]: generous, because on a shared, oversubscribed
/// machine a group's turn can be delayed by other groups' acknowledgement timeouts and by
/// thread scheduling; a liveness timeout must not fire on a merely slow server.
pub const DEFAULT_ACTIVATION_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time dropping a [`ScaleRpc`] waits for its goodbye to complete (on the device
/// model it completes within the doorbell; on hardware within microseconds unless the
/// server's NIC is gone).
pub const DISCONNECT_WAIT: Duration = Duration::from_millis(10);
/// `rpc_type` of the requests [`ScaleRpc`] sends for calls.
pub const RPC_TYPE_CALL: u16 = 0;
/// `rpc_type` of liveness probes (empty requests, answered by [`ScaleRpcServer`] itself).
pub const RPC_TYPE_PROBE: u16 = u16::MAX;
use crate::rc::client::{RcClient, Unsent};
use crate::rc::{self, liveness::ProbeClock};
/// User data of the probe call (never a call token: tokens are below `u16::MAX`).
const PROBE_TOKEN: u32 = u32::MAX;
/// Zero-length receive WQEs and CQ entries of a one-connection client context: notices are
/// rare (two per round of the schedule), and the SRQ never exceeds the CQ.
const CLIENT_SRQ_SIZE: u32 = 256;
const CLIENT_CQ_SIZE: u32 = 1024;

/// The setting [`RpcError::CapacityMismatch`] and [`RpcError::MessageTooLarge`] name.
const SETTING_SLOT_SIZE: &str = "ScaleRPC ServerConfig::slot_size";

/// Largest request payload a pool slot of `slot_size` bytes carries (header and trailer
/// included).
pub fn max_request_payload(slot_size: u32) -> usize {
    (slot_size as usize).saturating_sub(REQUEST_HEADER_SIZE + TRAILER_SIZE)
}

/// The slot size [`ScaleRpcServer::new`] uses for `service` when [`ServerConfig::slot_size`]
/// is `None`: the smallest multiple of 64 B whose [`max_request_payload`] and
/// [`max_response_payload`] carry the service's largest request and response (a request of
/// `n` B takes `n + 40` B of slot: 32 B header, 8 B trailer; a response `n + 32` B: 20 B
/// header, 8 B trailer, 4 B the core reserves). `None` if that exceeds `u32::MAX`.
///
/// ```
/// use rpc_runtime::scalerpc::transport::{derive_slot_size, max_request_payload};
/// # const M: &[rpc_runtime::MethodDescriptor] = &[];
/// # static S: rpc_runtime::ServiceDescriptor = rpc_runtime::ServiceDescriptor {
/// #     name: "S", fingerprint: 1, methods: M, max_request_bytes: 65544, max_response_bytes: 16,
/// #     variable: false, realign: false,
/// # };
/// assert_eq!(derive_slot_size(&S), Some(65600));
/// assert!(max_request_payload(65600) >= 65544);
/// ```
pub fn derive_slot_size(service: &ServiceDescriptor) -> Option<u32> {
    let need = (service
        .max_request_bytes
        .saturating_add(REQUEST_HEADER_SIZE + TRAILER_SIZE))
    .max(
        service
            .max_response_bytes
            .saturating_add(RESPONSE_HEADER_SIZE + TRAILER_SIZE + 4),
    )
    .max(64);
    u32::try_from(need.checked_next_multiple_of(64)?).ok()
}

/// Largest response payload a server with slots of `slot_size` bytes sends
/// ([`ScaleServer::max_response`]).
pub fn max_response_payload(slot_size: u32) -> usize {
    (slot_size as usize).saturating_sub(RESPONSE_HEADER_SIZE + TRAILER_SIZE + 4)
}

pub use crate::rc::ConnectRefusal;

pub use crate::rc::RcSetupError;

/// Setting up a ScaleRPC client or server failed (beyond what [`RpcError`] names directly):
/// the RC transports' one setup error over ScaleRPC's [`ScaleError`];
/// [`RcSetupError::Evicted`] once the server evicted the connection.
pub type ScaleRpcSetupError = RcSetupError<ScaleError>;

impl rc::RcCore for ScaleError {
    const TRANSPORT: &'static str = "scalerpc";

    fn schema_mismatch(&self) -> Option<(u64, u64)> {
        match *self {
            ScaleError::SchemaMismatch { ours, theirs } => Some((ours, theirs)),
            _ => None,
        }
    }
}

/// One connect request: the client's connection and its slot geometry.
pub(crate) struct ConnectRequest {
    info: ClientConnInfo,
    slot_size: u32,
    slots_per_conn: u32,
}

/// In-process rendezvous through which clients connect to one [`ScaleRpcServer`]
/// ([`ScaleRpcServer::listener`]): a channel of connect requests plus a count of pending
/// ones, so that the server's poll costs one relaxed load while nobody connects. It also
/// tells clients the server's slot geometry ([`ScaleRpcAddr::new`] sizes the client by it).
///
/// Cheap to clone; `Send + Sync`. Across processes exchange [`ClientConnInfo`] and
/// [`ServerConnInfo`] out of band instead (module docs).
#[derive(Clone, Debug)]
pub struct Listener {
    rv: Rendezvous<ConnectRequest, ServerConnInfo, ConnectRefusal>,
    slot_size: u32,
    slots_per_conn: u32,
}

impl Listener {
    /// Sends `info` (a created, unconnected connection of a client context configured by
    /// `client`; its fingerprint names the service) to the server and waits up to `timeout`
    /// for the server's answer; complete the connection with [`ScaleClient::connect`].
    ///
    /// # Errors
    /// [`ScaleRpcSetupError::Refused`] (fingerprint, slot geometry, or the server could not
    /// accept); [`ScaleRpcSetupError::Timeout`] if the server does not poll within `timeout`;
    /// [`ScaleRpcSetupError::ServerGone`] if the server was dropped.
    pub fn exchange(
        &self,
        info: &ClientConnInfo,
        client: &ClientConfig,
        timeout: Duration,
    ) -> Result<ServerConnInfo, ScaleRpcSetupError> {
        let req = ConnectRequest {
            info: *info,
            slot_size: client.slot_size.unwrap_or(DEFAULT_SLOT_SIZE),
            slots_per_conn: client.slots_per_conn,
        };
        Ok(self.rv.exchange(req, timeout)?)
    }

    /// Connect requests sent and not yet taken by the server.
    pub fn pending(&self) -> usize {
        self.rv.pending()
    }

    /// The server's slot size in bytes.
    pub fn slot_size(&self) -> u32 {
        self.slot_size
    }

    /// The server's slots per connection.
    pub fn slots_per_conn(&self) -> u32 {
        self.slots_per_conn
    }
}

/// Where and how a [`ScaleRpc`] client connects: `KvClient::<ScaleRpc>::connect(&addr)`.
#[derive(Clone, Debug)]
pub struct ScaleRpcAddr {
    /// The device the client's context is created on (hardware or the software model).
    pub device: mlx5::verbs::Context,
    /// The server's rendezvous ([`ScaleRpcServer::listener`]).
    pub listener: Listener,
    /// Sizing of the client's context. Its `max_conns` is replaced by 1 and its
    /// `fingerprint` by the service's; `slot_size` and `slots_per_conn` must be at least the
    /// server's ([`ScaleRpcAddr::new`] takes the server's; a `slot_size` of `None` also
    /// means the server's).
    pub config: ClientConfig,
    /// How long [`ScaleRpc::connect`](crate::client::ClientTransport::connect) waits for the server's answer.
    pub timeout: Duration,
    /// With calls outstanding and no response for this long, probe the server (module docs).
    /// `Some` keeps one slot of the connection for the probe: calls in flight are then
    /// `slots_per_conn - 1`, and the server needs at least 2 slots per connection. `None`:
    /// no probing, `slots_per_conn` calls in flight.
    pub probe_interval: Option<Duration>,
    /// A client that keeps trying to call while its connection stays inactive (its group not
    /// scheduled) for this long gets [`RpcError::ServerDisconnected`] (module docs). Keep it
    /// well above a round of the schedule (groups x slice). `None`: wait for ever.
    pub activation_timeout: Option<Duration>,
}

impl ScaleRpcAddr {
    /// An address with the server's slot geometry (from `listener`), a one-connection
    /// [`ClientConfig`] and the defaults [`DEFAULT_CONNECT_TIMEOUT`],
    /// [`DEFAULT_PROBE_INTERVAL`] and [`DEFAULT_ACTIVATION_TIMEOUT`].
    pub fn new(device: mlx5::verbs::Context, listener: Listener) -> Self {
        let config = ClientConfig {
            max_conns: 1,
            slot_size: Some(listener.slot_size),
            slots_per_conn: listener.slots_per_conn,
            srq_size: CLIENT_SRQ_SIZE,
            cq_size: CLIENT_CQ_SIZE,
            ..ClientConfig::default()
        };
        ScaleRpcAddr {
            device,
            listener,
            config,
            timeout: DEFAULT_CONNECT_TIMEOUT,
            probe_interval: Some(DEFAULT_PROBE_INTERVAL),
            activation_timeout: Some(DEFAULT_ACTIVATION_TIMEOUT),
        }
    }
}

/// Checks that slots of `slot_size` bytes carry `service`'s largest request and response;
/// `side` is whose slots they are. The error names [`ServerConfig::slot_size`] and the
/// least size that works ([`derive_slot_size`]).
fn check_capacity(
    service: &'static ServiceDescriptor,
    slot_size: u32,
    side: LimitSide,
) -> Result<(), RpcError> {
    match rc::gap(
        service,
        max_request_payload(slot_size) as u64,
        max_response_payload(slot_size) as u64,
    ) {
        Some(gap) => Err(gap.error(
            service,
            side,
            SETTING_SLOT_SIZE,
            derive_slot_size(service).map(u64::from),
        )),
        None => Ok(()),
    }
}

/// Liveness state of a [`ScaleRpc`] client (module docs).
#[derive(Debug)]
struct Liveness {
    /// The probe's clock, if probing is on.
    probe: Option<ProbeClock>,
    activation_timeout: Option<Duration>,
    probe_out: bool,
    probes: u64,
    /// Start of the current run of calls refused because the connection is inactive.
    inactive_since: Option<Instant>,
    /// The last such refusal.
    last_inactive: Instant,
}

/// Client transport over one ScaleRPC connection in a client context of its own (module
/// docs).
///
/// Tokens are a preallocated free list of `0..max_in_flight`, used as the core's user data of
/// each call. The core delivers every arrived response in one poll; those beyond the `max` a
/// [`ClientTransport::poll`](crate::client::ClientTransport::poll) asked for are copied into a preallocated per-token buffer and
/// delivered first by the next poll. No allocation after construction.
pub struct ScaleRpc {
    client: ScaleClient<u32>,
    conn: u32,
    service: &'static ServiceDescriptor,
    slot_size: u32,
    max_req: usize,
    max_resp: usize,
    max_in_flight: u32,
    tokens: Tokens,
    failed: bool,
    /// The server evicted the connection (implies `failed`).
    evicted: bool,
    live: Liveness,
}

impl std::fmt::Debug for ScaleRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScaleRpc")
            .field("service", &self.service.name)
            .field("conn", &self.conn)
            .field("active", &self.client.is_active(self.conn))
            .field("failed", &self.failed)
            .field("max_in_flight", &self.max_in_flight)
            .field("free", &self.tokens.free())
            .field("ready", &self.tokens.stashed())
            .field("probes", &self.live.probes)
            .finish_non_exhaustive()
    }
}

impl ScaleRpc {
    /// Wraps connection `conn` of `client`, already connected (by the caller, e.g. after an
    /// MPI exchange of [`ClientConnInfo`]/[`ServerConnInfo`]) to a [`ScaleRpcServer`] of
    /// `service` that answered with `server`. Checks what [`ScaleRpc::connect`](crate::client::ClientTransport::connect) checks.
    /// `slots_per_conn` calls in flight; no liveness probe or activation timeout (add them
    /// with [`ScaleRpc::with_liveness`]). Other connections of `client` are never used.
    ///
    /// # Errors
    /// [`RpcError::SchemaMismatch`] if the server's fingerprint is not the service's (the
    /// core already refused a client fingerprint different from the server's);
    /// [`RpcError::CapacityMismatch`] if the server's slots cannot carry the service's
    /// largest request or response; [`RpcError::Transport`] ([`ScaleRpcSetupError::Config`])
    /// for an unknown or failed connection or more than `u16::MAX` slots.
    pub fn from_client(
        client: ScaleClient<u32>,
        conn: u32,
        server: &ServerConnInfo,
        service: &'static ServiceDescriptor,
    ) -> Result<Self, RpcError> {
        if conn >= client.num_conns() || client.is_failed(conn) {
            return Err(ScaleRpcSetupError::Config("no such connection, or it failed").into());
        }
        if server.fingerprint != service.fingerprint {
            return Err(RpcError::SchemaMismatch {
                service: service.name,
                expected: service.fingerprint,
                found: server.fingerprint,
            });
        }
        check_capacity(service, server.slot_size, LimitSide::PeerServer)?;
        let n = server.slots_per_conn;
        if n == 0 || n >= u16::MAX as u32 {
            return Err(ScaleRpcSetupError::Config("slots_per_conn must be in 1..65535").into());
        }
        let max_resp = service.max_response_bytes;
        let now = Instant::now();
        let mut t = ScaleRpc {
            client,
            conn,
            service,
            slot_size: server.slot_size,
            max_req: service.max_request_bytes,
            max_resp,
            max_in_flight: 0,
            tokens: Tokens::new(0, 0),
            failed: false,
            evicted: false,
            live: Liveness {
                probe: None,
                activation_timeout: None,
                probe_out: false,
                probes: 0,
                inactive_since: None,
                last_inactive: now,
            },
        };
        t.set_tokens(n);
        Ok(t)
    }

    /// Sizes the token free list and the stash for `n` calls in flight.
    fn set_tokens(&mut self, n: u32) {
        self.max_in_flight = n;
        self.tokens = Tokens::new(n, self.max_resp);
    }

    /// Sets the liveness checks (module docs): a probe after `probe_interval` without a
    /// response while calls are outstanding (keeps one slot for it, so calls in flight drop
    /// to `slots_per_conn - 1`), and [`RpcError::ServerDisconnected`] after trying to call
    /// for `activation_timeout` on a connection that stays inactive. Call before the first
    /// call.
    ///
    /// # Errors
    /// [`RpcError::Transport`] ([`ScaleRpcSetupError::Config`]) if calls were made already, or
    /// a probe is asked for with one slot per connection.
    pub fn with_liveness(
        mut self,
        probe_interval: Option<Duration>,
        activation_timeout: Option<Duration>,
    ) -> Result<Self, RpcError> {
        if self.tokens.free() != self.max_in_flight as usize || self.live.probe_out {
            return Err(ScaleRpcSetupError::Config("with_liveness after the first call").into());
        }
        let slots = self.max_in_flight + u32::from(self.live.probe.is_some());
        if probe_interval.is_some() {
            if slots < 2 {
                return Err(ScaleRpcSetupError::Config(
                    "a liveness probe needs at least 2 slots per connection",
                )
                .into());
            }
            self.set_tokens(slots - 1);
        } else {
            self.set_tokens(slots);
        }
        let responses = self.client.stats().responses;
        self.live.probe = probe_interval.map(|i| ProbeClock::new(i, Instant::now(), responses));
        self.live.activation_timeout = activation_timeout;
        Ok(self)
    }

    /// The client context (counters: [`ScaleClient::stats`]).
    pub fn scale_client(&self) -> &ScaleClient<u32> {
        &self.client
    }

    /// The connection used.
    pub fn conn(&self) -> u32 {
        self.conn
    }

    /// The service this transport was connected for.
    pub fn service(&self) -> &'static ServiceDescriptor {
        self.service
    }

    /// Whether the connection may issue now (its group is scheduled), as of the last poll.
    pub fn is_active(&self) -> bool {
        self.client.is_active(self.conn)
    }

    /// Liveness probes sent.
    pub fn probes_sent(&self) -> u64 {
        self.live.probes
    }

    /// Calls issued and not yet answered (responses stashed for delivery excluded).
    #[inline]
    fn outstanding(&self) -> usize {
        self.max_in_flight as usize - self.tokens.free() - self.tokens.stashed()
    }

    /// One core poll: responses go to `on_response` while fewer than `max` were delivered
    /// (counting `delivered` already), the rest to the stash. A rejected request (the server
    /// refused its header) is delivered as an empty message; calls failed with the connection
    /// free their token without delivery (the failure is reported by
    /// [`ClientTransport::poll`](crate::client::ClientTransport::poll)). Probe answers are consumed here.
    #[inline(always)]
    fn pump(&mut self, deliver: bool, on_response: &mut impl FnMut(u32, &[u8])) -> usize {
        let mut delivered = 0;
        let Self {
            client,
            tokens,
            failed,
            evicted,
            live,
            ..
        } = self;
        client.poll(|tok, r| {
            if let Err(f @ (CallFailure::ConnFailed | CallFailure::Evicted)) = r {
                *failed = true;
                *evicted |= f == CallFailure::Evicted;
            }
            if tok == PROBE_TOKEN {
                live.probe_out = false;
                return;
            }
            let msg = match r {
                Ok(msg) => msg,
                Err(CallFailure::Rejected(_)) => &[],
                Err(CallFailure::ConnFailed | CallFailure::Evicted) => {
                    tokens.give_back(tok);
                    return;
                }
            };
            if deliver {
                delivered += 1;
                tokens.deliver(tok, msg, on_response);
            } else {
                tokens.stash(tok, msg);
            }
        });
        delivered
    }

    /// The error of a failed connection: [`ScaleRpcSetupError::Evicted`] if the server
    /// evicted it, else [`RpcError::ServerDisconnected`].
    #[cold]
    fn failed_error(&mut self) -> RpcError {
        self.failed = true;
        self.evicted |= self.client.is_evicted(self.conn);
        if self.evicted {
            ScaleRpcSetupError::Evicted.into()
        } else {
            RpcError::ServerDisconnected
        }
    }

    /// A call found the connection inactive: [`RpcError::WouldBlock`], or
    /// [`RpcError::ServerDisconnected`] once calls kept being refused for the activation
    /// timeout. Refusals further apart than a quarter of the timeout start a new run (the
    /// caller was not waiting in between).
    fn not_active(&mut self) -> RpcError {
        let Some(limit) = self.live.activation_timeout else {
            return RpcError::WouldBlock;
        };
        let now = Instant::now();
        match self.live.inactive_since {
            Some(since) if now.duration_since(self.live.last_inactive) <= limit / 4 => {
                self.live.last_inactive = now;
                if now.duration_since(since) >= limit {
                    tracing::warn!(
                        service = self.service.name,
                        conn = self.conn,
                        "scalerpc: not scheduled within the activation timeout"
                    );
                    self.failed = true;
                    return RpcError::ServerDisconnected;
                }
            }
            _ => {
                self.live.inactive_since = Some(now);
                self.live.last_inactive = now;
            }
        }
        RpcError::WouldBlock
    }
}

crate::rc::client::rc_client_transport!(ScaleRpc, ScaleRpcAddr);

impl RcClient for ScaleRpc {
    type Refusal = ScaleCallError<u32>;
    type Addr = ScaleRpcAddr;

    /// Creates a client context of its own on `addr.device` with one connection carrying the
    /// service's fingerprint, exchanges connection info with the server through
    /// `addr.listener` (waiting up to `addr.timeout`), connects, checks slot sizes
    /// ([`ScaleRpc::from_client`]) and sets the liveness checks ([`ScaleRpc::with_liveness`]).
    ///
    /// # Errors
    /// [`RpcError::SchemaMismatch`] / [`RpcError::CapacityMismatch`]; [`RpcError::ServerDisconnected`]
    /// if the server was dropped; [`RpcError::Transport`] ([`ScaleRpcSetupError`]) for a refusal on slot geometry, a
    /// timeout, a device error or a bad configuration.
    fn open(addr: &ScaleRpcAddr, service: &'static ServiceDescriptor) -> Result<Self, RpcError> {
        if addr.probe_interval.is_some() && addr.listener.slots_per_conn < 2 {
            return Err(ScaleRpcSetupError::Config(
                "a liveness probe needs at least 2 slots per connection (probe_interval: None)",
            )
            .into());
        }
        let cfg = ClientConfig {
            max_conns: 1,
            fingerprint: service.fingerprint,
            slot_size: addr.config.slot_size.or(Some(addr.listener.slot_size)),
            ..addr.config
        };
        let mut client =
            ScaleClient::<u32>::new(&addr.device, cfg).map_err(|e| rc::core_error(e, service))?;
        let (c, info) = client
            .create_conn()
            .map_err(|e| rc::core_error(e, service))?;
        let server = addr
            .listener
            .exchange(&info, &cfg, addr.timeout)
            .map_err(|e| rc::connect_error(e, service))?;
        client
            .connect(c, &server)
            .map_err(|e| rc::core_error(e, service))?;
        ScaleRpc::from_client(client, c, &server, service)?
            .with_liveness(addr.probe_interval, addr.activation_timeout)
    }

    #[inline]
    fn tokens(&self) -> usize {
        self.max_in_flight as usize
    }

    /// Takes a token and writes the request into the connection's pool slot. With nothing
    /// outstanding it first processes the server's notices, so that a client idle since its
    /// last call sees the current schedule.
    #[inline(always)]
    fn issue(
        &mut self,
        _method_id: u16,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, Unsent<ScaleCallError<u32>>> {
        let Some(tok) = self.tokens.take() else {
            return Err(Unsent::NoToken);
        };
        if self.tokens.free() + 1 == self.max_in_flight as usize && self.tokens.stashed() == 0 {
            // Nothing outstanding: cheap (no slots to check), and catches stop notices that
            // arrived while the caller was not polling.
            self.pump(false, &mut |_, _| {});
        }
        match self
            .client
            .call(self.conn, RPC_TYPE_CALL, self.max_req, tok, encode)
        {
            Ok(_) => {
                self.live.inactive_since = None;
                Ok(tok)
            }
            Err(e) => Err(Unsent::Refused(e)),
        }
    }

    /// Stashed responses first, then one poll of the client (which also sends what was
    /// written and handles the server's notices).
    #[inline(always)]
    fn deliver(&mut self, on_response: &mut impl FnMut(u32, &[u8])) -> usize {
        let mut n = 0;
        if self.tokens.stashed() != 0 {
            n = self.tokens.drain(on_response);
        }
        n + self.pump(true, on_response)
    }

    fn progress(&mut self) {
        self.pump(false, &mut |_, _| {});
    }

    #[inline(always)]
    fn state(&mut self) -> (bool, bool) {
        (
            self.failed || self.client.is_failed(self.conn),
            self.outstanding() > 0,
        )
    }

    /// [`ScaleRpcSetupError::Evicted`] if the server evicted the connection, else
    /// [`RpcError::ServerDisconnected`].
    fn failed_error(&mut self) -> RpcError {
        ScaleRpc::failed_error(self)
    }

    fn refusal_error(&mut self, e: &ScaleCallError<u32>) -> RpcError {
        match e.kind {
            ScaleCallErrorKind::NotActive => self.not_active(),
            ScaleCallErrorKind::SlotsBusy => RpcError::WouldBlock,
            ScaleCallErrorKind::TooLarge => RpcError::MessageTooLarge {
                len: self.max_req,
                cap: max_request_payload(self.slot_size),
                setting: SETTING_SLOT_SIZE,
            },
            ScaleCallErrorKind::Failed | ScaleCallErrorKind::Evicted => self.failed_error(),
        }
    }

    fn give_back(&mut self, e: ScaleCallError<u32>) {
        self.tokens.give_back(e.into_inner());
    }

    #[inline(always)]
    fn probe_clock(&mut self) -> Option<&mut ProbeClock> {
        self.live.probe.as_mut()
    }

    fn responses(&mut self) -> u64 {
        self.client.stats().responses
    }

    /// A probe call in the reserved slot, if none is out and the connection is active.
    fn send_probe(&mut self) {
        if self.live.probe_out || !self.client.is_active(self.conn) {
            return;
        }
        // The reserved slot is free: user calls never take more than `slots - 1`.
        if self
            .client
            .call(self.conn, RPC_TYPE_PROBE, 0, PROBE_TOKEN, |_| 0)
            .is_ok()
        {
            self.live.probe_out = true;
            self.live.probes += 1;
            self.client.flush();
        }
    }
}

impl Drop for ScaleRpc {
    /// Closes the connection: polls once more (acknowledging a pending stop notice), then
    /// says goodbye ([`ScaleClient::disconnect`]) so that the server reclaims the connection
    /// at once, and waits up to [`DISCONNECT_WAIT`] for the goodbye to complete before the
    /// QP is destroyed. (A goodbye that does not make it looks like a crash: the server
    /// reclaims the connection when its next notice to it fails.)
    fn drop(&mut self) {
        if self.failed {
            return;
        }
        self.pump(false, &mut |_, _| {});
        self.client.disconnect(self.conn, |_, _| {});
        let start = Instant::now();
        while !self.client.goodbye_sent(self.conn) && start.elapsed() < DISCONNECT_WAIT {
            self.client.poll(|_, _| {});
        }
    }
}

/// Server transport over a [`ScaleServer`] of its own: one RC connection per client, all
/// sharing the message pool (module docs).
///
/// `ReplyToken` is [`ScaleToken`]; a token answers exactly one request, once.
pub struct ScaleRpcServer {
    inner: ScaleServer,
    inbox: Inbox<ConnectRequest, ServerConnInfo, ConnectRefusal>,
    listener: Listener,
    service: &'static ServiceDescriptor,
    max_resp: usize,
    probes: u64,
}

impl std::fmt::Debug for ScaleRpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScaleRpcServer")
            .field("service", &self.service.name)
            .field("server", &self.inner)
            .field("probes", &self.probes)
            .finish_non_exhaustive()
    }
}

impl ScaleRpcServer {
    /// Creates a server of `service` on `device` ([`ScaleServer::new`] with `cfg`, its
    /// `fingerprint` replaced by the service's, and its `slot_size`, if `None`, by
    /// [`derive_slot_size`] of the service). The pool takes up to `max_conns ×
    /// slots_per_conn × slot_size` bytes of registered memory ([`ServerConfig`]).
    ///
    /// # Errors
    /// [`RpcError::CapacityMismatch`] if slots of `Some(cfg.slot_size)` cannot carry the
    /// service's largest request or response (naming the least size that can);
    /// [`RpcError::Transport`] ([`ScaleRpcSetupError`]) for an unusable configuration (a derived size above `u32::MAX`)
    /// or a device error.
    pub fn new(
        device: &mlx5::verbs::Context,
        service: &'static ServiceDescriptor,
        cfg: ServerConfig,
    ) -> Result<Self, RpcError> {
        let slot_size = match cfg.slot_size {
            Some(n) => n,
            None => derive_slot_size(service).ok_or(ScaleRpcSetupError::Config(
                "the service's largest message needs a slot above u32::MAX bytes",
            ))?,
        };
        check_capacity(service, slot_size, LimitSide::ThisServer)?;
        let cfg = ServerConfig {
            fingerprint: service.fingerprint,
            slot_size: Some(slot_size),
            ..cfg
        };
        let inner = ScaleServer::new(device, cfg)?;
        debug_assert_eq!(inner.max_response(), max_response_payload(slot_size));
        let (rv, inbox) = rendezvous();
        Ok(ScaleRpcServer {
            inner,
            inbox,
            listener: Listener {
                rv,
                slot_size,
                slots_per_conn: cfg.slots_per_conn,
            },
            service,
            max_resp: service.max_response_bytes,
            probes: 0,
        })
    }

    /// [`ScaleRpcServer::new`] for service `S`, wrapped in a typed [`crate::Server`].
    ///
    /// # Errors
    /// As [`ScaleRpcServer::new`].
    pub fn serve<S: Service>(
        device: &mlx5::verbs::Context,
        cfg: ServerConfig,
    ) -> Result<crate::Server<S, Self>, RpcError> {
        Ok(crate::Server::new(Self::new(device, S::DESCRIPTOR, cfg)?))
    }

    /// The rendezvous clients connect through (put it in a [`ScaleRpcAddr`]).
    pub fn listener(&self) -> Listener {
        self.listener.clone()
    }

    /// Answers every pending connect request (done by [`ServerTransport::poll`] whenever some
    /// are pending): refuses another fingerprint or slots smaller or fewer than the server's,
    /// else accepts the connection ([`ScaleRpcServer::add_client`]) and sends back its info.
    /// Returns how many clients were connected.
    ///
    /// A request whose client stopped waiting (timeout) still gets a connection, which never
    /// says hello: it is evicted at its group's first stop ([`ServerConfig::ack_timeout`]);
    /// the server cannot remove connections.
    pub fn accept(&mut self) -> usize {
        rc::accept(self)
    }

    /// Accepts the client connection described by `client` (exchanged out of band, e.g.
    /// through MPI) and returns the info to send back; the client then completes it with
    /// [`ScaleClient::connect`] and wraps it with [`ScaleRpc::from_client`]. The client's
    /// slots must be at least as large and as many as this server's (its `connect` refuses
    /// otherwise, leaving this connection unused).
    ///
    /// # Errors
    /// [`RpcError::SchemaMismatch`] if the client's fingerprint is not the service's (nothing
    /// is created); [`RpcError::Transport`] ([`ScaleRpcSetupError`]) when the server has `max_conns` connections, the
    /// client's response region is too small, or the device fails.
    pub fn add_client(&mut self, client: &ClientConnInfo) -> Result<ServerConnInfo, RpcError> {
        if client.fingerprint != self.service.fingerprint {
            return Err(RpcError::SchemaMismatch {
                service: self.service.name,
                expected: self.service.fingerprint,
                found: client.fingerprint,
            });
        }
        self.inner
            .accept(client)
            .map_err(|e| rc::core_error(e, self.service))
    }

    /// The ScaleRPC server (counters: [`ScaleServer::stats`]; the schedule:
    /// [`ScaleServer::scheduler`]).
    pub fn scale_server(&self) -> &ScaleServer {
        &self.inner
    }

    /// The ScaleRPC server, mutably. Take no requests from it directly: the typed server
    /// would never see them.
    pub fn scale_server_mut(&mut self) -> &mut ScaleServer {
        &mut self.inner
    }

    /// The service served.
    pub fn service(&self) -> &'static ServiceDescriptor {
        self.service
    }

    /// Liveness probes answered.
    pub fn probes_answered(&self) -> u64 {
        self.probes
    }

    /// Answers a probe (an empty request) with an empty response.
    #[cold]
    fn answer_probe(&mut self, tok: ScaleToken) {
        self.probes += 1;
        let _ = self.inner.reply(tok, 0, |_| 0);
    }
}

impl rc::Admit for ScaleRpcServer {
    type Request = ConnectRequest;
    type Answer = ServerConnInfo;
    const TRANSPORT: &'static str = "scalerpc";

    fn inbox(&mut self) -> &mut Inbox<ConnectRequest, ServerConnInfo, ConnectRefusal> {
        &mut self.inbox
    }

    fn service_name(&self) -> &'static str {
        self.service.name
    }

    /// Refuses another fingerprint, then slots smaller or fewer than the server's; else
    /// [`ScaleRpcServer::add_client`], its error as the client learns it.
    fn admit(&mut self, req: &ConnectRequest) -> Result<ServerConnInfo, ConnectRefusal> {
        let (slot_size, slots_per_conn) =
            (self.inner.slot_size(), self.inner.config().slots_per_conn);
        if req.info.fingerprint == self.service.fingerprint
            && (req.slot_size < slot_size || req.slots_per_conn < slots_per_conn)
        {
            return Err(ConnectRefusal::Slots {
                slot_size,
                slots_per_conn,
            });
        }
        self.add_client(&req.info).map_err(rc::refusal)
    }
}

impl ServerTransport for ScaleRpcServer {
    type ReplyToken = ScaleToken;

    /// Answers pending connect requests (one relaxed load when there are none), then runs one
    /// round of the ScaleRPC dispatch loop (schedule, control messages, completions, slot
    /// scan). Returns the requests available to `recv`.
    #[inline]
    fn poll(&mut self) -> usize {
        if self.inbox.has_pending() {
            self.accept();
        }
        self.inner.poll()
    }

    /// The next request. Liveness probes (`rpc_type` [`RPC_TYPE_PROBE`]) are answered here
    /// and skipped.
    #[inline]
    fn recv(&mut self) -> Option<(ScaleToken, &[u8])> {
        loop {
            let (tok, msg) = self.inner.recv()?;
            if tok.rpc_type() != RPC_TYPE_PROBE {
                let msg: *const [u8] = msg;
                // SAFETY: `msg` borrows `self.inner` (its pool slot, reserved for this request
                // until it is answered) and is returned under that same `&mut self` borrow;
                // the pointer only sidesteps the borrow checker's refusal to end a borrow
                // returned from one iteration of a loop before the next (NLL "problem case 3").
                return Some((tok, unsafe { &*msg }));
            }
            let probe = tok;
            self.answer_probe(probe);
        }
    }

    /// Builds the reply in the request's slot; it is sent by the next poll or flush (or once
    /// the doorbell batch fills).
    ///
    /// # Errors
    /// [`RpcError::ReplyDropped`] if the token is stale (already answered), the client's
    /// connection failed, or the reply does not fit the client's response region.
    #[inline]
    fn reply(
        &mut self,
        token: ScaleToken,
        _len: usize,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), RpcError> {
        self.inner
            .reply(token, self.max_resp, encode)
            .map_err(reply_error)
    }

    /// Rings the doorbells of the connections with replies written since the last poll.
    /// There is no request space to release: a request's pool slot is freed by its reply
    /// (the response is built in place in that slot), and its client writes the slot again
    /// only after the response arrived.
    #[inline]
    fn flush(&mut self) {
        self.inner.flush();
    }
}

#[cold]
fn reply_error(e: ScaleError) -> RpcError {
    RpcError::ReplyDropped(match e {
        ScaleError::StaleToken => "the request was already answered (stale token)",
        ScaleError::TooLarge => "the reply does not fit the client's response slot",
        ScaleError::ConnFailed => "the client's connection failed",
        _ => "scalerpc reply failed",
    })
}

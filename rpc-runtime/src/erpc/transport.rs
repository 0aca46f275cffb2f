//! eRPC as an RPC transport: [`Erpc`] (client) and [`ErpcServer`] implement
//! [`ClientTransport`]/[`ServerTransport`] on top of an [`Endpoint`] (the eRPC core plus its
//! event loop over a [`DatagramTransport`]), so that `#[rpc_service(transport = "erpc")]`
//! services run over UDP ([`UdpTransport`], the default) or any other datagram transport
//! (seeds/000, seeds/002).
//!
//! # Messages
//! A call carries one [`crate::wire`] request message of at most the service's
//! `max_request_bytes` as one eRPC request (request type [`REQ_TYPE_CALL`]); the reply is one
//! eRPC response of at most `max_response_bytes`. eRPC splits messages larger than a packet
//! (`mtu - 16` data bytes) into several packets and reassembles them (seeds/000 §8.2), so
//! the only size limit is the core's [`Config::max_msg_size`] (8 MiB by default): both sides
//! refuse, when they are created, a service whose largest request or response exceeds it
//! ([`ErpcSetupError::Capacity`]). The connect handshake carries each end's `max_msg_size`,
//! MTU and session credits, and the server refuses a client whose values differ from its own
//! ([`ErpcSetupError::Refused`] with [`core::SessionError::ConfigMismatch`], naming the field and
//! both values): build both ends with the same settings (the defaults).
//!
//! Each client opens `ceil(max_in_flight / 8)` sessions to its server (eRPC allows 8
//! outstanding RPCs per session, [`SLOTS_PER_SESSION`]; seeds/002 §2
//! `MAX_INFLIGHT_PER_SESSION`), and call token `t` always uses session `t / 8`, so no session
//! ever has more than 8 calls and the core's backlog (seeds/000 §5.1, seeds/002 §6.1), which
//! copies each request into a fresh buffer, is not used in the steady state. Requests are
//! encoded straight into the session slot's request message buffer
//! ([`Endpoint::enqueue_request_with`]) and replies into the server slot's response buffer
//! ([`Endpoint::reply_with`]), from which their packets are sent without further copies
//! (seeds/000 §3; the copies per message are counted in the [`crate::erpc`] module docs);
//! each received multi-packet message (and each single-packet response, which the client
//! takes through the copying path) arrives in a buffer from the core's free list, and the
//! binding returns it once the message was delivered ([`Endpoint::recycle`]), so once warm a
//! call allocates and maps nothing on either side (the free lists grow to the most messages
//! ever out at once, then stay).
//!
//! # Connecting
//! [`Erpc::connect_with`] (and [`ClientTransport::connect`], with [`ErpcConfig::default`])
//! opens a transport of its own ([`ErpcConnect`]: for UDP, a socket on an ephemeral port of
//! the server address's family, on loopback if the server is on loopback; for the mlx5 UD
//! transport, a queue pair on the device of a [`UdConnectAddr`]), creates the
//! sessions and runs the event loop until every session is connected. The session-management
//! handshake carries the schema fingerprint ([`Config::schema_fingerprint`], set to the
//! service's by [`service_config`]); a server of another service refuses it, which fails the
//! connect with [`ErpcSetupError::SchemaMismatch`] (seeds/000 §12.4: the server validates a
//! connect request before it creates the session). It also carries the MTU, `max_msg_size`
//! and session credits, which must equal the server's, and the server admits a session only
//! if its receive ring can absorb the packets of all its sessions (admission control,
//! [`Config::rx_ring_entries`]); a refusal fails the connect with [`ErpcSetupError::Refused`]
//! and a message naming the cause. Connecting is bounded: by `connect_timeout`
//! ([`ErpcSetupError::Timeout`]) and by the core's `failure_timeout` for a server that never
//! answers ([`ErpcSetupError::NoAnswer`]). Across processes (MPI), create the
//! [`Endpoint`] yourself and hand it, with the server's datagram address, to
//! [`Erpc::from_endpoint`]; [`ErpcServer::from_endpoint`] is the server-side counterpart.
//!
//! # Progress
//! eRPC is driven by its event loop (seeds/000 §12.1, seeds/002 §11): nothing is sent or
//! received unless someone runs it. [`Erpc`] runs it once per [`ClientTransport::poll`]
//! (which [`crate::Client`] calls while it waits); a call's packets leave at that poll.
//! [`ErpcServer`] runs it once per [`ServerTransport::poll`] and, after replies were given,
//! once per [`ServerTransport::flush`] ([`crate::Server::serve_once`] calls both), so the
//! replies of a round leave at the end of that round.
//!
//! **Idle clients.** eRPC keeps sessions alive with keepalive pings sent by the event loop
//! and fails a session whose peer was silent for [`Config::failure_timeout`] (seeds/002 §10).
//! A client that neither calls nor polls does not run its loop, so its sessions look dead to
//! both ends after that long. [`Erpc`] therefore treats its sessions as stale once its loop
//! has not run for `(failure_timeout - keepalive) / 2` (450 ms with [`ErpcConfig::default`])
//! while no call is in flight: it disconnects them and opens new ones for the next calls (whose
//! requests wait in the core's backlog until the new session is connected). A session that
//! failed while it had no call in flight is replaced the same way. Calls in flight are never
//! moved to another session (that could execute them twice): keep polling while calls are
//! outstanding (at least every `keepalive`, 100 ms by default), as the blocking calls and
//! `poll_with` loops do.
//!
//! # Back-pressure
//! At most [`Erpc::max_in_flight`] calls (default [`DEFAULT_MAX_IN_FLIGHT`]) are outstanding;
//! `send` returns [`RpcError::WouldBlock`] beyond that. Packets within a session are limited
//! by its credits (seeds/000 §5, seeds/002 §6.2), which the core handles.
//!
//! **Ordering.** Calls on different sessions, and calls outstanding together on one session
//! (different slots), may execute in either order. A caller that needs order between two
//! calls waits for the first one's response before issuing the second.
//!
//! # A server that disappears
//! A client session retransmits unanswered packets (go-back-N, seeds/000 §7.1) and pings a
//! silent server; when the server stays silent for [`Config::failure_timeout`]
//! ([`DEFAULT_FAILURE_TIMEOUT`] with [`ErpcConfig::default`]) the core fails every call of
//! the session (seeds/002 §10, node failure). [`Erpc`] then reports
//! [`RpcError::ServerDisconnected`] from `poll` (the pending calls are never delivered), and
//! every later call fails with it at once ([`Erpc::last_failure`] tells why). A server
//! refusing a session (another schema, other settings, no room) also fails the transport this
//! way. Nothing hangs: the failure timeout bounds the wait.
//!
//! **Reconnecting is explicit**: after a server restart or a transient fault, call
//! [`Erpc::reconnect`] (through a generated client: `client.transport_mut().reconnect()`).
//! It replaces the sessions that have no call in flight by new ones to the same address and
//! clears the failure; the next calls run on the new sessions (waiting, within the failure
//! timeout, for them to connect). Without it the transport stays failed and every call fails
//! at once, so a dead server costs a caller nothing per call. A late packet of an old session
//! cannot reach a new one, at either end (session tokens, [`core`] module docs).
//!
//! # Server
//! [`ErpcServer`] answers requests of any number of clients on one endpoint. Its
//! `ReplyToken` is the core's [`ReqToken`] (`Copy`), valid until the request is answered or
//! its session is freed (client gone); a stale token is refused with
//! [`RpcError::ReplyDropped`]. Replies may be given in any order and later (deferred
//! replies); the core keeps each answered response for duplicates of its request
//! (at-most-once, seeds/000 §7.2, seeds/002 §4 I3).
//!
//! **Zero copy.** Single-packet requests are handed out in place, in the transport's receive
//! ring (seeds/002 §7.2, eRPC's dispatch-mode path): [`ErpcServer::poll`](ServerTransport::poll)
//! receives a burst with [`Endpoint::rx_burst_zc`] without re-posting it, `recv` lends each
//! such request from the ring ([`Endpoint::zc`]) and then the copied ones (multi-packet
//! requests, which the core reassembles into recycled buffers and reports as
//! [`Event::Request`]), and `flush` finishes the loop iteration
//! ([`Endpoint::finish_iteration`]: re-post the burst, run the timers, transmit the replies),
//! which is exactly when the lent bytes stop being valid under the [`ServerTransport`] contract
//! (`recv`'s borrow ends before `flush`; reply tokens stay valid, and `reply` may be called
//! before `finish_iteration`). A `poll` that found nothing leaves its (empty) iteration open;
//! the next `poll` or `flush` finishes it. The client takes responses through the copying
//! path (recycled buffers).
//!
//! # Errors
//! Setup errors are [`ErpcSetupError`]s. Where a [`RpcError`] is required
//! ([`ClientTransport::connect`], `?` through `From<ErpcSetupError>`), a schema mismatch
//! becomes [`RpcError::SchemaMismatch`] (with `found`, the server's fingerprint, which the
//! connect response carries), a capacity problem [`RpcError::CapacityMismatch`], and everything
//! else [`RpcError::Transport`] carrying the [`ErpcSetupError`] (transport `"erpc"`;
//! [`RpcError::transport`] gets it back).

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::core::{
    self, Config, ConfigError, ErpcCallError, Event, MS, ReqToken, SLOTS_PER_SESSION, SessionId,
    Time,
};
use super::datagram::lossy::{LossConfig, LossyTransport};
use super::datagram::ud::{UdAddr, UdConfig, UdTransport};
use super::datagram::udp::{DEFAULT_BATCH, UdpConfig, UdpMtu, UdpTransport};
use super::datagram::{DatagramTransport, RxFd, RxWait, ppoll_readable};
use super::event_loop::Endpoint;
use super::idle::{CallWait, CallWaitStats, IdleConfig, runnable_threads, usable_cpus};
use super::msgbuf::MsgBuffer;
use crate::client::ClientTransport;
use crate::error::{LimitSide, MessageKind, RpcError, SETTING_SERVICE_MAX, sat_u32};
use crate::server::ServerTransport;
use crate::service::{Service, ServiceDescriptor};

/// Default [`ErpcConfig::max_in_flight`]: calls one client can have outstanding (four
/// sessions of 8 slots): the shared [`crate::client::DEFAULT_CALLS_IN_FLIGHT`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = crate::client::DEFAULT_CALLS_IN_FLIGHT;
/// Largest accepted [`ErpcConfig::max_in_flight`] (512 sessions per client).
pub const MAX_IN_FLIGHT_LIMIT: usize = 4096;
/// [`Config::failure_timeout`] of [`ErpcConfig::default`], ns: 1 s instead of the core's
/// 200 ms.
/// Typed clients and servers often share a machine with more busy threads than cores (the
/// `kv` job, test suites), where a thread can be descheduled for a few hundred
/// milliseconds; a peer that looks silent for that long must not fail its sessions.
pub const DEFAULT_FAILURE_TIMEOUT: Time = 1_000 * MS;
/// [`Config::keepalive`] of [`ErpcConfig::default`], ns: 100 ms (below
/// [`DEFAULT_FAILURE_TIMEOUT`]).
pub const DEFAULT_KEEPALIVE: Time = 100 * MS;
/// Default [`ErpcConfig::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default [`ErpcConfig::udp_socket_buf_bytes`]: 4 MiB (the kernel caps it at
/// `net.core.rmem_max`/`wmem_max`), the UDP transport's own default.
pub use super::datagram::udp::DEFAULT_SOCKET_BUF_BYTES;
/// eRPC request type (`req_type`, the handler type of seeds/000 §2.1) of the calls [`Erpc`]
/// sends. [`ErpcServer`] hands requests of every type to the service.
pub const REQ_TYPE_CALL: u8 = 1;

/// Settings of an [`Erpc`] client or [`ErpcServer`] (fields marked *client* or *UDP* are
/// ignored where they do not apply).
#[derive(Clone, Debug)]
pub struct ErpcConfig {
    /// Protocol settings of the endpoint ([`service_config`] replaces `schema_fingerprint` by
    /// the service's and `token_nonce` by a random value). The `mtu` comes from the transport.
    pub core: Config,
    /// *Client*: calls in flight at most, in `1..=`[`MAX_IN_FLIGHT_LIMIT`]; the client opens
    /// `ceil(max_in_flight / 8)` sessions.
    pub max_in_flight: usize,
    /// *Client*: how long connecting may take (all sessions connected). A server that does
    /// not answer at all fails the connect earlier, after the core's `failure_timeout`
    /// (which also bounds the wait when this is too long for the clock to represent).
    pub connect_timeout: Duration,
    /// *UDP*: datagram size in bytes, header included; `None`: derived from the network path
    /// ([`path_mtu`](super::datagram::path_mtu): a server from its bound address, a client
    /// from the server's address as given; 8972 B on IPv4 loopback when the receive buffer
    /// admits it, 1472 B on a 1500 B Ethernet link). Both ends must agree; the connect
    /// handshake refuses a mismatch (`ConfigMismatch`, field `mtu`).
    pub udp_mtu: Option<usize>,
    /// *UDP*: datagrams per `sendmmsg`/`recvmmsg` and receive-ring size.
    pub udp_batch: usize,
    /// *UDP*: requested socket buffer sizes in bytes (`None`: the kernel's default).
    pub udp_socket_buf_bytes: Option<usize>,
    /// *Client*: when a blocking call that polled and yielded without a response blocks in
    /// the socket ([`CallWait`]: on an oversubscribed machine, or once it has waited
    /// `max_spin`); `None`: it polls and yields until its response or deadline. Default:
    /// [`IdleConfig::default`]. A transport that cannot wait (mlx5 UD) always polls.
    pub client_idle: Option<IdleConfig>,
}

impl Default for ErpcConfig {
    /// [`Config::default`] with [`DEFAULT_FAILURE_TIMEOUT`] and [`DEFAULT_KEEPALIVE`],
    /// [`DEFAULT_MAX_IN_FLIGHT`], [`DEFAULT_CONNECT_TIMEOUT`], the UDP defaults and
    /// [`DEFAULT_SOCKET_BUF_BYTES`].
    fn default() -> Self {
        ErpcConfig {
            core: Config {
                failure_timeout: DEFAULT_FAILURE_TIMEOUT,
                keepalive: DEFAULT_KEEPALIVE,
                ..Config::default()
            },
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            udp_mtu: None,
            udp_batch: DEFAULT_BATCH,
            udp_socket_buf_bytes: Some(DEFAULT_SOCKET_BUF_BYTES),
            client_idle: Some(IdleConfig::default()),
        }
    }
}

impl ErpcConfig {
    /// The UDP transport configuration binding `bind` with these settings.
    pub fn udp(&self, bind: SocketAddr) -> UdpConfig {
        let base = UdpConfig::new(bind);
        UdpConfig {
            mtu: self.udp_mtu.map_or(base.mtu, UdpMtu::Fixed),
            batch: self.udp_batch,
            socket_buf_bytes: self.udp_socket_buf_bytes,
            ..base
        }
    }
}

/// `base` with `service`'s schema fingerprint and a fresh random `token_nonce`: the core
/// configuration of an endpoint of `service` (for [`Endpoint::new`] before
/// [`Erpc::from_endpoint`] / [`ErpcServer::from_endpoint`]).
pub fn service_config(service: &ServiceDescriptor, base: &Config) -> Config {
    Config {
        schema_fingerprint: service.fingerprint,
        token_nonce: random_nonce(),
        ..base.clone()
    }
}

/// A random value for [`Config::token_nonce`] (from `rand`'s OS-seeded thread generator).
fn random_nonce() -> u64 {
    rand::Rng::next_u64(&mut rand::rng())
}

/// Setting up an eRPC client or server failed.
#[derive(Debug, thiserror::Error)]
pub enum ErpcSetupError {
    /// Creating the transport failed (e.g. binding the UDP socket).
    #[error("eRPC transport setup failed: {0}")]
    Io(#[from] std::io::Error),
    /// The eRPC core refused the configuration.
    #[error("eRPC core configuration refused: {0}")]
    Config(#[from] ConfigError),
    /// A setting or argument of this binding is unusable.
    #[error("invalid eRPC configuration: {0}")]
    Invalid(&'static str),
    /// The endpoint's `max_msg_size` cannot carry the service's largest message.
    #[error(
        "service {service}: {side} eRPC Config::max_msg_size is {cap} bytes, the service's largest {what} is {need}: set it to at least {need}"
    )]
    Capacity {
        /// Service name.
        service: &'static str,
        /// Whose endpoint: [`LimitSide::ThisClient`] or [`LimitSide::ThisServer`] (the
        /// handshake refuses peers whose `max_msg_size` differs, so a peer's is never the
        /// limit).
        side: LimitSide,
        /// Which message kind does not fit.
        what: MessageKind,
        /// The endpoint's `max_msg_size` in bytes.
        cap: usize,
        /// The service's largest message of that kind, in bytes.
        need: usize,
    },
    /// The server refused the session: it serves another schema (another service, or
    /// another build of this one).
    #[error(
        "service {service}: the server refused the session (schema fingerprint mismatch: ours is {expected:#018x}, the server's is {found:#018x})"
    )]
    SchemaMismatch {
        /// Service name.
        service: &'static str,
        /// This build's fingerprint.
        expected: u64,
        /// The server's fingerprint (carried in its connect response).
        found: u64,
    },
    /// The server refused the session for another reason: a setting both ends must share
    /// differs ([`core::SessionError::ConfigMismatch`]: MTU, `max_msg_size` or session credits;
    /// the message names the field, both values and the client setting to change), its
    /// receive ring has no room for another session ([`core::SessionError::NoRingEntries`],
    /// admission control), this client's address already holds the server's per-source
    /// limit of sessions ([`core::SessionError::SourceLimit`]), it has no free sessions, or it
    /// dropped the session while connecting.
    #[error("the eRPC server refused the session: {0}")]
    Refused(core::SessionError),
    /// The server did not answer the connect requests within the core's failure timeout.
    #[error("no answer from the eRPC server (failure timeout)")]
    NoAnswer,
    /// Not every session was connected within the connect timeout.
    #[error("eRPC sessions not connected within {0:?}")]
    Timeout(Duration),
    /// The endpoint could not create a session (all session numbers in use).
    #[error("creating an eRPC session failed: {0}")]
    Session(ErpcCallError),
}

impl ErpcSetupError {
    /// The [`RpcError`] reported for this error where no richer type fits (module docs,
    /// "Errors"): a schema mismatch and a capacity problem map to their [`RpcError`]
    /// variants, everything else to [`RpcError::Transport`] carrying `self`.
    #[cold]
    pub fn into_rpc_error(self) -> RpcError {
        match self {
            ErpcSetupError::SchemaMismatch {
                service,
                expected,
                found,
            } => RpcError::SchemaMismatch {
                service,
                expected,
                found,
            },
            ErpcSetupError::Capacity {
                service,
                side,
                what,
                cap,
                need,
            } => RpcError::CapacityMismatch {
                service,
                what,
                side,
                setting: SETTING_MAX_MSG_SIZE,
                cap: sat_u32(cap),
                need: sat_u32(need),
                min: Some(need as u64),
            },
            e => RpcError::from_transport("erpc", e),
        }
    }
}

impl From<ErpcSetupError> for RpcError {
    /// [`ErpcSetupError::into_rpc_error`] (module docs, "Errors").
    #[cold]
    fn from(e: ErpcSetupError) -> Self {
        e.into_rpc_error()
    }
}

/// The setting [`RpcError::CapacityMismatch`] and [`RpcError::MessageTooLarge`] name for
/// the core's message size limit.
const SETTING_MAX_MSG_SIZE: &str = "eRPC Config::max_msg_size";

/// Checks that the endpoint configuration `cfg` can serve `service`: its fingerprint is the
/// service's, and its `max_msg_size` carries the largest request and response. `side` is whose
/// endpoint it is (for the error).
fn check_endpoint(
    cfg: &Config,
    service: &'static ServiceDescriptor,
    side: LimitSide,
) -> Result<(), ErpcSetupError> {
    if cfg.schema_fingerprint != service.fingerprint {
        return Err(ErpcSetupError::Invalid(
            "the endpoint's Config::schema_fingerprint is not the service's (use service_config)",
        ));
    }
    for (what, need) in [
        (MessageKind::Request, service.max_request_bytes),
        (MessageKind::Response, service.max_response_bytes),
    ] {
        if need > cfg.max_msg_size {
            return Err(ErpcSetupError::Capacity {
                service: service.name,
                side,
                what,
                cap: cfg.max_msg_size,
                need,
            });
        }
    }
    Ok(())
}

/// A datagram transport that can open a client endpoint by itself, given what
/// [`ClientTransport::connect`] receives; makes [`Erpc<T>`] a [`ClientTransport`].
/// Transports without it are still usable through [`Erpc::from_endpoint`] (and
/// [`crate::Client::from_transport`]) once this trait is implemented for them; implement it
/// where the transport is defined.
pub trait ErpcConnect: DatagramTransport + Sized {
    /// What a client is given to reach a server (`SocketAddr` for UDP).
    type ConnectAddr;

    /// Opens a client-side transport that can reach the server named by `addr`, configured
    /// by `cfg`; returns it with the server's datagram address.
    ///
    /// # Errors
    /// The transport's setup errors ([`ErpcSetupError::Io`] for sockets).
    fn open_client(
        addr: &Self::ConnectAddr,
        cfg: &ErpcConfig,
    ) -> Result<(Self, Self::Addr), ErpcSetupError>;

    /// Whether [`ErpcConfig::udp_mtu`] sets this transport's datagram size, so that a client
    /// whose derived size the server refused (`ConfigMismatch`, field `mtu`) can reconnect
    /// with the server's ([`Erpc::connect_with`]). `false` unless the transport says so.
    const MTU_FROM_UDP_CONFIG: bool = false;
}

impl ErpcConnect for UdpTransport {
    type ConnectAddr = SocketAddr;

    const MTU_FROM_UDP_CONFIG: bool = true;

    /// Binds an ephemeral port of `addr`'s family: on loopback if `addr` is a loopback
    /// address, else on the unspecified address. An unspecified `addr` (a server bound to
    /// `0.0.0.0`/`::`) is reached on loopback.
    fn open_client(
        addr: &SocketAddr,
        cfg: &ErpcConfig,
    ) -> Result<(Self, SocketAddr), ErpcSetupError> {
        let server = reachable(*addr);
        let bind = match server.ip() {
            IpAddr::V4(ip) if ip.is_loopback() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(ip) if ip.is_loopback() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let mut udp = cfg.udp(SocketAddr::new(bind, 0));
        if cfg.udp_mtu.is_none() {
            // The server's rule, applied to its address as given (unspecified included), so
            // both ends derive the same size.
            udp.mtu = UdpMtu::AutoToward(addr.ip());
        }
        let t = UdpTransport::bind(udp)?;
        Ok((t, server))
    }
}

/// `addr` with an unspecified IP replaced by the loopback address of its family.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

impl<T: ErpcConnect> ErpcConnect for LossyTransport<T> {
    /// The inner transport's address and the faults to inject (a test aid).
    type ConnectAddr = (T::ConnectAddr, LossConfig);

    fn open_client(
        (addr, loss): &(T::ConnectAddr, LossConfig),
        cfg: &ErpcConfig,
    ) -> Result<(Self, T::Addr), ErpcSetupError> {
        let (t, server) = T::open_client(addr, cfg)?;
        Ok((LossyTransport::new(t, *loss), server))
    }
}

/// Where an [`Erpc<UdTransport>`] client connects: the device its own UD queue pair is
/// created on (hardware or the software device model), the server's UD address
/// ([`ErpcServer::local_addr`] of a server over [`UdTransport`]), and the UD settings.
#[derive(Clone, Debug)]
pub struct UdConnectAddr {
    /// The device the client's transport is created on.
    pub device: mlx5::verbs::Context,
    /// The server's address.
    pub server: UdAddr,
    /// Settings of the client's transport; `mtu` and `qkey` must be the server's.
    pub config: UdConfig,
}

impl UdConnectAddr {
    /// An address with [`UdConfig::for_port`] of `device`'s port (the defaults, MTU capped at
    /// the port's).
    pub fn new(device: mlx5::verbs::Context, server: UdAddr) -> Self {
        let config = UdConfig::for_port(&device.port());
        UdConnectAddr {
            device,
            server,
            config,
        }
    }
}

impl ErpcConnect for UdTransport {
    type ConnectAddr = UdConnectAddr;

    /// Creates a UD transport of its own on `addr.device` ([`UdTransport::new`] with
    /// `addr.config`; `cfg`'s UDP fields do not apply).
    fn open_client(
        addr: &UdConnectAddr,
        _cfg: &ErpcConfig,
    ) -> Result<(Self, UdAddr), ErpcSetupError> {
        Ok((UdTransport::new(&addr.device, addr.config)?, addr.server))
    }
}

/// Counters of an [`Erpc`] client (monotonically increasing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErpcClientStats {
    /// Calls accepted by `send`.
    pub calls: u64,
    /// Responses delivered.
    pub responses: u64,
    /// Calls that failed with their session (reported as [`RpcError::ServerDisconnected`]).
    pub failed_calls: u64,
    /// Sessions opened, the initial ones included.
    pub sessions_opened: u64,
    /// Times every session was found stale after an idle gap and replaced (module docs).
    pub stale_renewals: u64,
    /// Events that concern no call of this client (a response for a token not in flight, a
    /// request from a peer: a client endpoint serves nothing), dropped.
    pub stray_events: u64,
    /// Calls of [`Erpc::reconnect`].
    pub reconnects: u64,
    /// Blocks of a blocking call in the transport ([`ClientTransport::wait_for_response`]
    /// with [`ErpcConfig::client_idle`]): each ends with a datagram, at its bound (the
    /// call's deadline, 1 ms, the next protocol timer) or at once with work to do.
    pub idle_waits: u64,
}

/// One session of an [`Erpc`] client: tokens `i * 8 .. i * 8 + 8` use it.
#[derive(Clone, Copy, Debug)]
struct Sess {
    /// `None`: no session (failed, or abandoned as stale); the next call opens one.
    id: Option<SessionId>,
    /// When it was opened (a counter): of two groups naming the same session number, the
    /// older one holds the session that ended first (module-internal bookkeeping, see
    /// `session_ended`).
    opened: u64,
}

/// Client transport over an eRPC [`Endpoint`] of its own with `ceil(max_in_flight / 8)`
/// sessions to one server (module docs).
///
/// Tokens are `0..max_in_flight`, used as the core's request tags; token `t` uses session
/// `t / 8`. Responses beyond the `max` a [`ClientTransport::poll`] asked for stay in the
/// core's event queue for the next poll. No allocation per call after connecting (module
/// docs, "Messages").
pub struct Erpc<T: DatagramTransport = UdpTransport> {
    ep: Endpoint<T>,
    server: T::Addr,
    service: &'static ServiceDescriptor,
    sessions: Box<[Sess]>,
    /// Sessions given up on (stale) whose final event has not been seen yet.
    old: Vec<SessionId>,
    free: Vec<u32>,
    pending: Box<[bool]>,
    in_flight: usize,
    /// Largest request in bytes (the service's `max_request_bytes`): the room `send`'s
    /// encoder gets in the slot's request message buffer.
    req_cap: usize,
    /// The first failure of a call: every later call fails.
    failed: Option<core::SessionError>,
    /// Why the last session that failed did.
    last_session_error: Option<core::SessionError>,
    /// When the event loop last ran.
    last_loop: Instant,
    /// Idle gap after which the sessions are stale.
    stale_after: Duration,
    stats: ErpcClientStats,
    /// When a blocking call blocks ([`ErpcConfig::client_idle`]); `None`: never (also once
    /// the transport turned out unable to wait).
    call_wait: Option<CallWait>,
}

impl<T: DatagramTransport + std::fmt::Debug> std::fmt::Debug for Erpc<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Erpc")
            .field("service", &self.service.name)
            .field("server", &self.server)
            .field("sessions", &self.sessions)
            .field("in_flight", &self.in_flight)
            .field("failed", &self.failed)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<T: ErpcConnect> Erpc<T> {
    /// Opens a transport ([`ErpcConnect::open_client`]), an endpoint of `service`
    /// ([`service_config`] of `cfg.core`) and connects it to the server at `addr`
    /// ([`Erpc::from_endpoint`] with `cfg.max_in_flight` and `cfg.connect_timeout`).
    ///
    /// **Datagram size.** With [`ErpcConfig::udp_mtu`] unset, the client derives its size from
    /// the server's address ([`path_mtu`](super::datagram::path_mtu)); where the server
    /// derived another (a different link MTU or receive buffer on its side), its refusal
    /// (`ConfigMismatch`, field `mtu`) names its size, and the client connects once more with
    /// that size, within the same `connect_timeout`. A size set explicitly is never changed.
    ///
    /// # Errors
    /// The transport's setup errors, and those of [`Erpc::from_endpoint`].
    pub fn connect_with(
        addr: &T::ConnectAddr,
        service: &'static ServiceDescriptor,
        cfg: &ErpcConfig,
    ) -> Result<Self, ErpcSetupError> {
        let start = Instant::now();
        match Self::connect_once(addr, service, cfg, cfg.connect_timeout) {
            Err(ErpcSetupError::Refused(core::SessionError::ConfigMismatch {
                field: core::ConfigField::Mtu,
                server,
                ..
            })) if T::MTU_FROM_UDP_CONFIG && cfg.udp_mtu.is_none() => {
                tracing::debug!("eRPC connect: adopting the server's datagram size {server} B");
                let adopted = ErpcConfig {
                    // Out of range (a lying server): the transport refuses it at bind.
                    udp_mtu: Some(usize::try_from(server).unwrap_or(usize::MAX)),
                    ..cfg.clone()
                };
                let left = cfg.connect_timeout.saturating_sub(start.elapsed());
                Self::connect_once(addr, service, &adopted, left)
            }
            other => other,
        }
    }

    /// One attempt of [`Erpc::connect_with`] with `timeout` instead of `cfg.connect_timeout`.
    fn connect_once(
        addr: &T::ConnectAddr,
        service: &'static ServiceDescriptor,
        cfg: &ErpcConfig,
        timeout: Duration,
    ) -> Result<Self, ErpcSetupError> {
        let core = service_config(service, &cfg.core);
        check_endpoint(&core, service, LimitSide::ThisClient)?;
        let (transport, server) = T::open_client(addr, cfg)?;
        let ep = Endpoint::new(transport, core)?;
        let mut t = Erpc::from_endpoint(ep, server, service, cfg.max_in_flight, timeout)?;
        t.set_client_idle(cfg.client_idle);
        Ok(t)
    }
}

impl<T: DatagramTransport> Erpc<T> {
    /// Wraps `ep` (an endpoint of `service`: its configuration from [`service_config`]; used
    /// by nothing else) and connects it to the eRPC server at `server`: opens
    /// `ceil(max_in_flight / 8)` sessions and runs the event loop until all are connected.
    ///
    /// # Errors
    /// [`ErpcSetupError::Invalid`] if the endpoint's fingerprint is not the service's or
    /// `max_in_flight` is not in `1..=`[`MAX_IN_FLIGHT_LIMIT`];
    /// [`ErpcSetupError::Capacity`] if its `max_msg_size` cannot carry the service's
    /// messages; [`ErpcSetupError::SchemaMismatch`] / [`ErpcSetupError::Refused`] if the
    /// server refused a session; [`ErpcSetupError::NoAnswer`] if it did not answer within the
    /// core's failure timeout; [`ErpcSetupError::Timeout`] after `timeout`;
    /// [`ErpcSetupError::Session`] if the endpoint has no free session numbers.
    pub fn from_endpoint(
        ep: Endpoint<T>,
        server: T::Addr,
        service: &'static ServiceDescriptor,
        max_in_flight: usize,
        timeout: Duration,
    ) -> Result<Self, ErpcSetupError> {
        let cfg = ep.rpc().config();
        check_endpoint(cfg, service, LimitSide::ThisClient)?;
        if max_in_flight == 0 || max_in_flight > MAX_IN_FLIGHT_LIMIT {
            return Err(ErpcSetupError::Invalid(
                "max_in_flight must be in 1..=MAX_IN_FLIGHT_LIMIT",
            ));
        }
        // Staleness bound (module docs): the last keepalive exchange may be up to `keepalive`
        // old when the loop stops, and the peer gives up `failure_timeout` after it.
        let stale_after =
            Duration::from_nanos(cfg.failure_timeout.saturating_sub(cfg.keepalive) / 2);
        let n_sess = max_in_flight.div_ceil(SLOTS_PER_SESSION);
        // Tokens handed out round-robin over the sessions: 0, 8, 16, .., 1, 9, ..
        let mut order: Vec<u32> = (0..SLOTS_PER_SESSION)
            .flat_map(|j| (0..n_sess).map(move |s| s * SLOTS_PER_SESSION + j))
            .filter(|&t| t < max_in_flight)
            .map(|t| t as u32)
            .collect();
        order.reverse();
        let mut t = Erpc {
            ep,
            server,
            service,
            sessions: vec![
                Sess {
                    id: None,
                    opened: 0
                };
                n_sess
            ]
            .into_boxed_slice(),
            old: Vec::with_capacity(n_sess),
            free: order,
            pending: vec![false; max_in_flight].into_boxed_slice(),
            in_flight: 0,
            req_cap: service.max_request_bytes,
            failed: None,
            last_session_error: None,
            last_loop: Instant::now(),
            stale_after,
            stats: ErpcClientStats::default(),
            call_wait: Some(CallWait::new(IdleConfig::default(), usable_cpus())),
        };
        for i in 0..n_sess {
            t.new_session(i).map_err(ErpcSetupError::Session)?;
        }
        // A timeout too long for the clock (e.g. `Duration::MAX`) leaves the core's
        // `failure_timeout` as the bound (a server that never answers fails the sessions).
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let work = t.ep.run_event_loop_once();
            t.last_loop = Instant::now();
            while let Some(ev) = t.ep.poll_event() {
                // No calls yet: nothing to deliver.
                let _ = t.on_event(ev);
            }
            if t.sessions.iter().any(|s| s.id.is_none()) {
                return Err(match t.last_session_error {
                    Some(core::SessionError::SchemaMismatch { server }) => {
                        ErpcSetupError::SchemaMismatch {
                            service: service.name,
                            expected: service.fingerprint,
                            found: server,
                        }
                    }
                    Some(core::SessionError::PeerFailed) | None => ErpcSetupError::NoAnswer,
                    Some(e) => ErpcSetupError::Refused(e),
                });
            }
            let ep = &t.ep;
            if t.sessions
                .iter()
                .all(|s| s.id.is_some_and(|id| ep.is_connected(id)))
            {
                return Ok(t);
            }
            if deadline.is_some_and(|d| t.last_loop >= d) {
                return Err(ErpcSetupError::Timeout(timeout));
            }
            if work == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// The endpoint (counters: [`Endpoint::core_stats`], [`Endpoint::loop_stats`], the
    /// transport's through [`Endpoint::transport`]).
    pub fn endpoint(&self) -> &Endpoint<T> {
        &self.ep
    }

    /// The server's datagram address.
    pub fn server_addr(&self) -> T::Addr {
        self.server
    }

    /// The service this transport was connected for.
    pub fn service(&self) -> &'static ServiceDescriptor {
        self.service
    }

    /// This client's counters.
    pub fn stats(&self) -> ErpcClientStats {
        self.stats
    }

    /// Whether the blocking-call policy ([`CallWait`], off: never) says that a call that
    /// has polled without a response for `waited` should block now.
    fn call_wait_blocks(&mut self, waited: Duration) -> bool {
        let Some(w) = &mut self.call_wait else {
            return false;
        };
        let now = self.ep.clock();
        let waited = Time::try_from(waited.as_nanos()).unwrap_or(Time::MAX);
        w.should_block(now, waited, runnable_threads)
    }

    /// Sets when a blocking call blocks in the transport ([`ErpcConfig::client_idle`];
    /// [`Erpc::from_endpoint`] starts with [`IdleConfig::default`]); `None`: never.
    pub fn set_client_idle(&mut self, cfg: Option<IdleConfig>) {
        self.call_wait = cfg.map(|c| CallWait::new(c, usable_cpus()));
    }

    /// The counters of the blocking calls' wait policy ([`ErpcConfig::client_idle`]);
    /// `None` if it is off.
    pub fn call_wait_stats(&self) -> Option<CallWaitStats> {
        self.call_wait.as_ref().map(CallWait::stats)
    }

    /// Sessions to the server (`ceil(max_in_flight / 8)`).
    pub fn num_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Calls sent and not yet delivered or failed.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether a failed call (or a refused session) made this transport fail: every call
    /// then fails with [`RpcError::ServerDisconnected`] until [`Erpc::reconnect`].
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Why the transport failed ([`Erpc::is_failed`]), else why the last session that ended
    /// with an error did (e.g. [`core::SessionError::PeerFailed`]: the server was silent for the
    /// failure timeout; [`core::SessionError::SessionLost`]: it no longer knew the session, as
    /// after a restart), if any.
    pub fn last_failure(&self) -> Option<core::SessionError> {
        self.failed.or(self.last_session_error)
    }

    /// Reconnects after a failure (module docs, "A server that disappears"): clears the
    /// failed state and replaces every session that has no call in flight by a new one to the
    /// same server address (disconnecting the old one if it is still connected). Does not
    /// wait: the new sessions connect in the background, and calls issued meanwhile wait in
    /// the core's backlog until they are connected, or fail with
    /// [`RpcError::ServerDisconnected`] if the server does not answer within the core's
    /// `failure_timeout` or refuses the session (then call `reconnect` again later). Calls
    /// still in flight keep their sessions (moving them could execute them twice); they
    /// complete or fail on their own.
    ///
    /// # Errors
    /// [`ErpcSetupError::Session`] if the endpoint cannot create a session (all session
    /// numbers in use, or its receive ring has no room for another session); a failed
    /// transport then stays failed.
    #[cold]
    pub fn reconnect(&mut self) -> Result<(), ErpcSetupError> {
        for i in 0..self.sessions.len() {
            let busy = self.pending[i * SLOTS_PER_SESSION..]
                .iter()
                .take(SLOTS_PER_SESSION)
                .any(|&p| p);
            if busy {
                continue;
            }
            if let Some(id) = self.sessions[i].id.take() {
                if self.ep.is_connected(id) {
                    let _ = self.ep.destroy_session(id);
                }
                // Its final event (disconnected or failed) removes it from `old`.
                self.old.push(id);
            }
            self.new_session(i).map_err(ErpcSetupError::Session)?;
        }
        self.failed = None;
        self.last_session_error = None;
        self.stats.reconnects += 1;
        tracing::debug!(
            service = self.service.name,
            "erpc: reconnecting: new sessions opened"
        );
        Ok(())
    }

    /// One iteration of the event loop; with nothing in flight, first gives up sessions that
    /// went stale during an idle gap (module docs).
    #[inline]
    fn run_loop(&mut self) -> usize {
        if self.in_flight == 0 {
            self.check_stale();
        }
        let work = self.ep.run_event_loop_once();
        self.last_loop = Instant::now();
        work
    }

    /// With nothing in flight: if the loop has not run for `stale_after`, disconnects every
    /// session (the peer may have dropped it meanwhile) so that the next calls open new ones.
    #[inline]
    fn check_stale(&mut self) {
        if self.last_loop.elapsed() >= self.stale_after {
            self.abandon_sessions();
        }
    }

    #[cold]
    #[inline(never)]
    fn abandon_sessions(&mut self) {
        let mut any = false;
        for s in self.sessions.iter_mut() {
            if let Some(id) = s.id.take() {
                if self.ep.is_connected(id) {
                    // Idle (nothing in flight): the disconnect request tells the server.
                    let _ = self.ep.destroy_session(id);
                }
                // Its final event (disconnected or failed) removes it from `old`; a session
                // still connecting is disconnected once it connects.
                self.old.push(id);
                any = true;
            }
        }
        if any {
            self.stats.stale_renewals += 1;
            tracing::debug!(
                service = self.service.name,
                idle = ?self.last_loop.elapsed(),
                "erpc: sessions stale after an idle gap; opening new ones for the next calls"
            );
        }
    }

    /// Creates a session for slot group `i`.
    fn new_session(&mut self, i: usize) -> Result<SessionId, ErpcCallError> {
        let id = self.ep.create_session(self.server)?;
        self.stats.sessions_opened += 1;
        self.sessions[i] = Sess {
            id: Some(id),
            opened: self.stats.sessions_opened,
        };
        Ok(id)
    }

    /// Opens a session for slot group `i` (after a failure or a stale gap); requests wait in
    /// the core's backlog until it is connected.
    #[cold]
    #[inline(never)]
    fn open_session(&mut self, i: usize) -> Result<SessionId, RpcError> {
        match self.new_session(i) {
            Ok(id) => Ok(id),
            Err(e) => {
                tracing::debug!(
                    service = self.service.name,
                    error = %e,
                    "erpc: cannot open a session"
                );
                Err(RpcError::ServerDisconnected)
            }
        }
    }

    /// Marks `tag` delivered or failed: frees its token if it is one of ours in flight.
    #[inline]
    fn finish(&mut self, tag: u64) -> Option<u32> {
        let tok = u32::try_from(tag).ok()?;
        let p = self.pending.get_mut(tok as usize)?;
        if !std::mem::replace(p, false) {
            return None;
        }
        self.in_flight -= 1;
        self.free.push(tok);
        Some(tok)
    }

    /// Handles one event; returns the token and data of a response to deliver.
    #[inline]
    fn on_event(&mut self, ev: Event) -> Option<(u32, MsgBuffer)> {
        match ev {
            Event::Response { tag, data, .. } => match self.finish(tag) {
                Some(tok) => {
                    self.stats.responses += 1;
                    Some((tok, data))
                }
                None => {
                    self.stats.stray_events += 1;
                    None
                }
            },
            ev => {
                self.on_other_event(ev);
                None
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn on_other_event(&mut self, ev: Event) {
        match ev {
            Event::RequestFailed { tag, error, .. } => {
                if self.finish(tag).is_some() {
                    self.stats.failed_calls += 1;
                    if self.failed.is_none() {
                        tracing::debug!(
                            service = self.service.name,
                            %error,
                            "erpc: a call failed; the server is considered gone"
                        );
                    }
                    self.failed.get_or_insert(error);
                } else {
                    self.stats.stray_events += 1;
                }
            }
            Event::SessionConnected(id) => {
                if self.old.contains(&id) {
                    let _ = self.ep.destroy_session(id);
                }
            }
            Event::SessionFailed { session, error } => self.session_ended(session, Some(error)),
            Event::SessionDisconnected(id) => self.session_ended(id, None),
            Event::Response { .. } | Event::Request { .. } | Event::ServerSessionClosed(_) => {
                self.stats.stray_events += 1;
            }
        }
    }

    /// Session `id` is gone (freed by the core).
    fn session_ended(&mut self, id: SessionId, error: Option<core::SessionError>) {
        // A session given up on is always found here first: the core frees a session number
        // (and queues its final event) before it can reuse it for a new session.
        if let Some(p) = self.old.iter().position(|&o| o == id) {
            self.old.swap_remove(p);
            return;
        }
        // A session that failed is freed at once, and its number may be reused by a session
        // opened before its final event was seen here: then two groups name the number, and
        // the older one's session is the one that ended (its event comes first).
        let Some(s) = self
            .sessions
            .iter_mut()
            .filter(|s| s.id == Some(id))
            .min_by_key(|s| s.opened)
        else {
            return;
        };
        s.id = None;
        self.last_session_error = error;
        // The server would refuse a new session as well. (Failed calls, if any, already
        // failed the transport; an idle session is replaced by the next call.)
        if let Some(
            e @ (core::SessionError::SchemaMismatch { .. }
            | core::SessionError::ConfigMismatch { .. }
            | core::SessionError::NoRingEntries { .. }
            | core::SessionError::SourceLimit { .. }
            | core::SessionError::NoResources),
        ) = error
        {
            self.failed.get_or_insert(e);
        }
    }

    /// Delivers every response queued in the core.
    #[inline]
    fn drain(&mut self, on_response: &mut impl FnMut(u32, &[u8])) -> usize {
        let mut n = 0;
        while let Some(ev) = self.ep.poll_event() {
            if let Some((tok, data)) = self.on_event(ev) {
                on_response(tok, &data);
                // Back to the core's free list: the next message reuses it.
                self.ep.recycle(data);
                n += 1;
            }
        }
        n
    }

    #[cold]
    fn enqueue_error(&mut self, e: ErpcCallError, i: usize) -> RpcError {
        match e {
            ErpcCallError::TooLarge(len) => RpcError::MessageTooLarge {
                len,
                cap: self.ep.rpc().config().max_msg_size,
                setting: SETTING_MAX_MSG_SIZE,
            },
            // Out of memory for the request's message buffer: nothing was queued; retry.
            ErpcCallError::NoBuffer => RpcError::WouldBlock,
            // The session was freed by a failure whose event is still queued: the next poll
            // handles it (and fails the transport if calls failed with it); retry after it.
            _ => {
                if let Some(id) = self.sessions[i].id.take() {
                    self.old.push(id);
                }
                RpcError::WouldBlock
            }
        }
    }
}

impl<T: DatagramTransport> Drop for Erpc<T> {
    /// With nothing in flight, disconnects the sessions (best effort: one loop iteration
    /// sends the requests, nothing waits for the answers), so that the server frees them at
    /// once instead of after its failure timeout.
    fn drop(&mut self) {
        if self.in_flight != 0 {
            return;
        }
        let mut any = false;
        for s in self.sessions.iter() {
            if let Some(id) = s.id
                && self.ep.is_connected(id)
            {
                any |= self.ep.destroy_session(id).is_ok();
            }
        }
        if any {
            self.ep.run_event_loop_once();
        }
    }
}

impl<T: ErpcConnect> ClientTransport for Erpc<T> {
    type Addr = T::ConnectAddr;

    /// [`Erpc::connect_with`] with [`ErpcConfig::default`].
    ///
    /// # Errors
    /// [`RpcError::SchemaMismatch`] if the server serves another schema (`found` is the
    /// server's fingerprint); [`RpcError::CapacityMismatch`] if the service's messages exceed the
    /// core's `max_msg_size`; [`RpcError::Transport`] ([`ErpcSetupError`]) for every other failure (no answer,
    /// refused, timeout, socket error; module docs, "Errors").
    fn connect(
        addr: &T::ConnectAddr,
        service: &'static ServiceDescriptor,
    ) -> Result<Self, RpcError> {
        Self::connect_with(addr, service, &ErpcConfig::default()).map_err(Into::into)
    }

    #[inline]
    fn max_in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Encodes the request into the preallocated buffer and enqueues it on the token's
    /// session (its packets leave at the next poll). With nothing in flight, sessions that
    /// went stale are replaced first (module docs).
    ///
    /// # Errors
    /// [`RpcError::WouldBlock`] when `max_in_flight` calls are in flight (or, rarely, the
    /// session just failed: poll and retry); [`RpcError::ServerDisconnected`] once a call
    /// failed, or the server refused a session; [`RpcError::MessageTooLarge`] if `encode`
    /// returned more than the service's `max_request_bytes` or the core's `max_msg_size`.
    #[inline]
    fn send(
        &mut self,
        _timeout: std::time::Duration,
        _method_id: u16,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RpcError> {
        if self.failed.is_some() {
            return Err(RpcError::ServerDisconnected);
        }
        if self.in_flight == 0 {
            self.check_stale();
        }
        let Some(tok) = self.free.pop() else {
            return Err(RpcError::WouldBlock);
        };
        let i = tok as usize / SLOTS_PER_SESSION;
        let session = match self.sessions[i].id {
            Some(id) => id,
            None => match self.open_session(i) {
                Ok(id) => id,
                Err(e) => {
                    self.free.push(tok);
                    return Err(e);
                }
            },
        };
        // Encoded straight into the slot's request message buffer (seeds/000 §3), from
        // which its packets are sent.
        let cap = self.req_cap;
        let mut written = 0;
        let res =
            self.ep
                .enqueue_request_with(session, REQ_TYPE_CALL, u64::from(tok), cap, |buf| {
                    written = encode(buf);
                    written
                });
        if written > cap {
            self.free.push(tok);
            return Err(RpcError::MessageTooLarge {
                len: written,
                cap,
                setting: SETTING_SERVICE_MAX,
            });
        }
        match res {
            Ok(()) => {
                self.pending[tok as usize] = true;
                self.in_flight += 1;
                self.stats.calls += 1;
                Ok(tok)
            }
            Err(e) => {
                self.free.push(tok);
                Err(self.enqueue_error(e, i))
            }
        }
    }

    /// Delivers responses the core has queued, runs the event loop once (sending what was
    /// enqueued, receiving, running timers) and delivers what arrived.
    ///
    /// # Errors
    /// [`RpcError::ServerDisconnected`] once a call failed (its session failed: the server is
    /// gone or refused) and no response is left to deliver; failed calls are never
    /// delivered.
    #[inline]
    fn poll(&mut self, mut on_response: impl FnMut(u32, &[u8])) -> Result<usize, RpcError> {
        let mut n = self.drain(&mut on_response);
        self.run_loop();
        n += self.drain(&mut on_response);
        if n == 0 && self.failed.is_some() {
            return Err(RpcError::ServerDisconnected);
        }
        Ok(n)
    }

    /// Blocks in the endpoint's transport ([`Endpoint::wait_for_datagram`], bounded by `max`
    /// and the core's next timer) if [`CallWait`] says so for a call that has waited
    /// `waited` (module [`idle`](super::idle), "A blocking call"); counted in
    /// [`ErpcClientStats::idle_waits`]. `false` without blocking otherwise, and from then on
    /// if the transport cannot wait.
    fn wait_for_response(&mut self, waited: Duration, max: Duration) -> bool {
        if !self.call_wait_blocks(waited) {
            return false;
        }
        match self.ep.wait_for_datagram(max) {
            // Work without a datagram (a timer is due, packets queued): poll at once.
            None => true,
            Some(RxWait::Unsupported) => {
                self.call_wait = None;
                false
            }
            Some(RxWait::Ready | RxWait::TimedOut) => {
                self.stats.idle_waits += 1;
                true
            }
        }
    }
}

/// The blocking wait of a client of several servers ([`Erpc`] connections, each its own
/// endpoint and socket): one `ppoll` over all their sockets, so that a response from any of
/// them ends it (a wait in one socket would hold up the others' responses). The policy is
/// [`ClientTransport::wait_for_response`]'s: the first connection's [`CallWait`] decides,
/// for a caller whose polls of every connection found nothing for `waited`; the wait lasts
/// at most `max` and never past any connection's next timer. Counted in the first
/// connection's [`ErpcClientStats::idle_waits`].
///
/// Returns `true` if it waited, or if a connection has work now (the caller polls at once);
/// `false` without waiting if the policy says not to (or is off on the first connection),
/// if a connection's transport cannot wait, or for no connection at all.
pub fn wait_for_any_response<'a, T: DatagramTransport + 'a>(
    clients: impl IntoIterator<Item = &'a mut Erpc<T>>,
    waited: Duration,
    max: Duration,
) -> bool {
    let mut clients = clients.into_iter();
    let Some(first) = clients.next() else {
        return false;
    };
    if !first.call_wait_blocks(waited) {
        return false;
    }
    // The cold path of an idle client: one small allocation per wait is not on any hot path.
    let mut fds = Vec::new();
    let mut bound = max;
    let mut target = |c: &mut Erpc<T>| match c.ep.wait_target(max) {
        None | Some((RxFd::Ready, _)) => Some(true),
        Some((RxFd::Unsupported, _)) => Some(false),
        Some((RxFd::Fd(fd), b)) => {
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            bound = bound.min(b);
            None
        }
    };
    if let Some(now) = target(first) {
        return now;
    }
    for c in clients {
        if let Some(now) = target(c) {
            return now;
        }
    }
    // An error (EINTR, ...) ends the wait like a datagram: the caller polls next.
    let _ = ppoll_readable(&mut fds, bound);
    first.stats.idle_waits += 1;
    true
}

/// Counters of an [`ErpcServer`] (monotonically increasing; the core's are in
/// [`Endpoint::core_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErpcServerStats {
    /// Requests received (zero-copy and copied).
    pub requests: u64,
    /// Requests lent out in place from the receive ring (single-packet, zero-copy).
    pub zero_copy_requests: u64,
    /// Replies handed to the core.
    pub replies: u64,
    /// Replies refused: stale token (already answered, or the client's session is gone), or
    /// larger than the core's `max_msg_size`.
    pub dropped_replies: u64,
    /// Server sessions freed (client disconnected, or silent for the failure timeout).
    pub sessions_closed: u64,
    /// Client-role events on the server's endpoint (it opens no sessions), dropped.
    pub stray_events: u64,
    /// Waits of an idle serve loop in the transport ([`ServerTransport::wait_for_request`],
    /// the runner's park): each ends with a datagram or at its timeout.
    pub idle_waits: u64,
}

/// Server transport over an eRPC [`Endpoint`] of its own: any number of clients, each with
/// its sessions (module docs).
///
/// `ReplyToken` is the core's [`ReqToken`]; a token answers exactly one request, once.
pub struct ErpcServer<T: DatagramTransport = UdpTransport> {
    ep: Endpoint<T>,
    service: &'static ServiceDescriptor,
    /// Requests received, not yet handed out.
    queue: VecDeque<(ReqToken, MsgBuffer)>,
    /// Requests handed out by `recv` since the last `flush`.
    lent: Vec<MsgBuffer>,
    /// A zero-copy iteration is open: `rx_burst_zc` ran, `finish_iteration` not yet.
    zc_open: bool,
    /// Zero-copy messages of the open iteration, and the next one `recv` hands out.
    zc_count: usize,
    zc_next: usize,
    /// Largest reply in bytes (the service's `max_response_bytes`): the room `reply`'s
    /// encoder gets in the slot's response message buffer.
    reply_cap: usize,
    /// Replies given since the loop last ran.
    dirty: bool,
    stats: ErpcServerStats,
}

impl<T: DatagramTransport + std::fmt::Debug> std::fmt::Debug for ErpcServer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErpcServer")
            .field("service", &self.service.name)
            .field("local_addr", &self.ep.local_addr())
            .field("queued", &self.queue.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Initial capacity of the request queue and the lent list (requests; they grow if needed).
const SERVER_QUEUE: usize = 1024;

impl ErpcServer<UdpTransport> {
    /// A server of `service` on a UDP socket bound to `addr` (port 0 picks a free port:
    /// [`ErpcServer::local_addr`] tells which), with [`ErpcConfig::default`].
    ///
    /// # Errors
    /// As [`ErpcServer::bind_with`].
    pub fn bind(
        addr: SocketAddr,
        service: &'static ServiceDescriptor,
    ) -> Result<Self, ErpcSetupError> {
        Self::bind_with(addr, service, &ErpcConfig::default())
    }

    /// A server of `service` on a UDP socket bound to `addr`, configured by `cfg` (its
    /// `core` and UDP fields).
    ///
    /// # Errors
    /// [`ErpcSetupError::Capacity`] if the service's messages exceed `cfg.core.max_msg_size`;
    /// [`ErpcSetupError::Io`] if the socket cannot be bound; [`ErpcSetupError::Config`] if
    /// the core refuses the configuration.
    pub fn bind_with(
        addr: SocketAddr,
        service: &'static ServiceDescriptor,
        cfg: &ErpcConfig,
    ) -> Result<Self, ErpcSetupError> {
        let core = service_config(service, &cfg.core);
        check_endpoint(&core, service, LimitSide::ThisServer)?;
        let transport = UdpTransport::bind(cfg.udp(addr))?;
        Self::from_endpoint(Endpoint::new(transport, core)?, service)
    }

    /// [`ErpcServer::bind`] for service `S`, wrapped in a typed [`crate::Server`].
    ///
    /// # Errors
    /// As [`ErpcServer::bind`].
    pub fn serve<S: Service>(addr: SocketAddr) -> Result<crate::Server<S, Self>, ErpcSetupError> {
        Ok(crate::Server::new(Self::bind(addr, S::DESCRIPTOR)?))
    }
}

impl<T: DatagramTransport> ErpcServer<T> {
    /// Serves `service` on `ep` (an endpoint whose configuration came from
    /// [`service_config`]; used by nothing else).
    ///
    /// # Errors
    /// [`ErpcSetupError::Invalid`] if the endpoint's fingerprint is not the service's;
    /// [`ErpcSetupError::Capacity`] if its `max_msg_size` cannot carry the service's
    /// messages.
    pub fn from_endpoint(
        ep: Endpoint<T>,
        service: &'static ServiceDescriptor,
    ) -> Result<Self, ErpcSetupError> {
        check_endpoint(ep.rpc().config(), service, LimitSide::ThisServer)?;
        Ok(ErpcServer {
            ep,
            service,
            queue: VecDeque::with_capacity(SERVER_QUEUE),
            lent: Vec::with_capacity(SERVER_QUEUE),
            zc_open: false,
            zc_count: 0,
            zc_next: 0,
            reply_cap: service.max_response_bytes,
            dirty: false,
            stats: ErpcServerStats::default(),
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> T::Addr {
        self.ep.local_addr()
    }

    /// The endpoint (counters: [`Endpoint::core_stats`], [`Endpoint::loop_stats`], the
    /// transport's through [`Endpoint::transport`]).
    pub fn endpoint(&self) -> &Endpoint<T> {
        &self.ep
    }

    /// The service served.
    pub fn service(&self) -> &'static ServiceDescriptor {
        self.service
    }

    /// This server's counters.
    pub fn stats(&self) -> ErpcServerStats {
        self.stats
    }

    /// Runs the event loop once and queues the requests that completed.
    #[inline]
    fn run_loop(&mut self) {
        self.finish_zc();
        self.ep.run_event_loop_once();
        self.dirty = false;
        self.drain_events();
    }

    /// Finishes an open zero-copy iteration: re-posts the receive burst (the lent requests
    /// become invalid), runs the timers and transmits.
    #[inline]
    fn finish_zc(&mut self) {
        if self.zc_open {
            self.zc_open = false;
            self.zc_count = 0;
            self.zc_next = 0;
            self.ep.finish_iteration();
            self.dirty = false;
            self.drain_events();
        }
    }

    /// Queues copied requests and counts the other events.
    #[inline]
    fn drain_events(&mut self) {
        while let Some(ev) = self.ep.poll_event() {
            match ev {
                Event::Request { token, data, .. } => {
                    self.stats.requests += 1;
                    self.queue.push_back((token, data));
                }
                Event::ServerSessionClosed(_) => self.stats.sessions_closed += 1,
                _ => self.stats.stray_events += 1,
            }
        }
    }
}

impl<T: DatagramTransport> ErpcServer<T> {
    /// Counts and maps the core's outcome of a reply whose encoder wrote `written` bytes
    /// (of at most the service's `max_response_bytes`).
    #[inline]
    fn replied(&mut self, res: Result<(), ErpcCallError>, written: usize) -> Result<(), RpcError> {
        let cap = self.reply_cap;
        if written > cap {
            self.stats.dropped_replies += 1;
            return Err(RpcError::MessageTooLarge {
                len: written,
                cap,
                setting: SETTING_SERVICE_MAX,
            });
        }
        match res {
            Ok(()) => {
                self.stats.replies += 1;
                self.dirty = true;
                Ok(())
            }
            Err(e) => {
                self.stats.dropped_replies += 1;
                Err(RpcError::ReplyDropped(match e {
                    ErpcCallError::TooLarge(_) => {
                        "the reply exceeds the eRPC endpoint's max_msg_size"
                    }
                    ErpcCallError::NoBuffer => {
                        "no message buffer for the reply: mapping its memory failed"
                    }
                    _ => {
                        "the request was already answered, or its client's session is gone (stale token)"
                    }
                }))
            }
        }
    }
}

impl<T: DatagramTransport> ServerTransport for ErpcServer<T> {
    type ReplyToken = ReqToken;

    /// Finishes the previous iteration if still open (timers, transmit), then receives a
    /// burst: single-packet requests stay in place for `recv` (module docs, "Zero copy"),
    /// multi-packet ones are queued. Returns the requests available to `recv`.
    #[inline]
    fn poll(&mut self) -> usize {
        self.finish_zc();
        let n = self.ep.rx_burst_zc();
        self.zc_open = true;
        self.zc_count = n;
        self.zc_next = 0;
        self.dirty = false;
        self.stats.requests += n as u64;
        self.drain_events();
        n + self.queue.len()
    }

    /// The next request: first the single-packet ones of the current burst, in place in the
    /// receive ring, then the copied (multi-packet) ones in arrival order.
    #[inline]
    fn recv(&mut self) -> Option<(ReqToken, &[u8])> {
        while self.zc_next < self.zc_count {
            let k = self.zc_next;
            self.zc_next += 1;
            if let (core::Zc::Request { token, .. }, data) = self.ep.zc(k) {
                self.stats.zero_copy_requests += 1;
                return Some((token, data));
            }
            // A response on a server endpoint (it opens no sessions): ignored.
            self.stats.stray_events += 1;
        }
        let (token, data) = self.queue.pop_front()?;
        self.lent.push(data);
        let msg = self.lent.last().map_or(&[][..], |d| &d[..]);
        Some((token, msg))
    }

    /// Encodes the reply into the preallocated buffer and hands it to the core
    /// ([`Endpoint::reply`]); it leaves at the next poll or flush.
    ///
    /// # Errors
    /// [`RpcError::ReplyDropped`] if the token is stale (already answered, or the client's
    /// session was freed: client gone) or the reply exceeds the core's `max_msg_size`;
    /// [`RpcError::MessageTooLarge`] if `encode` returned more than the service's
    /// `max_response_bytes` (nothing was sent).
    #[inline]
    fn reply(
        &mut self,
        token: ReqToken,
        _len: usize,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), RpcError> {
        // Encoded straight into the slot's response message buffer (seeds/000 §3), which
        // caches it for duplicates and from which its packets are sent.
        let cap = self.reply_cap;
        let mut written = 0;
        let res = self.ep.reply_with(token, cap, |buf| {
            written = encode(buf);
            written
        });
        self.replied(res, written)
    }

    /// Receives the next request and answers it with no copy of the reply: `handle` reads
    /// the request in place (a single-packet request in the transport's receive ring,
    /// [`Endpoint::reply_zc`]; a multi-packet one in its reassembly buffer, which then
    /// returns to the core's free list) and writes the reply straight into the session
    /// slot's response message buffer, from which its packets are sent (seeds/000 §3; over
    /// mlx5 UD gathered by the NIC). `scratch` is not used.
    ///
    /// # Errors
    /// As [`reply`](Self::reply). If the slot's response buffer cannot be mapped
    /// ([`core::ErpcCallError::NoBuffer`]) `handle` does not run and the reply is dropped (the
    /// client's call ends by its deadline).
    #[inline]
    fn serve_next(
        &mut self,
        _scratch: &mut [u8],
        handle: impl FnOnce(&[u8], &mut [u8]) -> usize,
    ) -> Option<Result<(), RpcError>> {
        let cap = self.reply_cap;
        let mut written = 0;
        while self.zc_next < self.zc_count {
            let k = self.zc_next;
            self.zc_next += 1;
            if !matches!(self.ep.zc(k).0, core::Zc::Request { .. }) {
                // A response on a server endpoint (it opens no sessions): ignored.
                self.stats.stray_events += 1;
                continue;
            }
            self.stats.zero_copy_requests += 1;
            let res = self.ep.reply_zc(k, cap, |_, req, out| {
                written = handle(req, out);
                written
            });
            return Some(self.replied(res, written));
        }
        let (token, data) = self.queue.pop_front()?;
        let res = self.ep.reply_with(token, cap, |out| {
            written = handle(&data, out);
            written
        });
        self.ep.recycle(data);
        Some(self.replied(res, written))
    }

    /// Returns the buffers of the copied requests handed out by `recv` to the core's free
    /// list ([`Endpoint::recycle`]) and finishes an open zero-copy iteration (re-posts the
    /// receive burst, runs the timers, transmits the replies given so far); else, if replies
    /// were given since the loop last ran, runs it once to send them (requests received
    /// meanwhile are queued for the next poll). Tokens stay valid.
    #[inline]
    fn flush(&mut self) {
        for buf in self.lent.drain(..) {
            self.ep.recycle(buf);
        }
        if self.zc_open {
            self.finish_zc();
        } else if self.dirty {
            self.run_loop();
        }
    }

    /// Closes the open iteration, then waits in the endpoint's transport
    /// ([`Endpoint::wait_for_datagram`]): at most `timeout` and never past the core's next
    /// timer (retransmission, keepalive, session reaping); at once with `true` if the loop
    /// has work without a datagram. `false` if the transport cannot wait (mlx5 UD on the
    /// device model): the runner parks instead.
    fn wait_for_request(&mut self, timeout: std::time::Duration) -> bool {
        self.finish_zc();
        match self.ep.wait_for_datagram(timeout) {
            None => true,
            Some(RxWait::Unsupported) => false,
            Some(RxWait::Ready | RxWait::TimedOut) => {
                self.stats.idle_waits += 1;
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_server_addresses_are_reached_on_loopback() {
        let a: SocketAddr = "0.0.0.0:7".parse().unwrap();
        assert_eq!(reachable(a), "127.0.0.1:7".parse().unwrap());
        let a: SocketAddr = "[::]:7".parse().unwrap();
        assert_eq!(reachable(a), "[::1]:7".parse().unwrap());
        for a in ["10.1.2.3:9", "127.0.0.1:9", "[fe80::1]:9"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(reachable(a), a);
        }
    }

    #[test]
    fn udp_settings_follow_the_address_family() {
        let cfg = ErpcConfig::default();
        let v4 = cfg.udp("127.0.0.1:0".parse().unwrap());
        let v6 = cfg.udp("[::1]:0".parse().unwrap());
        assert_eq!((v4.mtu, v6.mtu), (UdpMtu::Auto, UdpMtu::Auto));
        assert_eq!(v4.socket_buf_bytes, Some(DEFAULT_SOCKET_BUF_BYTES));
        let cfg = ErpcConfig {
            udp_mtu: Some(9000),
            udp_batch: 8,
            ..ErpcConfig::default()
        };
        let c = cfg.udp("[::1]:0".parse().unwrap());
        assert_eq!((c.mtu, c.batch), (UdpMtu::Fixed(9000), 8));
        assert!(cfg.core.keepalive < cfg.core.failure_timeout);
    }

    #[test]
    fn setup_errors_map_to_rpc_errors() {
        let e = ErpcSetupError::SchemaMismatch {
            service: "S",
            expected: 5,
            found: 6,
        };
        assert!(matches!(
            e.into_rpc_error(),
            RpcError::SchemaMismatch {
                service: "S",
                expected: 5,
                found: 6
            }
        ));
        let e = ErpcSetupError::Capacity {
            service: "S",
            side: LimitSide::ThisClient,
            what: MessageKind::Response,
            cap: 10,
            need: usize::MAX,
        };
        assert!(matches!(
            RpcError::from(e),
            RpcError::CapacityMismatch {
                what: MessageKind::Response,
                cap: 10,
                need: u32::MAX,
                ..
            }
        ));
        for e in [
            ErpcSetupError::NoAnswer,
            ErpcSetupError::Timeout(Duration::from_secs(1)),
            ErpcSetupError::Refused(core::SessionError::NoResources),
            ErpcSetupError::Invalid("x"),
            ErpcSetupError::Io(std::io::Error::other("x")),
        ] {
            assert!(e.into_rpc_error().transport::<ErpcSetupError>().is_some());
        }
    }

    #[test]
    fn endpoint_configuration_is_checked_against_the_service() {
        const M: &[crate::MethodDescriptor] = &[crate::MethodDescriptor {
            id: 0,
            name: "m",
            args: &[],
            ret_ty: "()",
            ret_size: 0,
            request_bytes: 100,
            response_bytes: 5000,
            var_request: false,
            var_response: false,
            var_align: 1,
        }];
        static S: ServiceDescriptor = ServiceDescriptor::new("S", M);
        let ok = service_config(&S, &Config::default());
        assert_eq!(ok.schema_fingerprint, S.fingerprint);
        assert!(check_endpoint(&ok, &S, LimitSide::ThisClient).is_ok());
        assert!(matches!(
            check_endpoint(&Config::default(), &S, LimitSide::ThisClient),
            Err(ErpcSetupError::Invalid(_))
        ));
        let small = Config {
            max_msg_size: 4096,
            ..ok.clone()
        };
        assert!(matches!(
            check_endpoint(&small, &S, LimitSide::ThisServer),
            Err(ErpcSetupError::Capacity {
                what: MessageKind::Response,
                cap: 4096,
                need: 5000,
                ..
            })
        ));
        // Nonces differ between endpoints.
        assert_ne!(
            service_config(&S, &Config::default()).token_nonce,
            service_config(&S, &Config::default()).token_nonce
        );
    }
}

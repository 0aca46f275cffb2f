//! Scaffolding shared by the RC transports (copyrpc, ScaleRPC), so that each rule lives in
//! one place:
//! - [`queues`]: RC QPs on a shared SRQ of zero-length receives, and its batched refill;
//! - [`rendezvous`]: the in-process connect rendezvous behind each transport's `Listener`
//!   (a client sends its connection information and waits, bounded, for the server's);
//! - [`liveness`]: when a client's liveness probe is due;
//! - [`ConnectRefusal`]: why a server refused such a connect request, and [`accept`], the
//!   server's loop answering them ([`Admit`]);
//! - [`RcSetupError`]: the one setup error, over each transport's core error ([`RcCore`]),
//!   and how setup errors map to [`RpcError`] ([`core_error`], [`connect_error`]);
//! - [`Refused`]: a call not issued, its reason and the caller's user data handed back
//!   (copyrpc's `CallError`, ScaleRPC's `ScaleCallError`);
//! - [`gap`]: whether a service's largest messages fit a transport's capacity;
//! - [`client`]: the client transport both implement over [`client::RcClient`] (send,
//!   poll, liveness probing);
//! - the connect timeout and liveness-probe defaults both transports share.

pub(crate) mod client;
pub(crate) mod liveness;
pub(crate) mod queues;
mod refused;
pub(crate) mod rendezvous;

pub use refused::Refused;

use std::time::Duration;

use crate::error::{LimitSide, MessageKind, RpcError, sat_u32};
use crate::service::ServiceDescriptor;
use rendezvous::{ExchangeError, Inbox};

/// Default connect timeout of an RC transport's client (copyrpc's `CopyrpcAddr::timeout`,
/// ScaleRPC's `ScaleRpcAddr::timeout`): how long `connect` waits for the server's answer.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default liveness-probe interval of an RC transport's client (`CopyrpcAddr::probe_interval`,
/// `ScaleRpcAddr::probe_interval`): with calls outstanding and nothing arriving, the client
/// checks its server this often, so a dead or stopped server is noticed.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// Empty polls between two readings of the clock by a client's liveness probe: keeps the
/// clock off the hot path, as the delegation ring does.
pub(crate) const PROBE_CHECK_POLLS: u32 = 1024;

/// Why a server refused a connect request sent through its `Listener`
/// ([`crate::copyrpc::Listener`], [`crate::scalerpc::Listener`]). copyrpc refuses with
/// `SchemaMismatch`, `Capacity` and `Setup`; ScaleRPC with `SchemaMismatch`, `Slots` and
/// `Setup`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnectRefusal {
    /// The server serves a service with another schema fingerprint.
    #[error("the server's schema fingerprint is {server:#018x}")]
    SchemaMismatch {
        /// The server's fingerprint.
        server: u64,
    },
    /// copyrpc: the negotiated ring cannot carry the service's largest messages.
    #[error(
        "largest {what} payload the rings carry is {cap} bytes, the service needs {need} ({side} {setting} is the limit)"
    )]
    Capacity {
        /// Which message kind does not fit.
        what: MessageKind,
        /// Largest payload in bytes.
        cap: u32,
        /// Bytes the service needs (saturated at `u32::MAX`).
        need: u32,
        /// Whose ring is the limit, as the server sees it ([`LimitSide::PeerClient`]: the
        /// client's; [`LimitSide::ThisServer`]: the server's).
        side: LimitSide,
        /// The setting to change ([`crate::RpcError::CapacityMismatch`]'s `setting`).
        setting: &'static str,
        /// Its least working value, where known.
        min: Option<u64>,
    },
    /// ScaleRPC: the client's slots are smaller or fewer than the server's.
    #[error(
        "the server's slots are {slot_size} B x {slots_per_conn} per connection; the client's must be at least as large and as many (ScaleRPC ClientConfig::slot_size and slots_per_conn: ScaleRpcAddr::new takes the server's)"
    )]
    Slots {
        /// The server's slot size in bytes.
        slot_size: u32,
        /// The server's slots per connection.
        slots_per_conn: u32,
    },
    /// The server could not create, accept or connect the connection (too many
    /// connections, a device error: the device's or the core's message).
    #[error("server-side setup failed: {0}")]
    Setup(String),
}

/// The core error of an RC transport ([`crate::copyrpc::SetupError`],
/// [`crate::scalerpc::ScaleError`]), as [`RcSetupError`] carries it.
pub trait RcCore: std::error::Error + Send + Sync + 'static {
    /// The transport's name in messages (`copyrpc`, `scalerpc`).
    const TRANSPORT: &'static str;

    /// `(ours, theirs)` if this error is a schema-fingerprint mismatch.
    fn schema_mismatch(&self) -> Option<(u64, u64)>;
}

/// Setting up an RC transport's client or server failed (beyond what [`RpcError`] names
/// directly): [`crate::copyrpc::CopyrpcSetupError`] and
/// [`crate::scalerpc::ScaleRpcSetupError`] are this error over their transport's core error
/// `E`.
#[derive(Debug)]
pub enum RcSetupError<E> {
    /// Creating the context or connection, or connecting it, failed.
    Core(E),
    /// The server refused the connection.
    Refused(ConnectRefusal),
    /// The server did not answer within the connect timeout (it does not poll).
    Timeout(Duration),
    /// The server is gone: its listener no longer takes requests.
    ServerGone,
    /// A configuration value or argument is unusable.
    Config(&'static str),
    /// ScaleRPC: the server evicted this client's connection: it did not acknowledge a stop
    /// notice within the server's [`crate::scalerpc::ServerConfig::ack_timeout`]
    /// ([`crate::scalerpc::CallFailure::Evicted`]). Calls pending at the eviction and every
    /// later call fail with this error; connect again.
    Evicted,
}

impl<E: RcCore> std::fmt::Display for RcSetupError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = E::TRANSPORT;
        match self {
            RcSetupError::Core(e) => std::fmt::Display::fmt(e, f),
            RcSetupError::Refused(r) => write!(f, "the server refused the connection: {r}"),
            RcSetupError::Timeout(d) => write!(f, "no answer from the {t} server within {d:?}"),
            RcSetupError::ServerGone => {
                write!(f, "the {t} server is gone (its listener is closed)")
            }
            RcSetupError::Config(m) => write!(f, "invalid {t} configuration: {m}"),
            RcSetupError::Evicted => write!(
                f,
                "the {t} server evicted this connection (a stop notice was not acknowledged within its ack timeout): connect again"
            ),
        }
    }
}

impl<E: RcCore> std::error::Error for RcSetupError<E> {
    /// The core error's source (the core error itself is displayed transparently).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RcSetupError::Core(e) => e.source(),
            _ => None,
        }
    }
}

impl<E: RcCore> From<RcSetupError<E>> for RpcError {
    /// [`RpcError::Transport`] carrying the setup error, named by its transport
    /// (`copyrpc`, `scalerpc`).
    #[cold]
    fn from(e: RcSetupError<E>) -> Self {
        RpcError::from_transport(E::TRANSPORT, e)
    }
}

impl<E: RcCore> From<E> for RpcError {
    /// [`RpcError::Transport`] carrying [`RcSetupError::Core`].
    #[cold]
    fn from(e: E) -> Self {
        RcSetupError::Core(e).into()
    }
}

impl<E: RcCore> From<E> for RcSetupError<E> {
    fn from(e: E) -> Self {
        RcSetupError::Core(e)
    }
}

impl<E> From<ExchangeError<ConnectRefusal>> for RcSetupError<E> {
    fn from(e: ExchangeError<ConnectRefusal>) -> Self {
        match e {
            ExchangeError::Refused(r) => RcSetupError::Refused(r),
            ExchangeError::Timeout(t) => RcSetupError::Timeout(t),
            ExchangeError::ServerGone => RcSetupError::ServerGone,
        }
    }
}

/// A schema mismatch found while setting up a client of `service`: `ours` is this build's
/// fingerprint, `theirs` the server's.
#[cold]
pub(crate) fn schema_mismatch(
    service: &'static ServiceDescriptor,
    ours: u64,
    theirs: u64,
) -> RpcError {
    RpcError::SchemaMismatch {
        service: service.name,
        expected: ours,
        found: theirs,
    }
}

/// Maps a core setup error of a client or server of `service`: a schema mismatch names the
/// service, anything else is the transport's setup error.
#[cold]
pub(crate) fn core_error<E: RcCore>(e: E, service: &'static ServiceDescriptor) -> RpcError
where
    RpcError: From<RcSetupError<E>>,
{
    match e.schema_mismatch() {
        Some((ours, theirs)) => schema_mismatch(service, ours, theirs),
        None => RcSetupError::Core(e).into(),
    }
}

/// Maps a failed connect exchange of a client of `service` (its `Listener::exchange`): a
/// refusal that names a schema mismatch or a capacity limit becomes the typed error (the
/// server's view of whose limit it is turned into this client's), a server that is gone
/// [`RpcError::ServerDisconnected`], anything else the transport's setup error.
#[cold]
pub(crate) fn connect_error<E>(e: RcSetupError<E>, service: &'static ServiceDescriptor) -> RpcError
where
    RpcError: From<RcSetupError<E>>,
{
    match e {
        RcSetupError::Refused(ConnectRefusal::SchemaMismatch { server }) => {
            schema_mismatch(service, service.fingerprint, server)
        }
        RcSetupError::Refused(ConnectRefusal::Capacity {
            what,
            cap,
            need,
            side,
            setting,
            min,
        }) => RpcError::CapacityMismatch {
            service: service.name,
            what,
            side: match side {
                LimitSide::PeerClient | LimitSide::ThisClient => LimitSide::ThisClient,
                LimitSide::ThisServer | LimitSide::PeerServer => LimitSide::PeerServer,
            },
            setting,
            cap,
            need,
            min,
        },
        RcSetupError::ServerGone => RpcError::ServerDisconnected,
        e => e.into(),
    }
}

/// What a client learns of a server's refusal `e` to admit it (the server's own setup error
/// for the client's request): a schema mismatch and a capacity limit as such, anything else
/// as its message.
#[cold]
pub(crate) fn refusal(e: RpcError) -> ConnectRefusal {
    match e {
        RpcError::SchemaMismatch { expected, .. } => {
            ConnectRefusal::SchemaMismatch { server: expected }
        }
        RpcError::CapacityMismatch {
            what,
            cap,
            need,
            side,
            setting,
            min,
            ..
        } => ConnectRefusal::Capacity {
            what,
            cap,
            need,
            side,
            setting,
            min,
        },
        e => ConnectRefusal::Setup(e.to_string()),
    }
}

/// A message kind whose largest payload does not fit ([`gap`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gap {
    /// Which message kind does not fit.
    pub(crate) what: MessageKind,
    /// Largest payload carried, in bytes.
    pub(crate) cap: u64,
    /// Bytes the service needs.
    pub(crate) need: usize,
}

/// The first message kind of `service` (its largest request, then its largest response)
/// beyond the largest payload carried, `request_cap` and `response_cap` bytes.
pub(crate) fn gap(
    service: &'static ServiceDescriptor,
    request_cap: u64,
    response_cap: u64,
) -> Option<Gap> {
    [
        (MessageKind::Request, request_cap, service.max_request_bytes),
        (
            MessageKind::Response,
            response_cap,
            service.max_response_bytes,
        ),
    ]
    .into_iter()
    .find(|&(_, cap, need)| need as u64 > cap)
    .map(|(what, cap, need)| Gap { what, cap, need })
}

impl Gap {
    /// The [`RpcError::CapacityMismatch`] of this gap for `service`: `side`'s `setting` is
    /// the limit, `min` its least working value where known.
    #[cold]
    pub(crate) fn error(
        self,
        service: &'static ServiceDescriptor,
        side: LimitSide,
        setting: &'static str,
        min: Option<u64>,
    ) -> RpcError {
        RpcError::CapacityMismatch {
            service: service.name,
            what: self.what,
            side,
            setting,
            cap: sat_u32(self.cap),
            need: sat_u32(self.need),
            min,
        }
    }
}

/// A server that answers the connect requests of its [`rendezvous::Inbox`]
/// ([`crate::copyrpc::CopyrpcServer::accept`], [`crate::scalerpc::ScaleRpcServer::accept`]).
pub(crate) trait Admit {
    /// A client's connect request.
    type Request;
    /// The server's answer to an admitted client.
    type Answer;
    /// The transport's name in log messages.
    const TRANSPORT: &'static str;

    /// Where the requests arrive.
    fn inbox(&mut self) -> &mut Inbox<Self::Request, Self::Answer, ConnectRefusal>;

    /// The name of the service served.
    fn service_name(&self) -> &'static str;

    /// Admits the client of `req` (creates and connects its queues), or refuses it.
    fn admit(&mut self, req: &Self::Request) -> Result<Self::Answer, ConnectRefusal>;
}

/// Answers every pending connect request of `server`; returns how many clients were
/// admitted. Refusals and answers to clients that stopped waiting are logged (debug).
pub(crate) fn accept<S: Admit>(server: &mut S) -> usize {
    let mut n = 0;
    while let Some(req) = server.inbox().take() {
        let answer = server.admit(&req.body);
        match &answer {
            Ok(_) => n += 1,
            Err(e) => tracing::debug!(
                transport = S::TRANSPORT,
                service = server.service_name(),
                refusal = %e,
                "connect refused"
            ),
        }
        if !req.answer(answer) {
            tracing::debug!(
                transport = S::TRANSPORT,
                service = server.service_name(),
                "client stopped waiting for its connect answer"
            );
        }
    }
    n
}

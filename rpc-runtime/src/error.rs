//! Errors returned to users of generated clients and servers.

use crate::wire::{Status, WireError};

/// An RPC failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The server is gone (clean shutdown, or its process died): every call in flight and
    /// every later call fails with this, until the transport reconnects (only eRPC can:
    /// `Erpc::reconnect`).
    #[error("server disconnected")]
    ServerDisconnected,
    /// No call slot is free right now: this client has as many calls in flight as its
    /// transport allows ([`crate::ClientTransport::max_in_flight`], by default
    /// [`crate::client::DEFAULT_CALLS_IN_FLIGHT`] on every transport), or (ScaleRPC) its
    /// connection's group is not scheduled right now. Poll for responses, then issue again.
    #[error(
        "no free call slot: this client has reached its calls-in-flight limit (max_in_flight(), default 32; set by DelegationConfig::resp_depth, IpcConfig::depth, CopyrpcAddr::max_in_flight, ErpcConfig::max_in_flight, ScaleRPC slots_per_conn - 1) or its ScaleRPC group is not scheduled now: poll for responses and retry"
    )]
    WouldBlock,
    /// The call's deadline passed before its response arrived (or, for a blocking call,
    /// before it could be sent). The call is over: if its response arrives later, the client
    /// drops it and counts it ([`crate::client::ClientStats::late_responses`]); it never
    /// completes another call. A server that is stopped, overloaded or unreachable shows up
    /// as this error.
    #[error("call {tag} to {method}: deadline of {timeout:?} exceeded")]
    DeadlineExceeded {
        /// The call's tag (for blocking calls, [`crate::client::BLOCKING_TAG`]).
        tag: u64,
        /// Method name.
        method: &'static str,
        /// The call's timeout (its deadline minus the time it was issued).
        timeout: std::time::Duration,
    },
    /// The server could not decode the request and answered with an error status.
    #[error("call {tag} to {method}: server rejected the request ({status:?})")]
    BadRequest {
        /// The call's tag (for blocking calls, an internal one).
        tag: u64,
        /// Method name.
        method: &'static str,
        /// Status the server answered with; `None` if this build does not know the code.
        status: Option<Status>,
    },
    /// The response could not be decoded (wrong length, invalid bytes, wrong method).
    #[error("call {tag} to {method}: bad response: {error}")]
    BadResponse {
        /// The call's tag.
        tag: u64,
        /// Method name.
        method: &'static str,
        /// What was wrong with it.
        error: WireError,
    },
    /// The peer was built from a different interface definition.
    #[error(
        "schema mismatch for service {service}: this build's fingerprint is {expected:#018x}, the peer's is {found:#018x} (rebuild both sides from the same trait)"
    )]
    SchemaMismatch {
        /// Service name.
        service: &'static str,
        /// Fingerprint of this build.
        expected: u64,
        /// Fingerprint announced by the peer.
        found: u64,
    },
    /// A message-size limit cannot carry this service's largest request or response. Says
    /// whose limit it is (`side`: this process's client or server configuration, or the
    /// capacity the peer announced), which setting sets it, and the least value of that
    /// setting that would work where it can be computed (`min`).
    #[error(
        "service {service}: {side} {what} capacity is {cap} B, the service needs {need} B: {}",
        Fix { side: *side, setting, min: *min }
    )]
    CapacityMismatch {
        /// Service name.
        service: &'static str,
        /// Which capacity.
        what: MessageKind,
        /// Whose configuration the limit comes from.
        side: LimitSide,
        /// The setting that sets the limit, named with its transport (e.g.
        /// `"ScaleRPC ServerConfig::slot_size"`), or what else determines it.
        setting: &'static str,
        /// The capacity in bytes (saturated at `u32::MAX`).
        cap: u32,
        /// Bytes this service needs (saturated at `u32::MAX`).
        need: u32,
        /// The least value of `setting` that carries the service's messages, in the
        /// setting's own unit (bytes for every setting named so far); `None` when it cannot
        /// be computed or no value would do (the message then says so through `setting`).
        min: Option<u64>,
    },
    /// An encoded message is larger than the transport's slot or buffer (an encoder that
    /// disagrees with the service descriptor); nothing was sent.
    #[error("message of {len} bytes exceeds the capacity of {cap} bytes set by {setting}")]
    MessageTooLarge {
        /// Encoded length in bytes.
        len: usize,
        /// Capacity in bytes.
        cap: usize,
        /// What sets the capacity (e.g. `"eRPC Config::max_msg_size"`, or the service's
        /// largest message where the transport sizes its buffer from the service).
        setting: &'static str,
    },
    /// A reply could not be delivered (the client is gone or the token is invalid); the reply
    /// was dropped and counted.
    #[error("reply dropped: {0}")]
    ReplyDropped(&'static str),
    /// Setting up the delegation ring failed (create/attach). Boxed: setup errors are rare
    /// and large, and `RpcError` travels in every call's `Result`.
    #[error(transparent)]
    Ring(Box<crate::delegation::RingError>),
    /// Setting up a copyrpc client or server failed (device error, connect timeout, bad
    /// configuration, refused for a reason other than schema or capacity). Boxed like
    /// [`RpcError::Ring`].
    #[error(transparent)]
    Copyrpc(Box<crate::copyrpc::CopyrpcSetupError>),
    /// Setting up a ScaleRPC client or server failed (device error, connect timeout, bad
    /// configuration, refused for a reason other than schema or capacity). Boxed like
    /// [`RpcError::Ring`].
    #[error(transparent)]
    Scalerpc(Box<crate::scalerpc::ScaleRpcSetupError>),
    /// Setting up an eRPC client or server failed (socket or device error, bad configuration,
    /// no answer or refusal at connect for a reason other than schema or capacity, connect
    /// timeout). Boxed like [`RpcError::Ring`].
    #[error(transparent)]
    Erpc(Box<crate::erpc::ErpcSetupError>),
    /// Setting up an ipc client or server failed, or the server found this client's rings
    /// corrupt ([`crate::ipc::IpcError::ClientFault`]). Boxed like [`RpcError::Ring`].
    #[error(transparent)]
    Ipc(Box<crate::ipc::IpcError>),
}

/// Which kind of message a capacity applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// Requests (client to server).
    Request,
    /// Responses (server to client).
    Response,
}

impl std::fmt::Display for MessageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MessageKind::Request => "request",
            MessageKind::Response => "response",
        })
    }
}

/// [`RpcError::CapacityMismatch::setting`] of the delegation ring and ipc: their servers size
/// message slots from their own service descriptor, so a peer too small for this service was
/// built from another definition of it.
pub const SETTING_DERIVED_FROM_SERVICE: &str = "the payload capacity the server derived from its own service descriptor (rebuild both sides from the same trait)";

/// [`RpcError::MessageTooLarge::setting`] where the transport sized the buffer from the
/// service descriptor: the encoder wrote more than the descriptor's largest message.
pub const SETTING_SERVICE_MAX: &str =
    "the service descriptor's largest message (the transport sizes this buffer from it)";

/// Whose configuration a capacity limit ([`RpcError::CapacityMismatch`]) comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitSide {
    /// This process's client configuration.
    ThisClient,
    /// This process's server configuration.
    ThisServer,
    /// The server's configuration, as it announced it to this client.
    PeerServer,
    /// The client's configuration, as it announced it to this server.
    PeerClient,
}

impl std::fmt::Display for LimitSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LimitSide::ThisClient => "this client's",
            LimitSide::ThisServer => "this server's",
            LimitSide::PeerServer => "the server's",
            LimitSide::PeerClient => "the client's",
        })
    }
}

/// The "what to change" part of a [`RpcError::CapacityMismatch`] message.
struct Fix<'a> {
    side: LimitSide,
    setting: &'a str,
    min: Option<u64>,
}

impl std::fmt::Display for Fix<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let on = match self.side {
            LimitSide::ThisClient | LimitSide::ThisServer => "",
            LimitSide::PeerServer => " on the server",
            LimitSide::PeerClient => " on the client",
        };
        match self.min {
            Some(min) => write!(f, "set {}{on} to at least {min}", self.setting),
            None => write!(f, "limit: {}", self.setting),
        }
    }
}

impl From<crate::delegation::RingError> for RpcError {
    #[cold]
    fn from(e: crate::delegation::RingError) -> Self {
        RpcError::Ring(Box::new(e))
    }
}

impl From<crate::ipc::IpcError> for RpcError {
    #[cold]
    fn from(e: crate::ipc::IpcError) -> Self {
        RpcError::Ipc(Box::new(e))
    }
}

impl From<crate::copyrpc::CopyrpcSetupError> for RpcError {
    #[cold]
    fn from(e: crate::copyrpc::CopyrpcSetupError) -> Self {
        RpcError::Copyrpc(Box::new(e))
    }
}

impl From<crate::copyrpc::SetupError> for RpcError {
    #[cold]
    fn from(e: crate::copyrpc::SetupError) -> Self {
        RpcError::Copyrpc(Box::new(crate::copyrpc::CopyrpcSetupError::Core(e)))
    }
}

impl From<crate::scalerpc::ScaleRpcSetupError> for RpcError {
    #[cold]
    fn from(e: crate::scalerpc::ScaleRpcSetupError) -> Self {
        RpcError::Scalerpc(Box::new(e))
    }
}

impl From<crate::scalerpc::ScaleError> for RpcError {
    #[cold]
    fn from(e: crate::scalerpc::ScaleError) -> Self {
        RpcError::Scalerpc(Box::new(crate::scalerpc::ScaleRpcSetupError::Core(e)))
    }
}

impl RpcError {
    /// Maps a response decode failure for call `tag` of `method`.
    #[cold]
    pub fn from_wire(tag: u64, method: &'static str, error: WireError) -> Self {
        match error {
            WireError::Rejected { status, .. } => RpcError::BadRequest {
                tag,
                method,
                status,
            },
            error => RpcError::BadResponse { tag, method, error },
        }
    }
}

/// `v` as a `u32`, saturated at `u32::MAX`: byte counts in capacity errors, whose fields are
/// `u32`.
pub(crate) fn sat_u32(v: impl TryInto<u32>) -> u32 {
    v.try_into().unwrap_or(u32::MAX)
}

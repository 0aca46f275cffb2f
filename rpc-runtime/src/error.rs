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
    /// The transport failed in its own terms: setting up a client or server failed (device
    /// or socket error, bad configuration, connect timeout, a refusal for a reason other
    /// than schema or capacity), or the transport found the peer faulty. The transport's own
    /// error is inside, type-erased so that the core names no transport: get it back with
    /// [`RpcError::transport`] (e.g. `e.transport::<rpc::copyrpc::CopyrpcSetupError>()`);
    /// each transport's docs say which type it puts here. Displays as that error.
    #[error(transparent)]
    Transport(TransportError),
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

/// A transport's own error inside [`RpcError::Transport`]: the name of the transport that
/// raised it and the error itself, type-erased. Displays as the error (its `source` is the
/// error's source); boxed, because setup errors are rare and large and `RpcError` travels
/// in every call's `Result`.
///
/// A transport outside this crate wraps its errors the same way:
/// `RpcError::from(TransportError::new("loopback", my_error))`.
pub struct TransportError {
    transport: &'static str,
    error: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl TransportError {
    /// Wraps `error`, raised by the transport named `transport` (e.g. `"copyrpc"`).
    #[cold]
    pub fn new(
        transport: &'static str,
        error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        TransportError {
            transport,
            error: error.into(),
        }
    }

    /// The name of the transport that raised the error.
    pub fn transport(&self) -> &'static str {
        self.transport
    }

    /// The error, if it is an `E`.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.error.downcast_ref::<E>()
    }

    /// The error, if it is an `E`; `self` back otherwise.
    pub fn downcast<E: std::error::Error + 'static>(self) -> Result<Box<E>, Self> {
        let TransportError { transport, error } = self;
        error
            .downcast::<E>()
            .map_err(|error| TransportError { transport, error })
    }

    /// The error, type-erased.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The error, type-erased and owned.
    pub fn into_inner(self) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self.error
    }
}

impl std::fmt::Debug for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TransportError")
            .field(&self.transport)
            .field(&self.error)
            .finish()
    }
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for TransportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl From<TransportError> for RpcError {
    #[cold]
    fn from(e: TransportError) -> Self {
        RpcError::Transport(e)
    }
}

impl RpcError {
    /// Wraps `error`, raised by the transport named `transport`, as [`RpcError::Transport`].
    #[cold]
    pub fn from_transport(
        transport: &'static str,
        error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        RpcError::Transport(TransportError::new(transport, error))
    }

    /// The transport's own error inside [`RpcError::Transport`], if this is one and it is an
    /// `E` (e.g. `rpc::scalerpc::ScaleRpcSetupError`); `None` for every other error.
    pub fn transport<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            RpcError::Transport(e) => e.downcast_ref::<E>(),
            _ => None,
        }
    }

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

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn transport_errors_display_as_theirs_and_downcast_back() {
        let e = RpcError::from_transport("loopback", Outer(std::io::Error::other("inner")));
        assert_eq!(e.to_string(), "outer");
        assert_eq!(e.source().unwrap().to_string(), "inner");
        assert!(e.transport::<Outer>().is_some());
        assert!(e.transport::<std::io::Error>().is_none());
        let RpcError::Transport(t) = e else {
            panic!("not a transport error")
        };
        assert_eq!(t.transport(), "loopback");
        let t = t.downcast::<std::io::Error>().unwrap_err();
        assert_eq!(t.transport(), "loopback");
        assert!(t.downcast::<Outer>().is_ok());
        assert!(RpcError::WouldBlock.transport::<Outer>().is_none());
    }

    #[test]
    fn each_transport_wraps_its_own_error_under_its_name() {
        let cases: [(RpcError, &str); 5] = [
            (
                crate::delegation::RingError::InvalidConfig { reason: "x".into() }.into(),
                "delegation",
            ),
            (
                crate::ipc::IpcError::InvalidConfig { reason: "x".into() }.into(),
                "ipc",
            ),
            (crate::copyrpc::SetupError::BadEndpoint(1).into(), "copyrpc"),
            (
                crate::scalerpc::ScaleRpcSetupError::Evicted.into(),
                "scalerpc",
            ),
            (crate::erpc::ErpcSetupError::NoAnswer.into(), "erpc"),
        ];
        for (e, name) in cases {
            match &e {
                RpcError::Transport(t) => assert_eq!(t.transport(), name),
                other => panic!("{name}: {other:?}"),
            }
        }
        // Errors of a transport's inner layers arrive as the transport's setup error.
        let e = RpcError::from(crate::copyrpc::SetupError::BadEndpoint(1));
        assert!(matches!(
            e.transport::<crate::copyrpc::CopyrpcSetupError>(),
            Some(crate::copyrpc::CopyrpcSetupError::Core(_))
        ));
    }
}

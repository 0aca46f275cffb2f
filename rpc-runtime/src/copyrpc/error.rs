//! copyrpc errors: call and reply failures (seeds/001 "エラーハンドリング"), malformed input
//! from the peer, and why an endpoint failed.

use mlx5::cqe::CqeError;

/// A call was not written: why ([`CallErrorKind`]) and the caller's user data, handed back
/// (`user`).
pub type CallError<U> = crate::rc::Refused<CallErrorKind, U>;

/// Why a call was not written ([`CallError`]'s `kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallErrorKind {
    /// The credit the peer granted does not cover the response allowance: poll (which brings
    /// new grants with the peer's batches) and retry (seeds/004 §3.4).
    #[error("insufficient response credit: poll and retry")]
    InsufficientCredit,
    /// The message would break `in_flight + 2R <= C`: poll and retry (seeds/004 §5
    /// back-pressure). The next poll also reads the peer's consumer position by RDMA READ.
    /// The peer releases ring space when its application takes requests with
    /// `Context::recv` (not when its poll parses them), so a retry loop that only polls can
    /// wait forever on a peer that is itself stuck in such a loop: progress must include
    /// `recv` of the requests received meanwhile (as `delegation::forward` does).
    /// Also returned when a large request (issue 15) finds every large-message send buffer
    /// waiting for the peer to read it ([`super::Stats::large_buffers_busy`]).
    #[error("send ring full: poll and retry")]
    RingFull,
    /// The payload or response allowance exceeds the endpoint's largest message: through a
    /// [`super::Context`], the large-message limit ([`super::EndpointCore::large_limit`],
    /// issue 15) or, without large messages, [`super::EndpointCore::max_payload`] and
    /// [`super::EndpointCore::max_response_allowance`]; through a bare
    /// [`super::EndpointCore`], the latter two.
    #[error("message larger than the endpoint's maximum payload")]
    MessageTooLarge,
    /// The endpoint is not connected yet.
    #[error("endpoint not connected")]
    NotConnected,
    /// The endpoint failed (see [`super::Context::endpoint_state`]).
    #[error("endpoint failed")]
    Failed,
}

impl CallErrorKind {
    /// Whether polling and retrying can succeed (`InsufficientCredit`, `RingFull`).
    #[inline]
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            CallErrorKind::InsufficientCredit | CallErrorKind::RingFull
        )
    }
}

/// A reply was not written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The response is larger than the allowance the caller reserved. Nothing was sent and
    /// the handle stays valid ([`super::Context::reply`]): answer with a reply that fits.
    #[error("response of {len} bytes exceeds the caller's allowance of {allowance} bytes")]
    TooLarge {
        /// Payload bytes.
        len: usize,
        /// Largest payload the allowance covers.
        allowance: usize,
    },
    /// The endpoint failed or the handle does not name a live endpoint.
    #[error("endpoint failed or unknown")]
    Failed,
    /// The handle was already answered (or was never handed out by `recv`).
    #[error("request already answered (stale handle)")]
    Stale,
    /// The response needs a large-message buffer (rendezvous, issue 15) and all
    /// `EndpointConfig::large_buffers` of the endpoint hold responses the caller has not
    /// read yet (only a caller that does not report its reads gets here). The request's
    /// credit is returned; the caller's call stays unanswered (its deadline ends it).
    /// Counted in [`super::Stats::large_buffers_busy`].
    #[error("no large-message buffer free for the response")]
    NoLargeBuffer,
}

/// Malformed input from the peer (a corrupt batch or endpoint info). Each is counted in
/// [`super::Stats::corrupt_batches`] and fails the endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A batch length that is not a multiple of 32 B, shorter than its metadata, crossing the
    /// ring end, or a message extending beyond the bytes received.
    #[error("batch or message length beyond the bytes received")]
    BadLength,
    /// `message_count` does not match the messages in the batch.
    #[error("message count does not match the batch")]
    BadCount,
    /// The batch would overwrite bytes not yet released to the peer.
    #[error("batch overruns unreleased receive-ring bytes")]
    Overrun,
    /// A wrap marker that does not end at the ring end.
    #[error("wrap marker not at the ring end")]
    BadWrap,
    /// A response to no pending call (unknown, already answered, or answered twice).
    #[error("response to unknown call id {0:#x}")]
    UnknownCallId(u32),
    /// A response larger than the call's allowance.
    #[error("response larger than its call's allowance")]
    ResponseTooLarge,
    /// A credit return beyond what was sent, or a consumer position read beyond it.
    #[error("peer consumer position beyond the bytes sent")]
    BadConsumer,
    /// A grant that is not 32 B aligned or exceeds the ring, or requests spending more credit
    /// than was granted.
    #[error("credit grant or spend inconsistent with the ring")]
    BadCredit,
    /// Endpoint information that cannot describe a peer ring.
    #[error("bad endpoint information: {0}")]
    BadEndpointInfo(&'static str),
    /// A rendezvous descriptor that cannot be honoured (issue 15): a `payload_len` other than
    /// the flag plus 16, a length not above [`super::encoding::RENDEZVOUS_MIN`] or above the
    /// large-message limit or the call's response allowance, or a rendezvous response to a
    /// call that did not accept one. Also counted in [`super::Stats::bad_descriptors`].
    #[error("bad rendezvous descriptor: {0}")]
    BadDescriptor(&'static str),
    /// A batch reporting more rendezvous READs done than rendezvous messages outstanding.
    #[error("more rendezvous reads reported done than messages outstanding")]
    BadReadsDone,
}

/// Why an endpoint failed; pending calls get it as their error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndpointFailure {
    /// The peer sent a malformed batch.
    #[error("corrupt batch from the peer: {0}")]
    Protocol(ProtocolError),
    /// An error completion (remote access error, retry exceeded, flush).
    #[error("{0}")]
    Completion(CqeError),
}

/// Setting up a context or endpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The NIC layer failed.
    #[error(transparent)]
    Device(#[from] mlx5::Error),
    /// The peer's endpoint information is unusable.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// The peer serves a different interface.
    #[error("schema fingerprint mismatch: ours {ours:#018x}, peer's {theirs:#018x}")]
    SchemaMismatch {
        /// Ours.
        ours: u64,
        /// The peer's.
        theirs: u64,
    },
    /// No such endpoint, or it is already connected.
    #[error("endpoint {0} does not exist or is already connected")]
    BadEndpoint(u32),
    /// Endpoint information bytes that do not decode (wrong magic or version, short).
    #[error("endpoint information does not decode: {0}")]
    BadInfo(&'static str),
}

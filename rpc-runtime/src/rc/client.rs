//! The client side both RC transports share: [`ClientTransport`] is implemented once
//! ([`rc_client_transport`]) over [`RcClient`], which each transport implements with its own
//! queues
//! ([`crate::copyrpc::Copyrpc`]: a copyrpc context, possibly shared;
//! [`crate::scalerpc::ScaleRpc`]: a ScaleRPC client context).
//!
//! The skeleton owns the rules: a call takes a token first and gives it back when the
//! transport refuses it; a retryable refusal makes one round of progress, so that a caller
//! with nothing in flight cannot spin on [`RpcError::WouldBlock`] for ever; a poll that
//! delivers nothing reports a failed connection, or counts towards the liveness probe
//! ([`super::liveness`]), which [`RcClient::send_probe`] sends once it is due.
//!
//! Everything here is generic (monomorphised per transport) and the hot functions are
//! `#[inline(always)]`: the typed client's poll costs what the transport's own did.

use std::time::Instant;

use super::liveness::ProbeClock;
#[cfg(doc)]
use crate::client::ClientTransport;
use crate::error::RpcError;
use crate::service::ServiceDescriptor;

/// A call the transport did not issue ([`RcClient::issue`]).
pub(crate) enum Unsent<R> {
    /// No token is free: every call slot is in flight.
    NoToken,
    /// The transport refused the call; `R` hands the token back ([`RcClient::give_back`]).
    Refused(R),
}

/// What an RC client transport provides to the shared skeleton ([`rc_client_transport`]
/// implements [`ClientTransport`] over it).
pub(crate) trait RcClient: Sized {
    /// [`ClientTransport::Addr`].
    type Addr;
    /// The transport's refusal of a call, carrying the call's token.
    type Refusal;

    /// [`ClientTransport::connect`].
    fn open(addr: &Self::Addr, service: &'static ServiceDescriptor) -> Result<Self, RpcError>;

    /// [`ClientTransport::max_in_flight`]: the number of call tokens.
    fn tokens(&self) -> usize;

    /// Takes a token and writes the call (`method_id`, payload by `encode`); returns the
    /// token.
    fn issue(
        &mut self,
        method_id: u16,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, Unsent<Self::Refusal>>;

    /// Delivers stashed responses first, then polls the queues once, every response to
    /// `on_response`. Returns how many were delivered.
    fn deliver(&mut self, on_response: &mut impl FnMut(u32, &[u8])) -> usize;

    /// One round of progress with nothing delivered (notices, credit requests, doorbells).
    fn progress(&mut self);

    /// Whether the connection failed, and whether calls are outstanding on it.
    fn state(&mut self) -> (bool, bool);

    /// The error a failed connection reports.
    fn failed_error(&mut self) -> RpcError;

    /// The error a refused call reports (may record state, e.g. how long the connection was
    /// inactive).
    fn refusal_error(&mut self, refusal: &Self::Refusal) -> RpcError;

    /// Hands the token of a refused call back.
    fn give_back(&mut self, refusal: Self::Refusal);

    /// The liveness probe's clock, if probing is on.
    fn probe_clock(&mut self) -> Option<&mut ProbeClock>;

    /// Responses received so far (the probe's measure of silence).
    fn responses(&mut self) -> u64;

    /// Sends a liveness probe if none is in flight and the transport can (a probe that
    /// cannot go now is tried at the next due check).
    fn send_probe(&mut self);
}

/// Implements [`ClientTransport`] for `$t`, an [`RcClient`] connecting to a `$addr`, by the
/// shared skeleton: the impl is written once, here. (Not a blanket impl over `RcClient`: that
/// would make rustc's error for a type that is no transport name this sealed trait, and drop
/// these transports from its list of the types that implement `ClientTransport`.)
macro_rules! rc_client_transport {
    ($t:ty, $addr:ty) => {
        impl $crate::client::ClientTransport for $t {
            type Addr = $addr;

            fn connect(
                addr: &$addr,
                service: &'static $crate::service::ServiceDescriptor,
            ) -> Result<Self, $crate::error::RpcError> {
                <$t as $crate::rc::client::RcClient>::open(addr, service)
            }

            #[inline]
            fn max_in_flight(&self) -> usize {
                $crate::rc::client::RcClient::tokens(self)
            }

            /// Issues the call (the transport writes it into its queue); never waits, so
            /// `timeout` is not used.
            ///
            /// # Errors
            /// [`RpcError::WouldBlock`](crate::RpcError::WouldBlock) when no token is free
            /// or the transport refuses for now (copyrpc: no response credit or ring space;
            /// ScaleRPC: no slot free, or the connection's group is not scheduled): poll and
            /// retry; [`RpcError::ServerDisconnected`](crate::RpcError::ServerDisconnected)
            /// once the connection failed (ScaleRPC: also once it stayed inactive for the
            /// activation timeout; an evicted one reports
            /// [`ScaleRpcSetupError::Evicted`](crate::scalerpc::ScaleRpcSetupError::Evicted));
            /// [`RpcError::MessageTooLarge`](crate::RpcError::MessageTooLarge) for a request
            /// beyond the transport's largest message.
            #[inline]
            fn send(
                &mut self,
                _timeout: std::time::Duration,
                method_id: u16,
                encode: impl FnOnce(&mut [u8]) -> usize,
            ) -> Result<u32, $crate::error::RpcError> {
                $crate::rc::client::send(self, method_id, encode)
            }

            /// Delivers stashed responses first, then polls the queues once (which also
            /// sends what was written; ScaleRPC: and handles the server's notices).
            ///
            /// # Errors
            /// [`RpcError::ServerDisconnected`](crate::RpcError::ServerDisconnected) once the
            /// connection failed and no response is left to deliver; calls pending at the
            /// failure are never delivered.
            #[inline]
            fn poll(
                &mut self,
                on_response: impl FnMut(u32, &[u8]),
            ) -> Result<usize, $crate::error::RpcError> {
                $crate::rc::client::poll(self, on_response)
            }

            /// Runs the liveness check (module docs) when calls are in flight, by time.
            #[inline]
            fn idle_tick(&mut self) {
                $crate::rc::client::idle_tick(self);
            }
        }
    };
}
pub(crate) use rc_client_transport;

/// [`ClientTransport::send`]: issues the call, or maps its refusal.
#[inline(always)]
pub(crate) fn send<C: RcClient>(
    c: &mut C,
    method_id: u16,
    encode: impl FnOnce(&mut [u8]) -> usize,
) -> Result<u32, RpcError> {
    match c.issue(method_id, encode) {
        Ok(tok) => Ok(tok),
        Err(Unsent::NoToken) => Err(RpcError::WouldBlock),
        Err(Unsent::Refused(r)) => Err(refused(c, r)),
    }
}

/// A call was refused: hand the token back and map the error. Retryable refusals make one
/// round of progress (copyrpc: sends the credit request or consumer READ the core asked for;
/// ScaleRPC: processes the server's notices and sends what is pending), so that a caller
/// with nothing in flight cannot spin on `WouldBlock` for ever, and the next attempt sees
/// the current schedule.
#[cold]
#[inline(never)]
fn refused<C: RcClient>(c: &mut C, r: C::Refusal) -> RpcError {
    let err = c.refusal_error(&r);
    c.give_back(r);
    if matches!(err, RpcError::WouldBlock) {
        c.progress();
    }
    err
}

/// [`ClientTransport::poll`]: delivers (stash first, then one poll of the
/// queues); with nothing delivered, reports a failed connection or counts an empty poll
/// towards the liveness probe.
#[inline(always)]
pub(crate) fn poll<C: RcClient>(
    c: &mut C,
    mut on_response: impl FnMut(u32, &[u8]),
) -> Result<usize, RpcError> {
    let n = c.deliver(&mut on_response);
    if n == 0 {
        return idle(c);
    }
    Ok(n)
}

/// Nothing was delivered: report a failed connection, or count towards a liveness check.
#[inline(always)]
fn idle<C: RcClient>(c: &mut C) -> Result<usize, RpcError> {
    let (failed, busy) = c.state();
    if failed {
        return Err(c.failed_error());
    }
    if busy
        && let Some(clock) = c.probe_clock()
        && clock.empty_poll()
    {
        check_liveness(c, Instant::now());
    }
    Ok(0)
}

/// [`ClientTransport::idle_tick`]: the liveness check by time, when probing
/// is on and calls are in flight on a live connection.
#[inline]
pub(crate) fn idle_tick<C: RcClient>(c: &mut C) {
    if c.probe_clock().is_none() {
        return;
    }
    let (failed, busy) = c.state();
    if !failed && busy {
        check_liveness(c, Instant::now());
    }
}

/// Every [`super::PROBE_CHECK_POLLS`] empty polls with calls outstanding, and at each idle
/// tick: if no response arrived for the probe interval, send a probe.
#[cold]
#[inline(never)]
fn check_liveness<C: RcClient>(c: &mut C, now: Instant) {
    let responses = c.responses();
    let Some(clock) = c.probe_clock() else {
        return;
    };
    if clock.due(now, responses) {
        c.send_probe();
    }
}

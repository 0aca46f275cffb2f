//! How the routing daemons ([`super::node::NodeDaemon`], [`super::Delegate`]) route and
//! serve the requests of their own shard: from owned requests (their `run_once`, the
//! application's handler takes a `S::Request` and returns a `S::Response`) or in place
//! (their `run_once_raw`, a router reading the message and a handler such as the generated
//! `<Trait>Service::dispatch_raw`, which borrows variable-length arguments from the request
//! and writes the reply straight into the reply buffer). Source of the routing rule:
//! seeds/004 §7 (`key % daemons`), §8 (the request's `rank`).
//!
//! Either way the daemon hands the shard its **private** copy of the request (a client or
//! peer cannot change it while the handler reads it) starting on an 8-byte boundary (slices
//! of `&[T]` arguments are aligned, [`crate::varlen::MAX_SLICE_ALIGN`]).

use super::forward::Target;
use crate::service::Service;
use crate::wire::{self, WireError};

/// Routes and serves the requests of a daemon's shard.
pub(super) trait Shard<S: Service> {
    /// Where the request `msg` is served.
    ///
    /// # Errors
    /// The [`WireError`] of a request that does not decode (answered with its status).
    fn route(&mut self, msg: &[u8]) -> Result<Target, WireError>;

    /// Serves `msg`, the request last passed to [`Shard::route`], writing the response
    /// message into `out` (the transport's reply buffer); returns its length.
    ///
    /// # Errors
    /// A request that does not decode, or a response longer than `out`
    /// ([`WireError::ResponseTooLarge`]).
    fn serve(&mut self, msg: &[u8], out: &mut [u8]) -> Result<usize, WireError>;
}

/// The owned way: `route(&request)`, `handler(request) -> response`. The request decoded to
/// route it is kept for [`Shard::serve`] (decoded once).
pub(super) struct Owned<'a, S: Service, R, H> {
    pub(super) route: &'a mut R,
    pub(super) handler: &'a mut H,
    pub(super) req: Option<S::Request>,
}

impl<S, R, H> Shard<S> for Owned<'_, S, R, H>
where
    S: Service,
    R: FnMut(&S::Request) -> Target,
    H: FnMut(S::Request) -> S::Response,
{
    #[inline]
    fn route(&mut self, msg: &[u8]) -> Result<Target, WireError> {
        let req = S::decode_request(msg)?;
        let t = (self.route)(&req);
        self.req = Some(req);
        Ok(t)
    }

    #[inline]
    fn serve(&mut self, msg: &[u8], out: &mut [u8]) -> Result<usize, WireError> {
        let req = match self.req.take() {
            Some(req) => req,
            None => S::decode_request(msg)?,
        };
        let resp = (self.handler)(req);
        let len = S::response_len(&resp);
        if len > out.len() {
            return Err(WireError::ResponseTooLarge {
                method_id: method_id_of(msg),
                len,
                cap: out.len(),
            });
        }
        Ok(S::encode_response(&resp, out))
    }
}

/// The in-place way: `route(msg)` reads the routing fields from the message,
/// `handler(msg, out)` serves it and writes the reply into `out`.
pub(super) struct Raw<'a, R, H> {
    pub(super) route: &'a mut R,
    pub(super) handler: &'a mut H,
}

impl<S, R, H> Shard<S> for Raw<'_, R, H>
where
    S: Service,
    R: FnMut(&[u8]) -> Result<Target, WireError>,
    H: FnMut(&[u8], &mut [u8]) -> Result<usize, WireError>,
{
    #[inline]
    fn route(&mut self, msg: &[u8]) -> Result<Target, WireError> {
        (self.route)(msg)
    }

    #[inline]
    fn serve(&mut self, msg: &[u8], out: &mut [u8]) -> Result<usize, WireError> {
        (self.handler)(msg, out)
    }
}

/// Serves `msg` with `shard` into `out`: the response, or, for a request that does not
/// decode or a response that does not fit `out` (also a handler that claims more bytes than
/// `out` holds), an error status, the error left in `err` for the caller to count. Returns
/// the length of what was written.
#[inline]
pub(super) fn serve_into<S: Service>(
    shard: &mut impl Shard<S>,
    msg: &[u8],
    out: &mut [u8],
    err: &mut Option<WireError>,
) -> usize {
    match shard.serve(msg, out) {
        Ok(n) if n <= out.len() => n,
        Ok(n) => {
            let e = WireError::ResponseTooLarge {
                method_id: method_id_of(msg),
                len: n,
                cap: out.len(),
            };
            failed::<S>(msg, out, e, err)
        }
        Err(e) => failed::<S>(msg, out, e, err),
    }
}

#[cold]
#[inline(never)]
fn failed<S: Service>(
    msg: &[u8],
    out: &mut [u8],
    e: WireError,
    err: &mut Option<WireError>,
) -> usize {
    let method_id = method_id_of(msg);
    tracing::debug!(service = S::DESCRIPTOR.name, method_id, error = %e, "daemon: request answered with an error status");
    *err = Some(e);
    if out.len() < wire::HEADER_BYTES {
        // No reply buffer is this small (each holds the service's largest response).
        return 0;
    }
    wire::encode_status(method_id, e.status(), out)
}

/// Whether a shard's error is a response too large for its reply buffer (else: a request
/// that did not decode).
#[inline]
pub(super) fn is_oversized(e: &WireError) -> bool {
    matches!(e, WireError::ResponseTooLarge { .. })
}

/// Best-effort method id of a (possibly malformed) message, echoed in error replies.
#[inline]
pub(super) fn method_id_of(msg: &[u8]) -> u16 {
    match msg {
        [a, b, ..] => u16::from_ne_bytes([*a, *b]),
        _ => u16::MAX,
    }
}

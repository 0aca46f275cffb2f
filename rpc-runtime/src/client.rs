//! The transport-generic client core that generated `<Trait>Client` stubs wrap.
//!
//! A [`ClientTransport`] moves opaque messages and identifies each call in flight by a small
//! token; [`Client`] adds typed encoding/decoding, user tags for pipelined calls, and blocking
//! calls on top.

use std::collections::VecDeque;

use crossbeam_utils::Backoff;
use zerocopy::{Immutable, IntoBytes, KnownLayout, TryFromBytes};

use crate::error::RpcError;
use crate::service::{Service, ServiceDescriptor};
use crate::wire;

/// The client side of a transport: sends request messages and delivers response messages.
///
/// Implemented by each transport (`Delegation`, `Copyrpc`, and later eRPC, ScaleRPC).
pub trait ClientTransport: Sized {
    /// What [`ClientTransport::connect`] takes: a shared-memory name for the delegation ring,
    /// an endpoint address for the network transports.
    type Addr: ?Sized;

    /// Attaches/connects to a server of `service`, checking the service's schema fingerprint
    /// and message sizes against the server's.
    ///
    /// # Errors
    /// [`RpcError::SchemaMismatch`], [`RpcError::CapacityMismatch`], and the transport's own
    /// setup errors.
    fn connect(addr: &Self::Addr, service: &'static ServiceDescriptor) -> Result<Self, RpcError>;

    /// Most calls this client can have in flight; tokens are `0..max_in_flight()`.
    fn max_in_flight(&self) -> usize;

    /// Sends one request. `encode` writes the message into a buffer of at least the
    /// service's `max_request_bytes` and returns its length. Returns the call's token, which
    /// stays reserved until [`ClientTransport::poll`] delivers the response.
    ///
    /// # Errors
    /// [`RpcError::WouldBlock`] when no token is free (nothing was sent; poll and retry);
    /// [`RpcError::ServerDisconnected`].
    fn send(&mut self, encode: impl FnOnce(&mut [u8]) -> usize) -> Result<u32, RpcError>;

    /// Delivers up to `max` (`>= 1`) of the responses that have arrived as
    /// `on_response(token, message)`; returns how many were delivered. A response the
    /// transport found corrupt is delivered as an empty message (it then fails to decode).
    ///
    /// # Errors
    /// [`RpcError::ServerDisconnected`] once the server is known to be gone while calls are
    /// in flight.
    fn poll(&mut self, max: usize, on_response: impl FnMut(u32, &[u8])) -> Result<usize, RpcError>;
}

#[derive(Clone, Copy, Debug)]
struct CallSlot {
    tag: u64,
    method_id: u16,
}

/// Tag used internally for blocking calls (reported in their errors).
pub const BLOCKING_TAG: u64 = u64::MAX;

/// Typed client core for service `S` over transport `T`: blocking calls, pipelined calls with
/// user tags, and polling for their completions.
///
/// Blocking and pipelined calls may be mixed: completions of pipelined calls that arrive while
/// a blocking call waits are kept (in arrival order) for the next [`Client::poll`].
pub struct Client<S: Service, T: ClientTransport> {
    transport: T,
    slots: Box<[CallSlot]>,
    ready: VecDeque<(u64, Result<S::Response, RpcError>)>,
    in_flight: usize,
}

impl<S: Service, T: ClientTransport> Client<S, T> {
    /// Connects to a server of `S` at `addr` (see [`ClientTransport::connect`]).
    ///
    /// # Errors
    /// As [`ClientTransport::connect`].
    pub fn connect(addr: &T::Addr) -> Result<Self, RpcError> {
        Ok(Self::from_transport(T::connect(addr, S::DESCRIPTOR)?))
    }

    /// Wraps a transport that is already connected to a server of `S`, e.g. one built from
    /// endpoint information exchanged by an MPI bootstrap (`Copyrpc::from_context`). The
    /// transport's constructor is responsible for the checks [`ClientTransport::connect`]
    /// makes (schema fingerprint, message sizes) against `S::DESCRIPTOR`.
    pub fn from_transport(transport: T) -> Self {
        let n = transport.max_in_flight();
        Client {
            transport,
            slots: vec![
                CallSlot {
                    tag: 0,
                    method_id: 0
                };
                n
            ]
            .into_boxed_slice(),
            ready: VecDeque::with_capacity(n),
            in_flight: 0,
        }
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The transport, mutably.
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    /// Calls issued and not yet delivered by [`Client::poll`]/[`Client::poll_with`]
    /// (including completions already received and waiting to be polled).
    pub fn in_flight(&self) -> usize {
        self.in_flight + self.ready.len()
    }

    /// Most calls that can be in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.slots.len()
    }

    /// Blocking call: sends method `method_id` with `args` and waits for its response, decoded
    /// as the lowered return type `R`.
    ///
    /// # Errors
    /// [`RpcError::ServerDisconnected`]; [`RpcError::BadRequest`] if the server rejected the
    /// request; [`RpcError::BadResponse`] if the response does not decode as `R`.
    #[inline]
    pub fn call<A, R>(&mut self, method_id: u16, args: &A) -> Result<R, RpcError>
    where
        A: IntoBytes + Immutable,
        R: TryFromBytes + KnownLayout + Immutable,
    {
        let token = self.send_blocking(BLOCKING_TAG, method_id, args)?;
        let mut out: Option<Result<R, wire::WireError>> = None;
        let backoff = Backoff::new();
        loop {
            let Self {
                transport,
                slots,
                ready,
                in_flight,
            } = self;
            let n = transport.poll(usize::MAX, |tok, msg| {
                *in_flight -= 1;
                if tok == token {
                    out = Some(wire::decode_response::<R>(method_id, msg));
                } else {
                    ready.push_back(complete::<S>(&slots[tok as usize], msg));
                }
            })?;
            if let Some(r) = out {
                return r.map_err(|e| {
                    RpcError::from_wire(BLOCKING_TAG, method_name::<S>(method_id), e)
                });
            }
            if n == 0 {
                backoff.snooze();
            }
        }
    }

    /// Pipelined call: sends method `method_id` with `args`; its completion is delivered with
    /// `tag` by [`Client::poll`].
    ///
    /// # Errors
    /// [`RpcError::WouldBlock`] when [`Client::max_in_flight`] calls are in flight (nothing
    /// was sent); [`RpcError::ServerDisconnected`].
    #[inline]
    pub fn issue<A: IntoBytes + Immutable>(
        &mut self,
        tag: u64,
        method_id: u16,
        args: &A,
    ) -> Result<(), RpcError> {
        let token = self
            .transport
            .send(|buf| wire::encode(method_id, 0, args, buf))?;
        self.slots[token as usize] = CallSlot { tag, method_id };
        self.in_flight += 1;
        Ok(())
    }

    /// Pipelined call of a whole request value (see [`Client::issue`]).
    ///
    /// # Errors
    /// As [`Client::issue`].
    #[inline]
    pub fn issue_request(&mut self, tag: u64, req: &S::Request) -> Result<(), RpcError> {
        let method_id = S::request_method_id(req);
        let token = self.transport.send(|buf| S::encode_request(req, buf))?;
        self.slots[token as usize] = CallSlot { tag, method_id };
        self.in_flight += 1;
        Ok(())
    }

    /// Returns one completed pipelined call as `(tag, response)`, or `None` if none has
    /// completed yet. Never blocks.
    ///
    /// # Errors
    /// [`RpcError::BadRequest`]/[`RpcError::BadResponse`] for a call that failed (its `tag`
    /// is in the error); [`RpcError::ServerDisconnected`].
    #[inline]
    pub fn poll(&mut self) -> Result<Option<(u64, S::Response)>, RpcError> {
        if !self.ready.is_empty() {
            return self.pop_ready();
        }
        if self.in_flight == 0 {
            return Ok(None);
        }
        // Take exactly one response from the transport: nothing is buffered.
        let Self {
            transport,
            slots,
            in_flight,
            ..
        } = self;
        let mut done = None;
        transport.poll(1, |tok, msg| {
            *in_flight -= 1;
            done = Some(complete::<S>(&slots[tok as usize], msg));
        })?;
        match done {
            None => Ok(None),
            Some((tag, Ok(resp))) => Ok(Some((tag, resp))),
            Some((_, Err(e))) => Err(e),
        }
    }

    #[cold]
    fn pop_ready(&mut self) -> Result<Option<(u64, S::Response)>, RpcError> {
        match self.ready.pop_front() {
            None => Ok(None),
            Some((tag, Ok(resp))) => Ok(Some((tag, resp))),
            Some((_, Err(e))) => Err(e),
        }
    }

    /// Delivers every completed pipelined call to `f(tag, result)`; returns how many.
    /// Never blocks; cheaper than [`Client::poll`] when many calls complete at once.
    ///
    /// # Errors
    /// [`RpcError::ServerDisconnected`] (per-call failures go to `f`).
    #[inline]
    pub fn poll_with(
        &mut self,
        mut f: impl FnMut(u64, Result<S::Response, RpcError>),
    ) -> Result<usize, RpcError> {
        let mut n = 0;
        while let Some((tag, r)) = self.ready.pop_front() {
            f(tag, r);
            n += 1;
        }
        if self.in_flight > 0 {
            let Self {
                transport,
                slots,
                in_flight,
                ..
            } = self;
            n += transport.poll(usize::MAX, |tok, msg| {
                *in_flight -= 1;
                let (tag, r) = complete::<S>(&slots[tok as usize], msg);
                f(tag, r);
            })?;
        }
        Ok(n)
    }

    fn send_blocking<A: IntoBytes + Immutable>(
        &mut self,
        tag: u64,
        method_id: u16,
        args: &A,
    ) -> Result<u32, RpcError> {
        loop {
            match self
                .transport
                .send(|buf| wire::encode(method_id, 0, args, buf))
            {
                Ok(token) => {
                    self.slots[token as usize] = CallSlot { tag, method_id };
                    self.in_flight += 1;
                    return Ok(token);
                }
                Err(RpcError::WouldBlock) => self.drain_into_ready()?,
                Err(e) => return Err(e),
            }
        }
    }

    #[cold]
    fn drain_into_ready(&mut self) -> Result<(), RpcError> {
        let Self {
            transport,
            slots,
            ready,
            in_flight,
        } = self;
        transport.poll(usize::MAX, |tok, msg| {
            *in_flight -= 1;
            ready.push_back(complete::<S>(&slots[tok as usize], msg));
        })?;
        std::hint::spin_loop();
        Ok(())
    }
}

#[inline(always)]
fn complete<S: Service>(slot: &CallSlot, msg: &[u8]) -> (u64, Result<S::Response, RpcError>) {
    (
        slot.tag,
        S::decode_response(slot.method_id, msg)
            .map_err(|e| RpcError::from_wire(slot.tag, method_name::<S>(slot.method_id), e)),
    )
}

#[cold]
fn method_name<S: Service>(method_id: u16) -> &'static str {
    S::DESCRIPTOR
        .method(method_id)
        .map_or("<unknown method>", |m| m.name)
}

//! The transport-generic server core: decodes requests, answers undecodable ones with an error
//! status, and encodes replies, immediately ([`Server::serve_once`]) or later
//! ([`Server::recv`] + [`Server::reply`], the deferred-reply path).

use crate::error::RpcError;
use crate::service::Service;
use crate::wire;

/// What [`ServerTransport::prepare_sleep`] did.
#[derive(Clone, Copy, Debug)]
pub enum SleepPrep<'a> {
    /// Armed: sleep on this shared-memory futex word while it holds 1 (`FUTEX_WAIT` with
    /// the value 1, or `futex_waitv` with other words), then call
    /// [`ServerTransport::end_sleep`].
    Sleep(&'a std::sync::atomic::AtomicU32),
    /// Not now (work is waiting): poll. Nothing to end.
    NotNow,
    /// The transport cannot sleep this way. Nothing to end.
    Unsupported,
}

/// The server side of a transport: delivers request messages and sends replies.
pub trait ServerTransport {
    /// Identifies where a reply goes. `Copy`, so a handler can keep it and reply later, out
    /// of order.
    type ReplyToken: Copy + Send + std::fmt::Debug + 'static;

    /// Makes newly arrived requests available to [`ServerTransport::recv`]; returns how many
    /// are available.
    fn poll(&mut self) -> usize;

    /// The next available request as `(token, message)`, or `None`. Entries the transport
    /// itself finds invalid (bad client id, bad slot index, oversized) are dropped and counted
    /// by the transport and never returned.
    fn recv(&mut self) -> Option<(Self::ReplyToken, &[u8])>;

    /// Sends a reply of `len` bytes (at most the service's `max_response_bytes`): `encode`
    /// writes the message into a buffer of at least `len` bytes and returns its length, at
    /// most `len`. A transport that reserves room for the reply sizes it by `len` (copyrpc
    /// checks it against the caller's response allowance, seeds/004 §3.4).
    ///
    /// # Errors
    /// [`RpcError::ReplyDropped`] if the client is gone or the token is stale/invalid, or the
    /// transport cannot take a reply of `len` bytes for this request (copyrpc: the caller
    /// reserved less).
    fn reply(
        &mut self,
        token: Self::ReplyToken,
        len: usize,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), RpcError>;

    /// [`ServerTransport::recv`] into a buffer the caller owns: the next request's message is
    /// left in `buf[..len]`, and `(token, len)` returned; `None` when no request is available.
    /// With the request in the caller's memory, the caller can read it while it answers it
    /// through [`ServerTransport::reply`] (which borrows the transport): the routing daemons
    /// of [`crate::delegation::node`] serve a request of their shard this way, writing the
    /// reply straight into the transport's reply buffer.
    ///
    /// `buf` is the caller's **private** memory (a client cannot change it while a handler
    /// reads it) and starts on an 8-byte boundary ([`crate::varlen::MAX_SLICE_ALIGN`]).
    /// The default implementation copies the message into `buf`, growing `buf` if it is
    /// shorter than the message (an allocation: size `buf` for the service's
    /// `max_request_bytes` up front). Transports that already copy each request into a
    /// private buffer of their own (the delegation ring, ipc) override it and **swap** that
    /// buffer with `buf` instead: no copy, no allocation once `buf` has the transport's
    /// request capacity (it is replaced by a buffer of that capacity on first use). The
    /// bytes `buf` held before are lost.
    #[inline]
    fn recv_into(
        &mut self,
        buf: &mut crate::varlen::AlignedBuf,
    ) -> Option<(Self::ReplyToken, usize)> {
        let (token, msg) = self.recv()?;
        if buf.len() < msg.len() {
            *buf = crate::varlen::AlignedBuf::new(msg.len());
        }
        buf[..msg.len()].copy_from_slice(msg);
        Some((token, msg.len()))
    }

    /// Ends a round: lets the transport reuse the space of every request returned by `recv`
    /// so far (delegation and ipc: `advance_tail`; eRPC: the receive burst and the copied
    /// requests' buffers), and sends the replies written so far, for transports that batch
    /// writes until their next poll (copyrpc, ScaleRPC, eRPC). [`Server::serve_once`] calls
    /// it after answering a round, so replies do not wait for the next round; a server that
    /// answers later calls it after a batch of `recv`s (tokens stay valid) and again after
    /// its replies.
    fn flush(&mut self);

    /// Blocks the serving thread until a request may have arrived or `timeout` has passed,
    /// for a serve loop with nothing to do (the park of [`crate::runner::IdlePolicy::Backoff`]).
    /// Returns `false` at once if the transport cannot wait for its requests (the default):
    /// the loop then parks for `timeout` instead. Called after [`ServerTransport::flush`],
    /// never longer than `timeout`. eRPC waits in its socket (`ppoll`), the delegation ring
    /// and ipc on their futex words (`RingServer::wait_for_request`,
    /// `IpcServer::wait_for_request`), so an idle server wakes for the first request
    /// instead of at the end of its park.
    fn wait_for_request(&mut self, timeout: std::time::Duration) -> bool {
        let _ = timeout;
        false
    }

    /// The first half of a sleep for a loop that waits for several transports at once (one
    /// `futex_waitv` over all their words: a `NodeDaemon` with an ipc server and a ring).
    /// [`SleepPrep::Sleep`] arms the transport's futex word (value 1 while armed): the caller
    /// may sleep on it until another party changes it, and must then call
    /// [`ServerTransport::end_sleep`]. [`SleepPrep::NotNow`]: work is waiting (or the
    /// transport arms its clients' checks first), poll instead. Default:
    /// [`SleepPrep::Unsupported`].
    fn prepare_sleep(&mut self) -> SleepPrep<'_> {
        SleepPrep::Unsupported
    }

    /// The second half of a sleep armed by [`ServerTransport::prepare_sleep`]: disarms the
    /// word; `slept`: whether the caller did sleep (counted by the transport).
    fn end_sleep(&mut self, slept: bool) {
        let _ = slept;
    }

    /// Receives the next request and answers it at once: `handle(request, reply_buf)` reads
    /// the request in place and writes the reply message into `reply_buf`, returning its
    /// length. Returns `None` when no request is available, else the outcome of the reply
    /// (as [`ServerTransport::reply`]).
    ///
    /// This is the zero-copy path of [`Server::serve_once_raw`]: a handler borrows
    /// variable-length arguments from the request while it writes its reply. The default
    /// implementation passes the request in place and `scratch` (at least the service's
    /// `max_response_bytes`) as the reply buffer, then copies the reply into the transport
    /// with [`ServerTransport::reply`]: one extra copy of the reply, needed where the reply
    /// buffer is the request's own memory (ScaleRPC answers in the request's slot,
    /// seeds/003 §4). Transports whose request and reply buffers are distinct override it and
    /// let `handle` write straight into the reply buffer.
    #[inline]
    fn serve_next(
        &mut self,
        scratch: &mut [u8],
        handle: impl FnOnce(&[u8], &mut [u8]) -> usize,
    ) -> Option<Result<(), RpcError>> {
        let (token, n) = {
            let (token, msg) = self.recv()?;
            (token, handle(msg, scratch))
        };
        let reply = &scratch[..n];
        Some(self.reply(token, reply.len(), |out| {
            out[..reply.len()].copy_from_slice(reply);
            reply.len()
        }))
    }
}

/// Server-side counters kept by [`Server`] (the transport keeps its own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Requests decoded and handed out.
    pub requests: u64,
    /// Requests answered with an error status because they did not decode.
    pub bad_requests: u64,
    /// Replies (including error replies) the transport dropped.
    pub dropped_replies: u64,
    /// Handler results too large for the reply buffer (a variable-length result over the
    /// service's `max_var_bytes`), answered with [`wire::Status::ResponseTooLarge`].
    pub oversized_responses: u64,
}

/// Typed server core for service `S` over transport `T`.
pub struct Server<S: Service, T: ServerTransport> {
    transport: T,
    stats: ServerStats,
    /// Reply staging buffer of [`ServerTransport::serve_next`]'s default implementation
    /// (`max_response_bytes`), allocated at the first [`Server::serve_once_raw`].
    scratch: Box<[u8]>,
    /// Aligned copy of a variable-length request whose buffer is not 8-byte aligned
    /// ([`crate::varlen::realign`]).
    realigned: crate::varlen::AlignedBuf,
    _service: std::marker::PhantomData<fn() -> S>,
}

impl<S: Service, T: ServerTransport> Server<S, T> {
    /// Wraps a transport that was created for `S` (its message sizes come from
    /// `S::DESCRIPTOR`).
    pub fn new(transport: T) -> Self {
        Server {
            transport,
            stats: ServerStats::default(),
            scratch: Box::default(),
            realigned: crate::varlen::AlignedBuf::default(),
            _service: std::marker::PhantomData,
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

    /// Counters.
    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// Makes newly arrived requests available to [`Server::recv`]; returns how many.
    #[inline]
    pub fn poll(&mut self) -> usize {
        self.transport.poll()
    }

    /// The next decoded request and the token to answer it with; `None` when no more are
    /// available. A request that does not decode is answered right here with an error status
    /// (so the client fails fast with [`RpcError::BadRequest`]), counted in
    /// [`ServerStats::bad_requests`], and skipped.
    #[inline]
    pub fn recv(&mut self) -> Option<(T::ReplyToken, S::Request)> {
        loop {
            let (token, decoded) = {
                let (token, msg) = self.transport.recv()?;
                let msg = if S::DESCRIPTOR.needs_realign(request_method_id(msg)) {
                    crate::varlen::realign(msg, &mut self.realigned)
                } else {
                    msg
                };
                (
                    token,
                    S::decode_request(msg).map_err(|e| (e, request_method_id(msg))),
                )
            };
            match decoded {
                Ok(req) => {
                    self.stats.requests += 1;
                    return Some((token, req));
                }
                Err((e, method_id)) => self.reject(token, method_id, e),
            }
        }
    }

    /// Answers the request identified by `token` with `resp`; may be called any time after
    /// [`Server::recv`] returned the token, in any order.
    ///
    /// # Errors
    /// [`RpcError::ReplyDropped`] if the client is gone or the token is stale (counted).
    #[inline]
    pub fn reply(&mut self, token: T::ReplyToken, resp: &S::Response) -> Result<(), RpcError> {
        let len = S::response_len(resp);
        if S::DESCRIPTOR.variable && len > S::DESCRIPTOR.max_response_bytes {
            return self.reply_too_large(token, len);
        }
        let r = self
            .transport
            .reply(token, len, |buf| S::encode_response(resp, buf));
        if r.is_err() {
            self.stats.dropped_replies += 1;
        }
        r
    }

    /// Ends a round ([`ServerTransport::flush`]): lets the transport reuse the space of the
    /// requests received so far (call it after a batch of [`Server::recv`]s; tokens stay
    /// valid for deferred replies) and sends the replies given so far through
    /// [`Server::reply`] on transports that batch them until their next poll.
    #[inline]
    pub fn flush(&mut self) {
        self.transport.flush();
    }

    /// One round of the serve loop: poll, answer every available request with `handler`,
    /// then release the requests' space and send the replies ([`ServerTransport::flush`]). Returns how many
    /// requests were handled (bad ones excluded).
    #[inline]
    pub fn serve_once(&mut self, mut handler: impl FnMut(S::Request) -> S::Response) -> usize {
        if self.transport.poll() == 0 {
            return 0;
        }
        let mut n = 0;
        while let Some((token, req)) = self.recv() {
            let resp = handler(req);
            // A dropped reply (client gone) is counted; the server carries on.
            let _ = self.reply(token, &resp);
            n += 1;
        }
        self.transport.flush();
        n
    }

    /// One round of the zero-copy serve loop: poll, then answer every available request with
    /// `handler(request, reply_buf)`, which decodes the request in place (variable-length
    /// arguments borrowed from it), runs the method and writes the reply into `reply_buf`,
    /// returning its length, or a [`wire::WireError`] for a request that does not decode (or
    /// a result too large), which is answered here with its error status and counted. The
    /// generated `<Trait>Service::dispatch_raw` is such a handler. Returns how many requests
    /// were handled (bad ones excluded).
    ///
    /// Unlike [`Server::serve_once`], no request or response enum is built: fixed-size
    /// arguments are read from the message, slices borrowed from it, and the result written
    /// straight into the transport's reply buffer where the transport allows
    /// ([`ServerTransport::serve_next`]).
    #[inline]
    pub fn serve_once_raw(
        &mut self,
        mut handler: impl FnMut(&[u8], &mut [u8]) -> Result<usize, wire::WireError>,
    ) -> usize {
        if self.transport.poll() == 0 {
            return 0;
        }
        if self.scratch.len() < S::DESCRIPTOR.max_response_bytes {
            self.scratch = vec![0u8; S::DESCRIPTOR.max_response_bytes].into_boxed_slice();
        }
        let mut n = 0;
        loop {
            let stats = &mut self.stats;
            let realigned = &mut self.realigned;
            let mut ok = false;
            let r = self.transport.serve_next(&mut self.scratch, |msg, out| {
                let msg = if S::DESCRIPTOR.needs_realign(request_method_id(msg)) {
                    crate::varlen::realign(msg, realigned)
                } else {
                    msg
                };
                match handler(msg, out) {
                    Ok(len) => {
                        ok = true;
                        len
                    }
                    Err(e) => raw_error::<S>(stats, msg, out, e),
                }
            });
            match r {
                None => break,
                Some(Ok(())) => {}
                Some(Err(_)) => self.stats.dropped_replies += 1,
            }
            if ok {
                self.stats.requests += 1;
                n += 1;
            }
        }
        self.transport.flush();
        n
    }

    #[cold]
    fn reply_too_large(&mut self, token: T::ReplyToken, len: usize) -> Result<(), RpcError> {
        self.stats.oversized_responses += 1;
        // An error status is checked before the echoed method id (`check_response_header`),
        // so the id need not be the call's.
        let method_id = u16::MAX;
        tracing::debug!(
            service = S::DESCRIPTOR.name,
            len,
            cap = S::DESCRIPTOR.max_response_bytes,
            "result too large for the reply buffer"
        );
        let r = self.transport.reply(token, wire::HEADER_BYTES, |buf| {
            wire::encode_status(method_id, wire::Status::ResponseTooLarge, buf)
        });
        if r.is_err() {
            self.stats.dropped_replies += 1;
        }
        r
    }

    #[cold]
    fn reject(&mut self, token: T::ReplyToken, method_id: u16, e: wire::WireError) {
        self.stats.bad_requests += 1;
        tracing::debug!(service = S::DESCRIPTOR.name, method_id, error = %e, "rejecting undecodable request");
        let status = e.status();
        if self
            .transport
            .reply(token, wire::HEADER_BYTES, |buf| {
                wire::encode_status(method_id, status, buf)
            })
            .is_err()
        {
            self.stats.dropped_replies += 1;
        }
    }
}

/// A raw handler failed on `msg`: counts it and writes the error reply into `out`.
#[cold]
fn raw_error<S: Service>(
    stats: &mut ServerStats,
    msg: &[u8],
    out: &mut [u8],
    e: wire::WireError,
) -> usize {
    if matches!(e, wire::WireError::ResponseTooLarge { .. }) {
        stats.oversized_responses += 1;
    } else {
        stats.bad_requests += 1;
    }
    let method_id = request_method_id(msg);
    tracing::debug!(service = S::DESCRIPTOR.name, method_id, error = %e, "rejecting request");
    wire::encode_status(method_id, e.status(), out)
}

/// Best-effort method id of a (possibly malformed) request, echoed in error replies.
fn request_method_id(msg: &[u8]) -> u16 {
    match msg {
        [a, b, ..] => u16::from_ne_bytes([*a, *b]),
        _ => u16::MAX,
    }
}

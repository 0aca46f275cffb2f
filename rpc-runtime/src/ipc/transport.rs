//! The typed binding of ipc: [`ClientTransport`] for [`Ipc`] and [`ServerTransport`] for
//! [`IpcServer`] (the file every transport names `transport.rs`). The client checks the
//! service's fingerprint and message sizes against the ring's header at connect; the server
//! serves requests from its private copy and writes replies straight into the client's
//! response slot.

use std::time::Duration;

use super::client::Ipc;
use super::server::{IpcServer, IpcToken};
use crate::client::ClientTransport;
use crate::erpc::idle::{idle_clock, runnable_threads, thread_may_migrate};
use crate::error::{MessageKind, RpcError};
use crate::server::ServerTransport;
use crate::service::ServiceDescriptor;

impl ClientTransport for Ipc {
    type Addr = str;

    fn connect(name: &str, service: &'static ServiceDescriptor) -> Result<Self, RpcError> {
        let ipc = Ipc::attach(name)?;
        if ipc.hdr.fingerprint != service.fingerprint {
            return Err(RpcError::SchemaMismatch {
                service: service.name,
                expected: service.fingerprint,
                found: ipc.hdr.fingerprint,
            });
        }
        let p = ipc.layout.params;
        let need = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        for (what, cap, n) in [
            (MessageKind::Request, p.req_cap, service.max_request_bytes),
            (
                MessageKind::Response,
                p.resp_cap,
                service.max_response_bytes,
            ),
        ] {
            if (cap as usize) < n {
                return Err(RpcError::CapacityMismatch {
                    service: service.name,
                    what,
                    side: crate::error::LimitSide::PeerServer,
                    setting: crate::error::SETTING_DERIVED_FROM_SERVICE,
                    cap,
                    need: need(n),
                    min: None,
                });
            }
        }
        Ok(ipc)
    }

    #[inline]
    fn max_in_flight(&self) -> usize {
        self.layout.params.depth as usize
    }

    #[inline]
    fn send(
        &mut self,
        _timeout: Duration,
        _method_id: u16,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RpcError> {
        self.try_send(encode)
    }

    #[inline]
    fn poll(&mut self, on_response: impl FnMut(u32, &[u8])) -> Result<usize, RpcError> {
        self.poll_up_to(usize::MAX, on_response)
    }

    /// Sleeps on the block's futex word ([`Ipc::sleep_for_response`], at most `max`) if
    /// `CallWait` says so for a call that has waited `waited` (module `crate::erpc::idle`,
    /// rule 4), and only from a thread that may run on more than one CPU (rule 5); `false`
    /// without sleeping otherwise (the call yields).
    fn wait_for_response(&mut self, waited: Duration, max: Duration) -> bool {
        self.call_wait_blocks(waited) && Ipc::sleep_for_response(self, max)
    }
}

impl Ipc {
    /// Whether the blocking-call policy (`CallWait`, off: never) says that a call that has
    /// polled without a response for `waited` should sleep now: never from a thread pinned
    /// to one CPU (rule 5 of `crate::erpc::idle`).
    pub(super) fn call_wait_blocks(&mut self, waited: Duration) -> bool {
        let Some(w) = &mut self.call_wait else {
            return false;
        };
        if !thread_may_migrate() {
            return false;
        }
        let waited = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        w.should_block(idle_clock(), waited, runnable_threads)
    }
}

impl ServerTransport for IpcServer {
    type ReplyToken = IpcToken;

    #[inline]
    fn poll(&mut self) -> usize {
        IpcServer::poll(self)
    }

    #[inline]
    fn recv(&mut self) -> Option<(IpcToken, &[u8])> {
        IpcServer::recv(self)
    }

    /// [`IpcServer::release`]; replies need no sending (visible as soon as they are
    /// written).
    #[inline]
    fn flush(&mut self) {
        IpcServer::release(self)
    }

    /// Sleeps on the segment's server futex word until a client publishes a request, at most
    /// `timeout` ([`IpcServer::wait_for_request`]); `false` without sleeping at the first call
    /// or with a request waiting (the loop parks or polls instead).
    fn wait_for_request(&mut self, timeout: Duration) -> bool {
        IpcServer::wait_for_request(self, timeout)
    }

    fn prepare_sleep(&mut self) -> crate::server::SleepPrep<'_> {
        IpcServer::prepare_sleep(self)
    }

    fn end_sleep(&mut self, slept: bool) {
        IpcServer::end_sleep(self, slept)
    }

    #[inline]
    fn reply(
        &mut self,
        token: IpcToken,
        _len: usize,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), RpcError> {
        self.reply_with(token, encode)
    }

    /// No copy: the server's private copy of the request (made by `recv`) is swapped with
    /// `buf` ([`IpcServer::swap_request`]).
    #[inline]
    fn recv_into(&mut self, buf: &mut crate::varlen::AlignedBuf) -> Option<(IpcToken, usize)> {
        let (token, len) = {
            let (token, msg) = IpcServer::recv(self)?;
            (token, msg.len())
        };
        self.swap_request(buf);
        Some((token, len))
    }

    /// Zero copy both ways: the request is the server's private copy (made by `recv`, so a
    /// client cannot change it while the handler reads it) and the reply is written straight
    /// into the client's response slot. `handle` does not run if the reply cannot be
    /// delivered (the errors of [`IpcServer::reply_with`]).
    #[inline]
    fn serve_next(
        &mut self,
        _scratch: &mut [u8],
        handle: impl FnOnce(&[u8], &mut [u8]) -> usize,
    ) -> Option<Result<(), RpcError>> {
        let (token, len) = {
            let (token, msg) = IpcServer::recv(self)?;
            (token, msg.len())
        };
        // Moved out for the reply (no allocation: the default is empty), so the request can
        // be read while `reply_with` borrows the server; `reply_with` never touches it.
        let req = std::mem::take(&mut self.scratch);
        let r = self.reply_with(token, |out| handle(&req[..len], out));
        self.scratch = req;
        Some(r)
    }
}

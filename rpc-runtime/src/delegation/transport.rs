//! The delegation ring as an RPC transport: [`Delegation`] (client) and [`DelegationServer`]
//! implement [`ClientTransport`]/[`ServerTransport`] on top of [`RingClient`]/[`RingServer`].
//!
//! Each request slot carries one [`crate::wire`] request message, each response slot one
//! response message; the slot payload capacities are the service's largest request and
//! response (`ServiceDescriptor::max_request_bytes` / `max_response_bytes`), and the ring
//! header carries the service's schema fingerprint, which [`Delegation`] checks on attach.

use std::time::Duration;

use super::{
    ReplyToken, RingCallError, RingClient, RingConfig, RingError, RingReplyError, RingServer,
};
use crate::client::ClientTransport;
use crate::erpc::idle::{
    CallWait, IdleConfig, idle_clock, runnable_threads, thread_may_migrate, usable_cpus,
};
use crate::error::{
    LimitSide, MessageKind, RpcError, SETTING_DERIVED_FROM_SERVICE, SETTING_SERVICE_MAX,
};
use crate::server::ServerTransport;
use crate::service::{Service, ServiceDescriptor};

/// Sizing and timing of a delegation ring; message capacities and the fingerprint come from
/// the service descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DelegationConfig {
    /// Most clients attached at once (client ids `0..max_clients`).
    pub max_clients: u32,
    /// Request slots in the shared MPSC ring; a power of two (seeds/004 §9 uses 1024).
    pub ring_depth: u32,
    /// Response slots per client = most calls one client can have in flight; a power of two
    /// (seeds/004 §9 uses the benchmark's queue depth).
    pub resp_depth: u32,
    /// How long the server waits at a hole (a reserved but uncommitted request slot) before
    /// checking whether its owner died.
    pub hole_timeout: Duration,
    /// How long the server waits at a hole whose owner is alive but stalled before skipping
    /// it (the owner's late commit is then refused). See [`RingConfig::stall_timeout`].
    pub stall_timeout: Duration,
    /// How often clients and server check each other's liveness while waiting.
    pub liveness_interval: Duration,
}

impl Default for DelegationConfig {
    fn default() -> Self {
        let ring = RingConfig::default();
        DelegationConfig {
            max_clients: ring.max_clients,
            ring_depth: ring.ring_depth,
            resp_depth: ring.resp_depth,
            hole_timeout: ring.hole_timeout,
            stall_timeout: ring.stall_timeout,
            liveness_interval: ring.liveness_interval,
        }
    }
}

/// Client transport over a delegation ring in `/dev/shm` (seeds/004 §2.2 client side).
///
/// `KvClient::<Delegation>::connect("kv0")` attaches to `/dev/shm/kv0`.
#[derive(Debug)]
pub struct Delegation {
    ring: RingClient,
    /// When a blocking call sleeps ([`ClientTransport::wait_for_response`]); `None`: never.
    call_wait: Option<CallWait>,
}

impl Delegation {
    /// The underlying ring client.
    pub fn ring(&self) -> &RingClient {
        &self.ring
    }

    /// The underlying ring client, mutably.
    pub fn ring_mut(&mut self) -> &mut RingClient {
        &mut self.ring
    }
}

#[cold]
fn call_error(e: RingCallError, ring: &RingClient) -> RpcError {
    match e {
        RingCallError::WouldBlock => RpcError::WouldBlock,
        RingCallError::ServerDisconnected => RpcError::ServerDisconnected,
        // The ring's capacity was checked against the service at attach time, so only an
        // encoder that disagrees with the descriptor gets here; the ring aborted the slot.
        RingCallError::PayloadTooLarge { len, cap } => RpcError::MessageTooLarge {
            len,
            cap,
            setting: SETTING_SERVICE_MAX,
        },
        // The ring stayed full (a stopped or overloaded server) past the call's timeout;
        // `Client` fills in the call's tag and method.
        // (`send` reports the call's timeout; `poll` never waits, so never times out.)
        RingCallError::Timeout => deadline_exceeded(std::time::Duration::ZERO),
        // The server skipped the call's position because this client stalled; nothing was
        // delivered, so sending again is safe (the typed client retries on WouldBlock).
        RingCallError::Skipped => RpcError::WouldBlock,
        RingCallError::RingCorrupt(fault) => RpcError::from(RingError::Failed {
            path: ring.path().to_path_buf(),
            fault,
        }),
    }
}

/// The ring stayed full past the call's timeout; [`crate::Client`] fills in the call's tag and
/// method.
#[cold]
fn deadline_exceeded(timeout: std::time::Duration) -> RpcError {
    RpcError::DeadlineExceeded {
        tag: crate::client::BLOCKING_TAG,
        method: "",
        timeout,
    }
}

impl ClientTransport for Delegation {
    type Addr = str;

    fn connect(name: &str, service: &'static ServiceDescriptor) -> Result<Self, RpcError> {
        let ring = RingClient::attach(name)?;
        let info = ring.info();
        if info.fingerprint != service.fingerprint {
            return Err(RpcError::SchemaMismatch {
                service: service.name,
                expected: service.fingerprint,
                found: info.fingerprint,
            });
        }
        if (info.req_payload_cap as usize) < service.max_request_bytes {
            return Err(RpcError::CapacityMismatch {
                service: service.name,
                what: MessageKind::Request,
                side: LimitSide::PeerServer,
                setting: SETTING_DERIVED_FROM_SERVICE,
                cap: info.req_payload_cap,
                need: u32::try_from(service.max_request_bytes).unwrap_or(u32::MAX),
                min: None,
            });
        }
        if (info.resp_payload_cap as usize) < service.max_response_bytes {
            return Err(RpcError::CapacityMismatch {
                service: service.name,
                what: MessageKind::Response,
                side: LimitSide::PeerServer,
                setting: SETTING_DERIVED_FROM_SERVICE,
                cap: info.resp_payload_cap,
                need: u32::try_from(service.max_response_bytes).unwrap_or(u32::MAX),
                min: None,
            });
        }
        Ok(Delegation {
            ring,
            call_wait: Some(CallWait::new(IdleConfig::default(), usable_cpus())),
        })
    }

    #[inline]
    fn max_in_flight(&self) -> usize {
        self.ring.info().resp_depth as usize
    }

    #[inline]
    fn send(
        &mut self,
        timeout: std::time::Duration,
        _method_id: u16,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RpcError> {
        self.ring
            .try_call_with_timeout(timeout, encode)
            .map_err(|e| match e {
                RingCallError::Timeout => deadline_exceeded(timeout),
                e => call_error(e, &self.ring),
            })
    }

    #[inline]
    fn poll(&mut self, on_response: impl FnMut(u32, &[u8])) -> Result<usize, RpcError> {
        self.ring
            .poll(on_response)
            .map_err(|e| call_error(e, &self.ring))
    }

    /// Sleeps on the client's futex word ([`RingClient::wait_for_response`], at most `max`)
    /// if [`CallWait`] says so for a call that has waited `waited`: while the machine is
    /// oversubscribed, or once the call has waited 200 µs (module [`crate::erpc::idle`], "A
    /// blocking call"), and only if the calling thread may run on more than one CPU (rule 5
    /// there). `false` without sleeping otherwise (the call yields).
    fn wait_for_response(&mut self, waited: Duration, max: Duration) -> bool {
        let Some(w) = &mut self.call_wait else {
            return false;
        };
        // Rule 5: a thread pinned to one CPU polls on.
        if !thread_may_migrate() {
            return false;
        }
        let now = idle_clock();
        let waited = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        if !w.should_block(now, waited, runnable_threads) {
            return false;
        }
        self.ring.wait_for_response(max)
    }
}

impl Delegation {
    /// Turns the sleeps of blocking calls on (`Some`, the default: `CallWait` with
    /// `IdleConfig::default()`) or off (`None`: a waiting call polls and yields).
    pub fn set_call_wait(&mut self, policy: Option<CallWait>) {
        self.call_wait = policy;
    }

    /// The sleep policy's counters (`None` if off).
    pub fn call_wait_stats(&self) -> Option<crate::erpc::idle::CallWaitStats> {
        self.call_wait.as_ref().map(CallWait::stats)
    }
}

/// Server transport over a delegation ring it creates in `/dev/shm` (seeds/004 §2.2 server
/// side): `poll` = ring poll, `recv` = ring recv, `flush` = `advance_tail`.
#[derive(Debug)]
pub struct DelegationServer {
    ring: RingServer,
}

impl DelegationServer {
    /// Creates the ring `/dev/shm/<name>` (mode 0600) for `service`.
    ///
    /// # Errors
    /// [`RpcError::Transport`] ([`RingError`]) if the name is taken by a live server, the configuration is invalid
    /// (depths not powers of two, ...), or shared memory cannot be created/mapped.
    pub fn create(
        name: &str,
        service: &'static ServiceDescriptor,
        cfg: DelegationConfig,
    ) -> Result<Self, RpcError> {
        let ring_cfg = RingConfig {
            max_clients: cfg.max_clients,
            ring_depth: cfg.ring_depth,
            resp_depth: cfg.resp_depth,
            req_payload_cap: service.max_request_bytes as u32,
            resp_payload_cap: service.max_response_bytes as u32,
            fingerprint: service.fingerprint,
            hole_timeout: cfg.hole_timeout,
            stall_timeout: cfg.stall_timeout,
            liveness_interval: cfg.liveness_interval,
        };
        Ok(DelegationServer {
            ring: RingServer::create(name, &ring_cfg)?,
        })
    }

    /// [`DelegationServer::create`] for service `S`, wrapped in a typed [`crate::Server`].
    ///
    /// # Errors
    /// As [`DelegationServer::create`].
    pub fn serve<S: Service>(
        name: &str,
        cfg: DelegationConfig,
    ) -> Result<crate::Server<S, Self>, RpcError> {
        Ok(crate::Server::new(Self::create(name, S::DESCRIPTOR, cfg)?))
    }

    /// The underlying ring server (counters: [`RingServer::stats`]).
    pub fn ring(&self) -> &RingServer {
        &self.ring
    }

    /// The underlying ring server, mutably.
    pub fn ring_mut(&mut self) -> &mut RingServer {
        &mut self.ring
    }
}

impl ServerTransport for DelegationServer {
    type ReplyToken = ReplyToken;

    #[inline]
    fn poll(&mut self) -> usize {
        self.ring.poll()
    }

    #[inline]
    fn recv(&mut self) -> Option<(ReplyToken, &[u8])> {
        self.ring.recv().map(|e| (e.token, e.payload))
    }

    /// Lets clients reuse the ring space of the requests received so far (`advance_tail`);
    /// replies need no sending (visible as soon as they are written).
    #[inline]
    fn flush(&mut self) {
        self.ring.advance_tail();
    }

    /// Sleeps on the ring's server futex word until a client commits a request, at most
    /// `timeout` ([`RingServer::wait_for_request`]); `false` without sleeping if an entry is
    /// already reserved (the loop polls again after its park or yield).
    fn wait_for_request(&mut self, timeout: Duration) -> bool {
        self.ring.wait_for_request(timeout)
    }

    fn prepare_sleep(&mut self) -> crate::server::SleepPrep<'_> {
        self.ring.prepare_sleep()
    }

    fn end_sleep(&mut self, slept: bool) {
        self.ring.end_sleep(slept)
    }

    #[inline]
    fn reply(
        &mut self,
        token: ReplyToken,
        _len: usize,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), RpcError> {
        self.ring.reply_with(token, encode).map_err(reply_error)
    }

    /// No copy: [`RingServer::recv_into`] swaps the ring's private copy of the request with
    /// `buf`.
    #[inline]
    fn recv_into(&mut self, buf: &mut crate::varlen::AlignedBuf) -> Option<(ReplyToken, usize)> {
        self.ring.recv_into(buf)
    }

    /// Zero copy both ways ([`RingServer::recv_reply`]): the handler reads the server's
    /// private copy of the request and writes into the client's response slot.
    #[inline]
    fn serve_next(
        &mut self,
        _scratch: &mut [u8],
        handle: impl FnOnce(&[u8], &mut [u8]) -> usize,
    ) -> Option<Result<(), RpcError>> {
        self.ring.recv_reply(handle).map(|r| r.map_err(reply_error))
    }
}

#[cold]
fn reply_error(e: RingReplyError) -> RpcError {
    RpcError::ReplyDropped(match e {
        RingReplyError::StaleToken => "the client detached or died (stale token)",
        RingReplyError::BadToken => "token out of range",
        RingReplyError::SlotBusy => "the client's response slot still holds an unread response",
        RingReplyError::PayloadTooLarge { .. } => "response larger than the slot",
    })
}

//! The transport-generic client core that generated `<Trait>Client` stubs wrap.
//!
//! A [`ClientTransport`] moves opaque messages and identifies each call in flight by a small
//! token; [`Client`] adds typed encoding/decoding, user tags for pipelined calls, and blocking
//! calls on top.
//!
//! # Every call ends
//! Each call has a deadline ([`DEFAULT_DEADLINE`], 1 s, unless the client or the call sets
//! another; see [`Client`]'s "Deadlines"). The waits a call can meet, and what bounds each:
//!
//! | wait | where | bounded by |
//! |---|---|---|
//! | response of a blocking call | [`Client::call_within`] | the call's deadline |
//! | a block of a blocking call in the transport ([`ClientTransport::wait_for_response`], after the call's spin-then-yield backoff; eRPC over UDP, and the delegation ring and ipc from a thread not pinned to one CPU, when the machine is oversubscribed or the call has waited 200 µs) | inside the transport | the call's remaining deadline and [`IDLE_TICK_NS`] (1 ms) |
//! | response of a pipelined call | [`Client::poll`]/[`Client::poll_with`] (never block) | the call's deadline: expiry is delivered with its tag |
//! | no free token / transport full (`WouldBlock`: delegation response slots, copyrpc credit and ring space, ScaleRPC group not scheduled, eRPC session credits) | [`Client::call_within`] retrying `send` | the call's deadline |
//! | delegation ring full after a position was reserved | inside `Delegation::send` | the call's deadline (`delegation` module docs) |
//! | connect / attach | each transport's `connect` | the transport's connect timeout (its `Addr`'s `timeout`; eRPC `ErpcConfig`) |
//! | server gone (dead process, QP error, shutdown) | every poll | the transport's liveness checks report [`RpcError::ServerDisconnected`] (delegation: `liveness_interval`; copyrpc, ScaleRPC: QP errors and the probe interval; eRPC: the session's failure detection) |
//!
//! A stopped (not dead) server is caught by the deadline: its calls fail with
//! [`RpcError::DeadlineExceeded`], and its late answers, once it resumes, are dropped and
//! counted ([`ClientStats::late_responses`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use zerocopy::{Immutable, IntoBytes, KnownLayout, TryFromBytes};

use crate::error::RpcError;
use crate::service::{Service, ServiceDescriptor};
use crate::wire;

/// Calls one typed client may have in flight by default, on every transport: each transport's
/// default configuration gives [`ClientTransport::max_in_flight`] this value, so the same
/// pipelining code meets [`RpcError::WouldBlock`] at the same depth everywhere. Where it is
/// set per transport:
///
/// | transport | setting | side |
/// |---|---|---|
/// | delegation | `DelegationConfig::resp_depth` (response slots per client) | server |
/// | ipc | `IpcConfig::depth` (ring slots per client) | server |
/// | copyrpc | `CopyrpcAddr::max_in_flight` | client |
/// | eRPC | `ErpcConfig::max_in_flight` (8 per session, seeds/002 §2) | client |
/// | ScaleRPC | `ServerConfig::slots_per_conn` (default 33) minus the liveness probe's slot | server |
///
/// 32 is the delegation ring's and eRPC's long-standing default (four eRPC sessions of 8
/// slots); it keeps a client's response buffers small (32 × the service's largest response)
/// while covering the queue depths of the seeds' benchmarks.
pub const DEFAULT_CALLS_IN_FLIGHT: usize = 32;

/// The client side of a transport: sends request messages and delivers response messages.
///
/// Implemented by each transport: `Delegation`, `Ipc`, `Copyrpc`, `Erpc` and `ScaleRpc`.
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

    /// Sends one request of method `method_id` (an index into the service's
    /// [`ServiceDescriptor::methods`], checked by the caller). `encode` writes the message
    /// into a buffer of at least that method's `request_bytes` and returns its length.
    /// Returns the call's token, which stays reserved until [`ClientTransport::poll`]
    /// delivers the response. A transport that reserves room for the response when it sends
    /// (copyrpc's response allowance, seeds/004 §3.4) sizes it by the method's
    /// `response_bytes`, the largest response the call can get.
    ///
    /// `timeout` is the call's timeout: a transport that must wait inside `send` (after
    /// committing to send, as the delegation ring does after reserving a ring position) waits
    /// at most that long (reading the clock only once it has to wait). A transport that can
    /// return [`RpcError::WouldBlock`] instead must do so rather than wait: [`Client`] bounds
    /// its retries by the call's deadline.
    ///
    /// # Errors
    /// [`RpcError::WouldBlock`] when no token is free (nothing was sent; poll and retry);
    /// [`RpcError::DeadlineExceeded`] if `timeout` passed while `send` waited;
    /// [`RpcError::ServerDisconnected`].
    fn send(
        &mut self,
        timeout: Duration,
        method_id: u16,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RpcError>;

    /// Delivers every response that has arrived as `on_response(token, message)`, in place
    /// in the transport's receive buffer; returns how many were delivered. Delivering all
    /// of them at once lets the caller decode each response once, straight from that
    /// buffer, and keep only what it cannot hand out yet ([`Client`]'s queue), so no
    /// transport holds a second copy of responses beyond a caller's limit. A response the
    /// transport found corrupt is delivered as an empty message (it then fails to decode).
    ///
    /// # Errors
    /// [`RpcError::ServerDisconnected`] once the server is known to be gone while calls are
    /// in flight.
    fn poll(&mut self, on_response: impl FnMut(u32, &[u8])) -> Result<usize, RpcError>;

    /// Called by [`Client`] while its polls deliver nothing and calls are in flight, at most
    /// once per [`IDLE_TICK_NS`] (1 ms) of such polling. A transport with a liveness check
    /// (copyrpc, ScaleRPC) runs it here, so that a dead or stopped server is noticed after
    /// its probe interval of waiting, however slowly the caller polls (a count of empty
    /// polls alone can take longer than a call's deadline on a loaded machine). Default:
    /// nothing.
    #[inline]
    fn idle_tick(&mut self) {}

    /// Called by [`Client`]'s blocking call while its polls deliver nothing, once its
    /// spin-then-yield backoff (`crossbeam_utils::Backoff`: 7 rounds of spinning, then 4
    /// yields) has completed, instead of yielding once more: the transport may block until
    /// a response may have arrived, for at most `max` (the call's remaining deadline, and
    /// at most [`IDLE_TICK_NS`]). `waited` is how long the call has polled without any
    /// response. Returns `true` if it waited (or found work to do at once), `false` if it
    /// did not: the call then yields. Default: `false`.
    ///
    /// A blocking call whose thread shares its CPU with the server (or with any busy
    /// thread) takes CPU time from the one that would answer; eRPC over UDP blocks in its
    /// socket then, and the delegation ring and ipc sleep on the client's futex word (unless
    /// the thread is pinned to one CPU) ([`crate::erpc::idle::CallWait`]).
    #[inline]
    fn wait_for_response(&mut self, waited: Duration, max: Duration) -> bool {
        let _ = (waited, max);
        false
    }
}

/// A completed pipelined call as [`Client::poll_raw_with`] hands it out.
pub enum Completion<'a, S: Service> {
    /// The response message of a call of `method_id`, in place in the transport's receive
    /// buffer (8-byte aligned where the method needs it): decode it with the service's codec
    /// (generated `poll_ref` does).
    Msg {
        /// The method called.
        method_id: u16,
        /// The response message (header included).
        msg: &'a [u8],
    },
    /// A response that arrived while a blocking call waited, decoded then.
    Decoded(S::Response),
    /// The call failed: its deadline passed, or its response did not decode.
    Failed(RpcError),
}

/// The name of method `method_id` of `S` for errors (`"<unknown method>"` if none).
#[cold]
pub fn method_name_of<S: Service>(method_id: u16) -> &'static str {
    method_name::<S>(method_id)
}

/// What the client knows of the call on one transport token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    /// No call: the transport has not handed this token out (or handed it back).
    Free,
    /// A call waits for its response.
    Live,
    /// The call's deadline passed and it was reported as failed; the transport still holds
    /// the token, and the response, if it ever comes, is dropped (a *zombie*).
    Expired,
}

#[derive(Clone, Copy, Debug)]
struct CallSlot {
    tag: u64,
    /// When the call is next checked, in ns of the TSC clock since [`Calls::epoch`]: valid
    /// once the call was stamped ([`Calls::stamp`], at the client's next clock read after
    /// issuing it); until `mono_deadline_ns` is set, when to set it.
    deadline_ns: u64,
    /// When the call expires, in ns of the monotonic clock since [`Calls::mono_epoch`]: the
    /// deadline itself, which the TSC clock only schedules. [`UNSTAMPED`] until the call has
    /// been live for 1/64 of its timeout ([`MONO_GRACE_SHIFT`], [`Calls::confirm_due`]).
    mono_deadline_ns: u64,
    /// The call's timeout (its deadline is this long after it was stamped).
    timeout: Duration,
    method_id: u16,
    state: SlotState,
}

/// What a response completes: the call's tag and method.
#[derive(Clone, Copy, Debug)]
struct Call {
    tag: u64,
    method_id: u16,
}

/// "No deadline yet" for a blocking call waiting for room to send.
const UNSTAMPED: u64 = u64::MAX;

/// How long a stamped call stays live before its deadline is stamped on the monotonic clock
/// too: `timeout >> MONO_GRACE_SHIFT`, 1/64 of its timeout. A call answered sooner (nearly
/// all) never costs a monotonic clock read; one that is not has its deadline counted from
/// then, so it expires at most this much later than `timeout` after it was issued (plus the
/// time to an empty poll).
const MONO_GRACE_SHIFT: u32 = 6;

/// `now + (timeout >> MONO_GRACE_SHIFT)` in ns, saturated below [`UNSTAMPED`].
#[inline]
fn grace_after(now: u64, timeout: Duration) -> u64 {
    let t = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
    now.saturating_add(t >> MONO_GRACE_SHIFT).min(UNSTAMPED - 1)
}

/// `now + timeout` in ns since a client's epoch, saturated below [`UNSTAMPED`].
#[inline]
fn deadline_after(now: u64, timeout: Duration) -> u64 {
    let t = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
    now.saturating_add(t).min(UNSTAMPED - 1)
}

/// Most calls issued between two clock reads: a client that never finds a poll empty still
/// stamps deadlines every this many calls.
const STAMP_EVERY: usize = 256;

/// Tag used internally for blocking calls (reported in their errors).
pub const BLOCKING_TAG: u64 = u64::MAX;

/// Deadline of every call unless the client or the call sets another: 1 s after the call is
/// issued. Long enough for any call of a healthy server on the software device model under a
/// loaded debug build (typical calls take µs), short enough that a stopped or wedged server is
/// noticed quickly. Change it per client with [`Client::set_default_deadline`], per call with
/// [`Client::call_within`]/[`Client::issue_within`] (generated stubs:
/// `client.with_deadline(d).method(..)`, `client.issue(tag).with_deadline(d).method(..)`).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(1);
/// Least time in ns between two [`ClientTransport::idle_tick`] calls of a [`Client`]: 1 ms,
/// well below the transports' liveness probe intervals (100 ms by default).
pub const IDLE_TICK_NS: u64 = 1_000_000;

/// Counters of a [`Client`]: calls that ended without their response, and responses that
/// arrived for no live call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Calls failed with [`RpcError::DeadlineExceeded`] after they were sent (calls that
    /// could not even be sent before their deadline are not counted here).
    pub expired: u64,
    /// Responses that arrived after their call had expired; each was dropped.
    pub late_responses: u64,
    /// Calls given up by the transport without a response: it reported
    /// [`RpcError::ServerDisconnected`] with them in flight, then (after a reconnect) handed
    /// their tokens out again.
    pub abandoned: u64,
    /// Responses the transport delivered for a token with no call on it (a transport bug
    /// or a corrupt peer); each was dropped.
    pub stray_responses: u64,
}

/// The per-token call table: which call each transport token carries, their deadlines, and
/// the counters.
///
/// Deadlines are stamped lazily so that issuing a call does not read the clock: a call is
/// recorded with its timeout, and gets its deadline (`now + timeout`) at the next clock read,
/// which happens when a poll finds nothing or after [`STAMP_EVERY`] calls.
///
/// Two clocks: the TSC (`quanta`, a few instructions per read) is read at every empty poll
/// and says when a call is *due to be checked*; the monotonic clock ([`std::time::Instant`],
/// the clock a caller measures with) says whether its deadline *has passed*
/// ([`Calls::confirm_due`]). `quanta` calibrates the TSC against the monotonic clock once,
/// and on a VM the result can be off by ~100 ppm: a CI run saw a 100 ms deadline fire 11 µs
/// early by the TSC alone. The monotonic clock is read only for calls still live
/// the grace ([`MONO_GRACE_SHIFT`], 1/64 of the timeout) after their stamp: the deadline counts from that
/// read, `mono + timeout`. A deadline is therefore never earlier than `timeout` after the
/// call was issued, by `Instant`, and later by at most 1/64 of it plus the time until the
/// client's empty polls (or its next [`STAMP_EVERY`] calls).
struct Calls {
    slots: Box<[CallSlot]>,
    /// Calls sent and neither answered nor expired.
    live: usize,
    /// Expired calls whose token the transport still holds.
    zombies: usize,
    /// Source of the `*_ns` times: the TSC through `quanta` (a read costs a few instructions
    /// instead of a vDSO `clock_gettime`), calibrated against the monotonic clock.
    clock: quanta::Clock,
    /// Raw `clock` reading at creation: the origin of the `*_ns` times.
    epoch: u64,
    /// Monotonic clock reading at creation: the origin of the `mono_*_ns` times.
    mono_epoch: Instant,
    /// When the transport is next told that polls come back empty
    /// ([`ClientTransport::idle_tick`]), in ns since the epoch.
    next_idle_ns: u64,
    /// The earliest stamped deadline of a live call, or a lower bound of it (`u64::MAX`: none).
    earliest_ns: u64,
    /// One bit per token: a call was issued on it since the last stamp.
    unstamped: Box<[u64]>,
    /// Calls issued since the last stamp.
    pending: usize,
    stats: ClientStats,
}

impl Calls {
    fn new(n: usize) -> Self {
        Self::with_clock(n, quanta::Clock::new())
    }

    /// [`Calls::new`] with the TSC clock given (tests pass `quanta::Clock::mock()`).
    fn with_clock(n: usize, clock: quanta::Clock) -> Self {
        Calls {
            slots: vec![
                CallSlot {
                    tag: 0,
                    deadline_ns: UNSTAMPED,
                    mono_deadline_ns: UNSTAMPED,
                    timeout: Duration::ZERO,
                    method_id: 0,
                    state: SlotState::Free,
                };
                n
            ]
            .into_boxed_slice(),
            live: 0,
            zombies: 0,
            epoch: clock.raw(),
            mono_epoch: Instant::now(),
            next_idle_ns: 0,
            clock,
            earliest_ns: u64::MAX,
            unstamped: vec![0; n.div_ceil(64)].into_boxed_slice(),
            pending: 0,
            stats: ClientStats::default(),
        }
    }

    /// Reads the clock: ns since [`Calls::epoch`].
    #[inline]
    fn now_ns(&self) -> u64 {
        self.clock
            .delta_as_nanos(self.epoch, self.clock.raw())
            .min(u64::MAX - 1)
    }

    /// Reads the monotonic clock: ns since [`Calls::mono_epoch`].
    fn mono_now_ns(&self) -> u64 {
        u64::try_from(self.mono_epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// Whether the transport is due an [`ClientTransport::idle_tick`] at `now` (at most one
    /// per [`IDLE_TICK_NS`]); if so, the next one is due [`IDLE_TICK_NS`] later.
    #[inline]
    fn idle_due(&mut self, now: u64) -> bool {
        if now < self.next_idle_ns {
            return false;
        }
        self.next_idle_ns = now.saturating_add(IDLE_TICK_NS);
        true
    }

    /// Records a call just sent on `token`.
    #[inline(always)]
    fn start(&mut self, token: u32, tag: u64, method_id: u16, timeout: Duration) {
        match self.slots.get_mut(token as usize) {
            Some(slot) if slot.state == SlotState::Free => {
                // `deadline_ns` is left as it is: `stamp` sets it (every live call is stamped
                // before any scan or deadline check reads it).
                slot.tag = tag;
                slot.timeout = timeout;
                slot.method_id = method_id;
                slot.state = SlotState::Live;
            }
            _ => self.start_reused(token, tag, method_id, timeout),
        }
        self.live += 1;
        if let Some(w) = self.unstamped.get_mut(token as usize / 64) {
            *w |= 1 << (token % 64);
        }
        self.pending += 1;
        if self.pending == STAMP_EVERY {
            self.stamp(self.now_ns());
        }
    }

    /// [`Calls::start`] on a token this table still holds (see [`Calls::reused`]).
    #[cold]
    fn start_reused(&mut self, token: u32, tag: u64, method_id: u16, timeout: Duration) {
        self.reused(token);
        let slot = &mut self.slots[token as usize];
        slot.tag = tag;
        slot.timeout = timeout;
        slot.method_id = method_id;
        slot.state = SlotState::Live;
    }

    /// Stamps every call issued since the last stamp: its first check is due at
    /// `now + timeout / 64` (TSC, [`MONO_GRACE_SHIFT`]), when its deadline is stamped on the monotonic clock
    /// ([`Calls::confirm_due`]). Walks the set bits of [`Calls::unstamped`] (a token answered
    /// and reissued in between carries its newest call, issued before `now` too).
    #[cold]
    fn stamp(&mut self, now: u64) {
        for w in 0..self.unstamped.len() {
            let mut bits = std::mem::take(&mut self.unstamped[w]);
            while bits != 0 {
                let token = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let slot = &mut self.slots[token];
                if slot.state == SlotState::Live {
                    slot.deadline_ns = grace_after(now, slot.timeout);
                    slot.mono_deadline_ns = UNSTAMPED;
                    self.earliest_ns = self.earliest_ns.min(slot.deadline_ns);
                }
            }
        }
        self.pending = 0;
    }

    /// The transport handed out a token this table still holds: it gave up the token's old
    /// call without delivering a response (it reported the server gone, then reconnected).
    /// That call's response can no longer arrive under this token: a zombie is forgotten, a
    /// live call is counted in [`ClientStats::abandoned`].
    #[cold]
    fn reused(&mut self, token: u32) {
        let slot = &mut self.slots[token as usize];
        match slot.state {
            SlotState::Expired => self.zombies -= 1,
            SlotState::Live => {
                // The transport failed (`ServerDisconnected`) with this call in flight and,
                // after a reconnect, hands the token out again: the call is over.
                self.live -= 1;
                self.stats.abandoned += 1;
            }
            SlotState::Free => {}
        }
        slot.state = SlotState::Free;
    }

    /// A response arrived on `token`: returns the call it completes, or `None` if the call
    /// expired (late response) or there is none (stray response); both are dropped and counted.
    #[inline(always)]
    fn settle(&mut self, token: u32) -> Option<Call> {
        match self.slots.get_mut(token as usize) {
            Some(slot) if slot.state == SlotState::Live => {
                slot.state = SlotState::Free;
                self.live -= 1;
                Some(Call {
                    tag: slot.tag,
                    method_id: slot.method_id,
                })
            }
            _ => self.settle_dead(token),
        }
    }

    #[cold]
    fn settle_dead(&mut self, token: u32) -> Option<Call> {
        match self.slots.get_mut(token as usize) {
            Some(slot) if slot.state == SlotState::Expired => {
                slot.state = SlotState::Free;
                self.zombies -= 1;
                self.stats.late_responses += 1;
                tracing::debug!(
                    token,
                    tag = slot.tag,
                    "late response of an expired call dropped"
                );
            }
            _ => {
                self.stats.stray_responses += 1;
                tracing::warn!(token, "response for a token with no call dropped");
            }
        }
        None
    }

    /// Marks the live call on `token` expired (its token stays reserved in the transport).
    #[cold]
    fn expire(&mut self, token: u32) -> CallSlot {
        let slot = &mut self.slots[token as usize];
        debug_assert_eq!(slot.state, SlotState::Live);
        slot.state = SlotState::Expired;
        self.live -= 1;
        self.zombies += 1;
        self.stats.expired += 1;
        *slot
    }

    /// A poll found nothing: reads the clock, stamps the calls issued since the last read,
    /// and expires every live call (but `skip`) whose deadline has passed, handing each to
    /// `out`. Returns the time read.
    #[inline]
    fn tick(&mut self, skip: u32, mut out: impl FnMut(CallSlot)) -> u64 {
        let now = self.now_ns();
        if self.pending != 0 {
            self.stamp(now);
        }
        if self.earliest_ns <= now {
            self.scan(now, skip, &mut out);
        }
        now
    }

    #[cold]
    fn scan(&mut self, now: u64, skip: u32, out: &mut dyn FnMut(CallSlot)) {
        let mut earliest = u64::MAX;
        // The monotonic clock, read at the first call found due by the TSC.
        let mut mono = None;
        for token in 0..self.slots.len() as u32 {
            let slot = self.slots[token as usize];
            if slot.state != SlotState::Live {
                continue;
            }
            // The blocking call (`skip`) is expired by its caller, but stamped here too.
            if slot.deadline_ns <= now && (token != skip || slot.mono_deadline_ns == UNSTAMPED) {
                let m = *mono.get_or_insert_with(|| self.mono_now_ns());
                if self.confirm_due(token, now, m) && token != skip {
                    out(self.expire(token));
                    continue;
                }
            }
            earliest = earliest.min(self.slots[token as usize].deadline_ns);
        }
        self.earliest_ns = earliest;
    }

    /// The TSC says the live call on `token` is due a check at `now`; `mono` is the
    /// monotonic clock (ns since [`Calls::mono_epoch`]). Its first check (1/64 of its
    /// timeout after the stamp, [`MONO_GRACE_SHIFT`]) stamps its deadline on the monotonic clock, `mono + timeout`, and the
    /// TSC check moves to `now + timeout`. Later checks return whether that deadline passed;
    /// if not, the TSC check moves to when it will have (the time left, from `now`) and the
    /// call stays live: the TSC's calibration error is a fraction of the time left, so a
    /// check or two more settle it.
    #[cold]
    fn confirm_due(&mut self, token: u32, now: u64, mono: u64) -> bool {
        let slot = &mut self.slots[token as usize];
        if slot.mono_deadline_ns == UNSTAMPED {
            slot.mono_deadline_ns = deadline_after(mono, slot.timeout);
            slot.deadline_ns = deadline_after(now, slot.timeout);
            self.earliest_ns = self.earliest_ns.min(slot.deadline_ns);
            return false;
        }
        if mono >= slot.mono_deadline_ns {
            return true;
        }
        slot.deadline_ns = now.saturating_add(slot.mono_deadline_ns - mono);
        self.earliest_ns = self.earliest_ns.min(slot.deadline_ns);
        false
    }
}

/// Typed client core for service `S` over transport `T`: blocking calls, pipelined calls with
/// user tags, and polling for their completions.
///
/// Blocking and pipelined calls may be mixed: completions of pipelined calls that arrive while
/// a blocking call waits are kept (in arrival order) for the next [`Client::poll`].
///
/// # Deadlines
/// Every call has a deadline, [`DEFAULT_DEADLINE`] (1 s) after it is issued unless the client
/// ([`Client::set_default_deadline`]) or the call ([`Client::call_within`],
/// [`Client::issue_within`]) says otherwise.
/// - A blocking call whose deadline passes returns [`RpcError::DeadlineExceeded`]; this
///   includes the time spent waiting for a free token or for room in the transport
///   (`WouldBlock`: delegation ring full, copyrpc credit or ring space, ScaleRPC group not
///   scheduled).
/// - A pipelined call whose deadline passes is delivered by [`Client::poll`] as
///   `Err(RpcError::DeadlineExceeded { tag, .. })` and by [`Client::poll_with`] as
///   `f(tag, Err(..))`.
/// - Issuing a call does not read the clock: the clock is read when a poll finds nothing (and
///   every 256 calls), and calls issued since the previous read get their deadline then
///   (`now + timeout`). A deadline is thus never earlier than the timeout after the call was
///   issued, as [`std::time::Instant`] measures it, and later by at most 1/64 of the timeout
///   plus the time to the client's next empty poll. (Empty polls read the TSC, which only
///   schedules checks; the monotonic clock decides them, so a miscalibrated TSC cannot fail
///   a call early. It is read for calls still live after 1/64 of their timeout, when their
///   deadline starts counting on it.) Expiry is found on empty polls only, so a client that
///   keeps receiving responses pays nothing more.
/// - An expired call keeps its transport token (a *zombie*, [`Client::zombies`]) until its
///   response arrives; that late response is dropped and counted in
///   [`ClientStats::late_responses`], and only then can the token carry another call. A late
///   response therefore never completes a later call, on any transport, whatever the
///   transport's own slot, call id or request numbering. A response that never comes keeps
///   its token until the transport reports the server gone; when every token is held by a
///   zombie, new calls wait for room and end with [`RpcError::DeadlineExceeded`].
pub struct Client<S: Service, T: ClientTransport> {
    transport: T,
    calls: Calls,
    ready: VecDeque<(u64, Result<S::Response, RpcError>)>,
    timeout: Duration,
    /// Aligned copy of a variable-length response whose buffer is not 8-byte aligned
    /// ([`crate::varlen::realign`]).
    realigned: crate::varlen::AlignedBuf,
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
            calls: Calls::new(n),
            ready: VecDeque::with_capacity(n),
            timeout: DEFAULT_DEADLINE,
            realigned: crate::varlen::AlignedBuf::default(),
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
    /// (including completions and expiries already found and waiting to be polled; not
    /// including [zombies](Client::zombies)).
    pub fn in_flight(&self) -> usize {
        self.calls.live + self.ready.len()
    }

    /// Expired calls whose transport token is still held until their late response arrives
    /// (see "Deadlines" in the type's docs).
    pub fn zombies(&self) -> usize {
        self.calls.zombies
    }

    /// Most calls that can be in flight at once (zombies included).
    pub fn max_in_flight(&self) -> usize {
        self.calls.slots.len()
    }

    /// The timeout of calls that do not set their own: [`DEFAULT_DEADLINE`] unless changed.
    pub fn default_deadline(&self) -> Duration {
        self.timeout
    }

    /// Sets the timeout of later calls that do not set their own (calls in flight keep
    /// theirs).
    pub fn set_default_deadline(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The largest request of method `method_id` this client sends, in bytes (header
    /// included): the method's fixed part, plus the service's `max_var_bytes` for a
    /// variable-length method. The connect checked that the transport carries it; a longer
    /// request fails with [`RpcError::MessageTooLarge`] before anything is sent. 0 for an
    /// unknown method.
    pub fn max_request_bytes(&self, method_id: u16) -> usize {
        S::DESCRIPTOR
            .method(method_id)
            .map_or(0, |m| m.request_bytes)
    }

    /// The largest successful response of method `method_id`, in bytes (header included),
    /// as [`Client::max_request_bytes`]; a server whose result is longer answers
    /// [`wire::Status::ResponseTooLarge`]. 0 for an unknown method.
    pub fn max_response_bytes(&self, method_id: u16) -> usize {
        S::DESCRIPTOR
            .method(method_id)
            .map_or(0, |m| m.response_bytes)
    }

    /// Counters: expired calls, late and stray responses.
    pub fn stats(&self) -> ClientStats {
        self.calls.stats
    }

    /// Blocking call with the default deadline ([`Client::call_within`]).
    ///
    /// # Errors
    /// As [`Client::call_within`].
    #[inline]
    pub fn call<A, R>(&mut self, method_id: u16, args: &A) -> Result<R, RpcError>
    where
        A: IntoBytes + Immutable,
        R: TryFromBytes + KnownLayout + Immutable,
    {
        self.call_within(self.timeout, method_id, args)
    }

    /// Blocking call: sends method `method_id` with `args` and waits, at most `timeout`, for
    /// its response, decoded as the lowered return type `R`.
    ///
    /// # Errors
    /// [`RpcError::DeadlineExceeded`] when `timeout` passes first (waiting for room to send
    /// counts); [`RpcError::ServerDisconnected`]; [`RpcError::BadRequest`] if the server
    /// rejected the request; [`RpcError::BadResponse`] if the response does not decode as `R`.
    #[inline]
    pub fn call_within<A, R>(
        &mut self,
        timeout: Duration,
        method_id: u16,
        args: &A,
    ) -> Result<R, RpcError>
    where
        A: IntoBytes + Immutable,
        R: TryFromBytes + KnownLayout + Immutable,
    {
        let token = self.send_blocking(timeout, method_id, args)?;
        self.wait_response(token, method_id, |msg| {
            wire::decode_response::<R>(method_id, msg)
        })
    }

    /// Waits for the response of the blocking call on `token` and reads it with `read`, in
    /// place in the transport's receive buffer; responses of other calls that arrive
    /// meanwhile are kept for [`Client::poll`]. Ends the call at its deadline.
    #[inline(always)]
    fn wait_response<R>(
        &mut self,
        token: u32,
        method_id: u16,
        read: impl FnOnce(&[u8]) -> Result<R, wire::WireError>,
    ) -> Result<R, RpcError> {
        let mut read = Some(read);
        let mut out: Option<Result<R, wire::WireError>> = None;
        let backoff = Backoff::new();
        // The first of the current run of empty polls (ns of `Calls`' clock).
        let mut idle_since = None;
        loop {
            let Self {
                transport,
                calls,
                ready,
                realigned,
                ..
            } = self;
            let n = transport.poll(|tok, msg| {
                if let Some(call) = calls.settle(tok) {
                    let msg = realign_var::<S>(call.method_id, msg, realigned);
                    if tok == token {
                        if let Some(read) = read.take() {
                            out = Some(read(msg));
                        }
                    } else {
                        ready.push_back(complete::<S>(call, msg));
                    }
                }
            })?;
            if let Some(r) = out {
                return r.map_err(|e| {
                    RpcError::from_wire(BLOCKING_TAG, method_name::<S>(method_id), e)
                });
            }
            if n == 0 {
                let now = self.tick(token);
                let deadline = self.calls.slots[token as usize].deadline_ns;
                if now >= deadline && self.calls.confirm_due(token, now, self.calls.mono_now_ns()) {
                    let slot = self.calls.expire(token);
                    return Err(deadline_error::<S>(BLOCKING_TAG, &slot));
                }
                let since = *idle_since.get_or_insert(now);
                if !backoff.is_completed()
                    || !self.wait_idle(now.saturating_sub(since), deadline.saturating_sub(now))
                {
                    backoff.snooze();
                }
            } else {
                idle_since = None;
            }
        }
    }

    /// [`ClientTransport::wait_for_response`] of a blocking call that has polled without a
    /// response for `waited_ns`, bounded by its deadline (`left_ns` away, the TSC clock; the
    /// monotonic clock confirms expiry) and [`IDLE_TICK_NS`].
    #[cold]
    #[inline(never)]
    fn wait_idle(&mut self, waited_ns: u64, left_ns: u64) -> bool {
        let max = Duration::from_nanos(left_ns.clamp(1, IDLE_TICK_NS));
        self.transport
            .wait_for_response(Duration::from_nanos(waited_ns), max)
    }

    /// Blocking call of a variable-length method ([`crate::varlen`]), used by generated stubs:
    /// `write` writes the whole request message (header included, `len` bytes, computed by
    /// the caller with [`crate::varlen::var_end`]) straight into the transport's send buffer,
    /// and `read` reads the response in place, in the transport's receive buffer (it may
    /// borrow from it: no copy), at most `timeout` after the call.
    ///
    /// `write` may run more than once (when the transport has no room, the call waits and
    /// writes again), and always writes the same message.
    ///
    /// # Errors
    /// [`RpcError::MessageTooLarge`] if `len` exceeds the method's largest request (its fixed
    /// part plus the service's `max_var_bytes`): nothing was sent. Otherwise as
    /// [`Client::call_within`], with `read`'s error reported as [`RpcError::BadResponse`] (or
    /// [`RpcError::BadRequest`] for an error status).
    #[inline]
    pub fn call_raw_within<R>(
        &mut self,
        timeout: Duration,
        method_id: u16,
        len: usize,
        mut write: impl FnMut(&mut [u8]) -> usize,
        read: impl FnOnce(&[u8]) -> Result<R, wire::WireError>,
    ) -> Result<R, RpcError> {
        check_request_len::<S>(method_id, len)?;
        let token = self.send_blocking_with(timeout, method_id, &mut write)?;
        self.wait_response(token, method_id, read)
    }

    /// Pipelined call of a variable-length method: `write` writes the whole request message
    /// (`len` bytes) into the transport's send buffer; the response is decoded into
    /// `S::Response` (owning its data) and delivered with `tag` by [`Client::poll`] /
    /// [`Client::poll_with`].
    ///
    /// # Errors
    /// [`RpcError::MessageTooLarge`] if `len` exceeds the method's largest request (nothing
    /// was sent); otherwise as [`Client::issue_within`].
    #[inline]
    pub fn issue_raw_within(
        &mut self,
        tag: u64,
        timeout: Duration,
        method_id: u16,
        len: usize,
        write: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), RpcError> {
        check_request_len::<S>(method_id, len)?;
        let token = self
            .transport
            .send(timeout, method_id, write)
            .map_err(|e| send_error::<S>(e, tag, method_id))?;
        self.calls.start(token, tag, method_id, timeout);
        Ok(())
    }

    /// Pipelined call with the default deadline ([`Client::issue_within`]).
    ///
    /// # Errors
    /// As [`Client::issue_within`].
    #[inline]
    pub fn issue<A: IntoBytes + Immutable>(
        &mut self,
        tag: u64,
        method_id: u16,
        args: &A,
    ) -> Result<(), RpcError> {
        self.issue_within(tag, self.timeout, method_id, args)
    }

    /// Pipelined call: sends method `method_id` with `args`; its completion, or its expiry
    /// `timeout` from now, is delivered with `tag` by [`Client::poll`]/[`Client::poll_with`].
    ///
    /// # Errors
    /// [`RpcError::WouldBlock`] when [`Client::max_in_flight`] calls are in flight or the
    /// transport has no room now (nothing was sent); [`RpcError::ServerDisconnected`].
    #[inline]
    pub fn issue_within<A: IntoBytes + Immutable>(
        &mut self,
        tag: u64,
        timeout: Duration,
        method_id: u16,
        args: &A,
    ) -> Result<(), RpcError> {
        let token = self
            .transport
            .send(timeout, method_id, |buf| {
                wire::encode(method_id, 0, args, buf)
            })
            .map_err(|e| send_error::<S>(e, tag, method_id))?;
        self.calls.start(token, tag, method_id, timeout);
        Ok(())
    }

    /// Pipelined call of a whole request value with the default deadline (see
    /// [`Client::issue_within`]).
    ///
    /// # Errors
    /// As [`Client::issue_within`].
    #[inline]
    pub fn issue_request(&mut self, tag: u64, req: &S::Request) -> Result<(), RpcError> {
        self.issue_request_within(tag, self.timeout, req)
    }

    /// Pipelined call of a whole request value that expires `timeout` from now (see
    /// [`Client::issue_within`]).
    ///
    /// # Errors
    /// As [`Client::issue_within`].
    #[inline]
    pub fn issue_request_within(
        &mut self,
        tag: u64,
        timeout: Duration,
        req: &S::Request,
    ) -> Result<(), RpcError> {
        let method_id = S::request_method_id(req);
        if S::DESCRIPTOR.variable {
            check_request_len::<S>(method_id, S::request_len(req))?;
        }
        let token = self
            .transport
            .send(timeout, method_id, |buf| S::encode_request(req, buf))
            .map_err(|e| send_error::<S>(e, tag, method_id))?;
        self.calls.start(token, tag, method_id, timeout);
        Ok(())
    }

    /// Returns one completed pipelined call as `(tag, response)`, or `None` if none has
    /// completed yet. Never blocks.
    ///
    /// # Errors
    /// [`RpcError::DeadlineExceeded`]/[`RpcError::BadRequest`]/[`RpcError::BadResponse`] for
    /// a call that failed (its `tag` is in the error; the call is consumed);
    /// [`RpcError::ServerDisconnected`].
    #[inline]
    pub fn poll(&mut self) -> Result<Option<(u64, S::Response)>, RpcError> {
        if !self.ready.is_empty() {
            return self.pop_ready();
        }
        if self.calls.live == 0 && self.calls.zombies == 0 {
            return Ok(None);
        }
        // Every response the transport has: the first is returned, the others are decoded
        // now (once, in place) and queued for the next polls.
        let Self {
            transport,
            calls,
            ready,
            realigned,
            ..
        } = self;
        let mut done = None;
        let n = transport.poll(|tok, msg| {
            if let Some(call) = calls.settle(tok) {
                let msg = realign_var::<S>(call.method_id, msg, realigned);
                let r = complete::<S>(call, msg);
                if done.is_none() {
                    done = Some(r);
                } else {
                    ready.push_back(r);
                }
            }
        })?;
        match done {
            Some((tag, Ok(resp))) => Ok(Some((tag, resp))),
            Some((_, Err(e))) => Err(e),
            None if n == 0 && self.calls.live != 0 => {
                self.tick(u32::MAX);
                self.pop_ready()
            }
            None => Ok(None),
        }
    }

    #[inline]
    fn pop_ready(&mut self) -> Result<Option<(u64, S::Response)>, RpcError> {
        match self.ready.pop_front() {
            None => Ok(None),
            Some((tag, Ok(resp))) => Ok(Some((tag, resp))),
            Some((_, Err(e))) => Err(e),
        }
    }

    /// Delivers every completed (or expired) pipelined call to `f(tag, result)`; returns how
    /// many. Never blocks; cheaper than [`Client::poll`] when many calls complete at once.
    ///
    /// # Errors
    /// [`RpcError::ServerDisconnected`] (per-call failures, expiry included, go to `f`).
    #[inline]
    pub fn poll_with(
        &mut self,
        mut f: impl FnMut(u64, Result<S::Response, RpcError>),
    ) -> Result<usize, RpcError> {
        self.poll_raw_with(|tag, c| match c {
            Completion::Msg { method_id, msg } => {
                f(tag, complete::<S>(Call { tag, method_id }, msg).1)
            }
            Completion::Decoded(resp) => f(tag, Ok(resp)),
            Completion::Failed(e) => f(tag, Err(e)),
        })
    }

    /// [`Client::poll_with`] that lends responses instead of decoding them into
    /// `S::Response`: each completed call is handed to `f(tag, completion)` as
    /// [`Completion::Msg`] (the response message, in place in the transport's receive buffer,
    /// for the caller to decode: no copy, no allocation), [`Completion::Decoded`] (a response
    /// that arrived while a blocking call waited, already decoded then) or
    /// [`Completion::Failed`] (expiry, or a failure found earlier). Generated clients of
    /// services with variable-length results wrap it as `poll_ref`. Returns how many were
    /// delivered; never blocks.
    ///
    /// # Errors
    /// [`RpcError::ServerDisconnected`] (per-call failures go to `f`).
    #[inline]
    pub fn poll_raw_with(
        &mut self,
        mut f: impl FnMut(u64, Completion<'_, S>),
    ) -> Result<usize, RpcError> {
        let mut n = 0;
        while let Some((tag, r)) = self.ready.pop_front() {
            match r {
                Ok(resp) => f(tag, Completion::Decoded(resp)),
                Err(e) => f(tag, Completion::Failed(e)),
            }
            n += 1;
        }
        if self.calls.live > 0 || self.calls.zombies > 0 {
            let Self {
                transport,
                calls,
                realigned,
                ..
            } = self;
            let got = transport.poll(|tok, msg| {
                if let Some(call) = calls.settle(tok) {
                    let msg = realign_var::<S>(call.method_id, msg, realigned);
                    f(
                        call.tag,
                        Completion::Msg {
                            method_id: call.method_id,
                            msg,
                        },
                    );
                    n += 1;
                }
            })?;
            if got == 0 && self.calls.live > 0 {
                let now = self.calls.tick(u32::MAX, |slot| {
                    f(
                        slot.tag,
                        Completion::Failed(deadline_error::<S>(slot.tag, &slot)),
                    );
                    n += 1;
                });
                self.idle(now);
            }
        }
        Ok(n)
    }

    /// [`Calls::tick`], expiring the due pipelined calls (not `skip`) into the ready queue.
    /// Returns the time read (ns since the client's epoch).
    #[inline]
    fn tick(&mut self, skip: u32) -> u64 {
        let ready = &mut self.ready;
        let now = self.calls.tick(skip, |slot| {
            ready.push_back((slot.tag, Err(deadline_error::<S>(slot.tag, &slot))));
        });
        self.idle(now);
        now
    }

    /// A poll found nothing at `now`: tells the transport, at most once per
    /// [`IDLE_TICK_NS`] ([`ClientTransport::idle_tick`]).
    #[inline]
    fn idle(&mut self, now: u64) {
        if self.calls.idle_due(now) {
            self.transport.idle_tick();
        }
    }

    #[inline(always)]
    fn send_blocking<A: IntoBytes + Immutable>(
        &mut self,
        timeout: Duration,
        method_id: u16,
        args: &A,
    ) -> Result<u32, RpcError> {
        self.send_blocking_with(timeout, method_id, &mut |buf: &mut [u8]| {
            wire::encode(method_id, 0, args, buf)
        })
    }

    #[inline(always)]
    fn send_blocking_with(
        &mut self,
        timeout: Duration,
        method_id: u16,
        write: &mut impl FnMut(&mut [u8]) -> usize,
    ) -> Result<u32, RpcError> {
        // The deadline for finding room to send (monotonic clock), set at the first refusal.
        let mut deadline_ns = UNSTAMPED;
        loop {
            match self.transport.send(timeout, method_id, &mut *write) {
                Ok(token) => {
                    self.calls.start(token, BLOCKING_TAG, method_id, timeout);
                    return Ok(token);
                }
                Err(RpcError::WouldBlock) => {
                    self.wait_for_room(&mut deadline_ns, timeout, method_id)?
                }
                Err(e) => return Err(send_error::<S>(e, BLOCKING_TAG, method_id)),
            }
        }
    }

    /// A blocking call found no room to send: takes what has arrived (kept for
    /// [`Client::poll`]), expires due pipelined calls, and fails the call once `timeout` has
    /// passed since its first refusal (`deadline_ns`, monotonic ns since
    /// [`Calls::mono_epoch`], set here on the first one).
    #[cold]
    fn wait_for_room(
        &mut self,
        deadline_ns: &mut u64,
        timeout: Duration,
        method_id: u16,
    ) -> Result<(), RpcError> {
        let Self {
            transport,
            calls,
            ready,
            realigned,
            ..
        } = self;
        transport.poll(|tok, msg| {
            if let Some(call) = calls.settle(tok) {
                let msg = realign_var::<S>(call.method_id, msg, realigned);
                ready.push_back(complete::<S>(call, msg));
            }
        })?;
        self.tick(u32::MAX);
        // A cold path: the monotonic clock directly (see `Calls` on the two clocks).
        let now = self.calls.mono_now_ns();
        if *deadline_ns == UNSTAMPED {
            *deadline_ns = deadline_after(now, timeout);
        }
        if now >= *deadline_ns {
            return Err(RpcError::DeadlineExceeded {
                tag: BLOCKING_TAG,
                method: method_name::<S>(method_id),
                timeout,
            });
        }
        std::hint::spin_loop();
        Ok(())
    }
}

/// The setting that bounds a variable-length request ([`RpcError::MessageTooLarge`]).
pub const SETTING_MAX_VAR_BYTES: &str = "the service's max_var_bytes (`#[rpc_service(max_var_bytes = N)]`, default 4096) plus the method's fixed part";

/// Refuses a request longer than method `method_id`'s largest one, before anything is sent.
#[inline(always)]
fn check_request_len<S: Service>(method_id: u16, len: usize) -> Result<(), RpcError> {
    let cap = S::DESCRIPTOR
        .methods
        .get(method_id as usize)
        .map_or(0, |m| m.request_bytes);
    if len > cap {
        return Err(too_large(len, cap));
    }
    Ok(())
}

#[cold]
fn too_large(len: usize, cap: usize) -> RpcError {
    RpcError::MessageTooLarge {
        len,
        cap,
        setting: SETTING_MAX_VAR_BYTES,
    }
}

/// A transport's `send` failed: a [`RpcError::DeadlineExceeded`] it reports (it waited inside
/// `send` until the timeout) gets the call's tag and method.
#[cold]
fn send_error<S: Service>(e: RpcError, tag: u64, method_id: u16) -> RpcError {
    match e {
        RpcError::DeadlineExceeded { timeout, .. } => RpcError::DeadlineExceeded {
            tag,
            method: method_name::<S>(method_id),
            timeout,
        },
        e => e,
    }
}

#[cold]
fn deadline_error<S: Service>(tag: u64, slot: &CallSlot) -> RpcError {
    RpcError::DeadlineExceeded {
        tag,
        method: method_name::<S>(slot.method_id),
        timeout: slot.timeout,
    }
}

/// [`crate::varlen::realign`] for a response of method `method_id` whose variable-length
/// result has elements aligned above 1 (a no-op for every other method, and constant for
/// services without such methods).
#[inline(always)]
fn realign_var<'a, S: Service>(
    method_id: u16,
    msg: &'a [u8],
    scratch: &'a mut crate::varlen::AlignedBuf,
) -> &'a [u8] {
    if S::DESCRIPTOR.needs_realign(method_id) {
        crate::varlen::realign(msg, scratch)
    } else {
        msg
    }
}

#[inline(always)]
fn complete<S: Service>(call: Call, msg: &[u8]) -> (u64, Result<S::Response, RpcError>) {
    (
        call.tag,
        S::decode_response(call.method_id, msg)
            .map_err(|e| RpcError::from_wire(call.tag, method_name::<S>(call.method_id), e)),
    )
}

#[cold]
fn method_name<S: Service>(method_id: u16) -> &'static str {
    S::DESCRIPTOR
        .method(method_id)
        .map_or("<unknown method>", |m| m.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expires the due calls of `calls` (no skip); returns their tags.
    fn tick(calls: &mut Calls) -> Vec<u64> {
        let mut expired = Vec::new();
        calls.tick(u32::MAX, |slot| expired.push(slot.tag));
        expired
    }

    /// A TSC clock that runs ahead of the monotonic clock (here an hour at once: a grossly
    /// miscalibrated TSC) expires nothing early: the monotonic clock decides, the call stays
    /// live, and its next TSC check moves to when the monotonic deadline will have passed.
    #[test]
    fn a_fast_tsc_clock_expires_no_call_early() {
        let (clock, mock) = quanta::Clock::mock();
        let mut calls = Calls::with_clock(4, clock);
        calls.start(1, 7, 0, Duration::from_secs(60));
        assert!(tick(&mut calls).is_empty(), "stamped, not due");
        mock.increment(Duration::from_secs(3600));
        assert!(tick(&mut calls).is_empty(), "due by the TSC only");
        assert_eq!(calls.live, 1);
        let now = calls.now_ns();
        assert!(calls.slots[1].deadline_ns > now);
        assert_eq!(calls.earliest_ns, calls.slots[1].deadline_ns);
        // The blocking call's own check (`Client::call_within`) says the same.
        assert!(!calls.confirm_due(1, now, calls.mono_now_ns()));
        assert_eq!(calls.slots[1].state, SlotState::Live);
    }

    /// A call answered within 1/64 of its timeout never reads the monotonic clock; one still
    /// live then gets its monotonic deadline at the first empty poll after it.
    #[test]
    fn the_monotonic_clock_is_read_only_for_calls_live_past_the_grace() {
        let (clock, mock) = quanta::Clock::mock();
        let mut calls = Calls::with_clock(4, clock);
        calls.start(0, 1, 0, Duration::from_millis(640));
        calls.start(1, 2, 0, Duration::from_millis(640));
        assert!(tick(&mut calls).is_empty());
        mock.increment(Duration::from_millis(9));
        assert!(tick(&mut calls).is_empty());
        assert_eq!(
            calls.slots[0].mono_deadline_ns, UNSTAMPED,
            "within the grace"
        );
        assert_eq!(calls.settle(0).map(|c| c.tag), Some(1));
        mock.increment(Duration::from_millis(1));
        assert!(tick(&mut calls).is_empty());
        assert_ne!(
            calls.slots[1].mono_deadline_ns, UNSTAMPED,
            "10 ms = 1/64 of 640 ms"
        );
        assert_eq!(calls.slots[1].state, SlotState::Live);
        let now = calls.now_ns();
        assert_eq!(calls.slots[1].deadline_ns, now + 640_000_000);
    }

    /// With the TSC racing ahead 1 ms per empty poll, a 20 ms call is rescheduled until the
    /// monotonic clock passes its deadline, and expires then, never earlier.
    #[test]
    fn a_call_expires_when_the_monotonic_clock_passes_its_deadline() {
        let (clock, mock) = quanta::Clock::mock();
        let mut calls = Calls::with_clock(4, clock);
        let t0 = Instant::now();
        calls.start(2, 9, 0, Duration::from_millis(20));
        let expired = loop {
            let expired = tick(&mut calls);
            if !expired.is_empty() {
                break expired;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the call never expired"
            );
            mock.increment(Duration::from_millis(1));
        };
        assert!(
            t0.elapsed() >= Duration::from_millis(20),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(expired, [9]);
        assert_eq!((calls.live, calls.zombies, calls.stats.expired), (0, 1, 1));
    }
}

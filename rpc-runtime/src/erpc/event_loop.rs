//! The event loop that ties the sans-I/O [`core::Rpc`](super::core::Rpc) to a
//! [`DatagramTransport`] (eRPC's `run_event_loop_once`; seeds/000 §12.1).
//!
//! An [`Endpoint`] owns one protocol core and one transport. Each call of
//! [`Endpoint::run_event_loop_once`] is one iteration of eRPC's single-threaded loop; the
//! application calls it in a busy loop (eRPC's dispatch thread does the same) and, between
//! iterations, drains [`Endpoint::poll_event`] and issues calls ([`Endpoint::enqueue_request`],
//! [`Endpoint::reply`], ..).
//!
//! # Steps of one iteration and their eRPC counterparts
//! | step here | eRPC (`run_event_loop_do_one_st`) |
//! |---|---|
//! | 1. read the clock once (`now`, ns since the endpoint was created) | `ev_loop_tsc_ = rdtsc()` |
//! | 2. retry the unsent tail of the previous TX batch | part of `do_tx_burst_st` |
//! | 3. `rx_burst` → [`Rpc::handle_datagram`] for each packet → `rx_release` | `process_comps_st` (+ `post_recvs`); session-management packets travel the same channel, so this also covers `handle_sm_rx_st` |
//! | 4. [`Rpc::handle_timeout`] every `timer_scan_interval` | `pkt_loss_scan_st` (periodic), plus session-management retries and failure detection |
//! | 5. drain [`Rpc::poll_transmit_gather`] into the TX batch (message packets as gather lists from their message buffers, [`Rpc::msg_pkt`]; control packets and datagrams of at most [`RENDER_MAX`](super::core::RENDER_MAX) bytes rendered into the batch's buffers), one `tx_burst` per full batch; rendered datagrams the transport takes one by one ([`DatagramTransport::tx_post`]) are posted as they come, one doorbell per batch | `process_credit_stall_queue_st` / `process_wheel_st` (inside the core) and `do_tx_burst_st` |
//! | 6. events stay queued for [`Endpoint::poll_event`] | continuations / request handlers |
//!
//! # Zero-copy iterations (seeds/002 §7.2, seeds/000 §12.2)
//! [`Endpoint::run_event_loop_once`] copies every complete message into an [`Event`]. An
//! application that wants eRPC's zero-copy dispatch of single-packet messages splits the
//! iteration in two around its handlers, as eRPC runs dispatch-mode handlers between
//! `rx_burst` and the re-posting of the RX descriptors:
//!
//! ```ignore
//! let n = ep.rx_burst_zc();             // steps 1-3, the burst stays in the RX ring
//! for k in 0..n {
//!     match ep.zc(k) {                  // the message's bytes, in place in the RX ring
//!         (Zc::Request { .. }, _) => ep.reply_zc(k, 4096, |req_type, req, resp| {
//!             resp[..req.len()].copy_from_slice(req); // write the response straight into
//!             req.len()                               // the slot's message buffer
//!         })?,
//!         (Zc::Response { tag, .. }, data) => { /* consume `data` */ }
//!     }
//! }
//! ep.finish_iteration();                // release the burst (zc bytes invalid), steps 4-5
//! while let Some(ev) = ep.poll_event() { /* multi-packet messages, session events */ }
//! ```
//! Single-packet requests and responses (the common case) then are never copied by the
//! core: a request is read in place and the response written in place into the slot's
//! cached response message buffer ([`Rpc::reply_with`]), from which it is sent;
//! [`Endpoint::reply`] also works between the two calls. Everything else still arrives as
//! events.
//!
//! # Units
//! Time is [`Time`]: nanoseconds since the endpoint's creation, read from the TSC through
//! `quanta` (seeds/000 §12.1 reads `rdtsc()` once per event-loop iteration; `quanta` calibrates it
//! against the monotonic clock once per process and falls back to that clock where the TSC is
//! not invariant). A read costs a few instructions instead of a vDSO `clock_gettime` call
//! (the raw reading times a scale precomputed from quanta's calibration), and the loop reads
//! it at most twice per iteration: when a burst arrives (or at the timer step if none did),
//! and again for the transmit step only when the core uses send times (Timely's RTT samples
//! or pacing; [`Config::cc_rate_comp`], [`Config::cc_pacing`]).
//! Sizes are bytes; the core's MTU is the transport's [`mtu`](DatagramTransport::mtu).
//!
//! # Allocation
//! The TX batch (`batch` buffers of `mtu` bytes for rendered packets, plus its descriptor
//! vectors) and the list of zero-copy messages (`rx_batch` entries) are allocated once in
//! [`Endpoint::new`]; the loop itself allocates nothing per packet. Message buffers of the
//! slots are mapped once per slot and reused; buffers of message events come from the core's
//! free list: return them with [`Endpoint::recycle`] and the steady state allocates (and
//! maps) nothing per message either.
//!
//! # Ordering and back-pressure
//! Packets leave in the order `poll_transmit_gather` produced them. When the transport's
//! send queue is full (`tx_burst` consumed only a prefix), the rest of the batch stays (as
//! rendered bytes or as message-packet descriptors) and is sent first on the next
//! iteration; no new packet is taken from the core until the batch is empty. A message
//! packet of that tail whose exchange ended meanwhile (the application may have called into
//! the core between the iterations) is not sent: [`Rpc::msg_pkt`] no longer finds it, and
//! it is counted in [`LoopStats::tx_stale`].
//! A transport error other than "queue full" drops the batch (counted in
//! [`LoopStats::tx_errors`]): to the protocol this is packet loss, which it recovers from.

use std::io;

use super::core::{
    Config, ConfigError, ErpcCallError, Event, ReqToken, Rpc, SessionId, Stats, Time, TxNext,
    TxOut, TxSink, Zc,
};
use super::datagram::{DatagramTransport, RxWait, TxPkt};
use super::idle::{
    IdleAction, IdleConfig, IdleStats, SpinThenBlock, block_bound, runnable_threads, usable_cpus,
};
use super::msgbuf::MsgBuffer;
use super::pkthdr::PKTHDR_SIZE;

/// Fractional bits of [`Endpoint`]'s fixed-point clock scale: a raw reading `d` ticks after
/// the epoch is `d * ns_per_tick >> CLOCK_FRAC_BITS` ns. 40 bits keep the scale's relative
/// error below 2^-40 / (ns per tick), about 10^-11 for a GHz TSC, and the factor below
/// 2^64 for clocks of up to 2^24 ns per tick (a monotonic clock has 1).
const CLOCK_FRAC_BITS: u32 = 40;

/// Default interval between timer scans ([`Rpc::handle_timeout`]), in ns (100 µs).
pub const DEFAULT_TIMER_SCAN_INTERVAL: Time = 100_000;

/// Counters of the event loop itself (all monotonically increasing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoopStats {
    /// Calls of [`Endpoint::run_event_loop_once`].
    pub iterations: u64,
    /// Datagrams received and handed to the core.
    pub rx_pkts: u64,
    /// Datagrams consumed by the transport (sent or dropped by it per packet).
    pub tx_pkts: u64,
    /// Message packets of a retried batch tail that were not sent because their exchange
    /// had ended meanwhile ([`Rpc::msg_pkt`] returned `None`).
    pub tx_stale: u64,
    /// `tx_burst` calls, plus batches of datagrams sent with
    /// [`tx_post`](DatagramTransport::tx_post).
    pub tx_bursts: u64,
    /// `tx_burst` calls that consumed only a prefix, or `tx_post` calls that consumed
    /// nothing (send queue full); the tail was retried.
    pub tx_partial: u64,
    /// `tx_burst` calls that failed (their batch was dropped), or `tx_post` calls that
    /// failed (their datagram was dropped).
    pub tx_errors: u64,
    /// Calls of [`Rpc::handle_timeout`].
    pub timer_scans: u64,
    /// Zero-copy messages handed out by [`Endpoint::rx_burst_zc`].
    pub zc_msgs: u64,
}

/// An eRPC endpoint: a protocol core driven over a datagram transport (see the
/// [module docs](self)).
pub struct Endpoint<T: DatagramTransport> {
    rpc: Rpc<T::Addr>,
    transport: T,
    /// Source of [`Time`] (TSC, calibrated; see the module docs).
    clock: quanta::Clock,
    /// Raw reading of `clock` at creation: the epoch of [`Time`].
    base: u64,
    /// Nanoseconds per raw tick of `clock`, in fixed point with [`CLOCK_FRAC_BITS`]
    /// fractional bits (`clock`'s own calibration, taken once in [`Endpoint::new`]).
    ns_per_tick: u64,
    /// The transmit step needs a clock reading of its own (the core uses the send time:
    /// Timely's RTT samples and link model with [`Config::cc_rate_comp`], the timing wheel
    /// with [`Config::cc_pacing`]); without either, the iteration's reading serves.
    tx_stamps: bool,
    /// [`Config::cc_rate_comp`]: RTT samples are taken, so empty receive polls are reported
    /// ([`Rpc::note_rx_drained`]).
    rtt_samples: bool,
    /// Clock reading of the current (last) iteration.
    now: Time,
    /// Clock reading taken before the transmit step of the current (last) iteration.
    tx_now: Time,
    /// Packets per TX batch.
    batch: usize,
    /// MTU: stride of `tx_bufs`.
    mtu: usize,
    /// `batch * mtu` bytes: control or session-management packet `i` of the batch is
    /// rendered at `i * mtu` (message packets are sent from their message buffers).
    tx_bufs: Box<[u8]>,
    /// The packets of the batch (`len() <= batch`): rendered into `tx_bufs` at the given
    /// offset, or in place in a message buffer.
    tx_meta: Vec<(TxOut<T::Addr>, usize)>,
    /// First packet of `tx_meta` not yet consumed by the transport.
    tx_head: usize,
    /// Reused descriptor vector for `tx_burst` (kept empty between calls; see `recycle`).
    tx_descs: Vec<TxPkt<'static, T::Addr>>,
    /// Interval between timer scans, ns.
    scan_interval: Time,
    /// Time of the last timer scan.
    last_scan: Time,
    /// The last `tx_burst` error, until taken.
    last_tx_error: Option<io::Error>,
    /// Zero-copy messages of the current burst: (index in the burst, message).
    zc_msgs: Vec<(usize, Zc)>,
    /// Between the receive half of an iteration and [`Endpoint::finish_iteration`].
    in_iteration: bool,
    /// The receive half received nothing and left the iteration's clock reading to
    /// [`Endpoint::finish_iteration`] (`now` is the previous iteration's until then).
    now_pending: bool,
    /// Packets received (and retried) in the receive half of the current iteration.
    iter_work: usize,
    stats: LoopStats,
    /// The spin-then-block policy of [`Endpoint::idle_wait`] (`None`: always poll, set by
    /// [`Endpoint::set_idle`] or when the transport cannot wait).
    idle: Option<SpinThenBlock>,
}

/// Turns an emptied vector of descriptors of one lifetime into one of another, keeping its
/// allocation (the standard library collects `vec::IntoIter` in place when the element layout
/// is unchanged, so this does not allocate).
fn recycle<'a, 'b, A>(mut v: Vec<TxPkt<'a, A>>) -> Vec<TxPkt<'b, A>> {
    v.clear();
    v.into_iter()
        .map(|_| -> TxPkt<'b, A> { unreachable!("vector was cleared") })
        .collect()
}

/// The event loop's [`TxSink`]: posts small datagrams with the transport's
/// [`tx_post_parts`](DatagramTransport::tx_post_parts) (one doorbell per batch, at
/// `tx_post_flush`). `max` is 0 once a packet waits in the batch or the queue is full, so
/// that the core's order is kept.
struct PostSink<'t, T: DatagramTransport> {
    transport: &'t mut T,
    /// Largest datagram taken now (0: none).
    max: usize,
    /// Datagrams posted.
    posted: usize,
    /// The send queue was full (nothing taken since).
    full: bool,
    /// The loop's counters (`tx_errors`: datagrams dropped because `tx_post_parts` failed).
    stats: &'t mut LoopStats,
    /// The last such error.
    last_error: &'t mut Option<io::Error>,
}

impl<T: DatagramTransport> PostSink<'_, T> {
    /// Posts `hdr` + `data`; `false` if the queue is full (then `full`, and nothing more is
    /// taken). A failed post drops the datagram (as a failed `tx_burst` drops its batch).
    #[inline(always)]
    fn post(&mut self, dest: T::Addr, hdr: &[u8], data: &[u8]) -> bool {
        match self.transport.tx_post_parts(dest, hdr, data) {
            Ok(true) => {
                self.posted += 1;
                true
            }
            Ok(false) => {
                self.full = true;
                self.max = 0;
                false
            }
            Err(e) => {
                self.stats.tx_errors += 1;
                *self.last_error = Some(e);
                true
            }
        }
    }
}

impl<T: DatagramTransport> TxSink<T::Addr> for PostSink<'_, T> {
    #[inline(always)]
    fn max_len(&self) -> usize {
        self.max
    }

    #[inline(always)]
    fn post(&mut self, dest: T::Addr, hdr: &[u8; PKTHDR_SIZE], data: &[u8]) -> bool {
        PostSink::post(self, dest, hdr, data)
    }
}

/// Appends to `descs` the transmit descriptors of `meta` (rendered packets from `bufs`,
/// message packets as gather lists from their message buffers). Stops at the first message
/// packet whose exchange is over, returning its index in `meta`.
#[inline]
fn gather<'a, A: Copy + Eq + std::hash::Hash + std::fmt::Debug>(
    rpc: &'a Rpc<A>,
    bufs: &'a [u8],
    meta: &[(TxOut<A>, usize)],
    descs: &mut Vec<TxPkt<'a, A>>,
) -> Result<(), usize> {
    for (i, &(out, off)) in meta.iter().enumerate() {
        match out {
            TxOut::Rendered { dest, len } => descs.push(TxPkt::single(dest, &bufs[off..off + len])),
            // A gather list straight from the message buffer: header, then data.
            TxOut::Msg { dest, pkt } => {
                let (hdr, data, msg) = rpc.msg_pkt_in(&pkt).ok_or(i)?;
                descs.push(TxPkt::in_buffer(dest, hdr, data, msg.dma_handle()));
            }
        }
    }
    Ok(())
}

impl<T: DatagramTransport> Endpoint<T> {
    /// An endpoint over `transport` with the protocol settings `cfg`; `cfg.mtu` is replaced
    /// by `transport.mtu()`, `cfg.rx_ring_entries` (admission control) is set to
    /// `transport.rx_ring_entries()` unless given, and the TX batch holds
    /// `transport.rx_batch()` packets.
    ///
    /// # Errors
    /// A [`ConfigError`] if the core refuses `cfg` (with the transport's MTU).
    pub fn new(transport: T, mut cfg: Config) -> Result<Self, ConfigError> {
        let mtu = transport.mtu();
        cfg.mtu = mtu;
        cfg.rx_ring_entries
            .get_or_insert(transport.rx_ring_entries());
        let batch = transport.rx_batch().max(1);
        let clock = quanta::Clock::new();
        // quanta scales `delta` ticks as `delta * factor >> shift`; its value for
        // 2^CLOCK_FRAC_BITS ticks is that factor with CLOCK_FRAC_BITS fractional bits.
        let ns_per_tick = clock.delta_as_nanos(0, 1 << CLOCK_FRAC_BITS);
        let tx_stamps = cfg.cc_rate_comp || cfg.cc_pacing;
        let rtt_samples = cfg.cc_rate_comp;
        let rpc = Rpc::new(cfg)?;
        Ok(Endpoint {
            rpc,
            transport,
            base: clock.raw(),
            clock,
            ns_per_tick,
            tx_stamps,
            rtt_samples,
            now: 0,
            tx_now: 0,
            batch,
            mtu,
            tx_bufs: vec![0; batch * mtu].into_boxed_slice(),
            tx_meta: Vec::with_capacity(batch),
            tx_head: 0,
            tx_descs: Vec::with_capacity(batch),
            scan_interval: DEFAULT_TIMER_SCAN_INTERVAL,
            last_scan: 0,
            last_tx_error: None,
            zc_msgs: Vec::with_capacity(batch),
            in_iteration: false,
            now_pending: false,
            iter_work: 0,
            stats: LoopStats::default(),
            idle: Some(SpinThenBlock::new(IdleConfig::default(), usable_cpus())),
        })
    }

    /// Sets the interval in ns between timer scans ([`Rpc::handle_timeout`]); timers fire up
    /// to this late. Default [`DEFAULT_TIMER_SCAN_INTERVAL`]; 0 scans every iteration.
    pub fn set_timer_scan_interval(&mut self, interval: Time) {
        self.scan_interval = interval;
    }

    /// Sets the policy of [`idle_wait`](Self::idle_wait): spin-then-block with `cfg`, or
    /// `None` to always poll (eRPC's loop on a dedicated core). Default:
    /// [`IdleConfig::default`].
    pub fn set_idle(&mut self, cfg: Option<IdleConfig>) {
        self.idle = cfg.map(|c| SpinThenBlock::new(c, usable_cpus()));
    }

    /// The counters of [`idle_wait`](Self::idle_wait)'s policy (zero if it is off).
    pub fn idle_stats(&self) -> IdleStats {
        self.idle
            .as_ref()
            .map(SpinThenBlock::stats)
            .unwrap_or_default()
    }

    /// Call between iterations with what the iteration returned (`work`, from
    /// [`run_event_loop_once`](Self::run_event_loop_once) or
    /// [`finish_iteration`](Self::finish_iteration)): after an iteration that found nothing,
    /// polls on or blocks in the transport ([`DatagramTransport::rx_wait`]) until a datagram
    /// may be waiting, per the spin-then-block rules of [`crate::erpc::idle`] (which samples
    /// the machine's run queue, `/proc/loadavg`, every 5 ms of idle polling). Returns whether
    /// it blocked.
    ///
    /// Never blocks while the next iteration has work without a datagram: an unsent transmit
    /// tail, packets or events queued in the core ([`Rpc::has_ready_work`]), a receive burst
    /// not yet finished, or a due timer. A block lasts at most until the core's next timer
    /// ([`Rpc::next_timeout`]: retransmission, keepalive, failure detection, the next paced
    /// packet) and [`IdleConfig::max_block`] (1 ms by default), so it delays no protocol step
    /// and leaves the loop at least that often. A transport that cannot wait
    /// ([`RxWait::Unsupported`], e.g. mlx5 UD on the device model) turns the policy off: the
    /// loop polls, as without this call.
    #[inline]
    pub fn idle_wait(&mut self, work: usize) -> bool {
        match &mut self.idle {
            None => false,
            Some(p) if work > 0 => {
                p.busy();
                false
            }
            Some(_) => self.idle_wait_slow(),
        }
    }

    /// [`idle_wait`](Self::idle_wait) after an iteration that found nothing.
    #[inline(never)]
    fn idle_wait_slow(&mut self) -> bool {
        let now = self.clock();
        let Some(p) = &mut self.idle else {
            return false;
        };
        if p.sample_due(now) {
            p.sampled(now, runnable_threads());
        }
        match p.idle(now) {
            IdleAction::Poll => {
                std::hint::spin_loop();
                return false;
            }
            IdleAction::Yield => {
                std::thread::yield_now();
                return false;
            }
            IdleAction::Block => {}
        }
        let max_block = p.config().max_block;
        let wait = self.wait_bounded(now, max_block);
        if wait == Some(RxWait::Unsupported) {
            self.idle = None;
            return false;
        }
        let woke = if wait.is_some() { self.clock() } else { now };
        let Some(p) = &mut self.idle else {
            return false;
        };
        match wait {
            Some(w) => {
                p.woke(woke, w == RxWait::Ready);
                true
            }
            None => {
                p.busy();
                false
            }
        }
    }

    /// Blocks in the transport ([`DatagramTransport::rx_wait`]) until a datagram may be
    /// waiting, for at most `max` and never past the core's next timer
    /// ([`Rpc::next_timeout`]), for a loop with nothing to do that has its own idle policy
    /// (the typed server's runner). Returns `None` without waiting if the next iteration has
    /// work without a datagram (an unsent transmit tail, packets or events queued in the
    /// core, a receive burst not yet finished) or a timer is due, else what the transport
    /// did ([`RxWait::Unsupported`] at once if it cannot wait).
    pub fn wait_for_datagram(&mut self, max: std::time::Duration) -> Option<RxWait> {
        let now = self.clock();
        self.wait_bounded(now, Time::try_from(max.as_nanos()).unwrap_or(Time::MAX))
    }

    /// What [`wait_for_datagram`](Self::wait_for_datagram) would wait on, and for how long,
    /// for a caller that waits for several endpoints at once: `None` if the next iteration
    /// has work without a datagram or a timer is due (the caller must not wait), else the
    /// transport's [`RxFd`](super::datagram::RxFd) and the bound (at most `max`, never past
    /// the core's next timer).
    pub fn wait_target(
        &mut self,
        max: std::time::Duration,
    ) -> Option<(super::datagram::RxFd, std::time::Duration)> {
        if self.in_iteration || self.tx_head < self.tx_meta.len() || self.rpc.has_ready_work() {
            return None;
        }
        let now = self.clock();
        let max = Time::try_from(max.as_nanos()).unwrap_or(Time::MAX);
        let bound = block_bound(now, self.rpc.next_timeout(), max)?;
        Some((self.transport.rx_wait_fd(), bound))
    }

    /// [`wait_for_datagram`](Self::wait_for_datagram) at `now`, at most `max` ns.
    fn wait_bounded(&mut self, now: Time, max: Time) -> Option<RxWait> {
        if self.in_iteration || self.tx_head < self.tx_meta.len() || self.rpc.has_ready_work() {
            return None;
        }
        let bound = block_bound(now, self.rpc.next_timeout(), max)?;
        Some(self.transport.rx_wait(bound))
    }

    /// The current time in ns since the endpoint was created (reads the clock).
    #[inline]
    pub fn clock(&self) -> Time {
        // One multiplication by the precomputed scale instead of quanta's conversion (which
        // matches on the clock type and shifts by a runtime amount); a reading at or before
        // the epoch (TSCs of different cores) is 0, as with quanta.
        let ticks = self.clock.raw().saturating_sub(self.base);
        ((u128::from(ticks) * u128::from(self.ns_per_tick)) >> CLOCK_FRAC_BITS) as Time
    }

    /// The clock reading of the last iteration, in ns since the endpoint was created
    /// (between an [`rx_burst_zc`](Self::rx_burst_zc) that received nothing and
    /// [`finish_iteration`](Self::finish_iteration), which takes that reading, the clock now).
    pub fn now(&self) -> Time {
        if self.now_pending {
            self.clock()
        } else {
            self.now
        }
    }

    /// One iteration of the event loop (see the [module docs](self) for its steps); every
    /// complete message is copied into an [`Event`].
    ///
    /// Returns the number of datagrams received plus datagrams handed to the transport in
    /// this iteration; `0` means the iteration found nothing to do.
    pub fn run_event_loop_once(&mut self) -> usize {
        self.rx_half(false);
        self.finish_iteration()
    }

    /// The receive half of a zero-copy iteration: steps 1-3 of
    /// [`run_event_loop_once`](Self::run_event_loop_once) (read the clock, retry the unsent
    /// TX tail, `rx_burst`, [`Rpc::handle_datagram_zc`] for each packet), without releasing
    /// the burst. Returns the number of zero-copy messages now available through
    /// [`zc`](Self::zc) (complete single-packet requests and responses, still in the
    /// transport's RX ring); other messages and session events are queued for
    /// [`poll_event`](Self::poll_event) as usual. Call
    /// [`finish_iteration`](Self::finish_iteration) next; until then the transport's RX
    /// buffers of this burst stay lent out (eRPC re-posts RX descriptors only after its
    /// dispatch-mode handlers ran, seeds/002 §7.2).
    pub fn rx_burst_zc(&mut self) -> usize {
        self.rx_half(true)
    }

    /// Number of zero-copy messages of the current burst (0 outside a zero-copy iteration).
    pub fn zc_count(&self) -> usize {
        self.zc_msgs.len()
    }

    /// Zero-copy message `k` (`k < `[`zc_count`](Self::zc_count)) of the current burst: what
    /// it is, and its data in place in the transport's RX ring. Valid until
    /// [`finish_iteration`](Self::finish_iteration). A request must be answered (with
    /// [`reply_zc`](Self::reply_zc) or [`reply`](Self::reply), now or later); a response
    /// completes the RPC enqueued with its tag.
    ///
    /// # Panics
    /// If `k` is not below `zc_count()` (a caller bug).
    pub fn zc(&self, k: usize) -> (Zc, &[u8]) {
        let (i, z) = self.zc_msgs[k];
        let (_, bytes) = self.transport.rx_pkt(i);
        (z, &bytes[z.range()])
    }

    /// Server: answers zero-copy request `k` of the current burst by running the handler
    /// `f(req_type, request, response)` with the request data in place in the RX ring and the
    /// (empty) response buffer of the request's slot, into which `f` writes the response
    /// ([`Rpc::reply_with`]; no intermediate copy on either side).
    ///
    /// # Errors
    /// [`ErpcCallError::StaleToken`] if message `k` is a response or its request was already
    /// answered (`f` is not called), else as [`Rpc::reply_with`].
    ///
    /// # Panics
    /// If `k` is not below `zc_count()` (a caller bug).
    pub fn reply_zc(
        &mut self,
        k: usize,
        max_len: usize,
        f: impl FnOnce(u8, &[u8], &mut [u8]) -> usize,
    ) -> Result<(), ErpcCallError> {
        let (i, z) = self.zc_msgs[k];
        let Zc::Request {
            token, req_type, ..
        } = z
        else {
            return Err(ErpcCallError::StaleToken);
        };
        let (_, bytes) = self.transport.rx_pkt(i);
        let req = &bytes[z.range()];
        self.rpc
            .reply_with(self.now, token, max_len, |resp| f(req_type, req, resp))
    }

    /// The second half of an iteration begun with [`rx_burst_zc`](Self::rx_burst_zc):
    /// releases the receive burst (the zero-copy messages become invalid), runs due timers
    /// and transmits (steps 4-5). Called without a preceding `rx_burst_zc` it reads the clock
    /// itself and does just that.
    ///
    /// Returns the datagrams received plus datagrams handed to the transport in the whole
    /// iteration, like [`run_event_loop_once`](Self::run_event_loop_once).
    pub fn finish_iteration(&mut self) -> usize {
        // A reading taken here (no receive burst before it) also serves the transmit step,
        // unless a timer scan runs in between.
        let mut fresh = false;
        if !self.in_iteration || self.now_pending {
            self.now = self.clock();
            self.now_pending = false;
            fresh = true;
        }
        self.in_iteration = false;
        self.zc_msgs.clear();
        self.transport.rx_release();
        let now = self.now;

        // Timers.
        if now.saturating_sub(self.last_scan) >= self.scan_interval {
            self.last_scan = now;
            if self.rpc.next_timeout().is_some_and(|t| t <= now) {
                self.stats.timer_scans += 1;
                self.rpc.handle_timeout(now);
                fresh = false;
            }
        }

        // Transmit, with a fresh clock reading if the core uses it: it is the send time of
        // the batch's client packets (their RTT samples' start) and paces the wheel, and
        // processing the receive burst may have taken a while. Without congestion control
        // the send time only orders the core's clock, and the iteration's reading serves.
        // With nothing to send (nothing queued or paced; an unsent tail is
        // left alone by `fill_and_flush` anyway) neither the clock nor the core is asked.
        let work = std::mem::take(&mut self.iter_work);
        if !self.rpc.may_transmit() {
            return work;
        }
        self.tx_now = if fresh || !self.tx_stamps {
            now
        } else {
            self.clock()
        };
        work + self.fill_and_flush()
    }

    /// Steps 1-3: clock, TX retry, receive burst through the core (copying or zero-copy).
    /// Returns the number of zero-copy messages.
    ///
    /// An idle iteration (no unsent tail, and the transport reports
    /// [`rx_idle`](DatagramTransport::rx_idle)) books exactly what a burst of 0 would, here,
    /// without entering the receive path: a busy-polling loop spends most iterations so.
    #[inline(always)]
    fn rx_half(&mut self, zero_copy: bool) -> usize {
        if !self.transport.rx_idle() || self.tx_head < self.tx_meta.len() {
            return self.rx_half_burst(zero_copy);
        }
        self.stats.iterations += 1;
        self.in_iteration = true;
        self.zc_msgs.clear();
        self.now_pending = true;
        if self.rtt_samples {
            self.rpc.note_rx_drained(self.now);
        }
        self.iter_work = 0;
        0
    }

    /// [`rx_half`](Self::rx_half) with a receive burst.
    #[inline(never)]
    fn rx_half_burst(&mut self, zero_copy: bool) -> usize {
        self.stats.iterations += 1;
        self.in_iteration = true;
        self.zc_msgs.clear();
        // The retry of an unsent tail; the test is inline, since the tail is rare.
        let mut work = if self.tx_head < self.tx_meta.len() {
            self.flush_tx()
        } else {
            0
        };

        // `batch` is the transport's `rx_batch()` (at least 1), fixed at creation.
        let n = self.transport.rx_burst(self.batch);
        // The iteration's clock reading: the receive time of the burst. With nothing
        // received nothing needs it yet, and `finish_iteration` reads it (one reading for
        // its timers and transmit step instead of two).
        self.now_pending = n == 0;
        let now = if n == 0 {
            // Nothing was waiting: what arrives later arrived after the last clock reading
            // (`Rpc::note_rx_drained`; only RTT samples use it).
            if self.rtt_samples {
                self.rpc.note_rx_drained(self.now);
            }
            self.now
        } else {
            let now = self.clock();
            self.now = now;
            now
        };
        for i in 0..n {
            let (from, bytes) = self.transport.rx_pkt(i);
            if zero_copy {
                if let Some(z) = self.rpc.handle_datagram_zc(now, from, bytes) {
                    self.zc_msgs.push((i, z));
                }
            } else {
                self.rpc.handle_datagram(now, from, bytes);
            }
        }
        self.stats.rx_pkts += n as u64;
        self.stats.zc_msgs += self.zc_msgs.len() as u64;
        work += n;
        self.iter_work = work;
        self.zc_msgs.len()
    }

    /// Renders packets from the core into the batch and sends them until the core has
    /// nothing left or the transport is full. Returns the packets the transport consumed.
    ///
    /// Datagrams of at most [`tx_post_max`](DatagramTransport::tx_post_max) bytes that no
    /// unsent packet precedes go to the transport one by one: control and small message
    /// packets straight from the core as header and data ([`Rpc::poll_transmit_direct`] into
    /// [`tx_post_parts`](DatagramTransport::tx_post_parts), not rendered into the batch),
    /// other rendered ones with [`tx_post`](DatagramTransport::tx_post); one doorbell per
    /// batch at [`tx_post_flush`](DatagramTransport::tx_post_flush)), instead of through the
    /// batch's descriptor list; the others are gathered and sent with one `tx_burst` as before. Both
    /// keep the core's order: once a packet waits in the batch, later ones wait behind it.
    #[inline(always)]
    fn fill_and_flush(&mut self) -> usize {
        let post_max = self.transport.tx_post_max();
        let mut sent = 0;
        loop {
            if self.tx_head < self.tx_meta.len() {
                // A tail from an earlier burst is still waiting: the transport is full.
                return sent;
            }
            self.tx_meta.clear();
            self.tx_head = 0;
            let mut taken = 0;
            // Small packets go to `tx_post_parts` straight from the core (header and data,
            // no rendering into the batch) while no packet waits in the batch.
            let mut sink = PostSink {
                transport: &mut self.transport,
                max: post_max,
                posted: 0,
                full: false,
                stats: &mut self.stats,
                last_error: &mut self.last_tx_error,
            };
            // `may_transmit` false: the core has nothing (its documented promise), so the
            // call that would return `None` is skipped.
            while taken < self.batch && self.rpc.may_transmit() {
                let off = self.tx_meta.len() * self.mtu;
                let buf = &mut self.tx_bufs[off..off + self.mtu];
                let Some(next) = self.rpc.poll_transmit_direct(self.tx_now, buf, &mut sink) else {
                    break;
                };
                taken += 1;
                let m = match next {
                    TxNext::Posted { .. } => continue,
                    TxNext::Out(m) => m,
                };
                if sink.full {
                    // The sink found the send queue full: the packet (rendered into the
                    // batch) becomes the tail retried next iteration.
                    self.tx_meta.push((m, off));
                    break;
                }
                if let TxOut::Rendered { dest, len } = m
                    && len <= sink.max
                {
                    // A rendered datagram (session management, RFR) no unsent packet precedes.
                    if sink.post(dest, &self.tx_bufs[off..off + len], &[]) {
                        continue;
                    }
                    self.tx_meta.push((m, off));
                    break;
                }
                self.tx_meta.push((m, off));
                // Later packets wait behind this one.
                sink.max = 0;
            }
            let (posted, full) = (sink.posted, sink.full);
            if full {
                self.stats.tx_partial += 1;
            }
            if posted > 0 {
                self.stats.tx_bursts += 1;
                self.stats.tx_pkts += posted as u64;
                sent += posted;
            }
            if !full && !self.tx_meta.is_empty() {
                // Rings the doorbell for the posted packets too.
                sent += self.flush_tx();
            }
            if posted > 0 {
                self.transport.tx_post_flush();
            }
            if full || taken < self.batch {
                return sent;
            }
        }
    }

    /// Sends the unsent part of the batch with one `tx_burst`; returns the packets consumed.
    fn flush_tx(&mut self) -> usize {
        if self.tx_head >= self.tx_meta.len() {
            return 0;
        }
        let mut descs = recycle(std::mem::take(&mut self.tx_descs));
        while let Err(i) = gather(
            &self.rpc,
            &self.tx_bufs,
            &self.tx_meta[self.tx_head..],
            &mut descs,
        ) {
            // Only in a tail retried after its exchange ended: not needed. Taken out of the
            // batch (rare; rendered packets keep their offsets), so that `descs` stays in
            // step with `tx_meta[tx_head..]`, and gathered again.
            self.stats.tx_stale += 1;
            self.tx_meta.remove(self.tx_head + i);
            descs.clear();
        }
        if descs.is_empty() {
            self.tx_descs = recycle(descs);
            self.tx_head = self.tx_meta.len();
            return 0;
        }
        self.stats.tx_bursts += 1;
        let res = self.transport.tx_burst(&descs);
        let pending = descs.len();
        self.tx_descs = recycle(descs);
        match res {
            Ok(k) => {
                self.stats.tx_pkts += k as u64;
                if k < pending {
                    self.stats.tx_partial += 1;
                    self.tx_head += k;
                } else {
                    self.tx_head = self.tx_meta.len();
                }
                k
            }
            Err(e) => {
                self.stats.tx_errors += 1;
                self.last_tx_error = Some(e);
                self.tx_head = self.tx_meta.len();
                0
            }
        }
    }

    /// The next event for the application ([`Rpc::poll_event`]).
    pub fn poll_event(&mut self) -> Option<Event> {
        self.rpc.poll_event()
    }

    /// Returns the data buffer of an [`Event::Request`] / [`Event::Response`] to the core's
    /// free list for reuse ([`Rpc::recycle`]; optional).
    pub fn recycle(&mut self, buf: MsgBuffer) {
        self.rpc.recycle(buf);
    }

    /// Client: opens a session to `peer` ([`Rpc::create_session`]) at the current time.
    ///
    /// # Errors
    /// As [`Rpc::create_session`].
    pub fn create_session(&mut self, peer: T::Addr) -> Result<SessionId, ErpcCallError> {
        let now = self.clock();
        self.rpc.create_session(now, peer)
    }

    /// Client: closes an idle session ([`Rpc::destroy_session`]).
    ///
    /// # Errors
    /// As [`Rpc::destroy_session`].
    pub fn destroy_session(&mut self, session: SessionId) -> Result<(), ErpcCallError> {
        let now = self.clock();
        self.rpc.destroy_session(now, session)
    }

    /// Client: queues a request ([`Rpc::enqueue_request`]); its packets leave on the next
    /// iteration.
    ///
    /// # Errors
    /// As [`Rpc::enqueue_request`].
    pub fn enqueue_request(
        &mut self,
        session: SessionId,
        req_type: u8,
        payload: &[u8],
        tag: u64,
    ) -> Result<(), ErpcCallError> {
        let now = self.clock();
        self.rpc
            .enqueue_request(now, session, req_type, payload, tag)
    }

    /// Client: queues a request written in place into the slot's message buffer
    /// ([`Rpc::enqueue_request_with`]: `fill` gets at least `max_len` bytes and returns the
    /// request length); its packets leave, from that buffer, on the next iteration.
    ///
    /// # Errors
    /// As [`Rpc::enqueue_request_with`].
    pub fn enqueue_request_with(
        &mut self,
        session: SessionId,
        req_type: u8,
        tag: u64,
        max_len: usize,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), ErpcCallError> {
        let now = self.clock();
        self.rpc
            .enqueue_request_with(now, session, req_type, tag, max_len, fill)
    }

    /// Server: answers a request ([`Rpc::reply`]); the response leaves on the next iteration.
    ///
    /// # Errors
    /// As [`Rpc::reply`].
    pub fn reply(&mut self, token: ReqToken, payload: &[u8]) -> Result<(), ErpcCallError> {
        let now = self.clock();
        self.rpc.reply(now, token, payload)
    }

    /// Server: answers a request with a response written in place into the slot's response
    /// message buffer ([`Rpc::reply_with`]: `fill` gets at least `max_len` bytes and returns
    /// the response length); it leaves, from that buffer, on the next iteration.
    ///
    /// # Errors
    /// As [`Rpc::reply_with`].
    pub fn reply_with(
        &mut self,
        token: ReqToken,
        max_len: usize,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), ErpcCallError> {
        let now = self.clock();
        self.rpc.reply_with(now, token, max_len, fill)
    }

    /// Whether `session` is a connected client session.
    pub fn is_connected(&self, session: SessionId) -> bool {
        self.rpc.is_connected(session)
    }

    /// The protocol core.
    pub fn rpc(&self) -> &Rpc<T::Addr> {
        &self.rpc
    }

    /// The protocol core, mutably (for calls not wrapped here; pass [`Endpoint::clock`] as
    /// their time).
    pub fn rpc_mut(&mut self) -> &mut Rpc<T::Addr> {
        &mut self.rpc
    }

    /// A snapshot of the protocol core's counters ([`Rpc::stats`]).
    pub fn core_stats(&self) -> Stats {
        self.rpc.stats()
    }

    /// The event loop's counters.
    pub fn loop_stats(&self) -> LoopStats {
        self.stats
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The address peers use to reach this endpoint.
    pub fn local_addr(&self) -> T::Addr {
        self.transport.local_addr()
    }

    /// Takes the last `tx_burst` error (its batch was dropped), if any.
    pub fn take_tx_error(&mut self) -> Option<io::Error> {
        self.last_tx_error.take()
    }

    /// Packets rendered but not yet accepted by the transport.
    pub fn tx_pending(&self) -> usize {
        self.tx_meta.len() - self.tx_head
    }
}

impl<T: DatagramTransport + std::fmt::Debug> std::fmt::Debug for Endpoint<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("rpc", &self.rpc)
            .field("transport", &self.transport)
            .field("now", &self.now)
            .field("batch", &self.batch)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

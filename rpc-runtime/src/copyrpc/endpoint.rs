//! The sans-I/O core of one copyrpc endpoint: ring positions, batching, credit accounting and
//! batch parsing (seeds/001 "コアデータ構造", "フロー制御", "バッチング"; seeds/004 §3.2-3.7).
//!
//! An [`EndpointCore`] never touches a queue. `call`/`reply` write messages into the send ring;
//! [`EndpointCore::flush`] closes the open batch and queues an [`Emit`] (one RDMA WRITE+IMM to
//! perform); `EndpointCore::ingest` parses one batch the peer wrote into the receive ring,
//! given the byte count its immediate announced. The context ([`super::context`]) turns
//! emits into WQEs and CQEs into `ingest` calls; tests can instead copy the bytes themselves.
//!
//! # Positions
//! Every position is a virtual, monotonically increasing `u64`; the ring offset is
//! `pos & (size - 1)` (seeds/004 §3.2). The send ring mirrors the peer's receive ring: the
//! message at send position `p` lands at remote offset `p & (C - 1)`, where `C` (the
//! *capacity*, [`EndpointCore::capacity`]) is the smaller of the two ring sizes, so a batch
//! that does not cross a multiple of `C` is contiguous in both rings.
//!
//! # Flow control (seeds/004 §3.4)
//! With `in_flight = producer - remote_consumer` and `R = resp_reservation`, a call is
//! written only if `in_flight + 2R <= C` holds afterwards (else [`CallErrorKind::RingFull`]).
//! Each closed batch grants `min((C - in_flight) / 2 - R, max_R - R)` (aligned down to 32 B)
//! and adds it to `R`; a call spends [`internal_allowance`] of the credit the peer granted
//! (else [`CallErrorKind::InsufficientCredit`]); a reply returns the caller's allowance from `R`.
//! Because the caller paid for the padded response plus one flow metadata and `R` counts
//! twice, a reply always fits, including a wrap (the waste of a wrap is at most the message
//! plus one metadata); `reply` therefore never reports lack of space. A reply that would
//! still not fit (a peer that broke the protocol) is kept in a backlog and sent later,
//! never written over unconsumed bytes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use mlx5::mem::DmaBuf;
use slab::Slab;

use super::encoding::{
    ALIGNMENT, DESCRIPTOR_SIZE, Descriptor, FLOW_METADATA_SIZE, FlowMetadata, HEADER_SIZE,
    LARGE_INLINE_RESPONSE, LARGE_RESPONSE_FLAG, MAX_CALL_ID, MsgHeader, RENDEZVOUS_FLAG,
    RENDEZVOUS_MIN, WRAP_MESSAGE_COUNT, decode_imm, encode_imm, from_response_id,
    internal_allowance, is_response, padded_message_size, to_response_id,
};
use super::error::{CallError, CallErrorKind, EndpointFailure, ProtocolError, ReplyError};
use super::stats::Stats;
use crate::fifo::Fifo;

const META: u64 = FLOW_METADATA_SIZE;

/// Flag: a batch is open (messages written since the last close).
const F_BATCH_OPEN: u16 = 1;
/// Flag: a call found the ring full: read the peer's consumer position (seeds/001 "RDMA READ
/// フォールバック").
const F_NEEDS_READ: u16 = 2;
/// Flag: a call lacked credit: send a flow update (an empty batch) asking for a grant.
const F_FLOW_REQUEST: u16 = 4;
/// Flag: the peer sent a flow update: answer with one if a grant is possible.
const F_ANSWER_FLOW: u16 = 8;
/// Flag: `released` moved since the consumer word was last stored.
const F_UNPUBLISHED: u16 = 16;
/// Flag: rendezvous READs completed and not yet reported to the peer (issue 15).
const F_READ_DONE: u16 = 32;
/// Flag: rendezvous descriptors received and not yet all READ-posted by the context.
const F_RDV: u16 = 64;
/// Flag: the context lent landing buffers of this endpoint to `recv` (freed at the flush).
const F_LENT: u16 = 128;
/// Flag: something may be queued in `emits` or `backlog` (set when either is pushed to,
/// cleared by [`EndpointCore::settle_queued`] once both are found empty), so that
/// [`EndpointCore::wants_flush`] need not look at them.
const F_QUEUED: u16 = 256;

/// Largest ring, in bytes (2 GiB): ring offsets are `u32`, and a message length with the
/// [`RENDEZVOUS_FLAG`] set always exceeds a batch, so `validate` sees a rendezvous message
/// only where an inline one would be too long.
pub const MAX_RING_SIZE: usize = 1 << 31;

/// Bit of [`RecvEntry::allowance`] set when the caller accepts a rendezvous response (the
/// allowance itself is below 2^37: 32 B units in 31 bits).
pub(crate) const ENTRY_LARGE_RESP: u64 = 1 << 63;

/// One RDMA WRITE+IMM to perform: `len` bytes from send position `start` to the same
/// position in the peer's receive ring, with immediate [`Emit::imm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Emit {
    /// Virtual position of the first byte (a batch's flow metadata).
    pub start: u64,
    /// Bytes to write (the batch; 32 for a wrap marker).
    pub len: u32,
    /// Bytes the batch covers in the ring: `len`, or up to the ring end for a wrap marker.
    pub delta: u64,
}

impl Emit {
    /// The immediate value: `delta / 32` (seeds/001 "Immediate Value").
    #[inline]
    pub fn imm(&self) -> u32 {
        encode_imm(self.delta)
    }
}

/// A request parsed from the receive ring, waiting for [`super::Context::recv`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RecvEntry {
    /// Endpoint index.
    pub ep: u32,
    /// The caller's call id.
    pub call_id: u32,
    /// Credit the caller reserved for the response ([`internal_allowance`] bytes), with
    /// [`ENTRY_LARGE_RESP`] set if the caller accepts a rendezvous response.
    pub allowance: u64,
    /// Ring offset of the payload; for a request read by rendezvous (`end == 0`), the
    /// context's landing buffer holding it at offset 0 (issue 15).
    pub off: u32,
    /// Payload bytes.
    pub len: u32,
    /// Virtual position just after the message (never 0); 0 for a request read by
    /// rendezvous, which occupies no ring bytes. (The flags live in existing fields so that
    /// the entry stays 32 bytes on the inline path.)
    pub end: u64,
}

/// What a received rendezvous descriptor is for.
#[derive(Debug)]
pub(crate) enum RdvKind<U> {
    /// A request: delivered to `recv` once read.
    Request {
        call_id: u32,
        allowance: u64,
        large_resp: bool,
    },
    /// The response to a call: delivered to `on_response` once read.
    Response { user: U },
}

/// A received rendezvous descriptor waiting for (or in) its RDMA READ (issue 15).
#[derive(Debug)]
pub(crate) struct Rdv<U> {
    pub desc: Descriptor,
    pub kind: RdvKind<U>,
    /// The context's landing buffer, once the READ is posted.
    pub slot: u32,
}

/// A call waiting for its response.
#[derive(Debug)]
struct Pending<U> {
    user: U,
    /// Largest response payload the caller accepts, in bytes.
    response_allowance: u32,
    /// The call accepts a rendezvous response.
    large: bool,
}

/// Why [`EndpointCore::admit`] refused a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    Credit,
    Ring,
}

/// Endpoint lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointState {
    /// Created; [`super::Context::connect`] not called yet.
    Init,
    /// Connected: calls and replies flow.
    Connected,
    /// Failed (corrupt input or an error completion): every pending call was failed, new
    /// calls and replies are refused.
    Failed(EndpointFailure),
}

/// A ring in registered memory: `size` bytes, a power of two.
pub(crate) struct Ring {
    pub buf: DmaBuf,
    pub mask: u64,
}

impl Ring {
    fn new(size: usize) -> Result<Ring, mlx5::Error> {
        let buf = if size >= mlx5::mem::HUGEPAGE_BYTES {
            DmaBuf::new(size)?
        } else {
            DmaBuf::with_normal_pages(size)?
        };
        Ok(Ring {
            buf,
            mask: size as u64 - 1,
        })
    }

    #[inline(always)]
    fn size(&self) -> u64 {
        self.mask + 1
    }

    /// The `len` bytes at ring offset `off`.
    ///
    /// # Safety
    /// `off + len <= size`, and nothing writes those bytes while the slice lives (the send
    /// ring: bytes not in flight; the receive ring: bytes of a batch whose CQE was consumed
    /// and not yet released to the peer).
    #[inline(always)]
    unsafe fn slice(&self, off: u64, len: usize) -> &[u8] {
        debug_assert!(off + len as u64 <= self.size());
        // SAFETY: `off + len <= size` and the range is not being written (the contract
        // above), so the bytes are in the live buffer and initialised.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().add(off as usize), len) }
    }

    /// Payload of request `e`, which this ring (an endpoint's receive ring) holds.
    ///
    /// # Safety
    /// `e` came from the owning endpoint's `EndpointCore::ingest` (so it lies inside the
    /// ring) and was not released to the peer ([`EndpointCore::received`]) before the last
    /// flush: the peer may not write those bytes again until a flush tells it they are free.
    #[inline(always)]
    pub(crate) unsafe fn request(&self, e: &RecvEntry) -> &[u8] {
        // SAFETY: ingest checked `e` to lie inside the ring, and the caller's contract (not
        // released) keeps the peer from writing it: `slice`'s contract.
        unsafe { self.slice(e.off as u64, e.len as usize) }
    }

    /// Mutable `len` bytes at ring offset `off`.
    ///
    /// # Safety
    /// As [`Ring::slice`], for send-ring bytes that are not in flight (beyond the producer).
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    unsafe fn slice_mut(&self, off: u64, len: usize) -> &mut [u8] {
        debug_assert!(off + len as u64 <= self.size());
        // SAFETY: `off + len <= size`, and nothing else reads or writes the range while the
        // slice lives (the contract above).
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().add(off as usize), len) }
    }
}

/// Where a message is written, as decided by [`EndpointCore::place`].
struct Placement {
    /// Wrap before writing: close the open batch, write a wrap marker.
    wrap: bool,
    /// Bytes added to `in_flight` (wrap waste, new metadata, the message at its maximum).
    total: u64,
}

/// The sans-I/O state of one endpoint. See the module docs.
pub struct EndpointCore<U> {
    pub(crate) send: Ring,
    pub(crate) recv: Ring,
    /// 16 bytes: `[0, 8)` our consumer position (little-endian, peers RDMA READ it);
    /// `[8, 16)` where our RDMA READ of the peer's lands.
    pub(crate) consumer_word: DmaBuf,
    cap: u64,
    /// [`EndpointCore::max_payload`] and [`EndpointCore::max_response_allowance`] for the
    /// current `cap` (set with it, read by every call).
    max_payload: u32,
    max_response_allowance: u32,
    // ---- large messages (rendezvous, issue 15)
    /// Largest message sent or received by rendezvous, in bytes (0: none); set by the
    /// context at connect ([`EndpointCore::set_large_limit`]).
    large_max: u32,
    /// Largest response allowance a call gets inline credit for; above it the call accepts
    /// a rendezvous response (`max_payload` with large messages, else
    /// `max_response_allowance`).
    inline_response_limit: u32,
    /// Inline part of a response to a call that accepts a rendezvous response.
    large_inline: u32,
    /// Large-message buffers of the context whose descriptors were written, in ring order,
    /// until the peer reports them read.
    pub(crate) tx_outstanding: VecDeque<u32>,
    /// Large-message send buffers free for reuse.
    pub(crate) tx_free: Vec<u32>,
    /// Received descriptors in arrival order; the first `rdv_posted` have their READ posted.
    pub(crate) rdv: VecDeque<Rdv<U>>,
    pub(crate) rdv_posted: usize,
    /// READs completed and not yet reported in a flow metadata.
    reads_unreported: u32,
    // ---- send side (seeds/004 §3.2 "Send Ring の状態変数")
    producer: u64,
    flush_start: u64,
    meta_pos: u64,
    /// End of the ring lap (a multiple of `cap`) the open batch's metadata is in, set when
    /// the batch opens: the batch must end before it ([`EndpointCore::place`]).
    batch_lap_end: u64,
    /// Flag bits (`F_*`): one word, so that [`EndpointCore::wants_flush`] tests them with
    /// one load.
    flags: u16,
    batch_count: u32,
    /// The peer's consumer position as reported by its `ring_credit_return`s.
    piggy_consumer: u64,
    /// Best known peer consumer position: max of piggyback and RDMA READ.
    remote_consumer: u64,
    resp_reservation: u64,
    max_resp_reservation: u64,
    /// Part of `resp_reservation` granted and not yet spent by the peer's calls.
    unused_grant: u64,
    initial_credit: u64,
    peer_credit: u64,
    pub(crate) emits: VecDeque<Emit>,
    /// A flow update was sent and no batch from the peer arrived since.
    credit_requested: bool,
    // ---- receive side
    /// Mask of receive-ring offsets: the peer's capacity `C` minus one, `min(our receive
    /// ring, peer's ring) - 1` once connected (the peer's send ring is assumed as large as
    /// its receive ring, as [`super::Context`] creates them).
    recv_mask: u64,
    recv_producer: u64,
    last_recv_pos: u64,
    released: u64,
    last_notified: u64,
    unreceived: u32,
    pending: Slab<Pending<U>>,
    backlog: Vec<Backlogged>,
    state: EndpointState,
}

/// A validated batch being delivered ([`EndpointCore::deliver`]).
struct Batch<'a> {
    bytes: &'a [u8],
    /// Ring offset of its first byte.
    off: u64,
    /// Virtual position of its first byte.
    pos: u64,
    count: u32,
}

/// What [`EndpointCore::validate_queue`] queued of a batch.
#[derive(Clone, Copy)]
struct Queued {
    /// Inline requests queued.
    requests: u32,
    /// Credit they spent, in bytes.
    spent: u64,
    /// The batch also holds responses (delivered by a second walk).
    others: bool,
}

/// A reply kept until it fits (a protocol-breaking peer; [`EndpointCore::reply`]).
#[derive(Debug)]
struct Backlogged {
    call_id: u32,
    len_flag: u32,
    data: Vec<u8>,
    slot: Option<u32>,
}

impl<U> std::fmt::Debug for EndpointCore<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointCore")
            .field("state", &self.state)
            .field("cap", &self.cap)
            .field("producer", &self.producer)
            .field("remote_consumer", &self.remote_consumer)
            .field("resp_reservation", &self.resp_reservation)
            .field("peer_credit", &self.peer_credit)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl<U> EndpointCore<U> {
    /// Allocates the rings (`send_size`/`recv_size` bytes, powers of two `>= 1 KiB`) and
    /// sets the most response credit this endpoint grants (`max_resp_reservation`, bytes;
    /// seeds/001 default `send_size / 4`).
    ///
    /// # Errors
    /// [`mlx5::Error::InvalidArgument`] for sizes that are not powers of two or too small;
    /// [`mlx5::Error::Memory`] if the rings cannot be mapped.
    pub fn new(
        send_size: usize,
        recv_size: usize,
        max_resp_reservation: u64,
    ) -> Result<Self, mlx5::Error> {
        for s in [send_size, recv_size] {
            if !s.is_power_of_two() || !(1024..=MAX_RING_SIZE).contains(&s) {
                return Err(mlx5::Error::InvalidArgument(format!(
                    "copyrpc ring size {s} bytes: must be a power of two in 1024..=2^31"
                )));
            }
        }
        let initial_credit = max_resp_reservation.min(send_size as u64 / 4) & !(ALIGNMENT - 1);
        let max_resp = initial_credit.max(max_resp_reservation & !(ALIGNMENT - 1));
        let cap = send_size as u64;
        Ok(EndpointCore {
            send: Ring::new(send_size)?,
            recv: Ring::new(recv_size)?,
            consumer_word: DmaBuf::with_normal_pages(16)?,
            cap,
            max_payload: max_payload_for(cap, max_resp),
            max_response_allowance: max_response_allowance_for(cap),
            large_max: 0,
            inline_response_limit: max_response_allowance_for(cap),
            large_inline: 0,
            tx_outstanding: VecDeque::new(),
            tx_free: Vec::new(),
            rdv: VecDeque::new(),
            rdv_posted: 0,
            reads_unreported: 0,
            producer: 0,
            flush_start: 0,
            meta_pos: 0,
            batch_lap_end: 0,
            flags: 0,
            batch_count: 0,
            piggy_consumer: 0,
            remote_consumer: 0,
            resp_reservation: 0,
            max_resp_reservation: max_resp,
            unused_grant: 0,
            initial_credit,
            peer_credit: 0,
            emits: VecDeque::with_capacity(8),
            credit_requested: false,
            recv_mask: recv_size as u64 - 1,
            recv_producer: 0,
            last_recv_pos: 0,
            released: 0,
            last_notified: 0,
            unreceived: 0,
            pending: Slab::with_capacity(64),
            backlog: Vec::new(),
            state: EndpointState::Init,
        })
    }

    /// Response credit announced to the peer in the endpoint info:
    /// `min(max_resp_reservation, send_size / 4)` bytes (seeds/001 "初期クレジット設計").
    pub fn initial_credit(&self) -> u64 {
        self.initial_credit
    }

    /// Receive ring size in bytes.
    pub fn recv_size(&self) -> u64 {
        self.recv.size()
    }

    /// `C`: bytes of the peer's receive ring this endpoint may fill (the smaller ring size).
    pub fn capacity(&self) -> u64 {
        self.cap
    }

    /// Lifecycle state.
    pub fn state(&self) -> EndpointState {
        self.state
    }

    /// Calls waiting for a response.
    pub fn pending_calls(&self) -> usize {
        self.pending.len()
    }

    /// Credit the peer granted and this side has not spent, in bytes.
    pub fn peer_credit(&self) -> u64 {
        self.peer_credit
    }

    /// `R`: credit granted to the peer plus allowances of requests not yet answered.
    pub fn resp_reservation(&self) -> u64 {
        self.resp_reservation
    }

    /// `producer - remote_consumer`: bytes written towards the peer and not known consumed.
    pub fn in_flight(&self) -> u64 {
        self.producer - self.remote_consumer
    }

    /// Largest request payload in bytes: the largest request that is always accepted
    /// eventually. Its worst placement (a wrap wasting up to the message plus one
    /// metadata, then a metadata and the message) plus `2R` at its maximum must fit in `C`:
    /// `2 (32 + padded) + 2 max_resp_reservation <= C`. A larger request could stay
    /// [`CallErrorKind::RingFull`] for as long as the peer holds unspent grant. With the default
    /// `max_resp_reservation` (a quarter of the ring) this is `C / 4 - 44`, which is also the
    /// largest response the peer's default grants can ever cover.
    #[inline(always)]
    pub fn max_payload(&self) -> u32 {
        self.max_payload
    }

    /// Largest response allowance a call may ask for, in bytes: the response plus one
    /// metadata in half the capacity (the peer's grants never exceed that). Whether the
    /// peer's credit can ever cover it depends on the peer's `max_resp_reservation`
    /// ([`CallErrorKind::InsufficientCredit`] otherwise).
    #[inline(always)]
    pub fn max_response_allowance(&self) -> u32 {
        self.max_response_allowance
    }

    /// Completes the connection with the peer's receive ring size and initial credit
    /// (seeds/004 §3.8 `connect_ex`): `R = initial_credit`, `peer_credit = remote credit`.
    /// Both directions use `C = min(our ring, peer's ring)`: the peer's send ring is assumed
    /// as large as its receive ring (as [`super::Context`] creates them), so the peer writes
    /// only the first `C` bytes of our receive ring and wraps there.
    ///
    /// # Errors
    /// [`ProtocolError::BadEndpointInfo`] if the peer's ring is not a power of two `>= 1 KiB`,
    /// our announced credit exceeds a quarter of the capacity, or the peer's exceeds a
    /// quarter of our receive ring.
    pub fn connect(
        &mut self,
        remote_recv_size: u64,
        remote_credit: u64,
    ) -> Result<(), ProtocolError> {
        self.check_remote(remote_recv_size, remote_credit)?;
        self.cap = self.send.size().min(remote_recv_size);
        self.max_payload = max_payload_for(self.cap, self.max_resp_reservation);
        self.max_response_allowance = max_response_allowance_for(self.cap);
        self.inline_response_limit = self.max_response_allowance;
        self.recv_mask = self.recv.size().min(remote_recv_size) - 1;
        self.resp_reservation = self.initial_credit;
        self.unused_grant = self.initial_credit;
        self.peer_credit = remote_credit;
        self.state = EndpointState::Connected;
        Ok(())
    }

    /// The checks of [`EndpointCore::connect`], without connecting.
    ///
    /// # Errors
    /// As [`EndpointCore::connect`].
    pub fn check_remote(
        &self,
        remote_recv_size: u64,
        remote_credit: u64,
    ) -> Result<(), ProtocolError> {
        if !remote_recv_size.is_power_of_two() || remote_recv_size < 1024 {
            return Err(ProtocolError::BadEndpointInfo("receive ring size"));
        }
        let cap = self.send.size().min(remote_recv_size);
        if self.initial_credit > cap / 4 {
            return Err(ProtocolError::BadEndpointInfo(
                "peer's receive ring is too small for the announced credit",
            ));
        }
        if remote_credit > self.recv.size() / 4 || !remote_credit.is_multiple_of(ALIGNMENT) {
            return Err(ProtocolError::BadEndpointInfo("initial credit"));
        }
        Ok(())
    }

    /// Decides where a message of padded size `m` goes and how many bytes it adds to
    /// `in_flight` (wrap rule: seeds/004 §3.6, a batch reaching the ring end wraps).
    #[inline(always)]
    fn place(&self, m: u64) -> Placement {
        // The batch (its metadata, its messages, this one) must end before the end of the
        // ring lap its metadata is in: `off + span < cap` with `off = start mod cap` and
        // `span = producer + meta + m - start`, i.e. `producer + meta + m` below
        // `(start - off) + cap`, which is `batch_lap_end` for an open batch.
        let (fits, meta) = if self.has(F_BATCH_OPEN) {
            (self.producer + m < self.batch_lap_end, 0)
        } else {
            ((self.producer & (self.cap - 1)) + META + m < self.cap, META)
        };
        if fits {
            Placement {
                wrap: false,
                total: meta + m,
            }
        } else {
            let waste = self.cap - (self.producer & (self.cap - 1));
            Placement {
                wrap: true,
                total: waste + META + m,
            }
        }
    }

    /// Writes a request: reserves [`internal_allowance`]`(response_allowance)` of the peer's
    /// credit, `encode` writes at most `max_len` payload bytes into the send ring and returns
    /// the length. Returns the call id (the pending-call key). The wire carries the allowance
    /// in 32 B units, so the response may be up to `padded_message_size(response_allowance)
    /// - 12` bytes (the allowance rounded up to the padded message); a longer one is
    /// [`ProtocolError::ResponseTooLarge`].
    ///
    /// # Errors
    /// Nothing is written on error and `user` is handed back:
    /// - [`CallErrorKind::InsufficientCredit`]: the peer's credit does not cover the response
    ///   (poll, which brings new grants, and retry);
    /// - [`CallErrorKind::RingFull`]: the message would break `in_flight + 2R <= C` (poll and
    ///   retry; the next poll also reads the peer's consumer position);
    /// - [`CallErrorKind::MessageTooLarge`]: `max_len` above [`EndpointCore::max_payload`] or
    ///   `response_allowance` above [`EndpointCore::max_response_allowance`];
    /// - [`CallErrorKind::Failed`] / [`CallErrorKind::NotConnected`].
    #[inline]
    pub fn call(
        &mut self,
        max_len: u32,
        response_allowance: u32,
        user: U,
        encode: impl FnOnce(&mut [u8]) -> usize,
        stats: &mut Stats,
    ) -> Result<u32, CallError<U>> {
        if max_len > self.max_payload() || response_allowance > self.max_response_allowance() {
            return Err(CallError::new(CallErrorKind::MessageTooLarge, user));
        }
        let credit = internal_allowance(response_allowance as u64);
        self.call_fit(
            max_len,
            credit,
            0,
            0,
            response_allowance,
            user,
            encode,
            stats,
        )
    }

    /// Checks that a call reserving `credit` bytes of the peer's credit with a message of
    /// padded size `m` can be written now (state, credit, ring space, call ids); on refusal
    /// sets what the next flush must do (flow request, consumer READ) and counts it.
    #[inline(always)]
    fn admit(&mut self, credit: u64, m: u64, stats: &mut Stats) -> Result<Placement, Refusal> {
        if self.peer_credit < credit {
            stats.insufficient_credit += 1;
            if !self.credit_requested {
                self.flags |= F_FLOW_REQUEST;
            }
            return Err(Refusal::Credit);
        }
        let p = self.place(m);
        if self.producer + p.total - self.remote_consumer + 2 * self.resp_reservation > self.cap {
            stats.ring_full += 1;
            self.flags |= F_NEEDS_READ;
            return Err(Refusal::Ring);
        }
        if self.pending.len() as u32 > MAX_CALL_ID {
            return Err(Refusal::Ring);
        }
        Ok(p)
    }

    /// [`EndpointCore::admit`] for the context's large path, which checks before encoding.
    #[inline]
    pub(crate) fn admit_large(
        &mut self,
        credit: u64,
        m: u64,
        stats: &mut Stats,
    ) -> Result<(), Refusal> {
        self.admit(credit, m, stats).map(|_| ())
    }

    /// Whether a request of padded size `m` keeps `in_flight + 2R <= C` if written now.
    #[inline(always)]
    pub(crate) fn fits(&self, m: u64) -> bool {
        let p = self.place(m);
        self.producer + p.total - self.remote_consumer + 2 * self.resp_reservation <= self.cap
    }

    /// [`EndpointCore::call`] without the size checks: the caller (the context, or `call`)
    /// chose the message size and the credit. `piggy_flag` is OR-ed into the credit units
    /// ([`LARGE_RESPONSE_FLAG`]), `len_flag` into the header's length
    /// ([`RENDEZVOUS_FLAG`]); `response_allowance` (exact, bytes) and `large` (a rendezvous
    /// response is accepted) are what the response is checked against.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn call_fit(
        &mut self,
        max_len: u32,
        credit: u64,
        piggy_flag: u32,
        len_flag: u32,
        response_allowance: u32,
        user: U,
        encode: impl FnOnce(&mut [u8]) -> usize,
        stats: &mut Stats,
    ) -> Result<u32, CallError<U>> {
        if self.state != EndpointState::Connected {
            return Err(self.not_usable(user));
        }
        let m = padded_message_size(max_len as u64);
        let p = match self.admit(credit, m, stats) {
            Ok(p) => p,
            Err(Refusal::Credit) => {
                return Err(CallError::new(CallErrorKind::InsufficientCredit, user));
            }
            Err(Refusal::Ring) => {
                return Err(CallError::new(CallErrorKind::RingFull, user));
            }
        };
        let entry = self.pending.vacant_entry();
        let call_id = entry.key() as u32;
        entry.insert(Pending {
            user,
            response_allowance,
            large: piggy_flag != 0,
        });
        self.peer_credit -= credit;
        if p.wrap {
            self.wrap(stats, p.total);
        }
        self.write_message(
            call_id,
            (credit / ALIGNMENT) as u32 | piggy_flag,
            max_len,
            len_flag,
            |_, b| encode(b),
        );
        stats.calls += 1;
        Ok(call_id)
    }

    /// Sets the large-message limit (issue 15) after [`EndpointCore::connect`]: `limit`
    /// bytes is the smaller of both sides' `EndpointConfig::max_large_message`. Rendezvous
    /// needs `max_payload >= RENDEZVOUS_MIN` (messages up to that are always inline), so on
    /// rings too small for that the limit is 0 (no large messages).
    pub fn set_large_limit(&mut self, limit: u32) {
        self.large_max = large_limit_for(self.max_payload, limit);
        if self.large_max != 0 {
            self.inline_response_limit = self.max_payload;
            self.large_inline = LARGE_INLINE_RESPONSE.min(self.max_payload);
        } else {
            self.large_max = 0;
            self.inline_response_limit = self.max_response_allowance;
            self.large_inline = 0;
        }
    }

    /// Largest message sent or received by rendezvous, in bytes (0: large messages off).
    #[inline(always)]
    pub fn large_limit(&self) -> u32 {
        self.large_max
    }

    /// Largest response allowance that reserves credit for the whole response; a call
    /// asking for more accepts a rendezvous response and reserves
    /// [`EndpointCore::large_call_credit`].
    #[inline(always)]
    pub fn inline_response_limit(&self) -> u32 {
        self.inline_response_limit
    }

    /// Credit, in bytes, a call accepting a rendezvous response reserves:
    /// [`internal_allowance`] of [`LARGE_INLINE_RESPONSE`] (4 KiB), less on small rings.
    pub fn large_call_credit(&self) -> u64 {
        internal_allowance(self.large_inline as u64)
    }

    /// A rendezvous READ of ours completed: the next batch (or a flow update) reports it.
    #[inline]
    pub(crate) fn read_completed(&mut self) {
        self.reads_unreported += 1;
        self.flags |= F_READ_DONE;
    }

    /// Whether the flush has large-message work: landing buffers to take back from `recv`
    /// or descriptors whose READ is not posted yet (one flag test).
    #[inline(always)]
    pub(crate) fn large_work(&self) -> bool {
        self.has(F_RDV | F_LENT)
    }

    /// The context lent a landing buffer of this endpoint (see [`F_LENT`]).
    #[inline]
    pub(crate) fn set_lent(&mut self) {
        self.flags |= F_LENT;
    }

    /// Takes the lent flag: whether landing buffers were lent since the last call.
    #[inline]
    pub(crate) fn take_lent(&mut self) -> bool {
        let lent = self.has(F_LENT);
        self.flags &= !F_LENT;
        lent
    }

    /// Every received descriptor has its READ posted.
    #[inline]
    pub(crate) fn rdv_all_posted(&mut self) {
        self.flags &= !F_RDV;
    }

    #[cold]
    pub(crate) fn not_usable(&self, user: U) -> CallError<U> {
        match self.state {
            EndpointState::Failed(_) => CallError::new(CallErrorKind::Failed, user),
            _ => CallError::new(CallErrorKind::NotConnected, user),
        }
    }

    /// Writes the response to request `call_id`, which reserved `allowance` bytes of credit,
    /// with at most `max_len` payload bytes written by `encode`. Never fails for lack of
    /// space (module docs).
    ///
    /// # Errors
    /// [`ReplyError::TooLarge`] if `max_len` exceeds the payload the allowance covers;
    /// [`ReplyError::Failed`] if the endpoint failed.
    #[inline]
    pub fn reply(
        &mut self,
        call_id: u32,
        allowance: u64,
        max_len: u32,
        encode: impl FnOnce(&mut [u8]) -> usize,
        stats: &mut Stats,
    ) -> Result<(), ReplyError> {
        self.reply_in(call_id, allowance, max_len, |_, b| encode(b), stats)
    }

    /// [`EndpointCore::reply`] whose `encode` also gets this endpoint's receive ring, so that
    /// it can read a request there while it writes the reply (the context's
    /// [`super::Context::serve_next`]): the ring is borrowed apart from the send side.
    #[inline]
    pub(crate) fn reply_in(
        &mut self,
        call_id: u32,
        allowance: u64,
        max_len: u32,
        encode: impl FnOnce(&Ring, &mut [u8]) -> usize,
        stats: &mut Stats,
    ) -> Result<(), ReplyError> {
        if self.state != EndpointState::Connected {
            return Err(ReplyError::Failed);
        }
        let m = padded_message_size(max_len as u64);
        if m + META > allowance {
            return Err(ReplyError::TooLarge {
                len: max_len as usize,
                allowance: (allowance - META - HEADER_SIZE as u64) as usize,
            });
        }
        self.reply_fit(call_id, allowance, max_len, 0, None, encode, stats)
    }

    /// [`EndpointCore::reply_in`] without the size check (done by the caller): `len_flag` is
    /// OR-ed into the header's length, `slot` is the large-message buffer a rendezvous
    /// descriptor names (kept until the peer reports it read). `encode` gets the receive
    /// ring and the reply buffer (`max_len` bytes: in the send ring, or in the backlog when
    /// the ring has no room).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn reply_fit(
        &mut self,
        call_id: u32,
        allowance: u64,
        max_len: u32,
        len_flag: u32,
        slot: Option<u32>,
        encode: impl FnOnce(&Ring, &mut [u8]) -> usize,
        stats: &mut Stats,
    ) -> Result<(), ReplyError> {
        if self.state != EndpointState::Connected {
            return Err(ReplyError::Failed);
        }
        let m = padded_message_size(max_len as u64);
        self.resp_reservation -= allowance.min(self.resp_reservation);
        let p = self.place(m);
        if !self.backlog.is_empty() || self.producer + p.total - self.remote_consumer > self.cap {
            return self.backlog_reply(call_id, max_len, len_flag, slot, encode, stats);
        }
        if p.wrap {
            self.wrap(stats, p.total);
        }
        self.write_message(to_response_id(call_id), 0, max_len, len_flag, encode);
        if let Some(s) = slot {
            self.tx_outstanding.push_back(s);
        }
        stats.replies += 1;
        Ok(())
    }

    /// Gives up answering a request that reserved `allowance` bytes (its response could
    /// not be written): the reservation returns to the grant pool.
    #[cold]
    pub(crate) fn abandon(&mut self, allowance: u64) {
        self.resp_reservation -= allowance.min(self.resp_reservation);
    }

    /// Keeps a reply that does not fit (only possible if the peer broke the protocol) until
    /// the peer consumes; sent by [`EndpointCore::flush`].
    #[cold]
    #[inline(never)]
    fn backlog_reply(
        &mut self,
        call_id: u32,
        max_len: u32,
        len_flag: u32,
        slot: Option<u32>,
        encode: impl FnOnce(&Ring, &mut [u8]) -> usize,
        stats: &mut Stats,
    ) -> Result<(), ReplyError> {
        let mut v = vec![0u8; max_len as usize];
        let n = encode(&self.recv, &mut v).min(max_len as usize);
        v.truncate(n);
        self.flags |= F_QUEUED;
        self.backlog.push(Backlogged {
            call_id,
            len_flag,
            data: v,
            slot,
        });
        self.flags |= F_NEEDS_READ;
        stats.backlogged_replies += 1;
        Ok(())
    }

    /// Writes header + payload at the producer (space already checked, no wrap needed).
    /// `encode` writes the payload into the send ring (at most `max_len` bytes; a larger
    /// returned length is clamped); it also gets the receive ring, borrowed apart from the
    /// send side, for a reply that reads its request in place.
    #[inline(always)]
    fn write_message(
        &mut self,
        call_id: u32,
        piggyback: u32,
        max_len: u32,
        len_flag: u32,
        encode: impl FnOnce(&Ring, &mut [u8]) -> usize,
    ) {
        if !self.has(F_BATCH_OPEN) {
            self.meta_pos = self.producer;
            self.batch_lap_end = (self.producer & !(self.cap - 1)) + self.cap;
            self.producer += META;
            self.flags |= F_BATCH_OPEN;
            self.batch_count = 0;
        }
        let off = self.producer & self.send.mask;
        // SAFETY: `place` guaranteed `off + padded(max_len) < cap <= send size`; these bytes
        // are beyond the producer, so neither in flight nor read by the device.
        let buf = unsafe { self.send.slice_mut(off, HEADER_SIZE + max_len as usize) };
        let (head, body) = buf.split_at_mut(HEADER_SIZE);
        let len = encode(&self.recv, body).min(max_len as usize) as u32;
        MsgHeader {
            call_id,
            piggyback,
            payload_len: len | len_flag,
        }
        .write(head.try_into().expect("12 bytes"));
        self.producer += padded_message_size(len as u64);
        self.batch_count += 1;
    }

    /// Closes the open batch (if any) and writes a wrap marker up to the ring end; the
    /// producer moves to the next multiple of the capacity. `total` is what the operation
    /// wrapping adds to `in_flight` ([`Placement::total`]: the waste, then a metadata and
    /// its message): the grants of both metadata written here leave room for all of it.
    #[cold]
    #[inline(never)]
    fn wrap(&mut self, stats: &mut Stats, total: u64) {
        self.close_batch(stats, total);
        let start = self.producer;
        let delta = self.cap - (start & (self.cap - 1));
        self.producer += delta;
        let meta = self.metadata(WRAP_MESSAGE_COUNT, total - delta);
        // SAFETY: a 32 B metadata at an aligned offset below the capacity; not in flight.
        let b = unsafe { self.send.slice_mut(start & self.send.mask, META as usize) };
        meta.write(b.try_into().expect("32 bytes"));
        self.flush_start = self.producer;
        self.flags |= F_QUEUED;
        self.emits.push_back(Emit {
            start,
            len: META as u32,
            delta,
        });
        stats.wrap_markers += 1;
    }

    /// The flow metadata for a batch ending at the producer: credit return and a new grant,
    /// which is added to `R` at once (seeds/004 §3.4 "クレジット付与の計算"). `ahead`: bytes
    /// the operation in progress still adds after this metadata (a wrap inside `call` or
    /// `reply`), counted in `in_flight` so that `in_flight + 2R <= C` holds once written.
    #[inline(always)]
    fn metadata(&mut self, message_count: u32, ahead: u64) -> FlowMetadata {
        let r = self.resp_reservation;
        // `R` at its maximum (a side that only calls, or whose grant is all with the peer):
        // the policy bound is 0, so is the grant; the invariant bound need not be computed.
        let grant = if r < self.max_resp_reservation {
            let in_flight = self.producer + ahead - self.remote_consumer;
            let by_invariant = (self.cap.saturating_sub(in_flight) / 2).saturating_sub(r);
            let by_policy = self.max_resp_reservation - r;
            let grant = by_invariant.min(by_policy) & !(ALIGNMENT - 1);
            self.resp_reservation += grant;
            self.unused_grant += grant;
            grant
        } else {
            0
        };
        let ret = self.released - self.last_notified;
        self.last_notified = self.released;
        let reads_done = self.reads_unreported;
        self.reads_unreported = 0;
        self.flags &= !F_READ_DONE;
        FlowMetadata {
            ring_credit_return: ret,
            credit_grant: grant,
            message_count,
            reads_done,
        }
    }

    /// Closes the open batch: fills its metadata and queues its [`Emit`]. `ahead` as in
    /// [`EndpointCore::metadata`].
    #[inline]
    fn close_batch(&mut self, stats: &mut Stats, ahead: u64) {
        if !self.has(F_BATCH_OPEN) {
            return;
        }
        let e = self.seal_batch(stats, ahead);
        self.flags |= F_QUEUED;
        self.emits.push_back(e);
    }

    /// [`EndpointCore::close_batch`] of a batch known to be open, returning its [`Emit`]
    /// instead of queueing it.
    #[inline(always)]
    fn seal_batch(&mut self, stats: &mut Stats, ahead: u64) -> Emit {
        debug_assert!(self.has(F_BATCH_OPEN));
        let meta = self.metadata(self.batch_count, ahead);
        let off = self.meta_pos & self.send.mask;
        // SAFETY: the batch's metadata slot, reserved when the batch opened; not in flight yet.
        let b = unsafe { self.send.slice_mut(off, META as usize) };
        meta.write(b.try_into().expect("32 bytes"));
        let len = self.producer - self.flush_start;
        let e = Emit {
            start: self.flush_start,
            len: len as u32,
            delta: len,
        };
        stats.record_batch(self.batch_count);
        self.flush_start = self.producer;
        self.flags &= !F_BATCH_OPEN;
        e
    }

    /// Sends backlogged replies that now fit, then closes the open batch. Without a batch,
    /// sends a flow update (an empty batch: metadata only, `message_count = 0`) if a call
    /// lacked credit, or if the peer sent one and a grant is possible now; it carries the
    /// credit return and a grant like any batch. A flow update is sent at most once per batch
    /// received from the peer, so two idle endpoints never exchange them endlessly. Emits are
    /// left in `EndpointCore::emits` for the context to post.
    #[inline]
    pub fn flush(&mut self, stats: &mut Stats) {
        if !self.backlog.is_empty() {
            self.drain_backlog(stats);
        }
        if self.has(F_BATCH_OPEN) {
            self.close_batch(stats, 0);
            self.flags &= !F_FLOW_REQUEST;
            self.flags &= !F_ANSWER_FLOW;
        } else if self.has(F_FLOW_REQUEST | F_ANSWER_FLOW | F_READ_DONE) {
            self.flow_update(stats);
        }
    }

    /// [`EndpointCore::flush`] for the common case of an open batch with no emit queued
    /// before it and no backlog: the batch is closed and its [`Emit`] returned instead of
    /// queued, so that the context posts it without a round trip through
    /// `EndpointCore::emits` (it must queue it there with [`EndpointCore::requeue_emit`] if
    /// the post fails). Otherwise runs `flush` and returns `None`.
    #[inline(always)]
    pub(crate) fn flush_one(&mut self, stats: &mut Stats) -> Option<Emit> {
        if self.flags & (F_BATCH_OPEN | F_QUEUED) == F_BATCH_OPEN {
            let e = self.seal_batch(stats, 0);
            self.flags &= !(F_FLOW_REQUEST | F_ANSWER_FLOW);
            return Some(e);
        }
        self.flush(stats);
        None
    }

    /// Queues an [`Emit`] returned by [`EndpointCore::flush_one`] that could not be posted:
    /// it is then exactly where `flush` would have left it.
    #[cold]
    pub(crate) fn requeue_emit(&mut self, e: Emit) {
        debug_assert!(self.emits.is_empty());
        self.flags |= F_QUEUED;
        self.emits.push_back(e);
    }

    #[cold]
    fn flow_update(&mut self, stats: &mut Stats) {
        if self.state != EndpointState::Connected {
            return;
        }
        let p = self.place(0);
        if self.producer + p.total - self.remote_consumer + 2 * self.resp_reservation > self.cap {
            // No room even for 32 B: learn the peer's consumer position first.
            self.flags |= F_NEEDS_READ;
            return;
        }
        if !self.has(F_FLOW_REQUEST | F_READ_DONE) {
            // Answering: only worth it if it grants something.
            let in_flight = self.producer + p.total - self.remote_consumer;
            let r = self.resp_reservation;
            let by_invariant =
                (self.cap.saturating_sub(in_flight) / 2).saturating_sub(r) & !(ALIGNMENT - 1);
            let by_policy = self.max_resp_reservation.saturating_sub(r) & !(ALIGNMENT - 1);
            if by_policy == 0 {
                // `R` is at its maximum: the grant is already with the peer (or in flight
                // to it), or held by requests whose replies will carry new grants.
                self.flags &= !F_ANSWER_FLOW;
                return;
            }
            if by_invariant == 0 && self.remote_consumer < self.producer {
                // Only the bytes not known consumed hold the grant back. The starved peer
                // may have nothing else to send us (no piggybacked credit return), so keep
                // the answer pending and learn its consumer position by RDMA READ; the
                // next flush retries. Dropping the answer here deadlocked both sides.
                self.flags |= F_NEEDS_READ;
                return;
            }
            self.flags &= !F_ANSWER_FLOW;
            if by_invariant == 0 {
                return;
            }
        }
        if p.wrap {
            self.wrap(stats, p.total);
        }
        self.meta_pos = self.producer;
        self.producer += META;
        let meta = self.metadata(0, 0);
        // SAFETY: 32 B at an aligned offset below the capacity (placed above); not in flight.
        let b = unsafe {
            self.send
                .slice_mut(self.meta_pos & self.send.mask, META as usize)
        };
        meta.write(b.try_into().expect("32 bytes"));
        self.flags |= F_QUEUED;
        self.emits.push_back(Emit {
            start: self.meta_pos,
            len: META as u32,
            delta: META,
        });
        self.flush_start = self.producer;
        if self.has(F_FLOW_REQUEST) {
            self.credit_requested = true;
        }
        self.flags &= !F_FLOW_REQUEST;
        self.flags &= !F_ANSWER_FLOW;
        stats.flow_updates += 1;
    }

    /// Whether the context must visit this endpoint at the next flush: an open batch,
    /// emits not yet posted, a backlog, a pending flow update, a consumer read or an
    /// unpublished consumer position.
    #[inline(always)]
    pub fn wants_flush(&self) -> bool {
        debug_assert!(self.has(F_QUEUED) || (self.emits.is_empty() && self.backlog.is_empty()));
        self.flags != 0
    }

    /// Clears the flag that something may be queued ([`EndpointCore::wants_flush`]) if
    /// `emits` and `backlog` are both empty (the context calls it after posting emits).
    #[inline(always)]
    pub(crate) fn settle_queued(&mut self) {
        if self.has(F_QUEUED) && self.emits.is_empty() && self.backlog.is_empty() {
            self.flags &= !F_QUEUED;
        }
    }

    /// Whether emits or backlogged replies may be queued (the flag [`EndpointCore::settle_queued`]
    /// clears): when not, `emits` and `backlog` are both empty.
    #[inline(always)]
    pub(crate) fn queued(&self) -> bool {
        self.has(F_QUEUED)
    }

    /// Whether [`EndpointCore::queued`], [`EndpointCore::large_work`] or
    /// [`EndpointCore::needs_read`] holds, in one test: a flush has nothing to do past the
    /// first batch otherwise.
    #[inline(always)]
    pub(crate) fn queued_reads_or_large_work(&self) -> bool {
        self.has(F_QUEUED | F_RDV | F_LENT | F_NEEDS_READ)
    }

    /// Whether [`EndpointCore::large_work`] or [`EndpointCore::needs_read`] holds, in one
    /// test.
    #[inline(always)]
    pub(crate) fn reads_or_large_work(&self) -> bool {
        self.has(F_RDV | F_LENT | F_NEEDS_READ)
    }

    /// Whether flag bit `f` (`F_*`) is set.
    #[inline(always)]
    fn has(&self, f: u16) -> bool {
        self.flags & f != 0
    }

    /// A call found the ring full (or a reply was backlogged): the next flush reads the
    /// peer's consumer position (seeds/001 "RDMA READフォールバック").
    #[inline(always)]
    pub(crate) fn needs_read(&self) -> bool {
        self.has(F_NEEDS_READ)
    }

    /// Stores the released position in the consumer word, where the peer's RDMA READ finds
    /// it. Called by the context at flush time and by `ingest` (within the context's poll),
    /// never while a request's bytes are borrowed.
    #[inline]
    pub(crate) fn publish(&mut self) {
        if self.has(F_UNPUBLISHED) {
            self.flags &= !F_UNPUBLISHED;
            // SAFETY: `consumer_word` is 16 bytes, page aligned; peers only read it.
            let w = unsafe { &*(self.consumer_word.as_ptr() as *const AtomicU64) };
            w.store(self.released.to_le(), Ordering::Release);
        }
    }

    #[cold]
    fn drain_backlog(&mut self, stats: &mut Stats) {
        let backlog = std::mem::take(&mut self.backlog);
        let mut rest = Vec::new();
        for b in backlog {
            let p = self.place(padded_message_size(b.data.len() as u64));
            if !rest.is_empty() || self.producer + p.total - self.remote_consumer > self.cap {
                rest.push(b);
                continue;
            }
            if p.wrap {
                self.wrap(stats, p.total);
            }
            let data = &b.data;
            self.write_message(
                to_response_id(b.call_id),
                0,
                data.len() as u32,
                b.len_flag,
                |_, buf| {
                    buf[..data.len()].copy_from_slice(data);
                    data.len()
                },
            );
            if let Some(s) = b.slot {
                self.tx_outstanding.push_back(s);
            }
            stats.replies += 1;
        }
        if !rest.is_empty() {
            self.flags |= F_NEEDS_READ;
        }
        self.backlog = rest;
    }

    /// Whether a batch is open (messages written and not yet flushed).
    #[inline]
    pub fn is_dirty(&self) -> bool {
        self.has(F_BATCH_OPEN) || !self.backlog.is_empty()
    }

    /// Bytes of our send ring at virtual position `pos` (for the context to build a WQE).
    ///
    /// # Safety
    /// `[pos, pos + len)` is an emitted range (does not cross the ring end, not modified
    /// until the peer consumes it).
    #[inline(always)]
    pub(crate) unsafe fn send_bytes(&self, pos: u64, len: usize) -> &[u8] {
        // SAFETY: an emitted range does not cross the ring end and is not modified until the
        // peer consumes it (the contract above): `slice`'s contract.
        unsafe { self.send.slice(pos & self.send.mask, len) }
    }

    /// Ring offset of virtual position `pos` in the peer's receive ring.
    #[inline(always)]
    pub(crate) fn remote_offset(&self, pos: u64) -> u64 {
        pos & (self.cap - 1)
    }

    /// Ring offset of `pos` in our send ring.
    #[inline(always)]
    pub(crate) fn send_offset(&self, pos: u64) -> u64 {
        pos & self.send.mask
    }

    /// Applies the result of an RDMA READ of the peer's consumer position.
    ///
    /// # Errors
    /// [`ProtocolError::BadConsumer`] if the value is beyond what was sent (ignored).
    pub fn on_consumer_read(&mut self, value: u64) -> Result<(), ProtocolError> {
        self.flags &= !F_NEEDS_READ;
        if value > self.producer {
            return Err(ProtocolError::BadConsumer);
        }
        self.remote_consumer = self.remote_consumer.max(value);
        Ok(())
    }

    /// Parses the batch of `delta` bytes (decoded from a receive CQE's immediate) at the
    /// receive position: applies its flow metadata, delivers responses to `on_response`
    /// and queues requests in `queue` (tagged with endpoint index `ep`). In-order ingest
    /// (seeds/001 "リクエスト取り込みはIn-Order").
    ///
    /// The whole batch is validated before anything is delivered, except for a second
    /// response to the same call within one batch, which is detected on delivery.
    ///
    /// # Errors
    /// A [`ProtocolError`] if the batch is malformed (nothing of it was delivered, except in
    /// the duplicate case); the caller then fails the endpoint.
    #[inline]
    pub(crate) fn ingest(
        &mut self,
        delta: u64,
        ep: u32,
        queue: &mut Fifo<RecvEntry>,
        stats: &mut Stats,
        on_response: &mut impl FnMut(U, Result<&[u8], EndpointFailure>),
    ) -> Result<(), ProtocolError> {
        let size = self.recv_mask + 1;
        let pos = self.recv_producer;
        let off = pos & self.recv_mask;
        if delta < META || !delta.is_multiple_of(ALIGNMENT) || off + delta > size {
            return reject(ProtocolError::BadLength);
        }
        if pos + delta - self.released > size {
            return reject(ProtocolError::Overrun);
        }
        // SAFETY: `off + delta <= size` (checked above); the peer wrote these bytes before
        // the CQE we consumed (Acquire on the owner bit) and may not write them again until
        // we release. The slice is not tied to `self` so that the delivery loop below can
        // call `&mut self` methods; nothing in this function writes the receive ring.
        let batch: &[u8] = unsafe {
            std::slice::from_raw_parts(self.recv.buf.as_ptr().add(off as usize), delta as usize)
        };
        let meta = FlowMetadata::read(batch[..META as usize].try_into().expect("32 bytes"));
        // `piggy_consumer + ret <= producer`, without overflow: `piggy_consumer` only takes
        // values checked here against the producer, which only grows.
        debug_assert!(self.piggy_consumer <= self.producer);
        if meta.ring_credit_return > self.producer - self.piggy_consumer {
            return reject(ProtocolError::BadConsumer);
        }
        let new_piggy = self.piggy_consumer + meta.ring_credit_return;
        // `peer_credit + grant <= receive ring size`, without overflow: `peer_credit` starts
        // at most a quarter of that size (`check_remote`), grows only by grants checked here
        // and shrinks by calls.
        debug_assert!(self.peer_credit <= self.recv.size());
        if !meta.credit_grant.is_multiple_of(ALIGNMENT)
            || meta.credit_grant > self.recv.size() - self.peer_credit
        {
            return reject(ProtocolError::BadCredit);
        }
        if meta.reads_done as usize > self.tx_outstanding.len() {
            return reject(ProtocolError::BadReadsDone);
        }
        // The one inline message of a batch of one is read and checked once (the common
        // case at low depth). A batch of several messages is checked by `validate_queue`,
        // which queues its inline requests as it goes (taken back if the batch turns out
        // bad), so that delivery only walks it again for its responses and rendezvous
        // messages, if any. Each branch applies the batch (`accept`) once it is validated,
        // then delivers it.
        let at = Batch {
            bytes: batch,
            off,
            pos,
            count: meta.message_count,
        };
        let duplicate = if meta.is_wrap() {
            if off + delta != size {
                return Err(ProtocolError::BadWrap);
            }
            self.accept(pos + delta, new_piggy, &meta, stats);
            Ok(None)
        } else if meta.message_count == 1 {
            match self.validate_one(batch)? {
                Some(h) => {
                    self.accept(pos + delta, new_piggy, &meta, stats);
                    let mut duplicate = None;
                    // `validate_one` checked that the message fills the batch: it ends at
                    // `delta`.
                    self.deliver_inline(
                        h,
                        META as usize,
                        delta as usize,
                        &at,
                        ep,
                        queue,
                        stats,
                        on_response,
                        &mut duplicate,
                    );
                    Ok(duplicate)
                }
                // A rendezvous message, checked by `validate`.
                None => {
                    self.accept(pos + delta, new_piggy, &meta, stats);
                    self.deliver::<false>(&at, ep, queue, stats, on_response)
                }
            }
        } else {
            match self.validate_queue(batch, meta.message_count, off, pos, ep, queue) {
                Ok(Some(q)) => {
                    // Accepted (nothing below fails before delivery): account for the
                    // queued requests; the walk below delivers the responses, if any.
                    self.unused_grant -= q.spent;
                    self.unreceived += q.requests;
                    stats.requests += q.requests as u64;
                    self.accept(pos + delta, new_piggy, &meta, stats);
                    if q.others {
                        self.deliver::<true>(&at, ep, queue, stats, on_response)
                    } else {
                        Ok(None)
                    }
                }
                r => {
                    r?;
                    self.validate(batch, meta.message_count)?;
                    self.accept(pos + delta, new_piggy, &meta, stats);
                    self.deliver::<false>(&at, ep, queue, stats, on_response)
                }
            }
        };
        self.last_recv_pos = pos + delta;
        if let Some(id) = duplicate? {
            return Err(ProtocolError::UnknownCallId(id));
        }
        if self.unreceived == 0 {
            // No request of this endpoint is queued or handed out, and the responses were
            // delivered above, within this call: nothing borrows the receive ring, so the
            // position is published at once (as the flush of this same poll would), and the
            // flush need not visit the endpoint for it.
            self.release_and_publish(self.last_recv_pos);
        }
        Ok(())
    }

    /// Applies the flow metadata `meta` of a validated batch ending at receive position
    /// `end`, whose credit return moves the peer's consumer position to `new_piggy`.
    #[inline(always)]
    fn accept(&mut self, end: u64, new_piggy: u64, meta: &FlowMetadata, stats: &mut Stats) {
        self.recv_producer = end;
        self.piggy_consumer = new_piggy;
        self.remote_consumer = self.remote_consumer.max(new_piggy);
        self.peer_credit += meta.credit_grant;
        self.credit_requested = false;
        if meta.reads_done != 0 {
            self.reads_reported(meta.reads_done);
        }
        if meta.message_count == 0 {
            self.flags |= F_ANSWER_FLOW;
        }
        stats.batches_received += 1;
    }

    /// Delivers the messages of a validated batch in order: responses to `on_response`,
    /// requests to `queue` (skipped if `QUEUED`: `validate_queue` queued them), rendezvous
    /// messages to [`EndpointCore::ingest_rendezvous`]. Returns the id of a second response
    /// to one call within the batch, if any.
    ///
    /// # Errors
    /// The batch lies in the receive ring, which the peer can write at any time (it holds
    /// the ring's rkey), so the headers read again here may no longer be the ones
    /// validation checked. What memory safety and the credit accounting rest on is checked
    /// again on the values read here, once: each header and message within the batch
    /// ([`ProtocolError::BadLength`]), a request's allowance within the credit left
    /// ([`ProtocolError::BadCredit`]), and a rendezvous descriptor (the checks of
    /// `validate_rendezvous`, so that no READ can be longer than its landing buffer).
    /// Delivery stops there, and the caller fails the endpoint.
    #[inline(always)]
    fn deliver<const QUEUED: bool>(
        &mut self,
        b: &Batch<'_>,
        ep: u32,
        queue: &mut Fifo<RecvEntry>,
        stats: &mut Stats,
        on_response: &mut impl FnMut(U, Result<&[u8], EndpointFailure>),
    ) -> Result<Option<u32>, ProtocolError> {
        let batch = b.bytes;
        let mut duplicate = None;
        let mut cur = META as usize;
        for _ in 0..b.count {
            let Some(hb) = batch.get(cur..cur + HEADER_SIZE) else {
                return reject(ProtocolError::BadLength);
            };
            let h = MsgHeader::read(hb.try_into().expect("12"));
            if h.payload_len & RENDEZVOUS_FLAG != 0 {
                if let Some(id) = self.deliver_rendezvous(h, batch, cur, stats)? {
                    duplicate = Some(id);
                }
                cur += padded_message_size(DESCRIPTOR_SIZE as u64) as usize;
                continue;
            }
            let next = cur + padded_message_size(h.payload_len as u64) as usize;
            if next > batch.len() {
                return reject(ProtocolError::BadLength);
            }
            if !is_response(h.call_id) {
                if QUEUED {
                    cur = next;
                    continue;
                }
                if (h.piggyback & !LARGE_RESPONSE_FLAG) as u64 * ALIGNMENT > self.unused_grant {
                    return reject(ProtocolError::BadCredit);
                }
            }
            self.deliver_inline(
                h,
                cur,
                next,
                b,
                ep,
                queue,
                stats,
                on_response,
                &mut duplicate,
            );
            cur = next;
        }
        Ok(duplicate)
    }

    /// The rendezvous message with header `h` at batch offset `cur`, for
    /// [`EndpointCore::deliver`]: its descriptor is read once and checked again on that copy
    /// (`check_rendezvous`, and its credit within what is left), which is what the READ will
    /// use, then queued (`ingest_rendezvous`; `Ok(Some(id))` for a second response to one
    /// call).
    #[cold]
    #[inline(never)]
    fn deliver_rendezvous(
        &mut self,
        h: MsgHeader,
        batch: &[u8],
        cur: usize,
        stats: &mut Stats,
    ) -> Result<Option<u32>, ProtocolError> {
        let body = cur + HEADER_SIZE;
        let Some(db) = batch.get(body..body + DESCRIPTOR_SIZE) else {
            return Err(ProtocolError::BadLength);
        };
        let d = Descriptor::read(db.try_into().expect("16"));
        if self.check_rendezvous(h, &d)? > self.unused_grant {
            return Err(ProtocolError::BadCredit);
        }
        Ok(self.ingest_rendezvous(h, d, stats).err())
    }

    /// Delivers the inline message with header `h` at batch offset `cur` of a validated
    /// batch (a response to `on_response`, a request to `queue`); `next` is the offset just
    /// after it (`cur` plus its padded size). A second response to one call within the
    /// batch sets `duplicate`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn deliver_inline(
        &mut self,
        h: MsgHeader,
        cur: usize,
        next: usize,
        b: &Batch<'_>,
        ep: u32,
        queue: &mut Fifo<RecvEntry>,
        stats: &mut Stats,
        on_response: &mut impl FnMut(U, Result<&[u8], EndpointFailure>),
        duplicate: &mut Option<u32>,
    ) {
        let (batch, off, pos) = (b.bytes, b.off, b.pos);
        let body = cur + HEADER_SIZE;
        let len = h.payload_len as usize;
        debug_assert_eq!(next, cur + padded_message_size(len as u64) as usize);
        if is_response(h.call_id) {
            // `validate` checked that the id names a pending call; only a second
            // response to the same call within this batch finds it gone.
            match self
                .pending
                .try_remove(from_response_id(h.call_id) as usize)
            {
                Some(p) => {
                    stats.responses += 1;
                    on_response(p.user, Ok(&batch[body..body + len]));
                }
                None => *duplicate = Some(h.call_id),
            }
        } else {
            let allowance = (h.piggyback & !LARGE_RESPONSE_FLAG) as u64 * ALIGNMENT;
            self.unused_grant -= allowance;
            self.unreceived += 1;
            stats.requests += 1;
            queue.push_back(RecvEntry {
                ep,
                call_id: h.call_id,
                allowance: allowance | ((h.piggyback & LARGE_RESPONSE_FLAG) as u64) << 32,
                off: (off as usize + body) as u32,
                len: len as u32,
                end: pos + next as u64,
            });
        }
    }

    /// [`EndpointCore::validate`] of a batch of one message, which returns that message's
    /// header when it is inline, so that delivery does not read and check it again (the
    /// same checks, in the same order, with the same errors). A rendezvous message is
    /// checked by `validate` and gives `None`.
    #[inline(always)]
    pub(super) fn validate_one(&self, batch: &[u8]) -> Result<Option<MsgHeader>, ProtocolError> {
        let cur = META as usize;
        if cur + HEADER_SIZE > batch.len() {
            return reject(ProtocolError::BadCount);
        }
        let h = MsgHeader::read(batch[cur..cur + HEADER_SIZE].try_into().expect("12"));
        let padded = padded_message_size(h.payload_len as u64) as usize;
        if padded > batch.len() - cur {
            if h.payload_len & RENDEZVOUS_FLAG != 0 {
                self.validate(batch, 1)?;
                return Ok(None);
            }
            return reject(ProtocolError::BadLength);
        }
        if is_response(h.call_id) {
            match self.pending.get(from_response_id(h.call_id) as usize) {
                None => return reject(ProtocolError::UnknownCallId(h.call_id)),
                Some(p) if padded > padded_message_size(p.response_allowance as u64) as usize => {
                    return reject(ProtocolError::ResponseTooLarge);
                }
                Some(_) => {}
            }
        } else if (h.piggyback & !LARGE_RESPONSE_FLAG) as u64 * ALIGNMENT > self.unused_grant {
            return reject(ProtocolError::BadCredit);
        }
        if cur + padded != batch.len() {
            return reject(ProtocolError::BadCount);
        }
        Ok(Some(h))
    }

    /// [`EndpointCore::validate`] (the same checks, in the same order, with the same errors)
    /// of a batch of inline messages at ring offset `off` and virtual position `pos`, which
    /// also pushes each request to `queue` as [`EndpointCore::deliver_inline`] would. Nothing
    /// of the core is modified: the caller applies the returned [`Queued`] once the batch is
    /// accepted. On error, or `Ok(None)` (a message too long for the batch: a rendezvous
    /// message, left to `validate`, or a bad length, which `validate` reports), nothing is
    /// queued (the entries written are not committed: `Appender::commit`).
    #[inline(always)]
    fn validate_queue(
        &self,
        batch: &[u8],
        count: u32,
        off: u64,
        pos: u64,
        ep: u32,
        queue: &mut Fifo<RecvEntry>,
    ) -> Result<Option<Queued>, ProtocolError> {
        // Each message takes at least 32 bytes: a batch cannot hold more (and one claiming
        // more fails below), so a peer's count never makes the queue grow beyond that.
        let mut queue = queue.appender((count as usize).min(batch.len() / ALIGNMENT as usize));
        let mut cur = META as usize;
        // Credit not spent yet by the requests checked so far (`validate`'s `spent` is
        // `unused_grant - budget`).
        let mut budget = self.unused_grant;
        for _ in 0..count {
            if cur + HEADER_SIZE > batch.len() {
                return Err(ProtocolError::BadCount);
            }
            let h = MsgHeader::read(batch[cur..cur + HEADER_SIZE].try_into().expect("12"));
            let padded = padded_message_size(h.payload_len as u64) as usize;
            if padded > batch.len() - cur {
                // A rendezvous message (or a bad length): left to `validate`.
                return Ok(None);
            }
            if is_response(h.call_id) {
                match self.pending.get(from_response_id(h.call_id) as usize) {
                    None => return reject(ProtocolError::UnknownCallId(h.call_id)),
                    Some(p)
                        if padded_message_size(h.payload_len as u64)
                            > padded_message_size(p.response_allowance as u64) =>
                    {
                        return Err(ProtocolError::ResponseTooLarge);
                    }
                    Some(_) => {}
                }
            } else {
                let allowance = (h.piggyback & !LARGE_RESPONSE_FLAG) as u64 * ALIGNMENT;
                if allowance > budget {
                    return Err(ProtocolError::BadCredit);
                }
                budget -= allowance;
                queue.push(RecvEntry {
                    ep,
                    call_id: h.call_id,
                    allowance: allowance | ((h.piggyback & LARGE_RESPONSE_FLAG) as u64) << 32,
                    off: (off as usize + cur + HEADER_SIZE) as u32,
                    len: h.payload_len,
                    end: pos + (cur + padded) as u64,
                });
            }
            cur += padded;
        }
        if cur != batch.len() {
            return Err(ProtocolError::BadCount);
        }
        let requests = queue.commit() as u32;
        Ok(Some(Queued {
            requests,
            spent: self.unused_grant - budget,
            others: requests != count,
        }))
    }

    /// Checks a batch's messages: count, lengths within the batch, exact fill (no trailing
    /// bytes), response ids naming pending calls and within their allowance, request
    /// allowances within the credit granted.
    pub(super) fn validate(&self, batch: &[u8], count: u32) -> Result<(), ProtocolError> {
        let mut cur = META as usize;
        let mut spent = 0u64;
        for _ in 0..count {
            if cur + HEADER_SIZE > batch.len() {
                return Err(ProtocolError::BadCount);
            }
            let h = MsgHeader::read(batch[cur..cur + HEADER_SIZE].try_into().expect("12"));
            let padded = padded_message_size(h.payload_len as u64) as usize;
            if padded > batch.len() - cur {
                // A length with the rendezvous flag always gets here (rings are at most
                // 2 GiB), so the inline path pays no extra test for it.
                if h.payload_len & RENDEZVOUS_FLAG == 0 {
                    return Err(ProtocolError::BadLength);
                }
                spent += self.validate_rendezvous(&batch[cur..])?;
                if spent > self.unused_grant {
                    return Err(ProtocolError::BadCredit);
                }
                cur += padded_message_size(DESCRIPTOR_SIZE as u64) as usize;
                continue;
            }
            if is_response(h.call_id) {
                match self.pending.get(from_response_id(h.call_id) as usize) {
                    None => return Err(ProtocolError::UnknownCallId(h.call_id)),
                    // The responder only knows the allowance in 32 B units
                    // (`RecvHandle::max_response`): it may fill the padded message.
                    Some(p)
                        if padded_message_size(h.payload_len as u64)
                            > padded_message_size(p.response_allowance as u64) =>
                    {
                        return Err(ProtocolError::ResponseTooLarge);
                    }
                    Some(_) => {}
                }
            } else {
                spent += (h.piggyback & !LARGE_RESPONSE_FLAG) as u64 * ALIGNMENT;
                if spent > self.unused_grant {
                    return Err(ProtocolError::BadCredit);
                }
            }
            cur += padded;
        }
        if cur != batch.len() {
            return Err(ProtocolError::BadCount);
        }
        Ok(())
    }

    /// Checks a rendezvous message (`rest` the batch from its header on, at least the 12
    /// header bytes): room for its descriptor, then [`EndpointCore::check_rendezvous`].
    /// Returns the credit a request spends. The header is read again here, so that
    /// `validate`'s loop need not keep it for this cold call.
    #[cold]
    #[inline(never)]
    fn validate_rendezvous(&self, rest: &[u8]) -> Result<u64, ProtocolError> {
        let h = MsgHeader::read(rest[..HEADER_SIZE].try_into().expect("12"));
        let m = padded_message_size(DESCRIPTOR_SIZE as u64) as usize;
        if m > rest.len() {
            return Err(ProtocolError::BadLength);
        }
        let d = Descriptor::read(
            rest[HEADER_SIZE..HEADER_SIZE + DESCRIPTOR_SIZE]
                .try_into()
                .expect("16"),
        );
        self.check_rendezvous(h, &d)
    }

    /// Checks a rendezvous message's header `h` and descriptor `d` (values the caller read
    /// once): exact length field, length within `(RENDEZVOUS_MIN, large limit]`, and for a
    /// response, a pending call that accepts a rendezvous response of that length. Returns
    /// the credit a request spends.
    #[cold]
    #[inline(never)]
    fn check_rendezvous(&self, h: MsgHeader, d: &Descriptor) -> Result<u64, ProtocolError> {
        if h.payload_len != RENDEZVOUS_FLAG | DESCRIPTOR_SIZE as u32 {
            return Err(ProtocolError::BadDescriptor(
                "length field is not the flag plus 16",
            ));
        }
        if d.len <= RENDEZVOUS_MIN {
            return Err(ProtocolError::BadDescriptor(
                "length not above the rendezvous threshold",
            ));
        }
        if d.len > self.large_max {
            return Err(ProtocolError::BadDescriptor(
                "length above the large-message limit",
            ));
        }
        if is_response(h.call_id) {
            match self.pending.get(from_response_id(h.call_id) as usize) {
                None => Err(ProtocolError::UnknownCallId(h.call_id)),
                Some(p) if !p.large => Err(ProtocolError::BadDescriptor(
                    "rendezvous response to a call that did not accept one",
                )),
                Some(p) if d.len > p.response_allowance => Err(ProtocolError::ResponseTooLarge),
                Some(_) => Ok(0),
            }
        } else {
            Ok((h.piggyback & !LARGE_RESPONSE_FLAG) as u64 * ALIGNMENT)
        }
    }

    /// Queues a validated rendezvous message for its READ. A request spends its credit
    /// now; its ring bytes are released at once (the descriptor is copied). Returns `Err(id)`
    /// for a second response to the same call within one batch.
    #[cold]
    #[inline(never)]
    fn ingest_rendezvous(
        &mut self,
        h: MsgHeader,
        desc: Descriptor,
        stats: &mut Stats,
    ) -> Result<(), u32> {
        let kind = if is_response(h.call_id) {
            match self
                .pending
                .try_remove(from_response_id(h.call_id) as usize)
            {
                Some(p) => RdvKind::Response { user: p.user },
                None => return Err(h.call_id),
            }
        } else {
            let allowance = (h.piggyback & !LARGE_RESPONSE_FLAG) as u64 * ALIGNMENT;
            self.unused_grant -= allowance;
            stats.requests += 1;
            RdvKind::Request {
                call_id: h.call_id,
                allowance,
                large_resp: h.piggyback & LARGE_RESPONSE_FLAG != 0,
            }
        };
        self.rdv.push_back(Rdv {
            desc,
            kind,
            slot: u32::MAX,
        });
        self.flags |= F_RDV;
        Ok(())
    }

    /// The peer reported `n` more of our rendezvous messages read (checked against
    /// `tx_outstanding` by `ingest`): their buffers are free again.
    #[cold]
    fn reads_reported(&mut self, n: u32) {
        for _ in 0..n {
            if let Some(s) = self.tx_outstanding.pop_front() {
                self.tx_free.push(s);
            }
        }
    }

    /// Moves the released position (the space the peer may reuse); the consumer word is
    /// stored at the next [`EndpointCore::publish`].
    #[inline(always)]
    fn release_to(&mut self, pos: u64) {
        if pos > self.released {
            self.released = pos;
            self.flags |= F_UNPUBLISHED;
        }
    }

    /// [`EndpointCore::release_to`] then [`EndpointCore::publish`], without setting the
    /// unpublished flag only to test and clear it: stores the consumer word if `pos` moves
    /// the released position or an earlier release is still unpublished.
    #[inline(always)]
    fn release_and_publish(&mut self, pos: u64) {
        if pos > self.released {
            self.released = pos;
        } else if !self.has(F_UNPUBLISHED) {
            return;
        }
        self.flags &= !F_UNPUBLISHED;
        // SAFETY: as in `publish`: `consumer_word` is 16 bytes, page aligned; peers only
        // read it.
        let w = unsafe { &*(self.consumer_word.as_ptr() as *const AtomicU64) };
        w.store(self.released.to_le(), Ordering::Release);
    }

    /// A queued request of this endpoint was handed to the application.
    #[inline(always)]
    pub(crate) fn received(&mut self, e: &RecvEntry) {
        self.unreceived -= 1;
        let pos = if self.unreceived == 0 {
            self.last_recv_pos
        } else {
            e.end
        };
        self.release_to(pos);
    }

    /// Payload of a queued request.
    ///
    /// # Safety
    /// `e` came from this endpoint's `EndpointCore::ingest` and was not released (received)
    /// before the last flush.
    #[inline(always)]
    pub(crate) unsafe fn request_bytes(&self, e: &RecvEntry) -> &[u8] {
        // SAFETY: the caller upholds this function's contract (# Safety above), which is the callee's.
        unsafe { self.recv.request(e) }
    }

    /// Fails the endpoint: every pending call gets `Err(why)` through `on_response`.
    /// Idempotent.
    #[cold]
    pub(crate) fn fail(
        &mut self,
        why: EndpointFailure,
        on_response: &mut impl FnMut(U, Result<&[u8], EndpointFailure>),
    ) {
        if !matches!(self.state, EndpointState::Failed(_)) {
            self.state = EndpointState::Failed(why);
        }
        self.emits.clear();
        self.flags &= !(F_BATCH_OPEN | F_RDV | F_READ_DONE | F_LENT);
        self.backlog.clear();
        for p in self.pending.drain() {
            on_response(p.user, Err(why));
        }
        for r in self.rdv.drain(..) {
            if let RdvKind::Response { user } = r.kind {
                on_response(user, Err(why));
            }
        }
        self.rdv_posted = 0;
        self.tx_outstanding.clear();
        self.tx_free.clear();
        self.reads_unreported = 0;
    }

    /// Part of `R` granted to the peer and not yet spent by its calls, in bytes.
    pub fn unused_grant(&self) -> u64 {
        self.unused_grant
    }

    /// Test hook: delivers the `count` messages of the `delta` bytes at the receive
    /// position as [`EndpointCore::ingest`] does after validation, without validating them:
    /// what delivery sees when the peer rewrites a batch after it was validated.
    #[cfg(test)]
    pub(crate) fn deliver_as_validated(
        &mut self,
        delta: u64,
        count: u32,
        queue: &mut Fifo<RecvEntry>,
        stats: &mut Stats,
        on_response: &mut impl FnMut(U, Result<&[u8], EndpointFailure>),
    ) -> Result<Option<u32>, ProtocolError> {
        let pos = self.recv_producer;
        let off = pos & self.recv_mask;
        assert!(off + delta <= self.recv_mask + 1);
        // SAFETY: inside the receive ring (asserted); single-threaded test.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.recv.buf.as_ptr().add(off as usize), delta as usize)
        };
        let b = Batch {
            bytes,
            off,
            pos,
            count,
        };
        self.deliver::<false>(&b, 0, queue, stats, on_response)
    }

    /// Receive position: where the next batch from the peer lands (virtual).
    #[cfg(test)]
    pub(crate) fn recv_position(&self) -> u64 {
        self.recv_producer
    }

    /// Virtual positions: (send producer, known peer consumer, receive released, receive
    /// position last reported to the peer).
    pub fn positions(&self) -> (u64, u64, u64, u64) {
        (
            self.producer,
            self.remote_consumer,
            self.released,
            self.last_notified,
        )
    }
}

/// Bytes announced by a receive CQE's immediate.
#[inline(always)]
pub(crate) fn cqe_delta(imm: u32) -> u64 {
    decode_imm(imm)
}

/// `Err(e)`, out of line: the error exit of a check on the receive fast path, so that the
/// compiler does not set up the error value ahead of the check.
#[cold]
#[inline(never)]
fn reject<T>(e: ProtocolError) -> Result<T, ProtocolError> {
    Err(e)
}

/// The large-message limit an endpoint with inline limit `max_payload` uses when both sides
/// allow `limit` bytes ([`EndpointCore::set_large_limit`]): `limit`, or 0 if rendezvous is
/// pointless (`limit <= max_payload`) or impossible (`max_payload <` [`RENDEZVOUS_MIN`]).
pub fn large_limit_for(max_payload: u32, limit: u32) -> u32 {
    if max_payload >= RENDEZVOUS_MIN && limit > max_payload {
        limit
    } else {
        0
    }
}

/// Credit, in bytes, one call with a response of up to `max_response` bytes reserves on an
/// endpoint with inline limit `max_payload`, capacity `cap` and large-message limit `large`
/// (as [`large_limit_for`] gives it): the whole response's [`internal_allowance`], or the
/// [`EndpointCore::large_call_credit`] of a call accepting a rendezvous response.
pub fn call_credit_for(cap: u64, max_payload: u32, large: u32, max_response: u64) -> u64 {
    let inline_limit = if large != 0 {
        max_payload
    } else {
        max_response_allowance_for(cap)
    };
    if large != 0 && max_response > inline_limit as u64 {
        internal_allowance(LARGE_INLINE_RESPONSE.min(max_payload) as u64)
    } else {
        internal_allowance(max_response)
    }
}

/// [`EndpointCore::max_response_allowance`] for capacity `cap`: `C / 2 - 32 - 12` bytes.
fn max_response_allowance_for(cap: u64) -> u32 {
    let m = cap / 2 - META - HEADER_SIZE as u64;
    m.min(u32::MAX as u64) as u32
}

/// [`EndpointCore::max_payload`] for capacity `cap` and a sender granting at most
/// `max_resp_reservation` bytes: `((C / 2 - max_R - 32) & !31) - 12` bytes.
pub fn max_payload_for(cap: u64, max_resp_reservation: u64) -> u32 {
    let m = (cap / 2).saturating_sub(max_resp_reservation.saturating_add(META)) & !(ALIGNMENT - 1);
    let m = m.saturating_sub(HEADER_SIZE as u64);
    m.min(u32::MAX as u64) as u32
}

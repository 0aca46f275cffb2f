//! The copyrpc context: one PD, one SRQ of zero-length receive WQEs shared by every endpoint,
//! a send CQ and a receive CQ, and the endpoints (one RC QP each) found by QPN through a
//! [`FastMap`] (seeds/001 "Context", seeds/004 §3.1). This is the I/O half; the protocol
//! itself is in [`super::endpoint`].
//!
//! [`Context::poll`] runs the seed's steps in order (seeds/004 §3.7): receive CQ (each CQE is
//! one batch: `EndpointCore::ingest`), SRQ refill below 2/3, send CQ (retire, consumer
//! READ results, raw RDMA completions, error CQEs), then flush every endpoint that has
//! something to send: each batch becomes one RDMA WRITE+IMM, fully inline up to 220 B, else
//! a 204 B inline head plus one SGE into the send ring; one doorbell per endpoint per poll.
//!
//! Large messages (issue 15): [`Context::call_with`] and [`Context::reply_with`] make one
//! size check more than the inline path needs; beyond the inline limits the message is
//! encoded into a per-endpoint registered buffer ([`EndpointConfig::max_large_message`]
//! bytes, at most [`EndpointConfig::large_buffers`] per direction, registered when first
//! needed) and sent as a rendezvous descriptor. A received descriptor is checked by the
//! core, then the flush posts an RDMA READ of it into a landing buffer (waiting, if none
//! is free, for one to be released); its completion delivers the message (a response to
//! `on_response`, a request to [`Context::recv`], lent until the next poll or
//! [`Context::release_large`]) and is reported to the peer with the next batch. A
//! failed READ is an error completion: the endpoint fails (the RC QP is in error anyway).

use std::collections::VecDeque;

use mlx5::cq::CqeRef;
use mlx5::cqe::Cqe;
use mlx5::fastmap::FastMap;
use mlx5::verbs::{Access, Cq, Mr, Pd, Qp, RcParams, RcRemote, Srq};
use mlx5::wqe::{CQ_UPDATE, Opcode, RaddrSeg, Sge, WqeDesc};

use super::encoding::{
    DESCRIPTOR_SIZE, Descriptor, FLOW_METADATA_SIZE, LARGE_RESPONSE_FLAG, RENDEZVOUS_FLAG,
    RENDEZVOUS_MIN, RESPONSE_FLAG, internal_allowance, padded_message_size,
};
use super::endpoint::{
    ENTRY_LARGE_RESP, Emit, EndpointCore, EndpointState, RdvKind, RecvEntry, Refusal, Ring,
    cqe_delta,
};
use super::error::{
    CallError, CallErrorKind, EndpointFailure, ProtocolError, ReplyError, SetupError,
};
use super::info::EndpointInfo;
use super::stats::Stats;
use crate::fifo::Fifo;
use crate::rc::queues::{rc_qp_on_srq, refill_srq, zero_length_srq};

/// A signaled WQE is posted at least every this many WQEs (seeds/001 `SIGNAL_INTERVAL`), and
/// also whenever a quarter of the send queue's WQEBBs went by unsignaled (an inline WQE
/// takes up to 4 WQEBBs, so 64 of them would fill the seed's 256-entry queue).
pub const SIGNAL_INTERVAL: u32 = 64;
/// Largest batch sent fully inline, in bytes (seeds/004 §3.5).
pub const MAX_FULL_INLINE: u32 = 220;
/// Inline head of a larger batch, in bytes (seeds/004 §3.5): the rest goes by one SGE.
pub const INLINE_HEAD: u32 = 204;
/// Default [`EndpointConfig::max_large_message`]: 8 MiB.
pub const DEFAULT_MAX_LARGE_MESSAGE: u32 = 8 << 20;
/// Default [`EndpointConfig::large_buffers`].
pub const DEFAULT_LARGE_BUFFERS: u32 = 64;

/// Context sizing (seeds/001 定数一覧).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextConfig {
    /// SRQ receive WQEs (zero-length; one per batch in flight towards this context).
    pub srq_size: u32,
    /// Entries of each CQ.
    pub cq_size: u32,
    /// Send WQEs per endpoint QP.
    pub max_send_wr: u32,
    /// Receive CQEs handled per [`Context::poll`] at most.
    pub poll_budget: u32,
    /// RC connection parameters (retry counts, timeout, MTU).
    pub rc: RcParams,
}

impl Default for ContextConfig {
    fn default() -> Self {
        ContextConfig {
            srq_size: 1024,
            cq_size: 4096,
            max_send_wr: 256,
            poll_budget: 256,
            rc: RcParams {
                max_rd_atomic: 4,
                access: Access::REMOTE_WRITE | Access::REMOTE_READ,
                ..RcParams::default()
            },
        }
    }
}

/// Endpoint sizing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Send and receive ring size in bytes (power of two, `>= 1 KiB`; seeds/001 default 1 MiB).
    pub ring_size: usize,
    /// Most response credit granted to the peer, in bytes (`None`: `ring_size / 4`).
    pub max_resp_reservation: Option<u64>,
    /// Schema fingerprint of the service carried (0 for untyped use); [`Context::connect`]
    /// refuses a peer announcing a different one.
    pub fingerprint: u64,
    /// Largest message, in bytes, sent or received by rendezvous (issue 15: a message
    /// beyond the ring's inline limit, [`EndpointCore::max_payload`], travels as a
    /// descriptor and is RDMA-READ by the receiver). Announced in [`EndpointInfo`]; the
    /// connection uses the smaller of both sides' values. Each large-message buffer is this
    /// size. 0 disables large messages. Default [`DEFAULT_MAX_LARGE_MESSAGE`] (8 MiB).
    pub max_large_message: u32,
    /// Most large-message buffers per direction per endpoint (send: a message waiting for
    /// the peer to read it; receive: the landing buffer of a READ, until delivered), each
    /// registered once when first needed and reused. Default [`DEFAULT_LARGE_BUFFERS`]: a
    /// caller accepting large responses reserves 4 KiB of credit per call, so a peer with
    /// the default 1 MiB ring can have at most 64 such calls waiting for replies.
    pub large_buffers: u32,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            ring_size: 1 << 20,
            max_resp_reservation: None,
            fingerprint: 0,
            max_large_message: DEFAULT_MAX_LARGE_MESSAGE,
            large_buffers: DEFAULT_LARGE_BUFFERS,
        }
    }
}

/// Identifies an endpoint of a [`Context`] (its index).
pub type EndpointId = u32;

/// What a signaled WQE was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signaled {
    /// A WRITE+IMM signaled to retire the send queue.
    Write,
    /// RDMA READ of the peer's consumer position.
    ConsumerRead,
    /// A raw RDMA operation (seeds/004 §3.9).
    Raw,
    /// The RDMA READ of a rendezvous message (issue 15): the first posted entry of
    /// `EndpointCore::rdv`.
    LargeRead,
}

/// One large-message buffer: registered once, reused. Field order is drop order: the
/// registration before the memory.
struct LargeBuf {
    mr: Mr,
    buf: mlx5::mem::DmaBuf,
}

/// The large-message buffers of one endpoint and direction (issue 15), allocated and
/// registered when first needed, at most `cap` of them, each `size` bytes.
struct Pool {
    bufs: Vec<LargeBuf>,
    /// Free buffers (receive pool only; the send pool's free list is the core's `tx_free`,
    /// which the peer's read reports refill).
    free: Vec<u32>,
    size: u32,
    cap: u32,
    access: Access,
}

impl Pool {
    fn new(size: u32, cap: u32, access: Access) -> Pool {
        Pool {
            bufs: Vec::new(),
            free: Vec::new(),
            size,
            cap,
            access,
        }
    }

    /// Registers one more buffer if below the cap; returns its index.
    #[cold]
    fn grow(&mut self, device: &mlx5::verbs::Context, pd: &Pd, stats: &mut Stats) -> Option<u32> {
        if self.bufs.len() as u32 >= self.cap || self.size == 0 {
            return None;
        }
        let r = mlx5::mem::DmaBuf::new(self.size as usize).and_then(|buf| {
            // SAFETY: `buf` moves into the `LargeBuf` with its registration (MR dropped first).
            let mr =
                unsafe { device.reg_mr(pd, buf.as_mut_ptr(), self.size as usize, self.access)? };
            Ok(LargeBuf { mr, buf })
        });
        match r {
            Ok(b) => {
                self.bufs.push(b);
                stats.large_buffers += 1;
                Some(self.bufs.len() as u32 - 1)
            }
            Err(e) => {
                tracing::warn!(error = %e, "copyrpc: cannot allocate a large-message buffer");
                None
            }
        }
    }

    /// The whole buffer `i`, mutably.
    ///
    /// # Safety
    /// No RDMA operation reads or writes buffer `i` while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes_mut(&self, i: u32) -> &mut [u8] {
        let b = &self.bufs[i as usize];
        // SAFETY: every buffer holds `size` bytes, and no RDMA operation touches it while the
        // slice lives (the contract above).
        unsafe { std::slice::from_raw_parts_mut(b.buf.as_mut_ptr(), self.size as usize) }
    }

    /// The first `len` bytes of buffer `i`.
    ///
    /// # Safety
    /// `len <= size`; nothing writes buffer `i` while the slice lives.
    unsafe fn bytes(&self, i: u32, len: usize) -> &[u8] {
        let b = &self.bufs[i as usize];
        // SAFETY: `len <= size` and nothing writes the buffer while the slice lives (the
        // contract above).
        unsafe { std::slice::from_raw_parts(b.buf.as_ptr(), len) }
    }

    /// Drops every buffer (deregistered first; a failed endpoint's).
    fn clear(&mut self) {
        self.bufs.clear();
        self.free.clear();
    }
}

/// The peer's addresses, known after connect.
#[derive(Clone, Copy, Debug, Default)]
struct Remote {
    ring_addr: u64,
    ring_rkey: u32,
    consumer_addr: u64,
    consumer_rkey: u32,
}

/// One endpoint: protocol core plus its QP and registrations. Field order is drop order: the
/// QP and MRs before the rings they cover.
struct Conn<U> {
    qp: Qp,
    send_mr: Mr,
    recv_mr: Mr,
    word_mr: Mr,
    /// Large-message send buffers (REMOTE_READ; issue 15).
    tx_pool: Pool,
    /// Large-message landing buffers of our READs (LOCAL_WRITE).
    rx_pool: Pool,
    /// Landing buffers whose request bytes `recv` lent out; freed at this endpoint's next
    /// flush (every poll) or by [`Context::release_large`].
    lent: Vec<u32>,
    core: EndpointCore<U>,
    remote: Remote,
    fingerprint: u64,
    /// WQEs posted since the last signaled one.
    unsignaled: u32,
    /// Send queue producer counter (WQEBBs) after the last signaled WQE.
    last_signal_pi: u32,
    /// `wqe_cnt / 4 - 4` of the send queue (WQEBBs, negative for a queue below 16): a WQE
    /// posted more than this many WQEBBs after `last_signal_pi` is signaled, so that with
    /// its own (at most 4) WQEBBs at most a quarter of the queue goes unsignaled.
    signal_gap: i32,
    /// Largest batch posted fully inline: the QP's inline limit, at most
    /// [`MAX_FULL_INLINE`].
    full_inline: u32,
    signaled: VecDeque<(u16, Signaled)>,
    read_outstanding: bool,
    in_dirty: bool,
    /// Requests handed out by `recv` and not yet answered: `(call_id, seq)`, keyed by the
    /// handle's slot; a reply must name a live entry, so a handle answers exactly once.
    answering: Answering,
    /// Requests handed out so far (the `seq` of the next one, wrapping).
    recv_seq: u32,
}

/// The requests handed out by [`Context::recv`] and not yet answered, by slot: a slab of
/// `call_id << 32 | seq` words whose free slots form a list (one word each:
/// [`Answering::FREE`] plus the next free slot). A request's call id never has
/// [`RESPONSE_FLAG`] (bit 31) set, so a live word never has bit 63 set, and a free one always.
struct Answering {
    slots: Vec<u64>,
    /// First free slot; `slots.len()` if none.
    free: u32,
}

impl Answering {
    /// Tag of a free slot's word.
    const FREE: u64 = 1 << 63;

    fn with_capacity(n: usize) -> Self {
        Answering {
            slots: Vec::with_capacity(n),
            free: 0,
        }
    }

    /// Records request `(call_id, seq)`; returns its slot.
    #[inline(always)]
    fn insert(&mut self, call_id: u32, seq: u32) -> u32 {
        debug_assert!(call_id & RESPONSE_FLAG == 0);
        let word = (call_id as u64) << 32 | seq as u64;
        let i = self.free;
        match self.slots.get_mut(i as usize) {
            Some(w) => {
                debug_assert!(*w & Self::FREE != 0);
                self.free = *w as u32;
                *w = word;
            }
            None => {
                self.slots.push(word);
                self.free = self.slots.len() as u32;
            }
        }
        i
    }

    /// Removes request `(call_id, seq)` from `slot` if it is the one recorded there (a live
    /// entry: a free slot's word has bit 63 set, which `call_id` must not have); returns
    /// whether it was.
    #[inline(always)]
    fn take(&mut self, slot: u32, call_id: u32, seq: u32) -> bool {
        let word = (call_id as u64) << 32 | seq as u64;
        match self.slots.get_mut(slot as usize) {
            Some(w) if *w == word && word & Self::FREE == 0 => {
                *w = Self::FREE | self.free as u64;
                self.free = slot;
                true
            }
            _ => false,
        }
    }

    /// Undoes the [`Answering::take`] of `(call_id, seq)` from `slot` that just succeeded
    /// (nothing was inserted or taken since, so `slot` heads the free list): the request is
    /// live again, under the same handle.
    #[cold]
    fn untake(&mut self, slot: u32, call_id: u32, seq: u32) {
        debug_assert_eq!(self.free, slot);
        let w = &mut self.slots[slot as usize];
        self.free = *w as u32;
        *w = (call_id as u64) << 32 | seq as u64;
    }
}

/// A request received by [`Context::recv`]; answer it with [`Context::reply`] at any time,
/// in any order (seeds/001 "レスポンスはOut-of-Order"), exactly once: a second reply with
/// the same handle (it is `Copy`) is refused with [`ReplyError::Stale`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvHandle {
    /// Endpoint it arrived on.
    pub ep: EndpointId,
    /// The caller's call id.
    pub call_id: u32,
    /// Credit the caller reserved for the response, in bytes.
    pub allowance: u64,
    /// Entry in the endpoint's table of unanswered requests.
    slot: u32,
    /// Sequence number of this request on its endpoint (31 bits, tells a reused slot
    /// apart), with [`HANDLE_LARGE`] set if the caller accepts a rendezvous response (kept
    /// in this field so that the handle stays 24 bytes).
    seq: u32,
}

/// Bit of [`RecvHandle`]'s sequence number: the caller accepts a rendezvous response.
const HANDLE_LARGE: u32 = 1 << 31;

impl RecvHandle {
    /// Largest response payload this request's allowance covers inline, in bytes. If the
    /// caller accepts a rendezvous response ([`RecvHandle::accepts_large`]), responses up to
    /// the connection's large-message limit are accepted too ([`Context::max_response`]).
    pub fn max_response(&self) -> usize {
        (self.allowance.saturating_sub(
            super::encoding::FLOW_METADATA_SIZE + super::encoding::HEADER_SIZE as u64,
        )) as usize
    }

    /// Whether the caller accepts a response sent by rendezvous (issue 15): its allowance
    /// exceeded the inline limit.
    pub fn accepts_large(&self) -> bool {
        self.seq & HANDLE_LARGE != 0
    }
}

/// A copyrpc context. `U` is the user data kept with each pending call and handed back with
/// its response.
///
/// Field order is drop order: endpoints (QPs) before the SRQ and CQs they use, everything
/// before the PD and the device.
pub struct Context<U> {
    conns: Vec<Conn<U>>,
    by_qpn: FastMap<EndpointId>,
    /// Endpoints to visit at the next flush; [`Context::flush_all`] compacts it in place
    /// (keeping those that stay dirty), so it is not reallocated once warm.
    dirty: Vec<EndpointId>,
    recv_queue: Fifo<RecvEntry>,
    /// `refill_srq`'s threshold, 2/3 of the SRQ's capacity, computed once: a poll that
    /// received something and finds at least this many WQEs posted skips the refill.
    srq_low: u32,
    /// Landing buffers lent out by `recv` since the last [`Context::release_large`] (a
    /// hint: the flush of their endpoint may have freed them already).
    lent: u32,
    srq: Srq,
    send_cq: Cq,
    recv_cq: Cq,
    pd: Pd,
    device: mlx5::verbs::Context,
    cfg: ContextConfig,
    stats: Stats,
}

impl<U> std::fmt::Debug for Context<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.device)
            .field("endpoints", &self.conns.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<U> Context<U> {
    /// Builds a context on an open device (seeds/004 §3.8 `Context::build`): PD, CQs, the SRQ
    /// with every WQE posted.
    ///
    /// # Errors
    /// [`SetupError::Device`] if the device refuses an object.
    pub fn new(device: &mlx5::verbs::Context, cfg: ContextConfig) -> Result<Self, SetupError> {
        let pd = device.alloc_pd()?;
        let send_cq = device.create_cq(cfg.cq_size)?;
        let recv_cq = device.create_cq(cfg.cq_size)?;
        let srq = zero_length_srq(device, &pd, cfg.srq_size)?;
        let srq_low = srq.srq.capacity() * 2 / 3;
        Ok(Context {
            conns: Vec::new(),
            by_qpn: FastMap::new(),
            dirty: Vec::with_capacity(16),
            recv_queue: Fifo::with_capacity(1024),
            srq_low,
            lent: 0,
            srq,
            send_cq,
            recv_cq,
            pd,
            device: device.clone(),
            cfg,
            stats: Stats::default(),
        })
    }

    /// The device this context runs on.
    pub fn device(&self) -> &mlx5::verbs::Context {
        &self.device
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Number of endpoints created.
    pub fn num_endpoints(&self) -> usize {
        self.conns.len()
    }

    /// Creates an endpoint: rings, their registrations (send ring: no remote access; receive
    /// ring: LOCAL_WRITE | REMOTE_WRITE; consumer word: LOCAL_WRITE | REMOTE_READ) and an RC
    /// QP on the shared SRQ and CQs, registered by QPN (seeds/004 §3.8 `create_endpoint`).
    ///
    /// # Errors
    /// [`SetupError::Device`] (bad ring size, registration or QP creation failed).
    pub fn create_endpoint(&mut self, cfg: &EndpointConfig) -> Result<EndpointId, SetupError> {
        let max_resp = cfg.max_resp_reservation.unwrap_or(cfg.ring_size as u64 / 4);
        let core = EndpointCore::new(cfg.ring_size, cfg.ring_size, max_resp)?;
        // SAFETY: each buffer is a ring of `core`, which the endpoint owns together with the
        // registrations; the endpoint drops its QP and MRs before `core` (field order).
        let reg = |buf: &mlx5::mem::DmaBuf, len: usize, access| unsafe {
            self.device.reg_mr(&self.pd, buf.as_mut_ptr(), len, access)
        };
        let send_mr = reg(&core.send.buf, cfg.ring_size, Access::empty())?;
        let recv_mr = reg(
            &core.recv.buf,
            cfg.ring_size,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )?;
        let word_mr = reg(
            &core.consumer_word,
            16,
            Access::LOCAL_WRITE | Access::REMOTE_READ,
        )?;
        let qp = rc_qp_on_srq(
            &self.device,
            &self.pd,
            &self.send_cq,
            &self.recv_cq,
            &self.srq,
            self.cfg.max_send_wr,
            MAX_FULL_INLINE,
        )?;
        let id = self.conns.len() as EndpointId;
        self.by_qpn.insert(qp.qpn(), id)?;
        let full_inline = qp.sq.mem().max_inline().min(MAX_FULL_INLINE);
        let signal_gap = (qp.sq.wqe_cnt() / 4) as i32 - 4;
        self.conns.push(Conn {
            qp,
            send_mr,
            recv_mr,
            word_mr,
            tx_pool: Pool::new(
                cfg.max_large_message,
                cfg.large_buffers,
                Access::LOCAL_WRITE | Access::REMOTE_READ,
            ),
            rx_pool: Pool::new(
                cfg.max_large_message,
                cfg.large_buffers,
                Access::LOCAL_WRITE,
            ),
            lent: Vec::new(),
            core,
            remote: Remote::default(),
            fingerprint: cfg.fingerprint,
            unsignaled: 0,
            last_signal_pi: 0,
            signal_gap,
            full_inline,
            signaled: VecDeque::with_capacity(8),
            read_outstanding: false,
            in_dirty: false,
            answering: Answering::with_capacity(64),
            recv_seq: 0,
        });
        Ok(id)
    }

    /// What the peer needs to connect to endpoint `ep` (exchange it out of band: in-process
    /// channel, MPI). `None` for an unknown endpoint.
    pub fn local_info(&self, ep: EndpointId) -> Option<EndpointInfo> {
        let c = self.conns.get(ep as usize)?;
        let port = self.device.port();
        Some(EndpointInfo {
            qpn: c.qp.qpn(),
            lid: port.lid,
            gid: port.gid,
            psn: self.cfg.rc.psn,
            recv_ring_addr: c.recv_mr.addr,
            recv_ring_rkey: c.recv_mr.rkey,
            recv_ring_size: c.core.recv_size(),
            consumer_addr: c.word_mr.addr,
            consumer_rkey: c.word_mr.rkey,
            initial_credit: c.core.initial_credit(),
            fingerprint: c.fingerprint,
            max_large_message: c.tx_pool.size,
        })
    }

    /// Connects endpoint `ep` to the peer described by `remote` (seeds/004 §3.8
    /// `connect_ex`): checks the fingerprint and ring parameters, moves the QP to RTS, sets
    /// the initial credits. No handshake message is needed.
    ///
    /// # Errors
    /// [`SetupError::SchemaMismatch`], [`SetupError::Protocol`] (unusable ring parameters),
    /// [`SetupError::BadEndpoint`] (unknown or already connected), [`SetupError::Device`].
    pub fn connect(&mut self, ep: EndpointId, remote: &EndpointInfo) -> Result<(), SetupError> {
        let c = self
            .conns
            .get_mut(ep as usize)
            .filter(|c| c.core.state() == EndpointState::Init)
            .ok_or(SetupError::BadEndpoint(ep))?;
        if remote.fingerprint != c.fingerprint {
            return Err(SetupError::SchemaMismatch {
                ours: c.fingerprint,
                theirs: remote.fingerprint,
            });
        }
        c.core
            .check_remote(remote.recv_ring_size, remote.initial_credit)?;
        c.qp.connect_rc(
            &RcRemote {
                qpn: remote.qpn,
                lid: remote.lid,
                gid: remote.gid,
                psn: remote.psn,
            },
            &self.cfg.rc,
        )?;
        c.core
            .connect(remote.recv_ring_size, remote.initial_credit)?;
        c.core
            .set_large_limit(c.tx_pool.size.min(remote.max_large_message));
        c.remote = Remote {
            ring_addr: remote.recv_ring_addr,
            ring_rkey: remote.recv_ring_rkey,
            consumer_addr: remote.consumer_addr,
            consumer_rkey: remote.consumer_rkey,
        };
        Ok(())
    }

    /// State of endpoint `ep` (`None` if unknown).
    pub fn endpoint_state(&self, ep: EndpointId) -> Option<EndpointState> {
        self.conns.get(ep as usize).map(|c| c.core.state())
    }

    /// The protocol core of endpoint `ep` (credits, positions; read-only).
    pub fn endpoint(&self, ep: EndpointId) -> Option<&EndpointCore<U>> {
        self.conns.get(ep as usize).map(|c| &c.core)
    }

    /// Marks `ep` for the next flush if it has anything to do.
    #[inline(always)]
    fn touch(dirty: &mut Vec<EndpointId>, c: &mut Conn<U>, ep: EndpointId) {
        if !c.in_dirty && c.core.wants_flush() {
            c.in_dirty = true;
            dirty.push(ep);
        }
    }

    /// Writes a request of `payload` to endpoint `ep`, reserving credit for a response of up
    /// to `response_allowance` bytes; `user` comes back with the response. Sent by the next
    /// [`Context::poll`]. Returns the call id.
    ///
    /// # Errors
    /// See [`CallError`]; `user` is handed back. An unknown `ep` gives `NotConnected`.
    #[inline]
    pub fn call(
        &mut self,
        ep: EndpointId,
        payload: &[u8],
        user: U,
        response_allowance: u32,
    ) -> Result<u32, CallError<U>> {
        let len = payload.len().min(u32::MAX as usize) as u32;
        self.call_with(ep, len, user, response_allowance, |b| {
            b[..payload.len()].copy_from_slice(payload);
            payload.len()
        })
    }

    /// [`Context::call`] with the payload written in place: `encode` gets `max_len` bytes of
    /// the send ring and returns the length it wrote.
    ///
    /// # Errors
    /// As [`Context::call`].
    #[inline]
    pub fn call_with(
        &mut self,
        ep: EndpointId,
        max_len: u32,
        user: U,
        response_allowance: u32,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, CallError<U>> {
        let Some(c) = self.conns.get_mut(ep as usize) else {
            return Err(CallError::new(CallErrorKind::NotConnected, user));
        };
        // The one check the large-message path adds (issue 15): it replaces the core's
        // `MessageTooLarge` check.
        if max_len > c.core.max_payload() || response_allowance > c.core.inline_response_limit() {
            return self.call_large(ep, max_len, user, response_allowance, encode);
        }
        let r = c.core.call_fit(
            max_len,
            internal_allowance(response_allowance as u64),
            0,
            0,
            response_allowance,
            user,
            encode,
            &mut self.stats,
        );
        Self::touch(&mut self.dirty, c, ep);
        r
    }

    /// A call beyond the inline limits (issue 15): a request larger than
    /// [`EndpointCore::max_payload`] is encoded into a large-message buffer and sent as a
    /// rendezvous descriptor (or copied inline if it turned out small: up to
    /// [`RENDEZVOUS_MIN`] bytes always, up to `max_payload` if the ring has room now); a
    /// response allowance above [`EndpointCore::inline_response_limit`] reserves
    /// [`EndpointCore::large_call_credit`] and accepts a rendezvous response.
    #[cold]
    #[inline(never)]
    fn call_large(
        &mut self,
        ep: EndpointId,
        max_len: u32,
        user: U,
        response_allowance: u32,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, CallError<U>> {
        let Context {
            conns,
            dirty,
            stats,
            device,
            pd,
            ..
        } = self;
        let c = &mut conns[ep as usize];
        let r = Self::call_large_on(
            c,
            device,
            pd,
            stats,
            max_len,
            user,
            response_allowance,
            encode,
        );
        Self::touch(dirty, c, ep);
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn call_large_on(
        c: &mut Conn<U>,
        device: &mlx5::verbs::Context,
        pd: &Pd,
        stats: &mut Stats,
        max_len: u32,
        user: U,
        ra: u32,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, CallError<U>> {
        let core = &mut c.core;
        if core.state() != EndpointState::Connected {
            return Err(core.not_usable(user));
        }
        let large = core.large_limit();
        let (credit, piggy) = if ra > core.inline_response_limit() {
            if large == 0 || ra > large {
                return Err(CallError::new(CallErrorKind::MessageTooLarge, user));
            }
            (core.large_call_credit(), LARGE_RESPONSE_FLAG)
        } else {
            (internal_allowance(ra as u64), 0)
        };
        if max_len <= core.max_payload() {
            return core.call_fit(max_len, credit, piggy, 0, ra, user, encode, stats);
        }
        if max_len > large {
            return Err(CallError::new(CallErrorKind::MessageTooLarge, user));
        }
        // Room for the smallest message this can become: up to RENDEZVOUS_MIN bytes inline,
        // else at least a descriptor.
        let least = padded_message_size(max_len.min(RENDEZVOUS_MIN) as u64);
        if let Err(r) = core.admit_large(credit, least, stats) {
            return Err(match r {
                Refusal::Credit => CallError::new(CallErrorKind::InsufficientCredit, user),
                Refusal::Ring => CallError::new(CallErrorKind::RingFull, user),
            });
        }
        let slot = match core.tx_free.pop() {
            Some(s) => s,
            None => match c.tx_pool.grow(device, pd, stats) {
                Some(s) => s,
                None => {
                    stats.large_buffers_busy += 1;
                    return Err(CallError::new(CallErrorKind::RingFull, user));
                }
            },
        };
        // SAFETY: a free send buffer: no descriptor of ours names it any more.
        let buf = unsafe { c.tx_pool.bytes_mut(slot) };
        let n = encode(&mut buf[..max_len as usize]).min(max_len as usize) as u32;
        let core = &mut c.core;
        if n <= RENDEZVOUS_MIN
            || (n <= core.max_payload() && core.fits(padded_message_size(n as u64)))
        {
            core.tx_free.push(slot);
            let src = &buf[..n as usize];
            return core.call_fit(
                n,
                credit,
                piggy,
                0,
                ra,
                user,
                |b| {
                    b[..src.len()].copy_from_slice(src);
                    src.len()
                },
                stats,
            );
        }
        let b = &c.tx_pool.bufs[slot as usize];
        let desc = Descriptor {
            addr: b.mr.addr,
            rkey: b.mr.rkey,
            len: n,
        };
        let r = core.call_fit(
            DESCRIPTOR_SIZE as u32,
            credit,
            piggy,
            RENDEZVOUS_FLAG,
            ra,
            user,
            |b| {
                desc.write(b);
                DESCRIPTOR_SIZE
            },
            stats,
        );
        match r {
            Ok(_) => {
                core.tx_outstanding.push_back(slot);
                stats.rendezvous_sent += 1;
            }
            Err(_) => core.tx_free.push(slot),
        }
        r
    }

    /// The next received request, in arrival order, with its payload (valid until the next
    /// call on the context). Requests of failed endpoints are skipped. A request sent by
    /// rendezvous (issue 15) counts as arrived when its RDMA READ completes, so inline
    /// requests sent after it may come first; responses may likewise overtake each other.
    #[inline]
    pub fn recv(&mut self) -> Option<(RecvHandle, &[u8])> {
        let Context {
            conns,
            dirty,
            recv_queue,
            lent,
            ..
        } = self;
        let e = loop {
            let e = recv_queue.pop_front()?;
            let c = &mut conns[e.ep as usize];
            if e.end != 0 {
                c.core.received(&e);
            }
            Self::touch(dirty, c, e.ep);
            if c.core.state() == EndpointState::Connected {
                break e;
            }
        };
        // Looked up once more, and no more (the returned bytes borrow it).
        // SAFETY: `e.ep` indexed `conns` in the loop above (a bounds-checked index), and no
        // endpoint was added or removed since.
        let c = unsafe { conns.get_unchecked_mut(e.ep as usize) };
        let seq = c.recv_seq & !HANDLE_LARGE | (e.allowance >> 32) as u32 & HANDLE_LARGE;
        c.recv_seq = c.recv_seq.wrapping_add(1);
        let slot = c.answering.insert(e.call_id, seq);
        let h = RecvHandle {
            ep: e.ep,
            call_id: e.call_id,
            allowance: e.allowance & !ENTRY_LARGE_RESP,
            slot,
            seq,
        };
        if e.end == 0 {
            // A request read by rendezvous: lent until the endpoint's next flush or
            // `release_large`.
            c.lent.push(e.off);
            c.core.set_lent();
            Self::touch(dirty, c, e.ep);
            *lent += 1;
            // SAFETY: the READ into this landing buffer completed; it is not reused before
            // the next `&mut self` call frees it.
            return Some((h, unsafe { c.rx_pool.bytes(e.off, e.len as usize) }));
        }
        // SAFETY: `e` came from this endpoint's ingest; its bytes stay unwritten until the
        // peer learns of the release, which happens at the next flush, after this borrow.
        Some((h, unsafe { c.core.request_bytes(&e) }))
    }

    /// Frees the large-message landing buffers of requests [`Context::recv`] handed out
    /// (the flush of every [`Context::poll`] does it too), so that waiting rendezvous READs
    /// can use them. Costs nothing unless some were lent.
    pub fn release_large(&mut self) {
        if self.lent == 0 {
            return;
        }
        self.lent = 0;
        for c in &mut self.conns {
            if !c.lent.is_empty() {
                c.core.take_lent();
                Self::return_lent(c);
            }
        }
    }

    /// Puts the landing buffers lent by `recv` back in the free list (those of a failed
    /// endpoint are gone with its pool).
    #[cold]
    fn return_lent(c: &mut Conn<U>) {
        if c.core.state() == EndpointState::Connected {
            c.rx_pool.free.append(&mut c.lent);
        }
        c.lent.clear();
    }

    /// Largest response payload request `h` accepts, in bytes: what its allowance covers
    /// inline, or the connection's large-message limit if the caller accepts a rendezvous
    /// response (issue 15). 0 for an unknown endpoint.
    pub fn max_response(&self, h: &RecvHandle) -> usize {
        let large = match self.conns.get(h.ep as usize) {
            Some(c) if h.accepts_large() => c.core.large_limit() as usize,
            Some(_) => 0,
            None => return 0,
        };
        h.max_response().max(large)
    }

    /// Requests parsed and not yet taken by [`Context::recv`].
    pub fn pending_requests(&self) -> usize {
        self.recv_queue.len()
    }

    /// Answers request `h` with `payload`. Never fails for lack of ring space.
    ///
    /// # Errors
    /// [`ReplyError::TooLarge`] if `payload` exceeds [`RecvHandle::max_response`] (nothing
    /// is sent and `h` stays valid: answer it with a reply that fits, e.g. an error status);
    /// [`ReplyError::Failed`] if the endpoint failed or is unknown.
    #[inline]
    pub fn reply(&mut self, h: RecvHandle, payload: &[u8]) -> Result<(), ReplyError> {
        let len = payload.len().min(u32::MAX as usize) as u32;
        self.reply_with(h, len, |b| {
            copy_short(b, payload);
            payload.len()
        })
    }

    /// [`Context::reply`] with the payload written in place (at most `max_len` bytes).
    ///
    /// # Errors
    /// As [`Context::reply`].
    #[inline]
    pub fn reply_with(
        &mut self,
        h: RecvHandle,
        max_len: u32,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), ReplyError> {
        let Context {
            conns,
            dirty,
            stats,
            device,
            pd,
            ..
        } = self;
        let Some(c) = conns.get_mut(h.ep as usize) else {
            return Err(ReplyError::Failed);
        };
        if !c.answering.take(h.slot, h.call_id, h.seq) {
            return Err(stale_reply(stats));
        }
        let r = Self::reply_on(
            &mut c.core,
            &mut c.tx_pool,
            device,
            pd,
            stats,
            h.call_id,
            h.allowance,
            h.accepts_large(),
            max_len,
            |_, b| encode(b),
        );
        if let Err(ReplyError::TooLarge { .. }) = r {
            // Refused before anything was written or any credit moved: the request stays
            // answerable (the caller's usual answer is an error status, which always fits).
            c.answering.untake(h.slot, h.call_id, h.seq);
        }
        Self::touch(dirty, c, h.ep);
        r
    }

    /// [`Context::recv`] and [`Context::reply_with`] in one step, without a copy of the
    /// request or of an inline reply: `handle(request, reply_buf)` reads the next request in
    /// place (in the endpoint's receive ring, or in the landing buffer of a request read by
    /// rendezvous) and writes its reply, returning its length (clamped to `max_len`), straight
    /// into the send ring. `reply_buf` is `max_len` bytes. `None` when no request is
    /// available.
    ///
    /// A reply larger than the request's inline allowance (a caller accepting a rendezvous
    /// response, issue 15) is written into a large-message send buffer and, if it turns out
    /// to fit inline, copied into the ring, as [`Context::reply_with`] does. If the send ring
    /// has no room (only with a peer that broke the protocol), the reply goes to the backlog
    /// and is sent later, as with `reply_with`. The request's ring space is released (the
    /// credit return of seeds/004 §3.4, sent with the next batch) and its landing buffer
    /// freed only after `handle` returned.
    ///
    /// If the reply cannot be written at all (the errors below), `handle` still runs, with
    /// `spare` as its reply buffer, and the reply is dropped: the request is served exactly as
    /// with `recv` followed by a failing `reply_with`.
    ///
    /// # Errors
    /// As [`Context::reply_with`] (never [`ReplyError::Stale`]).
    #[inline]
    pub fn serve_next(
        &mut self,
        max_len: u32,
        spare: &mut [u8],
        handle: impl FnOnce(&[u8], &mut [u8]) -> usize,
    ) -> Option<Result<(), ReplyError>> {
        self.serve_next_sized(|_| max_len, spare, handle)
    }

    /// [`Context::serve_next`] with the reply buffer's size chosen per request:
    /// `max_len(request)` is called with the request's bytes before `handle`, and the reply
    /// buffer is that many bytes (the typed server sizes it by the request's method, which
    /// is what the caller's allowance covers).
    ///
    /// # Errors
    /// As [`Context::serve_next`].
    #[inline]
    pub fn serve_next_sized(
        &mut self,
        max_len: impl FnOnce(&[u8]) -> u32,
        spare: &mut [u8],
        handle: impl FnOnce(&[u8], &mut [u8]) -> usize,
    ) -> Option<Result<(), ReplyError>> {
        let e = loop {
            let e = self.recv_queue.pop_front()?;
            let c = &mut self.conns[e.ep as usize];
            if c.core.state() == EndpointState::Connected {
                break e;
            }
            // Skipped as `recv` skips it.
            if e.end != 0 {
                c.core.received(&e);
            }
            Self::touch(&mut self.dirty, c, e.ep);
        };
        let Context {
            conns,
            dirty,
            stats,
            device,
            pd,
            ..
        } = self;
        let c = &mut conns[e.ep as usize];
        // Never stored in `answering`: this request is answered here, once, with what a
        // `RecvHandle` would carry (its allowance, whether a rendezvous response is
        // accepted) passed as scalars.
        let call_id = e.call_id;
        let allowance = e.allowance & !ENTRY_LARGE_RESP;
        let large = e.allowance & ENTRY_LARGE_RESP != 0;
        // Disjoint borrows of the endpoint: the request is read from `rx_pool` (a request
        // read by rendezvous) or from the core's receive ring (handed to `encode` by the
        // core apart from its send side), while the reply path mutates `core` and `tx_pool`.
        let Conn {
            core,
            tx_pool,
            rx_pool,
            ..
        } = c;
        // SAFETY: as for the request read in the reply paths below: a landing buffer whose
        // READ completed and that is in no free list, or ring bytes not yet released; the
        // slice ends before the reply path runs.
        let max_len = max_len(unsafe {
            if e.end == 0 {
                rx_pool.bytes(e.off, e.len as usize)
            } else {
                core.request_bytes(&e)
            }
        });
        // Taken by whichever of the reply buffer or `spare` gets the reply.
        let mut handle = Some(handle);
        // Two calls, one closure per request source: one closure that tests `e.end` itself
        // cost the in-place server 23 more instructions per request
        // (`scripts/callgrind-copyrpc.sh 20000 {1,32} in-place`: 744 -> 767, 214 -> 238).
        let r = if e.end == 0 {
            // SAFETY: the READ into landing buffer `e.off` completed before `e` was queued;
            // the buffer is in no free list (it returns to one below, after `handle`), so no
            // READ can be posted into it, and the reply path never touches `rx_pool`.
            let req = unsafe { rx_pool.bytes(e.off, e.len as usize) };
            Self::reply_on(
                core,
                tx_pool,
                device,
                pd,
                stats,
                call_id,
                allowance,
                large,
                max_len,
                |_, out| handle.take().map_or(0, |f| f(req, out)),
            )
        } else {
            Self::reply_on(
                core,
                tx_pool,
                device,
                pd,
                stats,
                call_id,
                allowance,
                large,
                max_len,
                |recv, out| {
                    // SAFETY: `e` came from this endpoint's ingest and is not released yet
                    // (`received` runs below, after `handle`), so no flush can have told the peer
                    // its bytes are free; our own writes go to the send ring, the large-message
                    // send buffers or the backlog, never the receive ring.
                    let req = unsafe { recv.request(&e) };
                    handle.take().map_or(0, |f| f(req, out))
                },
            )
        };
        if let Some(f) = handle {
            // The reply was refused before `encode` ran: serve the request anyway.
            // SAFETY: as above; nothing was released or freed yet.
            let req = unsafe {
                if e.end == 0 {
                    rx_pool.bytes(e.off, e.len as usize)
                } else {
                    core.request_bytes(&e)
                }
            };
            f(req, spare);
        }
        // The request is done with: release its ring space or free its landing buffer.
        if e.end == 0 {
            rx_pool.free.push(e.off);
        } else {
            core.received(&e);
        }
        Self::touch(dirty, c, e.ep);
        Some(r)
    }

    /// The reply path of [`Context::reply_with`] and [`Context::serve_next`] on one
    /// endpoint's core and large-message send buffers: `encode` gets the core's receive ring
    /// (apart from its send side) and the reply buffer. The request is given by the fields of
    /// its [`RecvHandle`] the path needs (`call_id`, `allowance`, `large`:
    /// [`RecvHandle::accepts_large`]), as scalars, so that no handle is built in memory for
    /// the cold path's call.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn reply_on(
        core: &mut EndpointCore<U>,
        tx_pool: &mut Pool,
        device: &mlx5::verbs::Context,
        pd: &Pd,
        stats: &mut Stats,
        call_id: u32,
        allowance: u64,
        large: bool,
        max_len: u32,
        encode: impl FnOnce(&Ring, &mut [u8]) -> usize,
    ) -> Result<(), ReplyError> {
        // The core's size check, made here: beyond the allowance, a rendezvous response if
        // the caller accepts one (issue 15), else `TooLarge`.
        if padded_message_size(max_len as u64) + FLOW_METADATA_SIZE > allowance {
            return Self::reply_beyond_allowance(
                core, tx_pool, device, pd, stats, call_id, allowance, large, max_len, encode,
            );
        }
        core.reply_fit(call_id, allowance, max_len, 0, None, encode, stats)
    }

    /// A reply larger than the request's inline allowance, to a caller that accepts a
    /// rendezvous response (issue 15): encoded into a large-message buffer, then copied
    /// inline if it turned out to fit, else sent as a descriptor.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn reply_beyond_allowance(
        core: &mut EndpointCore<U>,
        tx_pool: &mut Pool,
        device: &mlx5::verbs::Context,
        pd: &Pd,
        stats: &mut Stats,
        call_id: u32,
        allowance: u64,
        large: bool,
        max_len: u32,
        encode: impl FnOnce(&Ring, &mut [u8]) -> usize,
    ) -> Result<(), ReplyError> {
        if !large || core.large_limit() == 0 {
            return core.reply_in(call_id, allowance, max_len, encode, stats);
        }
        Self::reply_large_on(
            core, tx_pool, device, pd, stats, call_id, allowance, max_len, encode,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn reply_large_on(
        core: &mut EndpointCore<U>,
        tx_pool: &mut Pool,
        device: &mlx5::verbs::Context,
        pd: &Pd,
        stats: &mut Stats,
        call_id: u32,
        allowance: u64,
        max_len: u32,
        encode: impl FnOnce(&Ring, &mut [u8]) -> usize,
    ) -> Result<(), ReplyError> {
        if core.state() != EndpointState::Connected {
            return Err(ReplyError::Failed);
        }
        let large = core.large_limit();
        if max_len > large {
            return Err(ReplyError::TooLarge {
                len: max_len as usize,
                allowance: large as usize,
            });
        }
        let slot = match core.tx_free.pop() {
            Some(s) => s,
            None => match tx_pool.grow(device, pd, stats) {
                Some(s) => s,
                None => {
                    stats.large_buffers_busy += 1;
                    core.abandon(allowance);
                    return Err(ReplyError::NoLargeBuffer);
                }
            },
        };
        // SAFETY: a free send buffer: no descriptor of ours names it any more.
        let buf = unsafe { tx_pool.bytes_mut(slot) };
        let n = encode(&core.recv, &mut buf[..max_len as usize]).min(max_len as usize) as u32;
        if padded_message_size(n as u64) + FLOW_METADATA_SIZE <= allowance {
            core.tx_free.push(slot);
            let src = &buf[..n as usize];
            return core.reply_fit(
                call_id,
                allowance,
                n,
                0,
                None,
                |_, b| {
                    b[..src.len()].copy_from_slice(src);
                    src.len()
                },
                stats,
            );
        }
        let b = &tx_pool.bufs[slot as usize];
        let desc = Descriptor {
            addr: b.mr.addr,
            rkey: b.mr.rkey,
            len: n,
        };
        let r = core.reply_fit(
            call_id,
            allowance,
            DESCRIPTOR_SIZE as u32,
            RENDEZVOUS_FLAG,
            Some(slot),
            |_, b| {
                desc.write(b);
                DESCRIPTOR_SIZE
            },
            stats,
        );
        match r {
            Ok(()) => stats.rendezvous_sent += 1,
            Err(_) => core.tx_free.push(slot),
        }
        r
    }

    /// One round of progress (seeds/004 §3.7): receive CQ → batches parsed (responses go to
    /// `on_response(user, Ok(payload))`, requests to [`Context::recv`]); SRQ refill; send CQ;
    /// flush. Calls of an endpoint that fails get `on_response(user, Err(why))`. Returns the
    /// number of batches received.
    ///
    /// Always inlined: callers poll in one loop, and the receive path it inlines (batch
    /// validation and delivery, each a few instructions per step) is where most of an
    /// RPC's instructions go (issue 16).
    #[inline(always)]
    pub fn poll(
        &mut self,
        mut on_response: impl FnMut(U, Result<&[u8], EndpointFailure>),
    ) -> usize {
        let Context {
            conns,
            by_qpn,
            dirty,
            recv_queue,
            srq,
            recv_cq,
            stats,
            cfg,
            ..
        } = self;
        let mut rx = Rx {
            conns,
            by_qpn,
            dirty,
            recv_queue,
            srq,
            stats,
        };
        // Steps 1-2: the monomorphized poller (seeds/001 "MonoCq"): the closure inlines.
        // Each CQE is read in place: the fast path needs four of its fields.
        let n = recv_cq.cq.poll_ref(cfg.poll_budget as usize, |cqe| {
            rx.on_cqe(cqe, &mut on_response)
        });
        if n > 0 && self.srq.srq.posted() < self.srq_low {
            // Step 3: refill below 2/3 of the SRQ, in one doorbell (`refill_srq`).
            refill_srq(&mut self.srq);
        }
        self.poll_send_cq(&mut on_response);
        if !self.dirty.is_empty() {
            self.flush_all(&mut on_response);
        }
        n
    }

    /// Sends what `call`/`reply` wrote since the last poll (step 6 of [`Context::poll`]
    /// alone: no completion is polled), for a server that replies after its poll and wants
    /// the replies on the wire before it polls again. The only failure possible here is a
    /// WQE the send queue refuses although its geometry allows it (a driver bug): that
    /// endpoint then fails without delivering its pending calls' user data.
    #[inline]
    pub fn flush(&mut self) {
        if !self.dirty.is_empty() {
            self.flush_all(&mut |_, _| {});
        }
    }

    #[cold]
    fn fail(
        stats: &mut Stats,
        c: &mut Conn<U>,
        why: EndpointFailure,
        on_response: &mut impl FnMut(U, Result<&[u8], EndpointFailure>),
    ) {
        if !matches!(c.core.state(), EndpointState::Failed(_)) {
            stats.failed_endpoints += 1;
        }
        c.core.fail(why, on_response);
        // The large-message buffers go with the endpoint (deregistered before unmapped: a
        // READ the NIC still runs on them fails instead of touching freed memory).
        c.tx_pool.clear();
        c.rx_pool.clear();
        c.lent.clear();
    }

    #[inline(always)]
    fn poll_send_cq(&mut self, on_response: &mut impl FnMut(U, Result<&[u8], EndpointFailure>)) {
        let mut any = false;
        while let Some(cqe) = self.send_cq.cq.poll_one() {
            any = true;
            let Some(&ep) = self.by_qpn.get(cqe.qpn) else {
                self.stats.stray_send_cqes += 1;
                continue;
            };
            let c = &mut self.conns[ep as usize];
            c.qp.sq.retire(cqe.wqe_counter);
            if cqe.is_error() {
                self.stats.error_cqes += 1;
                // Every signaled WQE up to this one is finished (failed or flushed).
                while let Some(&(idx, kind)) = c.signaled.front() {
                    if idx.wrapping_sub(cqe.wqe_counter) < 0x8000 && idx != cqe.wqe_counter {
                        break;
                    }
                    c.signaled.pop_front();
                    match kind {
                        Signaled::Raw => self.stats.raw_done += 1,
                        Signaled::ConsumerRead => c.read_outstanding = false,
                        Signaled::LargeRead => self.stats.rendezvous_read_errors += 1,
                        Signaled::Write => {}
                    }
                }
                let err = cqe.status().expect_err("error CQE");
                Self::fail(
                    &mut self.stats,
                    c,
                    EndpointFailure::Completion(err),
                    on_response,
                );
                continue;
            }
            match c.signaled.front() {
                Some(&(idx, kind)) if idx == cqe.wqe_counter => {
                    c.signaled.pop_front();
                    match kind {
                        Signaled::Write => {}
                        Signaled::ConsumerRead => {
                            c.read_outstanding = false;
                            // SAFETY: bytes 8..16 of the 16 B consumer word; the READ that
                            // wrote them completed (this CQE, Acquire on its owner bit).
                            let v = unsafe {
                                std::ptr::read_volatile(
                                    c.core.consumer_word.as_ptr().add(8) as *const u64
                                )
                            };
                            if c.core.on_consumer_read(u64::from_le(v)).is_err() {
                                self.stats.bad_consumer_reads += 1;
                            }
                            self.stats.consumer_reads += 1;
                            Self::touch(&mut self.dirty, c, ep);
                        }
                        Signaled::Raw => self.stats.raw_done += 1,
                        Signaled::LargeRead => {
                            Self::large_read_done(
                                &mut self.stats,
                                &mut self.recv_queue,
                                c,
                                ep,
                                on_response,
                            );
                            Self::touch(&mut self.dirty, c, ep);
                        }
                    }
                }
                _ => self.stats.stray_send_cqes += 1,
            }
        }
        if any {
            self.send_cq.cq.update_dbrec();
        }
    }

    /// Flushes every endpoint marked dirty: close batches, post their WRITE+IMMs, post
    /// consumer READs, publish consumer positions, one doorbell per endpoint.
    #[inline(always)]
    fn flush_all(&mut self, on_response: &mut impl FnMut(U, Result<&[u8], EndpointFailure>)) {
        // Walk the dirty list and compact it in place: the endpoints that stay dirty move to
        // its front (`kept` of them), the rest is truncated. No allocation per poll while a
        // READ is outstanding or a send queue is full. Nothing below pushes to `self.dirty`.
        let mut kept = 0;
        for i in 0..self.dirty.len() {
            let ep = self.dirty[i];
            let c = &mut self.conns[ep as usize];
            c.in_dirty = false;
            if c.core.state() != EndpointState::Connected {
                continue;
            }
            c.core.publish();
            let mut posted = false;
            // The common case: one batch, posted straight away. If the post fails, the emit
            // is queued and retried (and counted or failed) by the loop below, as if `flush`
            // had queued it.
            if let Some(e) = c.core.flush_one(&mut self.stats) {
                match Self::post_emit(&mut self.stats, c, &e) {
                    Ok(()) => posted = true,
                    Err(_) => c.core.requeue_emit(e),
                }
            }
            // The common case (one batch, nothing queued, no READ or large-message work)
            // skips the rest in one flag test.
            if c.core.queued_reads_or_large_work() {
                // Nothing is queued unless the flag says so (`EndpointCore::wants_flush`'s
                // invariant): the common case skips the queue walk.
                if c.core.queued() {
                    while let Some(&e) = c.core.emits.front() {
                        match Self::post_emit(&mut self.stats, c, &e) {
                            Ok(()) => {
                                c.core.emits.pop_front();
                                posted = true;
                            }
                            Err(mlx5::Error::SqFull { .. }) => {
                                self.stats.sq_full += 1;
                                break;
                            }
                            Err(e) => {
                                // A WQE our own geometry says fits was refused: a bug, not input.
                                tracing::error!(ep, error = %e, "copyrpc: WRITE+IMM refused by the send queue");
                                Self::fail(
                                    &mut self.stats,
                                    c,
                                    EndpointFailure::Protocol(ProtocolError::BadLength),
                                    on_response,
                                );
                                break;
                            }
                        }
                    }
                    c.core.settle_queued();
                }
                // Large-message work and the consumer READ, behind one flag test.
                if c.core.reads_or_large_work() {
                    if c.core.large_work() {
                        if c.core.take_lent() {
                            Self::return_lent(c);
                        }
                        posted |=
                            Self::post_large_reads(&self.device, &self.pd, &mut self.stats, c);
                    }
                    if c.core.needs_read() && !c.read_outstanding && c.core.emits.is_empty() {
                        posted |= Self::post_consumer_read(&mut self.stats, c);
                    }
                }
            }
            if posted {
                c.qp.sq.ring_doorbell();
                self.stats.doorbells += 1;
            }
            // Still something to do (send queue full, a READ in flight): next poll.
            if c.core.wants_flush() && c.core.state() == EndpointState::Connected {
                c.in_dirty = true;
                self.dirty[kept] = ep;
                kept += 1;
            }
        }
        self.dirty.truncate(kept);
    }

    /// Posts one RDMA WRITE+IMM for `e` (seeds/004 §3.5): fully inline up to 220 B (the
    /// send queue's dedicated all-inline path), else a 204 B inline head and one SGE;
    /// signaled every [`SIGNAL_INTERVAL`] WQEs or when a quarter of the send queue is
    /// unsignaled.
    #[inline(always)]
    fn post_emit(stats: &mut Stats, c: &mut Conn<U>, e: &Emit) -> Result<(), mlx5::Error> {
        // WQEBBs since the last signaled WQE, plus this one (at most 4): a quarter of the
        // ring at most, so completions retire the queue long before it fills, and each QP
        // has at most a handful of signaled WQEs (send CQEs) outstanding.
        let signal = c.unsignaled + 1 >= SIGNAL_INTERVAL
            || c.qp.sq.pi().wrapping_sub(c.last_signal_pi) as i32 > c.signal_gap;
        let flags = if signal { CQ_UPDATE } else { 0 };
        let raddr = c.remote.ring_addr + c.core.remote_offset(e.start);
        let idx = if e.len <= c.full_inline {
            // SAFETY: an emitted range: inside the ring, unmodified until the peer consumes it.
            let data = unsafe { c.core.send_bytes(e.start, e.len as usize) };
            let idx =
                c.qp.sq
                    .post_write_imm_inline(flags, e.imm(), raddr, c.remote.ring_rkey, data)?;
            stats.writes_inline += 1;
            idx
        } else {
            Self::post_emit_gather(c, e, flags, raddr)?
        };
        if signal {
            c.signaled.push_back((idx, Signaled::Write));
            c.unsignaled = 0;
            c.last_signal_pi = c.qp.sq.pi();
        } else {
            c.unsignaled += 1;
        }
        stats.writes_posted += 1;
        Ok(())
    }

    /// The WQE of [`Context::post_emit`] for a batch beyond the inline limit: an inline head
    /// of up to [`INLINE_HEAD`] bytes and one SGE into the send ring for the rest.
    #[inline(always)]
    fn post_emit_gather(
        c: &mut Conn<U>,
        e: &Emit,
        flags: u8,
        raddr: u64,
    ) -> Result<u16, mlx5::Error> {
        let max_inline = c.full_inline;
        // SAFETY: an emitted range: inside the ring, unmodified until the peer consumes it.
        let data = unsafe { c.core.send_bytes(e.start, e.len as usize) };
        let head = max_inline.saturating_sub(16).min(INLINE_HEAD) & !3;
        let sge = [Sge {
            addr: c.send_mr.addr + c.core.send_offset(e.start) + head as u64,
            len: e.len - head,
            lkey: c.send_mr.lkey,
        }];
        c.qp.sq.post(&WqeDesc {
            opcode: Opcode::RdmaWriteImm,
            flags,
            imm: e.imm(),
            ud: None,
            remote: Some(RaddrSeg {
                raddr,
                rkey: c.remote.ring_rkey,
            }),
            atomic: None,
            inline: &data[..head as usize],
            sges: &sge,
        })
    }

    /// Posts the RDMA READs of received rendezvous descriptors (issue 15), in arrival
    /// order, each into a landing buffer of its own; stops when no buffer is free (the
    /// endpoint stays dirty and retries at the next flush) or the send queue is full.
    /// Returns whether any was posted.
    #[cold]
    #[inline(never)]
    fn post_large_reads(
        device: &mlx5::verbs::Context,
        pd: &Pd,
        stats: &mut Stats,
        c: &mut Conn<U>,
    ) -> bool {
        let mut posted = false;
        while c.core.rdv_posted < c.core.rdv.len() {
            let slot = match c.rx_pool.free.pop() {
                Some(s) => s,
                None => match c.rx_pool.grow(device, pd, stats) {
                    Some(s) => s,
                    None => return posted,
                },
            };
            let i = c.core.rdv_posted;
            let d = c.core.rdv[i].desc;
            let b = &c.rx_pool.bufs[slot as usize];
            // `ingest` checked `d.len <= large limit <= our buffer size` on this copy of the
            // descriptor, when it was delivered (not only when its batch was validated: the
            // peer can rewrite its ring bytes in between): the READ cannot write beyond the
            // landing buffer.
            debug_assert!(d.len <= c.rx_pool.size);
            let sge = [Sge {
                addr: b.mr.addr,
                len: d.len,
                lkey: b.mr.lkey,
            }];
            let remote = RaddrSeg {
                raddr: d.addr,
                rkey: d.rkey,
            };
            // SAFETY: the landing buffer `slot` was just taken off the pool's free list and
            // is lent to no one until this READ's completion is polled (`LargeRead`); the
            // pool's buffers live as long as the connection's QP.
            let r = unsafe { c.qp.sq.post_local_write(&WqeDesc::rdma_read(remote, &sge)) };
            match r {
                Ok(idx) => {
                    c.signaled.push_back((idx, Signaled::LargeRead));
                    c.unsignaled = 0;
                    c.last_signal_pi = c.qp.sq.pi();
                    c.core.rdv[i].slot = slot;
                    c.core.rdv_posted += 1;
                    posted = true;
                }
                Err(_) => {
                    c.rx_pool.free.push(slot);
                    stats.sq_full += 1;
                    return posted;
                }
            }
        }
        c.core.rdv_all_posted();
        posted
    }

    /// The READ of the oldest posted rendezvous message completed: report it to the peer
    /// (next batch), then deliver a response to `on_response` (its landing buffer is free
    /// again right after) or queue a request for [`Context::recv`].
    #[cold]
    #[inline(never)]
    fn large_read_done(
        stats: &mut Stats,
        recv_queue: &mut Fifo<RecvEntry>,
        c: &mut Conn<U>,
        ep: EndpointId,
        on_response: &mut impl FnMut(U, Result<&[u8], EndpointFailure>),
    ) {
        if c.core.rdv_posted == 0 {
            stats.stray_send_cqes += 1;
            return;
        }
        let Some(r) = c.core.rdv.pop_front() else {
            stats.stray_send_cqes += 1;
            return;
        };
        c.core.rdv_posted -= 1;
        c.core.read_completed();
        stats.rendezvous_read += 1;
        stats.rendezvous_bytes += r.desc.len as u64;
        match r.kind {
            RdvKind::Response { user } => {
                stats.responses += 1;
                // SAFETY: the READ into this buffer completed (this CQE); it is freed only
                // after the callback returns.
                let bytes = unsafe { c.rx_pool.bytes(r.slot, r.desc.len as usize) };
                on_response(user, Ok(bytes));
                c.rx_pool.free.push(r.slot);
            }
            RdvKind::Request {
                call_id,
                allowance,
                large_resp,
            } => recv_queue.push_back(RecvEntry {
                ep,
                call_id,
                allowance: allowance | if large_resp { ENTRY_LARGE_RESP } else { 0 },
                off: r.slot,
                len: r.desc.len,
                end: 0,
            }),
        }
    }

    /// Posts a signaled RDMA READ of the peer's consumer position into bytes 8..16 of our
    /// consumer word (seeds/001 "RDMA READフォールバック"). Returns whether it was posted.
    #[cold]
    fn post_consumer_read(stats: &mut Stats, c: &mut Conn<U>) -> bool {
        let sge = [Sge {
            addr: c.word_mr.addr + 8,
            len: 8,
            lkey: c.word_mr.lkey,
        }];
        let remote = RaddrSeg {
            raddr: c.remote.consumer_addr,
            rkey: c.remote.consumer_rkey,
        };
        // SAFETY: bytes 8..16 of the connection's consumer word are this READ's landing
        // place only; they are read with a volatile load after its completion, never through
        // a reference, and the word lives as long as the QP.
        let r = unsafe { c.qp.sq.post_local_write(&WqeDesc::rdma_read(remote, &sge)) };
        match r {
            Ok(idx) => {
                c.signaled.push_back((idx, Signaled::ConsumerRead));
                c.unsignaled = 0;
                c.last_signal_pi = c.qp.sq.pi();
                c.read_outstanding = true;
                true
            }
            Err(_) => {
                stats.sq_full += 1;
                false
            }
        }
    }

    /// Registers `len` bytes at `addr` with this context's PD, for raw RDMA operations
    /// ([`Context::post_rdma_read`], [`Context::post_rdma_write`]) or as a target of peers'.
    ///
    /// # Safety
    /// The memory stays mapped until the returned [`Mr`] is dropped.
    ///
    /// # Errors
    /// The device's error.
    pub unsafe fn reg_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, SetupError> {
        // SAFETY: this function's own contract (# Safety above) is `reg_mr`'s.
        Ok(unsafe { self.device.reg_mr(&self.pd, addr, len, access)? })
    }

    /// Posts a raw RDMA READ of `local.len` bytes from `remote` into `local` on endpoint `ep`
    /// (seeds/004 §3.9), signaled and rung at once; its completion is counted in
    /// [`Stats::raw_done`] (see [`Context::raw_rdma_pending`]).
    ///
    /// # Safety
    /// The device writes `local` at any time until the completion: the memory it names
    /// (registered on this context, lkey) must stay valid, and no Rust reference to it may
    /// be live, until [`Context::raw_rdma_pending`] no longer counts this READ
    /// (`mlx5::sq::SendQueue::post_local_write`).
    ///
    /// # Errors
    /// [`SetupError::BadEndpoint`] for an unknown or unconnected endpoint;
    /// [`SetupError::Device`] (`SqFull`: poll and retry).
    pub unsafe fn post_rdma_read(
        &mut self,
        ep: EndpointId,
        local: Sge,
        remote: RaddrSeg,
    ) -> Result<(), SetupError> {
        self.post_raw(ep, Opcode::RdmaRead, local, remote)
    }

    /// Posts a raw RDMA WRITE of `local` to `remote` on endpoint `ep` (seeds/004 §3.9).
    ///
    /// # Errors
    /// As [`Context::post_rdma_read`].
    pub fn post_rdma_write(
        &mut self,
        ep: EndpointId,
        local: Sge,
        remote: RaddrSeg,
    ) -> Result<(), SetupError> {
        self.post_raw(ep, Opcode::RdmaWrite, local, remote)
    }

    fn post_raw(
        &mut self,
        ep: EndpointId,
        opcode: Opcode,
        local: Sge,
        remote: RaddrSeg,
    ) -> Result<(), SetupError> {
        let c = self
            .conns
            .get_mut(ep as usize)
            .filter(|c| c.core.state() == EndpointState::Connected)
            .ok_or(SetupError::BadEndpoint(ep))?;
        // SAFETY: a WRITE only reads `local`; for a READ, `post_rdma_read`'s caller
        // upholds its contract, which is `post_local_write`'s.
        let idx = unsafe {
            c.qp.sq
                .post_local_write(&WqeDesc::rdma(opcode, remote, &[local]))
        }?;
        c.signaled.push_back((idx, Signaled::Raw));
        c.unsignaled = 0;
        c.last_signal_pi = c.qp.sq.pi();
        c.qp.sq.ring_doorbell();
        self.stats.raw_posted += 1;
        self.stats.doorbells += 1;
        Ok(())
    }

    /// Test hook: writes a request whose payload is the rendezvous descriptor `desc` as
    /// given (a forged one, for adversarial tests), reserving a 64-byte response.
    #[cfg(test)]
    pub(crate) fn forge_rendezvous_call(
        &mut self,
        ep: EndpointId,
        desc: Descriptor,
        user: U,
    ) -> Result<u32, CallError<U>> {
        let c = &mut self.conns[ep as usize];
        let r = c.core.call_fit(
            DESCRIPTOR_SIZE as u32,
            internal_allowance(64),
            0,
            RENDEZVOUS_FLAG,
            64,
            user,
            |b| {
                desc.write(b);
                DESCRIPTOR_SIZE
            },
            &mut self.stats,
        );
        Self::touch(&mut self.dirty, c, ep);
        r
    }

    /// Raw RDMA operations posted and not yet completed (seeds/004 §3.9 `raw_rdma_pending`).
    pub fn raw_rdma_pending(&self) -> u64 {
        self.stats.raw_posted - self.stats.raw_done
    }
}

/// The parts of a [`Context`] that receive completions touch, borrowed apart from the
/// receive CQ so that its monomorphized poller can call into them.
struct Rx<'a, U> {
    conns: &'a mut Vec<Conn<U>>,
    by_qpn: &'a FastMap<EndpointId>,
    dirty: &'a mut Vec<EndpointId>,
    recv_queue: &'a mut Fifo<RecvEntry>,
    srq: &'a mut Srq,
    stats: &'a mut Stats,
}

impl<U> Rx<'_, U> {
    /// One receive CQE = one batch (seeds/004 §3.7 step 1): return the SRQ WQE, find the
    /// endpoint by QPN, parse the batch; a corrupt batch fails the endpoint.
    #[inline(always)]
    fn on_cqe(
        &mut self,
        cqe: CqeRef<'_>,
        on_response: &mut impl FnMut(U, Result<&[u8], EndpointFailure>),
    ) {
        if cqe.is_error() {
            // The pieces, not `self`: a `&mut Rx` escaping into this out-of-line call would
            // keep the `Rx` in memory on every poll.
            return Self::on_error(
                self.conns,
                self.by_qpn,
                self.srq,
                self.stats,
                &cqe.decode(),
                on_response,
            );
        }
        if self.srq.srq.release(cqe.wqe_counter()).is_err() {
            self.stats.stray_send_cqes += 1;
        }
        let qpn = cqe.qpn();
        let Some(&ep) = self.by_qpn.get(qpn) else {
            self.stats.unknown_qpn += 1;
            return;
        };
        let c = &mut self.conns[ep as usize];
        if c.core.state() != EndpointState::Connected {
            return;
        }
        let r = c.core.ingest(
            cqe_delta(cqe.imm()),
            ep,
            self.recv_queue,
            self.stats,
            on_response,
        );
        if let Err(e) = r {
            self.stats.corrupt_batches += 1;
            if matches!(e, ProtocolError::BadDescriptor(_)) {
                self.stats.bad_descriptors += 1;
            }
            tracing::warn!(ep, qpn, error = %e, "copyrpc: corrupt batch; failing the endpoint");
            Context::fail(self.stats, c, EndpointFailure::Protocol(e), on_response);
        }
        Context::touch(self.dirty, c, ep);
    }

    /// A responder error CQE: fails the endpoint it names.
    #[cold]
    #[inline(never)]
    fn on_error(
        conns: &mut [Conn<U>],
        by_qpn: &FastMap<EndpointId>,
        srq: &mut Srq,
        stats: &mut Stats,
        cqe: &Cqe,
        on_response: &mut impl FnMut(U, Result<&[u8], EndpointFailure>),
    ) {
        stats.error_cqes += 1;
        if srq.srq.is_posted(cqe.wqe_counter) && cqe.srqn == srq.srqn() {
            let _ = srq.srq.release(cqe.wqe_counter);
        }
        let Some(&ep) = by_qpn.get(cqe.qpn) else {
            stats.unknown_qpn += 1;
            return;
        };
        let err = cqe.status().expect_err("error CQE");
        let c = &mut conns[ep as usize];
        Context::fail(stats, c, EndpointFailure::Completion(err), on_response);
    }
}

/// Copies `src` to the front of `dst` (at least as long). 16 to 64 bytes (a typical
/// small reply) as two overlapping fixed-size copies, inline, where `copy_from_slice` of a
/// length unknown at compile time calls `memcpy`; other lengths with `copy_from_slice`.
#[inline(always)]
fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    let dst = &mut dst[..n];
    if (16..=32).contains(&n) {
        dst[..16].copy_from_slice(&src[..16]);
        dst[n - 16..].copy_from_slice(&src[n - 16..]);
    } else if (33..=64).contains(&n) {
        dst[..32].copy_from_slice(&src[..32]);
        dst[n - 32..].copy_from_slice(&src[n - 32..]);
    } else {
        dst.copy_from_slice(src);
    }
}

#[cold]
fn stale_reply(stats: &mut Stats) -> ReplyError {
    stats.stale_replies += 1;
    ReplyError::Stale
}

#[cfg(test)]
mod copy_tests {
    use super::{Answering, copy_short};

    #[test]
    fn answering_takes_each_request_once() {
        let mut a = Answering::with_capacity(1);
        let s0 = a.insert(5, 0);
        let s1 = a.insert(6, 1);
        let s2 = a.insert(5, 2);
        assert_eq!((s0, s1, s2), (0, 1, 2));
        assert!(!a.take(s1, 6, 0), "wrong seq");
        assert!(!a.take(s1, 5, 1), "wrong call id");
        assert!(!a.take(3, 6, 1), "no such slot");
        assert!(a.take(s1, 6, 1));
        assert!(!a.take(s1, 6, 1), "taken twice");
        // A free slot's word (`FREE | next`) matches no handle, whatever its call id.
        assert!(!a.take(s1, 0x8000_0000, 3));
        assert!(!a.take(s1, u32::MAX, 3));
        // Freed slots are reused, last freed first.
        assert!(a.take(s0, 5, 0));
        assert_eq!(a.insert(7, 3), s0);
        assert_eq!(a.insert(8, 4), s1);
        assert_eq!(a.insert(9, 5), 3);
        assert!(a.take(s2, 5, 2) && a.take(s0, 7, 3) && a.take(s1, 8, 4) && a.take(3, 9, 5));
    }

    #[test]
    fn copy_short_every_length() {
        let src: Vec<u8> = (1..=200u8).collect();
        for n in 0..=150 {
            let mut dst = vec![0u8; n + 8];
            copy_short(&mut dst, &src[..n]);
            assert_eq!(&dst[..n], &src[..n], "n = {n}");
            assert!(
                dst[n..].iter().all(|&b| b == 0),
                "n = {n}: wrote past the end"
            );
        }
    }
}

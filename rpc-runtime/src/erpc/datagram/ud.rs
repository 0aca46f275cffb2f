//! [`DatagramTransport`] over one mlx5 unreliable-datagram (UD) queue pair: eRPC's native
//! transport (seeds/000 §9, §12.5; seeds/002 §5), on hardware or on the device model
//! ([`mlx5::sim`]) through the same driver code.
//!
//! # Objects
//! [`UdTransport::new`] takes an open [`mlx5::verbs::Context`] and creates, once: a protection
//! domain, a send CQ and a receive CQ, one UD QP with its own receive queue (activated with the
//! Q_Key), a registered receive ring and a registered transmit staging ring. Address handles
//! are created on the first send to each destination and cached for the transport's lifetime,
//! and message buffers are registered on their first in-place send; those (and the error of a
//! failed creation, a cold path) are the only allocations after construction.
//!
//! # Constants (seeds/000 §12.5 "IBトランスポートパラメータ", eRPC's InfiniBand transport)
//! | setting | default | seed |
//! |---|---|---|
//! | MTU (datagram the core sees) | [`DEFAULT_MTU`] = 3840 B | `kMTU` 3840 (IB); 1024 for RoCE, which this driver does not support for UD |
//! | send queue depth | [`DEFAULT_SQ_DEPTH`] = 128 WQEs | `kSQDepth` 128 (seeds/002 §2 Appendix A: `TXQ_ENTRIES` 64) |
//! | receive queue depth | [`DEFAULT_RQ_DEPTH`] = 512 WQEs | `kRQDepth` 512 |
//! | signaling interval | [`DEFAULT_SIGNAL_INTERVAL`] = 64 WQEs | `kUnsigBatch` 64; §12.8 "64pkt/signal" |
//! | inline limit | [`MAX_INLINE`] = 60 B | `kMaxInline` 60; §12.8 "`if msg.len() <= 60`" |
//! | receive batch | [`DEFAULT_RX_BATCH`] = 32 datagrams | `kRecvSlack` 32 |
//! | re-post batch | [`RECV_SLACK`] = 32 receive WQEs (fewer for queues under 512: `recv_slack`) | `kRecvSlack` 32 (receives are re-posted in batches) |
//! | Q_Key | [`DEFAULT_QKEY`] = 0x0205 | `kQKey` 0x0205 |
//!
//! Deviations from seeds/002 §2 and §5 (Appendix A): the receive CQ has one entry per receive
//! WQE instead of 8 entries allowed to overrun (an overrun is fatal for a CQ in this driver and
//! in the model), and the receive queue has one buffer per WQE instead of a multi-packet
//! receive queue with 512-byte strides (which the driver does not implement).
//!
//! # Datagram layout
//! On the wire a datagram is the UD SEND payload: `hdr` followed by `data` of a [`TxPkt`] (the
//! eRPC packet, at most `mtu` bytes). The transport adds nothing to the payload. It sends
//! every datagram as SEND with immediate, and the immediate carries the sender's LID
//! (`0xE5C0_0000 | lid`): the UD receive completion names the source QPN, but this crate's
//! CQE decoder ([`mlx5::cqe::Cqe`]) does not expose the source LID, and without it a reply
//! could not be addressed (the model does not fill the CQE's source-LID field either).
//! Datagrams arriving without that immediate (a foreign UD sender that knows our QPN and
//! Q_Key) are dropped and counted in [`TransportStats::rx_errors`].
//!
//! A UD receive buffer starts with the 40-byte GRH area (InfiniBand: filled only when the
//! sender used a global route header, zero otherwise); the payload follows it. Each receive
//! buffer of the ring is `64 + port MTU` bytes and the GRH area starts at offset 24, so the
//! payload lent out by [`rx_pkt`](DatagramTransport::rx_pkt) starts 64-byte aligned and the
//! GRH is skipped without a copy:
//! ```text
//! offset 0        24                64
//! | 24 B unused   | GRH area (40 B) | payload (<= port MTU) | padding to a multiple of 64 B |
//! ^ 64-B aligned                    ^ 64-B aligned: the bytes of rx_pkt(i)
//! ```
//! Receive buffers hold a full *port* MTU (4096 B on the model), not just the configured
//! `mtu`: a UD datagram larger than its receive buffer is a responder length error, which on
//! the model puts the QP into the error state (hardware reports an error completion too), so
//! a peer with a larger MTU could otherwise kill the transport. A datagram longer than `mtu`
//! is dropped and counted ([`TransportStats::rx_oversized`]) instead; one longer than the port
//! MTU never arrives (the sender's NIC refuses to send it).
//!
//! # What is copied and why
//! - **Receive: nothing.** The NIC writes into the registered ring; `rx_pkt` lends the payload
//!   in place; [`rx_release`](DatagramTransport::rx_release) (or the next `rx_burst`) re-posts
//!   the buffers of the burst, one receive doorbell per burst.
//! - **Transmit, datagrams of at most [`MAX_INLINE`] bytes:** inline in the WQE (the 60-B rule
//!   of the seed). Header and data are gathered into a 60-byte stack buffer and then written
//!   into the WQE's inline segment.
//! - **Transmit, larger datagrams of a message buffer ([`TxPkt::mem`]): nothing.** The NIC
//!   gathers them in place, as eRPC does (seeds/000 §3): packet 0, whose header and data are
//!   adjacent, as one data segment; packet `i >= 1` as two (its header slot in the buffer's
//!   tail, its data slice). The buffer is registered with this transport's PD on its first
//!   send (local read only; counted in [`TransportStats::tx_registrations`]) and looked up by
//!   the address of its shared handle afterwards (the last one is cached). Because the send
//!   reads the buffer after `tx_burst` returned, the transport *pins* it: it keeps a clone of
//!   the buffer's handle until the WQE has retired (one pin per run of WQEs from the same
//!   buffer, at most `sq_depth`, in a ring allocated once). So the memory stays mapped for
//!   the NIC even if the owner drops the buffer, and the owner sees the buffer as
//!   [in flight](crate::erpc::msgbuf::MsgBuffer::in_flight) and does not rewrite it
//!   (the eRPC core's rule, [`crate::erpc`] "Buffers the NIC still reads"). A registration is
//!   dropped (the MR deregistered) by a sweep once nobody holds the buffer any more, which
//!   implies no posted WQE reads it; sweeps run when registrations reach a threshold that
//!   doubles with the live ones (first at 64).
//! - **Transmit, other larger datagrams:** copied (header, then data) into a slot of a
//!   registered staging ring and sent with one data segment: packets that name no buffer
//!   (the event loop's rendered control packets and short packets), whose bytes are not
//!   inside the buffer they name, or whose buffer the device refused to register. The ring
//!   has one slot of `mtu` bytes (rounded up to 64) per send-queue entry; a slot is reused
//!   only after the WQE that used it has completed.
//!
//! Datagrams without a buffer are free as soon as `tx_burst` returns, so for them the TX
//! DMA-queue flush that eRPC needs before a retransmission or a completion (seeds/002 §9,
//! §10, §13, invariant I1) is not needed; for in-place sends the pins replace it.
//!
//! # Signaling rule (selective signaling, seeds/000 §12.8; seeds/002 §1 "unsignaled TX")
//! Sends are unsignaled except one WQE every `signal_interval` (the `k`-th WQE with
//! `k % signal_interval == signal_interval - 1`), except the last in-place WQE of a run of
//! them in a burst (so that its pins are dropped at the next poll; the send CQ is polled
//! before every receive burst while buffers are pinned), and except the WQE after which the send
//! queue would be full (no free staging slot, or fewer than 4 free WQEBBs: less than the
//! largest WQE this transport writes, 2 WQEBBs, plus ring-end padding). A signaled WQE's
//! completion retires it and every earlier WQE (PRM "Requester CQE"). Since `signal_interval
//! <= sq_depth`, any `sq_depth` consecutive WQEs include a signaled one, so a queue whose
//! staging slots are all in use always has a signaled WQE outstanding; the second rule makes
//! that hold too when the send ring runs out of WQEBBs before slots (a provider that sizes the
//! ring for fewer, smaller WQEs than the model and rdma-core do), and lets one completion
//! retire the whole queue. The send CQ is polled in `tx_burst` only when the burst does not fit
//! in the free send-queue entries; each `tx_burst` rings the send doorbell at most once.
//! When the queue is still full after polling, `tx_burst` returns the number of datagrams
//! consumed so far and counts [`TransportStats::tx_would_block`].
//!
//! # Errors
//! - A packet longer than `mtu`: `tx_burst` fails with [`io::ErrorKind::InvalidInput`] and
//!   sends nothing (caller bug).
//! - The address handle for a destination cannot be created: that packet is dropped and
//!   counted ([`TransportStats::tx_errors`]); the next packet to that destination tries again.
//! - A destination that does not exist (no such LID or QPN, another Q_Key): the NIC sends the
//!   datagram and the network drops it, as UD does; the transport cannot tell (the model
//!   counts it in [`mlx5::sim::SimStats::ud_no_dest`] / `ud_bad_qkey`).
//! - Receive error completions, datagrams without the transport's immediate or shorter than
//!   the GRH: dropped, counted in [`TransportStats::rx_errors`].
//! - An error completion on the send queue means the QP is in the error state (every later
//!   WQE is flushed): the transport has failed. [`UdTransport::qp_error`] reports the first
//!   error, `tx_burst` returns an error ([`io::ErrorKind::BrokenPipe`]), receives stop being
//!   re-posted. A flushed receive (WR_FLUSH) marks the transport failed the same way.
//!
//! # Delivery on the device model
//! The model executes a UD SEND synchronously inside the sender's doorbell
//! ([`mlx5::sim`] "What executes"): the payload is placed in the receiver's ring and the
//! receive CQE written before `tx_burst` returns, and a signaled send's CQE likewise. With UD
//! fault injection ([`mlx5::sim::UdFaults`]), delayed and reordered datagrams are delivered at
//! later *progress steps*, which every doorbell on the fabric makes (or
//! [`mlx5::sim::Fabric::progress`], or the progress thread, on by default). eRPC's
//! retransmission timer keeps ringing doorbells while anything is outstanding, so the tests
//! here run without the progress thread ([`mlx5::sim::SimConfig::deterministic`]).

use std::collections::HashMap;
use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::sync::{Arc, Weak};

use mlx5::cq::CqeRef;
use mlx5::cqe::{Cqe, CqeError, CqeOpcode, Syndrome};
use mlx5::mem::DmaBuf;
use mlx5::verbs::{
    Access, Ah, Context, Cq, LinkLayer, Mr, Pd, PortInfo, Qp, QpCaps, QpInit, QpType, UdDest,
};
use mlx5::wqe::{
    CQ_UPDATE, CTRL_BYTES, DATA_BYTES, DGRAM_BYTES, DS_BYTES, DgramSeg, EncodedAv, Opcode, Sge,
    WqeDesc, inline_seg_bytes,
};

use super::{DatagramTransport, PKT_HDR_LEN, TransportStats, TxPkt};

/// Bytes of the GRH area at the start of every UD receive buffer (InfiniBand spec; PRM
/// "Receive queues": the first 40 bytes of a UD receive are the GRH, present or not).
pub const GRH_BYTES: usize = 40;
/// Largest datagram in bytes sent inline in the WQE (seeds/000 §12.5 `kMaxInline` = 60).
pub const MAX_INLINE: usize = 60;
/// Default MTU in bytes: the largest datagram (eRPC packet header included) the core sees
/// (seeds/000 §12.5 `kMTU` = 3840 for InfiniBand).
pub const DEFAULT_MTU: usize = 3840;
/// Default send queue depth in WQEs (seeds/000 §12.5 `kSQDepth` = 128).
pub const DEFAULT_SQ_DEPTH: u32 = 128;
/// Default receive queue depth in WQEs, i.e. receive buffers (seeds/000 §12.5 `kRQDepth` =
/// 512).
pub const DEFAULT_RQ_DEPTH: u32 = 512;
/// Default interval in WQEs between signaled sends (seeds/000 §12.5 `kUnsigBatch` = 64).
pub const DEFAULT_SIGNAL_INTERVAL: u32 = 64;
/// Default number of datagrams one `rx_burst` returns at most (seeds/000 §12.5
/// `kRecvSlack` = 32: receives are re-posted in batches of this size).
pub const DEFAULT_RX_BATCH: usize = 32;
/// Default Q_Key (seeds/000 §12.5 `kQKey` = 0x0205). All endpoints must use the same one.
pub const DEFAULT_QKEY: u32 = 0x0205;
/// Largest configurable send queue depth in WQEs.
pub const MAX_SQ_DEPTH: u32 = 4096;
/// Largest configurable receive queue depth in WQEs.
pub const MAX_RQ_DEPTH: u32 = 16384;

/// Offset of the GRH area in a receive buffer: the payload after it starts 64-B aligned.
const RX_GRH_OFFSET: usize = ALIGN - GRH_BYTES;
/// Offset of the payload in a receive buffer.
const RX_PAYLOAD_OFFSET: usize = ALIGN;
/// Alignment in bytes of receive buffers and staging slots.
const ALIGN: usize = 64;
/// Upper half of the immediate of every datagram this transport sends; the lower half is the
/// sender's LID.
const IMM_MAGIC: u32 = 0xE5C0_0000;
/// Mask of [`IMM_MAGIC`].
const IMM_MAGIC_MASK: u32 = 0xFFFF_0000;
/// Free WQEBBs under which a send is signaled: the largest WQE written here is 2 WQEBBs and
/// ring-end padding adds at most 1 (see the module docs, "Signaling rule").
const LOW_WQEBBS: u32 = 4;
/// Registered message buffers at which dead registrations are first swept; the threshold then
/// doubles with the live ones.
const MIN_SWEEP: usize = 64;

/// Address of a [`UdTransport`] endpoint: the port's LID and the QP number.
///
/// InfiniBand within one subnet only (no GID): this driver builds UD address vectors for
/// InfiniBand; RoCE would need MAC and UDP fields that [`mlx5::wqe::DgramSeg`] cannot carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UdAddr {
    /// Local identifier of the port (InfiniBand).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
}

impl UdAddr {
    /// The address of QP `qpn` behind the port with LID `lid`.
    pub const fn new(lid: u16, qpn: u32) -> Self {
        UdAddr { lid, qpn }
    }

    /// The verbs destination of this address with `qkey`.
    pub fn dest(&self, qkey: u32) -> UdDest {
        UdDest {
            qpn: self.qpn,
            qkey,
            lid: self.lid,
            gid: [0; 16],
        }
    }
}

impl fmt::Display for UdAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lid {:#x} qpn {:#x}", self.lid, self.qpn)
    }
}

/// Configuration of a [`UdTransport`]; see the module docs for where the defaults come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdConfig {
    /// Largest datagram in bytes (eRPC header included), sent or received; between
    /// [`PKT_HDR_LEN`] and the port's active MTU. Both ends of a session must use the same
    /// value. Default [`DEFAULT_MTU`].
    pub mtu: usize,
    /// Send queue depth in WQEs, i.e. datagrams in flight in the NIC and staging slots;
    /// 1..=[`MAX_SQ_DEPTH`]. Default [`DEFAULT_SQ_DEPTH`].
    pub sq_depth: u32,
    /// Receive queue depth in WQEs, i.e. receive buffers; a power of two in
    /// 1..=[`MAX_RQ_DEPTH`]. Default [`DEFAULT_RQ_DEPTH`].
    pub rq_depth: u32,
    /// Most datagrams one `rx_burst` returns (and the event loop's TX batch);
    /// 1..=`rq_depth`. Default [`DEFAULT_RX_BATCH`].
    pub rx_batch: usize,
    /// One send WQE in this many is signaled (more when the queue runs low); 1..=`sq_depth`.
    /// Default [`DEFAULT_SIGNAL_INTERVAL`].
    pub signal_interval: u32,
    /// Q_Key of the QP and of every destination. Default [`DEFAULT_QKEY`].
    pub qkey: u32,
}

impl Default for UdConfig {
    /// eRPC's InfiniBand defaults (seeds/000 §12.5).
    fn default() -> Self {
        UdConfig {
            mtu: DEFAULT_MTU,
            sq_depth: DEFAULT_SQ_DEPTH,
            rq_depth: DEFAULT_RQ_DEPTH,
            rx_batch: DEFAULT_RX_BATCH,
            signal_interval: DEFAULT_SIGNAL_INTERVAL,
            qkey: DEFAULT_QKEY,
        }
    }
}

impl UdConfig {
    /// The defaults with the MTU capped at the port's active MTU (a port with a 2048-byte MTU
    /// gets `mtu` 2048).
    pub fn for_port(port: &PortInfo) -> Self {
        UdConfig {
            mtu: DEFAULT_MTU.min(port.active_mtu as usize),
            ..UdConfig::default()
        }
    }

    /// Checks the ranges documented on the fields against `port`.
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] naming the first bad field;
    /// [`io::ErrorKind::Unsupported`] for a RoCE port.
    pub fn validate(&self, port: &PortInfo) -> io::Result<()> {
        if port.link_layer != LinkLayer::InfiniBand {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "mlx5 UD transport: RoCE ports are not supported (UD address vectors here carry \
                 no MAC/UDP fields); use the UDP transport",
            ));
        }
        let bad = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        let port_mtu = port.active_mtu as usize;
        if !(PKT_HDR_LEN..=port_mtu).contains(&self.mtu) {
            return bad(format!(
                "UD transport mtu {} outside {PKT_HDR_LEN}..={port_mtu} (port MTU)",
                self.mtu
            ));
        }
        if !(1..=MAX_SQ_DEPTH).contains(&self.sq_depth) {
            return bad(format!(
                "UD transport sq_depth {} outside 1..={MAX_SQ_DEPTH}",
                self.sq_depth
            ));
        }
        if !self.rq_depth.is_power_of_two() || self.rq_depth > MAX_RQ_DEPTH {
            return bad(format!(
                "UD transport rq_depth {} is not a power of two <= {MAX_RQ_DEPTH}",
                self.rq_depth
            ));
        }
        if !(1..=self.rq_depth as usize).contains(&self.rx_batch) {
            return bad(format!(
                "UD transport rx_batch {} outside 1..={}",
                self.rx_batch, self.rq_depth
            ));
        }
        if !(1..=self.sq_depth).contains(&self.signal_interval) {
            return bad(format!(
                "UD transport signal_interval {} outside 1..={}",
                self.signal_interval, self.sq_depth
            ));
        }
        Ok(())
    }
}

/// A signaled send WQE not yet completed.
#[derive(Clone, Copy, Debug, Default)]
struct Signaled {
    /// Its `wqe_index` (what the requester CQE's `wqe_counter` names).
    wqe_index: u16,
    /// The transport's send sequence number after it: every WQE before this is retired when
    /// its CQE arrives.
    seq_after: u64,
}

/// FIFO of signaled WQEs in posting order (fixed capacity `sq_depth`: each entry is a
/// distinct outstanding WQE).
#[derive(Debug)]
struct SignaledRing {
    buf: Box<[Signaled]>,
    head: usize,
    len: usize,
}

impl SignaledRing {
    fn new(cap: usize) -> Self {
        SignaledRing {
            buf: vec![Signaled::default(); cap].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    fn push(&mut self, s: Signaled) {
        debug_assert!(
            self.len < self.buf.len(),
            "more signaled WQEs than SQ entries"
        );
        if self.len == self.buf.len() {
            return;
        }
        // `head` and `len` are below the capacity: one conditional subtraction wraps the
        // index (no division).
        let mut i = self.head + self.len;
        if i >= self.buf.len() {
            i -= self.buf.len();
        }
        self.buf[i] = s;
        self.len += 1;
    }

    fn pop(&mut self) -> Option<Signaled> {
        if self.len == 0 {
            return None;
        }
        let s = self.buf[self.head];
        self.head += 1;
        if self.head == self.buf.len() {
            self.head = 0;
        }
        self.len -= 1;
        Some(s)
    }

    fn clear(&mut self) {
        self.len = 0;
    }
}

/// Outcome of a room check before a post.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Room {
    /// The WQE can be posted.
    Yes,
    /// No room even after polling the send CQ: the burst stops here.
    No,
    /// The QP failed (seen while polling the send CQ).
    Failed,
}

/// A datagram of the current receive burst.
#[derive(Clone, Copy, Debug, Default)]
struct RxMeta {
    addr: UdAddr,
    /// Byte offset of its payload in the receive ring (`buffer index * rx_stride +
    /// RX_PAYLOAD_OFFSET`), computed once when the burst is polled.
    off: usize,
    /// Payload length in bytes (GRH excluded).
    len: u32,
}

/// The panic of [`UdTransport::rx_pkt`] for an index outside the current burst (a caller
/// bug), out of line.
#[cold]
#[inline(never)]
fn rx_pkt_outside(i: usize, count: usize) -> ! {
    panic!("rx_pkt({i}) outside the current burst of {count}")
}

/// `ds` (16-byte units) of the UD SEND WQE for a datagram of `len` bytes: control segment,
/// address vector, then an inline segment (`len <= inline_max`, none for an empty datagram)
/// or `sges` data segments (1 for a staged copy or a contiguous in-place packet, 2 for an
/// in-place header and data apart).
fn send_ds(len: usize, inline_max: usize, sges: usize) -> u32 {
    let body = if len == 0 {
        0
    } else if len <= inline_max {
        inline_seg_bytes(len)
    } else {
        sges * DATA_BYTES
    };
    ((CTRL_BYTES + DGRAM_BYTES + body) / DS_BYTES) as u32
}

/// Most data segments of a send WQE here: header and data of an in-place packet.
const MAX_SEND_SGES: usize = 2;

/// Receive buffers re-posted at once (seeds/000 §12.5 `kRecvSlack` = 32).
pub const RECV_SLACK: u32 = 32;

/// Consumed receive buffers that trigger a re-post for a queue of `rq_depth` WQEs:
/// `clamp(rq_depth / 16, 1, RECV_SLACK)`, so at least 15/16 of the queue stays posted (32 of
/// the default 512; every buffer at once for a queue of fewer than 32).
#[inline]
fn recv_slack(rq_depth: u32) -> u64 {
    u64::from((rq_depth / 16).clamp(1, RECV_SLACK))
}

/// The bytes of packet `p` (at most [`MAX_INLINE`]) as one slice for an inline segment:
/// `hdr` or `data` alone when the other is empty, both in place when `data` directly follows
/// `hdr` in the packet's message buffer (packet 0 of a message, seeds/000 §3), else both
/// copied into `staged`.
#[inline(always)]
fn inline_bytes<'a, A>(p: &TxPkt<'a, A>, staged: &'a mut [u8; MAX_INLINE]) -> &'a [u8] {
    if p.data.is_empty() {
        return p.hdr;
    }
    if p.hdr.is_empty() {
        return p.data;
    }
    if let Some(mem) = p.mem
        && p.hdr.as_ptr_range().end == p.data.as_ptr()
        && inside(mem, p.hdr)
        && inside(mem, p.data)
    {
        // SAFETY: `hdr` and `data` both lie inside the one allocation of `mem` (checked) and
        // `data` starts where `hdr` ends, so the `hdr.len() + data.len()` bytes from
        // `hdr`'s start are one initialised range of that allocation, borrowed for `'a` as
        // both parts are (`p.mem` borrows the buffer for `'a`).
        return unsafe { std::slice::from_raw_parts(p.hdr.as_ptr(), p.hdr.len() + p.data.len()) };
    }
    let len = p.hdr.len() + p.data.len();
    staged[..p.hdr.len()].copy_from_slice(p.hdr);
    staged[p.hdr.len()..len].copy_from_slice(p.data);
    &staged[..len]
}

/// Whether `part` lies inside `mem` (an empty part always does: it gets no data segment).
#[inline]
fn inside(mem: &DmaBuf, part: &[u8]) -> bool {
    let base = mem.as_ptr() as usize;
    let start = part.as_ptr() as usize;
    part.is_empty() || (start >= base && start + part.len() <= base + mem.len())
}

/// A message buffer registered for in-place sends (module docs, "What is copied and why").
struct TxReg {
    /// The buffer; weak, so the registration does not keep it mapped. It also keeps the
    /// `Arc` allocation, whose address keys `reg_index`, from being reused while the entry
    /// exists.
    buf: Weak<DmaBuf>,
    /// Its memory region (deregistered when the entry is dropped).
    mr: Mr,
}

/// A message buffer read by posted, not yet retired in-place sends: holding the `Arc` keeps
/// it mapped until the NIC is done with it.
#[derive(Debug)]
struct Pin {
    /// Sequence number of the last WQE posted from it; retired once `tx_retired` passes it.
    last_seq: u64,
    buf: Arc<DmaBuf>,
}

/// The fields of a successful receive completion that decide its fate, read in place
/// ([`CqeRef`]) on the receive path or taken from a decoded [`Cqe`].
#[derive(Clone, Copy, Debug)]
struct RxFields {
    /// CQE opcode nibble.
    opcode: u8,
    /// Immediate (host order).
    imm: u32,
    /// Bytes received, GRH area included.
    byte_cnt: u32,
}

impl RxFields {
    #[inline(always)]
    fn of(c: &CqeRef<'_>) -> Self {
        RxFields {
            opcode: c.opcode(),
            imm: c.imm(),
            byte_cnt: c.byte_cnt(),
        }
    }
}

impl From<&Cqe> for RxFields {
    fn from(c: &Cqe) -> Self {
        RxFields {
            opcode: c.opcode,
            imm: c.imm,
            byte_cnt: c.byte_cnt,
        }
    }
}

/// Why a successful receive completion is not delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RxDrop {
    /// Not this transport's datagram (no SEND with our immediate, or shorter than the GRH
    /// area): counted in `rx_errors`.
    Foreign,
    /// Longer than `mtu`: counted in `rx_oversized`.
    Oversized,
}

/// The payload length in bytes (GRH area excluded) of the datagram a successful receive
/// completion `c` reports, or why it is dropped (module docs, "Datagram layout"). Total over
/// every CQE value: fields the NIC (or a peer's model) wrote are checked, never trusted.
fn rx_payload_len(c: &RxFields, mtu: usize) -> Result<usize, RxDrop> {
    if c.opcode != CqeOpcode::RespSendImm as u8 || c.imm & IMM_MAGIC_MASK != IMM_MAGIC {
        return Err(RxDrop::Foreign);
    }
    let len = (c.byte_cnt as usize)
        .checked_sub(GRH_BYTES)
        .ok_or(RxDrop::Foreign)?;
    if len > mtu {
        return Err(RxDrop::Oversized);
    }
    Ok(len)
}

/// A receive completed in error: counted in `rx_errors`; a flush error (the QP went to the
/// error state) fails the transport.
#[cold]
#[inline(never)]
fn rx_error(c: &Cqe, stats: &mut TransportStats, failed: &mut Option<CqeError>) {
    stats.rx_errors += 1;
    if c.syndrome == Syndrome::WrFlush as u8
        && let Err(e) = c.status()
    {
        failed.get_or_insert(e);
    }
}

fn device_error(what: &str, e: mlx5::Error) -> io::Error {
    io::Error::other(format!("mlx5 UD transport: {what}: {e}"))
}

/// eRPC datagram transport over one mlx5 UD QP; see the [module docs](self).
pub struct UdTransport {
    // Fields drop in declaration order: the QP before its CQs, address handles, memory
    // regions before their buffers (message buffers' regions before the pins that may keep
    // them mapped), everything before the PD.
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    ahs: HashMap<UdAddr, Ah>,
    /// Registered message buffers (in-place sends).
    regs: Vec<TxReg>,
    /// `regs` index by the address of the buffer's `Arc` allocation.
    reg_index: HashMap<usize, usize>,
    /// The last buffer looked up: (`Arc` address, `regs` index, lkey).
    last_reg: Option<(usize, usize, u32)>,
    /// Registrations at which the next sweep of dead entries runs.
    sweep_at: usize,
    /// Message buffers with in-place sends outstanding, in posting order (at most one entry
    /// per outstanding WQE, so at most `sq_depth`; allocated once).
    pins: VecDeque<Pin>,
    rx_mr: Mr,
    tx_mr: Mr,
    rx_buf: DmaBuf,
    tx_buf: DmaBuf,
    pd: Pd,
    /// The device (for address handles).
    ctx: Context,
    cfg: UdConfig,
    local: UdAddr,
    /// Immediate of every send: `IMM_MAGIC | our LID`.
    imm: u32,
    /// Largest datagram sent inline: `min(MAX_INLINE, QP's max_inline)`.
    inline_max: usize,
    /// Bytes per staging slot (`mtu` rounded up to 64).
    tx_stride: usize,
    /// Send WQEs posted (the next one's sequence number; its staging slot is
    /// `seq % sq_depth`).
    tx_posted: u64,
    /// Posts until the next one that is signaled by the interval rule: `signal_interval -
    /// tx_posted % signal_interval` (so WQE `seq` is due when `(seq + 1) % signal_interval ==
    /// 0`), kept as a countdown instead of a division per post.
    tx_to_signal: u32,
    /// WQEs were posted by [`tx_post`](DatagramTransport::tx_post) since the last doorbell.
    tx_unrung: bool,
    /// Send WQEs known complete (retired by a CQE).
    tx_retired: u64,
    /// Signaled WQEs outstanding, oldest first.
    signaled: SignaledRing,
    /// The last destination sent to (`None` before the first send), and its address vector
    /// encoded once ([`DgramSeg::encode`]), so that a send to it copies 48 bytes.
    last_dest: Option<UdAddr>,
    /// The encoded address vector of `last_dest` (meaningless while it is `None`).
    last_av: EncodedAv,
    /// Bytes per receive buffer (`64 + port MTU`, rounded up to 64).
    rx_stride: usize,
    /// Receive WQEs posted since creation (WQE `k` uses buffer `k % rq_depth`).
    rx_posted: u64,
    /// Receive completions consumed since creation (completion `k` is WQE `k`: an RQ
    /// completes in order).
    rx_consumed: u64,
    /// `rx_consumed` at which [`recv_slack`] buffers are consumed and the next re-post is due:
    /// `rx_posted + recv_slack - rq_depth` (0 if negative), kept by `post_receives`, so that
    /// the test on every release is one comparison.
    rx_repost_at: u64,
    /// The datagrams of the current burst (empty once released); capacity `rx_batch`,
    /// allocated once, so that filling it never allocates.
    rx_meta: Vec<RxMeta>,
    /// First error completion seen; the QP is in the error state.
    failed: Option<CqeError>,
    stats: TransportStats,
}

impl fmt::Debug for UdTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdTransport")
            .field("local", &self.local)
            .field("cfg", &self.cfg)
            .field("tx_outstanding", &(self.tx_posted - self.tx_retired))
            .field("destinations", &self.ahs.len())
            .field("rx_count", &self.rx_meta.len())
            .field("failed", &self.failed)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl UdTransport {
    /// Creates the UD QP, CQs and registered rings on `ctx` as `cfg` says, activates the QP
    /// with `cfg.qkey` and posts every receive buffer.
    ///
    /// Memory: `rq_depth * (64 + port MTU)` bytes of receive ring and `sq_depth * mtu`
    /// (rounded up to 64 B per slot) of staging ring, both registered.
    ///
    /// # Errors
    /// Those of [`UdConfig::validate`]; [`io::ErrorKind::Other`] wrapping the device's error
    /// when an object cannot be created.
    pub fn new(ctx: &Context, cfg: UdConfig) -> io::Result<Self> {
        let port = ctx.port();
        cfg.validate(&port)?;
        let pd = ctx.alloc_pd().map_err(|e| device_error("alloc_pd", e))?;
        let send_cq = ctx
            .create_cq(2 * cfg.sq_depth)
            .map_err(|e| device_error("create send CQ", e))?;
        let recv_cq = ctx
            .create_cq(cfg.rq_depth)
            .map_err(|e| device_error("create receive CQ", e))?;
        let mut qp = ctx
            .create_qp(
                &pd,
                &QpInit {
                    qp_type: QpType::Ud,
                    send_cq: &send_cq,
                    recv_cq: &recv_cq,
                    srq: None,
                    caps: QpCaps {
                        max_send_wr: cfg.sq_depth,
                        max_recv_wr: cfg.rq_depth,
                        max_send_sge: MAX_SEND_SGES as u32,
                        max_recv_sge: 1,
                        max_inline_data: MAX_INLINE as u32,
                    },
                },
            )
            .map_err(|e| device_error("create UD QP", e))?;
        qp.activate_ud(cfg.qkey)
            .map_err(|e| device_error("activate UD QP", e))?;
        let rq_room = qp.rq.as_ref().map_or(0, |rq| rq.free());
        if rq_room < cfg.rq_depth || recv_cq.cq.cqe_cnt() < cfg.rq_depth {
            return Err(io::Error::other(format!(
                "mlx5 UD transport: device gave {rq_room} receive WQEs and {} receive CQEs, \
                 {} needed",
                recv_cq.cq.cqe_cnt(),
                cfg.rq_depth
            )));
        }

        let rx_stride = (RX_PAYLOAD_OFFSET + port.active_mtu as usize).next_multiple_of(ALIGN);
        let rx_buf = DmaBuf::new(cfg.rq_depth as usize * rx_stride)
            .map_err(|e| device_error("receive ring", e))?;
        // SAFETY: `rx_buf` and `tx_buf` are owned by the transport with their MRs, which are
        // declared (dropped) before them and outlive every WQE (drained on drop).
        let rx_mr =
            unsafe { ctx.reg_mr(&pd, rx_buf.as_mut_ptr(), rx_buf.len(), Access::LOCAL_WRITE) }
                .map_err(|e| device_error("register receive ring", e))?;
        let tx_stride = cfg.mtu.next_multiple_of(ALIGN);
        let tx_buf = DmaBuf::new(cfg.sq_depth as usize * tx_stride)
            .map_err(|e| device_error("staging ring", e))?;
        // SAFETY: as above.
        let tx_mr = unsafe { ctx.reg_mr(&pd, tx_buf.as_mut_ptr(), tx_buf.len(), Access::empty()) }
            .map_err(|e| device_error("register staging ring", e))?;

        let inline_max = MAX_INLINE.min(qp.sq.mem().max_inline() as usize);
        let local = UdAddr::new(port.lid, qp.qpn());
        let mut t = UdTransport {
            qp,
            send_cq,
            recv_cq,
            ahs: HashMap::new(),
            regs: Vec::new(),
            reg_index: HashMap::new(),
            last_reg: None,
            sweep_at: MIN_SWEEP,
            pins: VecDeque::with_capacity(cfg.sq_depth as usize + 1),
            rx_mr,
            tx_mr,
            rx_buf,
            tx_buf,
            pd,
            ctx: ctx.clone(),
            cfg,
            local,
            imm: IMM_MAGIC | u32::from(port.lid),
            inline_max,
            tx_stride,
            tx_posted: 0,
            tx_to_signal: cfg.signal_interval,
            tx_unrung: false,
            tx_retired: 0,
            signaled: SignaledRing::new(cfg.sq_depth as usize),
            last_dest: None,
            last_av: EncodedAv([0; DGRAM_BYTES]),
            rx_stride,
            rx_posted: 0,
            rx_consumed: 0,
            rx_repost_at: 0,
            rx_meta: Vec::with_capacity(cfg.rx_batch),
            failed: None,
            stats: TransportStats::default(),
        };
        t.repost_receives();
        if t.rx_posted != u64::from(cfg.rq_depth) {
            return Err(io::Error::other(
                "mlx5 UD transport: could not post the receive ring",
            ));
        }
        Ok(t)
    }

    /// The configuration in use.
    pub fn config(&self) -> &UdConfig {
        &self.cfg
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    /// The first error completion seen, if the QP has failed (see the module docs, "Errors").
    pub fn qp_error(&self) -> Option<CqeError> {
        self.failed
    }

    /// Destinations with a cached address handle.
    pub fn known_destinations(&self) -> usize {
        self.ahs.len()
    }

    /// Send WQEs posted and not yet known complete (at most `sq_depth`).
    pub fn tx_outstanding(&self) -> usize {
        (self.tx_posted - self.tx_retired) as usize
    }

    /// The error of a transport whose QP failed with `e`.
    #[cold]
    #[inline(never)]
    fn qp_failed(&self, e: CqeError) -> io::Error {
        io::Error::new(
            io::ErrorKind::BrokenPipe,
            format!("mlx5 UD transport: QP {:#x} failed: {e}", self.qp.qpn()),
        )
    }

    /// [`qp_failed`](Self::qp_failed) for a QP that was just seen failing.
    #[cold]
    #[inline(never)]
    fn qp_failed_now(&self) -> io::Error {
        match self.failed {
            Some(e) => self.qp_failed(e),
            None => io::Error::other("mlx5 UD transport: QP failed"),
        }
    }

    /// Retires completed sends by polling the send CQ; returns the number of send WQEs known
    /// complete afterwards that were not before. `tx_burst` does this itself when the queue
    /// runs low; call it to free the send queue without sending.
    pub fn poll_tx_completions(&mut self) -> usize {
        let before = self.tx_retired;
        self.poll_send_cq();
        (self.tx_retired - before) as usize
    }

    /// Polls the send CQ: successful CQEs retire the WQEs up to the signaled one they name;
    /// an error CQE marks the transport failed.
    fn poll_send_cq(&mut self) {
        let UdTransport {
            send_cq,
            qp,
            signaled,
            tx_posted,
            tx_retired,
            failed,
            cfg,
            ..
        } = self;
        let budget = 2 * cfg.sq_depth as usize;
        send_cq.cq.poll(budget, |c| {
            qp.sq.retire(c.wqe_counter);
            if let Err(e) = c.status() {
                failed.get_or_insert(e);
                signaled.clear();
                *tx_retired = *tx_posted;
                return;
            }
            while let Some(s) = signaled.pop() {
                if s.wqe_index == c.wqe_counter {
                    *tx_retired = s.seq_after;
                    break;
                }
            }
        });
        self.unpin_retired();
    }

    /// Drops the pins of message buffers whose last in-place WQE is retired (or every pin
    /// once the QP failed: its WQEs are flushed, not executed).
    #[inline]
    fn unpin_retired(&mut self) {
        while self
            .pins
            .front()
            .is_some_and(|p| p.last_seq < self.tx_retired)
        {
            self.pins.pop_front();
        }
    }

    /// Message buffers with in-place sends not yet known complete.
    pub fn pinned_buffers(&self) -> usize {
        self.pins.len()
    }

    /// Message buffers currently registered for in-place sends (live, or dropped and not
    /// yet swept).
    pub fn registered_buffers(&self) -> usize {
        self.regs.len()
    }

    /// The lkey under which `mem` can be gathered from, registering it on first use; `None`
    /// if the device refuses (the packet is then copied). Not inlined: it keeps the hash
    /// lookup out of the inline-send path of `post_send` (measured with
    /// `scripts/callgrind-erpc.sh`).
    #[inline(never)]
    fn tx_lkey(&mut self, mem: &Arc<DmaBuf>) -> Option<u32> {
        let key = Arc::as_ptr(mem) as usize;
        if let Some((k, _, lkey)) = self.last_reg
            && k == key
        {
            return Some(lkey);
        }
        let (idx, lkey) = match self.reg_index.get(&key) {
            Some(&i) => (i, self.regs[i].mr.lkey),
            None => self.register(mem)?,
        };
        self.last_reg = Some((key, idx, lkey));
        Some(lkey)
    }

    /// Registers `mem` with the PD (local read only) and records it; sweeps dead
    /// registrations first when their number reached the threshold.
    #[cold]
    #[inline(never)]
    fn register(&mut self, mem: &Arc<DmaBuf>) -> Option<(usize, u32)> {
        if self.regs.len() >= self.sweep_at {
            self.sweep_registrations();
        }
        // `as_mut_ptr` only because `reg_mr` takes one; the region is registered without
        // LOCAL_WRITE, so the NIC only reads it.
        // SAFETY: local read only (no remote access, no device writes); a send names this
        // lkey only while it holds `mem` alive, until its completion (module docs), and dead
        // registrations are swept only once no send reads them.
        let mr = match unsafe {
            self.ctx
                .reg_mr(&self.pd, mem.as_mut_ptr(), mem.len(), Access::empty())
        } {
            Ok(mr) => mr,
            Err(e) => {
                tracing::debug!(error = %e, "mlx5 UD transport: registering a message buffer failed");
                return None;
            }
        };
        let lkey = mr.lkey;
        let idx = self.regs.len();
        self.regs.push(TxReg {
            buf: Arc::downgrade(mem),
            mr,
        });
        self.reg_index.insert(Arc::as_ptr(mem) as usize, idx);
        self.stats.tx_registrations += 1;
        Some((idx, lkey))
    }

    /// Deregisters the message buffers that were dropped and are no longer read by any
    /// posted WQE (no strong reference left: neither the owner nor a pin holds them).
    #[cold]
    fn sweep_registrations(&mut self) {
        self.regs.retain(|r| r.buf.strong_count() > 0);
        self.reg_index.clear();
        for (i, r) in self.regs.iter().enumerate() {
            self.reg_index.insert(r.buf.as_ptr() as usize, i);
        }
        self.last_reg = None;
        self.sweep_at = (2 * self.regs.len()).max(MIN_SWEEP);
    }

    /// Whether a WQE of `ds` units can be posted now (a free staging slot and WQEBBs).
    #[inline]
    fn tx_has_room(&self, ds: u32) -> bool {
        self.tx_posted - self.tx_retired < u64::from(self.cfg.sq_depth) && self.qp.sq.has_room(ds)
    }

    /// [`tx_has_room`](Self::tx_has_room), polling the send CQ once if not.
    #[inline]
    fn tx_room_polled(&mut self, ds: u32) -> Room {
        if self.tx_has_room(ds) {
            return Room::Yes;
        }
        self.poll_send_cq();
        if self.failed.is_some() {
            Room::Failed
        } else if self.tx_has_room(ds) {
            Room::Yes
        } else {
            Room::No
        }
    }

    /// Whether a staging slot is free (fewer than `sq_depth` WQEs outstanding), polling the
    /// send CQ once if not.
    #[inline]
    fn tx_slot(&mut self) -> Room {
        let depth = u64::from(self.cfg.sq_depth);
        if self.tx_posted - self.tx_retired < depth {
            return Room::Yes;
        }
        self.poll_send_cq();
        if self.failed.is_some() {
            Room::Failed
        } else if self.tx_posted - self.tx_retired < depth {
            Room::Yes
        } else {
            Room::No
        }
    }

    /// Makes `dest` the destination of the next sends (`last_dest`, its encoded address
    /// vector in `last_av`), creating and caching its address handle on first use. `false`
    /// if the device refuses to create it.
    #[inline]
    fn select_dest(&mut self, dest: UdAddr) -> bool {
        if self.last_dest == Some(dest) {
            return true;
        }
        self.select_other_dest(dest)
    }

    /// [`select_dest`](Self::select_dest) for a destination other than the last one.
    #[inline(never)]
    fn select_other_dest(&mut self, dest: UdAddr) -> bool {
        let av = match self.ahs.get(&dest) {
            Some(ah) => ah.av,
            None => match self.create_ah(dest) {
                Some(av) => av,
                None => return false,
            },
        };
        self.last_av = av.encode();
        self.last_dest = Some(dest);
        true
    }

    #[cold]
    #[inline(never)]
    fn create_ah(&mut self, dest: UdAddr) -> Option<DgramSeg> {
        match self.ctx.create_ah(&self.pd, &dest.dest(self.cfg.qkey)) {
            Ok(ah) => {
                let av = ah.av;
                self.ahs.insert(dest, ah);
                Some(av)
            }
            Err(e) => {
                tracing::debug!(%dest, error = %e, "mlx5 UD transport: create_ah failed");
                None
            }
        }
    }

    /// Posts one UD SEND-with-immediate WQE for `p` to the selected destination
    /// ([`select_dest`](Self::select_dest); room was checked). `end_of_run`:
    /// `p` is the last packet of the burst, or the next one is not sent in place; an in-place
    /// WQE there is signaled, so that its buffer's pin is dropped at the next poll instead
    /// of up to `signal_interval` WQEs later.
    #[inline]
    fn post_send(&mut self, p: &TxPkt<'_, UdAddr>, end_of_run: bool) -> mlx5::Result<()> {
        let len = p.len();
        let seq = self.tx_posted;
        // In place when the packet is not inline, names its buffer, lies inside it and the
        // buffer is (or can be) registered; otherwise staged.
        let gather = match p.mem {
            Some(mem) if len > self.inline_max && inside(mem, p.hdr) && inside(mem, p.data) => {
                self.tx_lkey(mem).map(|lkey| (mem, lkey))
            }
            _ => None,
        };
        let mut sge = [Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        }; MAX_SEND_SGES];
        let nsge = match gather {
            Some((_, lkey)) => {
                let mut n = 0;
                for part in [p.hdr, p.data] {
                    if part.is_empty() {
                        continue;
                    }
                    let addr = part.as_ptr() as u64;
                    // Packet 0: header and data adjacent, one segment (seeds/000 §3).
                    if n == 1 && sge[0].addr + u64::from(sge[0].len) == addr {
                        sge[0].len += part.len() as u32;
                    } else {
                        sge[n] = Sge {
                            addr,
                            len: part.len() as u32,
                            lkey,
                        };
                        n += 1;
                    }
                }
                n
            }
            None => 1,
        };
        let ds = send_ds(len, self.inline_max, nsge);
        let sq_depth = u64::from(self.cfg.sq_depth);
        let full_after = seq + 1 - self.tx_retired >= sq_depth;
        let low_after = self
            .qp
            .sq
            .free_wqebbs()
            .saturating_sub(self.qp.sq.wqebbs_needed(ds))
            < LOW_WQEBBS;
        let signaled =
            self.tx_to_signal == 1 || full_after || low_after || (gather.is_some() && end_of_run);
        let mut staged = [0u8; MAX_INLINE];
        let (inline, sges): (&[u8], &[Sge]) = if len <= self.inline_max {
            (inline_bytes(p, &mut staged), &[])
        } else if gather.is_some() {
            (&[], &sge[..nsge])
        } else {
            let off = (seq % sq_depth) as usize * self.tx_stride;
            // SAFETY: slot `seq % sq_depth` lies inside the staging ring (`sq_depth *
            // tx_stride` bytes, `len <= mtu <= tx_stride`); the WQE that used it before,
            // `seq - sq_depth`, is retired (room check: fewer than `sq_depth` outstanding), so
            // the device no longer reads it.
            unsafe { self.stage(off, p.hdr, p.data) };
            sge[0] = Sge {
                addr: self.tx_buf.as_ptr() as u64 + off as u64,
                len: len as u32,
                lkey: self.tx_mr.lkey,
            };
            (&[], &sge[..1])
        };
        let desc = WqeDesc {
            opcode: Opcode::SendImm,
            flags: if signaled { CQ_UPDATE } else { 0 },
            imm: self.imm,
            ud: None,
            remote: None,
            atomic: None,
            inline,
            sges,
        };
        debug_assert_eq!(desc.ds() + (DGRAM_BYTES / DS_BYTES) as u32, ds);
        let wqe_index = self.qp.sq.post_ud(&self.last_av, &desc)?;
        if let Some((mem, _)) = gather {
            // Keep the buffer mapped until this WQE retires (module docs).
            match self.pins.back_mut() {
                Some(pin) if Arc::ptr_eq(&pin.buf, mem) => pin.last_seq = seq,
                _ => self.pins.push_back(Pin {
                    last_seq: seq,
                    buf: Arc::clone(mem),
                }),
            }
            self.stats.tx_in_place += 1;
        }
        self.posted(seq, wqe_index, signaled, len);
        Ok(())
    }

    /// [`post_send`](Self::post_send) for a non-empty datagram of at most `inline_max` bytes:
    /// `hdr` and `data` are written straight into the WQE's inline segment
    /// ([`SendQueue::post_ud_inline`](mlx5::sq::SendQueue::post_ud_inline)), with no staging
    /// copy and no gather decision (an inline packet never pins its buffer). The SQ checks
    /// its WQEBB room (`SqFull` if none; the caller checked the staging count) and signals
    /// the WQE when fewer than [`LOW_WQEBBS`] stay free after it.
    #[inline(always)]
    fn post_send_inline(&mut self, hdr: &[u8], data: &[u8]) -> mlx5::Result<()> {
        let len = hdr.len() + data.len();
        let seq = self.tx_posted;
        let full_after = seq + 1 - self.tx_retired >= u64::from(self.cfg.sq_depth);
        let due = self.tx_to_signal == 1 || full_after;
        let flags = if due { CQ_UPDATE } else { 0 };
        let (wqe_index, signaled) =
            self.qp
                .sq
                .post_ud_inline(&self.last_av, flags, self.imm, hdr, data, LOW_WQEBBS)?;
        self.posted(seq, wqe_index, signaled, len);
        Ok(())
    }

    /// Whether a burst goes on after the room check `room`: not when the QP failed, nor
    /// when there is no room (counted in `tx_would_block`).
    #[inline(always)]
    fn room_go(&mut self, room: Room) -> bool {
        match room {
            Room::Yes => true,
            Room::Failed => false,
            Room::No => {
                self.stats.tx_would_block += 1;
                false
            }
        }
    }

    /// Books a successful post of send WQE number `seq` (at `wqe_index`, `len` bytes):
    /// advances `tx_posted` and the signal countdown (`tx_to_signal`), remembers a signaled
    /// WQE for retirement, and counts the packet.
    #[inline(always)]
    fn posted(&mut self, seq: u64, wqe_index: u16, signaled: bool, len: usize) {
        self.tx_posted = seq + 1;
        self.tx_to_signal = if self.tx_to_signal <= 1 {
            self.cfg.signal_interval
        } else {
            self.tx_to_signal - 1
        };
        if signaled {
            self.signaled.push(Signaled {
                wqe_index,
                seq_after: seq + 1,
            });
        }
        self.stats.tx_pkts += 1;
        self.stats.tx_bytes += len as u64;
    }

    /// Copies `hdr` then `data` into the staging ring at byte `off`.
    ///
    /// # Safety
    /// `off + hdr.len() + data.len()` is within the staging ring and no posted, unretired WQE
    /// reads those bytes.
    #[inline]
    unsafe fn stage(&mut self, off: usize, hdr: &[u8], data: &[u8]) {
        debug_assert!(off + hdr.len() + data.len() <= self.tx_buf.len());
        let dst = self.tx_buf.as_mut_ptr();
        // SAFETY: caller's contract; the source slices are caller memory, never the ring
        // (it is private to this transport), so they do not overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(hdr.as_ptr(), dst.add(off), hdr.len());
            std::ptr::copy_nonoverlapping(data.as_ptr(), dst.add(off + hdr.len()), data.len());
        }
    }

    /// Re-posts every consumed receive buffer (one doorbell) once at least
    /// [`recv_slack`] of them are consumed, unless the QP has failed (seeds/000 §12.5
    /// `kRecvSlack`: receives are re-posted in batches, so the per-datagram cost is a counter
    /// test, not a WQE and a doorbell record write).
    #[inline]
    fn repost_receives(&mut self) {
        // `rx_consumed >= rx_repost_at` is `rq_depth - (rx_posted - rx_consumed) >=
        // recv_slack`: that many buffers are free.
        if self.rx_consumed < self.rx_repost_at || self.failed.is_some() {
            return;
        }
        let depth = u64::from(self.cfg.rq_depth);
        self.post_receives(depth - (self.rx_posted - self.rx_consumed));
    }

    /// Posts `want` receive WQEs for the next consumed buffers, in ring order, one doorbell.
    #[inline(never)]
    fn post_receives(&mut self, want: u64) {
        let depth = u64::from(self.cfg.rq_depth);
        let Some(rq) = self.qp.rq.as_mut() else {
            return;
        };
        // Buffer `k % rq_depth` always goes to WQE `k`, at slot `k % wqe_cnt`: with a ring of
        // exactly `rq_depth` WQEs, each slot is always posted with the same buffer, so once
        // every buffer was posted the slots already hold the right WQEs and a re-post only
        // moves the producer counter (eRPC's fixed RECV descriptors, seeds/000 §12.5).
        // SAFETY (both posts below): the buffers re-posted are consumed ones: their
        // completions were polled, and the slices `rx_pkt` lent out of them borrowed `self`,
        // which this `&mut self` call proves ended (`rx_release`); `rx_buf`, registered as
        // `rx_mr`, lives as long as the QP (it is dropped after it, field order).
        if rq.wqe_cnt() == self.cfg.rq_depth
            && self.rx_posted >= depth
            // SAFETY: see above.
            && u32::try_from(want).is_ok_and(|n| unsafe { rq.repost(n) })
        {
            self.rx_posted += want;
            rq.ring_doorbell();
            self.rx_repost_at =
                (self.rx_posted + recv_slack(self.cfg.rq_depth)).saturating_sub(depth);
            return;
        }
        let base = self.rx_buf.as_ptr() as u64;
        let len = (GRH_BYTES + (self.rx_stride - RX_PAYLOAD_OFFSET)) as u32;
        for _ in 0..want {
            let buf = self.rx_posted % depth;
            let sge = Sge {
                addr: base + buf * self.rx_stride as u64 + RX_GRH_OFFSET as u64,
                len,
                lkey: self.rx_mr.lkey,
            };
            // SAFETY: see above.
            if unsafe { rq.post(&[sge]) }.is_err() {
                break;
            }
            self.rx_posted += 1;
        }
        rq.ring_doorbell();
        self.rx_repost_at = (self.rx_posted + recv_slack(self.cfg.rq_depth)).saturating_sub(depth);
    }
}

impl DatagramTransport for UdTransport {
    type Addr = UdAddr;

    fn mtu(&self) -> usize {
        self.cfg.mtu
    }

    fn local_addr(&self) -> UdAddr {
        self.local
    }

    fn rx_batch(&self) -> usize {
        self.cfg.rx_batch
    }

    /// `rq_depth`: one receive WQE per datagram (seeds/000 §12.5 `kRQDepth`).
    fn rx_ring_entries(&self) -> usize {
        self.cfg.rq_depth as usize
    }

    fn tx_burst(&mut self, pkts: &[TxPkt<'_, UdAddr>]) -> io::Result<usize> {
        if let Some((i, p)) = pkts
            .iter()
            .enumerate()
            .find(|(_, p)| p.len() > self.cfg.mtu)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "packet {i} is {} bytes, above the UD transport mtu {}",
                    p.len(),
                    self.cfg.mtu
                ),
            ));
        }
        if pkts.is_empty() {
            return Ok(0);
        }
        if self.tx_posted - self.tx_retired + pkts.len() as u64 > u64::from(self.cfg.sq_depth) {
            self.poll_send_cq();
        }
        let mut done = 0;
        let mut posted = 0;
        let mut post_error = None;
        for (i, p) in pkts.iter().enumerate() {
            if self.failed.is_some() {
                break;
            }
            let len = p.len();
            let res = if len != 0 && len <= self.inline_max {
                // Inline: the SQ checks WQEBB room itself (and signals when little is left),
                // so only the staging count is checked here.
                let room = self.tx_slot();
                if !self.room_go(room) {
                    break;
                }
                if !self.select_dest(p.dest) {
                    // Consumed as an error only if it could have been posted (as in the
                    // gather path, which checks room first).
                    let room = self.tx_room_polled(send_ds(len, self.inline_max, 0));
                    if !self.room_go(room) {
                        break;
                    }
                    self.stats.tx_errors += 1;
                    done += 1;
                    continue;
                }
                match self.post_send_inline(p.hdr, p.data) {
                    Err(mlx5::Error::SqFull { .. }) => {
                        self.poll_send_cq();
                        if self.failed.is_some() {
                            break;
                        }
                        match self.post_send_inline(p.hdr, p.data) {
                            Err(mlx5::Error::SqFull { .. }) => {
                                self.stats.tx_would_block += 1;
                                break;
                            }
                            res => res,
                        }
                    }
                    res => res,
                }
            } else {
                // Room for the largest gather layout (two data segments: still 2 WQEBBs).
                let room = self.tx_room_polled(send_ds(len, self.inline_max, MAX_SEND_SGES));
                if !self.room_go(room) {
                    break;
                }
                if !self.select_dest(p.dest) {
                    self.stats.tx_errors += 1;
                    done += 1;
                    continue;
                }
                let end_of_run = pkts.get(i + 1).is_none_or(|n| n.mem.is_none());
                self.post_send(p, end_of_run)
            };
            match res {
                Ok(()) => {
                    done += 1;
                    posted += 1;
                }
                Err(e) => {
                    // Room was checked, so this is a driver/provider inconsistency: the
                    // transport cannot go on sending.
                    post_error = Some(e);
                    break;
                }
            }
        }
        if posted > 0 || self.tx_unrung {
            self.tx_unrung = false;
            self.qp.sq.ring_doorbell();
            self.stats.tx_calls += 1;
        }
        if done == 0 {
            if let Some(e) = post_error {
                return Err(device_error("post send WQE", e));
            }
            if let Some(e) = self.failed {
                return Err(self.qp_failed(e));
            }
        }
        Ok(done)
    }

    #[inline]
    fn tx_post_max(&self) -> usize {
        self.inline_max
    }

    /// The inline send of `tx_burst` for one datagram, without its descriptor list, length
    /// checks and doorbell (see the trait). Larger or empty datagrams go through `tx_burst`.
    #[inline]
    fn tx_post(&mut self, dest: UdAddr, bytes: &[u8]) -> io::Result<bool> {
        self.tx_post_parts(dest, bytes, &[])
    }

    /// As [`tx_post`](DatagramTransport::tx_post), with header and data written into the
    /// WQE's inline segment one after the other.
    #[inline(always)]
    fn tx_post_parts(&mut self, dest: UdAddr, hdr: &[u8], data: &[u8]) -> io::Result<bool> {
        let len = hdr.len() + data.len();
        if len == 0 || len > self.inline_max {
            return self
                .tx_burst(&[TxPkt::new(dest, hdr, data)])
                .map(|n| n == 1);
        }
        if let Some(e) = self.failed {
            return Err(self.qp_failed(e));
        }
        // As in `tx_burst`: the staging count here, WQEBB room in the SQ.
        match self.tx_slot() {
            Room::Yes => {}
            Room::Failed => return Err(self.qp_failed_now()),
            Room::No => {
                self.stats.tx_would_block += 1;
                return Ok(false);
            }
        }
        if !self.select_dest(dest) {
            return match self.tx_room_polled(send_ds(len, self.inline_max, 0)) {
                Room::Yes => {
                    self.stats.tx_errors += 1;
                    Ok(true)
                }
                Room::Failed => Err(self.qp_failed_now()),
                Room::No => {
                    self.stats.tx_would_block += 1;
                    Ok(false)
                }
            };
        }
        match self.post_send_inline(hdr, data) {
            Ok(()) => {}
            Err(mlx5::Error::SqFull { .. }) => {
                self.poll_send_cq();
                if self.failed.is_some() {
                    return Err(self.qp_failed_now());
                }
                match self.post_send_inline(hdr, data) {
                    Ok(()) => {}
                    Err(mlx5::Error::SqFull { .. }) => {
                        self.stats.tx_would_block += 1;
                        return Ok(false);
                    }
                    Err(e) => return Err(device_error("post send WQE", e)),
                }
            }
            Err(e) => return Err(device_error("post send WQE", e)),
        }
        self.tx_unrung = true;
        Ok(true)
    }

    #[inline]
    fn tx_post_flush(&mut self) {
        if self.tx_unrung {
            self.tx_unrung = false;
            self.qp.sq.ring_doorbell();
            self.stats.tx_calls += 1;
        }
    }

    /// True when the receive CQ's next entry is still the device's (nothing received,
    /// nothing to skip) and no in-place send is pinned (`rx_burst` would retire those).
    #[inline(always)]
    fn rx_idle(&self) -> bool {
        self.pins.is_empty() && !self.recv_cq.cq.has_cqe()
    }

    fn rx_burst(&mut self, max: usize) -> usize {
        self.rx_release();
        // Retire in-place sends first, so that the buffers of the messages answered in this
        // burst are free again when the core reuses them.
        if !self.pins.is_empty() {
            self.poll_send_cq();
        }
        let n = max.min(self.cfg.rx_batch);
        if n == 0 {
            return 0;
        }
        let UdTransport {
            recv_cq,
            qp,
            rx_meta,
            rx_consumed,
            rx_stride,
            failed,
            stats,
            cfg,
            ..
        } = self;
        // `rq_depth` is a power of two (`UdConfig::validate`).
        debug_assert!(cfg.rq_depth.is_power_of_two());
        let buf_mask = u64::from(cfg.rq_depth) - 1;
        let rx_stride = *rx_stride;
        let mtu = cfg.mtu;
        let mut count = 0;
        // Fields are read in place from the entry (`poll_ref`): only the four used here.
        let polled = recv_cq.cq.poll_ref(n, |c| {
            // Completion `k` of the RQ is receive WQE `k`, whose buffer is `k % rq_depth`.
            let buf = (*rx_consumed & buf_mask) as usize;
            *rx_consumed += 1;
            if let Some(rq) = qp.rq.as_mut() {
                rq.complete();
            }
            if c.is_error() {
                rx_error(&c.decode(), stats, failed);
                return;
            }
            let f = RxFields::of(&c);
            let len = match rx_payload_len(&f, mtu) {
                Ok(len) => len,
                Err(RxDrop::Foreign) => {
                    stats.rx_errors += 1;
                    return;
                }
                Err(RxDrop::Oversized) => {
                    stats.rx_oversized += 1;
                    return;
                }
            };
            if len < PKT_HDR_LEN {
                stats.rx_short += 1;
            }
            stats.rx_pkts += 1;
            stats.rx_bytes += len as u64;
            // Within the capacity: `rx_release` emptied it and `n <= rx_batch`.
            rx_meta.push(RxMeta {
                addr: UdAddr::new(f.imm as u16, c.src_qpn()),
                off: buf * rx_stride + RX_PAYLOAD_OFFSET,
                len: len as u32,
            });
            count += 1;
        });
        if polled > 0 {
            self.stats.rx_calls += 1;
        }
        count
    }

    fn rx_pkt(&self, i: usize) -> (UdAddr, &[u8]) {
        // One bounds check: the vector holds exactly the current burst.
        let Some(&m) = self.rx_meta.get(i) else {
            rx_pkt_outside(i, self.rx_meta.len())
        };
        let off = m.off;
        debug_assert!(off + m.len as usize <= self.rx_buf.len());
        // SAFETY: `m.off` is the payload offset of a buffer `< rq_depth` (rx_burst), so the
        // payload lies inside the receive ring (`rq_depth * rx_stride` bytes) as
        // `m.len <= mtu <= rx_stride - RX_PAYLOAD_OFFSET`. Its receive WQE was consumed
        // (its completion was polled with Acquire ordering, after the device wrote the bytes)
        // and is re-posted only by `rx_release`/`rx_burst`, which take `&mut self` and so
        // cannot run while this borrow of `self` lives: nothing writes these bytes meanwhile.
        let bytes =
            unsafe { std::slice::from_raw_parts(self.rx_buf.as_ptr().add(off), m.len as usize) };
        (m.addr, bytes)
    }

    fn rx_release(&mut self) {
        self.rx_meta.clear();
        self.repost_receives();
    }

    fn stats(&self) -> TransportStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use mlx5::queue::{CqMem, RqMem, SqMem, SrqMem};

    use crate::erpc::msgbuf::MsgBuffer;
    use mlx5::sim::{Fabric, SimConfig, SimDevice};
    use mlx5::verbs::{Handle, Provider, RcParams, RcRemote};

    use super::*;

    /// A sim device whose `create_ah` fails for one QPN, whose port may report another MTU
    /// than the fabric's (to provoke a requester length error), and which may create send
    /// rings for fewer WQEs than asked (so that WQEBBs run out before staging slots).
    struct Tweaked {
        inner: SimDevice,
        fail_ah_qpn: Option<u32>,
        port_mtu: Option<u32>,
        max_send_wr: Option<u32>,
    }

    impl Tweaked {
        fn new(inner: SimDevice) -> Self {
            Tweaked {
                inner,
                fail_ah_qpn: None,
                port_mtu: None,
                max_send_wr: None,
            }
        }
    }

    impl Provider for Tweaked {
        fn name(&self) -> String {
            self.inner.name()
        }
        fn port(&self) -> PortInfo {
            let mut p = self.inner.port();
            if let Some(m) = self.port_mtu {
                p.active_mtu = m;
            }
            p
        }
        fn alloc_pd(&self) -> mlx5::Result<Handle> {
            self.inner.alloc_pd()
        }
        unsafe fn reg_mr(
            &self,
            pd: &Handle,
            addr: *mut u8,
            len: usize,
            access: Access,
        ) -> mlx5::Result<(Handle, u32, u32)> {
            // SAFETY: our caller's contract, passed on unchanged.
            unsafe { self.inner.reg_mr(pd, addr, len, access) }
        }
        fn create_cq(&self, cqe: u32) -> mlx5::Result<(Handle, CqMem)> {
            self.inner.create_cq(cqe)
        }
        fn create_srq(
            &self,
            pd: &Handle,
            max_wr: u32,
            max_sge: u32,
        ) -> mlx5::Result<(Handle, SrqMem)> {
            self.inner.create_srq(pd, max_wr, max_sge)
        }
        fn create_qp(
            &self,
            pd: &Handle,
            init: &QpInit<'_>,
        ) -> mlx5::Result<(Handle, u32, SqMem, Option<RqMem>)> {
            let caps = QpCaps {
                max_send_wr: self.max_send_wr.unwrap_or(init.caps.max_send_wr),
                ..init.caps
            };
            let init = QpInit {
                qp_type: init.qp_type,
                send_cq: init.send_cq,
                recv_cq: init.recv_cq,
                srq: init.srq,
                caps,
            };
            self.inner.create_qp(pd, &init)
        }
        fn connect_rc(
            &self,
            qp: &Handle,
            remote: &RcRemote,
            params: &RcParams,
        ) -> mlx5::Result<()> {
            self.inner.connect_rc(qp, remote, params)
        }
        fn activate_ud(&self, qp: &Handle, qkey: u32) -> mlx5::Result<()> {
            self.inner.activate_ud(qp, qkey)
        }
        fn create_ah(&self, pd: &Handle, dest: &UdDest) -> mlx5::Result<(Handle, DgramSeg)> {
            if Some(dest.qpn) == self.fail_ah_qpn {
                return Err(mlx5::Error::InvalidArgument(
                    "injected create_ah failure".into(),
                ));
            }
            self.inner.create_ah(pd, dest)
        }
    }

    fn small(sq_depth: u32, rq_depth: u32, rx_batch: usize, signal_interval: u32) -> UdConfig {
        UdConfig {
            sq_depth,
            rq_depth,
            rx_batch,
            signal_interval,
            ..UdConfig::default()
        }
    }

    fn transport(f: &Fabric, cfg: UdConfig) -> UdTransport {
        UdTransport::new(&f.open(), cfg).expect("UD transport")
    }

    fn pattern(len: usize, seed: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i.wrapping_mul(7) ^ seed.wrapping_mul(13)) as u8)
            .collect()
    }

    /// Receives everything waiting, burst by burst; returns (source, bytes) and burst sizes.
    fn drain(t: &mut UdTransport) -> (Vec<(UdAddr, Vec<u8>)>, Vec<usize>) {
        let mut got = Vec::new();
        let mut bursts = Vec::new();
        loop {
            let n = t.rx_burst(usize::MAX);
            if n == 0 {
                return (got, bursts);
            }
            bursts.push(n);
            for i in 0..n {
                let (a, b) = t.rx_pkt(i);
                got.push((a, b.to_vec()));
            }
            t.rx_release();
        }
    }

    #[test]
    fn every_size_both_ways_inline_and_gathered() {
        let f = Fabric::new(SimConfig::deterministic());
        let mut a = transport(&f, UdConfig::default());
        let mut b = transport(&f, UdConfig::default());
        let mtu = a.mtu();
        assert_eq!(mtu, DEFAULT_MTU);
        let (aa, ba) = (a.local_addr(), b.local_addr());
        assert_ne!(aa, ba);
        // Every length 0..=mtu, split into header and data at varying points (two-part
        // gather), in bursts of 32, alternating directions.
        let lens: Vec<usize> = (0..=mtu).collect();
        let mut expect_short = 0;
        for (k, chunk) in lens.chunks(32).enumerate() {
            let (tx, rx, from, to) = if k % 2 == 0 {
                (&mut a, &mut b, aa, ba)
            } else {
                (&mut b, &mut a, ba, aa)
            };
            let bufs: Vec<Vec<u8>> = chunk.iter().map(|&l| pattern(l, l)).collect();
            let pkts: Vec<TxPkt<'_, UdAddr>> = bufs
                .iter()
                .map(|v| {
                    let split = (v.len() % 17).min(v.len());
                    TxPkt::new(to, &v[..split], &v[split..])
                })
                .collect();
            assert_eq!(tx.tx_burst(&pkts).unwrap(), pkts.len());
            expect_short += chunk.iter().filter(|&&l| l < PKT_HDR_LEN).count() as u64;
            let (got, _) = drain(rx);
            assert_eq!(got.len(), bufs.len());
            for ((src, bytes), want) in got.iter().zip(&bufs) {
                assert_eq!(*src, from);
                assert_eq!(bytes, want, "datagram of {} bytes", want.len());
            }
        }
        let (sa, sb) = (a.stats(), b.stats());
        let total_bytes: u64 = lens.iter().map(|&l| l as u64).sum();
        assert_eq!(sa.tx_pkts + sb.tx_pkts, lens.len() as u64);
        assert_eq!(sa.tx_pkts, sb.rx_pkts);
        assert_eq!(sb.tx_pkts, sa.rx_pkts);
        assert_eq!(sa.tx_bytes, sb.rx_bytes);
        assert_eq!(sb.tx_bytes, sa.rx_bytes);
        assert_eq!(sa.tx_bytes + sb.tx_bytes, total_bytes);
        assert_eq!(sa.rx_short + sb.rx_short, expect_short);
        for s in [sa, sb] {
            assert_eq!(
                (s.tx_errors, s.tx_would_block, s.rx_errors, s.rx_oversized),
                (0, 0, 0, 0)
            );
        }
        // One doorbell per burst.
        let bursts = lens.len().div_ceil(32) as u64;
        assert_eq!(sa.tx_calls + sb.tx_calls, bursts);
        let fs = f.stats();
        assert_eq!(fs.ud_sent, lens.len() as u64);
        assert_eq!(fs.ud_delivered, lens.len() as u64);
        assert_eq!(fs.wqes.send_imm, lens.len() as u64);
        // Selective signaling: one send CQE per 64 WQEs, plus at most one per 128 for the
        // "queue full" rule (the queue is polled only when a burst does not fit).
        let n = fs.ud_sent;
        let send_cqes = fs.cqes - fs.ud_delivered;
        assert!(
            (n / 64..=n / 64 + n / 128 + 1).contains(&send_cqes),
            "{send_cqes} send CQEs for {n} sends"
        );
        assert_eq!(fs.error_cqes, 0);
        assert_eq!(a.known_destinations(), 1);
    }

    /// WQE sizes: ctrl + address vector (4 ds), then inline data up to 60 bytes, else one
    /// data segment (staged or contiguous in place) or two (in-place header and data apart);
    /// `post_send` asserts that the descriptor it builds has this size.
    #[test]
    fn wqe_sizes_inline_up_to_60_bytes() {
        assert_eq!(send_ds(0, MAX_INLINE, 1), 4);
        assert_eq!(send_ds(1, MAX_INLINE, 1), 5);
        assert_eq!(send_ds(12, MAX_INLINE, 1), 5);
        assert_eq!(send_ds(13, MAX_INLINE, 1), 6);
        assert_eq!(send_ds(60, MAX_INLINE, 2), 8);
        assert_eq!(send_ds(61, MAX_INLINE, 1), 5);
        assert_eq!(send_ds(61, MAX_INLINE, 2), 6);
        assert_eq!(send_ds(DEFAULT_MTU, MAX_INLINE, 1), 5);
        assert_eq!(send_ds(20, 16, 1), 5);
        // Every WQE fits in 2 WQEBBs (the LOW_WQEBBS reasoning).
        assert!((0..=4096).all(|l| mlx5::wqe::wqebbs(send_ds(l, MAX_INLINE, MAX_SEND_SGES)) <= 2));
    }

    #[test]
    fn burst_larger_than_the_send_queue_is_partial_then_completes() {
        for signal_interval in [16, 5, 1] {
            let f = Fabric::new(SimConfig::deterministic());
            let mut a = transport(&f, small(16, 64, 64, signal_interval));
            let mut b = transport(&f, small(16, 64, 64, signal_interval));
            let to = b.local_addr();
            let bufs: Vec<Vec<u8>> = (0..40)
                .map(|i| pattern(if i % 3 == 0 { 20 } else { 200 }, i))
                .collect();
            let pkts: Vec<_> = bufs.iter().map(|v| TxPkt::single(to, v)).collect();
            let mut got = Vec::new();
            let mut sent = 0;
            let mut rounds = 0;
            while sent < pkts.len() {
                rounds += 1;
                assert!(rounds < 10, "send queue never drained");
                let n = a.tx_burst(&pkts[sent..]).unwrap();
                assert!(n <= 16, "at most sq_depth WQEs in flight, got {n}");
                assert!(a.tx_outstanding() <= 16);
                assert!(n > 0, "signal_interval {signal_interval}: stuck at {sent}");
                sent += n;
                got.extend(drain(&mut b).0.into_iter().map(|(_, v)| v));
            }
            assert_eq!(got, bufs, "signal_interval {signal_interval}");
            let s = a.stats();
            assert_eq!(s.tx_pkts, 40);
            assert_eq!(s.tx_would_block, 2);
            assert_eq!(s.tx_calls, 3);
            // Only the unsignaled tail after the last signaled WQE stays outstanding.
            a.poll_tx_completions();
            assert!(
                a.tx_outstanding() < signal_interval as usize,
                "{} outstanding",
                a.tx_outstanding()
            );
        }
    }

    #[test]
    fn posted_datagrams_leave_in_order_at_the_flush_and_a_full_queue_refuses() {
        for signal_interval in [16, 5, 1] {
            let f = Fabric::new(SimConfig::deterministic());
            let mut a = transport(&f, small(16, 64, 64, signal_interval));
            let mut b = transport(&f, small(16, 64, 64, signal_interval));
            let to = b.local_addr();
            let max = a.tx_post_max();
            assert!(max > 0);
            let bufs: Vec<Vec<u8>> = (0..40).map(|i| pattern(1 + i % max, i)).collect();
            let mut got = Vec::new();
            let mut sent = 0;
            let mut refused = 0;
            let mut rounds = 0;
            while sent < bufs.len() {
                rounds += 1;
                assert!(rounds < 10, "send queue never drained");
                let before = sent;
                while sent < bufs.len() && a.tx_post(to, &bufs[sent]).unwrap() {
                    sent += 1;
                }
                if sent < bufs.len() {
                    refused += 1;
                }
                assert!(
                    sent > before,
                    "signal_interval {signal_interval}: stuck at {sent}"
                );
                assert!(a.tx_outstanding() <= 16);
                // Nothing leaves before the doorbell.
                assert!(drain(&mut b).0.is_empty());
                a.tx_post_flush();
                got.extend(drain(&mut b).0.into_iter().map(|(_, v)| v));
            }
            assert_eq!(got, bufs, "signal_interval {signal_interval}");
            let s = a.stats();
            assert_eq!(s.tx_pkts, 40);
            assert_eq!(s.tx_would_block, refused);
            assert_eq!(s.tx_calls, rounds);
            // A flush with nothing posted rings nothing.
            a.tx_post_flush();
            assert_eq!(a.stats().tx_calls, rounds);
        }
    }

    #[test]
    fn many_small_bursts_never_wedge_the_send_queue() {
        // Only the "queue low" rule signals when the interval equals the depth and bursts do
        // not divide it; every burst must still make progress.
        let f = Fabric::new(SimConfig::deterministic());
        let mut a = transport(&f, small(16, 64, 64, 16));
        let mut b = transport(&f, small(16, 64, 64, 16));
        let to = b.local_addr();
        let data = [0x5au8; 100];
        let pkts = [TxPkt::single(to, &data); 7];
        let mut total = 0;
        for _ in 0..300 {
            let n = a.tx_burst(&pkts).unwrap();
            assert!(n > 0);
            total += n;
            drain(&mut b);
        }
        assert_eq!(b.stats().rx_pkts, total as u64);
        assert_eq!(f.stats().ud_no_recv, 0);
    }

    /// A send ring of 64 WQEBBs (the provider sized it for 16 WQEs of 3 WQEBBs) holds 32 of
    /// this transport's 2-WQEBB WQEs, fewer than its 64 staging slots, and the interval (64)
    /// signals none of them: only the "queue low" rule keeps the queue from filling with
    /// unsignaled WQEs that nothing would ever retire.
    #[test]
    fn send_ring_short_of_wqebbs_still_drains() {
        let f = Fabric::new(SimConfig::deterministic());
        let ctx = Context::new(Arc::new(Tweaked {
            max_send_wr: Some(16),
            ..Tweaked::new(f.open_device())
        }));
        let mut a = UdTransport::new(&ctx, small(64, 64, 64, 64)).unwrap();
        assert_eq!(a.qp.sq.wqe_cnt(), 64);
        let mut b = transport(&f, UdConfig::default());
        let to = b.local_addr();
        let data = [0xc3u8; 100]; // gathered: ds 5, 2 WQEBBs
        let pkts = [TxPkt::single(to, &data); 40];
        let mut total = 0;
        for round in 0..20 {
            let n = a.tx_burst(&pkts).unwrap();
            assert!(n > 0, "round {round}: send queue wedged");
            assert!(n <= 32, "{n} WQEs of 2 WQEBBs in a 64-WQEBB ring");
            total += n;
            assert_eq!(drain(&mut b).0.len(), n);
        }
        assert_eq!(a.stats().tx_pkts, total as u64);
        assert!(a.stats().tx_would_block > 0);
    }

    #[test]
    fn rx_bursts_are_capped_at_rx_batch() {
        let f = Fabric::new(SimConfig::deterministic());
        let mut a = transport(&f, UdConfig::default());
        let mut b = transport(&f, small(128, 64, 16, 64));
        let to = b.local_addr();
        let bufs: Vec<Vec<u8>> = (0..40).map(|i| pattern(16 + i, i)).collect();
        let pkts: Vec<_> = bufs.iter().map(|v| TxPkt::single(to, v)).collect();
        assert_eq!(a.tx_burst(&pkts).unwrap(), 40);
        assert_eq!(b.rx_burst(0), 0);
        assert_eq!(b.rx_burst(5), 5);
        let first: Vec<Vec<u8>> = (0..5).map(|i| b.rx_pkt(i).1.to_vec()).collect();
        assert_eq!(first, bufs[..5]);
        let (rest, bursts) = drain(&mut b);
        assert_eq!(bursts, [16, 16, 3]);
        let rest: Vec<Vec<u8>> = rest.into_iter().map(|(_, v)| v).collect();
        assert_eq!(rest, bufs[5..]);
        assert_eq!(b.stats().rx_calls, 4);
        // Buffers are re-posted in batches of `recv_slack(64)` = 4: the last 3 of the 40
        // wait for a fourth, so a full ring's worth less those 3 arrives again, and after
        // that drain every consumed buffer was re-posted: 64 arrive.
        assert_eq!(recv_slack(64), 4);
        for n in [61, 64] {
            let again: Vec<_> = (0..n).map(|_| TxPkt::single(to, &bufs[0])).collect();
            let mut sent = 0;
            while sent < n {
                sent += a.tx_burst(&again[sent..]).unwrap();
            }
            assert_eq!(drain(&mut b).0.len(), n);
            assert_eq!(f.stats().ud_no_recv, 0);
        }
    }

    /// Inline packets are sent from their bytes in place when they are one range (a single
    /// part, or header and data adjacent in one message buffer), else from a staged copy;
    /// either way the bytes are the header followed by the data.
    #[test]
    fn inline_bytes_in_place_or_staged() {
        let to = UdAddr::new(1, 2);
        let mem = Arc::new(DmaBuf::new(4096).unwrap());
        // SAFETY: `mem` is a fresh 4096-byte buffer no one else uses; written before any
        // shared view of it is taken.
        unsafe {
            std::ptr::copy_nonoverlapping(pattern(64, 3).as_ptr(), mem.as_ptr().cast_mut(), 64);
        }
        // SAFETY: the first 64 bytes were initialised above; nothing writes `mem` any more.
        let bytes = unsafe { std::slice::from_raw_parts(mem.as_ptr(), 64) };
        let mut staged = [0u8; MAX_INLINE];
        // Header and data adjacent in the buffer: one slice, in place.
        let p = TxPkt::in_buffer(to, &bytes[..16], &bytes[16..40], &mem);
        let got = inline_bytes(&p, &mut staged);
        assert_eq!(got.as_ptr(), bytes.as_ptr());
        assert_eq!(got, &bytes[..40]);
        // A gap between them: staged, header then data.
        let p = TxPkt::in_buffer(to, &bytes[..16], &bytes[20..40], &mem);
        let got = inline_bytes(&p, &mut staged).to_vec();
        assert_eq!(got, [&bytes[..16], &bytes[20..40]].concat());
        // Adjacent but not in a message buffer: staged too.
        let p = TxPkt::new(to, &bytes[..16], &bytes[16..40]);
        let got = inline_bytes(&p, &mut staged);
        assert_ne!(got.as_ptr(), bytes.as_ptr());
        assert_eq!(got, &bytes[..40]);
        // One part: that part.
        let p = TxPkt::single(to, &bytes[..33]);
        assert_eq!(inline_bytes(&p, &mut staged).as_ptr(), bytes.as_ptr());
    }

    #[test]
    #[should_panic(expected = "outside the current burst")]
    fn rx_pkt_after_release_panics() {
        let f = Fabric::new(SimConfig::deterministic());
        let mut a = transport(&f, UdConfig::default());
        let mut b = transport(&f, UdConfig::default());
        a.tx_burst(&[TxPkt::single(b.local_addr(), &[1; 20])])
            .unwrap();
        assert_eq!(b.rx_burst(8), 1);
        b.rx_release();
        let _ = b.rx_pkt(0);
    }

    #[test]
    fn unknown_destinations_are_per_packet_drops() {
        let f = Fabric::new(SimConfig::deterministic());
        let mut a = transport(&f, UdConfig::default());
        let mut b = transport(&f, UdConfig::default());
        let c = transport(&f, UdConfig::default());
        let good = b.local_addr();
        let gone = c.local_addr();
        drop(c);
        let bad_qpn = UdAddr::new(good.lid, 0x00ab_cdef);
        let bad_lid = UdAddr::new(0x0777, good.qpn);
        let x = [9u8; 300];
        let pkts = [
            TxPkt::single(bad_qpn, &x),
            TxPkt::single(good, &x[..30]),
            TxPkt::single(bad_lid, &x[..10]),
            TxPkt::single(gone, &x),
            TxPkt::single(good, &x),
        ];
        assert_eq!(a.tx_burst(&pkts).unwrap(), 5);
        let (got, _) = drain(&mut b);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].1.len(), got[1].1.len()), (30, 300));
        let fs = f.stats();
        assert_eq!((fs.ud_sent, fs.ud_no_dest, fs.ud_delivered), (5, 3, 2));
        let s = a.stats();
        assert_eq!((s.tx_pkts, s.tx_errors), (5, 0));
        assert_eq!(a.known_destinations(), 4);
        assert!(a.qp_error().is_none());
    }

    #[test]
    fn address_handle_failure_drops_and_counts_the_packet() {
        let f = Fabric::new(SimConfig::deterministic());
        let mut b = transport(&f, UdConfig::default());
        let poisoned = 0x00fe_dcba;
        let ctx = Context::new(Arc::new(Tweaked {
            fail_ah_qpn: Some(poisoned),
            ..Tweaked::new(f.open_device())
        }));
        let mut a = UdTransport::new(&ctx, UdConfig::default()).unwrap();
        let to = b.local_addr();
        let bad = UdAddr::new(to.lid, poisoned);
        let x = [3u8; 64];
        let pkts = [
            TxPkt::single(to, &x),
            TxPkt::single(bad, &x),
            TxPkt::single(to, &x),
            TxPkt::single(bad, &x),
        ];
        assert_eq!(a.tx_burst(&pkts).unwrap(), 4);
        let s = a.stats();
        assert_eq!((s.tx_pkts, s.tx_errors), (2, 2));
        assert_eq!(a.known_destinations(), 1);
        assert_eq!(drain(&mut b).0.len(), 2);
    }

    #[test]
    fn oversized_datagrams_are_dropped_and_counted() {
        let f = Fabric::new(SimConfig::deterministic());
        let mut a = transport(&f, UdConfig::default());
        // The peer may use the whole port MTU.
        let mut big = transport(
            &f,
            UdConfig {
                mtu: 4096,
                ..UdConfig::default()
            },
        );
        let x = pattern(4096, 1);
        let to = a.local_addr();
        let pkts = [
            TxPkt::single(to, &x[..DEFAULT_MTU + 1]),
            TxPkt::single(to, &x),
            TxPkt::single(to, &x[..DEFAULT_MTU]),
        ];
        assert_eq!(big.tx_burst(&pkts).unwrap(), 3);
        let (got, _) = drain(&mut a);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, x[..DEFAULT_MTU]);
        let s = a.stats();
        assert_eq!((s.rx_oversized, s.rx_pkts, s.rx_errors), (2, 1, 0));
        assert!(a.qp_error().is_none());
        // Sending above our own MTU is a caller error; nothing is sent.
        let err = a
            .tx_burst(&[
                TxPkt::single(big.local_addr(), &x[..10]),
                TxPkt::new(big.local_addr(), &x[..16], &x[16..DEFAULT_MTU + 1]),
            ])
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(a.stats().tx_pkts, 0);
    }

    /// A plain UD QP (default caps, one CQ for both directions) activated with the default
    /// Q_Key: a sender that is not an eRPC transport.
    fn plain_ud_qp(ctx: &Context, pd: &Pd, cq: &Cq) -> Qp {
        let mut qp = ctx
            .create_qp(
                pd,
                &QpInit {
                    qp_type: QpType::Ud,
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    caps: QpCaps::default(),
                },
            )
            .unwrap();
        qp.activate_ud(DEFAULT_QKEY).unwrap();
        qp
    }

    /// Datagrams from a plain UD QP: without the transport's immediate they are dropped; with
    /// it, and with a GRH, the GRH is skipped and the source is the sender's LID and QPN.
    #[test]
    fn foreign_senders_and_grh() {
        let f = Fabric::new(SimConfig::deterministic());
        let mut t = transport(&f, UdConfig::default());
        let ctx = f.open();
        let pd = ctx.alloc_pd().unwrap();
        let mut cq = ctx.create_cq(16).unwrap();
        let mut qp = plain_ud_qp(&ctx, &pd, &cq);
        let mut dest = t.local_addr().dest(DEFAULT_QKEY);
        let plain = ctx.create_ah(&pd, &dest).unwrap().av;
        dest.gid = f.open().port().gid; // any non-zero GID: the AV carries a GRH
        let with_grh = ctx.create_ah(&pd, &dest).unwrap().av;
        assert!(with_grh.grh && !plain.grh);
        let lid = ctx.port().lid;
        let sends = [
            (Opcode::Send, 0, plain, &b"no immediate"[..]),
            (
                Opcode::SendImm,
                0x1234_0000 | u32::from(lid),
                plain,
                b"bad magic",
            ),
            (
                Opcode::SendImm,
                IMM_MAGIC | u32::from(lid),
                with_grh,
                b"with a GRH",
            ),
            (Opcode::SendImm, IMM_MAGIC | u32::from(lid), plain, b"plain"),
        ];
        for (opcode, imm, av, payload) in sends {
            qp.sq
                .post(&WqeDesc {
                    opcode,
                    flags: 0,
                    imm,
                    ud: Some(av),
                    remote: None,
                    atomic: None,
                    inline: payload,
                    sges: &[],
                })
                .unwrap();
        }
        qp.sq.ring_doorbell();
        let (got, _) = drain(&mut t);
        let from = UdAddr::new(lid, qp.qpn());
        assert_eq!(
            got,
            [(from, b"with a GRH".to_vec()), (from, b"plain".to_vec())]
        );
        assert_eq!(t.stats().rx_errors, 2);
        // Replies reach the foreign QP at the reported address.
        let mut rq = qp.rq.take().unwrap();
        let buf = DmaBuf::new(4096).unwrap();
        // SAFETY: `buf` lives to the end of the test, after the receive completes.
        let mr = unsafe { ctx.reg_mr(&pd, buf.as_mut_ptr(), 4096, Access::LOCAL_WRITE) }.unwrap();
        // SAFETY: `buf` lives to the end of the test and is read only after the completion.
        unsafe {
            rq.post(&[Sge {
                addr: buf.as_ptr() as u64,
                len: 4096,
                lkey: mr.lkey,
            }])
        }
        .unwrap();
        rq.ring_doorbell();
        assert_eq!(t.tx_burst(&[TxPkt::single(from, b"reply")]).unwrap(), 1);
        let mut seen = None;
        cq.cq.poll(4, |c| {
            if c.opcode == CqeOpcode::RespSendImm as u8 {
                seen = Some((c.imm, c.src_qpn, c.byte_cnt));
            }
        });
        let own = t.local_addr();
        assert_eq!(
            seen,
            Some((IMM_MAGIC | u32::from(own.lid), own.qpn, 40 + 5))
        );
        // SAFETY: the receive completed; nothing writes the buffer any more.
        assert_eq!(unsafe { &buf.as_slice()[40..45] }, b"reply");
        drop(cq);
    }

    /// A requester error (here: a datagram above the fabric's real MTU, which the tweaked port
    /// hides) puts the QP in the error state: the transport reports it and stops.
    #[test]
    fn send_error_fails_the_transport_without_panicking() {
        let f = Fabric::new(SimConfig {
            mtu: 1024,
            ..SimConfig::deterministic()
        });
        let ctx = Context::new(Arc::new(Tweaked {
            port_mtu: Some(4096),
            ..Tweaked::new(f.open_device())
        }));
        let mut a = UdTransport::new(&ctx, UdConfig::default()).unwrap();
        let b = transport(
            &f,
            UdConfig {
                mtu: 1024,
                ..UdConfig::default()
            },
        );
        let x = [1u8; 2000];
        assert_eq!(a.tx_burst(&[TxPkt::single(b.local_addr(), &x)]).unwrap(), 1);
        a.poll_tx_completions();
        let e = a.qp_error().expect("requester error seen");
        assert_eq!(
            e.kind,
            mlx5::cqe::CqeErrorKind::Known(Syndrome::LocalLength)
        );
        let err = a
            .tx_burst(&[TxPkt::single(b.local_addr(), &x[..10])])
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        // The posted receives are flushed (after a progress step) and not re-posted.
        f.progress();
        let mut flushed = 0;
        for _ in 0..100 {
            assert_eq!(a.rx_burst(64), 0);
            flushed = a.stats().rx_errors;
        }
        assert_eq!(flushed, u64::from(DEFAULT_RQ_DEPTH));
    }

    #[test]
    fn config_validation() {
        let f = Fabric::new(SimConfig {
            mtu: 2048,
            ..SimConfig::deterministic()
        });
        let ctx = f.open();
        let port = ctx.port();
        let bad = |c: UdConfig| UdTransport::new(&ctx, c).unwrap_err().kind();
        // The default MTU exceeds this port's; for_port caps it.
        assert_eq!(bad(UdConfig::default()), io::ErrorKind::InvalidInput);
        let ok = UdConfig::for_port(&port);
        assert_eq!(ok.mtu, 2048);
        for c in [
            UdConfig { mtu: 15, ..ok },
            UdConfig { sq_depth: 0, ..ok },
            UdConfig {
                sq_depth: MAX_SQ_DEPTH + 1,
                ..ok
            },
            UdConfig {
                rq_depth: 100,
                ..ok
            },
            UdConfig {
                rq_depth: 2 * MAX_RQ_DEPTH,
                ..ok
            },
            UdConfig { rx_batch: 0, ..ok },
            UdConfig {
                rx_batch: 513,
                ..ok
            },
            UdConfig {
                signal_interval: 0,
                ..ok
            },
            UdConfig {
                signal_interval: 129,
                ..ok
            },
        ] {
            assert_eq!(bad(c), io::ErrorKind::InvalidInput, "{c:?}");
        }
        let t = UdTransport::new(&ctx, ok).unwrap();
        assert_eq!((t.mtu(), t.rx_batch()), (2048, DEFAULT_RX_BATCH));
        assert_eq!(t.local_addr(), UdAddr::new(port.lid, t.qpn()));
        let mut roce = port;
        roce.link_layer = LinkLayer::Ethernet;
        assert_eq!(
            ok.validate(&roce).unwrap_err().kind(),
            io::ErrorKind::Unsupported
        );
    }

    #[test]
    fn transport_is_send_and_works_from_another_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<UdTransport>();
        let f = Fabric::new(SimConfig::deterministic());
        let mut a = transport(&f, UdConfig::default());
        let b = transport(&f, UdConfig::default());
        let to = b.local_addr();
        let h = std::thread::spawn(move || {
            let mut b = b;
            let mut got = 0;
            while got < 100 {
                got += b.rx_burst(32);
                std::thread::yield_now();
            }
            b
        });
        let x = [7u8; 500];
        let mut sent = 0;
        while sent < 100 {
            let n = a.tx_burst(&[TxPkt::single(to, &x); 10]).unwrap();
            sent += n;
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let b = h.join().unwrap();
        assert_eq!(b.stats().rx_pkts, 100);
    }

    /// Property tests of the UD receive path (issue 14 §4): receive completions and the
    /// datagrams of a foreign UD sender that knows our QPN and Q_Key. 256 cases per property
    /// by default (64 for the end-to-end one, each case a fresh fabric); `PROPTEST_CASES=<n>`
    /// runs more (proptest reads the variable itself; the smaller default applies only when
    /// the variable is unset).
    mod props {
        use mlx5::cqe::CQE_BYTES;
        use proptest::prelude::*;

        use super::*;

        /// `ProptestConfig::default()` (which honours `PROPTEST_CASES`), with `cases` when
        /// the variable is not set.
        fn cases(cases: u32) -> ProptestConfig {
            let mut c = ProptestConfig::default();
            if std::env::var_os("PROPTEST_CASES").is_none() {
                c.cases = cases;
            }
            c
        }

        proptest! {
            /// Any receive completion (decoded from arbitrary bytes) yields a payload length
            /// only for a SEND with our immediate whose byte count covers the GRH area and
            /// whose payload is at most the MTU; everything else is a typed drop reason.
            #[test]
            fn rx_payload_len_over_arbitrary_cqes(
                lo in any::<[u8; 32]>(),
                hi in any::<[u8; 32]>(),
                mtu in 16usize..8192,
            ) {
                let mut b = [0u8; CQE_BYTES];
                b[..32].copy_from_slice(&lo);
                b[32..].copy_from_slice(&hi);
                let c = Cqe::decode(&b);
                let ours = c.opcode == CqeOpcode::RespSendImm as u8
                    && c.imm & IMM_MAGIC_MASK == IMM_MAGIC
                    && c.byte_cnt as usize >= GRH_BYTES;
                match rx_payload_len(&RxFields::from(&c), mtu) {
                    Ok(len) => {
                        prop_assert!(ours);
                        prop_assert_eq!(len, c.byte_cnt as usize - GRH_BYTES);
                        prop_assert!(len <= mtu);
                    }
                    Err(RxDrop::Foreign) => prop_assert!(!ours),
                    Err(RxDrop::Oversized) => {
                        prop_assert!(ours && c.byte_cnt as usize - GRH_BYTES > mtu)
                    }
                }
            }
        }

        proptest! {
            #![proptest_config(cases(64))]

            /// A foreign UD QP sends datagrams of any length up to the port MTU, as SEND or
            /// SEND with an arbitrary immediate (sometimes ours): each one is delivered
            /// exactly (bytes, source LID from the immediate, source QPN) if it carries our
            /// immediate and fits the transport's MTU, else dropped and counted
            /// (`rx_errors` / `rx_oversized`); nothing panics and the transport keeps
            /// working.
            #[test]
            fn foreign_datagrams_are_delivered_or_counted(
                sends in proptest::collection::vec(
                    (any::<bool>(), prop_oneof![2 => Just(None), 1 => any::<u32>().prop_map(Some)],
                     prop_oneof![0usize..64, 0usize..=4096], any::<u8>()),
                    1..8,
                ),
            ) {
                let f = Fabric::new(SimConfig::deterministic());
                let mut t = transport(&f, small(64, 64, 32, 16));
                let ctx = f.open();
                let port_mtu = ctx.port().active_mtu as usize;
                let lid = ctx.port().lid;
                let pd = ctx.alloc_pd().unwrap();
                let mut cq = ctx.create_cq(16).unwrap();
                let mut qp = super::plain_ud_qp(&ctx, &pd, &cq);
                let av = ctx.create_ah(&pd, &t.local_addr().dest(DEFAULT_QKEY)).unwrap().av;
                let buf = DmaBuf::new(8192).unwrap();
                // SAFETY: `buf` lives to the end of this case, after its sends complete.
                let mr =
                    unsafe { ctx.reg_mr(&pd, buf.as_mut_ptr(), 8192, Access::LOCAL_WRITE) }.unwrap();
                let mtu = t.mtu();
                for (k, &(imm_op, imm, len, seed)) in sends.iter().enumerate() {
                    let len = len.min(port_mtu);
                    let imm = imm.unwrap_or(IMM_MAGIC | u32::from(lid));
                    let payload = pattern(len, usize::from(seed) + k);
                    // SAFETY: inside the registered buffer; the previous send completed.
                    unsafe {
                        std::ptr::copy_nonoverlapping(payload.as_ptr(), buf.as_mut_ptr(), len)
                    };
                    let before = t.stats();
                    qp.sq
                        .post(&WqeDesc {
                            opcode: if imm_op { Opcode::SendImm } else { Opcode::Send },
                            flags: CQ_UPDATE,
                            imm,
                            ud: Some(av),
                            remote: None,
                            atomic: None,
                            inline: &[],
                            sges: &[Sge { addr: buf.as_ptr() as u64, len: len as u32, lkey: mr.lkey }],
                        })
                        .unwrap();
                    qp.sq.ring_doorbell();
                    let mut sent = 0;
                    cq.cq.poll(4, |c| {
                        assert!(c.status().is_ok(), "send completion {c:?}");
                        sent += 1;
                    });
                    prop_assert_eq!(sent, 1);
                    let (got, _) = drain(&mut t);
                    let after = t.stats();
                    let ours = imm_op && imm & IMM_MAGIC_MASK == IMM_MAGIC;
                    if ours && len <= mtu {
                        prop_assert_eq!(got, vec![(UdAddr::new(imm as u16, qp.qpn()), payload)]);
                        prop_assert_eq!(after.rx_pkts, before.rx_pkts + 1);
                        prop_assert_eq!(
                            after.rx_short,
                            before.rx_short + u64::from(len < PKT_HDR_LEN)
                        );
                    } else {
                        prop_assert!(got.is_empty());
                        prop_assert_eq!(after.rx_pkts, before.rx_pkts);
                        if ours {
                            prop_assert_eq!(after.rx_oversized, before.rx_oversized + 1);
                        } else {
                            prop_assert_eq!(after.rx_errors, before.rx_errors + 1);
                        }
                    }
                    prop_assert!(t.qp_error().is_none());
                }
                drop(mr);
                drop(cq);
            }
        }
    }

    /// A multi-packet message buffer filled with a pattern; header `i` holds `[i; 16]`.
    fn msgbuf(size: usize, dpp: usize) -> MsgBuffer {
        let mut m = MsgBuffer::new(size, dpp).unwrap();
        m.data_mut().copy_from_slice(&pattern(size, size));
        for i in 0..m.num_pkts() {
            *m.pkthdr_mut(i) = [i as u8; 16];
        }
        m
    }

    fn in_place_pkts(m: &MsgBuffer, to: UdAddr) -> Vec<TxPkt<'_, UdAddr>> {
        (0..m.num_pkts())
            .map(|i| {
                let (h, d) = m.pkt_parts(i).unwrap();
                TxPkt::in_buffer(to, h, d, m.dma_handle())
            })
            .collect()
    }

    /// Packets of a message buffer are gathered in place (packet 0 as one segment, the others
    /// as header + data), arrive intact, pin the buffer until their completion is polled, and
    /// register it once.
    #[test]
    fn message_buffer_packets_are_sent_in_place() {
        let f = Fabric::new(SimConfig::deterministic());
        let mut a = transport(&f, UdConfig::default());
        let mut b = transport(&f, UdConfig::default());
        let to = b.local_addr();
        let dpp = DEFAULT_MTU - PKT_HDR_LEN;
        let m = msgbuf(3 * dpp - 100, dpp);
        assert!(!m.in_flight());
        let pkts = in_place_pkts(&m, to);
        assert_eq!(a.tx_burst(&pkts).unwrap(), 3);
        // Read by the (model's) NIC, but not known complete until the send CQ is polled.
        assert!(m.in_flight(), "the transport pins the buffer");
        assert_eq!(a.pinned_buffers(), 1);
        let (got, _) = drain(&mut b);
        assert_eq!(got.len(), 3);
        for (i, (src, bytes)) in got.iter().enumerate() {
            assert_eq!(*src, a.local_addr());
            let (h, d) = m.pkt_parts(i).unwrap();
            assert_eq!(&bytes[..16], h);
            assert_eq!(&bytes[16..], d, "packet {i}");
        }
        let s = a.stats();
        assert_eq!((s.tx_in_place, s.tx_registrations, s.tx_pkts), (3, 1, 3));
        // The last in-place WQE of the burst was signaled: one poll retires it.
        a.poll_tx_completions();
        assert_eq!(a.pinned_buffers(), 0);
        assert!(!m.in_flight());
        // Sent again: the registration is reused.
        let pkts = in_place_pkts(&m, to);
        assert_eq!(a.tx_burst(&pkts).unwrap(), 3);
        assert_eq!(drain(&mut b).0.len(), 3);
        assert_eq!((a.stats().tx_in_place, a.stats().tx_registrations), (6, 1));
    }

    /// `rx_idle` is true exactly while nothing waits in the receive CQ and no in-place send
    /// is pinned: a datagram arriving, or a buffer waiting for its send completion, makes it
    /// false until the burst is received or the send retired.
    #[test]
    fn rx_idle_until_a_datagram_waits_or_a_send_is_pinned() {
        let f = Fabric::new(SimConfig::deterministic());
        let mut a = transport(&f, UdConfig::default());
        let mut b = transport(&f, UdConfig::default());
        let to = b.local_addr();
        assert!(a.rx_idle() && b.rx_idle(), "fresh transports");
        assert!(a.tx_post(to, &pattern(40, 1)).unwrap());
        assert!(b.rx_idle(), "posted, not yet flushed");
        a.tx_post_flush();
        assert!(!b.rx_idle(), "a datagram waits");
        assert!(!b.rx_idle(), "asking consumes nothing");
        assert_eq!(drain(&mut b).0.len(), 1);
        assert!(b.rx_idle(), "drained");
        let dpp = DEFAULT_MTU - PKT_HDR_LEN;
        let m = msgbuf(2 * dpp, dpp);
        assert_eq!(a.tx_burst(&in_place_pkts(&m, to)).unwrap(), 2);
        assert!(!a.rx_idle(), "a pinned send: rx_burst would retire it");
        a.poll_tx_completions();
        assert_eq!(a.pinned_buffers(), 0);
        assert!(a.rx_idle());
        assert_eq!(drain(&mut b).0.len(), 2);
        assert!(b.rx_idle());
    }

    /// What is not sent in place: inline-size packets, and a packet whose bytes are not inside
    /// the buffer it names (copied into the staging ring instead, still delivered intact).
    #[test]
    fn packets_outside_their_buffer_or_inline_are_copied() {
        let f = Fabric::new(SimConfig::deterministic());
        let mut a = transport(&f, UdConfig::default());
        let mut b = transport(&f, UdConfig::default());
        let to = b.local_addr();
        let m = msgbuf(1000, DEFAULT_MTU - PKT_HDR_LEN);
        let elsewhere = pattern(900, 3);
        let (h, d) = m.pkt_parts(0).unwrap();
        let pkts = [
            TxPkt::in_buffer(to, &h[..8], &d[..20], m.dma_handle()),
            TxPkt::in_buffer(to, h, &elsewhere, m.dma_handle()),
            TxPkt::in_buffer(to, &elsewhere, &[], m.dma_handle()),
        ];
        assert_eq!(a.tx_burst(&pkts).unwrap(), 3);
        let (got, _) = drain(&mut b);
        assert_eq!(got[0].1, [&h[..8], &d[..20]].concat());
        assert_eq!(got[1].1, [h, &elsewhere[..]].concat());
        assert_eq!(got[2].1, elsewhere);
        let s = a.stats();
        assert_eq!((s.tx_in_place, s.tx_registrations), (0, 0));
        assert!(!m.in_flight());
    }

    /// A message buffer dropped while its send is outstanding stays mapped (pinned) until the
    /// completion; registrations of dropped buffers are swept, so their number stays bounded.
    #[test]
    fn dropped_buffers_outlive_their_sends_and_are_deregistered() {
        let f = Fabric::new(SimConfig::deterministic());
        let mut a = transport(&f, UdConfig::default());
        let mut b = transport(&f, UdConfig::default());
        let to = b.local_addr();
        let dpp = DEFAULT_MTU - PKT_HDR_LEN;
        for k in 0..5 * MIN_SWEEP {
            let m = msgbuf(2 * dpp, dpp);
            let handle = Arc::downgrade(m.dma_handle());
            assert_eq!(a.tx_burst(&in_place_pkts(&m, to)).unwrap(), 2);
            drop(m);
            assert!(
                handle.upgrade().is_some(),
                "pinned after the owner dropped it"
            );
            assert_eq!(drain(&mut b).0.len(), 2, "message {k}");
            a.poll_tx_completions();
            assert!(
                handle.upgrade().is_none(),
                "unmapped once the send completed"
            );
            assert!(a.registered_buffers() <= 2 * MIN_SWEEP);
        }
        assert_eq!(a.stats().tx_registrations, 5 * MIN_SWEEP as u64);
        assert_eq!(a.stats().tx_in_place, 10 * MIN_SWEEP as u64);
    }
}

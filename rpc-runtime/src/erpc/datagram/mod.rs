//! Datagram transports that the eRPC protocol core drives.
//!
//! The eRPC core is sans-I/O: it turns "packet in / time now / call issued" into "packets out /
//! completions". A [`DatagramTransport`] is the other half: it moves whole datagrams between
//! endpoints, unreliably (loss, duplication and reordering are the core's problem), in batches.
//! Two implementations: UDP sockets with `sendmmsg`/`recvmmsg` ([`udp`]) for any IP network,
//! and mlx5 UD queue pairs ([`ud`]) on InfiniBand hardware or the device model.
//! [`lossy::LossyTransport`] wraps either to inject loss, duplication and reordering in tests.
//!
//! # Units
//! All sizes are in bytes. A *packet* is one datagram: eRPC's 16-byte packet header followed by
//! up to `mtu() - 16` bytes of message data. The transport does not look inside packets.
//!
//! # Zero-copy batching
//! - **Transmit** takes a slice of [`TxPkt`]s. Each packet is a gather list of two byte slices,
//!   header and data, because eRPC's message buffer keeps the headers of packets `1..N-1` apart
//!   from the contiguous data; the transport gathers them (`iovec`s for UDP, two data segments of
//!   a WQE for UD) without copying them into an intermediate buffer first. A packet that names
//!   its message buffer ([`TxPkt::mem`]) may be sent in place after `tx_burst` returns; the
//!   transport then holds the buffer until the send completed.
//! - **Receive** fills a ring of buffers that the transport allocated once, at construction.
//!   [`rx_burst`](DatagramTransport::rx_burst) reports how many datagrams arrived;
//!   [`rx_pkt`](DatagramTransport::rx_pkt) lends each one out in place; the borrow ends before
//!   the next `rx_burst` (which takes `&mut self`), at which point the buffers are reused.
//!
//! This *pull* style was chosen over a callback (`rx_burst(max, |addr, bytes| ..)`) because
//! (1) it is how eRPC's own loop is structured (receive a burst, process the ring, re-post the
//! receive descriptors) and maps one-to-one onto a UD receive queue, where
//! [`rx_release`](DatagramTransport::rx_release) is the re-post; (2) the core can look at a
//! packet, decide, and come back to it (e.g. hand a single-packet request to a dispatch-mode
//! handler zero-copy) without threading its whole state through a closure; and (3) nothing is
//! boxed or captured, so the steady state allocates nothing on either side.
//!
//! # Errors
//! Datagram loss is normal, so conditions that affect one packet (unreachable destination, a
//! datagram above the receiver's MTU) drop that packet and count it in [`TransportStats`]
//! instead of failing the call. A full send queue stops a transmit burst early (the return value
//! says how many were taken; retry the rest later). `Err` is reserved for caller bugs (a packet
//! larger than [`mtu`](DatagramTransport::mtu)) and for failures of the transport itself.

pub mod lossy;
pub mod path_mtu;
pub mod ud;
pub mod udp;

use std::fmt::Debug;
use std::hash::Hash;
use std::io;
use std::sync::Arc;

use mlx5::mem::DmaBuf;

pub use ud::{UdAddr, UdConfig, UdTransport};
pub(crate) use udp::ppoll_readable;
pub use udp::{UdpConfig, UdpMtu, UdpTransport};

/// Size in bytes of an eRPC packet header (the same value as
/// [`pkthdr::PKTHDR_SIZE`](super::pkthdr::PKTHDR_SIZE)); datagrams shorter than this are still
/// delivered by transports (the core validates and counts them).
pub const PKT_HDR_LEN: usize = super::pkthdr::PKTHDR_SIZE;

/// One outgoing datagram: a destination and a two-part gather list.
///
/// The datagram on the wire is `hdr` immediately followed by `data`. Either part may be empty;
/// their total length must not exceed the transport's [`mtu`](DatagramTransport::mtu).
#[derive(Clone, Copy, Debug)]
pub struct TxPkt<'a, A> {
    /// Where the datagram goes.
    pub dest: A,
    /// First part, normally the 16-byte eRPC packet header.
    pub hdr: &'a [u8],
    /// Second part, normally this packet's slice of the message data.
    pub data: &'a [u8],
    /// The DMA buffer that holds both `hdr` and `data` when they come from a message buffer
    /// ([`MsgBuffer::dma_handle`](super::msgbuf::MsgBuffer::dma_handle)), else `None`.
    ///
    /// With `Some`, a transport may send the packet in place, gathering `hdr` and `data`
    /// straight from the buffer after `tx_burst` returned (seeds/000 §3: header and data as
    /// two SGEs of one WQE). It then keeps a clone of the handle until the send completed, so
    /// the memory outlives every read of the NIC, and the caller must not rewrite those bytes
    /// while the clone exists ([`MsgBuffer::in_flight`](super::msgbuf::MsgBuffer::in_flight);
    /// the eRPC core keeps this rule). A transport that checks `hdr` and `data` are not inside
    /// the buffer copies the packet instead. With `None` the bytes are free again when
    /// `tx_burst` returns.
    pub mem: Option<&'a Arc<DmaBuf>>,
}

impl<'a, A> TxPkt<'a, A> {
    /// A datagram made of `hdr` followed by `data`, copied by the transport before
    /// `tx_burst` returns.
    pub fn new(dest: A, hdr: &'a [u8], data: &'a [u8]) -> Self {
        TxPkt {
            dest,
            hdr,
            data,
            mem: None,
        }
    }

    /// A datagram made of `hdr` followed by `data`, both inside the DMA buffer `mem`, which a
    /// transport may send in place (see [`TxPkt::mem`] for the caller's obligation).
    pub fn in_buffer(dest: A, hdr: &'a [u8], data: &'a [u8], mem: &'a Arc<DmaBuf>) -> Self {
        TxPkt {
            dest,
            hdr,
            data,
            mem: Some(mem),
        }
    }

    /// A datagram made of one contiguous byte slice.
    pub fn single(dest: A, bytes: &'a [u8]) -> Self {
        TxPkt {
            dest,
            hdr: bytes,
            data: &[],
            mem: None,
        }
    }

    /// Length in bytes of the datagram (`hdr.len() + data.len()`).
    pub fn len(&self) -> usize {
        self.hdr.len() + self.data.len()
    }

    /// Whether the datagram has no payload at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Counters kept by a transport since it was created. All are monotonically increasing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Datagrams handed to the network.
    pub tx_pkts: u64,
    /// Payload bytes of the datagrams in `tx_pkts`.
    pub tx_bytes: u64,
    /// Datagrams dropped at send time because of an error that concerns only that packet
    /// (e.g. unreachable network, address family the socket cannot reach).
    pub tx_errors: u64,
    /// Times a transmit burst stopped early because the send queue was full.
    pub tx_would_block: u64,
    /// Transmit system calls (or doorbells) made; `tx_pkts / tx_calls` is the batching factor.
    pub tx_calls: u64,
    /// Datagrams of `tx_pkts` sent in place from the caller's message buffer
    /// ([`TxPkt::mem`]) without being copied: gathered by the NIC (mlx5 UD). Transports that
    /// copy every datagram (UDP: the kernel copies in `sendmmsg`) leave it 0.
    pub tx_in_place: u64,
    /// Message buffers registered with the NIC for in-place sends (once per buffer while it
    /// lives; mlx5 UD).
    pub tx_registrations: u64,
    /// Datagrams delivered by `rx_burst`.
    pub rx_pkts: u64,
    /// Payload bytes of the datagrams in `rx_pkts`.
    pub rx_bytes: u64,
    /// Datagrams dropped on receipt because they were larger than [`DatagramTransport::mtu`].
    pub rx_oversized: u64,
    /// Datagrams delivered that were shorter than [`PKT_HDR_LEN`] (also counted in `rx_pkts`).
    pub rx_short: u64,
    /// Receive calls that failed with an error other than "nothing to receive".
    pub rx_errors: u64,
    /// Receive system calls (or completion-queue polls) that returned at least one datagram.
    pub rx_calls: u64,
}

/// An unreliable, batched datagram transport; the interface the eRPC core drives.
///
/// Implementations preallocate everything at construction, so [`tx_burst`](Self::tx_burst),
/// [`rx_burst`](Self::rx_burst), [`rx_pkt`](Self::rx_pkt) and [`rx_release`](Self::rx_release)
/// never allocate. None of them blocks.
pub trait DatagramTransport {
    /// Address of an endpoint, small and cheap to copy; sessions are keyed by it.
    type Addr: Copy + Eq + Hash + Debug;

    /// Largest datagram payload in bytes (header included) that can be sent and received.
    /// The eRPC core packs `mtu() - 16` data bytes per packet.
    fn mtu(&self) -> usize;

    /// The address peers use to reach this endpoint.
    fn local_addr(&self) -> Self::Addr;

    /// The most datagrams one [`rx_burst`](Self::rx_burst) can return (the receive ring size);
    /// fixed for the transport's lifetime (the event loop reads it once).
    fn rx_batch(&self) -> usize;

    /// The most datagrams that can wait for [`rx_burst`](Self::rx_burst) before the receive
    /// path drops new ones: a UD queue pair's receive WQEs (RQ depth), or what a UDP socket's
    /// receive buffer holds. The eRPC core's admission control
    /// ([`Config::rx_ring_entries`](crate::erpc::core::Config::rx_ring_entries)) admits only
    /// as many sessions as this absorbs at full credit (issue 12; eRPC: `kNumRxRingEntries`).
    fn rx_ring_entries(&self) -> usize;

    /// Sends `pkts` in order, batching system calls, without blocking.
    ///
    /// Returns how many packets from the front of `pkts` were consumed: sent, or dropped because
    /// of a per-packet error (counted in [`TransportStats::tx_errors`]). A value below
    /// `pkts.len()` means the send queue is full; the caller retries the rest later.
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] if any packet is longer than [`mtu`](Self::mtu); nothing
    /// is sent in that case. Any other error means the transport itself failed (it is returned
    /// only when no packet of this call was consumed; otherwise the call returns the count and
    /// the next one reports the error).
    fn tx_burst(&mut self, pkts: &[TxPkt<'_, Self::Addr>]) -> io::Result<usize>;

    /// Largest datagram in bytes that [`tx_post`](Self::tx_post) takes; 0 (the default) if
    /// the transport has no cheaper path than [`tx_burst`](Self::tx_burst) for one datagram,
    /// in which case callers send everything with `tx_burst`.
    fn tx_post_max(&self) -> usize {
        0
    }

    /// Sends one contiguous datagram of at most [`tx_post_max`](Self::tx_post_max) bytes,
    /// copied before the call returns, without handing it to the network yet: the datagrams
    /// posted since the last [`tx_post_flush`](Self::tx_post_flush) (or `tx_burst`, which
    /// flushes them too) leave, in posting order and before those of later calls, at that
    /// flush. This lets a caller that produces datagrams one by one batch them without
    /// building a descriptor list (the mlx5 UD transport writes each into its send WQE and
    /// rings one doorbell per batch).
    ///
    /// Returns `true` if the datagram was consumed (posted, or dropped because of an error
    /// that concerns only it, counted as in `tx_burst`), `false` if the send queue is full
    /// (nothing consumed; retry later). The default sends it with a one-datagram `tx_burst`.
    ///
    /// # Errors
    /// As [`tx_burst`](Self::tx_burst).
    fn tx_post(&mut self, dest: Self::Addr, bytes: &[u8]) -> io::Result<bool> {
        self.tx_burst(&[TxPkt::single(dest, bytes)]).map(|n| n == 1)
    }

    /// [`tx_post`](Self::tx_post) for a datagram given as a header and its data (`hdr` then
    /// `data`, together at most [`tx_post_max`](Self::tx_post_max) bytes), so that the caller
    /// need not concatenate them first. The default sends it with a one-datagram `tx_burst`.
    ///
    /// # Errors
    /// As [`tx_burst`](Self::tx_burst).
    fn tx_post_parts(&mut self, dest: Self::Addr, hdr: &[u8], data: &[u8]) -> io::Result<bool> {
        self.tx_burst(&[TxPkt::new(dest, hdr, data)])
            .map(|n| n == 1)
    }

    /// Hands the datagrams posted with [`tx_post`](Self::tx_post) to the network (one
    /// doorbell); nothing if none is pending. The default does nothing (its `tx_post` sends
    /// at once).
    fn tx_post_flush(&mut self) {}

    /// Receives up to `max` (capped at [`rx_batch`](Self::rx_batch)) datagrams into the
    /// receive ring without blocking, and returns how many are available through
    /// [`rx_pkt`](Self::rx_pkt) (`0` if none were waiting).
    ///
    /// Any packets of the previous burst not yet released are released first. Datagrams larger
    /// than [`mtu`](Self::mtu) are dropped and counted ([`TransportStats::rx_oversized`]);
    /// datagrams shorter than a packet header are delivered (and counted in
    /// [`TransportStats::rx_short`]). Receive errors are counted in
    /// [`TransportStats::rx_errors`] and yield `0`.
    fn rx_burst(&mut self, max: usize) -> usize;

    /// Whether an [`rx_burst`](Self::rx_burst) now would certainly return 0 and have nothing
    /// else to do: no datagram waits and no other receive-side work is pending (for the
    /// mlx5 UD transport: the receive CQ's next entry is still the device's, and no in-place
    /// send waits to be retired). `false` promises nothing. An event loop skips its receive
    /// step when this is `true`; the default (`false`) keeps every call. Must not block or
    /// make a system call.
    #[inline]
    fn rx_idle(&self) -> bool {
        false
    }

    /// The `i`-th datagram of the current burst: its source and its bytes, in place in the
    /// receive ring.
    ///
    /// # Panics
    /// If `i` is not below the count the last [`rx_burst`](Self::rx_burst) returned, or the
    /// burst was released.
    fn rx_pkt(&self, i: usize) -> (Self::Addr, &[u8]);

    /// Returns the buffers of the current burst to the receive ring. Optional: the next
    /// [`rx_burst`](Self::rx_burst) does it implicitly.
    fn rx_release(&mut self);

    /// A snapshot of the counters.
    fn stats(&self) -> TransportStats;

    /// Blocks the thread until a datagram may be waiting or `timeout` has passed, for an
    /// event loop with nothing to do ([`crate::erpc::idle`]). The only call of this trait that
    /// may sleep, and never longer than `timeout`. [`RxWait::Ready`] promises nothing (a
    /// signal or a datagram of another kind may end the wait): the caller polls next.
    ///
    /// The default is [`RxWait::Unsupported`], returned at once: a transport without a way
    /// to sleep until a datagram arrives (the mlx5 UD transport: the device model has no
    /// completion channel, the interrupt a NIC raises for an armed CQ) is polled instead.
    fn rx_wait(&mut self, timeout: std::time::Duration) -> RxWait {
        let _ = timeout;
        RxWait::Unsupported
    }

    /// What [`rx_wait`](Self::rx_wait) would wait on, for a caller that waits for several
    /// transports at once (one `ppoll` over all of them: a client of several servers, see
    /// [`wait_for_any_response`](crate::erpc::wait_for_any_response)). The default is
    /// [`RxFd::Unsupported`].
    fn rx_wait_fd(&self) -> RxFd {
        RxFd::Unsupported
    }
}

/// What [`DatagramTransport::rx_wait_fd`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxFd {
    /// A datagram is already buffered: [`DatagramTransport::rx_wait`] would return at once.
    Ready,
    /// `rx_wait` waits for this descriptor to become readable (`POLLIN`).
    Fd(std::os::fd::RawFd),
    /// The transport cannot wait for a datagram.
    Unsupported,
}

/// What [`DatagramTransport::rx_wait`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxWait {
    /// The wait ended early: a datagram may be waiting (or a signal interrupted it).
    Ready,
    /// `timeout` passed with nothing to receive.
    TimedOut,
    /// The transport cannot wait for a datagram; it returned at once.
    Unsupported,
}

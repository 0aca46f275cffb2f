//! Software device model: an in-memory ConnectX that executes the same WQEs as the hardware.
//!
//! "The same objects, created in memory and connected by a fabric object shared by the ranks
//! (threads) of a process." (Across processes on one host: [`Fabric::join`], see "Across
//! processes" below.) On a doorbell the model reads the producer index, parses each WQE
//! exactly as the PRM defines it, and executes." A [`Fabric`] is that shared object;
//! [`Fabric::open`] gives each rank a [`Context`] on a new simulated device (its own port and
//! LID) whose [`crate::verbs::Provider`] allocates the queue memory that the driver
//! ([`crate::sq`], [`crate::rq`], [`crate::srq`], [`crate::cq`]) then uses exactly as on
//! hardware. Only the doorbell differs: [`crate::queue::Doorbell::Sim`] calls the model.
//!
//! ```
//! use mlx5::sim::{Fabric, SimConfig};
//! let fabric = Fabric::new(SimConfig::default());
//! let (a, b) = (fabric.open(), fabric.open());
//! assert_ne!(a.port().lid, b.port().lid);
//! ```
//!
//! # What executes
//! On [`crate::queue::SimDoorbell::ring_sq`] the model reads the SQ producer from `dbrec[1]`
//! (16 bits, extended against its own consumer counter), copies each new WQE out of the ring
//! (modulo the ring, so a WQE may wrap past the end), checks its control segment (opcode, `ds`,
//! `wqe_index == pi & 0xffff`, QPN: a mismatch is a malformed WQE, stricter than hardware),
//! parses it with [`crate::wqe::parse`] and executes it:
//! - RC SEND/SEND_IMM, RDMA WRITE/WRITE_IMM/READ, ATOMIC_CS/FA between connected QPs, UD
//!   SEND/SEND_IMM to any UD QP of the fabric, NOP. Receive WQEs are consumed in order from an
//!   RQ, or from an SRQ by following its free list (`next_wqe_index`) from WQE 0.
//! - Atomics treat the 8 remote bytes as a big-endian u64, as ConnectX does, and return the
//!   original 8 bytes unchanged into the local buffer. They are atomic with respect to other
//!   model operations (the fabric lock), not to CPU atomics on the same memory (as on hardware).
//! - Every address a WQE names is validated against the MR table (key, PD, range, access)
//!   before anything is copied (`sim/memory.rs`); an invalid one never causes a write.
//!
//! # Errors (PRM syndromes)
//! Requester: bad lkey/range/LOCAL_WRITE → LOCAL_PROT; malformed WQE, an opcode invalid for
//! the QP type, inline data on READ/atomics, a QP not in RTS → LOCAL_QP_OP; UD payload over
//! the MTU or an atomic result buffer under 8 bytes → LOCAL_LENGTH; bad rkey/range/MR access →
//! REMOTE_ACCESS; a misaligned atomic or an operation the responder QP's access flags
//! ([`crate::verbs::RcParams::access`]) do not permit → REMOTE_INVAL_REQ; receive buffers too
//! short → responder LOCAL_LENGTH + requester REMOTE_INVAL_REQ; a bad receive SGE → responder
//! LOCAL_PROT + requester REMOTE_OP; RNR retries exhausted → RNR_RETRY_EXC; a peer that does
//! not exist, is not RC, not connected back, on another port (its LID; its GID when connected
//! with LID 0, RoCE style) or in error → TRANSPORT_RETRY_EXC once `retry_cnt` retries failed. The first error CQE is written even for an unsignaled
//! WQE; the QP enters the error state and every later WQE (already rung or rung later) is
//! flushed with a WR_FLUSH error CQE, NOPs included, as are its posted (non-SRQ) receive WQEs.
//! A responder-side error also moves the responder QP to the error state. A remote access
//! error does not (hardware may also break the responder's connection; the model keeps the
//! responder usable, which is what a transport testing its own error handling wants).
//!
//! # Progress and retries
//! A *progress step* happens on every doorbell of the fabric and on [`Fabric::progress`]. Each
//! step delivers due delayed UD packets and released reordered ones, then gives every stalled
//! QP one retry (after [`SimConfig::rnr_retry_interval`] / `transport_retry_interval` steps),
//! and flushes QPs in the error state. A WQE that finds no receive WQE (RC SEND/WRITE_IMM)
//! stays at the head of its SQ (the QP stalls in order behind it); after `rnr_retry` failed
//! retries (from [`crate::verbs::RcParams`], 7 = infinite as on hardware, overridable with
//! [`SimConfig::rnr_retry_override`]) it fails with RNR_RETRY_EXC. Posting receives does not
//! ring the model, so a stalled sender resumes on the next step caused by anyone; with
//! [`SimConfig::progress_thread`] (on by default, every [`DEFAULT_PROGRESS_INTERVAL`]) a
//! background thread also makes steps periodically, as a NIC's retransmission timer would;
//! [`SimConfig::deterministic`] turns it off.
//!
//! # Concurrency and memory ordering
//! All model state is behind one mutex per fabric (correctness first: a doorbell executes its
//! WQEs, writes remote memory and CQEs, all under that lock). Ranks are threads; a doorbell
//! rung by one thread writes into another thread's registered memory and CQ. The ordering
//! argument, edge by edge:
//! 1. *SQ (driver → model).* The ringing thread writes its WQEs and `dbrec[1]`, then calls the
//!    model, which records the producer index under the lock. WQEs are read (possibly by
//!    another thread's later step, e.g. an RNR retry) only up to that recorded index, so the
//!    mutex's release/acquire orders them; the model never reads a WQE that was not rung.
//! 2. *RQ/SRQ (driver → model).* The receiving thread writes a receive WQE and then stores the
//!    doorbell record; the model loads the record with Acquire and reads only WQEs below it.
//!    This requires the driver's store to be a Release store (or a Release fence followed by
//!    an atomic store), which is what a driver needs on hardware anyway (a store barrier).
//! 3. *Data and CQEs (model → driver).* Data is copied into registered memory, then the CQE's
//!    bytes 0..63, then `op_own` is stored with Release. A consumer that sees the new owner
//!    bit with an Acquire load (or a load followed by an Acquire fence, the PRM's "read
//!    barrier") sees the CQE and the data. For consumers that detect arrival by polling
//!    memory instead (last-byte polling), the last 8 bytes of each written buffer are stored
//!    with Release atomics after the rest.
//! 4. *CQ consumer index (driver → model).* Loaded with Acquire before every CQE write: the
//!    consumer's Release store of the index happens after it finished reading the released
//!    entries, so the model never overwrites an entry that is still being read.
//!
//! Objects are destroyed when their provider handle drops: the handle removes the object
//! from the model under the lock and only then frees its memory. The model refers to objects
//! by number only, so a doorbell on a destroyed QP is ignored, a CQE for a destroyed CQ is
//! counted as lost, and a packet to a destroyed QP is dropped.
//!
//! # QPC cache
//! A NIC keeps the contexts of recently used QPs (QPC: state, PSNs, queue addresses, keys) in
//! on-chip memory; to work on a QP whose context is not cached it first reads the context from
//! host memory over PCIe. Once the QPs in use outnumber the cache, every operation pays that
//! round trip, which is the connection-scalability problem ScaleRPC (grouping clients so that
//! only one group's QPs are active at a time) addresses. The model gives every device (every
//! [`Fabric::open`], i.e. every NIC) an LRU cache of [`QpcCacheConfig::entries`] contexts,
//! configured by [`SimConfig::qpc_cache`]: by default 1000 entries (the ConnectX-5 estimate
//! of seeds/003, [`QpcCacheConfig::CX5_ENTRIES`]; ConnectX-3: 400) and a miss penalty of
//! 500 ns (one PCIe round trip to fetch the context from host memory, the cost a QPC miss
//! stands for). `None` disables the model: no lookups, no counters, no penalty.
//!
//! Lookups, each a hit or a miss (a miss loads the context, evicting the least recently used
//! one when the cache is full):
//! - the requester's device looks up the requester QP for every WQE it executes (RNR and
//!   transport retries included, as the NIC re-reads the context; flushed and malformed WQEs
//!   and WQEs on a QP not in RTS are not looked up);
//! - for RC operations that reach a connected responder, the responder's device looks up the
//!   responder QP (also when the operation then stalls on RNR or fails on the remote key);
//! - for UD, the destination device looks up the destination QP for every packet that reaches
//!   an existing UD QP in RTS on that port (duplicates included; before the Q_Key check).
//!
//! Two QPs on one device share its cache. Creating or connecting a QP loads nothing; a
//! destroyed QP leaves its device's cache. Every miss busy-waits
//! [`QpcCacheConfig::miss_penalty`] while executing, inside the doorbell and *with the fabric
//! lock held*: the NIC stalls on the fetch, but since one lock serialises the whole fabric, a
//! miss also delays the doorbells of every other device (threads) of the fabric, not only the
//! NIC that missed. Throughput drops accordingly once the working set of QPs exceeds the
//! cache.
//!
//! Counters: [`SimStats::qpc_hits`] and [`SimStats::qpc_misses`] sum over all devices;
//! [`Fabric::qpc_stats`] (by LID) and [`SimDevice::qpc_stats`] give one device's
//! [`QpcStats`] (hits, misses, evictions, contexts resident). A benchmark separates the server
//! NIC's misses from a client NIC's by the LIDs of their contexts:
//!
//! ```
//! use mlx5::sim::{Fabric, SimConfig};
//! let fabric = Fabric::new(SimConfig::deterministic());
//! let (server, client) = (fabric.open(), fabric.open());
//! let before = fabric.qpc_stats(server.port().lid).unwrap();
//! // ... run the workload ...
//! let server_misses = fabric.qpc_stats(server.port().lid).unwrap().since(&before).misses;
//! let client_misses = fabric.qpc_stats(client.port().lid).unwrap().misses;
//! assert_eq!((server_misses, client_misses), (0, 0));
//! ```
//!
//! # Across processes
//! [`Fabric::join`] puts the fabric of every process on one host that joins the same node name
//! into one network: each process keeps its own model (its devices, queues and retries), and the
//! models share a node directory in `/dev/shm` (`sim/node.rs`) through which they find each
//! other's QPs, SRQs, CQs and memory regions. From the join on, the process's DMA buffers
//! ([`crate::mem::DmaBuf`]) and the model's queue memory are shared segment files, so when a
//! doorbell in one process executes an RC WRITE/SEND/READ/atomic or a UD SEND to a QP of another
//! process, that process's memory is written directly: the payload lands in its
//! registered buffer, the receive WQE is consumed from its RQ/SRQ, the CQE appears in its CQ (the
//! queue's device counters live in the queue memory, `sim/alloc.rs`), exactly as a NIC's DMA
//! would, with no help from the target process's CPU. Numbers (QPN, CQN, SRQN, MR index, PD) and
//! LIDs are unique on the node. Every model operation runs under the process's fabric mutex and
//! the node lock (an OFD file lock the kernel releases if its holder dies), waited for at most
//! [`SimConfig::node_lock_timeout`]: a lock held longer (by a stopped peer, or by anyone who can
//! open the directory) gives [`crate::error::Error::LockTimeout`], never a stall. The node's
//! files are this user's only: created `O_EXCL` with mode 0600 whatever the umask, and checked
//! with `fstat` for owner and mode before they are mapped ([`crate::mem`] "Ownership").
//!
//! A process that dies (however: `abort`, `SIGKILL`) drops its liveness lock; within about
//! 1 ms (`LIVENESS_PERIOD` in `sim/node.rs`) of a peer's next doorbell or progress step, the peer marks
//! it dead ([`SimStats::peer_deaths`]) and its QPs become unreachable: RC requests to them fail
//! with TRANSPORT_RETRY_EXC after `retry_cnt` retries (the QP enters the error state, as
//! transports expect on hardware) and UD packets to them are dropped. Requests in that first
//! millisecond still land in the dead process's (orphaned) memory, as they would on a NIC that
//! has not yet been told. What a peer cannot do across processes: look up the target device's
//! QPC cache (only requester-side and same-process lookups are modelled), and reach memory
//! registered before the join (private memory; counted in [`SimStats::remote_unreachable_mr`]).
//! Fault injection applies to the packets a process sends.
//!
//! # Fault injection
//! UD packets meet [`SimConfig::ud_faults`] (`sim/faults.rs`): a seeded xoshiro256** owned by
//! the fabric draws each packet's fate (deliver, drop, duplicate, reorder, delay) in send
//! order. Same seed and same sequence of operations (one thread, or threads in a
//! deterministic order) → the same drops, duplicates and order.

mod alloc;
mod cq;
mod device;
mod exec;
pub(crate) mod faults;
pub(crate) mod memory;
mod model;
mod node;
mod qpc;
mod recv;
mod table;
mod target;
#[cfg(feature = "testkit")]
pub mod testkit;

#[cfg(test)]
mod export_props;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use crate::queue::SimDoorbell;
use crate::verbs::Context;
use crate::wqe::Opcode;

pub use device::SimDevice;
pub use node::DEFAULT_NODE_LOCK_TIMEOUT;

use model::Model;

/// UD fault injection parameters: per packet, one of drop / duplicate / reorder / delay is
/// chosen with these probabilities (their sum must not exceed 1), else the packet is
/// delivered normally.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UdFaults {
    /// RNG seed.
    pub seed: u64,
    /// Probability that a packet is lost.
    pub drop: f64,
    /// Probability that a packet is delivered twice.
    pub duplicate: f64,
    /// Probability that a packet is overtaken by the next one (delivered after it, or at the
    /// next progress step if none comes).
    pub reorder: f64,
    /// Probability that a packet is delayed by 1..=`max_delay` progress steps.
    pub delay: f64,
    /// Longest delay in progress steps (doorbells or [`Fabric::progress`] calls).
    pub max_delay: u32,
}

/// The QP-context cache of every simulated device (see "QPC cache" in the module docs).
///
/// ```
/// use std::time::Duration;
/// use mlx5::sim::{QpcCacheConfig, SimConfig};
/// // A ConnectX-3-sized cache with a 1 µs miss penalty.
/// let cfg = SimConfig {
///     qpc_cache: Some(QpcCacheConfig {
///         entries: QpcCacheConfig::CX3_ENTRIES,
///         miss_penalty: Duration::from_micros(1),
///     }),
///     ..SimConfig::default()
/// };
/// // No cache model at all (nothing counted, no penalty).
/// let off = SimConfig { qpc_cache: None, ..SimConfig::default() };
/// # let _ = (cfg, off);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpcCacheConfig {
    /// QP contexts each device caches (>= 1); LRU replacement.
    pub entries: usize,
    /// Busy-wait charged per miss, inside the doorbell and under the fabric lock.
    pub miss_penalty: Duration,
}

impl QpcCacheConfig {
    /// ConnectX-5 estimate (seeds/003 `NIC_QPC_CACHE_ENTRIES_CX5`); the default.
    pub const CX5_ENTRIES: usize = 1000;
    /// ConnectX-3 (seeds/003 `NIC_QPC_CACHE_ENTRIES_CX3`).
    pub const CX3_ENTRIES: usize = 400;
    /// One PCIe round trip to fetch a context from host memory (order of 0.5 µs); the
    /// default.
    pub const DEFAULT_MISS_PENALTY: Duration = Duration::from_nanos(500);
}

impl Default for QpcCacheConfig {
    fn default() -> Self {
        QpcCacheConfig {
            entries: Self::CX5_ENTRIES,
            miss_penalty: Self::DEFAULT_MISS_PENALTY,
        }
    }
}

/// Fabric configuration.
///
/// [`SimConfig::default`]: MTU 4096, lossless UD, retries at every step, a progress thread
/// stepping every [`DEFAULT_PROGRESS_INTERVAL`] (so a WQE towards a dead peer fails with
/// retry-exceeded on its own, as on RC hardware), a QPC cache of
/// [`QpcCacheConfig::CX5_ENTRIES`] contexts per device with a 500 ns miss penalty
/// ([`QpcCacheConfig::default`]). [`SimConfig::deterministic`]: the same without the progress
/// thread, for tests and instruction-count benchmarks that need steps only on doorbells.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Port MTU in bytes (the largest UD payload); 256..=4096, power of two.
    pub mtu: u32,
    /// UD fault injection (`None`: lossless, in order).
    pub ud_faults: Option<UdFaults>,
    /// Progress steps between two RNR retries of a stalled QP (>= 1).
    pub rnr_retry_interval: u32,
    /// Progress steps between two transport retries (peer unreachable) (>= 1).
    pub transport_retry_interval: u32,
    /// Replaces every QP's `rnr_retry` (7 = infinite).
    pub rnr_retry_override: Option<u8>,
    /// Run a background thread that makes a progress step at this interval: the model's
    /// stand-in for the NIC's retransmission timer, so a WQE towards a dead or unreachable
    /// peer fails with TRANSPORT_RETRY_EXC (and an RNR-stalled one is retried) even when
    /// nobody rings a doorbell. Default `Some(`[`DEFAULT_PROGRESS_INTERVAL`]`)`.
    ///
    /// Cost: one thread per fabric that wakes every interval and takes the fabric lock for
    /// one step (near zero CPU on an idle fabric; on a busy one each step competes for the
    /// lock with doorbells). `None` ([`SimConfig::deterministic`]): steps happen only on
    /// doorbells and [`Fabric::progress`], which keeps runs deterministic (same steps, same
    /// seeded fault decisions, same instruction counts), but a transport waiting on a dead
    /// peer without ringing a doorbell then waits until its own deadline.
    pub progress_thread: Option<Duration>,
    /// Each device's QP-context cache (`None`: not modelled, no counters, no penalty).
    pub qpc_cache: Option<QpcCacheConfig>,
    /// Joined node ([`Fabric::join`]): the longest a join or model operation waits for the
    /// node lock (an OFD lock on byte 0 of the node directory) while another open file
    /// description holds it. Beyond it the call fails with
    /// [`Error::LockTimeout`](crate::error::Error::LockTimeout) (a doorbell, which cannot fail,
    /// leaves its WQEs posted for the next one; see `sim/node.rs` "The lock wait is bounded"),
    /// counted in [`SimStats::node_lock_timeouts`]. Default [`DEFAULT_NODE_LOCK_TIMEOUT`] (1 s).
    pub node_lock_timeout: Duration,
}

/// Default [`SimConfig::progress_thread`] interval: 1 ms. With the default
/// `transport_retry_interval` of 1 step and a QP's `retry_cnt` of 7, a WQE towards a dead peer
/// fails within about 8 ms of steps even when nothing else rings a doorbell (RC hardware with
/// a short `timeout` reports it in the same order of magnitude).
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_millis(1);

impl SimConfig {
    /// [`SimConfig::default`] without the progress thread (`progress_thread: None`): progress
    /// steps happen only on doorbells and [`Fabric::progress`], so a run is deterministic.
    /// For tests that count steps or retries or use seeded fault injection, and for the
    /// instruction-count (callgrind) drivers. A peer's death is then seen only when someone
    /// rings a doorbell or calls [`Fabric::progress`].
    pub fn deterministic() -> Self {
        SimConfig {
            progress_thread: None,
            ..SimConfig::default()
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            mtu: 4096,
            ud_faults: None,
            rnr_retry_interval: 1,
            transport_retry_interval: 1,
            rnr_retry_override: None,
            progress_thread: Some(DEFAULT_PROGRESS_INTERVAL),
            qpc_cache: Some(QpcCacheConfig::default()),
            node_lock_timeout: DEFAULT_NODE_LOCK_TIMEOUT,
        }
    }
}

/// WQEs executed, per opcode (flushed WQEs are not counted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpcodeCounts {
    /// NOP.
    pub nop: u64,
    /// RDMA WRITE.
    pub rdma_write: u64,
    /// RDMA WRITE with immediate.
    pub rdma_write_imm: u64,
    /// SEND.
    pub send: u64,
    /// SEND with immediate.
    pub send_imm: u64,
    /// RDMA READ.
    pub rdma_read: u64,
    /// Atomic compare-and-swap.
    pub atomic_cs: u64,
    /// Atomic fetch-and-add.
    pub atomic_fa: u64,
}

impl OpcodeCounts {
    /// The counter of `op`.
    pub fn get(&self, op: Opcode) -> u64 {
        match op {
            Opcode::Nop => self.nop,
            Opcode::RdmaWrite => self.rdma_write,
            Opcode::RdmaWriteImm => self.rdma_write_imm,
            Opcode::Send => self.send,
            Opcode::SendImm => self.send_imm,
            Opcode::RdmaRead => self.rdma_read,
            Opcode::AtomicCs => self.atomic_cs,
            Opcode::AtomicFa => self.atomic_fa,
        }
    }

    pub(crate) fn bump(&mut self, op: Opcode) {
        let c = match op {
            Opcode::Nop => &mut self.nop,
            Opcode::RdmaWrite => &mut self.rdma_write,
            Opcode::RdmaWriteImm => &mut self.rdma_write_imm,
            Opcode::Send => &mut self.send,
            Opcode::SendImm => &mut self.send_imm,
            Opcode::RdmaRead => &mut self.rdma_read,
            Opcode::AtomicCs => &mut self.atomic_cs,
            Opcode::AtomicFa => &mut self.atomic_fa,
        };
        *c += 1;
    }

    /// All opcodes together.
    pub fn total(&self) -> u64 {
        self.nop
            + self.rdma_write
            + self.rdma_write_imm
            + self.send
            + self.send_imm
            + self.rdma_read
            + self.atomic_cs
            + self.atomic_fa
    }
}

/// A snapshot of the fabric's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Doorbells rung.
    pub doorbells: u64,
    /// Progress steps (doorbells plus [`Fabric::progress`] calls).
    pub steps: u64,
    /// WQEs executed successfully, per opcode.
    pub wqes: OpcodeCounts,
    /// Payload bytes moved into registered memory (sends, writes, reads, atomics; UD GRH
    /// areas not included).
    pub bytes: u64,
    /// CQEs written (all kinds).
    pub cqes: u64,
    /// Error CQEs written (requester and responder, flushes included).
    pub error_cqes: u64,
    /// WR_FLUSH error CQEs written (send and receive WQEs).
    pub flushes: u64,
    /// CQ overruns detected (one per CQ).
    pub cq_overruns: u64,
    /// CQEs not written because their CQ had overrun or was destroyed.
    pub cqes_lost: u64,
    /// RNR retries made (successful or not).
    pub rnr_retries: u64,
    /// Transport retries made (peer unreachable).
    pub transport_retries: u64,
    /// UD packets sent (requester side).
    pub ud_sent: u64,
    /// UD packets placed into a receive WQE (duplicates included).
    pub ud_delivered: u64,
    /// UD packets dropped by fault injection.
    pub ud_drops: u64,
    /// UD packets duplicated by fault injection.
    pub ud_dups: u64,
    /// UD packets reordered by fault injection.
    pub ud_reorders: u64,
    /// UD packets delayed by fault injection.
    pub ud_delays: u64,
    /// UD packets dropped: no such QPN, not a UD QP, not active, or another port's LID (GID
    /// when the address vector has LID 0 and a GRH).
    pub ud_no_dest: u64,
    /// UD packets dropped: Q_Key mismatch.
    pub ud_bad_qkey: u64,
    /// UD packets dropped: no receive WQE at the destination.
    pub ud_no_recv: u64,
    /// QPC cache hits, all devices (requester and responder lookups).
    pub qpc_hits: u64,
    /// QPC cache misses, all devices (each charged [`QpcCacheConfig::miss_penalty`]).
    pub qpc_misses: u64,
    /// Joined node: accesses refused because the peer's region was registered on private
    /// memory (allocated before [`Fabric::join`]), which no other process can reach.
    pub remote_unreachable_mr: u64,
    /// Joined node: peer processes this model found dead (liveness lock gone).
    pub peer_deaths: u64,
    /// Joined node: live exports of peers' QPs that failed validation (sizes, numbers,
    /// segments missing or too short); the QP is treated as unreachable.
    pub remote_bad_exports: u64,
    /// Joined node: calls that gave up waiting for the node lock after
    /// [`SimConfig::node_lock_timeout`] (another open file description held it).
    pub node_lock_timeouts: u64,
    /// Shared files this process refused to map because of their owner, mode or type (the
    /// node directory, peers' segments; see [`crate::mem`] "Ownership"). Process-wide.
    pub unsafe_files_refused: u64,
}

/// One device's QPC cache counters ([`Fabric::qpc_stats`], [`SimDevice::qpc_stats`]). All
/// zero when the cache is disabled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpcStats {
    /// Lookups that found the QP's context cached.
    pub hits: u64,
    /// Lookups that had to load it (each charged the miss penalty).
    pub misses: u64,
    /// Contexts evicted to make room (LRU); destroyed QPs leaving the cache are not counted.
    pub evictions: u64,
    /// Contexts cached now.
    pub resident: u64,
}

impl QpcStats {
    /// Misses per lookup (0 with no lookups).
    pub fn miss_ratio(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.misses as f64 / n as f64
        }
    }

    /// The counters accumulated since `earlier` (a snapshot of the same device); `resident`
    /// is this snapshot's.
    pub fn since(&self, earlier: &QpcStats) -> QpcStats {
        QpcStats {
            hits: self.hits - earlier.hits,
            misses: self.misses - earlier.misses,
            evictions: self.evictions - earlier.evictions,
            resident: self.resident,
        }
    }
}

/// A QP's state as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimQpState {
    /// Created, not yet connected/activated.
    Reset,
    /// Ready to send (and receive).
    Rts,
    /// Error: every WQE is flushed.
    Error,
}

/// The state shared by all handles of one fabric.
pub(crate) struct Shared {
    model: Mutex<Model>,
    /// The node directory when the fabric spans processes ([`Fabric::join`]).
    node: Option<Arc<node::NodeDir>>,
}

/// The model, locked: the fabric mutex and, on a joined node, the node lock (taken after the
/// mutex, released before it: the node lock is owned by the process's open file description,
/// so the mutex is what keeps two threads of one process from both believing they hold it).
pub(crate) struct ModelGuard<'a> {
    // Field order is drop order: the node lock goes first.
    _node: Option<node::NodeLock<'a>>,
    model: MutexGuard<'a, Model>,
}

impl std::ops::Deref for ModelGuard<'_> {
    type Target = Model;
    fn deref(&self) -> &Model {
        &self.model
    }
}

impl std::ops::DerefMut for ModelGuard<'_> {
    fn deref_mut(&mut self) -> &mut Model {
        &mut self.model
    }
}

impl Shared {
    /// Locks the model: the fabric mutex and, on a joined node, the node lock (a panic while
    /// holding the mutex does not wedge the fabric: the state is still consistent object by
    /// object).
    ///
    /// # Errors
    /// [`crate::error::Error::LockTimeout`] if the node lock stays held by another open file
    /// description for [`SimConfig::node_lock_timeout`] (counted in
    /// [`SimStats::node_lock_timeouts`]); the mutex is released again.
    #[inline]
    pub(crate) fn lock(&self) -> crate::error::Result<ModelGuard<'_>> {
        let mut model = self.model.lock().unwrap_or_else(|e| e.into_inner());
        let node = match &self.node {
            None => None,
            Some(d) => match d.lock() {
                Ok(l) => Some(l),
                Err(e) => {
                    model.stats.node_lock_timeouts += 1;
                    return Err(e);
                }
            },
        };
        Ok(ModelGuard { _node: node, model })
    }

    /// Only the fabric mutex, never the node lock: for reading this process's own state
    /// (counters, configuration, its QPs' and CQs' states) and adding a device (its LID comes
    /// from an atomic counter in the directory).
    pub(crate) fn lock_local(&self) -> ModelGuard<'_> {
        ModelGuard {
            _node: None,
            model: self.model.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// For tearing down this process's own objects, which cannot fail: [`Shared::lock`], or,
    /// when the node lock stays held for the whole bound, the fabric mutex alone (the
    /// object must leave the model before its memory is freed; peers keep their own mappings
    /// of its segments, so they never touch freed memory).
    pub(crate) fn lock_for_teardown(&self) -> ModelGuard<'_> {
        match self.lock() {
            Ok(g) => g,
            Err(e) => {
                tracing::error!("sim: tearing an object down without the node lock: {e}");
                self.lock_local()
            }
        }
    }
}

/// The node this process joined (one per process: its DMA buffers follow it).
static JOINED: Mutex<Option<(String, Weak<Shared>)>> = Mutex::new(None);

impl SimDoorbell for Shared {
    #[inline]
    fn ring_sq(&self, qpn: u32) {
        if self.node.is_none() {
            // A process-local fabric: the mutex is the whole lock (as in `lock_local`), and no
            // `ModelGuard` is built and dropped around it.
            self.model
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .ring(qpn);
            return;
        }
        match self.lock() {
            Ok(mut g) => g.ring(qpn),
            // Counted and logged by `lock`: the WQEs stay posted (their producer index is in
            // the doorbell record) and run at the next doorbell of this QP.
            Err(e) => ring_deferred(qpn, &e),
        }
    }
}

#[cold]
#[inline(never)]
fn ring_deferred(qpn: u32, e: &crate::error::Error) {
    tracing::error!(qpn, "sim: doorbell not executed: {e}; the WQEs stay posted");
}

/// A simulated network: devices opened on it reach each other. Cheap to clone (an `Arc`).
#[derive(Clone)]
pub struct Fabric {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for Fabric {
    fn default() -> Self {
        Fabric::new(SimConfig::default())
    }
}

impl Fabric {
    /// A new, empty fabric.
    ///
    /// # Panics
    /// On an invalid configuration: an MTU that is not a power of two in 256..=4096, a retry
    /// interval of 0, fault probabilities outside [0, 1] or summing to more than 1.
    pub fn new(cfg: SimConfig) -> Fabric {
        Self::build(cfg, None)
    }

    fn build(cfg: SimConfig, dir: Option<Arc<node::NodeDir>>) -> Fabric {
        assert!(
            cfg.mtu.is_power_of_two() && (256..=4096).contains(&cfg.mtu),
            "SimConfig::mtu must be a power of two in 256..=4096, got {}",
            cfg.mtu
        );
        assert!(
            cfg.rnr_retry_interval >= 1 && cfg.transport_retry_interval >= 1,
            "SimConfig retry intervals must be >= 1"
        );
        if let Some(f) = cfg.ud_faults {
            let ps = [f.drop, f.duplicate, f.reorder, f.delay];
            assert!(
                ps.iter().all(|p| (0.0..=1.0).contains(p)) && ps.iter().sum::<f64>() <= 1.0,
                "SimConfig::ud_faults probabilities must be in [0, 1] and sum to at most 1: {f:?}"
            );
        }
        if let Some(c) = cfg.qpc_cache {
            assert!(
                c.entries >= 1,
                "SimConfig::qpc_cache entries must be >= 1 (use None to disable the cache)"
            );
        }
        let interval = cfg.progress_thread;
        let mut model = Model::new(cfg);
        if let Some(d) = &dir {
            model.mrs.slot = Some(d.slot);
            model.node = Some(target::link(d.clone()));
        }
        let shared = Arc::new(Shared {
            model: Mutex::new(model),
            node: dir,
        });
        if let Some(every) = interval {
            let weak: Weak<Shared> = Arc::downgrade(&shared);
            std::thread::Builder::new()
                .name("mlx5-sim-progress".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(every);
                        match weak.upgrade() {
                            Some(s) => {
                                if let Ok(mut g) = s.lock() {
                                    g.step();
                                }
                            }
                            None => break,
                        }
                    }
                })
                .expect("spawn the sim progress thread");
        }
        Fabric { shared }
    }

    /// Joins the node-wide fabric `node`: every process on this host that joins the same name
    /// shares one fabric, so a doorbell rung in one process moves bytes into another process's
    /// registered memory and CQ (see "Across processes" in the module docs).
    ///
    /// Call it before allocating any [`crate::mem::DmaBuf`] that will be registered: from this
    /// call on, the process's DMA buffers and the model's queue memory live in shared memory.
    ///
    /// # Errors
    /// [`crate::error::Error::Memory`] if the shared directory cannot be created or mapped;
    /// [`crate::error::Error::InvalidArgument`] for a bad name or a directory of another
    /// layout version, or when the process already joined a different node.
    ///
    /// Joining again a node this process already joined returns the same fabric (`cfg` is
    /// then ignored).
    ///
    /// # Panics
    /// On an invalid configuration, as [`Fabric::new`].
    pub fn join(node: &str, cfg: SimConfig) -> crate::error::Result<Fabric> {
        let mut joined = JOINED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((name, weak)) = joined.as_ref()
            && let Some(shared) = weak.upgrade()
        {
            if name == node {
                return Ok(Fabric { shared });
            }
            return Err(crate::error::Error::InvalidArgument(format!(
                "this process is joined to node {name}, cannot join {node}"
            )));
        }
        let dir = node::NodeDir::join(node, cfg.node_lock_timeout)?;
        crate::mem::set_backing(dir.backing.clone())?;
        let fabric = Self::build(cfg, Some(Arc::new(dir)));
        *joined = Some((node.to_string(), Arc::downgrade(&fabric.shared)));
        Ok(fabric)
    }

    /// This process's slot on the node it joined (`None` for a process-local fabric).
    pub fn node_slot(&self) -> Option<u32> {
        self.shared.node.as_ref().map(|d| d.slot)
    }

    /// Opens a new simulated device (one port, its own LID) on this fabric: one per rank.
    pub fn open(&self) -> Context {
        Context::new(Arc::new(self.open_device()))
    }

    /// Like [`Fabric::open`], returning the device itself.
    pub fn open_device(&self) -> SimDevice {
        let (id, port) = self.shared.lock_local().add_device();
        SimDevice::new(self.shared.clone(), id, port)
    }

    /// Counters so far.
    pub fn stats(&self) -> SimStats {
        let mut s = self.shared.lock_local().stats;
        s.unsafe_files_refused = crate::mem::unsafe_files_refused();
        s
    }

    /// QPC cache counters of the device whose port has LID `lid` (`None`: no such device).
    /// Pass a rank's `ctx.port().lid` to separate, e.g., the server NIC's misses from a
    /// client NIC's; [`Fabric::stats`] has the sums over all devices.
    pub fn qpc_stats(&self, lid: u16) -> Option<QpcStats> {
        self.shared.lock_local().qpc_stats_by_lid(lid)
    }

    /// Makes one progress step: delivers due delayed/reordered UD packets, retries stalled
    /// QPs once, flushes QPs in error. On a joined node whose node lock stays held by someone
    /// else for [`SimConfig::node_lock_timeout`], the step is skipped (counted in
    /// [`SimStats::node_lock_timeouts`]; [`Fabric::try_progress`] returns the error).
    pub fn progress(&self) {
        let _ = self.try_progress();
    }

    /// [`Fabric::progress`], returning the error when the step was skipped.
    ///
    /// # Errors
    /// [`crate::error::Error::LockTimeout`] if the node lock stayed held by another open file
    /// description for [`SimConfig::node_lock_timeout`].
    pub fn try_progress(&self) -> crate::error::Result<()> {
        self.shared.lock()?.step();
        Ok(())
    }

    /// Whether CQ `cqn` overran (hardware would raise an asynchronous CQ error event).
    pub fn cq_overrun(&self, cqn: u32) -> bool {
        self.shared.lock_local().cq_overrun(cqn)
    }

    /// The state of QP `qpn` (`None` if it does not exist).
    pub fn qp_state(&self, qpn: u32) -> Option<SimQpState> {
        self.shared.lock_local().qp_state(qpn)
    }

    /// The configuration.
    pub fn config(&self) -> SimConfig {
        self.shared.lock_local().cfg.clone()
    }
}

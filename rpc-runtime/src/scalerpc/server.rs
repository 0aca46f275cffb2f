//! The ScaleRPC server (seeds/003 §5.3): one RC QP per client connection, one shared message
//! pool that clients RDMA WRITE their requests into (virtualized mapping, [`super::sched`]),
//! a dispatch loop that scans the slots of the groups being served, and responses written
//! back by RDMA WRITE into the client's response slot (or left in the pool slot for the
//! client's RDMA READ, [`ResponseMode::Read`]).
//!
//! Control messages travel as 8 B RDMA WRITE+IMM (one CQE each, on zero-length SRQ
//! receives): the server's activation/stop notices into the client's control word, the
//! client's hello and acknowledgements into its word of the server's ack region.
//!
//! Bad input never reaches the handler or the wire: a wrong magic (neither request nor
//! response), a `payload_len` beyond the slot, or a response address outside the region the
//! client registered at connect is rejected and counted ([`ScaleServerStats`]); nothing is
//! written for an address that does not validate.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use mlx5::fastmap::FastMap;
use mlx5::verbs::{Access, Cq, Pd, Qp, RcParams, RcRemote, Srq};
use mlx5::wqe::{CQ_UPDATE, Opcode, RaddrSeg, Sge, WqeDesc};

use super::info::{ClientConnInfo, ServerConnInfo};
use super::mem::Slots;
use super::protocol::{
    REQUEST_HEADER_SIZE, REQUEST_MAGIC, RESPONSE_HEADER_SIZE, RESPONSE_MAGIC, RequestHeader,
    ResponseHeader, STATUS_OK, STATUS_REJECTED, TRAILER_SIZE, request_bytes, response_bytes,
    trailer, trailer_offset,
};
use super::sched::{ConnState, Notice, Scheduler};
use super::{
    ACK_BYE, ACK_HELLO, CTRL_EVICT, CTRL_STOP, DOORBELL_BATCH_SIZE, IMM_ACK, IMM_NOTICE,
    ResponseMode, ScaleError,
};
use crate::rc::queues::{rc_qp_on_srq, refill_srq, zero_length_srq};

/// The request header bytes at the start of a pool slot. Every slot holds at least
/// `request_bytes(0)` bytes (checked by [`ScaleServer::new`]), so this cannot fail.
#[inline(always)]
fn header(slot: &[u8]) -> &[u8; REQUEST_HEADER_SIZE] {
    slot.first_chunk()
        .expect("slot_size >= request_bytes(0), checked at construction")
}

/// Slot size in bytes used when [`ServerConfig::slot_size`] / [`ClientConfig::slot_size`] of
/// an untyped [`ScaleServer`] / [`super::ScaleClient`] is `None` (seeds/003 §9
/// `DEFAULT_SLOT_SIZE`; the typed [`super::ScaleRpcServer`] derives its slot size from the
/// service instead).
///
/// [`ClientConfig::slot_size`]: super::ClientConfig::slot_size
pub const DEFAULT_SLOT_SIZE: u32 = 4096;

/// Default [`ServerConfig::slots_per_conn`] (and [`super::ClientConfig::slots_per_conn`]):
/// [`crate::client::DEFAULT_CALLS_IN_FLIGHT`] calls plus the slot the typed client keeps for
/// its liveness probe, so a typed ScaleRPC client has the same 32 calls in flight as every
/// other transport.
pub const DEFAULT_SLOTS_PER_CONN: u32 = crate::client::DEFAULT_CALLS_IN_FLIGHT as u32 + 1;

/// Default [`ServerConfig::max_conns`]: 256 connections × [`DEFAULT_SLOTS_PER_CONN`] (33) =
/// 8448 pool slots when they form one group (the default device model's derived group size
/// is 400), about seeds/003 §9's `DEFAULT_NUM_SLOTS` (8192).
pub const DEFAULT_MAX_CONNS: u32 = 256;

/// Server configuration (seeds/003 §9 constants as defaults where the seed gives one).
///
/// # Memory and scan cost
/// The message pool is registered memory of `banks × group_size × slots_per_conn × slot_size`
/// bytes (`banks` is 1 when `max_conns` fits one group, else 2; at most about `2 ×
/// max_conns × slots_per_conn × slot_size`). With the defaults (256 connections in one group,
/// 33 slots each) that is 8448 slots: 34.6 MB at 4096 B slots, 1.1 MB at the 128 B slots a
/// small typed service derives. Each poll scans every slot of the active group's connected
/// connections (`connections × slots_per_conn` header reads: 33 per connected client by
/// default, 4 before issue 17), so more slots per connection cost poll time even when idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Most client connections at once. Ids of connections that are gone (disconnected,
    /// failed, evicted) are reclaimed ([`ScaleServerStats::reclaimed`]), so churn never exhausts it.
    pub max_conns: u32,
    /// Connections per group: derived from the NIC's QP-context cache by default
    /// ([`GroupSize::Auto`], [`derive_group_size`]), or given ([`GroupSize::Fixed`]), or
    /// grouping off ([`GroupSize::Off`]).
    pub group_size: GroupSize,
    /// QP contexts the NIC caches, for [`GroupSize::Auto`]: the parameter to set on hardware
    /// (rdma-core does not report it). `None`: the device's figure
    /// ([`mlx5::verbs::Context::qpc_cache_entries`]: the software model knows its own), else
    /// [`DEFAULT_QPC_CACHE_ENTRIES`].
    pub qpc_cache_entries: Option<u32>,
    /// Percentage of the QPC cache the groups may fill, for [`GroupSize::Auto`] (seeds/003
    /// §3.2 / §9 `SAFE_CACHE_RATIO` 0.8: 80).
    pub safe_cache_ratio_pct: u32,
    /// Server threads (one [`ScaleServer`] each) sharing the NIC, for [`GroupSize::Auto`]:
    /// each gets its share of the cache (seeds/003 §3.2 `num_threads`).
    pub server_threads: u32,
    /// Pool slots per connection (calls a client may have in flight on it). Default
    /// [`DEFAULT_SLOTS_PER_CONN`] (33: 32 calls plus the typed client's probe slot).
    pub slots_per_conn: u32,
    /// Slot size in bytes, a multiple of 64. `None` (the default): [`DEFAULT_SLOT_SIZE`]
    /// (seeds/003 `DEFAULT_SLOT_SIZE` 4096) for a [`ScaleServer`]; derived from the
    /// service's largest request and response by [`super::ScaleRpcServer::new`]
    /// ([`super::transport::derive_slot_size`]). `Some(n)`: exactly `n`. After creation,
    /// [`ScaleServer::config`] holds the size in use.
    pub slot_size: Option<u32>,
    /// A group's time slice.
    pub slice: Duration,
    /// How long before a slice ends the next group is activated (warm-up).
    pub warmup: Duration,
    /// A stopped client that has not acknowledged after this long (of *served* time: time
    /// the server loop did not run is charged at most a quarter of this per gap,
    /// [`super::sched`]) is evicted: the client is told ([`super::CTRL_EVICT`]: it fails its
    /// calls with [`super::CallFailure::Evicted`]), then the connection fails
    /// ([`ScaleServer::conn_failed`], [`ScaleServerStats::failed_conns`]), its QP is destroyed (so
    /// that a late WRITE of the client fails instead of landing in a bank that now belongs to
    /// another group) and its id is reclaimed. A client acknowledges only once every call it
    /// made was answered: keep this above the longest time the server defers a reply.
    pub ack_timeout: Duration,
    /// How responses reach the client.
    pub response_mode: ResponseMode,
    /// Send WQEs per QP (seeds/003 §7.3: 128).
    pub max_send_wr: u32,
    /// Largest inline payload in bytes (seeds/003 §7.3: 60).
    pub max_inline: u32,
    /// Zero-length receive WQEs for control messages.
    pub srq_size: u32,
    /// Entries of each CQ.
    pub cq_size: u32,
    /// Schema fingerprint clients must match (0: untyped).
    pub fingerprint: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_conns: DEFAULT_MAX_CONNS,
            group_size: GroupSize::Auto,
            qpc_cache_entries: None,
            safe_cache_ratio_pct: 80,
            server_threads: 1,
            slots_per_conn: DEFAULT_SLOTS_PER_CONN,
            slot_size: None,
            slice: Duration::from_micros(200),
            warmup: Duration::from_micros(50),
            ack_timeout: Duration::from_millis(100),
            response_mode: ResponseMode::Write,
            max_send_wr: 128,
            max_inline: 60,
            srq_size: 1024,
            cq_size: 4096,
            fingerprint: 0,
        }
    }
}

/// How [`ServerConfig::group_size`] is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GroupSize {
    /// Derived from the NIC's QPC cache, the safe ratio and the server threads
    /// ([`derive_group_size`], seeds/003 §3.2). The default.
    #[default]
    Auto,
    /// Exactly this many connections per group (clamped to `1..=max_conns`): the explicit
    /// override.
    Fixed(u32),
    /// Grouping off: every connection in one group and one bank (the per-connection-buffer
    /// baseline).
    Off,
}

/// QPC cache entries assumed when neither [`ServerConfig::qpc_cache_entries`] nor the device
/// gives a figure: the ConnectX-5 estimate of seeds/003 §9 (`NIC_QPC_CACHE_ENTRIES_CX5`).
pub const DEFAULT_QPC_CACHE_ENTRIES: u32 = 1000;

/// Connections per group for a NIC caching `cache_entries` QP contexts (seeds/003 §3.2
/// `calculate_group_size`): the safe share `cache_entries × safe_ratio_pct / 100`, divided
/// among `server_threads`, and halved, because in this implementation two groups per thread
/// are resident at a switch (the active one and the one warming up, [`super::sched`]); the
/// seed's formula assumes one. Capped by `max_conns` (the seed's `total_connections /
/// num_threads`: one group holds all of a thread's connections if they fit) and at least 1.
///
/// ```
/// use rpc_runtime::scalerpc::server::derive_group_size;
/// assert_eq!(derive_group_size(1000, 80, 1, 100_000), 400); // ConnectX-5, one thread
/// assert_eq!(derive_group_size(400, 80, 2, 100_000), 80); // ConnectX-3, two threads
/// assert_eq!(derive_group_size(1000, 80, 1, 50), 50);
/// ```
pub fn derive_group_size(
    cache_entries: u32,
    safe_ratio_pct: u32,
    server_threads: u32,
    max_conns: u32,
) -> u32 {
    let safe = u64::from(cache_entries) * u64::from(safe_ratio_pct.min(100)) / 100;
    let per_thread = safe / u64::from(server_threads.max(1));
    let g = u32::try_from(per_thread / 2).unwrap_or(u32::MAX);
    g.clamp(1, max_conns.max(1))
}

/// [`ScaleServer`] counters (the typed [`crate::Server`] keeps its own,
/// [`crate::ServerStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScaleServerStats {
    /// Requests handed to the application.
    pub requests: u64,
    /// Responses written (or left for READ).
    pub responses: u64,
    /// Slot scans (slots examined).
    pub slots_scanned: u64,
    /// RDMA WRITEs posted (responses).
    pub writes: u64,
    /// Of those, inline.
    pub inline_writes: u64,
    /// Doorbells rung.
    pub doorbells: u64,
    /// Notices sent (activate/stop).
    pub notices: u64,
    /// Slots holding neither a request nor a response (wrong magic); cleared.
    pub bad_magic: u64,
    /// Requests whose payload_len exceeds the slot.
    pub bad_length: u64,
    /// Requests whose response address is outside the client's registered region.
    pub bad_response_addr: u64,
    /// Replies with a stale or unknown token.
    pub stale_replies: u64,
    /// Replies larger than the slot or the client's response region allows.
    pub oversized_replies: u64,
    /// Control messages that made no sense (unknown connection, bad ack).
    pub bad_control: u64,
    /// Error completions.
    pub error_cqes: u64,
    /// Connections failed (error completion or eviction).
    pub failed_conns: u64,
    /// Eviction notices posted (the client was told, [`super::CTRL_EVICT`]).
    pub evict_notices: u64,
    /// Clients that said goodbye ([`super::ACK_BYE`]).
    pub disconnects: u64,
    /// Connection ids reclaimed (QP destroyed, slots cleared, id free for the next accept):
    /// after a goodbye, a failure or an eviction.
    pub reclaimed: u64,
    /// Send attempts that found the send queue full (retried next poll).
    pub sq_full: u64,
}

/// Identifies a request handed out by [`ScaleServer::recv`]; answer it with
/// [`ScaleServer::reply`] once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaleToken {
    conn: u32,
    /// Incarnation of connection id `conn` (ids are reused after a reclaim).
    incarnation: u32,
    slot: u32,
    req_id: u64,
    resp_addr: u64,
    rpc_type: u16,
}

impl ScaleToken {
    /// Connection the request came on.
    pub fn conn(&self) -> u32 {
        self.conn
    }

    /// The request's `rpc_type` as the client wrote it in the header (seeds/003 §5.1;
    /// [`super::ScaleClient::call`]'s `rpc_type`): which handler the request is for.
    pub fn rpc_type(&self) -> u16 {
        self.rpc_type
    }

    /// The request id (per connection, increasing).
    pub fn req_id(&self) -> u64 {
        self.req_id
    }
}

/// Slot states (seeds/003 §4.2 `SlotState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum SlotState {
    /// Scanned for requests.
    Free = 0,
    /// Handed to the application, reply pending.
    Reserved = 1,
    /// A complete request found, waiting for `recv`.
    RequestPending = 2,
    /// The response was built in the slot (RDMA WRITTEN to the client, or waiting for its
    /// READ); the slot is scanned again, since the client's next request overwrites it.
    ResponseReady = 3,
}

struct ServerConn {
    /// `None` once evicted: the QP is destroyed so that the client can no longer write into
    /// a bank that now belongs to another group (its next operation fails instead).
    qp: Option<Qp>,
    resp_addr: u64,
    resp_len: u64,
    resp_rkey: u32,
    ctrl_addr: u64,
    ctrl_rkey: u32,
    /// The client said hello: notices may be sent.
    confirmed: bool,
    /// Notices held until `confirmed`.
    held: Vec<Notice>,
    failed: bool,
    unsignaled: u32,
    pending_db: u32,
    /// Incarnation of this id (bumped when the id is reclaimed).
    incarnation: u32,
    /// WQE index of the eviction notice: the connection is closed once it completes.
    close_at: Option<u16>,
}

/// A ScaleRPC server. Field order is drop order: QPs before the SRQ/CQs, registrations before
/// the PD.
pub struct ScaleServer {
    conns: Vec<ServerConn>,
    by_qpn: FastMap<u32>,
    pool: Slots,
    acks: Slots,
    states: Vec<SlotState>,
    /// Connection whose request holds each slot (meaningful while the slot is not `Free`).
    owner: Vec<u32>,
    ready: VecDeque<(u32, u32)>,
    dirty: Vec<u32>,
    sched: Scheduler,
    /// Connections to close (evicted and not told, or past the close deadline); reused.
    closing: Vec<u32>,
    srq: Srq,
    send_cq: Cq,
    recv_cq: Cq,
    pd: Pd,
    device: mlx5::verbs::Context,
    cfg: ServerConfig,
    /// `cfg.slot_size`, resolved.
    slot_size: u32,
    group_size: u32,
    clock: Instant,
    stats: ScaleServerStats,
    /// Some confirmed connection holds notices that found its send queue full.
    notices_held: bool,
}

impl std::fmt::Debug for ScaleServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScaleServer")
            .field("conns", &self.conns.len())
            .field("cfg", &self.cfg)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl ScaleServer {
    /// Creates a server on `device`: the message pool (`Scheduler::pool_slots` slots of
    /// `slot_size`, REMOTE_WRITE, plus REMOTE_READ in [`ResponseMode::Read`]), the ack region,
    /// CQs and the SRQ.
    ///
    /// # Errors
    /// [`ScaleError::Config`] for a slot size that is not a positive multiple of 64 or zero
    /// sizes; [`ScaleError::Device`].
    pub fn new(device: &mlx5::verbs::Context, cfg: ServerConfig) -> Result<Self, ScaleError> {
        let slot_size = cfg.slot_size.unwrap_or(DEFAULT_SLOT_SIZE);
        let cfg = ServerConfig {
            slot_size: Some(slot_size),
            ..cfg
        };
        if slot_size == 0 || !slot_size.is_multiple_of(64) {
            return Err(ScaleError::Config(
                "slot_size must be a positive multiple of 64",
            ));
        }
        if cfg.max_conns == 0 || cfg.slots_per_conn == 0 {
            return Err(ScaleError::Config(
                "max_conns and slots_per_conn must be > 0",
            ));
        }
        if request_bytes(0) > slot_size as usize {
            return Err(ScaleError::Config("slot_size too small"));
        }
        let group_size = match cfg.group_size {
            GroupSize::Fixed(g) => g.clamp(1, cfg.max_conns),
            GroupSize::Off => cfg.max_conns,
            GroupSize::Auto => derive_group_size(
                Self::cache_entries(device, &cfg),
                cfg.safe_cache_ratio_pct,
                cfg.server_threads,
                cfg.max_conns,
            ),
        };
        let n = Scheduler::pool_slots(group_size, cfg.slots_per_conn, cfg.max_conns) as usize;
        let pd = device.alloc_pd()?;
        let mut access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        if cfg.response_mode == ResponseMode::Read {
            access |= Access::REMOTE_READ;
        }
        let pool = Slots::new(device, &pd, n, slot_size as usize, access)?;
        let acks = Slots::new(
            device,
            &pd,
            cfg.max_conns as usize,
            8,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )?;
        let send_cq = device.create_cq(cfg.cq_size)?;
        let recv_cq = device.create_cq(cfg.cq_size)?;
        let srq = zero_length_srq(device, &pd, cfg.srq_size)?;
        let ns = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
        Ok(ScaleServer {
            conns: Vec::new(),
            by_qpn: FastMap::new(),
            states: vec![SlotState::Free; n],
            owner: vec![u32::MAX; n],
            pool,
            acks,
            ready: VecDeque::with_capacity(n),
            dirty: Vec::new(),
            closing: Vec::new(),
            sched: Scheduler::new(
                group_size,
                cfg.slots_per_conn,
                ns(cfg.slice),
                ns(cfg.warmup),
                ns(cfg.ack_timeout),
            ),
            srq,
            send_cq,
            recv_cq,
            pd,
            device: device.clone(),
            cfg,
            slot_size,
            group_size,
            clock: Instant::now(),
            stats: ScaleServerStats::default(),
            notices_held: false,
        })
    }

    /// QPC cache entries [`GroupSize::Auto`] uses: the configured figure, else the device's,
    /// else [`DEFAULT_QPC_CACHE_ENTRIES`].
    fn cache_entries(device: &mlx5::verbs::Context, cfg: &ServerConfig) -> u32 {
        cfg.qpc_cache_entries
            .or_else(|| device.qpc_cache_entries())
            .unwrap_or(DEFAULT_QPC_CACHE_ENTRIES)
    }

    /// Counters.
    pub fn stats(&self) -> &ScaleServerStats {
        &self.stats
    }

    /// The scheduler (groups, banks, counters).
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// Configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    /// The pool's slot size in bytes (`config().slot_size`, resolved).
    pub fn slot_size(&self) -> u32 {
        self.slot_size
    }

    /// Connections accepted and not reclaimed.
    pub fn num_conns(&self) -> u32 {
        self.sched.num_conns()
    }

    /// Whether connection `c` failed (error completion or eviction) or was reclaimed (until
    /// its id is reused by the next accept).
    pub fn conn_failed(&self, c: u32) -> bool {
        self.conns.get(c as usize).is_none_or(|c| c.failed)
    }

    fn now(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64
    }

    /// Accepts a client: checks its fingerprint, creates and connects an RC QP, joins it to
    /// a group (taking the lowest free connection id: ids of reclaimed connections are
    /// reused), and returns what the client needs (including whether it starts active).
    /// With `max_conns` connections it first reads the control messages already received,
    /// so that a goodbye waiting there frees its id for this client.
    ///
    /// # Errors
    /// [`ScaleError::SchemaMismatch`], [`ScaleError::Config`] (too many connections, a
    /// response region smaller than one slot per pool slot of the connection),
    /// [`ScaleError::Device`].
    pub fn accept(&mut self, client: &ClientConnInfo) -> Result<ServerConnInfo, ScaleError> {
        if client.fingerprint != self.cfg.fingerprint {
            return Err(ScaleError::SchemaMismatch {
                ours: self.cfg.fingerprint,
                theirs: client.fingerprint,
            });
        }
        if self.sched.num_conns() >= self.cfg.max_conns {
            // Goodbyes (and failures) already in the CQ free ids: read them first.
            let mut dirty = std::mem::take(&mut self.dirty);
            self.poll_recv(&mut dirty);
            self.poll_send();
            self.dirty = dirty;
            if self.sched.num_conns() >= self.cfg.max_conns {
                return Err(ScaleError::Config("the server has max_conns connections"));
            }
        }
        if client.resp_len < response_bytes(0) as u64 {
            return Err(ScaleError::Config(
                "the client's response region is too small",
            ));
        }
        let mut qp = rc_qp_on_srq(
            &self.device,
            &self.pd,
            &self.send_cq,
            &self.recv_cq,
            &self.srq,
            self.cfg.max_send_wr,
            self.cfg.max_inline,
        )?;
        qp.connect_rc(
            &RcRemote {
                qpn: client.qpn,
                lid: client.lid,
                gid: client.gid,
                psn: 0,
            },
            &rc_params(),
        )?;
        let now = self.now();
        let mut start = None;
        // The lowest free id: a reclaimed one, else the next new one.
        let c = self.sched.join(now, &mut |n| start = Some(n));
        if let Err(e) = self.by_qpn.insert(qp.qpn(), c) {
            self.sched.release(c);
            return Err(e.into());
        }
        let incarnation = self
            .conns
            .get(c as usize)
            .map_or(0, |old| old.incarnation.wrapping_add(1));
        let conn = ServerConn {
            qp: Some(qp),
            resp_addr: client.resp_addr,
            resp_len: client.resp_len,
            resp_rkey: client.resp_rkey,
            ctrl_addr: client.ctrl_addr,
            ctrl_rkey: client.ctrl_rkey,
            confirmed: false,
            held: Vec::new(),
            failed: false,
            unsignaled: 0,
            pending_db: 0,
            incarnation,
            close_at: None,
        };
        if c as usize == self.conns.len() {
            self.conns.push(conn);
        } else {
            self.conns[c as usize] = conn;
        }
        let (active, base, epoch) = match start {
            Some(Notice::Activate { base, epoch, .. }) => (true, base, epoch),
            _ => (false, 0, 0),
        };
        let port = self.device.port();
        Ok(ServerConnInfo {
            qpn: self.conns[c as usize].qp.as_ref().map_or(0, Qp::qpn),
            lid: port.lid,
            gid: port.gid,
            conn_id: c,
            pool_addr: self.pool.mr.addr,
            pool_rkey: self.pool.mr.rkey,
            slot_size: self.slot_size,
            slots_per_conn: self.cfg.slots_per_conn,
            ack_addr: self.acks.addr(c as usize, 0),
            ack_rkey: self.acks.mr.rkey,
            active,
            base,
            epoch,
            response_mode: self.cfg.response_mode,
            fingerprint: self.cfg.fingerprint,
        })
    }

    /// One round of the dispatch loop: control messages (hellos, acknowledgements,
    /// goodbyes) and send completions first, then the scheduler (notices, evictions), then a
    /// scan of the served groups' slots for complete requests. Acknowledgements are read
    /// before the scheduler runs, so a client whose acknowledgement is already in the CQ is
    /// never evicted because this loop was late to read it ([`super::sched`]). Returns how
    /// many requests are ready for [`ScaleServer::recv`].
    pub fn poll(&mut self) -> usize {
        let mut out = std::mem::take(&mut self.dirty);
        self.poll_recv(&mut out);
        self.poll_send();
        let now = self.now();
        {
            let Self {
                sched,
                conns,
                stats,
                notices_held,
                closing,
                ..
            } = self;
            sched.tick(now, &mut |n| {
                *notices_held |= Self::notice(conns, stats, &mut out, closing, n)
            });
        }
        if !self.closing.is_empty() {
            self.close_pending();
        }
        if self.notices_held {
            self.retry_held_notices(&mut out);
        }
        self.scan();
        for &c in &out {
            let conn = &mut self.conns[c as usize];
            if conn.pending_db > 0
                && let Some(qp) = conn.qp.as_mut()
            {
                qp.sq.ring_doorbell();
                conn.pending_db = 0;
                self.stats.doorbells += 1;
            }
        }
        // Responses posted during this poll (rejections in the scan) went to `self.dirty`.
        self.flush();
        out.clear();
        if out.capacity() >= self.dirty.capacity() {
            self.dirty = out;
        }
        self.ready.len()
    }

    /// Closes the connections queued in `closing` (evicted ones that cannot be told, or
    /// whose eviction notice did not complete within the close deadline).
    #[cold]
    fn close_pending(&mut self) {
        let closing = std::mem::take(&mut self.closing);
        for &c in &closing {
            self.sched.on_closed(c);
            self.reclaim(c);
        }
        self.closing = closing;
        self.closing.clear();
    }

    /// Connection `c` is gone for good (goodbye, failure, eviction closed): its QP is
    /// destroyed (a late WRITE of its client fails instead of landing in a bank that may
    /// belong to another connection by now), the slots its mapping names are cleared (so
    /// the id's next owner never sees the old requests, and tokens of the old incarnation
    /// are stale: [`ScaleError::ConnFailed`]), and the id is given back to the scheduler for
    /// the next [`ScaleServer::accept`] ([`ScaleServerStats::reclaimed`]).
    #[cold]
    fn reclaim(&mut self, c: u32) {
        if self.sched.conn_state(c) == Some(ConnState::Free) {
            return;
        }
        let conn = &mut self.conns[c as usize];
        if !conn.failed {
            conn.failed = true;
            self.stats.failed_conns += 1;
        }
        conn.held.clear();
        conn.pending_db = 0;
        conn.close_at = None;
        if let Some(qp) = conn.qp.take() {
            self.by_qpn.remove(qp.qpn());
        }
        if let Some(base) = self.sched.pool_slot(c, 0) {
            for j in 0..self.cfg.slots_per_conn {
                let i = (base + j) as usize;
                self.pool.store_u32(i, 0, 0);
                self.states[i] = SlotState::Free;
                self.owner[i] = u32::MAX;
            }
        }
        self.acks.store_u32(c as usize, 0, 0);
        self.sched.release(c);
        self.stats.reclaimed += 1;
        tracing::debug!(conn = c, "scalerpc: connection reclaimed");
    }

    /// Re-posts notices held because a send queue was full.
    #[cold]
    fn retry_held_notices(&mut self, dirty: &mut Vec<u32>) {
        self.notices_held = false;
        for c in 0..self.conns.len() {
            let conn = &mut self.conns[c];
            if !conn.confirmed || conn.failed || conn.held.is_empty() {
                continue;
            }
            let held = std::mem::take(&mut conn.held);
            for n in held {
                self.notices_held |= Self::notice(
                    &mut self.conns,
                    &mut self.stats,
                    dirty,
                    &mut self.closing,
                    n,
                );
            }
        }
        if !self.closing.is_empty() {
            self.close_pending();
        }
    }

    /// Posts (or holds, before the hello) a notice: 8 B WRITE+IMM into the client's control
    /// word: `epoch u32 | base u32` (`base` = [`CTRL_STOP`] for a stop, [`CTRL_EVICT`] for an
    /// eviction). Returns whether it was held because the send queue was full (retried at the
    /// next poll; later notices queue behind it, so the client sees them in order). An
    /// eviction of a client that never said hello, and [`Notice::Close`], queue the
    /// connection in `closing`.
    fn notice(
        conns: &mut [ServerConn],
        stats: &mut ScaleServerStats,
        dirty: &mut Vec<u32>,
        closing: &mut Vec<u32>,
        n: Notice,
    ) -> bool {
        let c = match n {
            Notice::Activate { conn, .. }
            | Notice::Stop { conn, .. }
            | Notice::Evict { conn }
            | Notice::Close { conn } => conn,
        };
        let conn = &mut conns[c as usize];
        if let Notice::Close { .. } = n {
            closing.push(c);
            return false;
        }
        if conn.failed {
            return false;
        }
        if !conn.confirmed {
            if let Notice::Evict { .. } = n {
                // It cannot be told (it never said hello): close at once.
                closing.push(c);
            } else {
                conn.held.push(n);
            }
            return false;
        }
        if !conn.held.is_empty() {
            conn.held.push(n);
            return true;
        }
        let Some(qp) = conn.qp.as_mut() else {
            return false;
        };
        let word = match n {
            Notice::Activate { base, epoch, .. } => (epoch as u64) | ((base as u64) << 32),
            Notice::Stop { epoch, .. } => (epoch as u64) | ((CTRL_STOP as u64) << 32),
            Notice::Evict { .. } | Notice::Close { .. } => (CTRL_EVICT as u64) << 32,
        };
        let r = qp.sq.post(&WqeDesc {
            opcode: Opcode::RdmaWriteImm,
            flags: CQ_UPDATE,
            imm: IMM_NOTICE,
            ud: None,
            remote: Some(RaddrSeg {
                raddr: conn.ctrl_addr,
                rkey: conn.ctrl_rkey,
            }),
            atomic: None,
            inline: &word.to_le_bytes(),
            sges: &[],
        });
        match r {
            Ok(idx) => {
                conn.unsignaled = 0;
                stats.notices += 1;
                if conn.pending_db == 0 {
                    dirty.push(c);
                }
                conn.pending_db += 1;
                if let Notice::Evict { .. } = n {
                    // Failed for the application from now on; the QP stays until the notice
                    // completed (`poll_send`), or the close deadline.
                    conn.failed = true;
                    conn.close_at = Some(idx);
                    stats.failed_conns += 1;
                    stats.evict_notices += 1;
                    tracing::debug!(
                        conn = c,
                        "scalerpc: connection evicted (no acknowledgement)"
                    );
                }
                false
            }
            Err(_) => {
                // Send queue full: hold it; the next poll retries.
                stats.sq_full += 1;
                conn.held.push(n);
                true
            }
        }
    }

    fn poll_recv(&mut self, dirty: &mut Vec<u32>) {
        let mut n = 0;
        while let Some(cqe) = self.recv_cq.cq.poll_one() {
            n += 1;
            if self.srq.srq.is_posted(cqe.wqe_counter) {
                let _ = self.srq.srq.release(cqe.wqe_counter);
            }
            let Some(&c) = self.by_qpn.get(cqe.qpn) else {
                self.stats.bad_control += 1;
                continue;
            };
            if cqe.is_error() {
                self.fail_conn(c);
                continue;
            }
            if cqe.imm != IMM_ACK {
                self.stats.bad_control += 1;
                continue;
            }
            // The 8 B the client wrote into its ack word: epoch u32 | issued u32.
            let epoch = self.acks.load_u32(c as usize, 0);
            if epoch == ACK_HELLO {
                let conn = &mut self.conns[c as usize];
                conn.confirmed = true;
                let held = std::mem::take(&mut conn.held);
                for notice in held {
                    self.notices_held |= Self::notice(
                        &mut self.conns,
                        &mut self.stats,
                        dirty,
                        &mut self.closing,
                        notice,
                    );
                }
            } else if epoch == ACK_BYE {
                self.goodbye(c);
            } else if !self.sched.on_ack(c, epoch) {
                self.stats.bad_control += 1;
            }
        }
        if n > 0 {
            self.recv_cq.cq.update_dbrec();
            refill_srq(&mut self.srq);
        }
    }

    /// The client closed connection `c` ([`super::ScaleClient::disconnect`]): reclaim it.
    #[cold]
    fn goodbye(&mut self, c: u32) {
        self.stats.disconnects += 1;
        let conn = &mut self.conns[c as usize];
        if !conn.failed {
            // Not a failure: the client left.
            conn.failed = true;
        }
        self.sched.on_failed(c);
        self.reclaim(c);
    }

    fn poll_send(&mut self) {
        let mut any = false;
        while let Some(cqe) = self.send_cq.cq.poll_one() {
            any = true;
            let Some(&c) = self.by_qpn.get(cqe.qpn) else {
                continue;
            };
            let conn = &mut self.conns[c as usize];
            if let Some(qp) = conn.qp.as_mut() {
                qp.sq.retire(cqe.wqe_counter);
            }
            if cqe.is_error() {
                self.fail_conn(c);
            } else if conn.close_at == Some(cqe.wqe_counter) {
                // The eviction notice reached the client: close.
                self.sched.on_closed(c);
                self.reclaim(c);
            }
        }
        if any {
            self.send_cq.cq.update_dbrec();
        }
    }

    /// An error completion on connection `c`: it failed; it is reclaimed at once.
    #[cold]
    fn fail_conn(&mut self, c: u32) {
        self.stats.error_cqes += 1;
        let conn = &mut self.conns[c as usize];
        if !conn.failed {
            conn.failed = true;
            self.stats.failed_conns += 1;
            tracing::debug!(conn = c, "scalerpc: connection failed");
        }
        self.sched.on_failed(c);
        self.reclaim(c);
    }

    /// Scans the slots of every connection of the served groups (active, then draining) for
    /// complete requests (seeds/003 §5.3 step 1).
    fn scan(&mut self) {
        let k = self.cfg.slots_per_conn;
        let groups: [Option<u32>; 2] = {
            let mut it = self.sched.serving();
            [it.next(), it.next()]
        };
        for g in groups.into_iter().flatten() {
            for c in self.sched.members(g) {
                if self.conns[c as usize].failed || !self.sched.may_serve(c) {
                    continue;
                }
                let Some(base) = self.sched.pool_slot(c, 0) else {
                    continue;
                };
                for j in 0..k {
                    self.scan_slot(c, base + j);
                }
            }
        }
    }

    #[inline(always)]
    fn scan_slot(&mut self, c: u32, p: u32) {
        let i = p as usize;
        self.stats.slots_scanned += 1;
        if matches!(
            self.states[i],
            SlotState::Reserved | SlotState::RequestPending
        ) {
            if self.owner[i] == c {
                return;
            }
            // Held for a connection that no longer owns the slot (failed or evicted with a
            // request pending, or acknowledged a stop with calls outstanding): the bank
            // changed hands, so the slot is `c`'s now; the old token is stale.
            self.states[i] = SlotState::Free;
        }
        let magic = self.pool.load_u32(i, 0);
        if magic != REQUEST_MAGIC {
            if magic != 0 && magic != RESPONSE_MAGIC {
                self.bad_magic(i);
            }
            return;
        }
        // SAFETY: slot `i` of the pool; the header bytes are read after its magic (Acquire);
        // if the header is still being written, the trailer check below fails.
        let h = RequestHeader::read(header(unsafe { self.pool.bytes(i) }));
        let len = h.payload_len as usize;
        if request_bytes(len) > self.pool.slot {
            return self.reject_length(c, i, &h);
        }
        let t = trailer_offset(REQUEST_HEADER_SIZE, len);
        if self.pool.load_u64(i, t) != trailer(REQUEST_MAGIC, h.req_id) {
            return; // not complete yet
        }
        let conn = &self.conns[c as usize];
        let end = conn.resp_addr + conn.resp_len;
        if h.client_slot_rkey != conn.resp_rkey
            || h.client_slot_addr < conn.resp_addr
            || h.client_slot_addr.saturating_add(response_bytes(0) as u64) > end
        {
            return self.reject_addr(i);
        }
        // Clear the trailer: a later request in this slot (perhaps from another connection
        // with the same request id and length) must not match it before its own arrives.
        self.pool.store_u64(i, t, 0);
        self.states[i] = SlotState::RequestPending;
        self.owner[i] = c;
        self.ready.push_back((c, p));
    }

    #[cold]
    fn bad_magic(&mut self, i: usize) {
        self.stats.bad_magic += 1;
        self.pool.store_u32(i, 0, 0);
    }

    #[cold]
    fn reject_addr(&mut self, i: usize) {
        self.stats.bad_response_addr += 1;
        self.pool.store_u32(i, 0, 0);
    }

    /// A request longer than the slot: answered with [`STATUS_REJECTED`] if its response
    /// address validates, else dropped. Counted either way.
    #[cold]
    fn reject_length(&mut self, c: u32, i: usize, h: &RequestHeader) {
        self.stats.bad_length += 1;
        self.pool.store_u32(i, 0, 0);
        let conn = &self.conns[c as usize];
        if h.client_slot_rkey == conn.resp_rkey
            && h.client_slot_addr >= conn.resp_addr
            && h.client_slot_addr.saturating_add(response_bytes(0) as u64)
                <= conn.resp_addr + conn.resp_len
        {
            let tok = ScaleToken {
                conn: c,
                incarnation: conn.incarnation,
                slot: i as u32,
                req_id: h.req_id,
                resp_addr: h.client_slot_addr,
                rpc_type: h.rpc_type,
            };
            self.states[i] = SlotState::Reserved;
            self.owner[i] = c;
            let _ = self.respond(tok, STATUS_REJECTED, 0, |_| 0);
        }
    }

    /// The next complete request: `(token, payload)`; the token also carries the request's
    /// `rpc_type` ([`ScaleToken::rpc_type`]). The payload stays valid until the next call on
    /// the server.
    pub fn recv(&mut self) -> Option<(ScaleToken, &[u8])> {
        let (c, p) = loop {
            let (c, p) = self.ready.pop_front()?;
            let i = p as usize;
            if self.states[i] != SlotState::RequestPending || self.owner[i] != c {
                continue; // taken over by the slot's new owner (see `scan_slot`)
            }
            if self.conns[c as usize].failed {
                self.states[i] = SlotState::Free; // nobody to answer
                continue;
            }
            break (c, p);
        };
        let i = p as usize;
        self.states[i] = SlotState::Reserved;
        // SAFETY: a complete request (trailer checked); the client does not write the slot
        // again before our response, and nobody else writes it while the bank is ours.
        let b = unsafe { self.pool.bytes(i) };
        let h = RequestHeader::read(header(b));
        self.stats.requests += 1;
        let tok = ScaleToken {
            conn: c,
            incarnation: self.conns[c as usize].incarnation,
            slot: p,
            req_id: h.req_id,
            resp_addr: h.client_slot_addr,
            rpc_type: h.rpc_type,
        };
        let len = h.payload_len as usize;
        Some((tok, &b[REQUEST_HEADER_SIZE..REQUEST_HEADER_SIZE + len]))
    }

    /// Requests ready for [`ScaleServer::recv`].
    pub fn pending_requests(&self) -> usize {
        self.ready.len()
    }

    /// Largest response payload in bytes (the slot minus header and trailer).
    pub fn max_response(&self) -> usize {
        self.slot_size as usize - RESPONSE_HEADER_SIZE - TRAILER_SIZE - 4
    }

    /// Answers `tok` with the `max_len` (at most [`ScaleServer::max_response`]) bytes `encode`
    /// writes; the response is built in place in the request's pool slot, then RDMA WRITTEN
    /// to the client (inline up to `max_inline`) or left there for its READ. The WRITE is
    /// sent at the next poll (doorbell batching, seeds/003 §8.3) or once
    /// `DOORBELL_BATCH_SIZE` WQEs are pending on the QP.
    ///
    /// # Errors
    /// [`ScaleError::StaleToken`] if `tok` was already answered or never handed out;
    /// [`ScaleError::TooLarge`] if the response does not fit the client's region (counted,
    /// nothing written; the slot is freed; a response longer than the slot is not an error:
    /// `encode` sees at most [`ScaleServer::max_response`] bytes); [`ScaleError::ConnFailed`]
    /// if the connection failed or was evicted (its slot may serve another connection by
    /// now: nothing is written).
    pub fn reply(
        &mut self,
        tok: ScaleToken,
        max_len: usize,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), ScaleError> {
        self.respond(tok, STATUS_OK, max_len, encode)
    }

    /// [`ScaleServer::reply`] with a status: the token check, the response built in the slot,
    /// then (WRITE mode) the RDMA WRITE and its doorbell batching, each a step below.
    fn respond(
        &mut self,
        tok: ScaleToken,
        status: u32,
        max_len: usize,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), ScaleError> {
        let i = self.check_token(&tok)?;
        if self.cfg.response_mode == ResponseMode::Write {
            self.make_sq_room(tok.conn);
        }
        let total = self.build_response(i, &tok, status, max_len, encode)?;
        if self.cfg.response_mode == ResponseMode::Read {
            // Left in place for the client's RDMA READ (seeds/003 §2.2 option A).
            return Ok(());
        }
        self.post_response(i, &tok, total)
    }

    /// The token names a live incarnation of its connection and a slot reserved for that
    /// connection; returns the slot index.
    ///
    /// # Errors
    /// [`ScaleError::ConnFailed`] for an earlier incarnation (counted as a stale reply) or a
    /// failed connection whose slots may be released; [`ScaleError::StaleToken`] otherwise.
    fn check_token(&mut self, tok: &ScaleToken) -> Result<usize, ScaleError> {
        let i = tok.slot as usize;
        if self
            .conns
            .get(tok.conn as usize)
            .is_some_and(|c| c.incarnation != tok.incarnation)
        {
            // An earlier incarnation of this connection id (reclaimed since): its slot may
            // hold the new connection's request by now.
            self.stats.stale_replies += 1;
            return Err(ScaleError::ConnFailed);
        }
        if self.states.get(i) != Some(&SlotState::Reserved) || self.owner[i] != tok.conn {
            if self.conns.get(tok.conn as usize).is_some_and(|c| c.failed) {
                // Its slots may have been released already (eviction, bank reuse).
                return Err(ScaleError::ConnFailed);
            }
            self.stats.stale_replies += 1;
            return Err(ScaleError::StaleToken);
        }
        Ok(i)
    }

    /// WRITE mode: with fewer than 4 free WQEBBs on the connection's SQ, rings its doorbell
    /// and retires completions first. A queue that stays full means the peer stopped
    /// acknowledging; the post then fails the connection.
    fn make_sq_room(&mut self, conn: u32) {
        if let Some(conn) = self.conns.get_mut(conn as usize)
            && !conn.failed
            && let Some(qp) = conn.qp.as_mut()
            && qp.sq.free_wqebbs() < 4
        {
            self.stats.sq_full += 1;
            qp.sq.ring_doorbell();
            conn.pending_db = 0;
            self.poll_send();
        }
    }

    /// Builds the response in the request's slot `i`: the request id still matches, the
    /// payload `encode` writes (at most `max_len` and [`ScaleServer::max_response`] bytes),
    /// the trailer, the header, and the magic last. Returns the response's size in bytes.
    ///
    /// # Errors
    /// [`ScaleError::StaleToken`] if the slot holds another request; [`ScaleError::ConnFailed`]
    /// if the connection failed; [`ScaleError::TooLarge`] if the response overruns the
    /// client's response region (counted). On the last two the slot's magic is cleared.
    fn build_response(
        &mut self,
        i: usize,
        tok: &ScaleToken,
        status: u32,
        max_len: usize,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<usize, ScaleError> {
        // SAFETY: the slot is reserved for this request: the client waits for our response
        // before writing it again.
        let b = unsafe { self.pool.bytes_mut(i) };
        if RequestHeader::read(header(b)).req_id != tok.req_id {
            self.stats.stale_replies += 1;
            return Err(ScaleError::StaleToken);
        }
        self.states[i] = SlotState::ResponseReady;
        self.stats.responses += 1;
        let c = tok.conn as usize;
        if self.conns[c].failed {
            b[..4].fill(0);
            return Err(ScaleError::ConnFailed);
        }
        let cap = self.max_response().min(max_len);
        let len = encode(&mut b[RESPONSE_HEADER_SIZE..RESPONSE_HEADER_SIZE + cap]).min(cap);
        let total = response_bytes(len);
        let conn = &self.conns[c];
        if tok.resp_addr + total as u64 > conn.resp_addr + conn.resp_len {
            self.stats.oversized_replies += 1;
            b[..4].fill(0);
            return Err(ScaleError::TooLarge);
        }
        let t = trailer_offset(RESPONSE_HEADER_SIZE, len);
        b[t..t + 8].copy_from_slice(&trailer(RESPONSE_MAGIC, tok.req_id).to_le_bytes());
        ResponseHeader {
            magic: 0,
            req_id: tok.req_id,
            status,
            payload_len: len as u32,
        }
        .write(&mut b[..RESPONSE_HEADER_SIZE]);
        // The magic last, with Release: a client READing the slot concurrently
        // ([`ResponseMode::Read`]) sees it only after the rest of the response.
        self.pool.store_u32(i, 0, RESPONSE_MAGIC);
        Ok(total)
    }

    /// WRITE mode: posts the RDMA WRITE of slot `i`'s `total` response bytes to the client's
    /// response address (inline up to `max_inline`; signaled every quarter of the SQ), then
    /// batches its doorbell ([`ScaleServer::batch_doorbell`]).
    ///
    /// # Errors
    /// [`ScaleError::ConnFailed`] if the connection has no QP, or the post fails (the
    /// connection is failed).
    fn post_response(
        &mut self,
        i: usize,
        tok: &ScaleToken,
        total: usize,
    ) -> Result<(), ScaleError> {
        // SAFETY: the slot is reserved for this request and its response is complete.
        let b = unsafe { self.pool.bytes(i) };
        let inline = total <= self.cfg.max_inline as usize;
        let conn = &mut self.conns[tok.conn as usize];
        let Some(qp) = conn.qp.as_mut() else {
            return Err(ScaleError::ConnFailed);
        };
        let signal = conn.unsignaled + 1 >= qp.sq.wqe_cnt() / 4;
        let sge = [Sge {
            addr: self.pool.addr(i, 0),
            len: total as u32,
            lkey: self.pool.mr.lkey,
        }];
        let desc = WqeDesc {
            opcode: Opcode::RdmaWrite,
            flags: if signal { CQ_UPDATE } else { 0 },
            imm: 0,
            ud: None,
            remote: Some(RaddrSeg {
                raddr: tok.resp_addr,
                rkey: conn.resp_rkey,
            }),
            atomic: None,
            inline: if inline { &b[..total] } else { &[] },
            sges: if inline { &[] } else { &sge },
        };
        if qp.sq.post(&desc).is_err() {
            self.fail_conn(tok.conn);
            return Err(ScaleError::ConnFailed);
        }
        if signal {
            conn.unsignaled = 0;
        } else {
            conn.unsignaled += 1;
        }
        self.stats.writes += 1;
        if inline {
            self.stats.inline_writes += 1;
        }
        self.batch_doorbell(tok.conn);
        Ok(())
    }

    /// Doorbell batching (seeds/003 §8.3): a posted WRITE marks its connection dirty (rung at
    /// the next poll or [`ScaleServer::flush`]); `DOORBELL_BATCH_SIZE` pending WQEs ring it
    /// now.
    fn batch_doorbell(&mut self, c: u32) {
        let conn = &mut self.conns[c as usize];
        if conn.pending_db == 0 {
            self.dirty.push(c);
        }
        conn.pending_db += 1;
        if conn.pending_db >= DOORBELL_BATCH_SIZE
            && let Some(qp) = conn.qp.as_mut()
        {
            qp.sq.ring_doorbell();
            conn.pending_db = 0;
            self.stats.doorbells += 1;
        }
    }

    /// Rings the doorbells of QPs with pending responses (what the next poll would do first).
    pub fn flush(&mut self) {
        for &c in &self.dirty {
            let conn = &mut self.conns[c as usize];
            if conn.pending_db > 0
                && let Some(qp) = conn.qp.as_mut()
            {
                qp.sq.ring_doorbell();
                conn.pending_db = 0;
                self.stats.doorbells += 1;
            }
        }
        self.dirty.clear();
    }

    /// Scheduling state of connection `c`.
    pub fn conn_state(&self, c: u32) -> Option<ConnState> {
        self.sched.conn_state(c)
    }

    /// Group size in effect.
    pub fn group_size(&self) -> u32 {
        self.group_size
    }
}

/// RC parameters of ScaleRPC QPs (seeds/003 §7.3: timeout 14, retry 7, RNR retry 7).
pub(crate) fn rc_params() -> RcParams {
    RcParams {
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 16,
        access: Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..RcParams::default()
    }
}

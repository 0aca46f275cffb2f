//! ScaleRPC (seeds/003; Chen, Lu, Shu, EuroSys 2019): RPC over one-sided RDMA on RC with
//! *connection grouping* (the server serves one group of connections per time slice, so the
//! NIC's QP-context working set stays bounded) and *virtualized mapping* (all connections
//! share one message pool; a group's connections are mapped onto it while the group is
//! scheduled).
//!
//! - [`protocol`]: request/response headers (seeds/003 §5.1) and the completion trailer.
//! - [`sched`]: groups, banks, slices, warm-up and drain, as a sans-I/O state machine.
//! - [`server`]: the message pool, the dispatch loop, responses by RDMA WRITE (or READ).
//! - [`client`]: connections, requests by RDMA WRITE, notices, acknowledgements.
//! - [`info`]: what client and server exchange to connect.
//! - [`worker`]: a dispatch thread with worker threads running the handler (seeds/003 §6).
//!
//! # Liveness: connection lifecycle
//! A connection ends in one of three ways, and in each the server reclaims it (destroys its
//! QP, clears the pool slots its mapping names, frees its id for the next accept;
//! [`ScaleServerStats::reclaimed`]), so churn never exhausts `max_conns`:
//! - *Goodbye.* [`ScaleClient::disconnect`] (and dropping a [`ScaleRpc`]) writes
//!   [`ACK_BYE`] into the connection's ack word.
//! - *Failure.* An error completion on the connection's QP (the client's context was dropped
//!   or its process died: the server's next notice to it fails).
//! - *Eviction.* A stopped client that does not acknowledge within the ack deadline
//!   ([`ServerConfig::ack_timeout`] of served time, [`sched`]) is told ([`CTRL_EVICT`]; it
//!   fails its calls with [`CallFailure::Evicted`], and a [`ScaleRpc`] reports
//!   [`ScaleRpcSetupError::Evicted`]); the QP is destroyed once that notice completed. An
//!   evicted client does not rejoin by itself: it connects again.
//!
//! # Blocking waits and what bounds them
//! The cores ([`ScaleClient`], [`ScaleServer`], [`Scheduler`]) never block: every call
//! returns at once ([`ScaleCallErrorKind::NotActive`] / [`ScaleCallErrorKind::SlotsBusy`] to retry
//! later). The waits are:
//!
//! | where | waits for | bounded by |
//! |---|---|---|
//! | [`Listener::exchange`] (`ScaleRpc::connect`) | the server's answer to a connect request | [`ScaleRpcAddr::timeout`] (default 5 s) → [`ScaleRpcSetupError::Timeout`]; a dropped server → [`ScaleRpcSetupError::ServerGone`] |
//! | typed client retrying `send` while `NotActive` ([`crate::RpcError::WouldBlock`]) | its group's turn | [`ScaleRpcAddr::activation_timeout`] (default 10 s) → [`crate::RpcError::ServerDisconnected`]; the eviction notice (`ack_timeout` of served time after its stop, if it does not acknowledge) → [`ScaleRpcSetupError::Evicted`]; the typed client's per-call deadline ([`crate::client`]) |
//! | typed client retrying `send` while `SlotsBusy` / no token, and waiting for responses | responses to its calls | a response; the liveness probe ([`ScaleRpcAddr::probe_interval`], default 100 ms; an active connection only) → [`crate::RpcError::ServerDisconnected`] when the server's QP or NIC is gone; the eviction notice when its group was stopped meanwhile; the per-call deadline (a live but stopped, e.g. SIGSTOPped, server answers neither probes nor calls: only the deadline ends those) |
//! | dropping a [`ScaleRpc`] | its goodbye's send completion | [`transport::DISCONNECT_WAIT`] (10 ms) |
//! | the server's scheduler: a stopped group's bank | every member's acknowledgement | `ack_timeout` of served time → eviction; the eviction's close: `ack_timeout` more ([`Notice::Close`]); so a warm-up waits at most about 2 × `ack_timeout` of served time ([`SchedStats::warmup_delays`]) |
//! | [`WorkerPool`] threads | the next job (idle) | pool drop (closes the queue); dropping the pool joins the workers: bounded by the handler's running time |
//!
//! *Served time*: the server's clock with each gap between two polls counted as at most
//! `ack_timeout / 4`, so that the server's own pauses are not charged to its clients.
//!
//! ```
//! use mlx5::sim::{Fabric, SimConfig};
//! use rpc_runtime::scalerpc::{ClientConfig, ScaleClient, ScaleServer, ServerConfig};
//!
//! let fabric = Fabric::new(SimConfig::default());
//! let mut server = ScaleServer::new(&fabric.open(), ServerConfig { max_conns: 4, ..Default::default() }).unwrap();
//! let mut client = ScaleClient::<u32>::new(&fabric.open(), ClientConfig::default()).unwrap();
//! let (c, info) = client.create_conn().unwrap();
//! let sinfo = server.accept(&info).unwrap();
//! client.connect(c, &sinfo).unwrap();
//!
//! client.call(c, 0, 4, 7, |b| { b[..4].copy_from_slice(b"ping"); 4 }).unwrap();
//! client.flush();
//! while server.poll() == 0 {}
//! let (tok, req) = server.recv().unwrap();
//! assert_eq!(req, b"ping");
//! server.reply(tok, 4, |b| { b[..4].copy_from_slice(b"pong"); 4 }).unwrap();
//! server.flush();
//! let mut got = None;
//! while got.is_none() {
//!     client.poll(|user, r| got = Some((user, r.unwrap().to_vec())));
//! }
//! assert_eq!(got, Some((7, b"pong".to_vec())));
//! ```

pub mod client;
pub mod info;
mod mem;
pub mod protocol;
pub mod sched;
pub mod server;
pub mod transport;
pub mod worker;

pub use client::{
    CallFailure, ClientConfig, ScaleCallError, ScaleCallErrorKind, ScaleClient, ScaleClientStats,
};
pub use info::{ClientConnInfo, ServerConnInfo};
pub use sched::{ConnState, Notice, SchedStats, Scheduler};
pub use server::{
    DEFAULT_MAX_CONNS, DEFAULT_QPC_CACHE_ENTRIES, DEFAULT_SLOT_SIZE, DEFAULT_SLOTS_PER_CONN,
    GroupSize, ScaleServer, ScaleServerStats, ScaleToken, ServerConfig, derive_group_size,
};
pub use transport::{
    ConnectRefusal, Listener, ScaleRpc, ScaleRpcAddr, ScaleRpcServer, ScaleRpcSetupError,
    derive_slot_size,
};
pub use worker::{WorkerConfig, WorkerPool, WorkerStats};

/// Doorbell batching: a QP's doorbell is rung once this many WQEs are pending, else at the
/// next poll/flush (seeds/003 §9 `DOORBELL_BATCH_SIZE`).
pub const DOORBELL_BATCH_SIZE: u32 = 16;
/// Immediate of a server notice (activate/stop) WRITE+IMM.
pub const IMM_NOTICE: u32 = 0x5343_4e31;
/// Immediate of a client hello/acknowledgement WRITE+IMM.
pub const IMM_ACK: u32 = 0x5343_4131;
/// Ack word epoch value meaning "hello: notices may be sent now".
pub const ACK_HELLO: u32 = u32::MAX;
/// Ack word epoch value meaning "goodbye: this connection is closed, reclaim it"
/// ([`ScaleClient::disconnect`]). Epochs skip both reserved values.
pub const ACK_BYE: u32 = u32::MAX - 1;
/// Control word base value meaning "stop".
pub const CTRL_STOP: u32 = u32::MAX;
/// Control word base value meaning "you are evicted: the connection is closed"
/// ([`sched::Notice::Evict`]); pool slot numbers stay below it.
pub const CTRL_EVICT: u32 = u32::MAX - 1;

/// How a response reaches the client (seeds/003 §2.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResponseMode {
    /// The server RDMA WRITEs it into the client's response slot (option B, the default).
    #[default]
    Write,
    /// The server leaves it in the pool slot; the client fetches it by RDMA READ (option A).
    Read,
}

/// Setup and reply errors.
#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    /// The NIC layer failed.
    #[error(transparent)]
    Device(#[from] mlx5::Error),
    /// A configuration or connection parameter is unusable.
    #[error("scalerpc configuration: {0}")]
    Config(&'static str),
    /// The peer serves a different interface.
    #[error("schema fingerprint mismatch: ours {ours:#018x}, peer's {theirs:#018x}")]
    SchemaMismatch {
        /// Ours.
        ours: u64,
        /// The peer's.
        theirs: u64,
    },
    /// A reply with a token already answered or never handed out.
    #[error("stale reply token")]
    StaleToken,
    /// A reply larger than the slot or the client's response region.
    #[error("reply too large for the slot or the client's response region")]
    TooLarge,
    /// The connection failed.
    #[error("connection failed")]
    ConnFailed,
}

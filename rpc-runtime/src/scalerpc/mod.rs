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

pub use client::{CallFailure, ClientConfig, ClientStats, ScaleCallError, ScaleClient};
pub use info::{ClientConnInfo, ServerConnInfo};
pub use sched::{ConnState, Notice, SchedStats, Scheduler};
pub use server::{
    DEFAULT_QPC_CACHE_ENTRIES, GroupSize, ScaleServer, ScaleToken, ServerConfig, ServerStats,
    derive_group_size,
};
pub use transport::{
    ConnectRefusal, Listener, ScaleRpc, ScaleRpcAddr, ScaleRpcServer, ScaleRpcSetupError,
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

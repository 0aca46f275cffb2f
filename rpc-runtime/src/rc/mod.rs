//! Scaffolding shared by the RC transports (copyrpc, ScaleRPC), so that each rule lives in
//! one place:
//! - [`queues`]: RC QPs on a shared SRQ of zero-length receives, and its batched refill;
//! - [`rendezvous`]: the in-process connect rendezvous behind each transport's `Listener`
//!   (a client sends its connection information and waits, bounded, for the server's);
//! - [`liveness`]: when a client's liveness probe is due;
//! - [`ConnectRefusal`]: why a server refused such a connect request;
//! - the connect timeout and liveness-probe defaults both transports share.

pub(crate) mod liveness;
pub(crate) mod queues;
pub(crate) mod rendezvous;

use std::time::Duration;

use crate::error::{LimitSide, MessageKind, RpcError};
use crate::service::ServiceDescriptor;

/// Default connect timeout of an RC transport's client (copyrpc's `CopyrpcAddr::timeout`,
/// ScaleRPC's `ScaleRpcAddr::timeout`): how long `connect` waits for the server's answer.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default liveness-probe interval of an RC transport's client (`CopyrpcAddr::probe_interval`,
/// `ScaleRpcAddr::probe_interval`): with calls outstanding and nothing arriving, the client
/// checks its server this often, so a dead or stopped server is noticed.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// Empty polls between two readings of the clock by a client's liveness probe: keeps the
/// clock off the hot path, as the delegation ring does.
pub(crate) const PROBE_CHECK_POLLS: u32 = 1024;

/// Why a server refused a connect request sent through its `Listener`
/// ([`crate::copyrpc::Listener`], [`crate::scalerpc::Listener`]). copyrpc refuses with
/// `SchemaMismatch`, `Capacity` and `Setup`; ScaleRPC with `SchemaMismatch`, `Slots` and
/// `Setup`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnectRefusal {
    /// The server serves a service with another schema fingerprint.
    #[error("the server's schema fingerprint is {server:#018x}")]
    SchemaMismatch {
        /// The server's fingerprint.
        server: u64,
    },
    /// copyrpc: the negotiated ring cannot carry the service's largest messages.
    #[error(
        "largest {what} payload the rings carry is {cap} bytes, the service needs {need} ({side} {setting} is the limit)"
    )]
    Capacity {
        /// Which message kind does not fit.
        what: MessageKind,
        /// Largest payload in bytes.
        cap: u32,
        /// Bytes the service needs (saturated at `u32::MAX`).
        need: u32,
        /// Whose ring is the limit, as the server sees it ([`LimitSide::PeerClient`]: the
        /// client's; [`LimitSide::ThisServer`]: the server's).
        side: LimitSide,
        /// The setting to change ([`crate::RpcError::CapacityMismatch`]'s `setting`).
        setting: &'static str,
        /// Its least working value, where known.
        min: Option<u64>,
    },
    /// ScaleRPC: the client's slots are smaller or fewer than the server's.
    #[error(
        "the server's slots are {slot_size} B x {slots_per_conn} per connection; the client's must be at least as large and as many (ScaleRPC ClientConfig::slot_size and slots_per_conn: ScaleRpcAddr::new takes the server's)"
    )]
    Slots {
        /// The server's slot size in bytes.
        slot_size: u32,
        /// The server's slots per connection.
        slots_per_conn: u32,
    },
    /// The server could not create, accept or connect the connection (too many
    /// connections, a device error: the device's or the core's message).
    #[error("server-side setup failed: {0}")]
    Setup(String),
}

/// A schema mismatch found while setting up a client of `service`: `ours` is this build's
/// fingerprint, `theirs` the server's.
#[cold]
pub(crate) fn schema_mismatch(
    service: &'static ServiceDescriptor,
    ours: u64,
    theirs: u64,
) -> RpcError {
    RpcError::SchemaMismatch {
        service: service.name,
        expected: ours,
        found: theirs,
    }
}

/// The typed error a client of `service` reports for a refusal that names one: a schema
/// mismatch, or a capacity limit (the server's view of whose limit it is, turned into this
/// client's). Other refusals come back unchanged, for the transport's own setup error.
#[cold]
pub(crate) fn refusal_error(
    refusal: ConnectRefusal,
    service: &'static ServiceDescriptor,
) -> Result<RpcError, ConnectRefusal> {
    match refusal {
        ConnectRefusal::SchemaMismatch { server } => {
            Ok(schema_mismatch(service, service.fingerprint, server))
        }
        ConnectRefusal::Capacity {
            what,
            cap,
            need,
            side,
            setting,
            min,
        } => Ok(RpcError::CapacityMismatch {
            service: service.name,
            what,
            side: match side {
                LimitSide::PeerClient | LimitSide::ThisClient => LimitSide::ThisClient,
                LimitSide::ThisServer | LimitSide::PeerServer => LimitSide::PeerServer,
            },
            setting,
            cap,
            need,
            min,
        }),
        r => Err(r),
    }
}

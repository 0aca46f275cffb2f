//! copyrpc: RPC over batched RDMA WRITE+IMM into per-endpoint rings with credit-based flow
//! control (seeds/001; seeds/004 §3).
//!
//! - [`encoding`]: the wire format (flow metadata, message header, immediate, alignment).
//! - [`endpoint`]: the sans-I/O protocol core of one endpoint (positions, batching, credits,
//!   batch parsing and validation).
//! - [`context`]: the mlx5 side: PD, shared SRQ, CQs, RC QPs, `poll`.
//! - [`info`]: endpoint information exchanged out of band.
//! - [`transport`]: the typed-service transports ([`Copyrpc`], [`CopyrpcServer`]).
//! - [`shared`]: [`ClientContext`], one context per client thread shared by its typed
//!   clients.
//!
//! Messages beyond the ring's inline limit, up to [`EndpointConfig::max_large_message`]
//! (8 MiB by default), go by rendezvous: a descriptor inline, the bytes by RDMA READ
//! (issue 15; [`encoding`], [`context`], [`transport`] describe it).
//!
//! ```
//! use mlx5::sim::{Fabric, SimConfig};
//! use rpc_runtime::copyrpc::{Context, ContextConfig, EndpointConfig};
//!
//! let fabric = Fabric::new(SimConfig::default());
//! let (da, db) = (fabric.open(), fabric.open());
//! let mut a = Context::<u64>::new(&da, ContextConfig::default()).unwrap();
//! let mut b = Context::<()>::new(&db, ContextConfig::default()).unwrap();
//! let cfg = EndpointConfig { ring_size: 1 << 16, ..Default::default() };
//! let (ea, eb) = (a.create_endpoint(&cfg).unwrap(), b.create_endpoint(&cfg).unwrap());
//! let (ia, ib) = (a.local_info(ea).unwrap(), b.local_info(eb).unwrap());
//! a.connect(ea, &ib).unwrap();
//! b.connect(eb, &ia).unwrap();
//!
//! a.call(ea, b"ping", 42, 64).unwrap();
//! a.poll(|_, _| {}); // flush: one WRITE+IMM
//! b.poll(|_, _| {});
//! let (h, req) = b.recv().unwrap();
//! assert_eq!(req, b"ping");
//! b.reply(h, b"pong").unwrap();
//! b.poll(|_, _| {});
//! let mut got = None;
//! a.poll(|user, resp| got = Some((user, resp.unwrap().to_vec())));
//! assert_eq!(got, Some((42, b"pong".to_vec())));
//! ```

pub mod context;
pub mod encoding;
pub mod endpoint;
pub mod error;
pub mod info;
pub mod shared;
pub mod stats;
pub mod transport;

#[cfg(test)]
mod tests;

pub use context::{Context, ContextConfig, EndpointConfig, EndpointId, RecvHandle};
pub use endpoint::{EndpointCore, EndpointState};
pub use error::{CallError, CallErrorKind, EndpointFailure, ProtocolError, ReplyError, SetupError};
pub use info::EndpointInfo;
pub use shared::{ClientContext, ContextGuard, ContextGuardMut};
pub use stats::Stats;
pub use transport::{
    ConnectRefusal, Copyrpc, CopyrpcAddr, CopyrpcServer, CopyrpcSetupError, Listener,
};

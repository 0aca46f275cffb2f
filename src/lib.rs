//! `rpc`: code-generated, typed RPC for RDMA networks.
//!
//! Annotate a trait with [`rpc_service`]; the macro generates zerocopy request/response types,
//! a client (`<Trait>Client`), a server trait (`<Trait>Server`) and a service descriptor
//! (`<Trait>Service`), and the runtime carries every call over the transport chosen for the
//! service. See the repository README for the transports and their status.
//!
//! ```
//! use rpc::delegation::{Delegation, DelegationConfig, DelegationServer};
//! use rpc::rpc_service;
//!
//! #[rpc_service(transport = "delegation", derive(Debug, PartialEq))]
//! pub trait Kv {
//!     fn put(&mut self, rank: u32, key: u64, value: u64);
//!     fn get(&mut self, rank: u32, key: u64) -> Option<u64>;
//! }
//!
//! #[derive(Default)]
//! struct Store(std::collections::HashMap<u64, u64>);
//!
//! impl KvServer for Store {
//!     fn put(&mut self, _rank: u32, key: u64, value: u64) {
//!         self.0.insert(key, value);
//!     }
//!     fn get(&mut self, _rank: u32, key: u64) -> Option<u64> {
//!         self.0.get(&key).copied()
//!     }
//! }
//!
//! # fn main() -> Result<(), rpc::RpcError> {
//! let name = format!("rpc-doc-{}", std::process::id());
//! // Server: a delegation ring in /dev/shm, served by its own thread (`Server::spawn`: idle
//! // backoff up to 1 ms; `spawn_with(RunnerConfig::busy_poll(), ..)` for benchmarks).
//! let server = DelegationServer::serve::<KvService>(&name, DelegationConfig::default())?;
//! let mut store = Store::default();
//! let handle = server.spawn(move |req| KvService::dispatch(&mut store, req));
//!
//! // Client: blocking calls, then a pipelined one identified by its tag.
//! let mut kv = KvClient::<Delegation>::connect(&name)?; // schema fingerprint checked here
//! kv.put(0, 7, 42)?;
//! assert_eq!(kv.get(0, 7)?, Some(42));
//! kv.issue(1).get(0, 8)?;
//! let done = loop {
//!     if let Some(done) = kv.poll()? {
//!         break done;
//!     }
//! };
//! assert_eq!(done, (1, KvResponse::Get(None)));
//!
//! // Stop the server and take it back with its counters (dropping `handle` stops it too).
//! let server = handle.join().expect("the handler did not panic");
//! assert_eq!(server.stats().requests, 3);
//! # Ok(())
//! # }
//! ```

// Lets the crate's own unit tests and doc tests use the macro, whose output names `::rpc`.
extern crate self as rpc;

/// The NIC layer (device model and hardware provider) the RDMA transports run on.
pub use mlx5;
pub use rpc_macros::rpc_service;
pub use rpc_runtime::*;

/// Runs every `rust` block of the repository README as a doc test, so the README's examples
/// (the service over the delegation ring, the same service over copyrpc on the device model)
/// stay compiled and correct (issue 17).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

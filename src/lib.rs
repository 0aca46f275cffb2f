//! `rpc`: code-generated, typed RPC for RDMA networks.
//!
//! Annotate a trait with [`rpc_service`]; the macro generates zerocopy request/response types,
//! a client (`<Trait>Client`), a server trait (`<Trait>Server`) and a service descriptor, and
//! the runtime routes every call over the transport chosen for the service.
//! See the repository README for the transports and their status.

// Lets the crate's own unit tests and doc tests use the macro, whose output names `::rpc`.
extern crate self as rpc;

pub use rpc_macros::rpc_service;
pub use rpc_runtime::*;

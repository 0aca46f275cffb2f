//! Runtime for `#[rpc_service]`: the wire format ([`wire`]), the service descriptor and
//! [`Service`] trait that generated code implements, the transport-generic [`Client`] and
//! [`Server`] cores (with a ready serve thread, [`Server::spawn`]), and the transports: the shared-memory
//! [`delegation`] ring and [`ipc`] SPSC rings (with [`flux`] between daemons), and the RDMA
//! transports [`copyrpc`], [`erpc`] (over mlx5 UD or UDP) and [`scalerpc`]; [`bootstrap`]
//! exchanges their endpoints between MPI ranks.

pub mod bootstrap;
pub mod client;
pub mod copyrpc;
pub mod delegation;
pub mod erpc;
pub mod error;
mod fifo;
pub mod flux;
mod futex;
pub mod ipc;
mod macro_support;
mod rc;
pub mod runner;
pub mod scalerpc;
pub mod server;
pub mod service;
mod tokens;
pub mod varlen;
pub mod wire;

pub use client::{Client, ClientTransport, Completion, DEFAULT_CALLS_IN_FLIGHT};
pub use error::{LimitSide, MessageKind, RpcError, TransportError};
pub use rc::Refused;
pub use runner::{IdlePolicy, RunError, RunnerConfig, ServerHandle};
pub use server::{Server, ServerStats, ServerTransport, SleepPrep};
pub use service::{ArgDescriptor, MethodDescriptor, Service, ServiceDescriptor};

/// Items used by code that `#[rpc_service]` generates. Not a stable API: hidden rather than
/// private because the generated code lives in the user's crate and names these paths
/// (`::rpc::__private::…`); macro support is reached only through here.
#[doc(hidden)]
pub mod __private {
    pub use crate::macro_support::*;
    pub use crate::varlen::{
        RESPONSE_DATA_START, VarWriter, WireSlice, decode_fixed, read_opt_slice, read_opt_str,
        read_slice, read_str, read_var_response, var_end, var_end_opt,
    };
    pub use crate::wire::{
        InvalidValue, WireOption, WireResult, decode_body, decode_response, encode, read_header,
        read_request_header,
    };
    pub use zerocopy;
    pub use zerocopy::{FromZeros, Immutable, IntoBytes, KnownLayout, TryFromBytes};
}

//! `mlx5`: a direct-verbs NIC layer for NVIDIA/Mellanox ConnectX, with a software device model
//! that executes the same WQEs.
//!
//! One code path for hardware and simulation (DESIGN.md "Layers"): the driver writes real WQEs
//! into a send-queue buffer ([`sq`]), posts real receive WQEs ([`rq`], [`srq`]) and polls real
//! CQEs by owner bit ([`cq`]). Only object creation and the doorbell differ ([`verbs::Provider`],
//! [`queue::Doorbell`]): rdma-core opened with `dlopen` at run time ([`hw`]) or the device model
//! ([`sim`]). Layouts: `mlx5-prm.md` ([`wqe`], [`cqe`]).
//!
//! # Public surface
//! - objects and queues: [`verbs`] (context, PD, MR, CQ, SRQ, QP), the drivers [`sq`], [`rq`],
//!   [`srq`], [`cq`], and the memory contract between providers and drivers, [`queue`]
//!   (`unsafe` constructors: see its "Safety contract");
//! - formats: [`wqe`], [`cqe`]; providers: [`hw`] (with its raw rdma-core bindings,
//!   `hw::ffi`, which `tests/conformance.rs` checks against the headers) and [`sim`] (with
//!   `sim::testkit` behind the `testkit` feature);
//! - helpers that `rpc-runtime` shares: [`mem`] (DMA buffers), [`fastmap`] (dispatch by QPN),
//!   [`private_file`] (the trust rule for files in `/dev/shm`);
//! - errors: [`Error`] and [`Result`] (the `error` module itself is private).

pub mod cq;
pub mod cqe;
mod error;
pub mod fastmap;
pub mod hw;
pub mod mem;
pub mod private_file;
pub mod queue;
pub mod rq;
pub mod sim;
pub mod sq;
pub mod srq;
pub mod verbs;
pub mod wqe;

pub use error::{Error, Result};

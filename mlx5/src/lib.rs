//! `mlx5`: a direct-verbs NIC layer for NVIDIA/Mellanox ConnectX, with a software device model
//! that executes the same WQEs.
//!
//! One code path for hardware and simulation (DESIGN.md "Layers"): the driver writes real WQEs
//! into a send-queue buffer ([`sq`]), posts real receive WQEs ([`rq`], [`srq`]) and polls real
//! CQEs by owner bit ([`cq`]). Only object creation and the doorbell differ ([`verbs::Provider`],
//! [`queue::Doorbell`]): rdma-core opened with `dlopen` at run time ([`hw`]) or the device model
//! ([`sim`]). Layouts: `mlx5-prm.md` ([`wqe`], [`cqe`]).

pub mod cq;
pub mod cqe;
pub mod error;
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

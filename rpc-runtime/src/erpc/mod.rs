//! Building blocks for an eRPC-style RPC layer (Kalia et al., "Datacenter RPCs can be General
//! and Fast", NSDI 2019; issue 5, specs `seeds/000` and `seeds/002`).
//!
//! eRPC runs RPCs over unreliable datagrams: connection state lives in CPU caches instead of
//! the NIC, the protocol is client driven (the server only answers packets), flow control
//! is per-session credits, loss recovery is go-back-N, and congestion control is Timely
//! (RTT gradients) with a Carousel-style rate limiter that uncongested sessions bypass.
//!
//! The pieces:
//! - [`pkthdr`]: the 16-byte packet header and its bit layout;
//! - [`msgbuf`]: the DMA-capable message buffer with the `hdr0 | data | hdr1..` layout;
//! - [`timely`]: Timely rate computation with eRPC's uncongested bypass;
//! - [`wheel`]: the Carousel timing wheel that paces packets of congested sessions;
//! - [`transport`]: the [`transport::DatagramTransport`] interface the core drives, with
//!   UDP sockets (`sendmmsg`/`recvmmsg` batching) and mlx5 UD queue pairs behind it;
//! - [`core`]: the sans-I/O protocol core ([`core::Rpc`]): sessions, slots, credits, CR/RFR,
//!   go-back-N, at-most-once, session management, node failure, zero-copy dispatch of
//!   single-packet messages, and congestion control (Timely per client session, pacing
//!   through the timing wheel, both bypassed by uncongested sessions);
//! - [`event_loop`]: [`event_loop::Endpoint`], which owns a core and a transport and runs
//!   eRPC's `run_event_loop_once` over them (receive burst, timers, batched transmit), also
//!   split around zero-copy handlers (`rx_burst_zc` / `zc` / `finish_iteration`);
//! - [`typed`]: the binding behind `#[rpc_service(transport = "erpc")]`.

pub mod core;
pub mod event_loop;
pub mod msgbuf;
pub mod pkthdr;
pub mod timely;
pub mod transport;
pub mod typed;
pub mod wheel;

pub use typed::{Erpc, ErpcConfig, ErpcConnect, ErpcServer, ErpcSetupError};

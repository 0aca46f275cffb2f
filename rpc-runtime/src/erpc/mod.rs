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
//!
//! # Every wait and what bounds it (issue 12)
//! Nothing in this module sleeps or blocks a thread except where listed; the event loop,
//! the transports (`MSG_DONTWAIT` sockets, polled UD CQs) and [`ErpcServer`] never wait.
//! Times are the defaults of [`ErpcConfig::default`] (typed) / [`core::Config::default`]
//! (core) and all are settable.
//!
//! | wait | bounded by | outcome when the bound is hit |
//! |---|---|---|
//! | [`Erpc::connect_with`] / [`Erpc::from_endpoint`] / `ClientTransport::connect`: the thread runs the event loop until every session is connected (the only blocking wait of the module) | `ErpcConfig::connect_timeout` (5 s), and the core's `failure_timeout` (1 s typed, 200 ms core) for a server that never answers; the smaller wins; an unrepresentable `connect_timeout` leaves `failure_timeout` | [`ErpcSetupError::Timeout`] / [`ErpcSetupError::NoAnswer`]; a refusal ends it at once ([`ErpcSetupError::SchemaMismatch`], [`ErpcSetupError::Refused`]) |
//! | core: a connecting session (connect request re-sent every `sm_rto`, 10 ms) | `failure_timeout` since its creation | [`core::Event::SessionFailed`] (`PeerFailed`), its queued calls get `RequestFailed` |
//! | core: calls queued in a session's backlog or stall queue (waiting for a slot, a credit or the connection) | progress of the session's other calls, each bounded as below; `failure_timeout` of server silence | `RequestFailed` for each |
//! | core: a call in flight (go-back-N re-sends after each `rto`, 5 ms; keepalive pings every `keepalive`) | `failure_timeout` of server silence: a dead or stopped (SIGSTOP) server answers no ping | `RequestFailed { error: PeerFailed }`; [`Erpc`] reports [`crate::RpcError::ServerDisconnected`] |
//! | core: a call whose server is alive (answers pings) but never replies | not by the core (eRPC has no RPC timeout): the typed client's per-call deadline (`crate::Client`) ends the call; the slot and token stay reserved until the response comes or the session fails, and a late response is then dropped by the client | `RpcError::DeadlineExceeded` from the generic client |
//! | core: a disconnect ([`core::Rpc::destroy_session`]; nobody waits for it) | `failure_timeout` | `SessionFailed` instead of `SessionDisconnected` |
//! | core, server: a request awaiting its reply keeps its slot | the reply, or `failure_timeout` of client silence (the session is reaped and the token goes stale) | `ServerSessionClosed` |
//! | core, server: a connected session whose client never sends a request (issue 14) | `idle_session_timeout` (10 s) after the connect | reclaimed ([`core::Stats::server_sessions_idle_reclaimed`], `ServerSessionClosed`); the client's next ping gets `SessionLost` |
//! | [`Erpc::reconnect`] | does not wait: the new sessions connect in the background, under the rows above | calls fail with `ServerDisconnected` if the server stays silent |
//! | event loop: a full transmit queue | never waited for: the unsent tail is retried on the next iteration | packets leave later (or, on a transport error, count as lost and are re-sent by go-back-N) |

pub mod core;
pub mod event_loop;
pub mod msgbuf;
pub mod pkthdr;
pub mod timely;
pub mod transport;
pub mod typed;
pub mod wheel;

pub use typed::{Erpc, ErpcConfig, ErpcConnect, ErpcServer, ErpcSetupError};

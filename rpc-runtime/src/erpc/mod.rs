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
//! - [`datagram`]: the [`datagram::DatagramTransport`] interface the core drives, with
//!   UDP sockets (`sendmmsg`/`recvmmsg` batching) and mlx5 UD queue pairs behind it;
//! - [`core`]: the sans-I/O protocol core ([`core::Rpc`]): sessions, slots, credits, CR/RFR,
//!   go-back-N, at-most-once, session management, node failure, zero-copy dispatch of
//!   single-packet messages, and congestion control (Timely per client session, pacing
//!   through the timing wheel, both bypassed by uncongested sessions);
//! - [`event_loop`]: [`event_loop::Endpoint`], which owns a core and a transport and runs
//!   eRPC's `run_event_loop_once` over them (receive burst, timers, batched transmit), also
//!   split around zero-copy handlers (`rx_burst_zc` / `zc` / `finish_iteration`);
//! - [`idle`]: what a loop does between iterations that found nothing (adaptive
//!   spin-then-block, for cores shared with other threads);
//! - [`transport`]: the binding behind `#[rpc_service(transport = "erpc")]`.
//!
//! # Every wait and what bounds it (issue 12)
//! Nothing in this module sleeps or blocks a thread except where listed; the event loop,
//! the transports (`MSG_DONTWAIT` sockets, polled UD CQs) and [`ErpcServer`] never wait,
//! except in [`event_loop::Endpoint::idle_wait`] and [`event_loop::Endpoint::wait_for_datagram`],
//! which a loop with nothing to do calls by choice (an application's loop; the runner's park
//! of an idle [`ErpcServer`], through `ServerTransport::wait_for_request`; a blocking call of
//! an [`Erpc`] client, through `ClientTransport::wait_for_response`; rows below).
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
//! | [`event_loop::Endpoint::idle_wait`] after an iteration that found nothing: polls on for an adaptive window, then blocks in [`datagram::DatagramTransport::rx_wait`] (UDP: `ppoll`) until a datagram may be waiting ([`idle`]); [`event_loop::Endpoint::wait_for_datagram`], the same block for a loop with its own idle policy ([`ErpcServer`] under the runner's backoff, in place of its park) | the core's next timer ([`core::Rpc::next_timeout`]: retransmission, keepalive, failure detection, the next paced packet) and [`idle::IdleConfig::max_block`] (1 ms) or the caller's bound (the runner's park, at most its `max_sleep`, 1 ms); never entered with a queued packet or event, an unsent transmit tail or a due timer | the loop runs its next iteration; a transport that cannot wait (mlx5 UD) turns the policy off, or the runner parks |
//! | a blocking call of an [`Erpc`] client (`crate::Client`) with no response after its backoff (spin, then 4 yields): blocks in [`event_loop::Endpoint::wait_for_datagram`] when [`idle::CallWait`] says so (an oversubscribed machine, or a call waiting for over `max_spin`, 200 µs; [`ErpcConfig::client_idle`]) | the call's remaining deadline, 1 ms (the client's idle tick), and the core's next timer; never entered with work queued | the call polls again; its deadline ends it as before; a transport that cannot wait (mlx5 UD) turns the policy off |
//! | a client of several servers with nothing in flight answered ([`wait_for_any_response`], e.g. `kv`'s clients of several daemons): one `ppoll` over every connection's socket ([`event_loop::Endpoint::wait_target`]) when the first connection's [`idle::CallWait`] says so | the caller's `max` (`kv`: 1 ms) and every connection's next timer; never entered while a connection has work | the caller polls every connection again; a transport that cannot wait declines at once |
//! | event loop: a full transmit queue | never waited for: the unsent tail is retried on the next iteration | packets leave later (or, on a transport error, count as lost and are re-sent by go-back-N) |
//!
//! # Copies per message (issue 15; seeds/000 §3)
//! Requests and responses live in [`msgbuf::MsgBuffer`]s held by the session slots: the
//! client slot's request buffer and the server slot's response buffer (taken from the core's
//! free list on first use and reused for every later RPC of the slot; replaced only by a
//! larger one), and the reassembly buffers of multi-packet messages (from the free list,
//! handed to the application in the [`core::Event`] and returned with
//! [`core::Rpc::recycle`]). Packet `i` is sent as a two-part gather list straight from its
//! buffer: its 16-byte header, written by the core into header slot `i` of the buffer, and
//! its data slice in place ([`core::Rpc::poll_transmit_gather`] / [`core::Rpc::msg_pkt`],
//! [`datagram::TxPkt`]).
//!
//! Copies of a message's data bytes by the CPU, for an `n`-byte multi-packet message through
//! the typed binding ([`transport`]); "(kernel)" is the copy `sendmmsg`/`recvmmsg` make between
//! user memory and socket buffers, which UDP cannot avoid:
//!
//! | path | before (commit c5ca698) | now |
//! |---|---|---|
//! | client request, UDP | encoder → `Erpc::req_buf`; **1** `enqueue_request`: `req_buf` → slot `Vec` (`core/req.rs`); **2** `poll_transmit`: slot → `Endpoint` TX batch buffer (`render_req_pkt`); **3** (kernel) `sendmmsg` | encoder → slot `MsgBuffer` (`Rpc::enqueue_request_with`); **1** (kernel) `sendmmsg` with two `iovec`s per packet (header slot, data slice of the `MsgBuffer`; `transport/udp.rs`) |
//! | client request, mlx5 UD | as UDP, but **3** is the copy into the registered staging ring (datagrams of at most 60 B are inlined instead) | **0**: the NIC gathers header slot and data slice straight from the `MsgBuffer` (two data segments of one WQE; packet 0 one segment), registered once per buffer (`transport/ud.rs`, "What is copied and why"); ≤ 60 B inline |
//! | server request receive | (kernel: UDP only) → RX ring; **1** multi-packet: RX ring → slot `Vec` (`server_rx_req`); single-packet: none (zero-copy dispatch) | unchanged count: (kernel: UDP only) → RX ring; **1** multi-packet: RX ring → the slot's `MsgBuffer` at packet `k`'s offset (`MsgBuffer::write_pkt`); single-packet: none |
//! | server reply, UDP | encoder → `ErpcServer::reply_buf`; **1** `reply`: → slot `Vec`; **2** → TX batch buffer (`render_resp_pkt`); **3** (kernel) | encoder → slot response `MsgBuffer` (`Rpc::reply_with`); **1** (kernel) gathered from it; re-sends to duplicates and RFR-requested packets likewise |
//! | server reply, mlx5 UD | as UDP with the staging copy as **3** | **0**: gathered from the slot's response `MsgBuffer`, re-sends too |
//! | client response receive | (kernel: UDP only) → RX ring; **1** RX ring → pooled `Vec` (multi-packet: reassembly; single-packet: the copying `handle_datagram`) | unchanged count: (kernel: UDP only) → RX ring; **1** RX ring → pooled `MsgBuffer` |
//!
//! So a request or reply is copied once on the sending side over UDP (by the kernel) and not
//! at all over mlx5 UD, instead of three times; and once (plus the kernel's copy over UDP)
//! on the receiving side, as before. Exception: a datagram of at most
//! [`core::RENDER_MAX`] (256) bytes, i.e. a packet carrying at most 240 data bytes (a small
//! message, or the short last packet of a large one), is still copied into the event loop's
//! batch buffer, because for so few bytes the copy costs fewer instructions than resolving
//! the gather list (measured with `scripts/callgrind-erpc.sh`).
//!
//! # Buffers the NIC still reads (mlx5 UD in-place sends)
//! A send posted from a message buffer reads it after `tx_burst` returned, until its
//! completion. eRPC flushes the TX DMA queue before a buffer may change (seeds/002 §9, §10,
//! invariant I1). Here the transport instead holds the buffer's memory
//! ([`msgbuf::MsgBuffer::dma_handle`], a shared handle) from the post until the completion
//! is polled, which makes the buffer [in flight](msgbuf::MsgBuffer::in_flight), and:
//! - the memory outlives every read by the NIC, whoever drops the `MsgBuffer` (the transport
//!   deregisters a buffer only once nobody holds it);
//! - the core never writes the data of a buffer in flight: a slot's buffer in flight is
//!   replaced by another one for the next message, and the free list does not hand out
//!   buffers in flight ([`core::Stats::msgbufs_in_flight_skipped`]). This covers every way a
//!   buffer can be reused while a packet of it is queued: after a retransmission, after a call
//!   expired or a session failed, or when a server answers the next request on a slot whose
//!   previous response the client gave up on;
//! - a retransmitted packet's header is identical and is not rewritten.
//!
//! The last in-place WQE of each burst is signaled and the transport polls its send CQ
//! before each receive burst while it holds buffers, so in the steady state a buffer is free
//! again before the response to its message arrives and no buffer is skipped or mapped.

pub mod core;
pub mod datagram;
pub mod event_loop;
pub mod idle;
pub mod msgbuf;
pub mod pkthdr;
pub mod rtt_filter;
pub mod timely;
pub mod transport;
pub mod wheel;

pub use transport::{
    Erpc, ErpcConfig, ErpcConnect, ErpcServer, ErpcSetupError, wait_for_any_response,
};

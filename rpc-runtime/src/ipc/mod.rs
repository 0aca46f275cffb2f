//! The `ipc` transport (seeds/004 §1.3 "ipc Server … per-client SPSC リングベース", §2.3, §4.4,
//! §6, §7): one shared-memory segment per server in `/dev/shm`, holding for every client a
//! single-producer single-consumer **request ring** and an SPSC **response ring** of `depth`
//! slots each. It is cross-process (threads of one process and separate processes of one user
//! alike); the kv daemons use it for local requests (`Server<KvService, IpcServer>` per daemon,
//! one `KvClient<Ipc>` per client thread and daemon).
//!
//! # Layout
//! All offsets in bytes, integers native-endian; see [`layout`] for the constants.
//!
//! | offset | size | field | written by |
//! |---|---|---|---|
//! | 0 | 8 | magic `"IPCRPCV1"` | server, at creation |
//! | 8 | 4 | version (1) | server |
//! | 12 | 4 | `max_clients` | server |
//! | 16 | 4 | `depth` (power of two; most calls in flight per client) | server |
//! | 20 / 24 | 4 + 4 | request / response payload capacity (service's `max_request_bytes` / `max_response_bytes`) | server |
//! | 28 / 32 | 4 + 4 | request / response slot size `align_up(8 + cap, 64)` (redundant, validated) | server |
//! | 36 | 4 | server pid (diagnostics) | server |
//! | 40 | 8 | service schema fingerprint | server |
//! | 48 | 8 | client block size `320 + depth * (req_slot + resp_slot)` (redundant) | server |
//! | 56 | 8 | total size `128 + max_clients * block` (redundant) | server |
//! | 64 | 8 | liveness interval, ns | server |
//! | 72 | 1 | `server_alive` (1 serving, 0 after a clean shutdown) | server |
//! | 76 | 4 | `server_sleep` futex word (1 while the server may be asleep) | server (sleep), a client (wake) |
//! | 80 | 4 | `sleep_armed` (1 once the server may sleep) | server |
//! | 84 | 4 | `client_sleep_armed` (1 once a client may sleep) | a client |
//! | 128 + c·block | 64 | client `c` record: owner word @+0 (`state << 62 \| generation << 32 \| pid`), fault code @+8 (u32) | client (claim, detach), server (reclaim, fault) |
//! | +64 | 64 | `req_head`: requests published | client |
//! | +128 | 64 | `req_tail`: requests released | server |
//! | +192 | 64 | `resp_head`: responses published | server |
//! | +256 | 64 | `resp_tail`: responses consumed @+256; the client's `resp_sleep` futex word @+264 | client (the word also: server, to wake) |
//! | +320 | depth · req_slot | request slots: `len` u32 @0, call `tag` u32 @4, payload @8 | client |
//! | after | depth · resp_slot | response slots: same format | server |
//!
//! Each counter has its own cache line, so the producer and the consumer of a ring never write
//! the same line. Counters are free-running `u64`s; position `p` uses slot `p & (depth - 1)`.
//!
//! # Protocol
//! * **Attach** (client): open the file (`O_NOFOLLOW`; regular, owned by this euid, mode 0600,
//!   checked with `fstat` before reading — [`mlx5::private_file`]), validate the header, map it,
//!   require `server_alive` and the server's lock, then claim a block: take the OFD write lock
//!   on its record line (fails if a live client has it) and CAS the owner word `FREE(g)` →
//!   `ACTIVE(g, pid)`. [`Ipc::connect`](crate::ClientTransport::connect) then compares the
//!   schema fingerprint ([`crate::RpcError::SchemaMismatch`]) and the capacities.
//! * **Send** (client, seeds/004 §2.3 "各 client が自分の ring に"): with a free call token
//!   (fewer than `depth` calls in flight) and `req_head - req_tail < depth`, write the message,
//!   its length and a tag `seq << log2(depth) | token` into slot `req_head`, then publish
//!   `req_head + 1` (Release). Otherwise [`crate::RpcError::WouldBlock`]: per-client
//!   back-pressure, nothing is waited for.
//! * **Poll** (server, §2.3 "全 SPSC リングを flat combining", §5/§6 `poll_with_skip`): one pass
//!   over all blocks reads each `req_head` (Acquire); a block found empty is skipped for the next
//!   [`IDLE_SKIP_POLLS`] polls, and read on every poll again as soon as it had work. **Recv**
//!   returns requests per client in ring order, copied out of the slot; **release** publishes
//!   `req_tail` per ring.
//! * **Reply** (server): write the message and the request's tag into slot `resp_head` of the
//!   client's response ring and publish `resp_head + 1` (Release), after publishing the
//!   client's `req_tail` up to the server's cursor if `release` has not yet (the requests were
//!   copied out at `recv`): so a client whose call was answered finds that call's request slot
//!   free, and `WouldBlock` means `depth` calls in flight. It cannot overflow: a client
//!   has at most `depth` calls in flight, and the server answers each received call at most
//!   once: it records the tag of every request received per call token and refuses a reply
//!   whose tag is not the one awaiting (a second reply, an altered token); it checks
//!   `resp_head - resp_tail < depth` anyway.
//! * **Client poll**: read responses up to `resp_head` (Acquire); a response is delivered only
//!   to the call whose tag it carries; any other (a duplicate, a reply to an earlier call on
//!   the same token) is dropped and counted ([`IpcClientStats::stale_responses`]). Publish
//!   `resp_tail`.
//!
//! # Liveness (as the delegation ring: OFD locks, seeds/004 assumes immortal processes)
//! * The server holds an OFD write lock on the header `[0, 128)` while it lives and clears
//!   `server_alive` when dropped. A client fails with [`crate::RpcError::ServerDisconnected`] on
//!   the next call or poll after a clean shutdown, and, with calls in flight and nothing
//!   arriving, within about one liveness interval after the server process died (lock gone).
//!   A *stopped* server (SIGSTOP) holds its lock: nothing in this module waits for it
//!   without a bound (`send` returns `WouldBlock`, `poll` returns 0, a sleep ends at its
//!   caller's bound), so the typed [`crate::Client`] ends the call at its deadline with
//!   [`crate::RpcError::DeadlineExceeded`].
//! * Each client holds the OFD lock on its record line. Every `liveness_interval` the server
//!   reclaims blocks that are `DETACHED` (dropped client) or `ACTIVE` without a lock (its
//!   process died): requests still queued or awaiting replies are dropped and counted
//!   ([`IpcStats::requests_dropped`]), the counters are zeroed, and the owner word becomes
//!   `FREE(g + 1)`; a reply token of generation `g` is refused as stale afterwards.
//!
//! # Sleeping (extension, seed: none)
//! The seed's server and clients poll forever. Here a server whose polls found nothing may
//! sleep in [`IpcServer::wait_for_request`] (the runner's park uses it) until a client
//! publishes, and a client waiting for responses may sleep in [`Ipc::sleep_for_response`]
//! (the typed blocking call uses it, from a thread not pinned to one CPU, when
//! `rpc::erpc::idle::CallWait` says so) until the server's round of replies: `FUTEX_WAIT`
//! on a word in the shared mapping, `FUTEX_WAKE` by the other side (shared futexes: the
//! sides may be processes). Every sleep is bounded by its caller.
//! * **Server**: `swap(1)` `server_sleep` (SeqCst), a SeqCst fence, then every served
//!   block's `req_head`; with a request not yet received it stores 0 and does not sleep,
//!   else `FUTEX_WAIT(server_sleep, 1, bound)`, then 0. **Client**: at its first poll after
//!   sends (or before it sleeps itself), if `sleep_armed` is set: a SeqCst fence, then
//!   `server_sleep`; a non-zero word is swapped to 0 and, if that returned non-zero, woken.
//!   Fence against fence: a `req_head` the server's check missed was published before the
//!   client's fence, so the client's load sees the server's `swap(1)`. The check costs a
//!   client one load of the header line per poll with sends while the server never sleeps
//!   (`sleep_armed` is 0: the `kv` daemons, which poll), and one fence per such poll once it
//!   may. `sleep_armed` is stored at the server's first `wait_for_request`, which does not
//!   sleep; a client that read it as 0 just before (its sends not yet checked) can leave a
//!   request unseen by the server's next sleep, which then ends at its bound.
//! * **Client**: `swap(1)` its block's `resp_sleep` (SeqCst), a SeqCst fence, then
//!   `resp_head`, `server_alive` and its fault word; with a response (or a reason to fail)
//!   it stores 0 and returns, else `FUTEX_WAIT(resp_sleep, 1, bound)`, then 0. **Server**:
//!   once `client_sleep_armed` (@84) is set, remembers the blocks it replies to, and at
//!   [`IpcServer::release`] (the end of the typed server's round) and before it sleeps
//!   issues one SeqCst fence, then loads each one's word and wakes the sleepers (swap to 0,
//!   `FUTEX_WAKE`). A client's first [`Ipc::sleep_for_response`] stores
//!   `client_sleep_armed` and does not sleep: a server whose clients never sleep (the `kv`
//!   clients are pinned) pays one load per reply, no fence. A reply published in the round
//!   in which the server first sees the flag can miss a sleeper, whose sleep then ends at its
//!   bound.
//! * A garbage word costs at most a spurious wake or a sleep to its bound.
//!
//! # Garbage in shared memory
//! Nothing read from the segment is trusted as an index: slots are `pos & (depth - 1)`; a
//! request longer than the capacity is answered with an empty message, which fails to
//! decode, so the call ends at once ([`IpcStats::bad_len`]); a `req_head` more than
//! `depth` ahead of the released tail or behind the server's cursor, or a `resp_tail` the
//! server finds out of range, marks that client's rings corrupt ([`IpcStats::ring_faults`]; the
//! code is stored in the block, the client's next call fails with [`IpcError::ClientFault`],
//! the other clients are unaffected); a reply token naming no block is refused
//! ([`IpcStats::bad_tokens`]); a client finding `resp_head` out of range fails likewise, and a
//! response longer than the capacity is delivered to its call as an empty message (it fails to
//! decode). All accesses go through bounds-checked accessors. Requests are copied out of the
//! slot before the handler sees them.

mod client;
mod error;
mod header;
pub mod layout;
mod server;
mod shm;
mod transport;

pub use client::{Ipc, IpcClientStats, sleep_for_any_response};
pub use error::IpcError;
pub use server::{IDLE_SKIP_POLLS, IpcServer, IpcToken, POLLS_PER_CLOCK};
pub use shm::{SHM_DIR, unsafe_files_refused};

use std::time::Duration;

/// Sizing and timing of an ipc segment, chosen by the server; capacities and fingerprint come
/// from the service descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcConfig {
    /// Client blocks = most clients attached at once, 1..=4096. Default 64.
    pub max_clients: u32,
    /// Slots per request ring and per response ring = most calls one client has in flight; a
    /// power of two 1..=4096 (seeds/004 §9 step 3 uses the benchmark's queue depth). Default 32.
    pub depth: u32,
    /// How often the server reclaims blocks of detached and dead clients, and how often a
    /// waiting client checks that the server process lives (stored in the header). In (0,
    /// 60 s]; default 10 ms.
    pub liveness_interval: Duration,
}

impl Default for IpcConfig {
    /// `max_clients` 64, `depth` 32 ([`crate::client::DEFAULT_CALLS_IN_FLIGHT`]),
    /// `liveness_interval` 10 ms.
    fn default() -> Self {
        IpcConfig {
            max_clients: 64,
            depth: crate::client::DEFAULT_CALLS_IN_FLIGHT as u32,
            liveness_interval: Duration::from_millis(10),
        }
    }
}

/// Server-side counters, in the server's own memory; each counts events since creation. Read
/// with [`IpcServer::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpcStats {
    /// Requests returned by `recv`.
    pub received: u64,
    /// Replies published.
    pub replied: u64,
    /// Requests whose length exceeded the request capacity: not handed out, answered with an
    /// empty message (which fails to decode at the client).
    pub bad_len: u64,
    /// Clients whose rings were found corrupt (request head out of range, response tail out of
    /// range).
    pub ring_faults: u64,
    /// Replies whose token named no client block.
    pub bad_tokens: u64,
    /// Replies to a client that detached, died or was faulted since the request was received.
    pub stale_replies: u64,
    /// Replies whose token matches no request awaiting a reply (a second reply to one call, or
    /// an altered tag).
    pub duplicate_replies: u64,
    /// Requests dropped because they reused the call token of a call of the same client that
    /// was still unanswered (a protocol violation: the token is freed only on delivery).
    pub token_reused: u64,
    /// Replies refused because the client's response ring was full.
    pub resp_ring_full: u64,
    /// Replies longer than the response capacity.
    pub oversized_replies: u64,
    /// Client blocks reclaimed after their owner detached or died (or found free but dirty,
    /// after their owner word was overwritten).
    pub clients_reclaimed: u64,
    /// Requests of detached or dead clients dropped at reclaim (queued, or received and not
    /// answered).
    pub requests_dropped: u64,
    /// Sleeps of the server in [`IpcServer::wait_for_request`] (woken, timed out, or the
    /// word changed before the wait).
    pub idle_waits: u64,
    /// Clients found asleep in [`Ipc::sleep_for_response`] and woken after replies.
    pub clients_woken: u64,
}

//! The delegation ring (seeds/004 §2 "delegationrpc プロトコル"): a shared-memory MPSC ring in
//! `/dev/shm` through which many client threads or processes send requests to one server
//! (the node's delegate), plus per-client response slots the server writes replies into.
//!
//! This module is byte-oriented and knows nothing about RPC types: requests and responses are
//! byte strings of at most `req_payload_cap` / `resp_payload_cap` bytes. The typed transport is
//! built on top of [`RingServer`] and [`RingClient`].
//!
//! # Layout
//! Exactly seeds/004 §2.1 — 128-byte header, ring control (`head` @128, `tail` @192), request
//! slots from 256, response slots after them — with documented extensions stored in the seed's
//! padding (schema fingerprint, payload capacities, redundant sizes for validation, payload
//! lengths, pids, the liveness interval, the ring fault byte), and a client table
//! appended at the end; each request slot starts with a 64-bit sequence word (its header is
//! 24 bytes, the seed's 16, and the layout version is 4), and the header and each client
//! record hold a futex word for sleeping (see "Sleeping" below). See [`layout`] for every
//! offset and its source.
//!
//! # Protocol
//! Seeds/004 §2.2: a client reserves a position with `head.fetch_add(1)`, waits until
//! `pos - tail < ring_depth`, writes its request into slot `pos & (ring_depth - 1)` and sets
//! `committed = 1` (two-phase commit). The server scans from its cursor while slots are
//! committed ([`RingServer::poll`]), takes entries out in position order ([`RingServer::recv`]),
//! publishes its cursor as `tail` ([`RingServer::advance_tail`]) and writes each reply into the
//! client's response slot ([`RingServer::reply`]), which the client reads
//! ([`RingClient::poll`]).
//!
//! **Slot sequence words (extension, deviation).** The seed's `committed` byte cannot tell
//! which lap of a slot it belongs to, so a client that stalls between `fetch_add` and its
//! commit, and commits after the server gave its position up, would have its late entry read
//! as the next lap's. Each slot therefore has a 64-bit sequence word `pos << 2 | state`
//! (states `FREE` and `COMMITTED`; see [`layout`]) that replaces the `committed` byte at the
//! start of the slot, in the cache line the server reads next. Slot `i` starts `FREE(i)`. A
//! writer of `pos` writes the slot only after it has seen `FREE(pos)` there (an Acquire load),
//! and commits by storing `COMMITTED(pos)` (Release). The server reads an entry only at
//! `COMMITTED(pos)` and frees the slot for the next lap with `FREE(pos + ring_depth)`
//! (Release) after copying it out. So no writer ever touches a slot that belongs to another
//! lap, and the server never reads a slot whose word is not `COMMITTED` of the position it is
//! at. With calls in flight the client's hot path has one read-modify-write, the seed's
//! `fetch_add` on `head`: the slot check is a load and the commit a store (an earlier version
//! claimed and committed with a CAS each, which cost about 30% of throughput at QD 32, see
//! `ring_vs_crossbeam`). A call made with nothing else in flight checks the slot with a CAS of
//! `FREE(pos)` to itself instead, which is the same check but takes the slot's cache line
//! exclusive in one transfer (QD 1 p50 230 ns instead of 300).

//! The seed assumes that every process lives forever. This implementation adds the mechanisms
//! below so that a crashed server, a crashed client, or a garbage file cannot hang or corrupt
//! the others.
//!
//! # Liveness: OFD locks
//! Liveness is tracked with open-file-description byte-range locks (`fcntl(F_OFD_SETLK)`):
//! they belong to one `open(2)` of the file, conflict with locks of every other `open` — in
//! the same process or another — and are released by the kernel when the description is
//! closed, including when its process dies. Checking is `F_OFD_GETLK`, a system call, so it is
//! done only on slow paths.
//!
//! * **Server.** The server holds a write lock on the header bytes `[0, 128)` for its lifetime.
//!   A client considers the server gone if `server_alive == false` (clean shutdown; checked on
//!   every call and every empty poll) or if no lock is held on `[0, 128)` (the process died;
//!   checked every `liveness_interval` while the client waits, in an empty
//!   [`RingClient::poll`] with calls outstanding or while the ring is full). Both give
//!   [`RingCallError::ServerDisconnected`] within about one `liveness_interval`, never a hang.
//! * **Clients.** Each client holds a write lock on its 64-byte record in the client table.
//!
//! # Client ids
//! The client table (extension) has one 64-byte record per id: `state` (`FREE`, `ACTIVE`,
//! `DETACHED`), `generation`, `reserving_pos` and `pid`. To attach, a client takes candidate ids
//! first from `next_client_id` (CAS-incremented while below `max_clients`), then from a scan
//! for `FREE` records; for each candidate it takes a non-blocking OFD write lock on the record
//! (failure: a live client has it) and then CASes `state` from `FREE` to `ACTIVE` (failure:
//! unlock, next candidate). So an `ACTIVE` record is always locked while its owner lives.
//! Dropping a [`RingClient`] stores `DETACHED` and releases the lock.
//!
//! **Reclaim.** Every `liveness_interval` (the clock is read every 1024 polls) the server scans
//! the table. A record that is `DETACHED`, or `ACTIVE` without a lock (its owner died), is
//! noted together with the current `head`: everything that owner ever reserved lies below it.
//! Once the server's cursor has passed that head, none of the owner's requests remain in the
//! ring, and the server bumps `generation`, clears the id's response slots (`valid = 0`), sets
//! `reserving_pos = IDLE` and finally `state = FREE` (Release), making the id available again.
//! A [`ReplyToken`] carries the generation seen at `recv` time, so a reply to a client that is
//! no longer `ACTIVE`, or whose id has been reclaimed (and perhaps reused), is refused with
//! [`RingReplyError::StaleToken`] instead of landing in the new owner's slots.
//!
//! # Holes: dead, abandoned and stalled reservations
//! A client that dies, gives up (deadline) or stalls between `fetch_add` and its commit
//! leaves a *hole*: a position that is not committed. The seed's server would stop there
//! forever. Here, every call brackets its reservation in its record: `reserving_pos =
//! RESERVING` (Relaxed), `pos = head.fetch_add(1, Release)`, `reserving_pos = pos` (Release),
//! …, commit, `reserving_pos = IDLE` (Release). When [`RingServer::poll`] finds a hole at its
//! cursor, it examines it every `min(hole_timeout, stall_timeout)`: it scans the table for
//! non-`FREE` records with `reserving_pos == RESERVING` or `== cursor` and checks their
//! owners' locks.
//!
//! * No live owner (it died, abandoned the position at its deadline, or is unknown): the hole
//!   is skipped (`holes_skipped`) after `hole_timeout` (default 50 ms).
//! * A live owner: the server waits up to `stall_timeout` (default 200 ms, see
//!   [`RingConfig::stall_timeout`] for the choice) from when it first saw the hole, then
//!   skips it anyway (`stalls_skipped`). The seed waits forever; before this change a 3 s
//!   stall of one client stopped every client for 3 s.
//!
//! What a skip does to the slot depends on who might still write it:
//!
//! * **Nobody** (the owner is dead or unknown, or it abandoned the position): CAS
//!   `FREE(pos)` → `FREE(pos + ring_depth)`; the slot goes to the next lap. A commit that lands
//!   before the CAS wins and is served.
//! * **A live owner** (stalled): it may be writing the slot right now, or resume at any
//!   instruction and write it, and its commit is a plain store the server cannot veto. So the
//!   server leaves the word alone and **holds** the slot for it: it remembers the held
//!   position and passes every later lap of that slot at once (`held_laps_skipped`): their
//!   writers see a word of an earlier lap, wait until the server has passed their position,
//!   and reserve again within the same call ([`RingClient::held_slot_retries`]; no call
//!   fails). The held slot is released (`held_slots_released`) to the first lap the server
//!   has not passed, once the holder has moved on: its `reserving_pos`, stored with Release
//!   after its last write to the slot, no longer names the position, or it died.
//!
//! The stalled client learns of the skip from `tail`: its refusal check just before the commit
//! store finds `tail > pos`, so it commits nothing and fails the call with
//! [`RingCallError::Skipped`] (the typed transport resends). Only a stall that ends exactly between
//! that check and the commit store commits an entry the server will not read: it is dropped
//! and counted when the slot is released (`late_commits_dropped`), and that call ends by its
//! deadline. A stopped client thus costs the ring one slot of capacity while it is stopped,
//! never a wait of other clients (the same whether it stopped before, during or after writing).
//!
//! The owner scan only decides *when* a hole is skipped (a dead owner need not be waited for;
//! the timeouts keep the system calls off the path of short-lived holes); the sequence word
//! makes every skip safe. (A lock lives as long as any descriptor of its open file
//! description: a process that `fork`s without `exec` while attached keeps its parent's
//! client alive in this sense.)
//!
//! # A corrupt ring fails loudly
//! Impossible ring states are detected by the server and by the clients, reported as
//! [`RingFault`] and counted ([`RingStats::ring_faults`], [`RingClient::ring_faults`]):
//! `head` behind `tail` (or the server's cursor); `head` more than `ring_depth +
//! 4 * max_clients` ahead (see [`RingFault::HeadTooFarAhead`] for why no legal state gets
//! there); `tail` changed by someone other than the server; a slot sequence word no protocol
//! step produces. The first finder stores the fault's code in the header (byte
//! [`layout::OFF_RING_FAULT`]), which **marks the ring failed**: every client's next call,
//! every poll with calls outstanding and every blocked wait (within one backoff round) fail
//! at once with [`RingCallError::RingCorrupt`]; [`RingClient::attach`] fails with
//! [`RingError::Failed`]; the server serves nothing more ([`RingServer::fault`]).
//!
//! Why failed and not repaired: after `head` or `tail` was overwritten nobody can tell which
//! positions clients hold, which were committed and which requests were already served. Any
//! repair (say, `head = tail = cursor`) could hand one slot to two writers, serve a request
//! twice, or leave a client waiting for a position that no longer exists. A failed ring gives
//! every current and future client an immediate, explicit error instead of a hang or a wrong
//! answer; the operator restarts the server, which creates a fresh ring (replacing the failed
//! file).
//!
//! # Sleeping (extension, seed: none)
//! A server with nothing to do may sleep in [`RingServer::wait_for_request`] until a client
//! commits, and a client waiting for replies in [`RingClient::wait_for_response`] until the
//! server's round of replies: `FUTEX_WAIT` on a word in the shared mapping, woken by the
//! other side with `FUTEX_WAKE` when it finds the word set. The protocol, why no wake is lost,
//! and the cost on the hot paths (one load of a read-mostly header line per commit, one
//! fence per round of replies) are in the `sleep` module's docs. Both are only offered: the
//! callers decide when to sleep (the typed [`Delegation`] transport and the `kv` daemons
//! with `rpc::erpc::idle::CallWait`, never from a thread pinned to one CPU).
//!
//! # Every wait is bounded
//! These are all the loops and sleeps that wait for another party, and what ends each:
//!
//! | where | waits for | bounded by |
//! |---|---|---|
//! | [`RingClient::try_call_with_deadline`]: the reserved position is not yet in the window (`pos - tail >= ring_depth`) | the server to consume | the call's deadline ([`RingCallError::Timeout`]; the position is abandoned, never written, and skipped as a hole after `hole_timeout`); server death: `server_alive` every round, its lock every `liveness_interval` ([`RingCallError::ServerDisconnected`]); a failed ring ([`RingCallError::RingCorrupt`]); the server passing the position ([`RingCallError::Skipped`]) |
//! | same call, before reserving, if an earlier call of this client abandoned a position | the server to pass that position | as above |
//! | same call, the slot of the reserved position is still held for a stalled writer of an earlier lap | the server to pass the position (it does so on its next poll, no timeout), then the call reserves again | as above |
//! | [`RingClient::try_call`], [`RingClient::try_call_with`], and the typed [`Delegation`] transport's `send` | as above | as above, with the client's send timeout as the deadline ([`DEFAULT_SEND_TIMEOUT`] = 1 s, [`RingClient::set_send_timeout`]) |
//! | [`RingClient::poll`] | nothing: it never blocks | the caller's deadline. It fails at once on a shut-down server or a failed ring, and within `liveness_interval` on a dead server |
//! | [`RingServer::poll`] at a hole (it does not block either: it returns 0) | the reserving client to commit | `hole_timeout` if the owner is dead, unknown or gave up; `stall_timeout` if it is alive |
//! | [`RingServer::wait_for_request`] (`FUTEX_WAIT`; not at all while an entry is reserved past the cursor) | a client's commit | the caller's bound (the `kv` daemons: 1 ms; the runner: its park) |
//! | [`RingClient::wait_for_response`] (`FUTEX_WAIT`) | the server's round of replies | the caller's bound (the typed client: its remaining deadline, at most 1 ms; the `kv` clients: 1 ms); a dead server is then found by the polls' liveness checks as before |
//! | [`Delegate`] Phase 1 hand-off to a daemon whose response slots are all in use | the daemon to answer | the delegate's wait timeout ([`forward::DEFAULT_WAIT_TIMEOUT`] = 1 s, [`Delegate::set_wait_timeout`]), which is also the hand-off call's deadline |
//! | [`Delegate`] Phase 2 `copyrpc call` on a full ring or short of credit | the peer delegate to return space | the delegate's wait timeout; an endpoint failure reported by copyrpc |
//!
//! # Garbage in shared memory
//! Every value read from shared memory is validated before it is used as an index: `recv`
//! drops (and counts in [`RingStats`]) entries whose client id, response slot or length is out
//! of range or whose client is not `ACTIVE`; a response carries the call tag of the request
//! it answers (low 16 bits of its ring position, [`layout::RESP_TAG`]) and a client delivers
//! only the one whose tag matches the call outstanding on the slot, clearing a stray one
//! ([`RingClient::stray_responses`]), so an entry whose metadata was overwritten to name
//! another client's slot cannot hand its answer to that client's call; reply tokens are
//! bounds-checked; the header is
//! validated field by field before the file is mapped ([`RingError`]). All shared-memory
//! accesses go through bounds-checked accessors. (A process that truncates the file under a
//! mapping can still cause `SIGBUS`; the files are mode 0600.)

mod client;
mod config;
mod error;
mod header;
pub mod layout;
pub mod manifest;
mod server;
mod shm;
mod sleep;
mod stats;

#[cfg(feature = "test-hooks")]
pub use client::PendingCall;
pub use client::{DEFAULT_SEND_TIMEOUT, RingClient};
pub use config::{RingConfig, RingInfo};
pub use error::{RingCallError, RingError, RingFault, RingReplyError};
pub use manifest::{RingManifest, read_manifest};
pub use server::{RecvEntry, ReplyToken, RingServer};
pub use shm::{SHM_DIR, unsafe_files_refused};
pub use stats::RingStats;

mod transport;
pub use transport::*;

pub mod forward;
pub use forward::{DelegToken, Delegate, DelegateError, ForwardStats, Target};
pub mod node;
mod shard;

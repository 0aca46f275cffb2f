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
//! lengths, pids, the liveness interval) and a client table appended at the end. See
//! [`layout`] for every offset and its source.
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
//!   [`CallError::ServerDisconnected`] within about one `liveness_interval`, never a hang.
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
//! [`ReplyError::StaleToken`] instead of landing in the new owner's slots.
//!
//! # Holes left by dead clients
//! A client that dies between `fetch_add` and its commit leaves a *hole*: a position that will
//! never be committed. The seed's server would stop there forever. Here, every call brackets
//! its reservation in its record: `reserving_pos = RESERVING` (Relaxed), `pos =
//! head.fetch_add(1, Release)`, `reserving_pos = pos` (Release), …, commit, `reserving_pos =
//! IDLE` (Release). When [`RingServer::poll`] finds the hole at its cursor older than
//! `hole_timeout`, it scans the table: if any non-`FREE` record with `reserving_pos ==
//! RESERVING` or `== cursor` has a live owner (lock held), that owner is about to commit and the
//! server keeps waiting. Otherwise it re-checks `committed == 0`, skips the position
//! (`holes_skipped`), and resets the dead owner's `reserving_pos`.
//!
//! Why skipping is safe: the server saw `head > cursor` with an Acquire load, which
//! synchronizes with the Release `fetch_add` that reserved `cursor` (and all earlier ones, a
//! release sequence), so the owner's `RESERVING` store — or a later one — is visible. A live
//! owner therefore shows `RESERVING` or `cursor` until it stores `IDLE` after committing, and
//! since that store is Release, a server that reads `IDLE` (or the owner's next, Release-stored
//! position) also sees `committed == 1` on its re-check. So the server skips only positions
//! whose owner is dead — its lock is gone, so its process (or, for the in-process test hook,
//! its `RingClient`) no longer exists — and a dead owner never writes again, so the skipped
//! slot can be reused safely. A live owner waiting at `cursor` for ring space is never blocked
//! forever: once the server advances `tail` to its cursor, `pos - tail == 0 < ring_depth`.
//! The timeout only keeps the system calls off the common path of short-lived holes.
//! (A lock lives as long as any descriptor of its open file description: a process that
//! `fork`s without `exec` while attached keeps its parent's client alive in this sense.)
//!
//! # Garbage in shared memory
//! Every value read from shared memory is validated before it is used as an index: `recv`
//! drops (and counts in [`RingStats`]) entries whose client id, response slot or length is out
//! of range or whose client is not `ACTIVE`; reply tokens are bounds-checked; the header is
//! validated field by field before the file is mapped ([`RingError`]). All shared-memory
//! accesses go through bounds-checked accessors. (A process that truncates the file under a
//! mapping can still cause `SIGBUS`; the files are mode 0600.)

mod client;
mod config;
mod error;
mod header;
pub mod layout;
mod server;
mod shm;
mod stats;

pub use client::RingClient;
pub use config::{RingConfig, RingInfo};
pub use error::{CallError, ReplyError, RingError, RingFault};
pub use server::{RecvEntry, ReplyToken, RingServer};
pub use shm::SHM_DIR;
pub use stats::RingStats;

mod transport;
pub use transport::*;

pub mod forward;
pub use forward::{DelegToken, Delegate, DelegateError, ForwardStats, Target};

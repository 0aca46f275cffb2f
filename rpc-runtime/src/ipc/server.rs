//! The server side: [`IpcServer`] creates the segment, scans every client's request ring with
//! flat combining (seeds/004 §2.3, §5 Phase 3, §6 Phase 1 `poll_with_skip`), hands requests out
//! in per-client order and writes replies into the sender's response ring.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicU64, fence};
use std::time::{Duration, Instant};

use super::error::IpcError;
use super::header;
use super::layout::*;
use super::shm::{self, Map, io_err};
use super::{IpcConfig, IpcStats};
use crate::error::RpcError;
use crate::server::SleepPrep;
use crate::service::{Service, ServiceDescriptor};

/// A client found with an empty request ring is not read again for this many polls (its skip
/// counter; reset to 0 as soon as it had work). Source: seeds/004 §5/§6 `poll_with_skip`; the
/// value is this implementation's choice: reading an idle client's `req_head` costs a cache
/// miss whenever that client wrote it, so idle clients are read on every 5th poll only, which
/// delays the first request of a client that wakes up by at most 4 polls of the server (each
/// a scan of the other clients, well under a microsecond on an idle server).
pub const IDLE_SKIP_POLLS: u8 = 4;

/// Polls between two reads of the clock for the liveness scan (the scan itself runs every
/// `liveness_interval`).
pub const POLLS_PER_CLOCK: u32 = 1024;

/// Where a reply goes: client block, the generation of its owner when the request was
/// received, and the call's tag. `Copy`; valid until that client detaches or dies (then
/// [`crate::ServerTransport::reply`] refuses it as stale).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcToken {
    /// Client block index.
    pub client: u32,
    /// Owner generation at `recv` time.
    pub generation: u32,
    /// The call tag the client wrote into the request slot.
    pub tag: u32,
}

/// Not attached as far as the server knows.
const NO_GEN: u32 = u32::MAX;

/// No request awaits a reply on this call token.
const NO_TAG: u64 = u64::MAX;

/// Server-local state of one client block (nothing here is read back from shared memory).
#[derive(Clone, Copy, Debug)]
struct Peer {
    /// Generation of the owner being served, `NO_GEN` until the server saw it `ACTIVE`.
    generation: u32,
    /// Next request position to read.
    cursor: u64,
    /// Last `req_tail` published.
    released: u64,
    /// Next response position to write (only the server writes `resp_head`).
    resp_head: u64,
    /// Requests received and not yet answered.
    outstanding: u64,
    /// Polls left before `req_head` is read again.
    skip: u8,
    /// Rings found corrupt: not served until the client is reclaimed.
    faulted: bool,
    /// In the `unreleased` list.
    unreleased: bool,
}

const PEER0: Peer = Peer {
    generation: NO_GEN,
    cursor: 0,
    released: 0,
    resp_head: 0,
    outstanding: 0,
    skip: 0,
    faulted: false,
    unreleased: false,
};

/// An ipc server (seeds/004 §1.3 "ipc Server", §4.4 step 2): owns `/dev/shm/<name>` (mode
/// 0600, created `O_EXCL`), holds the OFD lock on its header for its lifetime.
///
/// Dropping it stores `server_alive = 0` (clients' next call or empty poll fails with
/// [`RpcError::ServerDisconnected`]), unlinks the file and releases the lock.
#[derive(Debug)]
pub struct IpcServer {
    path: PathBuf,
    file: File,
    map: Map,
    layout: Layout,
    liveness: Duration,
    peers: Box<[Peer]>,
    /// `(client, limit)` found with requests by the last `poll`; `recv` walks it.
    ready: Vec<(u32, u64)>,
    ready_at: usize,
    /// Clients whose `req_tail` must be published at `release`.
    unreleased: Vec<u32>,
    /// Per client block and call token (`tag & (depth - 1)`): the tag of the request received
    /// on it and not yet answered, or `NO_TAG`. A reply must match it exactly, so a second
    /// reply to one call, or a forged token, never reaches the client.
    pending: Box<[u64]>,
    /// Copy of the request being handed out (a client cannot change it under the handler).
    pub(super) scratch: crate::varlen::AlignedBuf,
    stats: IpcStats,
    polls_until_clock: u32,
    next_scan: Instant,
    /// Client blocks replied to since the last check of their sleep words.
    replied: Vec<u32>,
    /// Per client block: in `replied`.
    replied_mark: Box<[bool]>,
    /// [`OFF_SLEEP_ARMED`] is stored: clients check the server's sleep word.
    armed: bool,
    /// `FUTEX_WAIT` was refused once: `wait_for_request` no longer sleeps.
    sleep_unsupported: bool,
}

impl IpcServer {
    /// Creates `/dev/shm/<name>` for `service` and starts serving it.
    ///
    /// A file of this user at the name that no live server holds (a crashed server's) is
    /// replaced; the segment is built under a temporary name and linked into place, so a
    /// client never sees a half-initialized header.
    ///
    /// # Errors
    /// [`RpcError::Transport`] with [`IpcError::InvalidName`], [`IpcError::InvalidConfig`] (depth not a
    /// power of two, liveness interval not in (0, 60 s], ...), [`IpcError::InUse`] (a live server
    /// has the name), [`IpcError::UnsafeFile`] (another user's file or a link is at the name),
    /// [`IpcError::Io`].
    pub fn create(
        name: &str,
        service: &'static ServiceDescriptor,
        cfg: IpcConfig,
    ) -> Result<Self, RpcError> {
        Ok(Self::create_raw(
            name,
            cfg,
            service.fingerprint,
            service.max_request_bytes,
            service.max_response_bytes,
        )?)
    }

    /// [`IpcServer::create`] for service `S`, wrapped in a typed [`crate::Server`].
    ///
    /// # Errors
    /// As [`IpcServer::create`].
    pub fn serve<S: Service>(
        name: &str,
        cfg: IpcConfig,
    ) -> Result<crate::Server<S, Self>, RpcError> {
        Ok(crate::Server::new(Self::create(name, S::DESCRIPTOR, cfg)?))
    }

    /// [`IpcServer::create`] with explicit capacities (bytes) and fingerprint, for byte-level
    /// use and tests.
    ///
    /// # Errors
    /// As [`IpcServer::create`].
    pub fn create_raw(
        name: &str,
        cfg: IpcConfig,
        fingerprint: u64,
        req_cap: usize,
        resp_cap: usize,
    ) -> Result<Self, IpcError> {
        let (name, path) = shm::shm_path(name)?;
        let invalid = |reason: String| IpcError::InvalidConfig { reason };
        let cap = |c: usize| u32::try_from(c).unwrap_or(u32::MAX);
        let layout = Layout::new(LayoutParams {
            max_clients: cfg.max_clients,
            depth: cfg.depth,
            req_cap: cap(req_cap),
            resp_cap: cap(resp_cap),
        })
        .map_err(invalid)?;
        let liveness_ns = u64::try_from(cfg.liveness_interval.as_nanos()).unwrap_or(u64::MAX);
        if liveness_ns == 0 || liveness_ns > MAX_LIVENESS_NS {
            return Err(invalid(format!(
                "liveness_interval = {:?} must be in (0, 60 s]",
                cfg.liveness_interval
            )));
        }
        let pid = std::process::id();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let tmp = path.with_file_name(format!(
            ".{name}.ipc.{pid}.{}",
            COUNTER.fetch_add(1, Relaxed)
        ));
        let file = mlx5::private_file::create(&tmp).map_err(io_err(&tmp, "create"))?;
        let built = (|| {
            file.set_len(layout.total_size)
                .map_err(io_err(&tmp, "ftruncate"))?;
            let map = Map::new(&file, layout.total_size).map_err(io_err(&tmp, "mmap"))?;
            header::init(&map, &layout, fingerprint, liveness_ns, pid);
            if !shm::try_lock(&file, 0, SERVER_LOCK_LEN).map_err(io_err(&tmp, "fcntl"))? {
                return Err(IpcError::InUse {
                    path: tmp.clone(),
                    pid,
                });
            }
            publish(&tmp, &path)?;
            Ok(map)
        })();
        let _ = std::fs::remove_file(&tmp);
        let map = built?;
        tracing::debug!(path = %path.display(), ?layout, "ipc segment created");
        Ok(IpcServer {
            path,
            file,
            map,
            layout,
            liveness: cfg.liveness_interval,
            peers: vec![PEER0; cfg.max_clients as usize].into_boxed_slice(),
            ready: Vec::with_capacity(cfg.max_clients as usize),
            ready_at: 0,
            unreleased: Vec::with_capacity(cfg.max_clients as usize),
            pending: vec![NO_TAG; cfg.max_clients as usize * cfg.depth as usize].into_boxed_slice(),
            scratch: crate::varlen::AlignedBuf::new(layout.params.req_cap as usize),
            stats: IpcStats::default(),
            polls_until_clock: POLLS_PER_CLOCK,
            next_scan: Instant::now() + cfg.liveness_interval,
            replied: Vec::with_capacity(cfg.max_clients as usize),
            replied_mark: vec![false; cfg.max_clients as usize].into_boxed_slice(),
            armed: false,
            sleep_unsupported: false,
        })
    }

    /// The file served.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Counters since creation.
    pub fn stats(&self) -> &IpcStats {
        &self.stats
    }

    /// The layout (sizes, offsets) of the segment.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Makes newly arrived requests available to [`IpcServer::recv`] and returns how many are
    /// available: one flat-combining pass over every client block (seeds/004 §2.3 "全 SPSC
    /// リングを flat combining"), skipping blocks found idle in the last
    /// [`IDLE_SKIP_POLLS`] polls (seeds/004 §5/§6 `poll_with_skip`). Every `liveness_interval`
    /// (the clock is read every [`POLLS_PER_CLOCK`] polls) it also reclaims the blocks of
    /// detached and dead clients. Requests not taken by `recv` before the next `poll` are
    /// offered again. Never blocks.
    pub fn poll(&mut self) -> usize {
        self.polls_until_clock -= 1;
        if self.polls_until_clock == 0 {
            self.polls_until_clock = POLLS_PER_CLOCK;
            if Instant::now() >= self.next_scan {
                self.scan_clients();
            }
        }
        self.ready.clear();
        self.ready_at = 0;
        let depth = u64::from(self.layout.params.depth);
        let mut total = 0;
        for c in 0..self.layout.params.max_clients {
            let p = &mut self.peers[c as usize];
            if p.skip > 0 {
                p.skip -= 1;
                continue;
            }
            if p.faulted {
                continue;
            }
            let block = self.layout.block(c);
            let head = self.map.u64(block + CB_REQ_HEAD).load(Acquire);
            let avail = head.wrapping_sub(p.cursor);
            if avail == 0 {
                p.skip = IDLE_SKIP_POLLS;
                continue;
            }
            if avail > depth || head.wrapping_sub(p.released) > depth {
                self.fault(c, FAULT_HEAD);
                continue;
            }
            let p = &mut self.peers[c as usize];
            if p.generation == NO_GEN {
                let owner = self.map.u64(block + CB_OWNER).load(Acquire);
                if owner_state(owner) != STATE_ACTIVE {
                    // Requests of a client that detached or whose block is not claimed: they
                    // are dropped (and counted) when the block is reclaimed.
                    p.skip = IDLE_SKIP_POLLS;
                    continue;
                }
                p.generation = owner_gen(owner);
            }
            self.ready.push((c, head));
            total += avail as usize;
        }
        total
    }

    /// The next request of the last [`IpcServer::poll`] as `(token, message)`, in per-client
    /// order. A request longer than the request capacity is not returned: it is counted
    /// ([`IpcStats::bad_len`]) and answered with an empty message (the call fails to decode it
    /// and ends with an error). A request that reuses the call token of an unanswered call is
    /// dropped ([`IpcStats::token_reused`]).
    pub fn recv(&mut self) -> Option<(IpcToken, &[u8])> {
        let cap = self.layout.params.req_cap;
        while let Some(&(c, limit)) = self.ready.get(self.ready_at) {
            let p = &mut self.peers[c as usize];
            if p.cursor == limit || p.faulted {
                self.ready_at += 1;
                continue;
            }
            let slot = self.layout.req_slot(c, p.cursor);
            p.cursor += 1;
            if !p.unreleased {
                p.unreleased = true;
                self.unreleased.push(c);
            }
            let len = self.map.u32(slot + SLOT_LEN).load(Relaxed);
            let tag = self.map.u32(slot + SLOT_TAG).load(Relaxed);
            let token = IpcToken {
                client: c,
                generation: p.generation,
                tag,
            };
            let mask = self.layout.params.depth - 1;
            let pending = &mut self.pending[(c * (mask + 1) + (tag & mask)) as usize];
            if *pending != NO_TAG {
                // The client reused a call token whose call is still unanswered: a client
                // that follows the protocol never does (it frees a token only on delivery).
                // Dropped without an answer (an answer would carry the tag of the live call).
                self.stats.token_reused += 1;
                tracing::debug!(client = c, tag, "ipc: request on a busy call token dropped");
                continue;
            }
            *pending = u64::from(tag);
            p.outstanding += 1;
            if len > cap {
                self.reject_oversized(token, len);
                continue;
            }
            self.stats.received += 1;
            let len = len as usize;
            let src = self.map.bytes(slot + SLOT_PAYLOAD, len);
            // SAFETY: `src..src+len` is inside the mapping (checked by `bytes`; `len <= cap`
            // and the slot holds `cap` payload bytes); the client does not write this slot
            // until the server publishes a `req_tail` past it (`release`), and a client that
            // does anyway can only change the bytes copied, not their bounds.
            unsafe { std::ptr::copy_nonoverlapping(src, self.scratch.as_mut_ptr(), len) };
            return Some((token, &self.scratch[..len]));
        }
        None
    }

    /// Hands the private copy of the last request [`IpcServer::recv`] returned to the caller:
    /// swaps the server's request buffer with `buf` (replaced first by a buffer of the
    /// request capacity if it has another length, so the server's buffer always holds
    /// `req_cap` bytes, which `recv` copies into). No copy; no allocation once `buf` has that
    /// length.
    #[inline]
    pub fn swap_request(&mut self, buf: &mut crate::varlen::AlignedBuf) {
        if buf.len() != self.scratch.len() {
            *buf = crate::varlen::AlignedBuf::new(self.scratch.len());
        }
        std::mem::swap(&mut self.scratch, buf);
    }

    /// Publishes `req_tail` of every client a request was received from since the last call,
    /// letting those clients reuse the slots (seeds/004 §2.2 `advance_tail`, per ring).
    /// [`IpcServer::reply_with`] also publishes it, before the response; `release` matters
    /// for requests that are received and answered later, or dropped.
    ///
    /// It first wakes the clients replied to since the last call that sleep in
    /// [`Ipc::sleep_for_response`](super::Ipc::sleep_for_response) (one fence for all of them;
    /// module docs, "Sleeping").
    pub fn release(&mut self) {
        if !self.replied.is_empty() {
            self.wake_replied();
        }
        for c in self.unreleased.drain(..) {
            let p = &mut self.peers[c as usize];
            p.unreleased = false;
            if p.released != p.cursor {
                p.released = p.cursor;
                self.map
                    .u64(self.layout.block(c) + CB_REQ_TAIL)
                    .store(p.cursor, Release);
            }
        }
    }

    /// Writes a reply into the response ring of `token`'s client: `encode` fills a buffer of
    /// the response capacity and returns the message length. Source: seeds/004 §2.3
    /// "per-client SPSC レスポンスリング".
    ///
    /// # Errors
    /// [`RpcError::ReplyDropped`], counted in [`IpcStats`]: the token names no client block
    /// (`bad_tokens`); the client detached, died or was faulted since `recv` (`stale_replies`);
    /// no request with this token awaits a reply (`duplicate_replies`: a second reply to one
    /// call, or a token whose tag was altered); its response ring is
    /// full (`resp_ring_full`; impossible for a client that follows the protocol, which only
    /// issues with a free response slot); the message is longer than the capacity
    /// (`oversized_replies`).
    pub fn reply_with(
        &mut self,
        token: IpcToken,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), RpcError> {
        let Some(p) = self.peers.get(token.client as usize) else {
            self.stats.bad_tokens += 1;
            return Err(dropped("token names no client slot"));
        };
        if p.generation != token.generation || p.faulted {
            self.stats.stale_replies += 1;
            return Err(dropped("the client detached or died (stale token)"));
        }
        let mask = self.layout.params.depth - 1;
        let pending = (token.client * (mask + 1) + (token.tag & mask)) as usize;
        if self.pending[pending] != u64::from(token.tag) {
            self.stats.duplicate_replies += 1;
            return Err(dropped("no request with this token awaits a reply"));
        }
        let (c, head) = (token.client, p.resp_head);
        let block = self.layout.block(c);
        let tail = self.map.u64(block + CB_RESP_TAIL).load(Acquire);
        let used = head.wrapping_sub(tail);
        let depth = u64::from(self.layout.params.depth);
        if used > depth {
            self.fault(c, FAULT_RESP_TAIL);
            return Err(dropped("the client's response ring is corrupt"));
        }
        if used == depth {
            self.stats.resp_ring_full += 1;
            return Err(dropped("the client's response ring is full"));
        }
        let cap = self.layout.params.resp_cap as usize;
        let slot = self.layout.resp_slot(c, head);
        let ptr = self.map.bytes(slot + SLOT_PAYLOAD, cap);
        // SAFETY: in bounds (checked by `bytes`); this slot (position `head`, `head - tail <
        // depth`) is not read by the client until `resp_head` passes it, and only this server
        // writes response slots.
        let len = encode(unsafe { std::slice::from_raw_parts_mut(ptr, cap) });
        if len > cap {
            self.stats.oversized_replies += 1;
            return Err(dropped("response larger than the slot"));
        }
        self.map.u32(slot + SLOT_LEN).store(len as u32, Relaxed);
        self.map.u32(slot + SLOT_TAG).store(token.tag, Relaxed);
        // Requests are copied out at `recv`, so every slot up to the cursor is free: publish
        // `req_tail` before the response, so that a client that sees its call answered also
        // sees that call's request slot free (it then gets `WouldBlock` only with `depth`
        // calls in flight, not because the server has yet to `release`).
        let p = &mut self.peers[c as usize];
        if p.released != p.cursor {
            p.released = p.cursor;
            self.map.u64(block + CB_REQ_TAIL).store(p.cursor, Release);
        }
        self.map.u64(block + CB_RESP_HEAD).store(head + 1, Release);
        self.pending[pending] = NO_TAG;
        let p = &mut self.peers[c as usize];
        p.resp_head = head + 1;
        p.outstanding -= 1;
        self.stats.replied += 1;
        // Once clients may sleep, the client's sleep word is checked at the next `release`
        // (module docs, "Sleeping").
        if self.map.u32(OFF_CLIENT_SLEEP_ARMED).load(Relaxed) != 0 {
            let mark = &mut self.replied_mark[c as usize];
            if !*mark {
                *mark = true;
                self.replied.push(c);
            }
        }
        Ok(())
    }

    /// The server's half of a client's sleep (module docs, "Sleeping"): one SeqCst fence after
    /// the replies published since the last call, then each replied client's sleep word; a
    /// client found asleep is woken (counted in [`IpcStats::clients_woken`]).
    fn wake_replied(&mut self) {
        fence(SeqCst);
        for &c in &self.replied {
            self.replied_mark[c as usize] = false;
            let word = self.map.u32(self.layout.block(c) + CB_RESP_SLEEP);
            if word.load(Relaxed) != 0 && crate::futex::wake(word) {
                self.stats.clients_woken += 1;
            }
        }
        self.replied.clear();
    }

    /// Blocks the serving thread until a client publishes a request, at most `bound` (module
    /// docs, "Sleeping"). For a server whose polls found nothing; the caller decides when to
    /// sleep (the runner's park, or `rpc::erpc::idle::CallWait`).
    ///
    /// Returns `true` if it slept (woken, timed out, or the word changed before the wait;
    /// counted in [`IpcStats::idle_waits`]), `false` without sleeping: at the first call (it
    /// arms the clients' checks, [`OFF_SLEEP_ARMED`], and sleeps from the next call on), if a
    /// client's ring holds a request not yet received, or once `FUTEX_WAIT` was refused. First
    /// wakes the clients that wait for replies already published.
    pub fn wait_for_request(&mut self, bound: Duration) -> bool {
        let end = match self.prepare_sleep() {
            SleepPrep::Sleep(word) => crate::futex::wait(word, bound),
            SleepPrep::NotNow | SleepPrep::Unsupported => return false,
        };
        if end == crate::futex::WaitEnd::Unsupported {
            self.sleep_unsupported = true;
        }
        self.end_sleep(end == crate::futex::WaitEnd::Returned);
        end == crate::futex::WaitEnd::Returned
    }

    /// [`wait_for_request`](Self::wait_for_request) up to the sleep, for a caller that also
    /// waits on other words ([`crate::ServerTransport::prepare_sleep`]): wakes the clients
    /// replied to, arms the clients' checks at the first call (`NotNow`), then arms the
    /// server's word and checks for requests (`NotNow` if one is waiting).
    pub fn prepare_sleep(&mut self) -> SleepPrep<'_> {
        if !self.replied.is_empty() {
            self.wake_replied();
        }
        if self.sleep_unsupported {
            return SleepPrep::Unsupported;
        }
        if !self.armed {
            self.armed = true;
            self.map.u32(OFF_SLEEP_ARMED).store(1, SeqCst);
            return SleepPrep::NotNow;
        }
        self.map.u32(OFF_SERVER_SLEEP).swap(1, SeqCst);
        fence(SeqCst);
        if self.any_request() {
            self.map.u32(OFF_SERVER_SLEEP).store(0, Relaxed);
            return SleepPrep::NotNow;
        }
        SleepPrep::Sleep(self.map.u32(OFF_SERVER_SLEEP))
    }

    /// Ends a sleep armed by [`prepare_sleep`](Self::prepare_sleep): disarms the word and,
    /// if the caller `slept`, counts it and has the next poll read every block and the clock.
    pub fn end_sleep(&mut self, slept: bool) {
        self.map.u32(OFF_SERVER_SLEEP).store(0, Relaxed);
        if slept {
            self.stats.idle_waits += 1;
            for p in self.peers.iter_mut() {
                p.skip = 0;
            }
            self.polls_until_clock = 1;
        }
    }

    /// Whether a client block that is served has a request not yet received (its skip counter
    /// ignored).
    fn any_request(&self) -> bool {
        (0..self.layout.params.max_clients).any(|c| {
            let p = &self.peers[c as usize];
            !p.faulted
                && self
                    .map
                    .u64(self.layout.block(c) + CB_REQ_HEAD)
                    .load(Acquire)
                    != p.cursor
        })
    }

    /// A request whose length exceeds the capacity: counted ([`IpcStats::bad_len`]) and
    /// answered with an empty message, which the client's decoder rejects, so the call ends
    /// at once with an error and its call token is freed (a dropped request would hold the
    /// token until the client's deadline and beyond).
    #[cold]
    fn reject_oversized(&mut self, token: IpcToken, len: u32) {
        self.stats.bad_len += 1;
        tracing::debug!(
            client = token.client,
            len,
            "ipc: oversized request rejected"
        );
        let _ = self.reply_with(token, |_| 0);
    }

    /// Marks client `c`'s rings corrupt: counted, the code stored in its block (its next call
    /// fails with [`IpcError::ClientFault`]), and the block is not served until reclaimed.
    #[cold]
    fn fault(&mut self, c: u32, code: u32) {
        self.stats.ring_faults += 1;
        self.peers[c as usize].faulted = true;
        self.map
            .u32(self.layout.block(c) + CB_FAULT)
            .store(code, Release);
        tracing::warn!(path = %self.path.display(), client = c, code, "ipc: client rings corrupt");
    }

    /// Reclaims the blocks of detached clients and of `ACTIVE` ones whose owner lock is gone
    /// (the process died); runs every `liveness_interval` from `poll`, or on demand.
    #[cold]
    pub fn scan_clients(&mut self) {
        self.next_scan = Instant::now() + self.liveness;
        for c in 0..self.layout.params.max_clients {
            let block = self.layout.block(c);
            let owner = self.map.u64(block + CB_OWNER).load(Acquire);
            let dead = match owner_state(owner) {
                // A free block is normally clean; one left dirty (its owner word was
                // overwritten while a client held it) is reset unless someone is claiming it.
                STATE_FREE => {
                    self.dirty(c) && !shm::locked_by_other(&self.file, block as u64, RECORD_SIZE)
                }
                STATE_DETACHED => true,
                // ACTIVE, or an impossible state: reclaimed once no live process holds the
                // block's lock.
                _ => !shm::locked_by_other(&self.file, block as u64, RECORD_SIZE),
            };
            if dead {
                self.reclaim(c, owner);
            }
        }
    }

    /// Whether free block `c` differs from a fresh one (server-local state, fault word,
    /// counters).
    fn dirty(&self, c: u32) -> bool {
        let p = &self.peers[c as usize];
        let block = self.layout.block(c);
        p.generation != NO_GEN
            || p.cursor != 0
            || p.resp_head != 0
            || p.faulted
            || self.map.u32(block + CB_FAULT).load(Relaxed) != 0
            || [CB_REQ_HEAD, CB_REQ_TAIL, CB_RESP_HEAD, CB_RESP_TAIL]
                .iter()
                .any(|&off| self.map.u64(block + off).load(Relaxed) != 0)
    }

    /// Drops client `c`'s requests still in its rings or awaiting a reply (counted in
    /// `requests_dropped`), zeroes its counters and frees the block for the next owner
    /// (generation + 1).
    #[cold]
    fn reclaim(&mut self, c: u32, owner: u64) {
        let block = self.layout.block(c);
        let depth = u64::from(self.layout.params.depth);
        let p = self.peers[c as usize];
        let head = self.map.u64(block + CB_REQ_HEAD).load(Acquire);
        let queued = head.wrapping_sub(p.cursor).min(depth);
        self.stats.requests_dropped += queued + p.outstanding;
        for off in [CB_REQ_HEAD, CB_REQ_TAIL, CB_RESP_HEAD, CB_RESP_TAIL] {
            self.map.u64(block + off).store(0, Relaxed);
        }
        self.map.u32(block + CB_RESP_SLEEP).store(0, Relaxed);
        self.map.u32(block + CB_FAULT).store(0, Relaxed);
        self.peers[c as usize] = PEER0;
        let d = self.layout.params.depth as usize;
        self.pending[c as usize * d..(c as usize + 1) * d].fill(NO_TAG);
        self.ready.retain(|&(r, _)| r != c);
        let free = owner_word(STATE_FREE, owner_gen(owner).wrapping_add(1), 0);
        if self
            .map
            .u64(block + CB_OWNER)
            .compare_exchange(owner, free, AcqRel, Relaxed)
            .is_ok()
        {
            self.stats.clients_reclaimed += 1;
        }
        tracing::debug!(
            client = c,
            queued,
            outstanding = p.outstanding,
            "ipc: client reclaimed"
        );
    }
}

#[cold]
fn dropped(why: &'static str) -> RpcError {
    RpcError::ReplyDropped(why)
}

/// Links the built segment at `path`, replacing a stale file of this user (one no live server
/// holds the header lock of).
fn publish(tmp: &std::path::Path, path: &std::path::Path) -> Result<(), IpcError> {
    for _ in 0..8 {
        match std::fs::hard_link(tmp, path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(path, "link")(e)),
        }
        let Some(old) = shm::open_checked(path, false)? else {
            continue;
        };
        if shm::locked_by_other(&old, 0, SERVER_LOCK_LEN) {
            let pid = header::read_and_validate(&old, path)
                .map(|h| h.server_pid)
                .unwrap_or(0);
            return Err(IpcError::InUse {
                path: path.to_path_buf(),
                pid,
            });
        }
        let _ = std::fs::remove_file(path);
    }
    Err(IpcError::InUse {
        path: path.to_path_buf(),
        pid: 0,
    })
}

impl Drop for IpcServer {
    fn drop(&mut self) {
        self.map.u8(OFF_SERVER_ALIVE).store(0, Release);
        if let (Ok(a), Ok(b)) = (self.file.metadata(), std::fs::metadata(&self.path)) {
            use std::os::unix::fs::MetadataExt;
            if a.dev() == b.dev() && a.ino() == b.ino() {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

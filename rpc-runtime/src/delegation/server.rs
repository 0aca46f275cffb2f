//! The single consumer of the ring: [`RingServer`]. Source: seeds/004 §2.2 (Server poll / recv /
//! advance_tail / reply), plus the hole and reclaim logic described in the module docs.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicU64, fence};
use std::time::{Duration, Instant};

use super::config::{RingConfig, RingInfo};
use super::error::{RingError, RingFault, RingReplyError};
use super::header::{self, Header};
use super::layout::*;
use super::shm::{self, ShmMap};
use super::sleep;
use super::stats::RingStats;

/// Identifies the response slot a reply goes to, and the incarnation of the client id that
/// asked (so a reply to a client that has since gone away is refused, not misdelivered).
///
/// Obtained from [`RingServer::recv`]; pass it to [`RingServer::reply`] exactly once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReplyToken {
    /// The sender's client id (`< max_clients`). Source: seeds/004 §2.1 Request Ring Slot +4.
    pub client_id: u32,
    /// Generation of the sender's client record when the request was received (extension).
    pub generation: u32,
    /// The response slot the sender waits on (`< resp_depth`). Source: seeds/004 §2.1 +8.
    pub resp_slot_idx: u32,
    /// Low 16 bits of the request's ring position, written with the reply
    /// ([`RESP_TAG`](super::layout::RESP_TAG)) so the client can tell the answer to its own call from a stray
    /// one (extension).
    pub call_tag: u16,
}

/// A request taken out of the ring by [`RingServer::recv`]. Source: seeds/004 §2.2 recv step 5.
#[derive(Debug)]
pub struct RecvEntry<'a> {
    /// Where to send the reply.
    pub token: ReplyToken,
    /// The request bytes (`payload_len` bytes), copied out of the slot into a server-owned
    /// buffer that stays valid until the next call on the server.
    pub payload: &'a [u8],
}

/// Number of `poll` calls between clock reads for the periodic reclaim scan.
const POLLS_PER_CLOCK_CHECK: u32 = 1024;
/// `death_noticed` value for "alive, or not yet seen dead".
const NOT_NOTICED: u64 = u64::MAX;
/// `held_by` value for "the holder is unknown" (a live client was between `RESERVING` and
/// storing its position when the server skipped the hole).
const UNKNOWN_HOLDER: u32 = u32::MAX;
/// `held_pos` value for "the slot is not held".
const NOT_HELD: u64 = u64::MAX;

/// Who reserved the position of a hole, as far as the client table tells.
#[derive(Clone, Copy, Debug, Default)]
struct HoleOwner {
    /// A live client whose `reserving_pos` is the hole's position.
    live: Option<u32>,
    /// A live client between `RESERVING` and storing its position (it may be the owner).
    live_reserving: bool,
    /// A dead client whose `reserving_pos` is the hole's position.
    dead: Option<u32>,
}

/// The server (single consumer) end of a delegation ring: creates `/dev/shm/NAME`, receives
/// requests in ring order and writes replies directly into the clients' response slots.
///
/// Typical loop (seeds/004 §5 Phase 2):
/// ```no_run
/// # use rpc_runtime::delegation::{RingServer, RingConfig};
/// let mut server = RingServer::create("kv0", &RingConfig::default())?;
/// loop {
///     if server.poll() == 0 { std::hint::spin_loop(); continue; }
///     while let Some(entry) = server.recv() {
///         let (token, reply) = (entry.token, entry.payload.to_vec());
///         let _ = server.reply(token, &reply);
///     }
///     server.advance_tail();
/// }
/// # Ok::<(), rpc_runtime::delegation::RingError>(())
/// ```
///
/// Dropping the server shuts the ring down: `server_alive = false`, the file is unlinked and
/// the server lock is released; attached clients then get
/// [`RingCallError::ServerDisconnected`](super::RingCallError::ServerDisconnected).
pub struct RingServer {
    name: String,
    path: PathBuf,
    /// The server's open file description; holds the OFD write lock on the header.
    file: File,
    map: ShmMap,
    layout: Layout,
    fingerprint: u64,
    hole_timeout: Duration,
    stall_timeout: Duration,
    liveness_interval: Duration,
    /// `ring_depth + 4 * max_clients`: beyond this distance from the cursor, `head` is
    /// impossible (see [`RingFault::HeadTooFarAhead`]).
    max_ahead: u64,
    /// The value of the last `advance_tail` (only the server writes `tail`).
    tail_published: u64,
    /// Set once the ring is marked failed: the server then serves nothing.
    fault: Option<RingFault>,
    /// Next position to consume. Source: seeds/004 §2.2 (`cursor`).
    cursor: u64,
    /// `recv` returns entries only below this position: the cursor plus the committed entries
    /// the last `poll` counted, at most `ring_depth` (in the role of the seed's `cached_head`,
    /// bounded so that the flag at a physical slot can only belong to the position being
    /// examined).
    limit: u64,
    /// Copy of the current request's payload (`req_payload_cap` bytes).
    scratch: crate::varlen::AlignedBuf,
    /// One bit per response slot (`client_id * resp_depth + slot`): a request was received on
    /// it and not yet answered. Guards against duplicate replies.
    pending: Box<[u64]>,
    stats: RingStats,
    polls_until_clock: u32,
    /// Whether the last `poll` found committed entries (the next one then scans the sequence
    /// words before reading `head`).
    busy: bool,
    next_reclaim_scan: Instant,
    /// The hole at `cursor` and when it was first seen.
    hole: Option<(u64, Instant)>,
    /// When the hole at `cursor` is examined next (the scan makes system calls).
    next_hole_check: Instant,
    /// Per slot: the position the server skipped while its live writer stalled, as long as
    /// that writer may still write the slot (`NOT_HELD` otherwise). See the module docs.
    held_pos: Box<[u64]>,
    /// Per slot: the client id of the writer of `held_pos` (`UNKNOWN_HOLDER` if unknown).
    held_by: Box<[u32]>,
    /// Number of slots with `held_pos != NOT_HELD`.
    held_count: usize,
    /// Per client id: `head` observed when the owner was first seen detached or dead.
    death_noticed: Box<[u64]>,
    /// Client ids replied to since the last check of their sleep words (module `sleep`).
    replied: Vec<u32>,
    /// Per client id: in `replied`.
    replied_mark: Box<[bool]>,
    /// `FUTEX_WAIT` was refused once: `wait_for_request` no longer sleeps.
    sleep_unsupported: bool,
}

impl RingServer {
    /// Creates the ring file `/dev/shm/NAME` (`name` is `"kv0"` or `"/kv0"`), mode 0600, and
    /// starts serving it.
    ///
    /// The file is initialized under a temporary name, locked, and then `link`ed into place, so
    /// a client never sees a half-initialized ring. The file is created `O_EXCL` and its mode
    /// set to exactly 0600 with `fchmod`, whatever the umask. If `NAME` already exists and a
    /// live server holds its lock, fails with [`RingError::AlreadyExists`]; if it belongs to
    /// another user (or is a symbolic link), fails with [`RingError::UnsafeFile`] and leaves it
    /// alone; if it is this user's and no live server holds it (a crashed server's leftover,
    /// or garbage), it is replaced.
    pub fn create(name: &str, cfg: &RingConfig) -> Result<Self, RingError> {
        let (name, path) = shm::shm_path(name)?;
        let layout = Layout::new(cfg.layout_params())
            .map_err(|e| RingError::InvalidConfig { reason: e.0 })?;
        let liveness_ns = u64::try_from(cfg.liveness_interval.as_nanos()).unwrap_or(u64::MAX);
        if liveness_ns == 0 || liveness_ns > MAX_LIVENESS_INTERVAL_NS {
            return Err(RingError::InvalidConfig {
                reason: format!(
                    "liveness_interval = {:?} must be in (0, 60 s]",
                    cfg.liveness_interval
                ),
            });
        }
        if cfg.stall_timeout.is_zero() || cfg.stall_timeout > Duration::from_secs(60) {
            return Err(RingError::InvalidConfig {
                reason: format!(
                    "stall_timeout = {:?} must be in (0, 60 s]",
                    cfg.stall_timeout
                ),
            });
        }
        let io = |path: &PathBuf, op| {
            let path = path.clone();
            move |source| RingError::Io { path, op, source }
        };

        // 1. Build the ring under a unique temporary name.
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        let (tmp, file) = {
            let mut attempt = 0;
            loop {
                let tmp = path.with_file_name(format!(
                    ".{name}.tmp.{pid}.{}",
                    COUNTER.fetch_add(1, Relaxed)
                ));
                match shm::create_exclusive(&tmp) {
                    Ok(file) => break (tmp, file),
                    // A leftover of a crashed process with a recycled pid: try another name.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 8 => {
                        attempt += 1
                    }
                    Err(e) => return Err(io(&tmp, "create")(e)),
                }
            }
        };
        let built = (|| {
            file.set_len(layout.total_size)
                .map_err(io(&tmp, "ftruncate"))?;
            let map = ShmMap::map(&file, layout.total_size).map_err(io(&tmp, "mmap"))?;
            header::init(&map, &layout, cfg, liveness_ns, pid);
            if !shm::try_lock_write(&file, SERVER_LOCK_START, SERVER_LOCK_LEN)
                .map_err(io(&tmp, "fcntl(F_OFD_SETLK)"))?
            {
                return Err(RingError::AlreadyExists {
                    path: tmp.clone(),
                    pid: 0,
                });
            }
            // 2. Publish it under the real name.
            publish(&tmp, &path)?;
            Ok(map)
        })();
        let _ = std::fs::remove_file(&tmp);
        let map = built?;

        let p = layout.params;
        let slots = p.max_clients as usize * p.resp_depth as usize;
        let now = Instant::now();
        tracing::debug!(path = %path.display(), ?layout, "delegation ring created");
        Ok(Self {
            name,
            path,
            file,
            map,
            layout,
            fingerprint: cfg.fingerprint,
            hole_timeout: cfg.hole_timeout,
            stall_timeout: cfg.stall_timeout,
            liveness_interval: cfg.liveness_interval,
            max_ahead: super::client::max_ahead(p.ring_depth, p.max_clients),
            tail_published: 0,
            fault: None,
            cursor: 0,
            limit: 0,
            scratch: crate::varlen::AlignedBuf::new(p.req_payload_cap as usize),
            pending: vec![0u64; slots.div_ceil(64)].into_boxed_slice(),
            stats: RingStats::default(),
            polls_until_clock: POLLS_PER_CLOCK_CHECK,
            busy: false,
            next_reclaim_scan: now + cfg.liveness_interval,
            hole: None,
            next_hole_check: now,
            held_pos: vec![NOT_HELD; p.ring_depth as usize].into_boxed_slice(),
            held_by: vec![UNKNOWN_HOLDER; p.ring_depth as usize].into_boxed_slice(),
            held_count: 0,
            death_noticed: vec![NOT_NOTICED; p.max_clients as usize].into_boxed_slice(),
            replied: Vec::with_capacity(p.max_clients as usize),
            replied_mark: vec![false; p.max_clients as usize].into_boxed_slice(),
            sleep_unsupported: false,
        })
    }

    /// The ring's name, without the leading `/` (the file is `/dev/shm/<name>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ring's parameters.
    pub fn info(&self) -> RingInfo {
        Header {
            layout: self.layout,
            fingerprint: self.fingerprint,
            liveness_interval: self.liveness_interval,
            server_pid: 0,
        }
        .info()
    }

    /// Counters since creation.
    pub fn stats(&self) -> &RingStats {
        &self.stats
    }

    /// The fault the ring was marked failed with (by this server or a client), if any. A
    /// failed ring serves nothing more: `poll` returns 0 and `recv` `None`; drop the server and
    /// create the ring again.
    pub fn fault(&self) -> Option<RingFault> {
        self.fault
    }

    /// Scans for committed requests. Source: seeds/004 §2.2 Server poll().
    ///
    /// Counts the committed entries (sequence word `COMMITTED(pos)`, the seed's
    /// `committed == 1`) from the cursor up to the first position that is not committed,
    /// scanning at most `ring_depth` positions. Returns that count; [`recv`](Self::recv) then
    /// takes them out.
    ///
    /// **A busy server does not read `head`** (extension: the seed snapshots `head` first on
    /// every poll). After a poll that found entries, the next one counts the sequence words
    /// from the cursor first: a word names its lap's position, so `COMMITTED(pos)` alone
    /// proves the entry reserved and whole, and the count stops at the first position without
    /// it, as the seed's scan stops at a hole. Only if that finds nothing (and always when
    /// the last poll found nothing) does the poll take the seed's path: snapshot `head`, then
    /// count up to it. Every client reserves with a `fetch_add` on `head`, so a server that
    /// loaded it on every poll pulled that cache line away from the clients each time; an idle
    /// server keeps reading `head` rather than the next slot, so that it does not pull the
    /// line a client is writing (measured: `cargo bench --bench ring_vs_crossbeam`, QD 32
    /// 2.19-2.28x crossbeam before, 2.39-2.54x after; QD 1 unchanged within noise).
    ///
    /// A `head` behind the cursor or more than `ring_depth + 4 * max_clients` ahead of it is
    /// impossible: the ring is marked failed ([`RingFault`], [`RingStats::ring_faults`]) and
    /// this and every later poll returns 0. A busy server finds it at the first poll that
    /// finds nothing committed at the cursor; the committed entries before it are served.
    ///
    /// Also drives the cold paths: if the cursor itself is a hole, it is examined every
    /// `min(hole_timeout, stall_timeout)`, and skipped once its reserving client is dead (or
    /// unknown) or it is older than `stall_timeout`; and every `liveness_interval` (clock read
    /// every 1024 polls) ids of detached or dead clients are reclaimed and `tail` and the
    /// header's fault byte are checked. See the module docs.
    #[inline]
    pub fn poll(&mut self) -> usize {
        if self.fault.is_some() {
            return 0;
        }
        let depth = u64::from(self.layout.params.ring_depth);
        // Busy (the last poll found entries): scan the sequence words without reading `head`.
        let mut n = if self.busy {
            self.count_committed(depth)
        } else {
            0
        };
        if n == 0 {
            // Idle, or the busy scan found nothing: the seed's path, `head` first, so that an
            // idle server touches no slot that a client may be writing.
            let head = self.map.hdr_u64::<OFF_HEAD>().load(Acquire);
            // Wrapping: a `head` behind the cursor shows up as a huge distance.
            let ahead = head.wrapping_sub(self.cursor);
            if ahead > self.max_ahead {
                self.bad_head(head);
                return 0;
            }
            let avail = ahead.min(depth);
            n = self.count_committed(avail);
            if n == 0 && avail != 0 {
                self.on_hole();
            }
        }
        self.limit = self.cursor + n;
        self.busy = n != 0;
        self.polls_until_clock -= 1;
        if self.polls_until_clock == 0 {
            self.periodic();
        }
        n as usize
    }

    /// The committed entries from the cursor on, at most `max`: the positions whose sequence
    /// word is `COMMITTED(pos)`, up to the first that is not.
    #[inline]
    fn count_committed(&self, max: u64) -> u64 {
        let mut n = 0;
        while n < max {
            let pos = self.cursor + n;
            let seq = self.map.u64_at(self.layout.seq_offset(pos));
            if seq.load(Acquire) != seq_word(pos, SEQ_COMMITTED) {
                break;
            }
            n += 1;
        }
        n
    }

    /// Takes the next committed request out of the ring. Source: seeds/004 §2.2 Server recv().
    ///
    /// Returns `None` at the position limit of the last [`poll`](Self::poll) or at a hole.
    /// Otherwise reads `client_id`, `resp_slot_idx`, `payload_len`, validates them, copies the
    /// payload into a server-owned buffer, frees the slot for the next lap (sequence word
    /// `FREE(pos + ring_depth)`, Release; the seed's `committed = 0`) and advances the cursor.
    /// Invalid entries (client id out of range, client not `ACTIVE`, response slot out of
    /// range, length above the capacity) are consumed, counted in [`RingStats`], and skipped.
    #[inline]
    pub fn recv(&mut self) -> Option<RecvEntry<'_>> {
        loop {
            if self.cursor >= self.limit {
                return None;
            }
            let p = self.layout.params;
            let pos = self.cursor;
            let off = self.layout.req_slot_offset(pos);
            let seq = self.map.u64_at(self.layout.seq_offset(pos));
            if seq.load(Acquire) != seq_word(pos, SEQ_COMMITTED) {
                return None;
            }
            let client_id = self.map.u32_at(off + SLOT_CLIENT_ID).load(Relaxed);
            let slot_idx = self.map.u32_at(off + SLOT_RESP_SLOT_IDX).load(Relaxed);
            let len = self.map.u32_at(off + SLOT_PAYLOAD_LEN).load(Relaxed);
            let mut generation = 0;
            let ok = client_id < p.max_clients
                && slot_idx < p.resp_depth
                && len <= p.req_payload_cap
                && {
                    let rec = self.layout.record_offset(client_id);
                    generation = self.map.u32_at(rec + REC_GENERATION).load(Relaxed);
                    self.map.u32_at(rec + REC_STATE).load(Acquire) == CLIENT_ACTIVE
                };
            if ok {
                let src = self.map.bytes(off + SLOT_PAYLOAD, len as usize);
                // SAFETY: `src` is `len <= req_payload_cap` in-bounds bytes of the slot's payload
                // area (checked by `bytes`); `scratch` holds `req_payload_cap` bytes and does not
                // overlap the mapping. The slot is committed and owned by the server until it
                // frees it below: its writer finished before its Release commit, which the
                // Acquire load above synchronizes with, and no writer may claim the slot before
                // it holds `FREE` of the next lap.
                unsafe {
                    std::ptr::copy_nonoverlapping(src, self.scratch.as_mut_ptr(), len as usize)
                };
            }
            seq.store(seq_word(pos + u64::from(p.ring_depth), SEQ_FREE), Release);
            self.cursor += 1;
            if ok {
                let bit = client_id as usize * p.resp_depth as usize + slot_idx as usize;
                self.pending[bit / 64] |= 1 << (bit % 64);
                self.stats.received += 1;
                return Some(RecvEntry {
                    token: ReplyToken {
                        client_id,
                        generation,
                        resp_slot_idx: slot_idx,
                        call_tag: pos as u16,
                    },
                    payload: &self.scratch[..len as usize],
                });
            }
            self.count_invalid(client_id, slot_idx, len);
        }
    }

    /// [`RingServer::recv`] into a buffer the caller owns: the server's private copy of the
    /// next request is swapped with `buf` (replaced first by a buffer of the request payload
    /// capacity if it has another length, so the server's buffer always holds
    /// `req_payload_cap` bytes, which `recv` copies into), and `(token, len)` returned; the
    /// request is `buf[..len]`. No copy; no allocation once `buf` has that length. `None` as
    /// for `recv`.
    #[inline]
    pub fn recv_into(
        &mut self,
        buf: &mut crate::varlen::AlignedBuf,
    ) -> Option<(ReplyToken, usize)> {
        let (token, len) = {
            let e = self.recv()?;
            (e.token, e.payload.len())
        };
        if buf.len() != self.scratch.len() {
            *buf = crate::varlen::AlignedBuf::new(self.scratch.len());
        }
        std::mem::swap(&mut self.scratch, buf);
        Some((token, len))
    }

    /// [`RingServer::recv`] and [`RingServer::reply_with`] in one step: `handle(request,
    /// reply_buf)` reads the server's private copy of the request and writes the response
    /// straight into the client's response slot, returning its length. `None` when no request
    /// is available. `handle` does not run if the reply cannot be delivered (the errors of
    /// [`RingServer::reply_with`] other than `PayloadTooLarge`).
    #[inline]
    pub fn recv_reply(
        &mut self,
        handle: impl FnOnce(&[u8], &mut [u8]) -> usize,
    ) -> Option<Result<(), RingReplyError>> {
        let (token, len) = {
            let e = self.recv()?;
            (e.token, e.payload.len())
        };
        // Moved out for the reply (no allocation: the default is empty) so that the request
        // can be read while `reply_with` borrows the server; `reply_with` never touches it.
        let req = std::mem::take(&mut self.scratch);
        let r = self.reply_with(token, |out| handle(&req[..len], out));
        self.scratch = req;
        Some(r)
    }

    /// Publishes the cursor as the new `tail` (Release), letting clients reuse the consumed
    /// slots. Source: seeds/004 §2.2 Server advance_tail().
    ///
    /// Does nothing if the cursor has not moved since the last call (so idle rounds do not
    /// invalidate the clients' cached copy of `tail`). Before storing, checks that `tail` still
    /// holds the value it last published (only the server writes it): if not, the ring is
    /// marked failed ([`RingFault::TailCorrupt`]) and nothing is stored.
    ///
    /// It first wakes the clients replied to since the last call that sleep in
    /// [`RingClient::wait_for_response`](super::RingClient::wait_for_response) (one fence for
    /// all of them; module `sleep`).
    #[inline]
    pub fn advance_tail(&mut self) {
        if !self.replied.is_empty() {
            self.wake_replied();
        }
        if self.cursor == self.tail_published {
            return;
        }
        let tail = self.map.hdr_u64::<OFF_TAIL>();
        if tail.load(Relaxed) != self.tail_published {
            self.bad_tail();
            return;
        }
        tail.store(self.cursor, Release);
        self.tail_published = self.cursor;
    }

    #[cold]
    #[inline(never)]
    fn bad_tail(&mut self) {
        tracing::error!(ring = %self.name, published = self.tail_published, "tail changed");
        self.fail(RingFault::TailCorrupt);
    }

    /// Writes `payload` into the response slot named by `token` and sets `valid` (Release).
    /// Source: seeds/004 §2.2 Server reply().
    ///
    /// Errors (the reply is dropped and nothing is written): [`RingReplyError::PayloadTooLarge`] if
    /// `payload` exceeds `resp_payload_cap`; otherwise as [`reply_with`](Self::reply_with).
    #[inline]
    pub fn reply(&mut self, token: ReplyToken, payload: &[u8]) -> Result<(), RingReplyError> {
        let cap = self.layout.params.resp_payload_cap as usize;
        if payload.len() > cap {
            return Err(RingReplyError::PayloadTooLarge {
                len: payload.len(),
                cap,
            });
        }
        self.reply_with(token, |buf| {
            buf[..payload.len()].copy_from_slice(payload);
            payload.len()
        })
    }

    /// Like [`reply`](Self::reply), but `write` fills the slot's payload area
    /// (`resp_payload_cap` bytes, directly in shared memory) and returns the number of bytes
    /// used.
    ///
    /// Errors: [`RingReplyError::BadToken`] if the token's `client_id` or `resp_slot_idx` is out of
    /// range; [`RingReplyError::StaleToken`] if the client is no longer `ACTIVE`, its generation
    /// changed (the id was reclaimed), or this token was already answered;
    /// [`RingReplyError::SlotBusy`] if the slot still holds an unread response;
    /// [`RingReplyError::PayloadTooLarge`] if `write` returns more than the capacity (nothing is
    /// published and the token stays valid). `write` is only called if none of the first three
    /// apply.
    #[inline]
    pub fn reply_with(
        &mut self,
        token: ReplyToken,
        write: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), RingReplyError> {
        let p = self.layout.params;
        if token.client_id >= p.max_clients || token.resp_slot_idx >= p.resp_depth {
            return Err(RingReplyError::BadToken);
        }
        let bit = token.client_id as usize * p.resp_depth as usize + token.resp_slot_idx as usize;
        let rec = self.layout.record_offset(token.client_id);
        if self.pending[bit / 64] & (1 << (bit % 64)) == 0
            || self.map.u32_at(rec + REC_STATE).load(Acquire) != CLIENT_ACTIVE
            || self.map.u32_at(rec + REC_GENERATION).load(Relaxed) != token.generation
        {
            return Err(self.stale_reply());
        }
        let off = self
            .layout
            .resp_slot_offset(token.client_id, token.resp_slot_idx);
        if self.map.u8_at(off + RESP_VALID).load(Acquire) != 0 {
            return Err(self.slot_busy());
        }
        let cap = p.resp_payload_cap as usize;
        let dst = self.map.bytes(off + RESP_PAYLOAD, cap);
        // SAFETY: `dst` is the slot's in-bounds payload area of `cap` bytes (checked by `bytes`).
        // The server has exclusive access to it: `valid == 0` (Acquire, pairing with the
        // client's Release clear after its copy-out) so the client is not reading it, and the
        // client only reads it after seeing `valid == 1`, which is stored below, after `write`.
        let len = write(unsafe { std::slice::from_raw_parts_mut(dst, cap) });
        if len > cap {
            return Err(RingReplyError::PayloadTooLarge { len, cap });
        }
        self.map
            .u32_at(off + RESP_PAYLOAD_LEN)
            .store(len as u32, Relaxed);
        self.map
            .u16_at(off + RESP_TAG)
            .store(token.call_tag, Relaxed);
        fence(Release);
        self.map.u8_at(off + RESP_VALID).store(1, Release);
        self.pending[bit / 64] &= !(1 << (bit % 64));
        self.stats.replied += 1;
        // Once clients may sleep, the client's sleep word is checked at the next
        // `advance_tail` (module `sleep`).
        if self.map.hdr_u32::<OFF_CLIENT_SLEEP_ARMED>().load(Relaxed) != 0 {
            let mark = &mut self.replied_mark[token.client_id as usize];
            if !*mark {
                *mark = true;
                self.replied.push(token.client_id);
            }
        }
        Ok(())
    }

    /// The server's half of a client's sleep (module `sleep`): one SeqCst fence after the
    /// replies published since the last call, then each replied client's sleep word; a
    /// client found asleep is woken (counted in [`RingStats::clients_woken`]).
    #[inline]
    fn wake_replied(&mut self) {
        fence(SeqCst);
        for &id in &self.replied {
            self.replied_mark[id as usize] = false;
            let word = self.map.u32_at(self.layout.record_offset(id) + REC_SLEEP);
            if word.load(Relaxed) != 0 && sleep::wake(word) {
                self.stats.clients_woken += 1;
            }
        }
        self.replied.clear();
    }

    /// Blocks the serving thread until a client commits a request, at most `bound` (module
    /// `sleep`: the server's word [`OFF_SERVER_SLEEP`]). For a server that found nothing in
    /// its polls; the caller decides when to sleep (e.g. `rpc::erpc::idle::CallWait`, or the
    /// runner's park).
    ///
    /// Returns `true` if it slept (woken, timed out, or the word changed before the wait;
    /// counted in [`RingStats::idle_waits`]), `false` without sleeping: the ring is failed,
    /// `FUTEX_WAIT` was refused once (never tried again), or an entry is reserved past the
    /// cursor (committed since the last poll, being written, or a hole the next polls
    /// examine). First wakes the clients that wait for replies already published.
    pub fn wait_for_request(&mut self, bound: Duration) -> bool {
        let end = match self.prepare_sleep() {
            crate::server::SleepPrep::Sleep(word) => sleep::wait(word, bound),
            _ => return false,
        };
        if end == sleep::WaitEnd::Unsupported {
            self.sleep_unsupported = true;
        }
        self.end_sleep(end == sleep::WaitEnd::Returned);
        end == sleep::WaitEnd::Returned
    }

    /// [`wait_for_request`](Self::wait_for_request) up to the sleep, for a caller that also
    /// waits on other words (`ServerTransport::prepare_sleep`): wakes the clients replied
    /// to, then arms the server's word and checks `head` (`NotNow` if an entry is reserved).
    pub fn prepare_sleep(&mut self) -> crate::server::SleepPrep<'_> {
        use crate::server::SleepPrep;
        if !self.replied.is_empty() {
            self.wake_replied();
        }
        if self.fault.is_some() || self.sleep_unsupported {
            return SleepPrep::Unsupported;
        }
        let word = self.map.hdr_u32::<OFF_SERVER_SLEEP>();
        word.swap(1, SeqCst);
        if self.map.hdr_u64::<OFF_HEAD>().load(SeqCst) != self.cursor {
            word.store(0, Relaxed);
            return SleepPrep::NotNow;
        }
        SleepPrep::Sleep(self.map.hdr_u32::<OFF_SERVER_SLEEP>())
    }

    /// Ends a sleep armed by [`prepare_sleep`](Self::prepare_sleep): disarms the word and,
    /// if the caller `slept`, counts it and has the next poll read the clock.
    pub fn end_sleep(&mut self, slept: bool) {
        self.map.hdr_u32::<OFF_SERVER_SLEEP>().store(0, Relaxed);
        if slept {
            self.stats.idle_waits += 1;
            self.polls_until_clock = 1;
        }
    }

    #[cold]
    fn stale_reply(&mut self) -> RingReplyError {
        self.stats.stale_replies += 1;
        RingReplyError::StaleToken
    }

    #[cold]
    fn slot_busy(&mut self) -> RingReplyError {
        self.stats.resp_slot_busy += 1;
        RingReplyError::SlotBusy
    }

    /// Classifies and counts a consumed invalid entry.
    #[cold]
    #[inline(never)]
    fn count_invalid(&mut self, client_id: u32, slot_idx: u32, len: u32) {
        let p = self.layout.params;
        let s = &mut self.stats;
        if len == ABORTED_PAYLOAD_LEN {
            s.aborted += 1;
            return;
        }
        let what = if client_id >= p.max_clients {
            s.bad_client_id += 1;
            "client_id out of range"
        } else if self
            .map
            .u32_at(self.layout.record_offset(client_id) + REC_STATE)
            .load(Acquire)
            != CLIENT_ACTIVE
        {
            s.inactive_client += 1;
            "client not active"
        } else if slot_idx >= p.resp_depth {
            s.bad_resp_slot += 1;
            "resp_slot_idx out of range"
        } else {
            s.bad_payload_len += 1;
            "payload_len above capacity"
        };
        tracing::debug!(
            ring = %self.name, client_id, slot_idx, len,
            "dropped invalid delegation ring entry: {what}"
        );
    }

    /// `head` is behind the cursor or impossibly far ahead: mark the ring failed.
    #[cold]
    #[inline(never)]
    fn bad_head(&mut self, head: u64) {
        let fault = if head < self.cursor {
            RingFault::HeadBehindTail
        } else {
            RingFault::HeadTooFarAhead
        };
        tracing::error!(ring = %self.name, head, cursor = self.cursor, "impossible head");
        self.fail(fault);
    }

    /// Marks the ring failed with `fault` (the header's fault byte keeps the first fault
    /// anyone found): clients fail every call and poll at once, the server serves nothing.
    #[cold]
    #[inline(never)]
    fn fail(&mut self, fault: RingFault) {
        if self.fault.is_some() {
            return;
        }
        self.stats.ring_faults += 1;
        let stored = match self.map.hdr_u8::<OFF_RING_FAULT>().compare_exchange(
            0,
            fault.code(),
            Release,
            Acquire,
        ) {
            Ok(_) => fault,
            Err(code) => RingFault::from_code(code).unwrap_or(fault),
        };
        self.fault = Some(stored);
        self.limit = self.cursor;
        tracing::error!(ring = %self.name, %fault, "delegation ring corrupt; marked failed");
    }

    /// Slow checks of the ring control: `tail` must still be what the server published, and
    /// a fault found by a client (header byte) stops the server too.
    #[cold]
    fn check_control(&mut self) {
        if self.fault.is_some() {
            return;
        }
        let code = self.map.hdr_u8::<OFF_RING_FAULT>().load(Acquire);
        if let Some(f) = RingFault::from_code(code) {
            tracing::error!(ring = %self.name, fault = %f, "delegation ring marked failed by a client");
            self.fault = Some(f);
            self.limit = self.cursor;
            return;
        }
        if self.map.hdr_u64::<OFF_TAIL>().load(Acquire) != self.tail_published {
            self.bad_tail();
        }
    }

    /// The cursor is at a hole. Times it; every `min(hole_timeout, stall_timeout)` after it
    /// was first seen, tries to resolve it.
    #[cold]
    #[inline(never)]
    fn on_hole(&mut self) {
        if self.held_count != 0 && self.held_pos[self.slot_of(self.cursor)] != NOT_HELD {
            // The cursor's slot is held by a stalled writer of an earlier lap: the cursor's own
            // writer will never write it, so pass it now (no clock, no owner scan).
            self.resolve_holes(Duration::ZERO);
            return;
        }
        let now = Instant::now();
        let interval = self.hole_timeout.min(self.stall_timeout);
        match self.hole {
            Some((pos, since)) if pos == self.cursor => {
                if now >= self.next_hole_check {
                    self.next_hole_check = now + interval;
                    self.check_control();
                    if self.fault.is_none() {
                        self.resolve_holes(now.duration_since(since));
                    }
                }
            }
            _ => {
                self.hole = Some((self.cursor, now));
                self.next_hole_check = now + interval;
            }
        }
    }

    /// Skips the holes at the cursor that may be skipped (see the module docs, "Holes"):
    ///
    /// * a position whose slot is held by a stalled writer of an earlier lap: at once (after
    ///   trying to release the slot);
    /// * a position whose reserving client is dead, or unknown: the slot goes straight to the
    ///   next lap (CAS `FREE(pos)` → `FREE(pos + ring_depth)`, so a commit that lands meanwhile
    ///   wins and is served);
    /// * if the first hole is older than `stall_timeout` (`age`), that one whatever its owner:
    ///   a live owner may still write the slot, so the server does not touch the word and
    ///   *holds* the slot (`held_pos`) until the owner has moved on ([`Self::try_release`]).
    ///
    /// Stops at the first hole that must still wait.
    #[cold]
    #[inline(never)]
    fn resolve_holes(&mut self, age: Duration) {
        let depth = u64::from(self.layout.params.ring_depth);
        // Bounded, so that a scribbled `head` cannot keep the server here.
        for i in 0..2 * depth {
            let head = self.map.hdr_u64::<OFF_HEAD>().load(Acquire);
            let pos = self.cursor;
            if head <= pos {
                return;
            }
            let slot = self.slot_of(pos);
            if self.held_pos[slot] != NOT_HELD {
                if self.try_release(slot) {
                    continue; // Re-examine `pos`: its slot is now `FREE(pos)`.
                }
                if self.fault.is_some() {
                    return;
                }
                self.pass(pos);
                self.stats.held_laps_skipped += 1;
                continue;
            }
            let seq = self.map.u64_at(self.layout.seq_offset(pos));
            let word = seq.load(Acquire);
            if word == seq_word(pos, SEQ_COMMITTED) {
                return;
            }
            if word != seq_word(pos, SEQ_FREE) {
                tracing::error!(ring = %self.name, pos, word, "impossible slot sequence word");
                self.fail(RingFault::SlotSequence);
                return;
            }
            let stalled = i == 0 && age >= self.stall_timeout;
            let owner = self.hole_owner(pos);
            let live = owner.live.is_some() || owner.live_reserving;
            if live && !stalled {
                return; // A live client is (or may be) about to fill `pos`.
            }
            if live {
                // The owner may be writing the slot right now, or resume later and write it:
                // hold the slot for it, pass the position.
                self.held_pos[slot] = pos;
                self.held_by[slot] = owner.live.unwrap_or(UNKNOWN_HOLDER);
                self.held_count += 1;
                self.pass(pos);
                self.stats.stalls_skipped += 1;
                tracing::warn!(ring = %self.name, pos, ?age, "skipped a position of a stalled client");
                continue;
            }
            // Nobody alive will write `pos`: the slot goes to the next lap.
            if seq
                .compare_exchange(word, seq_word(pos + depth, SEQ_FREE), AcqRel, Acquire)
                .is_err()
            {
                continue; // Committed meanwhile: look again.
            }
            if let Some(id) = owner.dead {
                let rec = self.layout.record_offset(id);
                let _ = self
                    .map
                    .u64_at(rec + REC_RESERVING_POS)
                    .compare_exchange(pos, POS_IDLE, Relaxed, Relaxed);
            }
            self.pass(pos);
            self.stats.holes_skipped += 1;
            tracing::warn!(ring = %self.name, pos, "skipped a position reserved by a dead client");
        }
    }

    /// The physical slot of `pos`.
    #[inline]
    fn slot_of(&self, pos: u64) -> usize {
        (pos & u64::from(self.layout.params.ring_depth - 1)) as usize
    }

    /// Moves the cursor past the hole `pos` (the cursor) without reading it, and publishes
    /// the new `tail` at once: a writer waiting for the server to pass its position (a held
    /// lap) may be the only client, so no later entry would make the caller's loop publish it
    /// (loops call `advance_tail` only after a poll that found entries).
    #[cold]
    fn pass(&mut self, pos: u64) {
        debug_assert_eq!(pos, self.cursor);
        self.cursor = pos + 1;
        self.limit = self.limit.max(self.cursor);
        self.advance_tail();
    }

    /// Releases held slot `slot` if its holder can no longer write it: the holder is dead, or
    /// its `reserving_pos` (Acquire, stored with Release after its last write to the slot) no
    /// longer names the held position; for an unknown holder, no live client is `RESERVING`
    /// or names the position. The slot then goes to the first lap the server has not passed,
    /// `FREE(r)` with `r >= cursor` (its writer, if it already saw the old word, gave `r` up
    /// and the server skips `r` as a hole without an owner). An entry the holder committed
    /// after the skip is dropped and counted in [`RingStats::late_commits_dropped`]. Returns
    /// whether the slot was released.
    #[cold]
    #[inline(never)]
    fn try_release(&mut self, slot: usize) -> bool {
        let held = self.held_pos[slot];
        let holder = self.held_by[slot];
        let still_held = if holder == UNKNOWN_HOLDER {
            let owner = self.hole_owner(held);
            owner.live.is_some() || owner.live_reserving
        } else {
            let rec = self.layout.record_offset(holder);
            self.map.u64_at(rec + REC_RESERVING_POS).load(Acquire) == held
                && self.client_alive(holder)
        };
        if still_held {
            return false;
        }
        let depth = u64::from(self.layout.params.ring_depth);
        let seq = self.map.u64_at(self.layout.seq_offset(held));
        let word = seq.load(Acquire);
        if word == seq_word(held, SEQ_COMMITTED) {
            self.stats.late_commits_dropped += 1;
            tracing::warn!(ring = %self.name, pos = held, "dropped an entry committed after its position was skipped");
        } else if word != seq_word(held, SEQ_FREE) {
            tracing::error!(ring = %self.name, pos = held, word, "impossible word in a held slot");
            self.fail(RingFault::SlotSequence);
            return false;
        }
        let laps = (self.cursor - held).div_ceil(depth);
        let next = held + laps * depth;
        if seq
            .compare_exchange(word, seq_word(next, SEQ_FREE), AcqRel, Acquire)
            .is_err()
        {
            tracing::error!(ring = %self.name, pos = held, "held slot changed while released");
            self.fail(RingFault::SlotSequence);
            return false;
        }
        self.held_pos[slot] = NOT_HELD;
        self.held_by[slot] = UNKNOWN_HOLDER;
        self.held_count -= 1;
        self.stats.held_slots_released += 1;
        true
    }

    /// Tries to release every held slot (see [`Self::try_release`]).
    #[cold]
    fn release_held(&mut self) {
        for slot in 0..self.held_pos.len() {
            if self.held_count == 0 || self.fault.is_some() {
                return;
            }
            if self.held_pos[slot] != NOT_HELD {
                self.try_release(slot);
            }
        }
    }

    /// Scans the client table for the reserver of hole `pos`: records (not `FREE`) whose
    /// `reserving_pos` is `pos` or `RESERVING`, and whether their owners are alive.
    #[cold]
    fn hole_owner(&self, pos: u64) -> HoleOwner {
        let mut owner = HoleOwner::default();
        for id in 0..self.layout.params.max_clients {
            let rec = self.layout.record_offset(id);
            if self.map.u32_at(rec + REC_STATE).load(Acquire) == CLIENT_FREE {
                continue;
            }
            let rp = self.map.u64_at(rec + REC_RESERVING_POS).load(Acquire);
            if rp != POS_RESERVING && rp != pos {
                continue;
            }
            match (self.client_alive(id), rp == pos) {
                (true, true) => owner.live = Some(id),
                (true, false) => owner.live_reserving = true,
                (false, true) => owner.dead = Some(id),
                (false, false) => {}
            }
        }
        owner
    }

    /// Whether the owner of client record `id` is alive: some open file description holds the
    /// lock on the record. Errs on the side of "alive" if the check itself fails.
    fn client_alive(&self, id: u32) -> bool {
        let rec = self.layout.record_offset(id) as u64;
        shm::is_locked_by_other(&self.file, rec, CLIENT_RECORD_SIZE).unwrap_or(true)
    }

    /// Every 1024 polls: if `liveness_interval` has passed, scan for dead or detached clients.
    #[cold]
    #[inline(never)]
    fn periodic(&mut self) {
        self.polls_until_clock = POLLS_PER_CLOCK_CHECK;
        let now = Instant::now();
        if now >= self.next_reclaim_scan {
            self.next_reclaim_scan = now + self.liveness_interval;
            self.check_control();
            self.reclaim_scan();
            self.release_held();
        }
    }

    /// Reclaims ids whose owner detached or died, once every request they committed has been
    /// consumed (`cursor` has passed the `head` seen when the death was first noticed).
    #[cold]
    #[inline(never)]
    fn reclaim_scan(&mut self) {
        for id in 0..self.layout.params.max_clients {
            let rec = self.layout.record_offset(id);
            let state = self.map.u32_at(rec + REC_STATE).load(Acquire);
            let gone = match state {
                CLIENT_FREE => false,
                CLIENT_ACTIVE => !self.client_alive(id),
                _ => true, // DETACHED, or garbage: nobody can own it.
            };
            let noticed = &mut self.death_noticed[id as usize];
            if !gone {
                *noticed = NOT_NOTICED;
            } else if *noticed == NOT_NOTICED {
                // Everything the owner ever reserved is below this head.
                *noticed = self.map.hdr_u64::<OFF_HEAD>().load(Acquire);
            } else if self.cursor >= *noticed {
                self.reclaim(id);
            }
        }
    }

    /// Returns client id `id` to `FREE`: takes back the request slots it still held when the
    /// server skipped its positions, bumps the generation, clears its response slots and
    /// pending replies, resets `reserving_pos`, then publishes `FREE` (Release).
    fn reclaim(&mut self, id: u32) {
        let p = self.layout.params;
        // The dead or detached owner writes nothing more: its held slots go on.
        for slot in 0..p.ring_depth as usize {
            if self.held_pos[slot] != NOT_HELD && self.held_by[slot] == id {
                self.try_release(slot);
            }
        }
        let rec = self.layout.record_offset(id);
        self.map.u32_at(rec + REC_GENERATION).fetch_add(1, Relaxed);
        for s in 0..p.resp_depth {
            let off = self.layout.resp_slot_offset(id, s);
            self.map.u8_at(off + RESP_VALID).store(0, Relaxed);
            let bit = id as usize * p.resp_depth as usize + s as usize;
            self.pending[bit / 64] &= !(1 << (bit % 64));
        }
        self.map
            .u64_at(rec + REC_RESERVING_POS)
            .store(POS_IDLE, Relaxed);
        self.map.u32_at(rec + REC_PID).store(0, Relaxed);
        self.map.u32_at(rec + REC_SLEEP).store(0, Relaxed);
        self.map.u32_at(rec + REC_STATE).store(CLIENT_FREE, Release);
        self.death_noticed[id as usize] = NOT_NOTICED;
        self.stats.clients_reclaimed += 1;
        tracing::debug!(ring = %self.name, client_id = id, "reclaimed client id");
    }
}

impl std::fmt::Debug for RingServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingServer")
            .field("path", &self.path)
            .field("info", &self.info())
            .field("cursor", &self.cursor)
            .field("limit", &self.limit)
            .field("hole", &self.hole)
            .field("fault", &self.fault)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Links the initialized, locked temporary file `tmp` to `path`, replacing a stale file (one of
/// this user that no live server holds) if present; a file of another user (or a symbolic link)
/// at `path` is [`RingError::UnsafeFile`] and is left alone.
fn publish(tmp: &std::path::Path, path: &std::path::Path) -> Result<(), RingError> {
    let io = |op| {
        let path = path.to_path_buf();
        move |source| RingError::Io { path, op, source }
    };
    // Descriptors of stale files we replaced, kept open (and locked) until our link succeeds so
    // that a concurrent creator cannot take them for stale files too.
    let mut replaced = Vec::new();
    for _ in 0..16 {
        match std::fs::hard_link(tmp, path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("link")(e)),
        }
        // Only a file of this user can be this user's stale ring: another user's file (or a
        // symbolic link) is an error, never locked, unlinked or reused (checked with `fstat`
        // on the opened descriptor).
        let Some(old) = shm::open_owned(path)? else {
            continue;
        };
        // Every ring file is locked by its server before it is linked, so an unlocked file at
        // the name is stale. Taking its lock ourselves makes the replacement exclusive.
        if !shm::try_lock_write(&old, SERVER_LOCK_START, SERVER_LOCK_LEN)
            .map_err(io("fcntl(F_OFD_SETLK)"))?
        {
            let pid = header::read_raw(&old)
                .map(|raw| {
                    u32::from_ne_bytes(raw[OFF_SERVER_PID..OFF_SERVER_PID + 4].try_into().unwrap())
                })
                .unwrap_or(0);
            return Err(RingError::AlreadyExists {
                path: path.to_path_buf(),
                pid,
            });
        }
        if shm::same_file(&old, path) {
            tracing::warn!(path = %path.display(), "replacing stale delegation ring");
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("unlink")(e)),
            }
        }
        replaced.push(old);
    }
    Err(RingError::AlreadyExists {
        path: path.to_path_buf(),
        pid: 0,
    })
}

impl Drop for RingServer {
    /// Clean shutdown: `server_alive = false` (Release), unlink the file (if it is still ours),
    /// release the server lock.
    fn drop(&mut self) {
        self.map.hdr_u8::<OFF_SERVER_ALIVE>().store(0, Release);
        if shm::same_file(&self.file, &self.path) {
            let _ = std::fs::remove_file(&self.path);
        }
        let _ = shm::unlock(&self.file, SERVER_LOCK_START, SERVER_LOCK_LEN);
    }
}

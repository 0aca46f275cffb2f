//! A producer of the ring: [`RingClient`]. Source: seeds/004 §2.2 (Client call() — 2-phase
//! commit, Client poll()), plus client ids, liveness bookkeeping and server-death detection
//! described in the module docs.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicU64, fence};
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use super::config::RingInfo;
use super::error::{RingCallError, RingError, RingFault};
use super::header;
use super::layout::*;
use super::shm::{self, ShmMap};
use super::sleep;

/// The client (producer) end of a delegation ring: reserves request slots with `fetch_add` on
/// the shared `head`, writes requests directly into them, and reads replies from its own
/// `resp_depth` response slots.
///
/// Calls are pipelined: [`try_call`](Self::try_call) returns the response slot index used,
/// and [`poll`](Self::poll) later delivers `(resp_slot_idx, response bytes)`. At most
/// `resp_depth` calls can be outstanding. Responses may arrive in any order.
///
/// Dropping the client marks its id `DETACHED` and releases its lock; the server then reclaims
/// the id (replies still in flight to it are refused with `StaleToken`).
///
/// Every wait of a call is bounded: by the deadline of
/// [`try_call_with_deadline`](Self::try_call_with_deadline), or by the client's send timeout
/// ([`DEFAULT_SEND_TIMEOUT`], see [`set_send_timeout`](Self::set_send_timeout)) for
/// [`try_call`](Self::try_call) and [`try_call_with`](Self::try_call_with).
pub struct RingClient {
    path: PathBuf,
    /// This client's own open file description; holds the OFD lock on its client record.
    file: File,
    map: ShmMap,
    layout: Layout,
    info: RingInfo,
    client_id: u32,
    generation: u32,
    /// Byte offset of this client's record in the client table.
    record: usize,
    /// Byte offset of this client's response slot 0 (its slots follow, `resp_slot_size`
    /// bytes apart; both from the validated layout).
    resp_base: usize,
    /// `Layout::resp_slot_size`, in bytes.
    resp_slot_size: usize,
    /// Round-robin start for picking a response slot. Source: seeds/004 §2.2 call() step 2.
    next_resp_slot: u32,
    in_flight: usize,
    /// One bit per response slot: a call is outstanding on it.
    outstanding: Box<[u64]>,
    /// Per response slot: the call tag (low 16 bits of the ring position) of the call
    /// outstanding on it; a response with another tag is not this call's.
    call_tags: Box<[u16]>,
    /// Responses dropped because their tag was not that of the slot's call.
    stray_responses: u64,
    /// Copy of the current response (`resp_payload_cap` bytes).
    scratch: Box<[u8]>,
    liveness_interval: Duration,
    next_liveness_check: Instant,
    corrupt_responses: u64,
    /// Calls refused because the server skipped their position (stall).
    skipped_calls: u64,
    /// Calls that gave up waiting for room at their deadline.
    timed_out_calls: u64,
    /// Positions given up and reserved again because their slot was held (see
    /// [`held_slot_retries`](Self::held_slot_retries)).
    held_slot_retries: u64,
    /// Impossible ring states this client found (it marked the ring failed).
    ring_faults: u64,
    /// How long `try_call`/`try_call_with` wait for room before [`RingCallError::Timeout`].
    send_timeout: Duration,
    /// `ring_depth + 4 * max_clients`: beyond this distance from `tail`, `head` is impossible
    /// (see [`RingFault::HeadTooFarAhead`]).
    max_ahead: u64,
    /// A position this client reserved and abandoned at a deadline, until the server passes
    /// it: no new reservation is made before (so a client never has more than one abandoned
    /// position ahead of `tail`).
    abandoned: Option<u64>,
    /// Sticky: the ring was marked failed.
    fault: Option<RingFault>,
    /// Sticky: the server was found dead or shut down.
    disconnected: bool,
    /// Test hook `__crash` was used: `Drop` must not touch shared state.
    crashed: bool,
    /// Sleeps in [`RingClient::wait_for_response`].
    idle_waits: u64,
    /// `FUTEX_WAIT` was refused once: `wait_for_response` no longer sleeps.
    sleep_unsupported: bool,
    /// [`OFF_CLIENT_SLEEP_ARMED`] is stored.
    armed: bool,
}

/// Default bound on the time [`RingClient::try_call`] and [`RingClient::try_call_with`] wait
/// for room in the ring (or for the slot's previous writer): 1 s, the default call deadline
/// suggested for the typed client. Past it they return [`RingCallError::Timeout`].
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// `ring_depth + 4 * max_clients`: the bound on `head - tail` used to recognize a corrupt
/// `head` (see [`RingFault::HeadTooFarAhead`]).
pub(crate) fn max_ahead(ring_depth: u32, max_clients: u32) -> u64 {
    u64::from(ring_depth) + 4 * u64::from(max_clients)
}

/// When a call's waits end: a fixed instant, or a duration counted from the first time the
/// call has to wait (so the fast path never reads the clock).
#[derive(Clone, Copy, Debug)]
enum Deadline {
    At(Instant),
    After(Duration),
}

impl Deadline {
    /// Resolves `After` against the clock on first use.
    #[cold]
    fn instant(&mut self) -> Instant {
        match *self {
            Deadline::At(t) => t,
            Deadline::After(d) => {
                let now = Instant::now();
                // A year stands in for "never" (and cannot overflow `Instant`).
                let t = now + d.min(Duration::from_secs(365 * 86_400));
                *self = Deadline::At(t);
                t
            }
        }
    }
}

/// A call between its reservation and its commit. Public only with the `test-hooks` feature,
/// for the test hooks `RingClient::__begin`, `__claim` and `__finish`.
#[derive(Debug)]
#[cfg_attr(not(feature = "test-hooks"), allow(unreachable_pub))]
pub struct PendingCall {
    pos: u64,
    idx: u32,
    /// Byte offset of `pos`'s sequence word (computed once per call).
    seq_off: usize,
}

#[cfg_attr(not(feature = "test-hooks"), allow(dead_code, unreachable_pub))]
impl PendingCall {
    /// The reserved ring position.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// The response slot the call will use.
    pub fn resp_slot(&self) -> u32 {
        self.idx
    }
}

impl RingClient {
    /// Attaches to the ring `/dev/shm/NAME` (`name` is `"kv0"` or `"/kv0"`).
    ///
    /// Refuses, before reading or mapping anything, a file that is not a regular file owned by
    /// this process's effective uid with mode 0600 ([`RingError::UnsafeFile`]: another user's
    /// file is never trusted, whatever its name). Validates the whole header before mapping
    /// the file (see [`RingError`] for the failure modes: missing file, wrong magic or
    /// version, inconsistent sizes, truncated file), checks
    /// that a live server holds the ring, and acquires a client id: first a fresh one from
    /// `next_client_id`, then any `FREE` (reclaimed) one. Fails with
    /// [`RingError::NoFreeClientId`] if all `max_clients` ids are in use, and with
    /// [`RingError::Failed`] if the ring was marked failed.
    pub fn attach(name: &str) -> Result<Self, RingError> {
        let (_, path) = shm::shm_path(name)?;
        let io = |op| {
            let path = path.clone();
            move |source| RingError::Io { path, op, source }
        };
        // Owner, mode and type are checked on the descriptor before anything is read or mapped.
        let Some(file) = shm::open_private(&path)? else {
            return Err(RingError::NotFound { path });
        };
        let hdr = header::read_and_validate(&file, &path)?;
        let layout = hdr.layout;
        let map = ShmMap::map(&file, layout.total_size).map_err(io("mmap"))?;
        let server_locked = shm::is_locked_by_other(&file, SERVER_LOCK_START, SERVER_LOCK_LEN)
            .map_err(io("fcntl(F_OFD_GETLK)"))?;
        if !server_locked || map.hdr_u8::<OFF_SERVER_ALIVE>().load(Acquire) == 0 {
            return Err(RingError::ServerNotRunning { path });
        }
        if let Some(fault) = RingFault::from_code(map.hdr_u8::<OFF_RING_FAULT>().load(Acquire)) {
            return Err(RingError::Failed { path, fault });
        }
        let Some((client_id, generation)) =
            acquire_id(&file, &map, &layout).map_err(io("fcntl(F_OFD_SETLK)"))?
        else {
            return Err(RingError::NoFreeClientId {
                path,
                max_clients: layout.params.max_clients,
            });
        };
        let p = layout.params;
        tracing::debug!(
            path = %path.display(), client_id, generation, server_pid = hdr.server_pid,
            "attached to delegation ring"
        );
        Ok(Self {
            path,
            file,
            record: layout.record_offset(client_id),
            resp_base: layout.resp_slot_offset(client_id, 0),
            resp_slot_size: layout.resp_slot_size as usize,
            map,
            layout,
            info: hdr.info(),
            client_id,
            generation,
            next_resp_slot: 0,
            in_flight: 0,
            outstanding: vec![0u64; (p.resp_depth as usize).div_ceil(64)].into_boxed_slice(),
            call_tags: vec![0u16; p.resp_depth as usize].into_boxed_slice(),
            stray_responses: 0,
            scratch: vec![0u8; p.resp_payload_cap as usize].into_boxed_slice(),
            liveness_interval: hdr.liveness_interval,
            next_liveness_check: Instant::now() + hdr.liveness_interval,
            corrupt_responses: 0,
            skipped_calls: 0,
            timed_out_calls: 0,
            held_slot_retries: 0,
            ring_faults: 0,
            send_timeout: DEFAULT_SEND_TIMEOUT,
            max_ahead: max_ahead(p.ring_depth, p.max_clients),
            abandoned: None,
            fault: None,
            disconnected: false,
            crashed: false,
            idle_waits: 0,
            sleep_unsupported: false,
            armed: false,
        })
    }

    /// The ring's parameters (from the header).
    pub fn info(&self) -> RingInfo {
        self.info
    }

    /// The ring file (`/dev/shm/NAME`).
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// This client's id (`< max_clients`).
    pub fn client_id(&self) -> u32 {
        self.client_id
    }

    /// Generation of this client's id when it was acquired (bumped each time the id is
    /// reclaimed).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Number of calls sent whose response has not been delivered by [`poll`](Self::poll).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Responses dropped because their call tag ([`RESP_TAG`]) was not that of the call
    /// outstanding on their slot: answers to ring entries whose metadata was overwritten to
    /// name this client's slot (only a misbehaving writer of shared memory can cause this).
    pub fn stray_responses(&self) -> u64 {
        self.stray_responses
    }

    /// Responses whose `payload_len` exceeded `resp_payload_cap` (only a misbehaving writer of
    /// shared memory can cause this); each was delivered as an empty message.
    pub fn corrupt_responses(&self) -> u64 {
        self.corrupt_responses
    }

    /// Calls refused with [`RingCallError::Skipped`]: the server skipped their position because
    /// this client stalled between reserving and committing for longer than `stall_timeout`.
    pub fn skipped_calls(&self) -> u64 {
        self.skipped_calls
    }

    /// Calls that returned [`RingCallError::Timeout`].
    pub fn timed_out_calls(&self) -> u64 {
        self.timed_out_calls
    }

    /// Sleeps in [`wait_for_response`](Self::wait_for_response) (woken, timed out, or the
    /// word changed before the wait).
    pub fn idle_waits(&self) -> u64 {
        self.idle_waits
    }

    /// Blocks until a reply to one of this client's outstanding calls may have arrived, at
    /// most `bound` (module `sleep`: the record's word [`REC_SLEEP`], which the server checks
    /// after its round of replies). For a caller whose polls found nothing; the caller
    /// decides when to sleep (e.g. `rpc::erpc::idle::CallWait`).
    ///
    /// Returns `true` if it slept (counted in [`idle_waits`](Self::idle_waits)) or found a
    /// reply already there, `false` without sleeping: at the first call (it arms the
    /// server's checks, [`OFF_CLIENT_SLEEP_ARMED`], and sleeps from the next call on), with no
    /// call outstanding, the client disconnected or the ring failed (the next poll reports
    /// it), or once `FUTEX_WAIT` was refused (never tried again). A server that died or
    /// stopped leaves the sleep to its bound; the caller's polls then check its liveness as
    /// before.
    pub fn wait_for_response(&mut self, bound: Duration) -> bool {
        if self.in_flight == 0
            || self.sleep_unsupported
            || self.disconnected
            || self.fault.is_some()
        {
            return false;
        }
        if !self.armed {
            // The first time: arm the server's checks, do not sleep yet.
            self.armed = true;
            self.map
                .hdr_u32::<OFF_CLIENT_SLEEP_ARMED>()
                .store(1, SeqCst);
            return false;
        }
        let word = self.map.u32_at(self.record + REC_SLEEP);
        word.swap(1, SeqCst);
        fence(SeqCst);
        if self.any_response() {
            word.store(0, Relaxed);
            return true;
        }
        let end = sleep::wait(word, bound);
        word.store(0, Relaxed);
        if end == sleep::WaitEnd::Unsupported {
            self.sleep_unsupported = true;
            return false;
        }
        self.idle_waits += 1;
        true
    }

    /// Whether a response slot with a call outstanding has `valid` set.
    fn any_response(&self) -> bool {
        self.outstanding.iter().enumerate().any(|(w, &bits)| {
            let mut bits = bits;
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                let off = self.resp_slot(w as u32 * 64 + b);
                if self.map.u8_at(off + RESP_VALID).load(Acquire) != 0 {
                    return true;
                }
            }
            false
        })
    }

    /// Reserved positions this client gave up, and reserved again within the same call,
    /// because their slot was still held by a stalled writer of an earlier lap (the server
    /// passes such positions at once). Not an error: the call went on.
    pub fn held_slot_retries(&self) -> u64 {
        self.held_slot_retries
    }

    /// Impossible ring states this client found (each marked the ring failed, see
    /// [`RingFault`]).
    pub fn ring_faults(&self) -> u64 {
        self.ring_faults
    }

    /// The fault the ring was marked failed with, once this client has seen it.
    pub fn fault(&self) -> Option<RingFault> {
        self.fault
    }

    /// Sets how long [`try_call`](Self::try_call) and [`try_call_with`](Self::try_call_with)
    /// wait for room in the ring before failing with [`RingCallError::Timeout`] (default
    /// [`DEFAULT_SEND_TIMEOUT`]). The clock is read only once a call has to wait.
    pub fn set_send_timeout(&mut self, timeout: Duration) {
        self.send_timeout = timeout;
    }

    /// Sends `payload` as a request. Returns the response slot index that
    /// [`poll`](Self::poll) will report the response under.
    ///
    /// Errors: [`RingCallError::PayloadTooLarge`] if `payload` exceeds `req_payload_cap`, and
    /// otherwise as [`try_call_with`](Self::try_call_with). Blocks (spinning, then yielding)
    /// only while the ring is full, for at most the send timeout.
    #[inline]
    pub fn try_call(&mut self, payload: &[u8]) -> Result<u32, RingCallError> {
        let cap = self.layout.params.req_payload_cap as usize;
        if payload.len() > cap {
            return Err(RingCallError::PayloadTooLarge {
                len: payload.len(),
                cap,
            });
        }
        self.call(Deadline::After(self.send_timeout), |buf| {
            buf[..payload.len()].copy_from_slice(payload);
            payload.len()
        })
    }

    /// [`try_call_with_deadline`](Self::try_call_with_deadline) with a deadline of the send
    /// timeout ([`DEFAULT_SEND_TIMEOUT`] unless [`set_send_timeout`](Self::set_send_timeout)),
    /// counted from the moment the call first has to wait.
    #[inline]
    pub fn try_call_with(
        &mut self,
        write: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RingCallError> {
        self.call(Deadline::After(self.send_timeout), write)
    }

    /// [`try_call_with_deadline`](Self::try_call_with_deadline) with a deadline of `timeout`
    /// counted from the moment the call first has to wait (the clock is not read otherwise).
    #[inline]
    pub fn try_call_with_timeout(
        &mut self,
        timeout: Duration,
        write: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RingCallError> {
        self.call(Deadline::After(timeout), write)
    }

    /// Sends a request that `write` produces directly in the reserved request slot: `write`
    /// gets the slot's payload area (`req_payload_cap` bytes of shared memory) and returns the
    /// number of bytes used. Waits (spinning, then yielding) only while the ring is full or the
    /// slot's previous writer has not handed it on, and never past `deadline`. Source:
    /// seeds/004 §2.2 Client call() — 2-phase commit, with the extensions of the module docs:
    ///
    /// 1. `server_alive` (Acquire) false → [`RingCallError::ServerDisconnected`]; ring marked
    ///    failed → [`RingCallError::RingCorrupt`].
    /// 2. Pick a free response slot round-robin; none free → [`RingCallError::WouldBlock`] (nothing
    ///    reserved).
    /// 3. If an earlier call of this client abandoned a position at its deadline, wait until
    ///    the server has passed it (`tail > abandoned`) before reserving again (extension).
    /// 4. Read `tail`; `reserving_pos = RESERVING`; `pos = head.fetch_add(1, Release)`;
    ///    `reserving_pos = pos`. (Release, not the seed's Relaxed, so that a server whose
    ///    `head.load(Acquire)` covers `pos` also sees `RESERVING` in this client's record: the
    ///    hole check relies on it.) Reservations stay in `fetch_add` order (a ticket queue),
    ///    as in the seed: there is no pre-check that would let later callers overtake a
    ///    waiting one.
    /// 5. Wait until `pos - tail < ring_depth`. `tail > pos` means the server skipped `pos`
    ///    (this client stalled) → [`RingCallError::Skipped`]. A `pos` below the `tail` read
    ///    before the `fetch_add`, or more than `ring_depth + 4 * max_clients` above `tail`,
    ///    is impossible → [`RingCallError::RingCorrupt`], and the ring is marked failed.
    /// 6. Check the slot (extension): its sequence word must be `FREE(pos)` (Acquire load, or
    ///    with no other call in flight a CAS of `FREE(pos)` to itself; no state change). A
    ///    word of an earlier lap means that lap's stalled writer still holds the slot: wait
    ///    until the word becomes `FREE(pos)` or the server passes `pos` (it does so at once),
    ///    and in the latter case reserve a new position (back to step 4, counted in
    ///    [`held_slot_retries`](Self::held_slot_retries)); a word of a later lap likewise. Any
    ///    other word → [`RingCallError::RingCorrupt`].
    /// 7. Write `client_id`, `resp_slot_idx`, `payload_len` and the payload (`write`).
    /// 8. Refusal check, then commit (the seed's `committed = 1`): if `tail > pos` the server
    ///    skipped `pos` because this client stalled for longer than `stall_timeout`: nothing
    ///    is committed and the call fails with [`RingCallError::Skipped`]. Otherwise store
    ///    `COMMITTED(pos)` (Release).
    /// 9. `reserving_pos = IDLE` (Release); the slot is now outstanding.
    ///
    /// A wait that reaches `deadline` fails with [`RingCallError::Timeout`] (the reserved
    /// position, if any, is abandoned unclaimed, and the server skips it); one that finds the
    /// server dead fails with [`RingCallError::ServerDisconnected`] (checked every
    /// `liveness_interval`). If `write` returns more than the capacity
    /// ([`RingCallError::PayloadTooLarge`]) or panics, the claimed slot is committed as an
    /// *aborted* entry that the server skips, so the ring never stalls on it.
    #[inline]
    pub fn try_call_with_deadline(
        &mut self,
        deadline: Instant,
        write: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RingCallError> {
        self.call(Deadline::At(deadline), write)
    }

    /// Steps 1-9 of [`try_call_with_deadline`](Self::try_call_with_deadline).
    #[inline(always)]
    fn call(
        &mut self,
        mut deadline: Deadline,
        write: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RingCallError> {
        let pending = loop {
            let pending = self.begin(&mut deadline)?;
            if self.claim(&pending, &mut deadline)? {
                break pending;
            }
        };
        self.finish(pending, write)
    }

    /// Steps 1-5: checks, response slot, reservation, room.
    #[inline(always)]
    fn begin(&mut self, deadline: &mut Deadline) -> Result<PendingCall, RingCallError> {
        self.check_usable()?;
        if self.in_flight == self.layout.params.resp_depth as usize {
            return Err(RingCallError::WouldBlock);
        }
        if self.abandoned.is_some() {
            self.wait_abandoned_passed(deadline)?;
        }
        let idx = self.pick_free_slot();
        // A response in a slot with no call outstanding answers nobody of this client (an
        // entry whose metadata was overwritten named it): clear it before the slot is used,
        // so the server's answer to this call is not refused as `SlotBusy`.
        let valid = self.map.u8_at(self.resp_slot(idx) + RESP_VALID);
        if valid.load(Relaxed) != 0 {
            valid.store(0, Release);
            self.stray_response(idx);
        }
        let pos = self.reserve(deadline)?;
        Ok(PendingCall {
            pos,
            idx,
            seq_off: self.layout.seq_offset(pos),
        })
    }

    /// Byte offset of this client's response slot `idx` (`idx < resp_depth`: callers pick it
    /// from their own bookkeeping; the accessors bounds-check the result anyway).
    #[inline(always)]
    fn resp_slot(&self, idx: u32) -> usize {
        self.resp_base + idx as usize * self.resp_slot_size
    }

    /// The sequence word of the slot holding `pos`.
    #[inline]
    fn seq(&self, pos: u64) -> &AtomicU64 {
        self.map.u64_at(self.layout.seq_offset(pos))
    }

    /// Step 6: checks that the slot of the reserved position is free for it (a load with calls
    /// in flight; a CAS of the word to itself, no state change, when this is the only call).
    /// Returns `Ok(false)` if the server passed the position because an earlier lap's writer
    /// still holds the slot: the caller reserves again.
    #[inline(always)]
    fn claim(
        &mut self,
        pending: &PendingCall,
        deadline: &mut Deadline,
    ) -> Result<bool, RingCallError> {
        let pos = pending.pos;
        // Acquire: the server's Release store of `FREE(pos)` was made after its last access to
        // the slot's previous lap, so this client's writes come after it.
        let seq = self.map.u64_at(pending.seq_off);
        let free = seq_word(pos, SEQ_FREE);
        // Two equivalent checks (a CAS of `FREE(pos)` to itself succeeds exactly when the word
        // is `FREE(pos)`), chosen for speed: with no other call in flight the caller waits for
        // this one, and the locked CAS takes the slot's line exclusive in one transfer
        // (`ring_vs_crossbeam` QD 1: p50 230 ns vs 300 ns with the load); with calls in flight
        // the load lets the CPU overlap this line's transfer with the rest of the call (QD 32:
        // 10.9 vs 8.5 Mops/s with the CAS).
        let word = if self.in_flight == 0 {
            match seq.compare_exchange(free, free, Acquire, Acquire) {
                Ok(w) | Err(w) => w,
            }
        } else {
            seq.load(Acquire)
        };
        if word == free {
            return Ok(true);
        }
        self.claim_slow(pos, word, deadline)
    }

    /// Steps 7-9: writes the request into the claimed slot and commits it.
    #[inline(always)]
    fn finish(
        &mut self,
        pending: PendingCall,
        write: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RingCallError> {
        let PendingCall { pos, idx, seq_off } = pending;
        let p = self.layout.params;
        let off = self.layout.req_slot_offset(pos);
        let cap = p.req_payload_cap as usize;
        let dst = self.map.bytes(off + SLOT_PAYLOAD, cap);
        let guard = AbortOnUnwind {
            map: &self.map,
            layout: &self.layout,
            pos,
            record: self.record,
            client_id: self.client_id,
        };
        // SAFETY: `dst` is the in-bounds payload area (`cap` bytes) of the slot for `pos`. This
        // client owns it exclusively from its slot check until its commit (or refusal): it saw
        // `FREE(pos)`, which the server stores only after its last read of the slot's previous
        // lap (or after that lap's writer moved on); the server stores `FREE` of a later lap
        // only after this client's `COMMITTED(pos)` or, if it skipped `pos`, once this
        // client's `reserving_pos` (Release, after its last write here) no longer names
        // `pos`; no other writer writes a slot without seeing `FREE` of its own position; and
        // the server reads the slot only after `COMMITTED(pos)`.
        let len = write(unsafe { std::slice::from_raw_parts_mut(dst, cap) });
        std::mem::forget(guard);
        if len > cap {
            return Err(self.abort_oversize(pos, len, cap));
        }
        if !commit_entry(
            &self.map,
            &self.layout,
            (pos, off, seq_off),
            self.record,
            self.client_id,
            idx,
            len as u32,
        ) {
            return Err(self.refused(pos));
        }
        self.outstanding[idx as usize / 64] |= 1 << (idx % 64);
        self.call_tags[idx as usize] = pos as u16;
        self.in_flight += 1;
        self.next_resp_slot = (idx + 1) & (p.resp_depth - 1);
        Ok(idx)
    }

    /// `write` returned more than the capacity: commit the claimed slot of `pos` as an
    /// aborted entry (the server skips it) and fail the call.
    #[cold]
    #[inline(never)]
    fn abort_oversize(&mut self, pos: u64, len: usize, cap: usize) -> RingCallError {
        let _ = commit_entry(
            &self.map,
            &self.layout,
            self.layout.slot_at(pos),
            self.record,
            self.client_id,
            0,
            ABORTED_PAYLOAD_LEN,
        );
        RingCallError::PayloadTooLarge { len, cap }
    }

    /// Delivers the responses that have arrived. Source: seeds/004 §2.2 Client poll().
    ///
    /// Scans only the response slots with a call outstanding; for each with `valid != 0`
    /// (Acquire): if the slot's call tag ([`RESP_TAG`]) is that of the call outstanding on it,
    /// copies the response out, clears `valid` (Release), frees the slot and calls
    /// `on_response(resp_slot_idx, bytes)`; otherwise drops the response (clears `valid`,
    /// counts it in [`stray_responses`](Self::stray_responses)) and keeps waiting. Returns the
    /// number delivered.
    ///
    /// When nothing arrived and calls are outstanding, checks the server's liveness
    /// (`server_alive` every time, its lock every `liveness_interval`) and returns
    /// [`RingCallError::ServerDisconnected`] if it is gone, or [`RingCallError::RingCorrupt`] if the
    /// ring was marked failed, so a caller waiting for a response never spins forever on a
    /// dead server or a failed ring. Responses that arrived before are still delivered. (A
    /// server that is alive but stopped is bounded only by the caller's own deadline: poll
    /// never blocks.)
    ///
    /// A response slot whose `payload_len` exceeds `resp_payload_cap` (only a misbehaving
    /// writer of the shared memory can do that) is delivered as an empty message, so the
    /// caller sees a decode error for that call instead of waiting forever, and is counted in
    /// [`corrupt_responses`](Self::corrupt_responses).
    #[inline]
    pub fn poll(&mut self, on_response: impl FnMut(u32, &[u8])) -> Result<usize, RingCallError> {
        self.poll_up_to(usize::MAX, on_response)
    }

    /// [`poll`](Self::poll), delivering at most `max` responses (`max >= 1`); the others stay
    /// in their slots for the next poll.
    #[inline]
    pub fn poll_up_to(
        &mut self,
        max: usize,
        mut on_response: impl FnMut(u32, &[u8]),
    ) -> Result<usize, RingCallError> {
        if self.in_flight == 0 {
            return if self.disconnected || self.fault.is_some() {
                Err(self.unusable())
            } else {
                Ok(0)
            };
        }
        let cap = self.layout.params.resp_payload_cap;
        let mut delivered = 0;
        for w in 0..self.outstanding.len() {
            let mut bits = self.outstanding[w];
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                let idx = w as u32 * 64 + b;
                let off = self.resp_slot(idx);
                let valid = self.map.u8_at(off + RESP_VALID);
                if valid.load(Acquire) == 0 {
                    continue;
                }
                if self.map.u16_at(off + RESP_TAG).load(Relaxed) != self.call_tags[idx as usize] {
                    // Not this call's answer: drop it, keep waiting for the right one.
                    valid.store(0, Release);
                    self.stray_response(idx);
                    continue;
                }
                let len = self.map.u32_at(off + RESP_PAYLOAD_LEN).load(Relaxed);
                let ok = len <= cap;
                if ok {
                    let src = self.map.bytes(off + RESP_PAYLOAD, len as usize);
                    // SAFETY: `src` is `len <= resp_payload_cap` in-bounds bytes of this
                    // client's response slot; `scratch` holds `resp_payload_cap` bytes and does
                    // not overlap the mapping. The server wrote them before its Release store of
                    // `valid = 1` (seen above with Acquire) and writes the slot again only after
                    // it sees `valid == 0`, stored below.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src, self.scratch.as_mut_ptr(), len as usize)
                    };
                }
                valid.store(0, Release);
                self.outstanding[w] &= !(1 << b);
                self.in_flight -= 1;
                delivered += 1;
                // One call site, so the (inlined) callback is not duplicated.
                let msg: &[u8] = if ok {
                    &self.scratch[..len as usize]
                } else {
                    self.corrupt_response(idx, len);
                    &[]
                };
                on_response(idx, msg);
                if delivered == max {
                    return Ok(delivered);
                }
            }
        }
        if delivered == 0 {
            self.on_idle()?;
        }
        Ok(delivered)
    }

    /// Slow liveness check: fails with [`RingCallError::ServerDisconnected`] if the server shut down
    /// (`server_alive == false`) or its process is gone (no lock on the header, checked with
    /// `F_OFD_GETLK`), and with [`RingCallError::RingCorrupt`] if the ring was marked failed. Once
    /// disconnected (or failed), a client stays so.
    pub fn check_server(&mut self) -> Result<(), RingCallError> {
        if self.disconnected
            || self.fault.is_some()
            || self.map.hdr_u8::<OFF_SERVER_ALIVE>().load(Acquire) == 0
            || self.map.hdr_u8::<OFF_RING_FAULT>().load(Relaxed) != 0
            || !self.server_lock_held()
        {
            return Err(self.unusable());
        }
        Ok(())
    }

    /// Step 1: the server is up and the ring not marked failed (two loads of the header line).
    #[inline(always)]
    fn check_usable(&mut self) -> Result<(), RingCallError> {
        if self.disconnected
            || self.fault.is_some()
            || self.map.hdr_u8::<OFF_SERVER_ALIVE>().load(Acquire) == 0
            || self.map.hdr_u8::<OFF_RING_FAULT>().load(Relaxed) != 0
        {
            return Err(self.unusable());
        }
        Ok(())
    }

    /// Picks the next free response slot round-robin from `next_resp_slot`. Requires
    /// `in_flight < resp_depth`, so a free slot exists.
    #[inline]
    fn pick_free_slot(&self) -> u32 {
        let mask = self.layout.params.resp_depth - 1;
        let mut i = self.next_resp_slot & mask;
        while self.outstanding[i as usize / 64] & (1 << (i % 64)) != 0 {
            i = (i + 1) & mask;
        }
        i
    }

    /// Steps 4-5 of a call: reservation, wait for room.
    #[inline(always)]
    fn reserve(&mut self, deadline: &mut Deadline) -> Result<u64, RingCallError> {
        let depth = u64::from(self.layout.params.ring_depth);
        // Read before the `fetch_add`: `tail <= head <= pos` for any sound ring.
        let tail = self.map.hdr_u64::<OFF_TAIL>().load(Acquire);
        let rp = self.map.u64_at(self.record + REC_RESERVING_POS);
        rp.store(POS_RESERVING, Relaxed);
        // SeqCst: the server's sleep check relies on it (module `sleep`); on x86-64 the same
        // locked instruction as Release.
        let pos = self.map.hdr_u64::<OFF_HEAD>().fetch_add(1, SeqCst);
        // Release: a server that reads `pos` here also sees this client's earlier commits.
        rp.store(pos, Release);
        // `tail` only grows, so room against the old value is room now. (Wrapping: a `pos`
        // below `tail` takes the slow path too.)
        if pos.wrapping_sub(tail) >= depth {
            self.wait_for_room(pos, tail, deadline)?;
        }
        Ok(pos)
    }

    /// Step 3: an earlier call abandoned a position; wait until the server has passed it.
    #[cold]
    #[inline(never)]
    fn wait_abandoned_passed(&mut self, deadline: &mut Deadline) -> Result<(), RingCallError> {
        let Some(pos) = self.abandoned else {
            return Ok(());
        };
        let backoff = Backoff::new();
        while self.map.hdr_u64::<OFF_TAIL>().load(Acquire) <= pos {
            self.wait_step(&backoff, deadline)?;
        }
        self.abandoned = None;
        Ok(())
    }

    /// Step 5, the reserved position is not yet inside the ring's window: waits until
    /// `pos - tail < ring_depth` (`tail0`: `tail` read before the `fetch_add`). On failure the
    /// position is abandoned (never written).
    #[cold]
    #[inline(never)]
    fn wait_for_room(
        &mut self,
        pos: u64,
        tail0: u64,
        deadline: &mut Deadline,
    ) -> Result<(), RingCallError> {
        if pos < tail0 {
            // `tail0 <= head` when it was read, and `pos` is a later `head`.
            return Err(self.found_fault(RingFault::HeadBehindTail));
        }
        let depth = u64::from(self.layout.params.ring_depth);
        let backoff = Backoff::new();
        loop {
            // Read after the `fetch_add`: `pos - tail` is at most `head - tail` of that moment.
            let tail = self.map.hdr_u64::<OFF_TAIL>().load(Acquire);
            if tail > pos {
                // The server passed `pos`, which this client never committed: it skipped it.
                return Err(self.refused(pos));
            }
            if pos - tail < depth {
                return Ok(());
            }
            if pos - tail > self.max_ahead || pos > MAX_POS {
                return Err(self.found_fault(RingFault::HeadTooFarAhead));
            }
            if let Err(e) = self.wait_step(&backoff, deadline) {
                return Err(self.abandon(pos, e));
            }
        }
    }

    /// Step 6, the slot's word is not `FREE(pos)`: it names an earlier lap whose writer still
    /// holds the slot (the server skipped that lap while its writer was stalled), or a later
    /// lap (the server passed `pos` and has released the slot since). Waits until the slot is
    /// released to `pos` (`Ok(true)`) or the server passes `pos` (`Ok(false)`, counted in
    /// [`held_slot_retries`](RingClient::held_slot_retries)); the server passes such positions
    /// at once, without an owner check. Any other word is impossible →
    /// [`RingCallError::RingCorrupt`].
    #[cold]
    #[inline(never)]
    fn claim_slow(
        &mut self,
        pos: u64,
        mut word: u64,
        deadline: &mut Deadline,
    ) -> Result<bool, RingCallError> {
        let depth = u64::from(self.layout.params.ring_depth);
        let backoff = Backoff::new();
        loop {
            if word == seq_word(pos, SEQ_FREE) {
                return Ok(true);
            }
            let (wpos, state) = (seq_pos(word), seq_state(word));
            let same_slot = (wpos ^ pos) & (depth - 1) == 0;
            if !same_slot || wpos == pos || (state != SEQ_FREE && state != SEQ_COMMITTED) {
                return Err(self.found_fault(RingFault::SlotSequence));
            }
            if wpos > pos || self.map.hdr_u64::<OFF_TAIL>().load(Acquire) > pos {
                self.held_slot_retries += 1;
                return Ok(false);
            }
            if let Err(e) = self.wait_step(&backoff, deadline) {
                return Err(self.abandon(pos, e));
            }
            word = self.seq(pos).load(Acquire);
        }
    }

    /// One round of a bounded wait: back off, then fail if the server is gone or the ring
    /// failed (every round; the server's lock every `liveness_interval`) or `deadline` passed.
    #[cold]
    fn wait_step(
        &mut self,
        backoff: &Backoff,
        deadline: &mut Deadline,
    ) -> Result<(), RingCallError> {
        backoff.snooze();
        if self.map.hdr_u8::<OFF_SERVER_ALIVE>().load(Acquire) == 0
            || self.map.hdr_u8::<OFF_RING_FAULT>().load(Acquire) != 0
            || (self.liveness_due() && !self.server_lock_held())
        {
            return Err(self.unusable());
        }
        if Instant::now() >= deadline.instant() {
            self.timed_out_calls += 1;
            return Err(RingCallError::Timeout);
        }
        Ok(())
    }

    /// Gives up the reserved, unclaimed position `pos` without writing it (the call failed
    /// with `e`): the server skips it as a hole without an owner, and this client reserves
    /// nothing new until it has.
    #[cold]
    fn abandon(&mut self, pos: u64, e: RingCallError) -> RingCallError {
        self.abandoned = Some(pos);
        self.idle(e)
    }

    /// Clears `reserving_pos` (no call in progress) and returns `e`.
    #[cold]
    fn idle(&mut self, e: RingCallError) -> RingCallError {
        self.map
            .u64_at(self.record + REC_RESERVING_POS)
            .store(POS_IDLE, Release);
        e
    }

    /// The server skipped `pos` (the late commit, claim or wait of a stalled call).
    #[cold]
    fn refused(&mut self, pos: u64) -> RingCallError {
        self.skipped_calls += 1;
        tracing::debug!(
            path = %self.path.display(), client_id = self.client_id, pos,
            "call refused: the server skipped its stalled position"
        );
        self.idle(RingCallError::Skipped)
    }

    /// This client found an impossible ring state: mark the ring failed (the first fault
    /// found wins) and fail the call.
    #[cold]
    #[inline(never)]
    fn found_fault(&mut self, fault: RingFault) -> RingCallError {
        self.ring_faults += 1;
        let _ =
            self.map
                .hdr_u8::<OFF_RING_FAULT>()
                .compare_exchange(0, fault.code(), AcqRel, Acquire);
        tracing::error!(
            path = %self.path.display(), client_id = self.client_id, %fault,
            "delegation ring corrupt; marked failed"
        );
        self.idle(RingCallError::RingCorrupt(fault));
        self.unusable()
    }

    /// The ring failed, or else the server is gone: the matching sticky error.
    #[cold]
    fn unusable(&mut self) -> RingCallError {
        if self.fault.is_none() {
            self.fault = RingFault::from_code(self.map.hdr_u8::<OFF_RING_FAULT>().load(Acquire));
        }
        match self.fault {
            Some(f) => RingCallError::RingCorrupt(f),
            None => self.disconnect(),
        }
    }

    /// Nothing arrived while calls are outstanding: is the server still there, the ring sound?
    #[cold]
    #[inline(never)]
    fn on_idle(&mut self) -> Result<(), RingCallError> {
        if self.disconnected
            || self.fault.is_some()
            || self.map.hdr_u8::<OFF_SERVER_ALIVE>().load(Acquire) == 0
            || self.map.hdr_u8::<OFF_RING_FAULT>().load(Acquire) != 0
            || (self.liveness_due() && !self.server_lock_held())
        {
            return Err(self.unusable());
        }
        Ok(())
    }

    /// True once per `liveness_interval`.
    fn liveness_due(&mut self) -> bool {
        let now = Instant::now();
        if now >= self.next_liveness_check {
            self.next_liveness_check = now + self.liveness_interval;
            true
        } else {
            false
        }
    }

    /// Whether another open file description (the server's) holds the header lock. A failing
    /// check counts as "not held", so that a waiting client cannot hang.
    fn server_lock_held(&self) -> bool {
        match shm::is_locked_by_other(&self.file, SERVER_LOCK_START, SERVER_LOCK_LEN) {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "server liveness check failed");
                false
            }
        }
    }

    #[cold]
    fn disconnect(&mut self) -> RingCallError {
        if !self.disconnected {
            tracing::debug!(path = %self.path.display(), client_id = self.client_id, "delegation server disconnected");
        }
        self.disconnected = true;
        RingCallError::ServerDisconnected
    }

    #[cold]
    #[inline(never)]
    fn stray_response(&mut self, idx: u32) {
        self.stray_responses += 1;
        tracing::warn!(
            path = %self.path.display(), resp_slot_idx = idx,
            "dropped a response whose call tag is not that of the slot's call"
        );
    }

    #[cold]
    fn corrupt_response(&mut self, idx: u32, len: u32) {
        self.corrupt_responses += 1;
        tracing::warn!(
            path = %self.path.display(), resp_slot_idx = idx, len,
            "response with payload_len above capacity delivered as empty"
        );
    }
}

impl std::fmt::Debug for RingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingClient")
            .field("path", &self.path)
            .field("client_id", &self.client_id)
            .field("generation", &self.generation)
            .field("info", &self.info)
            .field("in_flight", &self.in_flight)
            .field("next_resp_slot", &self.next_resp_slot)
            .field("corrupt_responses", &self.corrupt_responses)
            .field("disconnected", &self.disconnected)
            .finish_non_exhaustive()
    }
}

/// Acquires a client id: fresh ids from `next_client_id` first, then `FREE` records. Returns
/// `(client_id, generation)`, or `None` if every id is taken.
fn acquire_id(file: &File, map: &ShmMap, layout: &Layout) -> std::io::Result<Option<(u32, u32)>> {
    let max = layout.params.max_clients;
    let next = map.u32_at(OFF_NEXT_CLIENT_ID);
    loop {
        let n = next.load(Relaxed);
        if n >= max {
            break;
        }
        if next
            .compare_exchange_weak(n, n + 1, Relaxed, Relaxed)
            .is_err()
        {
            continue;
        }
        if let Some(g) = try_claim(file, map, layout, n)? {
            return Ok(Some((n, g)));
        }
    }
    for id in 0..max {
        let rec = layout.record_offset(id);
        if map.u32_at(rec + REC_STATE).load(Relaxed) != CLIENT_FREE {
            continue;
        }
        if let Some(g) = try_claim(file, map, layout, id)? {
            return Ok(Some((id, g)));
        }
    }
    Ok(None)
}

/// Tries to take client id `id`: lock its record (OFD write lock, non-blocking), then
/// `state: FREE -> ACTIVE`. Returns the record's generation on success.
fn try_claim(file: &File, map: &ShmMap, layout: &Layout, id: u32) -> std::io::Result<Option<u32>> {
    let rec = layout.record_offset(id);
    if !shm::try_lock_write(file, rec as u64, CLIENT_RECORD_SIZE)? {
        return Ok(None); // A live client holds it (or is claiming it right now).
    }
    if map
        .u32_at(rec + REC_STATE)
        .compare_exchange(CLIENT_FREE, CLIENT_ACTIVE, AcqRel, Acquire)
        .is_err()
    {
        shm::unlock(file, rec as u64, CLIENT_RECORD_SIZE)?;
        return Ok(None);
    }
    let generation = map.u32_at(rec + REC_GENERATION).load(Relaxed);
    map.u64_at(rec + REC_RESERVING_POS).store(POS_IDLE, Relaxed);
    map.u32_at(rec + REC_PID).store(std::process::id(), Relaxed);
    map.u32_at(rec + REC_SLEEP).store(0, Relaxed);
    // Reclaim already cleared these; clearing again costs nothing and tolerates a sloppy file.
    for s in 0..layout.params.resp_depth {
        map.u8_at(layout.resp_slot_offset(id, s) + RESP_VALID)
            .store(0, Relaxed);
    }
    Ok(Some(generation))
}

/// Writes an entry's fields into the slot of `pos` and commits it, unless the server has
/// passed `pos` meanwhile (`tail > pos`: it skipped the position because this client stalled
/// for longer than `stall_timeout`); then nothing is committed and false is returned. The
/// commit is a plain store of `COMMITTED(pos)` to the slot's sequence word (Release, so the
/// server's Acquire load of `COMMITTED(pos)` sees the payload). Then `reserving_pos = IDLE`
/// (Release), which also tells a server that holds the slot for this client (see the module
/// docs) that the slot may go to its next writer.
#[inline(always)]
fn commit_entry(
    map: &ShmMap,
    layout: &Layout,
    (pos, off, seq_off): (u64, usize, usize),
    record: usize,
    client_id: u32,
    resp_slot_idx: u32,
    len: u32,
) -> bool {
    debug_assert_eq!(
        (off, seq_off),
        (layout.req_slot_offset(pos), layout.seq_offset(pos))
    );
    const _: () =
        assert!(SLOT_RESP_SLOT_IDX == SLOT_CLIENT_ID + 4 && SLOT_PAYLOAD_LEN == SLOT_CLIENT_ID + 8);
    let [id, idx, plen] = map.u32x3_at(off + SLOT_CLIENT_ID);
    id.store(client_id, Relaxed);
    idx.store(resp_slot_idx, Relaxed);
    plen.store(len, Relaxed);
    // The refusal check. A stall that ends between this load and the store below commits an
    // entry the server no longer reads: it drops and counts it when it releases the slot
    // (`late_commits_dropped`), and the call ends by its deadline.
    let committed = map.hdr_u64::<OFF_TAIL>().load(Acquire) <= pos;
    if committed {
        map.u64_at(seq_off)
            .store(seq_word(pos, SEQ_COMMITTED), Release);
    }
    map.u64_at(record + REC_RESERVING_POS)
        .store(POS_IDLE, Release);
    // The client's half of the server's sleep (module `sleep`): a sleeping server is woken
    // (also for an entry it will drop, so that it frees the position at once).
    let server_sleep = map.hdr_u32::<OFF_SERVER_SLEEP>();
    if server_sleep.load(SeqCst) != 0 {
        sleep::wake(server_sleep);
    }
    committed
}

/// Commits the claimed slot as aborted if the payload writer of `try_call_with` unwinds.
struct AbortOnUnwind<'a> {
    map: &'a ShmMap,
    layout: &'a Layout,
    pos: u64,
    record: usize,
    client_id: u32,
}

impl Drop for AbortOnUnwind<'_> {
    fn drop(&mut self) {
        let _ = commit_entry(
            self.map,
            self.layout,
            self.layout.slot_at(self.pos),
            self.record,
            self.client_id,
            0,
            ABORTED_PAYLOAD_LEN,
        );
    }
}

impl Drop for RingClient {
    /// Marks the id `DETACHED` (Release) and releases the record lock; the server reclaims it.
    fn drop(&mut self) {
        if self.crashed {
            return;
        }
        self.map
            .u64_at(self.record + REC_RESERVING_POS)
            .store(POS_IDLE, Release);
        self.map
            .u32_at(self.record + REC_STATE)
            .store(CLIENT_DETACHED, Release);
        let _ = shm::unlock(&self.file, self.record as u64, CLIENT_RECORD_SIZE);
    }
}

/// Test hooks: they break the protocol on purpose, or stop a call between its steps, and exist
/// only for the crate's tests (cargo feature `test-hooks`, which the crate enables for its own
/// tests through a dev-dependency on itself; never enable it in production).
#[cfg(feature = "test-hooks")]
impl RingClient {
    /// Reserves a position (call steps 1, 4-5) and returns it without ever claiming or
    /// committing it, leaving `reserving_pos == pos`: what a client that dies mid-call leaves
    /// behind. The client must not make calls afterwards (follow with `__crash`, drop, or
    /// process exit).
    pub fn __reserve_without_commit(&mut self) -> Result<u64, RingCallError> {
        self.check_usable()?;
        self.reserve(&mut Deadline::After(self.send_timeout))
    }

    /// Call steps 1-5 of [`try_call_with_deadline`](Self::try_call_with_deadline): the call
    /// stops after reserving its position (`reserving_pos == pos`, slot not claimed). Continue
    /// with [`__claim`](Self::__claim) and [`__finish`](Self::__finish), exactly as the real
    /// call does, to play a client that stalls at that point. Make no other call meanwhile.
    pub fn __begin(&mut self, deadline: Instant) -> Result<PendingCall, RingCallError> {
        self.begin(&mut Deadline::At(deadline))
    }

    /// Call step 6 (the slot check) of a call stopped by [`__begin`](Self::__begin). Where the
    /// real call would reserve again (the server passed the position because the slot is
    /// still held by an earlier lap's writer), returns [`RingCallError::Skipped`].
    pub fn __claim(
        &mut self,
        pending: &PendingCall,
        deadline: Instant,
    ) -> Result<(), RingCallError> {
        match self.claim(pending, &mut Deadline::At(deadline))? {
            true => Ok(()),
            false => Err(self.refused(pending.pos)),
        }
    }

    /// Call steps 7-9 (write, commit) of a call stopped by [`__begin`](Self::__begin) and
    /// claimed with [`__claim`](Self::__claim).
    pub fn __finish(
        &mut self,
        pending: PendingCall,
        write: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RingCallError> {
        self.finish(pending, write)
    }

    /// Simulates the death of this client's process: releases the record lock without marking
    /// the record `DETACHED` and without touching shared memory again.
    pub fn __crash(mut self) {
        self.crashed = true;
        let _ = shm::unlock(&self.file, self.record as u64, CLIENT_RECORD_SIZE);
    }

    /// Reserves a position, checks its slot and commits an arbitrary entry in it: the given
    /// `client_id`, `resp_slot_idx` and `payload_len` fields, and `bytes` (truncated to
    /// `req_payload_cap`) as payload. Returns the position. Bypasses all client-side
    /// bookkeeping.
    pub fn __raw_commit(
        &mut self,
        client_id: u32,
        resp_slot_idx: u32,
        payload_len: u32,
        bytes: &[u8],
    ) -> Result<u64, RingCallError> {
        let mut deadline = Deadline::After(self.send_timeout);
        let pos = self.__reserve_without_commit()?;
        let pending = PendingCall {
            pos,
            idx: 0,
            seq_off: self.layout.seq_offset(pos),
        };
        if !self.claim(&pending, &mut deadline)? {
            return Err(self.refused(pos));
        }
        let off = self.layout.req_slot_offset(pos);
        let n = bytes.len().min(self.layout.params.req_payload_cap as usize);
        let dst = self.map.bytes(off + SLOT_PAYLOAD, n);
        // SAFETY: in-bounds (checked by `bytes`) and owned by this client until the commit, as
        // in `finish`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, n) };
        if !commit_entry(
            &self.map,
            &self.layout,
            self.layout.slot_at(pos),
            self.record,
            client_id,
            resp_slot_idx,
            payload_len,
        ) {
            return Err(self.refused(pos));
        }
        Ok(pos)
    }
}

//! A producer of the ring: [`RingClient`]. Source: seeds/004 §2.2 (Client call() — 2-phase
//! commit, Client poll()), plus client ids, liveness bookkeeping and server-death detection
//! described in the module docs.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::fence;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use super::config::RingInfo;
use super::error::{CallError, RingError};
use super::header;
use super::layout::*;
use super::shm::{self, ShmMap};

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
    /// Round-robin start for picking a response slot. Source: seeds/004 §2.2 call() step 2.
    next_resp_slot: u32,
    in_flight: usize,
    /// One bit per response slot: a call is outstanding on it.
    outstanding: Box<[u64]>,
    /// Copy of the current response (`resp_payload_cap` bytes).
    scratch: Box<[u8]>,
    liveness_interval: Duration,
    next_liveness_check: Instant,
    corrupt_responses: u64,
    /// Sticky: the server was found dead or shut down.
    disconnected: bool,
    /// Test hook `__crash` was used: `Drop` must not touch shared state.
    crashed: bool,
}

impl RingClient {
    /// Attaches to the ring `/dev/shm/NAME` (`name` is `"kv0"` or `"/kv0"`).
    ///
    /// Validates the whole header before mapping the file (see [`RingError`] for the failure
    /// modes: missing file, wrong magic or version, inconsistent sizes, truncated file), checks
    /// that a live server holds the ring, and acquires a client id: first a fresh one from
    /// `next_client_id`, then any `FREE` (reclaimed) one. Fails with
    /// [`RingError::NoFreeClientId`] if all `max_clients` ids are in use.
    pub fn attach(name: &str) -> Result<Self, RingError> {
        let (_, path) = shm::shm_path(name)?;
        let io = |op| {
            let path = path.clone();
            move |source| RingError::Io { path, op, source }
        };
        let file = match shm::open_existing(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(RingError::NotFound { path });
            }
            Err(e) => return Err(io("open")(e)),
        };
        let hdr = header::read_and_validate(&file, &path)?;
        let layout = hdr.layout;
        let map = ShmMap::map(&file, layout.total_size).map_err(io("mmap"))?;
        let server_locked = shm::is_locked_by_other(&file, SERVER_LOCK_START, SERVER_LOCK_LEN)
            .map_err(io("fcntl(F_OFD_GETLK)"))?;
        if !server_locked || map.u8_at(OFF_SERVER_ALIVE).load(Acquire) == 0 {
            return Err(RingError::ServerNotRunning { path });
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
            map,
            layout,
            info: hdr.info(),
            client_id,
            generation,
            next_resp_slot: 0,
            in_flight: 0,
            outstanding: vec![0u64; (p.resp_depth as usize).div_ceil(64)].into_boxed_slice(),
            scratch: vec![0u8; p.resp_payload_cap as usize].into_boxed_slice(),
            liveness_interval: hdr.liveness_interval,
            next_liveness_check: Instant::now() + hdr.liveness_interval,
            corrupt_responses: 0,
            disconnected: false,
            crashed: false,
        })
    }

    /// The ring's parameters (from the header).
    pub fn info(&self) -> RingInfo {
        self.info
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

    /// Responses whose `payload_len` exceeded `resp_payload_cap` (only a misbehaving writer of
    /// shared memory can cause this); each was delivered as an empty message.
    pub fn corrupt_responses(&self) -> u64 {
        self.corrupt_responses
    }

    /// Sends `payload` as a request. Returns the response slot index that
    /// [`poll`](Self::poll) will report the response under.
    ///
    /// Errors: [`CallError::PayloadTooLarge`] if `payload` exceeds `req_payload_cap`, and
    /// otherwise as [`try_call_with`](Self::try_call_with). Blocks (spinning, then yielding)
    /// only while the ring is full.
    #[inline]
    pub fn try_call(&mut self, payload: &[u8]) -> Result<u32, CallError> {
        let cap = self.layout.params.req_payload_cap as usize;
        if payload.len() > cap {
            return Err(CallError::PayloadTooLarge {
                len: payload.len(),
                cap,
            });
        }
        self.try_call_with(|buf| {
            buf[..payload.len()].copy_from_slice(payload);
            payload.len()
        })
    }

    /// Sends a request that `write` produces directly in the reserved request slot: `write`
    /// gets the slot's payload area (`req_payload_cap` bytes of shared memory) and returns the
    /// number of bytes used. Source: seeds/004 §2.2 Client call() — 2-phase commit:
    ///
    /// 1. `server_alive` (Acquire) false → [`CallError::ServerDisconnected`].
    /// 2. Pick a free response slot round-robin; none free → [`CallError::WouldBlock`] (nothing
    ///    reserved).
    /// 3. `reserving_pos = RESERVING`; `pos = head.fetch_add(1, Release)`; `reserving_pos = pos`.
    ///    (Release, not the seed's Relaxed, so that a server whose `head.load(Acquire)` covers
    ///    `pos` also sees `RESERVING` in this client's record: the hole check relies on it.)
    /// 4. Wait until `pos - tail < ring_depth` (spin, then yield; every `liveness_interval`
    ///    check the server is alive, else [`CallError::ServerDisconnected`]).
    /// 5. Write `client_id`, `resp_slot_idx`, `payload_len` and the payload (`write`).
    /// 6. `fence(Release)`; `committed = 1` (Release).
    /// 7. `reserving_pos = IDLE` (Release); the slot is now outstanding.
    ///
    /// If `write` returns more than the capacity ([`CallError::PayloadTooLarge`]) or panics, the
    /// reserved position is committed as an *aborted* entry that the server skips, so the ring
    /// never stalls on it.
    #[inline]
    pub fn try_call_with(
        &mut self,
        write: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, CallError> {
        if self.disconnected || self.map.u8_at(OFF_SERVER_ALIVE).load(Acquire) == 0 {
            return Err(self.disconnect());
        }
        let p = self.layout.params;
        if self.in_flight == p.resp_depth as usize {
            return Err(CallError::WouldBlock);
        }
        let idx = self.pick_free_slot();
        let pos = self.reserve()?;
        let off = self.layout.req_slot_offset(pos);
        let cap = p.req_payload_cap as usize;
        let dst = self.map.bytes(off + SLOT_PAYLOAD, cap);
        let guard = AbortOnUnwind {
            map: &self.map,
            slot: off,
            record: self.record,
            client_id: self.client_id,
        };
        // SAFETY: `dst` is the in-bounds payload area (`cap` bytes) of the slot for `pos`. This
        // client owns it exclusively from the reservation until its commit: no other client
        // got `pos` from `fetch_add`, positions `pos - k * ring_depth` were all consumed by the
        // server (`pos - tail < ring_depth`, and the server reads a slot only while it is
        // committed and clears `committed` before advancing `tail`), and the server reads it
        // only after `committed = 1`, stored below.
        let len = write(unsafe { std::slice::from_raw_parts_mut(dst, cap) });
        std::mem::forget(guard);
        if len > cap {
            abort_entry(&self.map, off, self.record, self.client_id);
            return Err(CallError::PayloadTooLarge { len, cap });
        }
        self.map
            .u32_at(off + SLOT_CLIENT_ID)
            .store(self.client_id, Relaxed);
        self.map
            .u32_at(off + SLOT_RESP_SLOT_IDX)
            .store(idx, Relaxed);
        self.map
            .u32_at(off + SLOT_PAYLOAD_LEN)
            .store(len as u32, Relaxed);
        fence(Release);
        self.map.u8_at(off + SLOT_COMMITTED).store(1, Release);
        self.map
            .u64_at(self.record + REC_RESERVING_POS)
            .store(POS_IDLE, Release);
        self.outstanding[idx as usize / 64] |= 1 << (idx % 64);
        self.in_flight += 1;
        self.next_resp_slot = (idx + 1) & (p.resp_depth - 1);
        Ok(idx)
    }

    /// Delivers the responses that have arrived. Source: seeds/004 §2.2 Client poll().
    ///
    /// Scans only the response slots with a call outstanding; for each with `valid != 0`
    /// (Acquire): copies the response out, clears `valid` (Release), frees the slot and calls
    /// `on_response(resp_slot_idx, bytes)`. Returns the number delivered.
    ///
    /// When nothing arrived and calls are outstanding, checks the server's liveness
    /// (`server_alive` every time, its lock every `liveness_interval`) and returns
    /// [`CallError::ServerDisconnected`] if it is gone, so a caller waiting for a response
    /// never spins forever. Responses that arrived before the server died are still delivered.
    ///
    /// A response slot whose `payload_len` exceeds `resp_payload_cap` (only a misbehaving
    /// writer of the shared memory can do that) is delivered as an empty message, so the
    /// caller sees a decode error for that call instead of waiting forever, and is counted in
    /// [`corrupt_responses`](Self::corrupt_responses).
    #[inline]
    pub fn poll(&mut self, on_response: impl FnMut(u32, &[u8])) -> Result<usize, CallError> {
        self.poll_up_to(usize::MAX, on_response)
    }

    /// [`poll`](Self::poll), delivering at most `max` responses (`max >= 1`); the others stay
    /// in their slots for the next poll.
    #[inline]
    pub fn poll_up_to(
        &mut self,
        max: usize,
        mut on_response: impl FnMut(u32, &[u8]),
    ) -> Result<usize, CallError> {
        if self.in_flight == 0 {
            return if self.disconnected {
                Err(CallError::ServerDisconnected)
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
                let off = self.layout.resp_slot_offset(self.client_id, idx);
                let valid = self.map.u8_at(off + RESP_VALID);
                if valid.load(Acquire) == 0 {
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

    /// Slow liveness check: fails with [`CallError::ServerDisconnected`] if the server shut down
    /// (`server_alive == false`) or its process is gone (no lock on the header, checked with
    /// `F_OFD_GETLK`). Once disconnected, a client stays disconnected.
    pub fn check_server(&mut self) -> Result<(), CallError> {
        if self.disconnected
            || self.map.u8_at(OFF_SERVER_ALIVE).load(Acquire) == 0
            || !self.server_lock_held()
        {
            return Err(self.disconnect());
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

    /// Steps 3 and 4 of a call: reserves a position and waits until its slot is free.
    #[inline]
    fn reserve(&mut self) -> Result<u64, CallError> {
        let rp = self.map.u64_at(self.record + REC_RESERVING_POS);
        rp.store(POS_RESERVING, Relaxed);
        let pos = self.map.u64_at(OFF_HEAD).fetch_add(1, Release);
        // Release: a server that reads `pos` here also sees this client's earlier commits.
        rp.store(pos, Release);
        let tail = self.map.u64_at(OFF_TAIL).load(Acquire);
        if pos.wrapping_sub(tail) >= u64::from(self.layout.params.ring_depth) {
            self.wait_for_room(pos)?;
        }
        Ok(pos)
    }

    /// The ring is full: wait until `pos - tail < ring_depth`, with exponential backoff that
    /// ends in `yield`, checking server liveness every `liveness_interval`.
    #[cold]
    #[inline(never)]
    fn wait_for_room(&mut self, pos: u64) -> Result<(), CallError> {
        let depth = u64::from(self.layout.params.ring_depth);
        let backoff = Backoff::new();
        loop {
            backoff.snooze();
            let tail = self.map.u64_at(OFF_TAIL).load(Acquire);
            if pos.wrapping_sub(tail) < depth {
                return Ok(());
            }
            let dead = self.map.u8_at(OFF_SERVER_ALIVE).load(Acquire) == 0
                || (self.liveness_due() && !self.server_lock_held());
            if dead {
                // The reserved position is abandoned: there is no server to consume it.
                self.map
                    .u64_at(self.record + REC_RESERVING_POS)
                    .store(POS_IDLE, Release);
                return Err(self.disconnect());
            }
        }
    }

    /// Nothing arrived while calls are outstanding: is the server still there?
    #[cold]
    #[inline(never)]
    fn on_idle(&mut self) -> Result<(), CallError> {
        if self.disconnected
            || self.map.u8_at(OFF_SERVER_ALIVE).load(Acquire) == 0
            || (self.liveness_due() && !self.server_lock_held())
        {
            return Err(self.disconnect());
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
    fn disconnect(&mut self) -> CallError {
        if !self.disconnected {
            tracing::debug!(path = %self.path.display(), client_id = self.client_id, "delegation server disconnected");
        }
        self.disconnected = true;
        CallError::ServerDisconnected
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
    // Reclaim already cleared these; clearing again costs nothing and tolerates a sloppy file.
    for s in 0..layout.params.resp_depth {
        map.u8_at(layout.resp_slot_offset(id, s) + RESP_VALID)
            .store(0, Relaxed);
    }
    Ok(Some(generation))
}

/// Commits the reserved slot at byte offset `slot` as an aborted entry
/// (`payload_len = ABORTED_PAYLOAD_LEN`) and clears the record's `reserving_pos`.
fn abort_entry(map: &ShmMap, slot: usize, record: usize, client_id: u32) {
    map.u32_at(slot + SLOT_CLIENT_ID).store(client_id, Relaxed);
    map.u32_at(slot + SLOT_RESP_SLOT_IDX).store(0, Relaxed);
    map.u32_at(slot + SLOT_PAYLOAD_LEN)
        .store(ABORTED_PAYLOAD_LEN, Relaxed);
    fence(Release);
    map.u8_at(slot + SLOT_COMMITTED).store(1, Release);
    map.u64_at(record + REC_RESERVING_POS)
        .store(POS_IDLE, Release);
}

/// Commits the slot as aborted if the payload writer of `try_call_with` unwinds.
struct AbortOnUnwind<'a> {
    map: &'a ShmMap,
    slot: usize,
    record: usize,
    client_id: u32,
}

impl Drop for AbortOnUnwind<'_> {
    fn drop(&mut self) {
        abort_entry(self.map, self.slot, self.record, self.client_id);
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

/// Test hooks: they break the protocol on purpose and exist only for the crate's tests.
#[doc(hidden)]
impl RingClient {
    /// Reserves a position (call steps 1, 3 and 4) and returns it without ever committing it,
    /// leaving `reserving_pos == pos`: what a client that dies mid-call leaves behind. The
    /// client must not make calls afterwards (follow with `__crash`, drop, or process exit).
    pub fn __reserve_without_commit(&mut self) -> Result<u64, CallError> {
        if self.disconnected || self.map.u8_at(OFF_SERVER_ALIVE).load(Acquire) == 0 {
            return Err(self.disconnect());
        }
        self.reserve()
    }

    /// Simulates the death of this client's process: releases the record lock without marking
    /// the record `DETACHED` and without touching shared memory again.
    pub fn __crash(mut self) {
        self.crashed = true;
        let _ = shm::unlock(&self.file, self.record as u64, CLIENT_RECORD_SIZE);
    }

    /// Reserves a position and commits an arbitrary entry in it: the given `client_id`,
    /// `resp_slot_idx` and `payload_len` fields, and `bytes` (truncated to `req_payload_cap`)
    /// as payload. Returns the position. Bypasses all client-side bookkeeping.
    pub fn __raw_commit(
        &mut self,
        client_id: u32,
        resp_slot_idx: u32,
        payload_len: u32,
        bytes: &[u8],
    ) -> Result<u64, CallError> {
        let pos = self.__reserve_without_commit()?;
        let off = self.layout.req_slot_offset(pos);
        let n = bytes.len().min(self.layout.params.req_payload_cap as usize);
        let dst = self.map.bytes(off + SLOT_PAYLOAD, n);
        // SAFETY: in-bounds (checked by `bytes`) and owned by this client until the commit, as
        // in `try_call_with`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, n) };
        self.map
            .u32_at(off + SLOT_CLIENT_ID)
            .store(client_id, Relaxed);
        self.map
            .u32_at(off + SLOT_RESP_SLOT_IDX)
            .store(resp_slot_idx, Relaxed);
        self.map
            .u32_at(off + SLOT_PAYLOAD_LEN)
            .store(payload_len, Relaxed);
        fence(Release);
        self.map.u8_at(off + SLOT_COMMITTED).store(1, Release);
        self.map
            .u64_at(self.record + REC_RESERVING_POS)
            .store(POS_IDLE, Release);
        Ok(pos)
    }
}

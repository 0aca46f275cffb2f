//! Byte layout of the shared-memory ring file: every offset, constant and size computation.
//!
//! The authority is seeds/004 §2.1 ("共有メモリレイアウト"). Fields that the seed does not define
//! live in bytes the seed marks as padding and are labelled "extension, seed: padding"; the
//! client table is appended after the seed's last region and is labelled "extension, seed: none".
//! Nothing here touches memory: these are plain numbers, and [`Layout`] is the single place where
//! region sizes are derived from the configuration (with overflow checks), used identically when
//! the server creates the file and when a client validates it.
//!
//! ```text
//! 0        Header (128 B)                     seeds/004 §2.1 Header
//! 128      Ring Control: head @128, tail @192 seeds/004 §2.1 Ring Control
//! 256      ring_depth request slots           seeds/004 §2.1 Request Ring Slot
//! resp     max_clients*resp_depth resp slots  seeds/004 §2.1 Response Slot
//! table    max_clients client records (128 B)  extension, seed: none
//! seq      ring_depth slot sequence words (64 B) extension, seed: none
//! total
//! ```

/// File magic, "DLGRPCV1" read as a big-endian `u64`. Source: seeds/004 §2.1.
pub const MAGIC: u64 = 0x444C_4752_5043_5631;
/// Layout version written at [`OFF_VERSION`]. Seeds/004 §2.1 Header has 1 (初期値 1); this
/// implementation writes 4: its request slot header differs from the seed's (the sequence
/// word, [`SLOT_SEQ`]), so a build with the seed's layout refuses the ring with a clear version
/// error instead of misreading slots; version 2 had the same layout but a claim/commit protocol
/// with two more sequence states (a CAS claim), which must not meet this one on a ring;
/// version 3 had no wake words ([`OFF_SERVER_SLEEP`], [`OFF_CLIENT_SLEEP_ARMED`],
/// [`REC_SLEEP`]): its
/// clients would never wake a server of this version that sleeps.
pub const VERSION: u32 = 4;

/// Cache-line size every region and slot is aligned to, in bytes. Source: seeds/004 §2.1
/// ("各 64B アラインメント").
pub const CACHE_LINE: u64 = 64;

// ---------------------------------------------------------------------------------------------
// Header (128 bytes at offset 0). Source: seeds/004 §2.1 Header.
// ---------------------------------------------------------------------------------------------

/// Size of the header, in bytes (two cache lines). Source: seeds/004 §2.1 Header.
pub const HEADER_SIZE: u64 = 128;
/// `u64` magic. Source: seeds/004 §2.1 Header.
pub const OFF_MAGIC: usize = 0;
/// `u32` version. Source: seeds/004 §2.1 Header.
pub const OFF_VERSION: usize = 8;
/// `u32` max_clients. Source: seeds/004 §2.1 Header.
pub const OFF_MAX_CLIENTS: usize = 12;
/// `u32` ring_depth (power of two). Source: seeds/004 §2.1 Header.
pub const OFF_RING_DEPTH: usize = 16;
/// `u32` resp_depth (power of two). Source: seeds/004 §2.1 Header.
pub const OFF_RESP_DEPTH: usize = 20;
/// `AtomicU32` next_client_id (initially 0). Source: seeds/004 §2.1 Header.
pub const OFF_NEXT_CLIENT_ID: usize = 24;
/// `AtomicBool` (one byte, 0/1) server_alive. Source: seeds/004 §2.1 Header.
pub const OFF_SERVER_ALIVE: usize = 28;
/// `AtomicU8` ring fault code: 0 while the ring is sound; otherwise the [`RingFault`] code of
/// the first impossible state found in it (by the server or a client), after which every call
/// and poll fails at once and no new client attaches. Extension, seed: padding (byte 29).
///
/// [`RingFault`]: super::RingFault
pub const OFF_RING_FAULT: usize = 29;
/// `u64` schema fingerprint. Extension, seed: padding (bytes 30..127).
pub const OFF_FINGERPRINT: usize = 32;
/// `u32` request payload capacity in bytes. Extension, seed: padding. (The seed sizes slots by
/// `size_of::<Req>()`; a byte ring stores the capacity instead.)
pub const OFF_REQ_PAYLOAD_CAP: usize = 40;
/// `u32` response payload capacity in bytes. Extension, seed: padding.
pub const OFF_RESP_PAYLOAD_CAP: usize = 44;
/// `u32` request slot size in bytes (redundant, cross-checked on attach). Extension, seed: padding.
pub const OFF_REQ_SLOT_SIZE: usize = 48;
/// `u32` response slot size in bytes (redundant, cross-checked). Extension, seed: padding.
pub const OFF_RESP_SLOT_SIZE: usize = 52;
/// `u64` byte offset of the client table (redundant, cross-checked). Extension, seed: padding.
pub const OFF_CLIENT_TABLE_OFFSET: usize = 56;
/// `u64` total file size in bytes (redundant, cross-checked). Extension, seed: padding.
pub const OFF_TOTAL_SIZE: usize = 64;
/// `u32` pid of the creating server process (diagnostics only). Extension, seed: padding.
pub const OFF_SERVER_PID: usize = 72;
/// `u64` server's liveness interval in nanoseconds; clients use it to pace their slow liveness
/// checks. Extension, seed: padding.
pub const OFF_LIVENESS_INTERVAL_NS: usize = 80;
/// `AtomicU32` futex word: 1 while the server may be asleep in
/// [`RingServer::wait_for_request`](super::RingServer::wait_for_request), else 0. A client
/// that finds it non-zero after a commit swaps it to 0 and wakes the server (`FUTEX_WAKE`).
/// In the header's second line, which clients only read (the server writes it when it goes
/// to sleep and when it wakes). Extension, seed: padding (the seed's server never sleeps);
/// see the module docs, "Sleeping".
pub const OFF_SERVER_SLEEP: usize = 76;
/// `AtomicU32` 1 once a client may sleep (a client stores it at its first
/// [`RingClient::wait_for_response`](super::RingClient::wait_for_response), which does not
/// sleep): only then does the server track the clients it replies to and check their
/// [`REC_SLEEP`] words, so a server whose clients never sleep pays nothing for it.
/// Extension, seed: padding.
pub const OFF_CLIENT_SLEEP_ARMED: usize = 88;

/// Byte range `[0, HEADER_SIZE)` on which the server holds an OFD write lock for its lifetime
/// (liveness, extension: the seed has no liveness mechanism beyond `server_alive`).
pub const SERVER_LOCK_START: u64 = 0;
/// Length of the server liveness lock range, in bytes.
pub const SERVER_LOCK_LEN: u64 = HEADER_SIZE;

// ---------------------------------------------------------------------------------------------
// Ring control (128 bytes at offset 128). Source: seeds/004 §2.1 Ring Control.
// ---------------------------------------------------------------------------------------------

/// `AtomicU64` head: next position to reserve, advanced by clients with `fetch_add`.
/// Source: seeds/004 §2.1 Ring Control.
pub const OFF_HEAD: usize = 128;
/// `AtomicU64` tail: first position not yet consumed, stored by the server (on its own cache
/// line, away from `head`). Source: seeds/004 §2.1 Ring Control.
pub const OFF_TAIL: usize = 192;

// ---------------------------------------------------------------------------------------------
// Request ring slots (from offset 256). Source: seeds/004 §2.1 Request Ring Slot.
// ---------------------------------------------------------------------------------------------

/// Offset of request slot 0, in bytes. Source: seeds/004 §2.1 Request Ring Slot.
pub const RING_SLOTS_OFFSET: u64 = 256;
/// Bytes of slot metadata before the request payload: 24 (seeds/004 §2.1 has
/// `16 + size_of::<Req>()`; the 8 more bytes hold the sequence word, see [`SLOT_SEQ`]).
pub const REQ_SLOT_HEADER: u64 = 24;
/// `AtomicU64` sequence word `pos << 2 | state` ([`seq_word`]). It replaces the seed's
/// `AtomicU8 committed` (+0, seeds/004 §2.1) as the slot's commit flag and also names the
/// position (lap) it belongs to, so a late commit of a position the server skipped cannot be
/// taken for a commit of a later lap of the same slot. It sits in the slot's first cache line,
/// with the header the server reads next, so a call moves no extra line between the cores.
/// Extension (deviation), see the module docs.
pub const SLOT_SEQ: usize = 0;
/// `u32` client_id. Source: seeds/004 §2.1 (at +4 there; moved by [`SLOT_SEQ`]).
pub const SLOT_CLIENT_ID: usize = 8;
/// `u32` resp_slot_idx. Source: seeds/004 §2.1 (at +8 there).
pub const SLOT_RESP_SLOT_IDX: usize = 12;
/// `u32` payload length in bytes. Extension, seed: none.
pub const SLOT_PAYLOAD_LEN: usize = 16;
/// Start of the request payload (8-aligned). Source: seeds/004 §2.1 (at +16 there).
pub const SLOT_PAYLOAD: usize = 24;
/// `payload_len` value a client commits when it must give up a reserved slot without a request
/// (its payload writer panicked or returned a length above the capacity). The server consumes
/// such an entry silently (counted as `aborted`). Extension, seed: none.
pub const ABORTED_PAYLOAD_LEN: u32 = u32::MAX;

// ---------------------------------------------------------------------------------------------
// Response slots (right after the ring). Source: seeds/004 §2.1 Response Slot.
// ---------------------------------------------------------------------------------------------

/// Bytes of slot metadata before the response payload. Source: seeds/004 §2.1 (`8 + size_of::<Resp>()`).
pub const RESP_SLOT_HEADER: u64 = 8;
/// `AtomicU8` valid (0 = empty, 1 = response present). Source: seeds/004 §2.1.
pub const RESP_VALID: usize = 0;
/// `u16` call tag: the low 16 bits of the ring position of the request this response answers.
/// The client delivers a response only if the tag is that of the call outstanding on the
/// slot, so an answer to an entry whose metadata was overwritten to name this slot is dropped
/// (and counted), never taken for another call's. Extension, seed: padding (+1..+7).
pub const RESP_TAG: usize = 2;
/// `u32` payload length in bytes. Extension, seed: padding (+1..+7).
pub const RESP_PAYLOAD_LEN: usize = 4;
/// Start of the response payload. Source: seeds/004 §2.1.
pub const RESP_PAYLOAD: usize = 8;

// ---------------------------------------------------------------------------------------------
// Client table (after the response slots). Extension, seed: none.
// ---------------------------------------------------------------------------------------------

/// Size of one client record, in bytes (two cache lines). Extension, seed: none.
///
/// The first line holds what the server reads on every `recv`/`reply` (state, generation,
/// pid) and the client writes only at attach/detach; the second holds `reserving_pos`, which
/// the client writes three times per call. Keeping them apart stops each call from pulling the
/// server's read-mostly line into the client's cache.
pub const CLIENT_RECORD_SIZE: u64 = 128;
/// `AtomicU32` record state: [`CLIENT_FREE`], [`CLIENT_ACTIVE`] or [`CLIENT_DETACHED`].
pub const REC_STATE: usize = 0;
/// `AtomicU32` generation, bumped by the server every time the id is reclaimed.
pub const REC_GENERATION: usize = 4;
/// `AtomicU64` reserving_pos: [`POS_IDLE`], [`POS_RESERVING`] or the position reserved by the
/// owner's in-progress call.
pub const REC_RESERVING_POS: usize = 64;
/// `u32` pid of the owning process (diagnostics only).
pub const REC_PID: usize = 8;
/// `AtomicU32` futex word: 1 while the owner may be asleep waiting for a response, else 0.
/// The server swaps it to 0 and wakes the owner after publishing replies to it. In the
/// record's first line, which the server reads on every reply
/// anyway and the owner writes only when it goes to sleep and wakes.
pub const REC_SLEEP: usize = 12;

/// Record state: unowned; all of the id's response slots have `valid == 0`.
pub const CLIENT_FREE: u32 = 0;
/// Record state: owned by a client that holds the OFD lock on the record.
pub const CLIENT_ACTIVE: u32 = 1;
/// Record state: the owner detached cleanly; the server reclaims the id.
pub const CLIENT_DETACHED: u32 = 2;

/// `reserving_pos`: no call in progress.
pub const POS_IDLE: u64 = u64::MAX;
/// `reserving_pos`: about to `fetch_add` head (or just did, and has not stored the result yet).
pub const POS_RESERVING: u64 = u64::MAX - 1;

// ---------------------------------------------------------------------------------------------
// Slot sequence words (at the start of each request slot). Extension, seed: none.
// ---------------------------------------------------------------------------------------------

/// Sequence state: the slot is free for the writer of the word's position. Stored by the
/// server (after consuming the previous lap, or when it releases a held slot or skips a
/// position nobody will write) with Release; a writer loads it with Acquire before writing.
pub const SEQ_FREE: u64 = 0;
/// Sequence state: the entry of the word's position is committed (the seed's `committed = 1`).
/// Stored only by the writer of that position, with Release, after its last write to the slot.
pub const SEQ_COMMITTED: u64 = 2;
/// Largest position a sequence word can name (`pos << 2` must not overflow). A `head` above it
/// is impossible: it would take 2^62 reservations.
pub const MAX_POS: u64 = (1 << 62) - 1;

/// The sequence word for `pos` in `state` (`SEQ_*`): `pos << 2 | state`.
#[inline]
pub const fn seq_word(pos: u64, state: u64) -> u64 {
    (pos << 2) | state
}

/// The position a sequence word names.
#[inline]
pub const fn seq_pos(word: u64) -> u64 {
    word >> 2
}

/// The state (`SEQ_*`) of a sequence word.
#[inline]
pub const fn seq_state(word: u64) -> u64 {
    word & 3
}

// ---------------------------------------------------------------------------------------------
// Limits.
// ---------------------------------------------------------------------------------------------

/// Largest accepted `max_clients` (ids are `u32`, the table is one record per id).
pub const MAX_CLIENTS_LIMIT: u32 = 65_536;
/// Largest accepted `resp_depth` (bounds the client's local outstanding-slot bitset).
pub const MAX_RESP_DEPTH: u32 = 65_536;
/// Largest accepted `ring_depth` (positions are `u64`; the physical index is `pos & (depth-1)`).
pub const MAX_RING_DEPTH: u32 = 1 << 30;
/// Largest accepted payload capacity, in bytes (bounds the local scratch buffers: 16 MiB).
pub const MAX_PAYLOAD_CAP: u32 = 1 << 24;
/// Largest accepted total file size, in bytes (1 TiB).
pub const MAX_TOTAL_SIZE: u64 = 1 << 40;
/// Largest accepted liveness interval stored in the header, in nanoseconds (60 s).
pub const MAX_LIVENESS_INTERVAL_NS: u64 = 60_000_000_000;

/// Rounds `x` up to a multiple of `a` (a power of two); `None` on overflow.
#[inline]
pub const fn align_up(x: u64, a: u64) -> Option<u64> {
    match x.checked_add(a - 1) {
        Some(v) => Some(v & !(a - 1)),
        None => None,
    }
}

/// The five numbers that determine a ring file's layout (what the header stores at offsets
/// 12..24 and 40..48).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutParams {
    /// Number of client ids (and client records).
    pub max_clients: u32,
    /// Number of request slots (power of two).
    pub ring_depth: u32,
    /// Response slots per client (power of two).
    pub resp_depth: u32,
    /// Request payload capacity, bytes.
    pub req_payload_cap: u32,
    /// Response payload capacity, bytes.
    pub resp_payload_cap: u32,
}

/// All derived sizes and offsets of a ring file, in bytes. Built only by [`Layout::new`], so a
/// `Layout` value is always internally consistent and every offset it produces for in-range
/// indices lies inside `[0, total_size)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The validated parameters.
    pub params: LayoutParams,
    /// `align_up(16 + req_payload_cap, 64)`. Source: seeds/004 §2.1 Request Ring Slot.
    pub req_slot_size: u32,
    /// `align_up(8 + resp_payload_cap, 64)`. Source: seeds/004 §2.1 Response Slot.
    pub resp_slot_size: u32,
    /// `256 + ring_depth * req_slot_size`. Source: seeds/004 §2.1 ("Request Ring の直後").
    pub resp_area_offset: u64,
    /// `resp_area_offset + max_clients * resp_depth * resp_slot_size`. Extension, seed: none.
    pub client_table_offset: u64,
    /// `client_table_offset + max_clients * CLIENT_RECORD_SIZE`: the file size.
    pub total_size: u64,
}

/// Why a set of [`LayoutParams`] is unacceptable (a human-readable reason naming the values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutError(pub String);

impl Layout {
    /// Validates `p` and computes the layout. Rejects zero or non-power-of-two depths, limits
    /// above the `MAX_*` constants, and any size that overflows `u32` (slot sizes) or exceeds
    /// [`MAX_TOTAL_SIZE`].
    pub fn new(p: LayoutParams) -> Result<Self, LayoutError> {
        let err = |s: String| Err(LayoutError(s));
        if p.max_clients == 0 || p.max_clients > MAX_CLIENTS_LIMIT {
            return err(format!(
                "max_clients = {} must be in 1..={MAX_CLIENTS_LIMIT}",
                p.max_clients
            ));
        }
        if !p.ring_depth.is_power_of_two() || p.ring_depth > MAX_RING_DEPTH {
            return err(format!(
                "ring_depth = {} must be a power of two in 1..={MAX_RING_DEPTH}",
                p.ring_depth
            ));
        }
        if !p.resp_depth.is_power_of_two() || p.resp_depth > MAX_RESP_DEPTH {
            return err(format!(
                "resp_depth = {} must be a power of two in 1..={MAX_RESP_DEPTH}",
                p.resp_depth
            ));
        }
        if p.req_payload_cap > MAX_PAYLOAD_CAP {
            return err(format!(
                "req_payload_cap = {} bytes exceeds {MAX_PAYLOAD_CAP}",
                p.req_payload_cap
            ));
        }
        if p.resp_payload_cap > MAX_PAYLOAD_CAP {
            return err(format!(
                "resp_payload_cap = {} bytes exceeds {MAX_PAYLOAD_CAP}",
                p.resp_payload_cap
            ));
        }
        // With the caps bounded above these cannot overflow, but keep the arithmetic checked.
        let req_slot = align_up(REQ_SLOT_HEADER + u64::from(p.req_payload_cap), CACHE_LINE);
        let resp_slot = align_up(RESP_SLOT_HEADER + u64::from(p.resp_payload_cap), CACHE_LINE);
        let (Some(req_slot), Some(resp_slot)) = (req_slot, resp_slot) else {
            return err("slot size overflows".into());
        };
        let (Ok(req_slot_size), Ok(resp_slot_size)) =
            (u32::try_from(req_slot), u32::try_from(resp_slot))
        else {
            return err(format!(
                "slot sizes {req_slot} / {resp_slot} bytes do not fit in u32"
            ));
        };
        let total = || -> Option<(u64, u64, u64)> {
            let resp_area =
                RING_SLOTS_OFFSET.checked_add(u64::from(p.ring_depth).checked_mul(req_slot)?)?;
            let resp_bytes = u64::from(p.max_clients)
                .checked_mul(u64::from(p.resp_depth))?
                .checked_mul(resp_slot)?;
            let table = resp_area.checked_add(resp_bytes)?;
            let total = table.checked_add(u64::from(p.max_clients) * CLIENT_RECORD_SIZE)?;
            Some((resp_area, table, total))
        };
        let Some((resp_area_offset, client_table_offset, total_size)) = total() else {
            return err("total size overflows u64".into());
        };
        if total_size > MAX_TOTAL_SIZE || usize::try_from(total_size).is_err() {
            return err(format!(
                "total size {total_size} bytes exceeds the limit of {MAX_TOTAL_SIZE} bytes"
            ));
        }
        Ok(Self {
            params: p,
            req_slot_size,
            resp_slot_size,
            resp_area_offset,
            client_table_offset,
            total_size,
        })
    }

    /// Byte offset of the request slot holding position `pos` (`pos & (ring_depth - 1)`).
    /// Always in bounds. Source: seeds/004 §2.1 ("物理インデックスは `pos & (ring_depth - 1)`").
    #[inline]
    pub fn req_slot_offset(&self, pos: u64) -> usize {
        let idx = pos & u64::from(self.params.ring_depth - 1);
        (RING_SLOTS_OFFSET + idx * u64::from(self.req_slot_size)) as usize
    }

    /// Byte offset of response slot `slot_idx` of client `client_id`:
    /// `resp_area_offset + (client_id * resp_depth + slot_idx) * resp_slot_size`.
    /// Source: seeds/004 §2.1 Response Slot. In bounds iff `client_id < max_clients` and
    /// `slot_idx < resp_depth`; callers check both first (debug-asserted here).
    #[inline]
    pub fn resp_slot_offset(&self, client_id: u32, slot_idx: u32) -> usize {
        debug_assert!(client_id < self.params.max_clients && slot_idx < self.params.resp_depth);
        let n = u64::from(client_id) * u64::from(self.params.resp_depth) + u64::from(slot_idx);
        (self.resp_area_offset + n * u64::from(self.resp_slot_size)) as usize
    }

    /// Byte offset of the sequence word ([`SLOT_SEQ`]) of the slot holding position `pos`.
    /// Always in bounds.
    #[inline]
    pub fn seq_offset(&self, pos: u64) -> usize {
        self.req_slot_offset(pos) + SLOT_SEQ
    }

    /// `(pos, req_slot_offset(pos), seq_offset(pos))`: a position with the offsets of its slot
    /// and sequence word, as a commit takes them.
    #[inline]
    pub fn slot_at(&self, pos: u64) -> (u64, usize, usize) {
        (pos, self.req_slot_offset(pos), self.seq_offset(pos))
    }

    /// Byte offset of the client record of `client_id` (callers check `client_id < max_clients`).
    #[inline]
    pub fn record_offset(&self, client_id: u32) -> usize {
        debug_assert!(client_id < self.params.max_clients);
        (self.client_table_offset + u64::from(client_id) * CLIENT_RECORD_SIZE) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(max_clients: u32, ring: u32, resp: u32, req_cap: u32, resp_cap: u32) -> LayoutParams {
        LayoutParams {
            max_clients,
            ring_depth: ring,
            resp_depth: resp,
            req_payload_cap: req_cap,
            resp_payload_cap: resp_cap,
        }
    }

    #[test]
    fn seed_offsets() {
        assert_eq!(MAGIC.to_be_bytes(), *b"DLGRPCV1");
        assert_eq!(OFF_HEAD, 128);
        assert_eq!(OFF_TAIL, 192);
        assert_eq!(
            OFF_TAIL - OFF_HEAD,
            64,
            "head and tail on separate cache lines"
        );
        const { assert!(OFF_LIVENESS_INTERVAL_NS + 8 <= HEADER_SIZE as usize) };
        const { assert!(OFF_RING_FAULT > OFF_SERVER_ALIVE && OFF_RING_FAULT < OFF_FINGERPRINT) };
        const { assert!(REC_PID + 4 <= 64 && REC_RESERVING_POS == 64) };
        const { assert!(REC_RESERVING_POS + 8 <= CLIENT_RECORD_SIZE as usize) };
    }

    #[test]
    fn sizes() {
        let l = Layout::new(params(64, 1024, 32, 64, 64)).unwrap();
        assert_eq!(l.req_slot_size, 128); // align_up(24 + 64, 64)
        assert_eq!(l.resp_slot_size, 128); // align_up(8 + 64, 64)
        assert_eq!(l.resp_area_offset, 256 + 1024 * 128);
        assert_eq!(l.client_table_offset, l.resp_area_offset + 64 * 32 * 128);
        assert_eq!(
            l.total_size,
            l.client_table_offset + 64 * CLIENT_RECORD_SIZE
        );
        assert_eq!(l.seq_offset(1025), 256 + 128 + SLOT_SEQ);
        let l = Layout::new(params(1, 1, 1, 40, 56)).unwrap();
        assert_eq!((l.req_slot_size, l.resp_slot_size), (64, 64));
        assert_eq!(l.req_slot_offset(7), 256);
        assert_eq!(l.resp_slot_offset(0, 0), 256 + 64);
        assert_eq!(l.record_offset(0), 256 + 128);
        assert_eq!(l.total_size, 256 + 128 + CLIENT_RECORD_SIZE);
        assert_eq!(seq_word(5, SEQ_COMMITTED), 22);
        assert_eq!((seq_pos(22), seq_state(22)), (5, SEQ_COMMITTED));
    }

    #[test]
    fn rejects() {
        for p in [
            params(0, 8, 8, 8, 8),
            params(MAX_CLIENTS_LIMIT + 1, 8, 8, 8, 8),
            params(1, 0, 8, 8, 8),
            params(1, 6, 8, 8, 8),
            params(1, 8, 0, 8, 8),
            params(1, 8, 3, 8, 8),
            params(1, 8, 8, MAX_PAYLOAD_CAP + 1, 8),
            params(1, 8, 8, 8, u32::MAX),
            params(
                MAX_CLIENTS_LIMIT,
                1 << 30,
                MAX_RESP_DEPTH,
                MAX_PAYLOAD_CAP,
                MAX_PAYLOAD_CAP,
            ),
        ] {
            assert!(Layout::new(p).is_err(), "{p:?}");
        }
    }
}

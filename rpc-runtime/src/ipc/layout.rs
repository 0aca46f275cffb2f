//! Byte layout of an ipc segment (all offsets in bytes from the start of the file; all
//! integers native-endian). See the table in the [module docs](super).
//!
//! The layout is recomputed from four parameters (`max_clients`, `depth`, request and response
//! capacity) by [`Layout::new`], which range-checks them with checked arithmetic; a client
//! compares every redundant header field with the recomputed value before it maps the file.

/// `"IPCRPCV1"` as a little-endian `u64` (@0).
pub const MAGIC: u64 = u64::from_le_bytes(*b"IPCRPCV1");
/// Layout version (@8). Version 1 had no sleep words ([`OFF_SERVER_SLEEP`],
/// [`OFF_SLEEP_ARMED`], [`OFF_CLIENT_SLEEP_ARMED`], [`CB_RESP_SLEEP`]): its clients would
/// never wake a server of this version that sleeps.
pub const VERSION: u32 = 2;
/// Header size; client blocks start here.
pub const HEADER_SIZE: u64 = 128;

/// `u64` magic.
pub const OFF_MAGIC: usize = 0;
/// `u32` layout version.
pub const OFF_VERSION: usize = 8;
/// `u32` number of client blocks.
pub const OFF_MAX_CLIENTS: usize = 12;
/// `u32` slots per ring (power of two) = most calls in flight per client.
pub const OFF_DEPTH: usize = 16;
/// `u32` request payload capacity, bytes.
pub const OFF_REQ_CAP: usize = 20;
/// `u32` response payload capacity, bytes.
pub const OFF_RESP_CAP: usize = 24;
/// `u32` request slot size, bytes (redundant, validated).
pub const OFF_REQ_SLOT_SIZE: usize = 28;
/// `u32` response slot size, bytes (redundant, validated).
pub const OFF_RESP_SLOT_SIZE: usize = 32;
/// `u32` server pid (diagnostics).
pub const OFF_SERVER_PID: usize = 36;
/// `u64` service schema fingerprint.
pub const OFF_FINGERPRINT: usize = 40;
/// `u64` client block size, bytes (redundant, validated).
pub const OFF_CLIENT_STRIDE: usize = 48;
/// `u64` total file size, bytes (redundant, validated).
pub const OFF_TOTAL_SIZE: usize = 56;
/// `u64` the server's liveness interval, ns (1 ns ..= 60 s).
pub const OFF_LIVENESS_NS: usize = 64;
/// `u8` 1 while the server serves, 0 after a clean shutdown.
pub const OFF_SERVER_ALIVE: usize = 72;
/// `AtomicU32` futex word: 1 while the server may be asleep in
/// [`IpcServer::wait_for_request`](super::IpcServer::wait_for_request), else 0. In the header
/// line clients read on every call (`server_alive`); see the module docs, "Sleeping".
pub const OFF_SERVER_SLEEP: usize = 76;
/// `AtomicU32` 1 once the server may sleep (it stored this at its first
/// `wait_for_request`): only then do clients check [`OFF_SERVER_SLEEP`] after their sends,
/// so clients of a server that never sleeps pay nothing for the wake protocol.
pub const OFF_SLEEP_ARMED: usize = 80;
/// `AtomicU32` 1 once a client may sleep (a client stores it at its first
/// `sleep_for_response`, which does not sleep): only then does the server track the clients
/// it replies to and check their words, so a server whose clients never sleep (the `kv`
/// clients, which are pinned) pays nothing for the wake protocol.
pub const OFF_CLIENT_SLEEP_ARMED: usize = 84;
/// The server holds an OFD write lock on `[0, SERVER_LOCK_LEN)` for its lifetime.
pub const SERVER_LOCK_LEN: u64 = HEADER_SIZE;

/// Client block: `u64` owner word (`state << 62 | generation << 32 | pid`). The client holds an
/// OFD write lock on the block's first [`RECORD_SIZE`] bytes while it is attached.
pub const CB_OWNER: usize = 0;
/// Client block: `u32` fault code the server stored when it found this client's rings corrupt
/// (0: none; see [`FAULT_HEAD`], [`FAULT_RESP_TAIL`]).
pub const CB_FAULT: usize = 8;
/// Client block: `u64` requests published by the client (client writes, Release).
pub const CB_REQ_HEAD: usize = 64;
/// Client block: `u64` requests released by the server (server writes, Release).
pub const CB_REQ_TAIL: usize = 128;
/// Client block: `u64` responses published by the server (server writes, Release).
pub const CB_RESP_HEAD: usize = 192;
/// Client block: `u64` responses consumed by the client (client writes, Release).
pub const CB_RESP_TAIL: usize = 256;
/// Client block: `AtomicU32` futex word, 1 while the client may be asleep in
/// [`Ipc::sleep_for_response`](super::Ipc::sleep_for_response), else 0. In `resp_tail`'s line,
/// which the server reads on every reply anyway.
pub const CB_RESP_SLEEP: usize = 264;
/// Client block: first request slot.
pub const CB_SLOTS: usize = 320;
/// Bytes of the owner record line (the range a client locks).
pub const RECORD_SIZE: u64 = 64;

/// Slot: `u32` message length, bytes.
pub const SLOT_LEN: usize = 0;
/// Slot: `u32` call tag (client-chosen; a response carries its request's tag).
pub const SLOT_TAG: usize = 4;
/// Slot: first payload byte.
pub const SLOT_PAYLOAD: usize = 8;

/// Owner state: no client (bits 62..64 of the owner word).
pub const STATE_FREE: u64 = 0;
/// Owner state: attached.
pub const STATE_ACTIVE: u64 = 1;
/// Owner state: the client detached; the server reclaims the block.
pub const STATE_DETACHED: u64 = 2;

/// Fault code: the client's request head was more than `depth` ahead of the released tail or
/// behind the server's cursor.
pub const FAULT_HEAD: u32 = 1;
/// Fault code: the response tail was ahead of the response head or more than `depth` behind.
pub const FAULT_RESP_TAIL: u32 = 2;

/// Largest `max_clients`.
pub const MAX_CLIENTS: u32 = 4096;
/// Largest `depth`.
pub const MAX_DEPTH: u32 = 4096;
/// Largest payload capacity, bytes (16 MiB).
pub const MAX_CAP: u32 = 16 << 20;
/// Largest liveness interval, ns (60 s).
pub const MAX_LIVENESS_NS: u64 = 60_000_000_000;
/// Largest segment, bytes (64 GiB).
pub const MAX_TOTAL: u64 = 64 << 30;

/// Builds an owner word.
pub const fn owner_word(state: u64, generation: u32, pid: u32) -> u64 {
    state << 62 | ((generation as u64) & 0x3fff_ffff) << 32 | pid as u64
}
/// The state bits of an owner word.
pub const fn owner_state(w: u64) -> u64 {
    w >> 62
}
/// The generation of an owner word (30 bits).
pub const fn owner_gen(w: u64) -> u32 {
    ((w >> 32) & 0x3fff_ffff) as u32
}
/// The pid of an owner word.
pub const fn owner_pid(w: u64) -> u32 {
    w as u32
}

/// The parameters a layout is computed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutParams {
    /// Client blocks, 1..=[`MAX_CLIENTS`].
    pub max_clients: u32,
    /// Slots per ring, a power of two 1..=[`MAX_DEPTH`].
    pub depth: u32,
    /// Request payload capacity, bytes, 0..=[`MAX_CAP`].
    pub req_cap: u32,
    /// Response payload capacity, bytes, 0..=[`MAX_CAP`].
    pub resp_cap: u32,
}

/// A validated layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The parameters.
    pub params: LayoutParams,
    /// `align_up(8 + req_cap, 64)`.
    pub req_slot_size: u32,
    /// `align_up(8 + resp_cap, 64)`.
    pub resp_slot_size: u32,
    /// `320 + depth * (req_slot_size + resp_slot_size)`.
    pub client_stride: u64,
    /// `128 + max_clients * client_stride`.
    pub total_size: u64,
}

fn slot_size(cap: u32) -> u32 {
    (SLOT_PAYLOAD as u32 + cap).div_ceil(64) * 64
}

impl Layout {
    /// Computes and range-checks the layout of `params`.
    ///
    /// # Errors
    /// A description of the first parameter out of range.
    pub fn new(params: LayoutParams) -> Result<Self, String> {
        let p = params;
        if p.max_clients == 0 || p.max_clients > MAX_CLIENTS {
            return Err(format!(
                "max_clients = {} must be in 1..={MAX_CLIENTS}",
                p.max_clients
            ));
        }
        if !p.depth.is_power_of_two() || p.depth > MAX_DEPTH {
            return Err(format!(
                "depth = {} must be a power of two <= {MAX_DEPTH}",
                p.depth
            ));
        }
        if p.req_cap > MAX_CAP || p.resp_cap > MAX_CAP {
            return Err(format!(
                "capacities ({} B, {} B) must be <= {MAX_CAP} B",
                p.req_cap, p.resp_cap
            ));
        }
        let req_slot_size = slot_size(p.req_cap);
        let resp_slot_size = slot_size(p.resp_cap);
        let client_stride = u64::from(p.depth)
            .checked_mul(u64::from(req_slot_size) + u64::from(resp_slot_size))
            .and_then(|s| s.checked_add(CB_SLOTS as u64));
        let total_size = client_stride
            .and_then(|s| s.checked_mul(u64::from(p.max_clients)))
            .and_then(|s| s.checked_add(HEADER_SIZE));
        match (client_stride, total_size) {
            (Some(client_stride), Some(total_size)) if total_size <= MAX_TOTAL => Ok(Layout {
                params,
                req_slot_size,
                resp_slot_size,
                client_stride,
                total_size,
            }),
            _ => Err(format!("{p:?} needs more than {MAX_TOTAL} bytes")),
        }
    }

    /// Offset of client `c`'s block.
    #[inline]
    pub fn block(&self, c: u32) -> usize {
        (HEADER_SIZE + u64::from(c) * self.client_stride) as usize
    }

    /// Offset of the request slot for position `pos` of client `c`.
    #[inline]
    pub fn req_slot(&self, c: u32, pos: u64) -> usize {
        let i = (pos & u64::from(self.params.depth - 1)) as usize;
        self.block(c) + CB_SLOTS + i * self.req_slot_size as usize
    }

    /// Offset of the response slot for position `pos` of client `c`.
    #[inline]
    pub fn resp_slot(&self, c: u32, pos: u64) -> usize {
        let i = (pos & u64::from(self.params.depth - 1)) as usize;
        self.block(c)
            + CB_SLOTS
            + self.params.depth as usize * self.req_slot_size as usize
            + i * self.resp_slot_size as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_sizes() {
        let l = Layout::new(LayoutParams {
            max_clients: 2,
            depth: 4,
            req_cap: 56,
            resp_cap: 57,
        })
        .unwrap();
        assert_eq!((l.req_slot_size, l.resp_slot_size), (64, 128));
        assert_eq!(l.client_stride, 320 + 4 * 192);
        assert_eq!(l.total_size, 128 + 2 * l.client_stride);
        assert_eq!(l.req_slot(1, 5), l.block(1) + 320 + 64);
        assert_eq!(l.resp_slot(0, 3), 128 + 320 + 4 * 64 + 3 * 128);
        let bad = |max_clients, depth| {
            Layout::new(LayoutParams {
                max_clients,
                depth,
                req_cap: 8,
                resp_cap: 8,
            })
            .is_err()
        };
        assert!(bad(0, 4) && bad(1, 3) && bad(1, 0) && bad(MAX_CLIENTS + 1, 4));
        let w = owner_word(STATE_ACTIVE, 7, 1234);
        assert_eq!((owner_state(w), owner_gen(w), owner_pid(w)), (1, 7, 1234));
    }
}

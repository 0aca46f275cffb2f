//! Writing the 128-byte header (server, at creation) and reading and validating it (client, at
//! attach; server, when deciding whether an existing file is live). Source: seeds/004 §2.1 Header.
//!
//! Validation never trusts a field: the layout is recomputed from the five parameters with
//! [`Layout::new`] (which range-checks them) and every redundant field (slot sizes, client table
//! offset, total size) must equal the recomputed value, and the file must be at least
//! `total_size` bytes long. Only then is the file mapped, so a garbage file yields a
//! [`RingError`], never an out-of-bounds access.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::time::Duration;

use super::config::{RingConfig, RingInfo};
use super::error::RingError;
use super::layout::*;
use super::shm::ShmMap;

/// A validated header.
#[derive(Clone, Copy, Debug)]
pub(super) struct Header {
    /// The layout recomputed from (and checked against) the header.
    pub layout: Layout,
    /// Schema fingerprint (@32).
    pub fingerprint: u64,
    /// Server's liveness interval (@80).
    pub liveness_interval: Duration,
    /// Server's pid (@72), diagnostics only.
    pub server_pid: u32,
}

impl Header {
    /// The public view of the parameters.
    pub(super) fn info(&self) -> RingInfo {
        let p = self.layout.params;
        RingInfo {
            max_clients: p.max_clients,
            ring_depth: p.ring_depth,
            resp_depth: p.resp_depth,
            req_payload_cap: p.req_payload_cap,
            resp_payload_cap: p.resp_payload_cap,
            fingerprint: self.fingerprint,
        }
    }
}

/// Initializes a freshly created, zero-filled file: all header fields (seed and extension), the
/// ring control words (`head = tail = 0`), the slot sequence words (slot `i`: `FREE` for
/// position `i`), and every client record (`FREE`, generation 0, `reserving_pos = IDLE`).
/// Request and response slots stay zero (`valid = 0`).
/// `server_alive` is stored last, with `Release`.
pub(super) fn init(map: &ShmMap, layout: &Layout, cfg: &RingConfig, liveness_ns: u64, pid: u32) {
    let p = &layout.params;
    map.u64_at(OFF_MAGIC).store(MAGIC, Relaxed);
    map.u32_at(OFF_VERSION).store(VERSION, Relaxed);
    map.u32_at(OFF_MAX_CLIENTS).store(p.max_clients, Relaxed);
    map.u32_at(OFF_RING_DEPTH).store(p.ring_depth, Relaxed);
    map.u32_at(OFF_RESP_DEPTH).store(p.resp_depth, Relaxed);
    map.u32_at(OFF_NEXT_CLIENT_ID).store(0, Relaxed);
    map.u64_at(OFF_FINGERPRINT).store(cfg.fingerprint, Relaxed);
    map.u32_at(OFF_REQ_PAYLOAD_CAP)
        .store(p.req_payload_cap, Relaxed);
    map.u32_at(OFF_RESP_PAYLOAD_CAP)
        .store(p.resp_payload_cap, Relaxed);
    map.u32_at(OFF_REQ_SLOT_SIZE)
        .store(layout.req_slot_size, Relaxed);
    map.u32_at(OFF_RESP_SLOT_SIZE)
        .store(layout.resp_slot_size, Relaxed);
    map.u64_at(OFF_CLIENT_TABLE_OFFSET)
        .store(layout.client_table_offset, Relaxed);
    map.u64_at(OFF_TOTAL_SIZE).store(layout.total_size, Relaxed);
    map.u32_at(OFF_SERVER_PID).store(pid, Relaxed);
    map.u64_at(OFF_LIVENESS_INTERVAL_NS)
        .store(liveness_ns, Relaxed);
    map.hdr_u64::<OFF_HEAD>().store(0, Relaxed);
    map.hdr_u64::<OFF_TAIL>().store(0, Relaxed);
    map.hdr_u8::<OFF_RING_FAULT>().store(0, Relaxed);
    map.u32_at(OFF_SERVER_SLEEP).store(0, Relaxed);
    map.u32_at(OFF_CLIENT_SLEEP_ARMED).store(0, Relaxed);
    for i in 0..u64::from(p.ring_depth) {
        map.u64_at(layout.seq_offset(i))
            .store(seq_word(i, SEQ_FREE), Relaxed);
    }
    for id in 0..p.max_clients {
        let rec = layout.record_offset(id);
        map.u32_at(rec + REC_STATE).store(CLIENT_FREE, Relaxed);
        map.u32_at(rec + REC_GENERATION).store(0, Relaxed);
        map.u64_at(rec + REC_RESERVING_POS).store(POS_IDLE, Relaxed);
        map.u32_at(rec + REC_PID).store(0, Relaxed);
        map.u32_at(rec + REC_SLEEP).store(0, Relaxed);
    }
    map.hdr_u8::<OFF_SERVER_ALIVE>().store(1, Release);
}

/// Reads the first 128 bytes of `file` with `pread` (no mapping).
pub(super) fn read_raw(file: &File) -> io::Result<[u8; HEADER_SIZE as usize]> {
    let mut raw = [0u8; HEADER_SIZE as usize];
    file.read_exact_at(&mut raw, 0)?;
    Ok(raw)
}

fn u32_of(raw: &[u8; HEADER_SIZE as usize], off: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&raw[off..off + 4]);
    u32::from_ne_bytes(b)
}

fn u64_of(raw: &[u8; HEADER_SIZE as usize], off: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&raw[off..off + 8]);
    u64::from_ne_bytes(b)
}

/// Validates a raw header read from the file at `path`, whose length is `file_len` bytes.
/// Checks, in order: length ≥ 128 (done by the caller's read), magic, version, the five layout
/// parameters, the redundant sizes and offsets, `total_size <= file_len`, and the liveness
/// interval.
pub(super) fn parse(
    raw: &[u8; HEADER_SIZE as usize],
    file_len: u64,
    path: &Path,
) -> Result<Header, RingError> {
    let path_buf = || path.to_path_buf();
    let magic = u64_of(raw, OFF_MAGIC);
    if magic != MAGIC {
        return Err(RingError::BadMagic {
            path: path_buf(),
            found: magic,
            expected: MAGIC,
        });
    }
    let version = u32_of(raw, OFF_VERSION);
    if version != VERSION {
        return Err(RingError::UnsupportedVersion {
            path: path_buf(),
            found: version,
            expected: VERSION,
        });
    }
    let corrupt = |reason: String| RingError::CorruptHeader {
        path: path_buf(),
        reason,
    };
    let params = LayoutParams {
        max_clients: u32_of(raw, OFF_MAX_CLIENTS),
        ring_depth: u32_of(raw, OFF_RING_DEPTH),
        resp_depth: u32_of(raw, OFF_RESP_DEPTH),
        req_payload_cap: u32_of(raw, OFF_REQ_PAYLOAD_CAP),
        resp_payload_cap: u32_of(raw, OFF_RESP_PAYLOAD_CAP),
    };
    let layout = Layout::new(params).map_err(|e| corrupt(e.0))?;
    let check = |field: &str, off: usize, found: u64, expected: u64| {
        if found == expected {
            Ok(())
        } else {
            Err(corrupt(format!(
                "{field} (@{off}) is {found}, expected {expected} for {params:?}"
            )))
        }
    };
    check(
        "req_slot_size",
        OFF_REQ_SLOT_SIZE,
        u32_of(raw, OFF_REQ_SLOT_SIZE).into(),
        layout.req_slot_size.into(),
    )?;
    check(
        "resp_slot_size",
        OFF_RESP_SLOT_SIZE,
        u32_of(raw, OFF_RESP_SLOT_SIZE).into(),
        layout.resp_slot_size.into(),
    )?;
    check(
        "client_table_offset",
        OFF_CLIENT_TABLE_OFFSET,
        u64_of(raw, OFF_CLIENT_TABLE_OFFSET),
        layout.client_table_offset,
    )?;
    check(
        "total_size",
        OFF_TOTAL_SIZE,
        u64_of(raw, OFF_TOTAL_SIZE),
        layout.total_size,
    )?;
    if file_len < layout.total_size {
        return Err(RingError::Truncated {
            path: path_buf(),
            len: file_len,
            needed: layout.total_size,
        });
    }
    let liveness_ns = u64_of(raw, OFF_LIVENESS_INTERVAL_NS);
    if liveness_ns == 0 || liveness_ns > MAX_LIVENESS_INTERVAL_NS {
        return Err(corrupt(format!(
            "liveness_interval_ns (@{OFF_LIVENESS_INTERVAL_NS}) is {liveness_ns}, expected 1..={MAX_LIVENESS_INTERVAL_NS}"
        )));
    }
    Ok(Header {
        layout,
        fingerprint: u64_of(raw, OFF_FINGERPRINT),
        liveness_interval: Duration::from_nanos(liveness_ns),
        server_pid: u32_of(raw, OFF_SERVER_PID),
    })
}

/// Opens the header of the file `file` (at `path`): checks the length, reads and validates the
/// header. Errors name `path`.
pub(super) fn read_and_validate(file: &File, path: &Path) -> Result<Header, RingError> {
    let len = file
        .metadata()
        .map_err(|source| RingError::Io {
            path: path.to_path_buf(),
            op: "fstat",
            source,
        })?
        .len();
    if len < RING_SLOTS_OFFSET {
        return Err(RingError::Truncated {
            path: path.to_path_buf(),
            len,
            needed: RING_SLOTS_OFFSET,
        });
    }
    let raw = read_raw(file).map_err(|source| RingError::Io {
        path: path.to_path_buf(),
        op: "pread(header)",
        source,
    })?;
    parse(&raw, len, path)
}

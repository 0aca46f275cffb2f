//! Writing the header (server) and reading and validating it before mapping (client).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::time::Duration;

use super::error::IpcError;
use super::layout::*;
use super::shm::{Map, io_err};

/// A validated header.
#[derive(Clone, Copy, Debug)]
pub(super) struct Header {
    pub layout: Layout,
    pub fingerprint: u64,
    pub liveness: Duration,
    pub server_pid: u32,
}

/// Initializes a zero-filled segment (client blocks stay zero: owner `FREE` generation 0, all
/// counters 0); `server_alive = 1` is stored last (Release).
pub(super) fn init(map: &Map, l: &Layout, fingerprint: u64, liveness_ns: u64, pid: u32) {
    let p = l.params;
    map.u64(OFF_MAGIC).store(MAGIC, Relaxed);
    map.u32(OFF_VERSION).store(VERSION, Relaxed);
    map.u32(OFF_MAX_CLIENTS).store(p.max_clients, Relaxed);
    map.u32(OFF_DEPTH).store(p.depth, Relaxed);
    map.u32(OFF_REQ_CAP).store(p.req_cap, Relaxed);
    map.u32(OFF_RESP_CAP).store(p.resp_cap, Relaxed);
    map.u32(OFF_REQ_SLOT_SIZE).store(l.req_slot_size, Relaxed);
    map.u32(OFF_RESP_SLOT_SIZE).store(l.resp_slot_size, Relaxed);
    map.u32(OFF_SERVER_PID).store(pid, Relaxed);
    map.u64(OFF_FINGERPRINT).store(fingerprint, Relaxed);
    map.u64(OFF_CLIENT_STRIDE).store(l.client_stride, Relaxed);
    map.u64(OFF_TOTAL_SIZE).store(l.total_size, Relaxed);
    map.u64(OFF_LIVENESS_NS).store(liveness_ns, Relaxed);
    map.u32(OFF_SERVER_SLEEP).store(0, Relaxed);
    map.u32(OFF_SLEEP_ARMED).store(0, Relaxed);
    map.u32(OFF_CLIENT_SLEEP_ARMED).store(0, Relaxed);
    map.u8(OFF_SERVER_ALIVE).store(1, Release);
}

fn u32_of(raw: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([raw[off], raw[off + 1], raw[off + 2], raw[off + 3]])
}

fn u64_of(raw: &[u8], off: usize) -> u64 {
    u64::from(u32_of(raw, off)) | u64::from(u32_of(raw, off + 4)) << 32
}

/// Reads the header of `file` (at `path`) with `pread` and validates every field: magic,
/// version, the four layout parameters, the redundant sizes, the file length and the
/// liveness interval. Nothing is mapped before this succeeds.
///
/// # Errors
/// [`IpcError::BadMagic`], [`IpcError::UnsupportedVersion`], [`IpcError::CorruptHeader`],
/// [`IpcError::Io`].
pub(super) fn read_and_validate(file: &File, path: &Path) -> Result<Header, IpcError> {
    let corrupt = |reason: String| IpcError::CorruptHeader {
        path: path.to_path_buf(),
        reason,
    };
    let len = file.metadata().map_err(io_err(path, "fstat"))?.len();
    if len < HEADER_SIZE {
        return Err(corrupt(format!(
            "file is {len} bytes, shorter than the header"
        )));
    }
    let mut raw = [0u8; HEADER_SIZE as usize];
    file.read_exact_at(&mut raw, 0)
        .map_err(io_err(path, "pread(header)"))?;
    let magic = u64_of(&raw, OFF_MAGIC);
    if magic != MAGIC {
        return Err(IpcError::BadMagic {
            path: path.to_path_buf(),
            found: magic,
        });
    }
    let version = u32_of(&raw, OFF_VERSION);
    if version != VERSION {
        return Err(IpcError::UnsupportedVersion {
            path: path.to_path_buf(),
            found: version,
            expected: VERSION,
        });
    }
    let params = LayoutParams {
        max_clients: u32_of(&raw, OFF_MAX_CLIENTS),
        depth: u32_of(&raw, OFF_DEPTH),
        req_cap: u32_of(&raw, OFF_REQ_CAP),
        resp_cap: u32_of(&raw, OFF_RESP_CAP),
    };
    let layout = Layout::new(params).map_err(corrupt)?;
    let checks = [
        (
            "req_slot_size",
            OFF_REQ_SLOT_SIZE,
            u64::from(u32_of(&raw, OFF_REQ_SLOT_SIZE)),
            u64::from(layout.req_slot_size),
        ),
        (
            "resp_slot_size",
            OFF_RESP_SLOT_SIZE,
            u64::from(u32_of(&raw, OFF_RESP_SLOT_SIZE)),
            u64::from(layout.resp_slot_size),
        ),
        (
            "client_stride",
            OFF_CLIENT_STRIDE,
            u64_of(&raw, OFF_CLIENT_STRIDE),
            layout.client_stride,
        ),
        (
            "total_size",
            OFF_TOTAL_SIZE,
            u64_of(&raw, OFF_TOTAL_SIZE),
            layout.total_size,
        ),
    ];
    for (field, off, found, expected) in checks {
        if found != expected {
            return Err(corrupt(format!(
                "{field} (@{off}) is {found}, expected {expected} for {params:?}"
            )));
        }
    }
    if len < layout.total_size {
        return Err(corrupt(format!(
            "file is {len} bytes, the layout needs {}",
            layout.total_size
        )));
    }
    let ns = u64_of(&raw, OFF_LIVENESS_NS);
    if ns == 0 || ns > MAX_LIVENESS_NS {
        return Err(corrupt(format!(
            "liveness_ns (@{OFF_LIVENESS_NS}) is {ns}, expected 1..={MAX_LIVENESS_NS}"
        )));
    }
    Ok(Header {
        layout,
        fingerprint: u64_of(&raw, OFF_FINGERPRINT),
        liveness: Duration::from_nanos(ns),
        server_pid: u32_of(&raw, OFF_SERVER_PID),
    })
}

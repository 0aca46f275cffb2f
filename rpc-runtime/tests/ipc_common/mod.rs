//! Helpers shared by the ipc transport's tests.

#![allow(dead_code)]

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rpc_runtime::ipc::{Ipc, IpcConfig, IpcServer, SHM_DIR};

/// A segment name unique to this process: `ipct-<pid>-<tag>`.
pub(crate) fn unique_name(tag: &str) -> String {
    format!("ipct-{}-{tag}", std::process::id())
}

/// `/dev/shm/<name>`.
pub(crate) fn shm_file(name: &str) -> PathBuf {
    PathBuf::from(SHM_DIR).join(name)
}

/// Request and response capacity of the byte-level tests, bytes.
pub(crate) const CAP: usize = 48;

/// A small configuration: `max_clients` clients, `depth` slots, 10 ms liveness interval.
pub(crate) fn cfg(max_clients: u32, depth: u32) -> IpcConfig {
    IpcConfig {
        max_clients,
        depth,
        liveness_interval: Duration::from_millis(10),
    }
}

/// A server for the byte-level tests (fingerprint 7, capacities [`CAP`]).
pub(crate) fn server(name: &str, max_clients: u32, depth: u32) -> IpcServer {
    IpcServer::create_raw(name, cfg(max_clients, depth), 7, CAP, CAP).expect("create")
}

/// The reply the echo servers send for `req`.
pub(crate) fn transform(req: &[u8]) -> Vec<u8> {
    req.iter()
        .map(|b| b.wrapping_mul(3).wrapping_add(1))
        .collect()
}

/// One poll round: answers every available request with [`transform`], releases; returns the
/// number answered.
pub(crate) fn serve_once(server: &mut IpcServer) -> usize {
    server.poll();
    let mut n = 0;
    while let Some((token, req)) = server.recv() {
        let resp = transform(req);
        let _ = server.reply_with(token, |buf| {
            buf[..resp.len()].copy_from_slice(&resp);
            resp.len()
        });
        n += 1;
    }
    server.release();
    n
}

/// Sends `msg` (panics on error).
pub(crate) fn send(c: &mut Ipc, msg: &[u8]) -> u32 {
    c.try_send(|buf| {
        buf[..msg.len()].copy_from_slice(msg);
        msg.len()
    })
    .expect("send")
}

/// Polls `c` until one response arrives or 10 s pass, driving `server` (if any) meanwhile.
pub(crate) fn wait_one(c: &mut Ipc, mut server: Option<&mut IpcServer>) -> (u32, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = server.as_deref_mut() {
            serve_once(s);
        }
        let mut got = None;
        c.poll_up_to(1, |t, b| got = Some((t, b.to_vec())))
            .expect("poll");
        if let Some(g) = got {
            return g;
        }
        assert!(Instant::now() < deadline, "no response within 10 s");
        std::thread::yield_now();
    }
}

/// A writable mapping of a segment file, for corrupting fields.
pub(crate) struct Raw(pub memmap2::MmapMut);

impl Raw {
    pub(crate) fn open(name: &str) -> Raw {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(shm_file(name))
            .unwrap();
        // SAFETY: test-only mapping of a file this test owns; concurrent writers only use
        // atomics on it, and the tests write it while no other thread touches the same field.
        Raw(unsafe { memmap2::MmapMut::map_mut(&f).unwrap() })
    }
    pub(crate) fn put_u64(&mut self, off: usize, v: u64) {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    }
    pub(crate) fn put_u32(&mut self, off: usize, v: u32) {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    }
    pub(crate) fn u64(&self, off: usize) -> u64 {
        u64::from_ne_bytes(self.0[off..off + 8].try_into().unwrap())
    }
    pub(crate) fn u32(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.0[off..off + 4].try_into().unwrap())
    }
}

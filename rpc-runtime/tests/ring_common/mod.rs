//! Helpers shared by the delegation ring's file-level tests (`ring_faults`, `shm_ownership`).

#![allow(dead_code)]

use std::path::PathBuf;

use rpc_runtime::delegation::SHM_DIR;

/// A ring name unique to this test process: `rt-<pid>-<tag>`.
pub(crate) fn unique_name(tag: &str) -> String {
    format!("rt-{}-{tag}", std::process::id())
}

/// `/dev/shm/<name>`.
pub(crate) fn shm_file(name: &str) -> PathBuf {
    PathBuf::from(SHM_DIR).join(name)
}

/// Removes a file on drop (for files no server owns).
pub(crate) struct Cleanup(pub PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

//! Errors of the ipc transport's setup and of a client whose rings the server found corrupt.

use std::path::PathBuf;

/// Creating, attaching to or using an ipc segment failed. Every variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IpcError {
    /// The name is not a single file name in `/dev/shm`.
    #[error("invalid ipc name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The configuration is out of range (see [`IpcConfig`](super::IpcConfig)).
    #[error("invalid ipc configuration: {reason}")]
    InvalidConfig {
        /// What is out of range.
        reason: String,
    },
    /// The file is not a regular file of this user with mode 0600 (or is a symbolic link):
    /// refused before anything was read or mapped.
    #[error(
        "refusing {path}: {reason} (owner uid {owner}, mode {mode:o}; expected uid {expected_uid}, mode 600)"
    )]
    UnsafeFile {
        /// The file.
        path: PathBuf,
        /// Its owner uid.
        owner: u32,
        /// Its permission bits.
        mode: u32,
        /// This process's effective uid.
        expected_uid: u32,
        /// What is wrong.
        reason: &'static str,
    },
    /// A system call failed.
    #[error("{op} on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operation.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not an ipc segment.
    #[error("{path} is not an ipc segment (magic {found:#018x})")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The magic found.
        found: u64,
    },
    /// The segment has another layout version.
    #[error("{path}: ipc layout version {found}, this build speaks {expected}")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// Version found.
        found: u32,
        /// Version of this build.
        expected: u32,
    },
    /// A header field is out of range or disagrees with the layout recomputed from the others,
    /// or the file is shorter than the layout.
    #[error("{path}: corrupt ipc header: {reason}")]
    CorruptHeader {
        /// The file.
        path: PathBuf,
        /// The field and its value.
        reason: String,
    },
    /// A live server already serves this name.
    #[error("{path} is served by a live server (pid {pid})")]
    InUse {
        /// The file.
        path: PathBuf,
        /// The pid recorded in its header.
        pid: u32,
    },
    /// No server serves this file (it shut down, or its process died).
    #[error("no live server behind {path}")]
    NoServer {
        /// The file.
        path: PathBuf,
    },
    /// Every client block is held by a live client (blocks of dead or detached clients are
    /// reclaimed by the server within its liveness interval).
    #[error("{path}: all {max_clients} client slots are in use")]
    NoFreeSlot {
        /// The file.
        path: PathBuf,
        /// Client blocks in the segment.
        max_clients: u32,
    },
    /// The rings of this client are corrupt (found by the server, which stored `code` in the
    /// client's block, or by the client itself); the client must reconnect.
    #[error("{path}: client slot {client}: rings corrupt (code {code}: {reason})")]
    ClientFault {
        /// The file.
        path: PathBuf,
        /// The client block.
        client: u32,
        /// The fault code ([`layout::FAULT_HEAD`](super::layout::FAULT_HEAD), ...; 0 if the
        /// client found it).
        code: u32,
        /// What was wrong.
        reason: &'static str,
    },
}

impl From<IpcError> for crate::RpcError {
    /// [`crate::RpcError::Transport`] carrying the [`IpcError`] (transport `"ipc"`).
    #[cold]
    fn from(e: IpcError) -> Self {
        crate::RpcError::from_transport("ipc", e)
    }
}

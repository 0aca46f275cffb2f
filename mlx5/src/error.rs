//! Errors of object creation and queue operations.

use crate::cqe::CqeError;

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An mlx5 operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No usable RDMA device: the libraries are missing, there is no device, or the named
    /// device/port does not exist. `reason` says which.
    #[error("no RDMA device: {reason}")]
    NoDevice {
        /// What was missing.
        reason: String,
    },
    /// A verbs call failed.
    #[error("{call} failed: {source}")]
    Verbs {
        /// The function called.
        call: &'static str,
        /// The errno it reported.
        source: std::io::Error,
    },
    /// Invalid argument to a provider call (sizes, wrong QP type, unknown object).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The send queue has no room for the WQE (in WQEBBs) until completions retire older ones.
    #[error("send queue full: need {need} WQEBBs, {free} free")]
    SqFull {
        /// WQEBBs the WQE (plus padding) needs.
        need: u32,
        /// WQEBBs free.
        free: u32,
    },
    /// The receive queue (or SRQ) has no free WQE.
    #[error("receive queue full")]
    RqFull,
    /// Inline payload longer than the QP's maximum.
    #[error("inline payload of {len} bytes exceeds the QP's max_inline_data {max}")]
    InlineTooLarge {
        /// Requested bytes.
        len: usize,
        /// Maximum.
        max: u32,
    },
    /// More data segments than the queue allows, or a WQE larger than 63 `ds`.
    #[error("WQE too large: {0}")]
    WqeTooLarge(String),
    /// A completion with an error status.
    #[error(transparent)]
    Completion(#[from] CqeError),
    /// Memory allocation or mapping failed.
    #[error("memory: {0}")]
    Memory(#[source] std::io::Error),
    /// A device-model file in `/dev/shm` (the node directory, a peer's memory segment) is not
    /// one this user's processes created: it is owned by another user, grants group or other
    /// users any access, is a symbolic link or is not a regular file (checked with `fstat` on
    /// the opened descriptor, before anything is mapped). Nothing was mapped.
    #[error(
        "refusing {path}: {reason} (owner uid {owner}, mode {mode:04o}; a device-model file must be a regular file owned by uid {expected_uid} with mode 0600)"
    )]
    UnsafeFile {
        /// The file.
        path: String,
        /// Its owner uid (`st_uid`; `u32::MAX` if it could not be read).
        owner: u32,
        /// Its permission bits (`st_mode & 0o7777`).
        mode: u32,
        /// This process's effective uid.
        expected_uid: u32,
        /// What is wrong.
        reason: &'static str,
    },
    /// A lock on a shared file stayed held by another open file description (another
    /// process, or a hostile user with read access) for longer than its bound, so the
    /// operation that needed it was not done.
    #[error("{lock} on {path} is held by someone else: gave up after {waited:?} (bound {bound:?})")]
    LockTimeout {
        /// Which lock ("node lock (byte 0)").
        lock: &'static str,
        /// The file.
        path: String,
        /// How long this call waited.
        waited: std::time::Duration,
        /// The configured bound ([`crate::sim::SimConfig::node_lock_timeout`]).
        bound: std::time::Duration,
    },
}

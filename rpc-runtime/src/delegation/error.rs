//! Errors of the delegation ring: [`RingError`] (creating or attaching), [`CallError`] (client
//! calls and polls) and [`ReplyError`] (server replies).

use std::io;
use std::path::PathBuf;

/// Creating a ring ([`RingServer::create`](super::RingServer::create)) or attaching to one
/// ([`RingClient::attach`](super::RingClient::attach)) failed. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The ring name is not a single `/dev/shm` file name.
    #[error("invalid delegation ring name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The [`RingConfig`](super::RingConfig) is out of range.
    #[error("invalid delegation ring configuration: {reason}")]
    InvalidConfig {
        /// What is wrong, naming the offending values.
        reason: String,
    },
    /// A live server already serves this name (it holds the server lock on the file).
    #[error("delegation ring {path} already exists and is served by a live server (pid {pid})")]
    AlreadyExists {
        /// The file.
        path: PathBuf,
        /// Pid recorded in the existing file's header (diagnostic; 0 if unreadable).
        pid: u32,
    },
    /// No ring file with this name.
    #[error("delegation ring {path} does not exist (is the server running?)")]
    NotFound {
        /// The file.
        path: PathBuf,
    },
    /// A system call failed.
    #[error("delegation ring {path}: {op} failed: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operation ("open", "mmap", "fcntl(F_OFD_SETLK)", ...).
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file is shorter than its header says (or shorter than a header).
    #[error("delegation ring {path} is truncated: {len} bytes, need {needed} bytes")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Actual file length, bytes.
        len: u64,
        /// Required length, bytes.
        needed: u64,
    },
    /// The file does not start with the ring magic.
    #[error(
        "{path} is not a delegation ring: magic {found:#018x}, expected {expected:#018x} (\"DLGRPCV1\")"
    )]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// Magic found at offset 0.
        found: u64,
        /// The expected magic.
        expected: u64,
    },
    /// The layout version is not the one this build understands.
    #[error("delegation ring {path} has layout version {found}, this build supports {expected}")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// Version found at offset 8.
        found: u32,
        /// The supported version.
        expected: u32,
    },
    /// A header field is inconsistent with the others or out of range.
    #[error("delegation ring {path} has a corrupt header: {reason}")]
    CorruptHeader {
        /// The file.
        path: PathBuf,
        /// Which field, its value and what was expected.
        reason: String,
    },
    /// The file exists but no live server holds it (the server exited or crashed).
    #[error("delegation ring {path} has no live server")]
    ServerNotRunning {
        /// The file.
        path: PathBuf,
    },
    /// All `max_clients` ids are held by live (or not yet reclaimed) clients.
    #[error("delegation ring {path}: all {max_clients} client ids are in use")]
    NoFreeClientId {
        /// The file.
        path: PathBuf,
        /// The ring's `max_clients`.
        max_clients: u32,
    },
}

/// A client call or poll failed. Source: seeds/004 §2.2 (`CallError::ServerDisconnected`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The server shut down (`server_alive == false`) or its process is gone (its lock on the
    /// header is no longer held). Outstanding calls will never be answered.
    #[error("delegation server disconnected")]
    ServerDisconnected,
    /// All `resp_depth` response slots have a call outstanding; poll for responses first.
    /// Nothing was reserved or sent.
    #[error("all response slots are in use; poll for responses first")]
    WouldBlock,
    /// The request does not fit in a request slot. With `try_call` nothing was reserved or sent;
    /// with `try_call_with` the reserved slot was released as an aborted entry.
    #[error("request payload of {len} bytes exceeds the ring's capacity of {cap} bytes")]
    PayloadTooLarge {
        /// Payload length, bytes.
        len: usize,
        /// `req_payload_cap`, bytes.
        cap: usize,
    },
}

/// A server reply was not delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The token's client is gone: it detached or died and its id was reclaimed (generation
    /// mismatch), it is no longer `ACTIVE`, or this token was already answered.
    #[error("stale reply token (client detached, reclaimed, or already answered)")]
    StaleToken,
    /// The token's `client_id` or `resp_slot_idx` is out of range (not a token from this ring).
    #[error("reply token out of range for this ring")]
    BadToken,
    /// The response does not fit in a response slot. Nothing was written; the token stays valid.
    #[error("response payload of {len} bytes exceeds the ring's capacity of {cap} bytes")]
    PayloadTooLarge {
        /// Payload length, bytes.
        len: usize,
        /// `resp_payload_cap`, bytes.
        cap: usize,
    },
    /// The response slot still holds an unread response (`valid == 1`): the client violated the
    /// protocol by reusing an outstanding slot. The reply was dropped.
    #[error("response slot still holds an unread response")]
    SlotBusy,
}

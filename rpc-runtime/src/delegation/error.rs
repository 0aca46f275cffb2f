//! Errors of the delegation ring: [`RingError`] (creating or attaching), [`RingCallError`] (client
//! calls and polls) and [`RingReplyError`] (server replies).

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
    /// The file at the ring's (or manifest's) name is not one this user's server created: it
    /// is owned by another user, grants group or other users any access, is a symbolic link or
    /// is not a regular file (checked with `fstat` on the opened descriptor, before anything is
    /// read or mapped). Nothing was read or mapped, and a server never unlinks or reuses such a
    /// file. Counted in [`unsafe_files_refused`](super::unsafe_files_refused).
    #[error(
        "refusing {path}: {reason} (owner uid {owner}, mode {mode:04o}; a shared-memory file must be a regular file owned by uid {expected_uid} with mode 0600)"
    )]
    UnsafeFile {
        /// The file.
        path: PathBuf,
        /// Its owner uid (`st_uid`; `u32::MAX` if it could not be read).
        owner: u32,
        /// Its permission bits (`st_mode & 0o7777`).
        mode: u32,
        /// This process's effective uid.
        expected_uid: u32,
        /// What is wrong.
        reason: &'static str,
    },
    /// A ring manifest ([`RingManifest`](super::RingManifest)) does not parse: wrong magic or
    /// version, truncated, a length or checksum that does not match, an invalid ring name.
    #[error("ring manifest {path} is invalid: {reason}")]
    BadManifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong, with the offending values.
        reason: String,
    },
    /// No ring file (or ring manifest) with this name.
    #[error("delegation ring file {path} does not exist (is the server running?)")]
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
    /// The ring was marked failed: its server or a client found an impossible state in it
    /// (see [`RingFault`]). A new server must create the ring afresh.
    #[error("delegation ring {path} was marked failed: {fault}")]
    Failed {
        /// The file.
        path: PathBuf,
        /// What was found.
        fault: RingFault,
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

/// An impossible state found in a ring's shared memory (only a process that scribbles over
/// the file, or a bug, can cause one). The first one found is stored in the header (byte
/// [`OFF_RING_FAULT`](super::layout::OFF_RING_FAULT)) as its code, which marks the ring
/// failed: every later call and poll of every client fails at once with
/// [`RingCallError::RingCorrupt`], attaching fails with [`RingError::Failed`], and the server stops
/// serving ([`RingServer::fault`](super::RingServer::fault)). Extension, seed: none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[repr(u8)]
pub enum RingFault {
    /// `head` is behind `tail` (or behind the server's cursor): positions below `tail` were
    /// all reserved, so `head >= tail` always holds.
    #[error("head is behind tail")]
    HeadBehindTail = 1,
    /// `head` is ahead of `tail` (or of the server's cursor) by more than
    /// `ring_depth + 4 * max_clients`, or above [`MAX_POS`](super::layout::MAX_POS). Only
    /// `ring_depth` positions fit in the ring's window, and beyond it a client id can hold at
    /// most two positions (the call waiting for room, and one abandoned earlier that the
    /// server has not passed yet); the bound allows twice that, so that no legal interleaving
    /// (a stale read of `tail`, an id's dead predecessor) can trip it.
    #[error("head is further ahead of tail than ring_depth plus the waiting clients allow")]
    HeadTooFarAhead = 2,
    /// `tail` is not the value the server last published (only the server writes it).
    #[error("tail was changed by someone other than the server")]
    TailCorrupt = 3,
    /// A slot's sequence word names a position or state that no protocol step produces for
    /// the position being reserved, claimed or consumed.
    #[error("a slot sequence word is impossible for its position")]
    SlotSequence = 4,
    /// A fault code this build does not know (another build, or garbage in the header).
    #[error("unknown fault code")]
    Unknown = 255,
}

impl RingFault {
    /// The code stored in the header (never 0).
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The fault a non-zero header code names (`None` for 0: no fault).
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => return None,
            1 => Self::HeadBehindTail,
            2 => Self::HeadTooFarAhead,
            3 => Self::TailCorrupt,
            4 => Self::SlotSequence,
            _ => Self::Unknown,
        })
    }
}

/// A client call or poll failed. Source: seeds/004 §2.2, where it is `CallError`
/// (`CallError::ServerDisconnected`); named for the ring here, like [`RingError`], so that it
/// is not confused with copyrpc's `CallError` or the eRPC core's `ErpcCallError`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingCallError {
    /// The server shut down (`server_alive == false`) or its process is gone (its lock on the
    /// header is no longer held). Outstanding calls will never be answered.
    #[error("delegation server disconnected")]
    ServerDisconnected,
    /// All `resp_depth` response slots have a call outstanding; poll for responses first.
    /// Nothing was reserved or sent.
    #[error("all response slots are in use; poll for responses first")]
    WouldBlock,
    /// The call's deadline passed while waiting for room in the ring (the server is stopped,
    /// e.g. SIGSTOP, or too slow), or for the slot's previous writer to hand it on. Nothing was
    /// sent; if a position had already been reserved it is abandoned (never written), and the
    /// server skips it (after `hole_timeout`, see the module docs).
    #[error("deadline passed while waiting for room in the delegation ring")]
    Timeout,
    /// The server skipped this call's reserved position because the client stalled between
    /// reserving it and committing for longer than the server's `stall_timeout`. The request
    /// was not delivered and never will be (the late commit was refused); the call can be
    /// retried.
    #[error(
        "the server skipped the reserved position: the client stalled for longer than the stall timeout"
    )]
    Skipped,
    /// The ring was marked failed (an impossible `head`/`tail` or slot sequence word, see
    /// [`RingFault`]): outstanding calls will never be answered, and every later call fails.
    #[error("delegation ring failed: {0}")]
    RingCorrupt(RingFault),
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
pub enum RingReplyError {
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

impl From<RingError> for crate::RpcError {
    /// [`crate::RpcError::Transport`] carrying the [`RingError`] (transport `"delegation"`).
    #[cold]
    fn from(e: RingError) -> Self {
        crate::RpcError::from_transport("delegation", e)
    }
}

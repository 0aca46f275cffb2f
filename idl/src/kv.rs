//! The key-value service of the delegation benchmark (seeds/004 §8).
//!
//! The seed's `Request::MetaPut { rank, key, value }` / `Request::MetaGet { rank, key }` map to
//! [`KvServer::put`] / [`KvServer::get`]; its `Response::MetaPutOk` to `()`,
//! `MetaGetOk { value }` to `Some(value)` and `MetaGetNotFound` to `None`. `rank` is the rank
//! that owns the key (the delegation topology forwards a call to that rank); within a rank,
//! the daemon owning a key is `key % daemons` (seeds/004 §7).

use rpc::rpc_service;

/// Key-value store RPCs (seeds/004 §8).
#[rpc_service(transport = "delegation", derive(Debug, PartialEq, Eq))]
pub trait Kv {
    /// Stores `value` under `key` on the shard of rank `rank` (seed: `MetaPut` → `MetaPutOk`).
    fn put(&mut self, rank: u32, key: u64, value: u64);
    /// Reads `key` on the shard of rank `rank`: `Some(value)` (seed: `MetaGetOk`) or `None`
    /// (seed: `MetaGetNotFound`).
    fn get(&mut self, rank: u32, key: u64) -> Option<u64>;
}

/// The daemon (shard) that owns `key` among `daemons` daemons of one rank (seeds/004 §7).
#[inline]
pub fn owner_daemon(key: u64, daemons: usize) -> usize {
    (key % daemons as u64) as usize
}

/// Longest key of [`KvVarServer`], bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// Longest value of [`KvVarServer`], bytes.
pub const MAX_VALUE_BYTES: usize = 4096;

/// The key-value service with variable-length keys and values (issue 15): the same calls as
/// [`Kv`] (seeds/004 §8 `MetaPut`/`MetaGet`), with a UTF-8 key of at most [`MAX_KEY_BYTES`]
/// and a value of at most [`MAX_VALUE_BYTES`] (the message's variable-length bytes, key and
/// value together, are bounded by `max_var_bytes`, their sum). Within a rank the daemon
/// owning a key is [`owner_daemon_of`] (a hash of the key's bytes).
#[rpc_service(
    transport = "delegation",
    derive(Debug, PartialEq, Eq),
    max_var_bytes = 4352
)]
pub trait KvVar {
    /// Stores `value` under `key` on the shard of rank `rank` (seed: `MetaPut` → `MetaPutOk`).
    fn put(&mut self, rank: u32, key: &str, value: &[u8]);
    /// Reads `key` on the shard of rank `rank`: the value, borrowed from the shard (seed:
    /// `MetaGetOk`), or `None` (seed: `MetaGetNotFound`).
    fn get(&self, rank: u32, key: &str) -> Option<&[u8]>;
}

/// The daemon (shard) that owns the variable-length `key` among `daemons` daemons of one
/// rank: FNV-1a (64 bit) of its bytes, modulo `daemons` (the analogue of seeds/004 §7's
/// `key % daemons` for byte-string keys).
#[inline]
pub fn owner_daemon_of(key: &[u8], daemons: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % daemons as u64) as usize
}

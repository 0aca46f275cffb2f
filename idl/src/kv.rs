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

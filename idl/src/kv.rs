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

/// The rank and key of a [`KvVarServer`] request message (a `put` or a `get`), read in place
/// without copying the key: what a daemon routes the request by (the request's `rank`,
/// seeds/004 §8, and the owner of the key's shard, [`owner_daemon_of`]). The key is borrowed
/// from `msg`, checked as [`KvVarService::dispatch_raw`] checks it (inside the message,
/// UTF-8); a put's value is checked too.
///
/// # Errors
/// The [`rpc::wire::WireError`] of a message that is not a `KvVar` request or does not
/// decode (unknown method, bad length, a slice outside the message, bad UTF-8): answered
/// with its status like any request that does not decode.
#[inline]
pub fn kv_var_target(msg: &[u8]) -> Result<(u32, &str), rpc::wire::WireError> {
    let hdr = rpc::wire::read_request_header(msg)?;
    match hdr.method_id {
        KvVarService::PUT => {
            KvVarService::__rpc_put_req_read(hdr, msg).map(|(rank, key, _)| (rank, key))
        }
        KvVarService::GET => KvVarService::__rpc_get_req_read(hdr, msg),
        id => Err(rpc::wire::WireError::UnknownMethod(id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_var_target_reads_rank_and_key_in_place() {
        let mut buf = vec![0u64; 64];
        let out = rpc::__private::zerocopy::IntoBytes::as_mut_bytes(&mut buf[..]);
        let n = KvVarService::__rpc_put_req_write(out, 3, "k042", b"value");
        assert_eq!(kv_var_target(&out[..n]), Ok((3, "k042")));
        let n = KvVarService::__rpc_get_req_write(out, 1, "k7");
        assert_eq!(kv_var_target(&out[..n]), Ok((1, "k7")));
        // A key slice pointing outside the message, and an unknown method.
        assert!(kv_var_target(&out[..n - 1]).is_err());
        out[0] = 0x7f;
        assert_eq!(
            kv_var_target(&out[..n]),
            Err(rpc::wire::WireError::UnknownMethod(0x7f))
        );
    }
}

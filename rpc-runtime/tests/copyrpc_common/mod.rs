//! Helpers shared by the copyrpc device-model tests: deterministic payloads and connecting
//! endpoints of two contexts.
#![allow(dead_code)]

use rpc_runtime::copyrpc::{Context, EndpointConfig, EndpointId};

/// Fills `buf` with the deterministic bytes of `seed` (splitmix64 stream, keyed by the
/// length too, so a truncated payload does not verify).
pub(crate) fn fill(seed: u64, buf: &mut [u8]) {
    let mut x = seed ^ (buf.len() as u64).rotate_left(32);
    for chunk in buf.chunks_mut(8) {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
}

/// The deterministic bytes of `(seed, len)`.
pub(crate) fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(seed, &mut v);
    v
}

/// Whether `bytes` are exactly the bytes of `(seed, expected_len)`.
pub(crate) fn verify(seed: u64, expected_len: usize, bytes: &[u8]) -> bool {
    if bytes.len() != expected_len {
        return false;
    }
    let mut x = seed ^ (bytes.len() as u64).rotate_left(32);
    for chunk in bytes.chunks(8) {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        if chunk != &z.to_le_bytes()[..chunk.len()] {
            return false;
        }
    }
    true
}

/// The seed of the response to a request of seed `seed`.
pub(crate) fn response_seed(seed: u64) -> u64 {
    seed ^ 0xa5a5_5a5a_0f0f_f0f0
}

/// Creates one endpoint on each context with `cfg` and connects them.
pub(crate) fn connect<A, B>(
    a: &mut Context<A>,
    b: &mut Context<B>,
    cfg: &EndpointConfig,
) -> (EndpointId, EndpointId) {
    let ea = a.create_endpoint(cfg).unwrap();
    let eb = b.create_endpoint(cfg).unwrap();
    let (ia, ib) = (a.local_info(ea).unwrap(), b.local_info(eb).unwrap());
    a.connect(ea, &ib).unwrap();
    b.connect(eb, &ia).unwrap();
    (ea, eb)
}

/// A small xorshift64* generator for seeded workloads.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

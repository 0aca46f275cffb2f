//! The workload (seeds/004 §9 step 2): the key distribution ([`Dist`]), one client's
//! pre-generated operations (`gen_pattern`, replayed cyclically), and the writer-id scheme
//! that gives every (rank, key) exactly one writer: a client writes only the keys `k` with
//! `k % writers == writer`, and its values are `(writer << SEQ_BITS) | seq`.

use clap::ValueEnum;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Zipf};

use crate::config::*;

/// Key distribution (`--dist`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dist {
    /// Every key of the range equally likely.
    Uniform,
    /// Zipfian over the key range, exponent `--theta` (`rand_distr::Zipf`).
    Zipf,
}

/// A pre-generated operation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    pub(crate) key: u64,
    pub(crate) rank: u32,
    pub(crate) read: bool,
}

pub(crate) const SEQ_BITS: u32 = 48;

/// Operations [`gen_pattern`] generates between two calls of its `tick`.
pub(crate) const PATTERN_TICK: usize = 1024;

/// Who a client thread is.
#[derive(Clone, Copy)]
pub(crate) struct Me {
    /// Global client id (`rank * clients + c`).
    pub(crate) gid: usize,
    pub(crate) rank: usize,
    /// The writer id in values: the client writes only keys `k` with
    /// `k % writers == writer` ([`Daemons::writer`]; by default `gid`).
    pub(crate) writer: u64,
    /// Number of writer ids (by default all clients of all ranks).
    pub(crate) writers: u64,
}

/// The operations of client `gid` (global id: `rank * clients + c`; it seeds the RNG) over
/// `ranks` ranks, for writer `me.writer` of `me.writers` (it writes only the keys `k` with
/// `k % writers == writer`). With one rank the pattern is exactly the single-node one (no
/// rank is drawn).
///
/// `tick` runs every [`PATTERN_TICK`] operations: generating a long pattern takes a while
/// (about a second for the default 2^20 operations in a debug build on a loaded machine),
/// and a client thread that is already connected keeps its connections polled meanwhile
/// (`client_thread`).
pub(crate) fn gen_pattern(
    load: &LoadArgs,
    me: Me,
    ranks: usize,
    mut tick: impl FnMut(),
) -> Vec<Op> {
    let mut rng =
        SmallRng::seed_from_u64(load.seed ^ (me.gid as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let zipf = Zipf::new(load.keys as f64, load.theta).expect("zipf parameters");
    let (writer, writers) = (me.writer, me.writers);
    (0..load.pattern_len.max(1))
        .map(|i| {
            if i % PATTERN_TICK == PATTERN_TICK - 1 {
                tick();
            }
            let mut key = match load.dist {
                Dist::Uniform => rng.random_range(0..load.keys),
                // Zipf ranks 1..=n, scattered over the key space so hot keys spread over shards.
                Dist::Zipf => {
                    ((zipf.sample(&mut rng) as u64 - 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                        % load.keys
                }
            };
            let read = rng.random_bool(load.read_ratio.clamp(0.0, 1.0));
            if !read {
                // Single writer per key: this client writes only keys congruent to its id.
                key = key - key % writers + writer;
                if key >= load.keys {
                    key -= writers;
                }
            }
            let rank = if ranks > 1 {
                rng.random_range(0..ranks as u32)
            } else {
                0
            };
            Op { key, rank, read }
        })
        .collect()
}

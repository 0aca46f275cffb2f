//! The end-of-run correctness check (see the crate docs, "Correctness"): a sample of the
//! written keys, local and remote, is read back from its owner daemon on its owner rank and
//! must hold the last value written; the counts are summed over the ranks.

use rpc::bootstrap::Bootstrap;
use rpc::bootstrap::wire::{self};

use crate::api::{Api, Ctx, Read};
use crate::client::*;
use crate::config::*;
use crate::wiring::*;
use crate::workload::*;

/// The correctness check over all ranks (the same on every rank).
pub(crate) struct CheckReport {
    pub(crate) checked: usize,
    /// Of `checked`, keys on another rank than their writer's.
    pub(crate) checked_remote: usize,
    pub(crate) mismatches: usize,
    /// The run wrote no sampled key, so the checkers wrote (and read back) their own.
    pub(crate) self_written: bool,
    /// What failed (a client thread, a check call), on any rank.
    pub(crate) failures: Vec<String>,
}

/// Bytes of a sampled key in the check's exchange: its rank (4), key (8), value (8).
pub(crate) const SAMPLE_BYTES: usize = 20;

/// The correctness check, on every rank together. Each rank samples
/// `ceil(--check-samples / ranks)` of the keys its clients wrote (on any rank) and
/// all-gathers them, so that every rank reads the keys it owns back from their owner daemon
/// (blocking calls, each bounded by `--deadline-ms`, through a fresh client of its own
/// daemons) and compares them with the
/// last value their single writer wrote; the counts and failures are summed over the ranks.
/// A run that wrote nothing (`--read-ratio 1`) has nothing to compare, so each rank's
/// checker then writes its own sample keys on its rank (values with writer id
/// `clients * ranks`, which no run client uses) and reads them back. `failure`: a client
/// thread of this rank failed; the rank still takes part, and the check fails.
pub(crate) fn check_written<B: Bootstrap, A: Api, D: Daemons<A>>(
    b: &B,
    daemons: &D,
    clients: &[ClientReport],
    mut failure: Option<String>,
    load: &LoadArgs,
) -> Result<CheckReport, String> {
    let (me, ranks) = (b.rank(), b.size());
    let quota = load.check_samples.div_ceil(ranks);
    // (rank, key, value): one writer per (rank, key), so no key twice.
    let mut written: Vec<(u32, u64, u64)> = clients
        .iter()
        .flat_map(|c| c.written.iter().map(|(&(r, k), &v)| (r, k, v)))
        .collect();
    written.sort_unstable();
    let mut total = [written.len() as u64];
    b.all_reduce_sum_u64(&mut total).map_err(boot)?;
    let self_written = total[0] == 0;
    // Keys and values of the variable-size service (never damaged here).
    let sizes = load.sizes()?.unwrap_or(crate::api::Sizes {
        value: load.value_size,
        key: load.value_size,
    });
    let mut ctx = Ctx::new(sizes, None);
    let mut rings = None;
    if failure.is_none() {
        match daemons.connect(me) {
            Ok(mut r) => {
                set_deadline::<A, _>(&mut r, load);
                rings = Some(r)
            }
            Err(e) => failure = Some(format!("check client: {e}")),
        }
    }
    if let (true, Some(rings)) = (self_written, rings.as_mut()) {
        // A writer id of its own: past the run's clients, or the one the daemons hand out
        // (then only keys of its class, which no other client writes).
        let (id, class) = match daemons.writer(rings.as_mut_slice()) {
            Some((id, writers)) => (id, Some(writers)),
            None => ((load.clients * ranks) as u64, None),
        };
        let writer = id << SEQ_BITS;
        let n = rings.len();
        for i in 0..quota.max(1) as u64 {
            let mut key = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20;
            if let Some(writers) = class {
                key = key - key % writers + id;
            }
            let value = writer | i;
            let owner = A::owner(key, n, &ctx);
            if let Err(e) = A::put(&mut rings[owner], me as u32, key, value, &mut ctx) {
                failure = Some(format!("check put({me}, {key}): {e}"));
                break;
            }
            D::keepalive(rings);
            written.push((me as u32, key, value));
        }
        // Later writes of a repeated key win.
        written.reverse();
        written.sort_by_key(|w| (w.0, w.1));
        written.dedup_by_key(|w| (w.0, w.1));
    }
    let step = (written.len() / quota.max(1)).max(1);
    let mut sample = Vec::with_capacity(quota * SAMPLE_BYTES);
    for &(rank, key, value) in written.iter().step_by(step).take(quota) {
        sample.extend(rank.to_le_bytes());
        sample.extend(key.to_le_bytes());
        sample.extend(value.to_le_bytes());
    }
    let all = gather_var(b, &sample)?;
    let (mut checked, mut checked_remote, mut mismatches) = (0u64, 0u64, 0u64);
    if let (None, Some(rings)) = (&failure, rings.as_mut()) {
        let n = rings.len();
        'read: for (writer_rank, part) in all.iter().enumerate() {
            if part.len() % SAMPLE_BYTES != 0 {
                failure = Some(format!(
                    "check: rank {writer_rank} sent {} sample bytes, not a multiple of {SAMPLE_BYTES}",
                    part.len()
                ));
                break 'read;
            }
            for rec in part.chunks_exact(SAMPLE_BYTES) {
                let (Some(rank), Some(key), Some(want)) = (
                    wire::le_u32(rec, 0),
                    wire::le_u64(rec, 4),
                    wire::le_u64(rec, 12),
                ) else {
                    continue; // unreachable: every chunk is SAMPLE_BYTES long
                };
                if rank as usize != me {
                    continue;
                }
                let owner = A::owner(key, n, &ctx);
                let got = match A::get(&mut rings[owner], rank, key, &mut ctx) {
                    Ok(got) => got,
                    Err(e) => {
                        failure = Some(format!("check get({rank}, {key}): {e}"));
                        break 'read;
                    }
                };
                D::keepalive(rings);
                checked += 1;
                checked_remote += u64::from(writer_rank != me);
                if got.version() != Some(want) {
                    if mismatches < 5 {
                        let what = match got {
                            Read::Miss => "nothing".to_owned(),
                            Read::Hit {
                                version,
                                intact: true,
                            } => format!("version {version}"),
                            Read::Hit { version, .. } => {
                                format!("a damaged value (version field {version})")
                            }
                        };
                        eprintln!(
                            "kv: check: rank {rank} key {key}: read {what}, last written version {want}"
                        );
                    }
                    mismatches += 1;
                }
            }
        }
    }
    // The checker's connections close before any daemon stops.
    drop(rings);
    let mut counts = [checked, checked_remote, mismatches];
    b.all_reduce_sum_u64(&mut counts).map_err(boot)?;
    let failure = failure.map(|f| on_rank(b, f)).unwrap_or_default();
    let failures = gather_var(b, failure.as_bytes())?
        .into_iter()
        .filter(|f| !f.is_empty())
        .map(|f| String::from_utf8_lossy(&f).into_owned())
        .collect();
    Ok(CheckReport {
        checked: counts[0] as usize,
        checked_remote: counts[1] as usize,
        mismatches: counts[2] as usize,
        self_written,
        failures,
    })
}

//! Bootstrap: how the ranks of a job find each other (issue 7 §1; DESIGN.md "Multi-node").
//!
//! A job is `size` ranks numbered `0..size`. Before any transport runs, ranks exchange
//! fixed-size endpoint information (copyrpc's [`crate::copyrpc::EndpointInfo`], a ScaleRPC or
//! eRPC address, ..) with [`Bootstrap::all_gather`], synchronize with [`Bootstrap::barrier`], and
//! at the end add up their results with [`Bootstrap::all_reduce_sum_u64`] /
//! [`Bootstrap::all_reduce_sum_f64`] (seeds/004 §9, steps 8, 10 and 14: MPI endpoint exchange,
//! MPI barrier, `all_reduce` of the per-rank RPS).
//!
//! Two implementations:
//! - [`threads::ThreadGroup`]: ranks are threads of this process (the default; needs nothing
//!   but Rust). Collectives meet in shared memory guarded by a mutex.
//! - `mpi::MpiBootstrap` (cargo feature `mpi`, rsmpi): ranks are MPI processes started by
//!   `mpirun`; collectives are `MPI_Allgather`, `MPI_Barrier` and `MPI_Allreduce` on
//!   `MPI_COMM_WORLD`.
//!
//! [`Bootstrap::node`] derives the node-local rank from the ranks' host names (every rank
//! contributes its name to an all-gather; ranks with equal names share a node), which places
//! daemons, rings and NICs per node as seeds/004 §1.3 and §9 do.
//!
//! # Failure
//! Every collective is all-or-nothing: it returns only when every rank has entered it. A rank
//! that never arrives must not hang the others: the in-process group fails the collective with
//! [`BootstrapError::PeerGone`] when a rank's handle is dropped (its thread ended or panicked)
//! and with [`BootstrapError::Timeout`] after the group's timeout; MPI aborts the job when a
//! process dies (Open MPI's default), which ends the others too.

pub mod threads;
pub mod wire;

#[cfg(feature = "mpi")]
pub mod mpi;

use std::time::Duration;

use thiserror::Error;

/// Longest host name [`Bootstrap::node`] compares, in bytes (longer names are truncated;
/// POSIX `HOST_NAME_MAX` is 64 on Linux).
pub const HOSTNAME_BYTES: usize = 64;

/// Default time a rank waits in a collective for the others (60 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a collective failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BootstrapError {
    /// Ranks contributed buffers of different lengths to one all-gather or all-reduce.
    #[error("rank {rank} contributed {got} bytes/elements, rank 0 {expected}")]
    LengthMismatch {
        /// The rank whose contribution differs.
        rank: usize,
        /// Length from rank 0.
        expected: usize,
        /// Length from `rank`.
        got: usize,
    },
    /// A rank left the group (its handle was dropped) before the collective completed.
    #[error("rank {0} left the group")]
    PeerGone(usize),
    /// The other ranks did not all arrive within the timeout.
    #[error("collective timed out after {0:?} waiting for other ranks")]
    Timeout(Duration),
    /// The MPI library reported an error.
    #[error("MPI: {0}")]
    Mpi(String),
    /// What a rank contributed does not decode ([`wire`]; issue 14: bytes from another
    /// process are checked, never trusted).
    #[error("rank {rank} sent a bad record: {what}")]
    BadRecord {
        /// The rank whose contribution is wrong (0 when the result as a whole is).
        rank: usize,
        /// What is wrong with it.
        what: String,
    },
}

/// Where a rank sits among the ranks of its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeInfo {
    /// Index of this rank's node, nodes numbered in order of their lowest rank.
    pub node: usize,
    /// Number of nodes.
    pub nodes: usize,
    /// This rank's index among the ranks of its node (in rank order).
    pub local_rank: usize,
    /// Ranks on this node.
    pub local_size: usize,
}

/// The collective operations a job's ranks use to set up and to report (module docs).
pub trait Bootstrap {
    /// This rank, in `0..size()`.
    fn rank(&self) -> usize;

    /// Ranks in the job.
    fn size(&self) -> usize;

    /// Every rank contributes `mine` (the same length on every rank); returns the
    /// concatenation in rank order (`size() * mine.len()` bytes).
    ///
    /// # Errors
    /// [`BootstrapError::LengthMismatch`] if the lengths differ, and the implementation's
    /// failure errors (module docs).
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<u8>, BootstrapError>;

    /// Returns once every rank has called it.
    ///
    /// # Errors
    /// The implementation's failure errors (module docs).
    fn barrier(&self) -> Result<(), BootstrapError>;

    /// Element-wise sum over the ranks of `values` (same length everywhere), in place,
    /// wrapping on overflow. Default: an all-gather of every rank's values, summed locally.
    ///
    /// # Errors
    /// As [`Bootstrap::all_gather`].
    fn all_reduce_sum_u64(&self, values: &mut [u64]) -> Result<(), BootstrapError> {
        let all = self.all_gather(&to_le_bytes(values.iter().map(|v| v.to_le_bytes())))?;
        let words = wire::split_ranks(&all, self.size(), 8 * values.len())?;
        values.fill(0);
        for part in words {
            for (i, v) in values.iter_mut().enumerate() {
                *v = v.wrapping_add(wire::le_u64(part, 8 * i).unwrap_or(0));
            }
        }
        Ok(())
    }

    /// Element-wise sum over the ranks of `values` (same length everywhere), in place. The
    /// sum is taken in rank order, so every rank gets the same bits (which `MPI_SUM` on
    /// doubles does not promise); this default is therefore used by every implementation.
    ///
    /// # Errors
    /// As [`Bootstrap::all_gather`].
    fn all_reduce_sum_f64(&self, values: &mut [f64]) -> Result<(), BootstrapError> {
        let all = self.all_gather(&to_le_bytes(values.iter().map(|v| v.to_le_bytes())))?;
        let words = wire::split_ranks(&all, self.size(), 8 * values.len())?;
        values.fill(0.0);
        for part in words {
            for (i, v) in values.iter_mut().enumerate() {
                *v += f64::from_bits(wire::le_u64(part, 8 * i).unwrap_or(0));
            }
        }
        Ok(())
    }

    /// This rank's host name as [`Bootstrap::node`] compares it.
    fn hostname(&self) -> String;

    /// The node-local placement of this rank, from every rank's [`Bootstrap::hostname`]
    /// (a collective: every rank must call it).
    ///
    /// # Errors
    /// As [`Bootstrap::all_gather`].
    fn node(&self) -> Result<NodeInfo, BootstrapError> {
        let mut mine = [0u8; HOSTNAME_BYTES];
        let name = self.hostname();
        let n = name.len().min(HOSTNAME_BYTES);
        mine[..n].copy_from_slice(&name.as_bytes()[..n]);
        let all = self.all_gather(&mine)?;
        let names = wire::split_ranks(&all, self.size(), HOSTNAME_BYTES)?;
        node_info(&names, self.rank()).ok_or_else(|| BootstrapError::BadRecord {
            rank: self.rank(),
            what: format!(
                "rank {} outside the {} ranks gathered",
                self.rank(),
                names.len()
            ),
        })
    }
}

/// The concatenated little-endian encodings of a reduction's values.
fn to_le_bytes(values: impl Iterator<Item = [u8; 8]>) -> Vec<u8> {
    values.flatten().collect()
}

/// Node placement of `rank` given every rank's host name (in rank order); `None` if `rank`
/// is not among them.
pub(crate) fn node_info(names: &[&[u8]], rank: usize) -> Option<NodeInfo> {
    let mut firsts: Vec<&[u8]> = Vec::new();
    for n in names {
        if !firsts.contains(n) {
            firsts.push(n);
        }
    }
    let me = *names.get(rank)?;
    Some(NodeInfo {
        node: firsts.iter().position(|n| *n == me)?,
        nodes: firsts.len(),
        local_rank: names[..rank].iter().filter(|n| **n == me).count(),
        local_size: names.iter().filter(|n| **n == me).count(),
    })
}

/// The host name of this machine (`gethostname(2)`), or `"localhost"` if it cannot be read.
pub fn local_hostname() -> String {
    let mut buf = [0u8; HOSTNAME_BYTES + 1];
    // SAFETY: `buf` is writable for its whole length, which is what we pass.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".to_owned();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_info_groups_ranks_by_host_name_in_rank_order() {
        let names: Vec<&[u8]> = vec![b"b", b"a", b"b", b"c", b"a", b"b"];
        let got: Vec<_> = (0..names.len())
            .map(|r| node_info(&names, r).unwrap())
            .collect();
        let want = [
            (0, 0, 3),
            (1, 0, 2),
            (0, 1, 3),
            (2, 0, 1),
            (1, 1, 2),
            (0, 2, 3),
        ];
        for (r, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!((g.node, g.local_rank, g.local_size), w, "rank {r}");
            assert_eq!(g.nodes, 3);
        }
        assert_eq!(node_info(&names, names.len()), None);
    }

    #[test]
    fn local_hostname_is_the_kernels() {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(local_hostname(), kernel.trim_end());
    }
}

//! MPI ranks (cargo feature `mpi`): the [`Bootstrap`] collectives on `MPI_COMM_WORLD` through
//! rsmpi (seeds/004 §9 steps 8, 10 and 14: endpoint exchange, barrier, `all_reduce`).
//!
//! [`MpiBootstrap::init`] initializes MPI once per process (rsmpi, thread level Funneled: other
//! threads run, only the initializing one calls MPI; MPI is
//! finalized when the bootstrap is dropped). Collectives are blocking MPI calls:
//! `MPI_Allgather` of bytes, `MPI_Barrier`, and `MPI_Allreduce` with `MPI_SUM` for `u64` (the
//! `f64` sum is the trait's rank-ordered default, so every rank gets the same bits). A process
//! that dies makes `mpirun` abort the job (Open MPI's default), which ends the other ranks;
//! the errors below cover what this module checks itself.
//!
//! Lengths: MPI collectives require every rank to pass the same count, and a mismatch is
//! undefined behaviour in MPI, so [`Bootstrap::all_gather`] and the reductions first
//! all-gather the lengths (8 bytes per rank) and fail with
//! [`BootstrapError::LengthMismatch`] on every rank before exchanging the data.

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};

use super::{Bootstrap, BootstrapError};

/// This process's rank of an MPI job (see the [module docs](self)).
pub struct MpiBootstrap {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    hostname: String,
    /// Declared last so it drops last (fields drop in declaration order): finalizes MPI
    /// after the communicator is gone.
    _universe: Universe,
}

impl std::fmt::Debug for MpiBootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiBootstrap")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("hostname", &self.hostname)
            .finish()
    }
}

impl MpiBootstrap {
    /// Initializes MPI and returns this process's rank of `MPI_COMM_WORLD`.
    ///
    /// # Errors
    /// [`BootstrapError::Mpi`] if MPI was already initialized in this process (rsmpi
    /// initializes once).
    pub fn init() -> Result<MpiBootstrap, BootstrapError> {
        // Funneled: the process may run many threads, but only the one that initialized MPI
        // calls it (every `Bootstrap` method runs on that thread).
        let (universe, provided) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            .ok_or_else(|| BootstrapError::Mpi("MPI is already initialized".into()))?;
        if provided < mpi::Threading::Funneled {
            return Err(BootstrapError::Mpi(format!(
                "the MPI library provides thread level {provided:?}, below Funneled"
            )));
        }
        let world = universe.world();
        let rank = world.rank() as usize;
        let size = world.size() as usize;
        let hostname =
            mpi::environment::processor_name().unwrap_or_else(|_| super::local_hostname());
        Ok(MpiBootstrap {
            world,
            rank,
            size,
            hostname,
            _universe: universe,
        })
    }

    /// Checks that every rank passes `len` (bytes or elements) to the collective about to run.
    fn agree_on_length(&self, len: usize) -> Result<(), BootstrapError> {
        let mine = len as u64;
        let mut all = vec![0u64; self.size];
        self.world.all_gather_into(&mine, &mut all[..]);
        match all.iter().position(|&l| l != all[0]) {
            None => Ok(()),
            Some(rank) => Err(BootstrapError::LengthMismatch {
                rank,
                expected: all[0] as usize,
                got: all[rank] as usize,
            }),
        }
    }
}

impl Bootstrap for MpiBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<u8>, BootstrapError> {
        self.agree_on_length(mine.len())?;
        let mut all = vec![0u8; mine.len() * self.size];
        if !mine.is_empty() {
            self.world.all_gather_into(mine, &mut all[..]);
        }
        Ok(all)
    }

    fn barrier(&self) -> Result<(), BootstrapError> {
        self.world.barrier();
        Ok(())
    }

    fn all_reduce_sum_u64(&self, values: &mut [u64]) -> Result<(), BootstrapError> {
        self.agree_on_length(values.len())?;
        if values.is_empty() {
            return Ok(());
        }
        let mine = values.to_vec();
        self.world
            .all_reduce_into(&mine[..], values, SystemOperation::sum());
        Ok(())
    }

    fn hostname(&self) -> String {
        self.hostname.clone()
    }
}

//! CPU pinning of daemons and clients (seeds/004 §9 step 1: the available cores are handed
//! out to the daemons, then the clients), with the `core_affinity` crate.
//!
//! Every rank on a host takes its own block of `daemons + clients` cores, in node-local rank
//! order: rank `l` of the host pins daemon `d` to core `l * (D + C) + d` and client `c` to
//! core `l * (D + C) + D + c` (cores as `core_affinity::get_core_ids` lists them). Pinning is
//! on by default and off with `--no-pin`; when the host has fewer cores than its ranks need,
//! nothing is pinned (threads sharing a core would only run worse pinned) and the summary
//! says so.

use core_affinity::CoreId;
use rpc::bootstrap::Bootstrap;

use crate::wiring::boot;

/// Which core each thread of a rank runs on, if any.
#[derive(Clone, Debug, Default)]
pub struct Pinning {
    /// The rank's block of cores: daemons first, then clients (empty: not pinned).
    cores: Vec<CoreId>,
    daemons: usize,
    /// Why nothing is pinned (`None` when pinned).
    pub off_reason: Option<String>,
}

impl Pinning {
    /// Nothing pinned, for `reason`.
    pub fn off(reason: &str) -> Self {
        Pinning {
            off_reason: Some(reason.to_owned()),
            ..Pinning::default()
        }
    }

    /// The plan for this rank: `enabled` (not `--no-pin`), `daemons` and `clients` threads
    /// per rank. A collective (every rank must call it): the node-local rank comes from the
    /// bootstrap.
    ///
    /// # Errors
    /// A bootstrap failure.
    pub fn plan<B: Bootstrap>(
        b: &B,
        enabled: bool,
        daemons: usize,
        clients: usize,
    ) -> Result<Self, String> {
        let node = b.node().map_err(boot)?;
        if !enabled {
            return Ok(Pinning::off("--no-pin"));
        }
        let all = core_affinity::get_core_ids().unwrap_or_default();
        let per_rank = daemons + clients;
        let need = per_rank * node.local_size;
        if need > all.len() {
            return Ok(Pinning::off(&format!(
                "{need} threads on this host ({} rank(s) x ({daemons} daemons + {clients} clients)) \
                 but {} core(s)",
                node.local_size,
                all.len()
            )));
        }
        let first = node.local_rank * per_rank;
        Ok(Pinning {
            cores: all[first..first + per_rank].to_vec(),
            daemons,
            off_reason: None,
        })
    }

    /// What the summary says about pinning.
    pub fn note(&self) -> String {
        match &self.off_reason {
            None => format!(
                "{} daemon(s) and {} client(s) pinned to cores {:?}",
                self.daemons,
                self.cores.len() - self.daemons,
                self.cores.iter().map(|c| c.id).collect::<Vec<_>>()
            ),
            Some(why) => format!("off ({why})"),
        }
    }

    /// Whether threads are pinned.
    pub fn pinned(&self) -> bool {
        !self.cores.is_empty()
    }

    /// The core of daemon `d`.
    pub fn daemon(&self, d: usize) -> Option<CoreId> {
        (d < self.daemons)
            .then(|| self.cores.get(d).copied())
            .flatten()
    }

    /// The core of client thread `c`.
    pub fn client(&self, c: usize) -> Option<CoreId> {
        self.cores.get(self.daemons + c).copied()
    }
}

/// Pins the calling thread to `core` (nothing for `None`); a refusal by the OS is logged, not
/// fatal.
pub fn pin_current(core: Option<CoreId>) {
    if let Some(core) = core {
        if !core_affinity::set_for_current(core) {
            tracing::warn!(core = core.id, "kv: could not pin a thread to its core");
        }
    }
}

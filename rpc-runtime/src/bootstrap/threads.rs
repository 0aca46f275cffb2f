//! In-process ranks: every rank is a thread holding a [`ThreadRank`] of one group.
//!
//! A collective is one *generation*: each rank deposits its contribution under the group's
//! mutex; the last to arrive builds the result (the contributions concatenated in rank order),
//! publishes it, advances the generation and wakes the others, who copy it out. The result of
//! generation `g` stays published until generation `g + 1` completes, which needs every rank,
//! so no rank can miss it.
//!
//! Failure (module docs of [`super`]): dropping a [`ThreadRank`] marks its rank gone, which
//! fails every collective in progress or later with [`BootstrapError::PeerGone`]; a rank that
//! waits longer than [`ThreadGroupConfig::timeout`] fails its collective with
//! [`BootstrapError::Timeout`] and breaks the group (every later collective fails too, since
//! the ranks no longer agree on which collective they are in).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Bootstrap, BootstrapError, DEFAULT_TIMEOUT, local_hostname};

/// Shape of an in-process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadGroupConfig {
    /// Ranks (threads), `>= 1`.
    pub ranks: usize,
    /// Ranks that pretend to share a node: with `Some(k)`, rank `r` reports the host name
    /// `node{r / k}` (so [`Bootstrap::node`] sees `ceil(ranks / k)` nodes); with `None`, every
    /// rank reports this machine's name (one node).
    pub ranks_per_node: Option<usize>,
    /// Longest wait in one collective for the other ranks.
    pub timeout: Duration,
}

impl ThreadGroupConfig {
    /// `ranks` ranks on one node with [`DEFAULT_TIMEOUT`].
    pub fn new(ranks: usize) -> Self {
        ThreadGroupConfig {
            ranks,
            ranks_per_node: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// Creates the ranks of an in-process group.
#[derive(Debug)]
pub struct ThreadGroup;

impl ThreadGroup {
    /// `ranks` handles, rank `i` at index `i`, on one node with the default timeout; move
    /// each into its thread.
    ///
    /// # Panics
    /// If `ranks` is 0.
    pub fn ranks(ranks: usize) -> Vec<ThreadRank> {
        Self::ranks_with(ThreadGroupConfig::new(ranks))
    }

    /// The handles of a group shaped by `cfg`, rank `i` at index `i`.
    ///
    /// # Panics
    /// If `cfg.ranks` or `cfg.ranks_per_node` is 0.
    pub fn ranks_with(cfg: ThreadGroupConfig) -> Vec<ThreadRank> {
        assert!(cfg.ranks > 0, "a group needs at least one rank");
        assert!(cfg.ranks_per_node != Some(0), "ranks_per_node must be >= 1");
        let shared = Arc::new(Shared {
            size: cfg.ranks,
            timeout: cfg.timeout,
            state: Mutex::new(State {
                generation: 0,
                arrived: 0,
                contributions: vec![None; cfg.ranks],
                result: Arc::new(Ok(Vec::new())),
                broken: None,
            }),
            cv: Condvar::new(),
        });
        let host = local_hostname();
        (0..cfg.ranks)
            .map(|rank| ThreadRank {
                rank,
                hostname: match cfg.ranks_per_node {
                    Some(k) => format!("node{}", rank / k),
                    None => host.clone(),
                },
                shared: shared.clone(),
            })
            .collect()
    }
}

struct Shared {
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

struct State {
    /// Collectives completed.
    generation: u64,
    /// Ranks that entered the current collective.
    arrived: usize,
    contributions: Vec<Option<Vec<u8>>>,
    /// Result of the last completed collective.
    result: Arc<Result<Vec<u8>, BootstrapError>>,
    /// Set once the group can no longer run collectives.
    broken: Option<BootstrapError>,
}

/// One rank of an in-process group (see the [module docs](self)).
pub struct ThreadRank {
    rank: usize,
    hostname: String,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ThreadRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadRank")
            .field("rank", &self.rank)
            .field("size", &self.shared.size)
            .finish()
    }
}

impl ThreadRank {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panicked while holding the lock left consistent state (every update
        // below is completed before anything can panic), so poisoning is ignored.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One collective: deposits `mine`, waits for every rank, returns the concatenation.
    fn exchange(&self, mine: &[u8]) -> Result<Vec<u8>, BootstrapError> {
        let sh = &*self.shared;
        let mut st = self.lock();
        if let Some(e) = &st.broken {
            return Err(e.clone());
        }
        let generation = st.generation;
        st.contributions[self.rank] = Some(mine.to_vec());
        st.arrived += 1;
        if st.arrived == sh.size {
            let parts: Vec<Vec<u8>> = st
                .contributions
                .iter_mut()
                .map(|c| c.take().unwrap())
                .collect();
            let expected = parts[0].len();
            let result = match parts.iter().position(|p| p.len() != expected) {
                Some(rank) => Err(BootstrapError::LengthMismatch {
                    rank,
                    expected,
                    got: parts[rank].len(),
                }),
                None => Ok(parts.concat()),
            };
            st.result = Arc::new(result);
            st.arrived = 0;
            st.generation += 1;
            sh.cv.notify_all();
            return (*st.result).clone();
        }
        let deadline = Instant::now() + sh.timeout;
        loop {
            if st.generation != generation {
                return (*st.result).clone();
            }
            if let Some(e) = &st.broken {
                return Err(e.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                let e = BootstrapError::Timeout(sh.timeout);
                st.broken = Some(e.clone());
                sh.cv.notify_all();
                return Err(e);
            }
            st = sh
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for ThreadRank {
    fn drop(&mut self) {
        let mut st = self.lock();
        if st.broken.is_none() {
            st.broken = Some(BootstrapError::PeerGone(self.rank));
        }
        self.shared.cv.notify_all();
    }
}

impl Bootstrap for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<u8>, BootstrapError> {
        self.exchange(mine)
    }

    fn barrier(&self) -> Result<(), BootstrapError> {
        self.exchange(&[]).map(|_| ())
    }

    fn hostname(&self) -> String {
        self.hostname.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;

    /// Runs `f` on every rank of `ranks` in its own thread; returns the results in rank order.
    fn run<T: Send + 'static>(
        ranks: Vec<ThreadRank>,
        f: impl Fn(&ThreadRank) -> T + Send + Sync + Clone + 'static,
    ) -> Vec<T> {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|r| {
                let f = f.clone();
                thread::spawn(move || f(&r))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn all_gather_barrier_and_reductions_across_many_rounds() {
        let out = run(ThreadGroup::ranks(5), |r| {
            let mut sums = Vec::new();
            for round in 0..200u64 {
                let mine = [r.rank() as u8, round as u8, 7];
                let all = r.all_gather(&mine).unwrap();
                assert_eq!(all.len(), 15);
                for (k, part) in all.chunks_exact(3).enumerate() {
                    assert_eq!(part, [k as u8, round as u8, 7]);
                }
                r.barrier().unwrap();
                let mut v = [r.rank() as u64, round];
                r.all_reduce_sum_u64(&mut v).unwrap();
                assert_eq!(v, [10, 5 * round]);
                let mut f = [0.5 * r.rank() as f64];
                r.all_reduce_sum_f64(&mut f).unwrap();
                sums.push(f[0].to_bits());
            }
            sums
        });
        // Every rank got exactly the same bits.
        assert!(out.iter().all(|s| *s == out[0]));
        assert_eq!(f64::from_bits(out[0][0]), 5.0);
    }

    #[test]
    fn simulated_nodes_give_node_local_ranks() {
        let cfg = ThreadGroupConfig {
            ranks_per_node: Some(2),
            ..ThreadGroupConfig::new(5)
        };
        let out = run(ThreadGroup::ranks_with(cfg), |r| r.node().unwrap());
        let got: Vec<_> = out
            .iter()
            .map(|n| (n.node, n.local_rank, n.local_size, n.nodes))
            .collect();
        assert_eq!(
            got,
            [
                (0, 0, 2, 3),
                (0, 1, 2, 3),
                (1, 0, 2, 3),
                (1, 1, 2, 3),
                (2, 0, 1, 3)
            ]
        );
        let one = run(ThreadGroup::ranks(3), |r| r.node().unwrap());
        assert!(
            one.iter()
                .enumerate()
                .all(|(i, n)| n.local_rank == i && n.nodes == 1)
        );
    }

    #[test]
    fn length_mismatch_is_reported_to_every_rank() {
        let out = run(ThreadGroup::ranks(3), |r| {
            let mine = vec![0u8; if r.rank() == 2 { 4 } else { 3 }];
            r.all_gather(&mine)
        });
        for res in out {
            assert_eq!(
                res,
                Err(BootstrapError::LengthMismatch {
                    rank: 2,
                    expected: 3,
                    got: 4
                })
            );
        }
    }

    #[test]
    fn a_rank_that_leaves_fails_the_others_instead_of_hanging() {
        let mut ranks = ThreadGroup::ranks(3);
        let gone = ranks.pop().unwrap();
        let waiting: Vec<_> = ranks
            .into_iter()
            .map(|r| thread::spawn(move || r.barrier()))
            .collect();
        thread::sleep(Duration::from_millis(50));
        drop(gone);
        for h in waiting {
            assert_eq!(h.join().unwrap(), Err(BootstrapError::PeerGone(2)));
        }
    }

    #[test]
    fn a_rank_that_never_arrives_times_out_and_breaks_the_group() {
        let cfg = ThreadGroupConfig {
            timeout: Duration::from_millis(100),
            ..ThreadGroupConfig::new(2)
        };
        let ranks = ThreadGroup::ranks_with(cfg);
        let t = Instant::now();
        let e = ranks[0].barrier();
        assert_eq!(e, Err(BootstrapError::Timeout(Duration::from_millis(100))));
        assert!(t.elapsed() >= Duration::from_millis(100));
        // The late rank finds the group broken rather than waiting for a partner.
        assert_eq!(ranks[1].barrier(), e);
    }

    #[test]
    fn a_single_rank_group_needs_nobody() {
        let r = ThreadGroup::ranks(1).pop().unwrap();
        assert_eq!(r.all_gather(b"xy").unwrap(), b"xy");
        let mut v = [3u64];
        r.all_reduce_sum_u64(&mut v).unwrap();
        assert_eq!(v, [3]);
    }
}

//! Flux: N-to-N request/response channels between the daemon threads of one rank.
//! Source: seeds/004 §1.3 (the Flux node of each daemon), §4.3 (Daemon#0 forwards a remote
//! request to the shard owner's daemon and gets its response back), §5 Phase 4 and the worker
//! loop (`flux.poll`, `flux.try_recv_raw`, `flux.reply`), §8 (`DelegatePayload::{Req, Resp}`),
//! §9 step 5 (K nodes, capacity 1024, max_inflight 256, user token `usize`).
//!
//! [`network`] creates the handles of `K` nodes, one per daemon thread; each is a [`Flux`].
//! A node sends a request to any node with [`Flux::call`] (`target`, payload, a user token
//! such as the index of a pending copyrpc receive handle), takes requests sent to it with
//! [`Flux::try_recv_raw`] and answers each with [`Flux::reply`]; the caller gets
//! `(user token, response)` from [`Flux::poll`]. The payload type is generic: the seed's
//! `DelegatePayload` (request and response in one enum) or separate types per direction.
//!
//! # Channels
//! Every ordered pair of nodes `(i, j)` has two bounded single-producer single-consumer
//! queues (`crossbeam_queue::ArrayQueue`, lock-free): requests from `i` to `j` and responses
//! from `i` to `j`, each holding at most `capacity` messages. Separate request and response
//! queues let `poll` and `try_recv_raw` each take only their own kind, in arrival order per
//! sender. `try_recv_raw` visits the senders round-robin, so one busy sender cannot starve the
//! others.
//!
//! # Limits and errors
//! A node has at most `max_inflight` calls outstanding (seeds/004 §9: 256); one more is refused
//! with [`FluxError::TooManyInFlight`], a full request queue with [`FluxError::Full`], and both
//! hand the payload back so the caller can retry later without losing it. Because
//! `capacity >= max_inflight` ([`FluxConfig::validate`]), the response queue back to a caller
//! can take the answers to all its outstanding calls; `reply` fails with [`FluxError::Full`]
//! (payload handed back, retry later) only while answers to calls the caller cancelled, or
//! duplicate answers, still occupy that queue.
//!
//! # Every call ends; stale responses are dropped
//! Nothing here blocks or waits: `call`, `reply`, `poll` and `try_recv_raw` return at once. A
//! node that stops serving (a stalled or panicked daemon thread) leaves its callers' calls
//! outstanding; the caller bounds them by its own deadline and gives each up with
//! [`Flux::cancel`], which frees the call's slot. Each call carries `(slot, generation)`: a
//! response that arrives after its call was cancelled (and its slot perhaps reused) names an
//! old generation and is dropped and counted in [`FluxStats::stale_responses`], never
//! delivered to another call.
//!
//! Flux is in-process only (threads of one process), as in the seed: payloads are moved
//! through the queues, not copied into shared memory.
//!
//! # Sleeping (extension, seed: none)
//! A node's thread may sleep until a message is pushed to it ([`Flux::prepare_sleep`], for
//! `NodeDaemon::wait_for_work`, which waits on it with the daemon's other words): it
//! `swap`s its word to 1 (SeqCst), then finds every queue into it empty (`is_empty`, SeqCst
//! loads of head and tail). A sender, after its push (a SeqCst compare-and-swap of the
//! queue's tail), loads the target's word (SeqCst) and, if set, swaps it to 0 and wakes it
//! (`FUTEX_WAKE`): a push the sleeper's check missed is ordered after the sleeper's `swap`
//! in the single total order, so the sender sees the 1. Cost to a sender: one load of a
//! line the target writes only when it goes to sleep.

use std::sync::Arc;

use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;

/// Default capacity of each queue, in messages. Source: seeds/004 §9 step 5.
pub const DEFAULT_CAPACITY: usize = 1024;
/// Default largest number of calls one node has outstanding. Source: seeds/004 §9 step 5.
pub const DEFAULT_MAX_INFLIGHT: usize = 256;

/// Sizes of a Flux network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FluxConfig {
    /// Messages each queue (per ordered node pair and direction) holds. Default 1024.
    pub capacity: usize,
    /// Calls one node may have outstanding (sent, response not yet taken by `poll`, not
    /// cancelled). Default 256; at most `capacity` and at most 2^31.
    pub max_inflight: usize,
}

impl Default for FluxConfig {
    fn default() -> Self {
        Self {
            capacity: DEFAULT_CAPACITY,
            max_inflight: DEFAULT_MAX_INFLIGHT,
        }
    }
}

impl FluxConfig {
    /// Checks the sizes: `1 <= max_inflight <= capacity`, `max_inflight <= 2^31`.
    ///
    /// # Errors
    /// [`FluxConfigError`] naming the setting.
    pub fn validate(&self) -> Result<(), FluxConfigError> {
        if self.max_inflight == 0 || self.max_inflight > 1 << 31 {
            return Err(FluxConfigError(format!(
                "max_inflight = {} must be in 1..=2^31",
                self.max_inflight
            )));
        }
        if self.capacity < self.max_inflight {
            return Err(FluxConfigError(format!(
                "capacity = {} must be at least max_inflight = {} (a caller's responses must \
                 always fit in the queue back to it)",
                self.capacity, self.max_inflight
            )));
        }
        Ok(())
    }
}

/// A Flux network or configuration that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid Flux configuration: {0}")]
pub struct FluxConfigError(String);

/// Why a [`Flux::call`] or [`Flux::reply`] did not send; carries the payload back.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FluxError<T> {
    /// `target` (or the token's sender) is not a node of this network.
    #[error("flux node {node} does not exist ({nodes} nodes)")]
    NoSuchNode {
        /// The node named.
        node: usize,
        /// Nodes in the network.
        nodes: usize,
        /// The payload, not sent.
        payload: T,
    },
    /// This node already has `max_inflight` calls outstanding.
    #[error("flux: {max_inflight} calls already in flight")]
    TooManyInFlight {
        /// The limit.
        max_inflight: usize,
        /// The payload, not sent.
        payload: T,
    },
    /// The queue to that node is full (`capacity` messages): try again after it has taken
    /// some.
    #[error("flux: the queue to node {node} is full")]
    Full {
        /// The node the queue leads to.
        node: usize,
        /// The payload, not sent.
        payload: T,
    },
}

impl<T> FluxError<T> {
    /// The payload that was not sent.
    pub fn into_payload(self) -> T {
        match self {
            FluxError::NoSuchNode { payload, .. }
            | FluxError::TooManyInFlight { payload, .. }
            | FluxError::Full { payload, .. } => payload,
        }
    }
}

/// Identifies one outstanding call of a node (returned by [`Flux::call`], for
/// [`Flux::cancel`]): its slot in the node's call table and the slot's generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallId {
    slot: u32,
    generation: u32,
}

/// A received request's return address (from [`Flux::try_recv_raw`], for [`Flux::reply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FluxToken {
    from: u32,
    call: CallId,
}

impl FluxToken {
    /// The node that sent the request.
    pub fn from(&self) -> usize {
        self.from as usize
    }
}

/// Counters of one node (events since it was created).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FluxStats {
    /// Requests sent with `call`.
    pub calls: u64,
    /// Requests taken with `try_recv_raw`.
    pub requests_received: u64,
    /// Responses sent with `reply`.
    pub replies: u64,
    /// Responses delivered by `poll`.
    pub responses: u64,
    /// Calls given up with `cancel`.
    pub cancelled: u64,
    /// Responses dropped by `poll` because their call was cancelled (or the call id is not
    /// one this node issued).
    pub stale_responses: u64,
}

struct Request<T> {
    from: u32,
    call: CallId,
    payload: T,
}

struct Response<T> {
    call: CallId,
    payload: T,
}

/// One ordered pair's queues.
struct Lane<T> {
    requests: ArrayQueue<Request<T>>,
    responses: ArrayQueue<Response<T>>,
}

/// A call slot: the generation of its current (or next) call and the user token while busy.
struct Slot<U> {
    generation: u32,
    token: Option<U>,
}

/// One node of a Flux network (seeds/004 §1.3): owned by one daemon thread (`Send`, not
/// shared). Created by [`network`].
pub struct Flux<T, U = usize> {
    id: u32,
    /// `lanes[i][j]`: from node `i` to node `j`, shared by all nodes' handles.
    lanes: Arc<[Box<[Lane<T>]>]>,
    /// Per node: its sleep word (module docs, "Sleeping"), shared by all nodes' handles.
    wake: Arc<[CachePadded<AtomicU32>]>,
    max_inflight: usize,
    slots: Box<[Slot<U>]>,
    free: Vec<u32>,
    next_sender: usize,
    stats: FluxStats,
}

/// Creates a network of `nodes` Flux nodes and returns their handles, node `i` at index `i`.
/// Source: seeds/004 §9 step 5.
///
/// # Errors
/// [`FluxConfigError`] if `nodes` is 0 or above 2^16, or `cfg` is invalid
/// ([`FluxConfig::validate`]).
pub fn network<T, U>(nodes: usize, cfg: FluxConfig) -> Result<Vec<Flux<T, U>>, FluxConfigError> {
    cfg.validate()?;
    if nodes == 0 || nodes > 1 << 16 {
        return Err(FluxConfigError(format!(
            "nodes = {nodes} must be in 1..=65536"
        )));
    }
    let lanes: Arc<[Box<[Lane<T>]>]> = (0..nodes)
        .map(|_| {
            (0..nodes)
                .map(|_| Lane {
                    requests: ArrayQueue::new(cfg.capacity),
                    responses: ArrayQueue::new(cfg.capacity),
                })
                .collect()
        })
        .collect();
    let wake: Arc<[CachePadded<AtomicU32>]> = (0..nodes)
        .map(|_| CachePadded::new(AtomicU32::new(0)))
        .collect();
    Ok((0..nodes)
        .map(|id| Flux {
            id: id as u32,
            lanes: lanes.clone(),
            wake: wake.clone(),
            max_inflight: cfg.max_inflight,
            slots: (0..cfg.max_inflight)
                .map(|_| Slot {
                    generation: 0,
                    token: None,
                })
                .collect(),
            free: (0..cfg.max_inflight as u32).rev().collect(),
            next_sender: 0,
            stats: FluxStats::default(),
        })
        .collect())
}

impl<T, U> Flux<T, U> {
    /// This node's id (`< nodes()`).
    pub fn id(&self) -> usize {
        self.id as usize
    }

    /// Nodes in the network.
    pub fn nodes(&self) -> usize {
        self.lanes.len()
    }

    /// Calls outstanding (sent, not yet delivered by `poll`, not cancelled).
    pub fn in_flight(&self) -> usize {
        self.max_inflight - self.free.len()
    }

    /// This node's counters.
    pub fn stats(&self) -> FluxStats {
        self.stats
    }

    /// Sends `payload` as a request to node `target` (which may be this node); `poll` later
    /// delivers the response with `token`. Returns the call's id, for [`cancel`](Self::cancel).
    /// Never blocks. Source: seeds/004 §4.3 step 3 (`flux.call(target_daemon, Req, idx)`).
    ///
    /// # Errors
    /// [`FluxError::NoSuchNode`], [`FluxError::TooManyInFlight`] or [`FluxError::Full`], each
    /// with the payload back; nothing was sent.
    pub fn call(&mut self, target: usize, payload: T, token: U) -> Result<CallId, FluxError<T>> {
        let nodes = self.nodes();
        if target >= nodes {
            return Err(FluxError::NoSuchNode {
                node: target,
                nodes,
                payload,
            });
        }
        let Some(&slot) = self.free.last() else {
            return Err(FluxError::TooManyInFlight {
                max_inflight: self.max_inflight,
                payload,
            });
        };
        let call = CallId {
            slot,
            generation: self.slots[slot as usize].generation,
        };
        let request = Request {
            from: self.id,
            call,
            payload,
        };
        if let Err(r) = self.lanes[self.id as usize][target].requests.push(request) {
            return Err(FluxError::Full {
                node: target,
                payload: r.payload,
            });
        }
        self.free.pop();
        self.slots[slot as usize].token = Some(token);
        self.stats.calls += 1;
        self.wake_node(target);
        Ok(call)
    }

    /// After a push to `node`'s queues: wakes `node` if it sleeps (module docs, "Sleeping").
    /// The push's SeqCst CAS of the queue's tail orders it before this SeqCst load.
    #[inline]
    fn wake_node(&self, node: usize) {
        let w = &self.wake[node];
        if w.load(SeqCst) != 0 {
            crate::futex::wake(w);
        }
    }

    /// Arms this node's sleep word for a caller that waits on it (and on others,
    /// `futex_waitv`; `NodeDaemon::wait_for_work`): `swap(1)` (SeqCst), then every queue into
    /// this node; with a message waiting it disarms and returns
    /// [`SleepPrep::NotNow`](crate::server::SleepPrep::NotNow). After the sleep, call
    /// [`end_sleep`](Self::end_sleep).
    pub fn prepare_sleep(&self) -> crate::server::SleepPrep<'_> {
        let me = self.id as usize;
        let w = &*self.wake[me];
        w.swap(1, SeqCst);
        let waiting = (0..self.nodes()).any(|from| {
            let lane = &self.lanes[from][me];
            !lane.requests.is_empty() || !lane.responses.is_empty()
        });
        if waiting {
            w.store(0, Relaxed);
            return crate::server::SleepPrep::NotNow;
        }
        crate::server::SleepPrep::Sleep(w)
    }

    /// Whether node `node`'s sleep word is armed (tests wait for it before they wake it).
    #[cfg(test)]
    pub(crate) fn is_armed(&self, node: usize) -> bool {
        self.wake[node].load(SeqCst) == 1
    }

    /// Disarms the sleep word armed by [`prepare_sleep`](Self::prepare_sleep).
    pub fn end_sleep(&self) {
        self.wake[self.id as usize].store(0, Relaxed);
    }

    /// Delivers the responses that have arrived for this node's calls:
    /// `on_response(user token, payload)` for each, senders round-robin from node 0, each
    /// sender's responses in arrival order. Returns the number delivered. Responses to
    /// cancelled calls are dropped and counted ([`FluxStats::stale_responses`]). Never blocks.
    /// Source: seeds/004 §5 Phase 4 (`flux.poll(|pending_idx, payload| …)`).
    pub fn poll(&mut self, mut on_response: impl FnMut(U, T)) -> usize {
        let me = self.id as usize;
        let mut delivered = 0;
        for from in 0..self.nodes() {
            while let Some(r) = self.lanes[from][me].responses.pop() {
                let token = match self.slots.get_mut(r.call.slot as usize) {
                    Some(s) if s.generation == r.call.generation => s.token.take(),
                    _ => None,
                };
                match token {
                    Some(token) => {
                        let s = &mut self.slots[r.call.slot as usize];
                        s.generation = s.generation.wrapping_add(1);
                        self.free.push(r.call.slot);
                        self.stats.responses += 1;
                        delivered += 1;
                        on_response(token, r.payload);
                    }
                    None => self.stale(),
                }
            }
        }
        delivered
    }

    /// Takes the next request sent to this node, visiting the senders round-robin: `(sender,
    /// token for reply, payload)`. Never blocks. Source: seeds/004 §4.3 step 4, §5 worker
    /// Phase 2.
    pub fn try_recv_raw(&mut self) -> Option<(usize, FluxToken, T)> {
        let me = self.id as usize;
        let n = self.nodes();
        for k in 0..n {
            let from = (self.next_sender + k) % n;
            if let Some(r) = self.lanes[from][me].requests.pop() {
                self.next_sender = (from + 1) % n;
                self.stats.requests_received += 1;
                let token = FluxToken {
                    from: r.from,
                    call: r.call,
                };
                return Some((from, token, r.payload));
            }
        }
        None
    }

    /// Sends `payload` as the response to the request `token` came with. Never blocks.
    /// Source: seeds/004 §4.3 step 6 (`flux.reply(flux_token, Resp)`).
    ///
    /// # Errors
    /// [`FluxError::NoSuchNode`] for a token naming no node (forged); [`FluxError::Full`] if
    /// the queue back is full (only while it holds answers to calls the caller cancelled, or
    /// duplicates; see the module docs): retry after the caller's next `poll`. Both hand the
    /// payload back.
    pub fn reply(&mut self, token: FluxToken, payload: T) -> Result<(), FluxError<T>> {
        let (to, nodes) = (token.from as usize, self.nodes());
        if to >= nodes {
            return Err(FluxError::NoSuchNode {
                node: to,
                nodes,
                payload,
            });
        }
        let response = Response {
            call: token.call,
            payload,
        };
        if let Err(r) = self.lanes[self.id as usize][to].responses.push(response) {
            return Err(FluxError::Full {
                node: to,
                payload: r.payload,
            });
        }
        self.stats.replies += 1;
        self.wake_node(to);
        Ok(())
    }

    /// Gives up the outstanding call `call` (for example at its deadline): frees its slot and
    /// returns its user token; its response, if it still comes, is dropped and counted. `None`
    /// if the call already completed or was cancelled.
    pub fn cancel(&mut self, call: CallId) -> Option<U> {
        let s = self.slots.get_mut(call.slot as usize)?;
        if s.generation != call.generation {
            return None;
        }
        let token = s.token.take()?;
        s.generation = s.generation.wrapping_add(1);
        self.free.push(call.slot);
        self.stats.cancelled += 1;
        Some(token)
    }

    /// Gives up every outstanding call whose user token satisfies `expired` (a sweep at the
    /// caller's deadline, e.g. calls issued before a cut-off time): each such call's slot is
    /// freed and its token passed to `on_expired`; late responses to them are dropped and
    /// counted in [`FluxStats::stale_responses`]. Visits every slot (`max_inflight`): call it
    /// periodically, not per message. Returns the number of calls given up.
    #[cold]
    pub fn cancel_where(
        &mut self,
        mut expired: impl FnMut(&U) -> bool,
        mut on_expired: impl FnMut(U),
    ) -> usize {
        let mut n = 0;
        for (i, s) in self.slots.iter_mut().enumerate() {
            if !s.token.as_ref().is_some_and(&mut expired) {
                continue;
            }
            if let Some(token) = s.token.take() {
                s.generation = s.generation.wrapping_add(1);
                self.free.push(i as u32);
                self.stats.cancelled += 1;
                n += 1;
                on_expired(token);
            }
        }
        n
    }

    #[cold]
    #[inline(never)]
    fn stale(&mut self) {
        self.stats.stale_responses += 1;
        tracing::debug!(
            node = self.id,
            "flux: dropped a response to a cancelled call"
        );
    }
}

impl<T, U> std::fmt::Debug for Flux<T, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flux")
            .field("id", &self.id)
            .field("nodes", &self.nodes())
            .field("in_flight", &self.in_flight())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

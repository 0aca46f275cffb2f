//! One copyrpc [`Context`] per client thread, shared by the typed clients of that thread
//! (seeds/001 "Context": one SRQ and one aggregated, monomorphized CQ pair for every
//! endpoint; issue 16).
//!
//! A [`Copyrpc`] made by [`Copyrpc::connect`] without [`CopyrpcAddr::shared`] owns a context
//! with one endpoint, so a thread talking to K servers polls K pairs of completion queues.
//! A [`ClientContext`] is one context on which many clients ride, each on an endpoint of its
//! own: polling any of them polls the context once, which sends every client's pending
//! requests (one WRITE+IMM batch per endpoint) and delivers every client's responses.
//!
//! # How responses reach their client
//! Each client holds a *slot* of the context: its tokens (`0..max_in_flight`) and a stash of
//! responses that arrived while another client polled. The copyrpc user data of a call is
//! `slot << 16 | token` ([`MAX_IN_FLIGHT_LIMIT`] is 2^16, so a token fits in 16 bits); a
//! poll by one client delivers its own responses and stashes the others' in their slots,
//! where their next poll finds them. The user data is stored with the pending call at the
//! sender, never read from the wire, so a response can only reach the client that made the
//! call. Slots are never reused: a client dropped with calls in flight leaves its slot
//! closed, and responses that still arrive for it are dropped and counted
//! ([`ClientContext::orphaned_responses`]). A context therefore serves at most 65 536
//! clients over its life, and a dropped client's endpoint (its rings and QP) is held until
//! the context itself is dropped.
//!
//! # Locking
//! The context sits behind a [`Mutex`] so that clients stay [`Send`] (a client may be
//! created on one thread and used on another). One thread is the intended user: the lock
//! is then uncontended, taken once per `send` and once per `poll`. A client that owns its
//! context takes no lock at all.
//!
//! [`Copyrpc`]: super::Copyrpc
//! [`Copyrpc::connect`]: crate::ClientTransport::connect
//! [`CopyrpcAddr::shared`]: super::CopyrpcAddr::shared
//! [`MAX_IN_FLIGHT_LIMIT`]: super::transport::MAX_IN_FLIGHT_LIMIT

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::context::{Context, ContextConfig};
use super::error::EndpointFailure;
use super::stats::Stats;
use crate::error::RpcError;
use crate::tokens::Tokens;

/// Bits of a call's user data that hold the client's token (module docs).
pub(super) const TOKEN_BITS: u32 = 16;
/// Mask of the token in a call's user data.
pub(super) const TOKEN_MASK: u32 = (1 << TOKEN_BITS) - 1;
/// Slots a context hands out over its life (module docs).
pub const MAX_CLIENTS_PER_CONTEXT: usize = 1 << (32 - TOKEN_BITS);

/// One client's share of a context (module docs).
pub(super) struct Slot {
    /// Free tokens and responses stashed for this client.
    pub(super) tokens: Tokens,
    /// Responses delivered to or stashed for this client (the liveness probe's progress
    /// measure: a response from another client's server says nothing about this one's).
    pub(super) responses: u64,
    /// Whether the client still exists.
    open: bool,
}

/// A copyrpc context and the slots of the clients riding on it.
pub(super) struct Shared {
    pub(super) ctx: Context<u32>,
    pub(super) slots: Vec<Slot>,
    /// Responses that arrived for a dropped client.
    orphaned: u64,
}

impl Shared {
    pub(super) fn new(ctx: Context<u32>) -> Shared {
        Shared {
            ctx,
            slots: Vec::new(),
            orphaned: 0,
        }
    }

    /// Opens a slot with `max_in_flight` tokens and a stash of `cap` bytes per token.
    ///
    /// # Errors
    /// [`RpcError::Transport`] ([`super::CopyrpcSetupError::Config`]) once [`MAX_CLIENTS_PER_CONTEXT`] slots were handed
    /// out.
    pub(super) fn open_slot(&mut self, max_in_flight: u32, cap: usize) -> Result<u32, RpcError> {
        if self.slots.len() >= MAX_CLIENTS_PER_CONTEXT {
            return Err(super::CopyrpcSetupError::Config(
                "a ClientContext serves at most 65536 clients over its life",
            )
            .into());
        }
        self.slots.push(Slot {
            tokens: Tokens::new(max_in_flight, cap),
            responses: 0,
            open: true,
        });
        Ok((self.slots.len() - 1) as u32)
    }

    /// Closes slot `me` (its client was dropped) and frees its stash.
    pub(super) fn close_slot(&mut self, me: u32) {
        if let Some(s) = self.slots.get_mut(me as usize) {
            s.open = false;
            s.tokens = Tokens::new(0, 0);
        }
    }

    /// Polls the context once for client `me`: its responses go to `on_response` if
    /// `deliver` (a poll), else to its stash (a `send` polling for credit or room); other
    /// clients' responses go to their stashes. A failed call frees its token without
    /// delivery (the failure is reported by the endpoint's state). Returns the responses
    /// delivered.
    #[inline(always)]
    pub(super) fn pump(
        &mut self,
        me: u32,
        deliver: bool,
        on_response: &mut impl FnMut(u32, &[u8]),
    ) -> usize {
        let Shared {
            ctx,
            slots,
            orphaned,
        } = self;
        let mut delivered = 0;
        ctx.poll(
            #[inline(always)]
            |user, r| {
                let (slot, tok) = (user >> TOKEN_BITS, user & TOKEN_MASK);
                if slot == me
                    && let Some(s) = slots.get_mut(me as usize)
                {
                    match r {
                        Ok(msg) => {
                            s.responses += 1;
                            if deliver {
                                delivered += 1;
                                s.tokens.deliver(tok, msg, on_response);
                            } else {
                                s.tokens.stash(tok, msg);
                            }
                        }
                        Err(_) => s.tokens.give_back(tok),
                    }
                } else {
                    Self::for_another(slots, orphaned, slot, tok, r);
                }
            },
        );
        delivered
    }

    /// A response (or failure) of another client's call: stashed in its slot, or dropped
    /// and counted if that client is gone.
    #[cold]
    #[inline(never)]
    fn for_another(
        slots: &mut [Slot],
        orphaned: &mut u64,
        slot: u32,
        tok: u32,
        r: Result<&[u8], EndpointFailure>,
    ) {
        match slots.get_mut(slot as usize) {
            Some(s) if s.open => match r {
                Ok(msg) => {
                    s.responses += 1;
                    s.tokens.stash(tok, msg);
                }
                Err(_) => s.tokens.give_back(tok),
            },
            _ => {
                if r.is_ok() {
                    *orphaned += 1;
                }
            }
        }
    }
}

/// Locks `m`, taking the state over from a thread that panicked while holding it (every
/// update of [`Shared`] leaves it consistent between statements that can panic).
#[inline(always)]
fn lock(m: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A copyrpc client context shared by the typed clients of one thread (module docs).
/// Cloning it clones the handle, not the context.
///
/// ```
/// use mlx5::sim::{Fabric, SimConfig};
/// use rpc_runtime::copyrpc::{ClientContext, ContextConfig};
///
/// let fabric = Fabric::new(SimConfig::default());
/// let ctx = ClientContext::new(&fabric.open(), ContextConfig::default()).unwrap();
/// // For each server: `let addr = CopyrpcAddr { shared: Some(ctx.clone()), ..addr }`,
/// // then `KvClient::<Copyrpc>::connect(&addr)` creates its endpoint in `ctx`.
/// assert_eq!(ctx.clients(), 0);
/// ```
#[derive(Clone)]
pub struct ClientContext {
    inner: Arc<Mutex<Shared>>,
}

impl std::fmt::Debug for ClientContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = lock(&self.inner);
        f.debug_struct("ClientContext")
            .field("endpoints", &s.ctx.num_endpoints())
            .field("clients", &s.slots.iter().filter(|s| s.open).count())
            .field("orphaned", &s.orphaned)
            .finish_non_exhaustive()
    }
}

impl ClientContext {
    /// A new context on `device` (its PD, SRQ and CQ pair), with no endpoint yet.
    ///
    /// # Errors
    /// [`RpcError::Transport`] ([`super::CopyrpcSetupError`] (`Core`)) if the device refuses a queue or a registration.
    pub fn new(device: &mlx5::verbs::Context, cfg: ContextConfig) -> Result<Self, RpcError> {
        Ok(Self::from_context(Context::new(device, cfg)?))
    }

    /// Wraps a context whose endpoints the caller creates and connects (MPI bootstrap:
    /// [`ClientContext::with`], then [`super::Copyrpc::on`]).
    pub fn from_context(ctx: Context<u32>) -> Self {
        ClientContext {
            inner: Arc::new(Mutex::new(Shared::new(ctx))),
        }
    }

    /// Runs `f` on the context, e.g. to create and connect endpoints or read counters.
    /// Make no calls on it directly: a response whose user data names no client of this
    /// context is dropped as orphaned.
    pub fn with<R>(&self, f: impl FnOnce(&mut Context<u32>) -> R) -> R {
        f(&mut lock(&self.inner).ctx)
    }

    /// The context's counters (all clients together).
    pub fn stats(&self) -> Stats {
        *lock(&self.inner).ctx.stats()
    }

    /// Clients riding on this context now.
    pub fn clients(&self) -> usize {
        lock(&self.inner).slots.iter().filter(|s| s.open).count()
    }

    /// Responses that arrived for a client already dropped (module docs), dropped.
    pub fn orphaned_responses(&self) -> u64 {
        lock(&self.inner).orphaned
    }
}

/// How a [`super::Copyrpc`] holds its context: alone, or shared through a
/// [`ClientContext`].
pub(super) enum Handle {
    Own(Box<Shared>),
    Shared(Arc<Mutex<Shared>>),
}

impl Handle {
    /// A context of the client's own.
    pub(super) fn own(ctx: Context<u32>) -> Handle {
        Handle::Own(Box::new(Shared::new(ctx)))
    }

    /// The context of `shared`.
    pub(super) fn shared(shared: &ClientContext) -> Handle {
        Handle::Shared(shared.inner.clone())
    }

    /// Runs `f` on the shared state (locked if shared). `f` has one call site, so that it
    /// inlines (one per arm would make it a function of its own).
    #[inline(always)]
    pub(super) fn with<R>(&mut self, f: impl FnOnce(&mut Shared) -> R) -> R {
        let mut guard;
        let s: &mut Shared = match self {
            Handle::Own(s) => s,
            Handle::Shared(m) => {
                guard = lock(m);
                &mut guard
            }
        };
        f(s)
    }

    /// The shared state, read-only (locked if shared).
    pub(super) fn get(&self) -> ContextGuard<'_> {
        match self {
            Handle::Own(s) => ContextGuard(Guard::Own(s)),
            Handle::Shared(m) => ContextGuard(Guard::Locked(lock(m))),
        }
    }

    /// The shared state, mutably (locked if shared).
    pub(super) fn get_mut(&mut self) -> ContextGuardMut<'_> {
        match self {
            Handle::Own(s) => ContextGuardMut(GuardMut::Own(s)),
            Handle::Shared(m) => ContextGuardMut(GuardMut::Locked(lock(m))),
        }
    }
}

/// Read access to a client's copyrpc [`Context`] ([`super::Copyrpc::context`]); holds the
/// [`ClientContext`]'s lock while it lives, so keep it short.
pub struct ContextGuard<'a>(Guard<'a>);

/// Write access to a client's copyrpc [`Context`] ([`super::Copyrpc::context_mut`]); holds
/// the [`ClientContext`]'s lock while it lives.
pub struct ContextGuardMut<'a>(GuardMut<'a>);

enum Guard<'a> {
    Own(&'a Shared),
    Locked(MutexGuard<'a, Shared>),
}

enum GuardMut<'a> {
    Own(&'a mut Shared),
    Locked(MutexGuard<'a, Shared>),
}

impl Deref for ContextGuard<'_> {
    type Target = Context<u32>;
    fn deref(&self) -> &Context<u32> {
        match &self.0 {
            Guard::Own(s) => &s.ctx,
            Guard::Locked(g) => &g.ctx,
        }
    }
}

impl Deref for ContextGuardMut<'_> {
    type Target = Context<u32>;
    fn deref(&self) -> &Context<u32> {
        match &self.0 {
            GuardMut::Own(s) => &s.ctx,
            GuardMut::Locked(g) => &g.ctx,
        }
    }
}

impl DerefMut for ContextGuardMut<'_> {
    fn deref_mut(&mut self) -> &mut Context<u32> {
        match &mut self.0 {
            GuardMut::Own(s) => &mut s.ctx,
            GuardMut::Locked(g) => &mut g.ctx,
        }
    }
}

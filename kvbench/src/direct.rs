//! The `direct` backend's client transport: a typed copyrpc client ([`Copyrpc`]) to another
//! rank's delegate, riding the client thread's one [`rpc::copyrpc::ClientContext`] with the
//! thread's clients to the other ranks (issue 18: `KvClient` over a shared context instead of
//! calls encoded by hand). The typed client enforces each call's deadline (`--deadline-ms`)
//! and drops late responses, as on every other path.
//!
//! It also carries the hidden test hook `--lose-direct-call` (`LoseCall`): the N-th call of
//! client thread 0 of rank 0 over any of its direct clients is never sent, as if its request
//! or reply were lost, so that its deadline has to end it (tests/kv_faults.rs).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rpc::copyrpc::{Copyrpc, CopyrpcAddr};
use rpc::{ClientTransport, RpcError, ServiceDescriptor};

/// The test hook `--lose-direct-call`: a count of the calls a client thread sent over its
/// direct clients (shared by them), and which one (1-based) to lose.
#[derive(Clone, Debug)]
pub(crate) struct LoseCall {
    sent: Arc<AtomicU64>,
    at: u64,
}

impl LoseCall {
    /// Loses the `at`-th (1-based) call of the clients that share the returned hook.
    pub(crate) fn new(at: u64) -> Self {
        LoseCall {
            sent: Arc::new(AtomicU64::new(0)),
            at,
        }
    }

    /// Counts a call; whether it is the one to lose.
    #[cold]
    fn lose(&self) -> bool {
        self.sent.fetch_add(1, Ordering::Relaxed) + 1 == self.at
    }
}

/// A typed copyrpc client to another rank's delegate (module docs). Its tokens are
/// [`Copyrpc`]'s, plus one more (the last) that only a lost call (`LoseCall`) takes, so a
/// lost call never shares a token with a call that is answered.
pub(crate) struct DirectCopyrpc {
    inner: Copyrpc,
    lose: Option<LoseCall>,
}

impl std::fmt::Debug for DirectCopyrpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectCopyrpc")
            .field("inner", &self.inner)
            .field("lose", &self.lose)
            .finish()
    }
}

impl DirectCopyrpc {
    /// Wraps `inner`, with the test hook `lose` if given.
    pub(crate) fn new(inner: Copyrpc, lose: Option<LoseCall>) -> Self {
        DirectCopyrpc { inner, lose }
    }
}

impl ClientTransport for DirectCopyrpc {
    type Addr = CopyrpcAddr;

    /// [`Copyrpc`]'s connect, without the test hook.
    fn connect(addr: &CopyrpcAddr, service: &'static ServiceDescriptor) -> Result<Self, RpcError> {
        Copyrpc::connect(addr, service).map(|inner| DirectCopyrpc { inner, lose: None })
    }

    fn max_in_flight(&self) -> usize {
        self.inner.max_in_flight() + usize::from(self.lose.is_some())
    }

    #[inline]
    fn send(
        &mut self,
        timeout: Duration,
        method_id: u16,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RpcError> {
        if let Some(l) = &self.lose
            && l.lose()
        {
            // The extra token: never answered, so the typed client expires the call.
            return Ok(self.inner.max_in_flight() as u32);
        }
        self.inner.send(timeout, method_id, encode)
    }

    #[inline]
    fn poll(&mut self, on_response: impl FnMut(u32, &[u8])) -> Result<usize, RpcError> {
        self.inner.poll(on_response)
    }

    #[inline]
    fn idle_tick(&mut self) {
        self.inner.idle_tick()
    }
}

//! The in-process connect rendezvous of the RC transports: a client sends its connection
//! information `Q` through a [`Rendezvous`] and waits, at most its connect timeout, for the
//! server's answer `A` or a refusal `R`; the server takes the requests from its [`Inbox`]
//! when it polls. A count of pending requests lets the server's poll cost one relaxed load
//! while nobody connects.
//!
//! Every wait is bounded: the client's by its timeout, the server's not at all (it only
//! takes what is queued). A server that is gone (its inbox dropped) is reported at once;
//! an answer to a client that stopped waiting is dropped (the server logs it).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::time::Duration;

/// Why [`Rendezvous::exchange`] got no answer.
#[derive(Debug)]
pub(crate) enum ExchangeError<R> {
    /// The server refused.
    Refused(R),
    /// The server did not answer within the timeout (it does not poll).
    Timeout(Duration),
    /// The server is gone: its inbox was dropped.
    ServerGone,
}

/// One connect request as the server takes it: the client's information and where the
/// answer goes.
pub(crate) struct Request<Q, A, R> {
    /// The client's connection information.
    pub(crate) body: Q,
    reply: SyncSender<Result<A, R>>,
}

impl<Q, A, R> Request<Q, A, R> {
    /// Sends the answer; `false` if the client stopped waiting (timed out or dropped).
    pub(crate) fn answer(self, answer: Result<A, R>) -> bool {
        self.reply.try_send(answer).is_ok()
    }
}

/// The client side: cheap to clone, `Send + Sync` when `Q`, `A` and `R` are `Send`.
pub(crate) struct Rendezvous<Q, A, R> {
    tx: Sender<Request<Q, A, R>>,
    pending: Arc<AtomicUsize>,
}

impl<Q, A, R> Clone for Rendezvous<Q, A, R> {
    fn clone(&self) -> Self {
        Rendezvous {
            tx: self.tx.clone(),
            pending: self.pending.clone(),
        }
    }
}

impl<Q, A, R> std::fmt::Debug for Rendezvous<Q, A, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rendezvous")
            .field("pending", &self.pending())
            .finish_non_exhaustive()
    }
}

/// The server side.
pub(crate) struct Inbox<Q, A, R> {
    rx: Receiver<Request<Q, A, R>>,
    pending: Arc<AtomicUsize>,
}

/// A connected pair.
pub(crate) fn rendezvous<Q, A, R>() -> (Rendezvous<Q, A, R>, Inbox<Q, A, R>) {
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    (
        Rendezvous {
            tx,
            pending: pending.clone(),
        },
        Inbox { rx, pending },
    )
}

impl<Q, A, R> Rendezvous<Q, A, R> {
    /// Sends `body` to the server and waits up to `timeout` for its answer.
    ///
    /// # Errors
    /// [`ExchangeError::Refused`] with the server's refusal; [`ExchangeError::Timeout`] if
    /// the server does not answer within `timeout`; [`ExchangeError::ServerGone`] if its
    /// inbox was dropped (before or while waiting).
    pub(crate) fn exchange(&self, body: Q, timeout: Duration) -> Result<A, ExchangeError<R>> {
        let (reply, answer) = mpsc::sync_channel(1);
        // Counted before it is sent: the server decrements after receiving, so the count
        // never goes below zero.
        self.pending.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(Request { body, reply }).is_err() {
            self.pending.fetch_sub(1, Ordering::Relaxed);
            return Err(ExchangeError::ServerGone);
        }
        match answer.recv_timeout(timeout) {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(refusal)) => Err(ExchangeError::Refused(refusal)),
            Err(RecvTimeoutError::Timeout) => Err(ExchangeError::Timeout(timeout)),
            Err(RecvTimeoutError::Disconnected) => Err(ExchangeError::ServerGone),
        }
    }

    /// Connect requests sent and not yet taken by the server.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }
}

impl<Q, A, R> Inbox<Q, A, R> {
    /// Whether any request waits: one relaxed load, for the server's hot poll.
    #[inline]
    pub(crate) fn has_pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed) != 0
    }

    /// The next queued request, if any; never waits.
    pub(crate) fn take(&mut self) -> Option<Request<Q, A, R>> {
        let req = self.rx.try_recv().ok()?;
        self.pending.fetch_sub(1, Ordering::Relaxed);
        Some(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answered_refused_timed_out_and_gone() {
        let (rv, mut inbox) = rendezvous::<u32, u32, &str>();
        assert!(!inbox.has_pending());
        assert!(inbox.take().is_none());
        let server = std::thread::spawn(move || {
            let mut answered = 0;
            while answered < 2 {
                if let Some(req) = inbox.take() {
                    let q = req.body;
                    assert!(req.answer(if q == 1 { Ok(q + 10) } else { Err("no") }));
                    answered += 1;
                }
                std::thread::yield_now();
            }
            inbox
        });
        assert_eq!(rv.exchange(1, Duration::from_secs(60)).unwrap(), 11);
        assert!(matches!(
            rv.exchange(2, Duration::from_secs(60)),
            Err(ExchangeError::Refused("no"))
        ));
        let mut inbox = server.join().unwrap();
        // Nobody takes it: the wait ends at the timeout, and the late answer is dropped.
        assert!(matches!(
            rv.exchange(3, Duration::from_millis(1)),
            Err(ExchangeError::Timeout(_))
        ));
        assert!(inbox.has_pending());
        let late = inbox.take().unwrap();
        assert!(!inbox.has_pending());
        assert!(!late.answer(Ok(0)), "the client stopped waiting");
        drop(inbox);
        assert!(matches!(
            rv.exchange(4, Duration::from_secs(60)),
            Err(ExchangeError::ServerGone)
        ));
        assert_eq!(rv.pending(), 0);
    }
}

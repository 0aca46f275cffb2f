//! Sleeping on the ring: the futex words that let an idle server, or a client waiting for
//! its responses, block in the kernel instead of spinning and yielding (extension, seed:
//! none; the seed's server and clients poll forever). Every rule of the wake protocol is
//! here or names this module.
//!
//! A thread that polls shared memory can only spin or yield, and a yield lets only the
//! threads of its own CPU run: next to a busy process, the thread that would answer waits for
//! the busy one's time slice (4 ms on the machines we measured). A thread blocked in
//! `FUTEX_WAIT` leaves its CPU idle, and the one it wakes with `FUTEX_WAKE` is scheduled at
//! once (Linux `futex(2)`). The words are in the shared mapping, so the futex operations are
//! the shared (not `FUTEX_PRIVATE_FLAG`) ones: the sleeper and the waker may be processes.
//!
//! # The server's word ([`OFF_SERVER_SLEEP`](super::layout::OFF_SERVER_SLEEP))
//! * **Server** ([`RingServer::wait_for_request`](super::RingServer::wait_for_request)):
//!   `swap(1)` the word (SeqCst), then load `head` (SeqCst). If `head` is past the cursor
//!   (an entry is reserved: committed, being written, or a hole), it stores 0 and does not
//!   sleep. Otherwise `FUTEX_WAIT(word, 1, bound)`, then stores 0.
//! * **Client**: reserves with `head.fetch_add` (SeqCst), and after its commit loads the word
//!   (SeqCst); if it is non-zero, `swap(0)` and, if that returned non-zero, `FUTEX_WAKE(1)`
//!   (one waker per sleep pays the system call).
//!
//! No wake is lost: the four operations are sequentially consistent, so if the server's load
//! of `head` missed the client's `fetch_add`, that load precedes the `fetch_add` in the
//! single total order, and the client's later load of the word follows the server's
//! `swap(1)`: it sees 1 (or 0 stored by another client that woke the server, or by the
//! server itself after waking). A client that commits before the server sleeps is seen in
//! `head`. On x86-64 these orderings cost nothing over the protocol's own: the `fetch_add`
//! is a locked instruction either way and a SeqCst load is a plain load.
//!
//! # A client's word ([`REC_SLEEP`](super::layout::REC_SLEEP))
//! * **Client** ([`RingClient::wait_for_response`](super::RingClient::wait_for_response)):
//!   `swap(1)` the word in its record and issue a SeqCst fence, then look at the `valid` flag
//!   of every response slot with a call outstanding. If one is set, it stores 0 and returns
//!   at once. Otherwise `FUTEX_WAIT(word, 1, bound)`, then stores 0.
//! * **Server**: once [`OFF_CLIENT_SLEEP_ARMED`](super::layout::OFF_CLIENT_SLEEP_ARMED) is
//!   set, remembers the clients it publishes replies to. At its next
//!   [`advance_tail`](super::RingServer::advance_tail) (the end of each round of the typed
//!   server) and before it sleeps, it issues one SeqCst fence for all of them, then loads each
//!   one's word; a non-zero word is swapped to 0 and, if that returned non-zero, woken.
//! * **Arming**: a client's first `wait_for_response` stores the flag and does not sleep, so
//!   a server whose clients never sleep pays one load per reply and no fence. A reply
//!   published in the round in which the server first sees the flag can miss a sleeper,
//!   whose sleep then ends at its bound.
//!
//! Fence against fence: a client whose look at `valid` missed a reply has its `swap(1)`
//! ordered before the server's fence, so the server's later load sees it. The fence costs
//! the server one drain of its store buffer per round with replies, not per reply, and does
//! not delay the client's view of the reply (it waits for the reply's store to leave the
//! server, which is when the client can see it anyway).
//!
//! # Bounds
//! Every sleep is bounded by its caller's bound (the `kv` daemons and clients pass 1 ms; the
//! typed client passes its remaining deadline, at most 1 ms), so a wake that never comes (a
//! waker that died between its commit and its load of the word, a peer of another version, a
//! word overwritten with garbage) costs at most that bound; a garbage word costs at most one
//! spurious wake. `FUTEX_WAIT` returns at once if the word is no longer 1 (`EAGAIN`), and on
//! a signal (`EINTR`); every return is treated alike: the caller polls again.

pub(super) use crate::futex::{WaitEnd, wait, wake};

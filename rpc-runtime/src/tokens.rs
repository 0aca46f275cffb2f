//! Call tokens and the response stash shared by client transports whose completions arrive
//! in batches (copyrpc, ScaleRPC).
//!
//! [`crate::ClientTransport::poll`] hands every response it finds to its caller, so a
//! response is stashed only when it arrives while nobody can take it: during a `send` (which
//! polls for credit or room), or, on a shared copyrpc context, during another client's poll.
//! [`Tokens`] hands out the call tokens `0..n` and keeps those responses in a preallocated
//! per-token buffer (`n × cap` bytes) until the client's next poll: no allocation after
//! construction.

use std::collections::VecDeque;

/// Free call tokens plus stashed responses (module docs).
#[derive(Debug)]
pub(crate) struct Tokens {
    free: Vec<u32>,
    ready: VecDeque<u32>,
    lens: Box<[u32]>,
    buf: Box<[u8]>,
    cap: usize,
}

impl Tokens {
    /// `n` tokens, handed out 0, 1, 2, ..; stashed responses up to `cap` bytes each.
    pub(crate) fn new(n: u32, cap: usize) -> Tokens {
        let k = n as usize;
        Tokens {
            free: (0..n).rev().collect(),
            ready: VecDeque::with_capacity(k),
            lens: vec![0; k].into_boxed_slice(),
            buf: vec![0; k * cap].into_boxed_slice(),
            cap,
        }
    }

    /// Takes a free token.
    #[inline(always)]
    pub(crate) fn take(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// Returns a token (its call was refused, failed or delivered).
    #[inline(always)]
    pub(crate) fn give_back(&mut self, tok: u32) {
        self.free.push(tok);
    }

    /// Tokens free.
    #[inline(always)]
    pub(crate) fn free(&self) -> usize {
        self.free.len()
    }

    /// Responses stashed and not yet delivered.
    #[inline(always)]
    pub(crate) fn stashed(&self) -> usize {
        self.ready.len()
    }

    /// Keeps `msg` (truncated to `cap`; transports never accept longer responses) as the
    /// response of `tok`, to be delivered by [`Tokens::drain`].
    #[inline(never)]
    pub(crate) fn stash(&mut self, tok: u32, msg: &[u8]) {
        let n = msg.len().min(self.cap);
        let at = tok as usize * self.cap;
        self.buf[at..at + n].copy_from_slice(&msg[..n]);
        self.lens[tok as usize] = n as u32;
        self.ready.push_back(tok);
    }

    /// Delivers every stashed response in arrival order, freeing their tokens.
    #[cold]
    pub(crate) fn drain(&mut self, on_response: &mut impl FnMut(u32, &[u8])) -> usize {
        let mut n = 0;
        while let Some(tok) = self.ready.pop_front() {
            let at = tok as usize * self.cap;
            let len = self.lens[tok as usize] as usize;
            on_response(tok, &self.buf[at..at + len]);
            self.free.push(tok);
            n += 1;
        }
        n
    }

    /// One response arrived during a poll of its client: delivers it and frees its token.
    #[inline(always)]
    pub(crate) fn deliver(
        &mut self,
        tok: u32,
        msg: &[u8],
        on_response: &mut impl FnMut(u32, &[u8]),
    ) {
        on_response(tok, msg);
        self.free.push(tok);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_stash_and_drain_in_order() {
        let mut t = Tokens::new(3, 4);
        assert_eq!(
            (t.take(), t.take(), t.take(), t.take()),
            (Some(0), Some(1), Some(2), None)
        );
        let mut got = Vec::new();
        let mut f = |tok: u32, m: &[u8]| got.push((tok, m.to_vec()));
        t.deliver(2, b"ab", &mut f);
        t.stash(0, b"cdefgh");
        t.stash(1, b"");
        assert_eq!((t.free(), t.stashed()), (1, 2));
        assert_eq!(t.drain(&mut f), 2);
        assert_eq!(
            got,
            vec![(2, b"ab".to_vec()), (0, b"cdef".to_vec()), (1, Vec::new())]
        );
        assert_eq!((t.free(), t.stashed()), (3, 0));
    }
}

//! Call tokens and the response stash shared by client transports whose completions arrive
//! in batches (copyrpc, ScaleRPC).
//!
//! [`crate::Client::poll`] asks a transport for exactly one response, but these transports
//! deliver every response of a CQ poll inside one callback. [`Tokens`] hands out the call
//! tokens `0..n` and keeps the responses beyond the caller's `max` in a preallocated
//! per-token buffer (`n × cap` bytes) until the next poll: no allocation after construction.

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
    pub fn new(n: u32, cap: usize) -> Tokens {
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
    pub fn take(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// Returns a token (its call was refused, failed or delivered).
    #[inline(always)]
    pub fn give_back(&mut self, tok: u32) {
        self.free.push(tok);
    }

    /// Tokens free.
    #[inline(always)]
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// Responses stashed and not yet delivered.
    #[inline(always)]
    pub fn stashed(&self) -> usize {
        self.ready.len()
    }

    /// Keeps `msg` (truncated to `cap`; transports never accept longer responses) as the
    /// response of `tok`, to be delivered by [`Tokens::drain`].
    #[inline(never)]
    pub fn stash(&mut self, tok: u32, msg: &[u8]) {
        let n = msg.len().min(self.cap);
        let at = tok as usize * self.cap;
        self.buf[at..at + n].copy_from_slice(&msg[..n]);
        self.lens[tok as usize] = n as u32;
        self.ready.push_back(tok);
    }

    /// Delivers up to `max` stashed responses in arrival order, freeing their tokens.
    #[cold]
    pub fn drain(&mut self, max: usize, on_response: &mut impl FnMut(u32, &[u8])) -> usize {
        let mut n = 0;
        while n < max {
            let Some(tok) = self.ready.pop_front() else {
                break;
            };
            let at = tok as usize * self.cap;
            let len = self.lens[tok as usize] as usize;
            on_response(tok, &self.buf[at..at + len]);
            self.free.push(tok);
            n += 1;
        }
        n
    }

    /// One response arrived during a poll that had delivered `*delivered` of at most `max`:
    /// delivers it (and frees its token) while under `max`, else stashes it.
    #[inline(always)]
    pub fn deliver_or_stash(
        &mut self,
        max: usize,
        delivered: &mut usize,
        tok: u32,
        msg: &[u8],
        on_response: &mut impl FnMut(u32, &[u8]),
    ) {
        if *delivered < max {
            *delivered += 1;
            on_response(tok, msg);
            self.free.push(tok);
        } else {
            self.stash(tok, msg);
        }
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
        let mut delivered = 0;
        let mut f = |tok: u32, m: &[u8]| got.push((tok, m.to_vec()));
        t.deliver_or_stash(1, &mut delivered, 2, b"ab", &mut f);
        t.deliver_or_stash(1, &mut delivered, 0, b"cdefgh", &mut f);
        t.deliver_or_stash(1, &mut delivered, 1, b"", &mut f);
        assert_eq!((t.free(), t.stashed()), (1, 2));
        assert_eq!(t.drain(5, &mut f), 2);
        assert_eq!(
            got,
            vec![(2, b"ab".to_vec()), (0, b"cdef".to_vec()), (1, Vec::new())]
        );
        assert_eq!((t.free(), t.stashed()), (3, 0));
    }
}

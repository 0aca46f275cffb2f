//! copyrpc's data path allocates nothing once warm (issue 16): calls, batches, consumer
//! READs, receives and replies through [`Context`], with the device model run synchronously
//! on the test thread (`SimConfig::deterministic`), make no heap allocation on that thread.
//!
//! Own test binary: a counting global allocator that counts only on the thread that switched
//! counting on, so other tests' threads cannot disturb it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use mlx5::sim::{Fabric, SimConfig};
use rpc_runtime::copyrpc::{CallError, CallErrorKind, Context, ContextConfig, EndpointConfig};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNT_HERE: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if COUNT_HERE.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.load(Ordering::Relaxed);
    COUNT_HERE.with(|c| c.set(true));
    f();
    COUNT_HERE.with(|c| c.set(false));
    ALLOCS.load(Ordering::Relaxed) - before
}

/// Client and server state of the scenario.
struct Pair {
    c: Context<u64>,
    s: Context<()>,
    ep: u32,
    /// Next call's sequence number = calls issued so far.
    seq: u64,
    /// Responses received.
    done: u64,
    /// Calls held back (no credit or ring space known yet).
    held: u64,
    /// Requests the server received and has not answered yet.
    pending: Vec<rpc_runtime::copyrpc::RecvHandle>,
}

impl Pair {
    /// One step: up to 8 calls of `size` bytes (none if 0; each allowing an 8 B response), the client's
    /// poll, the server's poll and receives; the server answers what it holds only when
    /// `answer` is set. Holding answers back lets the client's ring fill with requests the
    /// server has consumed but not answered, so the client must READ the consumer position
    /// to learn the free space.
    fn step(&mut self, size: usize, answer: bool) {
        for _ in 0..if size == 0 { 0 } else { 8 } {
            let seq = self.seq;
            let r = self.c.call_with(self.ep, size as u32, seq, 8, |b| {
                b[..8].copy_from_slice(&seq.to_le_bytes());
                size
            });
            match r {
                Ok(_) => self.seq += 1,
                Err(CallError {
                    kind: CallErrorKind::InsufficientCredit | CallErrorKind::RingFull,
                    ..
                }) => {
                    self.held += 1;
                    break;
                }
                Err(e) => panic!("call failed: {e}"),
            }
        }
        let done = &mut self.done;
        self.c.poll(|_, r| {
            assert_eq!(r.expect("call failed").len(), 8);
            *done += 1;
        });
        self.s.poll(|_, _| {});
        while let Some((h, _)) = self.s.recv() {
            self.pending.push(h);
        }
        if answer {
            for h in self.pending.drain(..) {
                self.s.reply(h, &[1u8; 8]).expect("reply");
            }
        }
        self.s.flush();
    }
}

#[test]
fn calls_replies_and_consumer_reads_allocate_nothing_once_warm() {
    let fabric = Fabric::new(SimConfig::deterministic());
    let (dc, ds) = (fabric.open(), fabric.open());
    let mut c = Context::<u64>::new(&dc, ContextConfig::default()).unwrap();
    let mut s = Context::<()>::new(&ds, ContextConfig::default()).unwrap();
    // Small rings and large requests: the client often runs out of known ring space.
    let cfg = EndpointConfig {
        ring_size: 4096,
        ..EndpointConfig::default()
    };
    let (ec, es) = (
        c.create_endpoint(&cfg).unwrap(),
        s.create_endpoint(&cfg).unwrap(),
    );
    let (ic, is) = (c.local_info(ec).unwrap(), s.local_info(es).unwrap());
    c.connect(ec, &is).unwrap();
    s.connect(es, &ic).unwrap();
    let mut p = Pair {
        c,
        s,
        ep: ec,
        seq: 0,
        done: 0,
        held: 0,
        pending: Vec::with_capacity(4096),
    };
    let run = |p: &mut Pair, steps: usize| {
        for i in 0..steps {
            p.step(64 + (i * 37) % 700, i % 4 == 3);
        }
    };
    // Warm-up: queues, batches and the model's tables reach their working sizes.
    run(&mut p, 4000);
    let reads_before = p.c.stats().consumer_reads;
    let (calls_before, held_before) = (p.seq, p.held);
    let n = allocations(|| run(&mut p, 4000));
    let reads = p.c.stats().consumer_reads - reads_before;
    let calls = p.seq - calls_before;
    // Drain: every call is answered.
    for _ in 0..1000 {
        if p.done == p.seq {
            break;
        }
        p.step(0, true);
    }
    assert_eq!(p.done, p.seq, "every call answered");
    assert!(calls > 4000, "calls made: {calls}");
    assert!(reads > 0, "no consumer READ in the measured steps");
    assert!(
        p.held > held_before,
        "the small ring never held a call back"
    );
    assert_eq!(
        n, 0,
        "allocations in {calls} calls ({reads} consumer READs)"
    );
}

/// The zero-copy serve path ([`Context::serve_next`]: request read in the receive ring, reply
/// written into the send ring) allocates nothing once warm either.
#[test]
fn serve_next_allocates_nothing_once_warm() {
    let fabric = Fabric::new(SimConfig::deterministic());
    let (dc, ds) = (fabric.open(), fabric.open());
    let mut c = Context::<u64>::new(&dc, ContextConfig::default()).unwrap();
    let mut s = Context::<()>::new(&ds, ContextConfig::default()).unwrap();
    let cfg = EndpointConfig {
        ring_size: 4096,
        ..EndpointConfig::default()
    };
    let (ec, es) = (
        c.create_endpoint(&cfg).unwrap(),
        s.create_endpoint(&cfg).unwrap(),
    );
    let (ic, is) = (c.local_info(ec).unwrap(), s.local_info(es).unwrap());
    c.connect(ec, &is).unwrap();
    s.connect(es, &ic).unwrap();
    let mut spare = [0u8; 8];
    let (mut seq, mut done, mut served) = (0u64, 0u64, 0u64);
    // One step: up to `calls` calls of a size varying with `i`, polls, serve, flush.
    let mut step = |i: usize, calls: usize| {
        let size = 8 + (i * 37) % 500;
        for _ in 0..calls {
            let r = c.call_with(ec, size as u32, seq, 8, |b| {
                b[..8].copy_from_slice(&seq.to_le_bytes());
                size
            });
            match r {
                Ok(_) => seq += 1,
                Err(CallError {
                    kind: CallErrorKind::InsufficientCredit | CallErrorKind::RingFull,
                    ..
                }) => break,
                Err(e) => panic!("call failed: {e}"),
            }
        }
        c.poll(|tag, r| {
            assert_eq!(r.expect("call failed"), tag.to_le_bytes());
            done += 1;
        });
        s.poll(|_, _| {});
        // Echo each request's first 8 bytes (its sequence number) straight into the reply.
        while let Some(r) = s.serve_next(8, &mut spare, |req, out| {
            out[..8].copy_from_slice(&req[..8]);
            8
        }) {
            r.expect("reply");
            served += 1;
        }
        s.flush();
        (seq, done)
    };
    for i in 0..4000 {
        step(i, 4);
    }
    let n = allocations(|| {
        for i in 0..4000 {
            step(i, 4);
        }
    });
    // Drain: every call is answered.
    let mut drained = false;
    for _ in 0..1000 {
        let (issued, answered) = step(0, 0);
        if issued == answered {
            drained = true;
            break;
        }
    }
    assert!(drained, "calls answered: {done} of {seq}");
    assert_eq!(served, seq);
    assert!(served > 8000, "requests served: {served}");
    assert_eq!(n, 0, "allocations while serving");
}

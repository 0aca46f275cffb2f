//! The ipc transport's sleeps (module docs, "Sleeping"): a server sleeping in
//! `IpcServer::wait_for_request` is woken by a client's first poll after its send, a client
//! sleeping in `Ipc::sleep_for_response` by the server's round of replies (`release`); neither
//! sleeps with work already there, the first `wait_for_request` only arms the clients'
//! checks (and a client's first sleep the server's), and every sleep ends at its bound. No test depends on timing luck: each waits
//! until the other side has announced its sleep in the shared word (read through a mapping of
//! its own), and a lost wake would show as a sleep of its whole bound (10 s here), far beyond
//! the 5 s the tests allow.

mod ipc_common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use rpc_runtime::ipc::layout::{
    CB_RESP_SLEEP, OFF_CLIENT_SLEEP_ARMED, OFF_SERVER_SLEEP, OFF_SLEEP_ARMED,
};
use rpc_runtime::ipc::{Ipc, IpcServer};

use ipc_common::{server, shm_file, unique_name};

const LONG: Duration = Duration::from_secs(10);
const WOKEN: Duration = Duration::from_secs(5);

/// A mapping of the segment of our own, as another process would have.
struct Words(memmap2::MmapRaw);

impl Words {
    fn open(name: &str) -> Self {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(shm_file(name))
            .unwrap();
        Words(memmap2::MmapRaw::map_raw(&file).unwrap())
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= self.0.len());
        // SAFETY: in bounds and 4-aligned (checked; the mapping is page-aligned); the
        // segment's processes access these words atomically only.
        unsafe { AtomicU32::from_ptr(self.0.as_mut_ptr().add(off).cast()) }
    }
}

fn until_asleep(word: &AtomicU32) {
    let t = Instant::now();
    while word.load(Ordering::SeqCst) != 1 {
        assert!(t.elapsed() < WOKEN, "the sleeper never announced its sleep");
        thread::yield_now();
    }
}

fn send(c: &mut Ipc, msg: &[u8]) {
    c.try_send(|b| {
        b[..msg.len()].copy_from_slice(msg);
        msg.len()
    })
    .unwrap();
}

fn echo_round(s: &mut IpcServer) -> usize {
    let mut n = 0;
    if s.poll() > 0 {
        while let Some((token, msg)) = s.recv() {
            let msg = msg.to_vec();
            s.reply_with(token, |b| {
                b[..msg.len()].copy_from_slice(&msg);
                msg.len()
            })
            .unwrap();
            n += 1;
        }
    }
    s.release();
    n
}

#[test]
fn the_first_wait_arms_the_clients_and_a_sleeping_server_is_woken_by_a_send() {
    let name = unique_name("sleep-srv");
    let mut s = server(&name, 2, 4);
    let words = Words::open(&name);
    let mut c = Ipc::attach(&name).unwrap();
    assert_eq!(words.word(OFF_SLEEP_ARMED).load(Ordering::SeqCst), 0);
    assert!(!s.wait_for_request(LONG), "the first call arms, no sleep");
    assert_eq!(words.word(OFF_SLEEP_ARMED).load(Ordering::SeqCst), 1);
    assert_eq!(s.stats().idle_waits, 0);
    let h = thread::spawn(move || {
        let t = Instant::now();
        assert!(s.wait_for_request(LONG));
        let slept = t.elapsed();
        assert_eq!(echo_round(&mut s), 1, "the request that woke it is there");
        (s, slept)
    });
    until_asleep(words.word(OFF_SERVER_SLEEP));
    send(&mut c, b"xyz");
    // The wake comes with the client's first poll after the send.
    let mut got = Vec::new();
    let t = Instant::now();
    while got.is_empty() {
        c.poll_up_to(8, |_, m| got.extend_from_slice(m)).unwrap();
        assert!(t.elapsed() < WOKEN);
    }
    let (s, slept) = h.join().unwrap();
    assert!(slept < WOKEN, "woken by the send, not its bound: {slept:?}");
    assert_eq!(got, b"xyz");
    assert_eq!(s.stats().idle_waits, 1);
    assert_eq!(c.stats().server_wakes, 1);
    assert_eq!(words.word(OFF_SERVER_SLEEP).load(Ordering::SeqCst), 0);
}

#[test]
fn a_server_does_not_sleep_with_a_request_waiting() {
    let name = unique_name("sleep-waiting");
    let mut s = server(&name, 2, 4);
    let mut c = Ipc::attach(&name).unwrap();
    assert!(!s.wait_for_request(LONG), "arms");
    send(&mut c, b"a");
    let t = Instant::now();
    assert!(!s.wait_for_request(LONG), "a request is waiting: no sleep");
    assert!(t.elapsed() < WOKEN);
    assert_eq!(s.stats().idle_waits, 0);
    assert_eq!(echo_round(&mut s), 1);
    // Its bound ends a sleep nobody wakes.
    let t = Instant::now();
    assert!(s.wait_for_request(Duration::from_millis(20)));
    assert!(t.elapsed() >= Duration::from_millis(10));
    assert_eq!(s.stats().idle_waits, 1);
}

#[test]
fn a_sleeping_client_is_woken_by_the_servers_round_of_replies() {
    let name = unique_name("sleep-cli");
    let mut s = server(&name, 2, 4);
    let words = Words::open(&name);
    let mut c = Ipc::attach(&name).unwrap();
    let block = c.layout().block(c.client_index());
    assert!(!c.sleep_for_response(LONG), "no call in flight");
    send(&mut c, b"q");
    assert_eq!(words.word(OFF_CLIENT_SLEEP_ARMED).load(Ordering::SeqCst), 0);
    assert!(!c.sleep_for_response(LONG), "the first call arms, no sleep");
    assert_eq!(words.word(OFF_CLIENT_SLEEP_ARMED).load(Ordering::SeqCst), 1);
    assert_eq!(c.stats().idle_waits, 0);
    let h = thread::spawn(move || {
        let t = Instant::now();
        assert!(c.sleep_for_response(LONG));
        let slept = t.elapsed();
        let mut got = Vec::new();
        c.poll_up_to(8, |_, m| got.extend_from_slice(m)).unwrap();
        (c, slept, got)
    });
    until_asleep(words.word(block + CB_RESP_SLEEP));
    assert_eq!(echo_round(&mut s), 1);
    let (mut c, slept, got) = h.join().unwrap();
    assert!(
        slept < WOKEN,
        "woken by the reply, not its bound: {slept:?}"
    );
    assert_eq!(got, b"q");
    assert_eq!(c.stats().idle_waits, 1);
    assert_eq!(s.stats().clients_woken, 1);
    // A reply already there: no sleep.
    send(&mut c, b"r");
    assert_eq!(echo_round(&mut s), 1);
    assert!(c.sleep_for_response(LONG));
    assert_eq!(c.stats().idle_waits, 1);
    assert_eq!(c.poll_up_to(8, |_, m| assert_eq!(m, b"r")).unwrap(), 1);
    // A stopped server: the sleep ends at its bound.
    send(&mut c, b"s");
    let t = Instant::now();
    assert!(c.sleep_for_response(Duration::from_millis(20)));
    assert!(t.elapsed() < WOKEN);
    assert_eq!(c.stats().idle_waits, 2);
    // Garbage in the client's word: a spurious wake at the next round, no harm.
    words.word(block + CB_RESP_SLEEP).store(9, Ordering::SeqCst);
    let mut got = Vec::new();
    assert_eq!(echo_round(&mut s), 1);
    assert_eq!(words.word(block + CB_RESP_SLEEP).load(Ordering::SeqCst), 0);
    assert_eq!(s.stats().clients_woken, 2);
    c.poll_up_to(8, |_, m| got.extend_from_slice(m)).unwrap();
    assert_eq!(got, b"s");
}

/// A client of two servers sleeps on both its connections' words at once
/// (`sleep_for_any_response`, `futex_waitv`) and a reply from the second server wakes it; the
/// first sleep of each connection only arms its server's checks.
#[test]
fn a_client_of_two_servers_sleeps_on_both_words() {
    if !rpc_runtime::erpc::idle::may_migrate() {
        eprintln!("skipped: this thread may run on one CPU only (a pinned thread never sleeps)");
        return;
    }
    let (n1, n2) = (unique_name("sleep-any1"), unique_name("sleep-any2"));
    let (_s1, mut s2) = (server(&n1, 2, 4), server(&n2, 2, 4));
    let (w1, w2) = (Words::open(&n1), Words::open(&n2));
    let (mut c1, mut c2) = (Ipc::attach(&n1).unwrap(), Ipc::attach(&n2).unwrap());
    let (b1, b2) = (
        c1.layout().block(c1.client_index()),
        c2.layout().block(c2.client_index()),
    );
    send(&mut c1, b"1");
    send(&mut c2, b"2");
    let waited = Duration::from_secs(1);
    // The first sleep of each connection arms its server's checks.
    assert!(!rpc_runtime::ipc::sleep_for_any_response(
        [&mut c1, &mut c2],
        waited,
        LONG
    ));
    assert!(!rpc_runtime::ipc::sleep_for_any_response(
        [&mut c1, &mut c2],
        waited,
        LONG
    ));
    let h = thread::spawn(move || {
        let t = Instant::now();
        let slept = rpc_runtime::ipc::sleep_for_any_response([&mut c1, &mut c2], waited, LONG);
        (c1, c2, slept, t.elapsed())
    });
    until_asleep(w1.word(b1 + CB_RESP_SLEEP));
    until_asleep(w2.word(b2 + CB_RESP_SLEEP));
    assert_eq!(echo_round(&mut s2), 1);
    let (c1, mut c2, slept, took) = h.join().unwrap();
    assert!(slept);
    assert!(took < WOKEN, "woken by the second server's reply: {took:?}");
    assert_eq!((c1.stats().idle_waits, c2.stats().idle_waits), (1, 1));
    assert_eq!(w1.word(b1 + CB_RESP_SLEEP).load(Ordering::SeqCst), 0);
    assert_eq!(c2.poll_up_to(8, |_, m| assert_eq!(m, b"2")).unwrap(), 1);
}

//! The delegation ring's sleeps (module `delegation::sleep`): a server sleeping in
//! `RingServer::wait_for_request` is woken by a commit, a client sleeping in
//! `RingClient::wait_for_response` by the server's round of replies; neither sleeps with work
//! already there, and every sleep ends at its bound. No test depends on timing luck: each
//! waits until the other side has announced its sleep in the shared word (read through a
//! mapping of its own), and a lost wake would show as a sleep that lasts its whole bound
//! (10 s here), far beyond the 5 s the tests allow.

mod ring_common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use rpc_runtime::delegation::layout::{
    Layout, LayoutParams, OFF_CLIENT_SLEEP_ARMED, OFF_SERVER_SLEEP, REC_SLEEP,
};
use rpc_runtime::delegation::{RingClient, RingConfig, RingServer};

use ring_common::{shm_file, unique_name};

/// A bound no wake-up needs: a sleep that lasts it lost its wake.
const LONG: Duration = Duration::from_secs(10);
/// What a woken sleep must stay under.
const WOKEN: Duration = Duration::from_secs(5);

fn server(tag: &str) -> (RingServer, String) {
    let name = unique_name(tag);
    let cfg = RingConfig {
        max_clients: 4,
        ring_depth: 8,
        resp_depth: 4,
        req_payload_cap: 64,
        resp_payload_cap: 64,
        ..RingConfig::default()
    };
    (RingServer::create(&name, &cfg).expect("create"), name)
}

/// A mapping of the ring file of our own, as another process would have.
struct Words {
    map: memmap2::MmapRaw,
    layout: Layout,
}

impl Words {
    fn open(name: &str, c: &RingClient) -> Self {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(shm_file(name))
            .unwrap();
        let i = c.info();
        let layout = Layout::new(LayoutParams {
            max_clients: i.max_clients,
            ring_depth: i.ring_depth,
            resp_depth: i.resp_depth,
            req_payload_cap: i.req_payload_cap,
            resp_payload_cap: i.resp_payload_cap,
        })
        .unwrap();
        Words {
            map: memmap2::MmapRaw::map_raw(&file).unwrap(),
            layout,
        }
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= self.map.len());
        // SAFETY: in bounds and 4-aligned (checked; the mapping is page-aligned); the ring's
        // processes access these words atomically only.
        unsafe { AtomicU32::from_ptr(self.map.as_mut_ptr().add(off).cast()) }
    }

    fn server_sleep(&self) -> &AtomicU32 {
        self.word(OFF_SERVER_SLEEP)
    }

    fn client_sleep(&self, id: u32) -> &AtomicU32 {
        self.word(self.layout.record_offset(id) + REC_SLEEP)
    }
}

/// Waits (yielding, at most `WOKEN`) until `word` holds 1: the other side announced its sleep.
fn until_asleep(word: &AtomicU32) {
    let t = Instant::now();
    while word.load(Ordering::SeqCst) != 1 {
        assert!(t.elapsed() < WOKEN, "the sleeper never announced its sleep");
        thread::yield_now();
    }
}

fn echo_round(s: &mut RingServer) -> usize {
    let mut n = 0;
    if s.poll() > 0 {
        while let Some(e) = s.recv() {
            let (token, msg) = (e.token, e.payload.to_vec());
            s.reply(token, &msg).expect("reply");
            n += 1;
        }
    }
    s.advance_tail();
    n
}

#[test]
fn a_sleeping_server_is_woken_by_a_commit() {
    let (mut s, name) = server("sleep-srv");
    let mut c = RingClient::attach(&name).unwrap();
    let words = Words::open(&name, &c);
    let h = thread::spawn(move || {
        let t = Instant::now();
        assert!(s.wait_for_request(LONG), "nothing reserved: it sleeps");
        let slept = t.elapsed();
        assert_eq!(echo_round(&mut s), 1, "the request that woke it is there");
        (s, slept)
    });
    until_asleep(words.server_sleep());
    c.try_call(b"abc").unwrap();
    let (s, slept) = h.join().unwrap();
    assert!(
        slept < WOKEN,
        "woken by the commit, not its bound: {slept:?}"
    );
    assert_eq!(s.stats().idle_waits, 1);
    assert_eq!(words.server_sleep().load(Ordering::SeqCst), 0);
    let mut got = Vec::new();
    let t = Instant::now();
    while got.is_empty() {
        c.poll(|_, m| got.extend_from_slice(m)).unwrap();
        assert!(t.elapsed() < WOKEN);
    }
    assert_eq!(got, b"abc");
}

#[test]
fn a_server_does_not_sleep_while_an_entry_is_reserved() {
    let (mut s, name) = server("sleep-reserved");
    let mut c = RingClient::attach(&name).unwrap();
    // Reserved, not committed (a client between its `fetch_add` and its commit, or a hole).
    c.__reserve_without_commit().unwrap();
    let t = Instant::now();
    assert!(!s.wait_for_request(LONG), "an entry is reserved: no sleep");
    assert!(t.elapsed() < WOKEN);
    assert_eq!(s.stats().idle_waits, 0);
    let words = Words::open(&name, &c);
    assert_eq!(words.server_sleep().load(Ordering::SeqCst), 0);
    c.__crash();
}

#[test]
fn a_sleeping_client_is_woken_by_the_servers_round_of_replies() {
    let (mut s, name) = server("sleep-cli");
    let mut c = RingClient::attach(&name).unwrap();
    let words = Words::open(&name, &c);
    let id = c.client_id();
    c.try_call(&[7]).unwrap();
    assert!(!c.wait_for_response(LONG), "the first call arms, no sleep");
    assert_eq!(words.word(OFF_CLIENT_SLEEP_ARMED).load(Ordering::SeqCst), 1);
    let h = thread::spawn(move || {
        let t = Instant::now();
        assert!(c.wait_for_response(LONG));
        let slept = t.elapsed();
        let mut got = Vec::new();
        c.poll(|_, m| got.extend_from_slice(m)).unwrap();
        (c, slept, got)
    });
    until_asleep(words.client_sleep(id));
    assert_eq!(echo_round(&mut s), 1);
    let (c, slept, got) = h.join().unwrap();
    assert!(
        slept < WOKEN,
        "woken by the reply, not its bound: {slept:?}"
    );
    assert_eq!(got, [7], "the reply that woke it is there");
    assert_eq!(c.idle_waits(), 1);
    assert_eq!(s.stats().clients_woken, 1);
    assert_eq!(words.client_sleep(id).load(Ordering::SeqCst), 0);
}

#[test]
fn a_client_with_a_reply_waiting_or_no_call_does_not_sleep() {
    let (mut s, name) = server("sleep-ready");
    let mut c = RingClient::attach(&name).unwrap();
    assert!(!c.wait_for_response(LONG), "no call outstanding");
    c.try_call(&[1]).unwrap();
    assert!(!c.wait_for_response(LONG), "the first call arms");
    assert_eq!(echo_round(&mut s), 1);
    let t = Instant::now();
    assert!(
        c.wait_for_response(LONG),
        "a reply is there: returns at once"
    );
    assert!(t.elapsed() < WOKEN);
    assert_eq!(c.idle_waits(), 0, "did not sleep");
    assert_eq!(s.stats().clients_woken, 0, "nobody was asleep");
    assert_eq!(c.poll(|_, _| {}).unwrap(), 1);
}

#[test]
fn sleeps_end_at_their_bound() {
    let (mut s, name) = server("sleep-bound");
    let mut c = RingClient::attach(&name).unwrap();
    let bound = Duration::from_millis(20);
    let t = Instant::now();
    assert!(s.wait_for_request(bound));
    // FUTEX_WAIT never returns before its timeout without a wake or a signal.
    assert!(t.elapsed() >= bound / 2, "{:?}", t.elapsed());
    assert_eq!(s.stats().idle_waits, 1);
    // A client whose server never answers (a stopped server) sleeps its bound, no more.
    c.try_call(&[1]).unwrap();
    assert!(!c.wait_for_response(bound), "the first call arms");
    let t = Instant::now();
    assert!(c.wait_for_response(bound));
    assert!(t.elapsed() < WOKEN);
    assert_eq!(c.idle_waits(), 1);
    assert_eq!(c.poll(|_, _| {}).unwrap(), 0);
}

#[test]
fn garbage_in_the_sleep_words_costs_at_most_a_spurious_wake() {
    let (mut s, name) = server("sleep-garbage");
    let mut c = RingClient::attach(&name).unwrap();
    let words = Words::open(&name, &c);
    let id = c.client_id();
    // Another writer of the shared memory scribbles on both words (and arms the server's
    // checks of the clients' words).
    words.server_sleep().store(0xdead_beef, Ordering::SeqCst);
    words
        .word(OFF_CLIENT_SLEEP_ARMED)
        .store(1, Ordering::SeqCst);
    words.client_sleep(id).store(5, Ordering::SeqCst);
    // The commit finds the server's word non-zero: a wake nobody waits for, and the word is 0.
    c.try_call(&[9]).unwrap();
    assert_eq!(words.server_sleep().load(Ordering::SeqCst), 0);
    // The reply round finds the client's word non-zero: the same.
    assert_eq!(echo_round(&mut s), 1);
    assert_eq!(words.client_sleep(id).load(Ordering::SeqCst), 0);
    assert_eq!(s.stats().clients_woken, 1);
    let mut got = Vec::new();
    c.poll(|_, m| got.extend_from_slice(m)).unwrap();
    assert_eq!(got, [9]);
    // A word cleared under a sleeper, before or during its FUTEX_WAIT, ends the sleep at
    // once (EAGAIN) or at its bound: never a hang.
    let t = Instant::now();
    let h = thread::spawn(move || s.wait_for_request(Duration::from_millis(50)));
    until_asleep(words.server_sleep());
    words.server_sleep().store(0, Ordering::SeqCst);
    assert!(h.join().unwrap());
    assert!(t.elapsed() < WOKEN);
}

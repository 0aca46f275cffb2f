//! Property tests of the delegation ring over scribbled shared memory (issue 14 §4): a
//! [`RingServer`] and [`RingClient`]s run over a ring file whose request-slot metadata,
//! response slots and client table a strategy overwrites with arbitrary values, through the
//! file (as another process of the same user could), between the protocol steps.
//!
//! Written against the public API and the [`layout`] constants only (offsets come from
//! [`Layout`]), so that it holds whatever the claim/commit protocol does inside.
//!
//! Asserted: `poll`, `recv`, `reply`, `advance_tail` and the client's `poll` and calls never
//! panic and never hang (every call has a short deadline); every entry `recv` returns is in
//! range (client id, response slot, length) and carries the slot's bytes; an invalid entry is
//! consumed and counted in exactly the [`RingStats`] counter its first fault names; a
//! response slot with a length above the capacity is delivered empty and counted in
//! `corrupt_responses`; a client only ever receives responses for calls it has outstanding;
//! and a fault the server or a client detects is reported (`ring_faults`, `RingCorrupt`).
//!
//! Cases: 256 per property by default (64 for the free-form scribbling, whose cases run many
//! rounds); `PROPTEST_CASES=<n>` runs more (proptest reads the variable itself; the smaller
//! default applies only when the variable is unset).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::Config;
use rpc_runtime::delegation::layout::{
    self, ABORTED_PAYLOAD_LEN, CLIENT_ACTIVE, Layout, LayoutParams, REC_STATE, RESP_PAYLOAD,
    RESP_PAYLOAD_LEN, RESP_TAG, RESP_VALID, SLOT_CLIENT_ID, SLOT_PAYLOAD, SLOT_PAYLOAD_LEN,
    SLOT_RESP_SLOT_IDX,
};
use rpc_runtime::delegation::{
    RingCallError, RingClient, RingConfig, RingReplyError, RingServer, SHM_DIR,
};

const MAX_CLIENTS: u32 = 4;
const RESP_DEPTH: u32 = 4;
const REQ_CAP: u32 = 32;
const RESP_CAP: u32 = 32;

fn cfg() -> RingConfig {
    RingConfig {
        max_clients: MAX_CLIENTS,
        ring_depth: 8,
        resp_depth: RESP_DEPTH,
        req_payload_cap: REQ_CAP,
        resp_payload_cap: RESP_CAP,
        hole_timeout: Duration::from_millis(2),
        stall_timeout: Duration::from_millis(4),
        liveness_interval: Duration::from_millis(1),
        ..RingConfig::default()
    }
}

fn layout_of(c: &RingConfig) -> Layout {
    Layout::new(LayoutParams {
        max_clients: c.max_clients,
        ring_depth: c.ring_depth,
        resp_depth: c.resp_depth,
        req_payload_cap: c.req_payload_cap,
        resp_payload_cap: c.resp_payload_cap,
    })
    .unwrap()
}

/// `ProptestConfig::default()` (which honours `PROPTEST_CASES`), with `cases` when the
/// variable is not set.
fn cases(cases: u32) -> Config {
    let mut c = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    c
}

/// A fresh ring with a server, a victim client and a second attached client, and the ring
/// file opened for scribbling.
struct Ring {
    server: RingServer,
    victim: RingClient,
    other: RingClient,
    file: File,
    layout: Layout,
    name: String,
    path: PathBuf,
}

impl Ring {
    fn new() -> Ring {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "rprops-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let c = cfg();
        let server = RingServer::create(&name, &c).unwrap();
        let mut victim = RingClient::attach(&name).unwrap();
        let mut other = RingClient::attach(&name).unwrap();
        victim.set_send_timeout(Duration::from_millis(5));
        other.set_send_timeout(Duration::from_millis(5));
        let path = PathBuf::from(SHM_DIR).join(&name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        Ring {
            server,
            victim,
            other,
            file,
            layout: layout_of(&c),
            name,
            path,
        }
    }

    fn write_u32(&self, off: usize, v: u32) {
        self.file
            .write_all_at(&v.to_le_bytes(), off as u64)
            .unwrap();
    }

    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.file.read_exact_at(&mut b, off as u64).unwrap();
        b
    }

    fn read_u32(&self, off: usize) -> u32 {
        u32::from_le_bytes(self.read(off, 4).try_into().unwrap())
    }

    /// Serves every committed entry: echoes valid ones back (a refused reply is fine), checks
    /// each one is in range, and returns them as `(client_id, resp_slot_idx, payload)`.
    fn serve(&mut self) -> Vec<(u32, u32, Vec<u8>)> {
        self.server.poll();
        let mut got = Vec::new();
        while let Some(e) = self.server.recv() {
            let (t, p) = (e.token, e.payload.to_vec());
            assert!(t.client_id < MAX_CLIENTS && t.resp_slot_idx < RESP_DEPTH);
            assert!(p.len() <= REQ_CAP as usize);
            match self.server.reply(t, &p) {
                Ok(()) | Err(RingReplyError::SlotBusy) | Err(RingReplyError::StaleToken) => {}
                Err(e) => panic!("reply to an entry recv returned: {e:?}"),
            }
            got.push((t.client_id, t.resp_slot_idx, p));
        }
        self.server.advance_tail();
        got
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A value for a `u32` field: the original, one of a few meaningful ones, or anything.
fn field(meaningful: Vec<u32>) -> impl Strategy<Value = Option<u32>> {
    prop_oneof![
        2 => Just(None),
        3 => proptest::sample::select(meaningful).prop_map(Some),
        1 => any::<u32>().prop_map(Some),
    ]
}

proptest! {
    /// The victim commits a call; before the server reads it, its client id, response slot
    /// and length are overwritten. The entry is served (with those values and the slot's
    /// bytes) exactly when every field is valid and names an `ACTIVE` client; otherwise it
    /// is consumed and counted in the one counter of its first fault (`aborted` for the
    /// abort marker, then `bad_client_id`, `inactive_client`, `bad_resp_slot`,
    /// `bad_payload_len`, in the server's order of checks). Either way the ring keeps
    /// working: a fresh call from the other client is answered.
    #[test]
    fn committed_entry_metadata_is_validated_and_counted(
        cid in field(vec![0, 1, 2, 3, MAX_CLIENTS, u32::MAX]),
        slot in field(vec![0, 1, RESP_DEPTH - 1, RESP_DEPTH, u32::MAX]),
        len in field(vec![0, 5, REQ_CAP, REQ_CAP + 1, ABORTED_PAYLOAD_LEN, u32::MAX - 1]),
        payload in proptest::collection::vec(any::<u8>(), 0..=REQ_CAP as usize),
    ) {
        let mut r = Ring::new();
        let idx = r.victim.try_call(&payload).unwrap();
        // The entry is at position 0 (nothing was sent before).
        let off = r.layout.req_slot_offset(0);
        let orig = (
            r.read_u32(off + SLOT_CLIENT_ID),
            r.read_u32(off + SLOT_RESP_SLOT_IDX),
            r.read_u32(off + SLOT_PAYLOAD_LEN),
        );
        prop_assert_eq!(orig, (r.victim.client_id(), idx, payload.len() as u32));
        let (c, s, l) = (cid.unwrap_or(orig.0), slot.unwrap_or(orig.1), len.unwrap_or(orig.2));
        r.write_u32(off + SLOT_CLIENT_ID, c);
        r.write_u32(off + SLOT_RESP_SLOT_IDX, s);
        r.write_u32(off + SLOT_PAYLOAD_LEN, l);
        let active = |c: u32| {
            c < MAX_CLIENTS && r.read_u32(r.layout.record_offset(c) + REC_STATE) == CLIENT_ACTIVE
        };
        // The oracle, in the server's order of checks.
        let want: [u64; 6] = if l == ABORTED_PAYLOAD_LEN {
            [0, 0, 0, 0, 0, 1]
        } else if c >= MAX_CLIENTS {
            [0, 1, 0, 0, 0, 0]
        } else if !active(c) {
            [0, 0, 1, 0, 0, 0]
        } else if s >= RESP_DEPTH {
            [0, 0, 0, 1, 0, 0]
        } else if l > REQ_CAP {
            [0, 0, 0, 0, 1, 0]
        } else {
            [1, 0, 0, 0, 0, 0]
        };
        let slot_bytes = r.read(off + SLOT_PAYLOAD, REQ_CAP as usize);
        let got = r.serve();
        let st = r.server.stats().clone();
        prop_assert_eq!(
            [st.received, st.bad_client_id, st.inactive_client, st.bad_resp_slot,
             st.bad_payload_len, st.aborted],
            want
        );
        if want[0] == 1 {
            prop_assert_eq!(got, vec![(c, s, slot_bytes[..l as usize].to_vec())]);
        } else {
            prop_assert!(got.is_empty());
        }
        // The victim hears back only if the entry still named its own call.
        let mut heard = Vec::new();
        let n = r.victim.poll(|i, b| heard.push((i, b.to_vec()))).unwrap();
        prop_assert_eq!(n, heard.len());
        for (i, _) in &heard {
            prop_assert_eq!(*i, idx);
        }
        if want[0] == 1 && (c, s) == (r.victim.client_id(), idx) {
            prop_assert_eq!(heard, vec![(idx, slot_bytes[..l as usize].to_vec())]);
        }
        // The ring still serves, a client that attaches now (its id was `FREE`, so no
        // forged entry was served into its response slots; see
        // `forged_entry_into_an_idle_response_slot_is_taken_for_the_next_response`).
        let mut fresh = RingClient::attach(&r.name).unwrap();
        fresh.set_send_timeout(Duration::from_millis(5));
        let j = fresh.try_call(b"next").unwrap();
        r.serve();
        let mut back = None;
        fresh.poll(|i, b| back = Some((i, b.to_vec()))).unwrap();
        prop_assert_eq!(back, Some((j, b"next".to_vec())));
    }

    /// The server answered the victim; before the victim reads its response slot, the slot's
    /// `valid` byte and length are overwritten. A non-zero `valid` delivers the response: the
    /// slot's bytes up to the length if it is within the capacity, else an empty message
    /// counted in `corrupt_responses`; a zero `valid` delivers nothing.
    #[test]
    fn response_slot_metadata_is_bounded_and_counted(
        valid in prop_oneof![Just(0u8), Just(1u8), any::<u8>()],
        len in field(vec![0, 3, RESP_CAP, RESP_CAP + 1, u32::MAX]),
        payload in proptest::collection::vec(any::<u8>(), 0..=REQ_CAP as usize),
    ) {
        let mut r = Ring::new();
        let idx = r.victim.try_call(&payload).unwrap();
        prop_assert_eq!(r.serve().len(), 1);
        let off = r.layout.resp_slot_offset(r.victim.client_id(), idx);
        r.file.write_all_at(&[valid], (off + RESP_VALID) as u64).unwrap();
        let l = len.unwrap_or(payload.len() as u32);
        r.write_u32(off + RESP_PAYLOAD_LEN, l);
        let bytes = r.read(off + RESP_PAYLOAD, RESP_CAP as usize);
        let mut heard = Vec::new();
        let n = r.victim.poll(|i, b| heard.push((i, b.to_vec()))).unwrap();
        prop_assert_eq!(n, heard.len());
        if valid == 0 {
            prop_assert!(heard.is_empty());
            prop_assert_eq!(r.victim.in_flight(), 1);
        } else if l <= RESP_CAP {
            prop_assert_eq!(heard, vec![(idx, bytes[..l as usize].to_vec())]);
            prop_assert_eq!(r.victim.corrupt_responses(), 0);
        } else {
            prop_assert_eq!(heard, vec![(idx, Vec::new())]);
            prop_assert_eq!(r.victim.corrupt_responses(), 1);
        }
    }
}

/// Where a free-form scribble lands.
#[derive(Clone, Debug)]
enum Region {
    /// Request slot `i`, byte offset within it (the slot's header, sequence word included,
    /// mostly).
    ReqSlot(u32, usize),
    /// Response slot `k` of the client table's order, byte offset within it.
    RespSlot(u32, usize),
    /// Client record `c`, byte offset within it.
    Record(u32, usize),
}

#[derive(Clone, Debug)]
struct Scribble {
    region: Region,
    bytes: Vec<u8>,
}

fn scribble() -> impl Strategy<Value = Scribble> {
    let region = prop_oneof![
        (0u32..8, prop_oneof![3 => 0usize..24, 1 => 0usize..64])
            .prop_map(|(i, o)| Region::ReqSlot(i, o)),
        (0u32..MAX_CLIENTS * RESP_DEPTH, 0usize..16).prop_map(|(k, o)| Region::RespSlot(k, o)),
        (0u32..MAX_CLIENTS, 0usize..80).prop_map(|(c, o)| Region::Record(c, o)),
    ];
    (region, proptest::collection::vec(any::<u8>(), 1..9))
        .prop_map(|(region, bytes)| Scribble { region, bytes })
}

proptest! {
    #![proptest_config(cases(64))]

    /// Free-form: rounds of calls from both clients, serving, and client polls, with
    /// arbitrary bytes written at arbitrary offsets of the request slots (sequence words
    /// included), the response slots and the client records in between. Nothing panics or
    /// hangs; every call ends in a response index or a typed error; attaching over the
    /// scribbled client table gives an id in range or a typed error; everything `recv`
    /// returns is in range (checked in `serve`); a client hears only about indices it has
    /// outstanding; and once the server reports a fault, it is counted, and a client that
    /// reports one fails its calls with `RingCorrupt`.
    #[test]
    fn arbitrary_scribbles_never_panic_and_stay_in_bounds(
        rounds in proptest::collection::vec(
            (proptest::collection::vec(scribble(), 0..3), 0usize..3, 0usize..3),
            1..12,
        ),
    ) {
        let mut r = Ring::new();
        let ring_bytes = r.layout.resp_area_offset as usize;
        let mut outstanding: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
        for (scribbles, calls_v, calls_o) in rounds {
            for s in &scribbles {
                let off = match s.region {
                    Region::ReqSlot(i, o) => r.layout.req_slot_offset(u64::from(i)) + o,
                    Region::RespSlot(k, o) => {
                        r.layout.resp_slot_offset(k / RESP_DEPTH, k % RESP_DEPTH) + o
                    }
                    Region::Record(c, o) => r.layout.record_offset(c) + o,
                };
                let end = (off + s.bytes.len()).min(r.layout.total_size as usize);
                if off < end {
                    r.file.write_all_at(&s.bytes[..end - off], off as u64).unwrap();
                }
            }
            prop_assert!(ring_bytes >= layout::RING_SLOTS_OFFSET as usize);
            for (who, n) in [(0usize, calls_v), (1, calls_o)] {
                for k in 0..n {
                    let c = if who == 0 { &mut r.victim } else { &mut r.other };
                    let p = [k as u8; 7];
                    match c.try_call_with_timeout(Duration::from_millis(2), |b| {
                        b[..7].copy_from_slice(&p);
                        7
                    }) {
                        Ok(i) => {
                            prop_assert!(i < RESP_DEPTH);
                            outstanding[who].push(i);
                        }
                        Err(RingCallError::RingCorrupt(_)) => prop_assert!(c.fault().is_some()),
                        Err(_) => {}
                    }
                }
            }
            r.serve();
            if r.server.fault().is_some() {
                // Found by the server (counted there) or adopted from the header's fault byte
                // that a client set (counted by that client).
                prop_assert!(
                    r.server.stats().ring_faults + r.victim.ring_faults() + r.other.ring_faults() >= 1
                );
            }
            for (who, outstanding) in outstanding.iter_mut().enumerate() {
                let c = if who == 0 { &mut r.victim } else { &mut r.other };
                let mut heard = Vec::new();
                let res = c.poll(|i, b| heard.push((i, b.len())));
                for (i, len) in heard {
                    let at = outstanding.iter().position(|&x| x == i);
                    prop_assert!(at.is_some(), "client {} heard about {} not outstanding", who, i);
                    outstanding.remove(at.unwrap());
                    prop_assert!(len <= RESP_CAP as usize);
                }
                if let Err(RingCallError::RingCorrupt(_)) = res {
                    prop_assert!(c.fault().is_some());
                }
            }
            // Attaching reads the client table: an id in range, or a typed error.
            if let Ok(c) = RingClient::attach(&r.name) {
                prop_assert!(c.client_id() < MAX_CLIENTS);
            }
            // A fault anyone reports was counted by whoever found it.
            if r.server.fault().is_some() || r.victim.fault().is_some() || r.other.fault().is_some() {
                prop_assert!(
                    r.server.stats().ring_faults + r.victim.ring_faults() + r.other.ring_faults() >= 1
                );
            }
        }
    }
}

/// A committed entry whose metadata another process overwrote to name client B's response
/// slot that B has no call on gets served and answered into that slot (`valid = 1`). Found by
/// the property tests above: B's next call on that slot used to take that answer for its own
/// (wrong data) and its real answer was refused with `SlotBusy`. Now B clears a response in
/// a slot it is about to use (counted in `stray_responses`), and gets its own answer.
#[test]
fn forged_entry_into_an_idle_response_slot_is_not_taken_for_the_next_response() {
    let mut r = Ring::new();
    r.victim.try_call(b"abc").unwrap();
    let off = r.layout.req_slot_offset(0);
    // Point the entry at the other client's response slot 0, on which it has no call.
    r.write_u32(off + SLOT_CLIENT_ID, r.other.client_id());
    r.write_u32(off + SLOT_RESP_SLOT_IDX, 0);
    assert_eq!(r.serve().len(), 1);
    let j = r.other.try_call(b"mine").unwrap();
    assert_eq!(j, 0);
    r.serve();
    let mut back = None;
    r.other.poll(|i, b| back = Some((i, b.to_vec()))).unwrap();
    assert_eq!(
        back,
        Some((0, b"mine".to_vec())),
        "the other client's own answer"
    );
    assert_eq!(r.other.stray_responses(), 1);
}

/// An answer with another call's tag lands in B's slot while B's call on it is outstanding
/// (for example the answer to an entry whose metadata was overwritten to name that slot,
/// served before B's own): B drops it (counted), goes on waiting, and gets its own answer.
#[test]
fn stray_answer_during_a_call_is_dropped_by_its_tag() {
    let mut r = Ring::new();
    let j = r.other.try_call(b"mine").unwrap();
    let off = r.layout.resp_slot_offset(r.other.client_id(), j);
    // The call is at ring position 0, so its tag is 0; the stray answer has tag 7.
    r.file
        .write_all_at(&7u16.to_ne_bytes(), (off + RESP_TAG) as u64)
        .unwrap();
    r.write_u32(off + RESP_PAYLOAD_LEN, 3);
    r.file
        .write_all_at(b"bad", (off + RESP_PAYLOAD) as u64)
        .unwrap();
    r.file
        .write_all_at(&[1u8], (off + RESP_VALID) as u64)
        .unwrap();
    let mut heard = Vec::new();
    r.other.poll(|i, b| heard.push((i, b.to_vec()))).unwrap();
    assert!(heard.is_empty(), "{heard:?}");
    assert_eq!((r.other.stray_responses(), r.other.in_flight()), (1, 1));
    assert_eq!(r.serve().len(), 1);
    r.other.poll(|i, b| heard.push((i, b.to_vec()))).unwrap();
    assert_eq!(heard, vec![(j, b"mine".to_vec())]);
}

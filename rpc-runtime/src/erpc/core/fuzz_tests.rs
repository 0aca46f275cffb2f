//! Property tests of everything the core decodes from the wire (issue 14 §4): the packet
//! header, session-management packets (`SmPkt::decode`) and whole datagrams through
//! [`Rpc::handle_datagram`], from arbitrary bytes and from well-formed headers with arbitrary
//! fields aimed at a live session.
//!
//! Asserted: nothing panics; every datagram is counted in `rx_pkts`; an invalid one (too
//! short, bad magic, unknown session or role, wrong session token, oversized message,
//! malformed SM packet) is dropped and counted in the matching `Stats::drop_*` counter (or,
//! for a well-formed connect request with foreign settings, in `connects_refused`) and
//! changes nothing else; and the core's own consistency checks (`check_invariants`) hold
//! after each datagram. 256 cases per property by default; `PROPTEST_CASES=<n>` runs more
//! (proptest reads the variable itself).

use proptest::prelude::*;

use super::sim_tests::{Node, connect_pair};
use super::sm::{SM_PKT_LEN, SM_SESSION_NUM, SmPkt};
use super::*;
use crate::erpc::pkthdr::{MAGIC, MAX_PKT_NUM, MAX_REQ_NUM};

/// The drop counters and `connects_refused`, in one array (a datagram moves exactly one).
fn drops(s: &Stats) -> [u64; 10] {
    [
        s.drop_truncated,
        s.drop_bad_hdr,
        s.drop_unknown_session,
        s.drop_out_of_window,
        s.drop_msg_too_large,
        s.drop_bad_len,
        s.drop_bad_sm,
        s.drop_stale_token,
        s.connects_refused,
        0,
    ]
}

/// Index of the counter that moved between `a` and `b`, if exactly one moved by one.
fn moved(a: &Stats, b: &Stats) -> Option<usize> {
    let (a, b) = (drops(a), drops(b));
    let d: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
    (d.len() == 1 && b[d[0]] == a[d[0]] + 1).then(|| d[0])
}

/// Arbitrary bytes, bytes with the header's magic nibble set (so the header decodes), and
/// SM-addressed packets of SM length with an arbitrary body.
fn datagram() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..100),
        proptest::collection::vec(any::<u8>(), 16..200).prop_map(|mut b| {
            b[13] = (b[13] & 0x0f) | (MAGIC << 4);
            b
        }),
        (
            any::<u8>(),
            proptest::collection::vec(any::<u8>(), 0..80),
            any::<bool>()
        )
            .prop_map(|(kind, body, zero_pad)| {
                let mut b = PktHdr::new(kind % 8, 48, SM_SESSION_NUM, PktType::Req, 0, 0)
                    .unwrap()
                    .encode()
                    .to_vec();
                b.extend_from_slice(&body);
                if zero_pad && b.len() >= SM_PKT_LEN {
                    // The reserved bytes zero, so more bodies decode.
                    b[PKTHDR_SIZE + 13] = 0;
                    b[PKTHDR_SIZE + 34..PKTHDR_SIZE + 36].fill(0);
                    b[PKTHDR_SIZE + 44..PKTHDR_SIZE + 48].fill(0);
                }
                b
            }),
    ]
}

/// A datagram aimed at a session: a well-formed header whose session number and token are
/// the session's (`None`, mostly) or arbitrary, with arbitrary other fields and payload.
#[derive(Clone, Debug)]
struct Aimed {
    to_server: bool,
    req_type: u8,
    msg_size: u32,
    dest: Option<u16>,
    pkt_type: u8,
    pkt_num: u16,
    req_num: u64,
    token: Option<u16>,
    payload: Vec<u8>,
}

impl Aimed {
    fn bytes(&self, dest: u16, token: u16) -> Vec<u8> {
        let h = PktHdr::new(
            self.req_type,
            self.msg_size,
            self.dest.unwrap_or(dest),
            PktType::from_bits(self.pkt_type),
            self.pkt_num,
            self.req_num,
        )
        .unwrap()
        .with_token(self.token.unwrap_or(token));
        let mut b = h.encode().to_vec();
        b.extend_from_slice(&self.payload);
        b
    }
}

fn aimed() -> impl Strategy<Value = Aimed> {
    (
        (
            any::<bool>(),
            any::<u8>(),
            prop_oneof![0u32..5000, 0u32..=crate::erpc::pkthdr::MAX_MSG_SIZE],
            prop_oneof![4 => Just(None), 1 => any::<u16>().prop_map(Some)],
        ),
        (
            0u8..4,
            prop_oneof![0u16..4, 0..=MAX_PKT_NUM],
            prop_oneof![0u64..32, 0..=MAX_REQ_NUM],
            prop_oneof![4 => Just(None), 1 => any::<u16>().prop_map(Some)],
            proptest::collection::vec(any::<u8>(), 0..3000),
        ),
    )
        .prop_map(
            |(
                (to_server, req_type, msg_size, dest),
                (pkt_type, pkt_num, req_num, token, payload),
            )| {
                Aimed {
                    to_server,
                    req_type,
                    msg_size,
                    dest,
                    pkt_type,
                    pkt_num,
                    req_num,
                    token,
                    payload,
                }
            },
        )
}

/// Drains everything the endpoint wants to send or report.
fn drain(n: &mut Node) {
    let mut buf = vec![0u8; 65536];
    while n.rpc.poll_transmit(&mut buf).is_some() {}
    while n.rpc.poll_event().is_some() {}
}

proptest! {
    /// `SmPkt::decode` over an arbitrary header and body: never panics, and accepts only
    /// the canonical encoding (re-encoding what it accepts gives back the same bytes, so no
    /// reserved bit or byte is silently ignored).
    #[test]
    fn sm_decode_accepts_only_canonical_packets(
        hdr in any::<[u8; 16]>(),
        body in proptest::collection::vec(any::<u8>(), 0..80),
        magic in any::<bool>(),
    ) {
        let mut hdr = hdr;
        if magic {
            hdr[13] = (hdr[13] & 0x0f) | (MAGIC << 4);
        }
        let Ok(h) = PktHdr::decode(&hdr) else { return Ok(()) };
        if let Some(p) = SmPkt::decode(&h, &body) {
            let mut out = [0u8; SM_PKT_LEN];
            prop_assert_eq!(p.encode(&mut out), SM_PKT_LEN);
            prop_assert_eq!(&out[..PKTHDR_SIZE], &hdr[..]);
            prop_assert_eq!(&out[PKTHDR_SIZE..], &body[..]);
        }
    }

    /// A server with no sessions, fed arbitrary datagrams from one address: each is counted
    /// in `rx_pkts` and either dropped and counted in exactly one drop counter (or refused
    /// and counted in `connects_refused`), or, for a well-formed ping or disconnect of an
    /// unknown session, answered (one SM packet sent, as the protocol requires). No session
    /// and no event ever results.
    #[test]
    fn fresh_server_counts_every_foreign_datagram(
        dgrams in proptest::collection::vec(datagram(), 1..16),
    ) {
        let cfg = Config { schema_fingerprint: 0x5eed_f00d_0bad_cafe, ..Config::default() };
        let mut sv = Node::new(2, cfg);
        for (i, d) in dgrams.iter().enumerate() {
            let before = sv.rpc.stats().clone();
            sv.rpc.handle_datagram(i as Time, 7, d);
            let after = sv.rpc.stats().clone();
            prop_assert_eq!(after.rx_pkts, before.rx_pkts + 1);
            let answered = after.sm_tx == before.sm_tx + 1;
            match moved(&before, &after) {
                Some(8) => prop_assert!(answered, "a refusal is answered"),
                Some(_) => prop_assert_eq!(after.sm_tx, before.sm_tx, "a drop is silent"),
                None => {
                    // Only an SM ping or disconnect request is answered without a counter.
                    prop_assert!(answered, "datagram {:?}: no counter moved: {:?}", d, after);
                    let h = PktHdr::decode(d).unwrap();
                    prop_assert_eq!(h.dest_session_num(), SM_SESSION_NUM);
                    prop_assert!(matches!(h.req_type(), 3 | 5), "kind {}", h.req_type());
                }
            }
            prop_assert_eq!(sv.rpc.num_sessions(), 0);
            prop_assert_eq!(sv.rpc.poll_event(), None);
            let mut buf = vec![0u8; 65536];
            while let Some((dest, _)) = sv.rpc.poll_transmit(&mut buf) {
                prop_assert_eq!(dest, 7);
            }
            sv.rpc.check_invariants();
        }
    }

    /// A connected client/server pair, each fed datagrams with well-formed headers aimed at
    /// its session (right number and token, mostly) with arbitrary fields and payloads:
    /// nothing panics, the invariants hold after every datagram, and each datagram the
    /// receiver must refuse before looking at its contents (wrong sender, session, token or
    /// role for its type, or a message above `max_msg_size`) is dropped and counted in the
    /// matching counter.
    #[test]
    fn connected_pair_survives_aimed_garbage(
        dgrams in proptest::collection::vec(aimed(), 1..12),
    ) {
        let (mut cl, mut sv, sid) = connect_pair(0);
        let s = cl.rpc.session(sid).unwrap();
        // The server's session number, and each side's receive token.
        let (sv_num, sv_tok, cl_tok) = (s.remote_num, s.tx_token, s.rx_token);
        let max = cl.rpc.cfg.max_msg_size;
        for (i, a) in dgrams.iter().enumerate() {
            let srv = a.to_server;
            let (node, from, dest, tok) = if srv {
                (&mut sv, 1u32, sv_num, sv_tok)
            } else {
                (&mut cl, 2u32, sid.0, cl_tok)
            };
            let d = a.bytes(dest, tok);
            let h = PktHdr::decode(&d).unwrap();
            let before = node.rpc.stats().clone();
            node.rpc.handle_datagram(i as Time, from, &d);
            let after = node.rpc.stats().clone();
            prop_assert_eq!(after.rx_pkts, before.rx_pkts + 1);
            let role_ok = if srv {
                matches!(h.pkt_type(), PktType::Req | PktType::Rfr)
            } else {
                matches!(h.pkt_type(), PktType::ExplCr | PktType::Resp)
            };
            let want = if h.dest_session_num() == SM_SESSION_NUM {
                None // an SM packet: covered by the test above
            } else if h.msg_size() as usize > max {
                Some(4)
            } else if h.dest_session_num() != dest {
                Some(2)
            } else if h.token() != tok {
                Some(7)
            } else if !role_ok {
                Some(2)
            } else {
                None
            };
            if let Some(w) = want {
                prop_assert_eq!(moved(&before, &after), Some(w), "header {:?}", h);
                prop_assert_eq!(after.requests_dispatched, before.requests_dispatched);
                prop_assert_eq!(node.rpc.poll_event(), None);
            }
            node.rpc.check_invariants();
            drain(node);
        }
        prop_assert_eq!(cl.rpc.num_sessions(), 1);
    }
}

/// Whole datagrams of every length up to a header past the end: the short ones are counted
/// as truncated, never read past their end.
#[test]
fn every_truncation_of_a_packet_is_counted() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    cl.rpc.enqueue_request(0, sid, 1, &[7u8; 100], 1).unwrap();
    let mut buf = vec![0u8; 65536];
    let (_, len) = cl.rpc.poll_transmit(&mut buf).unwrap();
    for n in 0..PKTHDR_SIZE {
        let before = sv.rpc.stats().drop_truncated;
        sv.rpc.handle_datagram(0, 1, &buf[..n]);
        assert_eq!(sv.rpc.stats().drop_truncated, before + 1, "{n} bytes");
    }
    // Header complete, payload short of msg_size: counted as a bad length.
    let before = sv.rpc.stats().drop_bad_len;
    sv.rpc.handle_datagram(0, 1, &buf[..len - 1]);
    assert_eq!(sv.rpc.stats().drop_bad_len, before + 1);
    sv.rpc.check_invariants();
}

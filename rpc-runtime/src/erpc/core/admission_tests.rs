//! Issue 14, part 3: admission per source and resistance to forged packets, in virtual time
//! over the instant, lossless wire of `sim_tests` (client at address 1, server at 2; other
//! addresses are attackers or other clients).

use super::sim_tests::{Node, connect_pair};
use super::sm::{SM_PKT_LEN, SmKind, SmPkt, SmStatus};
use super::*;
use crate::erpc::pkthdr::MAX_REQ_NUM;

/// An SM packet with this crate's default settings, as any sender can build it (every field
/// but the tokens is public or guessable).
fn sm(kind: SmKind, token: u64, client_sess: u16, server_sess: u16, status: SmStatus) -> Vec<u8> {
    let c = Config::default();
    let pkt = SmPkt {
        kind,
        token,
        client_sess,
        server_sess,
        status,
        sess_token: 0,
        fingerprint: c.schema_fingerprint,
        mtu: c.mtu as u32,
        max_msg_size: c.max_msg_size as u32,
        credits: c.session_credits as u16,
        ring_entries: u32::MAX,
        sessions: 0,
        req_base: 0,
        src_limit: 0,
    };
    let mut buf = vec![0u8; SM_PKT_LEN];
    let n = pkt.encode(&mut buf);
    buf.truncate(n);
    buf
}

/// A response packet 0 for a single-packet request carrying `data`.
fn forged_resp(dest_sess: u16, req_num: u64, token: u16, data: &[u8]) -> Vec<u8> {
    let mut p = PktHdr::new(4, data.len() as u32, dest_sess, PktType::Resp, 0, req_num)
        .unwrap()
        .with_token(token)
        .encode()
        .to_vec();
    p.extend_from_slice(data);
    p
}

/// Moves both nodes' clocks to `until` in `step`s, running their timers and delivering
/// everything in between (requests are echoed).
fn advance(cl: &mut Node, sv: &mut Node, until: Time, step: Time) {
    while cl.now < until {
        let t = (cl.now + step).min(until);
        cl.now = t;
        sv.now = t;
        cl.rpc.handle_timeout(t);
        sv.rpc.handle_timeout(t);
        Node::run_reliable(cl, sv, |_, d| d.to_vec());
    }
}

/// A forged response that names the right client session and request number but carries a
/// wrong session token is dropped and counted and completes nothing. An off-path sender
/// does not see request numbers: before issue 14 a session's first request on slot `i` was
/// always number `i`, so trying the eight first request numbers with all 2^16 tokens (2^19
/// datagrams from the spoofed server address) completed the call with the sender's data.
/// Request numbers now start at a random base (2^40 choices) agreed at connect, so the
/// same sweep completes nothing; the real response still completes the call afterwards.
#[test]
fn forged_responses_are_dropped_and_counted() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let mut buf = vec![0u8; 4096];
    cl.rpc.enqueue_request(0, sid, 4, b"question", 7).unwrap();
    let (_, len) = cl.rpc.poll_transmit(&mut buf).unwrap();
    let req = buf[..len].to_vec();
    let req_num = PktHdr::decode(&req).unwrap().req_num();
    let token = cl.rpc.session(sid).unwrap().rx_token;

    // Sniffed request number, wrong token.
    cl.rpc.handle_datagram(
        0,
        2,
        &forged_resp(sid.num(), req_num, token ^ 0x5a5a, b"forged"),
    );
    assert_eq!(cl.rpc.stats().drop_stale_token, 1);
    assert!(cl.rpc.poll_event().is_none(), "forged response delivered");

    // The off-path sweep.
    let before = cl.rpc.stats().clone();
    let mut sent = 0u64;
    for guess in 0..SLOTS_PER_SESSION as u64 {
        let mut p = forged_resp(sid.num(), guess, 0, b"forged");
        for tok in 0..=u16::MAX {
            p[14..16].copy_from_slice(&tok.to_le_bytes());
            if let Some(zc) = cl.rpc.handle_datagram_zc(0, 2, &p) {
                panic!("forged response accepted: req_num {guess} token {tok:#x}: {zc:?}");
            }
            sent += 1;
        }
    }
    let st = cl.rpc.stats();
    assert_eq!(
        (st.drop_stale_token - before.drop_stale_token)
            + (st.drop_out_of_window - before.drop_out_of_window),
        sent,
        "every forged response is dropped and counted"
    );
    assert!(cl.rpc.poll_event().is_none());

    // The real exchange still completes with the server's data.
    sv.rpc.handle_datagram(0, 1, &req);
    let Some(Event::Request { token, .. }) = sv.rpc.poll_event() else {
        panic!("request not dispatched")
    };
    sv.rpc.reply(0, token, b"answer").unwrap();
    let (_, len) = sv.rpc.poll_transmit(&mut buf).unwrap();
    cl.rpc.handle_datagram(0, 2, &buf[..len]);
    assert_eq!(
        cl.rpc.poll_event(),
        Some(Event::Response {
            session: sid,
            tag: 7,
            data: MsgBuffer::from_bytes(b"answer", 4080).unwrap()
        })
    );
    cl.rpc.check_invariants();
}

/// A forged request with the right session token (say an earlier session's token was
/// guessed) but a request number other than the slot's next one is dropped: before issue
/// 14 the server took any higher request number as a new request, ran it, and then dropped
/// every later real request on the slot as "old" (the client retransmitted forever).
#[test]
fn forged_requests_cannot_run_or_take_a_slot() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let mut buf = vec![0u8; 4096];
    let s = sv.rpc.session(SessionId(0)).unwrap();
    let (dest, tok) = (SessionId(0).num(), s.rx_token);
    assert_eq!(s.peer, 1);
    for r in [8, 1 << 20, MAX_REQ_NUM - 7] {
        let mut p = PktHdr::new(4, 6, dest, PktType::Req, 0, r)
            .unwrap()
            .with_token(tok)
            .encode()
            .to_vec();
        p.extend_from_slice(b"forged");
        sv.rpc.handle_datagram(0, 1, &p);
    }
    assert_eq!(sv.rpc.stats().requests_dispatched, 0, "forged request ran");
    assert_eq!(sv.rpc.stats().drop_out_of_window, 3);
    assert!(sv.rpc.poll_event().is_none());
    // The real call on slot 0 runs.
    cl.rpc.enqueue_request(0, sid, 4, b"real", 1).unwrap();
    let (_, len) = cl.rpc.poll_transmit(&mut buf).unwrap();
    sv.rpc.handle_datagram(0, 1, &buf[..len]);
    assert!(matches!(sv.rpc.poll_event(), Some(Event::Request { data, .. }) if data == b"real"));
}

/// A forged disconnect (wrong connect token from the client's address, or the right one from
/// another address) is dropped and counted, and the session survives and serves calls; a
/// forged "no such session" pong to the client is dropped and counted as well. Before
/// issue 14 such packets were ignored without a trace.
#[test]
fn forged_disconnects_are_dropped_and_counted() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let srv_sid = SessionId(0);
    let conn_token = sv.rpc.session(srv_sid).unwrap().token;
    let forged = [
        (1, conn_token ^ 1),        // spoofed client address, guessed token
        (1, 0x1234_5678_9abc_def0), // spoofed client address, guessed token
        (77, conn_token),           // sniffed token, another address
    ];
    for (from, token) in forged {
        let p = sm(
            SmKind::DisconnectReq,
            token,
            sid.num(),
            srv_sid.num(),
            SmStatus::Ok,
        );
        sv.rpc.handle_datagram(0, from, &p);
    }
    assert_eq!(sv.rpc.stats().drop_sm_bad_token, 3);
    assert!(sv.rpc.poll_event().is_none(), "server session closed");
    assert!(sv.rpc.session(srv_sid).is_some());
    // A forged pong "no such session" from the server's address to the client.
    let p = sm(
        SmKind::Pong,
        conn_token ^ 2,
        sid.num(),
        srv_sid.num(),
        SmStatus::NoSession,
    );
    cl.rpc.handle_datagram(0, 2, &p);
    assert_eq!(cl.rpc.stats().drop_sm_bad_token, 1);
    assert!(cl.rpc.is_connected(sid));
    // The acknowledgements the server sent to the forged disconnects reach their claimed
    // sources; the client drops the two it gets, as they carry the forger's tokens.
    let mut buf = vec![0u8; 4096];
    let mut acks = 0;
    while let Some((dest, len)) = sv.rpc.poll_transmit(&mut buf) {
        acks += 1;
        if dest == 1 {
            cl.rpc.handle_datagram(0, 2, &buf[..len]);
        }
    }
    assert_eq!(acks, 3);
    assert_eq!(cl.rpc.stats().drop_sm_bad_token, 3);
    assert!(cl.rpc.is_connected(sid));
    assert!(cl.rpc.poll_event().is_none());
    // The session serves calls.
    cl.rpc.enqueue_request(0, sid, 4, b"still here", 3).unwrap();
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    assert_eq!(
        cl.rpc.poll_event(),
        Some(Event::Response {
            session: sid,
            tag: 3,
            data: MsgBuffer::from_bytes(b"still here", 4080).unwrap()
        })
    );
}

/// A client session that never sends a request is reclaimed by the server after
/// `idle_session_timeout` although its client keeps it alive with pings (before issue 14 it
/// was held for as long as the pings came); a session that made a call is kept. The client
/// learns at its next ping (`SessionLost`).
#[test]
fn idle_never_sending_session_is_reclaimed() {
    let cfg = Config {
        idle_session_timeout: 120 * MS,
        failure_timeout: 200 * MS,
        keepalive: 50 * MS,
        ..Config::default()
    };
    let mut cl = Node::new(1, cfg.clone());
    let mut sv = Node::new(2, cfg);
    let busy = cl.rpc.create_session(0, 2).unwrap();
    let idle = cl.rpc.create_session(0, 2).unwrap();
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    cl.rpc.enqueue_request(0, busy, 4, b"x", 1).unwrap();
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    // Well past the idle bound, within which the idle session's pings kept it from failing.
    advance(&mut cl, &mut sv, 100 * MS, 5 * MS);
    assert_eq!(sv.rpc.num_sessions(), 2, "reclaimed before the bound");
    advance(&mut cl, &mut sv, 400 * MS, 5 * MS);
    let st = sv.rpc.stats();
    assert_eq!(st.server_sessions_idle_reclaimed, 1);
    assert_eq!(st.server_sessions_reaped, 0, "pings kept both alive");
    assert_eq!(sv.rpc.num_sessions(), 1);
    let mut events = Vec::new();
    while let Some(e) = cl.rpc.poll_event() {
        events.push(e);
    }
    assert!(
        events.contains(&Event::SessionFailed {
            session: idle,
            error: SessionError::SessionLost
        }),
        "{events:?}"
    );
    assert!(cl.rpc.is_connected(busy));
    assert!(!cl.rpc.is_connected(idle));
    sv.rpc.check_invariants();
}

/// A connect flood from one source (64 connect requests with distinct connect tokens, the
/// public fingerprint and settings) takes at most the per-source share of the server's
/// sessions (default: half of what its receive ring admits), and a second client connects
/// and is served. Before issue 14 the flood took every session and the second client was
/// refused (`NoRingEntries`).
#[test]
fn connect_flood_from_one_source_leaves_others_served() {
    let cfg = Config {
        rx_ring_entries: Some(16 * 8),
        ..Config::default()
    };
    assert_eq!(cfg.session_capacity(), 16);
    assert_eq!(cfg.source_session_limit(), 8);
    let mut sv = Node::new(2, cfg.clone());
    let mut attacker = Node::new(99, Config::default());
    let mut buf = vec![0u8; 4096];
    for _ in 0..64 {
        attacker.rpc.create_session(0, 2).unwrap();
    }
    while let Some((dest, len)) = attacker.rpc.poll_transmit(&mut buf) {
        assert_eq!(dest, 2);
        sv.rpc.handle_datagram(0, 99, &buf[..len]);
    }
    assert_eq!(sv.rpc.num_sessions(), 8);
    assert_eq!(sv.rpc.stats().connects_refused_source_limit, 56);
    // The flooder's connects are answered: 8 accepted, 56 refused with the limit.
    while let Some((_, len)) = sv.rpc.poll_transmit(&mut buf) {
        attacker.rpc.handle_datagram(0, 2, &buf[..len]);
    }
    let refused = std::iter::from_fn(|| attacker.rpc.poll_event())
        .filter(|e| {
            matches!(
                e,
                Event::SessionFailed {
                    error: SessionError::SourceLimit { limit: 8 },
                    ..
                }
            )
        })
        .count();
    assert_eq!(refused, 56);
    // Another client connects and is served.
    let mut cl = Node::new(1, cfg);
    let sid = cl.rpc.create_session(0, 2).unwrap();
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    assert_eq!(cl.rpc.poll_event(), Some(Event::SessionConnected(sid)));
    cl.rpc.enqueue_request(0, sid, 4, b"hello", 1).unwrap();
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    assert!(matches!(
        cl.rpc.poll_event(),
        Some(Event::Response { tag: 1, .. })
    ));
    // The per-source counts: one entry per source holding sessions.
    assert_eq!(sv.rpc.src_sessions.len(), 2);
    assert_eq!(sv.rpc.src_sessions[&99], 8);
    sv.rpc.check_invariants();
}

/// Session-management requests beyond a source's burst are dropped unanswered and counted;
/// the budget refills at the configured rate (virtual time), and another source is not
/// affected. State stays in the fixed table however many sources send.
#[test]
fn sm_requests_are_rate_limited_per_source() {
    let cfg = Config {
        sm_rate_per_source: 100,
        sm_burst_per_source: 10,
        failure_timeout: 1_000 * MS,
        ..Config::default()
    };
    let mut sv = Node::new(2, cfg.clone());
    let mut buf = vec![0u8; 4096];
    let t0 = 1_000 * MS;
    let ping = sm(SmKind::Ping, 5, 0, 0, SmStatus::Ok);
    for _ in 0..1000 {
        sv.rpc.handle_datagram(t0, 99, &ping);
    }
    let mut answers = 0;
    while sv.rpc.poll_transmit(&mut buf).is_some() {
        answers += 1;
    }
    assert_eq!(answers, 10, "burst");
    assert_eq!(sv.rpc.stats().drop_sm_rate_limited, 990);
    // 100 ms later: 10 more (one per 10 ms).
    for _ in 0..1000 {
        sv.rpc.handle_datagram(t0 + 100 * MS, 99, &ping);
    }
    let mut answers = 0;
    while sv.rpc.poll_transmit(&mut buf).is_some() {
        answers += 1;
    }
    assert_eq!(answers, 10, "rate");
    // Another source connects meanwhile. (Should its table entry be the flooder's, it shares
    // that bucket and gets through once the flooder's budget refills: the connect request is
    // re-sent every `sm_rto`.)
    let mut cl = Node::new(1, cfg);
    cl.now = t0 + 100 * MS;
    sv.now = cl.now;
    let sid = cl.rpc.create_session(cl.now, 2).unwrap();
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    advance(&mut cl, &mut sv, t0 + 400 * MS, MS);
    assert_eq!(cl.rpc.poll_event(), Some(Event::SessionConnected(sid)));
    // 100 000 spoofed sources: the table does not grow, and the per-source session map has
    // one entry per source that holds a session.
    for src in 1000..101_000u32 {
        sv.rpc.handle_datagram(t0 + 500 * MS, src, &ping);
        while sv.rpc.poll_transmit(&mut buf).is_some() {}
    }
    assert_eq!(sv.rpc.sm_limiter.entries(), 4096);
    assert_eq!(sv.rpc.src_sessions.len(), 1);
    sv.rpc.check_invariants();
}

/// Per-source settings are validated.
#[test]
fn source_limits_validated() {
    let bad = |f: fn(&mut Config)| {
        let mut c = Config::default();
        f(&mut c);
        Rpc::<u32>::new(c).err()
    };
    assert_eq!(
        bad(|c| c.max_sessions_per_source = Some(0)),
        Some(ConfigError::BadSourceLimit("max_sessions_per_source"))
    );
    assert!(bad(|c| c.sm_rate_per_source = 0).is_some());
    assert!(bad(|c| c.sm_burst_per_source = 0).is_some());
    assert!(bad(|c| c.sm_rate_table_entries = 0).is_some());
    assert!(bad(|c| c.idle_session_timeout = 0).is_some());
    // The default share: half the capacity, at least one.
    let c = Config {
        rx_ring_entries: Some(8),
        ..Config::default()
    };
    assert_eq!(c.source_session_limit(), 1);
    assert_eq!(Config::default().source_session_limit(), 2048);
}

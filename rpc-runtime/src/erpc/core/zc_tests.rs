//! Zero-copy single-packet dispatch (`handle_datagram_zc`, seeds/002 §7.2), `reply_with`,
//! and the buffer free list (`recycle`).

use super::sim_tests::{Node, connect_pair, payload};
use super::*;

/// The client's next datagram (there must be one).
fn tx(n: &mut Node) -> Vec<u8> {
    let mut buf = vec![0u8; 65536];
    let (_, len) = n.rpc.poll_transmit(&mut buf).expect("a datagram to send");
    buf[..len].to_vec()
}

/// A single-packet request and its response are handed out in place exactly once; a
/// duplicate of the request while the handler runs is dropped, one after the reply is
/// answered from the cached response and not dispatched again.
#[test]
fn zc_request_and_response_delivered_once() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    cl.rpc.enqueue_request(0, sid, 4, b"ping", 1).unwrap();
    let req = tx(&mut cl);

    let zc = sv
        .rpc
        .handle_datagram_zc(0, 1, &req)
        .expect("zero-copy request");
    let Zc::Request {
        token, req_type, ..
    } = zc
    else {
        panic!("{zc:?}")
    };
    assert_eq!(req_type, 4);
    assert_eq!(zc.range(), PKTHDR_SIZE..PKTHDR_SIZE + 4);
    assert_eq!(&req[zc.range()], b"ping");
    assert_eq!(token.session().num(), 0);
    assert!(sv.rpc.poll_event().is_none(), "not copied into an event");
    assert_eq!(sv.rpc.stats().requests_dispatched, 1);

    // Duplicate while the handler runs: dropped, nothing dispatched, nothing sent (I4).
    assert_eq!(sv.rpc.handle_datagram_zc(0, 1, &req), None);
    assert_eq!(sv.rpc.stats().drop_out_of_window, 1);
    assert!(sv.rpc.poll_event().is_none());
    assert!(sv.rpc.poll_transmit(&mut [0; 4096]).is_none());

    sv.rpc
        .reply_with(0, token, 4, |b| {
            assert_eq!(b.len(), 4);
            b.copy_from_slice(b"pong");
            4
        })
        .unwrap();
    assert_eq!(
        sv.rpc
            .reply_with(0, token, 4, |_| panic!("not called for a stale token")),
        Err(ErpcCallError::StaleToken)
    );
    let resp = tx(&mut sv);

    // Duplicate after the reply: the cached response, not a second dispatch.
    assert_eq!(sv.rpc.handle_datagram_zc(0, 1, &req), None);
    assert_eq!(tx(&mut sv), resp);
    assert_eq!(sv.rpc.stats().dup_req_answered, 1);
    assert_eq!(sv.rpc.stats().requests_dispatched, 1);
    assert!(sv.rpc.poll_event().is_none());

    let zc = cl
        .rpc
        .handle_datagram_zc(0, 2, &resp)
        .expect("zero-copy response");
    assert!(matches!(zc, Zc::Response { session, tag: 1, .. } if session == sid));
    assert_eq!(&resp[zc.range()], b"pong");
    assert!(cl.rpc.poll_event().is_none(), "not copied into an event");
    // Duplicate response: dropped.
    assert_eq!(cl.rpc.handle_datagram_zc(0, 2, &resp), None);
    assert!(cl.rpc.poll_event().is_none());
    cl.rpc.check_invariants();

    // The slot is free again: the next request on it works.
    for k in 0..SLOTS_PER_SESSION as u64 {
        cl.rpc.enqueue_request(0, sid, 4, b"n", 10 + k).unwrap();
    }
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    let mut tags = Vec::new();
    while let Some(ev) = cl.rpc.poll_event() {
        match ev {
            Event::Response { tag, data, .. } => {
                assert_eq!(data, b"n");
                tags.push(tag);
            }
            e => panic!("{e:?}"),
        }
    }
    tags.sort_unstable();
    assert_eq!(
        tags,
        (10..10 + SLOTS_PER_SESSION as u64).collect::<Vec<_>>()
    );
}

/// Runs a client/server pair to quiescence with the zero-copy API on both sides: zero-copy
/// requests are echoed with `reply_with`, multi-packet requests (events) with `reply`.
/// Returns (tag, data, zero_copy) of every completed RPC.
fn run_zc(cl: &mut Node, sv: &mut Node) -> Vec<(u64, Vec<u8>, bool)> {
    let mut done = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        let mut moved = false;
        while let Some((_, len)) = cl.rpc.poll_transmit(&mut buf) {
            moved = true;
            let pkt = &buf[..len];
            if let Some(zc) = sv.rpc.handle_datagram_zc(sv.now, cl.addr, pkt) {
                let Zc::Request { token, .. } = zc else {
                    panic!("{zc:?}")
                };
                let data = &pkt[zc.range()];
                sv.rpc
                    .reply_with(sv.now, token, data.len(), |b| {
                        b.copy_from_slice(data);
                        data.len()
                    })
                    .unwrap();
            }
        }
        while let Some(ev) = sv.rpc.poll_event() {
            moved = true;
            let Event::Request { token, data, .. } = ev else {
                panic!("{ev:?}")
            };
            sv.rpc.reply(sv.now, token, &data).unwrap();
            sv.rpc.recycle(data);
        }
        while let Some((_, len)) = sv.rpc.poll_transmit(&mut buf) {
            moved = true;
            let pkt = &buf[..len];
            if let Some(zc) = cl.rpc.handle_datagram_zc(cl.now, sv.addr, pkt) {
                let Zc::Response { tag, .. } = zc else {
                    panic!("{zc:?}")
                };
                done.push((tag, pkt[zc.range()].to_vec(), true));
            }
        }
        while let Some(ev) = cl.rpc.poll_event() {
            moved = true;
            let Event::Response { tag, data, .. } = ev else {
                panic!("{ev:?}")
            };
            done.push((tag, data.to_vec(), false));
            cl.rpc.recycle(data);
        }
        cl.rpc.check_invariants();
        if !moved {
            return done;
        }
    }
}

/// Mixed sizes, more RPCs than slots: single-packet messages take the zero-copy path,
/// multi-packet ones arrive as events; every RPC completes once with the right data.
#[test]
fn zc_and_event_paths_mixed() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let dpp = cl.rpc.data_per_pkt();
    let sizes = [
        0,
        1,
        100,
        dpp,
        dpp + 1,
        3 * dpp,
        5,
        dpp - 1,
        2 * dpp + 7,
        64,
    ];
    let n = 40u64;
    for tag in 0..n {
        let len = sizes[tag as usize % sizes.len()];
        cl.rpc
            .enqueue_request(0, sid, 1, &payload(tag + 1000, len), tag)
            .unwrap();
    }
    let mut done = run_zc(&mut cl, &mut sv);
    done.sort_by_key(|d| d.0);
    assert_eq!(done.len(), n as usize);
    for (tag, data, zc) in &done {
        let len = sizes[*tag as usize % sizes.len()];
        assert_eq!(*data, payload(tag + 1000, len), "tag {tag}");
        assert_eq!(
            *zc,
            len <= dpp,
            "tag {tag} of {len} bytes: zero-copy iff one packet"
        );
    }
    assert_eq!(sv.rpc.stats().requests_dispatched, n);
    assert_eq!(sv.rpc.stats().dup_req_answered, 0);
}

/// `reply_with` that writes more than `max_msg_size` is refused and leaves the request
/// pending; a proper reply then succeeds.
#[test]
fn reply_with_too_large_keeps_request_pending() {
    let cfg = Config {
        max_msg_size: 1000,
        ..Config::default()
    };
    let mut cl = Node::new(1, cfg.clone());
    let mut sv = Node::new(2, cfg);
    let sid = cl.rpc.create_session(0, 2).unwrap();
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    assert_eq!(cl.rpc.poll_event(), Some(Event::SessionConnected(sid)));
    cl.rpc.enqueue_request(0, sid, 1, b"q", 7).unwrap();
    let req = tx(&mut cl);
    let Some(Zc::Request { token, .. }) = sv.rpc.handle_datagram_zc(0, 1, &req) else {
        panic!()
    };
    assert_eq!(
        sv.rpc
            .reply_with(0, token, 1001, |_| panic!("max_len above max_msg_size")),
        Err(ErpcCallError::TooLarge(1001))
    );
    assert_eq!(
        sv.rpc.reply_with(0, token, 10, |_| 11),
        Err(ErpcCallError::TooLarge(11)),
        "fill wrote more than it was given"
    );
    assert_eq!(
        sv.rpc.reply(0, token, &[0; 1001]),
        Err(ErpcCallError::TooLarge(1001))
    );
    assert!(sv.rpc.poll_transmit(&mut [0; 4096]).is_none());
    sv.rpc
        .reply_with(0, token, 1000, |b| {
            b.fill(3);
            1000
        })
        .unwrap();
    let resp = tx(&mut sv);
    cl.rpc.handle_datagram(0, 2, &resp);
    match cl.rpc.poll_event() {
        Some(Event::Response { tag: 7, data, .. }) => assert_eq!(data, vec![3; 1000]),
        e => panic!("{e:?}"),
    }
}

/// The copying path takes event buffers from the free list: a recycled buffer comes back in
/// the next event.
#[test]
fn recycled_buffers_are_reused() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let mut prev: Option<*const u8> = None;
    for k in 0..5u64 {
        cl.rpc.enqueue_request(0, sid, 1, b"abc", k).unwrap();
        let req = tx(&mut cl);
        sv.rpc.handle_datagram(0, 1, &req);
        let Some(Event::Request { token, data, .. }) = sv.rpc.poll_event() else {
            panic!()
        };
        assert_eq!(data, b"abc");
        if let Some(p) = prev {
            assert_eq!(data.as_ptr(), p, "request {k} reuses the recycled buffer");
        }
        prev = Some(data.as_ptr());
        sv.rpc.reply(0, token, &data).unwrap();
        sv.rpc.recycle(data);
        let resp = tx(&mut sv);
        cl.rpc.handle_datagram(0, 2, &resp);
        let Some(Event::Response { data, .. }) = cl.rpc.poll_event() else {
            panic!()
        };
        assert_eq!(data, b"abc");
        cl.rpc.recycle(data);
    }
}

//! The message-buffer data path (issue 15; seeds/000 §3, §8.2): packets sent in place from
//! slot buffers, multi-packet messages reassembled into buffers, and what a lying or broken
//! peer gets (a counter, never a write out of place).

use super::sim_tests::{Node, connect_pair, payload};
use super::*;

/// All datagrams `n` has to send, copied out.
fn drain(n: &mut Node) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 65536];
    let mut out = Vec::new();
    while let Some((_, len)) = n.rpc.poll_transmit(&mut buf) {
        out.push(buf[..len].to_vec());
    }
    out
}

/// `pkt` with its header rewritten by `f` (token kept).
fn forge(pkt: &[u8], f: impl FnOnce(&mut (u32, u16))) -> Vec<u8> {
    let h = PktHdr::decode(pkt).unwrap();
    let mut v = (h.msg_size(), h.pkt_num());
    f(&mut v);
    let hdr = PktHdr::new(
        h.req_type(),
        v.0,
        h.dest_session_num(),
        h.pkt_type(),
        v.1,
        h.req_num(),
    )
    .unwrap()
    .with_token(h.token())
    .encode();
    let mut out = hdr.to_vec();
    out.extend_from_slice(&pkt[PKTHDR_SIZE..]);
    out
}

/// A 3-packet request: a header lying about the message size, a packet index past the
/// message, a payload of the wrong length and an out-of-order packet are each dropped and
/// counted; duplicates are answered (credit return) and not written twice; the request
/// that arrives is exactly what was sent.
#[test]
fn multi_packet_request_bad_input_is_counted_never_written() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let dpp = cl.rpc.data_per_pkt();
    let data = payload(9, 2 * dpp + 100);
    cl.rpc.enqueue_request(0, sid, 3, &data, 1).unwrap();
    let pkts = drain(&mut cl);
    assert_eq!(pkts.len(), 3);
    sv.rpc.handle_datagram(0, 1, &pkts[0]);
    let st0 = sv.rpc.stats().clone();
    assert_eq!(drain(&mut sv).len(), 1, "credit return for packet 0");

    // msg_size lying (one byte more, still 3 packets): the packet is refused.
    let lie = forge(&pkts[1], |v| v.0 += 1);
    sv.rpc.handle_datagram(0, 1, &lie);
    assert_eq!(sv.rpc.stats().drop_bad_len, st0.drop_bad_len + 1);
    // msg_size lying big (more packets than the message has).
    let lie = forge(&pkts[1], |v| v.0 = (5 * dpp) as u32);
    sv.rpc.handle_datagram(0, 1, &lie);
    assert_eq!(sv.rpc.stats().drop_bad_len, st0.drop_bad_len + 2);
    // A packet index past the message.
    let past = forge(&pkts[2], |v| v.1 = 3);
    sv.rpc.handle_datagram(0, 1, &past);
    assert_eq!(sv.rpc.stats().drop_bad_len, st0.drop_bad_len + 3);
    // Payload of the wrong length for its packet (truncated).
    sv.rpc.handle_datagram(0, 1, &pkts[1][..pkts[1].len() - 1]);
    assert_eq!(sv.rpc.stats().drop_bad_len, st0.drop_bad_len + 4);
    // Out of order: packet 2 before packet 1.
    sv.rpc.handle_datagram(0, 1, &pkts[2]);
    assert_eq!(
        sv.rpc.stats().drop_out_of_window,
        st0.drop_out_of_window + 1
    );
    assert!(drain(&mut sv).is_empty(), "nothing answers bad packets");
    // Duplicate of packet 0: answered from state, not written again.
    sv.rpc.handle_datagram(0, 1, &pkts[0]);
    assert_eq!(sv.rpc.stats().dup_req_answered, st0.dup_req_answered + 1);
    assert_eq!(drain(&mut sv).len(), 1);
    sv.rpc.handle_datagram(0, 1, &pkts[1]);
    sv.rpc.handle_datagram(0, 1, &pkts[1]);
    assert_eq!(sv.rpc.stats().dup_req_answered, st0.dup_req_answered + 2);
    sv.rpc.handle_datagram(0, 1, &pkts[2]);
    let Some(Event::Request {
        token,
        req_type: 3,
        data: got,
    }) = sv.rpc.poll_event()
    else {
        panic!("request expected")
    };
    assert_eq!(got, data);
    assert_eq!(sv.rpc.stats().requests_dispatched, 1);
    // Late duplicate of the last packet while the handler runs: dropped.
    sv.rpc.handle_datagram(0, 1, &pkts[2]);
    assert!(sv.rpc.poll_event().is_none());
    sv.rpc.recycle(got);
    sv.rpc.reply(0, token, b"ok").unwrap();
    sv.rpc.check_invariants();
}

/// A 3-packet response: response packets lying about the size or of the wrong length are
/// dropped and counted; the response delivered is exactly the reply.
#[test]
fn multi_packet_response_bad_input_is_counted_never_written() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let dpp = cl.rpc.data_per_pkt();
    let resp = payload(4, 2 * dpp + 7);
    cl.rpc.enqueue_request(0, sid, 1, b"q", 5).unwrap();
    for p in drain(&mut cl) {
        sv.rpc.handle_datagram(0, 1, &p);
    }
    let Some(Event::Request { token, .. }) = sv.rpc.poll_event() else {
        panic!()
    };
    sv.rpc.reply(0, token, &resp).unwrap();
    let r0 = drain(&mut sv);
    assert_eq!(r0.len(), 1, "response packet 0 only, the rest on request");
    cl.rpc.handle_datagram(0, 2, &r0[0]);
    let rfrs = drain(&mut cl);
    assert_eq!(rfrs.len(), 2, "two RFRs");
    for p in &rfrs {
        sv.rpc.handle_datagram(0, 1, p);
    }
    let rest = drain(&mut sv);
    assert_eq!(rest.len(), 2);
    let st0 = cl.rpc.stats().clone();
    // Response packet 1 claiming another size.
    cl.rpc.handle_datagram(0, 2, &forge(&rest[0], |v| v.0 -= 1));
    assert_eq!(cl.rpc.stats().drop_bad_len, st0.drop_bad_len + 1);
    // Truncated.
    cl.rpc.handle_datagram(0, 2, &rest[0][..rest[0].len() - 3]);
    assert_eq!(cl.rpc.stats().drop_bad_len, st0.drop_bad_len + 2);
    // Packet number past the response.
    cl.rpc.handle_datagram(0, 2, &forge(&rest[1], |v| v.1 += 1));
    assert_eq!(
        cl.rpc.stats().drop_out_of_window,
        st0.drop_out_of_window + 1
    );
    cl.rpc.handle_datagram(0, 2, &rest[0]);
    // Duplicate of an accepted packet: dropped.
    cl.rpc.handle_datagram(0, 2, &rest[0]);
    assert_eq!(
        cl.rpc.stats().drop_out_of_window,
        st0.drop_out_of_window + 2
    );
    cl.rpc.handle_datagram(0, 2, &rest[1]);
    match cl.rpc.poll_event() {
        Some(Event::Response { tag: 5, data, .. }) => assert_eq!(data, resp),
        e => panic!("{e:?}"),
    }
    cl.rpc.check_invariants();
}

/// Request and response packets go out in place: `poll_transmit_gather` names them,
/// `msg_pkt` gives a 16-byte header and the data slice, the same bytes the copying
/// `poll_transmit` produces; once the call is over the packets are gone (`None`). Packets
/// of at most `RENDER_MAX` bytes are copied into the caller's buffer instead.
#[test]
fn gather_lists_come_from_the_slot_buffers() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let dpp = cl.rpc.data_per_pkt();
    // The last packet carries RENDER_MAX - 15 data bytes: just above the copy limit.
    let data = payload(1, dpp + RENDER_MAX - 15);
    cl.rpc.enqueue_request(0, sid, 1, &data, 9).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut msgs = Vec::new();
    while let Some(out) = cl.rpc.poll_transmit_gather(0, &mut buf) {
        let TxOut::Msg { dest, pkt } = out else {
            panic!("{out:?}")
        };
        assert_eq!(dest, 2);
        msgs.push(pkt);
    }
    assert_eq!(msgs.len(), 2);
    let (h0, d0) = cl.rpc.msg_pkt(&msgs[0]).unwrap();
    let (h1, d1) = cl.rpc.msg_pkt(&msgs[1]).unwrap();
    assert_eq!((h0.len(), h1.len()), (PKTHDR_SIZE, PKTHDR_SIZE));
    assert_eq!([d0, d1].concat(), data);
    // Packet 0's header and data are adjacent in the buffer (seeds/000 §3).
    assert_eq!(h0.as_ptr().wrapping_add(PKTHDR_SIZE), d0.as_ptr());
    assert_eq!(PktHdr::decode(h1).unwrap().pkt_num(), 1);
    for m in &msgs {
        let (h, d) = cl.rpc.msg_pkt(m).unwrap();
        sv.rpc.handle_datagram(0, 1, &[h, d].concat());
    }
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    assert!(matches!(
        cl.rpc.poll_event(),
        Some(Event::Response { tag: 9, .. })
    ));
    assert!(
        msgs.iter().all(|m| cl.rpc.msg_pkt(m).is_none()),
        "packets of a finished call are not sent"
    );
    // A request whose last packet is RENDER_MAX bytes: that one is rendered, by copy.
    let data = payload(2, dpp + RENDER_MAX - PKTHDR_SIZE);
    cl.rpc.enqueue_request(0, sid, 1, &data, 10).unwrap();
    let mut kinds = Vec::new();
    let mut wire = Vec::new();
    while let Some(out) = cl.rpc.poll_transmit_gather(0, &mut buf) {
        match out {
            TxOut::Msg { pkt, .. } => {
                kinds.push("msg");
                let (h, d) = cl.rpc.msg_pkt(&pkt).unwrap();
                wire.push([h, d].concat());
            }
            TxOut::Rendered { len, .. } => {
                kinds.push("copy");
                assert_eq!(len, RENDER_MAX);
                wire.push(buf[..len].to_vec());
            }
        }
    }
    assert_eq!(kinds, ["msg", "copy"]);
    for p in &wire {
        sv.rpc.handle_datagram(0, 1, p);
    }
    let Some(Event::Request { data: got, .. }) = sv.rpc.poll_event() else {
        panic!("request")
    };
    assert_eq!(got, data);
}

/// `enqueue_request_with` writes in place: the slot keeps its buffer across calls, a
/// backlogged request's buffer becomes the slot's, and a `fill` that overruns `max_len`,
/// a `max_len` above `max_msg_size` or a failed mapping queue nothing.
#[test]
fn enqueue_in_place_and_its_errors() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let max = cl.rpc.config().max_msg_size;
    assert_eq!(
        cl.rpc
            .enqueue_request_with(0, sid, 1, 0, max + 1, |_| panic!("not called")),
        Err(ErpcCallError::TooLarge(max + 1))
    );
    assert_eq!(
        cl.rpc.enqueue_request_with(0, sid, 1, 0, 10, |_| 11),
        Err(ErpcCallError::TooLarge(11))
    );
    // The slot's buffer (one packet's worth, from the call above) is too small for this.
    cl.rpc.pool.fail_next_alloc = true;
    assert_eq!(
        cl.rpc
            .enqueue_request_with(0, sid, 1, 0, 3 * cl.rpc.data_per_pkt(), |_| 1),
        Err(ErpcCallError::NoBuffer)
    );
    assert!(drain(&mut cl).is_empty(), "nothing queued");
    // Ten calls at once: 8 in slots, 2 in the backlog, all written in place.
    for tag in 0..10u64 {
        cl.rpc
            .enqueue_request_with(0, sid, 1, tag, 100, |b| {
                b[..8].copy_from_slice(&tag.to_le_bytes());
                8
            })
            .unwrap();
    }
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    let mut seen = 0;
    while let Some(ev) = cl.rpc.poll_event() {
        let Event::Response { tag, data, .. } = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(data, tag.to_le_bytes());
        cl.rpc.recycle(data);
        seen += 1;
    }
    assert_eq!(seen, 10);
    // Once warm, more rounds map no new buffers on either side.
    let mut mapped = cl.rpc.stats().msgbufs_allocated + sv.rpc.stats().msgbufs_allocated;
    for round in 0..5u64 {
        for tag in 0..10u64 {
            cl.rpc
                .enqueue_request_with(0, sid, 1, tag, 100, |b| {
                    b[..8].copy_from_slice(&(round * 100 + tag).to_le_bytes());
                    8
                })
                .unwrap();
        }
        Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
        while let Some(ev) = cl.rpc.poll_event() {
            let Event::Response { tag, data, .. } = ev else {
                panic!("{ev:?}")
            };
            assert_eq!(data, (round * 100 + tag).to_le_bytes());
            cl.rpc.recycle(data);
        }
        let now = cl.rpc.stats().msgbufs_allocated + sv.rpc.stats().msgbufs_allocated;
        if round == 0 {
            // The free lists fill up to the most buffers out at once in this pattern.
            mapped = now;
        }
        assert_eq!(now, mapped, "round {round} mapped new message buffers");
    }
    cl.rpc.check_invariants();
}

/// The copying receive path cannot map a buffer for a single-packet response: the datagram
/// is dropped before it is processed (`drop_no_buffer`), the call stays in flight, and the
/// response's retransmission completes it.
#[test]
fn copying_path_without_buffer_drops_before_processing() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    cl.rpc.enqueue_request(0, sid, 1, b"q", 4).unwrap();
    for p in drain(&mut cl) {
        sv.rpc.handle_datagram(0, 1, &p);
    }
    let Some(Event::Request { token, .. }) = sv.rpc.poll_event() else {
        panic!()
    };
    sv.rpc.reply(0, token, b"answer").unwrap();
    let resp = drain(&mut sv);
    // Empty the client's one-packet free list, then refuse the next mapping.
    cl.rpc.pool.clear_small();
    cl.rpc.pool.fail_next_alloc = true;
    let st0 = cl.rpc.stats().clone();
    cl.rpc.handle_datagram(0, 2, &resp[0]);
    assert_eq!(cl.rpc.stats().drop_no_buffer, st0.drop_no_buffer + 1);
    assert!(cl.rpc.poll_event().is_none());
    // Still in flight: the same response is accepted now (a finished call would count it
    // out of window).
    cl.rpc.handle_datagram(0, 2, &resp[0]);
    assert_eq!(cl.rpc.stats().drop_out_of_window, st0.drop_out_of_window);
    match cl.rpc.poll_event() {
        Some(Event::Response { tag: 4, data, .. }) => assert_eq!(data, b"answer"),
        e => panic!("{e:?}"),
    }
}

/// A reassembly or response buffer that cannot be mapped: the first packet of a
/// multi-packet request is dropped and counted (`drop_no_buffer`) with no state change, and
/// its retransmission is accepted; `reply_with` fails with `NoBuffer` and the request stays
/// pending.
#[test]
fn failed_buffer_mapping_is_counted_and_recoverable() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let dpp = cl.rpc.data_per_pkt();
    let data = payload(2, 2 * dpp);
    cl.rpc.enqueue_request(0, sid, 1, &data, 3).unwrap();
    let pkts = drain(&mut cl);
    sv.rpc.pool.fail_next_alloc = true;
    sv.rpc.handle_datagram(0, 1, &pkts[0]);
    assert_eq!(sv.rpc.stats().drop_no_buffer, 1);
    assert!(drain(&mut sv).is_empty(), "dropped as if lost");
    for p in &pkts {
        sv.rpc.handle_datagram(0, 1, p);
    }
    let Some(Event::Request {
        token, data: got, ..
    }) = sv.rpc.poll_event()
    else {
        panic!("request after the retransmission")
    };
    assert_eq!(got, data);
    // A reply larger than anything pooled needs a new buffer: refuse the mapping once.
    sv.rpc.pool.fail_next_alloc = true;
    assert_eq!(
        sv.rpc
            .reply_with(0, token, 3 * dpp, |_| panic!("not called")),
        Err(ErpcCallError::NoBuffer)
    );
    sv.rpc.reply(0, token, b"done").unwrap();
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    match cl.rpc.poll_event() {
        Some(Event::Response { tag: 3, data, .. }) => assert_eq!(data, b"done"),
        e => panic!("{e:?}"),
    }
}

/// A transport that sends in place pins the slot's request buffer (here: a clone of its
/// handle held by the test) past the end of the call: the next call on the slot writes into
/// another buffer, counted, so the pinned packets keep their bytes; unpinned, the buffers are
/// reused again.
#[test]
fn buffers_in_flight_are_not_rewritten() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let dpp = cl.rpc.data_per_pkt();
    let first = payload(1, dpp + 1000);
    cl.rpc.enqueue_request(0, sid, 1, &first, 1).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut msgs = Vec::new();
    while let Some(out) = cl.rpc.poll_transmit_gather(0, &mut buf) {
        let TxOut::Msg { pkt, .. } = out else {
            panic!("{out:?}")
        };
        msgs.push(pkt);
    }
    let (_, _, m) = cl.rpc.msg_pkt_in(&msgs[0]).unwrap();
    let pin = std::sync::Arc::clone(m.dma_handle());
    let wire: Vec<Vec<u8>> = msgs
        .iter()
        .map(|p| {
            let (h, d) = cl.rpc.msg_pkt(p).unwrap();
            [h, d].concat()
        })
        .collect();
    for p in &wire {
        sv.rpc.handle_datagram(0, 1, p);
    }
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    assert!(matches!(
        cl.rpc.poll_event(),
        Some(Event::Response { tag: 1, .. })
    ));
    assert_eq!(cl.rpc.stats().msgbufs_in_flight_skipped, 0);

    // The next call would reuse the slot's buffer: it is pinned, so another one is taken.
    let second = payload(2, dpp + 1000);
    cl.rpc.enqueue_request(0, sid, 1, &second, 2).unwrap();
    assert_eq!(cl.rpc.stats().msgbufs_in_flight_skipped, 1);
    let Some(TxOut::Msg { pkt, .. }) = cl.rpc.poll_transmit_gather(0, &mut buf) else {
        panic!("a packet sent in place")
    };
    let (h, d, m2) = cl.rpc.msg_pkt_in(&pkt).unwrap();
    assert!(!std::sync::Arc::ptr_eq(m2.dma_handle(), &pin));
    assert_eq!(d, &second[..d.len()]);
    let pkt0 = [h, d].concat();
    sv.rpc.handle_datagram(0, 1, &pkt0);
    // SAFETY: the mapping is alive (`pin`) and nothing writes it (that is the point).
    let pinned = unsafe { pin.as_slice() };
    assert_eq!(
        &pinned[..wire[0].len()],
        &wire[0][..],
        "the pinned packet kept its bytes"
    );
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    assert!(matches!(
        cl.rpc.poll_event(),
        Some(Event::Response { tag: 2, .. })
    ));

    // Unpinned: the calls that follow reuse buffers without skipping or mapping.
    drop(pin);
    let skipped = cl.rpc.stats().msgbufs_in_flight_skipped;
    let mapped = cl.rpc.stats().msgbufs_allocated;
    for tag in 3..10 {
        cl.rpc
            .enqueue_request(0, sid, 1, &payload(tag, dpp + 1000), tag)
            .unwrap();
        Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
        let Some(Event::Response { data, .. }) = cl.rpc.poll_event() else {
            panic!("response {tag}")
        };
        cl.rpc.recycle(data);
    }
    assert_eq!(cl.rpc.stats().msgbufs_in_flight_skipped, skipped);
    assert_eq!(cl.rpc.stats().msgbufs_allocated, mapped);
}

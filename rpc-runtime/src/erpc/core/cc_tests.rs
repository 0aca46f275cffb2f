//! Congestion control in the core: Timely fed by RTT samples, pacing through the timing
//! wheel, the Timely and wheel bypasses of uncongested sessions, and go-back-N with paced
//! packets (seeds/000 §6, §12.3, §12.7; seeds/002 §6.3, §9).

use std::collections::HashMap;

use super::sim_tests::{Node, Sim, connect_all, echo, payload};
use super::*;
use crate::erpc::timely::{MIN_RATE_BPS, Timely};

/// Drives Timely of client session `sid` down to the minimum rate with samples taken at
/// times `0..=190 µs` (so later samples, at `now >= 1 ms`, get full steps).
fn force_min_rate(rpc: &mut Rpc<u32>, sid: SessionId) {
    let link = rpc.cfg.link_bandwidth_bps as f64;
    let c = rpc.sessions[usize::from(sid.0)]
        .as_mut()
        .unwrap()
        .role
        .client_mut()
        .unwrap();
    c.timely = Timely::new(link);
    for i in 0..20 {
        c.timely.update(1e6, i * 10_000);
    }
    assert_eq!(c.timely.rate(), MIN_RATE_BPS);
}

/// Wire time in ns of a packet of `bytes` at the minimum rate (as the core rounds it).
fn min_rate_wire_ns(bytes: usize) -> Time {
    (bytes as f64 * 8.0 * 1e9 / MIN_RATE_BPS).ceil() as Time
}

/// A connected pair with configuration `cfg`, at time `now`.
fn pair(cfg: Config, now: Time) -> (Node, Node, SessionId) {
    let mut cl = Node::new(1, cfg.clone());
    let mut sv = Node::new(2, cfg);
    cl.now = now;
    sv.now = now;
    let sid = cl.rpc.create_session(now, 2).unwrap();
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    assert_eq!(cl.rpc.poll_event(), Some(Event::SessionConnected(sid)));
    (cl, sv, sid)
}

/// Runs a pair over an instant, lossless wire, advancing virtual time to the next timer
/// (paced packets included) whenever nothing moves, until `done(client events)` holds.
fn drive(cl: &mut Node, sv: &mut Node, mut done: impl FnMut(&[Event]) -> bool) {
    for _ in 0..100_000 {
        Node::run_reliable(cl, sv, |_, d| d.to_vec());
        while let Some(e) = cl.rpc.poll_event() {
            cl.events.push(e);
        }
        cl.rpc.check_invariants();
        if done(&cl.events) {
            return;
        }
        let t = [cl.rpc.next_timeout(), sv.rpc.next_timeout()]
            .into_iter()
            .flatten()
            .min()
            .expect("a timer");
        let t = t.max(cl.now);
        cl.now = t;
        sv.now = t;
        cl.rpc.handle_timeout(t);
        sv.rpc.handle_timeout(t);
    }
    panic!("not done");
}

/// A low-latency wire (RTT 20 µs < T_LOW): every sample takes the Timely bypass and every
/// packet the wheel bypass; the rate stays at the link rate.
#[test]
fn uncongested_session_bypasses_wheel() {
    let cfg = Config::default();
    let dpp = cfg.mtu - 16;
    let mut sim = Sim::new(2, cfg, 21, echo());
    let sid = connect_all(&mut sim, 0, 1, 1)[0];
    let sizes = [8, dpp, 3 * dpp + 1, 100];
    for tag in 0..40u64 {
        let now = sim.now;
        let len = sizes[tag as usize % sizes.len()];
        sim.nodes[0]
            .rpc
            .enqueue_request(now, sid, 1, &payload(tag, len), tag)
            .unwrap();
    }
    assert!(sim.run(sim.now + 10_000 * MS, |s| s.responses().len() == 40));
    let st = sim.nodes[0].rpc.stats().clone();
    // Request packets plus RFRs: 10 x (1 + 1 + 4 + 1) + 10 x 3 RFRs.
    let data_pkts = 10 * 7 + 10 * 3;
    assert_eq!(st.wheel_bypassed, data_pkts);
    assert_eq!(st.wheel_paced, 0);
    // Every answered packet is a sample except, in the ten 4-packet exchanges, the last
    // request packet, answered by response packet 0 after the handler ran (server time).
    assert_eq!(st.rtt_skipped_server_time, 10);
    assert_eq!(st.rtt_skipped_retransmit, 0);
    assert_eq!(
        st.rtt_samples,
        data_pkts - 10,
        "one sample per other answer"
    );
    assert_eq!(st.timely_bypassed, st.rtt_samples);
    assert_eq!(st.timely_updates, 0);
    assert!(sim.nodes[0].rpc.session_uncongested(sid).unwrap());
    assert_eq!(
        sim.nodes[0].rpc.session_rate_bps(sid),
        Some(25e9),
        "link rate"
    );
    assert_eq!(sim.nodes[0].rpc.wheel_len(), 0);
}

/// Issues `rounds` rounds of 8 three-packet echo RPCs on `sid`, each round run to
/// completion and checked; returns the lowest rate seen and whether the session ended
/// uncongested.
fn rounds(sim: &mut Sim, sid: SessionId, rounds: u64, tag0: u64, min_rate: &mut f64) {
    let dpp = sim.nodes[0].rpc.data_per_pkt();
    for r in 0..rounds {
        let mut want = HashMap::new();
        for k in 0..8 {
            let tag = tag0 + r * 8 + k;
            let p = payload(tag, 3 * dpp - 5);
            let now = sim.now;
            sim.nodes[0]
                .rpc
                .enqueue_request(now, sid, 1, &p, tag)
                .unwrap();
            want.insert(tag, p);
        }
        let ok = sim.run(sim.now + 100_000 * MS, |s| {
            let rate = s.nodes[0].rpc.session_rate_bps(sid).unwrap();
            *min_rate = min_rate.min(rate);
            s.count(0, |e| matches!(e, Event::Response { .. })) == 8
        });
        assert!(ok, "round {r} did not complete");
        for e in sim.nodes[0].events.drain(..) {
            let Event::Response { tag, data, .. } = e else {
                panic!("{e:?}")
            };
            assert_eq!(
                want.remove(&tag),
                Some(data.to_vec()),
                "tag {tag} once, right data"
            );
        }
    }
}

/// A 50 Mbit/s queueing bottleneck under a 1 Gbit/s link rate: RTTs grow, Timely cuts the
/// rate and packets get paced; once the bottleneck is gone, low RTTs raise the rate back to
/// the link rate (uncongested again, bypassing the wheel).
#[test]
fn timely_rate_drops_on_slow_link_and_recovers() {
    let cfg = Config {
        mtu: 1024,
        max_msg_size: 64 << 10,
        link_bandwidth_bps: 1_000_000_000,
        ..Config::default()
    };
    let link = cfg.link_bandwidth_bps as f64;
    let mut sim = Sim::new(2, cfg, 22, echo());
    let sid = connect_all(&mut sim, 0, 1, 1)[0];
    sim.nodes[0].events.clear();
    sim.bottleneck_bps = 50e6;
    let mut min_rate = f64::MAX;
    rounds(&mut sim, sid, 20, 0, &mut min_rate);
    let st = sim.nodes[0].rpc.stats().clone();
    eprintln!("congested: min rate {min_rate:.0} bit/s, {st:?}");
    assert!(min_rate < 0.2 * link, "rate fell: {min_rate}");
    assert!(st.timely_updates > 0);
    assert!(st.wheel_paced > 0);
    assert!(!sim.nodes[0].rpc.session_uncongested(sid).unwrap());

    // The bottleneck clears (its queue drains first).
    sim.bottleneck_bps = 0.0;
    let mut recovered_after = None;
    for r in 0..200 {
        let mut ignore = f64::MAX;
        rounds(&mut sim, sid, 1, 10_000 + r * 8, &mut ignore);
        if sim.nodes[0].rpc.session_uncongested(sid).unwrap() {
            recovered_after = Some(r + 1);
            break;
        }
    }
    let r = recovered_after.expect("rate back at the link rate");
    eprintln!("uncongested again after {r} rounds");
    assert_eq!(sim.nodes[0].rpc.session_rate_bps(sid), Some(link));
    // Uncongested now: the next round bypasses the wheel entirely.
    let paced = sim.nodes[0].rpc.stats().wheel_paced;
    let mut ignore = f64::MAX;
    rounds(&mut sim, sid, 1, 50_000, &mut ignore);
    assert_eq!(sim.nodes[0].rpc.stats().wheel_paced, paced);
    assert_eq!(sim.executions.len() as u64, (20 + r + 1) * 8);
    assert!(sim.executions.values().all(|&c| c == 1));
}

/// With both halves of congestion control off, the same bottleneck neither changes the
/// rate nor paces anything.
#[test]
fn cc_disabled_never_paces() {
    let cfg = Config {
        mtu: 1024,
        max_msg_size: 64 << 10,
        link_bandwidth_bps: 1_000_000_000,
        cc_rate_comp: false,
        cc_pacing: false,
        ..Config::default()
    };
    let mut sim = Sim::new(2, cfg, 23, echo());
    let sid = connect_all(&mut sim, 0, 1, 1)[0];
    sim.nodes[0].events.clear();
    sim.bottleneck_bps = 50e6;
    let mut min_rate = f64::MAX;
    rounds(&mut sim, sid, 5, 0, &mut min_rate);
    assert_eq!(min_rate, 1e9);
    let st = sim.nodes[0].rpc.stats();
    assert_eq!(
        (st.rtt_samples, st.wheel_paced, st.wheel_bypassed),
        (0, 0, 0)
    );
}

/// Paced packets leave exactly at their time, spaced by their wire time at the session's
/// rate, never earlier; `next_timeout` names the next one.
#[test]
fn paced_packets_not_released_early() {
    let t0 = MS;
    let (mut cl, mut sv, sid) = pair(Config::default(), t0);
    force_min_rate(&mut cl.rpc, sid);
    let sizes = [1000usize, 10, 4000, 0];
    for (tag, &len) in sizes.iter().enumerate() {
        cl.rpc
            .enqueue_request(t0, sid, 1, &payload(tag as u64, len), tag as u64)
            .unwrap();
    }
    assert_eq!(cl.rpc.stats().wheel_paced, 4);
    assert_eq!(cl.rpc.wheel_len(), 4);
    let mut buf = vec![0u8; 4096];
    let mut due = t0;
    for (k, &len) in sizes.iter().enumerate() {
        if k > 0 {
            // The bound may lag (it is lowered, not raised, as deadlines come and go); a
            // timer scan makes it exact.
            let t = cl.rpc.next_timeout().unwrap();
            assert!(t <= due);
            if t < due {
                cl.rpc.handle_timeout(t);
            }
            assert_eq!(
                cl.rpc.next_timeout(),
                Some(due),
                "next timeout is packet {k}"
            );
            assert!(
                cl.rpc.poll_transmit_at(due - 1, &mut buf).is_none(),
                "packet {k} not before {due}"
            );
        }
        let (_, n) = cl.rpc.poll_transmit_at(due, &mut buf).expect("due packet");
        assert_eq!(n, PKTHDR_SIZE + len, "packets leave in order");
        assert!(cl.rpc.poll_transmit_at(due, &mut buf).is_none());
        sv.rpc.handle_datagram(due, 1, &buf[..n]);
        due += min_rate_wire_ns(PKTHDR_SIZE + len);
    }
    assert_eq!(cl.rpc.wheel_len(), 0);
    cl.now = due;
    sv.now = due;
    drive(&mut cl, &mut sv, |ev| ev.len() == 4);
    // Single-packet exchanges: the response is each one's only sample, and is taken.
    assert_eq!(cl.rpc.stats().rtt_skipped_server_time, 0);
    assert_eq!(cl.rpc.stats().rtt_samples, 4);
    assert_eq!(cl.rpc.stats().wheel_bypassed, 0);
}

/// Karn's rule: a three-packet request whose packets are all lost once is re-sent after the
/// RTO; the answers to the re-sent copies (two CRs) give no RTT sample, and the response to
/// the last packet none either (handler time); the two RFRs for the echoed three-packet
/// response, sent once, are samples. The next exchange of the slot, without loss, samples
/// its two CRs and two RFR answers.
#[test]
fn answers_to_retransmitted_packets_give_no_rtt_sample() {
    let cfg = Config {
        rto: MS,
        ..Config::default()
    };
    let dpp = cfg.mtu - 16;
    let t0 = MS;
    let (mut cl, mut sv, sid) = pair(cfg, t0);
    let len = 2 * dpp + 1;
    cl.rpc
        .enqueue_request(t0, sid, 1, &payload(0, len), 0)
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let mut lost = 0;
    while cl.rpc.poll_transmit_at(t0, &mut buf).is_some() {
        lost += 1;
    }
    assert_eq!(lost, 3, "the three request packets, all lost");
    cl.rpc.handle_timeout(t0 + MS);
    assert_eq!(cl.rpc.stats().rollbacks, 1);
    cl.now = t0 + MS;
    sv.now = t0 + MS;
    drive(&mut cl, &mut sv, |ev| ev.len() == 1);
    let st = cl.rpc.stats().clone();
    assert_eq!(
        (
            st.rtt_samples,
            st.rtt_skipped_retransmit,
            st.rtt_skipped_server_time
        ),
        (2, 2, 1),
        "{st:?}"
    );
    let now = cl.now;
    cl.rpc
        .enqueue_request(now, sid, 1, &payload(1, len), 1)
        .unwrap();
    drive(&mut cl, &mut sv, |ev| ev.len() == 2);
    let st = cl.rpc.stats().clone();
    assert_eq!(
        (
            st.rtt_samples,
            st.rtt_skipped_retransmit,
            st.rtt_skipped_server_time
        ),
        (6, 2, 2),
        "{st:?}"
    );
}

/// Go-back-N while the session is paced: slot 0's packet is "lost" and rolled back; its
/// re-sent copy waits in the wheel behind the other slots' packets when the answer to the
/// original arrives. The RPC completes once, the queued copy is purged (I1) and never sent,
/// and all eight RPCs complete once.
#[test]
fn go_back_n_with_packets_in_wheel_completes_once() {
    let cfg = Config {
        rto: MS,
        ..Config::default()
    };
    let t0 = MS;
    let (mut cl, mut sv, sid) = pair(cfg, t0);
    force_min_rate(&mut cl.rpc, sid);
    let w = min_rate_wire_ns(PKTHDR_SIZE + 1000);
    for tag in 0..8u64 {
        cl.rpc
            .enqueue_request(t0, sid, 1, &payload(tag, 1000), tag)
            .unwrap();
    }
    let mut buf = vec![0u8; 4096];
    let (_, n) = cl.rpc.poll_transmit_at(t0, &mut buf).unwrap();
    let lost = buf[..n].to_vec(); // slot 0's request, held back
    assert!(cl.rpc.poll_transmit_at(t0, &mut buf).is_none());

    // Slot 0 times out at t0 + rto; the wheel then holds slots 2..7 (slot 1 became due)
    // and the session's next pacing time is t0 + 8w, where the re-sent copy goes.
    let t1 = t0 + MS;
    assert!(t1 < t0 + 2 * w);
    cl.rpc.handle_timeout(t1);
    cl.rpc.check_invariants();
    assert_eq!(cl.rpc.stats().rollbacks, 1);
    assert_eq!(cl.rpc.wheel_len(), 7, "slots 2..7 and slot 0's copy");
    let slot0 = |rpc: &Rpc<u32>| {
        rpc.sessions[usize::from(sid.0)]
            .as_ref()
            .unwrap()
            .role
            .client()
            .unwrap()
            .slots[0]
            .in_wheel
    };
    assert_eq!(slot0(&cl.rpc), 1);

    // The original arrives after all; its response completes slot 0.
    sv.rpc.handle_datagram(t1, 1, &lost);
    let Some(Event::Request { token, data, .. }) = sv.rpc.poll_event() else {
        panic!()
    };
    sv.rpc.reply(t1, token, &data).unwrap();
    let (_, n) = sv.rpc.poll_transmit_at(t1, &mut buf).unwrap();
    cl.rpc.handle_datagram(t1, 2, &buf[..n]);
    match cl.rpc.poll_event() {
        Some(Event::Response { tag: 0, data, .. }) => assert_eq!(data, payload(0, 1000)),
        e => panic!("{e:?}"),
    }
    assert_eq!(slot0(&cl.rpc), 0);
    assert_eq!(cl.rpc.stats().wheel_purged, 1);
    assert_eq!(cl.rpc.wheel_len(), 6);
    cl.rpc.check_invariants();

    cl.now = t1;
    sv.now = t1;
    drive(&mut cl, &mut sv, |ev| ev.len() == 7);
    let mut tags: Vec<u64> = cl
        .events
        .iter()
        .map(|e| match e {
            Event::Response { tag, data, .. } => {
                assert_eq!(*data, payload(*tag, 1000));
                *tag
            }
            e => panic!("{e:?}"),
        })
        .collect();
    tags.sort_unstable();
    assert_eq!(tags, (1..8).collect::<Vec<_>>());
    let st = sv.rpc.stats();
    assert_eq!(st.requests_dispatched, 8);
    assert_eq!(st.dup_req_answered, 0, "the purged copy never left");
    assert_eq!(cl.rpc.wheel_len(), 0);
}

/// Loss, duplication and reordering over a bottleneck that keeps sessions congested: go-back-N
/// and pacing interact, every RPC still completes exactly once.
#[test]
fn lossy_congested_exactly_once() {
    for seed in [31, 32] {
        let cfg = Config {
            mtu: 1024,
            link_bandwidth_bps: 1_000_000_000,
            max_msg_size: 32 << 10,
            ..Config::default()
        };
        let dpp = cfg.mtu - 16;
        let mut sim = Sim::new(3, cfg, seed, echo());
        let mut sids = Vec::new();
        for c in 1..3 {
            sids.push((c, connect_all(&mut sim, c, 0, 2)));
        }
        sim.bottleneck_bps = 100e6;
        sim.loss = 0.1;
        sim.dup = 0.05;
        sim.jitter = 20_000;
        let mut rng = super::sim_tests::Rng::new(seed);
        let mut expect = HashMap::new();
        let mut id = 0u64;
        for (c, ss) in &sids {
            for &sid in ss {
                for _ in 0..20 {
                    id += 1;
                    let len = match rng.below(3) {
                        0 => 8,
                        1 => dpp + 1,
                        _ => 8 + rng.below(6 * dpp as u64) as usize,
                    };
                    let p = payload(id, len);
                    let now = sim.now;
                    sim.nodes[*c]
                        .rpc
                        .enqueue_request(now, sid, 2, &p, id)
                        .unwrap();
                    expect.insert((*c, id), p);
                }
            }
        }
        let total = expect.len();
        assert!(sim.run(sim.now + 600_000 * MS, |s| s.responses().len() == total));
        let until = sim.now + 50 * MS;
        sim.run(until, |_| false);
        let resp = sim.responses();
        for ((c, tag), p) in &expect {
            let r = &resp[&(*c, *tag)];
            assert_eq!(r.len(), 1, "completed once");
            assert_eq!(r[0], p);
            assert_eq!(sim.executions[&p[..8]], 1, "executed once");
        }
        for c in 1..3 {
            let st = sim.nodes[c].rpc.stats();
            eprintln!("seed {seed} client {c}: {st:?}");
            assert!(st.wheel_paced > 0 && st.rollbacks > 0 && st.timely_updates > 0);
            assert_eq!(sim.nodes[c].rpc.wheel_len(), 0);
        }
    }
}

/// `next_timeout` is a lower bound maintained in O(1); reaching it either runs timers or
/// moves it to the exact next deadline, and `handle_timeout` before it does nothing.
#[test]
fn timer_bound_advances() {
    let cfg = Config::default();
    let (mut cl, _sv, sid) = pair(cfg.clone(), 0);
    // Connected at 0: keepalive due at 50 ms, failure at 200 ms; the bound may be earlier.
    let t = cl.rpc.next_timeout().unwrap();
    assert!(t <= cfg.keepalive);
    cl.rpc.handle_timeout(t);
    assert_eq!(
        cl.rpc.next_timeout(),
        Some(cfg.keepalive),
        "exact after a scan"
    );
    let sm = cl.rpc.stats().sm_tx;
    cl.rpc.handle_timeout(cfg.keepalive - 1);
    assert_eq!(cl.rpc.stats().sm_tx, sm, "nothing due yet");
    // An RPC arms its retransmission timer below the bound.
    cl.rpc.enqueue_request(MS, sid, 1, b"x", 1).unwrap();
    assert_eq!(cl.rpc.next_timeout(), Some(MS + cfg.rto));
    cl.rpc.handle_timeout(cfg.keepalive);
    assert_eq!(cl.rpc.stats().sm_tx, sm + 1, "keepalive ping");
    cl.rpc.check_invariants();
}

/// The client session of `sid`: (Timely rate in bit/s, measured minimum RTT in µs).
fn timely_of(rpc: &Rpc<u32>, sid: SessionId) -> (f64, f64) {
    let c = rpc.sessions[usize::from(sid.0)]
        .as_ref()
        .unwrap()
        .role
        .client()
        .unwrap();
    (c.timely.rate(), c.timely.min_rtt_us())
}

/// Timely's RTT excludes serialization at the sender (Mittal et al. 2015, §4.1): a window
/// of eight 4 KiB packets handed out at once leaves a 1 Gbit/s link one wire time (32.8 µs)
/// apart, and each is answered 10 µs after it left. Counted from the hand-out, the samples
/// would grow to 272 µs (gradient mode, rate cut); counted from each packet's departure
/// every sample is 10 µs, so the session stays uncongested and every sample takes the
/// Timely bypass. The minimum RTT (which normalizes the gradient) is the smallest full
/// round trip, 42.8 µs, not the corrected 10 µs.
#[test]
fn rtt_samples_exclude_serialization_of_the_burst() {
    let cfg = Config {
        link_bandwidth_bps: 1_000_000_000,
        ..Config::default()
    };
    let mtu = cfg.mtu;
    let dpp = mtu - PKTHDR_SIZE;
    let wire = (mtu * 8) as Time; // ns per full packet at 1 Gbit/s
    let prop: Time = 5_000; // one-way, ns
    let t0 = MS;
    let (mut cl, mut sv, sid) = pair(cfg, t0);
    // Nine packets: packets 0..8 take the eight credits, 0..7 are answered by CRs.
    cl.rpc
        .enqueue_request(t0, sid, 1, &payload(0, 9 * dpp), 0)
        .unwrap();
    let mut buf = vec![0u8; 65536];
    let mut burst = Vec::new();
    while let Some((_, n)) = cl.rpc.poll_transmit_at(t0, &mut buf) {
        burst.push(buf[..n].to_vec());
    }
    assert_eq!(burst.len(), 8, "one window handed out at once");
    for (k, pkt) in burst.iter().enumerate() {
        let departed = t0 + (k as Time + 1) * wire;
        sv.rpc.handle_datagram(departed + prop, 1, pkt);
        while let Some((_, n)) = sv.rpc.poll_transmit_at(departed + prop, &mut buf) {
            cl.rpc.handle_datagram(departed + 2 * prop, 2, &buf[..n]);
        }
    }
    let st = cl.rpc.stats().clone();
    assert_eq!(st.rtt_samples, 8, "{st:?}");
    assert_eq!(
        st.timely_bypassed, 8,
        "every sample is 10 µs < T_LOW: {st:?}"
    );
    assert_eq!(st.timely_updates, 0, "{st:?}");
    let (rate, min_rtt) = timely_of(&cl.rpc, sid);
    assert_eq!(rate, 1e9, "still uncongested");
    let first_round_trip_us = (wire + 2 * prop) as f64 / 1e3;
    assert!(
        (min_rtt - first_round_trip_us).abs() < 1e-6,
        "min RTT {min_rtt} µs is the smallest full round trip {first_round_trip_us} µs"
    );
}

/// The correction removes only the link's serialization: a packet whose answer is late
/// because of queueing beyond the link (here 1.5 ms, far more than its 32.8 µs wire time)
/// still gives a sample above `T_HIGH`, and Timely cuts the rate multiplicatively.
#[test]
fn queueing_beyond_the_link_still_cuts_the_rate() {
    let cfg = Config {
        link_bandwidth_bps: 1_000_000_000,
        ..Config::default()
    };
    let dpp = cfg.mtu - PKTHDR_SIZE;
    let t0 = MS;
    let (mut cl, mut sv, sid) = pair(cfg, t0);
    cl.rpc
        .enqueue_request(t0, sid, 1, &payload(0, 3 * dpp), 0)
        .unwrap();
    let mut buf = vec![0u8; 65536];
    let (_, n) = cl.rpc.poll_transmit_at(t0, &mut buf).unwrap();
    let first = buf[..n].to_vec();
    let late = t0 + 1_500_000;
    sv.rpc.handle_datagram(late, 1, &first);
    while let Some((_, n)) = sv.rpc.poll_transmit_at(late, &mut buf) {
        cl.rpc.handle_datagram(late, 2, &buf[..n]);
    }
    let st = cl.rpc.stats().clone();
    assert_eq!((st.rtt_samples, st.timely_updates), (1, 1), "{st:?}");
    let (rate, _) = timely_of(&cl.rpc, sid);
    assert!(rate < 1e9, "rate cut to {rate}");
}

/// Timely rate of client session `sid`.
fn session_rate(rpc: &mut Rpc<u32>, sid: SessionId) -> f64 {
    rpc.sessions[usize::from(sid.0)]
        .as_mut()
        .unwrap()
        .role
        .client_mut()
        .unwrap()
        .timely
        .rate()
}

/// A client whose event loop stalls for 3 ms while the answers to a two-packet request wait
/// (a descheduled thread): the answer was not there at its last poll, 2 µs after the
/// packets left, so with that poll reported (`note_rx_drained`) the CR's sample ends there
/// and the session stays at the link rate; a driver that reports no poll reads the stall
/// as a 3 ms RTT and Timely cuts the rate.
#[test]
fn a_stalled_client_loop_is_not_read_as_congestion() {
    let mut rates = Vec::new();
    for report_polls in [false, true] {
        let cfg = Config::default();
        let dpp = cfg.mtu - 16;
        let link = cfg.link_bandwidth_bps as f64;
        let t0 = MS;
        let (mut cl, mut sv, sid) = pair(cfg, t0);
        cl.rpc
            .enqueue_request(t0, sid, 1, &payload(0, dpp + 1), 0)
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let mut sent = 0;
        while let Some((_, n)) = cl.rpc.poll_transmit_at(t0, &mut buf) {
            sv.rpc.handle_datagram(t0 + 3_000, 1, &buf[..n]);
            sent += 1;
        }
        assert_eq!(sent, 2);
        if report_polls {
            // The poll after the burst: nothing back yet.
            cl.rpc.note_rx_drained(t0 + 2_000);
        }
        // The server's event loop answers packet 0 at once (a CR; the response waits for
        // the handler); the client gets to it 3 ms later.
        let late = t0 + 3 * MS;
        let mut answers = 0;
        while let Some((_, n)) = sv.rpc.poll_transmit_at(t0 + 3_000, &mut buf) {
            cl.rpc.handle_datagram(late, 2, &buf[..n]);
            answers += 1;
        }
        assert_eq!(answers, 1, "the CR");
        let st = cl.rpc.stats();
        assert_eq!(st.rtt_samples, 1, "the CR's");
        assert_eq!(st.rtt_bounded_by_poll, u64::from(report_polls));
        rates.push(session_rate(&mut cl.rpc, sid) / link);
    }
    assert!(
        rates[0] < 0.9,
        "an unreported stall reads as congestion: {rates:?}"
    );
    assert_eq!(
        rates[1], 1.0,
        "a reported poll bounds the sample: {rates:?}"
    );
}

/// Client session `sid` sends a two-packet request at `t`; the server's event loop takes
/// both packets at once and answers packet 0 with a CR (the response waits for a handler
/// that never runs), which the client handles at `t + rtt`: one RTT sample of about `rtt`,
/// one completion event. Uses a slot and, net, one credit.
fn cr_exchange(cl: &mut Node, sv: &mut Node, sid: SessionId, t: Time, rtt: Time, tag: u64) {
    let dpp = cl.rpc.cfg.mtu - PKTHDR_SIZE;
    cl.rpc
        .enqueue_request(t, sid, 1, &payload(tag, dpp + 1), tag)
        .unwrap();
    let mut buf = vec![0u8; 65536];
    let mut sent = 0;
    while let Some((_, n)) = cl.rpc.poll_transmit_at(t, &mut buf) {
        sv.rpc.handle_datagram(t, 1, &buf[..n]);
        sent += 1;
    }
    assert_eq!(sent, 2, "exchange {tag}: {:?}", cl.rpc.stats());
    let mut answers = 0;
    while let Some((_, n)) = sv.rpc.poll_transmit_at(t, &mut buf) {
        cl.rpc.handle_datagram(t + rtt, 2, &buf[..n]);
        answers += 1;
    }
    assert_eq!(answers, 1, "the CR");
}

/// Runs one `cr_exchange` per entry of `rtts` (ns), 100 µs apart after each answer, on a
/// fresh pair whose RTT filter spans `events` completion events; returns the session's
/// rate over the link rate after each exchange. Pacing is off (rates are computed, packets
/// leave at once), so that every exchange is sent at its time.
fn rates_after(events: usize, rtts: &[Time]) -> Vec<f64> {
    let cfg = Config {
        cc_rtt_filter_events: events,
        cc_pacing: false,
        ..Config::default()
    };
    let link = cfg.link_bandwidth_bps as f64;
    let mut t = MS;
    let (mut cl, mut sv, sid) = pair(cfg, t);
    let mut rates = Vec::new();
    for (k, &rtt) in rtts.iter().enumerate() {
        cr_exchange(&mut cl, &mut sv, sid, t, rtt, k as u64);
        rates.push(session_rate(&mut cl.rpc, sid) / link);
        t += rtt + 100_000;
    }
    assert_eq!(cl.rpc.stats().rtt_samples, rtts.len() as u64);
    rates
}

/// A server stalled for 3 ms (its thread descheduled) answers one completion event late:
/// fed as is (filter of one event, eRPC's input), that 3 ms sample cuts the rate by half
/// and 20 µs samples afterwards only add 5 Mbit/s each; with the default filter (the
/// minimum over four events) the session never leaves the link rate.
#[test]
fn a_server_stall_shorter_than_the_rtt_filter_leaves_the_rate() {
    let rtts = [20_000, 20_000, 20_000, 3 * MS, 20_000, 20_000];
    let unfiltered = rates_after(1, &rtts);
    assert!(unfiltered[3] < 0.5, "{unfiltered:?}");
    assert!(unfiltered[5] < 0.5, "no quick recovery: {unfiltered:?}");
    assert_eq!(Config::default().cc_rtt_filter_events, 4);
    let filtered = rates_after(4, &rtts);
    assert_eq!(filtered, [1.0; 6]);
}

/// Queueing that lasts reaches Timely through the filter, `events - 1` events late: with
/// the default four-event window, 2 ms RTTs from the second exchange on leave the rate
/// alone for three events and cut it at the fourth, as the first of them does unfiltered.
#[test]
fn sustained_queueing_gets_through_the_rtt_filter() {
    let rtts = [20_000, 2 * MS, 2 * MS, 2 * MS, 2 * MS, 2 * MS];
    let filtered = rates_after(4, &rtts);
    assert_eq!(filtered[..4], [1.0; 4], "{filtered:?}");
    assert!(filtered[4] < 0.7, "{filtered:?}");
    assert!(filtered[5] < filtered[4], "{filtered:?}");
    let unfiltered = rates_after(1, &rtts);
    assert!(unfiltered[1] < 0.7, "{unfiltered:?}");
}

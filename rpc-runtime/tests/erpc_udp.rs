//! The batched UDP datagram transport of eRPC (`rpc_runtime::erpc::datagram::udp`) over
//! loopback: bursts with every byte checked, header/data gather, ping-pong, oversized and short
//! datagrams, IPv6 and dual-stack addressing, nonblocking empty receive, per-packet send errors,
//! and an allocation-free steady state (checked with a counting global allocator).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use rpc_runtime::erpc::datagram::udp::{UdpConfig, UdpMtu, UdpTransport};
use rpc_runtime::erpc::datagram::{DatagramTransport, PKT_HDR_LEN, TxPkt};

/// Counts allocations made by the current thread, so tests running in parallel do not disturb
/// each other's counts.
struct CountingAlloc;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn bump() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

// SAFETY: forwards every call to the system allocator unchanged; the counter is a const-
// initialized thread-local without destructor, whose access does not allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const TIMEOUT: Duration = Duration::from_secs(10);

fn v4_loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn transport(bind: SocketAddr, mtu: usize, batch: usize) -> UdpTransport {
    UdpTransport::bind(UdpConfig {
        bind,
        mtu: UdpMtu::Fixed(mtu),
        batch,
        socket_buf_bytes: Some(4 << 20),
        gso: true,
    })
    .expect("bind UDP transport")
}

/// The 16-byte "header" of test packet `seq` carrying `len` data bytes.
fn test_hdr(seq: u32, len: usize) -> [u8; PKT_HDR_LEN] {
    let mut h = [0u8; PKT_HDR_LEN];
    h[0..4].copy_from_slice(&seq.to_le_bytes());
    h[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    h[8..16].copy_from_slice(&0x5eed_cafe_f00d_beefu64.to_le_bytes());
    h
}

/// Data byte `j` of test packet `seq`.
fn test_byte(seq: u32, j: usize) -> u8 {
    (seq as usize * 31 + j * 7 + (j >> 8)) as u8
}

/// Checks that `bytes` is test packet `seq` (header + data pattern).
fn check_pkt(bytes: &[u8], seq: u32, len: usize) {
    assert_eq!(bytes.len(), PKT_HDR_LEN + len, "length of packet {seq}");
    assert_eq!(
        bytes[..PKT_HDR_LEN],
        test_hdr(seq, len),
        "header of packet {seq}"
    );
    for (j, &b) in bytes[PKT_HDR_LEN..].iter().enumerate() {
        assert_eq!(b, test_byte(seq, j), "byte {j} of packet {seq}");
    }
}

/// Sends all of `pkts`, retrying when the send queue is full.
fn send_all(t: &mut UdpTransport, pkts: &[TxPkt<'_, SocketAddr>]) {
    let deadline = Instant::now() + TIMEOUT;
    let mut done = 0;
    while done < pkts.len() {
        done += t.tx_burst(&pkts[done..]).expect("tx_burst");
        assert!(Instant::now() < deadline, "send did not finish");
    }
}

/// Receives exactly `n` datagrams, copying them out.
fn recv_n(t: &mut UdpTransport, n: usize) -> Vec<(SocketAddr, Vec<u8>)> {
    let deadline = Instant::now() + TIMEOUT;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let got = t.rx_burst(n - out.len());
        for i in 0..got {
            let (addr, bytes) = t.rx_pkt(i);
            out.push((addr, bytes.to_vec()));
        }
        t.rx_release();
        assert!(
            Instant::now() < deadline,
            "received {} of {n} datagrams",
            out.len()
        );
    }
    out
}

#[test]
fn thousand_datagrams_in_bursts_of_32_every_byte_checked() {
    let mut a = transport(v4_loopback(), 1472, 32);
    let mut b = transport(v4_loopback(), 1472, 32);
    let dest = b.local_addr();
    let max_data = a.mtu() - PKT_HDR_LEN;
    // One data buffer per in-flight packet of a burst, built up front: the data part of each
    // datagram is a slice of it, the header part a separate 16-byte array (gather of 2).
    let lens: Vec<usize> = (0..1000u32)
        .map(|s| match s % 5 {
            0 => 0,
            1 => max_data,
            _ => (s as usize * 37) % max_data,
        })
        .collect();
    let mut seq = 0u32;
    while (seq as usize) < lens.len() {
        let burst = (lens.len() - seq as usize).min(32);
        let hdrs: Vec<[u8; PKT_HDR_LEN]> = (0..burst)
            .map(|k| test_hdr(seq + k as u32, lens[seq as usize + k]))
            .collect();
        let datas: Vec<Vec<u8>> = (0..burst)
            .map(|k| {
                let s = seq + k as u32;
                (0..lens[s as usize]).map(|j| test_byte(s, j)).collect()
            })
            .collect();
        let pkts: Vec<TxPkt<'_, SocketAddr>> = (0..burst)
            .map(|k| TxPkt::new(dest, &hdrs[k], &datas[k]))
            .collect();
        send_all(&mut a, &pkts);
        for (k, (src, bytes)) in recv_n(&mut b, burst).into_iter().enumerate() {
            let s = seq + k as u32;
            assert_eq!(src, a.local_addr());
            check_pkt(&bytes, s, lens[s as usize]);
        }
        seq += burst as u32;
    }
    let (sa, sb) = (a.stats(), b.stats());
    let total_bytes: u64 = lens.iter().map(|l| (PKT_HDR_LEN + l) as u64).sum();
    assert_eq!(sa.tx_pkts, 1000);
    assert_eq!(sa.tx_bytes, total_bytes);
    assert_eq!(sa.tx_errors, 0);
    assert!(
        sa.tx_calls <= 64,
        "sendmmsg batching: {} calls for 1000 packets",
        sa.tx_calls
    );
    assert_eq!(sb.rx_pkts, 1000);
    assert_eq!(sb.rx_bytes, total_bytes);
    assert_eq!((sb.rx_oversized, sb.rx_short, sb.rx_errors), (0, 0, 0));
    assert!(
        sb.rx_calls < 1000,
        "recvmmsg batching: {} calls",
        sb.rx_calls
    );
}

#[test]
fn single_part_and_header_only_packets() {
    let mut a = transport(v4_loopback(), 256, 8);
    let mut b = transport(v4_loopback(), 256, 8);
    let dest = b.local_addr();
    let whole: Vec<u8> = (0..256).map(|i| i as u8).collect();
    let hdr = test_hdr(7, 0);
    let pkts = [
        TxPkt::single(dest, &whole),
        TxPkt::new(dest, &hdr, &[]),
        TxPkt::new(dest, &whole[..10], &whole[10..200]),
        TxPkt::single(dest, &[]),
    ];
    assert_eq!(a.tx_burst(&pkts).unwrap(), 4);
    let got = recv_n(&mut b, 4);
    assert_eq!(got[0].1, whole);
    assert_eq!(got[1].1, hdr);
    assert_eq!(got[2].1, &whole[..200]);
    assert!(got[3].1.is_empty());
    // Zero-length datagrams are delivered (the core validates) and counted as short.
    assert_eq!(b.stats().rx_short, 1);
}

#[test]
fn ping_pong_between_two_sockets() {
    let mut client = transport(v4_loopback(), 1472, 32);
    let mut server = transport(v4_loopback(), 1472, 32);
    let server_addr = server.local_addr();
    let mut echo = vec![0u8; server.mtu()];
    for round in 0..200u32 {
        let len = (round as usize * 13) % (client.mtu() - PKT_HDR_LEN);
        let hdr = test_hdr(round, len);
        let data: Vec<u8> = (0..len).map(|j| test_byte(round, j)).collect();
        send_all(&mut client, &[TxPkt::new(server_addr, &hdr, &data)]);

        let (from, n) = {
            let got = recv_n(&mut server, 1);
            let (from, bytes) = &got[0];
            check_pkt(bytes, round, len);
            echo[..bytes.len()].copy_from_slice(bytes);
            (*from, bytes.len())
        };
        assert_eq!(from, client.local_addr());
        send_all(
            &mut server,
            &[TxPkt::new(
                from,
                &echo[..PKT_HDR_LEN],
                &echo[PKT_HDR_LEN..n],
            )],
        );

        let back = recv_n(&mut client, 1);
        assert_eq!(back[0].0, server_addr);
        check_pkt(&back[0].1, round, len);
    }
    assert_eq!(client.stats().tx_pkts, 200);
    assert_eq!(server.stats().rx_pkts, 200);
}

#[test]
fn oversized_datagram_is_dropped_and_counted() {
    let mut rx = transport(v4_loopback(), 100, 8);
    let plain = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dest = rx.local_addr();
    plain.send_to(&[1u8; 101], dest).unwrap(); // one byte above the mtu
    plain.send_to(&[2u8; 100], dest).unwrap(); // exactly the mtu
    plain.send_to(&[3u8; 5000], dest).unwrap(); // far above
    plain.send_to(&[4u8; 5], dest).unwrap(); // shorter than a packet header
    let deadline = Instant::now() + TIMEOUT;
    let mut delivered = Vec::new();
    while rx.stats().rx_pkts + rx.stats().rx_oversized < 4 {
        let n = rx.rx_burst(8);
        for i in 0..n {
            let (from, bytes) = rx.rx_pkt(i);
            assert_eq!(from, plain.local_addr().unwrap());
            delivered.push(bytes.to_vec());
        }
        assert!(Instant::now() < deadline);
    }
    assert_eq!(delivered, vec![vec![2u8; 100], vec![4u8; 5]]);
    let s = rx.stats();
    assert_eq!(s.rx_oversized, 2);
    assert_eq!(s.rx_short, 1);
    assert_eq!(s.rx_pkts, 2);
    assert_eq!(s.rx_bytes, 105);
}

#[test]
fn tx_rejects_packet_above_mtu_and_sends_nothing() {
    let mut a = transport(v4_loopback(), 64, 4);
    let mut b = transport(v4_loopback(), 64, 4);
    let dest = b.local_addr();
    let big = [0u8; 60];
    let pkts = [
        TxPkt::single(dest, &big),
        TxPkt::new(dest, &[0u8; PKT_HDR_LEN], &big), // 76 > 64
    ];
    let err = a.tx_burst(&pkts).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert_eq!(a.stats().tx_pkts, 0);
    assert_eq!(a.stats().tx_calls, 0);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(b.rx_burst(4), 0);
}

#[test]
fn per_packet_send_error_is_counted_and_skipped() {
    let mut a = transport(v4_loopback(), 128, 8);
    let mut b = transport(v4_loopback(), 128, 8);
    let good = b.local_addr();
    // An IPv6 destination cannot be reached from an IPv4 socket (EAFNOSUPPORT): that packet is
    // dropped, the others of the burst still go out.
    let bad: SocketAddr = "[2001:db8::1]:9".parse().unwrap();
    let pkts = [
        TxPkt::single(good, b"first"),
        TxPkt::single(bad, b"lost"),
        TxPkt::single(good, b"third"),
    ];
    assert_eq!(a.tx_burst(&pkts).unwrap(), 3);
    let s = a.stats();
    assert_eq!((s.tx_pkts, s.tx_errors), (2, 1));
    let got = recv_n(&mut b, 2);
    assert_eq!(got[0].1, b"first");
    assert_eq!(got[1].1, b"third");
}

#[test]
fn rx_burst_on_empty_socket_returns_zero_without_blocking() {
    let mut t = transport(v4_loopback(), 1472, 32);
    let start = Instant::now();
    for _ in 0..1000 {
        assert_eq!(t.rx_burst(32), 0);
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "1000 empty rx_burst calls took {:?}",
        start.elapsed()
    );
    assert_eq!(t.rx_burst(0), 0);
    let s = t.stats();
    assert_eq!((s.rx_pkts, s.rx_calls, s.rx_errors), (0, 0, 0));
}

#[test]
fn rx_burst_honours_max_and_ring_size() {
    let mut a = transport(v4_loopback(), 512, 16);
    let mut b = transport(v4_loopback(), 512, 4);
    let dest = b.local_addr();
    let hdrs: Vec<[u8; PKT_HDR_LEN]> = (0..10).map(|s| test_hdr(s, 0)).collect();
    let pkts: Vec<_> = hdrs.iter().map(|h| TxPkt::single(dest, h)).collect();
    send_all(&mut a, &pkts);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(b.rx_batch(), 4);
    assert_eq!(b.rx_burst(3), 3);
    assert_eq!(b.rx_pkt(2).1, hdrs[2]);
    b.rx_release();
    assert_eq!(b.rx_burst(100), 4, "capped at the ring size");
    for i in 0..4 {
        assert_eq!(b.rx_pkt(i).1, hdrs[3 + i]);
    }
    assert_eq!(b.rx_burst(100), 3);
    assert_eq!(b.rx_pkt(0).1, hdrs[7]);
    assert_eq!(b.rx_burst(100), 0);
}

#[test]
#[should_panic(expected = "outside the current burst")]
fn rx_pkt_after_release_panics() {
    let mut a = transport(v4_loopback(), 512, 4);
    let mut b = transport(v4_loopback(), 512, 4);
    send_all(&mut a, &[TxPkt::single(b.local_addr(), b"x")]);
    let deadline = Instant::now() + TIMEOUT;
    while b.rx_burst(4) == 0 {
        assert!(Instant::now() < deadline);
    }
    b.rx_release();
    let _ = b.rx_pkt(0);
}

/// Binds an IPv6 transport, or explains why the test is skipped.
fn try_v6(bind: &str) -> Option<UdpTransport> {
    match UdpTransport::bind(UdpConfig::new(bind.parse().unwrap())) {
        Ok(t) => Some(t),
        Err(e) => {
            println!("skipping: cannot bind {bind}: {e}");
            None
        }
    }
}

#[test]
fn ipv6_loopback_burst() {
    let (Some(mut a), Some(mut b)) = (try_v6("[::1]:0"), try_v6("[::1]:0")) else {
        return;
    };
    // The derived size of IPv6 loopback: a jumbo frame's payload (8952 B) when the receive
    // buffer admits it, else the IPv6 Ethernet default (1452 B).
    let expected =
        rpc_runtime::erpc::datagram::path_mtu::auto_mtu("::1".parse().unwrap(), a.rcvbuf_bytes());
    assert!(expected == 8952 || expected == 1452, "{expected}");
    assert_eq!(a.mtu(), expected);
    let dest = b.local_addr();
    assert!(dest.is_ipv6());
    let hdrs: Vec<[u8; PKT_HDR_LEN]> = (0..100).map(|s| test_hdr(s, 100)).collect();
    let datas: Vec<Vec<u8>> = (0..100u32)
        .map(|s| (0..100).map(|j| test_byte(s, j)).collect())
        .collect();
    let pkts: Vec<_> = (0..100)
        .map(|k| TxPkt::new(dest, &hdrs[k], &datas[k]))
        .collect();
    let mut sent = 0;
    while sent < 100 {
        let end = (sent + 32).min(100);
        send_all(&mut a, &pkts[sent..end]);
        for (k, (src, bytes)) in recv_n(&mut b, end - sent).into_iter().enumerate() {
            assert_eq!(src, a.local_addr());
            check_pkt(&bytes, (sent + k) as u32, 100);
        }
        sent = end;
    }
    // And back, to the address the packets came from.
    let from = a.local_addr();
    send_all(&mut b, &[TxPkt::single(from, b"reply")]);
    assert_eq!(recv_n(&mut a, 1)[0], (dest, b"reply".to_vec()));
}

#[test]
fn dual_stack_socket_reports_ipv4_peers_as_ipv4() {
    let Some(mut server) = try_v6("[::]:0") else {
        return;
    };
    let mut client = transport(v4_loopback(), 1452, 8);
    let server_v4: SocketAddr = ([127, 0, 0, 1], server.local_addr().port()).into();
    if client
        .tx_burst(&[TxPkt::single(server_v4, b"hello")])
        .unwrap()
        != 1
    {
        panic!("send to dual-stack socket was not taken");
    }
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut got = None;
    while got.is_none() && Instant::now() < deadline {
        if server.rx_burst(8) > 0 {
            let (from, bytes) = server.rx_pkt(0);
            got = Some((from, bytes.to_vec()));
        }
    }
    let Some((from, bytes)) = got else {
        println!("skipping: [::] is IPv6-only here (net.ipv6.bindv6only=1)");
        return;
    };
    assert_eq!(bytes, b"hello");
    assert_eq!(
        from,
        client.local_addr(),
        "IPv4-mapped source reported as IPv4"
    );
    // Replying to the plain IPv4 address from the IPv6 socket works (sent IPv4-mapped).
    send_all(&mut server, &[TxPkt::single(from, b"world")]);
    let back = recv_n(&mut client, 1);
    assert_eq!(back[0].1, b"world");
    assert_eq!(back[0].0.port(), server.local_addr().port());
}

#[test]
fn steady_state_tx_and_rx_do_not_allocate() {
    let mut a = transport(v4_loopback(), 1472, 32);
    let mut b = transport(v4_loopback(), 1472, 32);
    let dest = b.local_addr();
    let hdrs: [[u8; PKT_HDR_LEN]; 32] = std::array::from_fn(|k| test_hdr(k as u32, 1000));
    let data = [0xa5u8; 1000];
    let pkts: [TxPkt<'_, SocketAddr>; 32] =
        std::array::from_fn(|k| TxPkt::new(dest, &hdrs[k], &data));
    let round = |a: &mut UdpTransport, b: &mut UdpTransport| {
        let deadline = Instant::now() + TIMEOUT;
        let mut sent = 0;
        while sent < pkts.len() {
            sent += a.tx_burst(&pkts[sent..]).expect("tx_burst");
        }
        let mut received = 0;
        let mut checksum = 0u64;
        while received < pkts.len() {
            let n = b.rx_burst(32);
            for i in 0..n {
                let (_, bytes) = b.rx_pkt(i);
                checksum += bytes.len() as u64 + u64::from(bytes[0]);
            }
            b.rx_release();
            received += n;
            // Empty polls on the other side take the would-block path too.
            assert_eq!(a.rx_burst(32), 0);
            assert!(Instant::now() < deadline, "round timed out");
        }
        checksum
    };
    // Warm-up (lazy kernel/socket state, thread-locals, Instant's first use).
    round(&mut a, &mut b);
    // The counter does see this thread's allocations.
    let probe = allocs();
    drop(std::hint::black_box(vec![1u8; 64]));
    assert_eq!(allocs(), probe + 1);
    let before = allocs();
    let mut total = 0;
    for _ in 0..100 {
        total += round(&mut a, &mut b);
    }
    let after = allocs();
    assert_eq!(
        after - before,
        0,
        "allocations during 100 steady-state rounds"
    );
    let expected: u64 = (0..32).map(|k| 1016 + k as u64).sum::<u64>() * 100;
    assert_eq!(total, expected);
    assert_eq!(b.stats().rx_pkts, 32 * 101);
}

/// Payload of zero-copy test RPC `tag` of `len` bytes: the tag, then a pattern.
fn zc_payload(tag: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len.max(8))
        .map(|i| (i as u64).wrapping_mul(13).wrapping_add(tag) as u8)
        .collect();
    v[..8].copy_from_slice(&tag.to_le_bytes());
    v
}

/// An eRPC echo server on the zero-copy iteration (`rx_burst_zc`, `zc`, `reply_zc` /
/// `reply`, `finish_iteration`; seeds/002 §7.2) in its own thread, and a client that takes
/// single-packet responses in place too, over UDP with 20% loss, duplication and reordering
/// each way. Single-packet requests are answered in place (`reply_zc`) or after a look with
/// `zc` (`reply`), multi-packet ones through events; every RPC completes exactly once and
/// every handler runs exactly once.
#[test]
fn zero_copy_echo_server_over_lossy_udp() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use rpc_runtime::erpc::core::{Config, Event, MS, Zc};
    use rpc_runtime::erpc::datagram::lossy::{LossConfig, LossyTransport};
    use rpc_runtime::erpc::event_loop::Endpoint;

    let loss = |seed| {
        LossyTransport::new(
            transport(v4_loopback(), 1472, 32),
            LossConfig {
                drop: 0.2,
                seed,
                ..LossConfig::default()
            },
        )
    };
    let cfg = Config {
        failure_timeout: 5_000 * MS,
        ..Config::default()
    };
    let mut server = Endpoint::new(loss(41), cfg.clone()).unwrap();
    let server_addr = server.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    // Handler executions per tag, and how each was answered (zc, zc+reply, event).
    let runs: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let kinds: Arc<Mutex<[u64; 3]>> = Arc::default();
    let (stop2, runs2, kinds2) = (stop.clone(), runs.clone(), kinds.clone());
    let handle = std::thread::spawn(move || {
        let tag_of = |d: &[u8]| u64::from_le_bytes(d[..8].try_into().unwrap());
        let mut copy = [0u8; 2048];
        while !stop2.load(Ordering::Relaxed) {
            for k in 0..server.rx_burst_zc() {
                let (zc, data) = server.zc(k);
                let Zc::Request {
                    token, req_type, ..
                } = zc
                else {
                    panic!("server got {zc:?}")
                };
                *runs2.lock().unwrap().entry(tag_of(data)).or_default() += 1;
                if req_type == 1 {
                    kinds2.lock().unwrap()[0] += 1;
                    server
                        .reply_zc(k, 4096, |_, req, resp| {
                            resp[..req.len()].copy_from_slice(req);
                            req.len()
                        })
                        .unwrap();
                } else {
                    kinds2.lock().unwrap()[1] += 1;
                    let n = data.len();
                    copy[..n].copy_from_slice(data);
                    server.reply(token, &copy[..n]).unwrap();
                }
            }
            server.finish_iteration();
            while let Some(ev) = server.poll_event() {
                let Event::Request { token, data, .. } = ev else {
                    panic!("server got {ev:?}")
                };
                *runs2.lock().unwrap().entry(tag_of(&data)).or_default() += 1;
                kinds2.lock().unwrap()[2] += 1;
                server.reply(token, &data).unwrap();
                server.recycle(data);
            }
        }
        server
    });

    let mut client = Endpoint::new(loss(42), cfg).unwrap();
    let sid = client.create_session(server_addr).unwrap();
    let start = Instant::now();
    let deadline = Duration::from_secs(30);
    while !client.is_connected(sid) {
        assert!(start.elapsed() < deadline, "connect timed out");
        client.run_event_loop_once();
        while client.poll_event().is_some() {}
    }
    let dpp = client.rpc().data_per_pkt();
    let n = 600u64;
    let len_of = |tag: u64| match tag % 6 {
        0 => 3 * dpp + 5, // multi-packet: events on both sides
        1 => dpp,
        _ => 8 + (tag as usize * 7) % 300,
    };
    let mut outstanding: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut completed = 0u64;
    let mut zc_responses = 0u64;
    let mut next = 0u64;
    while completed < n {
        assert!(
            start.elapsed() < deadline,
            "{completed}/{n} done; client {:?}",
            client.core_stats()
        );
        while next < n && outstanding.len() < 32 {
            let p = zc_payload(next, len_of(next));
            let req_type = if next.is_multiple_of(2) { 1 } else { 2 };
            client.enqueue_request(sid, req_type, &p, next).unwrap();
            outstanding.insert(next, p);
            next += 1;
        }
        for k in 0..client.rx_burst_zc() {
            let (zc, data) = client.zc(k);
            let Zc::Response { tag, .. } = zc else {
                panic!("client got {zc:?}")
            };
            let want = outstanding.remove(&tag).expect("response once");
            assert_eq!(data, &want[..], "tag {tag}");
            completed += 1;
            zc_responses += 1;
        }
        client.finish_iteration();
        while let Some(ev) = client.poll_event() {
            let Event::Response { tag, data, .. } = ev else {
                panic!("client got {ev:?}")
            };
            let want = outstanding.remove(&tag).expect("response once");
            assert_eq!(data, want, "tag {tag}");
            completed += 1;
            client.recycle(data);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let server = handle.join().expect("server thread");
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len() as u64, n);
    assert!(runs.values().all(|&c| c == 1), "every handler ran once");
    let kinds = *kinds.lock().unwrap();
    eprintln!(
        "zc echo: {n} RPCs in {:?}; server answers (reply_zc, zc+reply, event) {kinds:?}; \
         client zc responses {zc_responses}; client {:?}; server {:?}",
        start.elapsed(),
        client.core_stats(),
        server.core_stats()
    );
    assert_eq!(kinds[2], n / 6, "multi-packet requests arrive as events");
    assert!(kinds[0] > 0 && kinds[1] > 0);
    assert_eq!(zc_responses, n - n / 6);
    assert_eq!(server.core_stats().requests_dispatched, n);
    assert!(
        server.core_stats().dup_req_answered > 0,
        "duplicates were answered"
    );
    assert!(client.core_stats().rollbacks > 0);
    assert_eq!(server.loop_stats().zc_msgs, kinds[0] + kinds[1]);
}

/// Admission control relies on `rx_ring_entries` (issue 12): that many full-size datagrams
/// sent to a socket nobody reads must all be kept by the kernel (the estimate of what the
/// receive buffer holds is not too high), for plain datagrams (the most expensive case: one
/// kernel buffer each) at several MTUs and buffer sizes.
#[test]
fn rx_ring_entries_datagrams_fit_the_socket_buffer() {
    for (mtu, buf) in [
        (1472, 64 << 10),
        (1472, 256 << 10),
        (4096, 256 << 10),
        (512, 64 << 10),
        // The loopback default: jumbo datagrams in the default 4 MiB buffer.
        (8972, 4 << 20),
    ] {
        let cfg = |bind| UdpConfig {
            bind,
            mtu: UdpMtu::Fixed(mtu),
            batch: 32,
            socket_buf_bytes: Some(buf),
            gso: false,
        };
        let mut rx = UdpTransport::bind(cfg(v4_loopback())).unwrap();
        let mut tx = UdpTransport::bind(cfg(v4_loopback())).unwrap();
        let entries = rx.rx_ring_entries();
        assert_eq!(
            entries,
            rx.rcvbuf_bytes() / rpc_runtime::erpc::datagram::udp::udp_rx_charge(mtu)
        );
        assert!(entries >= 8, "mtu {mtu} buf {buf}: {entries} entries");
        let data = vec![7u8; mtu - PKT_HDR_LEN];
        let dest = rx.local_addr();
        // Twice the estimate: the kernel keeps what fits and drops the rest.
        for seq in 0..2 * entries as u32 {
            let hdr = test_hdr(seq, data.len());
            send_all(&mut tx, &[TxPkt::new(dest, &hdr, &data)]);
        }
        let mut got = 0;
        loop {
            let n = rx.rx_burst(usize::MAX);
            if n == 0 {
                break;
            }
            got += n;
            rx.rx_release();
        }
        eprintln!(
            "mtu {mtu}, SO_RCVBUF {} B: estimate {entries} datagrams, kernel kept {got}",
            rx.rcvbuf_bytes()
        );
        assert!(
            got >= entries,
            "mtu {mtu}: the socket kept {got} datagrams, fewer than the estimate {entries}"
        );
        assert!(
            got < 2 * entries,
            "the buffer overflowed: the test sent enough"
        );
    }
}

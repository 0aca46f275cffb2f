//! The event loop's retried transmit tail (issue 15): message packets are queued as
//! descriptors into their slots' message buffers, not as copies, so when the transport's
//! send queue is full the tail is re-resolved on the next iteration; a packet whose exchange
//! ended meanwhile is not sent (`LoopStats::tx_stale`) and never reads a buffer that was
//! reused.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rpc_runtime::erpc::core::{Config, Event, MS, SessionError};
use rpc_runtime::erpc::datagram::udp::{UdpConfig, UdpTransport};
use rpc_runtime::erpc::datagram::{DatagramTransport, TransportStats, TxPkt};
use rpc_runtime::erpc::event_loop::Endpoint;

/// A UDP transport whose send queue takes at most `room` datagrams per `tx_burst` (the
/// test's stand-in for a full NIC send queue).
#[derive(Debug)]
struct Throttled {
    inner: UdpTransport,
    room: Arc<AtomicUsize>,
}

impl DatagramTransport for Throttled {
    type Addr = SocketAddr;

    fn mtu(&self) -> usize {
        self.inner.mtu()
    }

    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    fn rx_batch(&self) -> usize {
        self.inner.rx_batch()
    }

    fn rx_ring_entries(&self) -> usize {
        self.inner.rx_ring_entries()
    }

    fn tx_burst(&mut self, pkts: &[TxPkt<'_, SocketAddr>]) -> io::Result<usize> {
        let n = pkts.len().min(self.room.load(Ordering::Relaxed));
        self.inner.tx_burst(&pkts[..n])
    }

    fn rx_burst(&mut self, max: usize) -> usize {
        self.inner.rx_burst(max)
    }

    fn rx_pkt(&self, i: usize) -> (SocketAddr, &[u8]) {
        self.inner.rx_pkt(i)
    }

    fn rx_release(&mut self) {
        self.inner.rx_release();
    }

    fn stats(&self) -> TransportStats {
        self.inner.stats()
    }
}

fn udp() -> UdpTransport {
    UdpTransport::bind(UdpConfig::new("127.0.0.1:0".parse().unwrap())).expect("bind UDP")
}

/// A 3-packet request and two small ones stuck in the transmit tail while their session
/// fails (the server hears nothing): once the queue has room again (one datagram per burst)
/// the large request's message packets are dropped as stale, and the two small requests,
/// rendered into the batch's buffers behind them, still go one per burst with their own
/// bytes (the server, which never learnt of the failure, dispatches exactly those two).
#[test]
fn stale_message_packets_of_a_retried_tail_are_not_sent() {
    let cfg = Config {
        failure_timeout: 100 * MS,
        keepalive: 20 * MS,
        ..Config::default()
    };
    let mut sv = Endpoint::new(udp(), cfg.clone()).unwrap();
    let room = Arc::new(AtomicUsize::new(usize::MAX));
    let mut cl = Endpoint::new(
        Throttled {
            inner: udp(),
            room: room.clone(),
        },
        cfg,
    )
    .unwrap();
    cl.set_timer_scan_interval(0);
    let sid = cl.create_session(sv.local_addr()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cl.is_connected(sid) {
        assert!(Instant::now() < deadline, "connect");
        cl.run_event_loop_once();
        sv.run_event_loop_once();
    }
    while cl.poll_event().is_some() {}

    // The send queue is full: the request's packets stay in the tail.
    room.store(0, Ordering::Relaxed);
    let sent = cl.loop_stats().tx_pkts;
    let dpp = cl.rpc().data_per_pkt();
    let req = vec![5u8; 3 * dpp - 1];
    cl.enqueue_request(sid, 1, &req, 7).unwrap();
    cl.enqueue_request(sid, 1, b"small one", 8).unwrap();
    cl.enqueue_request(sid, 1, b"small two", 9).unwrap();
    cl.run_event_loop_once();
    assert_eq!(
        cl.tx_pending(),
        5,
        "three message packets and two rendered ones wait"
    );
    assert_eq!(cl.loop_stats().tx_pkts, sent, "nothing left");

    // The server hears nothing, so the session fails after failure_timeout.
    let failed = loop {
        assert!(Instant::now() < deadline, "session failure");
        cl.run_event_loop_once();
        if let Some(ev) = cl.poll_event() {
            break ev;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(
        failed,
        Event::RequestFailed {
            session: sid,
            tag: 7,
            error: SessionError::PeerFailed
        }
    );
    assert_eq!(cl.tx_pending(), 5, "still waiting");

    // Room for one datagram per burst: the three packets of the large request are not
    // sent, the two small ones go in two bursts.
    room.store(1, Ordering::Relaxed);
    cl.run_event_loop_once();
    assert_eq!(cl.loop_stats().tx_stale, 3);
    assert_eq!(
        cl.tx_pending(),
        1,
        "a partial burst: one small request left"
    );
    cl.run_event_loop_once();
    // Both small requests (then possibly a ping, see below) are out.
    assert!(cl.loop_stats().tx_pkts >= sent + 2);
    // Behind the tail, the keepalive pings queued while it was blocked (session-management
    // packets, harmless to the server) go out.
    room.store(usize::MAX, Ordering::Relaxed);
    while cl.tx_pending() > 0 {
        assert!(Instant::now() < deadline, "the rest leaves");
        cl.run_event_loop_once();
    }
    assert_eq!(cl.loop_stats().tx_stale, 3);
    assert_eq!(cl.transport().stats().tx_pkts, cl.loop_stats().tx_pkts);
    // The server saw exactly the two small requests, each with its own bytes.
    let mut got = Vec::new();
    while got.len() < 2 {
        assert!(Instant::now() < deadline, "the small requests arrive");
        sv.run_event_loop_once();
        while let Some(ev) = sv.poll_event() {
            if let Event::Request { data, .. } = ev {
                got.push(data.to_vec());
            }
        }
    }
    assert_eq!(got, [b"small one".to_vec(), b"small two".to_vec()]);
    let until = Instant::now() + Duration::from_millis(20);
    while Instant::now() < until {
        sv.run_event_loop_once();
    }
    assert_eq!(sv.core_stats().requests_dispatched, 2, "not the large one");
}

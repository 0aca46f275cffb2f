//! eRPC in lock step on the device model, for instruction counts (issue 5 §7;
//! `scripts/callgrind-erpc.sh`).
//!
//! One thread drives a client and a server [`Endpoint`], each over its own mlx5 UD transport
//! ([`UdTransport`]) on one simulated NIC each (`mlx5::sim::Fabric`, lossless, UD delivered at
//! the doorbell). Each round:
//! 1. `client_issue`: the client enqueues `qd` echo requests of `--size` bytes (default 32),
//!    spread over `ceil(qd / 8)` sessions (8 slots each);
//! 2. `client_poll`: one client event-loop iteration (transmits them as one TX burst);
//! 3. `server_serve`: one zero-copy server iteration (`rx_burst_zc`, each request answered in
//!    place with `reply_zc`, `finish_iteration` transmits the responses);
//! 4. `client_poll` again: one zero-copy client iteration receives the responses, which are
//!    checked byte for byte.
//!
//! A session that Timely slowed down (a late RTT sample, e.g. the thread was descheduled)
//! paces its packets through the timing wheel, so they may leave a later iteration: the round
//! then repeats steps 2-4 until every response is in (counted in `extra_iterations`).
//!
//! The three functions are `#[inline(never)]` so callgrind can attribute their inclusive
//! cost; the script subtracts the model (everything under the simulated doorbell).
//! Congestion control is on by default (`--cc off` disables Timely and pacing).
//!
//! ```text
//! cargo run --release --example erpc_lockstep -- 100000 --qd 1
//! ```
//! Prints `<rpcs> rpcs verified` and a CSV line with the core's counters.

use std::process::ExitCode;

use clap::Parser;
use rpc::erpc::core::{Config, Event, SLOTS_PER_SESSION, SessionId, Zc};
use rpc::erpc::datagram::ud::{UdConfig, UdTransport};
use rpc::erpc::event_loop::Endpoint;
use rpc::mlx5::sim::{Fabric, SimConfig};

#[derive(Parser, Debug)]
#[command(about = "eRPC echo in lock step over mlx5 UD on the device model (for callgrind)")]
struct Args {
    /// RPCs to run (rounded up to a multiple of --qd).
    #[arg(default_value_t = 100_000)]
    rpcs: u64,
    /// Requests per round (queue depth).
    #[arg(long, default_value_t = 1)]
    qd: usize,
    /// Request and response size in bytes (single packet: at most the MTU minus 16).
    #[arg(long, default_value_t = 32)]
    size: usize,
    /// Congestion control (Timely rate computation and wheel pacing) on or off.
    #[arg(long, default_value = "on")]
    cc: Switch,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Switch {
    On,
    Off,
}

type Ep = Endpoint<UdTransport>;

struct Client {
    ep: Ep,
    sessions: Vec<SessionId>,
    req: Vec<u8>,
    done: u64,
    connected: usize,
}

#[inline(never)]
fn client_issue(c: &mut Client, round: u64, qd: usize) {
    for k in 0..qd {
        let tag = round * qd as u64 + k as u64;
        c.req[..8].copy_from_slice(&tag.to_le_bytes());
        let s = c.sessions[k / SLOTS_PER_SESSION];
        c.ep.enqueue_request(s, 1, &c.req, tag).expect("enqueue");
    }
}

#[inline(never)]
fn client_poll(c: &mut Client) {
    let n = c.ep.rx_burst_zc();
    for k in 0..n {
        let (z, data) = c.ep.zc(k);
        if let Zc::Response { tag, .. } = z {
            assert_eq!(data.len(), c.req.len(), "response length");
            assert_eq!(&data[..8], &tag.to_le_bytes(), "response of tag {tag}");
            assert_eq!(&data[8..], &c.req[8..], "response body");
            c.done += 1;
        }
    }
    c.ep.finish_iteration();
    while let Some(ev) = c.ep.poll_event() {
        match ev {
            Event::Response { tag, data, .. } => {
                assert_eq!(&data[..8], &tag.to_le_bytes());
                c.done += 1;
                c.ep.recycle(data);
            }
            Event::SessionConnected(_) => c.connected += 1,
            other => panic!("unexpected client event {other:?}"),
        }
    }
}

#[inline(never)]
fn server_serve(s: &mut Ep) {
    let n = s.rx_burst_zc();
    for k in 0..n {
        s.reply_zc(k, 4096, |_, req, resp| {
            resp[..req.len()].copy_from_slice(req);
            req.len()
        })
        .expect("reply");
    }
    s.finish_iteration();
    while let Some(ev) = s.poll_event() {
        match ev {
            Event::Request { token, data, .. } => {
                s.reply(token, &data).expect("reply");
                s.recycle(data);
            }
            other => panic!("unexpected server event {other:?}"),
        }
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    if a.qd == 0 || a.size < 8 {
        eprintln!("--qd must be >= 1 and --size >= 8");
        return ExitCode::FAILURE;
    }
    let cfg = Config {
        cc_rate_comp: a.cc == Switch::On,
        cc_pacing: a.cc == Switch::On,
        ..Config::default()
    };
    // No progress thread: callgrind's instruction counts must come from this thread only.
    let fabric = Fabric::new(SimConfig::deterministic());
    let ud = || UdTransport::new(&fabric.open(), UdConfig::default()).expect("UD transport");
    let mut server = Endpoint::new(ud(), cfg.clone()).expect("server");
    let mut client = Client {
        ep: Endpoint::new(ud(), cfg).expect("client"),
        sessions: Vec::new(),
        req: (0..a.size).map(|i| i as u8).collect(),
        done: 0,
        connected: 0,
    };
    if a.size > client.ep.rpc().data_per_pkt() {
        eprintln!(
            "--size must fit one packet ({} B)",
            client.ep.rpc().data_per_pkt()
        );
        return ExitCode::FAILURE;
    }
    let peer = server.local_addr();
    let n_sessions = a.qd.div_ceil(SLOTS_PER_SESSION);
    client.sessions = (0..n_sessions)
        .map(|_| client.ep.create_session(peer).expect("session"))
        .collect();
    // Connect: lock-step rounds of session management, through the measured functions (so
    // that every doorbell happens inside them; the connect cost is negligible per RPC).
    for _ in 0..1000 {
        client_poll(&mut client);
        server_serve(&mut server);
        client_poll(&mut client);
        if client.connected == n_sessions {
            break;
        }
    }
    assert_eq!(client.connected, n_sessions, "sessions did not connect");

    let rounds = a.rpcs.div_ceil(a.qd as u64);
    let mut extra = 0u64;
    for round in 0..rounds {
        let want = client.done + a.qd as u64;
        client_issue(&mut client, round, a.qd);
        client_poll(&mut client);
        server_serve(&mut server);
        client_poll(&mut client);
        let mut spins = 0u64;
        while client.done < want {
            // Paced packets (see the module docs) leave in a later iteration.
            spins += 1;
            assert!(spins < 100_000_000, "round {round}: responses missing");
            client_poll(&mut client);
            server_serve(&mut server);
            client_poll(&mut client);
        }
        extra += spins;
    }
    let st = client.ep.core_stats();
    let ss = server.core_stats();
    println!("{} rpcs verified", client.done);
    println!(
        "qd,size,cc,rpcs,extra_iterations,client_tx_pkts,server_tx_pkts,rollbacks,timely_bypassed,wheel_paced"
    );
    println!(
        "{},{},{:?},{},{},{},{},{},{},{}",
        a.qd,
        a.size,
        a.cc,
        client.done,
        extra,
        st.tx_pkts,
        ss.tx_pkts,
        st.rollbacks,
        st.timely_bypassed,
        st.wheel_paced
    );
    ExitCode::SUCCESS
}

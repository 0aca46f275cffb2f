//! Back-to-back blocking calls of the generated stubs: a typed client ([`EchoClient`], `ping`,
//! 8 B each way) and a typed server ([`Server::spawn`]) in one process, one thread each, with
//! the blocking call's wait policy ([`rpc::erpc::idle::CallWait`]) on (`adaptive`, the
//! default) and off (`poll`: poll and yield until the response), alternated round by round so
//! that both see the same machine. `--transport` picks eRPC over UDP loopback (the default;
//! the client blocks in its socket, [`ErpcConfig::client_idle`]), the delegation ring or ipc
//! (the client sleeps on its futex word in the shared segment, `Delegation::set_call_wait`,
//! `Ipc::set_call_wait`; never from a thread pinned to one CPU).
//!
//! The policy matters where threads outnumber CPUs: run it next to a busy process
//! (`timeout 60 sh -c 'while :; do :; done' &`) to see the difference; on a quiet machine
//! both should measure the same.
//!
//! ```text
//! cargo run --release --example typed_blocking                       # 4 rounds of 30 000 calls
//! cargo run --release --example typed_blocking -- --transport delegation --rounds 6
//! cargo run --release --example typed_blocking -- --calls 50000 --rounds 6 --csv target/b.csv
//! ```
//! Output: CSV on stdout (or `--csv FILE`), columns `transport,client_idle,round,calls,seconds,
//! kcalls_per_s,p50_us,p99_us,p999_us,idle_waits_per_call` (`idle_waits`: the client's blocks
//! in its socket or sleeps on its word, [`rpc::erpc::ErpcClientStats::idle_waits`],
//! `RingClient::idle_waits`, `IpcClientStats::idle_waits`); a summary per mode (range over the
//! rounds) on stderr.

use std::fs::File;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use idl::echo::{EchoClient, EchoService, Echoer};
use rpc::delegation::{Delegation, DelegationConfig, DelegationServer};
use rpc::erpc::datagram::udp::UdpTransport;
use rpc::erpc::idle::{CallWait, IdleConfig, usable_cpus};
use rpc::erpc::{Erpc, ErpcConfig, ErpcServer};
use rpc::ipc::{Ipc, IpcConfig, IpcServer};
use rpc::{ClientTransport, Server, Service};
use serde::Serialize;
use tracing_subscriber::EnvFilter;

#[derive(Parser, Debug)]
#[command(about = "Blocking typed calls with the client's wait policy on and off")]
struct Cli {
    /// The transport.
    #[arg(long, value_enum, default_value_t = Transport::Erpc)]
    transport: Transport,
    /// Measured calls per round (after 1000 warm-up calls).
    #[arg(long, default_value_t = 30_000)]
    calls: u64,
    /// Rounds per mode, alternated.
    #[arg(long, default_value_t = 4)]
    rounds: u32,
    /// Modes to run.
    #[arg(long, value_delimiter = ',', default_value = "adaptive,poll")]
    modes: Vec<Mode>,
    /// Write the CSV here instead of stdout.
    #[arg(long)]
    csv: Option<String>,
}

/// The transport of the client and the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Transport {
    /// eRPC over UDP loopback.
    Erpc,
    /// The delegation ring (`/dev/shm`).
    Delegation,
    /// ipc (`/dev/shm`).
    Ipc,
}

/// The client's wait policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    /// `client_idle: Some(IdleConfig::default())` (the default).
    Adaptive,
    /// `client_idle: None`.
    Poll,
}

#[derive(Serialize)]
struct Row {
    transport: Transport,
    client_idle: Mode,
    round: u32,
    calls: u64,
    seconds: f64,
    kcalls_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    idle_waits_per_call: f64,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(io::stderr)
        .init();
    let cli = Cli::parse();
    let name = format!("typed-blocking-{}", std::process::id());
    let (handle, addr): (Box<dyn std::any::Any>, Option<SocketAddr>) = match cli.transport {
        Transport::Erpc => {
            let server = ErpcServer::bind(
                SocketAddr::from(([127, 0, 0, 1], 0)),
                EchoService::DESCRIPTOR,
            )
            .expect("bind the server");
            let addr = server.local_addr();
            let h = Server::<EchoService, _>::new(server)
                .spawn(|req| EchoService::dispatch(&mut Echoer, req));
            (Box::new(h), Some(addr))
        }
        Transport::Delegation => {
            let server = DelegationServer::serve::<EchoService>(&name, DelegationConfig::default())
                .expect("create the ring");
            let h = server.spawn(|req| EchoService::dispatch(&mut Echoer, req));
            (Box::new(h), None)
        }
        Transport::Ipc => {
            let server = IpcServer::serve::<EchoService>(&name, IpcConfig::default())
                .expect("create the segment");
            let h = server.spawn(|req| EchoService::dispatch(&mut Echoer, req));
            (Box::new(h), None)
        }
    };
    let out: Box<dyn Write> = match &cli.csv {
        Some(p) => Box::new(File::create(p).expect("create the CSV file")),
        None => Box::new(io::stdout()),
    };
    let mut csv = csv::Writer::from_writer(out);
    let mut rows = Vec::new();
    for round in 0..cli.rounds {
        for &mode in &cli.modes {
            let row = match (cli.transport, addr) {
                (Transport::Erpc, Some(addr)) => run_erpc(addr, mode, round, cli.calls),
                (Transport::Delegation, _) => {
                    let mut c = EchoClient::<Delegation>::connect(&name).expect("attach");
                    if mode == Mode::Poll {
                        c.transport_mut().set_call_wait(None);
                    }
                    measure(&mut c, Transport::Delegation, mode, round, cli.calls, |c| {
                        c.transport().ring().idle_waits()
                    })
                }
                (Transport::Ipc, _) => {
                    let mut c = EchoClient::<Ipc>::connect(&name).expect("attach");
                    c.transport_mut().set_call_wait(
                        (mode == Mode::Adaptive)
                            .then(|| CallWait::new(IdleConfig::default(), usable_cpus())),
                    );
                    measure(&mut c, Transport::Ipc, mode, round, cli.calls, |c| {
                        c.transport().stats().idle_waits
                    })
                }
                (Transport::Erpc, None) => unreachable!("eRPC has an address"),
            };
            csv.serialize(&row).expect("write CSV");
            csv.flush().expect("write CSV");
            rows.push(row);
        }
    }
    drop(handle);
    eprintln!("load {}", load());
    for &mode in &cli.modes {
        let r: Vec<&Row> = rows.iter().filter(|r| r.client_idle == mode).collect();
        let range = |f: fn(&Row) -> f64, digits: usize| {
            let lo = r.iter().map(|x| f(x)).fold(f64::INFINITY, f64::min);
            let hi = r.iter().map(|x| f(x)).fold(f64::NEG_INFINITY, f64::max);
            format!("{lo:.digits$}-{hi:.digits$}")
        };
        eprintln!(
            "{mode:?}: {} k calls/s, p50 {} us, p99 {} us, p99.9 {} us, idle waits per call {}",
            range(|x| x.kcalls_per_s, 1),
            range(|x| x.p50_us, 1),
            range(|x| x.p99_us, 1),
            range(|x| x.p999_us, 1),
            range(|x| x.idle_waits_per_call, 5),
        );
    }
}

/// One eRPC round: a new client with `mode`'s policy.
fn run_erpc(addr: SocketAddr, mode: Mode, round: u32, calls: u64) -> Row {
    let cfg = ErpcConfig {
        client_idle: match mode {
            Mode::Adaptive => Some(IdleConfig::default()),
            Mode::Poll => None,
        },
        ..ErpcConfig::default()
    };
    let t =
        Erpc::<UdpTransport>::connect_with(&addr, EchoService::DESCRIPTOR, &cfg).expect("connect");
    let mut c = EchoClient::from_transport(t);
    measure(&mut c, Transport::Erpc, mode, round, calls, |c| {
        c.transport().stats().idle_waits
    })
}

/// One round of client `c` over `transport` (its policy set for `mode`): 1000 warm-up calls,
/// then `calls` timed; `waits` reads the client's idle-wait counter.
fn measure<T: ClientTransport>(
    c: &mut EchoClient<T>,
    transport: Transport,
    mode: Mode,
    round: u32,
    calls: u64,
    waits: impl Fn(&EchoClient<T>) -> u64,
) -> Row {
    for i in 0..1000 {
        assert_eq!(c.ping(i).expect("warm-up call"), i);
    }
    let waits_before = waits(c);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let start = Instant::now();
    for i in 0..calls {
        let t0 = Instant::now();
        assert_eq!(c.ping(i).expect("call"), i, "wrong response");
        hist.saturating_record(t0.elapsed().as_nanos() as u64);
    }
    let seconds = start.elapsed().as_secs_f64();
    let waits = waits(c) - waits_before;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1e3;
    Row {
        transport,
        client_idle: mode,
        round,
        calls,
        seconds,
        kcalls_per_s: calls as f64 / seconds / 1e3,
        p50_us: us(0.5),
        p99_us: us(0.99),
        p999_us: us(0.999),
        idle_waits_per_call: waits as f64 / calls as f64,
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

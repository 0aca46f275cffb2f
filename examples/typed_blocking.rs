//! Back-to-back blocking calls of the generated stubs over eRPC on UDP loopback: a typed
//! client ([`EchoClient`]`<`[`Erpc`]`>`, `ping`, 8 B each way) and a typed server
//! ([`Server::spawn`]) in one process, one thread each, with the blocking call's wait policy
//! ([`ErpcConfig::client_idle`], [`rpc::erpc::idle::CallWait`]) on (`adaptive`, the default)
//! and off (`poll`: poll and yield until the response), alternated round by round so that
//! both see the same machine.
//!
//! The policy matters where threads outnumber CPUs: run it next to a busy process
//! (`timeout 60 sh -c 'while :; do :; done' &`) to see the difference; on a quiet machine
//! both should measure the same.
//!
//! ```text
//! cargo run --release --example typed_blocking                       # 4 rounds of 30 000 calls
//! cargo run --release --example typed_blocking -- --calls 50000 --rounds 6 --csv target/b.csv
//! ```
//! Output: CSV on stdout (or `--csv FILE`), columns `client_idle,round,calls,seconds,
//! kcalls_per_s,p50_us,p99_us,p999_us,idle_waits_per_call` (`idle_waits`: the client's blocks
//! in its socket, [`rpc::erpc::ErpcClientStats::idle_waits`]); a summary per mode (range over
//! the rounds) on stderr.

use std::fs::File;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use idl::echo::{EchoClient, EchoService, Echoer};
use rpc::erpc::datagram::udp::UdpTransport;
use rpc::erpc::idle::IdleConfig;
use rpc::erpc::{Erpc, ErpcConfig, ErpcServer};
use rpc::{Server, Service};
use serde::Serialize;
use tracing_subscriber::EnvFilter;

#[derive(Parser, Debug)]
#[command(about = "Blocking typed eRPC calls with the client's wait policy on and off")]
struct Cli {
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
    let server = ErpcServer::bind(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        EchoService::DESCRIPTOR,
    )
    .expect("bind the server");
    let addr = server.local_addr();
    let handle =
        Server::<EchoService, _>::new(server).spawn(|req| EchoService::dispatch(&mut Echoer, req));
    let out: Box<dyn Write> = match &cli.csv {
        Some(p) => Box::new(File::create(p).expect("create the CSV file")),
        None => Box::new(io::stdout()),
    };
    let mut csv = csv::Writer::from_writer(out);
    let mut rows = Vec::new();
    for round in 0..cli.rounds {
        for &mode in &cli.modes {
            let row = run(addr, mode, round, cli.calls);
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

/// One round: a new client with `mode`'s policy, 1000 warm-up calls, then `calls` timed.
fn run(addr: SocketAddr, mode: Mode, round: u32, calls: u64) -> Row {
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
    for i in 0..1000 {
        assert_eq!(c.ping(i).expect("warm-up call"), i);
    }
    let waits_before = c.transport().stats().idle_waits;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let start = Instant::now();
    for i in 0..calls {
        let t0 = Instant::now();
        assert_eq!(c.ping(i).expect("call"), i, "wrong response");
        hist.saturating_record(t0.elapsed().as_nanos() as u64);
    }
    let seconds = start.elapsed().as_secs_f64();
    let waits = c.transport().stats().idle_waits - waits_before;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1e3;
    Row {
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

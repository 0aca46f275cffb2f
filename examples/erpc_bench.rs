//! eRPC against tarpc on this machine, in one run (issue 5 §7): small-RPC echo throughput and
//! latency at a queue depth, and large-message goodput.
//!
//! Both systems run the same workload, one after the other, each with one server thread and
//! one client thread (two cores):
//! - **eRPC**: [`Endpoint`] (the sans-I/O core plus its event loop) over UDP loopback
//!   ([`UdpTransport`], `sendmmsg`/`recvmmsg`). The server thread spins on
//!   `run_event_loop_once` and answers each [`Event::Request`] with [`Endpoint::reply`]; the
//!   client thread keeps `QD` requests outstanding. Two session layouts: `multi` (the
//!   headline) spreads the calls over `ceil(QD / 8)` sessions, so each session has at most
//!   its 8 slots busy and every call is on the wire at once; `single` puts all calls on one
//!   session, where at most 8 are in flight and the rest wait in the core's backlog (it is run
//!   only when `QD > 8`, where it differs).
//! - **tarpc** (0.38): a `#[tarpc::service]` over TCP loopback with
//!   `tarpc::serde_transport` (length-delimited frames, bincode codec, `TCP_NODELAY` on both
//!   sides), each side on its own `current_thread` tokio runtime in its own OS thread. The
//!   server executes requests as tarpc's examples do (`BaseChannel::execute`, one spawned
//!   task per request); the client keeps `QD` calls in flight from one task
//!   (`FuturesUnordered`).
//!
//! Workloads:
//! - `echo` (default): `--size` byte requests echoed back (default 32 B), at each `--qd`
//!   (default 32). Reported per system: throughput (Krps), per-call latency (issue to
//!   completion, hdrhistogram, µs: p50/p99/p99.9) and the ratio eRPC/tarpc; the issue's
//!   target, eRPC ≥ 5× tarpc at QD 32, is checked and printed.
//! - `large`: requests of each `--sizes` bytes (default 64 KiB, 1 MiB, 8 MiB, the core's
//!   maximum message, `msgbuf::MAX_DATA_SIZE`) answered with an 8-byte length; reported as
//!   goodput in Gbit/s of request payload, `--qd` messages in flight (default 1), each on its
//!   own eRPC session (so each message has a full credit window).
//!
//! Every response is checked (echo: the bytes sent; large: the length). A warm-up of a fifth
//! of `--duration` precedes each measured window; throughput counts completions inside the
//! window, latency is recorded for calls issued and completed inside it.
//!
//! ```text
//! cargo run --release --example erpc_bench                          # echo, QD 32, 2 s each
//! cargo run --release --example erpc_bench -- --qd 1,8,32 --csv target/erpc_echo.csv
//! cargo run --release --example erpc_bench -- large --sizes 65536,1048576 --duration 1
//! cargo run --release --example erpc_bench -- echo --only erpc --qd 32   # eRPC alone
//! ```
//! Output: CSV on stdout (or `--csv FILE`); the human summary goes to stderr.
//!
//! The eRPC side is generic over [`DatagramTransport`] (`erpc_echo`, `erpc_large`):
//! `--transport udp` (default) or `--transport ud`, mlx5 UD queue pairs on the device model
//! (two simulated NICs of one `mlx5::sim::Fabric`). The model executes each send inside the
//! sender's doorbell, under the fabric's lock, so UD figures measure the protocol plus the
//! model on this machine, not a NIC. `--cc off` turns eRPC's congestion control (Timely rate
//! computation and pacing) off; the default is eRPC's (on). eRPC's retransmission timeout is
//! the core's default (5 ms): on an overloaded machine, a spinning thread descheduled for
//! longer triggers go-back-N, visible in the `retransmits` column. Both eRPC loops spin,
//! then block between iterations that found nothing ([`Endpoint::idle_wait`], `--idle
//! adaptive`, the default): on a machine with more runnable threads than cores this keeps a
//! busy neighbour from starving the exchange. `--idle poll` polls without pause, as eRPC's
//! dispatch thread does (and as every figure measured before 2026-12-02 did).
//!
//! CSV columns: `mode,system,transport,layout,qd,size_bytes,sessions,calls` (completions in
//! the window), `seconds` (window), `krps`, `gbps` (request payload), `p50_us,p99_us,p999_us`,
//! `ratio_vs_tarpc` (throughput), and for eRPC `retransmits` (client, go-back-N),
//! `client_pkts_per_call`, datagrams per `sendmmsg`/`recvmmsg` (or doorbell/CQ poll) on each
//! side, client event-loop iterations per call, the share of client packets paced and of RTT
//! samples that updated a Timely rate, and the blocks of the client's and server's idle policy
//! per call (`--idle adaptive`).

use std::fs::File;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use hdrhistogram::Histogram;
use rpc::erpc::core::{Config, Event, MS, SLOTS_PER_SESSION, SessionId, Stats};
use rpc::erpc::datagram::ud::{UdConfig, UdTransport};
use rpc::erpc::datagram::udp::{UdpConfig, UdpMtu, UdpTransport};
use rpc::erpc::datagram::{DatagramTransport, TransportStats};
use rpc::erpc::event_loop::Endpoint;
use rpc::erpc::idle::{IdleConfig, IdleStats};
use rpc::erpc::msgbuf::MAX_DATA_SIZE;
use rpc::mlx5::sim::{Fabric, SimConfig};
use tarpc::server::Channel;
use tarpc::tokio_serde::formats::Bincode;
use tarpc::tokio_util::codec::LengthDelimitedCodec;
use tarpc::{client, context, serde_transport, server};

#[derive(Parser, Debug)]
#[command(
    about = "eRPC (UDP) vs tarpc (TCP) on loopback: echo throughput/latency and large-message goodput",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Options of the default workload (`echo`).
    #[command(flatten)]
    echo: EchoArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Small-RPC echo at a queue depth (the default workload).
    Echo(EchoArgs),
    /// Large requests (small responses): goodput of request payload.
    Large(LargeArgs),
}

/// Which systems to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Only {
    Both,
    Erpc,
    Tarpc,
}

/// A switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

/// The eRPC datagram transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum TransportKind {
    /// UDP sockets on 127.0.0.1 (`sendmmsg`/`recvmmsg`).
    Udp,
    /// mlx5 UD queue pairs on the device model (`mlx5::sim::Fabric`, two simulated NICs).
    Ud,
}

impl TransportKind {
    fn name(self) -> &'static str {
        match self {
            TransportKind::Udp => "udp",
            TransportKind::Ud => "ud-sim",
        }
    }
}

#[derive(Args, Debug, Clone)]
struct Common {
    /// Seconds measured per configuration (after a warm-up of a fifth of it).
    #[arg(long, default_value_t = 2.0)]
    duration: f64,
    /// Write the CSV here instead of stdout.
    #[arg(long)]
    csv: Option<String>,
    /// Systems to measure.
    #[arg(long, value_enum, default_value_t = Only::Both)]
    only: Only,
    /// eRPC transport.
    #[arg(long, value_enum, default_value_t = TransportKind::Udp)]
    transport: TransportKind,
    /// eRPC datagram size in bytes, header included [default: UDP derives it from the
    /// loopback link (8972 when the socket buffer admits it, else 1472; max 65507), UD 3840
    /// (max: the port MTU)].
    #[arg(long)]
    mtu: Option<usize>,
    /// eRPC credits (packets in flight) per session.
    #[arg(long, default_value_t = 8)]
    credits: usize,
    /// eRPC congestion control (Timely rate computation and wheel pacing): `on` is eRPC's
    /// default; `off` keeps every session at the link rate.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    cc: OnOff,
    /// Completion events over which Timely's RTT input is filtered (`Config::cc_rtt_filter_events`;
    /// 1: each event's sample as eRPC feeds it).
    #[arg(long, default_value_t = Config::default().cc_rtt_filter_events)]
    rtt_filter: usize,
    /// `SO_SNDBUF`/`SO_RCVBUF` of the eRPC UDP sockets, bytes (capped by the kernel).
    #[arg(long, default_value_t = 4 << 20)]
    sockbuf: usize,
    /// What the eRPC client and server loops do after an iteration that found nothing:
    /// `adaptive` polls on for an adaptive window, then blocks in the transport until a
    /// datagram arrives, after 4 yields of the CPU while the machine has more runnable
    /// threads than CPUs (`Endpoint::idle_wait`, `rpc::erpc::idle`); `poll` polls without pause (eRPC's
    /// dispatch thread on a core of its own; the only mode before 2026-12-02).
    #[arg(long, value_enum, default_value_t = IdleMode::Adaptive)]
    idle: IdleMode,
}

/// The eRPC loops' idle policy (`--idle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum IdleMode {
    /// Spin, then block until a datagram arrives (`IdleConfig::default()`).
    Adaptive,
    /// Poll without pause.
    Poll,
}

impl IdleMode {
    fn config(self) -> Option<IdleConfig> {
        match self {
            IdleMode::Adaptive => Some(IdleConfig::default()),
            IdleMode::Poll => None,
        }
    }
}

#[derive(Args, Debug, Clone)]
struct EchoArgs {
    /// Calls in flight (comma-separated list runs each in turn).
    #[arg(long, value_delimiter = ',', default_value = "32")]
    qd: Vec<usize>,
    /// Request and response payload, bytes (>= 8).
    #[arg(long, default_value_t = 32)]
    size: usize,
    /// eRPC session layouts: `multi` = ceil(QD/8) sessions (headline), `single` = one session
    /// plus the core's backlog (run only for QD > 8).
    #[arg(long, value_delimiter = ',', default_value = "multi,single")]
    layout: Vec<Layout>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug, Clone)]
struct LargeArgs {
    /// Request sizes in bytes (at most 8 MiB, the core's maximum message).
    #[arg(long, value_delimiter = ',', default_value = "65536,1048576,8388608")]
    sizes: Vec<usize>,
    /// Messages in flight (each on its own eRPC session).
    #[arg(long, default_value_t = 1)]
    qd: usize,
    #[command(flatten)]
    common: Common,
}

/// How the eRPC client spreads its calls over sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Layout {
    /// `ceil(QD / 8)` sessions, at most 8 calls (one per slot) on each.
    Multi,
    /// One session; calls beyond its 8 slots wait in the core's backlog.
    Single,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Multi => "multi",
            Layout::Single => "single",
        }
    }
}

/// What a server answers and a client expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    /// Response = request.
    Echo,
    /// Response = the request's length as 8 little-endian bytes.
    Sink,
}

/// eRPC request type used for every call (the server does not look at it).
const REQ_TYPE: u8 = 1;
/// Histogram bounds: 1 ns .. 60 s.
const HIST_MAX_NS: u64 = 60_000_000_000;
/// Time given to outstanding calls to finish after a window, and to connection setup.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// One measured configuration.
struct Row {
    mode: &'static str,
    system: &'static str,
    transport: &'static str,
    layout: &'static str,
    qd: usize,
    size: usize,
    sessions: usize,
    /// Completions inside the measured window.
    calls: u64,
    /// Length of the measured window, s.
    secs: f64,
    /// Per-call latency, ns.
    hist: Histogram<u64>,
    /// eRPC: go-back-N retransmitted packets (client); tarpc: empty.
    retransmits: Option<u64>,
    /// eRPC: client datagrams sent per completed call, whole run; tarpc: empty.
    pkts_per_call: Option<f64>,
    /// eRPC: batching, whole run; tarpc: empty.
    batching: Option<Batching>,
}

/// eRPC datagrams per system call (`sendmmsg`/`recvmmsg` that returned at least one), and
/// client event-loop iterations per completed call, over a whole run.
#[derive(Clone, Copy, Debug)]
struct Batching {
    client_tx: f64,
    client_rx: f64,
    server_tx: f64,
    server_rx: f64,
    client_iters_per_call: f64,
    /// Client packets paced through the timing wheel / all client packets that could be.
    client_paced_frac: f64,
    /// Client RTT samples that updated a Timely rate / all RTT samples.
    client_timely_frac: f64,
    /// Blocks of the client's / server's idle policy per completed call (`--idle adaptive`).
    client_blocks_per_call: f64,
    server_blocks_per_call: f64,
}

fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / b.max(1) as f64
}

impl Row {
    fn krps(&self) -> f64 {
        self.calls as f64 / self.secs / 1e3
    }

    /// Request payload goodput, Gbit/s.
    fn gbps(&self) -> f64 {
        self.calls as f64 * self.size as f64 * 8.0 / self.secs / 1e9
    }

    fn q_us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1e3
    }
}

const CSV_HEADER: &str = "mode,system,transport,layout,qd,size_bytes,sessions,calls,seconds,krps,gbps,p50_us,p99_us,p999_us,ratio_vs_tarpc,retransmits,client_pkts_per_call,client_tx_batch,client_rx_batch,server_tx_batch,server_rx_batch,client_iters_per_call,client_paced_frac,client_timely_frac,client_idle_blocks_per_call,server_idle_blocks_per_call";

fn csv_line(r: &Row, tarpc_krps: Option<f64>) -> String {
    let ratio = tarpc_krps
        .filter(|&t| t > 0.0)
        .map_or(String::new(), |t| format!("{:.3}", r.krps() / t));
    format!(
        "{},{},{},{},{},{},{},{},{:.3},{:.2},{:.4},{:.2},{:.2},{:.2},{},{},{},{}",
        r.mode,
        r.system,
        r.transport,
        r.layout,
        r.qd,
        r.size,
        r.sessions,
        r.calls,
        r.secs,
        r.krps(),
        r.gbps(),
        r.q_us(0.5),
        r.q_us(0.99),
        r.q_us(0.999),
        ratio,
        r.retransmits.map_or(String::new(), |v| v.to_string()),
        r.pkts_per_call.map_or(String::new(), |v| format!("{v:.2}")),
        r.batching.map_or(",,,,,,,,".into(), |b| format!(
            "{:.2},{:.2},{:.2},{:.2},{:.2},{:.3},{:.3},{:.3},{:.3}",
            b.client_tx,
            b.client_rx,
            b.server_tx,
            b.server_rx,
            b.client_iters_per_call,
            b.client_paced_frac,
            b.client_timely_frac,
            b.client_blocks_per_call,
            b.server_blocks_per_call
        )),
    )
}

/// CSV sink: stdout or a file; lines are flushed as they are written.
struct Csv(Box<dyn Write>);

impl Csv {
    fn open(path: Option<&str>) -> io::Result<Csv> {
        let w: Box<dyn Write> = match path {
            Some(p) => Box::new(File::create(p)?),
            None => Box::new(io::stdout()),
        };
        let mut c = Csv(w);
        c.line(CSV_HEADER);
        Ok(c)
    }

    fn line(&mut self, s: &str) {
        writeln!(self.0, "{s}")
            .and_then(|()| self.0.flush())
            .expect("write csv");
    }
}

fn main() {
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::Echo(a)) => echo_main(&a),
        None => echo_main(&cli.echo),
        Some(Cmd::Large(a)) => large_main(&a),
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn durations(c: &Common) -> (Duration, Duration) {
    let d = Duration::from_secs_f64(c.duration.max(0.01));
    (d / 5, d)
}

fn erpc_config(c: &Common, max_msg: usize) -> Config {
    Config {
        session_credits: c.credits,
        // A loop starved by a loaded 2-core machine must not be mistaken for a dead peer.
        failure_timeout: 5_000 * MS,
        max_msg_size: max_msg,
        cc_rate_comp: c.cc == OnOff::On,
        cc_pacing: c.cc == OnOff::On,
        cc_rtt_filter_events: c.rtt_filter,
        ..Config::default()
    }
}

fn udp(c: &Common) -> UdpTransport {
    UdpTransport::bind(UdpConfig {
        mtu: c.mtu.map_or(UdpMtu::Auto, UdpMtu::Fixed),
        socket_buf_bytes: Some(c.sockbuf),
        ..UdpConfig::default()
    })
    .expect("bind UDP socket")
}

/// A UD transport on a new simulated NIC of `fabric`, with eRPC's defaults (and `--mtu`).
fn ud(c: &Common, fabric: &Fabric) -> UdTransport {
    let ctx = fabric.open();
    let mut cfg = UdConfig::for_port(&ctx.port());
    if let Some(mtu) = c.mtu {
        cfg.mtu = mtu;
    }
    UdTransport::new(&ctx, cfg).expect("UD transport")
}

fn echo_main(a: &EchoArgs) {
    let c = &a.common;
    let size = a.size.max(8);
    let (warm, dur) = durations(c);
    let mut csv = Csv::open(c.csv.as_deref()).expect("open csv");
    eprintln!(
        "erpc_bench echo: {size} B echo, QD {:?}, {:.2} s per point, eRPC idle {:?}, load average {}",
        a.qd,
        dur.as_secs_f64(),
        c.idle,
        load()
    );
    let mut summary = Vec::new();
    for &qd in &a.qd {
        let qd = qd.max(1);
        let tarpc = (c.only != Only::Erpc).then(|| tarpc_run(Workload::Echo, qd, size, warm, dur));
        let tk = tarpc.as_ref().map(Row::krps);
        if let Some(r) = &tarpc {
            csv.line(&csv_line(r, tk));
        }
        let mut erpc_rows = Vec::new();
        if c.only != Only::Tarpc {
            for &layout in &a.layout {
                if layout == Layout::Single && qd <= SLOTS_PER_SESSION {
                    continue; // identical to `multi`
                }
                let r = match c.transport {
                    TransportKind::Udp => erpc_echo(udp(c), udp(c), c, layout, qd, size, warm, dur),
                    TransportKind::Ud => {
                        let f = Fabric::new(SimConfig::default());
                        erpc_echo(ud(c, &f), ud(c, &f), c, layout, qd, size, warm, dur)
                    }
                };
                csv.line(&csv_line(&r, tk));
                erpc_rows.push(r);
            }
        }
        summary.push((qd, tarpc, erpc_rows));
    }
    eprintln!();
    for (qd, tarpc, erpc_rows) in &summary {
        eprintln!("QD {qd}:");
        let tk = tarpc.as_ref().map(Row::krps);
        for r in tarpc.iter().chain(erpc_rows) {
            let ratio = tk.map_or(String::new(), |t| format!("  {:.2}x tarpc", r.krps() / t));
            eprintln!(
                "  {:<6} {:<6} {:>2} sess  {:>9.1} Krps  p50 {:>8.1} µs  p99 {:>8.1} µs{ratio}",
                r.system,
                r.layout,
                r.sessions,
                r.krps(),
                r.q_us(0.5),
                r.q_us(0.99),
            );
        }
        let headline = erpc_rows.iter().find(|r| r.layout == "multi");
        if let (32, Some(t), Some(e)) = (*qd, tk, headline) {
            let ratio = e.krps() / t;
            eprintln!(
                "  target eRPC >= 5x tarpc at QD 32 (multi layout): {} ({ratio:.2}x)",
                if ratio >= 5.0 { "MET" } else { "NOT MET" }
            );
        }
    }
    eprintln!("load average after the run: {}", load());
}

fn large_main(a: &LargeArgs) {
    let c = &a.common;
    let qd = a.qd.max(1);
    let (warm, dur) = durations(c);
    let mut csv = Csv::open(c.csv.as_deref()).expect("open csv");
    eprintln!(
        "erpc_bench large: sizes {:?} B, QD {qd}, {:.2} s per point, eRPC idle {:?}, load average {}",
        a.sizes,
        dur.as_secs_f64(),
        c.idle,
        load()
    );
    let mut summary = Vec::new();
    for &size in &a.sizes {
        let size = size.clamp(8, MAX_DATA_SIZE);
        let tarpc = (c.only != Only::Erpc).then(|| tarpc_run(Workload::Sink, qd, size, warm, dur));
        let tk = tarpc.as_ref().map(Row::krps);
        if let Some(r) = &tarpc {
            csv.line(&csv_line(r, tk));
        }
        let erpc = (c.only != Only::Tarpc).then(|| match c.transport {
            TransportKind::Udp => erpc_large(udp(c), udp(c), c, qd, size, warm, dur),
            TransportKind::Ud => {
                let f = Fabric::new(SimConfig::default());
                erpc_large(ud(c, &f), ud(c, &f), c, qd, size, warm, dur)
            }
        });
        if let Some(r) = &erpc {
            csv.line(&csv_line(r, tk));
        }
        summary.push((size, tarpc, erpc));
    }
    eprintln!();
    for (size, tarpc, erpc) in &summary {
        eprintln!("{size} B requests, QD {qd}:");
        let tk = tarpc.as_ref().map(Row::krps);
        for r in tarpc.iter().chain(erpc) {
            let ratio = tk.map_or(String::new(), |t| format!("  {:.2}x tarpc", r.krps() / t));
            eprintln!(
                "  {:<6} {:>8.2} Gbit/s  {:>8.2} Krps  p50 {:>9.1} µs  p99 {:>9.1} µs{ratio}",
                r.system,
                r.gbps(),
                r.krps(),
                r.q_us(0.5),
                r.q_us(0.99),
            );
        }
    }
    eprintln!("load average after the run: {}", load());
}

// ---------------------------------------------------------------------------------------------
// eRPC
// ---------------------------------------------------------------------------------------------

/// Spawns an eRPC server on `transport`: spins on the event loop and answers every request
/// according to `work` until `stop` is set. Returns its address and thread.
fn spawn_erpc_server<T>(
    transport: T,
    cfg: Config,
    idle: Option<IdleConfig>,
    work: Workload,
    stop: Arc<AtomicBool>,
) -> (
    T::Addr,
    thread::JoinHandle<(u64, TransportStats, IdleStats)>,
)
where
    T: DatagramTransport + Send + 'static,
    T::Addr: Send,
{
    let mut ep = Endpoint::new(transport, cfg).expect("eRPC server config");
    ep.set_idle(idle);
    let addr = ep.local_addr();
    let h = thread::Builder::new()
        .name("erpc-server".into())
        .spawn(move || {
            let mut handled = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let n = ep.run_event_loop_once();
                while let Some(ev) = ep.poll_event() {
                    if let Event::Request { token, data, .. } = ev {
                        handled += 1;
                        let r = match work {
                            Workload::Echo => ep.reply(token, &data),
                            Workload::Sink => ep.reply(token, &(data.len() as u64).to_le_bytes()),
                        };
                        r.expect("reply");
                        ep.recycle(data);
                    }
                }
                ep.idle_wait(n);
            }
            (handled, ep.transport().stats(), ep.idle_stats())
        })
        .expect("spawn server thread");
    (addr, h)
}

/// Opens `n` sessions from `ep` to `peer` and waits until all are connected.
fn erpc_connect<T: DatagramTransport>(
    ep: &mut Endpoint<T>,
    peer: T::Addr,
    n: usize,
) -> Vec<SessionId> {
    let sessions: Vec<_> = (0..n)
        .map(|_| ep.create_session(peer).expect("create_session"))
        .collect();
    let start = Instant::now();
    let mut connected = 0;
    while connected < n {
        assert!(start.elapsed() < DRAIN_TIMEOUT, "eRPC connect timed out");
        ep.run_event_loop_once();
        while let Some(ev) = ep.poll_event() {
            match ev {
                Event::SessionConnected(_) => connected += 1,
                other => panic!("unexpected event while connecting: {other:?}"),
            }
        }
    }
    sessions
}

/// Parameters of one eRPC closed-loop run.
struct ErpcRun {
    work: Workload,
    /// Calls in flight.
    qd: usize,
    /// Request payload, bytes.
    size: usize,
    /// Number of sessions; call slot `k` uses session `k * sessions / qd`.
    sessions: usize,
    warm: Duration,
    dur: Duration,
    /// Idle policy of both loops (`--idle`).
    idle: Option<IdleConfig>,
}

/// Runs `run` between a server on `server_t` (its own thread) and a client on `client_t`
/// (another thread) and returns the client's figures.
fn erpc_closed_loop<T>(server_t: T, client_t: T, cfg: Config, run: ErpcRun) -> (ErpcOut, Batching)
where
    T: DatagramTransport + Send + 'static,
    T::Addr: Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let (addr, server) = spawn_erpc_server(server_t, cfg.clone(), run.idle, run.work, stop.clone());
    let mut ep = Endpoint::new(client_t, cfg).expect("eRPC client config");
    ep.set_idle(run.idle);
    let client = thread::Builder::new()
        .name("erpc-client".into())
        .spawn(move || {
            let s = erpc_connect(&mut ep, addr, run.sessions);
            erpc_client(&mut ep, &s, &run)
        })
        .expect("spawn client thread");
    let out = client.join().expect("eRPC client thread");
    stop.store(true, Ordering::Relaxed);
    let (handled, st, server_idle) = server.join().expect("eRPC server thread");
    assert!(
        handled >= out.completed,
        "server handled fewer calls than completed"
    );
    let ct = &out.transport;
    let batching = Batching {
        client_tx: ratio(ct.tx_pkts, ct.tx_calls),
        client_rx: ratio(ct.rx_pkts, ct.rx_calls),
        server_tx: ratio(st.tx_pkts, st.tx_calls),
        server_rx: ratio(st.rx_pkts, st.rx_calls),
        client_iters_per_call: ratio(out.iterations, out.completed),
        client_paced_frac: ratio(
            out.core.wheel_paced,
            out.core.wheel_paced + out.core.wheel_bypassed,
        ),
        client_timely_frac: ratio(out.core.timely_updates, out.core.rtt_samples),
        client_blocks_per_call: ratio(out.idle.blocks, out.completed),
        server_blocks_per_call: ratio(server_idle.blocks, out.completed),
    };
    (out, batching)
}

/// What the eRPC client measured.
struct ErpcOut {
    calls: u64,
    secs: f64,
    hist: Histogram<u64>,
    /// Completions over the whole run (warm-up and drain included).
    completed: u64,
    retransmits: u64,
    tx_pkts: u64,
    /// Client event-loop iterations.
    iterations: u64,
    /// The client transport's counters.
    transport: TransportStats,
    /// The client core's counters.
    core: Stats,
    /// The client loop's idle policy counters.
    idle: IdleStats,
}

/// The client loop: keeps `run.qd` calls outstanding, checks each response, measures.
fn erpc_client<T: DatagramTransport>(
    ep: &mut Endpoint<T>,
    sessions: &[SessionId],
    run: &ErpcRun,
) -> ErpcOut {
    let qd = run.qd;
    // One request buffer per call slot; its first 8 bytes carry the call's sequence number.
    let mut bufs: Vec<Vec<u8>> = (0..qd)
        .map(|k| (0..run.size).map(|i| (i * 7 + k) as u8).collect())
        .collect();
    let mut issued_at = vec![Instant::now(); qd];
    let mut seq_of = vec![0u64; qd];
    let mut hist = Histogram::<u64>::new_with_bounds(1, HIST_MAX_NS, 3).expect("histogram");
    let mut seq = 0u64;
    let issue = |ep: &mut Endpoint<T>, k: usize, seq: u64, buf: &mut [u8]| {
        buf[..8].copy_from_slice(&seq.to_le_bytes());
        let s = sessions[k * sessions.len() / qd];
        ep.enqueue_request(s, REQ_TYPE, buf, k as u64)
            .expect("enqueue_request");
    };
    let start = Instant::now();
    let warm_end = start + run.warm;
    let end = warm_end + run.dur;
    for k in 0..qd {
        issue(ep, k, seq, &mut bufs[k]);
        issued_at[k] = Instant::now();
        seq_of[k] = seq;
        seq += 1;
    }
    let mut outstanding = qd;
    let (mut calls, mut completed) = (0u64, 0u64);
    let mut drain_deadline = None;
    while outstanding > 0 {
        let work = ep.run_event_loop_once();
        let mut now = None;
        while let Some(ev) = ep.poll_event() {
            let (tag, data) = match ev {
                Event::Response { tag, data, .. } => (tag, data),
                other => panic!("unexpected client event: {other:?}"),
            };
            let t = *now.get_or_insert_with(Instant::now);
            let k = tag as usize;
            let want = seq_of[k];
            match run.work {
                Workload::Echo => assert!(data == bufs[k], "echo of call {want} differs"),
                Workload::Sink => assert_eq!(
                    data,
                    (run.size as u64).to_le_bytes(),
                    "length of call {want}"
                ),
            }
            ep.recycle(data);
            completed += 1;
            outstanding -= 1;
            if t > warm_end && t <= end {
                calls += 1;
                if issued_at[k] >= warm_end {
                    let ns = (t - issued_at[k]).as_nanos() as u64;
                    hist.record(ns.clamp(1, HIST_MAX_NS)).expect("record");
                }
            }
            if t <= end {
                issue(ep, k, seq, &mut bufs[k]);
                issued_at[k] = Instant::now();
                seq_of[k] = seq;
                seq += 1;
                outstanding += 1;
            }
        }
        if outstanding > 0 && now.is_none() {
            let t = Instant::now();
            if t > end {
                let d = *drain_deadline.get_or_insert(t + DRAIN_TIMEOUT);
                assert!(
                    t < d,
                    "eRPC calls did not drain: {outstanding} outstanding, core {:?}",
                    ep.core_stats()
                );
            }
        }
        ep.idle_wait(work);
    }
    let st = ep.core_stats();
    ErpcOut {
        calls,
        secs: run.dur.as_secs_f64(),
        hist,
        completed,
        retransmits: st.retransmitted_pkts,
        tx_pkts: ep.loop_stats().tx_pkts,
        iterations: ep.loop_stats().iterations,
        transport: ep.transport().stats(),
        core: st.clone(),
        idle: ep.idle_stats(),
    }
}

/// eRPC echo of `size`-byte messages at depth `qd` between two endpoints on `server_t` and
/// `client_t` (any [`DatagramTransport`]), with the given session `layout`.
#[allow(clippy::too_many_arguments)]
fn erpc_echo<T>(
    server_t: T,
    client_t: T,
    c: &Common,
    layout: Layout,
    qd: usize,
    size: usize,
    warm: Duration,
    dur: Duration,
) -> Row
where
    T: DatagramTransport + Send + 'static,
    T::Addr: Send,
{
    let sessions = match layout {
        Layout::Multi => qd.div_ceil(SLOTS_PER_SESSION),
        Layout::Single => 1,
    };
    let cfg = erpc_config(c, MAX_DATA_SIZE);
    let o = erpc_closed_loop(
        server_t,
        client_t,
        cfg,
        ErpcRun {
            work: Workload::Echo,
            qd,
            size,
            sessions,
            warm,
            dur,
            idle: c.idle.config(),
        },
    );
    erpc_row("echo", c, layout.name(), qd, size, sessions, o)
}

/// eRPC large requests of `size` bytes answered with 8 bytes, `qd` in flight, one session each.
fn erpc_large<T>(
    server_t: T,
    client_t: T,
    c: &Common,
    qd: usize,
    size: usize,
    warm: Duration,
    dur: Duration,
) -> Row
where
    T: DatagramTransport + Send + 'static,
    T::Addr: Send,
{
    let cfg = erpc_config(c, MAX_DATA_SIZE);
    let o = erpc_closed_loop(
        server_t,
        client_t,
        cfg,
        ErpcRun {
            work: Workload::Sink,
            qd,
            size,
            sessions: qd,
            warm,
            dur,
            idle: c.idle.config(),
        },
    );
    erpc_row("large", c, "multi", qd, size, qd, o)
}

fn erpc_row(
    mode: &'static str,
    c: &Common,
    layout: &'static str,
    qd: usize,
    size: usize,
    sessions: usize,
    (o, batching): (ErpcOut, Batching),
) -> Row {
    Row {
        mode,
        system: "erpc",
        transport: c.transport.name(),
        layout,
        qd,
        size,
        sessions,
        calls: o.calls,
        secs: o.secs,
        hist: o.hist,
        retransmits: Some(o.retransmits),
        pkts_per_call: Some(ratio(o.tx_pkts, o.completed)),
        batching: Some(batching),
    }
}

// ---------------------------------------------------------------------------------------------
// tarpc
// ---------------------------------------------------------------------------------------------

/// The tarpc service: the same two operations the eRPC server performs.
#[tarpc::service]
trait Bench {
    /// Returns the request.
    async fn echo(data: Bytes) -> Bytes;
    /// Returns the request's length in bytes.
    async fn sink(data: Bytes) -> u64;
}

#[derive(Clone)]
struct BenchServer;

impl Bench for BenchServer {
    async fn echo(self, _: context::Context, data: Bytes) -> Bytes {
        data
    }

    async fn sink(self, _: context::Context, data: Bytes) -> u64 {
        data.len() as u64
    }
}

/// Largest tarpc frame, bytes: an 8 MiB request plus bincode and tarpc framing.
const TARPC_MAX_FRAME: usize = 2 * MAX_DATA_SIZE;

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A length-delimited bincode tarpc transport over `stream` (with `TCP_NODELAY`).
fn tarpc_transport<In, Out>(
    stream: tokio::net::TcpStream,
) -> serde_transport::Transport<tokio::net::TcpStream, In, Out, Bincode<In, Out>>
where
    In: for<'de> serde::Deserialize<'de>,
    Out: serde::Serialize,
{
    stream.set_nodelay(true).expect("TCP_NODELAY");
    let framed = LengthDelimitedCodec::builder()
        .max_frame_length(TARPC_MAX_FRAME)
        .new_framed(stream);
    serde_transport::new(framed, Bincode::default())
}

/// Runs `work` over tarpc at depth `qd` with `size`-byte requests: server and client each on
/// a `current_thread` runtime in its own thread.
fn tarpc_run(work: Workload, qd: usize, size: usize, warm: Duration, dur: Duration) -> Row {
    let listener = std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .expect("bind TCP listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("local addr");
    let server = thread::Builder::new()
        .name("tarpc-server".into())
        .spawn(move || {
            current_thread_runtime().block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let (stream, _) = listener.accept().await.expect("accept");
                let channel = server::BaseChannel::with_defaults(tarpc_transport(stream));
                // Ends when the client closes the connection.
                channel
                    .execute(BenchServer.serve())
                    .for_each(|resp| async move {
                        tokio::spawn(resp);
                    })
                    .await;
            });
        })
        .expect("spawn tarpc server");
    let client = thread::Builder::new()
        .name("tarpc-client".into())
        .spawn(move || {
            current_thread_runtime().block_on(tarpc_client(addr, work, qd, size, warm, dur))
        })
        .expect("spawn tarpc client");
    let (calls, hist) = client.join().expect("tarpc client thread");
    server.join().expect("tarpc server thread");
    Row {
        mode: match work {
            Workload::Echo => "echo",
            Workload::Sink => "large",
        },
        system: "tarpc",
        transport: "tcp",
        layout: "",
        qd,
        size,
        sessions: 1,
        calls,
        secs: dur.as_secs_f64(),
        hist,
        retransmits: None,
        pkts_per_call: None,
        batching: None,
    }
}

/// The tarpc client: `qd` calls in flight from one task; returns the completions inside the
/// measured window and the latency histogram (ns).
async fn tarpc_client(
    addr: SocketAddr,
    work: Workload,
    qd: usize,
    size: usize,
    warm: Duration,
    dur: Duration,
) -> (u64, Histogram<u64>) {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let cli = BenchClient::new(client::Config::default(), tarpc_transport(stream)).spawn();
    // Payload template; each echo call sends its own copy with its sequence number in front.
    let template: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
    let large = Bytes::from(template.clone());
    let one = |seq: u64| {
        let cli = &cli;
        let data = match work {
            Workload::Echo => {
                let mut v = template.clone();
                v[..8].copy_from_slice(&seq.to_le_bytes());
                Bytes::from(v)
            }
            Workload::Sink => large.clone(),
        };
        async move {
            let t0 = Instant::now();
            let ok = match work {
                Workload::Echo => {
                    let resp = cli
                        .echo(context::current(), data.clone())
                        .await
                        .expect("tarpc echo");
                    resp == data
                }
                Workload::Sink => {
                    let n = cli
                        .sink(context::current(), data)
                        .await
                        .expect("tarpc sink");
                    n == size as u64
                }
            };
            assert!(ok, "tarpc response of call {seq} differs");
            t0
        }
    };
    let mut hist = Histogram::<u64>::new_with_bounds(1, HIST_MAX_NS, 3).expect("histogram");
    let start = Instant::now();
    let warm_end = start + warm;
    let end = warm_end + dur;
    let mut inflight = FuturesUnordered::new();
    let mut seq = 0u64;
    for _ in 0..qd {
        inflight.push(one(seq));
        seq += 1;
    }
    let mut calls = 0u64;
    let drain = async {
        while let Some(t0) = inflight.next().await {
            let t = Instant::now();
            if t > warm_end && t <= end {
                calls += 1;
                if t0 >= warm_end {
                    let ns = (t - t0).as_nanos() as u64;
                    hist.record(ns.clamp(1, HIST_MAX_NS)).expect("record");
                }
            }
            if t <= end {
                inflight.push(one(seq));
                seq += 1;
            }
        }
    };
    tokio::time::timeout(dur + warm + DRAIN_TIMEOUT, drain)
        .await
        .expect("tarpc calls did not drain");
    (calls, hist)
}

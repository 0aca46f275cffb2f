//! The fault matrix: what a typed KV call sees on each transport when the server is stopped,
//! answers late, or goes away, and how long the call takes to end. Prints CSV
//! (`transport,fault,outcome,ms`), one row per fault and transport.
//!
//! ```sh
//! cargo run --release --example faults
//! ```
//!
//! Faults (all in one process; the RDMA transports run on the software device model with its
//! default `SimConfig`, the eRPC one on UDP loopback):
//! - `stopped server`: the server loop is paused (as by SIGSTOP); one blocking call with a
//!   100 ms deadline.
//! - `late reply`: the server withholds one answer past the call's 50 ms deadline, then sends
//!   it; the next call must get its own answer, and the late one be dropped and counted.
//! - `server dropped`: the server is dropped; one blocking call with the default deadline
//!   (1 s). Transports that learn of the death report `ServerDisconnected`; the others end by
//!   the deadline.
//!
//! Exits 1 (naming the row) if any call ends otherwise: with another error, with a wrong
//! answer, or more than 2 s after its deadline.

// The serve loop with a pause switch and withheld answers, shared with the typed tests.
#[path = "../tests/typed_common/mod.rs"]
mod typed_common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use idl::kv::{KvClient, KvService};
use rpc::copyrpc::{ContextConfig, Copyrpc, CopyrpcAddr, CopyrpcServer, EndpointConfig};
use rpc::delegation::{Delegation, DelegationConfig, DelegationServer};
use rpc::erpc::{Erpc, ErpcServer};
use rpc::mlx5::sim::{Fabric, SimConfig};
use rpc::scalerpc::{ScaleRpc, ScaleRpcAddr, ScaleRpcServer, ServerConfig};
use rpc::{ClientTransport, RpcError, Server, ServerTransport};
use serde::Serialize;
use typed_common::{LATE_KEY, spawn_late};

/// How far past its deadline a call may end before the run counts it as a failure (ms): a
/// generous bound for a loaded machine, far below "hangs".
const LIMIT_MS: f64 = 2000.0;

#[derive(Serialize)]
struct Row {
    transport: &'static str,
    fault: &'static str,
    outcome: String,
    ms: f64,
    /// The outcome is the one every transport must give (see the module docs).
    ok: bool,
}

/// Milliseconds since `t`, to 0.1 ms.
fn ms(t: Instant) -> f64 {
    (t.elapsed().as_secs_f64() * 1e4).round() / 10.0
}

fn outcome<V: std::fmt::Debug>(r: &Result<V, RpcError>) -> String {
    match r {
        Ok(v) => format!("Ok({v:?})"),
        Err(RpcError::DeadlineExceeded { .. }) => "DeadlineExceeded".into(),
        Err(RpcError::ServerDisconnected) => "ServerDisconnected".into(),
        Err(e) => format!("{e}"),
    }
}

/// Runs the three faults against one transport; `server` is served on a thread.
fn matrix<T: ClientTransport, S: ServerTransport + Send + 'static>(
    transport: &'static str,
    server: Server<KvService, S>,
    connect: impl FnOnce() -> Result<KvClient<T>, RpcError>,
    rows: &mut Vec<Row>,
) {
    let serving = spawn_late(server);
    let mut kv = connect().expect("connect");
    kv.put(0, 5, 50).expect("put");

    serving.paused.store(true, Ordering::Release);
    let t = Instant::now();
    let r = kv.with_deadline(Duration::from_millis(100)).get(0, 5);
    let took = ms(t);
    rows.push(Row {
        transport,
        fault: "stopped server (deadline 100 ms)",
        ok: matches!(r, Err(RpcError::DeadlineExceeded { .. })) && took < LIMIT_MS,
        outcome: outcome(&r),
        ms: took,
    });
    serving.paused.store(false, Ordering::Release);

    let t = Instant::now();
    let r = kv.with_deadline(Duration::from_millis(50)).get(0, LATE_KEY);
    let expired = ms(t);
    serving.answer.send(666).expect("server thread");
    let until = Instant::now() + Duration::from_secs(10);
    let mut next = Ok(None);
    // Both late answers (the stopped server's and this one) must be dropped, every call
    // answered with its own value.
    while kv.stats().late_responses < 2 && Instant::now() < until {
        next = kv.get(0, 5);
        if !matches!(next, Ok(Some(50))) {
            break;
        }
    }
    rows.push(Row {
        transport,
        fault: "late reply (deadline 50 ms)",
        ok: matches!(r, Err(RpcError::DeadlineExceeded { .. }))
            && matches!(next, Ok(Some(50)))
            && kv.stats().late_responses == 2
            && expired < LIMIT_MS,
        outcome: format!(
            "{}; next call {}; late responses dropped {}",
            outcome(&r),
            outcome(&next),
            kv.stats().late_responses
        ),
        ms: expired,
    });

    serving.stop.store(true, Ordering::Relaxed);
    serving.handle.join().expect("server thread");
    let t = Instant::now();
    let r = kv.get(0, 5);
    let took = ms(t);
    rows.push(Row {
        transport,
        fault: "server dropped (default deadline 1 s)",
        ok: matches!(
            r,
            Err(RpcError::DeadlineExceeded { .. } | RpcError::ServerDisconnected)
        ) && took < 1000.0 + LIMIT_MS,
        outcome: outcome(&r),
        ms: took,
    });
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut rows = Vec::new();

    let name = format!("rpc-faults-{}", std::process::id());
    let server = DelegationServer::serve::<KvService>(&name, DelegationConfig::default())
        .expect("delegation server");
    matrix::<Delegation, _>(
        "delegation",
        server,
        || KvClient::connect(name.as_str()),
        &mut rows,
    );

    let fabric = Fabric::new(SimConfig::default());
    let rings = EndpointConfig {
        ring_size: 1 << 16,
        ..EndpointConfig::default()
    };
    let server = CopyrpcServer::serve::<KvService>(&fabric.open(), ContextConfig::default(), rings)
        .expect("copyrpc server");
    let mut addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    addr.endpoint = rings;
    matrix::<Copyrpc, _>("copyrpc", server, || KvClient::connect(&addr), &mut rows);

    let server = ScaleRpcServer::serve::<KvService>(&fabric.open(), ServerConfig::default())
        .expect("scalerpc server");
    let addr = ScaleRpcAddr::new(fabric.open(), server.transport().listener());
    matrix::<ScaleRpc, _>("scalerpc", server, || KvClient::connect(&addr), &mut rows);

    let server =
        ErpcServer::serve::<KvService>("127.0.0.1:0".parse().expect("addr")).expect("erpc server");
    let addr = server.transport().local_addr();
    matrix::<Erpc, _>("erpc (UDP)", server, || KvClient::connect(&addr), &mut rows);

    let mut w = csv_writer();
    for r in &rows {
        w.serialize(r).expect("csv");
    }
    w.flush().expect("flush");
    let bad: Vec<&Row> = rows.iter().filter(|r| !r.ok).collect();
    if !bad.is_empty() {
        for r in bad {
            eprintln!(
                "faults: {} / {}: unexpected outcome {} after {} ms",
                r.transport, r.fault, r.outcome, r.ms
            );
        }
        std::process::exit(1);
    }
}

fn csv_writer() -> csv::Writer<std::io::Stdout> {
    csv::Writer::from_writer(std::io::stdout())
}

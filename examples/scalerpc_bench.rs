//! ScaleRPC connection grouping on the device model: throughput and QP-context (QPC) cache
//! misses against the number of client connections, with grouping on and off, in one run
//! (issue 6 §4; seeds/003 §1.1, §3).
//!
//! Workload: one thread alternates between the client, driving `N` connections (one RC QP
//! each, all on one client NIC) that each keep up to `--slots` 16 B echo calls in flight
//! whenever their group is scheduled, and the server's dispatch loop (`ScaleServer` poll,
//! echo handler, doorbell-batched responses). Lock-step in one thread keeps the figures
//! independent of how a shared machine schedules threads; the model charges QPC misses in
//! that thread too. Both NICs model
//! a QPC cache of `--qpc-entries` contexts (default 400, ConnectX-3 in seeds/003) with a
//! `--miss-penalty-ns` busy-wait per miss. Grouping off = one group of all connections (the
//! per-connection-buffer baseline: every QP active all the time); on = groups of `--group`
//! connections served one time slice at a time. Every response is checked.
//!
//! ```text
//! cargo run --release --example scalerpc_bench -- --svg target/scalerpc_grouping.svg
//! cargo run --release --example scalerpc_bench -- --conns 16,256,1024 --duration 0.5 --json
//! ```
//! Output: CSV (or JSON lines) per point: connections, grouping, group size, Mops, QPC
//! misses per RPC on the server and client NICs, the miss ratio, group switches; and an
//! SVG plot of throughput and misses per RPC against connections (log2 axis).

use std::time::{Duration, Instant};

use clap::Parser;
use plotters::prelude::*;
use rpc::mlx5::sim::{Fabric, QpcCacheConfig, SimConfig};
use rpc::scalerpc::{
    ClientConfig, GroupSize, ScaleCallError, ScaleCallErrorKind, ScaleClient, ScaleServer,
    ServerConfig,
};

#[derive(Parser, Debug)]
#[command(about = "ScaleRPC grouping benchmark: throughput and QPC misses vs connections")]
struct Args {
    /// Connection counts to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "16,32,64,128,256,512,1024"
    )]
    conns: Vec<u32>,
    /// Connections per group with grouping on (two groups, the active and the warming one,
    /// must fit the QPC cache: 2 x 128 < 400).
    #[arg(long, default_value_t = 128)]
    group: u32,
    /// QPC cache entries per NIC.
    #[arg(long, default_value_t = QpcCacheConfig::CX3_ENTRIES)]
    qpc_entries: usize,
    /// Busy-wait per QPC miss, ns.
    #[arg(long, default_value_t = 500)]
    miss_penalty_ns: u64,
    /// Calls in flight per connection (pool slots per connection).
    #[arg(long, default_value_t = 2)]
    slots: u32,
    /// Time slice of a group, µs (long enough that a switch's compulsory QPC misses, one
    /// per connection of the incoming group, are amortized over many RPCs).
    #[arg(long, default_value_t = 1000)]
    slice_us: u64,
    /// Seconds measured per point (after a warm-up of a fifth of it).
    #[arg(long, default_value_t = 1.0)]
    duration: f64,
    /// JSON lines instead of CSV.
    #[arg(long)]
    json: bool,
    /// Write an SVG plot here.
    #[arg(long)]
    svg: Option<String>,
}

#[derive(Clone, Copy, Debug)]
struct Point {
    conns: u32,
    grouping: bool,
    group_size: u32,
    mops: f64,
    server_miss_per_rpc: f64,
    client_miss_per_rpc: f64,
    server_miss_ratio: f64,
    switches: u64,
}

const SLOT: u32 = 128;
const PAYLOAD: usize = 16;

fn main() {
    let a = Args::parse();
    if !a.json {
        println!(
            "conns,grouping,group_size,mops,server_qpc_miss_per_rpc,client_qpc_miss_per_rpc,server_qpc_miss_ratio,switches"
        );
    }
    let mut points = Vec::new();
    for &n in &a.conns {
        for grouping in [false, true] {
            let p = measure(&a, n, grouping);
            if a.json {
                println!(
                    "{{\"conns\":{},\"grouping\":{},\"group_size\":{},\"mops\":{:.4},\"server_qpc_miss_per_rpc\":{:.4},\"client_qpc_miss_per_rpc\":{:.4},\"server_qpc_miss_ratio\":{:.4},\"switches\":{}}}",
                    p.conns,
                    p.grouping,
                    p.group_size,
                    p.mops,
                    p.server_miss_per_rpc,
                    p.client_miss_per_rpc,
                    p.server_miss_ratio,
                    p.switches
                );
            } else {
                println!(
                    "{},{},{},{:.4},{:.4},{:.4},{:.4},{}",
                    p.conns,
                    if p.grouping { "on" } else { "off" },
                    p.group_size,
                    p.mops,
                    p.server_miss_per_rpc,
                    p.client_miss_per_rpc,
                    p.server_miss_ratio,
                    p.switches
                );
            }
            points.push(p);
        }
    }
    if let Some(path) = &a.svg {
        match plot(path, &points, &a) {
            Ok(()) => eprintln!("plot written to {path}"),
            Err(e) => {
                eprintln!("plot failed: {e}");
                std::process::exit(1);
            }
        }
    }
}

fn measure(a: &Args, n: u32, grouping: bool) -> Point {
    let fabric = Fabric::new(SimConfig {
        qpc_cache: Some(QpcCacheConfig {
            entries: a.qpc_entries,
            miss_penalty: Duration::from_nanos(a.miss_penalty_ns),
        }),
        ..SimConfig::default()
    });
    let (sdev, cdev) = (fabric.open(), fabric.open());
    let group_size = if grouping { a.group.min(n) } else { n };
    let slice = Duration::from_micros(a.slice_us);
    let mut server = ScaleServer::new(
        &sdev,
        ServerConfig {
            max_conns: n,
            group_size: GroupSize::Fixed(group_size),
            slots_per_conn: a.slots,
            slot_size: Some(SLOT),
            slice,
            warmup: slice / 4,
            ack_timeout: Duration::from_secs(1),
            ..ServerConfig::default()
        },
    )
    .expect("server");
    let mut client = ScaleClient::<u64>::new(
        &cdev,
        ClientConfig {
            max_conns: n,
            slots_per_conn: a.slots,
            slot_size: Some(SLOT),
            ..ClientConfig::default()
        },
    )
    .expect("client");
    for _ in 0..n {
        let (c, info) = client.create_conn().expect("conn");
        let s = server.accept(&info).expect("accept");
        client.connect(c, &s).expect("connect");
    }
    let dur = Duration::from_secs_f64(a.duration);
    let warm_end = Instant::now() + dur / 5;
    let mut t0 = None;
    let (slid, clid) = (sdev.port().lid, cdev.port().lid);
    let mut base = (
        0u64,
        fabric.qpc_stats(slid).unwrap(),
        fabric.qpc_stats(clid).unwrap(),
    );
    let mut done = 0u64;
    let mut seq = 0u64;
    loop {
        for c in 0..n {
            loop {
                let tag = seq;
                match client.call(c, 0, PAYLOAD, tag, |b| {
                    b[..8].copy_from_slice(&tag.to_le_bytes());
                    b[8..16].copy_from_slice(&(c as u64).to_le_bytes());
                    PAYLOAD
                }) {
                    Ok(_) => seq += 1,
                    Err(ScaleCallError {
                        kind: ScaleCallErrorKind::NotActive | ScaleCallErrorKind::SlotsBusy,
                        ..
                    }) => break,
                    Err(e) => panic!("call: {e}"),
                }
            }
        }
        client.flush();
        server.poll();
        while let Some((tok, req)) = server.recv() {
            let mut r = [0u8; PAYLOAD];
            r.copy_from_slice(&req[..PAYLOAD]);
            server
                .reply(tok, PAYLOAD, |b| {
                    b[..PAYLOAD].copy_from_slice(&r);
                    PAYLOAD
                })
                .expect("reply");
        }
        server.flush();
        done += client.poll(|tag, r| {
            let r = r.expect("call failed");
            assert!(
                r.len() == PAYLOAD && r[..8] == tag.to_le_bytes(),
                "bad echo"
            );
        }) as u64;
        let now = Instant::now();
        match t0 {
            None if now >= warm_end => {
                t0 = Some(now);
                base = (
                    done,
                    fabric.qpc_stats(slid).unwrap(),
                    fabric.qpc_stats(clid).unwrap(),
                );
            }
            Some(t) if now - t >= dur => break,
            _ => {}
        }
    }
    let el = t0.unwrap().elapsed().as_secs_f64();
    let rpcs = (done - base.0).max(1);
    let s = fabric.qpc_stats(slid).unwrap().since(&base.1);
    let c = fabric.qpc_stats(clid).unwrap().since(&base.2);
    Point {
        conns: n,
        grouping,
        group_size,
        mops: rpcs as f64 / el / 1e6,
        server_miss_per_rpc: s.misses as f64 / rpcs as f64,
        client_miss_per_rpc: c.misses as f64 / rpcs as f64,
        server_miss_ratio: s.misses as f64 / (s.hits + s.misses).max(1) as f64,
        switches: server.scheduler().stats().switches,
    }
}

fn plot(path: &str, pts: &[Point], a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (900, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(350);
    let xs: Vec<f64> = pts.iter().map(|p| (p.conns as f64).log2()).collect();
    let (xmin, xmax) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min),
        xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    let ymax = pts.iter().map(|p| p.mops).fold(0.0, f64::max) * 1.15;
    let mut ch = ChartBuilder::on(&top)
        .caption(
            format!(
                "ScaleRPC on the device model: QPC cache {} entries, {} ns/miss, groups of {}",
                a.qpc_entries, a.miss_penalty_ns, a.group
            ),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(xmin..xmax, 0.0..ymax.max(0.01))?;
    ch.configure_mesh()
        .x_desc("client connections (log2)")
        .y_desc("Mops/s")
        .x_label_formatter(&|x| format!("{}", 2f64.powf(*x).round()))
        .draw()?;
    for (grouping, color) in [(false, RED), (true, BLUE)] {
        let series: Vec<(f64, f64)> = pts
            .iter()
            .filter(|p| p.grouping == grouping)
            .map(|p| ((p.conns as f64).log2(), p.mops))
            .collect();
        ch.draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?
            .label(if grouping {
                "grouping on"
            } else {
                "grouping off"
            })
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        ch.draw_series(
            series
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    ch.configure_series_labels().border_style(BLACK).draw()?;
    let mmax = pts
        .iter()
        .map(|p| p.server_miss_per_rpc + p.client_miss_per_rpc)
        .fold(0.0, f64::max)
        * 1.15;
    let mut ch = ChartBuilder::on(&bottom)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(xmin..xmax, 0.0..mmax.max(0.01))?;
    ch.configure_mesh()
        .x_desc("client connections (log2)")
        .y_desc("QPC misses per RPC (both NICs)")
        .x_label_formatter(&|x| format!("{}", 2f64.powf(*x).round()))
        .draw()?;
    for (grouping, color) in [(false, RED), (true, BLUE)] {
        let series: Vec<(f64, f64)> = pts
            .iter()
            .filter(|p| p.grouping == grouping)
            .map(|p| {
                (
                    (p.conns as f64).log2(),
                    p.server_miss_per_rpc + p.client_miss_per_rpc,
                )
            })
            .collect();
        ch.draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?;
        ch.draw_series(
            series
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    root.present()?;
    Ok(())
}

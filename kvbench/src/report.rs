//! TODO

use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use rpc::bootstrap::Bootstrap;
use rpc::bootstrap::wire::{self};
use rpc::delegation::ForwardStats;

use crate::check::*;
use crate::client::*;
use crate::config::*;
use crate::daemon::*;
use crate::wiring::*;
use crate::workload::*;

/// One ScaleRPC daemon's server counters.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ScaleDaemon {
    pub(crate) conns: u32,
    pub(crate) groups: u32,
    pub(crate) sched: rpc::scalerpc::SchedStats,
    pub(crate) server: rpc::scalerpc::ServerStats,
    pub(crate) probes: u64,
}

/// ScaleRPC figures of a run: the daemons' counters summed, and the QPC caches.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ScaleFigures {
    pub(crate) group_size: u32,
    pub(crate) slice_us: u64,
    pub(crate) slot_size: u32,
    pub(crate) conns: u32,
    /// Most groups on one daemon.
    pub(crate) groups: u32,
    pub(crate) switches: u64,
    pub(crate) warmup_delays: u64,
    pub(crate) acks: u64,
    pub(crate) evictions: u64,
    pub(crate) failed_conns: u64,
    pub(crate) requests: u64,
    pub(crate) doorbells: u64,
    pub(crate) notices: u64,
    pub(crate) probes: u64,
    /// QPC cache of the daemons' NICs (hits, misses), and of every NIC of the fabric.
    pub(crate) qpc_server: (u64, u64),
    pub(crate) qpc_all: (u64, u64),
}

/// eRPC figures of a run: the daemons' endpoint counters, summed.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ErpcFigures {
    /// Sessions the daemons served at the end of the run (the checker's included).
    pub(crate) sessions: u64,
    /// Server sessions freed (clients disconnected, or silent for the failure timeout).
    pub(crate) sessions_closed: u64,
    /// Requests handed to the handlers (each executed once).
    pub(crate) requests: u64,
    /// Duplicate request packets answered from the at-most-once cache.
    pub(crate) dup_requests: u64,
    /// Datagrams dropped by the cores as invalid, stale or out of window.
    pub(crate) dropped_pkts: u64,
    pub(crate) rx_pkts: u64,
    pub(crate) tx_pkts: u64,
    /// `recvmmsg`/`sendmmsg` calls that moved datagrams.
    pub(crate) rx_calls: u64,
    pub(crate) tx_calls: u64,
}

/// A latency histogram: 1 ns to 60 s, 3 significant digits.
pub(crate) fn new_hist() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram")
}

/// The sum over all ranks of every rank's histogram `h`: each rank's serialized with
/// hdrhistogram's V2 encoding, all-gathered, deserialized and added.
pub(crate) fn merge_hist<B: Bootstrap>(
    b: &B,
    h: &Histogram<u64>,
) -> Result<Histogram<u64>, String> {
    let mut buf = Vec::new();
    V2Serializer::new()
        .serialize(h, &mut buf)
        .map_err(|e| format!("serializing a histogram: {e:?}"))?;
    let mut sum = new_hist();
    for part in gather_var(b, &buf)? {
        let h: Histogram<u64> = Deserializer::new()
            .deserialize(&mut &part[..])
            .map_err(|e| format!("deserializing a rank's histogram: {e:?}"))?;
        sum.add(&h)
            .map_err(|e| format!("merging the histograms: {e:?}"))?;
    }
    Ok(sum)
}

/// Counter structs summed field by field (over a rank's daemons, and over the ranks by a
/// reduction).
pub(crate) trait Counters: Default {
    fn to_vec(&self) -> Vec<u64>;
    fn from_slice(v: &[u64]) -> Self;
    fn add(&mut self, o: &Self) {
        let sum: Vec<u64> = (self.to_vec().iter().zip(o.to_vec()))
            .map(|(a, b)| a + b)
            .collect();
        *self = Self::from_slice(&sum);
    }
}

macro_rules! counters {
    ($t:ty { $($f:ident),+ $(,)? }) => {
        impl Counters for $t {
            fn to_vec(&self) -> Vec<u64> {
                vec![$(self.$f),+]
            }
            fn from_slice(v: &[u64]) -> Self {
                let mut v = v.iter().copied();
                let mut s = Self::default();
                $(s.$f = v.next().expect("a value per counter");)+
                s
            }
        }
    };
}

counters!(ForwardStats {
    ring_local,
    forwarded,
    responses,
    remote_served,
    handed_off,
    handoff_replies,
    bad_requests,
    unroutable,
    failed_calls,
    corrupt_responses,
    dropped_replies,
    ring_full_retries,
    daemon_busy_waits,
});

counters!(ErpcFigures {
    sessions,
    sessions_closed,
    requests,
    dup_requests,
    dropped_pkts,
    rx_pkts,
    tx_pkts,
    rx_calls,
    tx_calls,
});

/// The figures of one run, over all ranks.
pub(crate) struct Summary {
    /// How clients reach the daemons of their rank (`delegation`, `scalerpc`, `erpc`).
    pub(crate) transport: &'static str,
    /// ScaleRPC runs: scheduler and QPC figures.
    pub(crate) scale: Option<ScaleFigures>,
    /// eRPC runs: the daemons' endpoint counters.
    pub(crate) erpc: Option<ErpcFigures>,
    pub(crate) backend: &'static str,
    pub(crate) ranks: usize,
    /// The ranks were MPI processes.
    pub(crate) mpi: bool,
    pub(crate) daemons: usize,
    pub(crate) clients: usize,
    pub(crate) qd: usize,
    pub(crate) read_ratio: f64,
    pub(crate) keys: u64,
    pub(crate) dist: String,
    pub(crate) secs: f64,
    pub(crate) ops: u64,
    pub(crate) mops: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) max_us: f64,
    pub(crate) ops_remote: u64,
    pub(crate) remote_p50_us: f64,
    pub(crate) remote_p99_us: f64,
    pub(crate) rank_ops: Vec<u64>,
    pub(crate) rank_mops: Vec<f64>,
    /// Requests the daemons of each rank executed.
    pub(crate) rank_served: Vec<u64>,
    pub(crate) gets: u64,
    pub(crate) hits: u64,
    /// Failed operations: error responses, implausible reads, calls expired.
    pub(crate) errors: u64,
    /// Calls given up at `--deadline-ms`.
    pub(crate) expired: u64,
    /// Late responses of calls given up (dropped).
    pub(crate) late: u64,
    pub(crate) bad_requests: u64,
    pub(crate) forward: Option<ForwardStats>,
    pub(crate) checked: usize,
    pub(crate) checked_remote: usize,
    pub(crate) mismatches: usize,
    pub(crate) check_msg: String,
    pub(crate) pass: bool,
}

/// The summary of a run over all ranks, from this rank's clients and daemons (every rank
/// gets the same one): counters summed, latency histograms merged ([`merge_hist`]),
/// throughput and requests served per rank, the check. The run's time is the longest of
/// the ranks'.
pub(crate) fn combine<B: Bootstrap>(
    b: &B,
    run: &RankRun,
    reports: &[DaemonReport],
    check: CheckReport,
    load: &LoadArgs,
    ndaemons: usize,
) -> Result<Summary, String> {
    let (mut hist, mut hist_remote) = (new_hist(), new_hist());
    // ops, ops_remote, gets, hits, errors, bad requests, calls expired, late responses.
    let mut sums = vec![0u64; 8];
    for c in &run.clients {
        hist.add(&c.hist)
            .map_err(|e| format!("histogram merge: {e:?}"))?;
        hist_remote
            .add(&c.hist_remote)
            .map_err(|e| format!("histogram merge: {e:?}"))?;
        for (s, v) in sums
            .iter_mut()
            .zip([c.ops, c.ops_remote, c.gets, c.hits, c.errors])
        {
            *s += v;
        }
        sums[6] += c.expired;
        sums[7] += c.late;
    }
    let rank_ops = sums[0];
    sums[5] = reports.iter().map(|d| d.bad_requests).sum();
    let served: u64 = reports.iter().map(|d| d.requests).sum();
    let (mut forward, mut erpc) = (None::<ForwardStats>, None::<ErpcFigures>);
    for d in reports {
        if let Some(f) = &d.forward {
            forward.get_or_insert_with(Default::default).add(f);
        }
        if let Some(e) = &d.erpc {
            erpc.get_or_insert_with(Default::default).add(e);
        }
    }
    let nf = ForwardStats::default().to_vec().len();
    sums.push(u64::from(forward.is_some()));
    sums.extend(forward.unwrap_or_default().to_vec());
    sums.push(u64::from(erpc.is_some()));
    sums.extend(erpc.unwrap_or_default().to_vec());
    b.all_reduce_sum_u64(&mut sums).map_err(boot)?;
    let [
        ops,
        ops_remote,
        gets,
        hits,
        errors,
        bad_requests,
        expired,
        late,
    ] = sums[..8]
    else {
        unreachable!("eight sums")
    };
    let forward = (sums[8] > 0).then(|| ForwardStats::from_slice(&sums[9..9 + nf]));
    let erpc = (sums[9 + nf] > 0).then(|| ErpcFigures::from_slice(&sums[10 + nf..]));
    // Per rank: operations, requests served, seconds.
    let mut mine = Vec::with_capacity(24);
    mine.extend(rank_ops.to_le_bytes());
    mine.extend(served.to_le_bytes());
    mine.extend(run.elapsed.as_secs_f64().to_le_bytes());
    let per = b.all_gather(&mine).map_err(boot)?;
    let per = wire::split_ranks(&per, b.size(), 24).map_err(boot)?;
    let (mut rank_ops, mut rank_served, mut rank_mops, mut secs) = (vec![], vec![], vec![], 0.0);
    for (rank, r) in per.iter().enumerate() {
        let (Some(o), Some(s), Some(t)) =
            (wire::le_u64(r, 0), wire::le_u64(r, 8), wire::le_u64(r, 16))
        else {
            return Err(format!("rank {rank} sent a short figures record"));
        };
        let t = f64::from_bits(t);
        rank_ops.push(o);
        rank_served.push(s);
        rank_mops.push(o as f64 / t / 1e6);
        secs = f64::max(secs, t);
    }
    let hist = merge_hist(b, &hist)?;
    let hist_remote = merge_hist(b, &hist_remote)?;
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e3;
    let forward_errors = forward.map_or(0, |f| {
        f.unroutable + f.failed_calls + f.corrupt_responses + f.dropped_replies
    });
    let check_ok = check.mismatches == 0 && check.checked > 0 && check.failures.is_empty();
    let mut notes = Vec::new();
    if expired > 0 {
        notes.push(format!(
            "{expired} call(s) got no reply within --deadline-ms {}",
            load.deadline_ms
        ));
    }
    if !check.failures.is_empty() {
        let mut m = check.failures[..check.failures.len().min(3)].join("; ");
        if check.failures.len() > 3 {
            m += &format!("; and {} more", check.failures.len() - 3);
        }
        notes.push(m);
    } else if check.self_written {
        notes.push("the run wrote nothing: keys written by the checker".to_string());
    }
    let check_msg = notes.join("; ");
    Ok(Summary {
        transport: "delegation",
        scale: None,
        erpc,
        backend: "delegation",
        ranks: b.size(),
        mpi: false,
        daemons: ndaemons,
        clients: load.clients,
        qd: load.qd,
        read_ratio: load.read_ratio,
        keys: load.keys,
        dist: match load.dist {
            Dist::Uniform => "uniform".to_string(),
            Dist::Zipf => format!("zipf({})", load.theta),
        },
        secs,
        ops,
        mops: ops as f64 / secs / 1e6,
        p50_us: us(&hist, 0.5),
        p99_us: us(&hist, 0.99),
        p999_us: us(&hist, 0.999),
        max_us: hist.max() as f64 / 1e3,
        ops_remote,
        remote_p50_us: us(&hist_remote, 0.5),
        remote_p99_us: us(&hist_remote, 0.99),
        rank_ops,
        rank_mops,
        rank_served,
        gets,
        hits,
        errors,
        expired,
        late,
        bad_requests,
        forward,
        checked: check.checked,
        checked_remote: check.checked_remote,
        mismatches: check.mismatches,
        check_msg,
        pass: check_ok && errors == 0 && bad_requests == 0 && forward_errors == 0,
    })
}

pub(crate) fn print_summary(s: &Summary, out: &OutArgs, first: bool) {
    let Summary {
        ranks,
        daemons,
        clients,
        qd,
        read_ratio,
        keys,
        secs,
        ops,
        mops,
        ops_remote,
        gets,
        hits,
        errors,
        bad_requests,
        checked,
        checked_remote,
        mismatches,
        pass,
        ..
    } = *s;
    let (dist, backend, check_msg) = (&s.dist, s.backend, &s.check_msg);
    let f = s.forward.unwrap_or_default();
    if out.json {
        let mut v = serde_json::json!({
            "transport": s.transport, "daemons": daemons, "clients": clients, "qd": qd,
            "read_ratio": read_ratio, "keys": keys, "dist": dist, "seconds": secs,
            "ops": ops, "mops": mops, "p50_us": s.p50_us, "p99_us": s.p99_us,
            "p999_us": s.p999_us, "gets": gets, "get_hits": hits, "errors": errors,
            "bad_requests": bad_requests, "check_samples": checked,
            "check_mismatches": mismatches, "check_passed": pass, "check_note": check_msg,
        });
        let more = serde_json::json!({
            "ranks": ranks, "mpi": s.mpi, "backend": backend, "clients_total": clients * ranks,
            "max_us": s.max_us, "rank_served": s.rank_served,
            "ops_local": ops - ops_remote, "ops_remote": ops_remote,
            "remote_p50_us": s.remote_p50_us, "remote_p99_us": s.remote_p99_us,
            "rank_ops": s.rank_ops, "rank_mops": s.rank_mops,
            "check_samples_remote": checked_remote, "deadline_exceeded": s.expired,
            "late_responses": s.late,
        });
        let forward = s.forward.map(|f| {
            serde_json::json!({
                "ring_local": f.ring_local, "forwarded": f.forwarded, "responses": f.responses,
                "remote_served": f.remote_served, "handed_off": f.handed_off,
                "handoff_replies": f.handoff_replies, "bad_requests": f.bad_requests,
                "unroutable": f.unroutable, "failed_calls": f.failed_calls,
                "corrupt_responses": f.corrupt_responses, "dropped_replies": f.dropped_replies,
                "ring_full_retries": f.ring_full_retries,
                "daemon_busy_waits": f.daemon_busy_waits,
            })
        });
        let obj = v.as_object_mut().expect("an object");
        obj.extend(more.as_object().expect("an object").clone());
        obj.insert("forward".into(), forward.unwrap_or(serde_json::Value::Null));
        if let Some(sc) = &s.scale {
            obj.insert(
                "scalerpc".into(),
                serde_json::json!({
                    "group_size": sc.group_size, "slice_us": sc.slice_us,
                    "slot_size": sc.slot_size, "conns": sc.conns, "groups": sc.groups,
                    "switches": sc.switches, "warmup_delays": sc.warmup_delays,
                    "acks": sc.acks, "evictions": sc.evictions,
                    "failed_conns": sc.failed_conns, "requests": sc.requests,
                    "doorbells": sc.doorbells, "notices": sc.notices, "probes": sc.probes,
                    "qpc_server_hits": sc.qpc_server.0, "qpc_server_misses": sc.qpc_server.1,
                    "qpc_hits": sc.qpc_all.0, "qpc_misses": sc.qpc_all.1,
                }),
            );
        }
        if let Some(e) = &s.erpc {
            obj.insert(
                "erpc".into(),
                serde_json::json!({
                    "sessions": e.sessions, "sessions_closed": e.sessions_closed,
                    "requests": e.requests, "dup_requests": e.dup_requests,
                    "dropped_pkts": e.dropped_pkts, "rx_pkts": e.rx_pkts, "tx_pkts": e.tx_pkts,
                    "rx_calls": e.rx_calls, "tx_calls": e.tx_calls,
                }),
            );
        }
        println!("{v}");
    } else if out.csv {
        if first {
            println!(
                "transport,daemons,clients,qd,read_ratio,keys,dist,seconds,ops,mops,p50_us,p99_us,p999_us,gets,get_hits,errors,check_samples,check_mismatches,check_passed,ranks,backend,ops_local,ops_remote,remote_p50_us,remote_p99_us,rank_mops,forwarded,remote_served,handed_off,unroutable,failed_calls,corrupt_responses,ring_full_retries,max_us,rank_served,mpi"
            );
        }
        let rank_served: Vec<String> = s.rank_served.iter().map(|n| n.to_string()).collect();
        let rank_mops: Vec<String> = s.rank_mops.iter().map(|m| format!("{m:.4}")).collect();
        println!(
            "{},{daemons},{clients},{qd},{read_ratio},{keys},{dist},{secs:.3},{ops},{mops:.4},{:.2},{:.2},{:.2},{gets},{hits},{errors},{checked},{mismatches},{pass},{ranks},{backend},{},{ops_remote},{:.2},{:.2},{},{},{},{},{},{},{},{},{:.2},{},{}",
            s.transport,
            s.p50_us,
            s.p99_us,
            s.p999_us,
            ops - ops_remote,
            s.remote_p50_us,
            s.remote_p99_us,
            rank_mops.join(";"),
            f.forwarded,
            f.remote_served,
            f.handed_off,
            f.unroutable,
            f.failed_calls,
            f.corrupt_responses,
            f.ring_full_retries,
            s.max_us,
            rank_served.join(";"),
            s.mpi,
        );
    } else {
        if ranks == 1 {
            println!(
                "kv over {}: {daemons} daemon(s), {clients} client(s), QD {qd}, {:.0}% gets, {keys} keys {dist}, {secs:.1} s",
                s.transport,
                read_ratio * 100.0,
            );
        } else {
            let kind = if s.mpi { "MPI ranks" } else { "ranks" };
            let over = match s.transport {
                "delegation" => format!("backend {backend}"),
                t => format!("over {t}"),
            };
            println!(
                "kv, {ranks} {kind}, {over}: {daemons} daemon(s) and {clients} client(s) per rank, QD {qd}, {:.0}% gets, {keys} keys {dist} per rank, {secs:.1} s",
                read_ratio * 100.0,
            );
        }
        println!("  throughput  {mops:.3} Mops/s ({ops} ops)");
        if ranks > 1 {
            let per: Vec<String> = s
                .rank_mops
                .iter()
                .enumerate()
                .map(|(r, m)| format!("{r}: {m:.3}"))
                .collect();
            println!("  per rank    {} Mops/s", per.join("   "));
            let served: Vec<String> = s
                .rank_served
                .iter()
                .enumerate()
                .map(|(r, n)| format!("{r}: {n}"))
                .collect();
            println!("  served      {} requests", served.join("   "));
        }
        println!(
            "  latency     p50 {:.2} us   p99 {:.2} us   p999 {:.2} us   max {:.2} us",
            s.p50_us, s.p99_us, s.p999_us, s.max_us
        );
        if ranks > 1 {
            println!(
                "  remote      {ops_remote} ops ({:.0}%), {} local   p50 {:.2} us   p99 {:.2} us",
                ops_remote as f64 * 100.0 / ops.max(1) as f64,
                ops - ops_remote,
                s.remote_p50_us,
                s.remote_p99_us
            );
        }
        if ranks > 1 && s.forward.is_some() {
            println!(
                "  delegates   forwarded {}   served remote {}   handed to daemons {}   ring-full retries {}   unroutable {}   failed {}   corrupt {}",
                f.forwarded,
                f.remote_served,
                f.handed_off,
                f.ring_full_retries,
                f.unroutable,
                f.failed_calls,
                f.corrupt_responses
            );
        }
        if let Some(sc) = &s.scale {
            let group = if sc.group_size == 0 {
                "off".to_string()
            } else {
                sc.group_size.to_string()
            };
            println!(
                "  scalerpc    {} connections, group size {group} ({} group(s) per daemon), slice {} us, slot {} B",
                sc.conns, sc.groups, sc.slice_us, sc.slot_size
            );
            println!(
                "  schedule    switches {}   warm-up delays {}   acks {}   evictions {}   conns failed or closed {}   probes {}",
                sc.switches, sc.warmup_delays, sc.acks, sc.evictions, sc.failed_conns, sc.probes
            );
            let ratio = |(h, m): (u64, u64)| m as f64 * 100.0 / (h + m).max(1) as f64;
            println!(
                "  qpc cache   daemon NICs: {} hits, {} misses ({:.2}%)   all NICs: {} hits, {} misses ({:.2}%)",
                sc.qpc_server.0,
                sc.qpc_server.1,
                ratio(sc.qpc_server),
                sc.qpc_all.0,
                sc.qpc_all.1,
                ratio(sc.qpc_all)
            );
        }
        if let Some(e) = &s.erpc {
            println!(
                "  erpc        {} sessions open at the end ({} closed)   requests {}   duplicates answered {}   packets dropped {}",
                e.sessions, e.sessions_closed, e.requests, e.dup_requests, e.dropped_pkts
            );
            println!(
                "  udp         daemons rx {} pkts in {} calls, tx {} pkts in {} calls",
                e.rx_pkts, e.rx_calls, e.tx_pkts, e.tx_calls
            );
        }
        println!(
            "  gets        {gets} ({hits} found)   errors {errors}   bad requests {bad_requests}"
        );
        println!(
            "  check       {}: {checked} written keys read back{}, {mismatches} mismatches{}",
            if pass { "PASSED" } else { "FAILED" },
            if ranks > 1 {
                format!(" ({checked_remote} written from another rank)")
            } else {
                String::new()
            },
            if check_msg.is_empty() {
                String::new()
            } else {
                format!(" ({check_msg})")
            }
        );
    }
}

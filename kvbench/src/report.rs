//! Reporting: the figures of a run over all ranks ([`Summary`], serializable with `serde`),
//! how they are combined from every rank's clients and daemons (`combine`: counters summed
//! by a reduction, latency histograms merged from hdrhistogram's V2 encoding), and how they
//! are printed: human-readable text, one JSON object per run (`--json`, `serde_json`) or
//! CSV (`--csv`, the `csv` crate).

use std::io::Write;

use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use rpc::bootstrap::Bootstrap;
use rpc::bootstrap::wire;
use rpc::delegation::ForwardStats;
use serde::Serialize;

use crate::check::*;
use crate::client::*;
use crate::config::*;
use crate::daemon::*;
use crate::wiring::*;
use crate::workload::*;

/// ScaleRPC figures of a run (JSON: the `scalerpc` object): the daemons' counters summed,
/// and the QPC caches.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ScaleFigures {
    /// Connections per group (`--scalerpc-group`), or 0 when the daemons size groups
    /// themselves.
    pub group_size: u32,
    /// The time slice of a group, µs (`--scalerpc-slice-us`).
    pub slice_us: u64,
    /// Bytes of one message slot (`--scalerpc-slot`, or derived from the service).
    pub slot_size: u32,
    /// Connections the daemons served, summed (those reclaimed during the run included).
    pub conns: u32,
    /// Most groups on one daemon.
    pub groups: u32,
    /// Group switches ([`rpc::scalerpc::SchedStats::switches`]), summed.
    pub switches: u64,
    /// Warm-ups that waited for the other bank to drain
    /// ([`rpc::scalerpc::SchedStats::warmup_delays`]), summed.
    pub warmup_delays: u64,
    /// Acknowledgements accepted ([`rpc::scalerpc::SchedStats::acks`]), summed.
    pub acks: u64,
    /// Connections evicted for missing the acknowledgement deadline
    /// ([`rpc::scalerpc::SchedStats::evictions`]), summed.
    pub evictions: u64,
    /// Connections failed by an error completion or an eviction
    /// ([`rpc::scalerpc::ScaleServerStats::failed_conns`]), summed.
    pub failed_conns: u64,
    /// Requests handed to the handlers ([`rpc::scalerpc::ScaleServerStats::requests`]), summed.
    pub requests: u64,
    /// Doorbells rung by the daemons ([`rpc::scalerpc::ScaleServerStats::doorbells`]), summed.
    pub doorbells: u64,
    /// Activate/stop notices sent ([`rpc::scalerpc::ScaleServerStats::notices`]), summed.
    pub notices: u64,
    /// Liveness probes the daemons answered, summed.
    pub probes: u64,
    /// QPC cache hits of the daemons' NICs.
    pub qpc_server_hits: u64,
    /// QPC cache misses of the daemons' NICs.
    pub qpc_server_misses: u64,
    /// QPC cache hits of every NIC of the fabric.
    pub qpc_hits: u64,
    /// QPC cache misses of every NIC of the fabric.
    pub qpc_misses: u64,
}

/// eRPC figures of a run (JSON: the `erpc` object): the daemons' endpoint counters, summed.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ErpcFigures {
    /// Sessions the daemons served at the end of the run (the checker's included).
    pub sessions: u64,
    /// Server sessions freed (clients disconnected, or silent for the failure timeout).
    pub sessions_closed: u64,
    /// Requests handed to the handlers (each executed once).
    pub requests: u64,
    /// Duplicate request packets answered from the at-most-once cache.
    pub dup_requests: u64,
    /// Datagrams dropped by the cores as invalid, stale or out of window.
    pub dropped_pkts: u64,
    /// Datagrams received.
    pub rx_pkts: u64,
    /// Datagrams sent.
    pub tx_pkts: u64,
    /// `recvmmsg` calls that received datagrams.
    pub rx_calls: u64,
    /// `sendmmsg` calls that sent datagrams.
    pub tx_calls: u64,
    /// Blocks of the daemons in their sockets while idle (`erpc_daemon_loop`: on an
    /// oversubscribed machine, or after 200 µs without a request).
    pub idle_waits: u64,
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

/// The delegates' counters of a run (JSON: the `forward` object; `null` without
/// delegates): [`ForwardStats`] summed over the ranks' delegates.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Forward {
    /// [`ForwardStats::ring_local`], summed.
    pub ring_local: u64,
    /// [`ForwardStats::forwarded`], summed.
    pub forwarded: u64,
    /// [`ForwardStats::responses`], summed.
    pub responses: u64,
    /// [`ForwardStats::remote_served`], summed.
    pub remote_served: u64,
    /// [`ForwardStats::handed_off`], summed.
    pub handed_off: u64,
    /// [`ForwardStats::handoff_replies`], summed.
    pub handoff_replies: u64,
    /// [`ForwardStats::bad_requests`], summed.
    pub bad_requests: u64,
    /// [`ForwardStats::oversized_responses`], summed.
    pub oversized_responses: u64,
    /// [`ForwardStats::unroutable`], summed.
    pub unroutable: u64,
    /// [`ForwardStats::failed_calls`], summed.
    pub failed_calls: u64,
    /// [`ForwardStats::corrupt_responses`], summed.
    pub corrupt_responses: u64,
    /// [`ForwardStats::dropped_replies`], summed.
    pub dropped_replies: u64,
    /// [`ForwardStats::ring_full_retries`], summed.
    pub ring_full_retries: u64,
    /// [`ForwardStats::daemon_busy_waits`], summed.
    pub daemon_busy_waits: u64,
    /// [`ForwardStats::wait_timeouts`], summed.
    pub wait_timeouts: u64,
}

impl From<ForwardStats> for Forward {
    fn from(f: ForwardStats) -> Self {
        // Destructured without `..`: a counter added to `ForwardStats` must be added here.
        let ForwardStats {
            ring_local,
            forwarded,
            responses,
            remote_served,
            handed_off,
            handoff_replies,
            bad_requests,
            oversized_responses,
            unroutable,
            failed_calls,
            corrupt_responses,
            dropped_replies,
            ring_full_retries,
            daemon_busy_waits,
            wait_timeouts,
        } = f;
        Forward {
            ring_local,
            forwarded,
            responses,
            remote_served,
            handed_off,
            handoff_replies,
            bad_requests,
            oversized_responses,
            unroutable,
            failed_calls,
            corrupt_responses,
            dropped_replies,
            ring_full_retries,
            daemon_busy_waits,
            wait_timeouts,
        }
    }
}

counters!(Forward {
    ring_local,
    forwarded,
    responses,
    remote_served,
    handed_off,
    handoff_replies,
    bad_requests,
    oversized_responses,
    unroutable,
    failed_calls,
    corrupt_responses,
    dropped_replies,
    ring_full_retries,
    daemon_busy_waits,
    wait_timeouts,
});

/// The daemons' counters of a Meta or Delegation run (JSON: the `node` object; absent for
/// the other backends): [`rpc::delegation::node::NodeStats`] summed over every daemon of every
/// rank.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Node {
    /// [`rpc::delegation::node::NodeStats::local_served`], summed.
    pub local_served: u64,
    /// [`rpc::delegation::node::NodeStats::ring_served`], summed.
    pub ring_served: u64,
    /// [`rpc::delegation::node::NodeStats::remote_served`], summed.
    pub remote_served: u64,
    /// [`rpc::delegation::node::NodeStats::flux_served`], summed.
    pub flux_served: u64,
    /// [`rpc::delegation::node::NodeStats::copyrpc_calls`], summed.
    pub copyrpc_calls: u64,
    /// [`rpc::delegation::node::NodeStats::copyrpc_responses`], summed.
    pub copyrpc_responses: u64,
    /// [`rpc::delegation::node::NodeStats::flux_calls`], summed.
    pub flux_calls: u64,
    /// [`rpc::delegation::node::NodeStats::flux_responses`], summed.
    pub flux_responses: u64,
    /// [`rpc::delegation::node::NodeStats::backlogged`], summed.
    pub backlogged: u64,
    /// [`rpc::delegation::node::NodeStats::backlog_full`], summed.
    pub backlog_full: u64,
    /// [`rpc::delegation::node::NodeStats::wait_timeouts`], summed.
    pub wait_timeouts: u64,
    /// [`rpc::delegation::node::NodeStats::bad_requests`], summed.
    pub bad_requests: u64,
    /// [`rpc::delegation::node::NodeStats::oversized_responses`], summed.
    pub oversized_responses: u64,
    /// [`rpc::delegation::node::NodeStats::unroutable`], summed.
    pub unroutable: u64,
    /// [`rpc::delegation::node::NodeStats::failed_calls`], summed.
    pub failed_calls: u64,
    /// [`rpc::delegation::node::NodeStats::corrupt_responses`], summed.
    pub corrupt_responses: u64,
    /// [`rpc::delegation::node::NodeStats::dropped_replies`], summed.
    pub dropped_replies: u64,
    /// [`rpc::delegation::node::NodeStats::idle_waits`], summed: the daemons' sleeps on
    /// their futex words.
    pub idle_waits: u64,
}

impl From<rpc::delegation::node::NodeStats> for Node {
    fn from(n: rpc::delegation::node::NodeStats) -> Self {
        let rpc::delegation::node::NodeStats {
            local_served,
            ring_served,
            remote_served,
            flux_served,
            copyrpc_calls,
            copyrpc_responses,
            flux_calls,
            flux_responses,
            backlogged,
            backlog_full,
            wait_timeouts,
            bad_requests,
            oversized_responses,
            unroutable,
            failed_calls,
            corrupt_responses,
            dropped_replies,
            idle_waits,
        } = n;
        Node {
            local_served,
            ring_served,
            remote_served,
            flux_served,
            copyrpc_calls,
            copyrpc_responses,
            flux_calls,
            flux_responses,
            backlogged,
            backlog_full,
            wait_timeouts,
            bad_requests,
            oversized_responses,
            unroutable,
            failed_calls,
            corrupt_responses,
            dropped_replies,
            idle_waits,
        }
    }
}

counters!(Node {
    local_served,
    ring_served,
    remote_served,
    flux_served,
    copyrpc_calls,
    copyrpc_responses,
    flux_calls,
    flux_responses,
    backlogged,
    backlog_full,
    wait_timeouts,
    bad_requests,
    oversized_responses,
    unroutable,
    failed_calls,
    corrupt_responses,
    dropped_replies,
    idle_waits,
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
    idle_waits,
});

/// The figures of one run, over all ranks (every rank computes the same one). Serialized
/// (`--json`) under the names given here; the text and CSV forms are [`text`] and
/// [`CsvRow`].
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// How clients reach the daemons of their rank (`delegation`, `scalerpc`, `erpc`).
    pub transport: &'static str,
    /// Daemon threads per rank.
    pub daemons: usize,
    /// Client threads per rank.
    pub clients: usize,
    /// Calls in flight per client thread.
    pub qd: usize,
    /// Fraction of gets in the access patterns.
    pub read_ratio: f64,
    /// Key range per rank.
    pub keys: u64,
    /// Key distribution: `uniform` or `zipf(θ)`.
    pub dist: String,
    /// Value bytes (`--value-size`): `8` (the fixed-size `u64` values), `N`, or `LO-HI`
    /// (uniform).
    pub value_size: String,
    /// Key bytes (`--key-size`): `8` (`u64` keys of the fixed-size service), `N`, or `LO-HI`
    /// (uniform).
    pub key_size: String,
    /// The run's time, seconds (the longest of the ranks').
    #[serde(rename = "seconds")]
    pub secs: f64,
    /// Operations completed, all ranks.
    pub ops: u64,
    /// Throughput, millions of operations per second: the median of `run_mops`
    /// (seeds/004 §9 step 12).
    pub mops: f64,
    /// Each measured run's throughput, all ranks, millions of operations per second: the
    /// operations completed between the run's start and its stop time, per second.
    pub run_mops: Vec<f64>,
    /// Operations completed inside the measured runs, all ranks (`ops` also counts the
    /// warm-up and the calls drained after the stop).
    pub measured_ops: u64,
    /// Daemons and clients were pinned to cores.
    pub pinned: bool,
    /// Why they were not pinned (empty when they were).
    pub pin_note: String,
    /// Median latency over all operations, µs.
    pub p50_us: f64,
    /// 99th percentile latency over all operations, µs.
    pub p99_us: f64,
    /// 99.9th percentile latency over all operations, µs.
    pub p999_us: f64,
    /// Gets issued.
    pub gets: u64,
    /// Of `gets`, the ones that found a value.
    #[serde(rename = "get_hits")]
    pub hits: u64,
    /// Failed operations: error responses, implausible reads, calls expired.
    pub errors: u64,
    /// Of `errors`, reads that found a damaged value (wrong length or bytes; variable-size
    /// values only).
    pub damaged_reads: u64,
    /// Requests the daemons could not decode.
    pub bad_requests: u64,
    /// Written keys the check read back.
    #[serde(rename = "check_samples")]
    pub checked: usize,
    /// Of those, the ones that did not hold the last value written.
    #[serde(rename = "check_mismatches")]
    pub mismatches: usize,
    /// The check passed, with no errors and no bad requests.
    #[serde(rename = "check_passed")]
    pub pass: bool,
    /// What the check notes (calls expired, failures, keys written by the checker).
    #[serde(rename = "check_note")]
    pub check_msg: String,
    /// Ranks of the run.
    pub ranks: usize,
    /// The ranks were MPI processes.
    pub mpi: bool,
    /// How clients reach other ranks (`delegation`, `direct`), or the transport.
    pub backend: &'static str,
    /// Client threads over all ranks.
    pub clients_total: usize,
    /// Largest latency, microseconds.
    pub max_us: f64,
    /// Requests the daemons of each rank executed, by rank.
    pub rank_served: Vec<u64>,
    /// Operations on the client's own rank.
    pub ops_local: u64,
    /// Operations on another rank than the client's.
    pub ops_remote: u64,
    /// Median latency of the remote operations, µs.
    pub remote_p50_us: f64,
    /// 99th percentile latency of the remote operations, µs.
    pub remote_p99_us: f64,
    /// Operations completed, by rank.
    pub rank_ops: Vec<u64>,
    /// Millions of operations per second, by rank.
    pub rank_mops: Vec<f64>,
    /// Of `check_samples`, keys written from another rank than their owner.
    #[serde(rename = "check_samples_remote")]
    pub checked_remote: usize,
    /// Calls given up at `--deadline-ms`.
    #[serde(rename = "deadline_exceeded")]
    pub expired: u64,
    /// Late responses of calls given up (dropped).
    #[serde(rename = "late_responses")]
    pub late: u64,
    /// The delegates' counters (multi-rank delegation-transport runs).
    pub forward: Option<Forward>,
    /// The daemons' counters (Meta and Delegation runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<Node>,
    /// ScaleRPC runs: scheduler and QPC figures.
    #[serde(rename = "scalerpc", skip_serializing_if = "Option::is_none")]
    pub scale: Option<ScaleFigures>,
    /// eRPC runs: the daemons' endpoint counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub erpc: Option<ErpcFigures>,
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
    // ops, ops_remote, gets, hits, errors, bad requests, calls expired, late responses,
    // damaged reads.
    let mut sums = vec![0u64; 9];
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
        sums[8] += c.damaged;
    }
    let rank_ops = sums[0];
    sums[5] = reports.iter().map(|d| d.bad_requests).sum();
    let served: u64 = reports.iter().map(|d| d.requests).sum();
    let (mut forward, mut erpc) = (None::<Forward>, None::<ErpcFigures>);
    let mut node = None::<Node>;
    for d in reports {
        if let Some(n) = &d.node {
            node.get_or_insert_with(Default::default)
                .add(&Node::from(*n));
        }
        if let Some(f) = &d.forward {
            forward
                .get_or_insert_with(Default::default)
                .add(&Forward::from(*f));
        }
        if let Some(e) = &d.erpc {
            erpc.get_or_insert_with(Default::default).add(e);
        }
    }
    let nf = Forward::default().to_vec().len();
    sums.push(u64::from(forward.is_some()));
    sums.extend(forward.unwrap_or_default().to_vec());
    sums.push(u64::from(erpc.is_some()));
    sums.extend(erpc.unwrap_or_default().to_vec());
    let ne = ErpcFigures::default().to_vec().len();
    sums.push(u64::from(node.is_some()));
    sums.extend(node.unwrap_or_default().to_vec());
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
        damaged_reads,
    ] = sums[..9]
    else {
        unreachable!("nine sums")
    };
    let forward = (sums[9] > 0).then(|| Forward::from_slice(&sums[10..10 + nf]));
    let erpc = (sums[10 + nf] > 0).then(|| ErpcFigures::from_slice(&sums[11 + nf..11 + nf + ne]));
    let node = (sums[11 + nf + ne] > 0).then(|| Node::from_slice(&sums[12 + nf + ne..]));
    // seeds/004 §9 step 12: each run's throughput (the same on every rank: the run figures
    // are already sums over the ranks), and their median.
    let run_mops: Vec<f64> = run
        .runs
        .iter()
        .map(|&(o, t)| o as f64 / t.max(1e-9) / 1e6)
        .collect();
    let measured_ops = run.runs.iter().map(|r| r.0).sum();
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
        f.unroutable
            + f.failed_calls
            + f.corrupt_responses
            + f.dropped_replies
            + f.oversized_responses
    }) + node.map_or(0, |n| {
        n.unroutable
            + n.failed_calls
            + n.corrupt_responses
            + n.dropped_replies
            + n.backlog_full
            + n.oversized_responses
    });
    let check_ok = check.mismatches == 0 && check.checked > 0 && check.failures.is_empty();
    let mut notes = Vec::new();
    if damaged_reads > 0 {
        notes.push(format!(
            "{damaged_reads} read(s) found a damaged value (wrong length or bytes)"
        ));
    }
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
        clients_total: load.clients * b.size(),
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
        value_size: load.value_size.to_string(),
        key_size: match load.key_size {
            Some(k) => k.to_string(),
            // The fixed-size service's u64 keys, or `KvVar`'s default.
            None => load.sizes()?.map_or("8".to_string(), |s| s.key.to_string()),
        },
        damaged_reads,
        secs,
        ops,
        mops: median(&run_mops).unwrap_or(ops as f64 / secs / 1e6),
        run_mops,
        measured_ops,
        pinned: false,
        pin_note: String::new(),
        node,
        p50_us: us(&hist, 0.5),
        p99_us: us(&hist, 0.99),
        p999_us: us(&hist, 0.999),
        max_us: hist.max() as f64 / 1e3,
        ops_local: ops - ops_remote,
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

/// The median of `v` (the mean of the middle two for an even count); `None` if empty.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// How [`print_summaries`] prints: `--json`, `--csv`, or text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Human-readable text ([`text`]), the default.
    Text,
    /// One JSON object per run (`--json`, [`json`]).
    Json,
    /// One CSV header, then one row per run (`--csv`, [`CsvRow`]).
    Csv,
}

impl Format {
    /// The format `--json` / `--csv` choose (text without either).
    pub fn of(out: &OutArgs) -> Format {
        if out.json {
            Format::Json
        } else if out.csv {
            Format::Csv
        } else {
            Format::Text
        }
    }
}

/// Prints the summaries of one invocation on stdout in the format of `out`: each run's, in
/// order (CSV: the header before the first row), then, in text, how the backends compare
/// ([`comparison`]).
pub fn print_summaries(summaries: &[Summary], out: &OutArgs) {
    let format = Format::of(out);
    let mut stdout = std::io::stdout().lock();
    for (i, s) in summaries.iter().enumerate() {
        let _ = stdout.write_all(render(s, format, i == 0).as_bytes());
    }
    if format == Format::Text {
        for line in comparison(summaries) {
            let _ = writeln!(stdout, "{line}");
        }
    }
    let _ = stdout.flush();
}

/// One summary in `format`, ending in a newline; `first`: the CSV header precedes the row.
pub fn render(s: &Summary, format: Format, first: bool) -> String {
    match format {
        Format::Json => json(s) + "\n",
        Format::Csv => csv(s, first),
        Format::Text => text(s),
    }
}

/// How the backends of one run compare: delegation against meta (the seeds/004 §10
/// experiment) and direct against delegation, as throughput and latency ratios. With one
/// rank every call is local and the backends differ only in Daemon#0's extra ring poll
/// (seeds/004 §10), so there is no remote path to compare: one line says so instead of a
/// ratio of two runs of the same thing.
pub fn comparison(summaries: &[Summary]) -> Vec<String> {
    let mut ranks: Vec<usize> = summaries.iter().map(|s| s.ranks).collect();
    ranks.dedup();
    let mut lines = Vec::new();
    for &r in &ranks {
        let group: Vec<&Summary> = summaries.iter().filter(|s| s.ranks == r).collect();
        if group.len() < 2 {
            continue;
        }
        if r == 1 {
            lines.push(
                "one rank: no remote traffic, so no comparison of the remote paths (the \
                 backends differ only in Daemon#0's delegation-ring poll, seeds/004 §10); use \
                 --ranks 2"
                    .to_owned(),
            );
            continue;
        }
        let by = |name: &str| group.iter().copied().find(|s| s.backend == name);
        let prefix = if ranks.len() > 1 {
            format!("{r} ranks: ")
        } else {
            String::new()
        };
        if let (Some(d), Some(m)) = (by("delegation"), by("meta")) {
            lines.extend(ratio_line(&format!("{prefix}delegation vs meta"), m, d));
        }
        if let (Some(x), Some(d)) = (by("direct"), by("delegation")) {
            lines.extend(ratio_line(
                &format!("{prefix}direct (upstream baseline) vs delegation"),
                d,
                x,
            ));
        }
    }
    lines
}

/// seeds/004 §10's figures, requests per second: (backend, one node, two nodes).
pub const SEED004_RPS: [(&str, f64, f64); 2] =
    [("meta", 25.2e6, 3.37e6), ("delegation", 21.0e6, 4.76e6)];

/// The seeds/004 §10 table beside ours (`--preset seed004`): requests per second of Meta and
/// Delegation on one node and two, all ranks, and the Delegation / Meta ratio, for the seed
/// (fern03-fern04, ConnectX) and for this run (`summaries`: the preset's runs; a cell with
/// no run is `-`).
pub fn seed004_table(summaries: &[Summary]) -> String {
    let ours = |backend: &str, ranks: usize| {
        summaries
            .iter()
            .find(|s| s.backend == backend && s.ranks == ranks)
            .map(|s| s.mops * 1e6)
    };
    let m = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.3}M", v / 1e6));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("x{:.2}", a / b),
        _ => "-".to_owned(),
    };
    let mut t = String::from(
        "\nseeds/004 §10 (2 daemons, 4 clients, QD 4), requests/s over all ranks:\n\
         | backend            | 1 node: seed | 1 rank: ours | 2 nodes: seed | 2 ranks: ours |\n\
         |--------------------|--------------|--------------|---------------|---------------|\n",
    );
    for (backend, one, two) in SEED004_RPS {
        t += &format!(
            "| {backend:<18} | {:>12} | {:>12} | {:>13} | {:>13} |\n",
            m(Some(one)),
            m(ours(backend, 1)),
            m(Some(two)),
            m(ours(backend, 2)),
        );
    }
    let (sm, sd) = (SEED004_RPS[0], SEED004_RPS[1]);
    t += &format!(
        "| {:<18} | {:>12} | {:>12} | {:>13} | {:>13} |\n",
        "delegation / meta",
        ratio(Some(sd.1), Some(sm.1)),
        ratio(ours("delegation", 1), ours("meta", 1)),
        ratio(Some(sd.2), Some(sm.2)),
        ratio(ours("delegation", 2), ours("meta", 2)),
    );
    t
}

/// `what: throughput xA, p50 xB, p99 xC`, the ratios of run `x` to run `base`; `None` if
/// `base` did nothing.
pub fn ratio_line(what: &str, base: &Summary, x: &Summary) -> Option<String> {
    (base.mops > 0.0).then(|| {
        format!(
            "{what}: throughput x{:.2}, p50 x{:.2}, p99 x{:.2}",
            x.mops / base.mops,
            x.p50_us / base.p50_us.max(1e-9),
            x.p99_us / base.p99_us.max(1e-9)
        )
    })
}

/// The summary as one line of JSON (no newline).
pub fn json(s: &Summary) -> String {
    serde_json::to_string(s).expect("a summary serializes (string keys only)")
}

/// One CSV row of a summary (`--csv`): the columns in order, with the figures rounded as
/// printed (seconds to 3 decimals, throughputs to 4, latencies to 2), and the per-rank lists
/// joined by `;`.
#[derive(Debug, Serialize)]
pub struct CsvRow<'a> {
    /// [`Summary::transport`].
    pub transport: &'a str,
    /// [`Summary::daemons`].
    pub daemons: usize,
    /// [`Summary::clients`].
    pub clients: usize,
    /// [`Summary::qd`].
    pub qd: usize,
    /// [`Summary::read_ratio`], as printed.
    pub read_ratio: String,
    /// [`Summary::keys`].
    pub keys: u64,
    /// [`Summary::dist`].
    pub dist: &'a str,
    /// [`Summary::secs`], 3 decimals.
    pub seconds: String,
    /// [`Summary::ops`].
    pub ops: u64,
    /// [`Summary::mops`], 4 decimals.
    pub mops: String,
    /// [`Summary::p50_us`], 2 decimals.
    pub p50_us: String,
    /// [`Summary::p99_us`], 2 decimals.
    pub p99_us: String,
    /// [`Summary::p999_us`], 2 decimals.
    pub p999_us: String,
    /// [`Summary::gets`].
    pub gets: u64,
    /// [`Summary::hits`].
    pub get_hits: u64,
    /// [`Summary::errors`].
    pub errors: u64,
    /// [`Summary::checked`].
    pub check_samples: usize,
    /// [`Summary::mismatches`].
    pub check_mismatches: usize,
    /// [`Summary::pass`].
    pub check_passed: bool,
    /// [`Summary::ranks`].
    pub ranks: usize,
    /// [`Summary::backend`].
    pub backend: &'a str,
    /// [`Summary::ops_local`].
    pub ops_local: u64,
    /// [`Summary::ops_remote`].
    pub ops_remote: u64,
    /// [`Summary::remote_p50_us`], 2 decimals.
    pub remote_p50_us: String,
    /// [`Summary::remote_p99_us`], 2 decimals.
    pub remote_p99_us: String,
    /// [`Summary::rank_mops`], 4 decimals each, joined by `;`.
    pub rank_mops: String,
    /// [`Forward::forwarded`] of [`Summary::forward`] (0 without delegates).
    pub forwarded: u64,
    /// [`Forward::remote_served`] of [`Summary::forward`] (0 without delegates).
    pub remote_served: u64,
    /// [`Forward::handed_off`] of [`Summary::forward`] (0 without delegates).
    pub handed_off: u64,
    /// [`Forward::unroutable`] of [`Summary::forward`] (0 without delegates).
    pub unroutable: u64,
    /// [`Forward::failed_calls`] of [`Summary::forward`] (0 without delegates).
    pub failed_calls: u64,
    /// [`Forward::corrupt_responses`] of [`Summary::forward`] (0 without delegates).
    pub corrupt_responses: u64,
    /// [`Forward::ring_full_retries`] of [`Summary::forward`] (0 without delegates).
    pub ring_full_retries: u64,
    /// [`Summary::max_us`], 2 decimals.
    pub max_us: String,
    /// [`Summary::rank_served`], joined by `;`.
    pub rank_served: String,
    /// [`Summary::mpi`].
    pub mpi: bool,
    /// [`Summary::value_size`].
    pub value_size: &'a str,
    /// [`Summary::key_size`].
    pub key_size: &'a str,
}

impl<'a> From<&'a Summary> for CsvRow<'a> {
    fn from(s: &'a Summary) -> Self {
        let f = s.forward.unwrap_or_default();
        let join = |v: Vec<String>| v.join(";");
        CsvRow {
            transport: s.transport,
            daemons: s.daemons,
            clients: s.clients,
            qd: s.qd,
            read_ratio: s.read_ratio.to_string(),
            keys: s.keys,
            dist: &s.dist,
            seconds: format!("{:.3}", s.secs),
            ops: s.ops,
            mops: format!("{:.4}", s.mops),
            p50_us: format!("{:.2}", s.p50_us),
            p99_us: format!("{:.2}", s.p99_us),
            p999_us: format!("{:.2}", s.p999_us),
            gets: s.gets,
            get_hits: s.hits,
            errors: s.errors,
            check_samples: s.checked,
            check_mismatches: s.mismatches,
            check_passed: s.pass,
            ranks: s.ranks,
            backend: s.backend,
            ops_local: s.ops_local,
            ops_remote: s.ops_remote,
            remote_p50_us: format!("{:.2}", s.remote_p50_us),
            remote_p99_us: format!("{:.2}", s.remote_p99_us),
            rank_mops: join(s.rank_mops.iter().map(|m| format!("{m:.4}")).collect()),
            forwarded: f.forwarded,
            remote_served: f.remote_served,
            handed_off: f.handed_off,
            unroutable: f.unroutable,
            failed_calls: f.failed_calls,
            corrupt_responses: f.corrupt_responses,
            ring_full_retries: f.ring_full_retries,
            max_us: format!("{:.2}", s.max_us),
            rank_served: join(s.rank_served.iter().map(u64::to_string).collect()),
            mpi: s.mpi,
            value_size: &s.value_size,
            key_size: &s.key_size,
        }
    }
}

/// The summary as a CSV row ([`CsvRow`]), after the header line if `header`.
pub fn csv(s: &Summary, header: bool) -> String {
    let mut w = csv::WriterBuilder::new()
        .has_headers(header)
        .from_writer(Vec::new());
    w.serialize(CsvRow::from(s))
        .expect("a CSV row serializes (flat fields)");
    let bytes = w.into_inner().expect("writing to memory");
    String::from_utf8(bytes).expect("CSV of UTF-8 fields")
}

/// The summary as human-readable text (several lines, each ending in a newline).
pub fn text(s: &Summary) -> String {
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
    let mut t = String::new();
    // One line of the text, formatted as by `format!`.
    macro_rules! say {
        ($($arg:tt)*) => {{
            t.push_str(&format!($($arg)*));
            t.push('\n');
        }};
    }
    if ranks == 1 && s.transport == "delegation" && s.backend != "delegation" {
        // One rank of the Meta or direct backend (the default, delegation, keeps the line
        // it always had).
        say!(
            "kv, 1 rank, backend {backend}: {daemons} daemon(s), {clients} client(s), QD {qd}, {:.0}% gets, {keys} keys {dist}, {secs:.1} s",
            read_ratio * 100.0,
        );
    } else if ranks == 1 {
        say!(
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
        say!(
            "kv, {ranks} {kind}, {over}: {daemons} daemon(s) and {clients} client(s) per rank, QD {qd}, {:.0}% gets, {keys} keys {dist} per rank, {secs:.1} s",
            read_ratio * 100.0,
        );
    }
    if s.run_mops.len() > 1 {
        let runs: Vec<String> = s.run_mops.iter().map(|m| format!("{m:.3}")).collect();
        say!(
            "  throughput  {mops:.3} Mops/s, median of {} runs ({})   {ops} ops",
            runs.len(),
            runs.join(", ")
        );
    } else {
        say!("  throughput  {mops:.3} Mops/s ({ops} ops)");
    }
    if ranks > 1 {
        let per: Vec<String> = s
            .rank_mops
            .iter()
            .enumerate()
            .map(|(r, m)| format!("{r}: {m:.3}"))
            .collect();
        say!("  per rank    {} Mops/s", per.join("   "));
        let served: Vec<String> = s
            .rank_served
            .iter()
            .enumerate()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        say!("  served      {} requests", served.join("   "));
    }
    if (s.value_size.as_str(), s.key_size.as_str()) != ("8", "8") {
        say!(
            "  sizes       values {} B, keys {} B (LO-HI: uniform)   damaged reads {}",
            s.value_size,
            s.key_size,
            s.damaged_reads
        );
    }
    say!(
        "  latency     p50 {:.2} us   p99 {:.2} us   p999 {:.2} us   max {:.2} us",
        s.p50_us,
        s.p99_us,
        s.p999_us,
        s.max_us
    );
    if ranks > 1 {
        say!(
            "  remote      {ops_remote} ops ({:.0}%), {} local   p50 {:.2} us   p99 {:.2} us",
            ops_remote as f64 * 100.0 / ops.max(1) as f64,
            ops - ops_remote,
            s.remote_p50_us,
            s.remote_p99_us
        );
    }
    if ranks > 1 && s.forward.is_some() {
        say!(
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
    if let Some(n) = &s.node {
        say!(
            "  daemons     served: local {}  remote {}  via flux {}   copyrpc calls {}   flux calls {}   backlogged {}   unroutable {}   failed {}   timeouts {}   idle waits {}",
            n.local_served,
            n.remote_served,
            n.flux_served,
            n.copyrpc_calls,
            n.flux_calls,
            n.backlogged,
            n.unroutable,
            n.failed_calls,
            n.wait_timeouts,
            n.idle_waits
        );
    }
    if !s.pin_note.is_empty() {
        say!("  pinning     {}", s.pin_note);
    }
    if let Some(sc) = &s.scale {
        let group = if sc.group_size == 0 {
            "off".to_string()
        } else {
            sc.group_size.to_string()
        };
        say!(
            "  scalerpc    {} connections, group size {group} ({} group(s) per daemon), slice {} us, slot {} B",
            sc.conns,
            sc.groups,
            sc.slice_us,
            sc.slot_size
        );
        say!(
            "  schedule    switches {}   warm-up delays {}   acks {}   evictions {}   conns failed or closed {}   probes {}",
            sc.switches,
            sc.warmup_delays,
            sc.acks,
            sc.evictions,
            sc.failed_conns,
            sc.probes
        );
        let ratio = |(h, m): (u64, u64)| m as f64 * 100.0 / (h + m).max(1) as f64;
        say!(
            "  qpc cache   daemon NICs: {} hits, {} misses ({:.2}%)   all NICs: {} hits, {} misses ({:.2}%)",
            sc.qpc_server_hits,
            sc.qpc_server_misses,
            ratio((sc.qpc_server_hits, sc.qpc_server_misses)),
            sc.qpc_hits,
            sc.qpc_misses,
            ratio((sc.qpc_hits, sc.qpc_misses))
        );
    }
    if let Some(e) = &s.erpc {
        say!(
            "  erpc        {} sessions open at the end ({} closed)   requests {}   duplicates answered {}   packets dropped {}",
            e.sessions,
            e.sessions_closed,
            e.requests,
            e.dup_requests,
            e.dropped_pkts
        );
        say!(
            "  udp         daemons rx {} pkts in {} calls, tx {} pkts in {} calls, {} idle waits",
            e.rx_pkts,
            e.rx_calls,
            e.tx_pkts,
            e.tx_calls,
            e.idle_waits
        );
    }
    say!("  gets        {gets} ({hits} found)   errors {errors}   bad requests {bad_requests}");
    say!(
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
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A two-rank delegation summary with every figure distinct.
    fn sample() -> Summary {
        Summary {
            transport: "delegation",
            daemons: 2,
            clients: 3,
            qd: 8,
            read_ratio: 1.0,
            keys: 4096,
            dist: "zipf(0.99)".into(),
            value_size: "8".into(),
            key_size: "8".into(),
            damaged_reads: 0,
            secs: 1.23456,
            ops: 1000,
            mops: 0.000_810_12,
            p50_us: 12.345,
            p99_us: 67.891,
            p999_us: 100.5,
            gets: 600,
            hits: 500,
            errors: 1,
            bad_requests: 2,
            checked: 77,
            mismatches: 3,
            pass: false,
            check_msg: "a note".into(),
            ranks: 2,
            mpi: true,
            backend: "direct",
            clients_total: 6,
            max_us: 250.126,
            rank_served: vec![510, 495],
            ops_local: 400,
            ops_remote: 600,
            remote_p50_us: 20.004,
            remote_p99_us: 80.555,
            rank_ops: vec![520, 480],
            rank_mops: vec![0.000_42, 0.000_391_23],
            checked_remote: 40,
            expired: 4,
            late: 5,
            run_mops: vec![0.000_810_12],
            measured_ops: 990,
            pinned: false,
            pin_note: String::new(),
            node: None,
            forward: Some(Forward {
                forwarded: 11,
                remote_served: 12,
                handed_off: 13,
                unroutable: 14,
                failed_calls: 15,
                corrupt_responses: 16,
                ring_full_retries: 17,
                ..Forward::default()
            }),
            scale: None,
            erpc: None,
        }
    }

    fn keys(v: &serde_json::Value) -> Vec<String> {
        let mut k: Vec<String> = v.as_object().expect("an object").keys().cloned().collect();
        k.sort();
        k
    }

    fn sorted(names: &[&str]) -> Vec<String> {
        let mut k: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        k.sort();
        k
    }

    /// The JSON summary has exactly the fields the hand-written JSON had (tests and scripts
    /// read them by name) plus the per-run figures and pinning of seeds/004 §9, `forward` is
    /// `null` without delegates, and the `node`, `scalerpc` and `erpc` objects appear only in
    /// runs of those backends and transports, with their fields.
    #[test]
    fn json_keeps_the_field_names() {
        let mut s = sample();
        s.forward = None;
        let v: serde_json::Value = serde_json::from_str(&json(&s)).expect("JSON");
        assert_eq!(
            keys(&v),
            sorted(&[
                "transport",
                "daemons",
                "clients",
                "qd",
                "read_ratio",
                "keys",
                "dist",
                "value_size",
                "key_size",
                "damaged_reads",
                "seconds",
                "ops",
                "mops",
                "p50_us",
                "p99_us",
                "p999_us",
                "gets",
                "get_hits",
                "errors",
                "bad_requests",
                "check_samples",
                "check_mismatches",
                "check_passed",
                "check_note",
                "ranks",
                "mpi",
                "backend",
                "clients_total",
                "max_us",
                "rank_served",
                "ops_local",
                "ops_remote",
                "remote_p50_us",
                "remote_p99_us",
                "rank_ops",
                "rank_mops",
                "check_samples_remote",
                "deadline_exceeded",
                "late_responses",
                "forward",
                "run_mops",
                "measured_ops",
                "pinned",
                "pin_note",
            ])
        );
        assert!(v["forward"].is_null());
        assert!(
            v.get("node").is_none(),
            "node only in Meta and Delegation runs"
        );
        assert_eq!(v["seconds"], 1.23456);
        assert_eq!(v["get_hits"], 500);
        assert_eq!(v["check_passed"], false);
        assert_eq!(v["deadline_exceeded"], 4);
        assert_eq!(v["late_responses"], 5);
        assert_eq!(v["rank_served"], serde_json::json!([510, 495]));

        let mut s = sample();
        s.node = Some(Node {
            flux_served: 3,
            ..Node::default()
        });
        let v: serde_json::Value = serde_json::from_str(&json(&s)).expect("JSON");
        assert_eq!(v["node"]["flux_served"], 3);
        assert_eq!(keys(&v["node"]).len(), Node::default().to_vec().len());

        let mut s = sample();
        s.scale = Some(ScaleFigures {
            qpc_server_misses: 9,
            ..ScaleFigures::default()
        });
        s.erpc = Some(ErpcFigures {
            dup_requests: 7,
            ..ErpcFigures::default()
        });
        let v: serde_json::Value = serde_json::from_str(&json(&s)).expect("JSON");
        assert_eq!(
            keys(&v["forward"]),
            sorted(&[
                "ring_local",
                "forwarded",
                "responses",
                "remote_served",
                "handed_off",
                "handoff_replies",
                "bad_requests",
                "oversized_responses",
                "unroutable",
                "failed_calls",
                "corrupt_responses",
                "dropped_replies",
                "ring_full_retries",
                "daemon_busy_waits",
                "wait_timeouts",
            ])
        );
        assert_eq!(v["forward"]["handed_off"], 13);
        assert_eq!(
            keys(&v["scalerpc"]),
            sorted(&[
                "group_size",
                "slice_us",
                "slot_size",
                "conns",
                "groups",
                "switches",
                "warmup_delays",
                "acks",
                "evictions",
                "failed_conns",
                "requests",
                "doorbells",
                "notices",
                "probes",
                "qpc_server_hits",
                "qpc_server_misses",
                "qpc_hits",
                "qpc_misses",
            ])
        );
        assert_eq!(v["scalerpc"]["qpc_server_misses"], 9);
        assert_eq!(
            keys(&v["erpc"]),
            sorted(&[
                "sessions",
                "sessions_closed",
                "requests",
                "dup_requests",
                "dropped_pkts",
                "rx_pkts",
                "tx_pkts",
                "rx_calls",
                "tx_calls",
                "idle_waits",
            ])
        );
        assert_eq!(v["erpc"]["dup_requests"], 7);
        // One line per run.
        let line = render(&s, Format::Json, false);
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
    }

    /// The CSV header and row are the hand-written ones, character for character: the same
    /// columns, the figures rounded alike (`read_ratio` as `Display` prints it), the
    /// per-rank lists joined by `;`.
    #[test]
    fn csv_matches_the_hand_written_format() {
        let s = sample();
        let header = "transport,daemons,clients,qd,read_ratio,keys,dist,seconds,ops,mops,p50_us,p99_us,p999_us,gets,get_hits,errors,check_samples,check_mismatches,check_passed,ranks,backend,ops_local,ops_remote,remote_p50_us,remote_p99_us,rank_mops,forwarded,remote_served,handed_off,unroutable,failed_calls,corrupt_responses,ring_full_retries,max_us,rank_served,mpi,value_size,key_size";
        let row = "delegation,2,3,8,1,4096,zipf(0.99),1.235,1000,0.0008,12.35,67.89,100.50,600,500,1,77,3,false,2,direct,400,600,20.00,80.56,0.0004;0.0004,11,12,13,14,15,16,17,250.13,510;495,true,8,8";
        assert_eq!(csv(&s, true), format!("{header}\n{row}\n"));
        assert_eq!(csv(&s, false), format!("{row}\n"));
        assert_eq!(render(&s, Format::Csv, true), format!("{header}\n{row}\n"));
    }

    /// The text summary of a multi-rank run names the ranks' figures and the check's
    /// outcome and note; the ratio line compares direct to delegation.
    #[test]
    fn text_and_ratio_lines() {
        let s = sample();
        let t = text(&s);
        assert!(t.starts_with("kv, 2 MPI ranks, backend direct: 2 daemon(s) and 3 client(s) per rank, QD 8, 100% gets, 4096 keys zipf(0.99) per rank, 1.2 s\n"), "{t}");
        assert!(
            t.contains("  per rank    0: 0.000   1: 0.000 Mops/s\n"),
            "{t}"
        );
        assert!(
            t.contains("  served      0: 510   1: 495 requests\n"),
            "{t}"
        );
        assert!(t.contains("  delegates   forwarded 11   served remote 12   handed to daemons 13   ring-full retries 17   unroutable 14   failed 15   corrupt 16\n"), "{t}");
        assert!(t.ends_with("  check       FAILED: 77 written keys read back (40 written from another rank), 3 mismatches (a note)\n"), "{t}");
        let mut d = sample();
        d.mops = s.mops / 2.0;
        d.backend = "delegation";
        let mut m = sample();
        m.mops = s.mops / 4.0;
        m.backend = "meta";
        assert_eq!(
            comparison(&[m.clone(), d.clone(), s.clone()]),
            vec![
                "delegation vs meta: throughput x2.00, p50 x1.00, p99 x1.00".to_owned(),
                "direct (upstream baseline) vs delegation: throughput x2.00, p50 x1.00, p99 x1.00"
                    .to_owned(),
            ]
        );
        d.mops = 0.0;
        assert_eq!(ratio_line("x", &d, &s), None);
        // One rank: no ratio, a note that there is no remote traffic.
        for x in [&mut m, &mut d] {
            x.ranks = 1;
        }
        let one = comparison(&[m, d]);
        assert_eq!(one.len(), 1);
        assert!(one[0].starts_with("one rank: no remote traffic"), "{one:?}");
    }
}

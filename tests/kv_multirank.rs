//! The `kv` main job with several in-process ranks (run through the `kvbench` library)
//! (seeds/004 §1, §4-§7, §9): each backend must pass the correctness check (which reads back keys written from other ranks)
//! after actually sending remote requests.

mod kv_common;

use kv_common::run_in_process;
use std::time::Duration;

/// Runs `kv` in this process with a short, small workload plus `args`; returns one JSON
/// object per backend run, after checking the exit code.
fn run_kv(args: &[&str]) -> Vec<serde_json::Value> {
    let qd: &[&str] = if args.contains(&"--qd") {
        &[]
    } else {
        &["--qd", "8"]
    };
    let duration: &[&str] = if args.contains(&"--duration") {
        &[]
    } else {
        &["--duration", "1"]
    };
    let all: Vec<&str> = ["--warmup", "0.2", "--keys", "4096"]
        .iter()
        .chain(duration)
        .chain(qd)
        .chain(&["--pattern-len", "4096", "--check-samples", "500"])
        .chain(&["--json", "--quiet"])
        .chain(args)
        .copied()
        .collect();
    let (code, summaries, stderr) = run_in_process(&all, Duration::from_secs(120));
    assert_eq!(
        code,
        Some(0),
        "kv {args:?} failed: {summaries:?}\nstderr: {stderr}"
    );
    summaries
}

/// The checks every multi-rank run must pass.
fn assert_multirank(v: &serde_json::Value, ranks: u64, backend: &str) {
    assert_eq!(v["ranks"], ranks, "{v}");
    assert_eq!(v["backend"], backend, "{v}");
    assert_eq!(v["check_passed"], true, "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    assert_eq!(v["bad_requests"], 0, "{v}");
    let ops = v["ops"].as_u64().unwrap();
    let remote = v["ops_remote"].as_u64().unwrap();
    assert!(remote > 0, "no remote requests: {v}");
    assert_eq!(v["ops_local"].as_u64().unwrap() + remote, ops, "{v}");
    // Targets are uniform over the ranks: most requests are remote.
    assert!(
        remote * ranks > ops * (ranks - 1) / 2,
        "too few remote requests: {v}"
    );
    assert!(v["check_samples_remote"].as_u64().unwrap() > 0, "{v}");
    let rank_ops = v["rank_ops"].as_array().unwrap();
    assert_eq!(rank_ops.len() as u64, ranks, "{v}");
    assert!(rank_ops.iter().all(|o| o.as_u64().unwrap() > 0), "{v}");
    let n = |k: &str| {
        v["node"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("node.{k}: {v}"))
    };
    let f = |k: &str| {
        v["forward"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("forward.{k}: {v}"))
    };
    match backend {
        "meta" | "delegation" => {
            for k in [
                "unroutable",
                "failed_calls",
                "corrupt_responses",
                "oversized_responses",
                "dropped_replies",
                "backlog_full",
                "wait_timeouts",
            ] {
                assert_eq!(n(k), 0, "{k}: {v}");
            }
            // Every remote call went over copyrpc once, and was served once on its rank: by
            // the daemon that received it (its shard) or by the owner it passed it to over
            // Flux (seeds/004 §4.3).
            assert_eq!(n("copyrpc_calls"), remote, "{v}");
            assert_eq!(n("copyrpc_responses"), remote, "{v}");
            assert_eq!(n("remote_served") + n("flux_served"), remote, "{v}");
            assert_eq!(n("flux_responses"), n("flux_calls"), "{v}");
            // Local calls go over ipc to the owner daemon (§4.4); the ring serves nothing.
            assert!(n("local_served") >= ops - remote, "{v}");
            assert_eq!(n("ring_served"), 0, "{v}");
            assert!(v["forward"].is_null(), "{v}");
        }
        _ => {
            for k in [
                "unroutable",
                "failed_calls",
                "corrupt_responses",
                "oversized_responses",
                "dropped_replies",
            ] {
                assert_eq!(f(k), 0, "{k}: {v}");
            }
            // Every remote request was served by a delegate (own shard or handed to a daemon).
            assert_eq!(f("remote_served") + f("handed_off"), remote, "{v}");
            assert_eq!(f("forwarded"), 0, "{v}");
        }
    }
}

/// Delegation (seeds/004 §1.2): remote calls go straight into Daemon#0's ring; Flux carries
/// only the receiving side's hand-offs to the shard owner.
#[test]
fn two_ranks_delegation() {
    let v = run_kv(&["--ranks", "2", "--backend", "delegation", "--daemons", "2"]);
    assert_eq!(v.len(), 1);
    assert_multirank(&v[0], 2, "delegation");
    let n = &v[0]["node"];
    assert!(n["flux_served"].as_u64().unwrap() > 0, "{}", v[0]);
    assert_eq!(n["flux_calls"], n["flux_served"], "{}", v[0]);
}

/// Meta (seeds/004 §1.1, §1.4): remote calls reach the endpoint's holder (daemon
/// `rank % D`) over Flux from the owner daemon the client sent them to, so Flux carries
/// more calls than the receiving side hands off.
#[test]
fn two_ranks_meta() {
    let v = run_kv(&["--ranks", "2", "--backend", "meta", "--daemons", "2"]);
    assert_eq!(v.len(), 1);
    assert_multirank(&v[0], 2, "meta");
    let n = &v[0]["node"];
    assert!(
        n["flux_calls"].as_u64().unwrap() > n["flux_served"].as_u64().unwrap(),
        "{}",
        v[0]
    );
}

#[test]
fn two_ranks_direct() {
    let v = run_kv(&["--ranks", "2", "--backend", "direct", "--clients", "2"]);
    assert_eq!(v.len(), 1);
    assert_multirank(&v[0], 2, "direct");
}

/// Four ranks, two daemons: under Meta both daemons hold endpoints (ranks `s % 2`).
#[test]
fn four_ranks_meta_and_delegation() {
    for backend in ["meta", "delegation"] {
        let v = run_kv(&["--ranks", "4", "--daemons", "2", "--backend", backend]);
        assert_eq!(v.len(), 1);
        assert_multirank(&v[0], 4, backend);
    }
}

#[test]
fn all_backends_in_one_run() {
    let v = run_kv(&["--ranks", "2", "--backend", "all", "--dist", "zipf"]);
    assert_eq!(v.len(), 3, "{v:?}");
    assert_multirank(&v[0], 2, "meta");
    assert_multirank(&v[1], 2, "delegation");
    assert_multirank(&v[2], 2, "direct");
}

/// `--runs 3` measures three runs after the warm-up, each counted only up to its stop time:
/// three throughputs whose median is the summary's, and fewer operations than completed.
#[test]
fn runs_give_per_run_figures_and_their_median() {
    let v = run_kv(&["--ranks", "2", "--runs", "3", "--duration", "0.5"]);
    assert_multirank(&v[0], 2, "delegation");
    let runs: Vec<f64> = v[0]["run_mops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_f64().unwrap())
        .collect();
    assert_eq!(runs.len(), 3, "{}", v[0]);
    assert!(runs.iter().all(|&m| m > 0.0), "{}", v[0]);
    let mut sorted = runs.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(v[0]["mops"].as_f64().unwrap(), sorted[1], "{}", v[0]);
    let measured = v[0]["measured_ops"].as_u64().unwrap();
    assert!(
        measured > 0 && measured < v[0]["ops"].as_u64().unwrap(),
        "{}",
        v[0]
    );
}

/// `--preset seed004`: Meta and Delegation at 1 and 2 ranks with the seed's configuration,
/// each passing its check.
#[test]
fn seed004_preset_runs_both_backends_at_one_and_two_ranks() {
    let v = run_kv(&["--preset", "seed004", "--duration", "0.5", "--runs", "2"]);
    let got: Vec<(u64, &str)> = v
        .iter()
        .map(|s| (s["ranks"].as_u64().unwrap(), s["backend"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "meta"),
            (1, "delegation"),
            (2, "meta"),
            (2, "delegation")
        ]
    );
    for s in &v {
        assert_eq!(
            (&s["daemons"], &s["clients"], &s["qd"]),
            (&2.into(), &4.into(), &4.into()),
            "{s}"
        );
        assert_eq!(s["check_passed"], true, "{s}");
        assert_eq!(s["run_mops"].as_array().unwrap().len(), 2, "{s}");
    }
    for s in &v[2..] {
        assert_multirank(s, 2, s["backend"].as_str().unwrap());
    }
}

#[test]
fn read_only_multirank_run_checks_checker_written_keys() {
    let v = run_kv(&["--ranks", "2", "--read-ratio", "1"]);
    assert_eq!(v[0]["check_passed"], true, "{}", v[0]);
    assert_eq!(
        v[0]["check_note"],
        "the run wrote nothing: keys written by the checker"
    );
}

#[test]
fn tiny_copyrpc_rings_exercise_back_pressure() {
    // 4 KiB copyrpc rings hold about 30 calls: with 64 calls in flight per rank, Daemon#0's
    // calls find no room and wait in its backlog (seeds/004 §5 back-pressure), in order.
    let v = run_kv(&[
        "--ranks",
        "2",
        "--daemons",
        "2",
        "--clients",
        "2",
        "--qd",
        "32",
        "--copyrpc-ring",
        "4096",
    ]);
    assert_multirank(&v[0], 2, "delegation");
    assert!(v[0]["node"]["backlogged"].as_u64().unwrap() > 0, "{}", v[0]);
}

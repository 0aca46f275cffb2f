//! The `kv` main job with several in-process ranks (run through the `kvbench` library) (seeds/004 §1.2, §4, §5, §7): each
//! backend must pass the correctness check (which reads back keys written from other ranks)
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
    let all: Vec<&str> = ["--duration", "1", "--keys", "4096"]
        .iter()
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
    let f = &v["forward"];
    for k in [
        "unroutable",
        "failed_calls",
        "corrupt_responses",
        "dropped_replies",
    ] {
        assert_eq!(f[k], 0, "{k}: {v}");
    }
    // Every remote request was served by a delegate (own shard or handed to a daemon).
    let served = f["remote_served"].as_u64().unwrap() + f["handed_off"].as_u64().unwrap();
    assert_eq!(served, remote, "{v}");
    match backend {
        "delegation" => {
            assert_eq!(f["forwarded"].as_u64().unwrap(), remote, "{v}");
            assert_eq!(f["responses"].as_u64().unwrap(), remote, "{v}");
        }
        _ => assert_eq!(f["forwarded"], 0, "{v}"),
    }
}

#[test]
fn two_ranks_delegation() {
    let v = run_kv(&["--ranks", "2", "--backend", "delegation", "--daemons", "2"]);
    assert_eq!(v.len(), 1);
    assert_multirank(&v[0], 2, "delegation");
    // With two daemons per rank, some remote requests were handed to daemon 1.
    assert!(
        v[0]["forward"]["handed_off"].as_u64().unwrap() > 0,
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

#[test]
fn four_ranks_delegation() {
    let v = run_kv(&["--ranks", "4", "--backend", "delegation"]);
    assert_eq!(v.len(), 1);
    assert_multirank(&v[0], 4, "delegation");
}

#[test]
fn both_backends_in_one_run() {
    let v = run_kv(&["--ranks", "2", "--backend", "both", "--dist", "zipf"]);
    assert_eq!(v.len(), 2, "{v:?}");
    assert_multirank(&v[0], 2, "delegation");
    assert_multirank(&v[1], 2, "direct");
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
    // 4 KiB copyrpc rings hold about 30 calls: with 64 calls in flight per rank, the
    // delegates' Phase 2 retries after nested progress (seeds/004 §5 back-pressure).
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
    assert!(
        v[0]["forward"]["ring_full_retries"].as_u64().unwrap() > 0,
        "{}",
        v[0]
    );
}

//! The `kv` main job over eRPC (`--transport erpc`): the correctness check must pass with one
//! and with several daemons and clients, and the transport is refused where it does not apply.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// `target/<profile>/examples/kv`, which `cargo test` builds alongside the test binaries.
fn kv_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let kv = profile_dir.join("examples").join("kv");
    assert!(
        kv.exists(),
        "{} not found: build it with `cargo test` (which builds examples) or `cargo build --example kv`",
        kv.display()
    );
    kv
}

/// Runs `kv --duration 1 --json` with a small workload plus `args`; returns the exit code,
/// the JSON summary (if any) and stderr.
fn run_kv(args: &[&str]) -> (Option<i32>, Option<serde_json::Value>, String) {
    let t0 = Instant::now();
    let out = Command::new(kv_binary())
        .args(["--duration", "1", "--json", "--quiet"])
        .args([
            "--keys",
            "65536",
            "--pattern-len",
            "8192",
            "--check-samples",
            "1000",
        ])
        .args(args)
        .output()
        .expect("run kv");
    assert!(
        t0.elapsed() < Duration::from_secs(120),
        "kv {args:?} too slow"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = stdout
        .lines()
        .next()
        .map(|l| serde_json::from_str(l).expect("a JSON summary"));
    (
        out.status.code(),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A passing run's summary.
fn passing(args: &[&str]) -> serde_json::Value {
    let (code, v, stderr) = run_kv(args);
    let v = v.unwrap_or_else(|| panic!("kv {args:?}: no summary; stderr: {stderr}"));
    assert_eq!(code, Some(0), "kv {args:?}: {v}\nstderr: {stderr}");
    assert_eq!(v["check_passed"], true, "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    assert_eq!(v["bad_requests"], 0, "{v}");
    assert_eq!(v["check_mismatches"], 0, "{v}");
    assert!(v["check_samples"].as_u64().unwrap() > 0, "{v}");
    assert!(v["ops"].as_u64().unwrap() > 0, "{v}");
    v
}

#[test]
fn erpc_transport_passes_the_check() {
    let v = passing(&["--transport", "erpc"]);
    assert_eq!(v["transport"], "erpc", "{v}");
    assert_eq!(v["backend"], "erpc", "{v}");
    let e = &v["erpc"];
    // Every operation and every check read executed once on the daemon (at-most-once:
    // retransmitted requests are answered from the cache, never re-executed).
    let ops = v["ops"].as_u64().unwrap();
    let checked = v["check_samples"].as_u64().unwrap();
    let requests = e["requests"].as_u64().unwrap();
    assert!(requests >= ops + checked, "{v}");
    assert!(e["rx_pkts"].as_u64().unwrap() >= requests, "{v}");
    assert!(v.get("scalerpc").is_none(), "{v}");
}

#[test]
fn erpc_with_several_daemons_and_clients_passes_the_check() {
    let v = passing(&[
        "--transport",
        "erpc",
        "--clients",
        "3",
        "--daemons",
        "2",
        "--qd",
        "12",
        "--read-ratio",
        "0.3",
    ]);
    assert_eq!(v["daemons"], 2, "{v}");
    assert_eq!(v["clients"], 3, "{v}");
    assert_eq!(v["qd"], 12, "{v}");
    let e = &v["erpc"];
    assert!(
        e["requests"].as_u64().unwrap() >= v["ops"].as_u64().unwrap(),
        "{v}"
    );
}

#[test]
fn erpc_transport_is_single_rank() {
    let (code, v, stderr) = run_kv(&["--transport", "erpc", "--ranks", "2"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(v.is_none());
    assert!(
        stderr.contains("--transport erpc runs one rank"),
        "{stderr}"
    );
    let (code, _, stderr) = run_kv(&["--transport", "erpc", "--qd", "5000"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--qd must be in 1..=4096"), "{stderr}");
}

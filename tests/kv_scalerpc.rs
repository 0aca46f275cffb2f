//! The `kv` main job over ScaleRPC (`--transport scalerpc`): the correctness check must pass,
//! with and without group switches during the run; the default transport is unchanged.

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
fn scalerpc_transport_passes_the_check() {
    let v = passing(&["--transport", "scalerpc"]);
    assert_eq!(v["transport"], "scalerpc", "{v}");
    let s = &v["scalerpc"];
    // One client and the checker: one group, no switch.
    assert_eq!(s["conns"], 2, "{v}");
    assert_eq!(s["groups"], 1, "{v}");
    assert_eq!(s["switches"], 0, "{v}");
    assert_eq!(s["evictions"], 0, "{v}");
    assert!(
        s["requests"].as_u64().unwrap() >= v["ops"].as_u64().unwrap(),
        "{v}"
    );
    // The device model's QPC cache saw the daemon's QPs (two: far below its capacity).
    assert!(s["qpc_server_hits"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn scalerpc_groups_switch_during_the_run_and_the_check_passes() {
    // Two daemons, five connections each (four clients and the checker) in groups of two:
    // three groups per daemon take turns every 100 us.
    let v = passing(&[
        "--transport",
        "scalerpc",
        "--clients",
        "4",
        "--daemons",
        "2",
        "--qd",
        "8",
        "--read-ratio",
        "0.3",
        "--scalerpc-group",
        "2",
        "--scalerpc-slice-us",
        "100",
    ]);
    let s = &v["scalerpc"];
    assert_eq!(s["conns"], 10, "{v}");
    assert_eq!(s["groups"], 3, "{v}");
    assert!(s["switches"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["daemons"], 2, "{v}");
    assert_eq!(v["clients"], 4, "{v}");
}

#[test]
fn scalerpc_transport_is_single_rank() {
    let (code, v, stderr) = run_kv(&["--transport", "scalerpc", "--ranks", "2"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(v.is_none());
    assert!(
        stderr.contains("--transport scalerpc runs one rank"),
        "{stderr}"
    );
}

#[test]
fn delegation_stays_the_default() {
    let v = passing(&[]);
    assert_eq!(v["transport"], "delegation", "{v}");
    assert_eq!(v["backend"], "delegation", "{v}");
    assert!(v.get("scalerpc").is_none(), "{v}");
}

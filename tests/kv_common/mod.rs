//! Helpers shared by the tests that run the `kv` example binary (`tests/kv_*.rs`): finding
//! it, running it with a small workload and parsing its JSON summary, and the checks every
//! passing single-rank run must meet.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// `target/<profile>/examples/kv`, which `cargo test` builds alongside the test binaries.
pub fn kv_binary() -> PathBuf {
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
pub fn run_kv(args: &[&str]) -> (Option<i32>, Option<serde_json::Value>, String) {
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
pub fn passing(args: &[&str]) -> serde_json::Value {
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

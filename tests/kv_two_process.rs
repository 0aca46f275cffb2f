//! The `kv` main job across two processes: `kv serve` (daemons) and `kv client` (clients and
//! the correctness check), talking through the delegation rings in /dev/shm.

use std::io::{BufRead, BufReader};
mod kv_common;

use kv_common::{client, kv_binary, signal};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn serve_and_client_in_separate_processes() {
    let kv = kv_binary();
    let shm = format!("kv2p-{}", std::process::id());
    let mut serve = Command::new(&kv)
        .args([
            "serve",
            "--shm",
            &shm,
            "--daemons",
            "2",
            "--duration",
            "120",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn kv serve");
    let mut lines = BufReader::new(serve.stdout.take().unwrap()).lines();
    let ready = lines.next().expect("serve exited early").unwrap();
    assert!(ready.starts_with("ready"), "unexpected first line: {ready}");

    let t0 = Instant::now();
    let out = client(
        &shm,
        &[
            "--clients",
            "2",
            "--qd",
            "8",
            "--duration",
            "1",
            "--dist",
            "zipf",
            "--quiet",
        ],
    )
    .output()
    .expect("run kv client");
    assert!(t0.elapsed() < Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kv client failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("JSON summary");
    assert_eq!(v["check_passed"], true, "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    assert!(v["ops"].as_u64().unwrap() > 0, "{v}");
    assert!(v["check_samples"].as_u64().unwrap() > 0, "{v}");

    // SIGTERM: the daemons stop cleanly and remove their rings.
    signal(serve.id(), "TERM");
    let status = serve.wait().expect("wait serve");
    assert!(status.success(), "kv serve exited with {status}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert_eq!(
        rest.iter().filter(|l| l.starts_with("daemon ")).count(),
        2,
        "{rest:?}"
    );
    for d in 0..2 {
        assert!(
            !PathBuf::from(format!("/dev/shm/{shm}-{d}")).exists(),
            "ring {d} left behind"
        );
    }
    assert!(
        !PathBuf::from(format!("/dev/shm/{shm}.rings")).exists(),
        "ring manifest left behind"
    );
}

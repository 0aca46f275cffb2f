//! The `kv` main job under faults (issue 12 §5), across two processes: `kv serve` (daemons)
//! and `kv client` (client threads and the check); and a lost direct reply in a run of two
//! in-process ranks through the `kvbench` library. Faults are made on purpose, never by
//! timing: a client thread that fails (the hidden test hook `--fail-client-after`), a
//! daemon process killed while the clients run, a reply the daemon drops (the hidden test hook
//! `kv serve --drop-reply`), and two client processes sharing the daemons.

mod kv_common;

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::time::{Duration, Instant};

use kv_common::{Serve, client, finish_within};

/// A client thread that fails ends `kv client` at once (not at `--duration`), and the summary
/// keeps what the client threads did before it (the failing one's operations included),
/// names the failure and exits non-zero.
#[test]
fn a_failing_client_thread_ends_the_run_with_its_partial_results() {
    let serve = Serve::start("failthread", 2, &[]);
    let t0 = Instant::now();
    let child = client(
        &serve.shm,
        &[
            "--clients",
            "1",
            "--qd",
            "8",
            "--duration",
            "120",
            "--quiet",
        ],
    )
    .args(["--fail-client-after", "2000"])
    .spawn()
    .expect("spawn kv client");
    let (code, v, stderr) = finish_within(child, Duration::from_secs(60), "kv client");
    assert!(t0.elapsed() < Duration::from_secs(60));
    let v = v.unwrap_or_else(|| panic!("no summary; stderr: {stderr}"));
    assert_eq!(code, Some(1), "{v}\nstderr: {stderr}");
    // The only client thread failed: every operation counted is one of its own.
    assert!(v["ops"].as_u64().unwrap() >= 2000, "{v}");
    assert!(v["seconds"].as_f64().unwrap() < 60.0, "{v}");
    assert_eq!(v["check_passed"], false, "{v}");
    let note = v["check_note"].as_str().unwrap();
    assert!(note.contains("client 0.0 failed"), "{v}");
    assert!(note.contains("failed on purpose"), "{v}");
    assert!(stderr.contains("client 0.0 failed"), "{stderr}");
}

/// With several client threads, one failing stops the others too; their operations count.
#[test]
fn one_failing_thread_of_several_stops_the_others() {
    let serve = Serve::start("failone", 1, &[]);
    let child = client(
        &serve.shm,
        &[
            "--clients",
            "3",
            "--qd",
            "4",
            "--duration",
            "120",
            "--quiet",
        ],
    )
    .args(["--fail-client-after", "1000"])
    .spawn()
    .expect("spawn kv client");
    let (code, v, stderr) = finish_within(child, Duration::from_secs(60), "kv client");
    let v = v.unwrap_or_else(|| panic!("no summary; stderr: {stderr}"));
    assert_eq!(code, Some(1), "{v}\nstderr: {stderr}");
    assert!(v["ops"].as_u64().unwrap() >= 1000, "{v}");
    assert_eq!(v["clients"], 3, "{v}");
    let note = v["check_note"].as_str().unwrap();
    // Only client 0 failed; the others stopped cleanly.
    assert!(note.contains("client 0.0 failed"), "{v}");
    assert!(!note.contains("client 0.1"), "{v}");
}

/// The daemons' process killed (SIGKILL) while the clients run: every client thread finds the
/// server gone, and `kv client` ends with what it did, not at `--duration`.
#[test]
fn killed_daemons_end_the_client_run_with_its_partial_results() {
    let mut serve = Serve::start("killserve", 2, &[]);
    let cmd = client(
        &serve.shm,
        &["--clients", "2", "--qd", "8", "--duration", "120"],
    );
    let (v, stderr) = through_fault(cmd, || serve.kill());
    assert_eq!(v["check_passed"], false, "{v}");
    assert!(
        v["check_note"]
            .as_str()
            .unwrap()
            .contains("server disconnected"),
        "{v}"
    );
    assert!(stderr.contains("server disconnected"), "{stderr}");
}

/// Runs the `kv client` command `cmd` until its first progress line (the run is going),
/// applies `fault`, and waits (at most 60 s) for the run to end: it must end with exit code 1
/// and a summary counting some operations. Returns the summary and the rest of stderr.
fn through_fault(mut cmd: Command, fault: impl FnOnce()) -> (serde_json::Value, String) {
    let mut child = cmd.spawn().expect("spawn kv client");
    let mut err = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let first = err.next().expect("kv client exited early").expect("a line");
    assert!(first.starts_with('['), "unexpected first line: {first}");
    fault();
    let rest = std::thread::spawn(move || err.map_while(Result::ok).collect::<Vec<_>>());
    let (code, v, _) = finish_within(child, Duration::from_secs(60), "kv client");
    let stderr = rest.join().unwrap().join("\n");
    let v = v.unwrap_or_else(|| panic!("no summary; stderr: {stderr}"));
    assert_eq!(code, Some(1), "{v}\nstderr: {stderr}");
    assert!(v["ops"].as_u64().unwrap() > 0, "{v}");
    (v, stderr)
}

/// A passing `kv client` summary.
fn assert_passed(code: Option<i32>, v: Option<serde_json::Value>, stderr: &str) {
    let v = v.unwrap_or_else(|| panic!("no summary; stderr: {stderr}"));
    assert_eq!(code, Some(0), "{v}\nstderr: {stderr}");
    assert_eq!(v["check_passed"], true, "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    assert_eq!(v["check_mismatches"], 0, "{v}");
    assert!(v["check_samples"].as_u64().unwrap() > 0, "{v}");
    assert!(v["ops"].as_u64().unwrap() > 0, "{v}");
}

/// Two `kv client` runs, one after the other, against one `kv serve` with different
/// `--clients`: the second reads values the first wrote, and must find each from the key's
/// one writer (writer ids are unique per client process, the key partition the same).
#[test]
fn consecutive_client_runs_with_different_client_counts_pass() {
    let serve = Serve::start("twoclients", 2, &[]);
    for clients in ["1", "2", "3"] {
        let child = client(
            &serve.shm,
            &[
                "--clients",
                clients,
                "--qd",
                "8",
                "--duration",
                "1",
                "--quiet",
            ],
        )
        .spawn()
        .expect("spawn kv client");
        let (code, v, stderr) = finish_within(child, Duration::from_secs(60), "kv client");
        assert_passed(code, v, &stderr);
    }
}

/// Two `kv client` processes at once against one `kv serve` (the second starts once the
/// first is running), with different `--clients`: each key still has one writer, so both
/// pass their checks.
#[test]
fn concurrent_client_runs_with_different_client_counts_pass() {
    let serve = Serve::start("concurrent", 2, &[]);
    let mut first = client(
        &serve.shm,
        &["--clients", "2", "--qd", "8", "--duration", "3"],
    )
    .spawn()
    .expect("spawn kv client");
    let mut err = BufReader::new(first.stderr.take().expect("stderr")).lines();
    let line = err.next().expect("kv client exited early").expect("a line");
    assert!(line.starts_with('['), "unexpected first line: {line}");
    let rest = std::thread::spawn(move || err.map_while(Result::ok).collect::<Vec<_>>());
    let second = client(
        &serve.shm,
        &["--clients", "3", "--qd", "8", "--duration", "1", "--quiet"],
    )
    .spawn()
    .expect("spawn kv client");
    let (code, v, stderr) = finish_within(second, Duration::from_secs(60), "second kv client");
    assert_passed(code, v, &stderr);
    let (code, v, _) = finish_within(first, Duration::from_secs(60), "first kv client");
    assert_passed(code, v, &rest.join().unwrap().join("\n"));
}

/// The key partition of `kv client` processes is by the rings' client ids (`k % max_clients`),
/// so a key range smaller than `--max-clients` is refused up front.
#[test]
fn client_refuses_fewer_keys_than_ring_client_ids() {
    let serve = Serve::start("fewkeys", 1, &["--max-clients", "16"]);
    let out = std::process::Command::new(kv_common::kv_binary())
        .args(["client", "--shm", &serve.shm, "--keys", "8", "--json"])
        .args(["--duration", "1", "--quiet"])
        .output()
        .expect("run kv client");
    let (code, stderr) = (out.status.code(), String::from_utf8_lossy(&out.stderr));
    let v = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(str::to_owned);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(v.is_none(), "{v:?}");
    assert!(stderr.contains("--keys 8"), "{stderr}");
    assert!(stderr.contains("--max-clients 16"), "{stderr}");
}

/// The daemons drop one reply (the hidden test hook `kv serve --drop-reply N`): that call
/// never completes, so `kv client` counts it as an error once `--deadline-ms` has passed and
/// ends (its stop loop used to wait for it forever), with a failing check and exit code 1.
#[test]
fn a_dropped_reply_expires_at_the_deadline_instead_of_hanging_the_stop_loop() {
    let serve = Serve::start("dropreply", 2, &["--drop-reply", "50"]);
    let child = client(
        &serve.shm,
        &["--clients", "2", "--qd", "8", "--duration", "1", "--quiet"],
    )
    .args(["--deadline-ms", "300"])
    .spawn()
    .expect("spawn kv client");
    let (code, v, stderr) = finish_within(child, Duration::from_secs(60), "kv client");
    let v = v.unwrap_or_else(|| panic!("no summary; stderr: {stderr}"));
    assert_eq!(code, Some(1), "{v}\nstderr: {stderr}");
    // Exactly the one call whose reply was dropped.
    assert_eq!(v["deadline_exceeded"], 1, "{v}");
    assert_eq!(v["errors"], 1, "{v}");
    assert!(v["ops"].as_u64().unwrap() > 50, "{v}");
    assert_eq!(v["check_passed"], false, "{v}");
    assert!(
        v["check_note"]
            .as_str()
            .unwrap()
            .contains("1 call(s) got no reply within --deadline-ms 300"),
        "{v}"
    );
}

/// The daemons' process stopped (SIGSTOP: alive, holding its rings, answering nothing) while
/// the clients run: every call in flight expires at `--deadline-ms` (the typed client's
/// deadline), the check's calls too, and `kv client` ends with a failing check instead of
/// waiting forever.
#[test]
fn stopped_daemons_end_the_client_run_at_the_deadline() {
    let serve = Serve::start("stopserve", 1, &[]);
    let mut cmd = client(
        &serve.shm,
        &["--clients", "2", "--qd", "4", "--duration", "2"],
    );
    cmd.args(["--deadline-ms", "300"]);
    let (v, _) = through_fault(cmd, || serve.pause());
    // Each client thread had calls in flight when the daemon stopped, and issued new ones as
    // those expired until the ring client's response slots (kv serve --resp-depth 64) were
    // all held by expired calls.
    let expired = v["deadline_exceeded"].as_u64().unwrap();
    assert!((2..=2 * 64).contains(&expired), "{v}");
    assert_eq!(v["errors"].as_u64().unwrap(), expired, "{v}");
    assert_eq!(v["check_passed"], false, "{v}");
    let note = v["check_note"].as_str().unwrap();
    assert!(
        note.contains("got no reply within --deadline-ms 300"),
        "{v}"
    );
    // The checker's first read got no reply either.
    assert!(note.contains("check "), "{v}");
}

/// `--backend direct` calls the other ranks through typed copyrpc clients on one shared
/// context per client thread: a call that gets no reply (the hidden test hook
/// `--lose-direct-call`, which never sends it) expires at `--deadline-ms`, and the run ends
/// (a stop loop that waited for every call would hang) with exit code 1.
#[test]
fn a_lost_direct_call_expires_at_the_deadline() {
    let args = [
        "--ranks",
        "2",
        "--backend",
        "direct",
        "--qd",
        "8",
        "--duration",
        "1",
        "--json",
        "--quiet",
        "--keys",
        "4096",
        "--pattern-len",
        "4096",
        "--check-samples",
        "500",
        "--deadline-ms",
        "300",
        "--lose-direct-call",
        "20",
    ];
    let (code, v, stderr) = kv_common::run_in_process(&args, Duration::from_secs(60));
    let v = v.into_iter().next();
    let v = v.unwrap_or_else(|| panic!("no summary; stderr: {stderr}"));
    assert_eq!(code, Some(1), "{v}\nstderr: {stderr}");
    assert_eq!(v["backend"], "direct", "{v}");
    assert_eq!(v["deadline_exceeded"], 1, "{v}");
    assert_eq!(v["errors"], 1, "{v}");
    assert!(v["ops_remote"].as_u64().unwrap() > 20, "{v}");
    assert!(
        v["check_note"]
            .as_str()
            .unwrap()
            .contains("1 call(s) got no reply within --deadline-ms 300"),
        "{v}"
    );
}

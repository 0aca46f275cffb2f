//! The `kv` main job with variable-size values and keys (issue 15: `--value-size LO-HI`,
//! `--key-size LO-HI`, the `KvVar` service): the correctness check passes end to end on the
//! delegation transport (one rank, and two ranks with every backend: Meta over ipc and Flux,
//! Delegation, direct copyrpc), over eRPC and ScaleRPC, and between `kv serve --variable` and
//! `kv client`; a damaged value (one byte flipped, or one byte short) written by a client is
//! found by the reads and by the check, which then fails; bad sizes are refused.

mod kv_common;

use std::time::Duration;

use kv_common::{Serve, client, finish_within, passing, run_in_process, run_kv};

const VAR: [&str; 4] = ["--value-size", "16-4096", "--key-size", "10-40"];

fn with_var<'a>(args: &[&'a str]) -> Vec<&'a str> {
    VAR.iter().chain(args).copied().collect()
}

/// A passing variable-size run names its sizes and found no damaged value (its check read
/// values back, `check_samples > 0`, each checked byte for byte).
fn assert_var(v: &serde_json::Value) {
    assert_eq!(v["value_size"], "16-4096", "{v}");
    assert_eq!(v["key_size"], "10-40", "{v}");
    assert_eq!(v["damaged_reads"], 0, "{v}");
    assert!(v["check_samples"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn variable_sizes_pass_the_check_on_the_delegation_transport() {
    let v = passing(&with_var(&[
        "--clients",
        "2",
        "--daemons",
        "2",
        "--qd",
        "8",
    ]));
    assert_var(&v);
    assert_eq!(v["transport"], "delegation", "{v}");
}

#[test]
fn variable_sizes_pass_the_check_across_ranks_on_every_backend() {
    let args = with_var(&[
        "--duration",
        "1",
        "--warmup",
        "0.2",
        "--json",
        "--quiet",
        "--keys",
        "65536",
        "--pattern-len",
        "8192",
        "--check-samples",
        "1000",
        "--ranks",
        "2",
        "--daemons",
        "2",
        "--qd",
        "8",
        "--backend",
        "all",
    ]);
    let (code, all, stderr) = run_in_process(&args, Duration::from_secs(240));
    assert_eq!(code, Some(0), "{stderr}");
    let backends: Vec<&str> = all.iter().map(|v| v["backend"].as_str().unwrap()).collect();
    assert_eq!(backends, ["meta", "delegation", "direct"]);
    for v in &all {
        assert_eq!(v["check_passed"], true, "{v}");
        assert_eq!(v["errors"], 0, "{v}");
        assert_eq!(v["bad_requests"], 0, "{v}");
        assert_var(v);
        // Values written from the other rank were read back and checked too.
        assert!(v["ops_remote"].as_u64().unwrap() > 0, "{v}");
        assert!(v["check_samples_remote"].as_u64().unwrap() > 0, "{v}");
    }
    // Meta passes remote calls between its daemons over Flux: the 4 KiB messages fit.
    let meta = &all[0]["node"];
    assert!(meta["flux_calls"].as_u64().unwrap() > 0, "{meta}");
}

#[test]
fn variable_sizes_pass_the_check_over_erpc_and_scalerpc() {
    let v = passing(&with_var(&[
        "--transport",
        "erpc",
        "--clients",
        "2",
        "--daemons",
        "2",
        "--qd",
        "8",
    ]));
    assert_var(&v);
    assert_eq!(v["transport"], "erpc", "{v}");
    let v = passing(&with_var(&["--transport", "scalerpc", "--clients", "2"]));
    assert_var(&v);
    // The slot is derived from KvVar's largest message (not the fixed-size 128 B).
    assert!(
        v["scalerpc"]["slot_size"].as_u64().unwrap() >= 4096 + 64,
        "{v}"
    );
    // A slot given too small is refused, naming the size needed.
    let (code, _, stderr) = run_kv(&with_var(&[
        "--transport",
        "scalerpc",
        "--scalerpc-slot",
        "128",
    ]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("slot_size to at least"), "{stderr}");
}

/// A fixed size other than 8 and fixed-length keys run `KvVar` too.
#[test]
fn a_fixed_value_size_runs_the_variable_service() {
    let v = passing(&["--value-size", "64"]);
    assert_eq!(v["value_size"], "64", "{v}");
    assert_eq!(v["key_size"], "16", "{v}");
    assert_eq!(v["damaged_reads"], 0, "{v}");
    // The default keeps the fixed-size u64 service.
    let v = passing(&[]);
    assert_eq!(
        (&v["value_size"], &v["key_size"]),
        (&"8".into(), &"8".into())
    );
}

/// Client 0 writes damaged values (`--corrupt-puts`): with one client every key the check
/// samples holds one, so the reads during the run and the check both find them.
#[test]
fn damaged_values_fail_the_check() {
    for how in ["flip", "short"] {
        let args = with_var(&[
            "--corrupt-puts",
            how,
            "--duration",
            "1",
            "--warmup",
            "0.2",
            "--json",
            "--quiet",
            "--keys",
            "4096",
            "--check-samples",
            "100000",
        ]);
        let (code, v, stderr) = run_in_process(&args, Duration::from_secs(120));
        let v = v
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("{how}: no summary: {stderr}"));
        assert_eq!(code, Some(1), "{how}: {v}");
        assert_eq!(v["check_passed"], false, "{how}: {v}");
        let checked = v["check_samples"].as_u64().unwrap();
        assert!(checked > 0, "{how}: {v}");
        // Every key read back holds a damaged value.
        assert_eq!(v["check_mismatches"], checked, "{how}: {v}");
        // The reads during the run that found one (if any did) are its only errors.
        assert_eq!(v["errors"], v["damaged_reads"], "{how}: {v}");
    }
}

#[test]
fn bad_sizes_are_refused() {
    for (args, want) in [
        (
            &["--value-size", "9"][..],
            "variable-size values are 16..=4096",
        ),
        (
            &["--value-size", "16-5000"],
            "variable-size values are 16..=4096",
        ),
        (
            &["--value-size", "64", "--key-size", "5"],
            "need at least 6 bytes",
        ),
        (&["--value-size", "64", "--key-size", "300"], "at most 256"),
        (&["--key-size", "16"], "give --value-size too"),
        (
            &[
                "--value-size",
                "64",
                "--ranks",
                "2",
                "--copyrpc-ring",
                "4096",
            ],
            "give --copyrpc-ring 32768 or more",
        ),
        (&["--corrupt-puts", "flip"], "--corrupt-puts needs"),
    ] {
        let (code, v, stderr) = run_kv(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(v.is_none(), "{args:?}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}

#[test]
fn variable_sizes_between_kv_serve_and_kv_client() {
    let serve = Serve::start("var", 2, &["--variable"]);
    let out = client(
        &serve.shm,
        &[
            "--value-size",
            "16-4096",
            "--key-size",
            "10-40",
            "--clients",
            "2",
            "--qd",
            "8",
            "--duration",
            "1",
            "--quiet",
        ],
    )
    .spawn()
    .expect("spawn kv client");
    let (code, v, stderr) = finish_within(out, Duration::from_secs(60), "kv client");
    let v = v.unwrap_or_else(|| panic!("no summary: {stderr}"));
    assert_eq!(code, Some(0), "{v}\n{stderr}");
    assert_eq!(v["check_passed"], true, "{v}");
    assert_var(&v);
    // The fixed-size client on the variable-size rings: refused, naming the fix.
    let out = client(&serve.shm, &["--duration", "1", "--quiet"])
        .spawn()
        .expect("spawn kv client");
    let (code, _, stderr) = finish_within(out, Duration::from_secs(60), "kv client");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("serve KvVar (kv serve --variable)"),
        "{stderr}"
    );
}

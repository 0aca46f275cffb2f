//! The `kv` main job over eRPC (`--transport erpc`): the correctness check must pass with one
//! and with several daemons and clients, and the transport is refused where it does not apply.

mod kv_common;

use kv_common::{passing, run_kv};

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

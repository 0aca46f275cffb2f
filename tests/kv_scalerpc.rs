//! The `kv` main job over ScaleRPC (`--transport scalerpc`): the correctness check must pass,
//! with and without group switches during the run; the default transport is unchanged.

mod kv_common;

use kv_common::{passing, run_kv};

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
    // Two daemons, five connections each (four clients, then the checker, which reuses a
    // reclaimed connection id) in groups of two: two groups per daemon take turns every 100 us.
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
    // Two groups when the checker's connection takes the id of a client connection the
    // daemon has already reclaimed; three when the checker connects before the daemon's
    // poll noticed a client leave (reclaiming is done by the daemon's loop, so under load it
    // can come after the checker's connect: seen in full-workspace runs on two cores).
    let groups = s["groups"].as_u64().unwrap();
    assert!((2..=3).contains(&groups), "{v}");
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

//! The routing daemons' variable-length path allocates nothing per request once warm
//! (issue 15): `KvVar` puts and gets from a typed ipc client to one rank's two daemons
//! (`NodeDaemon::run_once_raw` with the generated `dispatch_raw`, a router reading the key
//! in place, half the keys served by the other daemon over Flux), their responses read with
//! `poll_ref` (a get's value checked in the receive buffer), all run on the test thread, make
//! no heap allocation on that thread. The scenario is `examples/kv_daemon_path.rs` (whose
//! counting global allocator counts only on the thread that switched counting on, the
//! pattern of `rpc-runtime/tests/copyrpc_alloc.rs`).

#[path = "../examples/kv_daemon_path.rs"]
#[allow(dead_code)]
mod path;

use idl::kv::KvVarService;
use path::{Bench, Mode, allocations};
use rpc::Service;

fn warm(mode: Mode, tag: &str) -> Bench {
    let mut b = Bench::new(&format!("kvalloc-{}-{tag}", std::process::id()), mode);
    // Warm-up: every key stored (with its final length), queues at their working sizes.
    for _ in 0..3000 {
        b.step();
    }
    assert_eq!(b.bad, 0, "bad responses in the warm-up");
    b
}

#[test]
fn kv_var_puts_and_gets_through_the_daemons_allocate_nothing_once_warm() {
    let mut b = warm(Mode::Raw, "raw");
    let (puts0, hits0) = (b.puts, b.hits);
    let n = allocations(|| {
        for _ in 0..3000 {
            b.step();
        }
    });
    let (puts, hits) = (b.puts - puts0, b.hits - hits0);
    assert_eq!(b.bad, 0, "bad responses");
    assert!(puts > 2000 && hits > 2000, "puts {puts}, gets {hits}");
    let s = b.stats();
    assert!(
        s[1].flux_served > 1000,
        "the other shard over Flux: {:?}",
        s[1]
    );
    assert_eq!(
        (
            s[0].bad_requests,
            s[0].oversized_responses,
            s[0].dropped_replies
        ),
        (0, 0, 0)
    );
    assert_eq!(n, 0, "allocations in {puts} puts and {hits} gets");
}

/// The counter sees allocations: the owned path (`run_once` + `poll_with`) of the same
/// scenario allocates a key `String` per request, a value `Vec` per put and per get
/// answered.
#[test]
fn the_owned_path_allocates_per_call() {
    let mut b = warm(Mode::Owned, "owned");
    let c0 = b.calls();
    let n = allocations(|| {
        for _ in 0..300 {
            b.step();
        }
    });
    let calls = b.calls() - c0;
    assert_eq!(b.bad, 0);
    assert!(calls > 200, "{calls} calls");
    assert!(n >= 2 * calls, "{n} allocations in {calls} calls");
    // Decoding one put into its owned request: a `String` and a `Vec`.
    let mut buf = vec![0u64; 64];
    let out = rpc::__private::zerocopy::IntoBytes::as_mut_bytes(&mut buf[..]);
    let len = KvVarService::__rpc_put_req_write(out, 0, "k0001", b"some value");
    let msg = &out[..len];
    let mut req = None;
    let allocs = allocations(|| req = Some(KvVarService::decode_request(msg).unwrap()));
    assert_eq!(allocs, 2, "a String and a Vec");
    drop(req);
}

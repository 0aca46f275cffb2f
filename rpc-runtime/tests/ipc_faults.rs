//! Bad input in an ipc segment: every corrupt field or slot, bad token, foreign file or
//! mismatched service gives a clear error and a counter, never a panic, a hang or a response
//! delivered to the wrong call.

mod ipc_common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use ipc_common::*;
use rpc_runtime::ipc::layout::*;
use rpc_runtime::ipc::{Ipc, IpcError, IpcServer, IpcToken};
use rpc_runtime::{ClientTransport, RpcError, ServiceDescriptor};

fn is_fault(e: &RpcError) -> bool {
    matches!(
        e.transport::<IpcError>(),
        Some(IpcError::ClientFault { .. })
    )
}

#[test]
fn request_longer_than_capacity_is_rejected_and_counted() {
    let n = unique_name("badlen");
    let mut s = server(&n, 2, 4);
    let mut c = Ipc::attach(&n).unwrap();
    let mut raw = Raw::open(&n);
    let l = *s.layout();
    let first = send(&mut c, b"first");
    let second = send(&mut c, b"second");
    // Corrupt the first request's length to exceed the capacity.
    raw.put_u32(l.req_slot(0, 0) + SLOT_LEN, CAP as u32 + 1);
    s.poll();
    let (t2, req) = s.recv().expect("the second request is served");
    assert_eq!(req, b"second");
    assert!(s.recv().is_none());
    assert_eq!(s.stats().bad_len, 1);
    assert_eq!(s.stats().received, 1);
    s.reply_with(t2, |buf| {
        buf[..3].copy_from_slice(b"abc");
        3
    })
    .unwrap();
    // The bad call was answered with an empty message at once (its token comes back), the
    // good one with its reply.
    let mut got = Vec::new();
    c.poll_up_to(4, |t, b| got.push((t, b.to_vec()))).unwrap();
    assert_eq!(got, [(first, vec![]), (second, b"abc".to_vec())]);
    // A huge length too: no out-of-bounds read.
    let third = send(&mut c, b"third");
    raw.put_u32(l.req_slot(0, 2) + SLOT_LEN, u32::MAX);
    s.poll();
    assert!(s.recv().is_none());
    assert_eq!(s.stats().bad_len, 2);
    let mut got = Vec::new();
    c.poll_up_to(4, |t, b| got.push((t, b.len()))).unwrap();
    assert_eq!(got, [(third, 0)]);
    assert_eq!(c.in_flight(), 0);
}

#[test]
fn head_jump_faults_only_that_client() {
    let n = unique_name("headjump");
    let mut s = server(&n, 2, 4);
    let mut bad = Ipc::attach(&n).unwrap();
    let mut good = Ipc::attach(&n).unwrap();
    let mut raw = Raw::open(&n);
    let l = *s.layout();
    let b = l.block(bad.client_index());
    raw.put_u64(b + CB_REQ_HEAD, 5); // depth 4, tail 0: 5 ahead
    s.poll();
    assert!(s.recv().is_none());
    assert_eq!(s.stats().ring_faults, 1);
    assert_eq!(raw.u32(b + CB_FAULT), FAULT_HEAD);
    let e = bad.try_send(|_| 0).unwrap_err();
    assert!(is_fault(&e), "{e}");
    // The other client is served as before.
    send(&mut good, b"ok");
    assert_eq!(wait_one(&mut good, Some(&mut s)).1, transform(b"ok"));
    // A head far beyond (wrapping) is refused the same way and never loops.
    drop(bad);
    s.scan_clients();
    let mut bad = Ipc::attach(&n).unwrap();
    let b = l.block(bad.client_index());
    raw.put_u64(b + CB_REQ_HEAD, u64::MAX);
    s.poll();
    assert!(s.recv().is_none());
    assert_eq!(s.stats().ring_faults, 2);
    assert!(is_fault(&bad.try_send(|_| 0).unwrap_err()));
}

#[test]
fn head_behind_cursor_faults() {
    let n = unique_name("headback");
    let mut s = server(&n, 1, 4);
    let mut c = Ipc::attach(&n).unwrap();
    let mut raw = Raw::open(&n);
    let b = s.layout().block(0);
    send(&mut c, b"a");
    send(&mut c, b"b");
    s.poll();
    while s.recv().is_some() {}
    // The server's cursor is 2 (released tail 0); the head goes back to 1.
    raw.put_u64(b + CB_REQ_HEAD, 1);
    s.poll();
    assert!(s.recv().is_none());
    assert_eq!(s.stats().ring_faults, 1);
}

#[test]
fn corrupt_response_tail_faults_and_reply_is_refused() {
    let n = unique_name("resptail");
    let mut s = server(&n, 1, 4);
    let mut c = Ipc::attach(&n).unwrap();
    let mut raw = Raw::open(&n);
    let b = s.layout().block(0);
    send(&mut c, b"x");
    s.poll();
    let (token, _) = s.recv().unwrap();
    raw.put_u64(b + CB_RESP_TAIL, 9); // ahead of resp_head 0
    assert!(matches!(
        s.reply_with(token, |_| 0),
        Err(RpcError::ReplyDropped(_))
    ));
    assert_eq!(s.stats().ring_faults, 1);
    assert_eq!(raw.u32(b + CB_FAULT), FAULT_RESP_TAIL);
    assert!(is_fault(&c.poll_up_to(1, |_, _| ()).unwrap_err()));
}

#[test]
fn client_detects_response_head_out_of_range() {
    let n = unique_name("resphead");
    let s = server(&n, 1, 4);
    let mut c = Ipc::attach(&n).unwrap();
    let mut raw = Raw::open(&n);
    send(&mut c, b"x");
    raw.put_u64(s.layout().block(0) + CB_RESP_HEAD, 100);
    let e = c
        .poll_up_to(4, |_, _| panic!("nothing may be delivered"))
        .unwrap_err();
    assert!(is_fault(&e), "{e}");
    assert_eq!(c.stats().ring_faults, 1);
}

#[test]
fn forged_token_is_refused_by_the_server() {
    let n = unique_name("forged");
    let mut s = server(&n, 1, 4);
    let mut c = Ipc::attach(&n).unwrap();
    let t = send(&mut c, b"q");
    s.poll();
    let (token, _) = s.recv().unwrap();
    // A token with another tag answers no call awaiting a reply: refused, never written.
    let forged = IpcToken {
        tag: token.tag ^ 0x100,
        ..token
    };
    assert!(s.reply_with(forged, |_| 1).is_err());
    assert_eq!(s.stats().duplicate_replies, 1);
    assert_eq!(
        c.poll_up_to(4, |_, _| panic!("nothing was replied"))
            .unwrap(),
        0
    );
    // The real reply still goes through, once.
    s.reply_with(token, |_| 0).unwrap();
    assert!(s.reply_with(token, |_| 0).is_err());
    assert_eq!(s.stats().duplicate_replies, 2);
    let mut got = Vec::new();
    c.poll_up_to(4, |tok, _| got.push(tok)).unwrap();
    assert_eq!(got, [t]);
}

#[test]
fn response_with_foreign_tag_is_dropped_not_delivered() {
    let n = unique_name("staletag");
    let s = server(&n, 1, 4);
    let mut c = Ipc::attach(&n).unwrap();
    let mut raw = Raw::open(&n);
    let l = *s.layout();
    let t = send(&mut c, b"q");
    let tag = raw.u32(l.req_slot(0, 0) + SLOT_TAG);
    // A response carrying another tag (same call token, other call number) in slot 0, then
    // the right one in slot 1.
    for (pos, tg) in [(0, tag ^ 0x100), (1, tag)] {
        raw.put_u32(l.resp_slot(0, pos) + SLOT_LEN, 2);
        raw.put_u32(l.resp_slot(0, pos) + SLOT_TAG, tg);
    }
    raw.put_u64(l.block(0) + CB_RESP_HEAD, 1);
    assert_eq!(
        c.poll_up_to(4, |_, _| panic!("delivered a stale response"))
            .unwrap(),
        0
    );
    assert_eq!(c.stats().stale_responses, 1);
    raw.put_u64(l.block(0) + CB_RESP_HEAD, 2);
    let mut got = Vec::new();
    c.poll_up_to(4, |tok, b| got.push((tok, b.len()))).unwrap();
    assert_eq!(got, [(t, 2)]);
    assert_eq!(raw.u64(l.block(0) + CB_RESP_TAIL), 2, "both slots consumed");
}

#[test]
fn request_reusing_a_busy_call_token_is_dropped() {
    let n = unique_name("reuse");
    let mut s = server(&n, 1, 4);
    let mut c = Ipc::attach(&n).unwrap();
    let mut raw = Raw::open(&n);
    let l = *s.layout();
    send(&mut c, b"a");
    send(&mut c, b"b");
    let tag0 = raw.u32(l.req_slot(0, 0) + SLOT_TAG);
    raw.put_u32(l.req_slot(0, 1) + SLOT_TAG, tag0);
    s.poll();
    let (_, req) = s.recv().unwrap();
    assert_eq!(req, b"a");
    assert!(s.recv().is_none());
    assert_eq!(s.stats().token_reused, 1);
}

#[test]
fn oversized_response_is_delivered_empty_and_counted() {
    let n = unique_name("bigresp");
    let mut s = server(&n, 1, 4);
    let mut c = Ipc::attach(&n).unwrap();
    let mut raw = Raw::open(&n);
    let l = *s.layout();
    let t = send(&mut c, b"q");
    s.poll();
    let (token, _) = s.recv().unwrap();
    s.reply_with(token, |buf| {
        buf[..3].copy_from_slice(b"abc");
        3
    })
    .unwrap();
    raw.put_u32(l.resp_slot(0, 0) + SLOT_LEN, u32::MAX);
    let mut got = Vec::new();
    c.poll_up_to(4, |tok, b| got.push((tok, b.to_vec())))
        .unwrap();
    assert_eq!(got, [(t, Vec::new())]);
    assert_eq!(c.stats().corrupt_responses, 1);
}

#[test]
fn bad_stale_duplicate_and_oversized_replies_are_refused_and_counted() {
    let n = unique_name("tokens");
    let mut s = server(&n, 2, 4);
    let mut c = Ipc::attach(&n).unwrap();
    send(&mut c, b"a");
    send(&mut c, b"b");
    s.poll();
    let (t1, _) = s.recv().unwrap();
    let (t2, _) = s.recv().unwrap();
    let bad = IpcToken { client: 2, ..t1 };
    assert!(s.reply_with(bad, |_| 0).is_err());
    assert_eq!(s.stats().bad_tokens, 1);
    assert!(s.reply_with(t1, |_| CAP + 1).is_err());
    assert_eq!(s.stats().oversized_replies, 1);
    s.reply_with(t1, |_| 0).unwrap();
    s.reply_with(t2, |_| 0).unwrap();
    assert!(s.reply_with(t2, |_| 0).is_err());
    assert_eq!(s.stats().duplicate_replies, 1);
    // After the client detaches and its block is reclaimed, its tokens are stale.
    send(&mut c, b"c");
    s.poll();
    let (t3, _) = s.recv().unwrap();
    drop(c);
    s.scan_clients();
    assert_eq!(s.stats().clients_reclaimed, 1);
    assert_eq!(s.stats().requests_dropped, 1);
    let c2 = Ipc::attach(&n).unwrap();
    assert_eq!(
        c2.client_index(),
        t3.client,
        "the reclaimed block is reused"
    );
    assert!(s.reply_with(t3, |_| 0).is_err());
    assert_eq!(s.stats().stale_replies, 1);
}

#[test]
fn full_and_detached_blocks() {
    let n = unique_name("full");
    let mut s = server(&n, 2, 4);
    let a = Ipc::attach(&n).unwrap();
    let _b = Ipc::attach(&n).unwrap();
    assert!(matches!(
        Ipc::attach(&n),
        Err(IpcError::NoFreeSlot { max_clients: 2, .. })
    ));
    drop(a);
    // Not free until the server reclaimed it.
    assert!(matches!(Ipc::attach(&n), Err(IpcError::NoFreeSlot { .. })));
    s.scan_clients();
    assert_eq!(s.stats().clients_reclaimed, 1);
    let raw = Raw::open(&n);
    assert_eq!(owner_gen(raw.u64(s.layout().block(0) + CB_OWNER)), 1);
    Ipc::attach(&n).expect("the reclaimed block is free again");
}

#[test]
fn corrupt_headers_are_refused_before_mapping() {
    let n = unique_name("hdr");
    let _s = server(&n, 2, 4);
    let cases: [(usize, u64, bool, &str); 8] = [
        (OFF_MAGIC, 1, false, "magic"),
        (OFF_VERSION, 99, true, "version"),
        (OFF_DEPTH, 3, true, "depth"),
        (OFF_MAX_CLIENTS, 0, true, "max_clients"),
        (OFF_REQ_SLOT_SIZE, 8, true, "req_slot_size"),
        (OFF_CLIENT_STRIDE, 1 << 40, false, "stride"),
        (OFF_TOTAL_SIZE, 1 << 20, false, "total"),
        (OFF_LIVENESS_NS, 0, false, "liveness"),
    ];
    for (off, v, is32, what) in cases {
        let mut raw = Raw::open(&n);
        let old = raw.0[off..off + 8].to_vec();
        if is32 {
            raw.put_u32(off, v as u32);
        } else {
            raw.put_u64(off, v);
        }
        let e = Ipc::attach(&n).expect_err(what);
        assert!(
            matches!(
                e,
                IpcError::BadMagic { .. }
                    | IpcError::UnsupportedVersion { .. }
                    | IpcError::CorruptHeader { .. }
            ),
            "{what}: {e}"
        );
        raw.0[off..off + 8].copy_from_slice(&old);
    }
    Ipc::attach(&n).expect("restored header");
    // A truncated file.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(shm_file(&n))
        .unwrap();
    f.set_len(200).unwrap();
    assert!(matches!(
        Ipc::attach(&n),
        Err(IpcError::CorruptHeader { .. })
    ));
}

#[test]
fn file_with_mode_0644_or_a_symlink_is_refused() {
    let n = unique_name("mode");
    let _s = server(&n, 2, 4);
    let path = shm_file(&n);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let before = rpc_runtime::ipc::unsafe_files_refused();
    let e = Ipc::attach(&n).unwrap_err();
    assert!(matches!(e, IpcError::UnsafeFile { mode: 0o644, .. }), "{e}");
    assert!(rpc_runtime::ipc::unsafe_files_refused() > before, "counted");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    Ipc::attach(&n).expect("mode 0600 is accepted");
    let link = unique_name("mode-link");
    let _ = std::fs::remove_file(shm_file(&link));
    std::os::unix::fs::symlink(&path, shm_file(&link)).unwrap();
    let e = Ipc::attach(&link).unwrap_err();
    assert!(matches!(e, IpcError::UnsafeFile { .. }), "{e}");
    std::fs::remove_file(shm_file(&link)).unwrap();
}

#[test]
fn live_server_name_is_not_taken_and_stale_file_is_replaced() {
    let n = unique_name("inuse");
    let s = server(&n, 1, 4);
    assert!(matches!(
        IpcServer::create_raw(&n, cfg(1, 4), 7, CAP, CAP),
        Err(IpcError::InUse { .. })
    ));
    // A leftover file nobody serves (copy of the segment) is replaced.
    let bytes = std::fs::read(shm_file(&n)).unwrap();
    drop(s);
    assert!(!shm_file(&n).exists(), "the server unlinks its file");
    std::fs::write(shm_file(&n), bytes).unwrap();
    std::fs::set_permissions(shm_file(&n), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(matches!(Ipc::attach(&n), Err(IpcError::NoServer { .. })));
    let _s = server(&n, 1, 4);
    Ipc::attach(&n).expect("fresh segment");
}

static OTHER: ServiceDescriptor = ServiceDescriptor::new("Other", &[]);

#[test]
fn wrong_fingerprint_or_capacity_is_refused() {
    let n = unique_name("fp");
    let _s = IpcServer::create_raw(&n, cfg(2, 4), OTHER.fingerprint ^ 1, 64, 64).unwrap();
    match <Ipc as ClientTransport>::connect(&n, &OTHER) {
        Err(RpcError::SchemaMismatch {
            expected, found, ..
        }) => {
            assert_eq!(
                (expected, found),
                (OTHER.fingerprint, OTHER.fingerprint ^ 1)
            )
        }
        other => panic!("{other:?}"),
    }
    let n2 = unique_name("cap");
    let _s2 = IpcServer::create_raw(&n2, cfg(2, 4), OTHER.fingerprint, 4, 64).unwrap();
    assert!(matches!(
        <Ipc as ClientTransport>::connect(&n2, &OTHER),
        Err(RpcError::CapacityMismatch {
            cap: 4,
            side: rpc_runtime::LimitSide::PeerServer,
            ..
        })
    ));
    let n3 = unique_name("ok");
    let _s3 = IpcServer::create_raw(&n3, cfg(2, 4), OTHER.fingerprint, 64, 64).unwrap();
    let c = <Ipc as ClientTransport>::connect(&n3, &OTHER).unwrap();
    assert_eq!(c.max_in_flight(), 4);
}

#[test]
fn invalid_configs_are_refused() {
    let n = unique_name("cfg");
    for (mc, d) in [(0, 4), (1, 3), (1, 0), (5000, 4), (1, 8192)] {
        assert!(matches!(
            IpcServer::create_raw(&n, cfg(mc, d), 0, 8, 8),
            Err(IpcError::InvalidConfig { .. })
        ));
    }
    let mut c = cfg(1, 4);
    c.liveness_interval = Duration::ZERO;
    assert!(matches!(
        IpcServer::create_raw(&n, c, 0, 8, 8),
        Err(IpcError::InvalidConfig { .. })
    ));
    assert!(matches!(
        IpcServer::create_raw("a/b", cfg(1, 4), 0, 8, 8),
        Err(IpcError::InvalidName { .. })
    ));
}

#[test]
fn clean_shutdown_ends_calls() {
    let n = unique_name("shutdown");
    let s = server(&n, 1, 4);
    let mut c = Ipc::attach(&n).unwrap();
    send(&mut c, b"x");
    drop(s);
    assert!(matches!(
        c.poll_up_to(1, |_, _| ()),
        Err(RpcError::ServerDisconnected)
    ));
    assert!(matches!(
        c.try_send(|_| 0),
        Err(RpcError::ServerDisconnected)
    ));
    assert!(matches!(Ipc::attach(&n), Err(IpcError::Io { .. })));
}

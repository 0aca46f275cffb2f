//! In-process fault tests of the delegation ring: invalid entries written straight into shared
//! memory, garbage ring files, stale and bad reply tokens, clients that die between reserving
//! and committing, aborted calls, clean server shutdown, name and configuration validation.

mod ring_common;

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rpc_runtime::delegation::layout::{self, MAGIC};
use rpc_runtime::delegation::{
    ReplyToken, RingCallError, RingClient, RingConfig, RingError, RingFault, RingReplyError,
    RingServer, SHM_DIR,
};

use ring_common::{Cleanup, shm_file, unique_name};

fn small_cfg() -> RingConfig {
    RingConfig {
        max_clients: 4,
        ring_depth: 8,
        resp_depth: 4,
        req_payload_cap: 32,
        resp_payload_cap: 32,
        hole_timeout: Duration::from_millis(50),
        liveness_interval: Duration::from_millis(5),
        ..RingConfig::default()
    }
}

/// Polls, echoes every request back, advances the tail. Returns the number served.
fn serve_once(server: &mut RingServer) -> usize {
    server.poll();
    let n = echo_received(server);
    server.advance_tail();
    n
}

/// Echoes every request the last poll found back to its sender. Returns the number served.
fn echo_received(server: &mut RingServer) -> usize {
    let mut n = 0;
    while let Some(e) = server.recv() {
        let token = e.token;
        let payload = e.payload.to_vec();
        server.reply(token, &payload).expect("reply");
        n += 1;
    }
    n
}

/// Serves until `done()` or the deadline; panics on timeout.
fn serve_until(
    server: &mut RingServer,
    timeout: Duration,
    mut done: impl FnMut(&RingServer) -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !done(server) {
        assert!(
            Instant::now() < deadline,
            "timed out; stats {:?}",
            server.stats()
        );
        serve_once(server);
        std::thread::yield_now();
    }
}

/// One call served by `server` and its response checked.
/// A new ring `name` with one attached client.
fn attached(name: &str, cfg: &RingConfig) -> (RingServer, RingClient) {
    let server = RingServer::create(name, cfg).unwrap();
    let client = RingClient::attach(name).unwrap();
    (server, client)
}

/// [`attached`], after one round trip that shows the ring works.
fn serving(name: &str, cfg: &RingConfig) -> (RingServer, RingClient) {
    let (mut server, mut client) = attached(name, cfg);
    roundtrip(&mut server, &mut client, b"ok");
    (server, client)
}

fn roundtrip(server: &mut RingServer, client: &mut RingClient, payload: &[u8]) {
    let idx = client.try_call(payload).expect("try_call");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = None;
    while got.is_none() {
        assert!(
            Instant::now() < deadline,
            "no response; stats {:?}",
            server.stats()
        );
        serve_once(server);
        client
            .poll(|i, r| {
                assert_eq!(i, idx);
                got = Some(r.to_vec());
            })
            .expect("poll");
    }
    assert_eq!(got.unwrap(), payload);
}

#[test]
fn ring_invalid_entries_are_dropped_and_counted() {
    let name = unique_name("invalid");
    let cfg = small_cfg();
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut attacker = RingClient::attach(&name).unwrap();
    let mut victim = RingClient::attach(&name).unwrap();
    let a = attacker.client_id();
    let free_id = 3; // never attached
    assert!(a != free_id && victim.client_id() != free_id);

    attacker
        .__raw_commit(cfg.max_clients, 0, 4, b"xxxx")
        .unwrap();
    attacker.__raw_commit(u32::MAX, 0, 4, b"xxxx").unwrap();
    attacker
        .__raw_commit(a, cfg.resp_depth, 4, b"xxxx")
        .unwrap();
    attacker.__raw_commit(a, u32::MAX, 4, b"xxxx").unwrap();
    attacker
        .__raw_commit(a, 0, cfg.req_payload_cap + 1, b"xxxx")
        .unwrap();
    attacker.__raw_commit(a, 0, u32::MAX - 1, b"xxxx").unwrap();
    attacker.__raw_commit(free_id, 0, 4, b"xxxx").unwrap();
    // A well-formed raw entry in between is served.
    attacker.__raw_commit(a, 1, 3, b"abc").unwrap();
    assert_eq!(server.poll(), 8);
    let e = server.recv().expect("the valid entry");
    assert_eq!(
        (e.token.client_id, e.token.resp_slot_idx, e.payload),
        (a, 1, &b"abc"[..])
    );
    assert!(server.recv().is_none());
    server.advance_tail();
    let s = server.stats();
    assert_eq!(
        (
            s.bad_client_id,
            s.bad_resp_slot,
            s.bad_payload_len,
            s.inactive_client
        ),
        (2, 2, 2, 1),
        "{s:?}"
    );
    assert_eq!((s.received, s.invalid_entries()), (1, 7));

    // The server keeps serving, through many wraps of the 8-slot ring.
    for i in 0..50u8 {
        roundtrip(&mut server, &mut victim, &[i; 7]);
    }
    // No response was written for the attacker's invalid entries.
    let mut stray = 0;
    attacker.poll(|_, _| stray += 1).unwrap();
    assert_eq!(stray, 0);
}

#[test]
fn ring_reply_token_checks() {
    let name = unique_name("tokens");
    let cfg = small_cfg();
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut c = RingClient::attach(&name).unwrap();
    let mut attacker = RingClient::attach(&name).unwrap();

    // BadToken: out of range.
    let bad = ReplyToken {
        call_tag: 0,
        client_id: cfg.max_clients,
        generation: 0,
        resp_slot_idx: 0,
    };
    assert_eq!(server.reply(bad, b"x"), Err(RingReplyError::BadToken));
    let bad = ReplyToken {
        call_tag: 0,
        client_id: c.client_id(),
        generation: c.generation(),
        resp_slot_idx: cfg.resp_depth,
    };
    assert_eq!(server.reply(bad, b"x"), Err(RingReplyError::BadToken));
    // A token never issued (nothing pending on that slot) is stale.
    let never = ReplyToken {
        call_tag: 0,
        client_id: c.client_id(),
        generation: c.generation(),
        resp_slot_idx: 0,
    };
    assert_eq!(server.reply(never, b"x"), Err(RingReplyError::StaleToken));

    let idx = c.try_call(b"hello").unwrap();
    assert_eq!(server.poll(), 1);
    let token = server.recv().unwrap().token;
    assert_eq!(token.resp_slot_idx, idx);
    assert_eq!(token.generation, c.generation());
    // Too large: nothing written, token still good.
    let big = vec![0u8; cfg.resp_payload_cap as usize + 1];
    assert!(matches!(
        server.reply(token, &big),
        Err(RingReplyError::PayloadTooLarge { len: 33, cap: 32 })
    ));
    assert!(matches!(
        server.reply_with(token, |_| 33),
        Err(RingReplyError::PayloadTooLarge { len: 33, cap: 32 })
    ));
    server
        .reply_with(token, |buf| {
            assert_eq!(buf.len(), 32);
            buf[..2].copy_from_slice(b"ok");
            2
        })
        .unwrap();
    // Answering twice is refused.
    assert_eq!(
        server.reply(token, b"again"),
        Err(RingReplyError::StaleToken)
    );

    // SlotBusy: a forged request on the same (still unread) response slot.
    attacker.__raw_commit(c.client_id(), idx, 1, b"f").unwrap();
    server.poll();
    let forged = server.recv().unwrap().token;
    assert_eq!(
        server.reply(forged, b"forged"),
        Err(RingReplyError::SlotBusy)
    );
    server.advance_tail();
    let mut got = Vec::new();
    c.poll(|i, r| got.push((i, r.to_vec()))).unwrap();
    assert_eq!(got, vec![(idx, b"ok".to_vec())]);
    let s = server.stats();
    assert_eq!((s.stale_replies, s.resp_slot_busy, s.replied), (2, 1, 1));
}

#[test]
fn ring_stale_token_after_detach_and_reclaim() {
    let name = unique_name("stale");
    let cfg = RingConfig {
        max_clients: 1,
        ..small_cfg()
    };
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut c = RingClient::attach(&name).unwrap();
    let (id, generation) = (c.client_id(), c.generation());
    c.try_call(b"req").unwrap();
    assert_eq!(server.poll(), 1);
    let token = server.recv().unwrap().token;
    server.advance_tail();
    // The only id is taken.
    assert!(matches!(
        RingClient::attach(&name),
        Err(RingError::NoFreeClientId { max_clients: 1, .. })
    ));
    drop(c); // DETACHED
    assert_eq!(
        server.reply(token, b"late"),
        Err(RingReplyError::StaleToken)
    );
    serve_until(&mut server, Duration::from_secs(10), |s| {
        s.stats().clients_reclaimed == 1
    });
    let c2 = RingClient::attach(&name).unwrap();
    assert_eq!(c2.client_id(), id);
    assert_eq!(c2.generation(), generation.wrapping_add(1));
    // The old token must not reach the new owner of the id.
    assert_eq!(
        server.reply(token, b"late"),
        Err(RingReplyError::StaleToken)
    );
    assert_eq!(server.stats().stale_replies, 2);
}

#[test]
fn ring_dead_client_hole_is_skipped_and_id_reclaimed() {
    let name = unique_name("hole-inproc");
    let cfg = RingConfig {
        max_clients: 2,
        ..small_cfg()
    };
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut live = RingClient::attach(&name).unwrap();
    let mut doomed = RingClient::attach(&name).unwrap();
    let dead_id = doomed.client_id();
    roundtrip(&mut server, &mut live, b"before");

    let pos = doomed.__reserve_without_commit().unwrap();
    assert_eq!(pos, 1);
    doomed.__crash(); // lock released, record left ACTIVE with reserving_pos == pos

    let start = Instant::now();
    let idx = live.try_call(b"after the hole").unwrap();
    let mut got = None;
    while got.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            server.stats()
        );
        serve_once(&mut server);
        live.poll(|i, r| got = Some((i, r.to_vec()))).unwrap();
    }
    let waited = start.elapsed();
    assert_eq!(got.unwrap(), (idx, b"after the hole".to_vec()));
    assert_eq!(server.stats().holes_skipped, 1);
    assert!(waited >= cfg.hole_timeout, "skipped after {waited:?}");

    // The dead client's id is reclaimed and reusable.
    serve_until(&mut server, Duration::from_secs(10), |s| {
        s.stats().clients_reclaimed == 1
    });
    let mut again = RingClient::attach(&name).unwrap();
    assert_eq!(again.client_id(), dead_id);
    for i in 0..20u8 {
        roundtrip(&mut server, &mut again, &[i; 3]);
        roundtrip(&mut server, &mut live, &[i; 5]);
    }
    assert_eq!(server.stats().holes_skipped, 1);
}

#[test]
fn ring_hole_of_live_client_is_not_skipped() {
    let name = unique_name("hole-live");
    // Within the stall timeout (here: long), a live client's hole is waited for.
    let cfg = RingConfig {
        stall_timeout: Duration::from_secs(30),
        ..small_cfg()
    };
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut stuck = RingClient::attach(&name).unwrap();
    let mut other = RingClient::attach(&name).unwrap();
    stuck.__reserve_without_commit().unwrap();
    let idx = other.try_call(b"behind").unwrap();
    // The owner is alive: the server must wait (until the stall timeout).
    let start = Instant::now();
    while start.elapsed() < cfg.hole_timeout * 4 {
        assert_eq!(serve_once(&mut server), 0);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(server.stats().holes_skipped, 0);
    // Once it detaches (here: without ever committing), the hole is skipped.
    drop(stuck);
    let mut got = None;
    while got.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            server.stats()
        );
        serve_once(&mut server);
        other.poll(|i, r| got = Some((i, r.to_vec()))).unwrap();
    }
    assert_eq!(got.unwrap(), (idx, b"behind".to_vec()));
    assert_eq!(server.stats().holes_skipped, 1);
}

#[test]
fn ring_aborted_calls_do_not_stall_the_ring() {
    let name = unique_name("abort");
    let cfg = small_cfg();
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut c = RingClient::attach(&name).unwrap();
    // Too large up front: nothing reserved.
    assert_eq!(
        c.try_call(&[0u8; 33]),
        Err(RingCallError::PayloadTooLarge { len: 33, cap: 32 })
    );
    // Too large from the writer: the slot is committed as aborted.
    assert_eq!(
        c.try_call_with(|buf| buf.len() + 1),
        Err(RingCallError::PayloadTooLarge { len: 33, cap: 32 })
    );
    // A panicking writer: the slot is committed as aborted during unwinding.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = c.try_call_with(|_| panic!("writer failed"));
    }));
    assert!(r.is_err());
    assert_eq!(c.in_flight(), 0);
    roundtrip(&mut server, &mut c, b"still works");
    let s = server.stats();
    assert_eq!((s.aborted, s.received, s.holes_skipped), (2, 1, 0), "{s:?}");
}

#[test]
fn ring_would_block_when_all_slots_outstanding() {
    let name = unique_name("wouldblock");
    let cfg = small_cfg();
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut c = RingClient::attach(&name).unwrap();
    let mut slots: Vec<u32> = (0..cfg.resp_depth)
        .map(|i| c.try_call(&[i as u8]).unwrap())
        .collect();
    slots.sort();
    assert_eq!(slots, (0..cfg.resp_depth).collect::<Vec<_>>());
    assert_eq!(c.try_call(b"x"), Err(RingCallError::WouldBlock));
    assert_eq!(c.in_flight(), cfg.resp_depth as usize);
    serve_once(&mut server);
    let mut n = 0;
    c.poll(|i, r| {
        assert_eq!(r, &[i as u8]);
        n += 1
    })
    .unwrap();
    assert_eq!(n, cfg.resp_depth);
    assert!(c.try_call(b"x").is_ok());
}

#[test]
fn ring_clean_server_drop_disconnects_clients() {
    let name = unique_name("drop");
    let mut server = RingServer::create(&name, &small_cfg()).unwrap();
    let mut c = RingClient::attach(&name).unwrap();
    roundtrip(&mut server, &mut c, b"hi");
    c.try_call(b"never answered").unwrap();
    drop(server);
    assert!(!shm_file(&name).exists(), "file unlinked on drop");
    assert_eq!(
        c.poll(|_, _| panic!()),
        Err(RingCallError::ServerDisconnected)
    );
    assert_eq!(c.try_call(b"x"), Err(RingCallError::ServerDisconnected));
    assert_eq!(c.check_server(), Err(RingCallError::ServerDisconnected));
    assert!(matches!(
        RingClient::attach(&name),
        Err(RingError::NotFound { .. })
    ));
}

#[test]
fn ring_create_exclusive_and_stale_replacement() {
    let name = unique_name("exclusive");
    let cfg = small_cfg();
    let server = RingServer::create(&name, &cfg).unwrap();
    assert!(matches!(
        RingServer::create(&format!("/{name}"), &cfg),
        Err(RingError::AlreadyExists { pid, .. }) if pid == std::process::id()
    ));
    // A stale copy of a ring (no server holds it) ...
    let stale = unique_name("stale-copy");
    let _cleanup = Cleanup(shm_file(&stale));
    std::fs::copy(shm_file(&name), shm_file(&stale)).unwrap();
    drop(server);
    assert!(matches!(
        RingClient::attach(&stale),
        Err(RingError::ServerNotRunning { .. })
    ));
    // ... is replaced by a new server.
    let mut s2 = RingServer::create(&stale, &cfg).unwrap();
    assert_eq!(s2.name(), stale);
    let mut c = RingClient::attach(&stale).unwrap();
    assert_eq!(c.client_id(), 0);
    roundtrip(&mut s2, &mut c, b"fresh");
    let mode = std::fs::metadata(shm_file(&stale)).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
}

#[test]
fn ring_names_and_config_are_validated() {
    for bad in ["", "/", "a/b", "/a/b", "..", ".", "x\0y"] {
        assert!(
            matches!(
                RingServer::create(bad, &small_cfg()),
                Err(RingError::InvalidName { .. })
            ),
            "{bad:?}"
        );
        assert!(matches!(
            RingClient::attach(bad),
            Err(RingError::InvalidName { .. })
        ));
    }
    let name = unique_name("badcfg");
    for cfg in [
        RingConfig {
            ring_depth: 3,
            ..small_cfg()
        },
        RingConfig {
            ring_depth: 0,
            ..small_cfg()
        },
        RingConfig {
            resp_depth: 6,
            ..small_cfg()
        },
        RingConfig {
            max_clients: 0,
            ..small_cfg()
        },
        RingConfig {
            max_clients: 65_537,
            ..small_cfg()
        },
        RingConfig {
            req_payload_cap: u32::MAX,
            ..small_cfg()
        },
        RingConfig {
            liveness_interval: Duration::ZERO,
            ..small_cfg()
        },
    ] {
        let e = RingServer::create(&name, &cfg).unwrap_err();
        assert!(matches!(e, RingError::InvalidConfig { .. }), "{cfg:?}: {e}");
    }
    assert!(!shm_file(&name).exists());
    let info = RingServer::create(&name, &small_cfg()).unwrap().info();
    assert_eq!(
        (info.ring_depth, info.resp_depth, info.req_payload_cap),
        (8, 4, 32)
    );
}

/// Copies the first `len` bytes of a live ring's file into a new file, applies `edit` to the
/// bytes, and attaches to it while holding a fake server lock on it.
fn attach_to_edited(
    tag: &str,
    len: Option<u64>,
    edit: impl FnOnce(&mut Vec<u8>),
) -> Result<RingClient, RingError> {
    let src = unique_name(&format!("{tag}-src"));
    let server = RingServer::create(&src, &small_cfg()).unwrap();
    let mut bytes = std::fs::read(shm_file(&src)).unwrap();
    drop(server);
    if let Some(len) = len {
        bytes.truncate(len as usize);
    }
    edit(&mut bytes);
    let dst = unique_name(tag);
    let _cleanup = Cleanup(shm_file(&dst));
    // Mode 0600, as a server creates it: attach refuses other modes before reading anything.
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(shm_file(&dst))
        .and_then(|mut f| f.write_all(&bytes))
        .unwrap();
    lock_header_and_attach(&dst)
}

/// Takes a server-style OFD lock on the header of `/dev/shm/name` and attaches.
fn lock_header_and_attach(name: &str) -> Result<RingClient, RingError> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(shm_file(name))
        .unwrap();
    // SAFETY: `flock` is a plain C struct of integers, valid when all zero.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_len = 128;
    // SAFETY: valid fd and flock struct.
    let r = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            libc::F_OFD_SETLK,
            &mut fl,
        )
    };
    assert_eq!(r, 0);
    RingClient::attach(name)
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

#[test]
fn ring_attach_rejects_bad_files() {
    // Sanity: an unmodified copy with a lock is accepted.
    assert!(attach_to_edited("ok", None, |_| {}).is_ok());

    let e = attach_to_edited("magic", None, |b| put_u64(b, 0, MAGIC ^ 1)).unwrap_err();
    assert!(
        matches!(e, RingError::BadMagic { found, .. } if found == MAGIC ^ 1),
        "{e}"
    );
    let e = attach_to_edited("zeros", None, |b| b.fill(0)).unwrap_err();
    assert!(matches!(e, RingError::BadMagic { .. }), "{e}");
    let e = attach_to_edited("version", None, |b| {
        put_u32(b, layout::OFF_VERSION, layout::VERSION + 1)
    })
    .unwrap_err();
    assert!(
        matches!(
            e,
            RingError::UnsupportedVersion {
                found,
                expected,
                ..
            } if found == layout::VERSION + 1 && expected == layout::VERSION
        ),
        "{e}"
    );
    // The full size of a ring built with the same configuration.
    let full_len = {
        let n = unique_name("size-probe");
        let _server = RingServer::create(&n, &small_cfg()).unwrap();
        std::fs::metadata(shm_file(&n)).unwrap().len()
    };
    let e = attach_to_edited("short", Some(1024), |_| {}).unwrap_err();
    assert!(
        matches!(
            e,
            RingError::Truncated {
                len: 1024,
                needed,
                ..
            } if needed == full_len
        ),
        "{e}"
    );
    let e = attach_to_edited("tiny", Some(100), |_| {}).unwrap_err();
    assert!(matches!(e, RingError::Truncated { len: 100, .. }), "{e}");
    let e = attach_to_edited("empty", Some(0), |_| {}).unwrap_err();
    assert!(matches!(e, RingError::Truncated { len: 0, .. }), "{e}");
    for (field, off, v) in [
        ("ring_depth", layout::OFF_RING_DEPTH, 3u32),
        ("ring_depth", layout::OFF_RING_DEPTH, 0),
        ("resp_depth", layout::OFF_RESP_DEPTH, 1 << 31),
        ("max_clients", layout::OFF_MAX_CLIENTS, 0),
        ("req_slot_size", layout::OFF_REQ_SLOT_SIZE, 128),
        ("resp_slot_size", layout::OFF_RESP_SLOT_SIZE, 4096),
        ("req_payload_cap", layout::OFF_REQ_PAYLOAD_CAP, u32::MAX),
    ] {
        let e = attach_to_edited(field, None, |b| put_u32(b, off, v)).unwrap_err();
        assert!(
            matches!(e, RingError::CorruptHeader { .. }),
            "{field}={v}: {e}"
        );
    }
    let e = attach_to_edited("total", None, |b| {
        put_u64(b, layout::OFF_TOTAL_SIZE, 1 << 50)
    })
    .unwrap_err();
    assert!(matches!(e, RingError::CorruptHeader { .. }), "{e}");
    let e = attach_to_edited("table", None, |b| {
        put_u64(b, layout::OFF_CLIENT_TABLE_OFFSET, 0)
    })
    .unwrap_err();
    assert!(matches!(e, RingError::CorruptHeader { .. }), "{e}");
    // Bigger parameters, consistently rewritten, but the file is too short for them.
    let e = attach_to_edited("bigger", None, |b| {
        put_u32(b, layout::OFF_RING_DEPTH, 1 << 20);
        let l = layout::Layout::new(layout::LayoutParams {
            max_clients: 4,
            ring_depth: 1 << 20,
            resp_depth: 4,
            req_payload_cap: 32,
            resp_payload_cap: 32,
        })
        .unwrap();
        put_u64(b, layout::OFF_CLIENT_TABLE_OFFSET, l.client_table_offset);
        put_u64(b, layout::OFF_TOTAL_SIZE, l.total_size);
    })
    .unwrap_err();
    assert!(matches!(e, RingError::Truncated { .. }), "{e}");
    let e = attach_to_edited("liveness", None, |b| {
        put_u64(b, layout::OFF_LIVENESS_INTERVAL_NS, 0)
    })
    .unwrap_err();
    assert!(matches!(e, RingError::CorruptHeader { .. }), "{e}");
    // A file nobody locked: no server.
    let name = unique_name("nolock");
    let _cleanup = Cleanup(shm_file(&name));
    let server = RingServer::create(&unique_name("nolock-src"), &small_cfg()).unwrap();
    std::fs::copy(shm_file(&unique_name("nolock-src")), shm_file(&name)).unwrap();
    drop(server);
    assert!(matches!(
        RingClient::attach(&name),
        Err(RingError::ServerNotRunning { .. })
    ));
    // A file whose server flag is down.
    let e = attach_to_edited("notalive", None, |b| b[layout::OFF_SERVER_ALIVE] = 0).unwrap_err();
    assert!(matches!(e, RingError::ServerNotRunning { .. }), "{e}");
    // Messages name the file.
    let e = attach_to_edited("msg", None, |b| put_u32(b, layout::OFF_VERSION, 9)).unwrap_err();
    assert!(
        e.to_string().contains("/dev/shm/rt-") && e.to_string().contains('9'),
        "{e}"
    );
}

#[test]
fn ring_garbage_client_table_is_harmless() {
    // Every client record in a state nobody can own: attach finds no id.
    let e = attach_to_edited("table-garbage", None, |b| {
        let l = layout::Layout::new(layout::LayoutParams {
            max_clients: 4,
            ring_depth: 8,
            resp_depth: 4,
            req_payload_cap: 32,
            resp_payload_cap: 32,
        })
        .unwrap();
        for id in 0..4 {
            put_u32(b, l.record_offset(id), 0xdead_beef);
        }
        put_u32(b, layout::OFF_NEXT_CLIENT_ID, u32::MAX);
    })
    .unwrap_err();
    assert!(
        matches!(e, RingError::NoFreeClientId { max_clients: 4, .. }),
        "{e}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random corruption of the header never panics attach (it fails or succeeds cleanly).
    #[test]
    fn ring_attach_never_panics_on_corrupt_header(
        edits in proptest::collection::vec((0usize..128, any::<u8>()), 1..6),
        cut in proptest::option::of(0u64..20_000),
    ) {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let tag = format!("fuzz{}", N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let r = attach_to_edited(&tag, cut, |b| {
            for (off, v) in edits {
                if off < b.len() {
                    b[off] = v;
                }
            }
        });
        if let Ok(c) = r {
            prop_assert!(c.client_id() < c.info().max_clients);
        }
    }
}

#[test]
fn ring_edited_file_offsets_checked_by_pwrite() {
    // Corrupting a live ring's header under a running server does not affect attached
    // clients, but new attaches validate what they read.
    let name = unique_name("pwrite");
    let mut server = RingServer::create(&name, &small_cfg()).unwrap();
    let mut c = RingClient::attach(&name).unwrap();
    let f = OpenOptions::new()
        .write(true)
        .open(shm_file(&name))
        .unwrap();
    f.write_all_at(
        &(layout::VERSION + 1).to_ne_bytes(),
        layout::OFF_VERSION as u64,
    )
    .unwrap();
    assert!(matches!(
        RingClient::attach(&name),
        Err(RingError::UnsupportedVersion { found, .. }) if found == layout::VERSION + 1
    ));
    roundtrip(&mut server, &mut c, b"unaffected");
}

#[test]
fn ring_concurrent_creators_exactly_one_wins() {
    for round in 0..20 {
        let name = unique_name(&format!("race{round}"));
        // Every other round, start from a stale file that all creators want to replace.
        let _cleanup = Cleanup(shm_file(&name));
        if round % 2 == 1 {
            let src = unique_name(&format!("race{round}-src"));
            let s = RingServer::create(&src, &small_cfg()).unwrap();
            std::fs::copy(shm_file(&src), shm_file(&name)).unwrap();
            drop(s);
        }
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (name, barrier) = (name.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    RingServer::create(&name, &small_cfg())
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let (ok, err): (Vec<_>, Vec<_>) = results.into_iter().partition(|r| r.is_ok());
        assert_eq!(ok.len(), 1, "round {round}: {err:?}");
        for e in err {
            assert!(matches!(e, Err(RingError::AlreadyExists { .. })), "{e:?}");
        }
        let mut server = ok.into_iter().next().unwrap().unwrap();
        let mut c = RingClient::attach(&name).unwrap();
        roundtrip(&mut server, &mut c, b"winner");
    }
    let leftovers: Vec<_> = std::fs::read_dir(SHM_DIR)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&format!("rt-{}-race", std::process::id())) && n.contains(".tmp."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A response slot whose `payload_len` exceeds the capacity (a corrupt writer of the shared
/// memory) is delivered as an empty message and counted, so the call fails instead of being
/// lost; the client keeps working.
#[test]
fn corrupt_response_length_is_delivered_empty_and_counted() {
    let name = unique_name("corrupt-resp");
    let cfg = small_cfg();
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut client = RingClient::attach(&name).unwrap();
    let slot = client.try_call(b"hello").unwrap();
    server.poll();
    let token = server.recv().unwrap().token;
    server.advance_tail();

    // Write the response slot by hand: valid = 1 with payload_len = cap + 1.
    let l = layout::Layout::new(layout::LayoutParams {
        max_clients: cfg.max_clients,
        ring_depth: cfg.ring_depth,
        resp_depth: cfg.resp_depth,
        req_payload_cap: cfg.req_payload_cap,
        resp_payload_cap: cfg.resp_payload_cap,
    })
    .unwrap();
    let off = l.resp_slot_offset(token.client_id, token.resp_slot_idx) as u64;
    let f = OpenOptions::new()
        .write(true)
        .open(shm_file(&name))
        .unwrap();
    f.write_all_at(
        &(cfg.resp_payload_cap + 1).to_ne_bytes(),
        off + layout::RESP_PAYLOAD_LEN as u64,
    )
    .unwrap();
    f.write_all_at(&[1], off + layout::RESP_VALID as u64)
        .unwrap();

    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.is_empty() {
        assert!(
            Instant::now() < deadline,
            "corrupt response never delivered"
        );
        client.poll(|s, bytes| got.push((s, bytes.len()))).unwrap();
    }
    assert_eq!(got, vec![(slot, 0)]);
    assert_eq!(client.corrupt_responses(), 1);
    assert_eq!(client.in_flight(), 0);
    // The client carries on with new calls.
    let slot2 = client.try_call(b"again").unwrap();
    let mut echoed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while echoed.is_empty() {
        assert!(Instant::now() < deadline, "no echo");
        serve_once(&mut server);
        client.poll(|s, b| echoed.push((s, b.to_vec()))).unwrap();
    }
    assert_eq!(echoed, vec![(slot2, b"again".to_vec())]);
}

// ---------------------------------------------------------------------------------------------
// Issue 12 §2: a corrupt or stuck ring fails loudly; bounded waits.
// ---------------------------------------------------------------------------------------------

fn layout_of(cfg: &RingConfig) -> layout::Layout {
    layout::Layout::new(layout::LayoutParams {
        max_clients: cfg.max_clients,
        ring_depth: cfg.ring_depth,
        resp_depth: cfg.resp_depth,
        req_payload_cap: cfg.req_payload_cap,
        resp_payload_cap: cfg.resp_payload_cap,
    })
    .unwrap()
}

/// Writes `v` at byte `off` of the ring file `/dev/shm/name` (a scribbler of shared memory).
fn poke_u64(name: &str, off: u64, v: u64) {
    let f = OpenOptions::new().write(true).open(shm_file(name)).unwrap();
    f.write_all_at(&v.to_ne_bytes(), off).unwrap();
}

fn peek_u64(name: &str, off: u64) -> u64 {
    let f = OpenOptions::new().read(true).open(shm_file(name)).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, off).unwrap();
    u64::from_ne_bytes(b)
}

/// Runs `f` on a thread and fails the test if it has not returned within `limit` (a hang on
/// the code before the fix becomes a failure, not a stuck test run).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not return within {limit:?}: hangs"))
}

/// The server finds `head` behind its cursor, marks the ring failed and counts it; every
/// client then fails at once — a call, a poll with a call outstanding — and a new client
/// cannot attach.
#[test]
fn corrupt_head_behind_tail_detected_by_server_fails_every_client() {
    let name = unique_name("head-behind");
    let cfg = small_cfg();
    let (mut server, mut a) = attached(&name, &cfg);
    let mut b = RingClient::attach(&name).unwrap();
    for i in 0..5u8 {
        roundtrip(&mut server, &mut a, &[i; 4]);
    }
    b.try_call(b"outstanding").unwrap();
    serve_once(&mut server); // answered, not yet polled by b
    b.try_call(b"outstanding 2").unwrap();
    // head = 0 although tail = cursor = 7. The server was busy (its last poll found an
    // entry), so it counts sequence words before reading `head`: the request committed at
    // the cursor is taken (its word shows it whole) and answered, and the next poll, finding
    // nothing committed, reads `head` and fails the ring.
    poke_u64(&name, layout::OFF_HEAD as u64, 0);
    assert_eq!(server.poll(), 1);
    assert_eq!(server.fault(), None);
    assert_eq!(echo_received(&mut server), 1);
    assert_eq!(server.poll(), 0);
    assert_eq!(server.fault(), Some(RingFault::HeadBehindTail));
    assert_eq!(server.stats().ring_faults, 1);
    assert!(server.recv().is_none());
    let corrupt = Err(RingCallError::RingCorrupt(RingFault::HeadBehindTail));
    let (a, b) = within(Duration::from_secs(5), move || {
        assert_eq!(a.try_call(b"after"), corrupt.map(|_: ()| 0));
        // b still gets the responses that arrived before, then the error.
        let mut got = Vec::new();
        while got.len() < 2 {
            assert!(b.poll(|_, r| got.push(r.to_vec())).is_ok());
        }
        assert_eq!(
            got,
            vec![b"outstanding".to_vec(), b"outstanding 2".to_vec()]
        );
        // Nothing in flight any more: b's next call fails.
        assert_eq!(b.try_call(b"after b"), corrupt.map(|_: ()| 0));
        assert!(b.poll(|_, _| panic!("no more responses")).is_err());
        (a, b)
    });
    assert_eq!(
        (a.fault(), b.fault()),
        (
            Some(RingFault::HeadBehindTail),
            Some(RingFault::HeadBehindTail)
        )
    );
    assert!(matches!(
        RingClient::attach(&name),
        Err(RingError::Failed {
            fault: RingFault::HeadBehindTail,
            ..
        })
    ));
    // The server stays failed.
    poke_u64(&name, layout::OFF_HEAD as u64, 7);
    assert_eq!(server.poll(), 0);
    assert_eq!(server.stats().ring_faults, 1);
}

/// A client finds `head` behind `tail` before the server does: it fails its call at once,
/// counts the fault and marks the ring failed; the server and the other clients follow.
#[test]
fn corrupt_head_behind_tail_detected_by_client() {
    let name = unique_name("head-behind-c");
    let cfg = small_cfg();
    let (mut server, mut a) = attached(&name, &cfg);
    let mut b = RingClient::attach(&name).unwrap();
    for i in 0..3u8 {
        roundtrip(&mut server, &mut a, &[i; 4]);
    }
    poke_u64(&name, layout::OFF_HEAD as u64, 1); // tail is 3
    let a = within(Duration::from_secs(5), move || {
        assert_eq!(
            a.try_call(b"x"),
            Err(RingCallError::RingCorrupt(RingFault::HeadBehindTail))
        );
        a
    });
    assert_eq!(a.ring_faults(), 1);
    assert_eq!(
        b.try_call(b"y"),
        Err(RingCallError::RingCorrupt(RingFault::HeadBehindTail))
    );
    assert_eq!(b.ring_faults(), 0, "b learnt it from the header");
    serve_once(&mut server);
    assert_eq!(server.fault(), Some(RingFault::HeadBehindTail));
}

/// `head` far ahead of `tail` (garbage) is detected by both sides; a `head` exactly
/// `ring_depth` ahead (a full ring) is not a fault: the call waits and times out.
#[test]
fn corrupt_head_too_far_ahead_is_detected() {
    let name = unique_name("head-ahead");
    let cfg = small_cfg();
    let (server, mut a) = serving(&name, &cfg);
    // Client side first: no server poll in between.
    poke_u64(&name, layout::OFF_HEAD as u64, 1 + (1 << 40));
    let a = within(Duration::from_secs(5), move || {
        assert_eq!(
            a.try_call(b"x"),
            Err(RingCallError::RingCorrupt(RingFault::HeadTooFarAhead))
        );
        a
    });
    assert_eq!(a.ring_faults(), 1);
    drop(a);
    drop(server);

    // Server side first, with the smallest impossible distance.
    let name = unique_name("head-ahead2");
    let (mut server, mut a) = serving(&name, &cfg);
    let max_ahead = u64::from(cfg.ring_depth) + 4 * u64::from(cfg.max_clients);
    // A full ring is legal: the client waits and times out.
    poke_u64(
        &name,
        layout::OFF_HEAD as u64,
        1 + u64::from(cfg.ring_depth),
    );
    let t = Instant::now();
    assert_eq!(
        a.try_call_with_deadline(t + Duration::from_millis(30), |_| 0),
        Err(RingCallError::Timeout)
    );
    assert!(t.elapsed() >= Duration::from_millis(30));
    assert_eq!(a.fault(), None);
    poke_u64(&name, layout::OFF_HEAD as u64, 1 + max_ahead);
    server.poll();
    assert_eq!(
        server.fault(),
        None,
        "head - tail == max_ahead is still possible"
    );
    poke_u64(&name, layout::OFF_HEAD as u64, 2 + max_ahead);
    assert_eq!(server.poll(), 0);
    assert_eq!(server.fault(), Some(RingFault::HeadTooFarAhead));
    assert_eq!(server.stats().ring_faults, 1);
    assert_eq!(
        a.try_call(b"x"),
        Err(RingCallError::RingCorrupt(RingFault::HeadTooFarAhead))
    );
}

/// `tail` is written only by the server: a changed `tail` is found by the server's slow check
/// (within a liveness interval while it polls), and a `tail` ahead of `head` by a client.
#[test]
fn corrupt_tail_is_detected() {
    let name = unique_name("tail");
    let cfg = small_cfg();
    let (mut server, mut a) = attached(&name, &cfg);
    for i in 0..3u8 {
        roundtrip(&mut server, &mut a, &[i; 2]);
    }
    a.try_call(b"pending").unwrap();
    // tail behind: every client would wait for room that never comes.
    poke_u64(&name, layout::OFF_TAIL as u64, 1);
    serve_until(&mut server, Duration::from_secs(5), |s| s.fault().is_some());
    assert_eq!(server.fault(), Some(RingFault::TailCorrupt));
    assert_eq!(server.stats().ring_faults, 1);
    let mut got = 0;
    // The pending call was answered before the check; then the poll reports the fault.
    while a.in_flight() > 0 {
        got += a.poll(|_, _| {}).unwrap();
    }
    assert_eq!(got, 1);
    assert_eq!(
        a.try_call(b"x"),
        Err(RingCallError::RingCorrupt(RingFault::TailCorrupt))
    );
    drop(a);
    drop(server);

    let name = unique_name("tail2");
    let (_server, mut a) = serving(&name, &cfg);
    poke_u64(&name, layout::OFF_TAIL as u64, 5); // head is 1
    let a = within(Duration::from_secs(5), move || {
        assert_eq!(
            a.try_call(b"x"),
            Err(RingCallError::RingCorrupt(RingFault::HeadBehindTail))
        );
        a
    });
    assert_eq!(a.ring_faults(), 1);
}

/// A slot sequence word no protocol step produces is found by the client that claims the
/// slot and by the server at a hole on it; both fail the ring.
#[test]
fn corrupt_slot_sequence_word_is_detected() {
    let name = unique_name("seq");
    let cfg = small_cfg();
    let l = layout_of(&cfg);
    let (server, mut a) = serving(&name, &cfg);
    // Slot of position 1: a word for position 2 (another slot).
    poke_u64(
        &name,
        l.seq_offset(1) as u64,
        layout::seq_word(2, layout::SEQ_FREE),
    );
    assert_eq!(
        a.try_call(b"x"),
        Err(RingCallError::RingCorrupt(RingFault::SlotSequence))
    );
    assert_eq!(a.ring_faults(), 1);
    drop(a);
    drop(server);

    let name = unique_name("seq2");
    let (mut server, mut a) = attached(&name, &cfg);
    let mut dead = RingClient::attach(&name).unwrap();
    roundtrip(&mut server, &mut a, b"ok");
    assert_eq!(dead.__reserve_without_commit().unwrap(), 1);
    dead.__crash();
    poke_u64(
        &name,
        l.seq_offset(1) as u64,
        layout::seq_word(1 + 3 * 8, layout::SEQ_COMMITTED),
    );
    serve_until(&mut server, Duration::from_secs(5), |s| s.fault().is_some());
    assert_eq!(server.fault(), Some(RingFault::SlotSequence));
    assert_eq!(server.stats().ring_faults, 1);
}

fn stall_cfg() -> RingConfig {
    RingConfig {
        max_clients: 4,
        ring_depth: 4,
        resp_depth: 4,
        hole_timeout: Duration::from_millis(20),
        stall_timeout: Duration::from_millis(100),
        ..small_cfg()
    }
}

/// A live client that reserved a position and stalls (here: forever) no longer blocks the
/// ring: after `stall_timeout` the server skips the position and counts it.
#[test]
fn stalled_live_client_does_not_block_the_ring() {
    let name = unique_name("stall-block");
    let cfg = stall_cfg();
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut stuck = RingClient::attach(&name).unwrap();
    let mut other = RingClient::attach(&name).unwrap();
    stuck.__reserve_without_commit().unwrap();
    let start = Instant::now();
    let idx = other.try_call(b"behind").unwrap();
    let mut got = None;
    while got.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "ring blocked by a stalled client: {:?}",
            server.stats()
        );
        serve_once(&mut server);
        other.poll(|i, r| got = Some((i, r.to_vec()))).unwrap();
    }
    let waited = start.elapsed();
    assert_eq!(got.unwrap(), (idx, b"behind".to_vec()));
    assert!(waited >= cfg.stall_timeout, "skipped after {waited:?}");
    let s = server.stats();
    assert_eq!((s.stalls_skipped, s.holes_skipped), (1, 0), "{s:?}");
    eprintln!(
        "stalled hole skipped after {waited:?} (stall_timeout {:?})",
        cfg.stall_timeout
    );
}

/// Calls `try_call(payload)` on `client` and waits for its response while another thread
/// serves the ring; checks the echo.
fn call_served_elsewhere(client: &mut RingClient, payload: &[u8]) {
    let idx = client.try_call(payload).expect("try_call");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = None;
    while got.is_none() {
        assert!(Instant::now() < deadline, "no response");
        client
            .poll(|i, r| got = Some((i, r.to_vec())))
            .expect("poll");
        std::thread::yield_now();
    }
    assert_eq!(got.unwrap(), (idx, payload.to_vec()));
}

/// Runs `f` while a scoped thread serves `server` (echo), then stops that thread. The loop is
/// the typed server's: `advance_tail` only after a poll that found entries.
fn with_server_thread<T>(server: &mut RingServer, f: impl FnOnce() -> T) -> T {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if server.poll() == 0 {
                    std::thread::yield_now();
                    continue;
                }
                echo_received(server);
                server.advance_tail();
            }
        });
        let out = f();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    })
}

/// A client stalled between its reservation and its slot check: the server skips its
/// position after `stall_timeout` and holds the slot for it; later laps of that slot are
/// passed at once and their writers reserve again (no call fails, nobody waits for the
/// stall); when the stalled client resumes, its refusal check fails the call with `Skipped`
/// before anything is committed, the slot is released, and both clients go on.
#[test]
fn stalled_client_late_call_is_refused_and_others_pass_its_slot() {
    let name = unique_name("stall-claim");
    let cfg = stall_cfg();
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut s = RingClient::attach(&name).unwrap();
    let mut o = RingClient::attach(&name).unwrap();
    let far = Instant::now() + Duration::from_secs(10);
    let p = s.__begin(far).unwrap();
    assert_eq!(p.pos(), 0);
    let idx = o.try_call(b"other").unwrap();
    serve_until(&mut server, Duration::from_secs(5), |sv| {
        sv.stats().stalls_skipped == 1
    });
    let mut got = Vec::new();
    while got.is_empty() {
        serve_once(&mut server);
        o.poll(|i, r| got.push((i, r.to_vec()))).unwrap();
    }
    assert_eq!(got, vec![(idx, b"other".to_vec())]);
    // Ten more calls wrap the 4-slot ring past the held slot 0 three times (positions 4, 8
    // and 12 are given up and reserved again), with no stall and no failed call.
    let t = Instant::now();
    with_server_thread(&mut server, || {
        for i in 0..10u8 {
            call_served_elsewhere(&mut o, &[i; 6]);
        }
    });
    assert!(t.elapsed() < cfg.stall_timeout, "{:?}", t.elapsed());
    assert_eq!(o.held_slot_retries(), 3);
    assert_eq!(server.stats().held_laps_skipped, 3, "{:?}", server.stats());
    // The stalled client resumes: its slot (still held for it) reads `FREE(0)`, it writes,
    // and its refusal check finds `tail > 0`: nothing committed.
    s.__claim(&p, far).unwrap();
    let r = s.__finish(p, |buf| {
        buf[..4].copy_from_slice(b"LATE");
        4
    });
    assert_eq!(r, Err(RingCallError::Skipped));
    assert_eq!((s.skipped_calls(), s.in_flight()), (1, 0));
    serve_until(&mut server, Duration::from_secs(5), |sv| {
        sv.stats().held_slots_released == 1
    });
    for i in 0..8u8 {
        roundtrip(&mut server, &mut s, &[i; 5]);
        roundtrip(&mut server, &mut o, &[i ^ 0xff; 7]);
    }
    let st = server.stats();
    assert_eq!((st.stalls_skipped, st.held_laps_skipped), (1, 3), "{st:?}");
    assert_eq!(
        st.received,
        1 + 10 + 16,
        "the late entry was never received: {st:?}"
    );
    assert_eq!(
        (st.late_commits_dropped, st.invalid_entries(), st.aborted),
        (0, 0, 0)
    );
    assert_eq!(o.held_slot_retries(), 3, "the released slot is used again");
}

/// A client stalled *inside* its payload write: the server skips its position after
/// `stall_timeout` but holds the slot for it; a later call on that slot passes it without
/// waiting for the stall; the late commit is refused, the slot released, and every request
/// and response stays intact.
#[test]
fn stalled_client_late_commit_is_refused_and_slot_released() {
    let name = unique_name("stall-commit");
    let cfg = stall_cfg();
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut s = RingClient::attach(&name).unwrap();
    let mut o = RingClient::attach(&name).unwrap();
    let far = Instant::now() + Duration::from_secs(10);
    let p = s.__begin(far).unwrap();
    assert_eq!(p.pos(), 0);
    s.__claim(&p, far).unwrap();
    let r = s.__finish(p, |buf| {
        buf[..4].copy_from_slice(b"LATE");
        // Stalled here, mid-write. The others go on: positions 1..3 are served.
        let slots: Vec<u32> = (1..4u8).map(|i| o.try_call(&[i; 3]).unwrap()).collect();
        serve_until(&mut server, Duration::from_secs(5), |sv| {
            sv.stats().stalls_skipped == 1
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            serve_once(&mut server);
            o.poll(|i, r| got.push((i, r.to_vec()))).unwrap();
        }
        got.sort();
        let mut want: Vec<_> = slots
            .iter()
            .zip(1..4u8)
            .map(|(&i, b)| (i, vec![b; 3]))
            .collect();
        want.sort();
        assert_eq!(got, want);
        // Position 4 is on the slot this client still holds: the server passes it at once and
        // the call goes on at position 5.
        let t = Instant::now();
        with_server_thread(&mut server, || call_served_elsewhere(&mut o, b"five"));
        assert!(t.elapsed() < cfg.stall_timeout, "{:?}", t.elapsed());
        assert_eq!(o.held_slot_retries(), 1);
        buf[4..8].copy_from_slice(b"DATA");
        8
    });
    assert_eq!(r, Err(RingCallError::Skipped));
    assert_eq!((s.skipped_calls(), s.in_flight()), (1, 0));
    serve_until(&mut server, Duration::from_secs(5), |sv| {
        sv.stats().held_slots_released == 1
    });
    // The slot was released: many wraps, both clients, every payload intact.
    for i in 0..20u8 {
        roundtrip(&mut server, &mut o, &[i; 9]);
        roundtrip(&mut server, &mut s, &[i ^ 0xff; 5]);
    }
    let st = server.stats();
    assert_eq!((st.stalls_skipped, st.held_laps_skipped), (1, 1), "{st:?}");
    assert_eq!(
        st.received,
        3 + 1 + 40,
        "the late entry was never received: {st:?}"
    );
    assert_eq!(
        (st.late_commits_dropped, st.invalid_entries(), st.aborted),
        (0, 0, 0)
    );
}

/// The narrow race the refusal check cannot close: the stall ends between the check and the
/// commit store, so an entry is committed after the server skipped its position. It is never
/// served; the server drops and counts it when it releases the slot, and the ring goes on.
#[test]
fn commit_after_skip_is_dropped_and_counted() {
    let name = unique_name("stall-late-commit");
    let cfg = stall_cfg();
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut s = RingClient::attach(&name).unwrap();
    let mut o = RingClient::attach(&name).unwrap();
    // `s` reserves position 0 and stalls; the server skips it and holds slot 0.
    let pos = s.__reserve_without_commit().unwrap();
    assert_eq!(pos, 0);
    roundtrip(&mut server, &mut o, b"1");
    assert_eq!(server.stats().stalls_skipped, 1);
    // Play the commit that passed its check before the skip: sequence word `COMMITTED(0)`,
    // then `reserving_pos = IDLE`, as the client's commit does.
    let l = layout_of(&cfg);
    poke_u64(
        &name,
        l.seq_offset(0) as u64,
        layout::seq_word(0, layout::SEQ_COMMITTED),
    );
    poke_u64(
        &name,
        (l.record_offset(s.client_id()) + layout::REC_RESERVING_POS) as u64,
        layout::POS_IDLE,
    );
    serve_until(&mut server, Duration::from_secs(5), |sv| {
        sv.stats().held_slots_released == 1
    });
    assert_eq!(server.stats().late_commits_dropped, 1);
    for i in 0..10u8 {
        roundtrip(&mut server, &mut o, &[i; 4]);
    }
    let st = server.stats();
    assert_eq!(st.received, 11, "the late entry was not served: {st:?}");
    assert_eq!(st.invalid_entries(), 0);
}

/// A client that dies while holding a slot whose position the server skipped: the server
/// takes the slot back (it would otherwise cost every later lap of that slot a stall).
#[test]
fn holder_dying_after_skip_releases_its_slot() {
    let name = unique_name("stall-die");
    let cfg = stall_cfg();
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut s = RingClient::attach(&name).unwrap();
    let mut o = RingClient::attach(&name).unwrap();
    let far = Instant::now() + Duration::from_secs(10);
    let p = s.__begin(far).unwrap();
    s.__claim(&p, far).unwrap();
    roundtrip(&mut server, &mut o, b"1"); // served once position 0 is skipped
    assert_eq!(server.stats().stalls_skipped, 1);
    s.__crash();
    // Positions 2, 3 are served; 4 is on the dead client's slot: the call waits (this test
    // serves in the same thread, so it times out and retries) until the server takes the
    // slot back.
    o.set_send_timeout(Duration::from_millis(10));
    let start = Instant::now();
    let mut timeouts = 0;
    let mut done = 0u8;
    while done < 12 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            server.stats()
        );
        match o.try_call(&[done; 3]) {
            Ok(_) => {
                let mut got = None;
                while got.is_none() {
                    serve_once(&mut server);
                    o.poll(|_, r| got = Some(r.to_vec())).unwrap();
                }
                assert_eq!(got.unwrap(), vec![done; 3]);
                done += 1;
            }
            Err(RingCallError::Timeout) => {
                timeouts += 1;
                serve_once(&mut server);
            }
            Err(e) => panic!("{e}"),
        }
    }
    let st = server.stats();
    assert_eq!(st.held_slots_released, 1, "{st:?}");
    assert!(timeouts >= 1);
    // Every later lap of the slot works without a stall: 12 calls wrap the 4-slot ring 3 times.
    assert_eq!(st.stalls_skipped, 1, "later laps did not stall: {st:?}");
    eprintln!(
        "slot taken back after {:?}, {timeouts} timed-out attempts",
        start.elapsed()
    );
}

/// The deadline bounds the wait for room: with the server not consuming, a call on a full
/// ring returns `Timeout` at its deadline. Its position is abandoned, never written; the
/// client reserves nothing more until the server has passed it; the server skips it as a hole
/// without an owner (after `hole_timeout`, not `stall_timeout`), and the ring works on.
#[test]
fn full_ring_call_times_out_and_its_position_is_skipped() {
    let name = unique_name("full-timeout");
    let cfg = RingConfig {
        resp_depth: 8,
        stall_timeout: Duration::from_secs(30),
        ..stall_cfg()
    };
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut c = RingClient::attach(&name).unwrap();
    for i in 0..4u8 {
        c.try_call(&[i]).unwrap(); // positions 0..3: the ring is full
    }
    let t = Instant::now();
    let d = Duration::from_millis(50);
    assert_eq!(
        c.try_call_with_deadline(t + d, |b| {
            b[0] = 0xEE;
            1
        }),
        Err(RingCallError::Timeout)
    );
    let took = t.elapsed();
    assert!(took >= d && took < d + Duration::from_secs(1), "{took:?}");
    assert_eq!(
        peek_u64(&name, layout::OFF_HEAD as u64),
        5,
        "position 4 abandoned"
    );
    // The send timeout bounds try_call too; nothing new is reserved while position 4 is
    // ahead of the server.
    c.set_send_timeout(Duration::from_millis(20));
    assert_eq!(c.try_call(b"x"), Err(RingCallError::Timeout));
    assert_eq!(peek_u64(&name, layout::OFF_HEAD as u64), 5);
    assert_eq!(c.timed_out_calls(), 2);
    let mut n = 0;
    while n < 4 {
        serve_once(&mut server);
        n += c.poll(|i, r| assert_eq!(r, &[i as u8])).unwrap();
    }
    let start = Instant::now();
    serve_until(&mut server, Duration::from_secs(5), |s| {
        s.stats().holes_skipped == 1
    });
    let idx = c.try_call(b"again").unwrap();
    let mut got = None;
    while got.is_none() {
        serve_once(&mut server);
        c.poll(|i, r| got = Some((i, r.to_vec()))).unwrap();
    }
    assert_eq!(got.unwrap(), (idx, b"again".to_vec()));
    assert!(start.elapsed() < Duration::from_secs(5));
    let s = server.stats();
    assert_eq!(
        (s.holes_skipped, s.stalls_skipped, s.received),
        (1, 0, 5),
        "{s:?}"
    );
    assert_eq!(
        s.invalid_entries() + s.aborted,
        0,
        "the abandoned slot was never written"
    );
}

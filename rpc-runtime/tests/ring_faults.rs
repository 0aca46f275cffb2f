//! In-process fault tests of the delegation ring: invalid entries written straight into shared
//! memory, garbage ring files, stale and bad reply tokens, clients that die between reserving
//! and committing, aborted calls, clean server shutdown, name and configuration validation.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rpc_runtime::delegation::layout::{self, MAGIC};
use rpc_runtime::delegation::{
    CallError, ReplyError, ReplyToken, RingClient, RingConfig, RingError, RingServer, SHM_DIR,
};

fn unique_name(tag: &str) -> String {
    format!("rt-{}-{tag}", std::process::id())
}

fn shm_file(name: &str) -> PathBuf {
    PathBuf::from(SHM_DIR).join(name)
}

/// Removes a file on drop (for files no server owns).
struct Cleanup(PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

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
    let mut n = 0;
    while let Some(e) = server.recv() {
        let token = e.token;
        let payload = e.payload.to_vec();
        server.reply(token, &payload).expect("reply");
        n += 1;
    }
    server.advance_tail();
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
        client_id: cfg.max_clients,
        generation: 0,
        resp_slot_idx: 0,
    };
    assert_eq!(server.reply(bad, b"x"), Err(ReplyError::BadToken));
    let bad = ReplyToken {
        client_id: c.client_id(),
        generation: c.generation(),
        resp_slot_idx: cfg.resp_depth,
    };
    assert_eq!(server.reply(bad, b"x"), Err(ReplyError::BadToken));
    // A token never issued (nothing pending on that slot) is stale.
    let never = ReplyToken {
        client_id: c.client_id(),
        generation: c.generation(),
        resp_slot_idx: 0,
    };
    assert_eq!(server.reply(never, b"x"), Err(ReplyError::StaleToken));

    let idx = c.try_call(b"hello").unwrap();
    assert_eq!(server.poll(), 1);
    let token = server.recv().unwrap().token;
    assert_eq!(token.resp_slot_idx, idx);
    assert_eq!(token.generation, c.generation());
    // Too large: nothing written, token still good.
    let big = vec![0u8; cfg.resp_payload_cap as usize + 1];
    assert!(matches!(
        server.reply(token, &big),
        Err(ReplyError::PayloadTooLarge { len: 33, cap: 32 })
    ));
    assert!(matches!(
        server.reply_with(token, |_| 33),
        Err(ReplyError::PayloadTooLarge { len: 33, cap: 32 })
    ));
    server
        .reply_with(token, |buf| {
            assert_eq!(buf.len(), 32);
            buf[..2].copy_from_slice(b"ok");
            2
        })
        .unwrap();
    // Answering twice is refused.
    assert_eq!(server.reply(token, b"again"), Err(ReplyError::StaleToken));

    // SlotBusy: a forged request on the same (still unread) response slot.
    attacker.__raw_commit(c.client_id(), idx, 1, b"f").unwrap();
    server.poll();
    let forged = server.recv().unwrap().token;
    assert_eq!(server.reply(forged, b"forged"), Err(ReplyError::SlotBusy));
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
    assert_eq!(server.reply(token, b"late"), Err(ReplyError::StaleToken));
    serve_until(&mut server, Duration::from_secs(10), |s| {
        s.stats().clients_reclaimed == 1
    });
    let c2 = RingClient::attach(&name).unwrap();
    assert_eq!(c2.client_id(), id);
    assert_eq!(c2.generation(), generation.wrapping_add(1));
    // The old token must not reach the new owner of the id.
    assert_eq!(server.reply(token, b"late"), Err(ReplyError::StaleToken));
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
    let cfg = small_cfg();
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut stuck = RingClient::attach(&name).unwrap();
    let mut other = RingClient::attach(&name).unwrap();
    stuck.__reserve_without_commit().unwrap();
    let idx = other.try_call(b"behind").unwrap();
    // The owner is alive: the server must wait, however long.
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
        Err(CallError::PayloadTooLarge { len: 33, cap: 32 })
    );
    // Too large from the writer: the slot is committed as aborted.
    assert_eq!(
        c.try_call_with(|buf| buf.len() + 1),
        Err(CallError::PayloadTooLarge { len: 33, cap: 32 })
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
    assert_eq!(c.try_call(b"x"), Err(CallError::WouldBlock));
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
    assert_eq!(c.poll(|_, _| panic!()), Err(CallError::ServerDisconnected));
    assert_eq!(c.try_call(b"x"), Err(CallError::ServerDisconnected));
    assert_eq!(c.check_server(), Err(CallError::ServerDisconnected));
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
    std::fs::write(shm_file(&dst), &bytes).unwrap();
    lock_header_and_attach(&dst)
}

/// Takes a server-style OFD lock on the header of `/dev/shm/name` and attaches.
fn lock_header_and_attach(name: &str) -> Result<RingClient, RingError> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(shm_file(name))
        .unwrap();
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
    let e = attach_to_edited("version", None, |b| put_u32(b, layout::OFF_VERSION, 2)).unwrap_err();
    assert!(
        matches!(
            e,
            RingError::UnsupportedVersion {
                found: 2,
                expected: 1,
                ..
            }
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
    f.write_all_at(&2u32.to_ne_bytes(), layout::OFF_VERSION as u64)
        .unwrap();
    assert!(matches!(
        RingClient::attach(&name),
        Err(RingError::UnsupportedVersion { found: 2, .. })
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

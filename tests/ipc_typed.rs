//! Generated stubs and server traits end to end over the ipc transport (per-client SPSC rings
//! in /dev/shm), mirroring `delegation_typed.rs`, plus the kv daemon shape of seeds/004 §6/§7
//! and a server process stopped with SIGSTOP and then killed.

mod typed_common;

use typed_common::scenarios::{self, Fixture};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use idl::echo::{EchoClient, EchoService};
use idl::kv::{KvClient, KvResponse, KvService};
use rpc::ipc::{Ipc, IpcConfig, IpcServer};
use rpc::wire::{MsgHeader, Status};
use rpc::{RpcError, Server};
use typed_common::Store;

fn name(tag: &str) -> String {
    format!("rpc-ipc-{}-{tag}", std::process::id())
}

fn spawn_kv(name: &str, cfg: IpcConfig) -> rpc::ServerHandle<KvService, IpcServer> {
    typed_common::spawn_kv(IpcServer::serve::<KvService>(name, cfg).unwrap())
}

/// Ipc servers named after the test (`tag`), numbered, with one configuration.
struct Fx {
    tag: &'static str,
    made: u32,
    cfg: IpcConfig,
}

fn fx(tag: &'static str, cfg: IpcConfig) -> Fx {
    Fx { tag, made: 0, cfg }
}

impl Fixture for Fx {
    type Client = Ipc;
    type Server = IpcServer;
    type Addr = String;
    fn server<S: rpc::Service>(&mut self) -> (rpc::Server<S, IpcServer>, String) {
        self.made += 1;
        let n = name(&format!("{}-{}", self.tag, self.made));
        (IpcServer::serve::<S>(&n, self.cfg).unwrap(), n)
    }
}

#[test]
fn blocking_calls() {
    scenarios::blocking_calls(&mut fx("blocking", IpcConfig::default()));
}

#[test]
fn pipelined_calls_complete_with_their_tags() {
    let cfg = IpcConfig {
        depth: 8,
        ..IpcConfig::default()
    };
    let depth = scenarios::pipelined_calls_complete_with_their_tags(&mut fx("pipelined", cfg));
    assert_eq!(depth, 8, "max_in_flight is the configured depth");
}

#[test]
fn deferred_replies_out_of_order() {
    let n = name("deferred");
    let mut server = IpcServer::serve::<KvService>(&n, IpcConfig::default()).unwrap();
    let mut kv = KvClient::<Ipc>::connect(&n).unwrap();
    let taken = scenarios::take_deferred_gets(&mut kv, &mut server, 8, false);
    assert_eq!(
        taken.iter().map(|t| t.1).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    for &(token, key) in taken.iter().rev() {
        server
            .reply(token, &KvResponse::Get(Some(key * 10)))
            .unwrap();
    }
    // A second reply to an answered call is refused and counted, never delivered.
    assert!(server.reply(taken[0].0, &KvResponse::Get(Some(1))).is_err());
    assert_eq!(server.stats().dropped_replies, 1);
    let mut got = Vec::new();
    scenarios::await_deferred_replies(&mut kv, &mut got, 8, || {});
    got.sort();
    assert_eq!(got, (0..8).collect::<Vec<_>>());
}

/// Writes one raw request message through a freshly attached ipc client and returns the
/// response ([`scenarios::raw_roundtrip`]).
fn raw_roundtrip(name: &str, server: &mut Server<KvService, IpcServer>, msg: &[u8]) -> Vec<u8> {
    scenarios::raw_roundtrip(&mut Ipc::attach(name).unwrap(), server, msg)
}

fn header(msg: &[u8]) -> MsgHeader {
    rpc::wire::read_header(msg).unwrap()
}

fn raw_reply(server: &mut Server<KvService, IpcServer>, token: rpc::ipc::IpcToken, b: &[u8]) {
    server
        .transport_mut()
        .reply_with(token, |buf| {
            buf[..b.len()].copy_from_slice(b);
            b.len()
        })
        .unwrap();
}

#[test]
fn undecodable_requests_get_error_status() {
    let n = name("badreq");
    let mut server = IpcServer::serve::<KvService>(&n, IpcConfig::default()).unwrap();
    let hdr = |method_id: u16, len: u32| {
        let mut v = Vec::new();
        v.extend_from_slice(&method_id.to_ne_bytes());
        v.extend_from_slice(&0u16.to_ne_bytes());
        v.extend_from_slice(&len.to_ne_bytes());
        v
    };
    let r = raw_roundtrip(&n, &mut server, &hdr(77, 0));
    assert_eq!(header(&r).status, Status::UnknownMethod as u16);
    assert_eq!(header(&r).method_id, 77);
    let mut m = hdr(KvService::GET, 4);
    m.extend_from_slice(&[0; 4]);
    assert_eq!(
        header(&raw_roundtrip(&n, &mut server, &m)).status,
        Status::BadLength as u16
    );
    let m = hdr(KvService::GET, 12);
    assert_eq!(
        header(&raw_roundtrip(&n, &mut server, &m)).status,
        Status::Truncated as u16
    );
    assert_eq!(
        header(&raw_roundtrip(&n, &mut server, &[1, 0, 0])).status,
        Status::Truncated as u16
    );
    let mut m = hdr(KvService::GET, 12);
    m[2..4].copy_from_slice(&7u16.to_ne_bytes());
    m.extend_from_slice(&[0; 12]);
    assert_eq!(
        header(&raw_roundtrip(&n, &mut server, &m)).status,
        Status::BadArguments as u16
    );
    assert_eq!(server.stats().bad_requests, 5);
    assert_eq!(server.stats().requests, 0);

    // Through the typed client, an error status surfaces as RpcError::BadRequest.
    let mut kv = KvClient::<Ipc>::connect(&n).unwrap();
    kv.issue(5).get(0, 1).unwrap();
    let mut got = None;
    while got.is_none() {
        server.poll();
        if let Some((token, _req)) = server.recv() {
            let mut b = Vec::new();
            b.extend_from_slice(&KvService::GET.to_ne_bytes());
            b.extend_from_slice(&(Status::BadArguments as u16).to_ne_bytes());
            b.extend_from_slice(&0u32.to_ne_bytes());
            raw_reply(&mut server, token, &b);
            server.flush();
        }
        match kv.poll() {
            Ok(None) => {}
            other => got = Some(other),
        }
    }
    match got.unwrap() {
        Err(RpcError::BadRequest {
            tag: 5,
            method: "get",
            status: Some(Status::BadArguments),
        }) => {}
        other => panic!("expected BadRequest, got {other:?}"),
    }
}

#[test]
fn bad_response_bytes_are_an_error_not_ub() {
    let n = name("badresp");
    let mut server = IpcServer::serve::<KvService>(&n, IpcConfig::default()).unwrap();
    let mut kv = KvClient::<Ipc>::connect(&n).unwrap();
    kv.issue(9).get(0, 1).unwrap();
    let mut got = None;
    while got.is_none() {
        server.poll();
        if let Some((token, _)) = server.recv() {
            // A "successful" response whose Option tag byte is 2: invalid.
            let mut b = Vec::new();
            b.extend_from_slice(&KvService::GET.to_ne_bytes());
            b.extend_from_slice(&0u16.to_ne_bytes());
            b.extend_from_slice(&9u32.to_ne_bytes());
            b.push(2);
            b.extend_from_slice(&[0; 8]);
            raw_reply(&mut server, token, &b);
            server.flush();
        }
        match kv.poll() {
            Ok(None) => {}
            other => got = Some(other),
        }
    }
    assert!(matches!(
        got.unwrap(),
        Err(RpcError::BadResponse {
            tag: 9,
            method: "get",
            error: rpc::wire::WireError::BadValue { .. }
        })
    ));
}

#[test]
fn schema_mismatch_fails_at_attach() {
    scenarios::schema_mismatch_fails_at_connect(&mut fx("schema", IpcConfig::default()), |_, _| {});
}

#[test]
fn server_shutdown_fails_blocking_and_pending_calls() {
    let n = name("shutdown");
    let h = spawn_kv(&n, IpcConfig::default());
    let mut kv = KvClient::<Ipc>::connect(&n).unwrap();
    kv.put(0, 1, 1).unwrap();
    drop(h.join().unwrap());
    let t0 = Instant::now();
    let r = kv.get(0, 1);
    assert!(matches!(r, Err(RpcError::ServerDisconnected)), "{r:?}");
    assert!(matches!(
        kv.issue(1).get(0, 1),
        Err(RpcError::ServerDisconnected)
    ));
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn server_gone_while_calls_pending() {
    let n = name("gone-pending");
    let server = IpcServer::serve::<KvService>(&n, IpcConfig::default()).unwrap();
    let mut kv = KvClient::<Ipc>::connect(&n).unwrap();
    kv.issue(1).get(0, 1).unwrap();
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match kv.poll() {
            Ok(None) => assert!(Instant::now() < deadline, "pending call never failed"),
            Err(RpcError::ServerDisconnected) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn eight_clients_20k_calls_each_all_matched() {
    const CLIENTS: u64 = 8;
    const CALLS: u64 = 20_000;
    let n = name("8x20k");
    let cfg = IpcConfig {
        depth: 16,
        ..IpcConfig::default()
    };
    let mut server = IpcServer::serve::<EchoService>(&n, cfg).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let server_thread = thread::spawn(move || {
        let backoff = Backoff::new();
        let mut handled = 0u64;
        while !st.load(Ordering::Relaxed) {
            let k = server.serve_once(|req| EchoService::dispatch(&mut idl::echo::Echoer, req));
            handled += k as u64;
            if k == 0 {
                backoff.snooze();
            } else {
                backoff.reset();
            }
        }
        handled
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let n = n.clone();
            thread::spawn(move || {
                let mut echo = EchoClient::<Ipc>::connect(&n).unwrap();
                // This test checks matching, not latency: on a loaded 2-core machine nine
                // spinning threads can leave a call unanswered for over a second.
                echo.set_default_deadline(Duration::from_secs(60));
                let depth = echo.max_in_flight();
                let mut seen = vec![false; CALLS as usize];
                let (mut next, mut done) = (0u64, 0u64);
                while done < CALLS {
                    while next < CALLS && echo.in_flight() < depth {
                        echo.issue(next).ping((c << 32) | next).unwrap();
                        next += 1;
                    }
                    done += echo
                        .poll_with(|tag, r| {
                            let idl::echo::EchoResponse::Ping(v) = r.unwrap() else {
                                panic!("wrong variant")
                            };
                            assert_eq!(v, (c << 32) | tag, "response matched to the wrong request");
                            assert!(
                                !std::mem::replace(&mut seen[tag as usize], true),
                                "duplicate response"
                            );
                        })
                        .unwrap() as u64;
                }
                assert!(seen.iter().all(|&s| s), "lost response");
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert_eq!(server_thread.join().unwrap(), CLIENTS * CALLS);
}

/// Seeds/004 §6/§7: K daemons each own a shard and hold a `Server<KvService, IpcServer>`;
/// every client thread holds one `KvClient<Ipc>` per daemon, routes by `key % K` and runs a
/// closed loop of `issue(tag)` + `poll()` over all of them.
#[test]
fn daemons_and_clients_in_the_kv_shape() {
    const DAEMONS: usize = 2;
    const CLIENTS: u64 = 3;
    const OPS: u64 = 4000;
    let names: Vec<String> = (0..DAEMONS).map(|d| name(&format!("daemon{d}"))).collect();
    let cfg = IpcConfig {
        max_clients: 4,
        depth: 4,
        ..IpcConfig::default()
    };
    let daemons: Vec<_> = names.iter().map(|n| spawn_kv(n, cfg)).collect();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let names = names.clone();
            thread::spawn(move || {
                let mut kvs: Vec<KvClient<Ipc>> = names
                    .iter()
                    .map(|n| {
                        let mut kv = KvClient::<Ipc>::connect(n).unwrap();
                        kv.set_default_deadline(Duration::from_secs(60));
                        kv
                    })
                    .collect();
                // Keys of this client: c * 1_000_000 + i; first put all, then get all.
                let key = |i: u64| c * 1_000_000 + i;
                for phase in 0..2 {
                    let (mut next, mut done) = (0u64, 0u64);
                    while done < OPS {
                        while next < OPS {
                            let k = key(next);
                            let kv = &mut kvs[(k % DAEMONS as u64) as usize];
                            let r = if phase == 0 {
                                kv.issue(next).put(0, k, k * 7)
                            } else {
                                kv.issue(next).get(0, k)
                            };
                            match r {
                                Ok(()) => next += 1,
                                Err(RpcError::WouldBlock) => break,
                                Err(e) => panic!("{e}"),
                            }
                        }
                        for kv in kvs.iter_mut() {
                            while let Some((tag, resp)) = kv.poll().unwrap() {
                                let want = if phase == 0 {
                                    KvResponse::Put(())
                                } else {
                                    KvResponse::Get(Some(key(tag) * 7))
                                };
                                assert_eq!(resp, want);
                                done += 1;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let mut total = 0;
    for h in daemons {
        let s = h.join().unwrap();
        assert!(s.stats().requests > 0, "every daemon served its shard");
        total += s.stats().requests;
    }
    assert_eq!(total, 2 * CLIENTS * OPS);
}

#[test]
fn late_replies_are_dropped_and_a_stopped_server_fails_calls_by_deadline() {
    let n = name("late");
    let cfg = IpcConfig {
        depth: 2,
        ..IpcConfig::default()
    };
    let server = IpcServer::serve::<KvService>(&n, cfg).unwrap();
    let late = typed_common::spawn_late(server);
    let mut kv = KvClient::<Ipc>::connect(&n).unwrap();
    let took = typed_common::late_and_stopped_server(&mut kv, &late);
    eprintln!("ipc: call to a stopped server failed after {took:?} (deadline 100 ms)");
    late.stop.store(true, Ordering::Relaxed);
    late.handle.join().unwrap();
}

const ROLE: &str = "IPC_TYPED_ROLE";

/// A server process stopped with SIGSTOP: a blocking call ends by its deadline; after
/// SIGCONT calls work again; after SIGKILL a call ends with `ServerDisconnected`.
#[test]
fn stopped_then_killed_server_process() {
    if let Ok(n) = std::env::var(ROLE) {
        // Exit when the parent closes our stdin (or dies), so a failing test leaves no
        // server process behind.
        thread::spawn(|| {
            let _ = std::io::Read::read(&mut std::io::stdin(), &mut [0u8]);
            std::process::exit(0);
        });
        let mut server = IpcServer::serve::<KvService>(&n, IpcConfig::default()).unwrap();
        println!("IPC-TYPED-READY");
        let mut store = Store::default();
        loop {
            if server.serve_once(|req| KvService::dispatch(&mut store, req)) == 0 {
                thread::yield_now();
            }
        }
    }
    use std::io::BufRead;
    let n = name("sigstop");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "stopped_then_killed_server_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, &n)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("IPC-TYPED-READY") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child failed");
    }
    let _stdin = child.stdin.take();
    let pid = child.id();
    let mut kv = KvClient::<Ipc>::connect(&n).unwrap();
    kv.put(0, 1, 11).unwrap();
    signal(pid, "STOP");
    // Signal delivery is asynchronous: wait until the kernel reports it stopped.
    let t0 = Instant::now();
    while !stopped(pid) {
        assert!(t0.elapsed() < Duration::from_secs(5), "child not stopped");
        thread::sleep(Duration::from_millis(1));
    }
    let deadline = Duration::from_millis(100);
    kv.set_default_deadline(deadline);
    let t0 = Instant::now();
    let e = kv.get(0, 1).unwrap_err();
    let took = t0.elapsed();
    assert!(
        matches!(e, RpcError::DeadlineExceeded { method: "get", timeout, .. } if timeout == deadline),
        "{e}"
    );
    assert!(
        took >= deadline && took < Duration::from_secs(5),
        "{took:?}"
    );
    eprintln!("ipc: call to a SIGSTOPped server process failed after {took:?} (deadline 100 ms)");
    signal(pid, "CONT");
    kv.set_default_deadline(Duration::from_secs(5));
    assert_eq!(kv.get(0, 1).unwrap(), Some(11));
    child.kill().unwrap();
    child.wait().unwrap();
    let t0 = Instant::now();
    let r = kv.get(0, 1);
    assert!(matches!(r, Err(RpcError::ServerDisconnected)), "{r:?}");
    eprintln!(
        "ipc: call to a killed server process failed after {:?}",
        t0.elapsed()
    );
    let _ = std::fs::remove_file(format!("/dev/shm/{n}"));
}

/// Sends `SIG<sig>` with the `kill` command.
fn signal(pid: u32, sig: &str) {
    let st = std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill -{sig} {pid}");
}

/// Whether process `pid` is stopped (state `T` in `/proc/<pid>/stat`).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
        .unwrap_or(false)
}

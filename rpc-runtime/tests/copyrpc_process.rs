//! copyrpc between two processes on the cross-process device model
//! ([`mlx5::sim::Fabric::join`]): a client (this test's process) and an echo server (this test
//! binary re-executed with `COPYRPC_PROC_ROLE=server`) exchange their endpoint information
//! over the server's stdin/stdout, as a bootstrap would, and make 2000 verified calls. Then the
//! server is killed (`SIGKILL`): the client's outstanding and later calls must fail with an
//! endpoint failure (retry exceeded), never hang.
//!
//! This file holds one `#[test]` on purpose: a process joins one node for its lifetime, so
//! no other test may share the test binary's process.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mlx5::sim::{Fabric, SimConfig};
use rpc_runtime::copyrpc::{
    CallError, CallErrorKind, Context, ContextConfig, EndpointConfig, EndpointFailure, EndpointInfo,
};

const ROLE: &str = "COPYRPC_PROC_ROLE";
const NODE: &str = "COPYRPC_PROC_NODE";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// The echo server: runs until killed (or 60 s, a watchdog for a lost parent).
fn server() {
    let f = Fabric::join(&std::env::var(NODE).unwrap(), SimConfig::default()).unwrap();
    let dev = f.open();
    let mut ctx: Context<()> = Context::new(&dev, ContextConfig::default()).unwrap();
    let ep = ctx.create_endpoint(&EndpointConfig::default()).unwrap();
    println!("INFO {}", hex(&ctx.local_info(ep).unwrap().to_bytes()));
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let peer = EndpointInfo::from_bytes(&unhex(line.trim())).unwrap();
    ctx.connect(ep, &peer).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        ctx.poll(|_, _| {});
        while let Some((h, req)) = ctx.recv() {
            let echo = req.to_vec();
            ctx.reply(h, &echo).unwrap();
        }
    }
}

fn expect(out: &mut impl BufRead, tag: &str) -> String {
    loop {
        let mut s = String::new();
        assert!(
            out.read_line(&mut s).unwrap() > 0,
            "server exited before {tag}"
        );
        if let Some(i) = s.find(tag) {
            return s[i + tag.len()..].trim().to_string();
        }
    }
}

#[test]
fn calls_across_processes_then_the_server_dies() {
    if std::env::var(ROLE).as_deref() == Ok("server") {
        return server();
    }
    let node = format!("copyrpc-test-{}", std::process::id());
    let f = Fabric::join(&node, SimConfig::default()).unwrap();
    let dev = f.open();
    let mut ctx: Context<u64> = Context::new(&dev, ContextConfig::default()).unwrap();
    let ep = ctx.create_endpoint(&EndpointConfig::default()).unwrap();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "calls_across_processes_then_the_server_dies"])
        .args(["--nocapture", "--test-threads=1"])
        .env(ROLE, "server")
        .env(NODE, &node)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut inp = child.stdin.take().unwrap();
    let info = EndpointInfo::from_bytes(&unhex(&expect(&mut out, "INFO "))).unwrap();
    ctx.connect(ep, &info).unwrap();
    writeln!(inp, "{}", hex(&ctx.local_info(ep).unwrap().to_bytes())).unwrap();
    inp.flush().unwrap();
    expect(&mut out, "READY");

    // 2000 echo calls, 8 in flight, every payload checked.
    let payload = |i: u64| -> Vec<u8> {
        (0..(i % 200) as usize + 8)
            .map(|k| (i as usize + k) as u8)
            .collect()
    };
    let (mut sent, mut done) = (0u64, 0u64);
    let t = Instant::now();
    while done < 2000 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "stalled at {done} calls"
        );
        while sent < 2000 && sent - done < 8 {
            match ctx.call(ep, &payload(sent), sent, 256) {
                Ok(_) => sent += 1,
                Err(CallError {
                    kind: CallErrorKind::InsufficientCredit | CallErrorKind::RingFull,
                    ..
                }) => break,
                Err(e) => panic!("call: {e:?}"),
            }
        }
        ctx.poll(|i, r| {
            let r = r.expect("no failure while the server lives");
            assert_eq!(r, &payload(i)[..], "echo of call {i}");
            done += 1;
        });
    }
    assert!(f.stats().wqes.rdma_write_imm > 0);

    // The server dies. Calls already out and calls made later fail; nothing hangs.
    child.kill().unwrap();
    child.wait().unwrap();
    let mut failures = 0;
    let mut failure: Option<EndpointFailure> = None;
    let t = Instant::now();
    let mut i = 1_000_000u64;
    while failure.is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the server's death was never reported"
        );
        match ctx.call(ep, b"anyone there?", i, 64) {
            Ok(_)
            | Err(CallError {
                kind: CallErrorKind::InsufficientCredit | CallErrorKind::RingFull,
                ..
            }) => {}
            Err(CallError {
                kind: CallErrorKind::Failed | CallErrorKind::NotConnected,
                ..
            }) => break,
            Err(e) => panic!("call: {e:?}"),
        }
        i += 1;
        ctx.poll(|_, r| {
            if let Err(e) = r {
                failures += 1;
                failure.get_or_insert(e);
            }
        });
        std::thread::sleep(Duration::from_micros(200));
    }
    if let Some(e) = &failure {
        assert!(
            matches!(e, EndpointFailure::Completion(_)),
            "retry exceeded, not {e:?}"
        );
    }
    assert!(f.stats().peer_deaths >= 1);
    eprintln!(
        "server death: {failures} calls failed after {:?}: {failure:?}",
        t.elapsed()
    );
    for e in std::fs::read_dir("/dev/shm").unwrap().flatten() {
        if e.file_name()
            .to_string_lossy()
            .starts_with(&format!("mlx5sim.{node}."))
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

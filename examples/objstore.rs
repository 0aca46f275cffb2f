//! A small object store: `put(&mut self, key: &str, value: &[u8])`, `get(&self, key: &str) ->
//! Option<&[u8]>` and friends over the default transport (the delegation ring in shared
//! memory), with variable-length keys and values and no copy the hardware does not need.
//!
//! ```sh
//! cargo run --release --example objstore                    # 2000 objects of 0..16 KiB
//! cargo run --release --example objstore -- --objects 10000 --max-size 65536
//! ```
//!
//! What each call copies:
//! - `put`: the client stub writes key and value straight into the ring slot (the one copy
//!   into shared memory); the server copies the request once out of shared memory (so a
//!   client cannot change it while the handler reads it) and hands the handler `&str`/`&[u8]`
//!   borrowed from that copy; storing it is the store's own copy.
//! - `get`: the handler returns `Option<&[u8]>` borrowed from the store; `dispatch_raw`
//!   writes it straight into the client's response slot; `get_with` lends it to a closure
//!   from that slot (no copy), `get` copies it into a `Vec`.
//!
//! The run stores `--objects` objects with sizes drawn uniformly from `0..=--max-size`
//! (blocking and pipelined puts), reads every one back and compares every byte, lists a
//! prefix, deletes half, checks what is left, and prints a JSON summary. Exits 1 on any
//! mismatch.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::Parser;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rpc::delegation::{Delegation, DelegationConfig, DelegationServer};
use rpc::{RpcError, rpc_service};
use serde::Serialize;

/// Largest value the service carries: 64 KiB of key and value bytes per message.
const MAX_VAR: usize = 65536;

#[rpc_service(
    transport = "delegation",
    derive(Debug, PartialEq),
    max_var_bytes = 65536
)]
pub trait ObjectStore {
    /// Stores `value` under `key`; returns the length of the value it replaced, if any.
    fn put(&mut self, key: &str, value: &[u8]) -> Option<u64>;
    /// The value stored under `key`, borrowed from the store.
    fn get(&self, key: &str) -> Option<&[u8]>;
    /// Removes `key`; returns whether it was there.
    fn delete(&mut self, key: &str) -> bool;
    /// Up to `limit` keys starting with `prefix`, sorted, one per line.
    fn list(&self, prefix: &str, limit: u32) -> String;
}

/// The server's state.
#[derive(Default)]
struct Store {
    objects: HashMap<String, Vec<u8>>,
}

impl ObjectStoreServer for Store {
    fn put(&mut self, key: &str, value: &[u8]) -> Option<u64> {
        self.objects
            .insert(key.to_owned(), value.to_vec())
            .map(|old| old.len() as u64)
    }
    fn get(&self, key: &str) -> Option<&[u8]> {
        self.objects.get(key).map(Vec::as_slice)
    }
    fn delete(&mut self, key: &str) -> bool {
        self.objects.remove(key).is_some()
    }
    fn list(&self, prefix: &str, limit: u32) -> String {
        let mut keys: Vec<&str> = self
            .objects
            .keys()
            .map(String::as_str)
            .filter(|k| k.starts_with(prefix))
            .collect();
        keys.sort_unstable();
        keys.truncate(limit as usize);
        keys.join("\n")
    }
}

#[derive(Parser)]
#[command(about = "A small object store over the delegation ring: variable-length keys and values")]
struct Args {
    /// Objects to store.
    #[arg(long, default_value_t = 2000)]
    objects: usize,
    /// Largest value in bytes (sizes are uniform in 0..=max); at most 65536 minus the key.
    #[arg(long, default_value_t = 16384)]
    max_size: usize,
    /// Seed of the size and content generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Serialize)]
struct Summary {
    objects: usize,
    bytes_stored: usize,
    put_mops: f64,
    get_mops: f64,
    get_gbit_per_s: f64,
    server_requests: u64,
    server_bad_requests: u64,
}

fn key(i: usize) -> String {
    format!("bucket-{}/object-{i}", i % 7)
}

/// Object `i`'s content: `len` bytes derived from `i`, so a reader checks every byte.
fn value(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (i.wrapping_mul(131) ^ j.wrapping_mul(7)) as u8)
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    let room = MAX_VAR - key(args.objects).len();
    if args.max_size > room {
        return Err(format!("--max-size is at most {room} (64 KiB minus the key)").into());
    }
    let name = format!("objstore-{}", std::process::id());
    let server = DelegationServer::serve::<ObjectStoreService>(&name, DelegationConfig::default())?;
    let mut store = Store::default();
    // The zero-copy serve loop: arguments borrowed from the request, results written into
    // the client's response slot.
    let handle =
        server.spawn_raw(move |msg, out| ObjectStoreService::dispatch_raw(&mut store, msg, out));
    let mut client = ObjectStoreClient::<Delegation>::connect(&name)?;
    client.set_default_deadline(Duration::from_secs(10));

    let mut rng = StdRng::seed_from_u64(args.seed);
    let sizes: Vec<usize> = (0..args.objects)
        .map(|_| rng.random_range(0..=args.max_size))
        .collect();

    // Puts: the first half blocking, the second half pipelined (up to max_in_flight).
    let t = Instant::now();
    let half = args.objects / 2;
    for (i, &len) in sizes.iter().enumerate().take(half) {
        let old = client.put(&key(i), &value(i, len))?;
        if old.is_some() {
            return Err(format!("object {i} existed before its put").into());
        }
    }
    let mut next = half;
    let mut done = half;
    while done < args.objects {
        while next < args.objects {
            match client
                .issue(next as u64)
                .put(&key(next), &value(next, sizes[next]))
            {
                Ok(()) => next += 1,
                Err(RpcError::WouldBlock) => break,
                Err(e) => return Err(e.into()),
            }
        }
        if let Some((tag, resp)) = client.poll()? {
            if resp != ObjectStoreResponse::Put(None) {
                return Err(format!("pipelined put {tag}: {resp:?}").into());
            }
            done += 1;
        }
    }
    let put_secs = t.elapsed().as_secs_f64();

    // Gets: every byte compared in place, in the response slot.
    let t = Instant::now();
    let mut bytes = 0;
    for (i, &len) in sizes.iter().enumerate() {
        let want = value(i, len);
        let same = client.get_with(&key(i), |v| v == Some(&want[..]))?;
        if !same {
            return Err(format!("object {i}: content differs").into());
        }
        bytes += len;
    }
    let get_secs = t.elapsed().as_secs_f64();
    // The copying form agrees.
    if client.get(&key(0))? != Some(value(0, sizes[0])) {
        return Err("get and get_with disagree".into());
    }

    // List one bucket, delete half of everything, check what is left.
    let listed = client.list("bucket-3/", u32::MAX)?;
    let want = (0..args.objects).filter(|i| i % 7 == 3).count();
    if listed.lines().count() != want {
        return Err(format!("list: {} keys, expected {want}", listed.lines().count()).into());
    }
    for i in (0..args.objects).step_by(2) {
        if !client.delete(&key(i))? {
            return Err(format!("delete {i}: not found").into());
        }
    }
    for i in 0..args.objects {
        let present = client.get_with(&key(i), |v| v.is_some())?;
        if present != (i % 2 == 1) {
            return Err(
                format!("object {i}: present = {present} after deleting the even ones").into(),
            );
        }
    }
    // A value over the service's limit is refused before anything is sent.
    match client.put("too-big", &vec![0; MAX_VAR]) {
        Err(RpcError::MessageTooLarge { .. }) => {}
        other => return Err(format!("oversized put: {other:?}").into()),
    }
    drop(client);
    let server = handle.join()?;
    let summary = Summary {
        objects: args.objects,
        bytes_stored: sizes.iter().sum(),
        put_mops: args.objects as f64 / put_secs / 1e6,
        get_mops: args.objects as f64 / get_secs / 1e6,
        get_gbit_per_s: bytes as f64 * 8.0 / get_secs / 1e9,
        server_requests: server.stats().requests,
        server_bad_requests: server.stats().bad_requests,
    };
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}

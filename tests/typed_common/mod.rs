//! Helpers shared by the typed end-to-end tests of the network transports
//! (`copyrpc_typed.rs`, `scalerpc_typed.rs`, `erpc_typed.rs`): an in-memory KV handler, a
//! server thread that serves until told to stop, and reading a wire header.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use crossbeam_utils::Backoff;
use idl::kv::{KvServer, KvService};
use rpc::wire::MsgHeader;
use rpc::{Server, ServerTransport, Service};

/// The KV handler: a hash map of the keys put (ranks ignored).
#[derive(Default)]
pub struct Store(pub HashMap<u64, u64>);

impl KvServer for Store {
    fn put(&mut self, _rank: u32, key: u64, value: u64) {
        self.0.insert(key, value);
    }
    fn get(&mut self, _rank: u32, key: u64) -> Option<u64> {
        self.0.get(&key).copied()
    }
}

/// Runs `server` on a thread with `handler` until the returned flag is set; the thread
/// returns the server.
pub fn spawn<S: Service, T: ServerTransport + Send + 'static>(
    mut server: Server<S, T>,
    mut handler: impl FnMut(S::Request) -> S::Response + Send + 'static,
) -> (Arc<AtomicBool>, thread::JoinHandle<Server<S, T>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let h = thread::spawn(move || {
        let backoff = Backoff::new();
        while !st.load(Ordering::Relaxed) {
            if server.serve_once(&mut handler) == 0 {
                backoff.snooze();
            } else {
                backoff.reset();
            }
        }
        server
    });
    (stop, h)
}

/// [`spawn`] with a fresh [`Store`] as the KV handler.
pub fn spawn_kv<T: ServerTransport + Send + 'static>(
    server: Server<KvService, T>,
) -> (Arc<AtomicBool>, thread::JoinHandle<Server<KvService, T>>) {
    let mut store = Store::default();
    spawn(server, move |req| KvService::dispatch(&mut store, req))
}

/// The wire header of a raw response message.
pub fn header(msg: &[u8]) -> MsgHeader {
    rpc::wire::read_header(msg).unwrap()
}

//! One daemon's shard (`Shard`, served through the generated `KvServer` trait) and where
//! a request is served: its `rank` field and the owner daemon `key % daemons` there
//! (seeds/004 §7, §8).

use idl::kv::{KvRequest, KvServer, owner_daemon};
use rpc::delegation::Target;
use rustc_hash::FxHashMap;

/// One shard: the daemon's store, served through the generated `KvServer` trait.
#[derive(Default)]
pub(crate) struct Shard {
    pub(crate) map: FxHashMap<u64, u64>,
}

impl KvServer for Shard {
    fn put(&mut self, _rank: u32, key: u64, value: u64) {
        self.map.insert(key, value);
    }
    fn get(&mut self, _rank: u32, key: u64) -> Option<u64> {
        self.map.get(&key).copied()
    }
}

/// Where a KV request is served: its `rank` field, and the daemon `key % daemons` there
/// (seeds/004 §7, §8).
pub(crate) fn kv_route(daemons: usize) -> impl FnMut(&KvRequest) -> Target + Send + 'static {
    move |req: &KvRequest| {
        let (rank, key) = match req {
            KvRequest::Get(a) => (a.rank(), a.key()),
            KvRequest::Put(a) => (a.rank(), a.key()),
        };
        Target {
            rank,
            daemon: owner_daemon(key, daemons) as u32,
        }
    }
}

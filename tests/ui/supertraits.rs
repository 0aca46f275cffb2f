use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Kv: Send + Sync {
    fn get(&self, key: u64) -> u64;
}

fn main() {}

use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Kv {
    fn get(&self, key: u64) -> u64 {
        key
    }
}

fn main() {}

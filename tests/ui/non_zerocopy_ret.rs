use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Kv {
    fn get(&self, key: u64) -> Vec<u8>;
}

fn main() {}

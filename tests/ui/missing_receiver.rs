use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Kv {
    fn get(key: u64) -> u64;
}

fn main() {}

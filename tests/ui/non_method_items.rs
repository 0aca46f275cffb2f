use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Kv {
    type Key;
    const MAX: usize;
    methods!();
    fn get(&self, key: u64) -> u64;
}

fn main() {}

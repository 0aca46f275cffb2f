use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub unsafe trait Kv {
    fn get(&self, key: u64) -> u64;
}

fn main() {}

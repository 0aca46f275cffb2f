use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub struct Kv {
    pub key: u64,
}

fn main() {}

use rpc::rpc_service;

#[rpc_service(transport = "erpc")]
pub trait B {
    fn get(&self, key: u64) -> u64;
}

fn main() {}

use rpc::rpc_service;

#[rpc_service]
pub trait A {
    fn get(&self, key: u64) -> u64;
}

#[rpc_service(derive(Debug))]
pub trait B {
    fn get(&self, key: u64) -> u64;
}

fn main() {}

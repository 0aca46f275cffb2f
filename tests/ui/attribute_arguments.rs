use rpc::rpc_service;

#[rpc_service(transport = "delegation", colour = "blue")]
pub trait A {
    fn get(&self, key: u64) -> u64;
}

#[rpc_service(transport = delegation)]
pub trait B {
    fn get(&self, key: u64) -> u64;
}

#[rpc_service(transport = "delegation", transport = "delegation", derive(Debug, Clone))]
pub trait C {
    fn get(&self, key: u64) -> u64;
}

fn main() {}

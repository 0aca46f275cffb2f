use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Kv {
    #[cfg(feature = "stats")]
    fn stats(&self) -> u64;
    fn get(&self, key: u64) -> u64;
}

fn main() {}

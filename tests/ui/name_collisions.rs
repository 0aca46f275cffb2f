use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Kv {
    fn get_value(&self, key: u64) -> u64;
    #[allow(non_snake_case)]
    fn getValue(&self, key: u64) -> u64;
    fn put(&mut self, key: u64, key: u64);
    fn get(&self);
    fn get(&self, key: u64);
}

fn main() {}

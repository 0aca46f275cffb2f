use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Kv {
    fn get<T>(&self, key: T) -> u64;
    fn scan<'a>(&'a self, from: u64) -> u64;
    fn put(&mut self, key: u64)
    where
        Self: Sized;
}

fn main() {}

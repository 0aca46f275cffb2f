use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Kv<'a, T, const N: usize>
where
    T: Copy,
{
    fn get(&self, key: u64) -> u64;
}

fn main() {}

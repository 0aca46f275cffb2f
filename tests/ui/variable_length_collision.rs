use rpc::rpc_service;

// A variable-length result gets a lending stub `<name>_with` on the client.
#[rpc_service(transport = "delegation")]
pub trait Blobs {
    fn get(&self, key: &str) -> Vec<u8>;
    fn get_with(&self, key: u64) -> u64;
}

fn main() {}

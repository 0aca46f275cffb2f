use rpc::rpc_service;

// Each use of a variable-length standard type gets exactly one error, on the type, saying
// what to write instead.
#[rpc_service(transport = "delegation")]
pub trait Files {
    fn open(&mut self, path: std::string::String, mode: u32) -> Option<String>;
    fn write(&mut self, fd: u32, data: Vec<u8>, words: alloc::vec::Vec<u64>);
    fn name(&self, fd: u32) -> [Vec<u8>; 2];
    fn fine(&self, fd: u32, data: [u8; 32]) -> u64;
}

fn main() {}

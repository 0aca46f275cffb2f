use rpc::rpc_service;

// Variable-length values are whole arguments (`&str`, `&[T]`, `Option` of one) or whole
// return types (also `String`, `Vec<T>`). Each other use gets exactly one error, on the type,
// saying what to write instead.
#[rpc_service(transport = "delegation")]
pub trait Files {
    fn open(&mut self, path: std::string::String, mode: u32) -> Option<String>;
    fn write(&mut self, fd: u32, data: Vec<u8>, words: alloc::vec::Vec<u64>);
    fn name(&self, fd: u32) -> [Vec<u8>; 2];
    fn patch(&mut self, data: &mut [u8]) -> Result<Vec<u8>, u32>;
    fn tags(&self, t: &[Option<u8>]) -> Vec<bool>;
    fn fine(&self, fd: u32, data: [u8; 32]) -> u64;
}

fn main() {}

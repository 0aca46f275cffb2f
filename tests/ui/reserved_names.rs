use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Kv {
    fn connect(&self);
    fn from_transport(&self);
    fn issue(&self);
    fn issue_request(&self);
    fn poll(&self);
    fn poll_with(&self);
    fn in_flight(&self);
    fn max_in_flight(&self);
    fn transport(&self);
    fn transport_mut(&self);
    fn with_deadline(&self);
    fn set_default_deadline(&self);
    fn default_deadline(&self);
    fn stats(&self);
    fn zombies(&self);
    fn descriptor(&self);
    fn __rpc_get(&self, __rpc_key: u64);
}

#[rpc_service(transport = "delegation")]
pub trait __RpcInternal {}

fn main() {}

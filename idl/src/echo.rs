//! Ping-pong service with fixed-size payloads, for latency/throughput measurements.

use rpc::rpc_service;

/// Echo RPCs: each returns its argument.
#[rpc_service(transport = "delegation", derive(Debug, PartialEq, Eq))]
pub trait Echo {
    /// Returns `seq` (8 B request body, 8 B response body).
    fn ping(&self, seq: u64) -> u64;
    /// Returns `payload` (32 B request and response bodies).
    fn echo32(&self, payload: [u8; 32]) -> [u8; 32];
    /// Returns `payload` (256 B request and response bodies).
    fn echo256(&self, payload: [u8; 256]) -> [u8; 256];
}

/// The obvious server: returns every argument unchanged.
#[derive(Clone, Copy, Debug, Default)]
pub struct Echoer;

impl EchoServer for Echoer {
    fn ping(&self, seq: u64) -> u64 {
        seq
    }
    fn echo32(&self, payload: [u8; 32]) -> [u8; 32] {
        payload
    }
    fn echo256(&self, payload: [u8; 256]) -> [u8; 256] {
        payload
    }
}

//! Every supported kind of argument and return type, both receivers, no-argument methods.

use rpc::rpc_service;
use zerocopy::{FromZeros, Immutable, IntoBytes, KnownLayout, TryFromBytes};

#[derive(Clone, Copy, Debug, PartialEq, FromZeros, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Point {
    pub x: i32,
    pub y: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, TryFromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(u8)]
pub enum Color {
    Red = 1,
    Green = 2,
}

pub const N: usize = 3;

/// All the types.
#[rpc_service(transport = "delegation", derive(Debug))]
pub trait All {
    /// Integers.
    fn ints(&mut self, a: u8, b: i16, c: u32, d: i64, e: u128, f: usize, g: isize) -> i128;
    fn floats(&self, a: f32, b: f64) -> f64;
    fn bool_char(&self, b: bool, c: char) -> char;
    fn arrays(&mut self, a: [u8; 32], b: [[u16; 2]; N]) -> [u8; 4];
    fn unit(&mut self, u: ()) -> ();
    fn nothing(&self);
    fn user(&mut self, p: Point, c: Color) -> Color;
    fn options(
        &mut self,
        a: Option<u64>,
        b: Option<Point>,
        c: std::option::Option<bool>,
    ) -> core::option::Option<char>;
    fn results(
        &mut self,
        r: Result<u32, Point>,
        s: ::std::result::Result<(), i8>,
    ) -> core::result::Result<(), u16>;
    fn nested(
        &mut self,
        n: Option<[Option<u8>; 2]>,
        m: [Option<Result<bool, char>>; 2],
    ) -> Option<Option<u8>>;
}

/// A private service with a zero-sized argument list.
#[rpc_service(transport = "delegation")]
trait Ping {
    fn ping(&self);
}

struct S;
impl PingServer for S {
    fn ping(&self) {}
}

fn main() {
    let _ = PingService::dispatch(&mut S, PingRequest::ping());
    assert_eq!(size_of::<PingPingArgs>(), 0);
    assert_eq!(size_of::<AllOptionsArgs>(), 9 + 9 + 2);
}

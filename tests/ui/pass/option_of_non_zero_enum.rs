//! `Option`/`Result` of an enum without a zero variant (not `FromZeros`) are accepted, nested
//! too, and round-trip through the generated codec.
use rpc::{Service, rpc_service};
use zerocopy::{Immutable, IntoBytes, KnownLayout, TryFromBytes};

/// Every value is valid except all-zero bytes.
#[derive(Clone, Copy, Debug, PartialEq, TryFromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(u8)]
pub enum Color {
    Red = 1,
    Green = 2,
}

#[rpc_service(transport = "delegation", derive(Debug, PartialEq))]
pub trait Paint {
    fn paint(&mut self, color: Color) -> Color;
    fn last(&self) -> Option<Color>;
    fn mix(&mut self, a: Result<Color, Color>) -> Result<Color, Color>;
    fn nested(
        &mut self,
        a: Option<Option<Color>>,
        b: Result<Option<Color>, Color>,
        c: [Option<Color>; 3],
        d: Option<[Color; 2]>,
    ) -> Option<Result<Color, [Color; 2]>>;
}

fn main() {
    let req = PaintRequest::nested(
        Some(None),
        Err(Color::Red),
        [None, Some(Color::Green), None],
        Some([Color::Red, Color::Green]),
    );
    let mut buf = [0u8; 64];
    let n = PaintService::encode_request(&req, &mut buf);
    assert_eq!(PaintService::decode_request(&buf[..n]).unwrap(), req);
    let resp = PaintResponse::Nested(Some(Err([Color::Green, Color::Red])));
    let n = PaintService::encode_response(&resp, &mut buf);
    assert_eq!(PaintService::decode_response(PaintService::NESTED, &buf[..n]).unwrap(), resp);
}

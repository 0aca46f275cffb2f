//! What a service looks like to the runtime: the [`Service`] trait that `#[rpc_service]`
//! implements for `<Trait>Service`, and the [`ServiceDescriptor`] with its schema fingerprint.

use crate::wire::WireError;

/// One argument of a method, as written in the trait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgDescriptor {
    /// Argument name. Not part of the [`fingerprint`]: arguments travel by position, so
    /// renaming one keeps the wire format.
    pub name: &'static str,
    /// Type as written in the trait (token text, whitespace-normalised by the macro).
    pub ty: &'static str,
    /// `size_of` the argument's wire (lowered) type, in bytes.
    pub size: usize,
}

/// One method of a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MethodDescriptor {
    /// Method id: index in the trait, in declaration order; carried in
    /// [`crate::wire::MsgHeader::method_id`].
    pub id: u16,
    /// Method name.
    pub name: &'static str,
    /// Arguments after the receiver, in order.
    pub args: &'static [ArgDescriptor],
    /// Return type as written (`()` when omitted).
    pub ret_ty: &'static str,
    /// `size_of` the return type's wire (lowered) form, in bytes.
    pub ret_size: usize,
    /// Largest request message: header + argument struct, in bytes; for a method with
    /// variable-length arguments ([`crate::varlen`]), header + fixed part + the service's
    /// `max_var_bytes`.
    pub request_bytes: usize,
    /// Largest successful response message: header + lowered return value, in bytes; for a
    /// variable-length result, header + one [`crate::varlen::WireSlice`] + `max_var_bytes`.
    pub response_bytes: usize,
    /// The request has variable-length arguments, so its length varies up to
    /// `request_bytes` ([`crate::varlen`]).
    pub var_request: bool,
    /// The result is of variable length, up to `response_bytes`.
    pub var_response: bool,
    /// Largest `align_of` of the elements of the method's variable-length values (`&[T]`,
    /// `Vec<T>`; 1 for bytes and strings, and for fixed-size methods). Above 1, a message whose
    /// buffer is not 8-byte aligned is copied to an aligned one before it is decoded
    /// ([`crate::varlen::realign`]); bytes and strings are always read in place.
    pub var_align: usize,
}

/// Static description of a service: its methods and a fingerprint of its schema.
///
/// Transports check the fingerprint when a client attaches or connects, so that two builds
/// with different interfaces fail at attach time ([`crate::RpcError::SchemaMismatch`])
/// instead of misreading each other's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceDescriptor {
    /// The trait's name.
    pub name: &'static str,
    /// Methods in declaration order (`methods[i].id == i`).
    pub methods: &'static [MethodDescriptor],
    /// Largest request message of any method, in bytes (at least the header).
    pub max_request_bytes: usize,
    /// Largest response message of any method, in bytes (at least the header, which is all an
    /// error response carries).
    pub max_response_bytes: usize,
    /// Some method has a variable-length argument or result ([`crate::varlen`]): its messages
    /// vary in length, so the generated request/response enums own their data and are not
    /// `Copy`.
    pub variable: bool,
    /// Some method's [`MethodDescriptor::var_align`] is above 1: messages of such methods are
    /// realigned when their buffer is not 8-byte aligned.
    pub realign: bool,
    /// FNV-1a 64 over the service name and, per method, its id, name, argument type names
    /// and wire sizes (in order), return type name and wire size; not argument names. See
    /// [`fingerprint`] for which schema changes keep it.
    pub fingerprint: u64,
}

impl ServiceDescriptor {
    /// Builds a descriptor, computing the maxima and the fingerprint (usable in `const`).
    pub const fn new(name: &'static str, methods: &'static [MethodDescriptor]) -> Self {
        let mut max_request_bytes = crate::wire::HEADER_BYTES;
        let mut max_response_bytes = crate::wire::HEADER_BYTES;
        let mut variable = false;
        let mut realign = false;
        let mut i = 0;
        while i < methods.len() {
            variable |= methods[i].var_request || methods[i].var_response;
            realign |= methods[i].var_align > 1;
            if methods[i].request_bytes > max_request_bytes {
                max_request_bytes = methods[i].request_bytes;
            }
            if methods[i].response_bytes > max_response_bytes {
                max_response_bytes = methods[i].response_bytes;
            }
            i += 1;
        }
        ServiceDescriptor {
            name,
            methods,
            max_request_bytes,
            max_response_bytes,
            variable,
            realign,
            fingerprint: fingerprint(name, methods),
        }
    }

    /// The method with id `id`, if any.
    pub fn method(&self, id: u16) -> Option<&'static MethodDescriptor> {
        self.methods.get(id as usize)
    }

    /// Largest reply to a request of method `id`, in bytes: the method's `response_bytes`, or
    /// [`crate::wire::HEADER_BYTES`] (an error status) for an id no method has. What a server
    /// transport that reserves reply space ([`crate::ServerTransport::reply`]) is told when
    /// the exact length is not known before encoding.
    #[inline]
    pub fn max_reply_bytes(&self, id: u16) -> usize {
        self.method(id)
            .map_or(crate::wire::HEADER_BYTES, |m| m.response_bytes)
            .max(crate::wire::HEADER_BYTES)
    }

    /// Whether a message of method `id` must be copied to an 8-byte aligned buffer when its
    /// own buffer is not aligned: some variable-length value of the method has elements
    /// aligned above 1 ([`MethodDescriptor::var_align`]). Constant `false` for services
    /// without such methods.
    #[inline(always)]
    pub fn needs_realign(&self, id: u16) -> bool {
        self.realign && self.method(id).is_some_and(|m| m.var_align > 1)
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

const fn fnv_bytes(mut h: u64, b: &[u8]) -> u64 {
    let mut i = 0;
    while i < b.len() {
        h ^= b[i] as u64;
        h = h.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    h
}

/// Hashes a string with its length prefixed, so that field boundaries are unambiguous.
const fn fnv_str(h: u64, s: &str) -> u64 {
    let h = fnv_u64(h, s.len() as u64);
    fnv_bytes(h, s.as_bytes())
}

const fn fnv_u64(h: u64, v: u64) -> u64 {
    fnv_bytes(h, &v.to_le_bytes())
}

/// The schema fingerprint: FNV-1a 64 over the service name, the number of methods and, per
/// method in id order, its id, name, number of arguments, each argument's type name and wire
/// size in order, and the return type name and wire size (strings length-prefixed, integers
/// little-endian u64).
///
/// It covers what the bytes depend on, plus the names that say what a method id *means*:
///
/// - **Compatible** (fingerprint unchanged): renaming an argument (arguments travel by
///   position in a `#[repr(C, packed)]` struct, so `get(key: u64)` and `get(k: u64)` send
///   the same bytes); docs and attributes; `&self` vs `&mut self`; spacing in types;
///   writing `-> ()` or leaving it out.
/// - **Incompatible** (fingerprint changes, connect refused with a schema mismatch):
///   changing an argument's or the return type, by name or by size (a type written
///   differently, such as an alias, counts as a change, since the macro sees only the
///   text); adding, removing or reordering arguments or methods (method ids are positions);
///   renaming a method or the service.
///
/// Method and service names stay in on purpose although the bytes do not depend on them: a
/// method id is only a position, and the name is what binds it to a meaning. Without it,
/// swapping two methods of the same signature (`incr`/`decr`) or connecting to another
/// service of the same shape would be accepted and run the wrong code, which is what the
/// check exists to prevent; a method rename is rare and easy to roll out with both ends.
/// For the same reason nothing can catch swapping two arguments of the same type: that is
/// the one rename-like change the fingerprint does not see.
pub const fn fingerprint(name: &str, methods: &[MethodDescriptor]) -> u64 {
    let mut h = fnv_str(FNV_OFFSET, name);
    h = fnv_u64(h, methods.len() as u64);
    let mut i = 0;
    while i < methods.len() {
        let m = &methods[i];
        h = fnv_u64(h, m.id as u64);
        h = fnv_str(h, m.name);
        h = fnv_u64(h, m.args.len() as u64);
        let mut j = 0;
        while j < m.args.len() {
            // Not the argument's name: the wire format does not depend on it.
            h = fnv_str(h, m.args[j].ty);
            h = fnv_u64(h, m.args[j].size as u64);
            j += 1;
        }
        h = fnv_str(h, m.ret_ty);
        h = fnv_u64(h, m.ret_size as u64);
        i += 1;
    }
    h
}

/// A service: implemented by `#[rpc_service]` for the generated `<Trait>Service` marker type.
///
/// Requests and responses are enums with one variant per method (`Copy` when every method
/// has fixed-size arguments and result). Encoding writes [`crate::wire::MsgHeader`] plus the
/// variant's zerocopy body (and, for variable-length methods, the data area of
/// [`crate::varlen`]); decoding is a validated cast.
pub trait Service: 'static {
    /// `<Trait>Request`: one variant per method, holding that method's arguments (the wire
    /// struct of a fixed-size method; owned `Vec`/`String` values for variable-length ones).
    type Request: Send + 'static;
    /// `<Trait>Response`: one variant per method, holding its return value (owned for a
    /// variable-length result).
    type Response: Send + 'static;
    /// The service's descriptor.
    const DESCRIPTOR: &'static ServiceDescriptor;

    /// Encodes `req` into `out` (at least [`Service::request_len`] long); returns the
    /// message length in bytes.
    fn encode_request(req: &Self::Request, out: &mut [u8]) -> usize;

    /// The length [`Service::encode_request`] writes for `req`, in bytes: the method's fixed
    /// `request_bytes`, or less for a variable-length request (more if the request exceeds
    /// the service's `max_var_bytes`: callers check it before encoding).
    fn request_len(req: &Self::Request) -> usize;

    /// The length [`Service::encode_response`] writes for `resp`, in bytes (see
    /// [`Service::request_len`]).
    fn response_len(resp: &Self::Response) -> usize;

    /// Decodes a request message.
    ///
    /// # Errors
    /// [`WireError::UnknownMethod`], [`WireError::Truncated`], [`WireError::BadLength`],
    /// [`WireError::BadValue`].
    fn decode_request(msg: &[u8]) -> Result<Self::Request, WireError>;

    /// Encodes a successful response into `out` (at least [`Service::response_len`] long);
    /// returns the message length in bytes.
    fn encode_response(resp: &Self::Response, out: &mut [u8]) -> usize;

    /// Decodes the response to a call of method `method_id`.
    ///
    /// # Errors
    /// [`WireError::Rejected`] if the server answered with an error status, and the errors of
    /// [`crate::wire::decode_response`].
    fn decode_response(method_id: u16, msg: &[u8]) -> Result<Self::Response, WireError>;

    /// The method id of a request.
    fn request_method_id(req: &Self::Request) -> u16;
}

//! Ring configuration ([`RingConfig`], chosen by the server) and the parameters a client reads
//! back from the header ([`RingInfo`]).

use std::time::Duration;

use super::layout::LayoutParams;

/// Parameters of a ring, chosen by the server at [`RingServer::create`](super::RingServer::create).
///
/// `max_clients`, `ring_depth` and `resp_depth` are the seed's header fields (seeds/004 §2.1
/// Header); the payload capacities replace the seed's `size_of::<Req>()` / `size_of::<Resp>()`
/// (this ring carries bytes); the rest are extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Number of client ids, 1..=65536 (each id owns `resp_depth` response slots and one
    /// client record). Source: seeds/004 §2.1 Header `max_clients`.
    pub max_clients: u32,
    /// Number of request slots, a power of two (1..=2^30). Source: seeds/004 §2.1 Header.
    pub ring_depth: u32,
    /// Response slots per client — the most calls one client can have outstanding — a power of
    /// two (1..=65536). Source: seeds/004 §2.1 Header.
    pub resp_depth: u32,
    /// Largest request payload, bytes (0..=16 MiB). The request slot is
    /// `align_up(16 + req_payload_cap, 64)` bytes. Source: seeds/004 §2.1 Request Ring Slot.
    pub req_payload_cap: u32,
    /// Largest response payload, bytes (0..=16 MiB). The response slot is
    /// `align_up(8 + resp_payload_cap, 64)` bytes. Source: seeds/004 §2.1 Response Slot.
    pub resp_payload_cap: u32,
    /// Schema fingerprint stored in the header for clients to check (extension, seed: padding).
    /// The ring itself does not interpret it.
    pub fingerprint: u64,
    /// How long the server waits at a hole (a reserved but uncommitted position) before checking
    /// whether the reserving client died. Default 50 ms. Extension (the seed waits forever).
    pub hole_timeout: Duration,
    /// How long the server waits at a hole whose reserving client is *alive* (it stalled
    /// between `fetch_add` and its commit: descheduled, stopped, paging) before skipping it
    /// anyway; the stalled client's late commit is then refused with
    /// [`RingCallError::Skipped`](super::RingCallError::Skipped). Must be non-zero and at most 60 s.
    ///
    /// Default 200 ms: well above a scheduler time slice and the short stalls of a busy
    /// machine (skipping a merely descheduled client costs that client one retried call), and
    /// well below the 1 s default call deadline, so one stalled client delays the others by at
    /// most a fifth of their deadline. Extension (the seed waits forever).
    pub stall_timeout: Duration,
    /// How often the slow liveness checks run: the server's scan for dead or detached clients,
    /// and (stored in the header) the clients' check for a dead server. Default 10 ms; must be
    /// non-zero and at most 60 s. Extension.
    pub liveness_interval: Duration,
}

impl Default for RingConfig {
    /// `max_clients` 64, `ring_depth` 1024 (seeds/004 §9), `resp_depth` 32
    /// ([`crate::client::DEFAULT_CALLS_IN_FLIGHT`]), payload
    /// capacities 64 bytes, fingerprint 0, `hole_timeout` 50 ms, `stall_timeout` 200 ms,
    /// `liveness_interval` 10 ms.
    fn default() -> Self {
        Self {
            max_clients: 64,
            ring_depth: 1024,
            resp_depth: crate::client::DEFAULT_CALLS_IN_FLIGHT as u32,
            req_payload_cap: 64,
            resp_payload_cap: 64,
            fingerprint: 0,
            hole_timeout: Duration::from_millis(50),
            stall_timeout: Duration::from_millis(200),
            liveness_interval: Duration::from_millis(10),
        }
    }
}

impl RingConfig {
    pub(crate) fn layout_params(&self) -> LayoutParams {
        LayoutParams {
            max_clients: self.max_clients,
            ring_depth: self.ring_depth,
            resp_depth: self.resp_depth,
            req_payload_cap: self.req_payload_cap,
            resp_payload_cap: self.resp_payload_cap,
        }
    }
}

/// The parameters of an existing ring, as recorded in its header (see [`RingConfig`] for the
/// meaning and units of each field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingInfo {
    /// Number of client ids.
    pub max_clients: u32,
    /// Number of request slots.
    pub ring_depth: u32,
    /// Response slots per client (maximum outstanding calls per client).
    pub resp_depth: u32,
    /// Largest request payload, bytes.
    pub req_payload_cap: u32,
    /// Largest response payload, bytes.
    pub resp_payload_cap: u32,
    /// Schema fingerprint chosen by the server.
    pub fingerprint: u64,
}

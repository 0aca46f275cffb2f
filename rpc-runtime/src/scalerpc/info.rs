//! Connection information exchanged out of band (in-process channel, MPI) before a ScaleRPC
//! client and server talk.

use super::ResponseMode;

/// What the server needs from a client connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientConnInfo {
    /// The client's RC QP number.
    pub qpn: u32,
    /// Its port LID.
    pub lid: u16,
    /// Its port GID.
    pub gid: [u8; 16],
    /// Start of this connection's response slots (the only addresses the server will write
    /// responses to).
    pub resp_addr: u64,
    /// Their total length in bytes.
    pub resp_len: u64,
    /// Their rkey.
    pub resp_rkey: u32,
    /// The 8 B control word the server writes notices into.
    pub ctrl_addr: u64,
    /// Its rkey.
    pub ctrl_rkey: u32,
    /// Schema fingerprint (0: untyped).
    pub fingerprint: u64,
}

/// What the client needs from the server for one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerConnInfo {
    /// The server's RC QP number for this connection.
    pub qpn: u32,
    /// Its port LID.
    pub lid: u16,
    /// Its port GID.
    pub gid: [u8; 16],
    /// Connection id (join order; determines the group).
    pub conn_id: u32,
    /// Message pool address.
    pub pool_addr: u64,
    /// Its rkey.
    pub pool_rkey: u32,
    /// Pool slot size in bytes.
    pub slot_size: u32,
    /// Slots per connection (calls in flight).
    pub slots_per_conn: u32,
    /// This connection's 8 B ack word in the server.
    pub ack_addr: u64,
    /// Its rkey.
    pub ack_rkey: u32,
    /// Whether the connection starts active (its group owns a bank).
    pub active: bool,
    /// If active: pool slot of the client's slot 0.
    pub base: u32,
    /// If active: the activation epoch.
    pub epoch: u32,
    /// How responses come back.
    pub response_mode: ResponseMode,
    /// The server's schema fingerprint.
    pub fingerprint: u64,
}

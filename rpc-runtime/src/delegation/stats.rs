//! Server-side counters ([`RingStats`]).

/// Counters kept by a [`RingServer`](super::RingServer) in its own (not shared) memory; every
/// field counts events since the server was created. Read with
/// [`RingServer::stats`](super::RingServer::stats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Requests returned by `recv` (valid entries).
    pub received: u64,
    /// Replies published (`valid` set to 1).
    pub replied: u64,
    /// Ring positions skipped because the client that reserved them died (or abandoned them
    /// at its deadline, or is unknown) before committing.
    pub holes_skipped: u64,
    /// Ring positions skipped because their live client stalled between reserving and
    /// committing for longer than `stall_timeout`. The slot is then *held* for that client
    /// until it has moved on (its commit, if it still makes one, is refused or dropped).
    pub stalls_skipped: u64,
    /// Ring positions passed at once because their slot was still held for the stalled
    /// writer of an earlier lap (their own writers reserve again; no call fails).
    pub held_laps_skipped: u64,
    /// Held slots given to their next lap once the holder moved on (it refused its own late
    /// commit, committed late, died or detached).
    pub held_slots_released: u64,
    /// Entries committed after the server had skipped their position (the client's stall
    /// ended between its refusal check and its commit store): dropped, never served; that
    /// call ends by its deadline.
    pub late_commits_dropped: u64,
    /// Impossible ring states the server found (head behind or too far ahead, tail changed,
    /// impossible slot sequence word); each marks the ring failed (see
    /// [`RingFault`](super::RingFault)).
    pub ring_faults: u64,
    /// Entries dropped because `client_id >= max_clients`.
    pub bad_client_id: u64,
    /// Entries dropped because `resp_slot_idx >= resp_depth`.
    pub bad_resp_slot: u64,
    /// Entries dropped because the sender's client record is not `ACTIVE`.
    pub inactive_client: u64,
    /// Entries dropped because `payload_len > req_payload_cap`.
    pub bad_payload_len: u64,
    /// Entries a client committed as aborted (its payload writer panicked or overflowed); not
    /// an error of the ring, consumed silently.
    pub aborted: u64,
    /// Replies refused with [`RingReplyError::StaleToken`](super::RingReplyError::StaleToken).
    pub stale_replies: u64,
    /// Replies refused with [`RingReplyError::SlotBusy`](super::RingReplyError::SlotBusy).
    pub resp_slot_busy: u64,
    /// Client ids returned to `FREE` after their owner detached or died.
    pub clients_reclaimed: u64,
    /// Sleeps of the server in [`RingServer::wait_for_request`](super::RingServer::wait_for_request)
    /// (woken, timed out, or the word changed before the wait).
    pub idle_waits: u64,
    /// Clients found asleep in [`RingClient::wait_for_response`](super::RingClient::wait_for_response)
    /// and woken after replies (`FUTEX_WAKE`).
    pub clients_woken: u64,
}

impl RingStats {
    /// Entries dropped as invalid: the sum of `bad_client_id`, `bad_resp_slot`,
    /// `inactive_client` and `bad_payload_len`.
    pub fn invalid_entries(&self) -> u64 {
        self.bad_client_id + self.bad_resp_slot + self.inactive_client + self.bad_payload_len
    }
}

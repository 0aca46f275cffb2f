//! Requests for response: after response packet 0 told it the response size, the client
//! sends one RFR per further response packet it wants (each takes a credit); RFR `pkt_num`
//! `k` asks for response packet `k - (num_req_pkts - 1)`. The server answers from the cached
//! response, so duplicate RFRs are harmless. (The client side of RFRs is the second half of
//! `Rpc::kick_slot` in `req.rs`, which sends RFRs once the request packets are out.)

use std::hash::Hash;

use super::sslot::{SrvState, slot_of};
use super::{Rpc, SessionId, Time};
use crate::erpc::pkthdr::{PKTHDR_SIZE, PktHdr, PktType};

impl<A: Copy + Eq + Hash + std::fmt::Debug> Rpc<A> {
    /// Client: renders the RFR with `pkt_num = pkt` (None if the slot moved on meanwhile).
    pub(super) fn render_rfr(
        &self,
        sid: SessionId,
        generation: u64,
        req_num: u64,
        pkt: usize,
        buf: &mut [u8],
    ) -> Option<(A, usize)> {
        let s = self.session(sid).filter(|s| s.generation == generation)?;
        let slot = &s.role.client()?.slots[slot_of(req_num)];
        if !slot.active
            || slot.req_num != req_num
            || pkt < slot.num_req_pkts
            || slot.wire_pkts().is_none_or(|w| pkt >= w)
        {
            return None;
        }
        let hdr = Self::hdr(
            slot.req_type,
            0,
            s.remote_num,
            s.tx_token,
            PktType::Rfr,
            pkt,
            req_num,
        );
        buf[..PKTHDR_SIZE].copy_from_slice(&hdr);
        Some((s.peer, PKTHDR_SIZE))
    }

    /// Server: an RFR arrived on connected server session `sid`.
    pub(super) fn server_rx_rfr(&mut self, now: Time, sid: SessionId, hdr: &PktHdr) {
        let Some(s) = super::sess_mut(&mut self.sessions, sid) else {
            return;
        };
        s.last_rx = now;
        let generation = s.generation;
        let Some(srv) = s.role.server_mut() else {
            return;
        };
        let r = hdr.req_num();
        let slot = &srv.slots[slot_of(r)];
        let k = usize::from(hdr.pkt_num());
        if slot.req_num != Some(r) || slot.state != SrvState::Replied || k < slot.num_req_pkts {
            self.stats.drop_out_of_window += 1;
            return;
        }
        let j = k + 1 - slot.num_req_pkts;
        if j >= slot.num_resp_pkts {
            self.stats.drop_out_of_window += 1;
            return;
        }
        self.queue_resp_pkt(sid, generation, r, j);
    }
}

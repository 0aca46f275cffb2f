//! Explicit credit returns: the server answers every non-last request packet with an
//! `ExplCr` carrying the same `pkt_num`; the client accepts them in order and gets the
//! credit back.

use std::hash::Hash;

use super::sslot::slot_of;
use super::{Rpc, SessionId, Time, Tx};
use crate::erpc::pkthdr::{PktHdr, PktType};

impl<A: Copy + Eq + Hash + std::fmt::Debug> Rpc<A> {
    /// Server: queues the credit return for request packet `pkt_num` of `req_num`.
    pub(super) fn send_cr(
        &mut self,
        peer: A,
        remote: u16,
        token: u16,
        req_type: u8,
        pkt_num: usize,
        req_num: u64,
    ) {
        let hdr = Self::hdr(
            req_type,
            0,
            remote,
            token,
            PktType::ExplCr,
            pkt_num,
            req_num,
        );
        self.txq.push_back(Tx::Ctrl { dest: peer, hdr });
        self.stats.cr_tx += 1;
    }

    /// Client: a credit return arrived on connected client session `sid`.
    pub(super) fn client_rx_cr(&mut self, now: Time, sid: SessionId, hdr: &PktHdr) {
        let rto = self.cfg.rto;
        let Some(s) = super::sess_mut(&mut self.sessions, sid) else {
            return;
        };
        let Some(c) = s.role.client_mut() else { return };
        let i = slot_of(hdr.req_num());
        let slot = &mut c.slots[i];
        let k = usize::from(hdr.pkt_num());
        if !slot.active
            || slot.req_num != hdr.req_num()
            || k != slot.num_rx
            || k >= slot.num_tx
            || k + 1 >= slot.num_req_pkts
        {
            self.stats.drop_out_of_window += 1;
            return;
        }
        s.last_rx = now;
        slot.num_rx += 1;
        c.credits += 1;
        // Counts from when the slot's last paced packet leaves, if later.
        slot.rto_deadline = (slot.num_tx > slot.num_rx).then_some(now.max(slot.paced_until) + rto);
        if let Some(d) = slot.rto_deadline {
            self.arm(d);
        }
        self.cc_sample(now, sid, i, k);
        self.kick_session(now, sid, Some(i));
    }
}

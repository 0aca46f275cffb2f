//! Responses: server response TX (`reply`, cached for duplicates) and client response RX
//! (in-order reassembly, implicit credit return, completion).

use std::hash::Hash;

use super::sslot::{SLOTS_PER_SESSION, SrvState, pkt_range, pkts_for, slot_of};
use super::{
    ErpcCallError, Event, MsgPkt, ReqToken, Rpc, SessionId, Time, Tx, TxNext, TxSink, Zc, place_pkt,
};
use crate::erpc::msgbuf::MsgBuffer;
use crate::erpc::pkthdr::{MAX_PKT_NUM, PKTHDR_SIZE, PktHdr, PktType};

impl<A: Copy + Eq + Hash + std::fmt::Debug> Rpc<A> {
    /// Server: answers the request named by `token` with `payload` (copied into the
    /// slot's response message buffer and cached there for duplicates). Sends response
    /// packet 0, which answers the client's last request packet; later packets go out only
    /// when the client asks for them (RFR). [`Rpc::reply_with`] writes the response in place
    /// instead.
    ///
    /// # Errors
    /// As [`Rpc::reply_with`].
    pub fn reply(
        &mut self,
        now: Time,
        token: ReqToken,
        payload: &[u8],
    ) -> Result<(), ErpcCallError> {
        self.reply_with(now, token, payload.len(), |buf| {
            buf[..payload.len()].copy_from_slice(payload);
            payload.len()
        })
    }

    /// Server: answers the request named by `token` with the bytes `fill` writes into the
    /// response message buffer of the request's slot (at least `max_len` writable bytes;
    /// `fill` returns the response length in bytes). The buffer is reused across requests
    /// and cached for duplicates, and its packets are sent from it in place: a handler
    /// writes its response once, with no intermediate copy (eRPC handlers fill the slot's
    /// preallocated response msgbuf, seeds/000 §3, §12.4). `fill` runs only for a valid
    /// token.
    ///
    /// # Errors
    /// [`ErpcCallError::StaleToken`] if the request is not awaiting a reply (already answered,
    /// or its session was freed); [`ErpcCallError::TooLarge`] if `max_len` exceeds
    /// `max_msg_size` (`fill` is not called), `fill` returned more than `max_len`, or
    /// request and response together exceed the 14-bit packet numbers;
    /// [`ErpcCallError::NoBuffer`] if a message buffer could not be mapped. On every error the
    /// request stays pending.
    pub fn reply_with(
        &mut self,
        _now: Time,
        token: ReqToken,
        max_len: usize,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), ErpcCallError> {
        let dpp = self.data_per_pkt;
        let max = self.cfg.max_msg_size;
        let s = super::sess_mut(&mut self.sessions, token.session)
            .filter(|s| s.generation == token.generation)
            .ok_or(ErpcCallError::StaleToken)?;
        let srv = s.role.server_mut().ok_or(ErpcCallError::StaleToken)?;
        let slot = &mut srv.slots[slot_of(token.req_num)];
        if slot.req_num != Some(token.req_num) || slot.state != SrvState::AwaitingReply {
            return Err(ErpcCallError::StaleToken);
        }
        if max_len > max {
            return Err(ErpcCallError::TooLarge(max_len));
        }
        let buf = self.pool.ensure(&mut slot.resp, max_len);
        let buf = buf.map_err(|_| ErpcCallError::NoBuffer)?;
        let len = fill(&mut buf.capacity_mut()[..max_len]);
        let num_resp_pkts = pkts_for(len, dpp);
        if len > max_len || slot.num_req_pkts + num_resp_pkts - 1 > usize::from(MAX_PKT_NUM) + 1 {
            return Err(ErpcCallError::TooLarge(len));
        }
        // Within the capacity ensured above.
        let _ = buf.resize(len);
        slot.num_resp_pkts = num_resp_pkts;
        slot.state = SrvState::Replied;
        self.queue_resp_pkt(token.session, token.generation, token.req_num, 0);
        Ok(())
    }

    /// Server: queues response packet `j` of request `req_num`.
    pub(super) fn queue_resp_pkt(
        &mut self,
        session: SessionId,
        generation: u64,
        req_num: u64,
        j: usize,
    ) {
        self.txq.push_back(Tx::RespPkt {
            session,
            generation,
            req_num,
            j,
        });
    }

    /// Server response packet `j` (None if the slot moved on meanwhile), sent in place from
    /// the slot's response message buffer or, if small, copied into `buf` (as
    /// [`Rpc::render_req_pkt`]).
    pub(super) fn render_resp_pkt<S: TxSink<A>>(
        &mut self,
        sid: SessionId,
        generation: u64,
        req_num: u64,
        j: usize,
        buf: &mut [u8],
        sink: &mut S,
    ) -> Option<TxNext<A>> {
        let s = super::sess_mut(&mut self.sessions, sid).filter(|s| s.generation == generation)?;
        let (peer, remote, tok) = (s.peer, s.remote_num, s.tx_token);
        let slot = &mut s.role.server_mut()?.slots[slot_of(req_num)];
        if slot.req_num != Some(req_num)
            || slot.state != SrvState::Replied
            || j >= slot.num_resp_pkts
        {
            return None;
        }
        let (req_type, pkt_num) = (slot.req_type, slot.num_req_pkts - 1 + j);
        let msg = slot.resp.as_mut()?;
        if j >= msg.num_pkts() {
            return None;
        }
        let hdr = Self::hdr(
            req_type,
            msg.data_size(),
            remote,
            tok,
            PktType::Resp,
            pkt_num,
            req_num,
        );
        Some(place_pkt(peer, msg, j, hdr, buf, sink, || MsgPkt {
            session: sid,
            generation,
            req_num,
            // Below num_pkts <= 2^14.
            pkt: j as u16,
            resp: true,
            len: 0,
        }))
    }

    /// Server response packet `j` as header and data slices in the slot's message buffer (and the buffer),
    /// or None if the slot moved on.
    pub(super) fn resp_pkt_parts(
        &self,
        sid: SessionId,
        generation: u64,
        req_num: u64,
        j: usize,
    ) -> Option<(&[u8], &[u8], &MsgBuffer)> {
        let s = self.session(sid).filter(|s| s.generation == generation)?;
        let slot = &s.role.server()?.slots[slot_of(req_num)];
        if slot.req_num != Some(req_num)
            || slot.state != SrvState::Replied
            || j >= slot.num_resp_pkts
        {
            return None;
        }
        let msg = slot.resp.as_ref()?;
        let (hdr, data) = msg.pkt_parts(j)?;
        Some((hdr, data, msg))
    }

    /// Client: a response packet arrived on connected client session `sid`. A response that
    /// is complete in this one packet is returned for zero-copy delivery instead of being
    /// copied (seeds/002 §7.2).
    pub(super) fn client_rx_resp(
        &mut self,
        now: Time,
        sid: SessionId,
        hdr: &PktHdr,
        payload: &[u8],
    ) -> Option<Zc> {
        let dpp = self.data_per_pkt;
        let rto = self.cfg.rto;
        let s = super::sess_mut(&mut self.sessions, sid)?;
        let c = s.role.client_mut()?;
        let r = hdr.req_num();
        let i = slot_of(r);
        let slot = &mut c.slots[i];
        let k = usize::from(hdr.pkt_num());
        if !slot.active
            || slot.req_num != r
            || k != slot.num_rx
            || k >= slot.num_tx
            || k + 1 < slot.num_req_pkts
        {
            self.stats.drop_out_of_window += 1;
            return None;
        }
        let j = k + 1 - slot.num_req_pkts;
        let size = hdr.msg_size() as usize;
        if hdr.req_type() != slot.req_type {
            self.stats.drop_bad_len += 1;
            return None;
        }
        let single = match slot.resp_size {
            None => {
                // j == 0 here: k == num_rx and num_rx only passes num_req_pkts - 1 after
                // response packet 0 was accepted.
                let n = pkts_for(size, dpp);
                if slot.num_req_pkts + n - 1 > usize::from(MAX_PKT_NUM) + 1 {
                    self.stats.drop_bad_len += 1;
                    return None;
                }
                if payload.len() != pkt_range(size, dpp, 0).len() {
                    self.stats.drop_bad_len += 1;
                    return None;
                }
                if n > 1 {
                    // The reassembly buffer: without one the packet is dropped as if lost
                    // (go-back-N re-sends the request's last packet).
                    let buf = self.pool.ensure(&mut slot.resp, size);
                    let Ok(buf) = buf else {
                        self.stats.drop_no_buffer += 1;
                        return None;
                    };
                    // Within the capacity just ensured.
                    let _ = buf.resize(size);
                }
                slot.resp_size = Some(size);
                slot.num_resp_pkts = n;
                n == 1
            }
            Some(sz) => {
                if sz != size || payload.len() != pkt_range(size, dpp, j).len() {
                    self.stats.drop_bad_len += 1;
                    return None;
                }
                false
            }
        };
        if !single {
            // Straight into the message buffer at packet j's place (seeds/000 §3); the
            // checks above make this succeed, and a buffer that disagrees drops the packet
            // instead of writing out of bounds.
            if slot
                .resp
                .as_mut()
                .is_none_or(|b| b.data_size() != size || b.write_pkt(j, payload).is_err())
            {
                self.stats.drop_bad_len += 1;
                return None;
            }
        }
        s.last_rx = now;
        slot.num_rx += 1;
        c.credits += 1;
        // Counts from when the slot's last paced packet leaves, if later.
        slot.rto_deadline = (slot.num_tx > slot.num_rx).then_some(now.max(slot.paced_until) + rto);
        let complete = Some(slot.num_rx) == slot.wire_pkts();
        let (tag, in_wheel) = (slot.tag, slot.in_wheel);
        if let Some(d) = slot.rto_deadline {
            self.arm(d);
        }
        self.cc_sample(now, sid, i, k);
        if !complete {
            self.kick_session(now, sid, Some(i));
            return None;
        }
        if in_wheel > 0 {
            // Retransmitted copies still queued: remove them before the slot moves on (I1).
            self.purge_slot(sid, i);
        }
        let c = super::sess_mut(&mut self.sessions, sid)?
            .role
            .client_mut()?;
        // What the kicks below would find to do: stalled slots to send, backlogged requests
        // to start (neither changes in between: a kick takes nothing from the backlog).
        let (stalled, backlogged) = (!c.stall.is_empty(), !c.backlog.is_empty());
        let slot = &mut c.slots[i];
        let data = if single { None } else { slot.resp.take() };
        slot.finish();
        debug_assert_eq!(slot.req_num % SLOTS_PER_SESSION as u64, i as u64);
        let zc = match data {
            Some(data) => {
                self.events.push_back(Event::Response {
                    session: sid,
                    tag,
                    data,
                });
                None
            }
            None => Some(Zc::Response {
                session: sid,
                tag,
                offset: PKTHDR_SIZE,
                len: payload.len(),
            }),
        };
        if stalled {
            self.kick_session(now, sid, None);
        }
        if backlogged {
            self.drain_backlog(now, sid);
        }
        zc
    }
}

impl ReqToken {
    /// Test helper: a token for an arbitrary request.
    #[cfg(test)]
    pub(super) fn for_test(session: SessionId, generation: u64, req_num: u64) -> Self {
        ReqToken {
            session,
            generation,
            req_num,
        }
    }
}

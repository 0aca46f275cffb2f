//! Responses: server response TX (`reply`, cached for duplicates) and client response RX
//! (in-order reassembly, implicit credit return, completion).

use std::hash::Hash;

use super::sslot::{SLOTS_PER_SESSION, SrvState, pkt_range, pkts_for, slot_of};
use super::{CallError, Event, ReqToken, Rpc, SessionId, Time, Tx, Zc};
use crate::erpc::pkthdr::{MAX_PKT_NUM, PKTHDR_SIZE, PktHdr, PktType};

impl<A: Copy + Eq + Hash + std::fmt::Debug> Rpc<A> {
    /// Server: answers the request named by `token` with `payload` (copied and cached for
    /// duplicates). Sends response packet 0, which answers the client's last request packet;
    /// later packets go out only when the client asks for them (RFR).
    ///
    /// # Errors
    /// [`CallError::StaleToken`] if the request is not awaiting a reply (already answered, or
    /// its session was freed), [`CallError::TooLarge`] above `max_msg_size` or when request
    /// and response together exceed the 14-bit packet numbers (the request stays pending).
    pub fn reply(&mut self, now: Time, token: ReqToken, payload: &[u8]) -> Result<(), CallError> {
        if payload.len() > self.cfg.max_msg_size {
            return Err(CallError::TooLarge(payload.len()));
        }
        self.reply_with(now, token, |buf| buf.extend_from_slice(payload))
    }

    /// Server: answers the request named by `token` with the bytes `fill` appends to the
    /// (empty) response buffer of the request's slot, which is reused across requests and
    /// cached for duplicates: a dispatch-mode handler writes its response in place, with no
    /// intermediate copy (eRPC handlers fill the slot's preallocated response msgbuf).
    /// `fill` runs only for a valid token.
    ///
    /// # Errors
    /// As [`Rpc::reply`]; on [`CallError::TooLarge`] the written bytes are discarded and the
    /// request stays pending.
    pub fn reply_with(
        &mut self,
        _now: Time,
        token: ReqToken,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), CallError> {
        let dpp = self.data_per_pkt;
        let max = self.cfg.max_msg_size;
        let s = self
            .session_mut(token.session)
            .filter(|s| s.generation == token.generation)
            .ok_or(CallError::StaleToken)?;
        let srv = s.role.server_mut().ok_or(CallError::StaleToken)?;
        let slot = &mut srv.slots[slot_of(token.req_num)];
        if slot.req_num != Some(token.req_num) || slot.state != SrvState::AwaitingReply {
            return Err(CallError::StaleToken);
        }
        slot.resp.clear();
        fill(&mut slot.resp);
        let len = slot.resp.len();
        let num_resp_pkts = pkts_for(len, dpp);
        if len > max || slot.num_req_pkts + num_resp_pkts - 1 > usize::from(MAX_PKT_NUM) + 1 {
            slot.resp.clear();
            return Err(CallError::TooLarge(len));
        }
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

    /// Renders server response packet `j` (None if the slot moved on meanwhile).
    pub(super) fn render_resp_pkt(
        &self,
        sid: SessionId,
        generation: u64,
        req_num: u64,
        j: usize,
        buf: &mut [u8],
    ) -> Option<(A, usize)> {
        let s = self.session(sid).filter(|s| s.generation == generation)?;
        let slot = &s.role.server()?.slots[slot_of(req_num)];
        if slot.req_num != Some(req_num)
            || slot.state != SrvState::Replied
            || j >= slot.num_resp_pkts
        {
            return None;
        }
        let range = pkt_range(slot.resp.len(), self.data_per_pkt, j);
        let len = range.len();
        let hdr = Self::hdr(
            slot.req_type,
            slot.resp.len(),
            s.remote_num,
            s.tx_token,
            PktType::Resp,
            slot.num_req_pkts - 1 + j,
            req_num,
        );
        buf[..PKTHDR_SIZE].copy_from_slice(&hdr);
        buf[PKTHDR_SIZE..PKTHDR_SIZE + len].copy_from_slice(&slot.resp[range]);
        Some((s.peer, PKTHDR_SIZE + len))
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
                slot.resp_size = Some(size);
                slot.num_resp_pkts = n;
                if n > 1 {
                    if slot.resp.capacity() == 0 {
                        slot.resp = self.pool.take(size);
                    } else {
                        slot.resp.clear();
                        slot.resp.reserve(size);
                    }
                }
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
        s.last_rx = now;
        if !single {
            slot.resp.extend_from_slice(payload);
        }
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
        let slot = &mut c.slots[i];
        let data = if single {
            None
        } else {
            Some(std::mem::take(&mut slot.resp))
        };
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
        self.kick_session(now, sid, None);
        self.drain_backlog(now, sid);
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

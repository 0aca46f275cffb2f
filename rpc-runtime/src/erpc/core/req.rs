//! Requests: client request TX (slots, backlog, credits, stall queue) and server request RX
//! (in-order reassembly, explicit credit returns, at-most-once dispatch).

use std::hash::Hash;

use super::cc::ClientTxq;
use super::session::{ClientSession, PendingReq, SessionState};
use super::sslot::{SLOTS_PER_SESSION, SrvState, pkt_range, pkts_for, slot_of};
use super::{
    ErpcCallError, Event, MsgPkt, ReqToken, Rpc, SessionId, Time, TxNext, TxSink, Zc, place_pkt,
};
use crate::erpc::msgbuf::MsgBuffer;
use crate::erpc::pkthdr::{PKTHDR_SIZE, PktHdr, PktType};

impl<A: Copy + Eq + Hash + std::fmt::Debug> Rpc<A> {
    /// Client: queues an RPC of type `req_type` with `payload` (copied into the slot's
    /// message buffer, or a buffer of the free list while it waits in the backlog). The
    /// outcome arrives as [`Event::Response`] or [`Event::RequestFailed`] carrying `tag`.
    /// Requests beyond the 8 slots, or issued while the session is still connecting, wait in
    /// the session's backlog. [`Rpc::enqueue_request_with`] writes the request in place
    /// instead.
    ///
    /// # Errors
    /// As [`Rpc::enqueue_request_with`].
    pub fn enqueue_request(
        &mut self,
        now: Time,
        session: SessionId,
        req_type: u8,
        payload: &[u8],
        tag: u64,
    ) -> Result<(), ErpcCallError> {
        self.enqueue_request_with(now, session, req_type, tag, payload.len(), |buf| {
            buf[..payload.len()].copy_from_slice(payload);
            payload.len()
        })
    }

    /// Client: queues an RPC of type `req_type` whose request `fill` writes in place into
    /// the slot's request message buffer (seeds/000 §3: the application fills a preallocated
    /// msgbuf; its packets are later sent from it without a copy). `fill` gets at least
    /// `max_len` writable bytes and returns the request's length in bytes. While the request
    /// must wait in the backlog (no free slot, or the session is still connecting), `fill`
    /// writes into a buffer of the free list that becomes the slot's when the request
    /// starts. The outcome arrives as [`Event::Response`] or [`Event::RequestFailed`]
    /// carrying `tag`.
    ///
    /// # Errors
    /// [`ErpcCallError::BadSession`] if `session` is not a connecting or connected client
    /// session; [`ErpcCallError::TooLarge`] if `max_len` exceeds `max_msg_size` (`fill` is not
    /// called) or `fill` returned more than `max_len` (nothing is queued);
    /// [`ErpcCallError::NoBuffer`] if a message buffer could not be mapped.
    pub fn enqueue_request_with(
        &mut self,
        now: Time,
        session: SessionId,
        req_type: u8,
        tag: u64,
        max_len: usize,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), ErpcCallError> {
        if max_len > self.cfg.max_msg_size {
            return Err(ErpcCallError::TooLarge(max_len));
        }
        let s = super::sess_mut(&mut self.sessions, session).ok_or(ErpcCallError::BadSession)?;
        let connected = match s.state {
            SessionState::Connected => true,
            SessionState::Connecting => false,
            SessionState::Disconnecting => return Err(ErpcCallError::BadSession),
        };
        let generation = s.generation;
        let c = s.role.client_mut().ok_or(ErpcCallError::BadSession)?;
        match c.free_slot().filter(|_| connected && c.backlog.is_empty()) {
            Some(i) => {
                let slot = &mut c.slots[i];
                let buf = self.pool.ensure(&mut slot.req, max_len);
                let buf = buf.map_err(|_| ErpcCallError::NoBuffer)?;
                let n = fill(&mut buf.capacity_mut()[..max_len]);
                if n > max_len {
                    return Err(ErpcCallError::TooLarge(n));
                }
                // Within the capacity ensured above.
                let _ = buf.resize(n);
                slot.start(req_type, tag);
                // `kick_session(now, session, Some(i))` on the session already borrowed.
                let mut q = ClientTxq {
                    cfg: &self.cfg,
                    data_per_pkt: self.data_per_pkt,
                    stats: &mut self.stats,
                    txq: &mut self.txq,
                    wheel: &mut self.wheel,
                    wheel_out: &mut self.wheel_out,
                    timer_lb: &mut self.timer_lb,
                    sid: session,
                    generation,
                };
                q.kick(now, c, Some(i));
            }
            None => {
                let data = self.pool.take(max_len);
                let mut data = data.map_err(|_| ErpcCallError::NoBuffer)?;
                let n = fill(&mut data.capacity_mut()[..max_len]);
                if n > max_len {
                    self.pool.put(data);
                    return Err(ErpcCallError::TooLarge(n));
                }
                let _ = data.resize(n);
                c.backlog.push_back(PendingReq {
                    req_type,
                    data,
                    tag,
                });
            }
        }
        Ok(())
    }

    /// Client: moves backlogged requests into free slots (connected sessions only).
    pub(super) fn drain_backlog(&mut self, now: Time, sid: SessionId) {
        loop {
            let Some(s) = super::sess_mut(&mut self.sessions, sid) else {
                return;
            };
            if s.state != SessionState::Connected {
                return;
            }
            let Some(c) = s.role.client_mut() else { return };
            let Some(i) = c.free_slot() else { return };
            let Some(p) = c.backlog.pop_front() else {
                return;
            };
            let slot = &mut c.slots[i];
            // The backlog buffer becomes the slot's; the slot's old one goes to the free list.
            if let Some(old) = slot.req.replace(p.data) {
                self.pool.put(old);
            }
            slot.start(p.req_type, p.tag);
            self.kick_session(now, sid, Some(i));
        }
    }

    /// Client: lets stalled slots, then `slot` (if given), send what their credits allow.
    /// The session is looked up once for the whole kick.
    pub(super) fn kick_session(&mut self, now: Time, sid: SessionId, slot: Option<usize>) {
        let Rpc {
            sessions,
            cfg,
            data_per_pkt,
            stats,
            txq,
            wheel,
            wheel_out,
            timer_lb,
            ..
        } = self;
        let Some(s) = super::sess_mut(sessions, sid) else {
            return;
        };
        let generation = s.generation;
        let Some(c) = s.role.client_mut() else {
            return;
        };
        let mut q = ClientTxq {
            cfg,
            data_per_pkt: *data_per_pkt,
            stats,
            txq,
            wheel,
            wheel_out,
            timer_lb,
            sid,
            generation,
        };
        q.kick(now, c, slot);
    }
    /// Client request packet `pkt` (None if the slot moved on meanwhile): its header is
    /// written into its place in the slot's request message buffer and the packet is sent
    /// in place ([`TxOut::Msg`], see [`Rpc::msg_pkt`]), or, for a datagram of at most
    /// [`RENDER_MAX`](super::RENDER_MAX) bytes, header and data are copied into `buf`
    /// ([`TxOut::Rendered`]).
    pub(super) fn render_req_pkt<S: TxSink<A>>(
        &mut self,
        sid: SessionId,
        generation: u64,
        req_num: u64,
        pkt: usize,
        buf: &mut [u8],
        sink: &mut S,
    ) -> Option<TxNext<A>> {
        let s = super::sess_mut(&mut self.sessions, sid).filter(|s| s.generation == generation)?;
        let (peer, remote, tok) = (s.peer, s.remote_num, s.tx_token);
        let slot = &mut s.role.client_mut()?.slots[slot_of(req_num)];
        if !slot.active || slot.req_num != req_num || pkt >= slot.num_req_pkts {
            return None;
        }
        let req_type = slot.req_type;
        let msg = slot.req.as_mut()?;
        if pkt >= msg.num_pkts() {
            return None;
        }
        let hdr = Self::hdr(
            req_type,
            msg.data_size(),
            remote,
            tok,
            PktType::Req,
            pkt,
            req_num,
        );
        Some(place_pkt(peer, msg, pkt, hdr, buf, sink, || MsgPkt {
            session: sid,
            generation,
            req_num,
            // Below num_pkts <= 2^14.
            pkt: pkt as u16,
            resp: false,
            len: 0,
        }))
    }

    /// Client request packet `pkt` as header and data slices in the slot's message buffer (and the buffer),
    /// or None if the slot moved on.
    pub(super) fn req_pkt_parts(
        &self,
        sid: SessionId,
        generation: u64,
        req_num: u64,
        pkt: usize,
    ) -> Option<(&[u8], &[u8], &MsgBuffer)> {
        let s = self.session(sid).filter(|s| s.generation == generation)?;
        let slot = &s.role.client()?.slots[slot_of(req_num)];
        if !slot.active || slot.req_num != req_num || pkt >= slot.num_req_pkts {
            return None;
        }
        let msg = slot.req.as_ref()?;
        let (hdr, data) = msg.pkt_parts(pkt)?;
        Some((hdr, data, msg))
    }

    /// Server: a request packet arrived on connected server session `sid`. A new
    /// single-packet request is returned for zero-copy dispatch instead of being copied
    /// (seeds/002 §7.2).
    pub(super) fn server_rx_req(
        &mut self,
        now: Time,
        sid: SessionId,
        hdr: &PktHdr,
        payload: &[u8],
    ) -> Option<Zc> {
        let dpp = self.data_per_pkt;
        let s = super::sess_mut(&mut self.sessions, sid)?;
        s.last_rx = now;
        let (peer, remote, tok, generation) = (s.peer, s.remote_num, s.tx_token, s.generation);
        let srv = s.role.server_mut()?;
        let r = hdr.req_num();
        let k = usize::from(hdr.pkt_num());
        let slot = &mut srv.slots[slot_of(r)];
        let size = hdr.msg_size() as usize;
        // A new request carries exactly the slot's next request number, a duplicate the held
        // one; anything else is stale or forged (the base is random, issue 14).
        let new_request = if r == slot.next_req {
            true
        } else if slot.req_num == Some(r) {
            false
        } else {
            self.stats.drop_out_of_window += 1;
            return None;
        };
        if new_request {
            // The client only reuses a slot after the previous response completed, so a
            // request still waiting for its reply cannot be superseded legitimately.
            if slot.state == SrvState::AwaitingReply || k != 0 {
                self.stats.drop_out_of_window += 1;
                return None;
            }
            if payload.len() != pkt_range(size, dpp, 0).len() {
                self.stats.drop_bad_len += 1;
                return None;
            }
            if pkts_for(size, dpp) > 1 {
                // The reassembly buffer, before any state changes: without one the packet
                // is dropped as if lost, and the client's retransmission tries again.
                let buf = self.pool.ensure(&mut slot.req, size);
                let Ok(buf) = buf else {
                    self.stats.drop_no_buffer += 1;
                    return None;
                };
                // Within the capacity just ensured.
                let _ = buf.resize(size);
            }
            slot.req_num = Some(r);
            slot.next_req = r + SLOTS_PER_SESSION as u64;
            slot.state = SrvState::Receiving;
            slot.req_type = hdr.req_type();
            slot.req_size = size;
            slot.num_req_pkts = pkts_for(size, dpp);
            slot.num_rx = 0;
            slot.num_resp_pkts = 0;
            if slot.num_req_pkts == 1 {
                // Complete single-packet request: dispatched in place, never copied.
                slot.num_rx = 1;
                slot.state = SrvState::AwaitingReply;
                self.stats.requests_dispatched += 1;
                return Some(Zc::Request {
                    token: ReqToken {
                        session: sid,
                        generation,
                        req_num: r,
                    },
                    req_type: hdr.req_type(),
                    offset: PKTHDR_SIZE,
                    len: payload.len(),
                });
            }
        }
        if size != slot.req_size || hdr.req_type() != slot.req_type || k >= slot.num_req_pkts {
            self.stats.drop_bad_len += 1;
            return None;
        }
        let last = slot.num_req_pkts - 1;
        if k < slot.num_rx {
            // Duplicate of a packet already received: its answer was lost.
            if k < last {
                self.stats.dup_req_answered += 1;
                self.send_cr(peer, remote, tok, hdr.req_type(), k, r);
            } else if slot.state == SrvState::Replied {
                self.stats.dup_req_answered += 1;
                self.queue_resp_pkt(sid, generation, r, 0);
            } else {
                // The handler is still running; `reply` will answer.
                self.stats.drop_out_of_window += 1;
            }
            return None;
        }
        if k > slot.num_rx {
            self.stats.drop_out_of_window += 1;
            return None;
        }
        if payload.len() != pkt_range(size, dpp, k).len() {
            self.stats.drop_bad_len += 1;
            return None;
        }
        // Straight into the message buffer at packet k's place (seeds/000 §3); the checks
        // above make this succeed, and a buffer that disagrees drops the packet instead of
        // writing out of bounds.
        if slot
            .req
            .as_mut()
            .is_none_or(|b| b.data_size() != size || b.write_pkt(k, payload).is_err())
        {
            self.stats.drop_bad_len += 1;
            return None;
        }
        slot.num_rx += 1;
        if k < last {
            self.send_cr(peer, remote, tok, hdr.req_type(), k, r);
            return None;
        }
        let Some(data) = slot.req.take() else {
            self.stats.drop_bad_len += 1;
            return None;
        };
        slot.state = SrvState::AwaitingReply;
        self.stats.requests_dispatched += 1;
        self.events.push_back(Event::Request {
            token: ReqToken {
                session: sid,
                generation,
                req_num: r,
            },
            req_type: hdr.req_type(),
            data,
        });
        None
    }
}

impl<A: Copy> ClientTxq<'_, A> {
    /// Client: lets stalled slots, then `slot` (if given), of the session `c` (`self.sid`)
    /// send what their credits allow (the body of [`Rpc::kick_session`]).
    #[inline]
    fn kick(&mut self, now: Time, c: &mut ClientSession, slot: Option<usize>) {
        while c.credits != 0 {
            let Some(i) = c.stall.pop_front() else { break };
            c.slots[i].in_stall = false;
            self.kick_slot(now, c, i);
        }
        if let Some(i) = slot {
            self.kick_slot(now, c, i);
        }
    }

    /// Client: sends request packets / RFRs of slot `i` of the session `c` (`self.sid`)
    /// while credits last (directly or through the timing wheel, see `cc.rs`); parks the slot
    /// in the stall queue if it runs out.
    #[inline]
    fn kick_slot(&mut self, now: Time, c: &mut ClientSession, i: usize) {
        let rto = self.cfg.rto;
        loop {
            if !c.slots[i].wants_tx() {
                return;
            }
            if c.credits == 0 {
                let slot = &mut c.slots[i];
                if !slot.in_stall {
                    slot.in_stall = true;
                    c.stall.push_back(i);
                }
                return;
            }
            let slot = &mut c.slots[i];
            let k = slot.num_tx;
            if k >= slot.num_req_pkts {
                self.stats.rfr_tx += 1;
            }
            slot.num_tx += 1;
            c.credits -= 1;
            let due = self.queue_client_pkt(now, c, i, k);
            let slot = &mut c.slots[i];
            // The timeout counts from when the packet leaves (later than now if paced).
            let deadline = due + rto;
            let d = match slot.rto_deadline {
                None => deadline,
                Some(d) => d.max(if due > now { deadline } else { d }),
            };
            slot.rto_deadline = Some(d);
            self.arm(d);
        }
    }
}

//! Node failure (seeds/002 §10): a peer silent for `failure_timeout` fails its sessions.
//!
//! Client side: every RPC in flight or backlogged gets [`Event::RequestFailed`], then the
//! session gets [`Event::SessionFailed`] and is freed. Server side: the session and its
//! cached requests/responses are freed ([`Event::ServerSessionClosed`]); tokens of requests
//! not yet answered become stale (`reply` returns `StaleToken`). Connected idle clients ping
//! (see `sm.rs`), so only a really silent peer trips this.

use std::hash::Hash;

use super::session::{Role, Session};
use super::{Event, Rpc, SessionError, SessionId, Time};

impl<A: Copy + Eq + Hash + std::fmt::Debug> Rpc<A> {
    /// Fails or reaps session `sid` if its peer has been silent too long; returns whether it
    /// was freed.
    pub(super) fn check_failure(&mut self, now: Time, sid: SessionId) -> bool {
        let timeout = self.cfg.failure_timeout;
        let Some(s) = self.session(sid) else {
            return true;
        };
        if now < s.last_rx.saturating_add(timeout) {
            return false;
        }
        if s.role.is_client() {
            self.fail_client_session(sid, SessionError::PeerFailed);
        } else {
            self.free_session(sid);
            self.stats.server_sessions_reaped += 1;
            self.events.push_back(Event::ServerSessionClosed(sid));
        }
        true
    }

    /// When server session `s` is reclaimed for never having received a request, if it has
    /// not (issue 14; [`Config::idle_session_timeout`](super::Config::idle_session_timeout)).
    pub(super) fn idle_deadline(&self, s: &Session<A>) -> Option<Time> {
        let srv = s.role.server()?;
        (!srv.got_request()).then(|| srv.created.saturating_add(self.cfg.idle_session_timeout))
    }

    /// Reclaims server session `sid` if its client has sent no request within
    /// `idle_session_timeout` of connecting; returns whether it was freed.
    pub(super) fn check_idle(&mut self, now: Time, sid: SessionId) -> bool {
        let Some(s) = self.session(sid) else {
            return true;
        };
        if self.idle_deadline(s).is_none_or(|d| now < d) {
            return false;
        }
        self.free_session(sid);
        self.stats.server_sessions_idle_reclaimed += 1;
        self.events.push_back(Event::ServerSessionClosed(sid));
        true
    }

    /// Client: fails every RPC of `sid`, reports the session failed, frees it.
    pub(super) fn fail_client_session(&mut self, sid: SessionId, error: SessionError) {
        let Some(s) = self.free_session(sid) else {
            return;
        };
        self.stats.sessions_failed += 1;
        if let Role::Client(c) = s.role {
            let c = *c;
            for slot in c.slots.iter().filter(|sl| sl.active) {
                self.events.push_back(Event::RequestFailed {
                    session: sid,
                    tag: slot.tag,
                    error,
                });
            }
            for p in c.backlog {
                self.events.push_back(Event::RequestFailed {
                    session: sid,
                    tag: p.tag,
                    error,
                });
                self.pool.put(p.data);
            }
        }
        self.events.push_back(Event::SessionFailed {
            session: sid,
            error,
        });
    }
}

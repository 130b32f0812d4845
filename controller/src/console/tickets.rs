//! Single-use tickets for the console's WebSocket. A browser cannot set an `Authorization`
//! header on a WebSocket, so an authenticated `POST /v1/nodes/{node}/console/ticket` hands out
//! a random ticket, good for [`TICKET_TTL`], for one node, and used at most once
//! (`GET …/console/ws?ticket=…`); it carries the caller's name and role. Kept in memory only:
//! a restart voids them, which costs a browser one more POST.

use rivet_model::config::Role;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a ticket is good for.
pub const TICKET_TTL: Duration = Duration::from_secs(30);

/// Most unused tickets kept; beyond it the oldest go (a client minting in a loop cannot grow
/// memory without bound).
const MAX_TICKETS: usize = 10_000;

/// Who a ticket lets in.
#[derive(Debug, Clone)]
pub struct TicketHolder {
    /// The node it is for.
    pub node_uuid: String,
    /// The credential's name (for the audit trail).
    pub name: String,
    /// Its role (a reader only watches).
    pub role: Role,
}

/// The tickets handed out and not yet used.
#[derive(Default)]
pub struct Tickets {
    open: Mutex<HashMap<String, (TicketHolder, Instant)>>,
}

impl Tickets {
    /// A new ticket for `holder`.
    pub fn issue(&self, holder: TicketHolder) -> String {
        let ticket = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let now = Instant::now();
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|_, (_, at)| now.duration_since(*at) < TICKET_TTL);
        if open.len() >= MAX_TICKETS {
            if let Some(oldest) = open
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
            {
                open.remove(&oldest);
            }
        }
        open.insert(ticket.clone(), (holder, now));
        ticket
    }

    /// Use `ticket` for `node_uuid`: its holder when it is open, unexpired and for that node.
    /// A ticket is gone after this call whatever the answer.
    pub fn redeem(&self, ticket: &str, node_uuid: &str) -> Option<TicketHolder> {
        self.redeem_at(ticket, node_uuid, Instant::now())
    }

    /// [`Tickets::redeem`] as of `now`.
    fn redeem_at(&self, ticket: &str, node_uuid: &str, now: Instant) -> Option<TicketHolder> {
        let (holder, at) = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(ticket)?;
        (now.saturating_duration_since(at) < TICKET_TTL && holder.node_uuid == node_uuid)
            .then_some(holder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_once_for_its_node() {
        let t = Tickets::default();
        let h = || TicketHolder {
            node_uuid: "n1".into(),
            name: "alice".into(),
            role: Role::Reader,
        };
        let a = t.issue(h());
        assert_eq!(a.len(), 64);
        assert!(t.redeem(&a, "n1").is_some());
        assert!(t.redeem(&a, "n1").is_none(), "reused");
        let b = t.issue(h());
        assert!(t.redeem(&b, "n2").is_none(), "another node");
        assert!(t.redeem(&b, "n1").is_none(), "gone after a wrong use");
        let c = t.issue(h());
        let late = Instant::now() + TICKET_TTL + Duration::from_secs(1);
        assert!(t.redeem_at(&c, "n1", late).is_none(), "expired");
        assert!(t.redeem(&c, "n1").is_none(), "gone after an expired use");
    }
}

//! Discovery from the ramdisk side: when every controller answers a lookup with 404 (no node
//! has this machine's MACs), send the whole inventory to `POST /agent/v1/discover` once per
//! boot. A controller with discovery enabled enrols a node and says what to do next
//! (`poweroff`: power the machine off when the agent owns it; `wait`: keep looking up, the
//! operator takes the node from `enroll`). A 403 (discovery disabled) is final for this boot;
//! other failures (429, unreachable) are retried on the next round. Lookups go on as before
//! in every case, so a node enrolled by hand is still found.

use crate::backoff::Backoff;
use crate::client::Transport;
use crate::inventory::{self, InventoryOptions, Root};
use rivet_hardware_managers::Dispatcher;
use rivet_protocol::agent::{LookupRequest, LookupResponse};
use rivet_protocol::discovery::{DiscoverRequest, DiscoveryEnd};
use std::sync::Arc;
use std::time::Duration;

/// Where discovery stands in this boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryState {
    /// Not tried yet (or the last try failed in a way worth retrying).
    Pending,
    /// A controller enrolled this machine (or already had it).
    Done,
    /// The controller refused (discovery disabled): not asked again this boot.
    Refused,
}

/// What discovery needs from the agent.
pub struct Discovery {
    /// State in this boot.
    pub state: DiscoveryState,
    /// How to collect the inventory sent (with the BMC address).
    pub inventory: InventoryOptions,
    /// Hardware managers that add to the inventory.
    pub dispatcher: Arc<Dispatcher>,
    /// The ramdisk's boot id.
    pub boot_id: Option<String>,
    /// Whether `poweroff` really powers off (the agent is the machine's init).
    pub owns_machine: bool,
}

impl Discovery {
    /// Post the inventory to `url`, once it is clear no controller knows this machine.
    async fn try_discover<T: Transport>(&mut self, transport: &T, url: &str) {
        let opts = self.inventory.clone();
        let dispatcher = self.dispatcher.clone();
        let inv = tokio::task::spawn_blocking(move || {
            let mut inv = inventory::collect(&Root::default(), &opts);
            dispatcher.inventory(&mut inv);
            inv
        })
        .await
        .unwrap_or_default();
        let req = DiscoverRequest {
            inventory: inv,
            agent_version: rivet_protocol::VERSION.to_string(),
            boot_id: self.boot_id.clone(),
        };
        match transport.discover(url, &req).await {
            Ok(resp) => {
                self.state = DiscoveryState::Done;
                tracing::info!(
                    controller = %url,
                    node = %resp.node_uuid,
                    created = resp.created,
                    end = ?resp.end,
                    "discovery: the controller enrolled this machine"
                );
                if resp.end == DiscoveryEnd::Poweroff {
                    if self.owns_machine {
                        tracing::warn!("discovery: powering off as the controller asked");
                        let r = tokio::task::spawn_blocking(|| crate::pid1::power(true)).await;
                        tracing::error!(result = ?r, "power off failed; waiting for the operator");
                    } else {
                        tracing::info!(
                            "discovery: the controller asked for power off, but this agent is \
                             not the machine's init (local mode): staying up and looking up"
                        );
                    }
                }
            }
            Err(e) if e.status() == Some(403) => {
                self.state = DiscoveryState::Refused;
                tracing::info!(controller = %url, error = %e, "discovery refused; enrol this machine by hand");
            }
            Err(e) => {
                tracing::warn!(controller = %url, error = %e, "discovery failed; retrying with the next lookup round")
            }
        }
    }
}

/// [`crate::client::lookup_until_found`] that discovers: after a round in which every
/// controller answered 404, post the inventory (to the first one) while discovery is pending.
pub async fn lookup_or_discover<T: Transport>(
    transport: &T,
    controllers: &[String],
    start: usize,
    req: &LookupRequest,
    backoff: &mut Backoff,
    discovery: &mut Discovery,
) -> (usize, LookupResponse) {
    loop {
        let mut asked_to_wait = Duration::ZERO;
        let mut unknown_everywhere = !controllers.is_empty();
        for i in 0..controllers.len() {
            let idx = (start + i) % controllers.len();
            let url = &controllers[idx];
            match transport.lookup(url, req).await {
                Ok(resp) => {
                    backoff.reset();
                    return (idx, resp);
                }
                Err(e) if e.status() == Some(404) => tracing::info!(
                    controller = %url,
                    macs = ?req.macs,
                    "controller does not know this machine (404); enrol it with one of these MACs"
                ),
                Err(e) => {
                    unknown_everywhere = false;
                    if let Some(wait) = e.retry_after() {
                        asked_to_wait = asked_to_wait.max(wait);
                    }
                    tracing::warn!(controller = %url, error = %e, "lookup failed")
                }
            }
        }
        if unknown_everywhere && discovery.state == DiscoveryState::Pending {
            let url = &controllers[start % controllers.len()];
            discovery.try_discover(transport, url).await;
        }
        let delay = backoff.next_delay().max(asked_to_wait);
        tracing::debug!(?delay, attempt = backoff.attempts(), "retrying lookup");
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::BackoffConfig;
    use crate::client::TransportError;
    use rivet_protocol::agent::{AgentConfig, HeartbeatRequest, HeartbeatResponse};
    use rivet_protocol::discovery::DiscoverResponse;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// 404 for `unknown_rounds` lookups, then found; discovery answers `discover`.
    struct Fake {
        unknown_rounds: usize,
        lookups: AtomicUsize,
        discovers: AtomicUsize,
        discover: Mutex<Result<DiscoverResponse, TransportError>>,
    }

    impl Transport for Arc<Fake> {
        async fn lookup(
            &self,
            _base: &str,
            _req: &LookupRequest,
        ) -> Result<LookupResponse, TransportError> {
            if self.lookups.fetch_add(1, Ordering::SeqCst) < self.unknown_rounds {
                return Err(TransportError::Status {
                    status: 404,
                    body: "unknown".into(),
                });
            }
            Ok(LookupResponse {
                node_uuid: "n1".into(),
                node_name: None,
                agent_token: Some("t".into()),
                config: AgentConfig {
                    long_poll_s: 1,
                    heartbeat_timeout_s: 300,
                },
            })
        }

        async fn heartbeat(
            &self,
            _base: &str,
            _node: &str,
            _token: &str,
            _req: &HeartbeatRequest,
            _timeout: Duration,
        ) -> Result<HeartbeatResponse, TransportError> {
            Ok(HeartbeatResponse::default())
        }

        async fn discover(
            &self,
            _base: &str,
            req: &DiscoverRequest,
        ) -> Result<rivet_protocol::discovery::DiscoverResponse, TransportError> {
            assert_eq!(req.agent_version, rivet_protocol::VERSION);
            self.discovers.fetch_add(1, Ordering::SeqCst);
            self.discover
                .lock()
                .map(|r| r.clone())
                .unwrap_or_else(|_| Err(TransportError::Connect("poisoned".into())))
        }
    }

    async fn run(answer: Result<DiscoverResponse, TransportError>) -> (usize, DiscoveryState) {
        let fake = Arc::new(Fake {
            unknown_rounds: 4,
            lookups: AtomicUsize::new(0),
            discovers: AtomicUsize::new(0),
            discover: Mutex::new(answer),
        });
        let mut d = Discovery {
            state: DiscoveryState::Pending,
            inventory: InventoryOptions::default(),
            dispatcher: Arc::new(Dispatcher::new(Vec::new())),
            boot_id: None,
            owns_machine: false,
        };
        let mut backoff = Backoff::new(BackoffConfig {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(2),
        });
        let (_, resp) = lookup_or_discover(
            &fake,
            &["http://c".to_string()],
            0,
            &LookupRequest::default(),
            &mut backoff,
            &mut d,
        )
        .await;
        assert_eq!(resp.node_uuid, "n1");
        (fake.discovers.load(Ordering::SeqCst), d.state)
    }

    #[tokio::test]
    async fn discovers_once_per_boot_and_a_403_is_final() {
        let ok = DiscoverResponse {
            node_uuid: "n1".into(),
            created: true,
            end: DiscoveryEnd::Wait,
        };
        assert_eq!(run(Ok(ok)).await, (1, DiscoveryState::Done));
        let refused = TransportError::Status {
            status: 403,
            body: "disabled".into(),
        };
        assert_eq!(run(Err(refused)).await, (1, DiscoveryState::Refused));
        // Worth retrying: asked again every 404 round.
        let busy = TransportError::RateLimited {
            retry_after: Duration::from_millis(1),
            body: "slow down".into(),
        };
        let (asked, state) = run(Err(busy)).await;
        assert_eq!((asked, state), (4, DiscoveryState::Pending));
    }
}

//! The SSH front door to the serial consoles (`[console] ssh_listen`, off by default):
//! `ssh -p PORT NODE@rivetd` attaches to NODE's console (its name or UUID) as one more viewer
//! of the SOL session rivetd already holds — the same fan-out, pen and audit trail as the
//! TCP and WebSocket viewers.
//!
//! Who it is: an SSH key listed for a user in `[auth] users` (`ssh_keys`), or that user's
//! Rivet name and password asked by keyboard-interactive prompts (the SSH user name is the
//! node, so plain "password" authentication could not name the Rivet user). With `--no-auth`
//! anyone is an anonymous admin, as on the API. Admins and operators may type (taking a
//! free pen, as a TCP viewer does); readers watch. Every attach and detach, and every refused
//! log-in, is in the audit trail (who, from where, when; never the keystrokes).
//!
//! The host key is an Ed25519 key kept at `[console] ssh_host_key` (default: `ssh_host_key`
//! beside the captured consoles), made on first start with mode 0600.
//!
//! Each viewer is one task reading the SSH channel and the console's output; leaving is the
//! SSH client's own escape (`~.` in OpenSSH) or the console being disabled.

use super::pen::Typed;
use super::ConsoleHub;
use axum::body::Bytes;
use rivet_model::config::{Role, UserEntry};
use russh::keys::ssh_key::private::Ed25519Keypair;
use russh::keys::{PrivateKey, PublicKey};
use russh::server::{Auth, Msg, Server as _, Session};
use russh::{Channel, ChannelId, ChannelMsg, MethodKind, MethodSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;

/// A notice to one SSH viewer when its keystrokes are refused, at most this often.
const REFUSAL_EVERY: Duration = Duration::from_secs(10);

/// The host key at `path`, made (0600) if there is none yet.
pub fn host_key(path: &Path) -> Result<PrivateKey, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => PrivateKey::from_openssh(text.as_bytes())
            .map_err(|e| format!("SSH host key {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use rand::RngCore;
            let mut seed = [0u8; 32];
            rand::rngs::OsRng.fill_bytes(&mut seed);
            let key = PrivateKey::from(Ed25519Keypair::from_seed(&seed));
            let text = key
                .to_openssh(russh::keys::ssh_key::LineEnding::LF)
                .map_err(|e| format!("encoding a new SSH host key: {e}"))?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("creating {}: {e}", dir.display()))?;
            }
            write_private(path, text.as_bytes())
                .map_err(|e| format!("writing the SSH host key {}: {e}", path.display()))?;
            tracing::info!(path = %path.display(), "made a new SSH host key for the console front door");
            Ok(key)
        }
        Err(e) => Err(format!("reading the SSH host key {}: {e}", path.display())),
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Serve SSH viewers on `listen` until rivetd shuts down (a controller-wide loop: it ends only
/// if the listener cannot be bound, which stops rivetd with the reason).
pub async fn serve(hub: Arc<ConsoleHub>, listen: String) -> rivet_conductor::supervisor::LoopEnd {
    let conductor = hub.conductor.clone();
    let key_path = conductor
        .config
        .console
        .ssh_host_key_path(&conductor.config.db);
    let key = match host_key(&key_path) {
        Ok(k) => k,
        Err(e) => return rivet_conductor::supervisor::LoopEnd::Failed(e),
    };
    let mut methods = MethodSet::empty();
    methods.push(MethodKind::PublicKey);
    methods.push(MethodKind::KeyboardInteractive);
    if conductor.config.no_auth {
        methods.push(MethodKind::None);
    }
    let config = Arc::new(russh::server::Config {
        methods,
        keys: vec![key],
        auth_rejection_time: Duration::from_secs(1),
        // OpenSSH asks "none" first to learn the methods: no need to make it wait.
        auth_rejection_time_initial: Some(Duration::ZERO),
        inactivity_timeout: None,
        keepalive_interval: Some(Duration::from_secs(30)),
        nodelay: true,
        ..Default::default()
    });
    let socket = match tokio::net::TcpListener::bind(&listen).await {
        Ok(s) => s,
        Err(e) => {
            return rivet_conductor::supervisor::LoopEnd::Failed(format!(
                "[console] ssh_listen = {listen:?}: cannot listen: {e}"
            ))
        }
    };
    tracing::info!(listen = %listen, host_key = %key_path.display(), "console SSH front door listening");
    let mut front = FrontDoor { hub };
    let shutdown = conductor.shutdown.clone();
    tokio::select! {
        r = front.run_on_socket(config, &socket) => {
            rivet_conductor::supervisor::LoopEnd::Failed(format!("the console SSH front door stopped: {r:?}"))
        }
        // Shutting down: the viewers' tasks end with their consoles.
        _ = shutdown.cancelled() => rivet_conductor::supervisor::LoopEnd::NotNeeded,
    }
}

/// One handler per connection.
struct FrontDoor {
    hub: Arc<ConsoleHub>,
}

impl russh::server::Server for FrontDoor {
    type Handler = Viewer;
    fn new_client(&mut self, peer: Option<SocketAddr>) -> Viewer {
        Viewer {
            hub: self.hub.clone(),
            peer,
            who: None,
            node: String::new(),
            channel: None,
        }
    }
}

/// Who authenticated on a connection.
#[derive(Clone)]
struct Who {
    name: String,
    role: Role,
}

/// A connection: who it is, and its session channel until the shell starts.
struct Viewer {
    hub: Arc<ConsoleHub>,
    peer: Option<SocketAddr>,
    who: Option<Who>,
    /// The SSH user name: the node asked for.
    node: String,
    channel: Option<Channel<Msg>>,
}

impl Viewer {
    fn users(&self) -> &[UserEntry] {
        &self.hub.conductor.config.auth.users
    }

    fn source(&self) -> Option<String> {
        self.peer.map(|p| p.to_string())
    }

    /// A refused log-in, in the audit trail against the node asked for (when it exists).
    async fn refused(&self, node: &str, who: &str, how: &str) {
        tracing::warn!(node = %node, who = %who, peer = ?self.peer, method = how, "console SSH log-in refused");
        if let Ok(n) = self.hub.conductor.store.get_node(node).await {
            self.hub
                .recorder
                .viewer(
                    &n.uuid,
                    who,
                    self.source(),
                    "refused",
                    format!("SSH log-in refused ({how})"),
                )
                .await;
        }
    }

    fn accept(&mut self, node: &str, name: String, role: Role) -> Auth {
        if role == Role::Metrics {
            return Auth::reject();
        }
        self.who = Some(Who { name, role });
        self.node = node.to_string();
        Auth::Accept
    }
}

impl russh::server::Handler for Viewer {
    type Error = russh::Error;

    async fn auth_none(&mut self, node: &str) -> Result<Auth, Self::Error> {
        if self.hub.conductor.config.no_auth {
            return Ok(self.accept(node, "anonymous (--no-auth)".into(), Role::Admin));
        }
        Ok(Auth::reject())
    }

    async fn auth_publickey_offered(
        &mut self,
        node: &str,
        key: &PublicKey,
    ) -> Result<Auth, Self::Error> {
        // Only keys someone listed go on to prove they are held.
        if key_owner(self.users(), key).is_some() {
            return Ok(Auth::Accept);
        }
        self.refused(node, "unknown SSH key", "publickey").await;
        Ok(Auth::reject())
    }

    async fn auth_publickey(&mut self, node: &str, key: &PublicKey) -> Result<Auth, Self::Error> {
        match key_owner(self.users(), key) {
            Some(u) => {
                let (name, role) = (u.name.clone(), u.role);
                Ok(self.accept(
                    node,
                    format!("{name} (role {}, SSH key)", role.as_str()),
                    role,
                ))
            }
            None => {
                self.refused(node, "unknown SSH key", "publickey").await;
                Ok(Auth::reject())
            }
        }
    }

    async fn auth_keyboard_interactive<'a>(
        &'a mut self,
        node: &str,
        _submethods: &str,
        response: Option<russh::server::Response<'a>>,
    ) -> Result<Auth, Self::Error> {
        let Some(answers) = response else {
            return Ok(Auth::Partial {
                name: "Rivet".into(),
                instructions: format!("The console of node {node}: log in as a Rivet user.").into(),
                prompts: vec![("Rivet user: ".into(), true), ("Password: ".into(), false)].into(),
            });
        };
        let answers: Vec<String> = answers
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .collect();
        let (user, password) = match answers.as_slice() {
            [u, p] => (u.trim().to_string(), p.clone()),
            _ => return Ok(Auth::reject()),
        };
        let found = self
            .users()
            .iter()
            .find(|u| u.name == user)
            .map(|u| (u.hash.clone(), u.role));
        let ok = match found {
            Some((hash, role)) => {
                // argon2 on the blocking pool: a log-in must not stall other connections.
                let pw = password.clone();
                let good = tokio::task::spawn_blocking(move || {
                    rivet_support::credentials::verify_secret(&pw, &hash)
                })
                .await
                .unwrap_or(false);
                good.then_some(role)
            }
            None => None,
        };
        match ok {
            Some(role) => Ok(self.accept(node, format!("{user} (role {})", role.as_str()), role)),
            None => {
                self.refused(node, &user, "keyboard-interactive").await;
                Ok(Auth::reject())
            }
        }
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.channel.is_some() {
            // One console per connection.
            drop(reply);
            return Ok(());
        }
        self.channel = Some(channel);
        reply.accept().await;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn pty_request(
        &mut self,
        channel: ChannelId,
        _term: &str,
        _cols: u32,
        _rows: u32,
        _pix_w: u32,
        _pix_h: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        // The client's terminal goes raw; the BMC's serial line has no size to set.
        session.channel_success(channel)?;
        Ok(())
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let node = self.node.clone();
        let (Some(ch), Some(who)) = (self.channel.take(), self.who.clone()) else {
            session.channel_failure(channel)?;
            return Ok(());
        };
        session.channel_success(channel)?;
        let hub = self.hub.clone();
        let source = self.source();
        // The viewer's own task, tracked with the console's others so shutdown waits for it.
        self.hub
            .conductor
            .tasks
            .spawn(attach(hub, node, who, source, ch));
        Ok(())
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        _command: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        // A command makes no sense here: the console is the shell (`ssh -p PORT NODE@rivetd`).
        session.channel_failure(channel)?;
        Ok(())
    }
}

/// The user whose `ssh_keys` list `key`.
fn key_owner<'a>(users: &'a [UserEntry], key: &PublicKey) -> Option<&'a UserEntry> {
    users.iter().find(|u| {
        u.ssh_keys.iter().any(|line| {
            PublicKey::from_openssh(line.trim()).is_ok_and(|k| k.key_data() == key.key_data())
        })
    })
}

/// Attach `who` to `node`'s console over `ch` until either side leaves.
async fn attach(
    hub: Arc<ConsoleHub>,
    node: String,
    who: Who,
    source: Option<String>,
    mut ch: Channel<Msg>,
) {
    let found = hub.conductor.store.get_node(&node).await;
    let session = match &found {
        Ok(n) => hub.session(&n.uuid),
        Err(_) => None,
    };
    let Some(session) = session else {
        let why = match found {
            Ok(n) => format!(
                "rivet: console access is not enabled on node {} ({}): `baremetal node console enable {}`\r\n",
                n.ident(),
                n.uuid,
                n.ident()
            ),
            Err(_) => format!("rivet: no node {node:?} (log in as NODE@rivetd, NODE its name or UUID)\r\n"),
        };
        let _ = ch.data(why.as_bytes()).await;
        let _ = ch.exit_status(1).await;
        let _ = ch.eof().await;
        let _ = ch.close().await;
        return;
    };
    let can_write = matches!(who.role, Role::Admin | Role::Operator);
    let mut attached = session
        .attach_recorded(
            &who.name,
            source.clone(),
            format!("SSH{}", if can_write { "" } else { ", read-only" }),
        )
        .await;
    let id = attached.id;
    let banner = format!(
        "[rivet: console of node {node} as {}{}; the pen: {}; leave with ~. ]\r\n",
        who.name,
        if can_write { "" } else { ", read-only" },
        session.holder().unwrap_or_else(|| "free".into())
    );
    let _ = ch.data(banner.as_bytes()).await;
    let mut last_refusal: Option<tokio::time::Instant> = None;
    let why = loop {
        tokio::select! {
            _ = session.cancel.cancelled() => break "console disabled",
            out = attached.output.recv() => match out {
                Ok(b) => {
                    if ch.data(&b[..]).await.is_err() { break "viewer gone"; }
                }
                Err(RecvError::Lagged(n)) => {
                    let msg = format!("\r\n[rivet: this viewer fell behind; {n} chunks skipped — the log has them]\r\n");
                    if ch.data(msg.as_bytes()).await.is_err() { break "viewer gone"; }
                }
                Err(RecvError::Closed) => break "console disabled",
            },
            msg = ch.wait() => match msg {
                Some(ChannelMsg::Data { data }) => {
                    let t = session.typed(id, &who.name, can_write, Bytes::copy_from_slice(&data));
                    let refusal = match t {
                        Typed::HeldBy(holder) => Some(format!("read-only: {holder} is typing")),
                        Typed::ReadOnly => Some("read-only: your role may only watch".to_string()),
                        Typed::Forward(_) => None,
                    };
                    if let Some(r) = refusal {
                        let now = tokio::time::Instant::now();
                        if last_refusal.is_none_or(|at| now.duration_since(at) >= REFUSAL_EVERY) {
                            last_refusal = Some(now);
                            let msg = format!("\r\n[rivet: {r}]\r\n");
                            if ch.data(msg.as_bytes()).await.is_err() { break "viewer gone"; }
                        }
                    }
                }
                Some(ChannelMsg::Eof) | Some(ChannelMsg::Close) | None => break "viewer left",
                Some(_) => {}
            },
        }
    };
    session.release(id);
    let _ = ch.eof().await;
    let _ = ch.close().await;
    session
        .recorder
        .viewer(
            &session.node_uuid,
            &who.name,
            source,
            "detach",
            format!("SSH: {why}"),
        )
        .await;
}

//! Rescue and unrescue with the `agent` rescue interface.
//!
//! `rescue`: the rescue password is hashed (SHA-512 crypt) when the verb is accepted and only
//! the hash is kept (`instance_info.hashed_rescue_password`, masked in API output); the node's
//! boot interface boots the ramdisk (`rescuing` → `rescue wait`), and once the agent has looked
//! up, `finalize_rescue` hands it the hash, which it writes for the `rescue` user of the
//! ramdisk. Its result moves the node to `rescue`. The instance's network is left as it is:
//! Rivet's network interface is `noop`, so there is no rescuing network to switch to.
//!
//! `unrescue`: power off, put the ramdisk's medium away, boot the instance from its disk again,
//! `active`.
//!
//! The `fake` rescue interface (fake-hardware) does nothing and says so by its name, as in
//! Ironic; it is handled in the conductor's dispatcher.

use super::{Conductor, ConductorError};
use rivet_drivers::{Bmc, BootDevice};
use rivet_model::fsm::Event;
use rivet_model::node::Node;
use rivet_model::runs::RescueRun;
use rivet_protocol::agent::{Command, CommandKind, CommandStatus};
use rivet_protocol::states::{PowerState, ProvisionState};
use serde_json::Value;
use sha2::{Digest, Sha512};

/// `instance_info` key of the rescue password's hash (Ironic's name; masked on output).
pub(crate) const HASH_KEY: &str = "hashed_rescue_password";

/// crypt(3)'s base-64 alphabet.
const CRYPT_B64: &[u8] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// glibc's default SHA-512 crypt rounds (no `rounds=` in the string).
const ROUNDS: usize = 5000;

fn repeat_to(digest: &[u8], len: usize) -> Vec<u8> {
    digest.iter().copied().cycle().take(len).collect()
}

/// SHA-512 crypt (`$6$salt$…`, glibc's algorithm, 5000 rounds) of `password` with `salt`
/// (at most 16 characters of crypt's alphabet are used).
pub(crate) fn sha512_crypt(password: &[u8], salt: &str) -> String {
    let salt: String = salt.chars().take(16).collect();
    let s = salt.as_bytes();
    let p = password;
    let b = Sha512::new()
        .chain_update(p)
        .chain_update(s)
        .chain_update(p)
        .finalize();
    let mut a = Sha512::new().chain_update(p).chain_update(s);
    let mut n = p.len();
    while n > 64 {
        a.update(b);
        n -= 64;
    }
    a.update(&b[..n]);
    let mut n = p.len();
    while n > 0 {
        if n & 1 == 1 {
            a.update(b);
        } else {
            a.update(p);
        }
        n >>= 1;
    }
    let a = a.finalize();
    let mut dp = Sha512::new();
    for _ in 0..p.len() {
        dp.update(p);
    }
    let p_seq = repeat_to(&dp.finalize(), p.len());
    let mut ds = Sha512::new();
    for _ in 0..(16 + usize::from(a[0])) {
        ds.update(s);
    }
    let s_seq = repeat_to(&ds.finalize(), s.len());
    let mut c = a.to_vec();
    for i in 0..ROUNDS {
        let mut h = Sha512::new();
        if i % 2 == 1 {
            h.update(&p_seq);
        } else {
            h.update(&c);
        }
        if i % 3 != 0 {
            h.update(&s_seq);
        }
        if i % 7 != 0 {
            h.update(&p_seq);
        }
        if i % 2 == 1 {
            h.update(&c);
        } else {
            h.update(&p_seq);
        }
        c = h.finalize().to_vec();
    }
    let mut out = format!("$6${salt}$");
    let mut push = |b2: u8, b1: u8, b0: u8, n: usize| {
        let mut w = (u32::from(b2) << 16) | (u32::from(b1) << 8) | u32::from(b0);
        for _ in 0..n {
            out.push(char::from(CRYPT_B64[(w & 0x3f) as usize]));
            w >>= 6;
        }
    };
    for i in 0..21 {
        let (x, y, z) = (i, (i + 21) % 63, (i + 42) % 63);
        // glibc's order: (0,21,42), (22,43,1), (44,2,23), then the pattern repeats.
        let (b2, b1, b0) = match i % 3 {
            0 => (x, y, z),
            1 => (y, z, x),
            _ => (z, x, y),
        };
        push(c[b2], c[b1], c[b0], 4);
    }
    push(0, 0, c[63], 2);
    out
}

/// The SHA-512 crypt of `password` with a fresh random 16-character salt.
pub(crate) fn hash_password(password: &str) -> String {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    let salt: String = (0..16)
        .map(|_| char::from(CRYPT_B64[rng.gen_range(0..CRYPT_B64.len())]))
        .collect();
    sha512_crypt(password.as_bytes(), &salt)
}

/// Forget a rescue run's bookkeeping (a new `rescue` starts over).
pub(crate) fn clear_run(node: &mut Node) {
    node.runs.rescue = None;
}

/// Forget the rescue password's hash (unrescue, abort, tear-down).
pub(crate) fn forget_password(node: &mut Node) {
    node.instance_info.remove(HASH_KEY);
    node.instance_info.remove("rescue_password");
}

impl Conductor {
    /// One decision of a rescue (`rescuing` / `rescue wait`) with the agent rescue interface.
    pub(crate) async fn advance_rescue(
        &self,
        mut node: Node,
        bmc: &dyn Bmc,
    ) -> Result<Option<Node>, ConductorError> {
        let uuid = node.uuid.clone();
        let Some(hash) = node
            .instance_info
            .get(HASH_KEY)
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            let msg = format!(
                "rescue of node {} failed: no rescue password hash is stored; send `rescue` with a rescue_password again",
                node.ident()
            );
            return self.fail(node, &msg).await.map(Some);
        };
        let booted = node.runs.rescue.as_ref().is_some_and(|r| r.ramdisk_booted);
        if !booted {
            if node.provision_state != ProvisionState::Rescuing {
                // A wait with nothing booted (a lost write): boot from rescuing.
                return self.event(node, Event::Resume, None).await.map(Some);
            }
            if let Err(e) = self.boot_ramdisk(&mut node, bmc).await {
                let msg = format!(
                    "failed to boot the rescue ramdisk on node {}: {e}",
                    node.ident()
                );
                return self.fail(node, &msg).await.map(Some);
            }
            node.runs.rescue = Some(RescueRun {
                ramdisk_booted: true,
                command: None,
            });
            tracing::info!(node = %uuid, "rescue ramdisk booting; waiting for the agent");
            return self.event(node, Event::Wait, None).await.map(Some);
        }
        if node.provision_state == ProvisionState::Rescuing {
            return self.event(node, Event::Wait, None).await.map(Some);
        }
        if !super::cleaning::has_agent(&node) {
            return Ok(None);
        }
        let kind = CommandKind::FinalizeRescue {
            rescue_password_hash: hash,
        };
        let Some(id) = node.runs.rescue.as_ref().and_then(|r| r.command.clone()) else {
            // Written before it is queued: a crash in between re-queues the same id.
            let id = uuid::Uuid::new_v4().to_string();
            node.runs
                .rescue
                .get_or_insert_with(RescueRun::default)
                .command = Some(id.clone());
            let node = self.update_node(&node).await?;
            self.queue(&uuid, Command { id, kind }).await?;
            return Ok(Some(node));
        };
        let Some(result) = self.ensure_queued(&uuid, &id, kind).await? else {
            return Ok(None);
        };
        if result.status != CommandStatus::Succeeded {
            let msg = format!(
                "the agent on node {} could not set the rescue password: {}",
                node.ident(),
                result.error.unwrap_or_else(|| "no reason given".into())
            );
            return self.fail(node, &msg).await.map(Some);
        }
        clear_run(&mut node);
        // The hash has done its work: it is not kept while the node sits in rescue.
        forget_password(&mut node);
        tracing::info!(node = %uuid, "rescue login set by the agent; node in rescue");
        let node = self.event(node, Event::Resume, None).await?;
        self.event(node, Event::Done, None).await.map(Some)
    }

    /// `unrescuing` with the agent rescue interface: power off, put the ramdisk away, boot
    /// the instance from its disk, `active`.
    pub(crate) async fn advance_unrescue(
        &self,
        mut node: Node,
        bmc: &dyn Bmc,
    ) -> Result<Node, ConductorError> {
        let uuid = node.uuid.clone();
        let booted = async {
            // disable_power_off (1.95): no power off; boot_action reboots into the instance.
            self.power_off_unless_kept_on(&node, bmc).await?;
            self.clean_up_ramdisk(&node, bmc).await?;
            let mode = self.override_mode(&node).await;
            bmc.set_boot_device_persistent(&uuid, &node.driver_info, BootDevice::Disk, mode)
                .await?;
            let action = super::power_policy::boot_action(&node);
            bmc.set_power(&uuid, &node.driver_info, action).await
        }
        .await;
        super::agent::forget_agent_token(&mut node);
        let _ = self.store.cancel_pending(&uuid).await;
        match booted {
            Ok(()) => {
                node.power_state = Some(PowerState::On);
                clear_run(&mut node);
                forget_password(&mut node);
                tracing::info!(node = %uuid, "instance booted again; rescue over");
                self.event(node, Event::Done, None).await
            }
            Err(e) => {
                let msg = format!(
                    "unrescue of node {} failed: could not boot the instance again: {e}; fix the BMC and send `unrescue` again",
                    node.ident()
                );
                self.fail(node, &msg).await
            }
        }
    }

    /// After `abort` in `rescue wait`: the ramdisk's medium is put away (best effort).
    pub(crate) async fn clean_up_after_rescue_abort(&self, node: &Node) {
        let Ok(bmc) = self.bmc(node) else { return };
        self.clean_up_ramdisk_logged(node, bmc.as_ref()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_glibc_sha512_crypt() {
        // `openssl passwd -6 -salt abcdefgh secret`
        assert_eq!(
            sha512_crypt(b"secret", "abcdefgh"),
            "$6$abcdefgh$ltjgWl6579NluT/Vi1nwEvcil.G5Nbc4NiXZaNGStk8PSwGfQv72N2CKPPrVACtLtip/cZ/1GM/O6IND4WQhG."
        );
    }

    #[test]
    fn random_salt_and_no_plaintext() {
        let a = hash_password("hunter2");
        let b = hash_password("hunter2");
        assert_ne!(a, b);
        assert!(a.starts_with("$6$") && !a.contains("hunter2"));
        let salt = a.split('$').nth(2).unwrap_or_default();
        assert_eq!(sha512_crypt(b"hunter2", salt), a);
    }
}

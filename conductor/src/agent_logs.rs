//! Keeping the agent's log of a failed step with its node (store/node_logs.rs): the failure
//! message names where the log is (`agent log: /v1/nodes/<uuid>/logs/<id>`) instead of
//! carrying it, so `last_error` and the node history stay short and point at the whole text.
//!
//! The agent never holds BMC credentials or logs its token, but its log does name URLs it
//! fetched (image sources), which may carry credentials in their user info or signed query
//! strings; those are masked before the text is stored or shown.

use rivet_model::node::Node;
use rivet_store::{NodeLog, Store};
use serde_json::Value;

const MASK: &str = "***";

/// Add the failed command's log to `msg`: stored with `node` and referenced by path; when it
/// cannot be stored, appended inline as before (the operator still sees it).
pub(super) async fn attach(
    store: &dyn Store,
    msg: &mut String,
    node: &Node,
    operation: &str,
    step: &str,
    command_id: &str,
    tail: Option<String>,
) {
    let Some(tail) = tail.filter(|t| !t.trim().is_empty()) else {
        return;
    };
    let text = scrub(tail.trim_end(), node);
    let log = NodeLog {
        id: 0,
        node_uuid: node.uuid.clone(),
        created_at: chrono::Utc::now(),
        operation: operation.to_string(),
        step: Some(step.to_string()),
        command_id: Some(command_id.to_string()),
        text: text.clone(),
    };
    match store.add_node_log(&log).await {
        Ok(stored) => {
            tracing::info!(node = %node.uuid, step, command = command_id, log_id = stored.id,
                "kept the agent log of the failed step");
            msg.push_str(&format!(
                "; agent log: /v1/nodes/{}/logs/{}",
                node.uuid, stored.id
            ));
        }
        Err(e) => {
            tracing::warn!(node = %node.uuid, step, error = %e, "could not keep the agent log of the failed step");
            msg.push_str("\nagent log (tail):\n");
            msg.push_str(&text);
        }
    }
}

/// Whether a key names a secret (`ipmi_password`, `redfish_password`, `auth_token`…).
fn secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "token",
        "sig",
        "signature",
        "credential",
        "key",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// `text` with URL user info, secret-looking query values and the node's secret
/// `driver_info` values masked.
pub(crate) fn scrub(text: &str, node: &Node) -> String {
    let mut out = mask_urls(text);
    for (k, v) in &node.driver_info {
        if let Value::String(s) = v {
            if secret_key(k) && s.len() >= 4 {
                out = out.replace(s.as_str(), MASK);
            }
        }
    }
    out
}

fn mask_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        let end = after
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | ')'))
            .unwrap_or(after.len());
        out.push_str(&mask_url(&after[..end]));
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// One URL without its scheme: `user:pass@host/p?sig=x` → `***@host/p?sig=***`.
fn mask_url(url: &str) -> String {
    let authority_end = url.find(['/', '?', '#']).unwrap_or(url.len());
    let (authority, path) = url.split_at(authority_end);
    let mut out = match authority.rfind('@') {
        Some(i) => format!("{MASK}@{}", &authority[i + 1..]),
        None => authority.to_string(),
    };
    match path.split_once('?') {
        None => out.push_str(path),
        Some((p, query)) => {
            out.push_str(p);
            out.push('?');
            let masked: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if secret_key(k) => format!("{k}={MASK}"),
                    _ => pair.to_string(),
                })
                .collect();
            out.push_str(&masked.join("&"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn masks_credentials_in_urls_and_driver_info() {
        let mut node = Node::new("u-1".into(), "ipmi".into());
        node.driver_info
            .insert("ipmi_password".into(), json!("hunter22"));
        node.driver_info
            .insert("ipmi_username".into(), json!("admin"));
        let text = "download failed url=https://bob:pw@img.example/a.qcow2?temp_url_sig=abc&temp_url_expires=9 \
                    error=x\nretry http://img.example/b?x=1\nlogin hunter22 as admin";
        let got = scrub(text, &node);
        assert_eq!(
            got,
            "download failed url=https://***@img.example/a.qcow2?temp_url_sig=***&temp_url_expires=9 \
             error=x\nretry http://img.example/b?x=1\nlogin *** as admin"
        );
    }
}

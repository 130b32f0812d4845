//! `/boot`: what a network-booting machine fetches. No credentials (a PXE-booting machine has
//! none), so these endpoints give out only the public ramdisk and, for a machine that is
//! enrolled, the script that boots it; an unknown node or MAC is a plain 404 that says
//! nothing more.
//!
//! - `GET /boot/{file}`: `vmlinuz`, `rivet.initramfs` or `rivet.iso` from `[boot]
//!   artefact_dir`, streamed from disk (nothing else in that directory is reachable).
//! - `GET /boot/iso/{node}.iso`: the virtual-media ISO for a node that expects a ramdisk:
//!   `rivet.iso` with its parameter region rewritten to `rivet.controller=<public_url>
//!   rivet.node=<uuid>` (see [`rivet_support::bootiso`]). The BMC downloads it; nothing in it is
//!   secret (the agent's token comes from its first lookup, not from the ISO).
//! - `GET /boot/ipxe/{node}` and `GET /boot/ipxe?mac=aa:bb:…`: an iPXE script chaining the
//!   kernel and the initramfs with `rivet.controller=<public_url> rivet.node=<uuid>` when the
//!   node expects a ramdisk (cleaning, inspection, deployment, rescue), else a script that
//!   `exit`s so the firmware boots the next device (its disk). With `[discovery] enabled`, a
//!   MAC no node has gets the ramdisk without `rivet.node` (its lookup finds nothing, so the
//!   agent sends its inventory to discovery), as Ironic's inspector serves unknown machines.

use super::{file_body, ApiError, AppState};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::StreamExt;
use rivet_conductor::agent::LOOKUP_ALLOWED;
use rivet_model::node::Node;
use rivet_store::{normalize_mac, StoreError};

/// The only files `GET /boot/{file}` serves (image-build's output names).
pub const ARTEFACTS: &[&str] = &["vmlinuz", "rivet.initramfs", "rivet.iso"];

/// Bytes read from disk per body chunk.
const CHUNK: usize = 256 * 1024;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/boot/ipxe", get(ipxe_by_mac))
        .route("/boot/ipxe/{node}", get(ipxe_for_node))
        .route("/boot/iso/{file}", get(node_iso))
        .route("/boot/{file}", get(artefact))
}

fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no boot resource here")
}

async fn artefact(
    State(state): State<AppState>,
    Path(file): Path<String>,
) -> Result<Response, ApiError> {
    if !ARTEFACTS.contains(&file.as_str()) {
        return Err(not_found());
    }
    let Some(dir) = state.conductor.config.boot.artefact_dir.clone() else {
        return Err(not_found());
    };
    let path = dir.join(&file);
    let opened = tokio::task::spawn_blocking(move || {
        let f = std::fs::File::open(&path)?;
        let len = f.metadata()?.len();
        Ok::<_, std::io::Error>((f, len))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let (f, len) = match opened {
        Ok(x) => x,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found()),
        Err(e) => {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot read boot artefact {file}: {e}"),
            ))
        }
    };
    tracing::info!(file = %file, bytes = len, "serving boot artefact");
    Ok(file_body::octet_stream(
        Body::from_stream(file_body::stream(f, len, CHUNK, ())),
        len,
    ))
}

async fn node_iso(
    State(state): State<AppState>,
    Path(file): Path<String>,
) -> Result<Response, ApiError> {
    let ident = file.strip_suffix(".iso").ok_or_else(not_found)?;
    let node = known(state.conductor.store.get_node(ident).await)?;
    if !LOOKUP_ALLOWED.contains(&node.provision_state) {
        tracing::info!(node = %node.uuid, state = %node.provision_state, "virtual-media ISO asked for a node that expects no ramdisk");
        return Err(not_found());
    }
    let boot = state.conductor.config.boot.clone();
    let uuid = node.uuid.clone();
    let opened = tokio::task::spawn_blocking(move || {
        let dir = boot
            .artefact_dir
            .as_deref()
            .ok_or(rivet_support::bootiso::BootIsoError::NoArtefacts)?;
        let public = boot
            .public_url
            .as_deref()
            .ok_or(rivet_support::bootiso::BootIsoError::NoUrl)?;
        let region = rivet_support::bootiso::node_region(public, &uuid)?;
        let path = dir.join(rivet_support::bootiso::ISO);
        let (len, regions) = rivet_support::bootiso::regions(&path)?;
        let f = std::fs::File::open(&path)
            .map_err(|source| rivet_support::bootiso::BootIsoError::Read { path, source })?;
        Ok::<_, rivet_support::bootiso::BootIsoError>((f, len, regions, region))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let (f, len, regions, region) = opened.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "cannot serve the virtual-media ISO of node {}: {e}",
                node.uuid
            ),
        )
    })?;
    tracing::info!(node = %node.uuid, bytes = len, "serving the node's virtual-media ISO");
    let region = Bytes::from(region.into_bytes());
    let mut at = 0u64;
    let body = file_body::stream(f, len, CHUNK, ()).map(move |chunk| {
        chunk.map(|c| {
            let (from, to) = (at, at + c.len() as u64);
            at = to;
            // Only the chunk or two holding grub.cfg is copied.
            let width = region.len() as u64;
            if !regions.iter().any(|&r| r < to && r + width > from) {
                return c;
            }
            let mut c = c.to_vec();
            for &r in &regions {
                rivet_protocol::bootparams::patch_chunk(&mut c, from, r, &region);
            }
            Bytes::from(c)
        })
    });
    Ok(file_body::octet_stream(Body::from_stream(body), len))
}

#[derive(serde::Deserialize)]
struct MacQuery {
    mac: Option<String>,
}

async fn ipxe_by_mac(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<MacQuery>,
) -> Result<Response, ApiError> {
    let mac = q
        .mac
        .as_deref()
        .and_then(|m| normalize_mac(&m.replace('-', ":")))
        .ok_or_else(not_found)?;
    let Some(uuid) = state
        .conductor
        .store
        .node_by_macs(std::slice::from_ref(&mac))
        .await?
    else {
        if state.conductor.config.discovery.enabled {
            tracing::info!(%mac, "iPXE: unknown MAC, serving the ramdisk for discovery");
            return Ok(text_response(ipxe_script(
                &public_base(&state, &headers),
                &state.conductor.config.boot.kernel_append,
                "",
            )));
        }
        return Err(not_found());
    };
    let node = known(state.conductor.store.get_node(&uuid).await)?;
    Ok(script_response(&state, &headers, &node))
}

async fn ipxe_for_node(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(ident): Path<String>,
) -> Result<Response, ApiError> {
    let node = known(state.conductor.store.get_node(&ident).await)?;
    Ok(script_response(&state, &headers, &node))
}

fn known(r: Result<Node, StoreError>) -> Result<Node, ApiError> {
    match r {
        Ok(n) => Ok(n),
        Err(StoreError::NotFound { .. }) => Err(not_found()),
        Err(e) => Err(e.into()),
    }
}

/// The URL the machine reaches this controller at: `[boot] public_url`, else the Host header.
fn public_base(state: &AppState, headers: &HeaderMap) -> String {
    match &state.conductor.config.boot.public_url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => format!(
            "http://{}",
            headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("127.0.0.1:6385")
        ),
    }
}

fn script_response(state: &AppState, headers: &HeaderMap, node: &Node) -> Response {
    let boot = &state.conductor.config.boot;
    let base = public_base(state, headers);
    let body = if LOOKUP_ALLOWED.contains(&node.provision_state) {
        tracing::info!(node = %node.uuid, state = %node.provision_state, "serving iPXE ramdisk script");
        ipxe_script(&base, &boot.kernel_append, &node.uuid)
    } else {
        tracing::info!(node = %node.uuid, state = %node.provision_state, "iPXE: no ramdisk expected, sending the machine to its next boot device");
        "#!ipxe\necho Rivet: no ramdisk is expected for this machine now; booting the next device\nexit\n"
            .to_string()
    };
    text_response(body)
}

fn text_response(body: String) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// The per-node script: absolute URLs under `base`, the node's UUID for lookup (none for
/// discovery: `node` empty), and the boot interface's MAC as `BOOTIF` (`netX` is the device
/// iPXE booted through).
pub fn ipxe_script(base: &str, append: &str, node: &str) -> String {
    let append = append.trim();
    let sep = if append.is_empty() { "" } else { " " };
    let (node_arg, what) = if node.is_empty() {
        (
            String::new(),
            "discovery (no node has this MAC)".to_string(),
        )
    } else {
        (format!(" rivet.node={node}"), format!("node {node}"))
    };
    format!(
        "#!ipxe\n\
         # Rivet ramdisk for {what}\n\
         kernel {base}/boot/vmlinuz initrd=rivet.initramfs BOOTIF=01-${{netX/mac:hexhyp}}{sep}{append} rivet.controller={base}{node_arg}\n\
         initrd --name rivet.initramfs {base}/boot/rivet.initramfs\n\
         boot\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_chains_kernel_and_initramfs() {
        let s = ipxe_script("http://10.0.0.1:6385", "console=ttyS0", "n-1");
        assert!(s.starts_with("#!ipxe\n"));
        assert!(s.contains(
            "kernel http://10.0.0.1:6385/boot/vmlinuz initrd=rivet.initramfs BOOTIF=01-${netX/mac:hexhyp} console=ttyS0 rivet.controller=http://10.0.0.1:6385 rivet.node=n-1\n"
        ));
        assert!(
            s.contains("initrd --name rivet.initramfs http://10.0.0.1:6385/boot/rivet.initramfs\n")
        );
        assert!(s.ends_with("boot\n"));
        let s = ipxe_script("http://h", "", "n");
        assert!(s.contains("hexhyp} rivet.controller=http://h rivet.node=n\n"));
        let s = ipxe_script("http://h", "", "");
        assert!(s.contains("hexhyp} rivet.controller=http://h\n"), "{s}");
    }
}

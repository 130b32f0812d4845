//! The OpenAPI 3.1 document of every route rivetd serves (`docs/openapi.json`,
//! `rivetd openapi`, `GET /v1/openapi.json`).
//!
//! [`OPERATIONS`] is the one list the document is made from: one row per (method, path) the
//! router in `api/mod.rs` answers, with its summary, the microversion that adds it, who may
//! call it and its body shapes. axum cannot enumerate its routes from outside, so the tie to
//! the router is a test, not a macro: `tests/openapi.rs` walks the real router (built by
//! `server::build`) and fails when a route or method is missing here, or listed here but not
//! served; it also probes every path on a live rivetd and checks the committed file equals
//! [`json`]. Add a `.route(...)` without a row here and CI says which row to add.
//!
//! Wire types of the agent protocol and the error body get schemas derived from their Rust
//! definitions (`utoipa::ToSchema` in rivet-protocol). Ironic's resource documents (nodes,
//! ports, …) are built as JSON maps whose fields depend on the negotiated microversion; they
//! are described as an open `IronicResource` object that points at Ironic's API reference
//! rather than a field list that would be wrong at most versions.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use rivet_model::microversions as mv;
use rivet_protocol::api::MIN_VERSION;
use rivet_protocol::states::{PowerState, Verb};
use serde_json::{json, Map, Value};
use std::sync::OnceLock;
use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{
    AdditionalProperties, ComponentsBuilder, ObjectBuilder, Schema, Type,
};
use utoipa::openapi::security::{
    ApiKey, ApiKeyValue, Http, HttpAuthScheme, HttpBuilder, SecurityScheme,
};
use utoipa::openapi::{
    ContentBuilder, InfoBuilder, OpenApiBuilder, PathItem, Paths, Ref, RefOr, Required,
    ResponseBuilder, SecurityRequirement, Tag,
};
use utoipa::ToSchema;

/// Who may call an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No credentials (version discovery, the boot network, the ramdisk's first contact).
    Public,
    /// An `[auth]` credential (bearer token, `X-Auth-Token` or basic); the role decides.
    Admin,
    /// The node's agent token from its lookup (`Authorization: Bearer`).
    AgentToken,
    /// A deploying node's image download token (Basic: node UUID and token).
    ImageToken,
}

/// The request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// None.
    Empty,
    /// An Ironic-shaped JSON object (a resource to create, an action's arguments).
    Object,
    /// An RFC 6902 JSON Patch.
    Patch,
    /// A named schema in `components.schemas`.
    Schema(&'static str),
}

/// The successful answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// A JSON document with this status (an `IronicResource` or a collection).
    Json(u16),
    /// A JSON document with either status (vendor passthru: 200 for a synchronous method,
    /// 202 for an asynchronous one).
    JsonOr(u16, u16),
    /// A named schema with this status.
    Schema(u16, &'static str),
    /// No body.
    Empty(u16),
    /// Non-JSON content: status and media type.
    Content(u16, &'static str),
    /// The route exists only to answer an error, as Ironic does: the status.
    Refused(u16),
}

/// One operation: a method on a path template.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    /// Upper-case HTTP method.
    pub method: &'static str,
    /// axum path template (`{param}`, which OpenAPI spells the same way).
    pub path: &'static str,
    /// The microversion that adds it (`/v1` only); `None` outside the microversioned API.
    pub since: Option<(u32, u32)>,
    /// Who may call it.
    pub access: Access,
    /// One line.
    pub summary: &'static str,
    /// The request body.
    pub body: Body,
    /// The successful answer.
    pub reply: Reply,
}

use Access::{Admin, AgentToken, ImageToken, Public};
use Body::{Empty as NoBody, Object, Patch};
use Reply::{Content, Json, Refused};

const fn op(
    method: &'static str,
    path: &'static str,
    since: (u32, u32),
    access: Access,
    summary: &'static str,
    body: Body,
    reply: Reply,
) -> Op {
    Op {
        method,
        path,
        since: Some(since),
        access,
        summary,
        body,
        reply,
    }
}

const fn unversioned(
    method: &'static str,
    path: &'static str,
    access: Access,
    summary: &'static str,
    body: Body,
    reply: Reply,
) -> Op {
    Op {
        method,
        path,
        since: None,
        access,
        summary,
        body,
        reply,
    }
}

/// Ironic's list/show/create/update/delete on `$base` and `$base/{$id}` (with the
/// trailing-slash spelling clients send), from microversion `$since`.
macro_rules! crud {
    ($base:literal, $item:literal, $since:expr, $what:literal, $whats:literal) => {
        [
            op(
                "GET",
                $base,
                $since,
                Admin,
                concat!("List ", $whats),
                NoBody,
                Json(200),
            ),
            op(
                "POST",
                $base,
                $since,
                Admin,
                concat!("Create one ", $what),
                Object,
                Json(201),
            ),
            op(
                "GET",
                concat!($base, "/"),
                $since,
                Admin,
                concat!("List ", $whats, " (trailing slash)"),
                NoBody,
                Json(200),
            ),
            op(
                "POST",
                concat!($base, "/"),
                $since,
                Admin,
                concat!("Create one ", $what, " (trailing slash)"),
                Object,
                Json(201),
            ),
            op(
                "GET",
                $item,
                $since,
                Admin,
                concat!("Show one ", $what),
                NoBody,
                Json(200),
            ),
            op(
                "PATCH",
                $item,
                $since,
                Admin,
                concat!("Update one ", $what),
                Patch,
                Json(200),
            ),
            op(
                "DELETE",
                $item,
                $since,
                Admin,
                concat!("Delete one ", $what),
                NoBody,
                Reply::Empty(204),
            ),
        ]
    };
}

/// The methods a vendor passthru route accepts (the router serves any method there).
pub const PASSTHRU_METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

macro_rules! passthru {
    ($path:literal, $what:literal) => {
        [
            op("GET", $path, mv::BASE, Admin, $what, NoBody, Json(200)),
            op(
                "POST",
                $path,
                mv::BASE,
                Admin,
                $what,
                Object,
                Reply::JsonOr(200, 202),
            ),
            op(
                "PUT",
                $path,
                mv::BASE,
                Admin,
                $what,
                Object,
                Reply::JsonOr(200, 202),
            ),
            op(
                "PATCH",
                $path,
                mv::BASE,
                Admin,
                $what,
                Object,
                Reply::JsonOr(200, 202),
            ),
            op(
                "DELETE",
                $path,
                mv::BASE,
                Admin,
                $what,
                NoBody,
                Reply::JsonOr(200, 202),
            ),
        ]
    };
}

const IPA: &str = "Not served: ironic-python-agent's ramdisk API. Always 404 with a message that says to boot Rivet's ramdisk, which speaks /agent/v1";

/// Every operation the router serves (tests/openapi.rs keeps this equal to the router).
#[rustfmt::skip]
pub static OPERATIONS: &[&[Op]] = &[
    // Version discovery and the document itself: open, as Ironic's root is.
    &[
        unversioned("GET", "/", Public, "API root: the versions this server speaks", NoBody, Json(200)),
        op("GET", "/v1", mv::BASE, Public, "The v1 API: links to its resources and the microversion range", NoBody, Json(200)),
        op("GET", "/v1/", mv::BASE, Public, "The v1 API (trailing slash)", NoBody, Json(200)),
        op("GET", "/v1/openapi.json", mv::BASE, Public, "This OpenAPI document", NoBody, Reply::Content(200, "application/json")),
        unversioned("GET", "/metrics", Admin, "Prometheus metrics (text exposition; the metrics role may read it)", NoBody, Content(200, "text/plain")),
    ],
    // Nodes.
    &[
        op("GET", "/v1/nodes", mv::BASE, Admin, "List nodes", NoBody, Json(200)),
        op("POST", "/v1/nodes", mv::BASE, Admin, "Create a node", Object, Json(201)),
        op("GET", "/v1/nodes/", mv::BASE, Admin, "List nodes (trailing slash)", NoBody, Json(200)),
        op("POST", "/v1/nodes/", mv::BASE, Admin, "Create a node (trailing slash)", Object, Json(201)),
        op("GET", "/v1/nodes/detail", mv::BASE, Admin, "List nodes with every field", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}", mv::BASE, Admin, "Show a node (UUID or name)", NoBody, Json(200)),
        op("PATCH", "/v1/nodes/{ident}", mv::BASE, Admin, "Update a node", Patch, Json(200)),
        op("DELETE", "/v1/nodes/{ident}", mv::BASE, Admin, "Delete a node", NoBody, Reply::Empty(204)),
        op("GET", "/v1/nodes/{ident}/states", mv::BASE, Admin, "A node's power and provision states", NoBody, Json(200)),
        op("PUT", "/v1/nodes/{ident}/states/provision", mv::BASE, Admin, "Change the provision state (a verb: manage, provide, active, deleted, clean, …)", Body::Schema("ProvisionRequest"), Reply::Empty(202)),
        op("DELETE", "/v1/nodes/{ident}/provision", mv::BASE, Admin, "Rivet: abort the running provision task (202, 403 when its step may not be interrupted, 404 when none runs)", NoBody, Reply::Empty(202)),
        op("PUT", "/v1/nodes/{ident}/states/power", mv::BASE, Admin, "Change the power state", Body::Schema("PowerRequest"), Reply::Empty(202)),
        op("PUT", "/v1/nodes/{ident}/maintenance", mv::BASE, Admin, "Put a node in maintenance", Object, Reply::Empty(202)),
        op("DELETE", "/v1/nodes/{ident}/maintenance", mv::BASE, Admin, "Take a node out of maintenance", NoBody, Reply::Empty(202)),
        op("GET", "/v1/nodes/{ident}/ports", mv::BASE, Admin, "List a node's ports", NoBody, Json(200)),
        op("POST", "/v1/nodes/{ident}/ports", mv::BASE, Admin, "Refused: create ports with POST /v1/ports", Object, Refused(400)),
        op("GET", "/v1/nodes/{ident}/ports/detail", mv::BASE, Admin, "List a node's ports with every field", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/inventory", mv::NODE_INVENTORY, Admin, "A node's hardware inventory from its last inspection", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/clean_steps", mv::BASE, Admin, "Rivet: a node's cached clean steps (merged, with where each comes from) as of its last cleaning", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/history", mv::NODE_HISTORY, Admin, "A node's event history", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/history/{event}", mv::NODE_HISTORY, Admin, "One history event", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/logs", mv::BASE, Admin, "Rivet: agent logs kept when a step failed on the ramdisk (admin and operator only)", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/logs/{id}", mv::BASE, Admin, "Rivet: one kept agent log", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/allocation", mv::ALLOCATIONS, Admin, "A node's allocation", NoBody, Json(200)),
        op("DELETE", "/v1/nodes/{ident}/allocation", mv::ALLOCATIONS, Admin, "Delete a node's allocation", NoBody, Reply::Empty(204)),
        op("GET", "/v1/nodes/{ident}/portgroups", mv::PORTGROUP_SUBRESOURCES, Admin, "List a node's port groups", NoBody, Json(200)),
        op("POST", "/v1/nodes/{ident}/portgroups", mv::PORTGROUP_SUBRESOURCES, Admin, "Refused: create port groups with POST /v1/portgroups", Object, Refused(400)),
        op("GET", "/v1/nodes/{ident}/portgroups/detail", mv::PORTGROUP_SUBRESOURCES, Admin, "List a node's port groups with every field", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/volume", mv::VOLUME, Admin, "A node's volume resources: links", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/volume/connectors", mv::VOLUME, Admin, "List a node's volume connectors", NoBody, Json(200)),
        op("POST", "/v1/nodes/{ident}/volume/connectors", mv::VOLUME, Admin, "Refused: create connectors with POST /v1/volume/connectors", Object, Refused(400)),
        op("GET", "/v1/nodes/{ident}/volume/targets", mv::VOLUME, Admin, "List a node's volume targets", NoBody, Json(200)),
        op("POST", "/v1/nodes/{ident}/volume/targets", mv::VOLUME, Admin, "Refused: create targets with POST /v1/volume/targets", Object, Refused(400)),
    ],
    // Node actions.
    &[
        op("GET", "/v1/nodes/{ident}/traits", mv::TRAITS, Admin, "List a node's traits", NoBody, Json(200)),
        op("PUT", "/v1/nodes/{ident}/traits", mv::TRAITS, Admin, "Replace a node's traits", Object, Reply::Empty(204)),
        op("DELETE", "/v1/nodes/{ident}/traits", mv::TRAITS, Admin, "Remove every trait of a node", NoBody, Reply::Empty(204)),
        op("PUT", "/v1/nodes/{ident}/traits/{trait}", mv::TRAITS, Admin, "Add one trait", NoBody, Reply::Empty(204)),
        op("DELETE", "/v1/nodes/{ident}/traits/{trait}", mv::TRAITS, Admin, "Remove one trait", NoBody, Reply::Empty(204)),
        op("GET", "/v1/nodes/{ident}/validate", mv::BASE, Admin, "Validate a node's interfaces", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/management/boot_device", mv::BASE, Admin, "The next boot device", NoBody, Json(200)),
        op("PUT", "/v1/nodes/{ident}/management/boot_device", mv::BASE, Admin, "Set the next boot device", Object, Reply::Empty(204)),
        op("GET", "/v1/nodes/{ident}/management/boot_device/supported", mv::BASE, Admin, "Boot devices the node supports", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/vmedia", mv::VMEDIA_GET, Admin, "Attached virtual media", NoBody, Json(200)),
        op("POST", "/v1/nodes/{ident}/vmedia", mv::VMEDIA, Admin, "Attach virtual media", Object, Reply::Empty(204)),
        op("DELETE", "/v1/nodes/{ident}/vmedia", mv::VMEDIA, Admin, "Detach all virtual media", NoBody, Reply::Empty(204)),
        op("DELETE", "/v1/nodes/{ident}/vmedia/{device_type}", mv::VMEDIA, Admin, "Detach virtual media of one device type", NoBody, Reply::Empty(204)),
        op("GET", "/v1/nodes/{ident}/vifs", mv::VIFS, Admin, "List attached VIFs", NoBody, Json(200)),
        op("POST", "/v1/nodes/{ident}/vifs", mv::VIFS, Admin, "Attach a VIF", Object, Reply::Empty(204)),
        op("DELETE", "/v1/nodes/{ident}/vifs/{vif}", mv::VIFS, Admin, "Detach a VIF", NoBody, Reply::Empty(204)),
        op("GET", "/v1/nodes/{ident}/bios", mv::BIOS, Admin, "List BIOS settings", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/bios/{setting}", mv::BIOS, Admin, "Show one BIOS setting", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/firmware", mv::FIRMWARE, Admin, "List firmware components", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/children", mv::CHILDREN, Admin, "List child nodes", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/management/indicators", mv::INDICATORS, Admin, "List indicators", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/management/indicators/{indicator}", mv::INDICATORS, Admin, "Show an indicator's state", NoBody, Json(200)),
        op("PUT", "/v1/nodes/{ident}/management/indicators/{indicator}", mv::INDICATORS, Admin, "Set an indicator's state", Object, Reply::Empty(204)),
        op("PUT", "/v1/nodes/{ident}/management/inject_nmi", mv::INJECT_NMI, Admin, "Inject a non-maskable interrupt", Object, Reply::Empty(204)),
        op("PUT", "/v1/nodes/{ident}/states/boot_mode", mv::BOOT_MODE_CHANGE, Admin, "Change the boot mode", Object, Reply::Empty(202)),
        op("PUT", "/v1/nodes/{ident}/states/secure_boot", mv::BOOT_MODE_CHANGE, Admin, "Turn secure boot on or off", Object, Reply::Empty(202)),
        op("PUT", "/v1/nodes/{ident}/states/raid", mv::RAID, Admin, "Set the target RAID configuration", Object, Reply::Empty(204)),
        op("GET", "/v1/nodes/{ident}/states/console", mv::BASE, Admin, "Console state and connection", NoBody, Json(200)),
        op("PUT", "/v1/nodes/{ident}/states/console", mv::BASE, Admin, "Enable or disable the console", Object, Reply::Empty(202)),
        op("GET", "/v1/nodes/states/console/{ident}", mv::BASE, Admin, "Console state and connection (the path Ironic's router also answers)", NoBody, Json(200)),
        op("GET", "/v1/nodes/{ident}/console/ws", mv::BASE, Admin, "Rivet: the node's live serial console over a WebSocket (credentials, or ?ticket=); binary frames are console bytes, text frames JSON events and commands (docs/console.md)", NoBody, Reply::Empty(101)),
        op("POST", "/v1/nodes/{ident}/console/ticket", mv::BASE, Admin, "Rivet: a single-use ticket (30 s) for the console WebSocket, for browsers (readers may ask)", NoBody, Json(201)),
        op("GET", "/v1/nodes/{ident}/console/log", mv::BASE, Admin, "Rivet: the node's captured console, newest last (?tail=BYTES)", NoBody, Content(200, "text/plain")),
        op("GET", "/v1/nodes/{ident}/vendor_passthru/methods", mv::BASE, Admin, "A node's vendor passthru methods", NoBody, Json(200)),
    ],
    &passthru!("/v1/nodes/{ident}/vendor_passthru", "Call a node vendor passthru method (named by ?method=)"),
    &passthru!("/v1/nodes/{ident}/vendor_passthru/{method}", "Call a named node vendor passthru method"),
    &passthru!("/v1/drivers/{name}/vendor_passthru", "Call a driver vendor passthru method (named by ?method=)"),
    &passthru!("/v1/drivers/{name}/vendor_passthru/{method}", "Call a named driver vendor passthru method"),
    // Ports and port groups.
    &[
        op("GET", "/v1/ports/detail", mv::BASE, Admin, "List ports with every field", NoBody, Json(200)),
        op("GET", "/v1/portgroups/detail", mv::PORTGROUPS, Admin, "List port groups with every field", NoBody, Json(200)),
        op("GET", "/v1/portgroups/{ident}/ports", mv::PORTGROUP_SUBRESOURCES, Admin, "List a port group's ports", NoBody, Json(200)),
        op("POST", "/v1/portgroups/{ident}/ports", mv::PORTGROUP_SUBRESOURCES, Admin, "Refused: create ports with POST /v1/ports", Object, Refused(400)),
        op("GET", "/v1/portgroups/{ident}/ports/detail", mv::PORTGROUP_SUBRESOURCES, Admin, "List a port group's ports with every field", NoBody, Json(200)),
    ],
    &crud!("/v1/ports", "/v1/ports/{ident}", mv::BASE, "port", "ports"),
    &crud!("/v1/portgroups", "/v1/portgroups/{ident}", mv::PORTGROUPS, "port group", "port groups"),
    // Chassis.
    &crud!("/v1/chassis", "/v1/chassis/{uuid}", mv::BASE, "chassis", "chassis"),
    &[
        op("GET", "/v1/chassis/detail", mv::BASE, Admin, "List chassis with every field", NoBody, Json(200)),
        op("GET", "/v1/chassis/{uuid}/nodes", mv::BASE, Admin, "List a chassis' nodes", NoBody, Json(200)),
        op("DELETE", "/v1/chassis/{uuid}/nodes", mv::BASE, Admin, "Refused: nodes are deleted through /v1/nodes", NoBody, Refused(400)),
        op("GET", "/v1/chassis/{uuid}/nodes/detail", mv::BASE, Admin, "List a chassis' nodes with every field", NoBody, Json(200)),
    ],
    // Inspection rules.
    &crud!("/v1/inspection_rules", "/v1/inspection_rules/{uuid}", mv::INSPECTION_RULES, "inspection rule", "inspection rules"),
    &[
        op("DELETE", "/v1/inspection_rules", mv::INSPECTION_RULES, Admin, "Delete every inspection rule", NoBody, Reply::Empty(204)),
        op("DELETE", "/v1/inspection_rules/", mv::INSPECTION_RULES, Admin, "Delete every inspection rule (trailing slash)", NoBody, Reply::Empty(204)),
    ],
    // Conductors, drivers, shards.
    &[
        op("GET", "/v1/conductors", mv::CONDUCTORS, Admin, "List conductors", NoBody, Json(200)),
        op("GET", "/v1/conductors/{hostname}", mv::CONDUCTORS, Admin, "Show a conductor", NoBody, Json(200)),
        op("GET", "/v1/drivers", mv::BASE, Admin, "List drivers", NoBody, Json(200)),
        op("GET", "/v1/drivers/", mv::BASE, Admin, "List drivers (trailing slash)", NoBody, Json(200)),
        op("GET", "/v1/drivers/{name}", mv::BASE, Admin, "Show a driver", NoBody, Json(200)),
        op("GET", "/v1/drivers/{name}/properties", mv::BASE, Admin, "A driver's driver_info properties", NoBody, Json(200)),
        op("GET", "/v1/drivers/{name}/raid/logical_disk_properties", mv::RAID, Admin, "A driver's RAID logical disk properties", NoBody, Json(200)),
        op("GET", "/v1/drivers/{name}/vendor_passthru/methods", mv::BASE, Admin, "A driver's vendor passthru methods", NoBody, Json(200)),
        op("GET", "/v1/shards", mv::SHARDS, Admin, "List shards and their node counts", NoBody, Json(200)),
        op("GET", "/v1/shards/{name}", mv::SHARDS, Admin, "Show a shard", NoBody, Json(200)),
    ],
    // Audit, events.
    &[
        op("GET", "/v1/audit", mv::BASE, Admin, "Rivet: the audit trail of state-changing requests and refused reads (admin only)", NoBody, Json(200)),
        op("POST", "/v1/events", mv::EVENTS, Admin, "Post external network events", Object, Reply::Empty(204)),
    ],
    // Allocations, deploy templates, runbooks.
    &crud!("/v1/allocations", "/v1/allocations/{ident}", mv::ALLOCATIONS, "allocation", "allocations"),
    &crud!("/v1/deploy_templates", "/v1/deploy_templates/{ident}", mv::DEPLOY_TEMPLATES, "deploy template", "deploy templates"),
    &crud!("/v1/runbooks", "/v1/runbooks/{ident}", mv::RUNBOOKS, "runbook", "runbooks"),
    &[
        op("GET", "/v1/runbooks/{ident}/traits", mv::RUNBOOK_TRAITS, Admin, "List a runbook's traits", NoBody, Json(200)),
        op("PUT", "/v1/runbooks/{ident}/traits", mv::RUNBOOK_TRAITS, Admin, "Replace a runbook's traits", Object, Reply::Empty(204)),
        op("DELETE", "/v1/runbooks/{ident}/traits", mv::RUNBOOK_TRAITS, Admin, "Remove every trait of a runbook", NoBody, Reply::Empty(204)),
        op("PUT", "/v1/runbooks/{ident}/traits/{name}", mv::RUNBOOK_TRAITS, Admin, "Add one trait to a runbook", NoBody, Reply::Empty(204)),
        op("DELETE", "/v1/runbooks/{ident}/traits/{name}", mv::RUNBOOK_TRAITS, Admin, "Remove one trait of a runbook", NoBody, Reply::Empty(204)),
    ],
    // Volume.
    &[
        op("GET", "/v1/volume", mv::VOLUME, Admin, "Volume resources: links", NoBody, Json(200)),
        op("GET", "/v1/volume/", mv::VOLUME, Admin, "Volume resources: links (trailing slash)", NoBody, Json(200)),
    ],
    &crud!("/v1/volume/connectors", "/v1/volume/connectors/{uuid}", mv::VOLUME, "volume connector", "volume connectors"),
    &crud!("/v1/volume/targets", "/v1/volume/targets/{uuid}", mv::VOLUME, "volume target", "volume targets"),
    // The agent protocol (Rivet's ramdisk; no microversions).
    &[
        unversioned("POST", "/agent/v1/lookup", Public, "Find the node of this machine; the first lookup of a ramdisk boot returns its agent token", Body::Schema("LookupRequest"), Reply::Schema(200, "LookupResponse")),
        unversioned("POST", "/agent/v1/heartbeat/{node}", AgentToken, "Report progress and results; held open (long poll) until a command is ready", Body::Schema("HeartbeatRequest"), Reply::Schema(200, "HeartbeatResponse")),
        unversioned("POST", "/agent/v1/discover", Public, "Discovery: enrol a node for an unknown machine (201) or name the node that has one of its MACs (200); [discovery] enabled only", Body::Schema("DiscoverRequest"), Reply::Schema(201, "DiscoverResponse")),
    ],
    // The image cache (image_download_source = "local").
    &[
        op("GET", "/v1/image_cache", mv::BASE, Admin, "Rivet: the cached images (content address, origin, size, use, the nodes reading them) and hit, miss, revalidation and eviction counts (admin only)", NoBody, Json(200)),
        op("DELETE", "/v1/image_cache", mv::BASE, Admin, "Rivet: remove every cached image no running deploy reads (admin only)", NoBody, Json(200)),
        unversioned("GET", "/image-cache/{name}", ImageToken, "A cached image for the agent of a deploying node (Basic auth: the node's UUID and the download token in its write_image command's URL); Range requests resume", NoBody, Content(200, "application/octet-stream")),
    ],
    // ironic-python-agent's ramdisk endpoints: present only to answer a helpful 404.
    &[
        op("GET", "/v1/lookup", mv::BASE, Public, IPA, NoBody, Refused(404)),
        op("POST", "/v1/heartbeat/{node}", mv::BASE, Public, IPA, Object, Refused(404)),
        op("POST", "/v1/continue_inspection", mv::BASE, Public, IPA, Object, Refused(404)),
    ],
    // Network boot (iPXE scripts and boot artefacts for the machines being provisioned).
    &[
        unversioned("GET", "/boot/ipxe", Public, "iPXE script for the node with the port ?mac= (the ramdisk when it expects one, else exit to the disk)", NoBody, Content(200, "text/plain")),
        unversioned("GET", "/boot/ipxe/{node}", Public, "iPXE script for a node", NoBody, Content(200, "text/plain")),
        unversioned("GET", "/boot/iso/{file}", Public, "The virtual-media ISO of a node that expects a ramdisk ({file} is NODE.iso)", NoBody, Content(200, "application/octet-stream")),
        unversioned("GET", "/boot/{file}", Public, "A boot artefact: vmlinuz, rivet.initramfs or rivet.iso", NoBody, Content(200, "application/octet-stream")),
    ],
];

/// Every operation, flattened.
pub fn operations() -> impl Iterator<Item = &'static Op> {
    OPERATIONS.iter().flat_map(|group| group.iter())
}

fn fmt_version((major, minor): (u32, u32)) -> String {
    format!("{major}.{minor}")
}

fn method(m: &str) -> Option<HttpMethod> {
    Some(match m {
        "GET" => HttpMethod::Get,
        "POST" => HttpMethod::Post,
        "PUT" => HttpMethod::Put,
        "PATCH" => HttpMethod::Patch,
        "DELETE" => HttpMethod::Delete,
        _ => return None,
    })
}

/// The tag of a path: its first segment after the API prefix.
fn tag(path: &str) -> &'static str {
    let rest = path
        .strip_prefix("/v1/")
        .or_else(|| path.strip_prefix("/agent/v1/").map(|_| "agent"))
        .or_else(|| path.strip_prefix("/v1").map(|_| ""))
        .or_else(|| path.strip_prefix('/'))
        .unwrap_or("");
    let first = rest.split('/').next().unwrap_or("");
    match first {
        "" | "openapi.json" => "version",
        "agent" => "agent",
        "boot" => "boot",
        "metrics" => "metrics",
        "lookup" | "heartbeat" | "continue_inspection" => "ironic-python-agent",
        "nodes" => "nodes",
        "ports" => "ports",
        "portgroups" => "portgroups",
        "chassis" => "chassis",
        "inspection_rules" => "inspection_rules",
        "conductors" => "conductors",
        "drivers" => "drivers",
        "shards" => "shards",
        "audit" => "audit",
        "events" => "events",
        "allocations" => "allocations",
        "deploy_templates" => "deploy_templates",
        "runbooks" => "runbooks",
        "volume" => "volume",
        "image_cache" | "image-cache" => "image_cache",
        _ => "other",
    }
}

fn schema_ref(name: &str) -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(name))
}

fn json_content(name: &str) -> utoipa::openapi::Content {
    ContentBuilder::new().schema(Some(schema_ref(name))).build()
}

fn error_response(what: &str) -> utoipa::openapi::Response {
    ResponseBuilder::new()
        .description(what)
        .content("application/json", json_content("ErrorBody"))
        .build()
}

fn status_text(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        _ => "Answer",
    }
}

fn operation(o: &Op) -> utoipa::openapi::path::Operation {
    let mut b = OperationBuilder::new()
        .summary(Some(o.summary))
        .tag(tag(o.path))
        .operation_id(Some(operation_id(o)));
    let mut description = String::new();
    if let Some(since) = o.since {
        b = b.extensions(Some(
            ExtensionsBuilder::new()
                .add("x-openstack-min-version", fmt_version(since))
                .build(),
        ));
        if since > MIN_VERSION {
            description.push_str(&format!(
                "Needs microversion {} or later (header X-OpenStack-Ironic-API-Version); an older one is refused as Ironic refuses it (404, or 406 for some actions).",
                fmt_version(since)
            ));
        }
    }
    for name in params(o.path) {
        b = b.parameter(
            ParameterBuilder::new()
                .name(name)
                .parameter_in(ParameterIn::Path)
                .required(Required::True)
                .schema(Some(ObjectBuilder::new().schema_type(Type::String))),
        );
    }
    let body = match o.body {
        NoBody => None,
        Object => Some(("application/json", schema_ref("IronicRequest"))),
        Patch => Some(("application/json-patch+json", schema_ref("JsonPatch"))),
        Body::Schema(name) => Some(("application/json", schema_ref(name))),
    };
    if let Some((media, schema)) = body {
        // Ironic's clients send JSON Patch as application/json; both are read.
        let mut rb = RequestBodyBuilder::new().required(Some(Required::True));
        rb = rb.content(
            "application/json",
            ContentBuilder::new().schema(Some(schema.clone())).build(),
        );
        if media != "application/json" {
            rb = rb.content(media, ContentBuilder::new().schema(Some(schema)).build());
        }
        b = b.request_body(Some(rb.build()));
    }
    b = match o.reply {
        Json(code) => b.response(
            code.to_string(),
            ResponseBuilder::new()
                .description(status_text(code))
                .content("application/json", json_content("IronicResource"))
                .build(),
        ),
        Reply::JsonOr(sync, not_sync) => [sync, not_sync].into_iter().fold(b, |b, code| {
            b.response(
                code.to_string(),
                ResponseBuilder::new()
                    .description(status_text(code))
                    .content("application/json", json_content("IronicResource"))
                    .build(),
            )
        }),
        Reply::Schema(code, name) => b.response(
            code.to_string(),
            ResponseBuilder::new()
                .description(status_text(code))
                .content("application/json", json_content(name))
                .build(),
        ),
        Reply::Empty(code) => b.response(
            code.to_string(),
            ResponseBuilder::new()
                .description(status_text(code))
                .build(),
        ),
        Content(code, media) => b.response(
            code.to_string(),
            ResponseBuilder::new()
                .description(status_text(code))
                .content(
                    media,
                    ContentBuilder::new()
                        .schema(Some(ObjectBuilder::new().schema_type(
                            if media == "application/json" {
                                Type::Object
                            } else {
                                Type::String
                            },
                        )))
                        .build(),
                )
                .build(),
        ),
        Refused(code) => b.response(
            code.to_string(),
            error_response("Always: this route exists only to answer this error"),
        ),
    };
    if !matches!(o.reply, Refused(_)) {
        b = b
            .response("default", RefOr::Ref(Ref::from_response_name("Error")))
            .description(if description.is_empty() {
                None
            } else {
                Some(description)
            });
    }
    b = match o.access {
        Public => b.securities(Some(Vec::<SecurityRequirement>::new())),
        Admin => b.securities(Some([
            SecurityRequirement::new("bearer", Vec::<String>::new()),
            SecurityRequirement::new("authToken", Vec::<String>::new()),
            SecurityRequirement::new("basic", Vec::<String>::new()),
        ])),
        AgentToken => b.security(SecurityRequirement::new("agentToken", Vec::<String>::new())),
        ImageToken => b.security(SecurityRequirement::new("imageToken", Vec::<String>::new())),
    };
    b.build()
}

/// `get_v1_nodes_ident_states`: unique per (method, path), stable across runs.
fn operation_id(o: &Op) -> String {
    let mut id = o.method.to_ascii_lowercase();
    for seg in o.path.split('/').filter(|s| !s.is_empty()) {
        id.push('_');
        id.extend(seg.chars().filter(|c| *c != '{' && *c != '}').map(|c| {
            if c.is_ascii_alphanumeric() {
                c
            } else {
                '_'
            }
        }));
    }
    if o.path.ends_with('/') && o.path.len() > 1 {
        id.push_str("_slash");
    }
    id
}

/// The `{param}` names of a path template, in order.
pub fn params(path: &str) -> impl Iterator<Item = &str> {
    path.split('/')
        .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
}

fn add_schema<T: ToSchema>(out: &mut Vec<(String, RefOr<Schema>)>) {
    out.push((T::name().into_owned(), T::schema()));
    T::schemas(out);
}

fn enum_of(values: impl IntoIterator<Item = &'static str>, description: &str) -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values))
        .description(Some(description))
        .into()
}

fn components() -> utoipa::openapi::Components {
    let mut schemas = Vec::new();
    use rivet_protocol::agent as a;
    add_schema::<a::LookupRequest>(&mut schemas);
    add_schema::<a::LookupResponse>(&mut schemas);
    add_schema::<a::HeartbeatRequest>(&mut schemas);
    add_schema::<a::HeartbeatResponse>(&mut schemas);
    add_schema::<rivet_protocol::discovery::DiscoverRequest>(&mut schemas);
    add_schema::<rivet_protocol::discovery::DiscoverResponse>(&mut schemas);
    add_schema::<rivet_protocol::api::ErrorBody>(&mut schemas);
    add_schema::<rivet_protocol::api::PatchOp>(&mut schemas);
    let json_patch: Schema = utoipa::openapi::schema::ArrayBuilder::new()
        .items(schema_ref("PatchOp"))
        .description(Some(
            "RFC 6902 JSON Patch (add, replace, remove) on the resource's document",
        ))
        .into();
    let resource: Schema = ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(
            "An Ironic-shaped JSON document: a resource (node, port, …), a collection ({\"<resources>\": [...], \"next\": url}) or an action's answer. Its fields follow Ironic's API reference at the negotiated microversion (fields a version does not have are hidden), so they are not listed here.",
        ))
        .into();
    let request: Schema = ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(
            "An Ironic-shaped JSON request body (a resource to create, an action's arguments); fields as in Ironic's API reference. Unknown fields are refused with 400.",
        ))
        .into();
    let provision: Schema = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("target", enum_of(Verb::ALL.iter().map(|v| v.as_str()), "The verb"))
        .required("target")
        .property("clean_steps", ObjectBuilder::new().schema_type(Type::Array).description(Some("Steps for manual cleaning (clean only)")))
        .property("configdrive", ObjectBuilder::new().description(Some("Config drive: gzip+base64 ISO, its URL, or (1.56+) an object of meta_data, user_data, network_data, vendor_data")))
        .property("deploy_steps", ObjectBuilder::new().schema_type(Type::Array).description(Some("Extra deploy steps (1.69+)")))
        .property("rescue_password", ObjectBuilder::new().schema_type(Type::String).description(Some("rescue only; never stored in clear")))
        .property("disable_ramdisk", ObjectBuilder::new().schema_type(Type::Boolean))
        .property("service_steps", ObjectBuilder::new().schema_type(Type::Array).description(Some("Steps for servicing (service only, 1.87+)")))
        .property("runbook", ObjectBuilder::new().schema_type(Type::String).description(Some("Runbook UUID or name (1.92+)")))
        .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        .into();
    let power: Schema = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property(
            "target",
            enum_of(
                PowerState::ALL.iter().map(|v| v.as_str()),
                "The power state to reach",
            ),
        )
        .required("target")
        .property(
            "timeout",
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .description(Some("Seconds, for soft actions")),
        )
        .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        .into();
    schemas.push(("JsonPatch".into(), json_patch.into()));
    schemas.push(("IronicResource".into(), resource.into()));
    schemas.push(("IronicRequest".into(), request.into()));
    schemas.push(("ProvisionRequest".into(), provision.into()));
    schemas.push(("PowerRequest".into(), power.into()));
    ComponentsBuilder::new()
        .schemas_from_iter(schemas)
        .response(
            "Error",
            error_response(
                "Ironic's error body: the message names the resource, its state and what to do",
            ),
        )
        .security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        )
        .security_scheme(
            "authToken",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-Auth-Token",
                "Keystone's header, carrying the same [auth] tokens as Bearer",
            ))),
        )
        .security_scheme(
            "basic",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Basic)),
        )
        .security_scheme(
            "agentToken",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The node's agent token, handed out by the first lookup of a ramdisk boot",
                    ))
                    .build(),
            ),
        )
        .security_scheme(
            "imageToken",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Basic)
                    .description(Some(
                        "A deploying node's UUID and image download token, as the URL of its write_image command carries them",
                    ))
                    .build(),
            ),
        )
        .build()
}

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut paths = Paths::new();
    for o in operations() {
        let Some(m) = method(o.method) else {
            continue;
        };
        let item = PathItem::new(m, operation(o));
        match paths.paths.get_mut(o.path) {
            Some(existing) => existing.merge_operations(item),
            None => {
                paths.paths.insert(o.path.to_string(), item);
            }
        }
    }
    let mut tags: Vec<&str> = operations().map(|o| tag(o.path)).collect();
    tags.sort_unstable();
    tags.dedup();
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("Rivet API")
                .version(env!("CARGO_PKG_VERSION"))
                // The newest microversion is left out on purpose (GET /v1 reports it): the
                // file would go stale with every version bump that adds no route.
                .description(Some(format!(
                    "rivetd: OpenStack Ironic's bare-metal API under /v1 (microversions from {} up to the maximum GET /v1 reports, header X-OpenStack-Ironic-API-Version; x-openstack-min-version on each operation is the version that adds it), Rivet's ramdisk agent protocol under /agent/v1, network boot under /boot, and /metrics. Generated from controller/src/api/openapi.rs; tests/openapi.rs keeps it equal to the router. List operations take Ironic's query parameters (fields, limit, marker, sort_key, sort_dir, detail and the resource's filters), which are not listed per operation.",
                    fmt_version(MIN_VERSION),
                ))),
        )
        .paths(paths)
        .components(Some(components()))
        .tags(Some(tags.into_iter().map(Tag::new)))
        .build()
}

/// Object keys sorted at every level, so the text is the same on every run whatever map
/// the models use inside.
fn sorted(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(String, Value)> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            let mut out = Map::new();
            for (k, v) in entries {
                out.insert(k, sorted(v));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// The document as pretty JSON with a final newline: `docs/openapi.json`.
pub fn json() -> String {
    let value = serde_json::to_value(document()).unwrap_or_else(
        |e| json!({"error": format!("cannot serialise the OpenAPI document: {e}")}),
    );
    let mut text = serde_json::to_string_pretty(&sorted(value)).unwrap_or_default();
    text.push('\n');
    text
}

/// `GET /v1/openapi.json`: open, like the version root.
pub async fn serve() -> Response {
    static TEXT: OnceLock<String> = OnceLock::new();
    let text: &'static str = TEXT.get_or_init(json);
    let mut resp = axum::body::Bytes::from_static(text.as_bytes()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn rows_are_unique_and_well_formed() {
        let mut seen = BTreeSet::new();
        let mut ids = BTreeSet::new();
        for o in operations() {
            assert!(
                method(o.method).is_some(),
                "{} {}: unknown method",
                o.method,
                o.path
            );
            assert!(
                seen.insert((o.method, o.path)),
                "{} {} twice",
                o.method,
                o.path
            );
            assert!(
                ids.insert(operation_id(o)),
                "{} {}: operation id clash",
                o.method,
                o.path
            );
            if let Some(since) = o.since {
                assert!(
                    (MIN_VERSION..=rivet_protocol::api::MAX_VERSION).contains(&since),
                    "{} {}: {since:?} outside the served range",
                    o.method,
                    o.path
                );
            }
        }
    }

    #[test]
    fn document_is_stable_and_lists_every_row() {
        let text = json();
        assert_eq!(text, json(), "two runs gave different text");
        let doc: Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(doc["openapi"], "3.1.0");
        for o in operations() {
            let op = &doc["paths"][o.path][o.method.to_ascii_lowercase()];
            assert!(op.is_object(), "{} {} missing", o.method, o.path);
            let want = o.since.map(|v| Value::String(fmt_version(v)));
            assert_eq!(op.get("x-openstack-min-version").cloned(), want);
        }
    }
}

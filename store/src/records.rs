//! Records of the store that its query modules share: allocations and step templates
//! (their listing requests and sort keys too) and the aggregate node counts. They are plain
//! data; the SQL that reads and writes them is in `allocations`, `counts` and `queries`,
//! which all import from here (never the other way round). Re-exported
//! where they always were (`rivet_store::Allocation`, `rivet_store::allocations::…`,
//! `rivet_store::counts::NodeCount`).

use super::SortDir;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

/// An allocation: a request for a node of a resource class (and traits).
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// UUID.
    pub uuid: String,
    /// Unique name.
    pub name: Option<String>,
    /// The node it holds, once allocated (or backfilled).
    pub node_uuid: Option<String>,
    /// `allocating`, `active` or `error`.
    pub state: String,
    /// Why it failed.
    pub last_error: Option<String>,
    /// Requested resource class.
    pub resource_class: Option<String>,
    /// Node UUIDs the allocation may pick from (empty: any).
    pub candidate_nodes: Vec<String>,
    /// Traits the node must have.
    pub traits: Vec<String>,
    /// Operator data.
    pub extra: Map<String, Value>,
    /// Owning project (1.60).
    pub owner: Option<String>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last write.
    pub updated_at: Option<DateTime<Utc>>,
    /// Version (optimistic writes).
    pub version: i64,
}

/// Allocation states (Ironic's names).
pub mod alloc_state {
    /// Waiting for the conductor to pick a node.
    pub const ALLOCATING: &str = "allocating";
    /// Holding a node.
    pub const ACTIVE: &str = "active";
    /// No node could be picked (`last_error` says why).
    pub const ERROR: &str = "error";
}

/// Columns an allocation listing may sort by.
pub const ALLOCATION_SORT_KEYS: &[&str] = &[
    "id",
    "uuid",
    "name",
    "node_uuid",
    "state",
    "resource_class",
    "owner",
    "last_error",
    "created_at",
    "updated_at",
];

/// An allocation listing request.
#[derive(Debug, Clone)]
pub struct AllocationQuery {
    /// Page size (0: the default page).
    pub limit: usize,
    /// UUID of the last allocation of the previous page.
    pub marker: Option<String>,
    /// One of [`ALLOCATION_SORT_KEYS`].
    pub sort_key: String,
    /// Direction.
    pub sort_dir: SortDir,
    /// Filter.
    pub node_uuid: Option<String>,
    /// Filter.
    pub resource_class: Option<String>,
    /// Filter.
    pub state: Option<String>,
    /// Filter.
    pub owner: Option<String>,
}

impl Default for AllocationQuery {
    fn default() -> Self {
        AllocationQuery {
            limit: 1000,
            marker: None,
            sort_key: "id".into(),
            sort_dir: SortDir::Asc,
            node_uuid: None,
            resource_class: None,
            state: None,
            owner: None,
        }
    }
}

/// What a step template is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateKind {
    /// A deploy template (steps merged into deployments of nodes asking for its trait).
    Deploy,
    /// A runbook (steps run by manual cleaning or servicing).
    Runbook,
}

impl TemplateKind {
    /// Stored and shown name.
    pub fn as_str(self) -> &'static str {
        match self {
            TemplateKind::Deploy => "deploy_template",
            TemplateKind::Runbook => "runbook",
        }
    }
}

/// A deploy template or runbook.
#[derive(Debug, Clone, PartialEq)]
pub struct StepTemplate {
    /// Which.
    pub kind: TemplateKind,
    /// UUID.
    pub uuid: String,
    /// Unique name (per kind).
    pub name: String,
    /// Free text.
    pub description: Option<String>,
    /// Traits of a runbook (1.112): a node with one of them may run it.
    pub traits: Vec<String>,
    /// Its steps (`interface`, `step`, `args`, `priority`/`order`).
    pub steps: Vec<Value>,
    /// Operator data.
    pub extra: Map<String, Value>,
    /// Owning project (runbooks).
    pub owner: Option<String>,
    /// Visible to every project (runbooks).
    pub public: bool,
    /// Run without booting the ramdisk (runbooks).
    pub disable_ramdisk: bool,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last write.
    pub updated_at: Option<DateTime<Utc>>,
    /// Version.
    pub version: i64,
}

/// Columns a template listing may sort by.
pub const TEMPLATE_SORT_KEYS: &[&str] =
    &["id", "uuid", "name", "owner", "created_at", "updated_at"];

/// A template listing request.
#[derive(Debug, Clone)]
pub struct TemplateQuery {
    /// Which templates.
    pub kind: TemplateKind,
    /// Page size (0: the default page).
    pub limit: usize,
    /// UUID of the last one of the previous page.
    pub marker: Option<String>,
    /// One of [`TEMPLATE_SORT_KEYS`].
    pub sort_key: String,
    /// Direction.
    pub sort_dir: SortDir,
    /// Filter: only these names.
    pub names: Option<Vec<String>>,
    /// Filter (runbooks).
    pub owner: Option<String>,
    /// Filter (runbooks).
    pub public: Option<bool>,
}

impl TemplateQuery {
    /// Every template of `kind`, oldest first.
    pub fn all(kind: TemplateKind) -> TemplateQuery {
        TemplateQuery {
            kind,
            limit: 1000,
            marker: None,
            sort_key: "id".into(),
            sort_dir: SortDir::Asc,
            names: None,
            owner: None,
            public: None,
        }
    }
}

/// Nodes sharing one combination of the state columns.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeCount {
    /// Provision state as stored (`available`, `clean wait`…).
    pub provision_state: String,
    /// Power state as stored; `None` before the first power read.
    pub power_state: Option<String>,
    /// Maintenance flag.
    pub maintenance: bool,
    /// The controller holding these nodes' leases, if any.
    pub reservation: Option<String>,
    /// How many nodes.
    pub count: i64,
    /// The oldest `provision_updated_at` among them: how long the longest-waiting node has
    /// been in its state.
    pub oldest_change: Option<DateTime<Utc>>,
}

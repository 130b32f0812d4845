//! Ironic API microversions: the one table of what each route, resource and provision verb
//! needs. Pure data: the API's route gates and OpenAPI rows, its resources and the
//! conductor's verb check all read these constants, so a version is written once.
//!
//! Each constant is `(major, minor)`, named after the feature; [`TABLE`] lists them all by
//! name (in the order below), for documents and tests. The names follow Ironic's
//! `MINOR_N_…` constants where it has one. Field-level gates (a field newer than its
//! resource) stay in each resource's own field table, next to the document they gate.

/// A microversion, `(major, minor)`.
pub type Microversion = (u32, u32);

macro_rules! microversions {
    ($($(#[$doc:meta])* $name:ident = $v:expr;)*) => {
        $($(#[$doc])* pub const $name: Microversion = $v;)*
        /// Every feature with its microversion, by constant name.
        pub const TABLE: &[(&str, Microversion)] = &[$((stringify!($name), $name)),*];
    };
}

microversions! {
    /// The v1 API as first versioned: nodes, ports, chassis, drivers.
    BASE = (1, 1);
    /// The `manage` and `provide` verbs (`MINOR_4_MANAGEABLE_STATE`).
    VERB_MANAGE_PROVIDE = (1, 4);
    /// The `inspect` verb.
    VERB_INSPECT = (1, 6);
    /// `?fields=` on listings and shows (`MINOR_8_FETCHING_SUBSET_OF_FIELDS`).
    FIELDS = (1, 8);
    /// RAID: a node's target configuration, a driver's logical disk properties.
    RAID = (1, 12);
    /// The `abort` verb.
    VERB_ABORT = (1, 13);
    /// Manual cleaning: the `clean` verb.
    VERB_CLEAN = (1, 15);
    /// The `adopt` verb.
    VERB_ADOPT = (1, 17);
    /// Port groups (`/v1/portgroups`).
    PORTGROUPS = (1, 23);
    /// Port group sub-resources and filters (`MINOR_24_PORTGROUPS_SUBCONTROLLERS`).
    PORTGROUP_SUBRESOURCES = (1, 24);
    /// A node's VIFs (`/v1/nodes/{node}/vifs`).
    VIFS = (1, 28);
    /// Injecting a non-maskable interrupt.
    INJECT_NMI = (1, 29);
    /// Volume connectors and targets (`/v1/volume`).
    VOLUME = (1, 32);
    /// Node traits (`MINOR_37_NODE_TRAITS`).
    TRAITS = (1, 37);
    /// The `rescue` and `unrescue` verbs.
    VERB_RESCUE = (1, 38);
    /// A node's BIOS settings.
    BIOS = (1, 40);
    /// `abort` of an inspection waiting for the ramdisk (`inspect wait`).
    VERB_ABORT_INSPECT_WAIT = (1, 41);
    /// `?detail=` on listings (`MINOR_43_ENABLE_DETAIL_QUERY`).
    DETAIL_QUERY = (1, 43);
    /// Conductors (`/v1/conductors`).
    CONDUCTORS = (1, 49);
    /// Allocations (`/v1/allocations`, a node's allocation).
    ALLOCATIONS = (1, 52);
    /// Events (`/v1/events`).
    EVENTS = (1, 54);
    /// Deploy templates (`/v1/deploy_templates`).
    DEPLOY_TEMPLATES = (1, 55);
    /// Updating an allocation (`MINOR_57_ALLOCATION_UPDATE`).
    ALLOCATION_UPDATE = (1, 57);
    /// A node's indicators (`/v1/nodes/{node}/management/indicators`).
    INDICATORS = (1, 63);
    /// The verbs `deploy` and `undeploy`, aliases of `active` and `deleted`.
    VERB_DEPLOY_UNDEPLOY = (1, 73);
    /// Changing the boot mode and Secure Boot (`/v1/nodes/{node}/states/boot_mode`, …).
    BOOT_MODE_CHANGE = (1, 76);
    /// A node's event history (`/v1/nodes/{node}/history`).
    NODE_HISTORY = (1, 78);
    /// A node's hardware inventory (`/v1/nodes/{node}/inventory`).
    NODE_INVENTORY = (1, 81);
    /// Shards (`/v1/shards`).
    SHARDS = (1, 82);
    /// Parent and child nodes (`/v1/nodes/{node}/children`).
    CHILDREN = (1, 83);
    /// The `unhold` verb.
    VERB_UNHOLD = (1, 85);
    /// A node's firmware components.
    FIRMWARE = (1, 86);
    /// The `service` verb.
    VERB_SERVICE = (1, 87);
    /// Attaching and detaching virtual media (`MINOR_89_ATTACH_DETACH_VMEDIA`).
    VMEDIA = (1, 89);
    /// A trailing `.json` is part of the path, no longer a content-type suffix
    /// (`MINOR_91_DOT_JSON`).
    DOT_JSON = (1, 91);
    /// Runbooks (`/v1/runbooks`).
    RUNBOOKS = (1, 92);
    /// Listing virtual media (`MINOR_93_GET_VMEDIA`).
    VMEDIA_GET = (1, 93);
    /// Inspection rules (`/v1/inspection_rules`).
    INSPECTION_RULES = (1, 96);
    /// `abort` of a node waiting for its ramdisk (`wait call-back`).
    VERB_ABORT_WAIT_CALLBACK = (1, 110);
    /// Runbook traits, descriptions and free names (`/v1/runbooks/{ident}/traits`).
    RUNBOOK_TRAITS = (1, 112);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rivet_protocol::api::{MAX_VERSION, MIN_VERSION};

    #[test]
    fn every_version_is_served_and_in_order() {
        assert_eq!(BASE, MIN_VERSION);
        for (name, v) in TABLE {
            assert!(*v >= MIN_VERSION && *v <= MAX_VERSION, "{name} {v:?}");
        }
        assert!(
            TABLE.windows(2).all(|w| w[0].1 <= w[1].1),
            "sorted by version"
        );
        let mut names: Vec<&str> = TABLE.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TABLE.len());
    }
}

//! rivetd, the agent and real peers end to end: each file of this folder that is not part of
//! the harness library (harness.rs) is one module here, linked into one test binary. Tests of
//! different files share the process: what must not overlap across files takes a lock from the
//! harness (`rivet_tests::libvirt_lock`). libtest starts tests in the order of their names, two at
//! a time: `cleaning_merged` (seconds) runs long before `lab` (minutes), which both drive libvirtd,
//! so the lock rarely holds a thread idle.

mod agent_controller;
mod agent_limits;
mod agent_logs;
mod allocations_api;
mod api_versions;
mod bios_steps;
mod bmc_faults;
mod boot_mode;
mod cleaning;
mod cleaning_merged;
mod console;
mod console_cli;
mod console_ssh;
mod demo_bare;
mod deploy;
mod deploy_integrity;
mod discovery;
mod drivers_api;
mod fast_track;
mod faults_controller;
mod faults_store;
mod history_api;
mod image_cache;
mod inspection;
mod inspection_rules;
mod ipa_ironic;
mod ipmi;
mod ironic_diff;
mod ironicclient;
mod lab;
mod lifecycle;
mod metrics;
mod node_actions_api;
mod node_health;
mod node_resources_api;
mod openapi;
mod packaging;
mod ports_api;
mod qemu_deploy;
mod qemu_e2e;
mod qemu_nvme;
mod qemu_raid;
mod raid_api;
mod redfish;
mod redfish_inspection;
mod redfish_mock;
mod restart;
mod sdk_roundtrip;
mod secrets;
mod soak;
mod takeover;
mod templates_api;
mod tls;
mod uefi_boot;
mod web_console;
mod web_ui;
mod write_image;

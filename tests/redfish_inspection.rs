//! Out-of-band inspection through rivetd against the real sushy-tools emulator: `inspect` on a
//! redfish node with `inspect_interface: redfish` fills what the BMC reports and creates a
//! port per NIC MAC. sushy's fake driver reports no CPU count or memory size (its
//! ProcessorSummary/MemorySummary carry only Status), so here those properties must stay
//! unset rather than be invented; CPU and memory from a BMC that reports them are tested
//! against the in-tree mock (tests/redfish_mock.rs).

use rivet_tests::peers::{have_sushy, FakeSystem, Sushy, SushyOptions};
use rivet_tests::{prerequisite, Rivetd};
use serde_json::json;
use std::time::Duration;

#[test]
fn redfish_out_of_band_inspection_fills_properties_and_ports() -> anyhow::Result<()> {
    if !prerequisite(
        have_sushy(),
        "sushy-emulator in .venv-sushy (scripts/setup-peers.sh)",
    ) {
        return Ok(());
    }
    let mac = "52:54:00:5e:00:42";
    let system = FakeSystem::new("inspect-me", mac);
    let uuid = system.uuid.clone();
    let sushy = Sushy::start(SushyOptions {
        systems: vec![system],
        auth: Some(("admin".into(), "pw-for-inspection".into())),
        tls: None,
    })?;
    let dir = tempfile::tempdir()?;
    let conf = dir.path().join("rivetd.toml");
    std::fs::write(&conf, "[drivers]\npoll_interval_ms = 200\n")?;
    let conf = conf.display().to_string();
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &["--config", &conf])?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(
            json!({"driver": "redfish", "name": "n1", "inspect_interface": "redfish",
                    "driver_info": sushy.driver_info(&uuid, "admin", "pw-for-inspection")}),
        ),
    )?;
    anyhow::ensure!(s == 201, "{v}");
    d.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    d.wait_node("n1", Duration::from_secs(60), |v| {
        v["provision_state"] == "manageable"
    })?;
    d.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "inspect"})),
    )?;
    let node = d
        .wait_node("n1", Duration::from_secs(60), |v| {
            v["provision_state"] == "manageable" && v["inspection_finished_at"].is_string()
        })
        .map_err(|e| anyhow::anyhow!("{e}\n{}", d.log_text()))?;
    assert!(node["last_error"].is_null(), "{node}");

    // What the emulator reports about the system, read straight from it.
    let sys = sushy.system(&uuid)?;
    match sys["ProcessorSummary"]["Count"].as_u64() {
        Some(cpus) => assert_eq!(node["properties"]["cpus"], cpus, "{node}"),
        None => assert!(
            node["properties"].get("cpus").is_none(),
            "cpus invented: {node}"
        ),
    }
    match sys["MemorySummary"]["TotalSystemMemoryGiB"].as_f64() {
        Some(gib) => assert_eq!(
            node["properties"]["memory_mb"],
            (gib * 1024.0) as u64,
            "{node}"
        ),
        None => assert!(
            node["properties"].get("memory_mb").is_none(),
            "memory invented: {node}"
        ),
    }
    assert_eq!(
        node["power_state"], "power off",
        "out-of-band inspection leaves power alone"
    );
    assert!(
        node["resource_class"].is_null(),
        "no class from an incomplete picture: {node}"
    );
    let (_, ports) = d.call("GET", "/v1/ports?node=n1", None)?;
    let macs: Vec<&str> = ports["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["address"].as_str())
        .collect();
    assert_eq!(macs, [mac], "{ports}");
    eprintln!(
        "emulator system summary: cpus {:?}, memory {:?}; node properties {}",
        sys["ProcessorSummary"], sys["MemorySummary"], node["properties"]
    );
    Ok(())
}

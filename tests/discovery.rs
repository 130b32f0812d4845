//! Discovery end to end with the real rivetd: the real rivet-agent (local mode, this host's
//! NICs) that no node expects gets a node enrolled with its MACs, inventory and the
//! inspection rules applied, and a second agent with the same MACs creates no second node;
//! disabled discovery is a 403 the agent gives up on; a rule sets the driver from the BMC
//! address; concurrent discoveries of one machine make one node; the endpoint is
//! rate-limited. The BMC-address and concurrency cases post the inventory over raw HTTP
//! (with the protocol's own types): a local agent has no BMC to report.

use anyhow::{ensure, Context, Result};
use rivet_protocol::discovery::{DiscoverRequest, DiscoverResponse, DISCOVER_PATH};
use rivet_protocol::inventory::{Interface, Inventory};
use rivet_tests::agentproc::AgentProcess;
use rivet_tests::Rivetd;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

fn start(dir: &tempfile::TempDir, discovery: &str) -> Result<Rivetd> {
    Rivetd::start_in(
        dir.path(),
        &format!("[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n{discovery}"),
    )
}

/// Every node that discovery enrolled.
fn discovered(d: &Rivetd) -> Result<Vec<Value>> {
    let (s, v) = d.call("GET", "/v1/nodes/detail", None)?;
    ensure!(s == 200, "{v}");
    Ok(v["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["driver_internal_info"]["auto_discovered"] == true)
        .cloned()
        .collect())
}

fn wait_for<T>(what: &str, secs: u64, mut f: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn port_macs(d: &Rivetd, node: &str) -> Result<BTreeSet<String>> {
    let (_, ports) = d.call("GET", &format!("/v1/ports?node={node}"), None)?;
    Ok(ports["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["address"].as_str().map(String::from))
        .collect())
}

fn agent(dir: &tempfile::TempDir, d: &Rivetd, log: &str) -> Result<AgentProcess> {
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk)?.set_len(4 << 30)?;
    // A node hint that names no node: the lookup still finds nothing.
    AgentProcess::start(
        &d.url,
        "5d1a4c1e-0000-4000-8000-00000000d15c",
        &[&disk],
        None,
        &dir.path().join(log),
        &[],
    )
}

fn post(d: &Rivetd, req: &DiscoverRequest) -> Result<(u16, Value)> {
    let r = reqwest::blocking::Client::new()
        .post(format!("{}{DISCOVER_PATH}", d.url))
        .json(req)
        .send()?;
    let status = r.status().as_u16();
    Ok((status, r.json().unwrap_or(Value::Null)))
}

fn inventory(macs: &[&str], bmc: Option<&str>) -> DiscoverRequest {
    let mut inv = Inventory::default();
    inv.cpu.count = 4;
    inv.cpu.architecture = "x86_64".into();
    inv.memory.physical_mb = 8192;
    inv.bmc_address = bmc.map(String::from);
    inv.interfaces = macs
        .iter()
        .enumerate()
        .map(|(i, m)| Interface {
            name: format!("eth{i}"),
            mac_address: m.to_string(),
            ..Default::default()
        })
        .collect();
    DiscoverRequest {
        inventory: inv,
        agent_version: "test".into(),
        boot_id: None,
    }
}

#[test]
fn unknown_agent_is_enrolled_once_with_its_macs_inventory_and_rules() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "[discovery]\nenabled = true\nend = \"wait\"\n")?;
    let (s, v) = d.call(
        "POST",
        "/v1/inspection_rules",
        Some(json!({"description": "no BMC on this machine",
            "conditions": [{"op": "is-empty", "args": {"value": "{inventory[bmc_address]}"}}],
            "actions": [{"op": "set-attribute", "args": {"path": "extra/bmc", "value": "none"}},
                        {"op": "set-attribute", "args": {"path": "name", "value": "disc-{inventory[cpu][architecture]}"}},
                        {"op": "add-trait", "args": {"name": "CUSTOM_DISCOVERED"}}]})),
    )?;
    ensure!(s == 201, "{v}");

    let first = agent(&dir, &d, "agent1.log")?;
    let nodes = wait_for("a discovered node", 60, || {
        let n = discovered(&d)?;
        Ok((!n.is_empty()).then_some(n))
    })
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}\nagent:\n{}\nrivetd:\n{}",
            first.log_text(),
            d.log_text()
        )
    })?;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let node = &nodes[0];
    let uuid = node["uuid"].as_str().unwrap_or_default().to_string();
    assert_eq!(node["provision_state"], "enroll", "{node}");
    assert_eq!(
        node["driver"], "fake-hardware",
        "the configured driver: {node}"
    );
    assert_eq!(node["extra"]["bmc"], "none", "the rule ran: {node}");
    assert_eq!(node["name"], format!("disc-{}", std::env::consts::ARCH));
    assert_eq!(node["traits"], json!(["CUSTOM_DISCOVERED"]), "{node}");
    assert!(
        node["properties"]["cpus"].as_u64().unwrap_or(0) > 0,
        "{node}"
    );

    // The inventory is stored, and its MACs are the ports.
    let (s, inv) = d.call("GET", &format!("/v1/nodes/{uuid}/inventory"), None)?;
    ensure!(s == 200, "{inv}");
    let inv_macs: BTreeSet<String> = inv["inventory"]["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["mac_address"].as_str())
        .filter(|m| m.len() == 17 && *m != "00:00:00:00:00:00")
        .map(String::from)
        .collect();
    ensure!(!inv_macs.is_empty(), "this host reports no MAC: {inv}");
    assert_eq!(port_macs(&d, &uuid)?, inv_macs);
    if let Ok(eth0) = std::fs::read_to_string("/sys/class/net/eth0/address") {
        assert!(inv_macs.contains(eth0.trim()), "{inv_macs:?}");
    }

    // `rivet discovery list` shows it.
    let out = std::process::Command::new(rivet_tests::bin("rivet"))
        .args(["--url", &d.url, "--json", "discovery", "list"])
        .output()?;
    let listed: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).to_string())?;
    assert_eq!(listed["nodes"][0]["uuid"], uuid.as_str(), "{listed}");

    // The same MACs again: no second node.
    drop(first);
    let second = agent(&dir, &d, "agent2.log")?;
    wait_for("the second agent's discovery answer", 60, || {
        Ok(second
            .log_text()
            .contains("discovery: the controller enrolled this machine")
            .then_some(()))
    })
    .map_err(|e| anyhow::anyhow!("{e}\nagent:\n{}", second.log_text()))?;
    assert!(
        second.log_text().contains("created=false"),
        "{}",
        second.log_text()
    );
    assert!(
        second.log_text().contains(&uuid),
        "the answer names the first node"
    );
    let nodes = discovered(&d)?;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let (_, all) = d.call("GET", "/v1/nodes", None)?;
    assert_eq!(all["nodes"].as_array().map(Vec::len), Some(1), "{all}");
    Ok(())
}

#[test]
fn disabled_discovery_is_403_and_creates_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "")?;
    let (s, v) = post(&d, &inventory(&["52:54:00:d1:5c:01"], None))?;
    assert_eq!(s, 403, "{v}");
    assert!(v.to_string().contains("[discovery] enabled"), "{v}");
    // The real agent hears the 403 and stops asking for this boot.
    let a = agent(&dir, &d, "agent.log")?;
    wait_for("the agent to give up on discovery", 60, || {
        Ok(a.log_text().contains("discovery refused").then_some(()))
    })
    .map_err(|e| anyhow::anyhow!("{e}\nagent:\n{}", a.log_text()))?;
    let (_, all) = d.call("GET", "/v1/nodes", None)?;
    assert_eq!(all["nodes"], json!([]), "{all}");
    Ok(())
}

#[test]
fn rule_sets_driver_from_bmc_address_and_concurrent_discoveries_make_one_node() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "[discovery]\nenabled = true\n")?;
    let (s, v) = d.call(
        "POST",
        "/v1/inspection_rules",
        Some(json!({"priority": 100,
            "conditions": [{"op": "!is-empty", "args": {"value": "{inventory[bmc_address]}"}},
                           {"op": "in-net", "args": {"address": "{inventory[bmc_address]}", "subnet": "10.20.0.0/16"}}],
            "actions": [{"op": "set-attribute", "args": {"path": "driver", "value": "ipmi"}},
                        {"op": "set-attribute", "args": {"path": "driver_info/ipmi_address", "value": "{inventory[bmc_address]}"}}]})),
    )?;
    ensure!(s == 201, "{v}");
    let (s, v) = post(
        &d,
        &inventory(
            &["52:54:00:d1:5c:01", "52:54:00:d1:5c:02"],
            Some("10.20.30.40"),
        ),
    )?;
    assert_eq!(s, 201, "{v}");
    let resp: DiscoverResponse = serde_json::from_value(v.clone())?;
    assert!(resp.created);
    assert_eq!(
        resp.end,
        rivet_protocol::discovery::DiscoveryEnd::Poweroff,
        "the default end"
    );
    let n = d.node(&resp.node_uuid)?;
    assert_eq!(n["driver"], "ipmi", "{n}");
    assert_eq!(n["driver_info"]["ipmi_address"], "10.20.30.40", "{n}");
    assert_eq!(
        port_macs(&d, &resp.node_uuid)?,
        ["52:54:00:d1:5c:01", "52:54:00:d1:5c:02"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    // One shared MAC is the same machine: 200, the same node.
    let (s, v) = post(&d, &inventory(&["52:54:00:D1:5C:02"], None))?;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["node_uuid"], resp.node_uuid.as_str());
    assert_eq!(v["created"], false);
    // Still a discovered node in `enroll`: the configured end again.
    assert_eq!(v["end"], "poweroff", "{v}");
    // A node the operator enrolled is the operator's: its machine booting the ramdisk on its
    // own is told to wait, never powered off behind the operator's back.
    let own = d.create_node_with_port(json!({"driver": "fake-hardware"}), "52:54:00:d1:5c:0f")?;
    let (s, v) = post(&d, &inventory(&["52:54:00:d1:5c:0f"], None))?;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["node_uuid"], own.as_str(), "{v}");
    assert_eq!(v["end"], "wait", "{v}");
    // No MAC at all: 400.
    let (s, v) = post(&d, &inventory(&[], None))?;
    assert_eq!(s, 400, "{v}");

    // Eight discoveries of one new machine at once: one node.
    let macs = [
        "52:54:00:d1:5c:a1",
        "52:54:00:d1:5c:a2",
        "52:54:00:d1:5c:a3",
    ];
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| post(&d, &inventory(&macs, None))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("thread panicked"))?)
            .collect::<Result<Vec<_>>>()
    })?;
    let created = answers.iter().filter(|(s, _)| *s == 201).count();
    assert_eq!(created, 1, "{answers:?}");
    let uuids: BTreeSet<&str> = answers
        .iter()
        .filter_map(|(_, v)| v["node_uuid"].as_str())
        .collect();
    assert_eq!(uuids.len(), 1, "{answers:?}");
    assert_eq!(discovered(&d)?.len(), 2);
    let (_, all) = d.call("GET", "/v1/nodes", None)?;
    assert_eq!(all["nodes"].as_array().map(Vec::len), Some(3), "{all}");
    Ok(())
}

#[test]
fn discovery_is_rate_limited_per_source() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(&dir, "[discovery]\nenabled = true\nper_minute = 2\n")?;
    let mut statuses = Vec::new();
    for i in 0..6 {
        let mac = format!("52:54:00:d1:5d:{i:02x}");
        statuses.push(post(&d, &inventory(&[&mac], None))?.0);
    }
    assert!(statuses.contains(&201), "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    let created = statuses.iter().filter(|s| **s == 201).count();
    assert_eq!(
        discovered(&d)?.len(),
        created,
        "a refused request creates nothing"
    );
    Ok(())
}

#[test]
fn two_controllers_on_postgresql_enrol_one_node_for_one_machine() -> Result<()> {
    let base = std::env::var("RIVET_TEST_POSTGRES").unwrap_or_default();
    if !rivet_tests::prerequisite(
        !base.is_empty(),
        "RIVET_TEST_POSTGRES (a PostgreSQL server; scripts/setup-postgres.sh starts one)",
    ) {
        return Ok(());
    }
    let db = rivet_store::postgres::ScratchDatabase::create(&base, "rivet_discovery")
        .context("scratch database")?;
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("secrets.key");
    let made = std::process::Command::new(rivet_tests::bin("rivetd"))
        .args(["secrets", "init-key"])
        .arg(&key)
        .output()?;
    ensure!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let cfg = dir.path().join("rivetd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[secrets]\nkey_file = {:?}\n[discovery]\nenabled = true\n",
            key.display().to_string()
        ),
    )?;
    let cfg = cfg.display().to_string();
    let a = Rivetd::start_url(db.url(), dir.path(), "d1", 0, &["--config", &cfg])?;
    let b = Rivetd::start_url(db.url(), dir.path(), "d2", 0, &["--config", &cfg])?;
    let macs = ["52:54:00:d1:5e:01", "52:54:00:d1:5e:02"];
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let d = if i % 2 == 0 { &a } else { &b };
                s.spawn(move || post(d, &inventory(&macs, None)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("thread panicked"))?)
            .collect::<Result<Vec<_>>>()
    })?;
    assert_eq!(
        answers.iter().filter(|(s, _)| *s == 201).count(),
        1,
        "{answers:?}"
    );
    let uuids: BTreeSet<&str> = answers
        .iter()
        .filter_map(|(_, v)| v["node_uuid"].as_str())
        .collect();
    assert_eq!(uuids.len(), 1, "{answers:?}");
    let (_, all) = a.call("GET", "/v1/nodes", None)?;
    assert_eq!(all["nodes"].as_array().map(Vec::len), Some(1), "{all}");
    Ok(())
}

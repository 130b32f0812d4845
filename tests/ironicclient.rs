//! The stock python-ironicclient (`baremetal`) drives the core flow against rivetd:
//! node create, list, show, manage.

use rivet_tests::{clients, prerequisite, Rivetd};
use std::process::Command;
use std::time::Duration;

/// `baremetal ARGS` against `d`; its stdout (fails with the CLI's error output).
fn run(d: &Rivetd, args: &[&str]) -> anyhow::Result<String> {
    clients::baremetal(d, args)
}

/// Run `baremetal ARGS` expecting it to fail; its error output.
fn run_failing(d: &Rivetd, args: &[&str]) -> anyhow::Result<String> {
    clients::baremetal_failing(d, args)
}

#[test]
fn stock_ironic_client_drives_core_flow() -> anyhow::Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;

    let created = run(
        &d,
        &[
            "node",
            "create",
            "--driver",
            "fake-hardware",
            "--name",
            "n1",
            "-f",
            "json",
        ],
    )?;
    let created: serde_json::Value = serde_json::from_str(&created)?;
    assert_eq!(created["name"], "n1");
    assert_eq!(created["provision_state"], "enroll");

    let list = run(&d, &["node", "list", "-f", "json"])?;
    let list: serde_json::Value = serde_json::from_str(&list)?;
    assert_eq!(list[0]["name"], "n1", "{list}");

    let long = run(&d, &["node", "list", "--long", "-f", "json"])?;
    assert!(long.contains("fake-hardware"), "{long}");

    let show = run(&d, &["node", "show", "n1", "-f", "json"])?;
    let show: serde_json::Value = serde_json::from_str(&show)?;
    assert_eq!(show["uuid"], created["uuid"]);
    assert_eq!(show["driver"], "fake-hardware");

    run(&d, &["node", "manage", "n1"])?;
    d.wait_node("n1", Duration::from_secs(20), |v| {
        v["provision_state"] == "manageable"
    })?;
    let state = run(
        &d,
        &["node", "show", "n1", "-f", "value", "-c", "provision_state"],
    )?;
    assert_eq!(state.trim(), "manageable");

    // The controllers and the node's owner, as Ironic's conductor API shows them.
    let conductors = run(&d, &["conductor", "list", "-f", "json"])?;
    let conductors: serde_json::Value = serde_json::from_str(&conductors)?;
    assert_eq!(conductors[0]["hostname"], "test-conductor", "{conductors}");
    assert_eq!(conductors[0]["alive"], true, "{conductors}");
    let owner = run(
        &d,
        &["node", "show", "n1", "-f", "value", "-c", "conductor"],
    )?;
    assert_eq!(owner.trim(), "test-conductor");

    // An error comes back as the client's error text, not a crash.
    let stderr = run_failing(&d, &["node", "show", "ghost"])?;
    assert!(stderr.contains("ghost"), "{stderr}");
    Ok(())
}

/// The issue's "done" line: a fake-hardware node with `deploy_interface=direct`, served by a
/// local `rivet-agent run --devices FILE`, deploys through the stock client with a
/// configdrive (`baremetal node deploy --config-drive JSON`), then undeploys.
#[test]
fn stock_client_deploys_with_a_configdrive() -> anyhow::Result<()> {
    use rivet_tests::agentproc::{have, AgentProcess};
    use rivet_tests::fileserver::FileServer;
    if !clients::available()
        || !prerequisite(have("sha256sum"), "sha256sum")
        || !prerequisite(have("sgdisk"), "sgdisk (gdisk)")
    {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start_in(dir.path(), rivet_tests::DEPLOY_TEST_CONFIG)?;
    // The node's disk: a sparse file; the image: 8 MiB of a pattern, served over loopback.
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk)?.set_len(64 << 20)?;
    let www = dir.path().join("www");
    std::fs::create_dir(&www)?;
    // A GPT whole-disk image (the configdrive partition needs a table to join).
    let pattern: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(www.join("img.raw"), &pattern)?;
    let gpt = Command::new("sgdisk")
        .args(["-o", "-n", "1:2048:0"])
        .arg(www.join("img.raw"))
        .output()?;
    anyhow::ensure!(
        gpt.status.success(),
        "sgdisk: {}",
        String::from_utf8_lossy(&gpt.stderr)
    );
    let image = std::fs::read(www.join("img.raw"))?;
    let sum = rivet_tests::sha256_file(&www.join("img.raw"))?;
    let server = FileServer::start(&www)?;

    let created = run(
        &d,
        &[
            "node",
            "create",
            "--driver",
            "fake-hardware",
            "--name",
            "dep",
            "--deploy-interface",
            "direct",
            // The agent stands in for a ramdisk on this BIOS host: no UEFI.
            "--property",
            "capabilities=boot_mode:bios",
            "-f",
            "json",
        ],
    )?;
    let created: serde_json::Value = serde_json::from_str(&created)?;
    assert_eq!(created["deploy_interface"], "direct", "{created}");
    let uuid = created["uuid"].as_str().unwrap_or_default().to_string();
    run(
        &d,
        &[
            "node",
            "set",
            "dep",
            "--property",
            &format!("root_device={{\"name\": \"{}\"}}", disk.display()),
            "--instance-info",
            &format!("image_source={}", server.url_of("img.raw")),
            "--instance-info",
            "image_os_hash_algo=sha256",
            "--instance-info",
            &format!("image_os_hash_value={sum}"),
        ],
    )?;
    let agent_log = dir.path().join("agent.log");
    let start_agent =
        || AgentProcess::start(&d.url, &uuid, &[disk.as_path()], None, &agent_log, &[]);
    run(&d, &["node", "manage", "dep", "--wait", "30"])?;
    let agent = start_agent()?;
    run(&d, &["node", "provide", "dep", "--wait", "120"])?;
    drop(agent);
    let agent = start_agent()?;
    run(
        &d,
        &[
            "node",
            "deploy",
            "dep",
            "--wait",
            "120",
            "--config-drive",
            r#"{"meta_data": {"hostname": "stock-client"}}"#,
        ],
    )
    .map_err(|e| anyhow::anyhow!("{e}\nagent log:\n{}", agent.log_text()))?;
    let state = run(
        &d,
        &[
            "node",
            "show",
            "dep",
            "-f",
            "value",
            "-c",
            "provision_state",
        ],
    )?;
    assert_eq!(state.trim(), "active");
    // The image's partition is on the disk, byte for byte (its GPT moved its backup).
    let written = std::fs::read(&disk)?;
    let part = (1 << 20)..(image.len() - (1 << 20));
    assert!(
        written[part.clone()] == image[part],
        "image bytes differ on the disk"
    );
    // The configdrive ISO (volume config-2) is on the disk after the image.
    let pvd = written[image.len()..]
        .windows(6)
        .position(|w| w == b"\x01CD001")
        .map(|p| p + image.len());
    let pvd =
        pvd.ok_or_else(|| anyhow::anyhow!("no ISO 9660 volume descriptor after the image"))?;
    // The volume identifier follows at byte 40 of the descriptor.
    assert_eq!(&written[pvd + 40..pvd + 48], b"config-2", "volume label");
    drop(agent);
    let _agent = start_agent()?;
    run(&d, &["node", "undeploy", "dep", "--wait", "120"])?;
    let state = run(
        &d,
        &[
            "node",
            "show",
            "dep",
            "-f",
            "value",
            "-c",
            "provision_state",
        ],
    )?;
    assert_eq!(state.trim(), "available");
    Ok(())
}

/// The drivers API through the stock client: the hardware types and the controller serving
/// them, one hardware type's interfaces, and the driver_info keys a driver reads.
#[test]
fn stock_client_lists_and_shows_drivers() -> anyhow::Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;

    let list: serde_json::Value =
        serde_json::from_str(&run(&d, &["driver", "list", "-f", "json"])?)?;
    let mut names: Vec<&str> = list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["fake-hardware", "ipmi", "redfish"], "{list}");
    for r in list.as_array().into_iter().flatten() {
        assert_eq!(r["hosts"], "test-conductor", "{list}");
    }
    let long = run(&d, &["driver", "list", "--long", "-f", "json"])?;
    assert!(long.contains("redfish-virtual-media"), "{long}");

    let show: serde_json::Value =
        serde_json::from_str(&run(&d, &["driver", "show", "redfish", "-f", "json"])?)?;
    assert_eq!(show["name"], "redfish", "{show}");
    assert_eq!(show["type"], "dynamic", "{show}");
    assert_eq!(show["hosts"], "test-conductor", "{show}");
    assert_eq!(show["default_boot_interface"], "ipxe", "{show}");
    assert_eq!(
        show["enabled_boot_interfaces"], "ipxe, pxe, redfish-virtual-media",
        "{show}"
    );
    assert_eq!(show["default_firmware_interface"], "redfish", "{show}");

    let props: serde_json::Value = serde_json::from_str(&run(
        &d,
        &["driver", "property", "list", "ipmi", "-f", "json"],
    )?)?;
    let rows: Vec<(String, String)> = props
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let text = |k: &str| {
                r.get(k)
                    .or_else(|| r.get(k.to_ascii_lowercase()))
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            (text("Property"), text("Description"))
        })
        .collect();
    let keys: Vec<&str> = rows.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "boot_mode",
            "ipmi_address",
            "ipmi_password",
            "ipmi_port",
            "ipmi_username"
        ],
        "{props}"
    );
    assert!(
        rows.iter()
            .any(|(k, v)| k == "ipmi_address" && v.ends_with("Required.")),
        "{props}"
    );

    // An unknown driver is the client's error, naming it.
    let stderr = run_failing(&d, &["driver", "show", "nope"])?;
    assert!(stderr.contains("nope"), "{stderr}");
    Ok(())
}

/// Traits, validate and the boot device through the stock client on a fake-hardware node.
#[test]
fn stock_client_traits_validate_and_boot_device() -> anyhow::Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;
    run(
        &d,
        &[
            "node",
            "create",
            "--driver",
            "fake-hardware",
            "--name",
            "t1",
        ],
    )?;

    let added = run(
        &d,
        &["node", "add", "trait", "t1", "CUSTOM_X", "HW_CPU_X86_VMX"],
    )?;
    assert!(added.contains("Added trait CUSTOM_X"), "{added}");
    assert!(added.contains("Added trait HW_CPU_X86_VMX"), "{added}");
    let listed = run(&d, &["node", "trait", "list", "t1", "-f", "value"])?;
    let listed: Vec<&str> = listed.lines().map(str::trim).collect();
    assert_eq!(listed, ["CUSTOM_X", "HW_CPU_X86_VMX"]);
    // A name Ironic refuses is refused with its message.
    let stderr = run_failing(&d, &["node", "add", "trait", "t1", "lower_case"])?;
    assert!(stderr.contains("does not match"), "{stderr}");
    let removed = run(&d, &["node", "remove", "trait", "t1", "CUSTOM_X"])?;
    assert!(removed.contains("Removed trait CUSTOM_X"), "{removed}");
    let listed = run(&d, &["node", "trait", "list", "t1", "-f", "value"])?;
    assert_eq!(listed.trim(), "HW_CPU_X86_VMX");

    let v: serde_json::Value =
        serde_json::from_str(&run(&d, &["node", "validate", "t1", "-f", "json"])?)?;
    let rows = v.as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = rows
        .iter()
        .filter_map(|r| r["Interface"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "bios",
            "boot",
            "console",
            "deploy",
            "firmware",
            "inspect",
            "management",
            "network",
            "power",
            "raid",
            "rescue",
            "storage"
        ],
        "{v}"
    );
    assert!(rows.iter().all(|r| r["Result"] == true), "{v}");

    let show = |d: &Rivetd| -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::from_str(&run(
            d,
            &["node", "boot", "device", "show", "t1", "-f", "json"],
        )?)?)
    };
    assert_eq!(
        show(&d)?,
        serde_json::json!({"boot_device": "pxe", "persistent": false})
    );
    run(
        &d,
        &[
            "node",
            "boot",
            "device",
            "set",
            "t1",
            "disk",
            "--persistent",
        ],
    )?;
    assert_eq!(
        show(&d)?,
        serde_json::json!({"boot_device": "disk", "persistent": true})
    );
    run(&d, &["node", "boot", "device", "set", "t1", "pxe"])?;
    assert_eq!(
        show(&d)?,
        serde_json::json!({"boot_device": "pxe", "persistent": false})
    );
    let supported = run(
        &d,
        &[
            "node",
            "boot",
            "device",
            "show",
            "t1",
            "--supported",
            "-f",
            "value",
        ],
    )?;
    assert_eq!(supported.trim(), "pxe, disk, cdrom");
    Ok(())
}

/// Chassis (API 1.1) through the stock client: create, list, show, a node in it, delete.
#[test]
fn stock_client_manages_chassis() -> anyhow::Result<()> {
    if !clients::available() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;

    let created = run(
        &d,
        &["chassis", "create", "--description", "rack 7", "-f", "json"],
    )?;
    let created: serde_json::Value = serde_json::from_str(&created)?;
    assert_eq!(created["description"], "rack 7", "{created}");
    let uuid = created["uuid"].as_str().unwrap_or_default().to_string();
    assert_eq!(uuid.len(), 36, "{created}");

    let list = run(&d, &["chassis", "list", "-f", "json"])?;
    let list: serde_json::Value = serde_json::from_str(&list)?;
    assert_eq!(list[0]["uuid"], uuid.as_str(), "{list}");
    assert_eq!(list[0]["description"], "rack 7", "{list}");

    let shown = run(&d, &["chassis", "show", &uuid, "-f", "json"])?;
    let shown: serde_json::Value = serde_json::from_str(&shown)?;
    assert_eq!(shown["description"], "rack 7", "{shown}");
    assert_eq!(shown["extra"], serde_json::json!({}), "{shown}");

    let node = run(
        &d,
        &[
            "node",
            "create",
            "--driver",
            "fake-hardware",
            "--name",
            "racked",
            "--chassis-uuid",
            &uuid,
            "-f",
            "json",
        ],
    )?;
    let node: serde_json::Value = serde_json::from_str(&node)?;
    assert_eq!(node["chassis_uuid"], uuid.as_str(), "{node}");
    let in_chassis = run(&d, &["node", "list", "--chassis", &uuid, "-f", "json"])?;
    assert!(in_chassis.contains("racked"), "{in_chassis}");

    let refused = run_failing(&d, &["chassis", "delete", &uuid])?;
    assert!(refused.contains("contains nodes"), "{refused}");
    run(&d, &["node", "delete", "racked"])?;
    run(&d, &["chassis", "delete", &uuid])?;
    let list = run(&d, &["chassis", "list", "-f", "json"])?;
    assert_eq!(list.trim(), "[]", "{list}");
    Ok(())
}

//! Ironic's drivers API on a real rivetd: `GET /v1/drivers` (type, detail, fields), one
//! driver, its properties; the interface fields at exactly the microversions Ironic adds
//! them; `hosts` naming the live controllers only.

use anyhow::{Context, Result};
use rivet_tests::{fault, Rivetd};
use serde_json::Value;
use std::collections::BTreeSet;

/// GET `path` at microversion `version` (`None`: no header, the minimum 1.1): status, body,
/// and the version the answer says it was served at.
fn get(d: &Rivetd, version: Option<&str>, path: &str) -> Result<(u16, Value, String)> {
    let mut req = reqwest::blocking::Client::new().get(format!("{}{path}", d.url));
    if let Some(v) = version {
        req = req.header("X-OpenStack-Ironic-API-Version", v);
    }
    let resp = req.send().with_context(|| format!("GET {path}"))?;
    let status = resp.status().as_u16();
    let served = resp
        .headers()
        .get("X-OpenStack-Ironic-API-Version")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let text = resp.text()?;
    let body = serde_json::from_str(&text).with_context(|| format!("GET {path}: {text}"))?;
    Ok((status, body, served))
}

/// An answer that must be 200.
fn ok(d: &Rivetd, version: Option<&str>, path: &str) -> Result<Value> {
    let (s, v, _) = get(d, version, path)?;
    anyhow::ensure!(s == 200, "GET {path} at {version:?}: {s} {v}");
    Ok(v)
}

/// An error answer with `status`, in Ironic's shape; its message.
fn refused(d: &Rivetd, version: Option<&str>, path: &str, status: u16) -> Result<String> {
    let (s, v, _) = get(d, version, path)?;
    anyhow::ensure!(
        s == status,
        "GET {path} at {version:?}: {s} {v}, want {status}"
    );
    let msg = fault(&v);
    anyhow::ensure!(!msg.is_empty(), "GET {path}: not Ironic's error shape: {v}");
    Ok(msg)
}

fn keys(doc: &Value) -> BTreeSet<String> {
    doc.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

fn names(list: &Value) -> BTreeSet<String> {
    list["drivers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["name"].as_str().map(str::to_string))
        .collect()
}

fn driver<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["drivers"]
        .as_array()
        .and_then(|a| a.iter().find(|d| d["name"] == name))
        .unwrap_or(&Value::Null)
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn list_filters_detail_and_fields() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;
    let all = set(&["fake-hardware", "ipmi", "redfish"]);

    let list = ok(&d, Some("latest"), "/v1/drivers")?;
    assert_eq!(names(&list), all, "{list}");
    for name in &all {
        let e = driver(&list, name);
        assert_eq!(e["hosts"], serde_json::json!(["test-conductor"]), "{e}");
        assert_eq!(e["type"], "dynamic", "{e}");
        assert_eq!(
            e["links"][0]["href"],
            format!("{}/v1/drivers/{name}", d.url),
            "{e}"
        );
        assert_eq!(e["links"][1]["href"], format!("{}/drivers/{name}", d.url));
        assert_eq!(
            e["properties"][0]["href"],
            format!("{}/v1/drivers/{name}/properties", d.url)
        );
        // Not detailed: no interface fields.
        assert_eq!(
            keys(e),
            set(&["hosts", "links", "name", "properties", "type"]),
            "{e}"
        );
    }

    // Rivet has hardware types only: classic is empty, dynamic is everything.
    let classic = ok(&d, Some("latest"), "/v1/drivers?type=classic")?;
    assert_eq!(classic, serde_json::json!({"drivers": []}));
    let dynamic = ok(&d, Some("latest"), "/v1/drivers?type=dynamic")?;
    assert_eq!(names(&dynamic), all);
    let msg = refused(&d, Some("latest"), "/v1/drivers?type=working", 400)?;
    assert!(msg.contains("\"classic\" or \"dynamic\""), "{msg}");

    // Detail: every interface, default first among the enabled ones.
    let detail = ok(&d, Some("latest"), "/v1/drivers?detail=True")?;
    let redfish = driver(&detail, "redfish");
    assert_eq!(redfish["default_boot_interface"], "ipxe", "{redfish}");
    assert_eq!(
        redfish["enabled_boot_interfaces"],
        serde_json::json!(["ipxe", "pxe", "redfish-virtual-media"])
    );
    assert_eq!(redfish["default_power_interface"], "redfish");
    assert_eq!(redfish["default_deploy_interface"], "direct");
    let ipmi = driver(&detail, "ipmi");
    assert_eq!(ipmi["default_management_interface"], "ipmitool", "{ipmi}");
    assert_eq!(
        ipmi["enabled_bios_interfaces"],
        serde_json::json!(["no-bios"])
    );
    let fake = driver(&detail, "fake-hardware");
    assert_eq!(fake["default_deploy_interface"], "fake", "{fake}");
    let not_detailed = ok(&d, Some("latest"), "/v1/drivers?detail=false")?;
    assert!(driver(&not_detailed, "ipmi")
        .get("default_boot_interface")
        .is_none());

    // fields: those asked for, and links.
    let some = ok(&d, Some("latest"), "/v1/drivers?fields=name,hosts")?;
    for name in &all {
        assert_eq!(
            keys(driver(&some, name)),
            set(&["hosts", "links", "name"]),
            "{some}"
        );
    }
    let iface = ok(
        &d,
        Some("latest"),
        "/v1/drivers?fields=name,default_power_interface",
    )?;
    assert_eq!(
        driver(&iface, "ipmi")["default_power_interface"],
        "ipmitool"
    );
    let msg = refused(&d, Some("latest"), "/v1/drivers?fields=name,invalid", 400)?;
    assert!(msg.contains("invalid"), "{msg}");
    let msg = refused(
        &d,
        Some("latest"),
        "/v1/drivers?detail=true&fields=name",
        400,
    )?;
    assert!(msg.contains("detail"), "{msg}");
    let msg = refused(&d, Some("latest"), "/v1/drivers?colour=red", 400)?;
    assert!(msg.contains("colour"), "{msg}");
    Ok(())
}

#[test]
fn show_properties_and_unknown_drivers() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;

    let redfish = ok(&d, Some("latest"), "/v1/drivers/redfish")?;
    assert_eq!(redfish["name"], "redfish");
    assert_eq!(redfish["type"], "dynamic");
    assert_eq!(redfish["hosts"], serde_json::json!(["test-conductor"]));
    assert_eq!(redfish["default_inspect_interface"], "agent", "{redfish}");
    assert_eq!(
        redfish["enabled_inspect_interfaces"],
        serde_json::json!(["agent", "redfish", "no-inspect"])
    );
    assert_eq!(
        redfish["enabled_firmware_interfaces"],
        serde_json::json!(["redfish", "no-firmware"])
    );
    assert_eq!(redfish["default_network_interface"], "noop");
    let some = ok(&d, Some("latest"), "/v1/drivers/ipmi?fields=name,hosts")?;
    assert_eq!(keys(&some), set(&["hosts", "links", "name"]), "{some}");

    let msg = refused(&d, Some("latest"), "/v1/drivers/nope", 404)?;
    assert!(
        msg.contains("Could not find the following driver(s) or hardware type(s): nope"),
        "{msg}"
    );
    let msg = refused(&d, Some("latest"), "/v1/drivers/nope/properties", 404)?;
    assert!(msg.contains("nope"), "{msg}");

    // Properties: the driver_info keys each driver reads, {key: description}.
    let ipmi = ok(&d, None, "/v1/drivers/ipmi/properties")?;
    assert_eq!(
        keys(&ipmi),
        set(&[
            "boot_mode",
            "ipmi_address",
            "ipmi_password",
            "ipmi_port",
            "ipmi_username"
        ]),
        "{ipmi}"
    );
    assert_eq!(
        ipmi["ipmi_address"],
        "IP address or hostname of the node. Required."
    );
    let redfish = ok(&d, Some("latest"), "/v1/drivers/redfish/properties")?;
    for k in [
        "redfish_address",
        "redfish_system_id",
        "redfish_username",
        "redfish_password",
        "redfish_verify_ca",
        "redfish_auth_type",
    ] {
        assert!(
            redfish[k].as_str().is_some_and(|s| !s.is_empty()),
            "{k}: {redfish}"
        );
    }
    assert!(redfish["redfish_address"]
        .as_str()
        .is_some_and(|s| s.ends_with("Required.")));
    assert!(redfish.get("ipmi_address").is_none());
    let fake = ok(&d, Some("latest"), "/v1/drivers/fake-hardware/properties")?;
    assert!(fake.get("fake_delay_ms").is_some(), "{fake}");
    Ok(())
}

/// Which fields and parameters each microversion has, as Ironic's driver controller and
/// its response schemas say.
#[test]
fn microversions_gate_fields_and_parameters() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start(&dir.path().join("rivet.db"), 0, &[])?;

    // No header: 1.1, just name, hosts and links.
    let (s, list, served) = get(&d, None, "/v1/drivers")?;
    assert_eq!((s, served.as_str()), (200, "1.1"));
    assert_eq!(
        keys(driver(&list, "ipmi")),
        set(&["hosts", "links", "name"]),
        "{list}"
    );
    let list = ok(&d, Some("1.14"), "/v1/drivers")?;
    assert_eq!(
        keys(driver(&list, "ipmi")),
        set(&["hosts", "links", "name", "properties"])
    );
    let show = ok(&d, Some("1.29"), "/v1/drivers/ipmi")?;
    assert_eq!(keys(&show), set(&["hosts", "links", "name", "properties"]));

    // type and detail are 1.30 (even detail=false).
    for q in ["detail=true", "detail=false", "type=classic"] {
        let msg = refused(&d, Some("1.29"), &format!("/v1/drivers?{q}"), 406)?;
        assert!(msg.contains("1.30"), "{q}: {msg}");
    }

    // Interface fields per version: the 1.30 set, then storage, rescue, bios, firmware.
    let base = [
        "boot",
        "console",
        "deploy",
        "inspect",
        "management",
        "network",
        "power",
        "raid",
        "vendor",
    ];
    let steps: [(&str, &[&str]); 7] = [
        ("1.30", &[]),
        ("1.32", &[]),
        ("1.33", &["storage"]),
        ("1.38", &["storage", "rescue"]),
        ("1.39", &["storage", "rescue"]),
        ("1.40", &["storage", "rescue", "bios"]),
        ("1.86", &["storage", "rescue", "bios", "firmware"]),
    ];
    for (version, extra) in steps {
        let mut want = set(&["hosts", "links", "name", "properties", "type"]);
        for i in base.iter().chain(extra.iter()) {
            want.insert(format!("default_{i}_interface"));
            want.insert(format!("enabled_{i}_interfaces"));
        }
        let show = ok(&d, Some(version), "/v1/drivers/redfish")?;
        assert_eq!(keys(&show), want, "GET /v1/drivers/redfish at {version}");
        let list = ok(&d, Some(version), "/v1/drivers?detail=true")?;
        assert_eq!(keys(driver(&list, "redfish")), want, "list at {version}");
        let plain = ok(&d, Some(version), "/v1/drivers")?;
        assert_eq!(
            keys(driver(&plain, "redfish")),
            set(&["hosts", "links", "name", "properties", "type"]),
            "plain list at {version}"
        );
    }
    let (_, show, served) = get(&d, Some("1.85"), "/v1/drivers/redfish")?;
    assert_eq!(served, "1.85");
    assert!(show.get("default_firmware_interface").is_none(), "{show}");

    // fields is 1.77; a field is selectable from the version that has it.
    for path in ["/v1/drivers?fields=name", "/v1/drivers/ipmi?fields=name"] {
        let msg = refused(&d, Some("1.76"), path, 406)?;
        assert!(msg.contains("1.77"), "{path}: {msg}");
        ok(&d, Some("1.77"), path)?;
    }
    refused(
        &d,
        Some("1.85"),
        "/v1/drivers/ipmi?fields=default_firmware_interface",
        400,
    )?;
    let fw = ok(
        &d,
        Some("1.86"),
        "/v1/drivers/ipmi?fields=default_firmware_interface",
    )?;
    assert_eq!(fw["default_firmware_interface"], "no-firmware", "{fw}");
    Ok(())
}

/// `hosts` are the live controllers in the store: a registered peer that heartbeat is
/// listed, one that went silent is not (while the conductors API still shows it, dead).
#[test]
fn hosts_are_the_live_controllers() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("rivet.db");
    let d = Rivetd::start(&db, 0, &[])?;
    let c = rusqlite::Connection::open(&db)?;
    c.busy_timeout(std::time::Duration::from_secs(10))?;
    let now = "strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')";
    c.execute(
        &format!(
            "INSERT INTO conductors (id, hostname, started_at, last_seen) \
             VALUES ('peer-conductor', 'peer', {now}, {now})"
        ),
        [],
    )?;
    c.execute(
        "INSERT INTO conductors (id, hostname, started_at, last_seen) \
         VALUES ('gone-conductor', 'gone', '2020-01-01T00:00:00.000000+00:00', \
         '2020-01-01T00:00:00.000000+00:00')",
        [],
    )?;
    let conductors = ok(&d, Some("latest"), "/v1/conductors")?;
    let gone = conductors["conductors"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["hostname"] == "gone-conductor"))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(gone["alive"], false, "{conductors}");

    let live = serde_json::json!(["peer-conductor", "test-conductor"]);
    let list = ok(&d, Some("latest"), "/v1/drivers")?;
    for name in ["fake-hardware", "redfish", "ipmi"] {
        assert_eq!(driver(&list, name)["hosts"], live, "{list}");
    }
    let show = ok(&d, Some("latest"), "/v1/drivers/ipmi")?;
    assert_eq!(show["hosts"], live, "{show}");
    Ok(())
}

/// Like the other read-only admin routes: credentials required (401 without), and any
/// role may read (a reader token is enough).
#[test]
fn drivers_need_credentials_and_any_role_reads_them() -> Result<()> {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir()?;
    let hash = rivet_tests::hash_secret("reader-token")?;
    let cfg = dir.path().join("auth.toml");
    std::fs::write(
        &cfg,
        format!("[auth]\ntokens = [{{ name = \"ro\", hash = \"{hash}\", role = \"reader\" }}]\n"),
    )?;
    let port = rivet_tests::free_port()?;
    let log = std::fs::File::create(dir.path().join("rivetd.log"))?;
    /// The child, killed however the test ends.
    struct Child(std::process::Child);
    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _child = Child(
        Command::new(rivet_tests::bin("rivetd"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--db")
            .arg(format!("sqlite:{}", dir.path().join("r.db").display()))
            .arg("--config")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?,
    );
    let http = reqwest::blocking::Client::new();
    let url = format!("http://127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while http.get(format!("{url}/v1")).send().is_err() {
        anyhow::ensure!(std::time::Instant::now() < deadline, "rivetd did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for path in [
        "/v1/drivers",
        "/v1/drivers/ipmi",
        "/v1/drivers/ipmi/properties",
    ] {
        let anonymous = http.get(format!("{url}{path}")).send()?;
        assert_eq!(anonymous.status().as_u16(), 401, "{path}");
        let reader = http
            .get(format!("{url}{path}"))
            .bearer_auth("reader-token")
            .send()?;
        assert_eq!(reader.status().as_u16(), 200, "{path}");
    }
    Ok(())
}

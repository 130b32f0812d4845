//! Node sub-resources on a real rivetd, with Ironic's shapes, codes and microversion gates:
//! traits (1.37), validate, the boot device (fake-hardware; redfish against sushy-tools; ipmi
//! against ipmi_sim) and virtual media (1.89/1.93; attached and detached in sushy-tools).
//!
//! The sushy and ipmi_sim scenarios skip without their peers unless RIVET_REQUIRE_PEERS=1.

use anyhow::{ensure, Context, Result};
use rivet_tests::peers::{
    have_ipmi_sim, have_sushy, FakeSystem, FileServer, IpmiSim, Sushy, SushyOptions,
};
use rivet_tests::{prerequisite, Rivetd};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// An answer: status, its Location header, the body (JSON, or null).
struct Answer {
    status: u16,
    location: Option<String>,
    body: Value,
}

impl Answer {
    /// Ironic's error text: `error_message` is JSON with the `faultstring`.
    fn fault(&self) -> String {
        let raw = self.body["error_message"].as_str().unwrap_or_default();
        serde_json::from_str::<Value>(raw)
            .ok()
            .and_then(|v| v["faultstring"].as_str().map(str::to_string))
            .unwrap_or_else(|| raw.to_string())
    }
}

/// A request at `version` (`None`: no header, i.e. 1.1) with a raw body.
fn send(
    d: &Rivetd,
    version: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<Answer> {
    let m = reqwest::Method::from_bytes(method.as_bytes())?;
    let mut req = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?
        .request(m, format!("{}{path}", d.url));
    if let Some(v) = version {
        req = req.header("X-OpenStack-Ironic-API-Version", v);
    }
    if let Some(b) = body {
        req = req
            .header("Content-Type", "application/json")
            .body(b.to_string());
    }
    let resp = req.send().with_context(|| format!("{method} {path}"))?;
    let status = resp.status().as_u16();
    let location = resp
        .headers()
        .get("Location")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = resp.text()?;
    Ok(Answer {
        status,
        location,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
    })
}

/// A request at the latest version with a JSON body.
fn call(d: &Rivetd, method: &str, path: &str, body: Option<Value>) -> Result<Answer> {
    let text = body.map(|b| b.to_string());
    send(d, Some("latest"), method, path, text.as_deref())
}

/// An answer that must have `status`; its body.
fn expect(a: Answer, status: u16, what: &str) -> Result<Value> {
    ensure!(
        a.status == status,
        "{what}: expected {status}, got {} {}",
        a.status,
        a.body
    );
    Ok(a.body)
}

/// A refusal with `status` whose message contains `needle`; the message.
fn refused(a: Answer, status: u16, needle: &str, what: &str) -> Result<String> {
    let msg = a.fault();
    ensure!(
        a.status == status && msg.contains(needle),
        "{what}: expected {status} with {needle:?}, got {} {msg}",
        a.status
    );
    Ok(msg)
}

fn create(d: &Rivetd, body: Value) -> Result<Value> {
    expect(
        call(d, "POST", "/v1/nodes", Some(body))?,
        201,
        "create node",
    )
}

fn traits_of(d: &Rivetd, node: &str) -> Result<Vec<String>> {
    let v = expect(
        call(d, "GET", &format!("/v1/nodes/{node}/traits"), None)?,
        200,
        "GET traits",
    )?;
    Ok(v["traits"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_str().map(str::to_string))
        .collect())
}

fn start(dir: &Path, config: &str) -> Result<Rivetd> {
    Rivetd::start_in(dir, config)
}

#[test]
fn traits_follow_ironics_rules() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(dir.path(), "")?;
    let n = create(&d, json!({"driver": "fake-hardware", "name": "n1"}))?;
    let uuid = n["uuid"].as_str().unwrap_or_default().to_string();
    let t = |rest: &str| format!("/v1/nodes/n1/traits{rest}");

    assert!(traits_of(&d, "n1")?.is_empty());
    // One trait, no body (ironicclient's add_trait), then one with an empty object.
    let a = send(&d, Some("latest"), "PUT", &t("/CUSTOM_B"), None)?;
    let loc = a.location.clone().unwrap_or_default();
    expect(a, 204, "add CUSTOM_B")?;
    assert!(loc.ends_with("/v1/nodes/n1/traits/CUSTOM_B"), "{loc}");
    expect(
        send(&d, Some("latest"), "PUT", &t("/HW_CPU_X86_VMX"), Some("{}"))?,
        204,
        "add a standard trait",
    )?;
    expect(call(&d, "PUT", &t("/CUSTOM_B"), None)?, 204, "add again")?;
    assert_eq!(traits_of(&d, "n1")?, ["CUSTOM_B", "HW_CPU_X86_VMX"]);
    assert_eq!(traits_of(&d, &uuid)?, ["CUSTOM_B", "HW_CPU_X86_VMX"]);
    assert_eq!(
        d.node("n1")?["traits"],
        json!(["CUSTOM_B", "HW_CPU_X86_VMX"])
    );

    // Names as Ironic's schema checks them, with its messages; nothing changes.
    let msg = refused(call(&d, "PUT", &t("/bad_trait"), None)?, 400, "", "bad")?;
    assert_eq!(
        msg,
        "Schema error for trait: 'bad_trait' is not valid under any of the given schemas. \
         Possible root cause: 'bad_trait' does not match '^CUSTOM_[A-Z0-9_]+$'"
    );
    let long = format!("CUSTOM_{}", "T".repeat(249));
    refused(
        call(&d, "PUT", &t(&format!("/{long}")), None)?,
        400,
        "is too long",
        "too long",
    )?;
    refused(
        call(
            &d,
            "PUT",
            &t(""),
            Some(json!({"traits": ["CUSTOM_3", "BAD_TRAIT"]})),
        )?,
        400,
        "Schema error for body: 'BAD_TRAIT' is not valid under any of the given schemas",
        "bad in a list",
    )?;
    let one_or_all = "A single node trait may be added via PUT";
    refused(
        call(&d, "PUT", &t(""), Some(json!({})))?,
        400,
        one_or_all,
        "{}",
    )?;
    refused(call(&d, "PUT", &t(""), None)?, 400, one_or_all, "no body")?;
    refused(
        call(
            &d,
            "PUT",
            &t("/CUSTOM_3"),
            Some(json!({"traits": ["CUSTOM_3"]})),
        )?,
        400,
        one_or_all,
        "both",
    )?;
    refused(
        call(&d, "PUT", &t(""), Some(json!({"trait": "CUSTOM_3"})))?,
        400,
        "Additional properties are not allowed ('trait' was unexpected)",
        "trait in the body",
    )?;
    assert_eq!(traits_of(&d, "n1")?, ["CUSTOM_B", "HW_CPU_X86_VMX"]);

    // Replace: duplicates dropped, sorted.
    expect(
        call(
            &d,
            "PUT",
            &t(""),
            Some(json!({"traits": ["CUSTOM_X", "HW_CPU_X86_VMX", "CUSTOM_X", "CUSTOM_A"]})),
        )?,
        204,
        "replace",
    )?;
    assert_eq!(
        traits_of(&d, "n1")?,
        ["CUSTOM_A", "CUSTOM_X", "HW_CPU_X86_VMX"]
    );

    // At most 50 per node, whichever way they come.
    let many = |n: usize| -> Vec<String> { (0..n).map(|i| format!("CUSTOM_T{i:02}")).collect() };
    let msg = refused(
        call(&d, "PUT", &t(""), Some(json!({ "traits": many(51) })))?,
        400,
        "(51 vs. 50)",
        "51",
    )?;
    assert!(msg.contains(&uuid), "{msg}");
    assert_eq!(traits_of(&d, "n1")?.len(), 3);
    expect(
        call(&d, "PUT", &t(""), Some(json!({ "traits": many(50) })))?,
        204,
        "50",
    )?;
    refused(
        call(&d, "PUT", &t("/CUSTOM_EXTRA"), None)?,
        400,
        "(51 vs. 50)",
        "51st",
    )?;

    // Removal: a trait the node lacks is 404 naming the node's UUID.
    let msg = refused(
        call(&d, "DELETE", &t("/CUSTOM_NOPE"), None)?,
        404,
        "",
        "absent",
    )?;
    assert_eq!(
        msg,
        format!("Node {uuid} doesn't have a trait 'CUSTOM_NOPE'")
    );
    expect(call(&d, "DELETE", &t("/CUSTOM_T07"), None)?, 204, "remove")?;
    let left = traits_of(&d, "n1")?;
    assert_eq!(left.len(), 49);
    assert!(!left.contains(&"CUSTOM_T07".to_string()));
    expect(call(&d, "DELETE", &t(""), None)?, 204, "remove all")?;
    assert!(traits_of(&d, "n1")?.is_empty());
    expect(call(&d, "DELETE", &t(""), None)?, 204, "remove all again")?;

    for (m, p) in [
        ("GET", "/v1/nodes/ghost/traits"),
        ("PUT", "/v1/nodes/ghost/traits/CUSTOM_X"),
        ("DELETE", "/v1/nodes/ghost/traits"),
        ("DELETE", "/v1/nodes/ghost/traits/CUSTOM_X"),
    ] {
        refused(call(&d, m, p, None)?, 404, "ghost", p)?;
    }
    let a = call(
        &d,
        "PUT",
        "/v1/nodes/ghost/traits",
        Some(json!({"traits": []})),
    )?;
    refused(a, 404, "ghost", "set on ghost")?;
    Ok(())
}

/// Below 1.37 the traits paths answer as Ironic's do: GET 406, PUT 405, DELETE 404.
#[test]
fn traits_version_gates() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(dir.path(), "")?;
    create(&d, json!({"driver": "fake-hardware", "name": "g"}))?;
    let body = Some(r#"{"traits": []}"#);
    for (v, method, path, b, want) in [
        (Some("1.36"), "GET", "/v1/nodes/g/traits", None, 406),
        (None, "GET", "/v1/nodes/g/traits", None, 406),
        (Some("1.36"), "PUT", "/v1/nodes/g/traits", body, 405),
        (
            Some("1.36"),
            "PUT",
            "/v1/nodes/g/traits/CUSTOM_A",
            None,
            405,
        ),
        (Some("1.36"), "DELETE", "/v1/nodes/g/traits", None, 404),
        (
            Some("1.36"),
            "DELETE",
            "/v1/nodes/g/traits/CUSTOM_A",
            None,
            404,
        ),
        (Some("1.37"), "GET", "/v1/nodes/g/traits", None, 200),
        (Some("1.37"), "PUT", "/v1/nodes/g/traits", body, 204),
        (
            Some("1.37"),
            "PUT",
            "/v1/nodes/g/traits/CUSTOM_A",
            None,
            204,
        ),
        (
            Some("1.37"),
            "DELETE",
            "/v1/nodes/g/traits/CUSTOM_A",
            None,
            204,
        ),
        (Some("1.37"), "DELETE", "/v1/nodes/g/traits", None, 204),
    ] {
        let a = send(&d, v, method, path, b)?;
        ensure!(
            a.status == want,
            "{method} {path} at {v:?}: expected {want}, got {} {}",
            a.status,
            a.body
        );
        if want >= 400 {
            ensure!(a.fault().contains("1.37"), "{}", a.fault());
        }
    }
    Ok(())
}

/// While another operation holds the node, what changes it or talks to its BMC is 409;
/// reads Ironic serves under a shared lock are not refused.
#[test]
fn locked_node_refuses_changes_with_409() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(dir.path(), "[conductor]\ncheck_interval_s = 1\n")?;
    create(
        &d,
        json!({"driver": "fake-hardware", "name": "busy", "inspect_interface": "fake"}),
    )?;
    expect(
        call(
            &d,
            "PUT",
            "/v1/nodes/busy/states/provision",
            Some(json!({"target": "manage"})),
        )?,
        202,
        "manage",
    )?;
    d.wait_node("busy", Duration::from_secs(20), |v| {
        v["provision_state"] == "manageable"
    })?;
    // Out-of-band inspection that takes its time holds the node meanwhile.
    expect(
        call(
            &d,
            "PATCH",
            "/v1/nodes/busy",
            Some(json!([{"op": "add", "path": "/driver_info/fake_delay_ms", "value": 5000}])),
        )?,
        200,
        "slow down",
    )?;
    expect(
        call(
            &d,
            "PUT",
            "/v1/nodes/busy/states/provision",
            Some(json!({"target": "inspect"})),
        )?,
        202,
        "inspect",
    )?;
    let n = d.wait_node("busy", Duration::from_secs(10), |v| {
        !v["reservation"].is_null()
    })?;
    let by = n["reservation"].as_str().unwrap_or_default().to_string();
    let started = Instant::now();
    for (m, p, b) in [
        ("PUT", "/v1/nodes/busy/traits/CUSTOM_A", None),
        ("PUT", "/v1/nodes/busy/traits", Some(json!({"traits": []}))),
        ("DELETE", "/v1/nodes/busy/traits", None),
        (
            "PUT",
            "/v1/nodes/busy/management/boot_device",
            Some(json!({"boot_device": "pxe"})),
        ),
        ("GET", "/v1/nodes/busy/management/boot_device", None),
    ] {
        let msg = refused(call(&d, m, p, b)?, 409, "locked", p)?;
        assert!(msg.contains(&by) && msg.contains("busy"), "{msg}");
    }
    for p in [
        "/v1/nodes/busy/traits",
        "/v1/nodes/busy/validate",
        "/v1/nodes/busy/management/boot_device/supported",
    ] {
        expect(call(&d, "GET", p, None)?, 200, p)?;
    }
    ensure!(
        started.elapsed() < Duration::from_secs(4),
        "the refusals outlasted the hold; the test proves nothing"
    );
    // Once the operation ends, the same requests go through.
    d.wait_node("busy", Duration::from_secs(30), |v| {
        v["provision_state"] == "manageable" && v["reservation"].is_null()
    })?;
    expect(
        call(&d, "PUT", "/v1/nodes/busy/traits/CUSTOM_A", None)?,
        204,
        "after",
    )?;
    expect(
        call(
            &d,
            "PUT",
            "/v1/nodes/busy/management/boot_device",
            Some(json!({"boot_device": "disk"})),
        )?,
        204,
        "after",
    )?;
    Ok(())
}

fn interfaces(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k.clone())
        .collect();
    k.sort();
    k
}

fn result(v: &Value, iface: &str) -> (Value, String) {
    (
        v[iface]["result"].clone(),
        v[iface]["reason"].as_str().unwrap_or_default().to_string(),
    )
}

#[test]
fn validate_reports_each_interface() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let www = dir.path().join("www");
    std::fs::create_dir(&www)?;
    for f in ["vmlinuz", "rivet.initramfs"] {
        std::fs::write(www.join(f), b"x")?;
    }
    let d = start(
        dir.path(),
        &format!("[boot]\nartefact_dir = {:?}\n", www.display().to_string()),
    )?;
    let all = [
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
        "storage",
    ];

    // fake-hardware with its defaults: everything passes, and a pass has no reason.
    create(&d, json!({"driver": "fake-hardware", "name": "plain"}))?;
    let v = expect(
        call(&d, "GET", "/v1/nodes/plain/validate", None)?,
        200,
        "plain",
    )?;
    assert_eq!(interfaces(&v), all, "{v}");
    for i in all {
        assert_eq!(v[i], json!({"result": true}), "{i}: {v}");
    }

    // The agent's deploy over iPXE: each missing piece fails with what is missing.
    let n = create(
        &d,
        json!({"driver": "fake-hardware", "name": "direct", "deploy_interface": "direct",
               "boot_interface": "ipxe", "inspect_interface": "agent"}),
    )?;
    let uuid = n["uuid"].as_str().unwrap_or_default().to_string();
    let validate = || -> Result<Value> {
        expect(
            call(&d, "GET", "/v1/nodes/direct/validate", None)?,
            200,
            "direct",
        )
    };
    let v = validate()?;
    let (r, why) = result(&v, "boot");
    assert_eq!(r, false, "{v}");
    assert_eq!(
        why,
        format!("Node {uuid} does not have any port associated with it")
    );
    assert_eq!(result(&v, "deploy"), (json!(false), why.clone()), "{v}");
    assert_eq!(result(&v, "inspect"), (json!(false), why), "{v}");
    assert_eq!(v["power"], json!({"result": true}), "{v}");
    expect(
        call(
            &d,
            "POST",
            "/v1/ports",
            Some(json!({"node_uuid": "direct", "address": "52:54:00:00:00:01"})),
        )?,
        201,
        "port",
    )?;
    let v = validate()?;
    assert_eq!(v["boot"], json!({"result": true}), "{v}");
    let (r, why) = result(&v, "deploy");
    assert_eq!(r, false, "{v}");
    assert!(
        why.contains("Missing are: ['instance_info.image_source']"),
        "{why}"
    );
    let patch = |ops: Value| -> Result<()> {
        expect(
            call(&d, "PATCH", "/v1/nodes/direct", Some(ops))?,
            200,
            "patch",
        )
        .map(|_| ())
    };
    patch(
        json!([{"op": "add", "path": "/instance_info/image_source", "value": "http://h/i.raw"}]),
    )?;
    let (_, why) = result(&validate()?, "deploy");
    assert!(why.contains("image_checksum"), "{why}");
    patch(json!([
        {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
        {"op": "add", "path": "/instance_info/image_os_hash_value", "value": "ab".repeat(32)},
    ]))?;
    assert_eq!(validate()?["deploy"], json!({"result": true}));
    patch(json!([{"op": "add", "path": "/properties/root_device", "value": {"colour": "blue"}}]))?;
    let (r, why) = result(&validate()?, "deploy");
    assert_eq!(r, false);
    assert!(why.contains("root_device"), "{why}");
    patch(json!([{"op": "remove", "path": "/properties/root_device"}]))?;
    // The artefacts are checked on every call.
    std::fs::remove_file(www.join("rivet.initramfs"))?;
    let v = validate()?;
    let (r, why) = result(&v, "boot");
    assert_eq!(r, false);
    assert!(why.contains("rivet.initramfs"), "{why}");
    assert_eq!(v["deploy"]["reason"], v["boot"]["reason"], "{v}");

    // redfish without driver_info: its own interfaces fail naming the field; no-* fail as
    // Ironic's do; noop passes.
    create(&d, json!({"driver": "redfish", "name": "rf"}))?;
    let v = expect(call(&d, "GET", "/v1/nodes/rf/validate", None)?, 200, "rf")?;
    assert_eq!(interfaces(&v), all, "{v}");
    for i in ["power", "management", "bios", "firmware"] {
        let (r, why) = result(&v, i);
        assert_eq!(r, false, "{i}: {v}");
        assert!(why.contains("redfish_address"), "{i}: {why}");
    }
    for i in ["rescue", "raid", "console"] {
        assert_eq!(
            result(&v, i),
            (
                json!(false),
                format!("Driver redfish does not support {i} (disabled or not implemented).")
            ),
            "{v}"
        );
    }
    assert_eq!(v["network"], json!({"result": true}), "{v}");
    assert_eq!(v["storage"], json!({"result": true}), "{v}");

    refused(
        call(&d, "GET", "/v1/nodes/ghost/validate", None)?,
        404,
        "ghost",
        "ghost",
    )?;
    Ok(())
}

fn boot_device(d: &Rivetd, node: &str) -> Result<Value> {
    expect(
        call(
            d,
            "GET",
            &format!("/v1/nodes/{node}/management/boot_device"),
            None,
        )?,
        200,
        "GET boot device",
    )
}

fn set_boot_device(d: &Rivetd, node: &str, body: Value) -> Result<Answer> {
    call(
        d,
        "PUT",
        &format!("/v1/nodes/{node}/management/boot_device"),
        Some(body),
    )
}

fn supported(d: &Rivetd, node: &str) -> Result<Value> {
    expect(
        call(
            d,
            "GET",
            &format!("/v1/nodes/{node}/management/boot_device/supported"),
            None,
        )?,
        200,
        "supported",
    )
}

#[test]
fn boot_device_on_fake_hardware() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(dir.path(), "")?;
    create(&d, json!({"driver": "fake-hardware", "name": "f"}))?;
    assert_eq!(
        supported(&d, "f")?,
        json!({"supported_boot_devices": ["pxe", "disk", "cdrom"]})
    );
    assert_eq!(
        boot_device(&d, "f")?,
        json!({"boot_device": "pxe", "persistent": false})
    );
    for (body, want) in [
        (
            json!({"boot_device": "disk", "persistent": true}),
            json!({"boot_device": "disk", "persistent": true}),
        ),
        (
            json!({"boot_device": "cdrom"}),
            json!({"boot_device": "cdrom", "persistent": false}),
        ),
    ] {
        let a = set_boot_device(&d, "f", body.clone())?;
        assert!(a.body.is_null(), "204 has no body: {}", a.body);
        expect(a, 204, &body.to_string())?;
        assert_eq!(boot_device(&d, "f")?, want);
    }
    // persistent as a query parameter, as Ironic takes it.
    expect(
        send(
            &d,
            Some("latest"),
            "PUT",
            "/v1/nodes/f/management/boot_device?persistent=True",
            Some(r#"{"boot_device": "pxe"}"#),
        )?,
        204,
        "query persistent",
    )?;
    assert_eq!(
        boot_device(&d, "f")?,
        json!({"boot_device": "pxe", "persistent": true})
    );

    let msg = refused(
        set_boot_device(&d, "f", json!({"boot_device": "bios"}))?,
        400,
        "",
        "bios",
    )?;
    assert_eq!(
        msg,
        "Invalid boot device bios specified, supported are pxe, disk, cdrom."
    );
    for (body, needle) in [
        (
            json!({"boot_device": "floppy"}),
            "Invalid boot device floppy",
        ),
        (json!({}), "boot_device"),
        (json!({"boot_device": 5}), "boot_device"),
        (json!({"boot_device": "pxe", "colour": 1}), "colour"),
        (
            json!({"boot_device": "pxe", "persistent": "perhaps"}),
            "persistent",
        ),
    ] {
        refused(
            set_boot_device(&d, "f", body.clone())?,
            400,
            needle,
            &body.to_string(),
        )?;
    }
    refused(
        send(
            &d,
            Some("latest"),
            "PUT",
            "/v1/nodes/f/management/boot_device?persistent=blah",
            Some(r#"{"boot_device": "pxe"}"#),
        )?,
        400,
        "persistent",
        "query blah",
    )?;
    // Nothing above changed the device.
    assert_eq!(
        boot_device(&d, "f")?,
        json!({"boot_device": "pxe", "persistent": true})
    );

    for p in [
        "/v1/nodes/ghost/management/boot_device",
        "/v1/nodes/ghost/management/boot_device/supported",
    ] {
        refused(call(&d, "GET", p, None)?, 404, "ghost", p)?;
    }
    refused(
        set_boot_device(&d, "ghost", json!({"boot_device": "pxe"}))?,
        404,
        "ghost",
        "PUT ghost",
    )?;

    // A BMC that fails is a server-side failure; bad driver_info the caller's (400).
    create(
        &d,
        json!({"driver": "fake-hardware", "name": "broken", "driver_info": {"fake_fail": "BMC on fire"}}),
    )?;
    refused(
        call(&d, "GET", "/v1/nodes/broken/management/boot_device", None)?,
        500,
        "BMC on fire",
        "failing BMC",
    )?;
    create(
        &d,
        json!({"driver": "fake-hardware", "name": "odd", "driver_info": {"fake_delay_ms": "soon"}}),
    )?;
    refused(
        set_boot_device(&d, "odd", json!({"boot_device": "pxe"}))?,
        400,
        "fake_delay_ms",
        "bad driver_info",
    )?;
    Ok(())
}

#[test]
fn vmedia_gates_and_refusals() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(dir.path(), "")?;
    create(&d, json!({"driver": "fake-hardware", "name": "v"}))?;
    let attach = r#"{"device_type": "cdrom", "image_url": "http://h/x.iso"}"#;
    for (ver, m, b) in [
        ("1.88", "POST", Some(attach)),
        ("1.88", "DELETE", None),
        ("1.1", "DELETE", None),
        ("1.92", "GET", None),
        ("1.88", "GET", None),
    ] {
        let a = send(&d, Some(ver), m, "/v1/nodes/v/vmedia", b)?;
        refused(a, 404, "vmedia", &format!("{m} at {ver}"))?;
    }
    refused(
        send(&d, Some("1.88"), "DELETE", "/v1/nodes/v/vmedia/cdrom", None)?,
        404,
        "vmedia",
        "DELETE one at 1.88",
    )?;
    // At its version the request reaches the driver: fake-hardware's fake BMC keeps the
    // medium in memory (Ironic's fake-hardware accepts both calls), and lists it.
    expect(
        send(&d, Some("1.89"), "POST", "/v1/nodes/v/vmedia", Some(attach))?,
        204,
        "attach on fake",
    )?;
    let listed = expect(
        send(&d, Some("1.93"), "GET", "/v1/nodes/v/vmedia", None)?,
        200,
        "list on fake",
    )?;
    assert_eq!(listed[0]["inserted"], true, "{listed}");
    assert_eq!(listed[0]["image"], "http://h/x.iso", "{listed}");
    expect(
        send(&d, Some("1.89"), "DELETE", "/v1/nodes/v/vmedia", None)?,
        204,
        "detach on fake",
    )?;
    let listed = expect(
        send(&d, Some("1.93"), "GET", "/v1/nodes/v/vmedia", None)?,
        200,
        "list on fake after detach",
    )?;
    assert_eq!(listed[0]["inserted"], false, "{listed}");
    // Bodies as Ironic's schema checks them.
    for (body, needle) in [
        (
            json!({"image_url": "http://image"}),
            "'device_type' is a required property",
        ),
        (
            json!({"device_type": "cat", "image_url": "http://image"}),
            "'cat' is not one of",
        ),
        (
            json!({"device_type": "cdrom"}),
            "'image_url' is a required property",
        ),
        (
            json!({"device_type": "cdrom", "image_url": "abcd"}),
            "Unsupported or missing URL scheme",
        ),
        (
            json!({"device_type": "cdrom", "image_url": "http://x", "image_download_source": "ftp"}),
            "'ftp' is not one of",
        ),
        (
            json!({"device_type": "cdrom", "image_url": "http://x", "x": 1}),
            "('x' was unexpected)",
        ),
    ] {
        refused(
            call(&d, "POST", "/v1/nodes/v/vmedia", Some(body.clone()))?,
            400,
            needle,
            &body.to_string(),
        )?;
    }
    refused(
        call(
            &d,
            "DELETE",
            "/v1/nodes/v/vmedia?device_types=cdrom,cat",
            None,
        )?,
        400,
        "Invalid device type(s) cat (valid are disk, cdrom, floppy)",
        "detach cat",
    )?;
    refused(
        call(&d, "DELETE", "/v1/nodes/v/vmedia/cat", None)?,
        400,
        "Invalid device type(s) cat",
        "detach cat by path",
    )?;
    for (m, b) in [("GET", None), ("POST", Some(attach)), ("DELETE", None)] {
        refused(
            send(&d, Some("latest"), m, "/v1/nodes/ghost/vmedia", b)?,
            404,
            "ghost",
            m,
        )?;
    }
    Ok(())
}

// ------------------------------------------------------------------ sushy-tools

fn sushy_ok() -> bool {
    prerequisite(
        have_sushy(),
        "sushy-emulator in .venv-sushy (scripts/setup-peers.sh installs sushy-tools)",
    )
}

/// The boot device and virtual media through the API, seen in the Redfish emulator.
#[test]
fn redfish_boot_device_and_vmedia_reach_the_emulator() -> Result<()> {
    if !sushy_ok() {
        return Ok(());
    }
    let sys = FakeSystem::new("node-api", "52:54:00:AB:CD:10");
    let sushy = Sushy::start(SushyOptions {
        systems: vec![sys.clone()],
        ..SushyOptions::default()
    })?;
    let dir = tempfile::tempdir()?;
    let d = start(dir.path(), "[drivers]\npoll_interval_ms = 200\n")?;
    create(
        &d,
        json!({"driver": "redfish", "name": "r", "driver_info": sushy.driver_info(&sys.uuid, "u", "p")}),
    )?;
    assert_eq!(
        supported(&d, "r")?,
        json!({"supported_boot_devices": ["pxe", "disk", "cdrom", "bios", "uefihttp"]})
    );
    // The emulator keeps every override "Continuous" (libvirt has no one-time boot), and
    // the API shows what the BMC reports.
    for (body, target, shown) in [
        (json!({"boot_device": "pxe"}), "Pxe", "pxe"),
        (
            json!({"boot_device": "cdrom", "persistent": true}),
            "Cd",
            "cdrom",
        ),
        (json!({"boot_device": "disk"}), "Hdd", "disk"),
    ] {
        expect(
            set_boot_device(&d, "r", body.clone())?,
            204,
            &body.to_string(),
        )?;
        let boot = &sushy.system(&sys.uuid)?["Boot"];
        assert_eq!(boot["BootSourceOverrideTarget"], target, "{boot}");
        assert_eq!(boot["BootSourceOverrideEnabled"], "Continuous", "{boot}");
        assert_eq!(
            boot_device(&d, "r")?,
            json!({"boot_device": shown, "persistent": true})
        );
    }
    refused(
        set_boot_device(&d, "r", json!({"boot_device": "safe"}))?,
        400,
        "Invalid boot device safe specified, supported are pxe, disk, cdrom, bios, uefihttp.",
        "safe on redfish",
    )?;

    // Virtual media: the emulator downloads the image from our file server.
    let files = FileServer::start(b"not really an ISO, but bytes to download".to_vec())?;
    let url = format!("{}/api.iso", files.url);
    let cd_path = format!("/redfish/v1/Systems/{}/VirtualMedia/Cd", sys.uuid);
    expect(
        send(
            &d,
            Some("1.89"),
            "POST",
            "/v1/nodes/r/vmedia",
            Some(
                &json!({"device_type": "cdrom", "image_url": url, "image_download_source": "http"})
                    .to_string(),
            ),
        )?,
        204,
        "attach",
    )?;
    let cd = sushy.get(&cd_path)?;
    assert_eq!(cd["Inserted"], true, "{cd}");
    assert_eq!(cd["Image"], url.as_str(), "{cd}");
    assert!(files.hits() >= 1, "the emulator did not download the image");
    let list = expect(
        send(&d, Some("1.93"), "GET", "/v1/nodes/r/vmedia", None)?,
        200,
        "list",
    )?;
    let cd_entry = list
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| {
            m["media_types"]
                .as_array()
                .is_some_and(|t| t.contains(&json!("CD")))
        })
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(cd_entry["inserted"], true, "{list}");
    assert_eq!(cd_entry["image"], url.as_str(), "{list}");
    refused(
        call(
            &d,
            "POST",
            "/v1/nodes/r/vmedia",
            Some(json!({"device_type": "floppy", "image_url": url})),
        )?,
        400,
        "cdrom only",
        "floppy",
    )?;
    refused(
        call(&d, "DELETE", "/v1/nodes/r/vmedia?device_types=floppy", None)?,
        400,
        "cdrom only",
        "detach floppy",
    )?;
    assert_eq!(sushy.get(&cd_path)?["Inserted"], true);
    expect(
        call(&d, "DELETE", "/v1/nodes/r/vmedia/cdrom", None)?,
        204,
        "detach",
    )?;
    assert_eq!(sushy.get(&cd_path)?["Inserted"], false);
    let list = expect(call(&d, "GET", "/v1/nodes/r/vmedia", None)?, 200, "list")?;
    assert!(
        list.as_array()
            .into_iter()
            .flatten()
            .all(|m| m["inserted"] != true),
        "{list}"
    );
    expect(
        call(&d, "DELETE", "/v1/nodes/r/vmedia", None)?,
        204,
        "detach twice",
    )?;
    Ok(())
}

// ------------------------------------------------------------------ ipmi_sim

/// The boot device through the API against OpenIPMI's simulator: set with `chassis
/// bootdev`, read back with `chassis bootparam get 5`.
#[test]
fn ipmi_boot_device_through_the_api() -> Result<()> {
    if !prerequisite(
        have_ipmi_sim(),
        "ipmi_sim and ipmitool (Debian openipmi, ipmitool; scripts/setup-peers.sh)",
    ) {
        return Ok(());
    }
    let sim = IpmiSim::start("admin", "ipmi-S3cret-pw")?;
    let dir = tempfile::tempdir()?;
    let d = start(dir.path(), "[drivers]\npoll_interval_ms = 100\n")?;
    create(
        &d,
        json!({"driver": "ipmi", "name": "i", "driver_info": sim.driver_info("ipmi-S3cret-pw")}),
    )?;
    assert_eq!(
        supported(&d, "i")?,
        json!({"supported_boot_devices": ["pxe", "disk", "cdrom", "bios", "safe"]})
    );
    for (dev, at_chassis) in [
        ("pxe", "pxe"),
        ("disk", "default"),
        ("cdrom", "cdrom"),
        ("bios", "bios"),
    ] {
        expect(
            set_boot_device(&d, "i", json!({ "boot_device": dev }))?,
            204,
            dev,
        )?;
        assert_eq!(sim.boot(), at_chassis, "{dev}");
        assert_eq!(
            boot_device(&d, "i")?,
            json!({"boot_device": dev, "persistent": false}),
            "{dev}"
        );
    }
    refused(
        set_boot_device(&d, "i", json!({"boot_device": "uefihttp"}))?,
        400,
        "Invalid boot device uefihttp specified",
        "uefihttp on ipmi",
    )?;
    assert_eq!(sim.boot(), "bios");
    // A BMC that does not answer is a server-side failure, never a hang.
    create(
        &d,
        json!({"driver": "ipmi", "name": "gone", "driver_info": {"ipmi_address": "127.0.0.1",
               "ipmi_port": rivet_tests::peers::free_udp_port()?, "ipmi_username": "admin",
               "ipmi_password": "x"}}),
    )?;
    let started = Instant::now();
    refused(
        call(&d, "GET", "/v1/nodes/gone/management/boot_device", None)?,
        500,
        "ipmi",
        "unreachable BMC",
    )?;
    assert!(started.elapsed() < Duration::from_secs(30));
    Ok(())
}

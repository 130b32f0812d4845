//! Deploy templates (1.55) and runbooks (1.92, traits 1.112) on a real rivetd: CRUD with
//! Ironic's validation, codes and gates through raw HTTP and both stock clients; a manual
//! clean by runbook that runs the runbook's steps on the real agent (a test plugin whose
//! steps leave traces); and a deploy whose template step runs between the default steps
//! (root: loop device, sgdisk).

use anyhow::{ensure, Context, Result};
use rivet_tests::agentproc::{have, is_root, AgentProcess, LoopDevice};
use rivet_tests::clients::{self, baremetal, baremetal_failing, baremetal_json, sdk};
use rivet_tests::fileserver::FileServer;
use rivet_tests::{fault, prerequisite, run_tool, sha256_file, Rivetd, DEPLOY_TEST_CONFIG};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A plugin with two clean steps, `count_step` and `count_again` (priority 0: run only when
/// asked for), each recording `start TAG`/`done TAG` lines in `$RIVET_TEST_DIR/count`.
const TEST_PLUGIN: &str = r#"#!/bin/sh
set -u
case "${1:-}" in
describe) echo '{"name": "test-steps", "support_level": 1}' ;;
steps) cat <<'JSON'
[{"interface": "deploy", "step": "count_step", "priority": 0, "abortable": true,
  "argsinfo": {"tag": {"description": "line to record", "required": true}}},
 {"interface": "deploy", "step": "count_again", "priority": 0, "abortable": true,
  "argsinfo": {"tag": {"description": "line to record", "required": true}}}]
JSON
;;
execute)
  req=$(cat)
  tag=${req#*\"tag\":\"}; [ "$tag" = "$req" ] && tag=none; tag=${tag%%\"*}
  echo "start $tag" >> "$RIVET_TEST_DIR/count"
  echo "done $tag" >> "$RIVET_TEST_DIR/count"
  echo "{\"tag\": \"$tag\"}" ;;
esac
"#;

fn write_plugin(dir: &Path) -> Result<PathBuf> {
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins)?;
    let plugin = plugins.join("test-steps");
    std::fs::write(&plugin, TEST_PLUGIN)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))?;
    Ok(plugins)
}

fn count_lines(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("count"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn steps(tag: &str, priority: i64) -> Value {
    json!([{"interface": "deploy", "step": "count_step", "args": {"tag": tag}, "priority": priority}])
}

#[test]
fn deploy_templates_crud_validation_and_clients() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start_in(dir.path(), "")?;

    let (s, _) = d.call_at(Some("1.54"), "GET", "/v1/deploy_templates", None)?;
    assert_eq!(s, 404);
    let (s, t) = d.call(
        "POST",
        "/v1/deploy_templates",
        Some(
            json!({"name": "CUSTOM_RAID", "steps": steps("raid", 75), "description": "d",
                    "extra": {"a": 1}}),
        ),
    )?;
    assert_eq!(s, 201, "{t}");
    assert_eq!(t["steps"][0]["priority"], 75, "{t}");
    assert_eq!(t["description"], "d", "{t}");
    let uuid = t["uuid"].as_str().context("uuid")?.to_string();
    // Bad templates: 400, nothing stored.
    for (body, want) in [
        (json!({"name": "raid", "steps": steps("x", 1)}), "raid"),
        (json!({"name": "CUSTOM_X", "steps": []}), "too short"),
        (
            json!({"name": "CUSTOM_X", "steps": [{"interface": "disk", "step": "s", "args": {}, "priority": 1}]}),
            "disk",
        ),
        (
            json!({"name": "CUSTOM_X", "steps": [{"interface": "deploy", "step": "s", "priority": 1}]}),
            "'args' is a required property",
        ),
        (
            json!({"name": "CUSTOM_X", "steps": [{"interface": "deploy", "step": "s", "args": {}, "priority": -1}]}),
            "priority",
        ),
        (
            json!({"name": "CUSTOM_X", "steps": [{"interface": "deploy", "step": "s", "args": {}, "priority": 1},
                                               {"interface": "deploy", "step": "s", "args": {}, "priority": 2}]}),
            "Duplicate",
        ),
        (
            json!({"name": "CUSTOM_X", "steps": steps("x", 1), "colour": "red"}),
            "colour",
        ),
    ] {
        let (s, v) = d.call("POST", "/v1/deploy_templates", Some(body.clone()))?;
        assert_eq!(s, 400, "{body}: {v}");
        assert!(fault(&v).contains(want), "{body}: {v}");
    }
    let (s, v) = d.call(
        "POST",
        "/v1/deploy_templates",
        Some(json!({"name": "CUSTOM_RAID", "steps": steps("y", 1)})),
    )?;
    assert_eq!(s, 409, "{v}");
    let (s, v) = d.call("GET", "/v1/deploy_templates", None)?;
    assert!(
        s == 200 && v["deploy_templates"].as_array().map(Vec::len) == Some(1),
        "{v}"
    );
    assert_eq!(
        v["deploy_templates"][0].as_object().map(|o| o.len()),
        Some(3),
        "uuid, name, links: {v}"
    );
    let (s, v) = d.call("GET", "/v1/deploy_templates?detail=true", None)?;
    assert!(
        s == 200 && v["deploy_templates"][0]["steps"][0]["step"] == "count_step",
        "{v}"
    );
    let (s, v) = d.call("GET", "/v1/deploy_templates/CUSTOM_RAID?fields=name", None)?;
    // The field asked for, and `links` (Ironic's `sanitize_dict` always keeps them).
    assert!(
        s == 200
            && v["name"] == "CUSTOM_RAID"
            && v["links"].is_array()
            && v.as_object().map(|o| o.len()) == Some(2),
        "{v}"
    );
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/deploy_templates/{uuid}"),
        Some(json!([{"op": "replace", "path": "/steps/0/priority", "value": 55}])),
    )?;
    assert!(s == 200 && v["steps"][0]["priority"] == 55, "{v}");
    let (s, v) = d.call(
        "PATCH",
        &format!("/v1/deploy_templates/{uuid}"),
        Some(json!([{"op": "replace", "path": "/steps/0/priority", "value": "high"}])),
    )?;
    assert_eq!(s, 400, "{v}");
    let (s, v) = d.call("GET", "/v1/deploy_templates/CUSTOM_NONE", None)?;
    assert_eq!(s, 404, "{v}");
    let (s, _) = d.call("DELETE", &format!("/v1/deploy_templates/{uuid}"), None)?;
    assert_eq!(s, 204);
    let (s, _) = d.call("DELETE", &format!("/v1/deploy_templates/{uuid}"), None)?;
    assert_eq!(s, 404);

    if !clients::available() {
        return Ok(());
    }
    // python-ironicclient.
    let steps_json = steps("cli", 70).to_string();
    let t = baremetal_json(
        &d,
        &[
            "deploy",
            "template",
            "create",
            "CUSTOM_CLI",
            "--steps",
            &steps_json,
            "--extra",
            "k=v",
        ],
    )?;
    assert_eq!(t["name"], "CUSTOM_CLI", "{t}");
    let shown = baremetal_json(&d, &["deploy", "template", "show", "CUSTOM_CLI"])?;
    assert_eq!(shown["steps"][0]["args"]["tag"], "cli", "{shown}");
    baremetal(
        &d,
        &[
            "deploy",
            "template",
            "set",
            "CUSTOM_CLI",
            "--name",
            "CUSTOM_CLI2",
        ],
    )?;
    baremetal(
        &d,
        &["deploy", "template", "unset", "CUSTOM_CLI2", "--extra", "k"],
    )?;
    let listed = baremetal_json(&d, &["deploy", "template", "list", "--long"])?;
    assert!(listed.to_string().contains("CUSTOM_CLI2"), "{listed}");
    let err = baremetal_failing(
        &d,
        &[
            "deploy",
            "template",
            "create",
            "not-a-trait",
            "--steps",
            &steps_json,
        ],
    )?;
    assert!(err.contains("not-a-trait"), "{err}");
    let err = baremetal_failing(&d, &["deploy", "template", "show", "CUSTOM_GONE"])?;
    assert!(err.contains("could not be found"), "{err}");
    baremetal(&d, &["deploy", "template", "delete", "CUSTOM_CLI2"])?;

    // openstacksdk.
    let v = sdk(
        &d,
        &format!(
            "t = conn.baremetal.create_deploy_template(name='CUSTOM_SDK', steps={steps})\n\
             got = conn.baremetal.get_deploy_template(t.id)\n\
             upd = conn.baremetal.update_deploy_template(got, extra={{'x': 'y'}})\n\
             names = [x.name for x in conn.baremetal.deploy_templates(details=True)]\n\
             conn.baremetal.delete_deploy_template(t.id)\n\
             try:\n    conn.baremetal.get_deploy_template(t.id)\n    gone = 'found'\n\
             except Exception as e:\n    gone = type(e).__name__\n\
             emit({{'steps': got.steps, 'extra': upd.extra, 'names': names, 'gone': gone}})",
            steps = steps("sdk", 65)
        ),
    )?;
    assert_eq!(v["steps"][0]["priority"], 65, "{v}");
    assert_eq!(v["extra"], json!({"x": "y"}), "{v}");
    assert_eq!(v["names"], json!(["CUSTOM_SDK"]), "{v}");
    assert_eq!(v["gone"], "NotFoundException", "{v}");
    Ok(())
}

fn runbook_steps(tag: &str, order: i64) -> Value {
    let step = if order % 2 == 0 {
        "count_again"
    } else {
        "count_step"
    };
    json!({"interface": "deploy", "step": step, "args": {"tag": tag}, "order": order})
}

#[test]
fn runbooks_crud_traits_and_clients() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start_in(dir.path(), "")?;
    let (s, _) = d.call_at(Some("1.91"), "GET", "/v1/runbooks", None)?;
    assert_eq!(s, 404);
    // 1.92: the name is a trait; no description or traits.
    let (s, v) = d.call_at(
        Some("1.92"),
        "POST",
        "/v1/runbooks",
        Some(json!({"name": "my-book", "steps": [runbook_steps("a", 1)]})),
    )?;
    assert_eq!(s, 400, "{v}");
    let (s, v) = d.call_at(
        Some("1.92"),
        "POST",
        "/v1/runbooks",
        Some(json!({"name": "CUSTOM_BOOK", "steps": [runbook_steps("a", 1)], "description": "x"})),
    )?;
    assert_eq!(s, 400, "{v}");
    let (s, rb) = d.call_at(Some("1.92"),
        "POST",
        "/v1/runbooks",
        Some(
            json!({"name": "CUSTOM_BOOK", "steps": [runbook_steps("b", 2), runbook_steps("a", 1)], "public": true}),
        ),
    )?;
    assert_eq!(s, 201, "{rb}");
    assert!(
        rb.get("traits").is_none() && rb["public"] == true && rb["steps"][0]["order"] == 2,
        "{rb}"
    );
    let (s, v) = d.call_at(
        Some("1.92"),
        "POST",
        "/v1/runbooks",
        Some(json!({"name": "CUSTOM_BOOK", "steps": [runbook_steps("a", 1)]})),
    )?;
    assert_eq!(s, 409, "{v}");
    let (s, v) = d.call(
        "POST",
        "/v1/runbooks",
        Some(json!({"name": "x", "steps": [{"interface": "deploy", "step": "count_step"}]})),
    )?;
    assert!(s == 400 && fault(&v).contains("order"), "{v}");
    // 1.112: free names, description, traits through their sub-resource.
    let (s, v) = d.call("POST", "/v1/runbooks", Some(json!({"name": "nightly-wipe", "description": "wipe", "steps": [runbook_steps("n", 1)]})))?;
    assert!(
        s == 201 && v["traits"] == json!([]) && v["description"] == "wipe",
        "{v}"
    );
    let (s, v) = d.call(
        "POST",
        "/v1/runbooks",
        Some(json!({"name": "x2", "traits": ["CUSTOM_A"], "steps": [runbook_steps("n", 1)]})),
    )?;
    assert_eq!(s, 400, "{v}");
    let (s, v) = d.call("PUT", "/v1/runbooks/nightly-wipe/traits/CUSTOM_WIPE", None)?;
    assert_eq!(s, 204, "{v}");
    let (s, v) = d.call(
        "PUT",
        "/v1/runbooks/nightly-wipe/traits",
        Some(json!({"traits": ["CUSTOM_WIPE", "CUSTOM_B"]})),
    )?;
    assert_eq!(s, 204, "{v}");
    let (s, v) = d.call("GET", "/v1/runbooks/nightly-wipe/traits", None)?;
    assert!(
        s == 200 && v == json!({"traits": ["CUSTOM_B", "CUSTOM_WIPE"]}),
        "{v}"
    );
    let (s, v) = d.call("PUT", "/v1/runbooks/nightly-wipe/traits/bad", None)?;
    assert_eq!(s, 400, "{v}");
    let (s, _) = d.call("DELETE", "/v1/runbooks/nightly-wipe/traits/CUSTOM_B", None)?;
    assert_eq!(s, 204);
    let (s, v) = d.call_at(
        Some("1.111"),
        "GET",
        "/v1/runbooks/nightly-wipe/traits",
        None,
    )?;
    assert_eq!(s, 404, "{v}");
    let (s, v) = d.call("PATCH", "/v1/runbooks/nightly-wipe", Some(json!([{"op": "replace", "path": "/steps/0/order", "value": 5}, {"op": "replace", "path": "/description", "value": "w2"}])))?;
    assert!(
        s == 200
            && v["steps"][0]["order"] == 5
            && v["description"] == "w2"
            && v["traits"] == json!(["CUSTOM_WIPE"]),
        "{v}"
    );
    let (s, v) = d.call("GET", "/v1/runbooks?public=true", None)?;
    assert!(
        s == 200 && v["runbooks"].as_array().map(Vec::len) == Some(1),
        "{v}"
    );
    let (s, _) = d.call("DELETE", "/v1/runbooks/nightly-wipe", None)?;
    assert_eq!(s, 204);
    let (s, _) = d.call("GET", "/v1/runbooks/nightly-wipe", None)?;
    assert_eq!(s, 404);

    if !clients::available() {
        return Ok(());
    }
    // python-ironicclient (1.115 by negotiation).
    let st = json!([runbook_steps("cli", 1)]).to_string();
    let rb = baremetal_json(
        &d,
        &[
            "runbook",
            "create",
            "--name",
            "cli-book",
            "--steps",
            &st,
            "--description",
            "from cli",
        ],
    )?;
    assert_eq!(rb["description"], "from cli", "{rb}");
    baremetal(&d, &["runbook", "trait", "add", "cli-book", "CUSTOM_CLI"])?;
    let traits = baremetal(&d, &["runbook", "trait", "list", "cli-book"])?;
    assert!(traits.contains("CUSTOM_CLI"), "{traits}");
    baremetal(&d, &["runbook", "set", "cli-book", "--extra", "a=b"])?;
    let shown = baremetal_json(&d, &["runbook", "show", "cli-book"])?;
    assert!(
        shown["extra"] == json!({"a": "b"}) && shown["traits"] == json!(["CUSTOM_CLI"]),
        "{shown}"
    );
    let listed = baremetal_json(&d, &["runbook", "list"])?;
    assert!(listed.to_string().contains("cli-book"), "{listed}");
    let err = baremetal_failing(&d, &["runbook", "show", "no-book"])?;
    assert!(err.contains("could not be found"), "{err}");
    baremetal(&d, &["runbook", "delete", "cli-book"])?;

    // openstacksdk.
    let v = sdk(
        &d,
        &format!(
            "r = conn.baremetal.create_runbook(name='sdk-book', steps={st})\n\
             conn.baremetal.add_runbook_trait(r, 'CUSTOM_SDK')\n\
             got = conn.baremetal.get_runbook('sdk-book')\n\
             upd = conn.baremetal.update_runbook(got, extra={{'x': 'y'}})\n\
             names = [x.name for x in conn.baremetal.runbooks()]\n\
             conn.baremetal.delete_runbook(got.id)\n\
             try:\n    conn.baremetal.get_runbook(got.id)\n    gone = 'found'\n\
             except Exception as e:\n    gone = type(e).__name__\n\
             emit({{'traits': got.traits, 'extra': upd.extra, 'names': names, 'gone': gone}})",
            st = json!([runbook_steps("sdk", 1)])
        ),
    )?;
    assert_eq!(v["traits"], json!(["CUSTOM_SDK"]), "{v}");
    assert_eq!(v["extra"], json!({"x": "y"}), "{v}");
    assert!(v["names"].to_string().contains("sdk-book"), "{v}");
    assert_eq!(v["gone"], "NotFoundException", "{v}");
    Ok(())
}

/// rivetd with quick timings, node n1 (fake-hardware, agent deploy interface) manageable.
fn clean_scene(dir: &Path) -> Result<(Rivetd, String)> {
    let d = Rivetd::start_in(
        dir,
        "[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n",
    )?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(
            json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "n1",
                    "properties": {"capabilities": "boot_mode:bios"}}),
        ),
    )?;
    ensure!(s == 201, "{v}");
    let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    ensure!(s == 202, "{v}");
    d.wait_node("n1", Duration::from_secs(20), |v| {
        v["provision_state"] == "manageable"
    })?;
    Ok((d, uuid))
}

#[test]
fn manual_clean_by_runbook_runs_its_steps() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (d, uuid) = clean_scene(dir.path())?;
    let plugins = write_plugin(dir.path())?;
    let disk = dir.path().join("disk0.img");
    std::fs::File::create(&disk)?.set_len(32 << 20)?;
    let test_dir = dir.path().display().to_string();
    let agent = |log: &str| {
        AgentProcess::start(
            &d.url,
            &uuid,
            &[disk.as_path()],
            Some(&plugins),
            &dir.path().join(log),
            &[("RIVET_TEST_DIR", test_dir.as_str())],
        )
    };
    let (s, v) = d.call_at(Some("1.92"),
        "POST",
        "/v1/runbooks",
        Some(
            json!({"name": "CUSTOM_COUNT", "steps": [runbook_steps("second", 2), runbook_steps("first", 1)]}),
        ),
    )?;
    ensure!(s == 201, "{v}");

    // Not approved for the node (its traits lack the runbook's name): 400, nothing runs.
    let (s, v) = d.call_at(
        Some("1.92"),
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "clean", "runbook": "CUSTOM_COUNT"})),
    )?;
    assert!(s == 400 && fault(&v).contains("not been approved"), "{v}");
    let (s, v) = d.call_at(
        Some("1.92"),
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "clean", "runbook": "CUSTOM_NOPE"})),
    )?;
    assert_eq!(s, 404, "{v}");
    let (s, v) = d.call("PUT", "/v1/nodes/n1/traits/CUSTOM_COUNT", None)?;
    ensure!(s == 204, "{v}");
    let (s, v) = d.call_at(Some("1.92"),
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(
            json!({"target": "clean", "runbook": "CUSTOM_COUNT", "clean_steps": [{"interface": "deploy", "step": "x"}]}),
        ),
    )?;
    assert!(s == 400 && fault(&v).contains("not both"), "{v}");
    let (s, v) = d.call_at(
        Some("1.92"),
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "provide", "runbook": "CUSTOM_COUNT"})),
    )?;
    assert_eq!(s, 400, "{v}");
    assert_eq!(d.node("n1")?["provision_state"], "manageable");
    assert!(count_lines(dir.path()).is_empty());

    // 1.92: the runbook's name among the node's traits; its steps run in their order.
    let (s, v) = d.call_at(
        Some("1.92"),
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "clean", "runbook": "CUSTOM_COUNT"})),
    )?;
    assert_eq!(s, 202, "{v}");
    let mut a = agent("agent-1.log")?;
    let n = d
        .wait_node("n1", Duration::from_secs(60), |v| {
            v["provision_state"] == "manageable"
        })
        .map_err(|e| anyhow::anyhow!("{e}\n{}", d.log_text()))?;
    assert!(n["last_error"].is_null(), "{n}");
    assert_eq!(
        count_lines(dir.path()),
        ["start first", "done first", "start second", "done second"]
    );
    a.kill9();

    // 1.112 through python-ironicclient: the runbook's traits decide.
    if !clients::available() {
        return Ok(());
    }
    std::fs::remove_file(dir.path().join("count"))?;
    let st = json!([runbook_steps("cli", 1)]).to_string();
    baremetal(
        &d,
        &["runbook", "create", "--name", "by-traits", "--steps", &st],
    )?;
    let err = baremetal_failing(&d, &["node", "clean", "n1", "--runbook", "by-traits"])?;
    assert!(err.contains("has no traits configured"), "{err}");
    baremetal(
        &d,
        &["runbook", "trait", "add", "by-traits", "CUSTOM_COUNT"],
    )?;
    baremetal(&d, &["node", "clean", "n1", "--runbook", "by-traits"])?;
    let _a = agent("agent-2.log")?;
    let n = d
        .wait_node("n1", Duration::from_secs(60), |v| {
            v["provision_state"] == "manageable"
        })
        .map_err(|e| anyhow::anyhow!("{e}\n{}", d.log_text()))?;
    assert!(n["last_error"].is_null(), "{n}");
    assert_eq!(count_lines(dir.path()), ["start cli", "done cli"]);
    Ok(())
}

const MIB: u64 = 1 << 20;

/// A small GPT whole-disk image (the deploy test's shape: BIOS-boot and data partitions).
fn make_image(path: &Path) -> Result<()> {
    std::fs::File::create(path)?.set_len(16 * MIB)?;
    run_tool(
        Command::new("sgdisk")
            .args([
                "-o",
                "-n",
                "1:2048:+1M",
                "-t",
                "1:ef02",
                "-n",
                "2:0:0",
                "-t",
                "2:8300",
            ])
            .arg(path),
    )?;
    Ok(())
}

#[test]
fn deploy_uses_the_steps_of_the_requested_template() -> Result<()> {
    let ready = prerequisite(is_root(), "root (loop devices)")
        && prerequisite(have("sgdisk"), "sgdisk (gdisk)");
    if !ready {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start_in(dir.path(), DEPLOY_TEST_CONFIG)?;
    let www = dir.path().join("www");
    std::fs::create_dir(&www)?;
    let images = FileServer::start(&www)?;
    let file = dir.path().join("disk0.img");
    std::fs::File::create(&file)?.set_len(64 * MIB)?;
    let disk = LoopDevice::attach(&file)?;
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(
            json!({"driver": "fake-hardware", "deploy_interface": "direct", "name": "n1",
                    // The agent stands in for a ramdisk on this BIOS host: no UEFI.
                    "properties": {"root_device": {"name": disk.path.display().to_string()},
                                   "capabilities": "boot_mode:bios"}}),
        ),
    )?;
    ensure!(s == 201, "{v}");
    let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
    let agent = |log: &str| {
        AgentProcess::start(
            &d.url,
            &uuid,
            &[disk.path.as_path()],
            None,
            &dir.path().join(log),
            &[],
        )
    };
    let wait = |state: &'static str| {
        d.wait_node("n1", Duration::from_secs(120), move |v| {
            v["provision_state"] == state
        })
        .map_err(|e| anyhow::anyhow!("{e}\n{}", d.log_text()))
    };
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "manage"})),
    )?;
    ensure!(s == 202, "{v}");
    wait("manageable")?;
    let a1 = agent("agent-1.log")?;
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "provide"})),
    )?;
    ensure!(s == 202, "{v}");
    wait("available")?;
    drop(a1);

    // The template disables the last default step (boot_instance powers the instance on)
    // and moves prepare_instance_boot: the deploy ends with the machine off.
    let (s, v) = d.call(
        "POST",
        "/v1/deploy_templates",
        Some(json!({"name": "CUSTOM_STAY_OFF", "steps": [
            {"interface": "deploy", "step": "boot_instance", "args": {}, "priority": 0},
            {"interface": "deploy", "step": "prepare_instance_boot", "args": {}, "priority": 65}
        ]})),
    )?;
    ensure!(s == 201, "{v}");
    let image = dir.path().join("disk.raw");
    make_image(&image)?;
    let digest = sha256_file(&image)?;
    std::fs::copy(&image, www.join("disk.raw"))?;
    let (s, v) = d.call(
        "PATCH",
        "/v1/nodes/n1",
        Some(json!([
            {"op": "add", "path": "/instance_info/image_source", "value": images.url_of("disk.raw")},
            {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
            {"op": "add", "path": "/instance_info/image_os_hash_value", "value": digest},
            {"op": "add", "path": "/instance_info/traits", "value": ["CUSTOM_STAY_OFF"]},
        ])),
    )?;
    ensure!(s == 200, "{v}");
    let _a2 = agent("agent-2.log")?;
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/n1/states/provision",
        Some(json!({"target": "active"})),
    )?;
    ensure!(s == 202, "{v}");
    let active = wait("active")?;
    assert!(active["last_error"].is_null(), "{active}");
    assert_eq!(active["power_state"], "power off", "{active}");
    let log = d.log_text();
    let plan = log
        .lines()
        .rfind(|l| l.contains("deploy plan"))
        .context("no deploy plan logged")?;
    assert!(
        plan.contains("prepare_instance_boot") && !plan.contains("boot_instance\""),
        "{plan}"
    );
    assert!(
        log.contains("deploy template step added") && log.contains("CUSTOM_STAY_OFF"),
        "{log}"
    );
    Ok(())
}

#[test]
fn service_by_runbook_runs_its_out_of_band_steps() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = Rivetd::start_in(
        dir.path(),
        "[agent]\nlong_poll_s = 2\n[conductor]\ncheck_interval_s = 1\n",
    )?;
    // A deployed fake-hardware node (fake deploy interface) whose BMC offers one
    // out-of-band step that needs no ramdisk.
    let (s, v) = d.call(
        "POST",
        "/v1/nodes",
        Some(json!({"driver": "fake-hardware", "name": "svc", "automated_clean": false,
                    "driver_info": {"fake_steps": [{"interface": "management", "step": "reset_idrac",
                                                    "priority": 0, "requires_ramdisk": false}]}})),
    )?;
    ensure!(s == 201, "{v}");
    for (target, state) in [
        ("manage", "manageable"),
        ("provide", "available"),
        ("active", "active"),
    ] {
        let (s, v) = d.call(
            "PUT",
            "/v1/nodes/svc/states/provision",
            Some(json!({"target": target})),
        )?;
        ensure!(s == 202, "{target}: {v}");
        d.wait_node("svc", Duration::from_secs(30), move |v| {
            v["provision_state"] == state
        })?;
    }
    let (s, v) = d.call(
        "POST",
        "/v1/runbooks",
        Some(
            json!({"name": "idrac-reset", "disable_ramdisk": true, "steps": [
            {"interface": "management", "step": "reset_idrac", "args": {}, "order": 1}]}),
        ),
    )?;
    ensure!(s == 201, "{v}");
    // Without a matching trait the runbook is refused and nothing starts.
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/svc/states/provision",
        Some(json!({"target": "service", "runbook": "idrac-reset"})),
    )?;
    assert!(
        s == 400 && fault(&v).contains("has no traits configured"),
        "{v}"
    );
    let (s, _) = d.call("PUT", "/v1/runbooks/idrac-reset/traits/CUSTOM_DELL", None)?;
    assert_eq!(s, 204);
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/svc/states/provision",
        Some(json!({"target": "service", "runbook": "idrac-reset"})),
    )?;
    assert!(s == 400 && fault(&v).contains("CUSTOM_DELL"), "{v}");
    assert_eq!(d.node("svc")?["provision_state"], "active");
    let (s, _) = d.call("PUT", "/v1/nodes/svc/traits/CUSTOM_DELL", None)?;
    assert_eq!(s, 204);
    let (s, v) = d.call(
        "PUT",
        "/v1/nodes/svc/states/provision",
        Some(json!({"target": "service", "runbook": "idrac-reset"})),
    )?;
    assert_eq!(s, 202, "{v}");
    let n = d.wait_node("svc", Duration::from_secs(30), |v| {
        v["provision_state"] == "active" && v["target_provision_state"].is_null()
    })?;
    assert!(n["last_error"].is_null(), "{n}");
    let log = d.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("service step done") && l.contains("reset_idrac")),
        "{log}"
    );
    Ok(())
}

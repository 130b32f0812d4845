//! Runs the built `rivet-agent inventory` on this machine and checks it against the usual
//! tools: /proc/meminfo, `nproc`, `lsblk -b -d -J`, `ip -j link`. A missing tool skips its
//! part with a printed reason.
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::process::Command;

fn agent_inventory() -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_rivet-agent"))
        .arg("inventory")
        .env_remove("RIVET_DEVICES")
        .output()
        .expect("run rivet-agent inventory");
    assert!(
        out.status.success(),
        "rivet-agent inventory failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("inventory is JSON")
}

/// Stdout of a tool as JSON, or `None` (with the reason printed) when it cannot run.
fn tool_json(cmd: &str, args: &[&str]) -> Option<Value> {
    match Command::new(cmd).args(args).output() {
        Ok(o) if o.status.success() => match serde_json::from_slice(&o.stdout) {
            Ok(v) => Some(v),
            Err(e) => {
                println!("SKIP {cmd}: output is not JSON ({e})");
                None
            }
        },
        Ok(o) => {
            println!("SKIP {cmd}: exit {}", o.status);
            None
        }
        Err(e) => {
            println!("SKIP {cmd}: not runnable ({e})");
            None
        }
    }
}

#[test]
fn inventory_matches_host_tools() {
    let inv = agent_inventory();

    // Memory: MemTotal in kB × 1024.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert_eq!(inv["memory"]["total"].as_u64(), Some(kb * 1024));
    assert!(inv["memory"]["physical_mb"].as_u64().unwrap() * 1024 * 1024 >= kb * 1024);

    // CPUs: `nproc` honours CPU affinity, so in a pinned container it may show fewer than
    // the online CPUs the inventory reports; then `getconf _NPROCESSORS_ONLN` must match.
    let count = inv["cpu"]["count"].as_u64();
    let number = |cmd: &str, args: &[&str]| -> Option<u64> {
        let o = Command::new(cmd).args(args).output().ok()?;
        String::from_utf8_lossy(&o.stdout).trim().parse().ok()
    };
    match (
        number("nproc", &[]),
        number("getconf", &["_NPROCESSORS_ONLN"]),
    ) {
        (None, None) => println!("SKIP cpu count: neither nproc nor getconf runnable"),
        (nproc, online) => assert!(
            count == nproc || count == online,
            "cpu count {count:?} vs nproc {nproc:?} / online {online:?}"
        ),
    }

    // Disks: every whole disk lsblk shows, same size in bytes.
    if let Some(lsblk) = tool_json("lsblk", &["-b", "-d", "-J", "-o", "NAME,SIZE"]) {
        let ours = inv["disks"].as_array().unwrap();
        for dev in lsblk["blockdevices"].as_array().unwrap() {
            let name = format!("/dev/{}", dev["name"].as_str().unwrap());
            // lsblk prints sizes as numbers, older versions as strings.
            let size = dev["size"]
                .as_u64()
                .or_else(|| dev["size"].as_str().and_then(|s| s.parse().ok()))
                .unwrap_or(0);
            // Not disks, as in IPA: compressed-RAM and RAM devices, empty slots.
            let base = name.trim_start_matches("/dev/");
            if base.starts_with("zram") || base.starts_with("ram") || size == 0 {
                assert!(
                    ours.iter().all(|d| d["name"] != name.as_str()),
                    "{name} is not a disk, yet the agent lists it"
                );
                continue;
            }
            let found = ours
                .iter()
                .find(|d| d["name"] == name.as_str())
                .unwrap_or_else(|| panic!("lsblk shows {name}, the agent does not: {ours:?}"));
            assert_eq!(found["size"].as_u64(), Some(size), "size of {name}");
        }
    }

    // Interfaces: every link except lo, same MAC.
    if let Some(links) = tool_json("ip", &["-j", "link"]) {
        let ours = inv["interfaces"].as_array().unwrap();
        for link in links.as_array().unwrap() {
            let name = link["ifname"].as_str().unwrap();
            if name == "lo" {
                continue;
            }
            let found = ours
                .iter()
                .find(|i| i["name"] == name)
                .unwrap_or_else(|| panic!("ip link shows {name}, the agent does not"));
            if let Some(mac) = link["address"].as_str() {
                assert_eq!(
                    found["mac_address"].as_str(),
                    Some(mac.to_ascii_lowercase().as_str()),
                    "MAC of {name}"
                );
            }
        }
        assert!(ours.iter().all(|i| i["name"] != "lo"));
    }
}

#[test]
fn explicit_devices_are_listed_exactly() {
    let dir = std::env::temp_dir().join(format!("rivet-inv-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("disk0.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(64 << 20).unwrap(); // sparse 64 MiB
    let out = Command::new(env!("CARGO_BIN_EXE_rivet-agent"))
        .args(["inventory", "--devices"])
        .arg(&img)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success());
    let inv: Value = serde_json::from_slice(&out.stdout).unwrap();
    let disks = inv["disks"].as_array().unwrap();
    assert_eq!(disks.len(), 1);
    assert_eq!(disks[0]["name"], img.to_string_lossy().as_ref());
    assert_eq!(disks[0]["size"], 64u64 << 20);
    assert_eq!(disks[0]["rotational"], false);
}

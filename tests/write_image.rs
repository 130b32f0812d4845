//! `write_image` on real loop devices through the agent's real HTTP fetcher and a loopback
//! image server: raw, gzip, zstd, qcow2 and compressed qcow2 (made by qemu-img), each read
//! back from the device and compared with the raw image, with the area the image does not
//! cover checked zero; unsafe or mislabelled images refused before a byte is written; root
//! device hints choosing among several disks.
//!
//! Needs root (loop devices), qemu-img (qemu-utils), gzip, zstd and sgdisk; skips without
//! them unless `RIVET_REQUIRE_PEERS=1`.

use anyhow::Result;
use rivet_protocol::deploy::WriteImageArgs;
use rivet_tests::agentproc::{have, is_root};
use rivet_tests::imagelab::{check_image, manager, write, ImageLab, MIB};
use rivet_tests::{prerequisite, run_tool, sha256_file};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

fn ready() -> bool {
    prerequisite(is_root(), "root (loop devices)")
        && prerequisite(have("qemu-img"), "qemu-img (Debian qemu-utils)")
        && prerequisite(have("zstd"), "zstd")
        && prerequisite(have("gzip"), "gzip")
        && prerequisite(have("sgdisk"), "sgdisk (gdisk)")
        && prerequisite(have("sha256sum"), "sha256sum")
}

#[test]
fn every_format_lands_byte_for_byte() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    // gzip, zstd, qcow2 and compressed qcow2 of the same image.
    run_tool(Command::new("sh").arg("-c").arg(format!(
        "gzip -c {0} > {1} && zstd -q -c {0} > {2}",
        lab.raw.display(),
        lab.www("img.raw.gz").display(),
        lab.www("img.raw.zst").display()
    )))?;
    run_tool(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(&lab.raw)
            .arg(lab.www("img.qcow2")),
    )?;
    run_tool(
        Command::new("qemu-img")
            .args(["convert", "-c", "-f", "raw", "-O", "qcow2"])
            .arg(&lab.raw)
            .arg(lab.www("img-c.qcow2")),
    )?;
    for (name, format, compression) in [
        ("img.raw", "raw", None),
        ("img.raw.gz", "raw", Some("gzip")),
        ("img.raw.zst", "raw", Some("zstd")),
        ("img.qcow2", "qcow2", None),
        ("img-c.qcow2", "qcow2", None),
    ] {
        let disk = lab.disk(&format!("{name}.disk"), 128)?;
        let m = manager(vec![disk.path().to_path_buf()]);
        let digest = sha256_file(&lab.www(name))?;
        let args = WriteImageArgs {
            image_source: lab.server.url_of(name),
            os_hash_algo: Some("sha256".into()),
            os_hash_value: Some(digest.clone()),
            root_device: Some(disk.hints()),
            ..Default::default()
        };
        let r = write(&m, &args).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        assert_eq!(r.format, format, "{name}");
        assert_eq!(r.compression.as_deref(), compression, "{name}");
        assert_eq!(r.hash_value, digest, "{name}");
        assert_eq!(r.virtual_size, 24 * MIB, "{name}");
        check_image(&disk, &lab.raw).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        if format == "qcow2" {
            // The hole is unallocated in the qcow2: the writer zeroed it over the 0xAB.
            let hole = disk.read(10 * MIB, (4 * MIB) as usize)?;
            assert!(
                hole.iter().all(|b| *b == 0),
                "{name}: unallocated clusters not zeroed"
            );
        }
        // The backup GPT went to the end of the 128 MiB disk.
        let v = Command::new("sgdisk").arg("-v").arg(&disk.file).output()?;
        let text = String::from_utf8_lossy(&v.stdout);
        assert!(text.contains("No problems found"), "{name}: {text}");
    }
    // sha512 and a wrong digest.
    let disk = lab.disk("sha512.disk", 128)?;
    let m = manager(vec![disk.path().to_path_buf()]);
    let sha512 = String::from_utf8_lossy(&Command::new("sha512sum").arg(&lab.raw).output()?.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    let mut args = WriteImageArgs {
        image_source: lab.server.url_of("img.raw"),
        os_hash_algo: Some("sha512".into()),
        os_hash_value: Some(sha512.clone()),
        ..Default::default()
    };
    args.root_device = Some(disk.hints());
    let r = write(&m, &args).map_err(anyhow::Error::msg)?;
    assert_eq!(r.hash_algo, "sha512");
    args.os_hash_value = Some("0".repeat(128));
    let e = write(&m, &args).expect_err("refused");
    assert!(e.contains(&sha512) && e.contains(&"0".repeat(128)), "{e}");
    Ok(())
}

#[test]
fn unsafe_and_mislabelled_images_are_refused_before_writing() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    // A qcow2 whose backing file is a host file.
    run_tool(
        Command::new("qemu-img")
            .args(["create", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&lab.raw)
            .arg(lab.www("backed.qcow2")),
    )?;
    let disk = lab.disk("d", 128)?;
    let m = manager(vec![disk.path().to_path_buf()]);
    let base = |name: &str| lab.args(name, &disk);
    let before = disk.read(0, MIB as usize)?;
    let e = write(&m, &base("backed.qcow2")?).expect_err("refused");
    assert!(e.contains("backing file"), "{e}");
    let mut mislabelled = base("img.raw")?;
    mislabelled.disk_format = Some("qcow2".into());
    let e = write(&m, &mislabelled).expect_err("refused");
    assert!(e.contains("declares qcow2"), "{e}");
    let mut not_permitted = base("img.raw")?;
    not_permitted.permitted_formats = vec!["qcow2".into()];
    let e = write(&m, &not_permitted).expect_err("refused");
    assert!(e.contains("not permitted"), "{e}");
    let after = disk.read(0, MIB as usize)?;
    assert!(before == after, "a refused image changed the disk");
    Ok(())
}

#[test]
fn root_device_hints_choose_among_disks() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    // Sparse: 5, 7 and 6 GiB cost nothing.
    let a = lab.disk("a", 5 << 10)?;
    let b = lab.disk("b", 7 << 10)?;
    let c = lab.disk("c", 6 << 10)?;
    let all = vec![
        a.path().to_path_buf(),
        b.path().to_path_buf(),
        c.path().to_path_buf(),
    ];
    let m = manager(all);
    let digest = sha256_file(&lab.raw)?;
    let with = |hints: Value| WriteImageArgs {
        image_source: lab.server.url_of("img.raw"),
        os_hash_algo: Some("sha256".into()),
        os_hash_value: Some(digest.clone()),
        root_device: hints.as_object().cloned(),
        ..Default::default()
    };
    // No hint: the smallest of at least 4 GiB.
    let r = write(&m, &with(Value::Null)).map_err(anyhow::Error::msg)?;
    assert_eq!(r.device, a.path().display().to_string());
    assert_eq!(r.chosen_by, "smallest disk of at least 4 GiB");
    // size >= 6 picks the first match in order: b (7 GiB).
    let r = write(&m, &with(json!({"size": ">= 6"}))).map_err(anyhow::Error::msg)?;
    assert_eq!(r.device, b.path().display().to_string());
    // <or> and name.
    let r = write(&m, &with(json!({"size": "<or> 6 <or> 9"}))).map_err(anyhow::Error::msg)?;
    assert_eq!(r.device, c.path().display().to_string());
    let name = c
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let r = write(&m, &with(json!({"name": name}))).map_err(anyhow::Error::msg)?;
    assert_eq!(r.device, c.path().display().to_string());
    // Nothing matches: the error lists the candidates.
    let e = write(&m, &with(json!({"size": 100}))).expect_err("refused");
    assert!(
        e.contains("no disk matches") && e.contains(&b.path().display().to_string()),
        "{e}"
    );
    // A mounted disk is never a candidate.
    let mnt = lab.dir.path().join("mnt");
    std::fs::create_dir(&mnt)?;
    run_tool(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(a.path()))?;
    run_tool(Command::new("mount").arg(a.path()).arg(&mnt))?;
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.clone());
    let r = write(&m, &with(Value::Null)).map_err(anyhow::Error::msg)?;
    assert_eq!(
        r.device,
        c.path().display().to_string(),
        "the mounted 5 GiB disk was skipped"
    );
    let e = write(&m, &with(json!({"name": a.path().display().to_string()}))).expect_err("refused");
    assert!(e.contains("mounted"), "{e}");
    Ok(())
}

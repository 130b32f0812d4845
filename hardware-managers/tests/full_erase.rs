//! erase_devices / erase_devices_express: every byte reads zero afterwards; abort stops a
//! running erase within a second.

use crate::common;
use common::*;
use rivet_hardware_managers::{StepContext, StepError};
use serde_json::json;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// Scatter data over a target so "all zero afterwards" means something.
fn scribble(path: &std::path::Path, size: u64) -> anyhow::Result<()> {
    let mut off = 0;
    let mut seed = 0u8;
    while off < size {
        write_at(path, off, &pattern(64 << 10, seed))?;
        seed = seed.wrapping_add(1);
        off += 8 * MIB + 4096;
    }
    write_at(path, size - 4096, &pattern(4096, 0xEE))?;
    Ok(())
}

#[test]
fn full_erase_zeroes_a_loop_device() -> anyhow::Result<()> {
    if !require(true, &["losetup", "sgdisk", "mkfs.ext4"]) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let size = 256 * MIB;
    let file = sparse(dir.path(), "disk.img", size)?;
    let disk = LoopDev::attach(&file)?;
    run("sgdisk", &["-n1:2048:+100M", "-n2:0:0", disk.as_str()])?;
    scribble(&disk.path, size)?;
    let (d, _) = generic_over(vec![disk.path.clone()]);
    let ctx = StepContext::new();
    let r = d.execute("erase_devices", &args(json!({})), &ctx)?;
    eprintln!("result: {r}");
    assert_eq!(r["devices"][0]["device"], json!(disk.as_str()));
    assert_eq!(first_nonzero(&disk.path)?, None, "loop device reads zero");
    assert_eq!(first_nonzero(&file)?, None, "backing file reads zero");
    let p = ctx.progress().expect("progress reported");
    assert_eq!((p.done, p.total), (size, size), "{p:?}");
    Ok(())
}

#[test]
fn full_erase_zeroes_a_sparse_file_with_a_random_pass() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let size = 64 * MIB + 512 * 3; // not a multiple of the chunk size
    let file = sparse(dir.path(), "disk.img", size)?;
    scribble(&file, size)?;
    let (d, _) = generic_over(vec![file.clone()]);
    let ctx = StepContext::new();
    let r = d.execute("erase_devices", &args(json!({"random_passes": 1})), &ctx)?;
    assert_eq!(
        r["devices"][0]["method"],
        json!("random overwrite + zero overwrite"),
        "{r}"
    );
    assert_eq!(first_nonzero(&file)?, None);
    assert_eq!(std::fs::metadata(&file)?.len(), size, "size unchanged");
    let p = ctx.progress().expect("progress");
    assert_eq!((p.done, p.total), (2 * size, 2 * size));
    Ok(())
}

#[test]
fn several_devices_in_parallel() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let files: Vec<_> = (0..5)
        .map(|i| sparse(dir.path(), &format!("d{i}.img"), 16 * MIB))
        .collect::<Result<_, _>>()?;
    for f in &files {
        scribble(f, 16 * MIB)?;
    }
    let (d, _) = generic_over(files.clone());
    let r = step(&d, "erase_devices", json!({"concurrency": 3}))?;
    assert_eq!(r["devices"].as_array().map(Vec::len), Some(5));
    for f in &files {
        assert_eq!(first_nonzero(f)?, None, "{}", f.display());
    }
    Ok(())
}

#[test]
fn express_erase_punches_a_file_and_zeroes_a_loop_device() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = sparse(dir.path(), "disk.img", 32 * MIB)?;
    scribble(&file, 32 * MIB)?;
    let (d, _) = generic_over(vec![file.clone()]);
    let r = step(&d, "erase_devices_express", json!({}))?;
    assert_eq!(r["devices"][0]["method"], json!("punch hole"), "{r}");
    assert_eq!(first_nonzero(&file)?, None);
    if !require(true, &["losetup"]) {
        return Ok(());
    }
    let file2 = sparse(dir.path(), "disk2.img", 64 * MIB)?;
    let disk = LoopDev::attach(&file2)?;
    scribble(&disk.path, 64 * MIB)?;
    let (d, _) = generic_over(vec![disk.path.clone()]);
    // Loop devices discard and offload write-zeroes (fallocate on the backing file).
    let r = step(&d, "erase_devices_express", json!({}))?;
    assert_eq!(r["devices"][0]["method"], json!("blkzeroout"), "{r}");
    assert_eq!(first_nonzero(&disk.path)?, None);
    Ok(())
}

/// Start an erase, cancel it from another thread, and time how long `execute` takes to
/// return after the cancel.
fn abort_within_a_second(device: std::path::PathBuf) -> anyhow::Result<()> {
    let (d, _) = generic_over(vec![device]);
    let ctx = StepContext::new();
    let canceller = {
        let ctx = ctx.clone();
        std::thread::spawn(move || {
            // Wait until the erase is really writing, then cancel.
            let deadline = Instant::now() + Duration::from_secs(20);
            while ctx.progress().map(|p| p.done).unwrap_or(0) < 64 * MIB
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            ctx.cancel();
            Instant::now()
        })
    };
    // A random pass really writes every byte, so the erase takes seconds, not milliseconds.
    let r = d.execute("erase_devices", &args(json!({"random_passes": 1})), &ctx);
    let returned = Instant::now();
    let cancelled_at = canceller.join().expect("canceller thread");
    assert!(
        matches!(r, Err(StepError::Aborted)),
        "expected Aborted, got {r:?}"
    );
    let latency = returned.saturating_duration_since(cancelled_at);
    eprintln!(
        "abort latency: {latency:?}, progress at abort: {:?}",
        ctx.progress()
    );
    assert!(latency < Duration::from_secs(1), "took {latency:?} to stop");
    let p = ctx.progress().expect("progress");
    assert!(p.done < p.total, "the erase must not have finished: {p:?}");
    Ok(())
}

#[test]
fn abort_stops_a_loop_device_erase_within_a_second() -> anyhow::Result<()> {
    if !require(true, &["losetup"]) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let file = sparse(dir.path(), "big.img", 4 << 30)?;
    let disk = LoopDev::attach(&file)?;
    abort_within_a_second(disk.path.clone())
}

#[test]
fn abort_stops_a_file_erase_within_a_second() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = sparse(dir.path(), "big.img", 4 << 30)?;
    abort_within_a_second(file)
}

#[test]
fn missing_device_is_a_clear_error_before_anything_is_written() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let good = sparse(dir.path(), "good.img", MIB)?;
    write_at(&good, 0, &pattern(512, 1))?;
    let (d, _) = generic_over(vec![good.clone(), dir.path().join("nope.img")]);
    let e = step(&d, "erase_devices", json!({})).expect_err("must fail");
    assert!(e.to_string().contains("nope.img"), "{e}");
    assert_eq!(read_at(&good, 0, 512)?, pattern(512, 1), "nothing erased");
    Ok(())
}

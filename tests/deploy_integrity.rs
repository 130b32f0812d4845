//! `active` is a promise about the disk's bytes: `write_image` on real loop devices, with
//! images made by the real tools, checked by reading the disk back (its backing file, so
//! only flushed bytes count).
//!
//! - every zstd frame and gzip member lands (pzstd, concatenated streams, skippable frames);
//! - containers and compressions Rivet does not write (VMDK, VHD, VHDX, VDI, QED by
//!   qemu-img; xz, bzip2, lz4; LUKS by cryptsetup; a VMDK inside gzip) are refused naming
//!   the detected and the declared format, with the disk untouched;
//! - old metadata (GPT, ext4, an LVM PV, an md 1.0 superblock) is gone after an MBR or a
//!   smaller GPT image: `wipefs -n` and `blkid -p` see only the new image;
//! - a digest mismatch, a cut stream, an abort leave no MBR signature and no GPT header;
//! - an image that cannot fit is refused with the disk untouched;
//! - a stream cut twice resumes (HTTP Range) or restarts, and lands byte for byte;
//! - the configdrive in every form IPA takes; a bad one fails before the image is fetched.
//!
//! Needs root (loop devices), qemu-img, sgdisk, blkid, wipefs, mkfs.ext4, pvcreate, xorriso,
//! gzip, zstd, pzstd, xz, bzip2, lz4 and cryptsetup (scripts/setup.sh installs them); skips
//! without them unless `RIVET_REQUIRE_PEERS=1`.

use anyhow::{ensure, Context, Result};
use rivet_hardware_managers::StepContext;
use rivet_tests::agentproc::{have, is_root, LoopDevice};
use rivet_tests::imagelab::{check_image, manager, write, write_with, ImageLab, TestDisk, MIB};
use rivet_tests::{prerequisite, run_tool};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn ready() -> bool {
    let tools = [
        ("qemu-img", "qemu-utils"),
        ("sgdisk", "gdisk"),
        ("blkid", "util-linux"),
        ("wipefs", "util-linux"),
        ("mkfs.ext4", "e2fsprogs"),
        ("pvcreate", "lvm2"),
        ("xorriso", "xorriso"),
        ("gzip", "gzip"),
        ("zstd", "zstd"),
        ("pzstd", "zstd"),
        ("xz", "xz-utils"),
        ("bzip2", "bzip2"),
        ("lz4", "lz4"),
        ("cryptsetup", "cryptsetup-bin"),
    ];
    prerequisite(is_root(), "root (loop devices)")
        && tools
            .iter()
            .all(|(t, pkg)| prerequisite(have(t), &format!("{t} (Debian {pkg})")))
}

/// The disk's whole content, to compare before and after a refusal.
fn snapshot(disk: &TestDisk) -> Result<Vec<u8>> {
    disk.read(0, disk.size as usize)
}

#[test]
fn every_zstd_frame_and_gzip_member_lands() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    // pzstd cuts its input into independent frames (one per 4 MiB here) and puts a
    // skippable frame before each; two plain zstd streams concatenated; gzip members
    // concatenated (what `pigz`-style tools and `cat a.gz b.gz` make).
    lab.sh(
        "set -e; cd $WWW; head -c 10485760 $RAW > a; tail -c +10485761 $RAW > b
         pzstd -q -p 2 -3 -c $RAW > img.pzst
         zstd -q -c a > img.cat.zst; zstd -q -c b >> img.cat.zst
         gzip -c a > img.cat.gz; gzip -c b >> img.cat.gz
         rm a b",
    )?;
    for (name, compression) in [
        ("img.pzst", "zstd"),
        ("img.cat.zst", "zstd"),
        ("img.cat.gz", "gzip"),
    ] {
        let disk = lab.disk(&format!("{name}.disk"), 128)?;
        let m = manager(vec![disk.path().to_path_buf()]);
        let r = write(&m, &lab.args(name, &disk)?).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        assert_eq!(r.compression.as_deref(), Some(compression), "{name}");
        assert_eq!(r.virtual_size, 24 * MIB, "{name}: every frame decoded");
        check_image(&disk, &lab.raw).with_context(|| name.to_string())?;
        // Past the image, the old 0xAB pattern was never part of it and is not zeroed by a
        // raw write: the last MiB of the image is the proof the tail landed.
        let tail = disk.read(22 * MIB, MIB as usize)?;
        let want = std::fs::read(&lab.raw)?;
        assert!(
            tail == want[(22 * MIB) as usize..(23 * MIB) as usize],
            "{name}: the image's tail is not on the disk"
        );
    }
    Ok(())
}

#[test]
fn containers_and_foreign_compressions_are_refused_with_the_disk_untouched() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    lab.sh(
        "set -e; cd $WWW
         for f in vmdk vpc vhdx vdi qed; do qemu-img convert -q -f raw -O $f $RAW img.$f; done
         xz -0 -c $RAW > img.xz; bzip2 -1 -c $RAW > img.bz2; lz4 -q -c $RAW > img.lz4
         gzip -c img.vmdk > img.vmdk.gz
         zstd -q -c img.xz > img.xz.zst
         truncate -s 32M img.luks
         echo pw | cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 img.luks",
    )?;
    let disk = lab.disk("d", 128)?;
    let m = manager(vec![disk.path().to_path_buf()]);
    let before = snapshot(&disk)?;
    for (name, detected) in [
        ("img.vmdk", "is vmdk"),
        ("img.vpc", "is vhd"),
        ("img.vhdx", "is vhdx"),
        ("img.vdi", "is vdi"),
        ("img.qed", "is qed"),
        ("img.luks", "is luks"),
        ("img.xz", "is xz-compressed"),
        ("img.bz2", "is bzip2-compressed"),
        ("img.lz4", "is lz4-compressed"),
        ("img.vmdk.gz", "is vmdk (gzip-compressed)"),
        ("img.xz.zst", "is xz (zstd-compressed)"),
    ] {
        let mut args = lab.args(name, &disk)?;
        args.disk_format = Some("raw".into());
        let e = write(&m, &args).expect_err(name);
        assert!(
            e.contains(detected) && e.contains("declare") && e.contains("raw"),
            "{name}: {e}"
        );
        assert!(e.contains("refused before writing"), "{name}: {e}");
        assert!(
            snapshot(&disk)? == before,
            "{name}: a refused image changed the disk"
        );
    }
    Ok(())
}

/// An md RAID superblock of metadata 1.0, as mdadm writes one at the end of a member
/// (8 KiB from the end, rounded down to 4 KiB), with the checksum blkid verifies. Built by
/// hand because the host kernel has no md driver for `mdadm --create`.
fn md10_superblock(member_size: u64) -> (u64, Vec<u8>) {
    let sectors = member_size / 512;
    let sb_sector = (sectors - 16) & !7;
    let max_dev: u32 = 2;
    let mut sb = vec![0u8; 256 + 2 * max_dev as usize];
    let put32 = |b: &mut [u8], o: usize, v: u32| b[o..o + 4].copy_from_slice(&v.to_le_bytes());
    let put64 = |b: &mut [u8], o: usize, v: u64| b[o..o + 8].copy_from_slice(&v.to_le_bytes());
    put32(&mut sb, 0, 0xa92b_4efc); // magic
    put32(&mut sb, 4, 1); // major version
    sb[16..32].copy_from_slice(b"rivet-test-md-10");
    sb[32..42].copy_from_slice(b"rivet:root");
    put32(&mut sb, 72, 1); // RAID-1
    put64(&mut sb, 80, sb_sector); // size
    put32(&mut sb, 92, 2); // raid disks
    put64(&mut sb, 136, sb_sector); // data size
    put64(&mut sb, 144, sb_sector); // super_offset: where it sits, in sectors
    sb[168..184].copy_from_slice(b"rivet-member-000");
    put64(&mut sb, 200, 1); // events
    put64(&mut sb, 208, u64::MAX); // resync done
    put32(&mut sb, 220, max_dev);
    let mut csum: u64 = sb
        .chunks(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as u64)
        .sum();
    csum = (csum & 0xffff_ffff) + (csum >> 32);
    put32(&mut sb, 216, csum as u32);
    (sb_sector * 512, sb)
}

/// What `blkid -p` finds in `len` bytes at `offset` of `file` (`TYPE=…`/`PTTYPE=…` pairs), or
/// an empty string when it finds nothing.
fn blkid_at(file: &Path, offset: u64, len: u64) -> Result<String> {
    let out = Command::new("blkid")
        .args([
            "-p",
            "-o",
            "export",
            "-O",
            &offset.to_string(),
            "-S",
            &len.to_string(),
        ])
        .arg(file)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter(|l| l.starts_with("TYPE=") || l.starts_with("PTTYPE="))
        .collect::<Vec<_>>()
        .join(" "))
}

/// `wipefs -n` of the whole file: `(type, offset)` of every signature it would erase.
fn wipefs_signatures(file: &Path) -> Result<Vec<(String, u64)>> {
    let out = run_tool(
        Command::new("wipefs")
            .args(["-n", "-p", "-O", "TYPE,OFFSET"])
            .arg(file),
    )?;
    Ok(out
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (t, o) = l.split_once(',')?;
            let o = u64::from_str_radix(o.trim().trim_start_matches("0x"), 16).ok()?;
            Some((t.trim().to_string(), o))
        })
        .collect())
}

/// A 24 MiB whole-disk image with an MBR (one Linux partition from 1 MiB) over pseudo-random
/// bytes, written by hand: what a BIOS-era cloud image looks like to the writer.
fn mbr_image(path: &Path) -> Result<()> {
    let mut data = rivet_tests::imagelab::pattern(24 * MIB, 7);
    data[440..512].fill(0);
    let e = &mut data[446..462];
    e[4] = 0x83;
    e[8..12].copy_from_slice(&2048u32.to_le_bytes());
    e[12..16].copy_from_slice(&((24 * MIB / 512 - 2048) as u32).to_le_bytes());
    data[510] = 0x55;
    data[511] = 0xAA;
    std::fs::write(path, data)?;
    Ok(())
}

/// Seed `disk` with what an earlier life leaves: a GPT of three partitions, ext4 in the
/// first, an LVM PV in the second, an md 1.0 member in the third. Returns the partitions'
/// byte ranges, and checks blkid sees each seed (so the test cannot pass on a seed that
/// never was).
fn seed_old_life(lab: &ImageLab, disk: &TestDisk) -> Result<Vec<(u64, u64, &'static str)>> {
    run_tool(
        Command::new("sgdisk")
            .args(["-o", "-n", "1:1M:+39M", "-n", "2:40M:+40M", "-n", "3:80M:0"])
            .arg(&disk.file),
    )?;
    let end = disk.size - MIB; // sgdisk's last usable sector, rounded to the MiB
    let parts = vec![
        (MIB, 39 * MIB, "ext4"),
        (40 * MIB, 40 * MIB, "LVM2_member"),
        (80 * MIB, end - 80 * MIB, "linux_raid_member"),
    ];
    let f = std::fs::OpenOptions::new().write(true).open(&disk.file)?;
    // ext4, made in a file of its own and copied in.
    let ext4 = lab.dir.path().join("ext4.img");
    std::fs::File::create(&ext4)?.set_len(parts[0].1)?;
    run_tool(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&ext4))?;
    f.write_all_at(&std::fs::read(&ext4)?[..(2 * MIB) as usize], parts[0].0)?;
    // An LVM PV needs a block device: a loop device of its own, then copied in.
    let pv = lab.dir.path().join("pv.img");
    std::fs::File::create(&pv)?.set_len(8 * MIB)?;
    {
        let l = LoopDevice::attach(&pv)?;
        run_tool(
            Command::new("pvcreate")
                .args(["-q", "-ff", "-y"])
                .arg(&l.path),
        )?;
    }
    f.write_all_at(&std::fs::read(&pv)?[..MIB as usize], parts[1].0)?;
    // md 1.0 at the end of the third partition.
    let (at, sb) = md10_superblock(parts[2].1);
    f.write_all_at(&sb, parts[2].0 + at)?;
    f.sync_all()?;
    for (off, len, want) in &parts {
        let seen = blkid_at(&disk.file, *off, *len)?;
        ensure!(
            seen.contains(want),
            "seeding: blkid sees {seen:?} at {off}, not {want}"
        );
    }
    ensure!(blkid_at(&disk.file, 0, disk.size)?.contains("PTTYPE=gpt"));
    Ok(parts)
}

#[test]
fn old_metadata_is_destroyed_before_an_image_is_written() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    mbr_image(&lab.www("mbr.raw"))?;
    for (name, pttype) in [("mbr.raw", "dos"), ("img.raw", "gpt")] {
        let disk = lab.disk(&format!("{name}.disk"), 128)?;
        let parts = seed_old_life(&lab, &disk)?;
        let m = manager(vec![disk.path().to_path_buf()]);
        write(&m, &lab.args(name, &disk)?).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        // The whole disk: only the new image's table.
        let whole = blkid_at(&disk.file, 0, disk.size)?;
        assert_eq!(
            whole,
            format!("PTTYPE={pttype}"),
            "{name}: blkid -p sees {whole}"
        );
        let sigs = wipefs_signatures(&disk.file)?;
        let want: Vec<(String, u64)> = if pttype == "dos" {
            vec![("dos".into(), 0x1fe)]
        } else {
            vec![
                ("gpt".into(), 0x200),
                ("gpt".into(), disk.size - 512),
                ("PMBR".into(), 0x1fe),
            ]
        };
        assert_eq!(sigs, want, "{name}: wipefs -n");
        // Where the old partitions were, past the image: nothing.
        for (off, len, old) in &parts[1..] {
            let seen = blkid_at(&disk.file, *off, *len)?;
            assert!(
                seen.is_empty(),
                "{name}: the old {old} at {off} survived: {seen}"
            );
        }
    }
    Ok(())
}

#[test]
fn a_failed_write_leaves_nothing_bootable() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    let old_gpt = |disk: &TestDisk| -> Result<()> {
        run_tool(
            Command::new("sgdisk")
                .args(["-o", "-n", "1:0:0"])
                .arg(disk.path()),
        )?;
        ensure!(disk.read(512, 8)? == b"EFI PART", "seeding the old GPT");
        Ok(())
    };
    let disk = lab.disk("d", 128)?;
    let m = manager(vec![disk.path().to_path_buf()]);

    // A digest mismatch: the whole image was written, then refused.
    old_gpt(&disk)?;
    let mut args = lab.args("img.raw", &disk)?;
    args.os_hash_value = Some("0".repeat(64));
    let e = write(&m, &args).expect_err("mismatch");
    assert!(e.contains("failed verification"), "{e}");
    disk.assert_nothing_bootable("digest mismatch")?;
    // The body did land: the failure was late, and still nothing boots.
    let want = std::fs::read(&lab.raw)?;
    assert!(disk.read(2 * MIB, MIB as usize)? == want[(2 * MIB) as usize..(3 * MIB) as usize]);

    // A stream cut with no retries left.
    old_gpt(&disk)?;
    let mut args = lab.args("img.raw", &disk)?;
    args.download_retries = Some(0);
    lab.server.cut_next(1, 5 * MIB);
    let e = write(&m, &args).expect_err("cut");
    assert!(e.contains("interrupted"), "{e}");
    disk.assert_nothing_bootable("cut stream")?;

    // An abort in the middle of the write.
    old_gpt(&disk)?;
    let args = lab.args("img.raw", &disk)?;
    lab.server.set_pace(4 * MIB);
    let ctx = StepContext::new();
    let aborter = {
        let ctx = ctx.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2500));
            ctx.cancel();
        })
    };
    let e = write_with(&m, &args, &ctx).expect_err("aborted");
    let _ = aborter.join();
    lab.server.set_pace(0);
    assert!(e.contains("abort"), "{e}");
    disk.assert_nothing_bootable("abort")?;

    // And the same disk then takes an image whole.
    write(&m, &lab.args("img.raw", &disk)?).map_err(anyhow::Error::msg)?;
    check_image(&disk, &lab.raw)?;
    Ok(())
}

#[test]
fn an_image_that_cannot_fit_is_refused_with_the_disk_untouched() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    rivet_tests::imagelab::raw_image(&lab.www("big.raw"), 48, 3)?;
    lab.sh("set -e; cd $WWW; gzip -c big.raw > big.raw.gz
         qemu-img create -q -f qcow2 big.qcow2 1G")?;
    let disk = lab.disk("d", 40)?;
    let m = manager(vec![disk.path().to_path_buf()]);
    let before = snapshot(&disk)?;
    for (name, why) in [
        ("big.raw", "its Content-Length"),
        ("big.raw.gz", "partition table"),
        ("big.qcow2", "qcow2 virtual size"),
    ] {
        let e = write(&m, &lab.args(name, &disk)?).expect_err(name);
        assert!(
            e.contains(why) && e.contains("disk untouched"),
            "{name}: {e}"
        );
        assert!(snapshot(&disk)? == before, "{name}: the disk changed");
    }
    // On a 25 MiB disk the 24 MiB image fits, but not with its configdrive's partition.
    let small = lab.disk("small", 25)?;
    let m = manager(vec![small.path().to_path_buf()]);
    let before = snapshot(&small)?;
    let mut args = lab.args("img.raw", &small)?;
    args.configdrive = Some(configdrive_b64(&lab)?);
    let e = write(&m, &args).expect_err("no room for the configdrive");
    assert!(e.contains("for the configdrive"), "{e}");
    assert!(snapshot(&small)? == before, "the disk changed");
    // On the 40 MiB disk both fit: the config-2 partition shrinks to what the ISO needs.
    let m = manager(vec![disk.path().to_path_buf()]);
    let mut args = lab.args("img.raw", &disk)?;
    args.configdrive = Some(configdrive_b64(&lab)?);
    let r = write(&m, &args).map_err(anyhow::Error::msg)?;
    assert!(r.configdrive_partition.is_some());
    check_image(&disk, &lab.raw)?;
    Ok(())
}

#[test]
fn a_stream_cut_twice_resumes_and_lands_whole() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    let disk = lab.disk("d", 128)?;
    let m = manager(vec![disk.path().to_path_buf()]);
    // Resumed with Range where the server supports it.
    lab.server.cut_next(2, 5 * MIB);
    let ranges = lab.server.range_requests();
    let r = write(&m, &lab.args("img.raw", &disk)?).map_err(anyhow::Error::msg)?;
    assert_eq!(lab.server.range_requests() - ranges, 2, "two resumes");
    assert_eq!(r.image_bytes, 24 * MIB);
    check_image(&disk, &lab.raw)?;
    // Restarted from the top, the bytes already read dropped, where it does not; the
    // digest (over the whole image) still matches. A compressed image, so the decoder sees
    // the stream continue.
    lab.sh("cd $WWW && zstd -q -c $RAW > img.zst")?;
    lab.server.ignore_ranges(true);
    lab.server.cut_next(2, 2 * MIB);
    let disk2 = lab.disk("d2", 128)?;
    let m2 = manager(vec![disk2.path().to_path_buf()]);
    write(&m2, &lab.args("img.zst", &disk2)?).map_err(anyhow::Error::msg)?;
    check_image(&disk2, &lab.raw)?;
    lab.server.ignore_ranges(false);
    // More cuts than retries: a clear failure, nothing bootable.
    lab.server.cut_next(4, 3 * MIB);
    let mut args = lab.args("img.raw", &disk)?;
    args.download_retries = Some(3);
    let e = write(&m, &args).expect_err("gave up");
    assert!(e.contains("gave up after 3 retries"), "{e}");
    disk.assert_nothing_bootable("retries exhausted")?;
    Ok(())
}

/// A config-2 ISO (xorriso, as Nova's genisoimage line) with a meta_data.json.
fn configdrive_iso(lab: &ImageLab) -> Result<Vec<u8>> {
    let dir = lab.dir.path().join("cd");
    std::fs::create_dir_all(dir.join("openstack/latest"))?;
    std::fs::write(
        dir.join("openstack/latest/meta_data.json"),
        r#"{"uuid": "0b1c7e3a-6d2e-4c55-9d1b-7f1e2a3b4c5d"}"#,
    )?;
    let iso = lab.dir.path().join("cd.iso");
    run_tool(
        Command::new("xorriso")
            .args([
                "-as", "mkisofs", "-quiet", "-V", "config-2", "-J", "-r", "-o",
            ])
            .arg(&iso)
            .arg(&dir),
    )?;
    Ok(std::fs::read(iso)?)
}

fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write;
    let mut child = Command::new("gzip")
        .arg("-c")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().context("gzip stdin")?;
    let input = data.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output()?;
    feeder
        .join()
        .map_err(|_| anyhow::anyhow!("gzip feeder"))??;
    Ok(out.stdout)
}

fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Ironic's stored form of the test configdrive: base64 of gzip of the ISO.
fn configdrive_b64(lab: &ImageLab) -> Result<String> {
    Ok(b64(&gzip(&configdrive_iso(lab)?)?))
}

/// The config-2 ISO's bytes on the disk: the partition at the disk's end holding a volume
/// labelled `config-2`.
fn config2_on(disk: &TestDisk, len: usize) -> Result<Vec<u8>> {
    let span = 66 * MIB;
    let base = disk.size - span;
    let tail = disk.read(base, span as usize)?;
    for start in (0..tail.len().saturating_sub(0x8030)).step_by(512) {
        let pvd = &tail[start + 0x8000..start + 0x8030];
        if &pvd[1..6] == b"CD001" && pvd[40..48] == *b"config-2" {
            ensure!(start + len <= tail.len(), "the ISO runs past the disk");
            return Ok(tail[start..start + len].to_vec());
        }
    }
    anyhow::bail!("no config-2 volume in the disk's last 66 MiB")
}

#[test]
fn configdrive_in_every_form_ipa_accepts() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    let iso = configdrive_iso(&lab)?;
    std::fs::write(lab.www("cd.iso"), &iso)?;
    std::fs::write(lab.www("cd.iso.gz"), gzip(&iso)?)?;
    // Ironic's stored form behind a URL (what the conductor uploads), wrapped as base64 -w76.
    let stored = b64(&gzip(&iso)?);
    let wrapped: String = stored
        .as_bytes()
        .chunks(76)
        .map(|c| format!("{}\n", String::from_utf8_lossy(c)))
        .collect();
    std::fs::write(lab.www("cd.b64"), wrapped)?;
    let disk = lab.disk("d", 128)?;
    let m = manager(vec![disk.path().to_path_buf()]);
    for (form, cd) in [
        ("inline gzip+base64", stored.clone()),
        ("URL of gzip+base64", lab.server.url_of("cd.b64")),
        ("URL of a plain ISO", lab.server.url_of("cd.iso")),
        ("URL of a gzipped ISO", lab.server.url_of("cd.iso.gz")),
    ] {
        let mut args = lab.args("img.raw", &disk)?;
        args.configdrive = Some(cd);
        let r = write(&m, &args).map_err(|e| anyhow::anyhow!("{form}: {e}"))?;
        assert!(r.configdrive_partition.is_some(), "{form}");
        assert!(
            config2_on(&disk, iso.len())? == iso,
            "{form}: the ISO on the disk differs"
        );
        check_image(&disk, &lab.raw).with_context(|| form)?;
    }
    // A bad configdrive fails before the image is fetched, with the disk as it was.
    std::fs::write(lab.www("bad.b64"), b"this is not a configdrive")?;
    let before = snapshot(&disk)?;
    for (what, cd) in [
        ("404", lab.server.url_of("missing.iso")),
        ("garbage", lab.server.url_of("bad.b64")),
        ("inline garbage", "bm90IGFuIGlzbw==".to_string()),
    ] {
        let mut args = lab.args("img.raw", &disk)?;
        args.configdrive = Some(cd);
        let served = lab
            .server
            .requests
            .load(std::sync::atomic::Ordering::Relaxed);
        let e = write(&m, &args).expect_err(what);
        assert!(e.contains("configdrive"), "{what}: {e}");
        let asked = lab
            .server
            .requests
            .load(std::sync::atomic::Ordering::Relaxed)
            - served;
        assert!(
            asked <= 1,
            "{what}: the image was fetched ({asked} requests)"
        );
        assert!(snapshot(&disk)? == before, "{what}: the disk changed");
    }
    Ok(())
}

//! `write_image` on a `uefi` node (IPA's `manage_uefi`): real disk images made with sgdisk,
//! mkfs.vfat and mtools (an ESP at 1 MiB, GPT or MBR type 0xEF) are written to loop devices;
//! the loader and label chosen are checked, and the `Boot####` variable the agent wrote into
//! a stand-in efivars directory is decoded here, independently of the agent's encoder, per
//! the UEFI spec (EFI_LOAD_OPTION, hard-drive and file-path media nodes) and compared with
//! what sgdisk says about the partition. Images without an ESP or a loader fail with both
//! disk ends wiped; a ramdisk that booted BIOS is refused before the disk is touched.
//!
//! Needs root (loop devices), sgdisk, mkfs.vfat (dosfstools) and mtools; skips without them
//! unless `RIVET_REQUIRE_PEERS=1`.

use anyhow::{bail, ensure, Context, Result};
use rivet_protocol::deploy::{BootMode, UefiBootEntry, WriteImageArgs};
use rivet_tests::agentproc::{have, is_root};
use rivet_tests::imagelab::{manager, write, ImageLab, TestDisk, MIB};
use rivet_tests::{prerequisite, run_tool};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const GLOBAL: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";
/// Where the tests' ESP starts and how long it is, in 512-byte sectors.
const ESP_START: u64 = 2048;
const ESP_SECTORS: u64 = 16384;

fn ready() -> bool {
    prerequisite(is_root(), "root (loop devices)")
        && prerequisite(have("sgdisk"), "sgdisk (Debian gdisk)")
        && prerequisite(have("mkfs.vfat"), "mkfs.vfat (Debian dosfstools)")
        && prerequisite(have("mmd"), "mmd (Debian mtools)")
        && prerequisite(have("mcopy"), "mcopy (Debian mtools)")
}

/// UTF-16LE with a BOM, as shim ships BOOTX64.CSV.
fn utf16_csv(text: &str) -> Vec<u8> {
    let mut b = vec![0xFF, 0xFE];
    b.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
    b
}

/// An 8 MiB FAT16 filesystem (512-byte clusters: FAT16 needs 4085 or more) holding `files` (paths below the root, `/`-separated).
fn esp_fs(dir: &Path, name: &str, files: &[(&str, Vec<u8>)]) -> Result<PathBuf> {
    let img = dir.join(format!("{name}.esp"));
    std::fs::File::create(&img)?.set_len(ESP_SECTORS * 512)?;
    run_tool(
        Command::new("mkfs.vfat")
            .args(["-F", "16", "-s", "1", "-n", "ESP"])
            .arg(&img),
    )?;
    let mut made = std::collections::BTreeSet::new();
    for (path, data) in files {
        let parts: Vec<&str> = path.split('/').collect();
        for i in 1..parts.len() {
            let d = parts[..i].join("/");
            if made.insert(d.clone()) {
                run_tool(
                    Command::new("mmd")
                        .arg("-i")
                        .arg(&img)
                        .arg(format!("::/{d}")),
                )?;
            }
        }
        let src = dir.join(format!("{name}.src"));
        std::fs::write(&src, data)?;
        run_tool(
            Command::new("mcopy")
                .arg("-i")
                .arg(&img)
                .arg(&src)
                .arg(format!("::/{path}")),
        )?;
    }
    Ok(img)
}

/// A 24 MiB GPT image in `www/name`: partition 1 the ESP (EF00) holding `files`, partition
/// 2 Linux. The ESP's unique GUID, as sgdisk prints it.
fn gpt_image(lab: &ImageLab, name: &str, files: &[(&str, Vec<u8>)]) -> Result<String> {
    let path = lab.www(name);
    std::fs::File::create(&path)?.set_len(24 * MIB)?;
    run_tool(
        Command::new("sgdisk")
            .args([
                "-o",
                "-n",
                "1:2048:+8M",
                "-t",
                "1:ef00",
                "-n",
                "2:0:0",
                "-t",
                "2:8300",
            ])
            .arg(&path),
    )?;
    let esp = esp_fs(lab.dir.path(), name, files)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)?
        .write_all_at(&std::fs::read(&esp)?, ESP_START * 512)?;
    let info = run_tool(Command::new("sgdisk").args(["-i", "1"]).arg(&path))?;
    let guid = info
        .lines()
        .find_map(|l| l.strip_prefix("Partition unique GUID: "))
        .context("sgdisk -i 1 printed no unique GUID")?;
    Ok(guid.trim().to_ascii_lowercase())
}

/// A 24 MiB MBR image: disk signature `sig`, partition 1 of type 0xEF holding `files`.
fn mbr_image(lab: &ImageLab, name: &str, sig: u32, files: &[(&str, Vec<u8>)]) -> Result<()> {
    let mut img = vec![0u8; (24 * MIB) as usize];
    img[440..444].copy_from_slice(&sig.to_le_bytes());
    let e = 446;
    img[e + 1..e + 4].copy_from_slice(&[0xFE, 0xFF, 0xFF]);
    img[e + 4] = 0xEF;
    img[e + 5..e + 8].copy_from_slice(&[0xFE, 0xFF, 0xFF]);
    img[e + 8..e + 12].copy_from_slice(&(ESP_START as u32).to_le_bytes());
    img[e + 12..e + 16].copy_from_slice(&(ESP_SECTORS as u32).to_le_bytes());
    img[510] = 0x55;
    img[511] = 0xAA;
    let esp = std::fs::read(esp_fs(lab.dir.path(), name, files)?)?;
    let at = (ESP_START * 512) as usize;
    img[at..at + esp.len()].copy_from_slice(&esp);
    std::fs::write(lab.www(name), img)?;
    Ok(())
}

/// A stand-in efivarfs: `…/efi/efivars` with a firmware's two entries and its BootOrder.
struct Vars {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

fn var_file(data: &[u8]) -> Vec<u8> {
    [&7u32.to_le_bytes()[..], data].concat()
}

/// A load option as a firmware writes one: `desc` and some device path bytes.
fn firmware_option(desc: &str, path: &[u8]) -> Vec<u8> {
    let mut o = 1u32.to_le_bytes().to_vec();
    o.extend_from_slice(&(path.len() as u16).to_le_bytes());
    o.extend(desc.encode_utf16().chain([0]).flat_map(u16::to_le_bytes));
    o.extend_from_slice(path);
    o
}

impl Vars {
    fn new() -> Result<Vars> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("efi/efivars");
        std::fs::create_dir_all(&root)?;
        let v = Vars { _dir: dir, root };
        // A PXE entry (a MAC node) and the shell (a firmware-volume node), order 0, 1.
        v.put(
            "Boot0000",
            &firmware_option(
                "UEFI PXEv4",
                &[
                    3, 11, 37, 0, 0x52, 0x54, 0, 0x12, 0x34, 0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 0xff, 4, 0,
                ],
            ),
        )?;
        v.put(
            "Boot0001",
            &firmware_option(
                "EFI Internal Shell",
                &[
                    4, 6, 20, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 0x7f, 0xff,
                    4, 0,
                ],
            ),
        )?;
        v.put("BootOrder", &[0, 0, 1, 0])?;
        Ok(v)
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        std::fs::write(self.root.join(format!("{name}-{GLOBAL}")), var_file(data))?;
        Ok(())
    }

    fn get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        match std::fs::read(self.root.join(format!("{name}-{GLOBAL}"))) {
            Ok(b) => {
                ensure!(
                    b.len() >= 4 && b[..4] == [7, 0, 0, 0],
                    "{name}: attributes are not NV|BS|RT"
                );
                Ok(Some(b[4..].to_vec()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn boot_order(&self) -> Result<Vec<u16>> {
        let b = self.get("BootOrder")?.context("no BootOrder")?;
        Ok(b.chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect())
    }

    /// Every variable file's name and content.
    fn snapshot(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let mut all = Vec::new();
        for e in std::fs::read_dir(&self.root)? {
            let e = e?;
            all.push((
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path())?,
            ));
        }
        all.sort();
        Ok(all)
    }
}

/// A `Boot####` decoded per the spec, for the checks.
#[derive(Debug)]
struct Decoded {
    attributes: u32,
    description: String,
    partition: u32,
    start: u64,
    size: u64,
    signature: [u8; 16],
    format: u8,
    signature_type: u8,
    path: String,
    optional_len: usize,
}

fn le16(b: &[u8], o: usize) -> Result<u16> {
    Ok(u16::from_le_bytes(
        b.get(o..o + 2).context("short")?.try_into()?,
    ))
}

fn decode_option(b: &[u8]) -> Result<Decoded> {
    let attributes = u32::from_le_bytes(b.get(..4).context("short")?.try_into()?);
    let fpl = le16(b, 4)? as usize;
    let mut units = Vec::new();
    let mut at = 6;
    loop {
        let u = le16(b, at)?;
        at += 2;
        if u == 0 {
            break;
        }
        units.push(u);
    }
    let description = String::from_utf16(&units)?;
    let list = b
        .get(at..at + fpl)
        .context("FilePathListLength past the end")?;
    let optional_len = b.len() - at - fpl;
    let mut hd = None;
    let mut path = None;
    let mut o = 0;
    let mut ended = false;
    while o < list.len() {
        let (t, s, len) = (list[o], list[o + 1], le16(list, o + 2)? as usize);
        ensure!(
            len >= 4 && o + len <= list.len(),
            "bad node length {len} at {o}"
        );
        let node = &list[o..o + len];
        match (t, s) {
            (4, 1) => {
                ensure!(len == 42, "HD node is {len} bytes, not 42");
                hd = Some(node.to_vec());
            }
            (4, 4) => {
                let u: Vec<u16> = node[4..]
                    .chunks(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                ensure!(u.last() == Some(&0), "file path not NUL-terminated");
                path = Some(String::from_utf16(&u[..u.len() - 1])?);
            }
            (0x7f, 0xff) => {
                ensure!(o + len == list.len(), "end node before the end of the list");
                ended = true;
            }
            other => bail!("unexpected device path node {other:?}"),
        }
        o += len;
    }
    ensure!(ended, "no end node");
    let hd = hd.context("no hard-drive node")?;
    Ok(Decoded {
        attributes,
        description,
        partition: u32::from_le_bytes(hd[4..8].try_into()?),
        start: u64::from_le_bytes(hd[8..16].try_into()?),
        size: u64::from_le_bytes(hd[16..24].try_into()?),
        signature: hd[24..40].try_into()?,
        format: hd[40],
        signature_type: hd[41],
        path: path.context("no file path node")?,
        optional_len,
    })
}

/// `6a2b…-…` → the GUID's on-disk bytes (first three groups little-endian).
fn guid_bytes(text: &str) -> Result<[u8; 16]> {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    ensure!(hex.len() == 32, "GUID {text}");
    let mut b = [0u8; 16];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16)?;
    }
    b[..4].reverse();
    b[4..6].reverse();
    b[6..8].reverse();
    Ok(b)
}

fn uefi_args(lab: &ImageLab, name: &str, disk: &TestDisk) -> Result<WriteImageArgs> {
    Ok(WriteImageArgs {
        boot_mode: Some(BootMode::Uefi),
        ..lab.args(name, disk)?
    })
}

fn deploy(lab: &ImageLab, name: &str, disk: &TestDisk, vars: &Vars) -> Result<UefiBootEntry> {
    let m = manager(vec![disk.path().to_path_buf()]).with_efivars(vars.root.clone());
    let r = write(&m, &uefi_args(lab, name, disk)?).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    r.uefi_boot_entry
        .with_context(|| format!("{name}: no uefi_boot_entry in the result"))
}

/// Files of an ESP: path below its root, content.
type EspFiles = Vec<(&'static str, Vec<u8>)>;

fn shim_csv_files() -> EspFiles {
    vec![
        // A vendor without a CSV sorts first: the CSV still wins (it is authoritative).
        ("EFI/centos/grubx64.efi", b"centos grub".to_vec()),
        (
            "EFI/debian/BOOTX64.CSV",
            utf16_csv("shimx64.efi,debian,,This is the boot entry for debian\r\n"),
        ),
        ("EFI/debian/shimx64.efi", b"shim".to_vec()),
        ("EFI/debian/grubx64.efi", b"grub".to_vec()),
        ("EFI/BOOT/BOOTX64.EFI", b"fallback".to_vec()),
    ]
}

#[test]
fn loaders_are_chosen_as_ipa_does_and_the_entry_is_first() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    let cases: Vec<(&str, EspFiles, &str, &str)> = vec![
        (
            "csv.raw",
            shim_csv_files(),
            "\\EFI\\debian\\shimx64.efi",
            "debian",
        ),
        (
            "shim.raw",
            vec![
                ("EFI/ubuntu/grubx64.efi", b"grub".to_vec()),
                ("EFI/ubuntu/shimx64.efi", b"shim".to_vec()),
                ("EFI/BOOT/BOOTX64.EFI", b"fallback".to_vec()),
            ],
            "\\EFI\\ubuntu\\shimx64.efi",
            "ironic1",
        ),
        (
            // Upper-case 8.3 names on the FAT: found case-insensitively, spelled as stored.
            "grub.raw",
            vec![
                ("EFI/fedora/GRUBX64.EFI", b"grub".to_vec()),
                ("EFI/BOOT/BOOTX64.EFI", b"fallback".to_vec()),
            ],
            "\\EFI\\fedora\\GRUBX64.EFI",
            "ironic1",
        ),
        (
            "removable.raw",
            vec![("EFI/BOOT/BOOTX64.EFI", b"fallback".to_vec())],
            "\\EFI\\BOOT\\BOOTX64.EFI",
            "ironic1",
        ),
    ];
    for (name, files, loader, label) in cases {
        let guid = gpt_image(&lab, name, &files)?;
        let disk = lab.disk(&format!("{name}.disk"), 128)?;
        let vars = Vars::new()?;
        let e = deploy(&lab, name, &disk, &vars)?;
        assert_eq!(e.loader, loader, "{name}");
        assert_eq!(e.label, label, "{name}");
        assert_eq!(e.number, "Boot0002", "{name}: the first free number");
        assert_eq!(e.partition, 1, "{name}");
        assert_eq!(e.partition_id, guid, "{name}");
        assert!(e.removed.is_empty(), "{name}: {:?}", e.removed);
        let d = decode_option(&vars.get("Boot0002")?.context("no Boot0002")?)?;
        assert_eq!(d.attributes, 1, "{name}: LOAD_OPTION_ACTIVE");
        assert_eq!(d.description, label, "{name}");
        assert_eq!(
            (d.partition, d.start, d.size),
            (1, ESP_START, ESP_SECTORS),
            "{name}"
        );
        assert_eq!(
            d.signature,
            guid_bytes(&guid)?,
            "{name}: the ESP's unique GUID"
        );
        assert_eq!(
            (d.format, d.signature_type),
            (2, 2),
            "{name}: GPT, GUID signature"
        );
        assert_eq!(d.path, loader, "{name}");
        assert_eq!(d.optional_len, 0, "{name}: no load options for the loader");
        assert_eq!(
            vars.boot_order()?,
            vec![2, 0, 1],
            "{name}: first, the others kept"
        );
        // The image is on the disk as written (the ESP was only read).
        let want = std::fs::read(lab.www(name))?;
        let at = (ESP_START * 512) as usize;
        assert!(
            disk.read(at as u64, (ESP_SECTORS * 512) as usize)?
                == want[at..at + (ESP_SECTORS * 512) as usize],
            "{name}: the ESP on the disk differs from the image's"
        );
    }

    // MBR with a 0xEF partition: the HD node carries the disk signature.
    mbr_image(
        &lab,
        "mbr.raw",
        0x1234_ABCD,
        &[("EFI/BOOT/BOOTX64.EFI", b"fallback".to_vec())],
    )?;
    let disk = lab.disk("mbr.disk", 128)?;
    let vars = Vars::new()?;
    let e = deploy(&lab, "mbr.raw", &disk, &vars)?;
    assert_eq!(e.loader, "\\EFI\\BOOT\\BOOTX64.EFI");
    assert_eq!(e.partition_id, "mbr:1234abcd");
    let d = decode_option(&vars.get("Boot0002")?.context("no Boot0002")?)?;
    assert_eq!((d.partition, d.start, d.size), (1, ESP_START, ESP_SECTORS));
    assert_eq!(
        (d.format, d.signature_type),
        (1, 1),
        "MBR, 32-bit signature"
    );
    assert_eq!(d.signature[..4], [0xCD, 0xAB, 0x34, 0x12]);
    assert!(d.signature[4..].iter().all(|b| *b == 0));
    assert_eq!(vars.boot_order()?, vec![2, 0, 1]);
    Ok(())
}

#[test]
fn a_redeploy_replaces_the_entry_the_agent_made_before() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    gpt_image(&lab, "csv.raw", &shim_csv_files())?;
    let grub_guid = gpt_image(
        &lab,
        "grub.raw",
        &[("EFI/rocky/grubx64.efi", b"grub".to_vec())],
    )?;
    let disk = lab.disk("d", 128)?;
    let vars = Vars::new()?;
    let first = deploy(&lab, "csv.raw", &disk, &vars)?;
    assert_eq!(first.number, "Boot0002");
    let firmware_before = (vars.get("Boot0000")?, vars.get("Boot0001")?);

    // Another image: a new ESP GUID, another loader and label. Boot0002 is recognised as
    // the agent's by its record alone, and goes.
    let second = deploy(&lab, "grub.raw", &disk, &vars)?;
    assert_eq!(
        second.number, "Boot0003",
        "written before the old one is removed"
    );
    assert_eq!(second.removed, vec!["Boot0002"]);
    assert_eq!(vars.get("Boot0002")?, None, "the first entry is gone");
    assert_eq!(vars.boot_order()?, vec![3, 0, 1]);
    assert_eq!(
        decode_option(&vars.get("Boot0003")?.context("Boot0003")?)?.signature,
        guid_bytes(&grub_guid)?
    );
    assert_eq!(
        (vars.get("Boot0000")?, vars.get("Boot0001")?),
        firmware_before,
        "firmware entries untouched"
    );

    // A third deploy of the same image, with an entry another tool made for the same loader
    // and an unrelated one in between: the same device path goes (IPA dedups), the other
    // tool's unrelated entry stays. The record is not needed for the duplicate.
    let dup = vars.get("Boot0003")?.context("Boot0003")?;
    let mut foreign = dup.clone();
    // Another description, same device path.
    let d = decode_option(&dup)?;
    let path_at = 6 + (d.description.encode_utf16().count() + 1) * 2;
    foreign.truncate(6);
    foreign.extend(
        "rocky (efibootmgr)"
            .encode_utf16()
            .chain([0])
            .flat_map(u16::to_le_bytes),
    );
    foreign.extend_from_slice(&dup[path_at..]);
    vars.put("Boot0004", &foreign)?;
    vars.put(
        "Boot0005",
        &firmware_option("Other OS", &[0x7f, 0xff, 4, 0]),
    )?;
    vars.put("BootOrder", &[3, 0, 4, 0, 0, 0, 5, 0, 1, 0])?;
    let third = deploy(&lab, "grub.raw", &disk, &vars)?;
    assert_eq!(third.number, "Boot0002", "the first free number again");
    assert_eq!(third.removed, vec!["Boot0003", "Boot0004"]);
    assert_eq!(vars.boot_order()?, vec![2, 0, 5, 1]);
    assert!(vars.get("Boot0005")?.is_some(), "an unrelated entry stays");
    Ok(())
}

#[test]
fn an_image_without_esp_or_loader_fails_with_the_disk_wiped() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    gpt_image(
        &lab,
        "empty-esp.raw",
        &[("EFI/debian/README.txt", b"no loader here".to_vec())],
    )?;
    for (name, want) in [
        ("img.raw", "has no EFI System Partition"),
        ("empty-esp.raw", "has no loader in it"),
    ] {
        let disk = lab.disk(&format!("{name}.disk"), 128)?;
        let vars = Vars::new()?;
        let before = vars.snapshot()?;
        let m = manager(vec![disk.path().to_path_buf()]).with_efivars(vars.root.clone());
        let e = write(&m, &uefi_args(&lab, name, &disk)?).expect_err(name);
        assert!(e.contains(want), "{name}: {e}");
        assert!(
            e.contains(&disk.path().display().to_string()),
            "{name}: names the disk: {e}"
        );
        assert!(
            e.contains("set boot_mode bios"),
            "{name}: says what to do: {e}"
        );
        disk.assert_nothing_bootable(name)?;
        assert_eq!(vars.snapshot()?, before, "{name}: no variable changed");
    }
    Ok(())
}

#[test]
fn a_bios_booted_ramdisk_is_refused_before_the_disk_is_touched() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let lab = ImageLab::new()?;
    gpt_image(&lab, "csv.raw", &shim_csv_files())?;
    let disk = lab.disk("d", 128)?;
    let nowhere = lab.dir.path().join("no-firmware/efi/efivars");
    let m = manager(vec![disk.path().to_path_buf()]).with_efivars(nowhere);
    let e = write(&m, &uefi_args(&lab, "csv.raw", &disk)?).expect_err("bios ramdisk");
    assert!(e.contains("booted in BIOS"), "{e}");
    assert!(e.contains("boot mode"), "says what to check: {e}");
    assert!(
        disk.read(0, MIB as usize)?.iter().all(|b| *b == 0xAB),
        "the disk was touched"
    );
    // The same image on a bios node: no entry, no ESP lookup.
    let m = manager(vec![disk.path().to_path_buf()])
        .with_efivars(lab.dir.path().join("no-firmware/efi/efivars"));
    let r = write(
        &m,
        &WriteImageArgs {
            boot_mode: Some(BootMode::Bios),
            ..lab.args("csv.raw", &disk)?
        },
    )
    .map_err(anyhow::Error::msg)?;
    assert_eq!(r.uefi_boot_entry, None);
    Ok(())
}

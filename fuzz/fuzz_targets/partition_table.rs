//! A disk's partition table from arbitrary bytes: the erase reader (`erase::table::parse`,
//! GPT primary or backup, MBR with an EBR chain) and the deploy step's GPT/MBR code
//! (`deploy::gpt`: which table, moving the GPT backup to the end, finding or adding the
//! `config-2` partition) on an in-memory device holding the bytes, possibly followed by empty
//! space (an image smaller than the disk). Properties: nothing panics; every partition read
//! lies inside the device; a placed `config-2` partition lies inside the device, and a new
//! one is what the erase reader then finds; moving the backup twice is a no-op the second
//! time; refusals name the device. The control byte's top bit makes the primary GPT's CRCs
//! right first, so the fuzzer explores what lies behind them.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rivet_hardware_managers::deploy::gpt::{self, Device, TableKind};
use rivet_hardware_managers::erase::table;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;

fn memfd() -> File {
    // SAFETY: a NUL-terminated name and no flags; the fd is checked, then owned by the File.
    let fd = unsafe { libc::memfd_create(c"rivet-fuzz-disk".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd nothing else owns.
    unsafe { File::from_raw_fd(fd) }
}

fn has_sig(f: &File, off: Option<u64>) -> bool {
    let mut b = [0u8; 8];
    off.is_some_and(|o| f.read_exact_at(&mut b, o).is_ok() && &b == b"EFI PART")
}

fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

/// Set the primary GPT header's partition-array CRC (when the array is inside the image) and
/// its own CRC.
fn fix_gpt_crcs(img: &mut [u8], sector: usize) {
    let h = sector;
    if img.len() < h + 92 || &img[h..h + 8] != b"EFI PART" {
        return;
    }
    let hsize = le32(img, h + 12) as usize;
    if !(92..=sector).contains(&hsize) || img.len() < h + hsize {
        return;
    }
    let lba = u64::from_le_bytes(img[h + 72..h + 80].try_into().expect("8 bytes"));
    let n = (le32(img, h + 80) as usize).saturating_mul(le32(img, h + 84) as usize);
    let array = lba
        .checked_mul(sector as u64)
        .and_then(|o| usize::try_from(o).ok())
        .filter(|o| n <= 1 << 20 && o.checked_add(n).is_some_and(|e| e <= img.len()));
    if let Some(o) = array {
        let mut c = flate2::Crc::new();
        c.update(&img[o..o + n]);
        img[h + 88..h + 92].copy_from_slice(&c.sum().to_le_bytes());
    }
    img[h + 16..h + 20].fill(0);
    let mut c = flate2::Crc::new();
    c.update(&img[h..h + hsize]);
    img[h + 16..h + 20].copy_from_slice(&c.sum().to_le_bytes());
}

fn check_read(f: &File, size: u64, sector: u64) -> Vec<(u64, u64)> {
    let parts = table::parse(f, size, sector, "fuzz");
    for p in &parts {
        assert!(p.size > 0, "empty partition {p:?}");
        assert!(
            p.start < size && p.start + p.size <= size,
            "partition {p:?} outside the {size}-byte device"
        );
    }
    parts.iter().map(|p| (p.start, p.size)).collect()
}

fn check_error(e: &gpt::TableError) {
    let m = e.to_string();
    assert!(m.starts_with("fuzz: "), "{m}");
    assert!(m.len() <= 1024, "error message of {} bytes", m.len());
}

fuzz_target!(|data: &[u8]| {
    let Some((&how, image)) = data.split_first() else {
        return;
    };
    let sector: u64 = if how & 1 == 0 { 512 } else { 4096 };
    // The disk: the image, then 0 to 60 MiB of nothing, in whole sectors.
    let extra = u64::from((how >> 1) & 15) * (4 << 20);
    let size = (image.len() as u64 + extra).div_ceil(sector) * sector;
    let mut image = image.to_vec();
    if how & 0x80 != 0 {
        fix_gpt_crcs(&mut image, sector as usize);
    }
    let f = memfd();
    f.write_all_at(&image, 0).expect("memfd write");
    f.set_len(size).expect("memfd size");

    check_read(&f, size, sector);

    let dev = Device::new(&f, "fuzz", sector, size);
    let kind = match gpt::table_kind(&dev) {
        Ok(k) => k,
        Err(e) => return check_error(&e),
    };
    match gpt::relocate_backup(&dev) {
        Ok(true) => assert!(
            matches!(gpt::relocate_backup(&dev), Ok(false)),
            "moving the backup again was not a no-op"
        ),
        Ok(false) => {}
        Err(e) => check_error(&e),
    }
    // The probe the deploy step uses: an ISO 9660 volume labelled config-2.
    let label_at = |offset: u64| {
        let mut b = [0u8; 8];
        offset
            .checked_add(0x8028)
            .is_some_and(|o| f.read_exact_at(&mut b, o).is_ok() && &b == b"config-2")
    };
    let need = 64u64 << 10 << (how >> 5 & 3);
    match gpt::config_partition(&dev, 64 << 20, need, &label_at) {
        Ok(p) => {
            assert!(p.len > 0 && p.offset % sector == 0, "{p:?}");
            assert!(
                p.offset.checked_add(p.len).is_some_and(|e| e <= size),
                "config-2 partition {p:?} outside the {size}-byte device"
            );
            if !p.reused {
                assert!(p.len >= need, "{p:?} is smaller than the {need} bytes asked");
                // What the erase reader sees must include it, unless another table shadows
                // the one written (a GPT signature where the reader looks first).
                let shadowed = match kind {
                    TableKind::Gpt => sector != 512,
                    _ => [Some(512), Some(4096), size.checked_sub(512), size.checked_sub(4096)]
                        .into_iter()
                        .any(|o| has_sig(&f, o)),
                };
                let parts = check_read(&f, size, sector);
                if !shadowed {
                    assert!(
                        parts.contains(&(p.offset, p.len)),
                        "the erase reader does not see the new partition {p:?}: {parts:?}"
                    );
                }
            }
        }
        Err(e) => check_error(&e),
    }
});

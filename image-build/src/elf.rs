//! Just enough ELF64 (little endian) reading for the ramdisk: a kernel module's `.modinfo`
//! section (`depends=`, `name=`…), whether an executable asks for a dynamic loader
//! (`PT_INTERP`), and for the one dynamically linked program the ramdisk ships (mdadm) what
//! the loader will look for: its `PT_INTERP` path and the `DT_NEEDED` libraries of its
//! dynamic section.

/// Errors reading an ELF file.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ElfError {
    /// Not an ELF file at all.
    #[error("not an ELF file")]
    NotElf,
    /// 32-bit or big-endian: the ramdisk is x86_64 only.
    #[error("not a 64-bit little-endian ELF file (the ramdisk is x86_64)")]
    Unsupported,
    /// A header or table points outside the file.
    #[error("truncated or corrupt ELF file: {0}")]
    Corrupt(&'static str),
}

fn u16_at(d: &[u8], off: usize) -> Result<u16, ElfError> {
    d.get(off..off + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .ok_or(ElfError::Corrupt("header"))
}

fn u32_at(d: &[u8], off: usize) -> Result<u32, ElfError> {
    d.get(off..off + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(ElfError::Corrupt("header"))
}

fn u64_at(d: &[u8], off: usize) -> Result<u64, ElfError> {
    d.get(off..off + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or(ElfError::Corrupt("header"))
}

fn usize_at(d: &[u8], off: usize) -> Result<usize, ElfError> {
    usize::try_from(u64_at(d, off)?).map_err(|_| ElfError::Corrupt("offset"))
}

fn check_ident(d: &[u8]) -> Result<(), ElfError> {
    if d.len() < 64 || &d[..4] != b"\x7fELF" {
        return Err(ElfError::NotElf);
    }
    // EI_CLASS = ELFCLASS64, EI_DATA = ELFDATA2LSB.
    if d[4] != 2 || d[5] != 1 {
        return Err(ElfError::Unsupported);
    }
    Ok(())
}

/// The bytes of the section called `name`, if there is one.
pub fn section<'a>(d: &'a [u8], name: &str) -> Result<Option<&'a [u8]>, ElfError> {
    check_ident(d)?;
    let shoff = usize_at(d, 0x28)?;
    let shentsize = usize::from(u16_at(d, 0x3a)?);
    let shnum = usize::from(u16_at(d, 0x3c)?);
    let shstrndx = usize::from(u16_at(d, 0x3e)?);
    if shoff == 0 || shnum == 0 {
        return Ok(None);
    }
    if shentsize < 64 || shstrndx >= shnum {
        return Err(ElfError::Corrupt("section header table"));
    }
    let sh = |i: usize| -> Result<(u32, u32, usize, usize), ElfError> {
        let base = shoff
            .checked_add(
                i.checked_mul(shentsize)
                    .ok_or(ElfError::Corrupt("section index"))?,
            )
            .ok_or(ElfError::Corrupt("section offset"))?;
        Ok((
            u32_at(d, base)?,
            u32_at(d, base + 4)?,
            usize_at(d, base + 24)?,
            usize_at(d, base + 32)?,
        ))
    };
    let slice = |off: usize, size: usize| -> Result<&'a [u8], ElfError> {
        off.checked_add(size)
            .and_then(|end| d.get(off..end))
            .ok_or(ElfError::Corrupt("section data outside the file"))
    };
    let (_, _, str_off, str_size) = sh(shstrndx)?;
    let names = slice(str_off, str_size)?;
    for i in 0..shnum {
        let (name_off, sh_type, off, size) = sh(i)?;
        let Some(rest) = names.get(name_off as usize..) else {
            continue;
        };
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        if &rest[..end] == name.as_bytes() {
            // SHT_NOBITS occupies no file space.
            return if sh_type == 8 {
                Ok(Some(&[]))
            } else {
                slice(off, size).map(Some)
            };
        }
    }
    Ok(None)
}

/// A kernel module's `.modinfo` as `(key, value)` pairs, in file order.
pub fn modinfo(d: &[u8]) -> Result<Vec<(String, String)>, ElfError> {
    let Some(sec) = section(d, ".modinfo")? else {
        return Ok(Vec::new());
    };
    Ok(sec
        .split(|&b| b == 0)
        .filter_map(|kv| {
            let s = std::str::from_utf8(kv).ok()?;
            let (k, v) = s.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect())
}

/// One program header: type, file offset, virtual address, size in the file.
struct Segment {
    kind: u32,
    offset: usize,
    vaddr: u64,
    filesz: usize,
}

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
const DT_SONAME: u64 = 14;

fn segments(d: &[u8]) -> Result<Vec<Segment>, ElfError> {
    check_ident(d)?;
    let phoff = usize_at(d, 0x20)?;
    let phentsize = usize::from(u16_at(d, 0x36)?);
    let phnum = usize::from(u16_at(d, 0x38)?);
    if phnum > 0 && phentsize < 56 {
        return Err(ElfError::Corrupt("program header table"));
    }
    (0..phnum)
        .map(|i| {
            let base = phoff
                .checked_add(i * phentsize)
                .ok_or(ElfError::Corrupt("program header offset"))?;
            Ok(Segment {
                kind: u32_at(d, base)?,
                offset: usize_at(d, base + 8)?,
                vaddr: u64_at(d, base + 16)?,
                filesz: usize_at(d, base + 32)?,
            })
        })
        .collect()
}

/// Whether the executable has a `PT_INTERP` program header (needs a dynamic loader).
pub fn needs_interpreter(d: &[u8]) -> Result<bool, ElfError> {
    Ok(segments(d)?.iter().any(|s| s.kind == PT_INTERP))
}

/// What a dynamically linked executable or shared library asks of the dynamic loader.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dynamic {
    /// The loader (`PT_INTERP`, `/lib64/ld-linux-x86-64.so.2`); `None` for a shared library
    /// or a static executable.
    pub interpreter: Option<String>,
    /// The libraries it needs (`DT_NEEDED`, `libc.so.6`), in file order.
    pub needed: Vec<String>,
    /// Its own name as a library (`DT_SONAME`), if it has one.
    pub soname: Option<String>,
}

/// The NUL-terminated string at the start of `b` (all of it when there is no NUL).
fn c_str(b: &[u8], what: &'static str) -> Result<String, ElfError> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end])
        .map(str::to_string)
        .map_err(|_| ElfError::Corrupt(what))
}

/// Read the loader path and the dynamic section: what the loader needs to run this file.
/// A static executable (or a kernel module) gives an empty [`Dynamic`].
pub fn dynamic(d: &[u8]) -> Result<Dynamic, ElfError> {
    let segs = segments(d)?;
    let bytes = |off: usize, len: usize, what: &'static str| {
        off.checked_add(len)
            .and_then(|end| d.get(off..end))
            .ok_or(ElfError::Corrupt(what))
    };
    let mut out = Dynamic::default();
    if let Some(s) = segs.iter().find(|s| s.kind == PT_INTERP) {
        let path = c_str(bytes(s.offset, s.filesz, "PT_INTERP")?, "PT_INTERP")?;
        if path.is_empty() {
            return Err(ElfError::Corrupt("empty PT_INTERP"));
        }
        out.interpreter = Some(path);
    }
    let Some(dynseg) = segs.iter().find(|s| s.kind == PT_DYNAMIC) else {
        return Ok(out);
    };
    let table = bytes(dynseg.offset, dynseg.filesz, "PT_DYNAMIC")?;
    let (mut needed, mut soname) = (Vec::new(), None);
    let (mut strtab, mut strsz) = (None, None);
    for entry in table.chunks_exact(16) {
        let tag = u64_at(entry, 0)?;
        let val = u64_at(entry, 8)?;
        match tag {
            DT_NULL => break,
            DT_NEEDED => needed.push(val),
            DT_SONAME => soname = Some(val),
            DT_STRTAB => strtab = Some(val),
            DT_STRSZ => strsz = Some(val),
            _ => {}
        }
    }
    if needed.is_empty() && soname.is_none() {
        return Ok(out);
    }
    // DT_STRTAB is a virtual address: find the loaded segment holding it.
    let addr = strtab.ok_or(ElfError::Corrupt("DT_NEEDED without DT_STRTAB"))?;
    let seg = segs
        .iter()
        .filter(|s| s.kind == PT_LOAD)
        .find(|s| addr >= s.vaddr && addr - s.vaddr < s.filesz as u64)
        .ok_or(ElfError::Corrupt("DT_STRTAB outside every PT_LOAD segment"))?;
    let start = seg.offset + (addr - seg.vaddr) as usize;
    let room = seg.filesz - (addr - seg.vaddr) as usize;
    let len = strsz.map_or(room, |n| usize::try_from(n).unwrap_or(usize::MAX).min(room));
    let strings = bytes(start, len, "DT_STRTAB")?;
    let string = |off: u64| -> Result<String, ElfError> {
        let rest = usize::try_from(off)
            .ok()
            .and_then(|o| strings.get(o..))
            .ok_or(ElfError::Corrupt("string offset outside DT_STRTAB"))?;
        c_str(rest, "dynamic string")
    };
    out.needed = needed.into_iter().map(string).collect::<Result<_, _>>()?;
    out.soname = soname.map(string).transpose()?;
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ELF64 relocatable file with a `.modinfo` section holding `modinfo`.
    pub(crate) fn fake_module(modinfo: &str) -> Vec<u8> {
        let shstr = b"\0.modinfo\0.shstrtab\0";
        let info = modinfo.replace(';', "\0");
        let mut d = vec![0u8; 64];
        d[..4].copy_from_slice(b"\x7fELF");
        d[4] = 2;
        d[5] = 1;
        let info_off = d.len();
        d.extend_from_slice(info.as_bytes());
        let str_off = d.len();
        d.extend_from_slice(shstr);
        while d.len() & 7 != 0 {
            d.push(0);
        }
        let shoff = d.len();
        // Section 0: null; 1: .modinfo; 2: .shstrtab.
        d.extend_from_slice(&[0u8; 64]);
        for (name, off, size) in [(1u32, info_off, info.len()), (10, str_off, shstr.len())] {
            let mut sh = [0u8; 64];
            sh[..4].copy_from_slice(&name.to_le_bytes());
            sh[4..8].copy_from_slice(&1u32.to_le_bytes());
            sh[24..32].copy_from_slice(&(off as u64).to_le_bytes());
            sh[32..40].copy_from_slice(&(size as u64).to_le_bytes());
            d.extend_from_slice(&sh);
        }
        d[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        d[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        d[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        d[0x3e..0x40].copy_from_slice(&2u16.to_le_bytes());
        d
    }

    /// A minimal dynamically linked ELF64 executable: one PT_LOAD mapping the whole file at
    /// 0x400000 (so DT_STRTAB's address differs from its offset), PT_INTERP when `interp` is
    /// given, and a PT_DYNAMIC with `needed` (and `soname`).
    pub(crate) fn fake_dynamic(
        interp: Option<&str>,
        needed: &[&str],
        soname: Option<&str>,
    ) -> Vec<u8> {
        const BASE: u64 = 0x40_0000;
        let nph = 2 + usize::from(interp.is_some());
        let mut d = vec![0u8; 64 + 56 * nph];
        d[..4].copy_from_slice(b"\x7fELF");
        d[4] = 2;
        d[5] = 1;
        d[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        d[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        d[0x38..0x3a].copy_from_slice(&(nph as u16).to_le_bytes());
        let interp_at = d.len();
        if let Some(i) = interp {
            d.extend_from_slice(i.as_bytes());
            d.push(0);
        }
        let interp_len = d.len() - interp_at;
        // The string table: a leading NUL, then each name.
        let str_at = d.len();
        d.push(0);
        let mut offsets = Vec::new();
        for n in needed.iter().chain(soname.iter()) {
            offsets.push((d.len() - str_at) as u64);
            d.extend_from_slice(n.as_bytes());
            d.push(0);
        }
        let str_len = d.len() - str_at;
        while d.len() & 7 != 0 {
            d.push(0);
        }
        let dyn_at = d.len();
        let mut entry = |tag: u64, val: u64| {
            d.extend_from_slice(&tag.to_le_bytes());
            d.extend_from_slice(&val.to_le_bytes());
        };
        for off in &offsets[..needed.len()] {
            entry(DT_NEEDED, *off);
        }
        if soname.is_some() {
            entry(DT_SONAME, offsets[needed.len()]);
        }
        entry(DT_STRTAB, BASE + str_at as u64);
        entry(DT_STRSZ, str_len as u64);
        entry(DT_NULL, 0);
        let dyn_len = d.len() - dyn_at;
        let total = d.len();
        let mut ph = |i: usize, kind: u32, off: usize, vaddr: u64, size: usize| {
            let b = 64 + 56 * i;
            d[b..b + 4].copy_from_slice(&kind.to_le_bytes());
            d[b + 8..b + 16].copy_from_slice(&(off as u64).to_le_bytes());
            d[b + 16..b + 24].copy_from_slice(&vaddr.to_le_bytes());
            d[b + 32..b + 40].copy_from_slice(&(size as u64).to_le_bytes());
            d[b + 40..b + 48].copy_from_slice(&(size as u64).to_le_bytes());
        };
        ph(0, PT_LOAD, 0, BASE, total);
        ph(1, PT_DYNAMIC, dyn_at, BASE + dyn_at as u64, dyn_len);
        if interp.is_some() {
            ph(2, PT_INTERP, interp_at, BASE + interp_at as u64, interp_len);
        }
        d
    }

    #[test]
    fn reads_the_dynamic_section() {
        let d = fake_dynamic(
            Some("/lib64/ld-linux-x86-64.so.2"),
            &["libudev.so.1", "libc.so.6"],
            None,
        );
        assert!(needs_interpreter(&d).expect("elf"));
        assert_eq!(
            dynamic(&d).expect("dynamic"),
            Dynamic {
                interpreter: Some("/lib64/ld-linux-x86-64.so.2".into()),
                needed: vec!["libudev.so.1".into(), "libc.so.6".into()],
                soname: None,
            }
        );
        let lib = fake_dynamic(None, &["libc.so.6"], Some("libudev.so.1"));
        assert!(!needs_interpreter(&lib).expect("elf"));
        let info = dynamic(&lib).expect("dynamic");
        assert_eq!(info.interpreter, None);
        assert_eq!(info.needed, ["libc.so.6"]);
        assert_eq!(info.soname.as_deref(), Some("libudev.so.1"));
        // A kernel module (no program headers) needs nothing.
        assert_eq!(
            dynamic(&fake_module("a=b")).expect("module"),
            Dynamic::default()
        );
        // DT_STRTAB pointing nowhere, and a cut-off file, are errors, not panics.
        let mut bad = d.clone();
        let at = bad.len() - 32; // the DT_STRSZ entry
        let strtab_at = at - 16;
        bad[strtab_at + 8..strtab_at + 16].copy_from_slice(&0x10u64.to_le_bytes());
        assert!(matches!(dynamic(&bad), Err(ElfError::Corrupt(_))));
        for cut in [70, 130, d.len() - 40] {
            assert!(dynamic(&d[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn reads_host_binaries() {
        // Debian's coreutils are dynamically linked against glibc.
        let Ok(d) = std::fs::read("/bin/ls") else {
            eprintln!("skipping: no /bin/ls");
            return;
        };
        let info = dynamic(&d).expect("/bin/ls");
        let interp = info.interpreter.clone().expect("/bin/ls has a loader");
        assert!(
            interp.starts_with('/') && interp.contains("ld-linux"),
            "{interp}"
        );
        assert!(info.needed.iter().any(|n| n == "libc.so.6"), "{info:?}");
        // A library names itself.
        for lib in [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
        ] {
            if let Ok(d) = std::fs::read(lib) {
                let info = dynamic(&d).expect("libc");
                assert_eq!(info.soname.as_deref(), Some("libc.so.6"), "{lib}");
                break;
            }
        }
    }

    #[test]
    fn reads_modinfo() {
        let d = fake_module("license=GPL;depends=virtio,virtio_ring;name=virtio_blk;");
        let info = modinfo(&d).expect("modinfo");
        assert_eq!(
            info,
            vec![
                ("license".to_string(), "GPL".to_string()),
                ("depends".to_string(), "virtio,virtio_ring".to_string()),
                ("name".to_string(), "virtio_blk".to_string()),
            ]
        );
        assert_eq!(section(&d, ".text").expect("ok"), None);
        assert!(!needs_interpreter(&d).expect("no program headers"));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(modinfo(b"hello"), Err(ElfError::NotElf));
        let mut d = fake_module("a=b");
        d[4] = 1;
        assert_eq!(modinfo(&d), Err(ElfError::Unsupported));
        let mut d = fake_module("a=b");
        let len = d.len();
        d.truncate(len - 30);
        assert!(matches!(modinfo(&d), Err(ElfError::Corrupt(_))));
    }

    #[test]
    fn host_binaries() {
        // /bin/sh on the build host is dynamically linked on Debian.
        if let Ok(d) = std::fs::read("/bin/sh") {
            assert!(needs_interpreter(&d).expect("elf"));
        }
    }
}

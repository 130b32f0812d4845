//! Just enough ELF64 (little endian) reading for the ramdisk: a kernel module's `.modinfo`
//! section (`depends=`, `name=`…) and whether an executable asks for a dynamic loader
//! (`PT_INTERP`), which a ramdisk without shared libraries cannot satisfy.

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

/// Whether the executable has a `PT_INTERP` program header (needs a dynamic loader).
pub fn needs_interpreter(d: &[u8]) -> Result<bool, ElfError> {
    check_ident(d)?;
    let phoff = usize_at(d, 0x20)?;
    let phentsize = usize::from(u16_at(d, 0x36)?);
    let phnum = usize::from(u16_at(d, 0x38)?);
    if phnum > 0 && phentsize < 56 {
        return Err(ElfError::Corrupt("program header table"));
    }
    for i in 0..phnum {
        let base = phoff
            .checked_add(i * phentsize)
            .ok_or(ElfError::Corrupt("program header offset"))?;
        if u32_at(d, base)? == 3 {
            return Ok(true);
        }
    }
    Ok(false)
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

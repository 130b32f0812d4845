//! What an image is, from its own bytes, as IPA's format inspector decides it: the stream's
//! compression first (gzip and zstd are decoded; xz, bzip2, lz4 and archives are refused),
//! then the content after decompression (raw, qcow2 and ISO 9660 are written; VMDK,
//! VHD/VHDX, VDI, QED, LUKS, QEMU's old qcow, Parallels, Bochs, cloop and a second layer of
//! compression are refused). The declared `image_disk_format` is never trusted: a raw image
//! that is really a VMDK would land as a container the firmware cannot boot.
//!
//! Also here: the size an image states about itself before it is written (a qcow2's virtual
//! size, an ISO's volume size, the extent a GPT's backup header claims), so an image that
//! cannot fit is refused with the disk untouched.

/// How the stream is compressed, as served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// gzip (every member is decoded).
    Gzip,
    /// zstd (every frame is decoded; skippable frames are skipped).
    Zstd,
}

impl Compression {
    /// Name as reported in `write_image`'s result.
    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
        }
    }
}

/// Compressions and archives recognised but not decoded: refused by name.
const REFUSED_COMPRESSION: &[(&[u8], &str)] = &[
    (b"\xfd7zXZ\x00", "xz"),
    (b"BZh", "bzip2"),
    (b"\x04\x22\x4d\x18", "lz4"),
    (b"\x02\x21\x4c\x18", "lz4 (legacy)"),
    (b"\x89LZO\x00\r\n\x1a\n", "lzop"),
    (b"7z\xbc\xaf\x27\x1c", "7-zip archive"),
    (b"PK\x03\x04", "zip archive"),
    (b"Rar!\x1a\x07", "rar archive"),
];

/// The compression of a stream from its first bytes: `Ok(None)` for none, `Err(name)` for
/// one Rivet does not decode.
pub fn sniff_compression(head: &[u8]) -> Result<Option<Compression>, &'static str> {
    if head.starts_with(&[0x1f, 0x8b]) {
        return Ok(Some(Compression::Gzip));
    }
    if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Ok(Some(Compression::Zstd));
    }
    // A zstd stream may open with a skippable frame (pzstd's own index does).
    if head.len() >= 4 {
        let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        if (0x184D_2A50..=0x184D_2A5F).contains(&magic) {
            return Ok(Some(Compression::Zstd));
        }
    }
    for (magic, name) in REFUSED_COMPRESSION {
        if head.starts_with(magic) {
            return Err(name);
        }
    }
    // ustar: "ustar" at 257.
    if head.len() >= 262 && &head[257..262] == b"ustar" {
        return Err("tar archive");
    }
    Ok(None)
}

/// The content of (decompressed) image bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// A disk image to write as it is (possibly with a partition table, possibly not).
    Raw,
    /// QEMU copy-on-write v2/v3: decoded cluster by cluster.
    Qcow2,
    /// ISO 9660 (a hybrid ISO boots from a disk): written as raw.
    Iso,
    /// Recognised, not written: the name says what it is.
    Refused(&'static str),
}

impl Content {
    /// The format's name, as `image_disk_format` spells it where it has one.
    pub fn name(self) -> &'static str {
        match self {
            Content::Raw => "raw",
            Content::Qcow2 => "qcow2",
            Content::Iso => "iso",
            Content::Refused(n) => n,
        }
    }
}

fn at(head: &[u8], offset: usize, magic: &[u8]) -> bool {
    head.len() >= offset + magic.len() && &head[offset..offset + magic.len()] == magic
}

/// What the first bytes of the decompressed image are. Give at least 64 KiB where the image
/// has them: the ISO 9660 descriptor sits at 32 KiB.
pub fn detect(head: &[u8]) -> Content {
    if at(head, 0, b"QFI\xfb") {
        // Version 1 is QEMU's old qcow, which the decoder does not read.
        let version = head
            .get(4..8)
            .map(|v| u32::from_be_bytes([v[0], v[1], v[2], v[3]]));
        return match version {
            Some(2) | Some(3) => Content::Qcow2,
            _ => Content::Refused("qcow (version 1)"),
        };
    }
    if at(head, 0, b"KDMV") || at(head, 0, b"COWD") || at(head, 0, b"# Disk DescriptorFile") {
        return Content::Refused("vmdk");
    }
    if at(head, 0, b"conectix") {
        return Content::Refused("vhd");
    }
    if at(head, 0, b"vhdxfile") {
        return Content::Refused("vhdx");
    }
    if at(head, 0x40, &0xbeda_107fu32.to_le_bytes()) {
        return Content::Refused("vdi");
    }
    if at(head, 0, b"QED\0") {
        return Content::Refused("qed");
    }
    if at(head, 0, b"LUKS\xba\xbe") || at(head, 0, b"SKUL\xba\xbe") {
        return Content::Refused("luks");
    }
    if at(head, 0, b"WithoutFreeSpace") || at(head, 0, b"WithouFreSpacExt") {
        return Content::Refused("parallels");
    }
    if at(head, 0, b"Bochs Virtual HD Image") {
        return Content::Refused("bochs");
    }
    if at(head, 0, b"#!/bin/sh\n#V2.0 Format") {
        return Content::Refused("cloop");
    }
    match sniff_compression(head) {
        Ok(Some(c)) => return Content::Refused(nested(c)),
        Err(name) => return Content::Refused(name),
        Ok(None) => {}
    }
    if at(head, 0x8001, b"CD001") {
        return Content::Iso;
    }
    Content::Raw
}

fn nested(c: Compression) -> &'static str {
    match c {
        Compression::Gzip => "gzip inside the compressed stream",
        Compression::Zstd => "zstd inside the compressed stream",
    }
}

/// Whether a declared `image_disk_format` admits the detected content. Ironic names ISO
/// images `iso`, and a hybrid ISO declared `raw` is written the same way.
pub fn declared_matches(declared: &str, detected: Content) -> bool {
    let d = declared.to_ascii_lowercase();
    match detected {
        Content::Raw | Content::Iso => d == "raw" || d == "iso",
        Content::Qcow2 => d == "qcow2",
        Content::Refused(_) => false,
    }
}

/// The smallest disk a raw image says it needs, from its own tables: an ISO's volume size,
/// or the backup header LBA a GPT's primary header names (the image's last sector). `None`
/// when the head states nothing.
pub fn stated_raw_size(head: &[u8]) -> Option<u64> {
    if at(head, 0x8001, b"CD001") && head.len() >= 0x8084 {
        let blocks = u32::from_le_bytes([head[0x8050], head[0x8051], head[0x8052], head[0x8053]]);
        let block = u16::from_le_bytes([head[0x8080], head[0x8081]]);
        if block.is_power_of_two() && block >= 512 {
            return Some(blocks as u64 * block as u64);
        }
    }
    for sector in [512usize, 4096] {
        if at(head, sector, b"EFI PART") && head.len() >= sector + 0x28 {
            let h = &head[sector..];
            let my_lba = u64::from_le_bytes(h[0x18..0x20].try_into().ok()?);
            let alternate = u64::from_le_bytes(h[0x20..0x28].try_into().ok()?);
            // Only a header that is where it says it is: a stray "EFI PART" proves nothing.
            if my_lba == 1 && alternate > 1 {
                return alternate.checked_add(1)?.checked_mul(sector as u64);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressions() {
        assert_eq!(
            sniff_compression(&[0x1f, 0x8b, 8]),
            Ok(Some(Compression::Gzip))
        );
        assert_eq!(
            sniff_compression(&[0x28, 0xb5, 0x2f, 0xfd]),
            Ok(Some(Compression::Zstd))
        );
        assert_eq!(
            sniff_compression(&[0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0]),
            Ok(Some(Compression::Zstd))
        );
        assert_eq!(sniff_compression(b"\xfd7zXZ\x00\x00"), Err("xz"));
        assert_eq!(sniff_compression(b"BZh91AY"), Err("bzip2"));
        assert_eq!(sniff_compression(b"\x04\x22\x4d\x18"), Err("lz4"));
        assert_eq!(sniff_compression(&[0u8; 600]), Ok(None));
    }

    #[test]
    fn contents() {
        assert_eq!(detect(b"QFI\xfb\0\0\0\x03"), Content::Qcow2);
        assert_eq!(
            detect(b"QFI\xfb\0\0\0\x01"),
            Content::Refused("qcow (version 1)")
        );
        assert_eq!(detect(b"KDMV\x01\0\0\0"), Content::Refused("vmdk"));
        assert_eq!(detect(b"conectix\0\0"), Content::Refused("vhd"));
        assert_eq!(detect(b"vhdxfile"), Content::Refused("vhdx"));
        assert_eq!(detect(b"QED\0"), Content::Refused("qed"));
        assert_eq!(detect(b"LUKS\xba\xbe\0\x02"), Content::Refused("luks"));
        let mut vdi = vec![0u8; 0x80];
        vdi[0x40..0x44].copy_from_slice(&0xbeda_107fu32.to_le_bytes());
        assert_eq!(detect(&vdi), Content::Refused("vdi"));
        assert_eq!(
            detect(&[0x1f, 0x8b, 8, 0]).name(),
            "gzip inside the compressed stream"
        );
        let mut iso = vec![0u8; 0x8800];
        iso[0x8001..0x8006].copy_from_slice(b"CD001");
        assert_eq!(detect(&iso), Content::Iso);
        assert_eq!(detect(&[0u8; 4096]), Content::Raw);
        assert!(declared_matches("raw", Content::Iso));
        assert!(declared_matches("QCOW2", Content::Qcow2));
        assert!(!declared_matches("raw", Content::Qcow2));
        assert!(!declared_matches("raw", Content::Refused("vmdk")));
    }

    #[test]
    fn sizes_an_image_states() {
        let mut iso = vec![0u8; 0x8800];
        iso[0x8001..0x8006].copy_from_slice(b"CD001");
        iso[0x8050..0x8054].copy_from_slice(&1000u32.to_le_bytes());
        iso[0x8080..0x8082].copy_from_slice(&2048u16.to_le_bytes());
        assert_eq!(stated_raw_size(&iso), Some(2048 * 1000));
        let mut gpt = vec![0u8; 1024];
        gpt[512..520].copy_from_slice(b"EFI PART");
        gpt[512 + 0x18..512 + 0x20].copy_from_slice(&1u64.to_le_bytes());
        gpt[512 + 0x20..512 + 0x28].copy_from_slice(&2047u64.to_le_bytes());
        assert_eq!(stated_raw_size(&gpt), Some(2048 * 512));
        // A header that does not sit at LBA 1 states nothing.
        gpt[512 + 0x18..512 + 0x20].copy_from_slice(&5u64.to_le_bytes());
        assert_eq!(stated_raw_size(&gpt), None);
        assert_eq!(stated_raw_size(&[0u8; 100]), None);
    }
}

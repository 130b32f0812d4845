//! `EFI_LOAD_OPTION`, the content of a `Boot####` variable (UEFI spec 2.10, §3.1.3), and the
//! device path it carries: a hard-drive media node naming the ESP, a file-path node naming
//! the loader on it, and the end node (§10.3.5.1, §10.3.5.4, §10.3.1).
//!
//! This is the short form efibootmgr writes by default (`HD(…)/File(…)`): the firmware
//! finds the partition by its signature on whichever disk and controller it sits, so the
//! entry does not depend on how the ramdisk's kernel named the disk. Pure functions, with a
//! decoder for the tests and for recognising an entry that already points at the same
//! loader.

/// `LOAD_OPTION_ACTIVE`: the boot manager tries the entry.
pub const LOAD_OPTION_ACTIVE: u32 = 0x0000_0001;

/// Device path node types and subtypes used here.
const MEDIA: u8 = 0x04;
const MEDIA_HARD_DRIVE: u8 = 0x01;
const MEDIA_FILE_PATH: u8 = 0x04;
const END: u8 = 0x7f;
const END_ENTIRE: u8 = 0xff;
/// Length of a hard-drive media node.
const HD_LEN: u16 = 42;

/// How the hard-drive node identifies its partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HdSignature {
    /// GPT: the partition's unique GUID in on-disk (mixed-endian) byte order; partition
    /// format 0x02, signature type 0x02.
    Gpt([u8; 16]),
    /// MBR: the disk's 32-bit signature; partition format 0x01, signature type 0x01.
    Mbr(u32),
}

/// The partition a loader lives on, as the hard-drive media node describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HardDrive {
    /// Partition number (1-based).
    pub partition: u32,
    /// First logical block of the partition.
    pub start_lba: u64,
    /// Size in logical blocks.
    pub size_lba: u64,
    /// Its signature.
    pub signature: HdSignature,
}

fn ucs2z(s: &str) -> Vec<u8> {
    s.encode_utf16()
        .chain(std::iter::once(0))
        .flat_map(u16::to_le_bytes)
        .collect()
}

/// `HD(…)/File(loader)/End`: `loader` is the firmware's spelling, `\EFI\debian\shimx64.efi`.
pub fn device_path(hd: &HardDrive, loader: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(HD_LEN as usize + 8 + loader.len() * 2);
    p.extend_from_slice(&[MEDIA, MEDIA_HARD_DRIVE]);
    p.extend_from_slice(&HD_LEN.to_le_bytes());
    p.extend_from_slice(&hd.partition.to_le_bytes());
    p.extend_from_slice(&hd.start_lba.to_le_bytes());
    p.extend_from_slice(&hd.size_lba.to_le_bytes());
    let (sig, format, kind) = match hd.signature {
        HdSignature::Gpt(g) => (g, 0x02u8, 0x02u8),
        HdSignature::Mbr(s) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&s.to_le_bytes());
            (b, 0x01, 0x01)
        }
    };
    p.extend_from_slice(&sig);
    p.push(format);
    p.push(kind);
    let path = ucs2z(loader);
    // A path no firmware would take is refused by the caller long before; the length field
    // is 16 bits, so clamp rather than wrap.
    let len = u16::try_from(4 + path.len()).unwrap_or(u16::MAX);
    p.extend_from_slice(&[MEDIA, MEDIA_FILE_PATH]);
    p.extend_from_slice(&len.to_le_bytes());
    p.extend_from_slice(&path);
    p.extend_from_slice(&[END, END_ENTIRE, 4, 0]);
    p
}

/// An `EFI_LOAD_OPTION`: attributes, `FilePathListLength`, the NUL-terminated UCS-2
/// description, the device path list, then the optional data (passed to the loader as its
/// load options).
pub fn encode(
    attributes: u32,
    description: &str,
    file_path_list: &[u8],
    optional: &[u8],
) -> Vec<u8> {
    let desc = ucs2z(description);
    let mut o = Vec::with_capacity(6 + desc.len() + file_path_list.len() + optional.len());
    o.extend_from_slice(&attributes.to_le_bytes());
    let fpl = u16::try_from(file_path_list.len()).unwrap_or(u16::MAX);
    o.extend_from_slice(&fpl.to_le_bytes());
    o.extend_from_slice(&desc);
    o.extend_from_slice(file_path_list);
    o.extend_from_slice(optional);
    o
}

/// A decoded `EFI_LOAD_OPTION`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOption {
    /// Attributes (`LOAD_OPTION_ACTIVE`, …).
    pub attributes: u32,
    /// The entry's label.
    pub description: String,
    /// The device path list, as bytes.
    pub file_path_list: Vec<u8>,
    /// What follows the device paths.
    pub optional_data: Vec<u8>,
}

/// Parse an `EFI_LOAD_OPTION`; `None` when it is truncated or its description is not
/// NUL-terminated (firmware and other tools write such entries too: they are left alone).
pub fn decode(b: &[u8]) -> Option<LoadOption> {
    let attributes = u32::from_le_bytes(b.get(..4)?.try_into().ok()?);
    let fpl = u16::from_le_bytes(b.get(4..6)?.try_into().ok()?) as usize;
    let mut units = Vec::new();
    let mut at = 6;
    loop {
        let u = u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?);
        at += 2;
        if u == 0 {
            break;
        }
        units.push(u);
    }
    let file_path_list = b.get(at..at + fpl)?.to_vec();
    let optional_data = b.get(at + fpl..)?.to_vec();
    Some(LoadOption {
        attributes,
        description: String::from_utf16_lossy(&units),
        file_path_list,
        optional_data,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// GUID 01234567-89AB-CDEF-0123-456789ABCDEF in on-disk order.
    const GUID: [u8; 16] = [
        0x67, 0x45, 0x23, 0x01, 0xAB, 0x89, 0xEF, 0xCD, 0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD,
        0xEF,
    ];

    /// The whole entry for `Boot####` "deb" → `\A.EFI` on GPT partition 1 (start 2048, 204800
    /// sectors), byte by byte from the spec's tables.
    #[test]
    fn gpt_entry_matches_the_spec_bytes() {
        let hd = HardDrive {
            partition: 1,
            start_lba: 2048,
            size_lba: 204800,
            signature: HdSignature::Gpt(GUID),
        };
        let dp = device_path(&hd, "\\A.EFI");
        let got = encode(LOAD_OPTION_ACTIVE, "deb", &dp, &[]);
        #[rustfmt::skip]
        let want: Vec<u8> = vec![
            // Attributes = LOAD_OPTION_ACTIVE
            0x01, 0x00, 0x00, 0x00,
            // FilePathListLength = 42 (HD) + 18 (File) + 4 (End) = 64
            0x40, 0x00,
            // Description "deb\0" in UCS-2
            b'd', 0, b'e', 0, b'b', 0, 0, 0,
            // HD media node: type 4, subtype 1, length 42
            0x04, 0x01, 0x2A, 0x00,
            // PartitionNumber 1
            0x01, 0x00, 0x00, 0x00,
            // PartitionStart 2048
            0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            // PartitionSize 204800 = 0x32000
            0x00, 0x20, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00,
            // PartitionSignature
            0x67, 0x45, 0x23, 0x01, 0xAB, 0x89, 0xEF, 0xCD,
            0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF,
            // PartitionFormat GPT, SignatureType GUID
            0x02, 0x02,
            // File path node: type 4, subtype 4, length 4 + 7 * 2 = 18, "\A.EFI\0"
            0x04, 0x04, 0x12, 0x00,
            b'\\', 0, b'A', 0, b'.', 0, b'E', 0, b'F', 0, b'I', 0, 0, 0,
            // End of entire device path
            0x7F, 0xFF, 0x04, 0x00,
        ];
        assert_eq!(got, want);
        let back = decode(&got).unwrap();
        assert_eq!(back.attributes, LOAD_OPTION_ACTIVE);
        assert_eq!(back.description, "deb");
        assert_eq!(back.file_path_list, dp);
        assert!(back.optional_data.is_empty());
    }

    #[test]
    fn mbr_node_carries_the_disk_signature() {
        let hd = HardDrive {
            partition: 2,
            start_lba: 63,
            size_lba: 1000,
            signature: HdSignature::Mbr(0xDEAD_BEEF),
        };
        let dp = device_path(&hd, "\\x");
        assert_eq!(
            &dp[24..40],
            &[0xEF, 0xBE, 0xAD, 0xDE, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(&dp[40..42], &[0x01, 0x01]);
        assert_eq!(&dp[4..8], &[2, 0, 0, 0]);
    }

    #[test]
    fn truncated_options_do_not_decode() {
        let dp = device_path(
            &HardDrive {
                partition: 1,
                start_lba: 1,
                size_lba: 1,
                signature: HdSignature::Gpt(GUID),
            },
            "\\a",
        );
        let whole = encode(LOAD_OPTION_ACTIVE, "x", &dp, b"opt");
        assert_eq!(decode(&whole).unwrap().optional_data, b"opt");
        for cut in [0, 3, 5, 7, 9, whole.len() - 4] {
            assert!(decode(&whole[..cut]).is_none(), "cut at {cut}");
        }
    }
}

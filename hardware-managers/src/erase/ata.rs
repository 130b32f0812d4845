//! ATA security erase through SG_IO ATA PASS-THROUGH (16): IDENTIFY DEVICE word 128 gives
//! the security state; the erase is SET PASSWORD, ERASE PREPARE, ERASE UNIT (enhanced when
//! word 128 bit 5 says so), as hdparm does.
//!
//! Only tried on disks whose SCSI vendor is `ATA`, i.e. driven by libata: USB bridges and
//! RAID HBAs translate pass-through badly and can lock up (IPA pain point), so they get the
//! zeroing path instead. A frozen drive (the BIOS froze security) or one still locked after
//! trying the empty password is an immediate error rather than a hang.

use super::ioctl;
use super::EraseError;
use std::fs::File;

const ATA_IDENTIFY: u8 = 0xEC;
const SEC_SET_PASS: u8 = 0xF1;
const SEC_UNLOCK: u8 = 0xF2;
const SEC_ERASE_PREPARE: u8 = 0xF3;
const SEC_ERASE_UNIT: u8 = 0xF4;
const SEC_DISABLE: u8 = 0xF6;
/// The temporary user password set for the erase; the erase clears it again.
const PASSWORD: &[u8] = b"rivet";

/// Security feature set state (IDENTIFY word 128) plus the erase time estimates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AtaSecurity {
    /// Security feature set supported.
    pub supported: bool,
    /// A user password is set.
    pub enabled: bool,
    /// Locked (password needed).
    pub locked: bool,
    /// Frozen until the next power cycle.
    pub frozen: bool,
    /// Enhanced erase supported.
    pub enhanced: bool,
    /// Minutes the (normal, enhanced) erase takes according to words 89/90 (0 = unknown).
    pub minutes: (u32, u32),
}

impl AtaSecurity {
    /// Decode from the 256 little-endian words of IDENTIFY DEVICE; `None` when the data
    /// carries the integrity signature (word 255 low byte 0xA5) but its checksum is wrong
    /// (a bridge that mangled the transfer: nothing in it can be trusted).
    pub fn from_identify(id: &[u8]) -> Option<AtaSecurity> {
        if !identify_checksum_ok(id) {
            return None;
        }
        let word = |n: usize| -> Option<u16> {
            Some(u16::from_le_bytes([*id.get(2 * n)?, *id.get(2 * n + 1)?]))
        };
        let w128 = word(128)?;
        // Words 89/90: bits 7:0 (or 14:0 with bit 15 = extended format) in units of 2 minutes.
        let est = |w: u16| -> u32 {
            let units = if w & 0x8000 != 0 {
                w & 0x7FFF
            } else {
                w & 0xFF
            };
            u32::from(units) * 2
        };
        Some(AtaSecurity {
            supported: w128 & 0x1 != 0,
            enabled: w128 & 0x2 != 0,
            locked: w128 & 0x4 != 0,
            frozen: w128 & 0x8 != 0,
            enhanced: w128 & 0x20 != 0,
            minutes: (est(word(89)?), est(word(90)?)),
        })
    }
}

/// ACS integrity word: when word 255's low byte is the signature 0xA5, all 512 bytes sum
/// to 0 modulo 256. Data without the signature (older drives, emulations) passes.
pub fn identify_checksum_ok(id: &[u8]) -> bool {
    match id.get(..512) {
        Some(block) if block[510] == 0xA5 => block.iter().fold(0u8, |a, b| a.wrapping_add(*b)) == 0,
        Some(_) => true,
        None => false,
    }
}

/// Data direction of a pass-through command.
#[derive(Clone, Copy)]
enum Dir {
    None,
    In,
    Out,
}

/// Build an ATA PASS-THROUGH (16) CDB for a 28-bit command with at most one 512-byte block.
pub fn cdb16(command: u8, data: bool, to_device: bool) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x85;
    // PROTOCOL (bits 4:1): 3 = non-data, 4 = PIO data-in, 5 = PIO data-out.
    let protocol: u8 = match (data, to_device) {
        (false, _) => 3,
        (true, false) => 4,
        (true, true) => 5,
    };
    c[1] = protocol << 1;
    if data {
        // T_DIR (bit 3) = from device, BYT_BLOK (bit 2) = blocks, T_LENGTH (1:0) = 2: the
        // transfer length is in the sector count field.
        c[2] = (if to_device { 0 } else { 0x08 }) | 0x04 | 0x02;
        c[6] = 1;
    }
    c[14] = command;
    c
}

fn run(
    f: &File,
    device: &str,
    command: u8,
    dir: Dir,
    data: &mut [u8],
    timeout_ms: u32,
) -> Result<(), EraseError> {
    let (sg_dir, has_data, to_dev) = match dir {
        Dir::None => (ioctl::SG_DXFER_NONE, false, false),
        Dir::In => (ioctl::SG_DXFER_FROM_DEV, true, false),
        Dir::Out => (ioctl::SG_DXFER_TO_DEV, true, true),
    };
    let mut cdb = cdb16(command, has_data, to_dev);
    let buf: &mut [u8] = if has_data { data } else { &mut [] };
    let r = ioctl::sg_io(f, &mut cdb, sg_dir, buf, timeout_ms).map_err(|e| {
        EraseError::SecureErase {
            device: device.into(),
            reason: format!("SG_IO for ATA command {command:#04x} failed: {e}"),
        }
    })?;
    if r.status == 0 && r.host_status == 0 && (r.driver_status & !0x08) == 0 {
        return Ok(());
    }
    Err(EraseError::SecureErase {
        device: device.into(),
        reason: format!(
            "ATA command {command:#04x} rejected (scsi status {:#x}, host {:#x}, driver {:#x}, sense {:02x?})",
            r.status,
            r.host_status,
            r.driver_status,
            &r.sense[..r.sense.len().min(24)]
        ),
    })
}

/// IDENTIFY DEVICE → security state; `None` when pass-through does not work.
pub fn probe(f: &File, device: &str) -> Option<AtaSecurity> {
    let mut id = vec![0u8; 512];
    run(f, device, ATA_IDENTIFY, Dir::In, &mut id, 10_000).ok()?;
    let sec = AtaSecurity::from_identify(&id);
    // Word 128 raw, so the agent log shows why security erase was (not) tried.
    tracing::info!(
        device,
        word128 = format!("{:#06x}", u16::from_le_bytes([id[256], id[257]])),
        ?sec,
        "ATA IDENTIFY DEVICE"
    );
    sec
}

fn password_block(enhanced: bool, password: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    // Word 0 bit 0: 0 = user password; bit 1 (erase only): enhanced.
    b[0] = if enhanced { 0x02 } else { 0x00 };
    let n = password.len().min(32);
    b[2..2 + n].copy_from_slice(&password[..n]);
    b
}

/// Security-erase the drive. Blocks for as long as the drive takes (words 89/90).
pub fn secure_erase(f: &File, device: &str, sec: AtaSecurity) -> Result<&'static str, EraseError> {
    let fail = |reason: &str| EraseError::SecureErase {
        device: device.into(),
        reason: reason.into(),
    };
    if !sec.supported {
        return Err(fail("ATA security feature set not supported"));
    }
    if sec.frozen {
        return Err(fail(
            "ATA security is frozen (the firmware froze it at boot); power-cycle or suspend/resume \
             the machine to unfreeze it, or allow the zeroing fallback",
        ));
    }
    let mut sec = sec;
    if sec.locked {
        // A previous failed erase leaves the drive locked with our (or an empty) password.
        for pw in [PASSWORD, b"".as_slice()] {
            let _ = run(
                f,
                device,
                SEC_UNLOCK,
                Dir::Out,
                &mut password_block(false, pw),
                15_000,
            );
            if let Some(s) = probe(f, device) {
                sec = s;
                if !s.locked {
                    break;
                }
            }
        }
        if sec.locked {
            return Err(fail("drive is security-locked with an unknown password"));
        }
    }
    let enhanced = sec.enhanced;
    run(
        f,
        device,
        SEC_SET_PASS,
        Dir::Out,
        &mut password_block(false, PASSWORD),
        15_000,
    )?;
    run(f, device, SEC_ERASE_PREPARE, Dir::None, &mut [], 15_000)?;
    let minutes = if enhanced {
        sec.minutes.1
    } else {
        sec.minutes.0
    };
    // Twice the drive's own estimate, at least 2 h; u32 ms caps at ~49 days.
    let timeout_ms = (u64::from(minutes.max(60)) * 2 * 60_000).min(u64::from(u32::MAX)) as u32;
    let res = run(
        f,
        device,
        SEC_ERASE_UNIT,
        Dir::Out,
        &mut password_block(enhanced, PASSWORD),
        timeout_ms,
    );
    if let Err(e) = res {
        // Do not leave the drive locked behind a password only we know.
        let _ = run(
            f,
            device,
            SEC_UNLOCK,
            Dir::Out,
            &mut password_block(false, PASSWORD),
            15_000,
        );
        let _ = run(
            f,
            device,
            SEC_DISABLE,
            Dir::Out,
            &mut password_block(false, PASSWORD),
            15_000,
        );
        return Err(e);
    }
    match probe(f, device) {
        Some(s) if s.enabled => Err(fail("security still enabled after the erase")),
        _ => Ok(if enhanced {
            "ata enhanced security erase"
        } else {
            "ata security erase"
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word128_decoding() {
        let mut id = vec![0u8; 512];
        id[256] = 0x01 | 0x08 | 0x20; // supported, frozen, enhanced
        id[178] = 10; // word 89: 20 min
        id[180] = 0x05;
        id[181] = 0x80; // word 90 extended: 5 units = 10 min
        let s = AtaSecurity::from_identify(&id).expect("sec");
        assert!(s.supported && s.frozen && s.enhanced && !s.locked && !s.enabled);
        assert_eq!(s.minutes, (20, 10));
    }

    /// `hdparm --Istdout` of a Seagate ST3160023AS (SATA, security feature set supported,
    /// not enabled, not frozen, no time estimate), as posted to linux-ide: 256 words in
    /// host order, 8 per line, word 255 = 0x7ea5 (checksum, signature).
    const SEAGATE_ST3160023AS: &str = "
        0c5a 3fff c837 0010 0000 0000 003f 0000 0000 0000 334a 5332 4b53 4c33 2020 2020
        2020 2020 2020 2020 0000 4000 0004 332e 3138 2020 2020 5354 3331 3630 3032 3341
        5320 2020 2020 2020 2020 2020 2020 2020 2020 2020 2020 2020 2020 2020 2020 8010
        0000 2f00 0000 0200 0200 0007 3fff 0010 003f fc10 00fb 0110 ffff 0fff 0000 0007
        0003 0078 0078 00f0 0078 0000 0000 0000 0000 0000 0000 0000 0002 0000 0000 0000
        007e 001b 346b 7d01 4003 3468 3c01 4003 407f 0000 0000 fefe 0000 0000 fe00 0000
        0000 0000 0000 0000 9eb0 12a1 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0001 9eb0 12a1 9eb0 12a1 2020 0002 42b6 8000 008a 3c06 3c0a ffff 07c6 0100 0800
        0ff0 1000 0002 0030 0000 0000 0000 fe06 0000 0002 0050 008a 954f 0000 0023 000b
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 7ea5";

    /// `hdparm --Istdout` of a Maxtor 6B200M0 (same thread): security supported, word
    /// 255 without the integrity signature.
    const MAXTOR_6B200M0: &str = "
        0040 3fff c837 0010 0000 0000 003f 0000 0000 0000 4234 3152 5643 3248 2020 2020
        2020 2020 2020 2020 0003 4000 0004 4241 4e43 3142 5930 4d61 7874 6f72 2036 4232
        3030 4d30 2020 2020 2020 2020 2020 2020 2020 2020 2020 2020 2020 2020 2020 8010
        0000 2f00 4000 0200 0000 0007 3fff 0010 003f fc10 00fb 0110 ffff 0fff 0000 0007
        0003 0078 0078 0078 0078 0000 0000 0000 0000 0000 0000 001f 0102 0000 0000 0000
        00fe 001e 7c6b 7f09 4063 7c68 3e01 4063 407f 0000 0000 0000 fffe 0000 c0fe 0000
        0000 0000 0000 0000 8800 17bd 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0001 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0113 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 a6a5";

    /// The 512 bytes the drive sent (words little-endian, as SG_IO returns them).
    fn identify_bytes(dump: &str) -> Vec<u8> {
        let words: Vec<u16> = dump
            .split_whitespace()
            .map(|w| u16::from_str_radix(w, 16).expect("hex word"))
            .collect();
        assert_eq!(words.len(), 256);
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// ATA strings: two characters per word, high byte first.
    fn ata_string(id: &[u8], words: std::ops::Range<usize>) -> String {
        words
            .flat_map(|w| [id[2 * w + 1], id[2 * w]])
            .map(char::from)
            .collect::<String>()
            .trim()
            .to_string()
    }

    /// Set word `n` and fix the integrity checksum, as the drive would report that state.
    fn with_word(mut id: Vec<u8>, n: usize, value: u16) -> Vec<u8> {
        id[2 * n..2 * n + 2].copy_from_slice(&value.to_le_bytes());
        if id[510] == 0xA5 {
            let sum = id[..511].iter().fold(0u8, |a, b| a.wrapping_add(*b));
            id[511] = sum.wrapping_neg();
        }
        id
    }

    #[test]
    fn recorded_identify_seagate() {
        let id = identify_bytes(SEAGATE_ST3160023AS);
        assert_eq!(ata_string(&id, 27..47), "ST3160023AS");
        assert_eq!(ata_string(&id, 10..20), "3JS2KSL3");
        assert!(identify_checksum_ok(&id));
        let s = AtaSecurity::from_identify(&id).expect("sec");
        assert_eq!(
            s,
            AtaSecurity {
                supported: true,
                ..AtaSecurity::default()
            }
        );
        // What choose() gets for it: security erase, not enhanced.
        let caps = super::super::Caps {
            ata: Some(s),
            ..Default::default()
        };
        let plan = super::super::choose(
            &caps,
            super::super::Mode::Full,
            &super::super::EraseOptions::default(),
        );
        assert_eq!(plan, Ok(vec![super::super::Method::AtaErase]));
        // A transfer error anywhere breaks the checksum: the data is refused.
        let mut bad = id.clone();
        bad[256] ^= 0x08;
        assert!(!identify_checksum_ok(&bad));
        assert_eq!(AtaSecurity::from_identify(&bad), None);
    }

    #[test]
    fn recorded_identify_seagate_frozen_and_locked_states() {
        let id = identify_bytes(SEAGATE_ST3160023AS);
        // The same drive after a BIOS SECURITY FREEZE LOCK (word 128 bit 3).
        let frozen =
            AtaSecurity::from_identify(&with_word(id.clone(), 128, 0x0009)).expect("frozen");
        assert!(frozen.supported && frozen.frozen && !frozen.locked);
        // Left locked by an interrupted erase: enabled + locked, high security.
        let locked =
            AtaSecurity::from_identify(&with_word(id.clone(), 128, 0x0007)).expect("locked");
        assert!(locked.enabled && locked.locked && !locked.frozen);
        // Erase time estimates (words 89/90) in the extended format: 0x8000 | units.
        let timed = with_word(with_word(id, 89, 0x801e), 90, 0x0005);
        let timed = AtaSecurity::from_identify(&timed).expect("timed");
        assert_eq!(timed.minutes, (60, 10));
    }

    #[test]
    fn recorded_identify_maxtor() {
        let id = identify_bytes(MAXTOR_6B200M0);
        assert_eq!(ata_string(&id, 27..47), "Maxtor 6B200M0");
        // Word 82 bit 1 (security feature set supported) agrees with word 128 bit 0.
        assert_eq!(u16::from_le_bytes([id[164], id[165]]) & 0x2, 0x2);
        assert!(identify_checksum_ok(&id));
        let s = AtaSecurity::from_identify(&id).expect("sec");
        assert!(s.supported && !s.enabled && !s.locked && !s.frozen && !s.enhanced);
        assert_eq!(s.minutes, (0, 0));
    }

    #[test]
    fn short_identify_is_refused() {
        assert!(!identify_checksum_ok(&[0u8; 100]));
        assert_eq!(AtaSecurity::from_identify(&[0u8; 100]), None);
    }

    #[test]
    fn cdb_layout() {
        let c = cdb16(ATA_IDENTIFY, true, false);
        assert_eq!(&c[..3], &[0x85, 0x08, 0x0e]);
        assert_eq!(c[6], 1);
        assert_eq!(c[14], 0xEC);
        let c = cdb16(SEC_ERASE_UNIT, true, true);
        assert_eq!(&c[..3], &[0x85, 0x0a, 0x06]);
        let c = cdb16(SEC_ERASE_PREPARE, false, false);
        assert_eq!(&c[..3], &[0x85, 0x06, 0x00]);
    }
}

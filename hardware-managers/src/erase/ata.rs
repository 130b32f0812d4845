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
    /// Decode from the 256 little-endian words of IDENTIFY DEVICE.
    pub fn from_identify(id: &[u8]) -> Option<AtaSecurity> {
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
    AtaSecurity::from_identify(&id)
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

//! NVMe secure erase through the admin passthrough ioctl: Identify Controller decides what
//! the controller can do (OACS bit 1 = Format NVM, FNA bit 2 = cryptographic erase on
//! format, SANICAP bits 0/1 = sanitize crypto/block erase), then Format NVM with a Secure
//! Erase Setting (IPA's choice, preferred: synchronous and per namespace) or, when Format is
//! not supported, Sanitize polled through the Sanitize Status log page.
//!
//! Once issued, neither command can be stopped by the host; cancellation is checked before
//! issuing and while polling sanitize (the drive finishes on its own, even across resets).

use super::ioctl::{self, NvmeAdminCmd};
use super::EraseError;
use crate::StepContext;
use std::fs::File;
use std::time::Duration;

const OPC_GET_LOG_PAGE: u8 = 0x02;
const OPC_IDENTIFY: u8 = 0x06;
const OPC_FORMAT_NVM: u8 = 0x80;
const OPC_SANITIZE: u8 = 0x84;
const LID_SANITIZE_STATUS: u32 = 0x81;
/// Format can take minutes on large drives; the kernel's default admin timeout is 60 s.
const FORMAT_TIMEOUT_MS: u32 = 4 * 3600 * 1000;

/// What Identify Controller says about erasing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmeCaps {
    /// OACS bit 1: Format NVM supported.
    pub format: bool,
    /// FNA bit 2: cryptographic erase supported as a format secure-erase setting.
    pub crypto_format: bool,
    /// FNA bit 0: a format applies to all namespaces of the controller.
    pub format_all_namespaces: bool,
    /// SANICAP bit 0: sanitize crypto erase.
    pub sanitize_crypto: bool,
    /// SANICAP bit 1: sanitize block erase.
    pub sanitize_block: bool,
}

impl NvmeCaps {
    /// Decode the 4096-byte Identify Controller data structure.
    pub fn from_identify(id: &[u8]) -> Option<NvmeCaps> {
        let oacs = u16::from_le_bytes([*id.get(256)?, *id.get(257)?]);
        let sanicap = u32::from_le_bytes(id.get(328..332)?.try_into().ok()?);
        let fna = *id.get(524)?;
        Some(NvmeCaps {
            format: oacs & 0x2 != 0,
            crypto_format: fna & 0x4 != 0,
            format_all_namespaces: fna & 0x1 != 0,
            sanitize_crypto: sanicap & 0x1 != 0,
            sanitize_block: sanicap & 0x2 != 0,
        })
    }

    /// Whether any secure erase is possible.
    pub fn any(&self) -> bool {
        self.format || self.sanitize_crypto || self.sanitize_block
    }
}

/// Current LBA format index from Identify Namespace FLBAS (bits 3:0, plus 6:5 for >16).
pub fn current_lbaf(id_ns: &[u8]) -> Option<u32> {
    let flbas = u32::from(*id_ns.get(26)?);
    Some((flbas & 0xF) | (((flbas >> 5) & 0x3) << 4))
}

/// CDW10 of Format NVM: LBAF (3:0), SES (11:9), LBAF upper bits (13:12).
pub fn format_cdw10(lbaf: u32, ses: u32) -> u32 {
    (lbaf & 0xF) | ((ses & 0x7) << 9) | (((lbaf >> 4) & 0x3) << 12)
}

/// A probed NVMe namespace.
#[derive(Debug, Clone, Copy)]
pub struct NvmeDevice {
    /// Namespace id.
    pub nsid: u32,
    /// Controller capabilities.
    pub caps: NvmeCaps,
    /// Current LBA format.
    pub lbaf: u32,
}

fn identify(f: &File, cns: u32, nsid: u32) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    let mut cmd = NvmeAdminCmd {
        opcode: OPC_IDENTIFY,
        nsid,
        cdw10: cns,
        ..Default::default()
    };
    match ioctl::nvme_admin(f, &mut cmd, Some(&mut buf)) {
        Ok(0) => Some(buf),
        _ => None,
    }
}

/// Probe a namespace block device; `None` if it is not NVMe or does not answer.
pub fn probe(f: &File) -> Option<NvmeDevice> {
    let nsid = ioctl::nvme_namespace_id(f).ok().filter(|n| *n != 0)?;
    let id = identify(f, 1, 0)?;
    let caps = NvmeCaps::from_identify(&id)?;
    let lbaf = current_lbaf(&identify(f, 0, nsid)?)?;
    // The raw fields, so the agent log shows why a method was (not) chosen.
    tracing::info!(
        nsid,
        oacs = format!("{:#06x}", u16::from_le_bytes([id[256], id[257]])),
        sanicap = format!(
            "{:#010x}",
            u32::from_le_bytes([id[328], id[329], id[330], id[331]])
        ),
        fna = format!("{:#04x}", id[524]),
        ?caps,
        "NVMe Identify Controller"
    );
    Some(NvmeDevice { nsid, caps, lbaf })
}

/// Format NVM with secure erase (SES 2 = crypto when supported, else 1 = user data).
pub fn format(f: &File, dev: &NvmeDevice, device: &str) -> Result<&'static str, EraseError> {
    let (ses, what) = if dev.caps.crypto_format {
        (2, "nvme format (cryptographic erase)")
    } else {
        (1, "nvme format (user data erase)")
    };
    let mut cmd = NvmeAdminCmd {
        opcode: OPC_FORMAT_NVM,
        // With FNA bit 0 the controller formats every namespace anyway; say so explicitly.
        nsid: if dev.caps.format_all_namespaces {
            0xFFFF_FFFF
        } else {
            dev.nsid
        },
        cdw10: format_cdw10(dev.lbaf, ses),
        timeout_ms: FORMAT_TIMEOUT_MS,
        ..Default::default()
    };
    match ioctl::nvme_admin(f, &mut cmd, None) {
        Ok(0) => Ok(what),
        Ok(status) => Err(EraseError::SecureErase {
            device: device.into(),
            reason: format!("Format NVM failed with NVMe status {status:#x}"),
        }),
        Err(e) => Err(EraseError::SecureErase {
            device: device.into(),
            reason: format!("Format NVM ioctl failed: {e}"),
        }),
    }
}

/// Sanitize (crypto erase if supported, else block erase) and poll until done.
pub fn sanitize(
    f: &File,
    dev: &NvmeDevice,
    device: &str,
    ctx: &StepContext,
    on_progress: &mut dyn FnMut(u64, u64),
) -> Result<&'static str, EraseError> {
    let fail = |reason: String| EraseError::SecureErase {
        device: device.into(),
        reason,
    };
    let (sanact, what) = if dev.caps.sanitize_crypto {
        (4, "nvme sanitize (crypto erase)")
    } else {
        (2, "nvme sanitize (block erase)")
    };
    ctx.check()?;
    let mut cmd = NvmeAdminCmd {
        opcode: OPC_SANITIZE,
        cdw10: sanact,
        ..Default::default()
    };
    match ioctl::nvme_admin(f, &mut cmd, None) {
        Ok(0) => {}
        Ok(s) => return Err(fail(format!("Sanitize failed with NVMe status {s:#x}"))),
        Err(e) => return Err(fail(format!("Sanitize ioctl failed: {e}"))),
    }
    loop {
        // The drive keeps sanitizing after an abort; the step still stops waiting for it.
        ctx.check()?;
        std::thread::sleep(Duration::from_millis(500));
        let mut log = vec![0u8; 512];
        let mut cmd = NvmeAdminCmd {
            opcode: OPC_GET_LOG_PAGE,
            nsid: 0xFFFF_FFFF,
            // NUMDL = dwords - 1 = 127.
            cdw10: LID_SANITIZE_STATUS | (127 << 16),
            ..Default::default()
        };
        match ioctl::nvme_admin(f, &mut cmd, Some(&mut log)) {
            Ok(0) => {}
            Ok(s) => return Err(fail(format!("sanitize status log: NVMe status {s:#x}"))),
            Err(e) => return Err(fail(format!("sanitize status log ioctl failed: {e}"))),
        }
        let sprog = u64::from(u16::from_le_bytes([log[0], log[1]]));
        match u16::from_le_bytes([log[2], log[3]]) & 0x7 {
            1 | 4 => return Ok(what),
            2 => on_progress(sprog, 65535),
            3 => {
                return Err(fail(
                    "the controller reports the sanitize operation failed".into(),
                ))
            }
            s => return Err(fail(format!("unexpected sanitize status {s}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identify_bits() {
        let mut id = vec![0u8; 4096];
        assert_eq!(NvmeCaps::from_identify(&id), Some(NvmeCaps::default()));
        id[256] = 0x2;
        id[524] = 0x4 | 0x1;
        id[328] = 0x2;
        let c = NvmeCaps::from_identify(&id).expect("caps");
        assert!(c.format && c.crypto_format && c.format_all_namespaces && c.sanitize_block);
        assert!(!c.sanitize_crypto);
        assert_eq!(NvmeCaps::from_identify(&id[..100]), None);
    }

    /// Identify Controller of Debian 12's QEMU 7.2 `-device nvme`, as the agent logged it in
    /// tests/qemu_nvme.rs: OACS 0x010a (Format NVM, namespace management, doorbell buffer
    /// config), SANICAP 0 (no sanitize), FNA 0 (per-namespace format, no crypto erase).
    #[test]
    fn qemu_7_2_controller_gets_format_with_user_data_erase() {
        let mut id = vec![0u8; 4096];
        id[256..258].copy_from_slice(&0x010au16.to_le_bytes());
        let caps = NvmeCaps::from_identify(&id).expect("caps");
        assert_eq!(
            caps,
            NvmeCaps {
                format: true,
                ..NvmeCaps::default()
            }
        );
        let dev = NvmeDevice {
            nsid: 1,
            caps,
            lbaf: 0,
        };
        let c = super::super::Caps {
            nvme: Some(dev),
            ..Default::default()
        };
        let o = super::super::EraseOptions::default();
        for mode in [super::super::Mode::Full, super::super::Mode::Express] {
            assert_eq!(
                super::super::choose(&c, mode, &o),
                Ok(vec![super::super::Method::NvmeFormat])
            );
        }
        // SES 1 (user data erase) on LBA format 0 of namespace 1.
        assert_eq!(format_cdw10(dev.lbaf, 1), 0x200);
    }

    #[test]
    fn format_command_encoding() {
        assert_eq!(format_cdw10(0, 1), 0x200);
        assert_eq!(format_cdw10(3, 2), 0x403);
        assert_eq!(format_cdw10(17, 1), 0x1201);
        let mut ns = vec![0u8; 4096];
        ns[26] = 0x21; // upper bits 01, lower 0001 → format 17
        assert_eq!(current_lbaf(&ns), Some(17));
    }
}

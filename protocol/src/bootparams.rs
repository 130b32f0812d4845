//! The per-node parameter region of the virtual-media ISO.
//!
//! A BMC boots an ISO by URL and passes no DHCP options, so the ramdisk must learn the
//! controller's URL and its node from the ISO itself. Building an ISO per node would need
//! grub-mkrescue and xorriso on the controller and seconds per boot; instead image-build
//! leaves a fixed-width region on the kernel line of the ISO's `grub.cfg`, and rivetd
//! overwrites those bytes in the stream it serves for one node. ISO 9660 stores a file's
//! bytes contiguously and keeps no checksum over them, so a same-length rewrite leaves a
//! valid ISO.
//!
//! The region is [`MARKER`] followed by the parameters and space padding, [`WIDTH`] bytes in
//! all, and then a newline. The agent ignores the marker (an unknown `rivet.` key) and the
//! padding (whitespace). No I/O here.

/// Where the region starts. A kernel argument the agent ignores.
pub const MARKER: &str = "rivet.params=v1 ";

/// The region's length in bytes, marker and padding included. The x86 kernel command line
/// holds 2,048 bytes; this leaves room for the console arguments before it.
pub const WIDTH: usize = 512;

/// Why parameters do not fit the region.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    /// Longer than the region.
    #[error("boot parameters take {len} bytes; the ISO's region holds {max}")]
    TooLong {
        /// Their length with the marker.
        len: usize,
        /// What fits.
        max: usize,
    },
    /// A byte GRUB or the kernel would read differently (quotes, `$`, `\`, control bytes,
    /// non-ASCII).
    #[error("boot parameter byte {byte:?} cannot go on a kernel command line written by GRUB")]
    BadByte {
        /// The byte.
        byte: char,
    },
}

/// The region for `params` (space-separated `key=value` kernel arguments): exactly
/// [`WIDTH`] bytes, starting with [`MARKER`].
pub fn region(params: &str) -> Result<String, RegionError> {
    if let Some(byte) = params.chars().find(|c| {
        !c.is_ascii() || c.is_ascii_control() || matches!(c, '"' | '\'' | '$' | '\\' | ';' | '#')
    }) {
        return Err(RegionError::BadByte { byte });
    }
    let len = MARKER.len() + params.len();
    if len > WIDTH {
        return Err(RegionError::TooLong { len, max: WIDTH });
    }
    let mut s = String::with_capacity(WIDTH);
    s.push_str(MARKER);
    s.push_str(params);
    s.extend(std::iter::repeat_n(' ', WIDTH - len));
    Ok(s)
}

/// Offsets of every region in `bytes`: a [`MARKER`] whose region ends with a newline.
/// (A marker without that shape is not a region and is left alone.)
pub fn find_regions(bytes: &[u8]) -> Vec<usize> {
    memchr::memmem::find_iter(bytes, MARKER.as_bytes())
        .filter(|&at| bytes.get(at + WIDTH) == Some(&b'\n'))
        .collect()
}

/// Overwrite the part of `chunk` (which starts at byte `chunk_at` of the file) that overlaps
/// the region at `region_at` with the same bytes of `region`.
pub fn patch_chunk(chunk: &mut [u8], chunk_at: u64, region_at: u64, region: &[u8]) {
    let chunk_end = chunk_at + chunk.len() as u64;
    let region_end = region_at + region.len() as u64;
    let start = chunk_at.max(region_at);
    let end = chunk_end.min(region_end);
    if start >= end {
        return;
    }
    let (c0, r0) = ((start - chunk_at) as usize, (start - region_at) as usize);
    let n = (end - start) as usize;
    chunk[c0..c0 + n].copy_from_slice(&region[r0..r0 + n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_is_fixed_width_and_found_again() {
        let r = region("rivet.controller=http://192.168.240.1:6385").unwrap();
        assert_eq!(r.len(), WIDTH);
        let file = format!("linux /boot/vmlinuz console=ttyS0 {r}\n  initrd x\n");
        let at = find_regions(file.as_bytes());
        assert_eq!(at, vec![file.find(MARKER).unwrap()]);
        // A marker not followed by a full region is not one.
        assert!(find_regions(MARKER.as_bytes()).is_empty());
        let short = format!("{MARKER}x\n");
        assert!(find_regions(short.as_bytes()).is_empty());
    }

    #[test]
    fn bad_bytes_and_overflow_are_refused() {
        assert_eq!(
            region("rivet.node=\"x\""),
            Err(RegionError::BadByte { byte: '"' })
        );
        assert_eq!(region("a=$x"), Err(RegionError::BadByte { byte: '$' }));
        assert!(matches!(
            region(&"x".repeat(WIDTH)),
            Err(RegionError::TooLong { .. })
        ));
        assert!(region(&"x".repeat(WIDTH - MARKER.len())).is_ok());
    }

    #[test]
    fn patching_in_chunks_equals_patching_whole() {
        let old = region("rivet.controller=http://old").unwrap();
        let new = region("rivet.controller=http://new:1 rivet.node=abc").unwrap();
        let file = format!("head {old}\ntail").into_bytes();
        let at = find_regions(&file)[0] as u64;
        let mut want = file.clone();
        want[at as usize..at as usize + WIDTH].copy_from_slice(new.as_bytes());
        for size in [1usize, 3, 7, 64, 511, 512, 513, 4096] {
            let mut got = Vec::new();
            for (i, c) in file.chunks(size).enumerate() {
                let mut c = c.to_vec();
                patch_chunk(&mut c, (i * size) as u64, at, new.as_bytes());
                got.extend(c);
            }
            assert_eq!(got, want, "chunk size {size}");
        }
    }
}

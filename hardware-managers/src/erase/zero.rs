//! The byte-moving primitives: overwrite (zeros or pseudo-random), BLKZEROOUT, discard,
//! hole punching for files, and sampled verification. Each works in bounded chunks and
//! checks cancellation between them, so an abort stops a step within one chunk's time.

use super::device::{Target, TargetKind};
use super::{ioctl, EraseError};
use crate::StepContext;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Overwrite chunk: 4 MiB keeps one write under ~50 ms even on a slow HDD.
pub const WRITE_CHUNK: usize = 4 << 20;
/// BLKZEROOUT / discard range per ioctl: bounded so cancellation is checked between ranges
/// (64 MiB is ~0.4 s of an HDD's write bandwidth when the kernel falls back to writing).
pub const ZEROOUT_CHUNK: u64 = 64 << 20;
/// Length of each sampled verification read.
const VERIFY_LEN: u64 = 1 << 20;

/// A zeroed buffer whose start is aligned to 4096 bytes, as O_DIRECT requires, without
/// unsafe code: over-allocate and slice at the aligned offset.
pub struct AlignedBuf {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes, 4 KiB-aligned.
    pub fn new(len: usize) -> Self {
        let v = vec![0u8; len + 4096];
        let off = (4096 - (v.as_ptr() as usize % 4096)) % 4096;
        AlignedBuf { v, off, len }
    }
    /// The aligned bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
    /// The aligned bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

/// xoshiro256** seeded with splitmix64: fast enough to keep a disk busy (GB/s per core).
/// Overwrite data does not need to be unpredictable, only not zero and not constant, like
/// shred's pass.
pub struct Rng([u64; 4]);

impl Rng {
    /// Seed from the clock, the thread and a caller value.
    pub fn new(extra: u64) -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut x = t ^ extra.rotate_left(32) ^ (u64::from(std::process::id()) << 17);
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }
    /// Next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }
    /// Fill `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

fn io_err(t: &Target, op: &'static str) -> impl FnOnce(std::io::Error) -> EraseError {
    let device = t.display();
    move |source| EraseError::Io { device, op, source }
}

/// Write zeros over `[offset, offset+len)` with `buf` (zeroed, aligned) in chunks.
pub fn write_zeros(
    t: &Target,
    f: &File,
    buf: &AlignedBuf,
    offset: u64,
    len: u64,
    ctx: &StepContext,
    on_chunk: &mut dyn FnMut(u64),
) -> Result<(), EraseError> {
    let mut pos = offset;
    let end = offset + len;
    while pos < end {
        ctx.check()?;
        let n = (end - pos).min(buf.as_slice().len() as u64) as usize;
        f.write_all_at(&buf.as_slice()[..n], pos)
            .map_err(io_err(t, "write zeros"))?;
        pos += n as u64;
        on_chunk(n as u64);
    }
    Ok(())
}

/// One overwrite pass over the whole target: zeros, or pseudo-random data when `rng` is set.
pub fn overwrite(
    t: &Target,
    f: &File,
    rng: Option<&mut Rng>,
    ctx: &StepContext,
    on_chunk: &mut dyn FnMut(u64),
) -> Result<(), EraseError> {
    let mut buf = AlignedBuf::new(WRITE_CHUNK);
    match rng {
        None => write_zeros(t, f, &buf, 0, t.size, ctx, on_chunk)?,
        Some(rng) => {
            let mut pos = 0;
            while pos < t.size {
                ctx.check()?;
                let n = (t.size - pos).min(WRITE_CHUNK as u64) as usize;
                rng.fill(&mut buf.as_mut_slice()[..n]);
                f.write_all_at(&buf.as_slice()[..n], pos)
                    .map_err(io_err(t, "write random data"))?;
                pos += n as u64;
                on_chunk(n as u64);
            }
        }
    }
    f.sync_data().map_err(io_err(t, "fsync"))
}

/// Outcome of an offloaded method the device may not support.
pub enum Offload {
    /// Done.
    Done,
    /// The device refused the first range (EOPNOTSUPP/EINVAL): use the next method.
    Unsupported(nix::Error),
}

/// BLKZEROOUT, or BLKDISCARD/BLKSECDISCARD when `discard` is set, over the whole target in
/// ZEROOUT_CHUNK ranges.
pub fn offload(
    t: &Target,
    f: &File,
    discard: Option<bool>,
    ctx: &StepContext,
    on_chunk: &mut dyn FnMut(u64),
) -> Result<Offload, EraseError> {
    let mut pos = 0;
    while pos < t.size {
        ctx.check()?;
        let n = (t.size - pos).min(ZEROOUT_CHUNK);
        let r = match discard {
            None => ioctl::zero_out(f, pos, n),
            Some(secure) => ioctl::discard(f, pos, n, secure),
        };
        match r {
            Ok(()) => {}
            Err(e @ (nix::Error::EOPNOTSUPP | nix::Error::EINVAL | nix::Error::ENOTTY))
                if pos == 0 =>
            {
                return Ok(Offload::Unsupported(e));
            }
            Err(e) => {
                let op = match discard {
                    None => "BLKZEROOUT",
                    Some(true) => "BLKSECDISCARD",
                    Some(false) => "BLKDISCARD",
                };
                return Err(io_err(t, op)(e.into()));
            }
        }
        pos += n;
        on_chunk(n);
    }
    Ok(Offload::Done)
}

/// Punch the whole file out (FALLOC_FL_PUNCH_HOLE): a file's discard, reads return zeros.
pub fn punch(
    t: &Target,
    f: &File,
    ctx: &StepContext,
    on_chunk: &mut dyn FnMut(u64),
) -> Result<Offload, EraseError> {
    use nix::fcntl::{fallocate, FallocateFlags};
    let mut pos = 0;
    while pos < t.size {
        ctx.check()?;
        let n = (t.size - pos).min(ZEROOUT_CHUNK);
        let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
        match fallocate(f, flags, pos as libc::off_t, n as libc::off_t) {
            Ok(()) => {}
            Err(e @ (nix::Error::EOPNOTSUPP | nix::Error::ENOSYS)) if pos == 0 => {
                return Ok(Offload::Unsupported(e));
            }
            Err(e) => return Err(io_err(t, "punch hole")(e.into())),
        }
        pos += n;
        on_chunk(n);
    }
    f.sync_data().map_err(io_err(t, "fsync"))?;
    Ok(Offload::Done)
}

/// Byte ranges verification reads: the first and last MiB and `samples` pseudo-random
/// 1 MiB ranges in between (4 KiB aligned), merged where they overlap.
pub fn sample_ranges(size: u64, samples: u32, rng: &mut Rng) -> Vec<(u64, u64)> {
    let mut r = vec![(0, VERIFY_LEN.min(size))];
    if size > VERIFY_LEN {
        r.push((size - VERIFY_LEN, VERIFY_LEN));
    }
    if size > 2 * VERIFY_LEN {
        for _ in 0..samples {
            let span = size - VERIFY_LEN;
            let off = (rng.next_u64() % span) & !4095;
            r.push((off, VERIFY_LEN));
        }
    }
    super::merge_ranges(r)
}

/// Read the sampled ranges; the first non-zero byte fails the step, naming the offset.
pub fn verify(t: &Target, samples: u32, ctx: &StepContext) -> Result<u64, EraseError> {
    // A fresh buffered fd: BLKFLSBUF first so a firmware erase is not hidden by stale cache.
    let f = File::open(&t.path).map_err(io_err(t, "open for verification"))?;
    if matches!(t.kind, TargetKind::Block { .. }) {
        let _ = ioctl::flush_buffers(&f);
    }
    let mut rng = Rng::new(t.size);
    let mut buf = vec![0u8; VERIFY_LEN as usize];
    let mut checked = 0;
    for (off, len) in sample_ranges(t.size, samples, &mut rng) {
        ctx.check()?;
        let mut pos = off;
        while pos < off + len {
            let n = (off + len - pos).min(VERIFY_LEN) as usize;
            f.read_exact_at(&mut buf[..n], pos)
                .map_err(io_err(t, "read back for verification"))?;
            if let Some(i) = buf[..n].iter().position(|b| *b != 0) {
                return Err(EraseError::Verify {
                    device: t.display(),
                    offset: pos + i as u64,
                });
            }
            pos += n as u64;
            checked += n as u64;
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer_is_aligned() {
        for len in [512, 4096, 1 << 20] {
            let b = AlignedBuf::new(len);
            assert_eq!(b.as_slice().as_ptr() as usize % 4096, 0);
            assert_eq!(b.as_slice().len(), len);
        }
    }

    #[test]
    fn rng_is_not_constant() {
        let mut r = Rng::new(1);
        let mut b = [0u8; 13];
        r.fill(&mut b);
        assert!(b.iter().any(|x| *x != 0));
        assert_ne!(r.next_u64(), r.next_u64());
    }

    #[test]
    fn samples_cover_both_ends_and_stay_inside() {
        let mut r = Rng::new(7);
        let size = 100 << 20;
        let s = sample_ranges(size, 16, &mut r);
        assert_eq!(s[0].0, 0);
        assert!(s.iter().all(|(o, l)| o + l <= size));
        assert_eq!(s.last().map(|(o, l)| o + l), Some(size));
        assert_eq!(sample_ranges(1000, 16, &mut r), vec![(0, 1000)]);
    }
}

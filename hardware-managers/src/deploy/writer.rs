//! The target disk as the image writer sees it: large aligned writes (O_DIRECT on block
//! devices, so the page cache neither fills up nor lies about what reached the disk),
//! zeroing of the ranges no image data covered, and the final flush.
//!
//! The image's first MiB is held in memory and reaches the disk last ([`DiskWriter::commit_head`]),
//! only once the digest matched and everything else is on the disk — as coreos-installer
//! does. The disk's head (MBR, primary GPT, boot code) was wiped before the write, so until
//! the commit the disk holds nothing a firmware would boot: a digest mismatch, a cut stream,
//! an abort, the agent killed or the machine powered off mid-write all leave it unbootable.

use crate::erase::device::{Target, TargetKind};
use crate::erase::ioctl;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Bytes of the image held back and written last: the MBR, a GPT's primary header and
/// entries (with 512 or 4096-byte sectors), and the boot loader's first stage.
pub const HEAD: u64 = 1 << 20;

/// Written ranges kept before they are merged (16 bytes each).
const COMPACT_AT: usize = 1 << 16;
/// Written ranges allowed after merging: 64 MiB of bookkeeping at most.
pub const MAX_RANGES: usize = 4 << 20;

/// `ranges` sorted, with touching and overlapping ones joined.
fn merged(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (s, l) in ranges {
        match out.last_mut() {
            Some((ps, pl)) if *ps + *pl >= s => *pl = (*pl).max(s + l - *ps),
            _ => out.push((s, l)),
        }
    }
    out
}

/// Alignment O_DIRECT needs for buffers, offsets and lengths (covers 4 KiB-sector disks).
pub const ALIGN: usize = 4096;

/// A buffer whose start is [`ALIGN`]-aligned, made without `unsafe`: a Vec one alignment
/// longer, used from its first aligned byte.
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes (rounded up to a multiple of [`ALIGN`]).
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.div_ceil(ALIGN) * ALIGN;
        let raw = vec![0u8; len + ALIGN];
        let start = raw.as_ptr().align_offset(ALIGN).min(ALIGN);
        AlignedBuf { raw, start, len }
    }

    /// The whole buffer.
    pub fn buf_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }

    /// The first `n` bytes.
    pub fn slice(&self, n: usize) -> &[u8] {
        &self.raw[self.start..self.start + n.min(self.len)]
    }
}

/// The disk being written.
pub struct DiskWriter {
    /// Path, for messages.
    pub device: String,
    direct: Option<File>,
    buffered: File,
    /// Size in bytes.
    pub size: u64,
    block: bool,
    /// Guest ranges written so far (cluster-granular for qcow2), merged now and then.
    written: Vec<(u64, u64)>,
    /// List length at which it is merged next.
    compact_at: usize,
    /// The image's first [`HEAD`] bytes, held until [`DiskWriter::commit_head`].
    head: AlignedBuf,
    /// End of the held bytes (0: none held).
    head_end: u64,
}

impl DiskWriter {
    /// Open `target` for writing.
    pub fn open(target: &Target) -> Result<DiskWriter, String> {
        let device = target.display();
        let (buffered, _) = target.open_write(false).map_err(|e| e.to_string())?;
        let direct = match target.open_write(true) {
            Ok((f, true)) => Some(f),
            _ => None,
        };
        Ok(DiskWriter {
            device,
            direct,
            buffered,
            size: target.size,
            block: !matches!(target.kind, TargetKind::File),
            written: Vec::new(),
            compact_at: COMPACT_AT,
            head: AlignedBuf::new(HEAD.min(target.size) as usize),
            head_end: 0,
        })
    }

    fn head_len(&self) -> u64 {
        HEAD.min(self.size)
    }

    fn check_fits(&self, offset: u64, len: u64) -> Result<(), String> {
        if offset + len > self.size {
            return Err(format!(
                "the image is larger than {} ({} bytes): it needs at least {} bytes",
                self.device,
                self.size,
                offset + len
            ));
        }
        Ok(())
    }

    /// Write `data` at `offset`: directly when both are aligned, else through the page cache.
    /// Bytes that fall in the image's first [`HEAD`] are held, not written (see the module
    /// doc).
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        if data.is_empty() {
            return Ok(());
        }
        self.check_fits(offset, data.len() as u64)?;
        let head = self.head_len();
        if offset < head {
            let n = (head - offset).min(data.len() as u64) as usize;
            let at = offset as usize;
            self.head.buf_mut()[at..at + n].copy_from_slice(&data[..n]);
            self.head_end = self.head_end.max(offset + n as u64);
            self.note(offset, n as u64)?;
            return self.write_at(offset + n as u64, &data[n..]);
        }
        let aligned = offset.is_multiple_of(ALIGN as u64)
            && data.len().is_multiple_of(ALIGN)
            && data.as_ptr().align_offset(ALIGN) == 0;
        let f = match (&self.direct, aligned) {
            (Some(d), true) => d,
            _ => &self.buffered,
        };
        f.write_all_at(data, offset)
            .map_err(|e| format!("{}: write at offset {offset}: {e}", self.device))?;
        self.note(offset, data.len() as u64)?;
        Ok(())
    }

    /// Like [`DiskWriter::write_at`] for data not known to be aligned in memory: aligned
    /// pieces go through `bounce` directly.
    pub fn write_copy(
        &mut self,
        offset: u64,
        data: &[u8],
        bounce: &mut AlignedBuf,
    ) -> Result<(), String> {
        let cap = bounce.buf_mut().len();
        let mut done = 0;
        while done < data.len() {
            let n = (data.len() - done).min(cap);
            let off = offset + done as u64;
            if self.direct.is_some() && off.is_multiple_of(ALIGN as u64) && n.is_multiple_of(ALIGN)
            {
                bounce.buf_mut()[..n].copy_from_slice(&data[done..done + n]);
                self.write_at(off, bounce.slice(n))?;
            } else {
                self.write_at(off, &data[done..done + n])?;
            }
            done += n;
        }
        Ok(())
    }

    /// Remember a written range. Out-of-order writes (a qcow2's clusters arrive in file
    /// order) are merged now and then, so the list stays small for any image qemu-img
    /// writes; one fragmented beyond [`MAX_RANGES`] even after merging is refused rather than
    /// let the list grow with the disk's size.
    fn note(&mut self, offset: u64, len: u64) -> Result<(), String> {
        match self.written.last_mut() {
            Some((s, l)) if *s + *l == offset => *l += len,
            _ => self.written.push((offset, len)),
        }
        if self.written.len() >= self.compact_at {
            self.written = merged(std::mem::take(&mut self.written));
            if self.written.len() > MAX_RANGES {
                return Err(format!(
                    "the image is fragmented into more than {MAX_RANGES} separate written ranges of {}: it cannot be written in bounded memory; convert it with `qemu-img convert -O raw` (or -O qcow2) and deploy that",
                    self.device
                ));
            }
            // Merge again once the list has doubled: amortised O(n log n) in all.
            self.compact_at = (self.written.len() * 2).max(COMPACT_AT);
        }
        Ok(())
    }

    /// Zero every byte of `[0, upto)` that no write covered (unallocated and zero clusters
    /// of a qcow2): BLKZEROOUT on a block device (offloaded where the device can), hole
    /// punching or zero writes on a file.
    pub fn zero_gaps(
        &mut self,
        upto: u64,
        check: &dyn Fn() -> Result<(), String>,
    ) -> Result<u64, String> {
        let mut w = std::mem::take(&mut self.written);
        w.sort_unstable();
        let mut gaps = Vec::new();
        let mut pos = 0u64;
        for (s, l) in &w {
            if *s > pos {
                gaps.push((pos, *s - pos));
            }
            pos = pos.max(s + l);
        }
        if pos < upto {
            gaps.push((pos, upto - pos));
        }
        self.written = w;
        let mut zeroed = 0;
        for (s, l) in gaps {
            let l = l.min(upto.saturating_sub(s));
            if l == 0 {
                continue;
            }
            check()?;
            self.zero_range(s, l)?;
            zeroed += l;
        }
        Ok(zeroed)
    }

    fn zero_range(&self, offset: u64, len: u64) -> Result<(), String> {
        // BLKZEROOUT needs 512-byte alignment: the unaligned edges are written.
        let start = offset.div_ceil(512) * 512;
        let end = (offset + len) / 512 * 512;
        if self.block && end > start && ioctl::zero_out(&self.buffered, start, end - start).is_ok()
        {
            self.write_zeros(offset, start - offset)?;
            return self.write_zeros(end, offset + len - end);
        }
        self.write_zeros(offset, len)
    }

    fn write_zeros(&self, offset: u64, len: u64) -> Result<(), String> {
        if len == 0 {
            return Ok(());
        }
        let zero = vec![0u8; (len.min(1 << 20)) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zero.len() as u64) as usize;
            self.buffered
                .write_all_at(&zero[..n], offset + done)
                .map_err(|e| format!("{}: zeroing at {}: {e}", self.device, offset + done))?;
            done += n as u64;
        }
        Ok(())
    }

    /// Write the held head, then flush: the image becomes bootable only here. Call once the
    /// image is verified and the rest of it is flushed.
    pub fn commit_head(&mut self) -> Result<(), String> {
        if self.head_end == 0 {
            return Ok(());
        }
        // Up to the last held byte, rounded up to the alignment where the head allows (the
        // held buffer is zero where nothing was written, as the disk is after the wipe).
        let n = (self.head_end.div_ceil(ALIGN as u64) * ALIGN as u64).min(self.head_len()) as usize;
        let f = match (&self.direct, n % ALIGN) {
            (Some(d), 0) => d,
            _ => &self.buffered,
        };
        f.write_all_at(self.head.slice(n), 0)
            .map_err(|e| format!("{}: writing the image's first MiB: {e}", self.device))?;
        self.flush()
    }

    /// Zero the first and the last MiB of the disk and flush: after a failed write nothing
    /// on it looks like a partition table or a boot sector (MBR, primary and backup GPT).
    pub fn wipe_ends(&self) -> Result<(), String> {
        let w = HEAD.min(self.size);
        self.zero_range(0, w)?;
        let tail = self.size.saturating_sub(HEAD);
        if tail > 0 {
            self.zero_range(tail.max(w), self.size - tail.max(w))?;
        }
        self.flush()
    }

    /// Flush everything to stable storage.
    pub fn flush(&self) -> Result<(), String> {
        for f in self.direct.iter().chain(std::iter::once(&self.buffered)) {
            f.sync_all()
                .map_err(|e| format!("{}: flush: {e}", self.device))?;
        }
        if self.block {
            let _ = ioctl::flush_buffers(&self.buffered);
        }
        Ok(())
    }

    /// The read-write file, for partition-table work after the image.
    pub fn file(&self) -> &File {
        &self.buffered
    }

    /// Ask the kernel to re-read the partition table. A loop device without partition
    /// scanning refuses; that is reported, not fatal (the table on the disk is right).
    pub fn reread(&self) -> Result<(), String> {
        if !self.block {
            return Ok(());
        }
        ioctl::reread_partitions(&self.buffered)
            .map_err(|e| format!("{}: re-reading the partition table: {e}", self.device))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer_and_gaps() {
        let mut b = AlignedBuf::new(5000);
        assert_eq!(b.buf_mut().len(), 8192);
        assert_eq!(b.buf_mut().as_ptr().align_offset(ALIGN), 0);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.img");
        let size = 2 * HEAD as usize;
        std::fs::write(&p, vec![0xAAu8; size]).unwrap();
        let t = Target::open(&p).unwrap();
        let mut w = DiskWriter::open(&t).unwrap();
        let past = HEAD as usize;
        w.write_at(4096, &[1u8; 4096]).unwrap();
        w.write_at(16384, &[2u8; 100]).unwrap();
        // Straddling the end of the head: its first half held, its second half written.
        w.write_at(HEAD - 4096, &[3u8; 8192]).unwrap();
        let zeroed = w.zero_gaps(past as u64 + 32768, &|| Ok(())).unwrap();
        assert_eq!(zeroed, past as u64 + 32768 - 4096 - 100 - 8192);
        w.flush().unwrap();
        let got = std::fs::read(&p).unwrap();
        assert!(
            got[4096..8192].iter().all(|b| *b == 0xAA),
            "the head is not written before the commit"
        );
        assert!(got[past..past + 4096].iter().all(|b| *b == 3));
        w.commit_head().unwrap();
        let got = std::fs::read(&p).unwrap();
        assert!(got[..4096].iter().all(|b| *b == 0));
        assert!(got[4096..8192].iter().all(|b| *b == 1));
        assert!(got[8192..16384].iter().all(|b| *b == 0));
        assert!(got[16384..16484].iter().all(|b| *b == 2));
        assert!(got[16484..past - 4096].iter().all(|b| *b == 0));
        assert!(got[past - 4096..past + 4096].iter().all(|b| *b == 3));
        assert!(got[past + 4096..past + 32768].iter().all(|b| *b == 0));
        assert!(
            got[past + 32768..].iter().all(|b| *b == 0xAA),
            "past upto untouched"
        );
        assert!(w
            .write_at(size as u64 - 10, &[0u8; 20])
            .unwrap_err()
            .contains("larger than"));
        // After a failure: both ends zero.
        w.wipe_ends().unwrap();
        let got = std::fs::read(&p).unwrap();
        assert!(got.iter().all(|b| *b == 0));
    }

    #[test]
    fn out_of_order_ranges_are_merged_and_stay_few() {
        assert_eq!(
            merged(vec![(10, 5), (0, 5), (5, 5), (30, 1), (29, 3)]),
            vec![(0, 15), (29, 3)]
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.img");
        let n = (COMPACT_AT * 3) as u64;
        std::fs::File::create(&p)
            .unwrap()
            .set_len(HEAD + n * 512)
            .unwrap();
        let t = Target::open(&p).unwrap();
        let mut w = DiskWriter::open(&t).unwrap();
        // Sectors past the head, last first: every write is out of order.
        for i in (0..n).rev() {
            w.write_at(HEAD + i * 512, &[7u8; 512]).unwrap();
        }
        assert!(w.written.len() <= COMPACT_AT, "{}", w.written.len());
        assert_eq!(merged(w.written.clone()), vec![(HEAD, n * 512)]);
    }
}

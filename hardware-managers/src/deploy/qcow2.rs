//! A qcow2 image decoded in one sequential pass, in bounded memory.
//!
//! IPA downloads a qcow2 into the ramdisk's RAM and runs `qemu-img convert`; a qcow2 bigger
//! than the ramdisk's free memory fails. Here the image streams once: the header comes
//! first, the L1 table names where the L2 tables are, each L2 table names where its data
//! clusters are, and every data cluster is written to its guest offset as it passes.
//!
//! Memory is bounded whatever the image's virtual size or table density: at most
//! [`MAX_BOOKKEEPING_BYTES`] (64 MiB). The window being read holds at most one pending
//! item's bytes plus one read ([`READ_CHUNK`]): the L1 table is walked as it passes, not held
//! whole. What is pending (L2 tables named by the L1, data clusters named by an L2 table
//! whose bytes have not come yet; clusters contiguous both in the file and on the disk are one
//! entry) is at most [`MAX_PENDING`] entries; an image that would need more is refused with
//! that limit named, never decoded in more memory. qemu-img (`convert`, `create`,
//! preallocation included) writes the L1 before every L2 table, and `convert` each L2 table
//! just before the clusters it maps, so what it makes streams with one pending entry per
//! allocated L2 table plus those of the L2 table being read; an image whose table points
//! backwards (at bytes already gone by) is refused with what to do, never written half.
//!
//! Hostile input cannot make the walk slow either: the L2 tables may not overlap each other
//! or the L1, so each byte of the file is read as a table at most once, and every guest
//! cluster is written at most once (fuzzed by `fuzz/fuzz_targets/qcow2.rs`).
//!
//! Image safety (the 2024 OpenStack advisories) is checked on the header, before a byte
//! reaches the disk: no backing file, no external data file, no encryption, no unknown
//! incompatible feature.

use std::collections::BTreeMap;
use std::io::Read;

/// Something the decoder refuses.
#[derive(Debug, thiserror::Error)]
pub enum Qcow2Error {
    /// The image is refused as unsafe or unsupported.
    #[error("qcow2 image refused: {0}")]
    Refused(String),
    /// The image is damaged or truncated.
    #[error("qcow2 image is damaged: {0}")]
    Damaged(String),
    /// Reading the stream failed.
    #[error("reading the image: {0}")]
    Read(#[from] std::io::Error),
    /// The sink failed.
    #[error("{0}")]
    Sink(String),
}

/// Where decoded clusters go.
pub trait ClusterSink {
    /// Write `data` at guest offset `offset`.
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), String>;
    /// Called with the number of stream bytes consumed so far (progress, abort checks).
    fn progress(&mut self, consumed: u64) -> Result<(), String>;
}

/// What the header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// 2 or 3.
    pub version: u32,
    /// Cluster size in bytes.
    pub cluster_size: u64,
    /// Virtual disk size.
    pub size: u64,
    l1_offset: u64,
    l1_entries: u64,
    /// 0 = deflate, 1 = zstd.
    compression: u8,
}

impl Header {
    /// Size of the L1 table in bytes (at most [`MAX_L1_BYTES`]).
    pub fn l1_table_bytes(&self) -> u64 {
        self.l1_entries * 8
    }
}

fn be32(b: &[u8], o: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[o..o + 4]);
    u32::from_be_bytes(x)
}

fn be64(b: &[u8], o: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[o..o + 8]);
    u64::from_be_bytes(x)
}

/// qcow2 magic.
pub const MAGIC: &[u8; 4] = b"QFI\xfb";

/// Smallest cluster size (`cluster_bits` 9).
pub const MIN_CLUSTER_SIZE: u64 = 512;
/// Largest cluster size (`cluster_bits` 21).
pub const MAX_CLUSTER_SIZE: u64 = 2 << 20;
/// Largest L1 table accepted: qemu's own limit (`QCOW_MAX_L1_SIZE`), so no image qemu can
/// open is refused by it.
pub const MAX_L1_BYTES: u64 = 32 << 20;
/// Most entries pending at once (an L2 table named by the L1, a run of data clusters or a
/// compressed cluster named by an L2 table, whose bytes are further on in the stream). An
/// image made by `qemu-img convert` needs one per allocated L2 table, then one per run of
/// data clusters (and one per compressed cluster) of the L2 table being read; this admits
/// 256 Ki allocated L2 tables (128 TiB of guest space in 64 KiB clusters, 512 GiB in 4 KiB
/// clusters). An image that needs more is refused, naming the limit.
pub const MAX_PENDING: usize = 256 << 10;
/// Bytes asked of the stream per read.
pub const READ_CHUNK: usize = 4 << 20;
/// The decoder's own memory for any image, whatever its virtual size and table density:
/// the window (one pending item, at most two clusters, plus one [`READ_CHUNK`]), the read
/// buffer, a cluster of scratch and the decompressor's state for compressed clusters, and
/// at most [`MAX_PENDING`] pending entries (under 100 bytes each in the map). Checked by
/// `hardware-managers/tests/qcow2_bound.rs` with a counting allocator.
pub const MAX_BOOKKEEPING_BYTES: u64 = 64 << 20;

/// Parse and vet the header from the first bytes of the image (at least 512 bytes, and the
/// whole header-extension area when there is one: the first cluster is always enough).
pub fn parse_header(b: &[u8]) -> Result<Header, Qcow2Error> {
    let refuse = |m: String| Err(Qcow2Error::Refused(m));
    if b.len() < 104 || &b[..4] != MAGIC {
        return Err(Qcow2Error::Damaged("no qcow2 header".into()));
    }
    let version = be32(b, 4);
    if version != 2 && version != 3 {
        return refuse(format!("version {version} is not supported (2 or 3)"));
    }
    if be64(b, 8) != 0 || be32(b, 16) != 0 {
        return refuse(
            "it has a backing file: its content would come from a file on the machine that converts it (CVE-2024-32498 class); flatten it with `qemu-img convert -O qcow2`".into(),
        );
    }
    let cluster_bits = be32(b, 20);
    if !(9..=21).contains(&cluster_bits) {
        return Err(Qcow2Error::Damaged(format!("cluster_bits {cluster_bits}")));
    }
    let size = be64(b, 24);
    if be32(b, 32) != 0 {
        return refuse("it is encrypted".into());
    }
    let l1_entries = u64::from(be32(b, 36));
    let l1_offset = be64(b, 40);
    let mut compression = 0u8;
    if version == 3 {
        let incompatible = be64(b, 72);
        let header_len = be32(b, 100) as usize;
        if incompatible & 0x1 != 0 {
            return refuse(
                "it is marked dirty (not closed cleanly): repair it with `qemu-img check -r all`"
                    .into(),
            );
        }
        if incompatible & 0x2 != 0 {
            return refuse("it is marked corrupt".into());
        }
        if incompatible & 0x4 != 0 {
            return refuse(
                "it stores its data in an external data file, which would be read from the machine that converts it (CVE-2024-32498 class)".into(),
            );
        }
        if incompatible & 0x10 != 0 {
            return refuse("extended L2 entries (subclusters) are not supported".into());
        }
        if incompatible & !0x1f != 0 {
            return refuse(format!("unknown incompatible features {incompatible:#x}"));
        }
        if incompatible & 0x8 != 0 {
            if header_len < 105 || b.len() < 105 {
                return Err(Qcow2Error::Damaged(
                    "compression type bit set without the field".into(),
                ));
            }
            compression = b[104];
            if compression > 1 {
                return refuse(format!("compression type {compression} is unknown"));
            }
        }
        // Header extensions: an external data file name also refuses the image.
        let mut o = header_len.max(104);
        while o + 8 <= b.len() {
            let kind = be32(b, o);
            let len = be32(b, o + 4) as usize;
            if kind == 0 {
                break;
            }
            if kind == 0x4441_5441 {
                return refuse("it names an external data file".into());
            }
            o += 8 + len.div_ceil(8) * 8;
        }
    }
    let cluster_size = 1u64 << cluster_bits;
    let needed = size.div_ceil(cluster_size).div_ceil(cluster_size / 8);
    if l1_entries < needed {
        return Err(Qcow2Error::Damaged(format!(
            "L1 table has {l1_entries} entries, {needed} needed for {size} bytes"
        )));
    }
    if l1_entries * 8 > MAX_L1_BYTES {
        return refuse(format!(
            "its L1 table of {} bytes is larger than the {} MiB qemu allows",
            l1_entries * 8,
            MAX_L1_BYTES >> 20
        ));
    }
    if l1_offset > OFFSET_MASK {
        return Err(Qcow2Error::Damaged(format!(
            "L1 table offset {l1_offset} is out of range"
        )));
    }
    Ok(Header {
        version,
        cluster_size,
        size,
        l1_offset,
        l1_entries,
        compression,
    })
}

/// What a host range of the file holds.
#[derive(Debug, Clone, Copy)]
enum Item {
    /// The L1 table from entry `index` on (it is walked as it passes).
    L1 { index: u64 },
    /// An L2 table and the guest offset its first entry maps.
    L2 { guest: u64 },
    /// `count` data clusters, contiguous both in the file and from guest offset `guest`.
    Data { guest: u64, count: u64 },
    /// A compressed cluster of `len` bytes for guest offset `guest`.
    Compressed { guest: u64, len: u64 },
}

const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;

/// What is pending, by file offset, and the rules on adding to it.
struct Pending {
    items: BTreeMap<u64, Item>,
    cs: u64,
    /// The L1 table's bytes: no L2 table may overlap them.
    l1: (u64, u64),
}

impl Pending {
    fn add(&mut self, at: u64, item: Item) -> Result<(), Qcow2Error> {
        if self.items.len() >= MAX_PENDING {
            return Err(Qcow2Error::Refused(format!(
                "its tables name more than {MAX_PENDING} L2 tables or runs of clusters ahead of their bytes, more than the decoder's bounded bookkeeping ({} MiB) holds; rewrite it with `qemu-img convert -O qcow2` (64 KiB clusters) or serve it raw",
                MAX_BOOKKEEPING_BYTES >> 20
            )));
        }
        if self.items.insert(at, item).is_some() {
            return Err(Qcow2Error::Refused(format!(
                "two table entries point at offset {at}: the image is damaged or crafted"
            )));
        }
        Ok(())
    }

    /// An L2 table named by the L1 (all of them are named before any is read): it may
    /// overlap neither the L1 nor another L2 table, so no byte is walked as a table twice.
    fn add_l2(&mut self, at: u64, guest: u64) -> Result<(), Qcow2Error> {
        let cs = self.cs;
        let (l1, l1_len) = self.l1;
        let overlap = |a: u64, b: u64| {
            Err(Qcow2Error::Refused(format!(
                "its tables at offsets {a} and {b} overlap: the image is damaged or crafted"
            )))
        };
        if at < l1 + l1_len && l1 < at + cs {
            return overlap(l1, at);
        }
        if let Some((&p, _)) = self.items.range(..=at).next_back() {
            if p + cs > at {
                return overlap(p, at);
            }
        }
        if let Some((&n, _)) = self.items.range(at..).next() {
            if at + cs > n {
                return overlap(at, n);
            }
        }
        self.add(at, Item::L2 { guest })
    }

    /// A data cluster: joins the run just before it when it continues it on both sides.
    fn add_data(&mut self, at: u64, guest: u64) -> Result<(), Qcow2Error> {
        let cs = self.cs;
        if !self.items.contains_key(&at) {
            if let Some((&p, Item::Data { guest: g, count })) =
                self.items.range_mut(..at).next_back()
            {
                if p + *count * cs == at && *g + *count * cs == guest {
                    *count += 1;
                    return Ok(());
                }
            }
        }
        self.add(at, Item::Data { guest, count: 1 })
    }
}

/// Decode the whole image from `input` (positioned at its first byte; `head` holds bytes
/// already read from it, at least the header cluster or the whole file when smaller).
/// Returns the header and the stream bytes consumed. Unallocated and zero clusters are not
/// written: the caller zeroes what no cluster covered. Every write lies within the virtual
/// size, and no guest cluster is written twice. Memory: [`MAX_BOOKKEEPING_BYTES`] beyond
/// `head`.
pub fn decode(
    head: Vec<u8>,
    input: &mut dyn Read,
    sink: &mut dyn ClusterSink,
) -> Result<(Header, u64), Qcow2Error> {
    let header = parse_header(&head)?;
    let cs = header.cluster_size;
    // Only entries that map guest bytes are walked (a bigger L1 maps nothing more).
    let l1_walk = header
        .size
        .div_ceil(cs)
        .div_ceil(cs / 8)
        .min(header.l1_entries);
    let mut pending = Pending {
        items: BTreeMap::new(),
        cs,
        l1: (header.l1_offset, header.l1_entries * 8),
    };
    let mut l1_done = l1_walk == 0;
    if !l1_done {
        pending.add(header.l1_offset, Item::L1 { index: 0 })?;
    }
    // The window: bytes of the file from `win_start`. Room for the largest item that can
    // wait in it (a compressed cluster spans up to two clusters) plus one read, reserved
    // once: growing by doubling would briefly hold two copies.
    let mut window = head;
    let mut win_start = 0u64;
    window.reserve_exact((2 * cs as usize + READ_CHUNK).saturating_sub(window.len()));
    let mut eof = false;
    let mut chunk = vec![0u8; READ_CHUNK];
    let mut scratch = Vec::new();
    let ends_early = |end: u64| {
        Qcow2Error::Damaged(format!(
            "the file ends before offset {end} that its tables refer to"
        ))
    };
    loop {
        // Handle every item whose bytes are in the window, lowest offset first.
        while let Some((&at, &item)) = pending.items.iter().next() {
            if at < win_start {
                return Err(Qcow2Error::Refused(format!(
                    "its tables point backwards (offset {at} after reading past it): the image cannot be streamed; rewrite it with `qemu-img convert -O qcow2` or serve it raw"
                )));
            }
            let win_end = win_start + window.len() as u64;
            let avail = win_end.saturating_sub(at);
            let from = (at - win_start) as usize;
            match item {
                Item::L1 { index } => {
                    let n = (l1_walk - index).min(avail / 8);
                    if n == 0 {
                        if eof {
                            return Err(ends_early(at + 8));
                        }
                        break;
                    }
                    pending.items.remove(&at);
                    let per_l2 = cs / 8 * cs;
                    for i in 0..n {
                        let e = be64(&window, from + (i * 8) as usize) & OFFSET_MASK;
                        if e != 0 {
                            pending.add_l2(e, (index + i) * per_l2)?;
                        }
                    }
                    if index + n < l1_walk {
                        pending.add(at + n * 8, Item::L1 { index: index + n })?;
                    } else {
                        l1_done = true;
                    }
                }
                Item::L2 { guest } => {
                    if !l1_done {
                        return Err(Qcow2Error::Refused(format!(
                            "an L2 table (offset {at}) comes before the end of its L1 table: the image cannot be streamed; rewrite it with `qemu-img convert -O qcow2` or serve it raw"
                        )));
                    }
                    if avail < cs {
                        if eof {
                            return Err(ends_early(at + cs));
                        }
                        break;
                    }
                    pending.items.remove(&at);
                    for i in 0..cs / 8 {
                        let g = guest + i * cs;
                        if g >= header.size {
                            break;
                        }
                        let e = be64(&window, from + (i * 8) as usize);
                        if e & (1 << 62) != 0 {
                            let x = 62 - (cs.trailing_zeros() as u64 - 8);
                            let off = e & ((1u64 << x) - 1);
                            let sectors = (e >> x) & ((1u64 << (cs.trailing_zeros() - 8)) - 1);
                            let len = (sectors + 1) * 512 - (off & 511);
                            pending.add(off, Item::Compressed { guest: g, len })?;
                        } else {
                            let off = e & OFFSET_MASK;
                            // Bit 0 = reads as zero (v3); unallocated reads as zero (no
                            // backing file): both are left to the caller's zeroing.
                            if off != 0 && e & 1 == 0 {
                                pending.add_data(off, g)?;
                            }
                        }
                    }
                }
                Item::Data { guest, count } => {
                    let n = count.min(avail / cs);
                    if n == 0 {
                        if !eof {
                            break;
                        }
                        // A data cluster may be cut short at the end of the file by tools
                        // that do not pad the last cluster.
                        if avail == 0 || count > 1 {
                            return Err(ends_early(at + cs));
                        }
                        pending.items.remove(&at);
                        write_data(sink, &header, guest, &window[from..])?;
                        continue;
                    }
                    pending.items.remove(&at);
                    let len = (n * cs) as usize;
                    write_data(sink, &header, guest, &window[from..from + len])?;
                    if n < count {
                        let item = Item::Data {
                            guest: guest + n * cs,
                            count: count - n,
                        };
                        pending.add(at + n * cs, item)?;
                    }
                }
                Item::Compressed { guest, len } => {
                    // A compressed cluster's length is rounded up to whole sectors; the file
                    // need not hold the rounding.
                    let take = if avail >= len {
                        len
                    } else if eof && avail > 0 {
                        avail
                    } else if eof {
                        return Err(ends_early(at + len));
                    } else {
                        break;
                    };
                    pending.items.remove(&at);
                    scratch.resize(cs as usize, 0);
                    let n = inflate(&header, &window[from..from + take as usize], &mut scratch)?;
                    write_data(sink, &header, guest, &scratch[..n])?;
                }
            }
        }
        if eof {
            return Ok((header, win_start + window.len() as u64));
        }
        let n = read_some(input, &mut chunk)?;
        if n == 0 {
            eof = true;
        } else {
            if window.len() + n > window.capacity() {
                // Drop what no pending item needs: then the window holds less than one
                // pending item (at most two clusters) and the read fits.
                let win_end = win_start + window.len() as u64;
                let keep_from = pending
                    .items
                    .keys()
                    .next()
                    .copied()
                    .unwrap_or(win_end)
                    .clamp(win_start, win_end);
                let drop = (keep_from - win_start) as usize;
                window.drain(..drop);
                win_start = keep_from;
            }
            window.extend_from_slice(&chunk[..n]);
        }
        sink.progress(win_start + window.len() as u64)
            .map_err(Qcow2Error::Sink)?;
        if pending.items.is_empty() && !eof {
            // Nothing left to find: the rest is refcounts and padding; the caller reads it
            // for the digest.
            return Ok((header, win_start + window.len() as u64));
        }
    }
}

fn write_data(
    sink: &mut dyn ClusterSink,
    header: &Header,
    guest: u64,
    data: &[u8],
) -> Result<(), Qcow2Error> {
    let len = (header.size - guest).min(data.len() as u64) as usize;
    sink.write_at(guest, &data[..len]).map_err(Qcow2Error::Sink)
}

fn inflate(header: &Header, src: &[u8], out: &mut [u8]) -> Result<usize, Qcow2Error> {
    let bad = |e: String| Qcow2Error::Damaged(format!("a compressed cluster does not decode: {e}"));
    let mut filled = 0;
    if header.compression == 1 {
        let mut d = ruzstd::decoding::StreamingDecoder::new(src).map_err(|e| bad(e.to_string()))?;
        while filled < out.len() {
            match d.read(&mut out[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) => return Err(bad(e.to_string())),
            }
        }
    } else {
        let mut d = flate2::read::DeflateDecoder::new(src);
        while filled < out.len() {
            match d.read(&mut out[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) => return Err(bad(e.to_string())),
            }
        }
    }
    Ok(filled)
}

fn read_some(input: &mut dyn Read, buf: &mut [u8]) -> Result<usize, std::io::Error> {
    loop {
        match input.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn header_refusals() {
        let mut h = vec![0u8; 512];
        h[..4].copy_from_slice(MAGIC);
        h[7] = 3; // version 3
        h[23] = 16; // 64 KiB clusters
        h[24..32].copy_from_slice(&(1u64 << 30).to_be_bytes());
        h[36..40].copy_from_slice(&2u32.to_be_bytes());
        h[40..48].copy_from_slice(&(3u64 << 16).to_be_bytes());
        h[100..104].copy_from_slice(&112u32.to_be_bytes());
        assert!(parse_header(&h).is_ok());
        let mut b = h.clone();
        b[8..16].copy_from_slice(&512u64.to_be_bytes());
        b[16..20].copy_from_slice(&8u32.to_be_bytes());
        assert!(parse_header(&b)
            .unwrap_err()
            .to_string()
            .contains("backing file"));
        let mut d = h.clone();
        d[79] = 0x4;
        assert!(parse_header(&d)
            .unwrap_err()
            .to_string()
            .contains("external data file"));
        let mut e = h.clone();
        e[35] = 1;
        assert!(parse_header(&e)
            .unwrap_err()
            .to_string()
            .contains("encrypted"));
        let mut u = h.clone();
        u[78] = 0x1;
        assert!(parse_header(&u)
            .unwrap_err()
            .to_string()
            .contains("unknown incompatible"));
        let mut x = h.clone();
        x[112..116].copy_from_slice(&0x4441_5441u32.to_be_bytes());
        x[116..120].copy_from_slice(&4u32.to_be_bytes());
        assert!(parse_header(&x)
            .unwrap_err()
            .to_string()
            .contains("names an external data file"));
    }

    /// A v3 image with 512-byte clusters (an L2 table maps 32 KiB), `size` bytes, its L1 at
    /// offset 512; `file` holds `len` bytes.
    fn image(size: u64, l1: &[u64], len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        b[..4].copy_from_slice(MAGIC);
        b[7] = 3;
        b[23] = 9;
        b[24..32].copy_from_slice(&size.to_be_bytes());
        b[36..40].copy_from_slice(&(l1.len() as u32).to_be_bytes());
        b[40..48].copy_from_slice(&512u64.to_be_bytes());
        b[100..104].copy_from_slice(&104u32.to_be_bytes());
        for (i, e) in l1.iter().enumerate() {
            b[512 + 8 * i..520 + 8 * i].copy_from_slice(&e.to_be_bytes());
        }
        b
    }

    fn put(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_be_bytes());
    }

    #[derive(Default)]
    struct Writes(Vec<(u64, Vec<u8>)>);

    impl ClusterSink for Writes {
        fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
            self.0.push((offset, data.to_vec()));
            Ok(())
        }
        fn progress(&mut self, _: u64) -> Result<(), String> {
            Ok(())
        }
    }

    /// `b` decoded with `head` bytes up front and the rest `step` bytes per read.
    fn run(b: &[u8], head: usize, step: usize) -> Result<Vec<(u64, Vec<u8>)>, Qcow2Error> {
        struct Trickle<'a>(&'a [u8], usize);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(self.1).min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut w = Writes::default();
        decode(b[..head].to_vec(), &mut Trickle(&b[head..], step), &mut w)?;
        Ok(w.0)
    }

    /// Fuzzing found `l1_offset + l1_len` overflowing (a panic with overflow checks).
    #[test]
    fn l1_table_out_of_range_or_over_qemus_limit_is_refused() {
        let mut b = image(1 << 20, &[0; 32], 1024);
        put(&mut b, 40, u64::MAX - 4);
        let e = parse_header(&b).unwrap_err().to_string();
        assert!(e.contains("L1 table offset"), "{e}");
        let mut b = image(1 << 20, &[0; 32], 1024);
        b[36..40].copy_from_slice(&(((32u32 << 20) / 8) + 1).to_be_bytes());
        let e = parse_header(&b).unwrap_err().to_string();
        assert!(e.contains("32 MiB qemu allows"), "{e}");
    }

    /// Contiguous writes joined, for comparing decodes of streams cut differently.
    fn joined(w: Vec<(u64, Vec<u8>)>) -> Vec<(u64, Vec<u8>)> {
        let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
        for (o, d) in w {
            match out.last_mut() {
                Some((lo, ld)) if *lo + ld.len() as u64 == o => ld.extend(d),
                _ => out.push((o, d)),
            }
        }
        out
    }

    /// Clusters contiguous on both sides are one pending entry, written at once when their
    /// bytes are there; however the stream is cut (the L1 walked a few bytes at a time
    /// included), the same bytes land.
    #[test]
    fn contiguous_clusters_decode_however_the_stream_arrives() {
        // 64 KiB: two L2 tables; the first maps guest 0..2 KiB to the four clusters after
        // it, the second one cluster at guest 32 KiB.
        let mut b = image(64 << 10, &[1024, 4096], 5120);
        for i in 0..4u64 {
            put(&mut b, 1024 + 8 * i as usize, 1536 + 512 * i);
        }
        put(&mut b, 4096, 4608);
        for (i, x) in b[1536..3584].iter_mut().enumerate() {
            *x = i as u8 | 1;
        }
        b[4608..5120].fill(0xab);
        let want = vec![(0, b[1536..3584].to_vec()), (32 << 10, vec![0xab; 512])];
        assert!(run(&b, b.len(), 1).unwrap() == want, "one write per run");
        for (head, step) in [(104, 3), (700, 1000), (512, 1)] {
            let got = joined(run(&b, head, step).unwrap());
            assert!(got == want, "head {head}, {step} bytes per read");
        }
    }

    #[test]
    fn overlapping_tables_are_refused() {
        // L2 tables at 1024 and 1032 (overlapping), or one inside the L1.
        for l1 in [[1024u64, 1032], [1024, 512]] {
            let b = image(64 << 10, &l1, 2048);
            let e = run(&b, b.len(), 4096).unwrap_err().to_string();
            assert!(e.contains("overlap"), "{e}");
        }
    }

    #[test]
    fn too_many_pending_entries_are_refused_naming_the_limit() {
        // One L2 table per 32 KiB of a 16 GiB image, all far ahead in the file.
        let n = MAX_PENDING as u64 + 1;
        let l1: Vec<u64> = (0..n).map(|i| (1 << 30) + i * 512).collect();
        let b = image(n * (32 << 10), &l1, 512 + 8 * n as usize);
        let e = run(&b, b.len(), 1 << 20).unwrap_err().to_string();
        assert!(e.contains(&format!("more than {MAX_PENDING}")), "{e}");
    }
}

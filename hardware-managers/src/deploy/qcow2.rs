//! A qcow2 image decoded in one sequential pass, in bounded memory.
//!
//! IPA downloads a qcow2 into the ramdisk's RAM and runs `qemu-img convert`; a qcow2 bigger
//! than the ramdisk's free memory fails. Here the image streams once: the header comes
//! first, the L1 table names where the L2 tables are, each L2 table names where its data
//! clusters are, and every data cluster is written to its guest offset as it passes. Memory
//! is the window being read plus one pending entry per data cluster whose L2 table has been
//! seen but whose bytes have not (16 bytes each: 32 MiB of bookkeeping for 128 GiB of
//! allocated 64 KiB clusters). qemu-img (`convert`, `create`) always writes an L2 table
//! before the clusters it maps, so every image it makes streams; an image whose table points
//! backwards (at bytes already gone by) is refused with what to do, never written half.
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
    L1,
    /// An L2 table and the guest offset its first entry maps.
    L2 {
        guest: u64,
    },
    /// A data cluster for guest offset `guest`.
    Data {
        guest: u64,
    },
    /// A compressed cluster of `len` bytes for guest offset `guest`.
    Compressed {
        guest: u64,
        len: u64,
    },
}

const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;

/// Decode the whole image from `input` (positioned at its first byte; `head` holds bytes
/// already read from it, at least the header cluster or the whole file when smaller).
/// Returns the header and the stream bytes consumed. Unallocated and zero clusters are not
/// written: the caller zeroes what no cluster covered.
pub fn decode(
    head: Vec<u8>,
    input: &mut dyn Read,
    sink: &mut dyn ClusterSink,
) -> Result<(Header, u64), Qcow2Error> {
    let header = parse_header(&head)?;
    let cs = header.cluster_size;
    let mut items: BTreeMap<u64, Item> = BTreeMap::new();
    let l1_len = header.l1_entries * 8;
    if l1_len > 64 << 20 {
        return Err(Qcow2Error::Refused(format!(
            "an L1 table of {l1_len} bytes is too large"
        )));
    }
    items.insert(header.l1_offset, Item::L1);
    // The window: bytes of the file from `win_start`.
    let mut window = head;
    let mut win_start = 0u64;
    let mut eof = false;
    let mut chunk = vec![0u8; 4 << 20];
    let mut scratch = vec![0u8; cs as usize];
    loop {
        // Handle every item fully inside the window, lowest offset first.
        while let Some((&at, &item)) = items.iter().next() {
            if at < win_start {
                return Err(Qcow2Error::Refused(format!(
                    "its tables point backwards (offset {at} after reading past it): the image cannot be streamed; rewrite it with `qemu-img convert -O qcow2` or serve it raw"
                )));
            }
            let len = match item {
                Item::L1 => l1_len,
                Item::L2 { .. } => cs,
                Item::Data { .. } => cs,
                Item::Compressed { len, .. } => len,
            };
            let end = at + len;
            if end > win_start + window.len() as u64 {
                if eof {
                    // A data cluster may be cut short at the end of the file by tools that
                    // do not pad the last cluster.
                    if at < win_start + window.len() as u64 {
                        let from = (at - win_start) as usize;
                        match item {
                            Item::Data { guest } => {
                                write_data(sink, &header, guest, &window[from..])?;
                                items.remove(&at);
                                continue;
                            }
                            // A compressed cluster's length is rounded up to whole sectors;
                            // the file need not hold the rounding.
                            Item::Compressed { guest, .. } => {
                                let n = inflate(&header, &window[from..], &mut scratch)?;
                                write_data(sink, &header, guest, &scratch[..n])?;
                                items.remove(&at);
                                continue;
                            }
                            _ => {}
                        }
                    }
                    return Err(Qcow2Error::Damaged(format!(
                        "the file ends before offset {end} that its tables refer to"
                    )));
                }
                break;
            }
            items.remove(&at);
            let from = (at - win_start) as usize;
            let bytes = &window[from..from + len as usize];
            match item {
                Item::L1 => {
                    let per_l2 = cs / 8 * cs;
                    for i in 0..header.l1_entries {
                        let e = be64(bytes, (i * 8) as usize) & OFFSET_MASK;
                        if e != 0 {
                            insert(&mut items, e, Item::L2 { guest: i * per_l2 })?;
                        }
                    }
                }
                Item::L2 { guest } => {
                    for i in 0..cs / 8 {
                        let g = guest + i * cs;
                        if g >= header.size {
                            break;
                        }
                        let e = be64(bytes, (i * 8) as usize);
                        if e & (1 << 62) != 0 {
                            let x = 62 - (cs.trailing_zeros() as u64 - 8);
                            let off = e & ((1u64 << x) - 1);
                            let sectors = (e >> x) & ((1u64 << (cs.trailing_zeros() - 8)) - 1);
                            let clen = (sectors + 1) * 512 - (off & 511);
                            insert(
                                &mut items,
                                off,
                                Item::Compressed {
                                    guest: g,
                                    len: clen,
                                },
                            )?;
                        } else {
                            let off = e & OFFSET_MASK;
                            // Bit 0 = reads as zero (v3); unallocated reads as zero (no
                            // backing file): both are left to the caller's zeroing.
                            if off != 0 && e & 1 == 0 {
                                insert(&mut items, off, Item::Data { guest: g })?;
                            }
                        }
                    }
                }
                Item::Data { guest } => write_data(sink, &header, guest, bytes)?,
                Item::Compressed { guest, .. } => {
                    let n = inflate(&header, bytes, &mut scratch)?;
                    write_data(sink, &header, guest, &scratch[..n])?;
                }
            }
        }
        if eof {
            return Ok((header, win_start + window.len() as u64));
        }
        // Drop what no pending item needs, then read more.
        let keep_from = items
            .keys()
            .next()
            .copied()
            .unwrap_or(u64::MAX)
            .min(win_start + window.len() as u64);
        let drop = (keep_from - win_start) as usize;
        window.drain(..drop);
        win_start += drop as u64;
        let n = read_some(input, &mut chunk)?;
        if n == 0 {
            eof = true;
        } else {
            window.extend_from_slice(&chunk[..n]);
        }
        sink.progress(win_start + window.len() as u64)
            .map_err(Qcow2Error::Sink)?;
        if items.is_empty() && !eof {
            // Nothing left to find: the rest is refcounts and padding; the caller reads it
            // for the digest.
            return Ok((header, win_start + window.len() as u64));
        }
    }
}

fn insert(items: &mut BTreeMap<u64, Item>, at: u64, item: Item) -> Result<(), Qcow2Error> {
    if items.insert(at, item).is_some() {
        return Err(Qcow2Error::Refused(format!(
            "two table entries point at offset {at}: the image is damaged or crafted"
        )));
    }
    Ok(())
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
}

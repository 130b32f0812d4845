//! The qcow2 decoder's bookkeeping stays under `qcow2::MAX_BOOKKEEPING_BYTES` whatever the
//! image: a 1 TiB image made by qemu-img with every L1 entry and L2 table allocated, and the
//! worst case its limits allow (built on the fly: `MAX_PENDING` entries pending at once,
//! 2 MiB clusters, a window held full by a zstd-compressed cluster being inflated); one
//! pending entry more is refused, naming the limit. Memory is counted, not estimated: a
//! global allocator wrapper keeps the live bytes of the decoding thread, and the peak from
//! before the image's head is read until `decode` returns is compared with the bound.
//!
//! Also: what qemu-img makes (plain, deflate, zstd, preallocated; 512 B, 64 KiB and 2 MiB
//! clusters) decodes to exactly the raw image, every write inside the virtual size.
//!
//! Needs qemu-img and qemu-io (Debian qemu-utils) for the qemu-made images; skips those
//! without them.

use crate::common;

use anyhow::{bail, ensure, Context, Result};
use rivet_hardware_managers::deploy::qcow2::{
    self, ClusterSink, Qcow2Error, MAX_BOOKKEEPING_BYTES, MAX_CLUSTER_SIZE, MAX_PENDING,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Read;
use std::path::Path;

const MIB: u64 = 1 << 20;
const TIB: u64 = 1 << 40;

/// Counts the live heap bytes of each thread (so the test harness's other threads do not
/// disturb a measurement) and their peak.
struct Counting;

thread_local! {
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn note(delta: i64) {
    let _ = LIVE.try_with(|live| {
        let v = live.get() + delta;
        live.set(v);
        let _ = PEAK.try_with(|peak| {
            if v > peak.get() {
                peak.set(v)
            }
        });
    });
}

// SAFETY: every call is passed to System unchanged; only counters are updated besides.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(layout.size() as i64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(layout.size() as i64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        note(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Counted as a copying realloc: the new block is live before the old one goes.
            note(new_size as i64);
            note(-(layout.size() as i64));
        }
        p
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// `f`'s result and the peak of this thread's live heap bytes while it ran, above what was
/// live before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    let peak = PEAK.with(Cell::get) - base;
    (r, peak.max(0) as u64)
}

/// Reads at most `max` bytes per call, as a network stream or a decompressor hands them.
struct Trickle<R> {
    inner: R,
    max: usize,
}

impl<R: Read> Read for Trickle<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.max);
        self.inner.read(&mut buf[..n])
    }
}

/// Sees each write: guest offset, bytes.
type Check<'a> = &'a mut dyn FnMut(u64, &[u8]) -> Result<(), String>;
/// What `decode` returns.
type Decoded = Result<(qcow2::Header, u64), Qcow2Error>;

/// Records nothing but counts (it must not allocate, or it would be measured): checks that
/// every write lies inside the virtual size and hands the bytes to `check`.
struct Checking<'a> {
    size: u64,
    writes: u64,
    bytes: u64,
    check: Check<'a>,
}

impl ClusterSink for Checking<'_> {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        if offset + data.len() as u64 > self.size {
            return Err(format!(
                "write of {} bytes at {offset} is past the virtual size {}",
                data.len(),
                self.size
            ));
        }
        self.writes += 1;
        self.bytes += data.len() as u64;
        (self.check)(offset, data)
    }

    fn progress(&mut self, _consumed: u64) -> Result<(), String> {
        Ok(())
    }
}

/// Decode `file` as the deploy step does (a 128 KiB head first, then the stream), 64 KiB per
/// read; returns the result and the peak bookkeeping, head included.
fn decode_file(file: &Path, size: u64, check: Check<'_>) -> Result<(Decoded, u64, u64)> {
    let f = std::fs::File::open(file).with_context(|| file.display().to_string())?;
    let mut input = Trickle {
        inner: f,
        max: 64 << 10,
    };
    let mut sink = Checking {
        size,
        writes: 0,
        bytes: 0,
        check,
    };
    let (r, peak) = peak_of(|| {
        let mut head = vec![0u8; 128 << 10];
        let mut n = 0;
        while n < head.len() {
            match input.read(&mut head[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) => return Err(Qcow2Error::Read(e)),
            }
        }
        head.truncate(n);
        qcow2::decode(head, &mut input, &mut sink)
    });
    Ok((r, peak, sink.bytes))
}

fn under_bound(what: &str, peak: u64) {
    eprintln!(
        "{what}: peak bookkeeping {peak} bytes ({:.1} MiB), bound {} MiB",
        peak as f64 / MIB as f64,
        MAX_BOOKKEEPING_BYTES >> 20
    );
    assert!(
        peak < MAX_BOOKKEEPING_BYTES,
        "{what}: the decoder held {peak} bytes, over its stated bound of {MAX_BOOKKEEPING_BYTES}"
    );
}

/// 1 TiB, qemu-img's own 64 KiB clusters, every L2 table allocated (a zero write over the
/// whole disk: 2048 L2 tables, the L1 entirely dense), then 64 patterned writes spread over
/// the disk whose clusters land after all the tables: all 2048 L2 tables are pending once the
/// L1 has gone by, then all 64 data clusters.
#[test]
fn qemu_image_of_1_tib_with_every_table_allocated_stays_under_the_bound() -> Result<()> {
    if !common::require(false, &["qemu-img", "qemu-io"]) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let img = dir.path().join("dense.qcow2");
    let img_s = img.to_str().context("path")?;
    common::run("qemu-img", &["create", "-q", "-f", "qcow2", img_s, "1T"])?;
    // Unaligned on purpose: a write may straddle two clusters.
    let spots: Vec<u64> = (0..64u64)
        .map(|i| i * (TIB / 64) + i * 4096 + 512 + (i % 3) * 65000)
        .collect();
    let mut cmds = vec!["write -q -n -z 0 1T".to_string()];
    cmds.extend(spots.iter().map(|o| format!("write -q -P 0xab {o} 1536")));
    let mut args = vec!["-t", "unsafe", "-f", "qcow2"];
    for c in &cmds {
        args.extend(["-c", c.as_str()]);
    }
    args.push(img_s);
    common::run("qemu-io", &args)?;
    let map = common::run("qemu-img", &["info", "--output=json", img_s])?;
    ensure!(map.contains("\"virtual-size\": 1099511627776"), "{map}");

    let mut marked = 0u64;
    let mut check = |offset: u64, data: &[u8]| -> Result<(), String> {
        for (i, b) in data.iter().enumerate() {
            let at = offset + i as u64;
            let i = spots.partition_point(|s| *s <= at);
            let want = if i > 0 && at < spots[i - 1] + 1536 {
                0xab
            } else {
                0
            };
            if *b != want {
                return Err(format!("byte {at} is {b:#x}, expected {want:#x}"));
            }
            marked += u64::from(want == 0xab);
        }
        Ok(())
    };
    let (r, peak, bytes) = decode_file(&img, TIB, &mut check)?;
    let (header, _) = r?;
    assert_eq!(header.size, TIB);
    assert_eq!(marked, 64 * 1536, "every patterned byte landed, once");
    assert!(
        bytes <= 128 * 64 * 1024,
        "only the data clusters were written: {bytes}"
    );
    under_bound("1 TiB qemu image, every table allocated", peak);
    Ok(())
}

/// A qcow2 image made on the fly, 512-byte sector by sector, for what qemu-img cannot make
/// quickly.
struct Synth<F: FnMut(u64, &mut [u8; 512])> {
    pos: u64,
    len: u64,
    sector: F,
}

impl<F: FnMut(u64, &mut [u8; 512])> Read for Synth<F> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // 64 KiB at most, whole sectors only (pos stays aligned).
        let n = (buf.len().min(64 << 10) as u64 / 512 * 512).min(self.len - self.pos) as usize;
        let mut s = [0u8; 512];
        for chunk in buf[..n].chunks_mut(512) {
            s.fill(0);
            (self.sector)(self.pos / 512, &mut s);
            chunk.copy_from_slice(&s[..chunk.len()]);
            self.pos += chunk.len() as u64;
        }
        Ok(n)
    }
}

fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_be_bytes());
}

fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_be_bytes());
}

/// The worst case the limits allow, made on the fly: 2 MiB clusters (the largest), a 1 TiB
/// image, its L2 table(s) naming `data` data clusters none of which continues the one before
/// in the file (so none joins a run: `MAX_PENDING` entries at once), then a zstd-compressed
/// cluster whose descriptor claims the most sectors (4 MiB: the window holds two clusters
/// plus a read) inflated while all of them are pending. The data clusters themselves are
/// past the end of the stream: the decode ends refusing that, after the peak.
fn worst_case(data: u64, descending: bool) -> (Decoded, u64) {
    let cs = MAX_CLUSTER_SIZE;
    let per_l2 = cs / 8;
    let l2s = (data + 1).div_ceil(per_l2);
    // A cluster that zstd compresses a little (tables and literals both used).
    let mut plain = vec![0u8; cs as usize];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for (i, b) in plain.iter_mut().enumerate() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = if i % 3 == 0 {
            b"qcow2 "[i % 6]
        } else {
            (x as u8) & 0x3f
        };
    }
    let zstd =
        ruzstd::encoding::compress_to_vec(&plain[..], ruzstd::encoding::CompressionLevel::Fastest);
    assert!(zstd.len() as u64 <= 2 * cs);
    let z_at = (2 + l2s) * cs; // after header, L1 and the L2 tables
    let data_at = z_at + 2 * cs;
    let sectors_bits = cs.trailing_zeros() - 8;
    let x_bits = 62 - sectors_bits;
    let compressed = (1u64 << 62) | (((1u64 << sectors_bits) - 1) << x_bits) | z_at;
    let entry = |k: u64| -> u64 {
        // Entry k of all L2 tables together: 0 the compressed cluster, then the data.
        if k == 0 {
            compressed
        } else if k <= data {
            // Every other cluster in the file, so no two are contiguous there.
            let slot = if descending { data - k } else { k };
            data_at + 2 * slot * cs
        } else {
            0
        }
    };
    let size = TIB;
    let total = z_at + 2 * cs;
    let sector = move |s: u64, out: &mut [u8; 512]| {
        let at = s * 512;
        if at == 0 {
            out[..4].copy_from_slice(qcow2::MAGIC);
            put32(out, 4, 3);
            put32(out, 20, cs.trailing_zeros());
            put64(out, 24, size);
            put32(out, 36, (size / (per_l2 * cs)) as u32);
            put64(out, 40, cs);
            put64(out, 72, 0x8); // compression type field present
            put32(out, 100, 112);
            out[104] = 1; // zstd
        } else if (cs..2 * cs).contains(&at) {
            for (i, e) in out.chunks_mut(8).enumerate() {
                let l1 = (at - cs) / 8 + i as u64;
                if l1 < l2s {
                    e.copy_from_slice(&((2 + l1) * cs).to_be_bytes());
                }
            }
        } else if (2 * cs..z_at).contains(&at) {
            for (i, e) in out.chunks_mut(8).enumerate() {
                e.copy_from_slice(&entry((at - 2 * cs) / 8 + i as u64).to_be_bytes());
            }
        } else if at >= z_at {
            let from = (at - z_at) as usize;
            if from < zstd.len() {
                let n = (zstd.len() - from).min(512);
                out[..n].copy_from_slice(&zstd[from..from + n]);
            }
        }
    };
    let mut input = Synth {
        pos: 0,
        len: total,
        sector,
    };
    let mut check = |offset: u64, data: &[u8]| -> Result<(), String> {
        if offset != 0 || data != plain.as_slice() {
            return Err(format!(
                "unexpected write of {} bytes at {offset}",
                data.len()
            ));
        }
        Ok(())
    };
    let mut sink = Checking {
        size,
        writes: 0,
        bytes: 0,
        check: &mut check,
    };
    peak_of(|| {
        let mut head = vec![0u8; 128 << 10];
        let n = input.read(&mut head).unwrap_or(0);
        head.truncate(n);
        qcow2::decode(head, &mut input, &mut sink)
    })
}

#[test]
fn worst_case_the_limits_allow_stays_under_the_bound() {
    // The compressed cluster and MAX_PENDING - 1 data clusters: exactly the limit.
    for descending in [false, true] {
        let (r, peak) = worst_case(MAX_PENDING as u64 - 1, descending);
        let e = r.expect_err("the data clusters are past the end");
        assert!(
            e.to_string().contains("the file ends before"),
            "the decode got to the end: {e}"
        );
        under_bound(
            &format!(
                "worst case, {MAX_PENDING} pending entries ({})",
                if descending {
                    "descending"
                } else {
                    "ascending"
                }
            ),
            peak,
        );
    }
}

#[test]
fn one_pending_entry_more_is_refused_naming_the_limit() {
    let (r, peak) = worst_case(MAX_PENDING as u64, false);
    let e = r.expect_err("over the limit").to_string();
    assert!(e.contains(&MAX_PENDING.to_string()), "{e}");
    assert!(
        e.contains(&format!("{} MiB", MAX_BOOKKEEPING_BYTES >> 20)),
        "{e}"
    );
    assert!(e.contains("qemu-img convert"), "{e}");
    under_bound("refused at the limit", peak);
}

/// Bytes with runs of pattern, zeros and holes; not a multiple of any cluster size.
fn raw_image(len: usize) -> Vec<u8> {
    let mut raw = vec![0u8; len];
    let mut x = 7u64;
    for (i, b) in raw.iter_mut().enumerate() {
        let region = i >> 17; // 128 KiB regions
        if region % 3 != 1 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *b = if region % 3 == 0 {
                (x >> 59) as u8
            } else {
                (x >> 33) as u8
            };
        }
    }
    raw
}

/// What qemu-img makes decodes to exactly the raw image.
#[test]
fn qemu_images_decode_to_the_raw_bytes() -> Result<()> {
    if !common::require(false, &["qemu-img"]) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let len = 6 * MIB as usize + 3 * 512;
    let raw = raw_image(len);
    let raw_path = dir.path().join("raw.img");
    std::fs::write(&raw_path, &raw)?;
    let raw_s = raw_path.to_str().context("path")?;
    let cases: &[(&str, &[&str])] = &[
        ("plain", &[]),
        ("512", &["-o", "cluster_size=512"]),
        ("2m", &["-o", "cluster_size=2M"]),
        ("v2", &["-o", "compat=0.10"]),
        (
            "prealloc",
            &["-o", "preallocation=metadata,cluster_size=4k"],
        ),
        ("deflate", &["-c"]),
        ("deflate-512", &["-c", "-o", "cluster_size=512"]),
        ("zstd", &["-c", "-o", "compression_type=zstd"]),
        (
            "zstd-2m",
            &["-c", "-o", "compression_type=zstd,cluster_size=2M"],
        ),
    ];
    for (name, opts) in cases {
        let img = dir.path().join(format!("{name}.qcow2"));
        let img_s = img.to_str().context("path")?;
        let mut args = vec!["convert", "-f", "raw", "-O", "qcow2"];
        args.extend_from_slice(opts);
        args.extend([raw_s, img_s]);
        common::run("qemu-img", &args)?;
        let mut disk = vec![0u8; len];
        let mut check = |offset: u64, data: &[u8]| -> Result<(), String> {
            disk[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            Ok(())
        };
        let (r, peak, _) = decode_file(&img, len as u64, &mut check)?;
        let (header, consumed) = r.map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        ensure!(header.size == len as u64, "{name}: size {}", header.size);
        ensure!(consumed > 0, "{name}");
        if disk != raw {
            let at = disk.iter().zip(&raw).position(|(a, b)| a != b);
            bail!("{name}: decoded bytes differ from the raw image at {at:?}");
        }
        under_bound(name, peak);
    }
    Ok(())
}

//! A qcow2 image from arbitrary bytes, streamed as the deploy step streams one: the first
//! byte chooses how much arrives as the head and how much each later read returns.
//! Properties: nothing panics or runs away (time and memory are the decoder's bound); an
//! accepted header is within the documented limits; every cluster written lies inside the
//! virtual size and no guest byte is written twice; a refusal is a short message.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rivet_hardware_managers::deploy::qcow2::{
    self, ClusterSink, MAX_CLUSTER_SIZE, MAX_L1_BYTES, MIN_CLUSTER_SIZE,
};
use std::collections::BTreeMap;
use std::io::Read;

/// The disk the sink stands for: writes past it are refused, as a real disk refuses them.
const DISK: u64 = 256 << 20;

struct Sink {
    size: u64,
    /// Written guest ranges, start -> end.
    written: BTreeMap<u64, u64>,
    consumed: u64,
    input_len: u64,
}

impl ClusterSink for Sink {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        let end = offset + data.len() as u64;
        assert!(
            end <= self.size,
            "write [{offset}, {end}) past the virtual size {}",
            self.size
        );
        if end > DISK {
            return Err(format!("write at {offset} is past the end of the disk"));
        }
        if data.is_empty() {
            return Ok(());
        }
        if let Some((&s, &e)) = self.written.range(..end).next_back() {
            assert!(
                e <= offset,
                "guest bytes [{offset}, {end}) written twice (first [{s}, {e}))"
            );
        }
        self.written.insert(offset, end);
        Ok(())
    }

    fn progress(&mut self, consumed: u64) -> Result<(), String> {
        assert!(consumed >= self.consumed, "progress went backwards");
        assert!(consumed <= self.input_len, "consumed more than the stream");
        self.consumed = consumed;
        Ok(())
    }
}

/// Hands out at most `max` bytes per read.
struct Trickle<'a> {
    data: &'a [u8],
    max: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.max).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn check_header(h: &qcow2::Header) {
    assert!(h.version == 2 || h.version == 3);
    assert!(h.cluster_size.is_power_of_two());
    assert!((MIN_CLUSTER_SIZE..=MAX_CLUSTER_SIZE).contains(&h.cluster_size));
    assert!(h.l1_table_bytes() <= MAX_L1_BYTES);
    // The L1 table maps the whole virtual size.
    let cs = u128::from(h.cluster_size);
    assert!(u128::from(h.l1_table_bytes() / 8) * (cs / 8) * cs >= u128::from(h.size));
}

fn check_error(e: &qcow2::Qcow2Error) {
    let m = e.to_string();
    assert!(!m.is_empty());
    assert!(m.len() <= 1024, "error message of {} bytes", m.len());
}

fuzz_target!(|data: &[u8]| {
    let Some((&how, image)) = data.split_first() else {
        return;
    };
    let head_len = match how & 3 {
        0 => image.len(),
        1 => 512,
        2 => 4096,
        _ => 104 + usize::from((how >> 2) & 7) * 7,
    }
    .min(image.len());
    let read_max = 1usize << (2 * ((how >> 5) & 7));
    let (head, rest) = image.split_at(head_len);

    let parsed = qcow2::parse_header(head);
    match &parsed {
        Ok(h) => check_header(h),
        Err(e) => check_error(e),
    }
    let mut sink = Sink {
        size: parsed.as_ref().map(|h| h.size).unwrap_or(0),
        written: BTreeMap::new(),
        consumed: 0,
        input_len: image.len() as u64,
    };
    let mut input = Trickle {
        data: rest,
        max: read_max,
    };
    match qcow2::decode(head.to_vec(), &mut input, &mut sink) {
        Ok((h, consumed)) => {
            assert_eq!(Some(&h), parsed.as_ref().ok(), "decode read another header");
            assert!(consumed >= head_len as u64 && consumed <= image.len() as u64);
        }
        Err(e) => {
            check_error(&e);
            if let Err(p) = &parsed {
                assert_eq!(e.to_string(), p.to_string(), "decode refused differently");
            }
        }
    }
});

//! A zstd stream decoded to its end: every frame in turn, skippable frames skipped.
//!
//! `pzstd`, `zstd -T0` with some options and plain concatenation of `.zst` files all make
//! streams of several frames, and the zstd format says a decoder reads them all. ruzstd's
//! streaming decoder stops after one frame (its own docs say callers must loop), which once
//! let a multi-frame image reach `active` with only its first frame on the disk; this reader
//! is that loop. One frame decoder is reused across frames, so its window buffers are
//! allocated once.

use ruzstd::decoding::{FrameDecoder, StreamingDecoder};
use std::io::{Error, ErrorKind, Read};

const ZSTD_MAGIC: u32 = 0xFD2F_B528;

/// The source with up to 4 bytes put back in front (a frame's magic, read to decide).
pub struct Src<R> {
    back: [u8; 4],
    back_len: usize,
    back_pos: usize,
    inner: R,
}

impl<R: Read> Read for Src<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.back_pos < self.back_len {
            let n = buf.len().min(self.back_len - self.back_pos);
            buf[..n].copy_from_slice(&self.back[self.back_pos..self.back_pos + n]);
            self.back_pos += n;
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

enum State<R: Read> {
    /// Between frames.
    Between(Src<R>, Box<FrameDecoder>),
    /// Inside a frame.
    Frame(Box<StreamingDecoder<Src<R>, Box<FrameDecoder>>>),
    /// The stream ended cleanly, or an error was returned.
    Done,
}

/// Decodes every frame of a zstd stream.
pub struct MultiFrameDecoder<R: Read> {
    state: State<R>,
    frames: u64,
}

impl<R: Read> MultiFrameDecoder<R> {
    /// A decoder over `inner`, positioned at the stream's first byte.
    pub fn new(inner: R) -> MultiFrameDecoder<R> {
        let src = Src {
            back: [0; 4],
            back_len: 0,
            back_pos: 0,
            inner,
        };
        MultiFrameDecoder {
            state: State::Between(src, Box::new(FrameDecoder::new())),
            frames: 0,
        }
    }

    /// Data frames decoded so far (begun).
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// At a frame boundary: skip skippable frames, start the next data frame, or end.
    /// `Ok(false)` at a clean end of stream.
    fn next_frame(&mut self) -> std::io::Result<bool> {
        loop {
            let State::Between(mut src, decoder) = std::mem::replace(&mut self.state, State::Done)
            else {
                return Ok(false);
            };
            let mut magic = [0u8; 4];
            let mut got = 0;
            while got < 4 {
                match src.read(&mut magic[got..]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if got == 0 {
                return Ok(false);
            }
            if got < 4 {
                return Err(Error::new(
                    ErrorKind::InvalidData,
                    format!("the zstd stream ends with {got} stray bytes after its last frame"),
                ));
            }
            let m = u32::from_le_bytes(magic);
            if (0x184D_2A50..=0x184D_2A5F).contains(&m) {
                let mut len = [0u8; 4];
                src.read_exact(&mut len).map_err(|e| {
                    Error::new(
                        e.kind(),
                        format!("a skippable zstd frame is cut short: {e}"),
                    )
                })?;
                let len = u32::from_le_bytes(len) as u64;
                let skipped = std::io::copy(&mut (&mut src).take(len), &mut std::io::sink())?;
                if skipped < len {
                    return Err(Error::new(
                        ErrorKind::UnexpectedEof,
                        "a skippable zstd frame is cut short",
                    ));
                }
                self.state = State::Between(src, decoder);
                continue;
            }
            if m != ZSTD_MAGIC {
                return Err(Error::new(
                    ErrorKind::InvalidData,
                    format!(
                        "after zstd frame {} the stream holds {m:#010x}, which starts no zstd frame",
                        self.frames
                    ),
                ));
            }
            src.back = magic;
            src.back_len = 4;
            src.back_pos = 0;
            // `init` reads the frame header (the magic put back first) and reuses the
            // decoder's buffers; its window is bounded by ruzstd's default maximum, whatever
            // the header asks for.
            let s = StreamingDecoder::new_with_decoder(src, decoder).map_err(|e| {
                Error::new(
                    ErrorKind::InvalidData,
                    format!("zstd frame {}: {e}", self.frames + 1),
                )
            })?;
            self.frames += 1;
            self.state = State::Frame(Box::new(s));
            return Ok(true);
        }
    }
}

impl<R: Read> Read for MultiFrameDecoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match &mut self.state {
                State::Done => return Ok(0),
                State::Frame(s) => {
                    let n = s.read(buf)?;
                    if n > 0 {
                        return Ok(n);
                    }
                    // The frame ended: back to the boundary with the source and decoder.
                    let State::Frame(s) = std::mem::replace(&mut self.state, State::Done) else {
                        return Ok(0);
                    };
                    let (src, decoder) = s.into_parts();
                    self.state = State::Between(src, decoder);
                }
                State::Between(..) => {
                    if !self.next_frame()? {
                        self.state = State::Done;
                        return Ok(0);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A one-frame zstd stream of `data`, made by ruzstd's own (uncompressed-block) encoder.
    fn frame(data: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Uncompressed)
    }

    fn decode(stream: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        MultiFrameDecoder::new(stream).read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn every_frame_is_decoded_and_skippable_frames_skipped() {
        let a = vec![1u8; 300_000];
        let b = vec![2u8; 5];
        let mut stream = frame(&a);
        // A skippable frame between the two (pzstd writes one ahead of each frame).
        stream.extend_from_slice(&0x184D_2A5Au32.to_le_bytes());
        stream.extend_from_slice(&3u32.to_le_bytes());
        stream.extend_from_slice(b"xyz");
        stream.extend_from_slice(&frame(&b));
        let out = decode(&stream).unwrap();
        assert_eq!(out.len(), a.len() + b.len());
        assert_eq!(&out[..a.len()], &a[..]);
        assert_eq!(&out[a.len()..], &b[..]);
        let mut d = MultiFrameDecoder::new(&stream[..]);
        d.read_to_end(&mut Vec::new()).unwrap();
        assert_eq!(d.frames(), 2);
    }

    #[test]
    fn trailing_garbage_and_cut_frames_are_errors() {
        let mut stream = frame(b"hello");
        stream.extend_from_slice(b"junk!");
        let e = decode(&stream).unwrap_err();
        assert!(e.to_string().contains("starts no zstd frame"), "{e}");
        let mut stream = frame(b"hello");
        stream.extend_from_slice(b"ab");
        assert!(decode(&stream).unwrap_err().to_string().contains("stray"));
        let mut cut = frame(&[7u8; 100_000]);
        cut.truncate(cut.len() - 10);
        assert!(decode(&cut).is_err());
        assert_eq!(decode(&[]).unwrap(), Vec::<u8>::new());
    }
}

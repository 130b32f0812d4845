//! What a failed operation's history event quotes from the node's serial console.
//!
//! The console is captured by rivetd's console hub (controller crate, above this one), so the
//! conductor reaches it through [`ConsoleTail`], which the controller installs with
//! [`Conductor::set_console_tail`]; without one (tests, a conductor alone) nothing is quoted.
//! When a deploy, cleaning, inspection, rescue or servicing fails, the failure's history event
//! ends with the console's last [`TAIL_BYTES`], ANSI escapes and control characters removed.

use super::Conductor;
use async_trait::async_trait;
use std::sync::Arc;

/// Bytes of console quoted in a failure event.
pub const TAIL_BYTES: usize = 4096;

/// Reads the newest bytes a node's console captured.
#[async_trait]
pub trait ConsoleTail: Send + Sync {
    /// Up to `max` of the newest captured bytes of `node_uuid`'s console; `None` when it has
    /// no capture.
    async fn tail(&self, node_uuid: &str, max: usize) -> Option<Vec<u8>>;
}

impl Conductor {
    /// Install the console capture failure events quote (once; later calls are ignored).
    pub fn set_console_tail(&self, tail: Arc<dyn ConsoleTail>) {
        let _ = self.console_tail.set(tail);
    }

    /// `\nconsole (last N bytes):\n…` for a failure event of `node_uuid`, or "" without a
    /// capture.
    pub(crate) async fn console_quote(&self, node_uuid: &str) -> String {
        let Some(reader) = self.console_tail.get() else {
            return String::new();
        };
        let Some(bytes) = reader.tail(node_uuid, TAIL_BYTES).await else {
            return String::new();
        };
        let text = strip_ansi(&bytes);
        // The history reads a transition's cause up to its last "; during ": console text
        // must not forge one.
        let text = text.replace("; during ", ";  during ");
        let text = text.trim_end();
        if text.is_empty() {
            return String::new();
        }
        format!("\nconsole (last {} bytes):\n{text}", bytes.len())
    }
}

/// Console bytes as plain text: ANSI escape sequences (CSI `ESC [ … final`, OSC `ESC ] …
/// BEL|ESC \`, two-byte `ESC x`) and control characters other than newline and tab removed,
/// carriage returns dropped, invalid UTF-8 replaced.
pub fn strip_ansi(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == 0x1b {
            match bytes.get(i + 1) {
                Some(b'[') => {
                    // Parameters and intermediates, then one final byte 0x40..=0x7e.
                    i += 2;
                    while i < bytes.len() && !(0x40..=0x7e).contains(&bytes[i]) {
                        i += 1;
                    }
                    i += 1;
                }
                Some(b']') => {
                    i += 2;
                    while i < bytes.len() {
                        if bytes[i] == 0x07 {
                            i += 1;
                            break;
                        }
                        if bytes[i] == 0x1b && bytes.get(i + 1) == Some(&b'\\') {
                            i += 2;
                            break;
                        }
                        i += 1;
                    }
                }
                Some(_) => i += 2,
                None => i += 1,
            }
            continue;
        }
        if b == b'\n' || b == b'\t' || b >= 0x20 && b != 0x7f {
            out.push(b);
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::strip_ansi;

    #[test]
    fn escapes_and_controls_are_removed() {
        let raw = b"\x1b[2J\x1b[1;32mOK\x1b[0m boot\r\n\x1b]0;title\x07login: \x00\x07\xff\x1bc!";
        assert_eq!(strip_ansi(raw), "OK boot\nlogin: \u{fffd}!");
        assert_eq!(strip_ansi(b"\x1b[31"), "");
        assert_eq!(strip_ansi(b"tail\x1b"), "tail");
    }
}

//! ssh's escape character for the interactive console: `~` at the start of a line followed by
//! `.` leaves, `~t` takes the pen, `~?` lists them, `~~` sends one `~`; anything else after the
//! `~` is sent with it. Escapes are never sent to the node.

/// What the typed bytes mean.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Keystrokes for the node.
    Send(Vec<u8>),
    /// `~.`: end the session.
    Leave,
    /// `~t`: take the pen from whoever holds it.
    TakeOver,
    /// `~?`: print the escapes.
    Help,
}

/// The help text for `~?`.
pub const HELP: &str = "escapes (at the start of a line): ~. leave, ~t take the pen, ~~ send ~";

/// The escape state across reads (a `~` may end one read and its `.` start the next).
pub struct Escape {
    at_line_start: bool,
    after_tilde: bool,
}

impl Escape {
    /// The start of a session counts as the start of a line, as in ssh.
    pub fn new() -> Escape {
        Escape {
            at_line_start: true,
            after_tilde: false,
        }
    }

    /// Split one read of keystrokes into what to send and what to do; nothing after a
    /// `Leave` is returned.
    pub fn feed(&mut self, input: &[u8]) -> Vec<Action> {
        let mut out = Vec::new();
        let mut keys = Vec::new();
        for &b in input {
            if self.after_tilde {
                self.after_tilde = false;
                let act = match b {
                    b'.' => Some(Action::Leave),
                    b't' => Some(Action::TakeOver),
                    b'?' => Some(Action::Help),
                    b'~' => {
                        keys.push(b'~');
                        self.at_line_start = false;
                        None
                    }
                    _ => {
                        keys.extend_from_slice(&[b'~', b]);
                        self.at_line_start = is_eol(b);
                        None
                    }
                };
                if let Some(act) = act {
                    if !keys.is_empty() {
                        out.push(Action::Send(std::mem::take(&mut keys)));
                    }
                    let leave = act == Action::Leave;
                    out.push(act);
                    if leave {
                        return out;
                    }
                }
                continue;
            }
            if self.at_line_start && b == b'~' {
                self.after_tilde = true;
                continue;
            }
            keys.push(b);
            self.at_line_start = is_eol(b);
        }
        if !keys.is_empty() {
            out.push(Action::Send(keys));
        }
        out
    }
}

/// Enter sends `\r` in raw mode, `\n` from a pipe.
fn is_eol(b: u8) -> bool {
    b == b'\r' || b == b'\n'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(s: &str) -> Action {
        Action::Send(s.as_bytes().to_vec())
    }

    #[test]
    fn leaves_only_at_line_start() {
        let mut e = Escape::new();
        assert_eq!(e.feed(b"~."), vec![Action::Leave]);
        let mut e = Escape::new();
        assert_eq!(e.feed(b"ls ~.\r"), vec![send("ls ~.\r")]);
        assert_eq!(e.feed(b"~.rest"), vec![Action::Leave]);
    }

    #[test]
    fn escape_split_across_reads() {
        let mut e = Escape::new();
        assert_eq!(e.feed(b"echo hi\n~"), vec![send("echo hi\n")]);
        assert_eq!(e.feed(b"."), vec![Action::Leave]);
    }

    #[test]
    fn other_escapes() {
        let mut e = Escape::new();
        assert_eq!(e.feed(b"~~x"), vec![send("~x")]);
        let mut e = Escape::new();
        assert_eq!(e.feed(b"~ab"), vec![send("~ab")]);
        let mut e = Escape::new();
        assert_eq!(
            e.feed(b"a\r~tb\r~?"),
            vec![send("a\r"), Action::TakeOver, send("b\r"), Action::Help]
        );
    }
}

//! Raw terminal mode for the interactive console, restored when the guard drops: on a normal
//! exit, an error (`?` unwinds through it), a panic (unwinding) and the signals the session
//! catches (SIGTERM, SIGHUP end the loop, so the guard drops). Only SIGKILL leaves the
//! terminal raw (`stty sane` repairs it).

use anyhow::{Context, Result};
use nix::sys::termios::{self, SetArg, Termios};
use std::io::{IsTerminal, Stdin};

/// Stdin in raw mode until dropped.
pub struct RawMode {
    stdin: Stdin,
    saved: Termios,
}

impl RawMode {
    /// Put stdin into raw mode when it is a terminal; `None` when it is not (a pipe, a file):
    /// then keystrokes arrive line by line, as the caller's shell sends them.
    pub fn enter() -> Result<Option<RawMode>> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Ok(None);
        }
        let saved = termios::tcgetattr(&stdin).context("reading the terminal's mode")?;
        let mut raw = saved.clone();
        // Like ssh: no echo, no line editing, no signals from ^C/^Z (they go to the node),
        // no output processing (the console sends its own \r\n).
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(&stdin, SetArg::TCSAFLUSH, &raw)
            .context("putting the terminal into raw mode")?;
        Ok(Some(RawMode { stdin, saved }))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // Nothing else to do if this fails: the terminal is gone or was taken from us.
        let _ = termios::tcsetattr(&self.stdin, SetArg::TCSADRAIN, &self.saved);
    }
}

//! Who may type into a console: one writer at a time (the pen), many watchers.
//!
//! A viewer allowed to write (TCP viewers; WebSocket viewers whose role is admin or
//! operator) takes the free pen by typing. While another viewer holds it, typing is refused
//! — unless the holder has been silent for [`PEN_IDLE`], or the viewer takes over explicitly
//! (WebSocket `{"takeover": true}`). The pen is freed when its holder detaches or releases
//! it. Readers never hold it. Pure bookkeeping: the session asks before forwarding bytes.

use std::time::{Duration, Instant};

/// A silent holder loses the pen to the next viewer who types.
pub const PEN_IDLE: Duration = Duration::from_secs(60);

/// A viewer of a console.
pub type ViewerId = u64;

/// What happened to a viewer's keystrokes.
#[derive(Debug, PartialEq, Eq)]
pub enum Typed {
    /// Forward them; `true` when the viewer just took the free (or idle) pen.
    Forward(bool),
    /// Refused: the viewer may only watch.
    ReadOnly,
    /// Refused: this viewer holds the pen (named).
    HeldBy(String),
}

/// The pen of one console.
#[derive(Debug, Default)]
pub struct Pen {
    holder: Option<(ViewerId, String, Instant)>,
}

impl Pen {
    /// The holder's name, if any.
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_ref().map(|(_, n, _)| n.as_str())
    }

    /// `viewer` (named `name`, allowed to write or not) typed.
    pub fn typed(&mut self, viewer: ViewerId, name: &str, can_write: bool, now: Instant) -> Typed {
        if !can_write {
            return Typed::ReadOnly;
        }
        match &mut self.holder {
            Some((id, _, last)) if *id == viewer => {
                *last = now;
                Typed::Forward(false)
            }
            Some((_, holder, last)) if now.duration_since(*last) < PEN_IDLE => {
                Typed::HeldBy(holder.clone())
            }
            _ => {
                self.holder = Some((viewer, name.to_string(), now));
                Typed::Forward(true)
            }
        }
    }

    /// `viewer` takes the pen whoever holds it; false for a viewer that may only watch.
    pub fn take_over(
        &mut self,
        viewer: ViewerId,
        name: &str,
        can_write: bool,
        now: Instant,
    ) -> bool {
        if can_write {
            self.holder = Some((viewer, name.to_string(), now));
        }
        can_write
    }

    /// `viewer` leaves or gives the pen back; true when it held it.
    pub fn release(&mut self, viewer: ViewerId) -> bool {
        if self.holder.as_ref().is_some_and(|(id, _, _)| *id == viewer) {
            self.holder = None;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_writer_takeover_idle_and_readers() {
        let mut pen = Pen::default();
        let t0 = Instant::now();
        assert_eq!(pen.typed(9, "reader", false, t0), Typed::ReadOnly);
        assert_eq!(pen.holder(), None);
        assert_eq!(pen.typed(1, "a", true, t0), Typed::Forward(true));
        assert_eq!(pen.typed(1, "a", true, t0), Typed::Forward(false));
        assert_eq!(pen.typed(2, "b", true, t0), Typed::HeldBy("a".into()));
        assert!(!pen.take_over(9, "reader", false, t0));
        assert!(pen.take_over(2, "b", true, t0));
        assert_eq!(pen.typed(1, "a", true, t0), Typed::HeldBy("b".into()));
        // b falls silent: a's typing takes the pen back.
        let later = t0 + PEN_IDLE + Duration::from_secs(1);
        assert_eq!(pen.typed(1, "a", true, later), Typed::Forward(true));
        assert!(!pen.release(2));
        assert!(pen.release(1));
        assert_eq!(pen.holder(), None);
    }
}

//! The TCP port of each enabled console: the node's `driver_info.ipmi_terminal_port`, or
//! the first free port of `[console] port_range` (Ironic's `acquire_port`: not taken by
//! another console of this rivetd, and bindable on `socat_address`). The listener is bound
//! here, so "free" is decided by the kernel, not guessed.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;

/// Ports held by this rivetd's consoles.
#[derive(Default)]
pub struct PortBook {
    taken: Mutex<HashSet<u16>>,
}

/// A bound listener and its port (given back with [`PortBook::release`]).
pub struct Bound {
    /// The listener.
    pub listener: tokio::net::TcpListener,
    /// Its port.
    pub port: u16,
}

impl PortBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<u16>> {
        self.taken.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bind a listener on `addr`: on `fixed` when the node names its port, else on the
    /// `preferred` port (the one it had before a restart) or the first free one of `ranges`.
    /// The error is worded for `last_error`, as Ironic's.
    pub fn bind(
        &self,
        addr: IpAddr,
        fixed: Option<u16>,
        preferred: Option<u16>,
        ranges: &[std::ops::Range<u16>],
    ) -> Result<Bound, String> {
        let mut taken = self.lock();
        if let Some(port) = fixed {
            if taken.contains(&port) {
                return Err(format!(
                    "ipmi_terminal_port {port} is already the console port of another node on this host"
                ));
            }
            return match try_bind(addr, port) {
                Ok(listener) => {
                    taken.insert(port);
                    Ok(Bound { listener, port })
                }
                Err(e) => Err(format!(
                    "cannot listen on ipmi_terminal_port {port} of {addr}: {e}"
                )),
            };
        }
        let candidates = preferred
            .into_iter()
            .filter(|p| ranges.iter().any(|r| r.contains(p)))
            .chain(ranges.iter().flat_map(|r| r.clone()));
        for port in candidates {
            if port == 0 || taken.contains(&port) {
                continue;
            }
            if let Ok(listener) = try_bind(addr, port) {
                taken.insert(port);
                return Ok(Bound { listener, port });
            }
        }
        Err(format!(
            "Unable to allocate a free port on host {addr} for IPMI terminal, not enough free ports."
        ))
    }

    /// Give `port` back.
    pub fn release(&self, port: u16) {
        self.lock().remove(&port);
    }
}

fn try_bind(addr: IpAddr, port: u16) -> std::io::Result<tokio::net::TcpListener> {
    let l = std::net::TcpListener::bind(SocketAddr::new(addr, port))?;
    l.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(l)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_free_port_then_exhausted() {
        let book = PortBook::default();
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        // A port the kernel picks, then a one-port range over it.
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = probe.local_addr().unwrap().port();
        drop(probe);
        let range = [p..p + 1];
        let a = book.bind(lo, None, None, &range).expect("free");
        assert_eq!(a.port, p);
        let e = book.bind(lo, None, None, &range).err().unwrap();
        assert!(e.contains("not enough free ports"), "{e}");
        let e = book.bind(lo, Some(p), None, &range).err().unwrap();
        assert!(e.contains("another node"), "{e}");
        book.release(p);
        drop(a);
        assert!(book.bind(lo, None, Some(p), &range).is_ok());
    }
}

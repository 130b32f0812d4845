//! PID-1 duties when the agent is the ramdisk's init.
//!
//! As PID 1 the agent mounts the pseudo file systems and brings up loopback, then becomes a
//! minimal init: it starts itself again as a child (marked by [`INIT_ENV`]) that does the real
//! work, and loops reaping every zombie, restarting the child if it ever exits. Keeping the
//! reaper out of the worker process means its own `waitpid` calls (exec plugins, ipmitool)
//! never race a global reaper for exit statuses. PID 1 never exits: the kernel would panic.

use std::process::Command;
use std::time::Duration;

/// Set in the worker's environment by the PID-1 supervisor.
pub const INIT_ENV: &str = "RIVET_AGENT_INIT";

/// Whether this process is the machine's init.
pub fn is_pid1() -> bool {
    std::process::id() == 1
}

/// Whether this process owns the machine (PID 1, or the worker started by it): only then do
/// reboot/power_off really happen.
pub fn owns_machine() -> bool {
    is_pid1() || std::env::var_os(INIT_ENV).is_some()
}

/// Mount /proc, /sys, /dev (devtmpfs), /run (tmpfs) and bring up `lo`. Each failure is logged
/// to stderr and skipped: an already-mounted file system is fine.
pub fn early_init() {
    use nix::mount::{mount, MsFlags};
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | MsFlags::MS_NODEV;
    let mounts: [(&str, &str, &str, MsFlags); 4] = [
        ("proc", "/proc", "proc", nosuid),
        ("sysfs", "/sys", "sysfs", nosuid),
        ("devtmpfs", "/dev", "devtmpfs", MsFlags::MS_NOSUID),
        (
            "tmpfs",
            "/run",
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        ),
    ];
    for (src, target, fstype, flags) in mounts {
        let _ = std::fs::create_dir_all(target);
        if let Err(e) = mount(Some(src), target, Some(fstype), flags, None::<&str>) {
            // EBUSY: the initramfs' init already mounted it.
            eprintln!("rivet-agent: mount {fstype} on {target}: {e}");
        }
    }
    if let Err(e) = loopback_up() {
        eprintln!("rivet-agent: cannot bring up lo: {e}");
    }
}

/// `ip link set lo up` with SIOCGIFFLAGS/SIOCSIFFLAGS on a datagram socket.
fn loopback_up() -> nix::Result<()> {
    use nix::libc;
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    use std::os::fd::AsRawFd;

    nix::ioctl_read_bad!(get_flags, libc::SIOCGIFFLAGS, libc::ifreq);
    nix::ioctl_write_ptr_bad!(set_flags, libc::SIOCSIFFLAGS, libc::ifreq);

    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: the socket is open and `req` is a valid ifreq naming an interface.
    unsafe { get_flags(sock.as_raw_fd(), &mut req) }?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above; the kernel only reads `req`.
    unsafe { set_flags(sock.as_raw_fd(), &req) }?;
    Ok(())
}

/// Run forever as init: start the worker (`/proc/self/exe` with our arguments and
/// [`INIT_ENV`] set), reap every child, restart the worker 5 s after it dies.
pub fn supervise() -> ! {
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::Pid;

    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut worker: Option<u32> = None;
    loop {
        if worker.is_none() {
            match Command::new("/proc/self/exe")
                .args(&args)
                .env(INIT_ENV, "1")
                .spawn()
            {
                // The Child handle is dropped: this loop's waitpid(-1) reaps it.
                Ok(child) => worker = Some(child.id()),
                Err(e) => {
                    eprintln!("rivet-agent init: cannot start the agent: {e}; retrying in 5 s");
                    std::thread::sleep(Duration::from_secs(5));
                    continue;
                }
            }
        }
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(pid, _)) | Ok(WaitStatus::Signaled(pid, _, _))
                if Some(pid.as_raw() as u32) == worker =>
            {
                eprintln!("rivet-agent init: agent exited ({pid}); restarting in 5 s");
                worker = None;
                std::thread::sleep(Duration::from_secs(5));
            }
            Ok(_) => {}
            // ECHILD cannot really happen while the worker lives; avoid a busy loop anyway.
            Err(_) => std::thread::sleep(Duration::from_secs(1)),
        }
    }
}

/// Flush file systems and reboot or power off. Returns only if reboot(2) failed.
pub fn power(off: bool) -> String {
    use nix::sys::reboot::{reboot, RebootMode};
    nix::unistd::sync();
    let mode = if off {
        RebootMode::RB_POWER_OFF
    } else {
        RebootMode::RB_AUTOBOOT
    };
    match reboot(mode) {
        Err(e) => e.to_string(),
        Ok(never) => match never {},
    }
}

//! Process accounting from /proc and getrusage: CPU time and resident memory of rivetd (a
//! child) and of this load generator.

use std::time::{Duration, Instant};

/// Clock ticks per second of /proc/PID/stat times.
fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of a process (all its threads), from /proc/PID/stat.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: split after it.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name, field 3 (state) is index 0, so utime (14) and stime (15) are 11 and 12.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_secs_f64((utime + stime) / clock_ticks()))
}

/// A `Vm*` line of /proc/PID/status, in KiB (`VmRSS`, `VmHWM`).
pub fn vm_kib(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// CPU time (user + system) of this process, all threads.
pub fn self_cpu_time() -> Duration {
    rusage_cpu(libc::RUSAGE_SELF)
}

fn rusage_cpu(who: libc::c_int) -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we own; `who` is a valid selector.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU use over an interval, as a fraction of one core.
pub struct CpuMeter {
    pid: Option<u32>,
    start_wall: Instant,
    start_cpu: Duration,
}

impl CpuMeter {
    /// Start measuring a child (`Some(pid)`) or this process (`None`).
    pub fn start(pid: Option<u32>) -> CpuMeter {
        CpuMeter {
            pid,
            start_wall: Instant::now(),
            start_cpu: Self::read(pid),
        }
    }

    fn read(pid: Option<u32>) -> Duration {
        match pid {
            Some(p) => cpu_time(p).unwrap_or_default(),
            None => self_cpu_time(),
        }
    }

    /// Cores used since `start` (1.0 = one core busy all the time).
    pub fn cores(&self) -> f64 {
        let wall = self.start_wall.elapsed().as_secs_f64();
        let cpu = Self::read(self.pid).saturating_sub(self.start_cpu);
        if wall > 0.0 {
            cpu.as_secs_f64() / wall
        } else {
            0.0
        }
    }
}

/// Busy CPU time of the whole machine (all cores), from the `cpu` line of /proc/stat.
fn machine_busy() -> Duration {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return Duration::ZERO;
    };
    // user nice system idle iowait irq softirq steal …: busy = all but idle and iowait.
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let busy: f64 = v
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4 && *i < 8)
        .map(|(_, x)| x)
        .sum();
    Duration::from_secs_f64(busy / clock_ticks())
}

/// CPU use of everything on the machine over an interval, in cores: subtract rivetd and the
/// generator to see what other processes took (the machine may be shared).
pub struct MachineMeter {
    start_wall: Instant,
    start_busy: Duration,
}

impl MachineMeter {
    /// Start measuring.
    pub fn start() -> MachineMeter {
        MachineMeter {
            start_wall: Instant::now(),
            start_busy: machine_busy(),
        }
    }

    /// Busy cores since `start`.
    pub fn cores(&self) -> f64 {
        let wall = self.start_wall.elapsed().as_secs_f64();
        let busy = machine_busy().saturating_sub(self.start_busy);
        if wall > 0.0 {
            busy.as_secs_f64() / wall
        } else {
            0.0
        }
    }
}

/// The PostgreSQL processes that serve database `db`: its client backends (process title
/// `postgres: USER DB HOST(PORT) …`) and the server's own processes (postmaster, WAL writer,
/// checkpointer, …), but not the backends of other databases on the same server.
fn postgres_pids(db: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() != "postgres" {
                return false;
            }
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            let backend = cmd.contains('(');
            !backend || cmd.split_whitespace().any(|w| w == db)
        })
        .collect()
}

/// CPU use of the PostgreSQL processes serving one database (see [`postgres_pids`]), in
/// cores. Backends that start during the interval count from their start.
pub struct PostgresMeter {
    db: String,
    start_wall: Instant,
    start: Vec<(u32, Duration)>,
}

impl PostgresMeter {
    /// Start measuring the processes serving database `db`.
    pub fn start(db: &str) -> PostgresMeter {
        PostgresMeter {
            db: db.to_string(),
            start_wall: Instant::now(),
            start: postgres_pids(db)
                .into_iter()
                .filter_map(|p| Some((p, cpu_time(p)?)))
                .collect(),
        }
    }

    /// Busy cores since `start`.
    pub fn cores(&self) -> f64 {
        let wall = self.start_wall.elapsed().as_secs_f64();
        let used: Duration = postgres_pids(&self.db)
            .into_iter()
            .filter_map(|p| {
                let now = cpu_time(p)?;
                let before = self
                    .start
                    .iter()
                    .find(|(q, _)| *q == p)
                    .map(|(_, t)| *t)
                    .unwrap_or_default();
                Some(now.saturating_sub(before))
            })
            .sum();
        if wall > 0.0 {
            used.as_secs_f64() / wall
        } else {
            0.0
        }
    }
}

/// The 1-minute load average (a busy machine makes latency numbers meaningless).
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// Raise this process's open-file limit to its hard limit (children inherit it): thousands
/// of agents hold thousands of sockets, in this process and in rivetd.
pub fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit read and write the struct we own.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        r.rlim_cur = r.rlim_max;
        let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        r.rlim_cur
    }
}

/// Run a command to completion; its wall time and peak RSS (KiB, `ru_maxrss` from wait4).
pub fn run_measured(cmd: &mut std::process::Command) -> anyhow::Result<(Duration, u64, bool)> {
    let start = Instant::now();
    let child = cmd.spawn()?;
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: wait4 on our own child pid, writing into structs we own. The `Child` is not
    // waited on afterwards (it is only dropped, which does not wait).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let wall = start.elapsed();
    drop(child);
    if r != pid {
        anyhow::bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    Ok((wall, ru.ru_maxrss as u64, ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let me = std::process::id();
        assert!(cpu_time(me).is_some());
        assert!(vm_kib(me, "VmRSS").unwrap_or(0) > 0);
        assert!(vm_kib(me, "VmHWM").unwrap_or(0) > 0);
    }

    #[test]
    fn measures_a_child() {
        let (wall, rss, ok) =
            run_measured(std::process::Command::new("true").stdout(std::process::Stdio::null()))
                .expect("run true");
        assert!(ok);
        assert!(rss > 0);
        assert!(wall < Duration::from_secs(5));
    }
}

//! CPU summary from /proc/cpuinfo and /sys/devices/system/cpu.

use super::Root;
use rivet_protocol::inventory::Cpu;
use std::collections::BTreeSet;

pub(super) fn collect(root: &Root) -> Cpu {
    let cpuinfo = root.read("/proc/cpuinfo").unwrap_or_default();
    let info = parse_cpuinfo(&cpuinfo);
    let count = root
        .read("/sys/devices/system/cpu/online")
        .and_then(|s| count_cpu_list(&s))
        .unwrap_or(info.processors);
    // lscpu prefers "CPU max MHz" (cpufreq, in kHz) over the current clock in cpuinfo.
    let frequency = root
        .read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
        .and_then(|s| s.parse::<u64>().ok())
        .map(|khz| format!("{:.4}", khz as f64 / 1000.0))
        .or(info.mhz)
        .unwrap_or_default();
    Cpu {
        model_name: info.model_name,
        frequency,
        count,
        architecture: std::env::consts::ARCH.to_string(),
        flags: info.flags,
        // Machines (VMs, some ARM) without "physical id" still have one socket.
        socket_count: if info.sockets.is_empty() && count > 0 {
            1
        } else {
            info.sockets.len() as u32
        },
    }
}

#[derive(Debug, Default, PartialEq)]
struct CpuInfo {
    processors: u32,
    model_name: String,
    mhz: Option<String>,
    flags: Vec<String>,
    sockets: BTreeSet<String>,
}

/// Parse the first processor's model, clock and flags, count processors and sockets.
fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut info = CpuInfo::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => info.processors += 1,
            // "model name" on x86, "Model Name"/"cpu model" elsewhere.
            "model name" | "Model Name" | "cpu model" if info.model_name.is_empty() => {
                info.model_name = value.to_string()
            }
            "cpu MHz" if info.mhz.is_none() => info.mhz = Some(value.to_string()),
            // "flags" on x86, "Features" on ARM.
            "flags" | "Features" if info.flags.is_empty() => {
                info.flags = value.split_whitespace().map(str::to_string).collect()
            }
            "physical id" => {
                info.sockets.insert(value.to_string());
            }
            _ => {}
        }
    }
    info
}

/// Count CPUs in a kernel CPU list like `0-3,8,10-11`. `None` on malformed input.
fn count_cpu_list(list: &str) -> Option<u32> {
    let mut n = 0u32;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                n = n.checked_add(b.checked_sub(a)?.checked_add(1)?)?;
            }
            None => {
                part.parse::<u32>().ok()?;
                n = n.checked_add(1)?;
            }
        }
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::super::testutil::TempTree;
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("x"), None);
        assert_eq!(count_cpu_list(""), None);
    }

    #[test]
    fn two_socket_x86() {
        let mut text = String::new();
        for i in 0..4 {
            text.push_str(&format!(
                "processor\t: {i}\nmodel name\t: Xeon Gold\ncpu MHz\t\t: 2100.000\n\
                 physical id\t: {}\nflags\t\t: fpu vmx sse\n\n",
                i / 2
            ));
        }
        let t = TempTree::new("cpu");
        t.file("/proc/cpuinfo", &text)
            .file("/sys/devices/system/cpu/online", "0-3\n")
            .file(
                "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq",
                "3400000\n",
            );
        let cpu = collect(&Root::new(t.path()));
        assert_eq!(cpu.model_name, "Xeon Gold");
        assert_eq!(cpu.count, 4);
        assert_eq!(cpu.socket_count, 2);
        assert_eq!(cpu.frequency, "3400.0000");
        assert_eq!(cpu.flags, vec!["fpu", "vmx", "sse"]);
    }

    #[test]
    fn garbage_cpuinfo() {
        let t = TempTree::new("cpu-garbage");
        t.file("/proc/cpuinfo", b"\xff\xfe:::\nprocessor\nflags:\n")
            .file("/sys/devices/system/cpu/online", "zz");
        let cpu = collect(&Root::new(t.path()));
        assert_eq!(cpu.count, 0);
        assert_eq!(cpu.socket_count, 0);
    }
}

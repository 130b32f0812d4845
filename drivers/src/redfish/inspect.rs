//! Out-of-band inspection over Redfish: CPUs and architecture from `ProcessorSummary` and
//! `Processors`, memory from `MemorySummary`, NIC MACs from `EthernetInterfaces`. Parts a
//! BMC does not serve are left empty rather than failing the whole inspection.

use super::{members, Ctx};
use crate::{DriverError, OobInventory};
use serde_json::Value;

/// Redfish `InstructionSet` / `ProcessorArchitecture` → the kernel's name.
fn arch(processor: &Value) -> Option<String> {
    let set = processor["InstructionSet"].as_str().unwrap_or("");
    let a = match set {
        "x86-64" => "x86_64",
        "x86" => "i686",
        "ARM-A64" => "aarch64",
        "ARM-A32" => "armv7l",
        "PowerISA" => "ppc64le",
        "IA-64" => "ia64",
        _ => match processor["ProcessorArchitecture"].as_str()? {
            "x86" => "x86_64",
            "ARM" => "aarch64",
            "Power" => "ppc64le",
            _ => return None,
        },
    };
    Some(a.to_string())
}

/// Logical CPUs and architecture summed over the CPU members of `Processors`.
async fn processors(ctx: &Ctx, path: &str) -> Result<(Option<u64>, Option<String>), DriverError> {
    let list = ctx.client.get(path).await?;
    let mut threads = 0;
    let mut arch_found = None;
    for p in members(&list) {
        let cpu = ctx.client.get(&p).await?;
        if cpu["ProcessorType"].as_str().is_some_and(|t| t != "CPU") {
            continue;
        }
        threads += cpu["TotalThreads"]
            .as_u64()
            .or_else(|| cpu["TotalCores"].as_u64())
            .unwrap_or(0);
        arch_found = arch_found.or_else(|| arch(&cpu));
    }
    Ok(((threads > 0).then_some(threads), arch_found))
}

/// Lower-case MACs of the system's Ethernet interfaces.
async fn macs(ctx: &Ctx, path: &str) -> Result<Vec<String>, DriverError> {
    let list = ctx.client.get(path).await?;
    let mut out = Vec::new();
    for nic in members(&list) {
        let n = ctx.client.get(&nic).await?;
        let mac = n["MACAddress"]
            .as_str()
            .or_else(|| n["PermanentMACAddress"].as_str())
            .and_then(rivet_model::records::normalize_mac);
        if let Some(m) = mac {
            if !out.contains(&m) {
                out.push(m);
            }
        }
    }
    Ok(out)
}

/// What the BMC knows of the system's hardware.
pub(crate) async fn inspect(ctx: &Ctx) -> Result<OobInventory, DriverError> {
    let sys = ctx.client.get(&ctx.system).await?;
    // Logical CPUs: the summary's logical count, else the threads of the processors, else
    // the summary's count (which some BMCs fill with logical CPUs, others with sockets).
    let logical = sys["ProcessorSummary"]["LogicalProcessorCount"].as_u64();
    let count = sys["ProcessorSummary"]["Count"].as_u64();
    let mut inv = OobInventory {
        cpus: logical,
        memory_mb: sys["MemorySummary"]["TotalSystemMemoryGiB"]
            .as_f64()
            .map(|gib| (gib * 1024.0).round() as u64),
        ..OobInventory::default()
    };
    if let Some(path) = sys["Processors"]["@odata.id"].as_str() {
        match processors(ctx, path).await {
            Ok((threads, arch)) => {
                inv.cpus = inv.cpus.or(threads);
                inv.cpu_arch = arch;
            }
            Err(e) => tracing::debug!(error = %e, "redfish inspection: Processors unreadable"),
        }
    }
    inv.cpus = inv.cpus.or(count);
    if let Some(path) = sys["EthernetInterfaces"]["@odata.id"].as_str() {
        inv.macs = macs(ctx, path).await?;
    }
    Ok(inv)
}

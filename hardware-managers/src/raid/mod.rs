//! Software RAID: IPA's `raid.create_configuration` and `raid.delete_configuration` clean
//! steps and `raid.apply_configuration` deploy step, built with Linux md through mdadm.
//!
//! Offered only where they can work: mdadm on PATH and md in the kernel (the ramdisk ships
//! both; an agent standing in for a ramdisk on a host without md offers none, so nothing
//! reports a RAID it did not build). rivetd puts the node's target RAID configuration in
//! the step arguments (`target_raid_config`); the result's `raid_config` is what was built,
//! which rivetd stores as the node's `raid_config`.
//!
//! Layout, and why: every array takes whole disks. The first volume is the root, a RAID-1
//! with md metadata 1.0 — the superblock at the end, data from sector 0 — so each member
//! read on its own is a plain disk holding the image written to the array, partition table,
//! ESP and boot code included: firmware boots from either disk, BIOS or UEFI, with no
//! bootloader installed per member. Other volumes use metadata 1.2 (nothing reads them
//! before Linux). See [`config`] for the rules and [`md`] for the mdadm calls.

pub mod config;
pub mod md;

use crate::erase::device::{self, Target};
use crate::erase::metadata;
use crate::{HardwareManager, StepContext, StepError, SupportLevel};
use config::{Size, Volume, GIB};
use rivet_protocol::inventory::Disk;
use rivet_protocol::steps::{ArgInfo, StepDescriptor};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use crate::DiskLister;

/// Name under which the manager registers.
pub const NAME: &str = "software_raid";

/// The software RAID steps.
pub struct SoftwareRaidManager {
    disks: DiskLister,
    sys_block: PathBuf,
    available: bool,
}

fn failed(msg: impl Into<String>) -> StepError {
    StepError::Failed(msg.into())
}

fn arg(description: &str, required: bool) -> ArgInfo {
    ArgInfo {
        description: description.into(),
        required,
    }
}

impl std::fmt::Debug for SoftwareRaidManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftwareRaidManager")
            .field("sys_block", &self.sys_block)
            .field("available", &self.available)
            .finish_non_exhaustive()
    }
}

impl SoftwareRaidManager {
    /// Over the machine's disks; offers steps only when [`md::available`].
    pub fn new(disks: DiskLister) -> SoftwareRaidManager {
        SoftwareRaidManager {
            disks,
            sys_block: PathBuf::from("/sys/block"),
            available: md::available(),
        }
    }

    fn target_config<'a>(
        &self,
        args: &'a Map<String, Value>,
        key: &str,
    ) -> Result<&'a Value, StepError> {
        args.get("target_raid_config")
            .or_else(|| args.get(key))
            .filter(|v| v.as_object().is_some_and(|o| !o.is_empty()))
            .ok_or_else(|| {
                failed(format!(
                    "no target RAID configuration was given to the step (argument \
                     target_raid_config{}); set the node's target_raid_config first",
                    if key == "raid_config" {
                        " or raid_config"
                    } else {
                        ""
                    }
                ))
            })
    }

    /// Whole disks that may become members: not md, not mounted, not swap, not the boot
    /// media, not read-only, not held by another array.
    fn eligible(&self) -> (Vec<Disk>, Vec<String>) {
        let mounts = device::mounts();
        let boot = device::boot_media(&mounts);
        let swaps = device::swap_devnos();
        let mut ok = Vec::new();
        let mut left_out = Vec::new();
        for d in (self.disks)() {
            let base = d.name.rsplit('/').next().unwrap_or_default().to_string();
            if base.starts_with("md") || d.size == 0 {
                continue;
            }
            match Target::open(Path::new(&d.name)) {
                Ok(t) => match device::check(&t, &[], false, &mounts, &boot, &swaps) {
                    Ok(None) => ok.push(d),
                    Ok(Some(skip)) => left_out.push(format!("{} ({skip})", d.name)),
                    Err(e) => left_out.push(format!("{} ({e})", d.name)),
                },
                Err(e) => left_out.push(format!("{} ({e})", d.name)),
            }
        }
        ok.sort_by(|a, b| a.name.cmp(&b.name));
        (ok, left_out)
    }

    /// Stop every array and remove its traces from its members: superblocks, partition
    /// tables, the first and last MiB. Disks with a stale superblock but no running array
    /// are cleared too. Refuses (before stopping anything) when an array is mounted.
    pub fn delete_configuration(&self, ctx: &StepContext) -> Result<Value, StepError> {
        let arrays = md::arrays(&self.sys_block);
        let mounts = device::mounts();
        let boot = device::boot_media(&mounts);
        let swaps = device::swap_devnos();
        for a in &arrays {
            let t = Target::open(&a.path()).map_err(|e| failed(e.to_string()))?;
            if let Err(e) = device::check(&t, &[], false, &mounts, &boot, &swaps) {
                return Err(failed(format!(
                    "cannot delete software RAID {}: {e}",
                    a.path().display()
                )));
            }
        }
        let mut deleted = Vec::new();
        let mut members: Vec<PathBuf> = Vec::new();
        for a in &arrays {
            ctx.check()?;
            md::mdadm(&["--stop".into(), a.path().display().to_string()]).map_err(failed)?;
            tracing::info!(array = %a.name, members = ?a.members, "software RAID stopped");
            deleted.push(json!({"array": a.path().display().to_string(), "level": a.level,
                                "members": a.members.iter().map(|m| format!("/dev/{m}")).collect::<Vec<_>>()}));
            members.extend(a.members.iter().map(|m| PathBuf::from("/dev").join(m)));
        }
        // Members, then every eligible disk still carrying a superblock (an array that did
        // not assemble leaves one behind).
        for d in self.eligible().0 {
            let p = PathBuf::from(&d.name);
            if !members.contains(&p) && md::mdadm(&["--examine".into(), d.name.clone()]).is_ok() {
                members.push(p);
            }
        }
        let mut wiped = Vec::new();
        for m in &members {
            ctx.check()?;
            // No superblock left (a partition member whose disk is wiped next) is fine.
            if let Err(e) = md::mdadm(&["--zero-superblock".into(), m.display().to_string()]) {
                tracing::debug!(member = %m.display(), error = %e, "no superblock to zero");
            }
            let mut wipe = vec![m.clone()];
            if let Some(disk) = parent_disk(&self.sys_block, m) {
                wipe.push(disk);
            }
            for w in wipe {
                if wiped.contains(&w) {
                    continue;
                }
                let t = Target::open(&w).map_err(|e| failed(e.to_string()))?;
                let plan = metadata::plan(&t).map_err(|e| failed(e.to_string()))?;
                metadata::erase(&t, &plan, ctx, &mut |_| {}).map_err(|e| failed(e.to_string()))?;
                wiped.push(w);
            }
        }
        Ok(json!({
            "raid_config": {},
            "deleted": deleted,
            "wiped": wiped.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        }))
    }

    /// Build `config` (Ironic's `{"logical_disks": [...]}`).
    pub fn create_configuration(
        &self,
        config: &Value,
        root: bool,
        nonroot: bool,
        delete_existing: bool,
        ctx: &StepContext,
    ) -> Result<Value, StepError> {
        let volumes = config::filter(config::parse(config).map_err(failed)?, root, nonroot);
        if volumes.is_empty() {
            return Err(failed(
                "nothing to build: create_root_volume and create_nonroot_volumes left no \
                 logical disk of the target RAID configuration",
            ));
        }
        if delete_existing {
            self.delete_configuration(ctx)?;
        } else if let Some(a) = md::arrays(&self.sys_block).first() {
            return Err(failed(format!(
                "software RAID {} exists and delete_existing is false; run \
                 raid.delete_configuration first",
                a.path().display()
            )));
        }
        let (eligible, left_out) = self.eligible();
        let members = config::choose_members(&volumes, &eligible).map_err(|e| {
            failed(if left_out.is_empty() {
                e
            } else {
                format!("{e}; left out: [{}]", left_out.join(", "))
            })
        })?;
        let mut built = Vec::new();
        for (v, disks) in volumes.iter().zip(&members) {
            ctx.check()?;
            built.push(self.build(v, disks, ctx)?);
        }
        Ok(json!({"raid_config": {"logical_disks": built}}))
    }

    /// One array: wipe the members, mdadm --create, wait until the kernel runs it.
    fn build(&self, v: &Volume, disks: &[Disk], ctx: &StepContext) -> Result<Value, StepError> {
        let paths: Vec<PathBuf> = disks.iter().map(|d| PathBuf::from(&d.name)).collect();
        for p in &paths {
            let t = Target::open(p).map_err(|e| failed(e.to_string()))?;
            let plan = metadata::plan(&t).map_err(|e| failed(e.to_string()))?;
            metadata::erase(&t, &plan, ctx, &mut |_| {}).map_err(|e| failed(e.to_string()))?;
        }
        let n = md::free_number(&self.sys_block);
        let dev = PathBuf::from(format!("/dev/md{n}"));
        let size_kib = match v.size {
            Size::Max => None,
            Size::Gib(g) => Some(match v.level {
                config::Level::Raid10 => (g * GIB * 2).div_ceil(disks.len() as u64) / 1024,
                _ => g * GIB / 1024,
            }),
        };
        let args = md::create_args(
            &dev,
            &v.name,
            v.level.mdadm(),
            v.metadata(),
            size_kib,
            &paths,
        );
        md::mdadm(&args).map_err(|e| failed(format!("building logical disk {}: {e}", v.index)))?;
        let name = format!("md{n}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let array = loop {
            if let Some(a) = md::arrays(&self.sys_block)
                .into_iter()
                .find(|a| a.name == name && a.running())
            {
                break a;
            }
            if Instant::now() > deadline {
                return Err(failed(format!(
                    "mdadm created {} but the kernel does not run it after 30 s",
                    dev.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        tracing::info!(array = %dev.display(), level = %array.level, members = ?array.members,
                       metadata = v.metadata(), "software RAID built");
        let mut out = v.requested.clone();
        out.insert("volume_name".into(), json!(v.name));
        out.insert("controller".into(), json!("software"));
        out.insert("raid_level".into(), json!(v.level.ironic()));
        out.insert("size_gb".into(), json!(array.size / GIB));
        if v.root {
            out.insert("is_root_volume".into(), json!(true));
        }
        out.insert(
            "physical_disks".into(),
            json!(paths
                .iter()
                .map(|p| json!({"name": p.display().to_string()}))
                .collect::<Vec<_>>()),
        );
        Ok(Value::Object(out))
    }
}

/// The whole disk a partition belongs to (`/dev/vda1` → `/dev/vda`), from sysfs.
fn parent_disk(sys_block: &Path, dev: &Path) -> Option<PathBuf> {
    let name = dev.file_name()?.to_string_lossy().into_owned();
    let class = Path::new("/sys/class/block").join(&name);
    if !class.join("partition").exists() {
        return None;
    }
    let real = std::fs::canonicalize(&class).ok()?;
    let parent = real.parent()?.file_name()?.to_string_lossy().into_owned();
    sys_block
        .join(&parent)
        .exists()
        .then(|| PathBuf::from("/dev").join(parent))
}

fn flag(args: &Map<String, Value>, name: &str, default: bool) -> Result<bool, StepError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) => {
            rivet_protocol::api::parse_bool_str(s).ok_or_else(|| StepError::BadArgument {
                name: name.into(),
                reason: "expected true or false".into(),
            })
        }
        Some(_) => Err(StepError::BadArgument {
            name: name.into(),
            reason: "expected true or false".into(),
        }),
    }
}

impl HardwareManager for SoftwareRaidManager {
    fn name(&self) -> &str {
        NAME
    }

    fn evaluate_support(&self) -> SupportLevel {
        SupportLevel::Generic
    }

    fn steps(&self) -> Vec<StepDescriptor> {
        if !self.available {
            return Vec::new();
        }
        let mut create = BTreeMap::new();
        create.insert(
            "create_root_volume".into(),
            arg("build the root volume (default true)", false),
        );
        create.insert(
            "create_nonroot_volumes".into(),
            arg("build the other volumes (default true)", false),
        );
        create.insert(
            "delete_existing".into(),
            arg("delete existing software RAID first (default true)", false),
        );
        vec![
            StepDescriptor {
                interface: "raid".into(),
                argsinfo: create,
                abortable: false,
                ..StepDescriptor::in_band("create_configuration", 0)
            },
            StepDescriptor {
                interface: "raid".into(),
                abortable: false,
                ..StepDescriptor::in_band("delete_configuration", 0)
            },
        ]
    }

    fn deploy_steps(&self) -> Vec<StepDescriptor> {
        if !self.available {
            return Vec::new();
        }
        let mut a = BTreeMap::new();
        a.insert(
            "raid_config".into(),
            arg(
                "the RAID configuration to build ({\"logical_disks\": [...]})",
                true,
            ),
        );
        a.insert(
            "delete_existing".into(),
            arg("delete existing software RAID first (default true)", false),
        );
        vec![StepDescriptor {
            interface: "raid".into(),
            argsinfo: a,
            abortable: false,
            ..StepDescriptor::in_band("apply_configuration", 0)
        }]
    }

    fn execute(
        &self,
        step: &str,
        args: &Map<String, Value>,
        ctx: &StepContext,
    ) -> Result<Value, StepError> {
        match step {
            "delete_configuration" => self.delete_configuration(ctx),
            "create_configuration" => {
                let cfg = self.target_config(args, "target_raid_config")?;
                self.create_configuration(
                    cfg,
                    flag(args, "create_root_volume", true)?,
                    flag(args, "create_nonroot_volumes", true)?,
                    flag(args, "delete_existing", true)?,
                    ctx,
                )
            }
            "apply_configuration" => {
                let cfg = self.target_config(args, "raid_config")?;
                self.create_configuration(
                    cfg,
                    true,
                    true,
                    flag(args, "delete_existing", true)?,
                    ctx,
                )
            }
            other => Err(StepError::UnknownStep(other.into())),
        }
    }
}

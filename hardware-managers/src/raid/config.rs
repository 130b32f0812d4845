//! The target RAID configuration, as the agent builds it: Ironic's `logical_disks` read into
//! typed volumes and checked against what the generic manager can build, and the member
//! disks chosen for each volume. Pure functions: no device is touched here.
//!
//! Rules (IPA's for software RAID, plus one of Rivet's layout):
//! - every logical disk says `controller: software`; others belong to a vendor manager;
//! - one or two volumes; the first is RAID-1 and is the root (the deploy target);
//! - levels 0, 1 and 1+0 (md raid0, raid1, raid10); 5 and 6 are not built by this ramdisk;
//! - members: one disk per `physical_disks` hint, in order, else every eligible disk;
//! - volumes never share a disk. Every array takes whole disks, because the root mirror
//!   must be readable by firmware from any single member as a plain disk (md metadata 1.0,
//!   superblock at the end, data from sector 0): the image's own partition table is then
//!   each member's. A second volume therefore needs other disks (`physical_disks`).

use rivet_protocol::hints;
use rivet_protocol::inventory::Disk;
use serde_json::{Map, Value};

/// One GiB.
pub const GIB: u64 = 1 << 30;

/// md's RAID levels this ramdisk builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Striping.
    Raid0,
    /// Mirroring.
    Raid1,
    /// Striped mirrors (md raid10, near-2 layout).
    Raid10,
}

impl Level {
    fn parse(s: &str) -> Result<Level, String> {
        match s {
            "0" => Ok(Level::Raid0),
            "1" => Ok(Level::Raid1),
            "1+0" => Ok(Level::Raid10),
            "2" | "5" | "6" | "5+0" | "6+0" => Err(format!(
                "software RAID level {s} is not built by this ramdisk (it builds 0, 1 and 1+0)"
            )),
            other => Err(format!("unknown RAID level {other:?}")),
        }
    }

    /// Ironic's spelling.
    pub fn ironic(self) -> &'static str {
        match self {
            Level::Raid0 => "0",
            Level::Raid1 => "1",
            Level::Raid10 => "1+0",
        }
    }

    /// mdadm's `--level`.
    pub fn mdadm(self) -> &'static str {
        match self {
            Level::Raid0 => "0",
            Level::Raid1 => "1",
            Level::Raid10 => "10",
        }
    }

    /// Fewest member disks (IPA's table).
    pub fn min_disks(self) -> usize {
        match self {
            Level::Raid0 | Level::Raid1 => 2,
            Level::Raid10 => 4,
        }
    }
}

/// `size_gb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// All the members' space.
    Max,
    /// This many GiB of array.
    Gib(u64),
}

/// One logical disk to build.
#[derive(Debug, Clone, PartialEq)]
pub struct Volume {
    /// Position in `logical_disks`.
    pub index: usize,
    /// RAID level.
    pub level: Level,
    /// Requested size.
    pub size: Size,
    /// The deploy target (always the first volume).
    pub root: bool,
    /// md array name (`volume_name`, else `rivet-root` / `rivet-data`).
    pub name: String,
    /// One device-hint object per member disk; empty: every eligible disk.
    pub hints: Vec<Map<String, Value>>,
    /// The logical disk as the operator wrote it (echoed back in `raid_config`).
    pub requested: Map<String, Value>,
}

impl Volume {
    /// The array's metadata format: 1.0 (at the end) for the root mirror, which firmware
    /// must read as a plain disk; 1.2 (4 KiB from the start, mdadm's default) elsewhere.
    pub fn metadata(&self) -> &'static str {
        if self.root {
            "1.0"
        } else {
            "1.2"
        }
    }
}

fn err(i: usize, msg: impl std::fmt::Display) -> String {
    format!("logical disk {i}: {msg}")
}

/// Read `{"logical_disks": [...]}`. Errors name the logical disk and the field.
pub fn parse(config: &Value) -> Result<Vec<Volume>, String> {
    let disks = config
        .get("logical_disks")
        .and_then(Value::as_array)
        .ok_or("the target RAID configuration has no logical_disks list")?;
    if disks.is_empty() {
        return Err("the target RAID configuration has no logical disks".into());
    }
    if disks.len() > 2 {
        return Err(format!(
            "software RAID builds one or two arrays (the first a RAID-1 root), not {}",
            disks.len()
        ));
    }
    let mut out = Vec::new();
    for (i, d) in disks.iter().enumerate() {
        let d = d.as_object().ok_or_else(|| err(i, "must be an object"))?;
        match d.get("controller").and_then(Value::as_str) {
            Some("software") => {}
            Some(c) => {
                return Err(err(
                    i,
                    format!(
                        "controller {c:?} is not \"software\": the generic hardware manager \
                         builds only software RAID; a vendor hardware manager that knows {c:?} \
                         must offer raid.create_configuration"
                    ),
                ))
            }
            None => {
                return Err(err(
                    i,
                    "has no controller; set \"controller\": \"software\" for software RAID",
                ))
            }
        }
        let level = match d.get("raid_level") {
            Some(Value::String(s)) => Level::parse(s),
            Some(Value::Number(n)) => Level::parse(&n.to_string()),
            _ => Err("raid_level is missing".to_string()),
        }
        .map_err(|e| err(i, e))?;
        let size = match d.get("size_gb") {
            Some(Value::String(s)) if s == "MAX" => Size::Max,
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Size::Gib(n),
                _ => return Err(err(i, "size_gb must be a positive integer or \"MAX\"")),
            },
            None => return Err(err(i, "size_gb is missing")),
        };
        let root_flag = match d.get("is_root_volume") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => return Err(err(i, "is_root_volume must be true or false")),
        };
        if i == 0 && level != Level::Raid1 {
            return Err(err(
                i,
                format!(
                    "the first software RAID volume is the deploy target and must be RAID-1 \
                     (a lost disk must not stop the server booting), not {}",
                    level.ironic()
                ),
            ));
        }
        if i == 0 && root_flag == Some(false) {
            return Err(err(
                i,
                "is_root_volume is false, but the first software RAID volume is the deploy \
                 target; put the data volume second",
            ));
        }
        if i > 0 && root_flag == Some(true) {
            return Err(err(
                i,
                "is_root_volume: only the first software RAID volume can be the root",
            ));
        }
        if level == Level::Raid0 && size != Size::Max {
            return Err(err(
                i,
                "a software RAID-0 volume takes its whole member disks: size_gb must be \"MAX\"",
            ));
        }
        let hints = match d.get("physical_disks") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|h| match h {
                    Value::Object(o) => {
                        hints::validate(o).map_err(|e| err(i, format!("physical_disks: {e}")))?;
                        Ok(o.clone())
                    }
                    Value::String(s) => {
                        let mut o = Map::new();
                        o.insert("name".into(), Value::String(s.clone()));
                        Ok(o)
                    }
                    _ => Err(err(i, "physical_disks items must be device hint objects")),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(err(i, "physical_disks must be a list of device hints")),
        };
        if !hints.is_empty() && hints.len() < level.min_disks() {
            return Err(err(
                i,
                format!(
                    "RAID-{} needs at least {} disks; physical_disks names {}",
                    level.ironic(),
                    level.min_disks(),
                    hints.len()
                ),
            ));
        }
        let name = match d.get("volume_name") {
            Some(Value::String(s)) if !s.is_empty() => {
                if s.len() > 32
                    || !s
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                {
                    return Err(err(
                        i,
                        "volume_name must be at most 32 letters, digits, '-', '_' or '.' (it \
                         names the md array)",
                    ));
                }
                s.clone()
            }
            _ if i == 0 => "rivet-root".into(),
            _ => "rivet-data".into(),
        };
        out.push(Volume {
            index: i,
            level,
            size,
            root: i == 0,
            name,
            hints,
            requested: d.clone(),
        });
    }
    Ok(out)
}

/// Ironic's `create_root_volume` / `create_nonroot_volumes` filter.
pub fn filter(volumes: Vec<Volume>, root: bool, nonroot: bool) -> Vec<Volume> {
    volumes
        .into_iter()
        .filter(|v| if v.root { root } else { nonroot })
        .collect()
}

/// Choose each volume's members among `eligible` (whole disks that may be written, in name
/// order). Volumes never share a disk; see the module doc for why.
pub fn choose_members(volumes: &[Volume], eligible: &[Disk]) -> Result<Vec<Vec<Disk>>, String> {
    let mut used: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for v in volumes {
        let free: Vec<&Disk> = eligible
            .iter()
            .filter(|d| !used.contains(&d.name))
            .collect();
        let members: Vec<Disk> = if v.hints.is_empty() {
            free.iter().map(|d| (*d).clone()).collect()
        } else {
            let mut chosen: Vec<Disk> = Vec::new();
            for h in &v.hints {
                let hit = free.iter().find(|d| {
                    !chosen.iter().any(|c| c.name == d.name)
                        && h.iter()
                            .all(|(k, want)| hints::hint_matches(d, k, want).unwrap_or(false))
                });
                match hit {
                    Some(d) => chosen.push((*d).clone()),
                    None => {
                        let taken = eligible
                            .iter()
                            .filter(|d| {
                                used.contains(&d.name)
                                    && h.iter().all(|(k, want)| {
                                        hints::hint_matches(d, k, want).unwrap_or(false)
                                    })
                            })
                            .map(|d| d.name.clone())
                            .collect::<Vec<_>>();
                        let why = if taken.is_empty() {
                            String::new()
                        } else {
                            format!(
                                " ({} matches, but an earlier volume uses it: software RAID \
                                 volumes here take whole disks and never share one)",
                                taken.join(", ")
                            )
                        };
                        return Err(err(
                            v.index,
                            format!(
                                "no free disk matches physical_disks hint {}{why}; eligible: [{}]",
                                Value::Object(h.clone()),
                                eligible
                                    .iter()
                                    .map(|d| d.name.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        ));
                    }
                }
            }
            chosen
        };
        if members.len() < v.level.min_disks() {
            let shared = if used.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} already belong to an earlier volume (software RAID volumes here take \
                     whole disks: give each volume its disks with physical_disks)",
                    used.join(", ")
                )
            };
            return Err(err(
                v.index,
                format!(
                    "RAID-{} needs at least {} disks, {} eligible{shared}",
                    v.level.ironic(),
                    v.level.min_disks(),
                    members.len()
                ),
            ));
        }
        if let Size::Gib(n) = v.size {
            let smallest = members.iter().map(|d| d.size).min().unwrap_or(0);
            // What each member must hold: a mirror holds all of it, raid10 (near 2) half
            // per pair of members. 1 MiB stays free for the superblock.
            let per_member = match v.level {
                Level::Raid10 => (n * GIB * 2).div_ceil(members.len() as u64),
                _ => n * GIB,
            };
            if per_member + (1 << 20) > smallest {
                return Err(err(
                    v.index,
                    format!(
                        "size_gb {n} does not fit: each member needs {per_member} bytes and \
                         the smallest ({}) has {smallest}",
                        members
                            .iter()
                            .min_by_key(|d| d.size)
                            .map(|d| d.name.as_str())
                            .unwrap_or("?")
                    ),
                ));
            }
        }
        used.extend(members.iter().map(|d| d.name.clone()));
        out.push(members);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn disk(name: &str, gib: u64) -> Disk {
        Disk {
            name: name.into(),
            size: gib * GIB,
            ..Default::default()
        }
    }

    fn names(m: &[Disk]) -> Vec<&str> {
        m.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn parses_ironic_software_config() {
        let v = parse(&json!({"logical_disks": [
            {"size_gb": "MAX", "raid_level": "1", "controller": "software", "is_root_volume": true},
            {"size_gb": "MAX", "raid_level": "0", "controller": "software", "volume_name": "scratch",
             "physical_disks": [{"name": "/dev/vdc"}, "/dev/vdd"]}
        ]}))
        .expect("valid");
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0].level, v[0].size, v[0].root),
            (Level::Raid1, Size::Max, true)
        );
        assert_eq!(v[0].name, "rivet-root");
        assert_eq!(v[0].metadata(), "1.0");
        assert_eq!(
            (v[1].level, v[1].name.as_str(), v[1].metadata()),
            (Level::Raid0, "scratch", "1.2")
        );
        assert_eq!(v[1].hints[1]["name"], json!("/dev/vdd"));
    }

    #[test]
    fn refuses_what_it_cannot_build_and_names_why() {
        let cases = [
            (json!({}), "no logical_disks"),
            (json!({"logical_disks": []}), "no logical disks"),
            (
                json!({"logical_disks": [{"size_gb": 10, "raid_level": "1"}]}),
                "has no controller",
            ),
            (
                json!({"logical_disks": [{"size_gb": 10, "raid_level": "1", "controller": "RAID.Integrated.1-1"}]}),
                "vendor hardware manager",
            ),
            (
                json!({"logical_disks": [{"size_gb": 10, "raid_level": "0", "controller": "software"}]}),
                "must be RAID-1",
            ),
            (
                json!({"logical_disks": [{"size_gb": 10, "raid_level": "5", "controller": "software"}]}),
                "not built by this ramdisk",
            ),
            (
                json!({"logical_disks": [{"size_gb": 0, "raid_level": "1", "controller": "software"}]}),
                "positive integer",
            ),
            (
                json!({"logical_disks": [{"size_gb": "MAX", "raid_level": "1", "controller": "software", "is_root_volume": false}]}),
                "deploy target",
            ),
            (
                json!({"logical_disks": [{"size_gb": "MAX", "raid_level": "1", "controller": "software"},
                                      {"size_gb": 5, "raid_level": "0", "controller": "software"}]}),
                "must be \"MAX\"",
            ),
            (
                json!({"logical_disks": [{"size_gb": "MAX", "raid_level": "1", "controller": "software",
                                       "physical_disks": [{"name": "/dev/vda"}]}]}),
                "at least 2 disks",
            ),
            (
                json!({"logical_disks": [{"size_gb": "MAX", "raid_level": "1", "controller": "software",
                                       "physical_disks": [{"colour": "red"}, {"name": "x"}]}]}),
                "physical_disks",
            ),
        ];
        for (cfg, want) in cases {
            let e = parse(&cfg).expect_err(&cfg.to_string());
            assert!(e.contains(want), "{cfg}: {e}");
        }
    }

    #[test]
    fn members_by_hints_or_all_and_never_shared() {
        let eligible = [
            disk("/dev/vda", 8),
            disk("/dev/vdb", 8),
            disk("/dev/vdc", 4),
            disk("/dev/vdd", 4),
        ];
        let one = parse(&json!({"logical_disks": [
            {"size_gb": "MAX", "raid_level": "1", "controller": "software"}]}))
        .expect("valid");
        let m = choose_members(&one, &eligible).expect("fits");
        assert_eq!(
            names(&m[0]),
            ["/dev/vda", "/dev/vdb", "/dev/vdc", "/dev/vdd"]
        );

        let two = parse(&json!({"logical_disks": [
            {"size_gb": 6, "raid_level": "1", "controller": "software",
             "physical_disks": [{"size": ">= 8"}, {"size": ">= 8"}]},
            {"size_gb": "MAX", "raid_level": "0", "controller": "software"}]}))
        .expect("valid");
        let m = choose_members(&two, &eligible).expect("fits");
        assert_eq!(names(&m[0]), ["/dev/vda", "/dev/vdb"]);
        assert_eq!(names(&m[1]), ["/dev/vdc", "/dev/vdd"]);

        // The second volume asks for a disk the first took.
        let shared = parse(&json!({"logical_disks": [
            {"size_gb": "MAX", "raid_level": "1", "controller": "software",
             "physical_disks": [{"name": "/dev/vda"}, {"name": "/dev/vdb"}]},
            {"size_gb": "MAX", "raid_level": "1", "controller": "software",
             "physical_disks": [{"name": "/dev/vdb"}, {"name": "/dev/vdc"}]}]}))
        .expect("valid");
        let e = choose_members(&shared, &eligible).expect_err("shared");
        assert!(e.contains("never share"), "{e}");
        // Without hints the first volume takes every disk: nothing left for a second.
        let greedy = parse(&json!({"logical_disks": [
            {"size_gb": "MAX", "raid_level": "1", "controller": "software"},
            {"size_gb": "MAX", "raid_level": "0", "controller": "software"}]}))
        .expect("valid");
        let e = choose_members(&greedy, &eligible).expect_err("greedy");
        assert!(e.contains("physical_disks"), "{e}");
        // Too big.
        let big = parse(&json!({"logical_disks": [
            {"size_gb": 8, "raid_level": "1", "controller": "software"}]}))
        .expect("valid");
        let e = choose_members(&big, &eligible).expect_err("too big");
        assert!(e.contains("does not fit"), "{e}");
        // Too few disks.
        let e = choose_members(&one, &eligible[..1]).expect_err("one disk");
        assert!(e.contains("at least 2 disks, 1 eligible"), "{e}");
    }

    #[test]
    fn filter_follows_ironic_flags() {
        let two = parse(&json!({"logical_disks": [
            {"size_gb": "MAX", "raid_level": "1", "controller": "software", "physical_disks": ["a", "b"]},
            {"size_gb": "MAX", "raid_level": "1", "controller": "software", "physical_disks": ["c", "d"]}]}))
        .expect("valid");
        assert_eq!(filter(two.clone(), true, false).len(), 1);
        assert!(filter(two.clone(), false, true)[0].index == 1);
        assert!(filter(two, false, false).is_empty());
    }
}

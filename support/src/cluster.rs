//! Several rivetd on one database: which controller owns which node.
//!
//! Ownership is a consistent hash ring over the ids of the live controllers (those whose
//! registration heartbeat in the store is fresh). Every controller computes the same ring
//! from the same table, so no election or messaging is needed; when one joins or dies only
//! about 1/N of the nodes move. Ownership says who *should* drive a node; the reservation
//! lease in the store says who *does*, so two controllers with briefly different views never
//! work on one node at once.

use sha2::{Digest, Sha256};

/// Points per controller: enough that 3 controllers share 1,000 nodes within a few percent.
const VNODES: usize = 128;

/// A consistent hash ring over controller ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashRing {
    /// (point, index into `members`), sorted by point.
    points: Vec<(u64, usize)>,
    /// Controller ids, sorted.
    members: Vec<String>,
}

fn point(key: &str) -> u64 {
    let digest = Sha256::digest(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

impl HashRing {
    /// The ring over `members` (order and duplicates do not matter).
    pub fn new<I, S>(members: I) -> HashRing
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut members: Vec<String> = members.into_iter().map(Into::into).collect();
        members.sort();
        members.dedup();
        let mut points: Vec<(u64, usize)> = members
            .iter()
            .enumerate()
            .flat_map(|(i, m)| (0..VNODES).map(move |v| (point(&format!("{m}#{v}")), i)))
            .collect();
        points.sort_unstable();
        HashRing { points, members }
    }

    /// The controller that owns `key` (a node UUID); `None` on an empty ring.
    pub fn owner(&self, key: &str) -> Option<&str> {
        if self.points.is_empty() {
            return None;
        }
        let p = point(key);
        let i = self.points.partition_point(|(q, _)| *q < p);
        let (_, m) = self.points[i % self.points.len()];
        Some(&self.members[m])
    }

    /// The controller ids on the ring, sorted.
    pub fn members(&self) -> &[String] {
        &self.members
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn keys(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("{:08x}-0000-4000-8000-{:012x}", i * 7919, i))
            .collect()
    }

    #[test]
    fn empty_ring_owns_nothing_and_one_member_owns_everything() {
        assert_eq!(HashRing::new(Vec::<String>::new()).owner("x"), None);
        let ring = HashRing::new(["only"]);
        assert!(keys(100).iter().all(|k| ring.owner(k) == Some("only")));
    }

    #[test]
    fn same_members_in_any_order_give_the_same_owners() {
        let a = HashRing::new(["c1", "c2", "c3"]);
        let b = HashRing::new(["c3", "c1", "c2", "c1"]);
        assert_eq!(a, b);
        for k in keys(200) {
            assert_eq!(a.owner(&k), b.owner(&k));
        }
    }

    #[test]
    fn three_members_share_evenly() {
        let ring = HashRing::new(["c1", "c2", "c3"]);
        let mut count: HashMap<&str, usize> = HashMap::new();
        let ks = keys(3000);
        for k in &ks {
            *count.entry(ring.owner(k).unwrap_or("none")).or_default() += 1;
        }
        assert_eq!(count.len(), 3, "{count:?}");
        for (m, c) in &count {
            assert!((700..=1300).contains(c), "{m} owns {c} of 3000: {count:?}");
        }
    }

    #[test]
    fn losing_a_member_moves_only_its_keys() {
        let before = HashRing::new(["c1", "c2", "c3"]);
        let after = HashRing::new(["c1", "c3"]);
        let mut moved = 0;
        for k in keys(2000) {
            let (b, a) = (before.owner(&k), after.owner(&k));
            if b != Some("c2") {
                assert_eq!(a, b, "key {k} moved although its owner stayed");
            } else {
                assert_ne!(a, Some("c2"));
                moved += 1;
            }
        }
        assert!(moved > 0);
    }
}

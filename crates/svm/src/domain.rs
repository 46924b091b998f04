//! Memory domains and the links between them.
//!
//! A domain is a physical place a replica of a region can live in: the guest-visible window,
//! host RAM, or the local memory of a (simulated or real) physical device. The topology says
//! which pairs of domains can copy directly; by default every pair can (all of them are
//! host-addressable on this kind of machine), and a restricted topology (a device reachable only
//! through host RAM, like a discrete GPU's memory) makes the copy engine route in hops.

use std::collections::HashSet;

/// Identifies a memory domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct DomainId(pub u32);

impl DomainId {
    /// The guest-visible window of the region's owner.
    pub const GUEST_WINDOW: DomainId = DomainId(0);
    /// Host RAM.
    pub const HOST_RAM: DomainId = DomainId(1);
}

/// What kind of memory a domain is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum DomainKind {
    /// The guest's shared window (one per guest, one domain id for all).
    GuestWindow,
    /// Ordinary host memory.
    HostRam,
    /// Memory local to one physical device.
    DeviceLocal,
}

/// Description of one domain.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DomainInfo {
    /// The domain's id.
    pub id: DomainId,
    /// Name for logs and listings (`guest-window`, `host-ram`, a device's name, ...).
    pub name: String,
    /// What kind of memory it is.
    pub kind: DomainKind,
}

/// The set of domains and links, fixed when the daemon starts.
#[derive(Debug, Clone)]
pub struct Topology {
    domains: Vec<DomainInfo>,
    /// `None`: every pair is linked. `Some`: only these (undirected) pairs.
    links: Option<HashSet<(DomainId, DomainId)>>,
}

impl Default for Topology {
    fn default() -> Self {
        Self::new()
    }
}

impl Topology {
    /// The guest window and host RAM, fully linked.
    pub fn new() -> Self {
        Topology {
            domains: vec![
                DomainInfo {
                    id: DomainId::GUEST_WINDOW,
                    name: "guest-window".into(),
                    kind: DomainKind::GuestWindow,
                },
                DomainInfo {
                    id: DomainId::HOST_RAM,
                    name: "host-ram".into(),
                    kind: DomainKind::HostRam,
                },
            ],
            links: None,
        }
    }

    /// Adds a device-local domain and returns its id.
    pub fn add_device_domain(&mut self, name: &str) -> DomainId {
        let id = DomainId(self.domains.len() as u32);
        self.domains.push(DomainInfo {
            id,
            name: name.to_string(),
            kind: DomainKind::DeviceLocal,
        });
        id
    }

    /// Switches to an explicit link set (starting empty) and adds `a <-> b`.
    pub fn add_link(&mut self, a: DomainId, b: DomainId) {
        let links = self.links.get_or_insert_with(HashSet::new);
        links.insert((a.min(b), a.max(b)));
    }

    /// Whether `a` and `b` can copy directly.
    pub fn linked(&self, a: DomainId, b: DomainId) -> bool {
        a != b
            && self.contains(a)
            && self.contains(b)
            && self
                .links
                .as_ref()
                .is_none_or(|l| l.contains(&(a.min(b), a.max(b))))
    }

    /// Whether the domain exists.
    pub fn contains(&self, d: DomainId) -> bool {
        (d.0 as usize) < self.domains.len()
    }

    /// All domains.
    pub fn domains(&self) -> &[DomainInfo] {
        &self.domains
    }

    /// Information about one domain.
    pub fn info(&self, d: DomainId) -> Option<&DomainInfo> {
        self.domains.get(d.0 as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_mesh_by_default_restricted_on_request() {
        let mut t = Topology::new();
        let gpu = t.add_device_domain("gpu");
        assert!(t.linked(DomainId::GUEST_WINDOW, gpu));
        assert!(!t.linked(gpu, gpu));
        assert!(!t.linked(gpu, DomainId(9)));
        t.add_link(gpu, DomainId::HOST_RAM);
        assert!(t.linked(DomainId::HOST_RAM, gpu));
        assert!(!t.linked(DomainId::GUEST_WINDOW, gpu));
    }
}

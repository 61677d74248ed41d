//! Roles and the role word: which tier of which website every node serves.
//!
//! The roles of all nodes live in one 64-bit word, so that one compare-and-swap changes a
//! node's role against the exact configuration the change was decided on:
//!
//! ```text
//!  63            48 47     45 44     42        5      3 2      0
//! +----------------+---------+---------+ ... +---------+---------+
//! |  epoch (16 b)  | node 15 | node 14 |     | node 1  | node 0  |   3 bits per node
//! +----------------+---------+---------+ ... +---------+---------+
//!  code 0 = not a member; code 1 + 2·site + tier = serves `tier` of `site`
//! ```
//!
//! Why one word and not one status word per node (as the thesis drew it): with per-node
//! words, two helpers that each see a tier of two nodes can each move a *different* node
//! out of it, both CASes succeed, and the tier is empty. Over the packed word the second
//! CAS fails, returns the configuration the first one made, and the loser decides again
//! from it. The epoch makes every change a new value, so a helper holding a view older
//! than the last change always fails (a helper would have to sleep through 65,536 changes
//! for its old word to come back).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Most nodes in one data center (16 three-bit codes fill 48 bits of the word).
pub const NODES_MAX: usize = 16;
/// Most websites (codes 1..=6 name 3 sites × 2 tiers; 7 is invalid).
pub const SITES_MAX: usize = 3;
/// Fewest nodes a website keeps in each tier: a site with an empty tier serves nothing
/// (the thesis' implementation had the same floor; section 4.3, note 1).
pub const TIER_NODES_MIN: usize = 1;

const CODE_BITS: u32 = 3;
const CODE_MASK: u64 = (1 << CODE_BITS) - 1;
const EPOCH_SHIFT: u32 = 48;
const _: () = assert!(NODES_MAX as u32 * CODE_BITS <= EPOCH_SHIFT, "node codes must fit under the epoch");
const _: () = assert!(2 * SITES_MAX as u64 <= CODE_MASK, "every (site, tier) needs a code");

/// A node by its index in the data center.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeIndex(pub u8);

impl NodeIndex {
    /// The index as a `usize`.
    pub fn get(self) -> usize {
        usize::from(self.0)
    }
}

impl fmt::Display for NodeIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// A website, by priority: site 0 has the highest priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SiteId(pub u8);

/// The two tiers a node can serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Front tier: answers static documents from its cache, forwards misses and dynamic requests.
    Proxy = 0,
    /// Back tier: produces dynamic content and serves static documents to the proxies.
    App = 1,
}

impl Tier {
    /// Both tiers.
    pub const ALL: [Tier; 2] = [Tier::Proxy, Tier::App];

    /// The other tier.
    pub fn other(self) -> Tier {
        match self {
            Tier::Proxy => Tier::App,
            Tier::App => Tier::Proxy,
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Proxy => "proxy",
            Tier::App => "app",
        })
    }
}

/// What one node does: a tier of a website.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Role {
    /// The website.
    pub site: SiteId,
    /// The tier.
    pub tier: Tier,
}

impl Role {
    /// A role.
    pub fn new(site: u8, tier: Tier) -> Self {
        Role { site: SiteId(site), tier }
    }

    /// The 3-bit code of this role (never 0, which means "not a member").
    pub fn code(self) -> u8 {
        debug_assert!(usize::from(self.site.0) < SITES_MAX);
        1 + 2 * self.site.0 + self.tier as u8
    }

    /// The role of a code, if the code names one.
    pub fn from_code(code: u8) -> Option<Role> {
        if code == 0 || usize::from(code) > 2 * SITES_MAX {
            return None;
        }
        let c = code - 1;
        Some(Role { site: SiteId(c / 2), tier: if c.is_multiple_of(2) { Tier::Proxy } else { Tier::App } })
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "site{}/{}", self.site.0, self.tier)
    }
}

/// Why a role word is not a valid configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// A node's code names no role.
    #[error("node {0} has an invalid role code")]
    BadCode(NodeIndex),
    /// A website has members but no node in one of its tiers.
    #[error("site {site} has no node in its {tier} tier")]
    EmptyTier {
        /// The website.
        site: u8,
        /// The empty tier.
        tier: Tier,
    },
    /// No node is a member.
    #[error("no node is a member")]
    NoMembers,
}

/// The roles of all nodes and the epoch of the configuration, packed in one word.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct RoleTable(pub u64);

impl RoleTable {
    /// An empty table (no members) at epoch 0.
    pub const EMPTY: RoleTable = RoleTable(0);

    /// A table from roles by node (`None`: not a member), at `epoch`.
    pub fn from_roles(roles: &[Option<Role>], epoch: u16) -> RoleTable {
        assert!(roles.len() <= NODES_MAX, "at most {NODES_MAX} nodes");
        let mut t = RoleTable(u64::from(epoch) << EPOCH_SHIFT);
        for (i, r) in roles.iter().enumerate() {
            t = t.with_code(i, r.map_or(0, Role::code));
        }
        t
    }

    /// The configuration counter; every change bumps it.
    pub fn epoch(self) -> u16 {
        (self.0 >> EPOCH_SHIFT) as u16
    }

    fn code(self, node: usize) -> u8 {
        ((self.0 >> (node as u32 * CODE_BITS)) & CODE_MASK) as u8
    }

    fn with_code(self, node: usize, code: u8) -> RoleTable {
        let shift = node as u32 * CODE_BITS;
        RoleTable((self.0 & !(CODE_MASK << shift)) | (u64::from(code) << shift))
    }

    /// The role of a node; `None` if it is not a member (or its code is invalid).
    pub fn role(self, node: NodeIndex) -> Option<Role> {
        if node.get() >= NODES_MAX {
            return None;
        }
        Role::from_code(self.code(node.get()))
    }

    /// Members and their roles, by node index.
    pub fn members(self) -> impl Iterator<Item = (NodeIndex, Role)> {
        (0..NODES_MAX as u8).filter_map(move |i| self.role(NodeIndex(i)).map(|r| (NodeIndex(i), r)))
    }

    /// Members serving `role`.
    pub fn nodes_in(self, role: Role) -> impl Iterator<Item = NodeIndex> {
        self.members().filter(move |(_, r)| *r == role).map(|(n, _)| n)
    }

    /// How many members serve `role`.
    pub fn count(self, role: Role) -> usize {
        self.nodes_in(role).count()
    }

    /// How many members belong to `site` (both tiers).
    pub fn site_nodes(self, site: SiteId) -> usize {
        self.members().filter(|(_, r)| r.site == site).count()
    }

    /// The same table with `node` serving `role` (or leaving, for `None`) and the epoch
    /// bumped: the value a helper proposes in its compare-and-swap.
    pub fn with_role(self, node: NodeIndex, role: Option<Role>) -> RoleTable {
        self.with_roles(&[node], role)
    }

    /// The same table with every node of `nodes` serving `role` and the epoch bumped once:
    /// one change, however many nodes it moves.
    pub fn with_roles(self, nodes: &[NodeIndex], role: Option<Role>) -> RoleTable {
        let changes: Vec<(NodeIndex, Option<Role>)> = nodes.iter().map(|n| (*n, role)).collect();
        self.with_changes(&changes)
    }

    /// The same table with each `(node, role)` of `changes` applied in order and the epoch
    /// bumped once: one change, however many nodes and roles it touches.
    pub fn with_changes(self, changes: &[(NodeIndex, Option<Role>)]) -> RoleTable {
        let mut t = self;
        for (node, role) in changes {
            assert!(node.get() < NODES_MAX, "node index out of range");
            t = t.with_code(node.get(), role.map_or(0, Role::code));
        }
        let epoch = self.epoch().wrapping_add(1);
        RoleTable((t.0 & ((1 << EPOCH_SHIFT) - 1)) | (u64::from(epoch) << EPOCH_SHIFT))
    }

    /// Checks the rules every configuration keeps: valid codes, at least one member, and
    /// every website with members has at least [`TIER_NODES_MIN`] node in each tier.
    pub fn validate(self) -> Result<(), TableError> {
        let mut counts = [[0usize; 2]; SITES_MAX];
        let mut members = 0;
        for i in 0..NODES_MAX {
            let code = self.code(i);
            if code == 0 {
                continue;
            }
            let role = Role::from_code(code).ok_or(TableError::BadCode(NodeIndex(i as u8)))?;
            counts[usize::from(role.site.0)][role.tier as usize] += 1;
            members += 1;
        }
        if members == 0 {
            return Err(TableError::NoMembers);
        }
        for (site, c) in counts.iter().enumerate() {
            if c[0] + c[1] == 0 {
                continue;
            }
            for tier in Tier::ALL {
                if c[tier as usize] < TIER_NODES_MIN {
                    return Err(TableError::EmptyTier { site: site as u8, tier });
                }
            }
        }
        Ok(())
    }

    /// A short human form: `e12 [P P A A A | p a]` style, one letter per member
    /// (upper case for site 0, lower case for site 1, digits-marked for others).
    pub fn describe(self) -> String {
        let mut s = format!("e{} ", self.epoch());
        for i in 0..NODES_MAX as u8 {
            let Some(r) = self.role(NodeIndex(i)) else { continue };
            let letter = match r.tier {
                Tier::Proxy => 'p',
                Tier::App => 'a',
            };
            s.push_str(&format!("{}{}{} ", i, letter, r.site.0));
        }
        s.trim_end().to_string()
    }

    /// Tier sizes of a site: (proxy, app).
    pub fn split(self, site: SiteId) -> (usize, usize) {
        (self.count(Role { site, tier: Tier::Proxy }), self.count(Role { site, tier: Tier::App }))
    }
}

impl fmt::Debug for RoleTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RoleTable({})", self.describe())
    }
}

/// Builds the starting table of a data center: for each website, its nodes given as
/// `(proxies, apps)`, assigned in node order.
pub fn initial_table(sites: &[(usize, usize)]) -> RoleTable {
    let mut roles = Vec::new();
    for (site, &(p, a)) in sites.iter().enumerate() {
        roles.extend(std::iter::repeat_n(Some(Role::new(site as u8, Tier::Proxy)), p));
        roles.extend(std::iter::repeat_n(Some(Role::new(site as u8, Tier::App)), a));
    }
    RoleTable::from_roles(&roles, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for site in 0..SITES_MAX as u8 {
            for tier in Tier::ALL {
                let r = Role::new(site, tier);
                assert_eq!(Role::from_code(r.code()), Some(r));
            }
        }
        assert_eq!(Role::from_code(0), None);
        assert_eq!(Role::from_code(7), None);
    }

    #[test]
    fn change_bumps_epoch_and_moves_one_node() {
        let t = initial_table(&[(3, 4)]);
        assert_eq!(t.split(SiteId(0)), (3, 4));
        let u = t.with_role(NodeIndex(3), Some(Role::new(0, Tier::Proxy)));
        assert_eq!(u.epoch(), t.epoch() + 1);
        assert_eq!(u.split(SiteId(0)), (4, 3));
        assert!(u.validate().is_ok());
    }

    #[test]
    fn empty_tier_is_rejected() {
        let t = initial_table(&[(1, 2)]);
        let u = t.with_role(NodeIndex(0), Some(Role::new(0, Tier::App)));
        assert_eq!(u.validate(), Err(TableError::EmptyTier { site: 0, tier: Tier::Proxy }));
    }

    #[test]
    fn epoch_wraps() {
        let t = RoleTable::from_roles(&[Some(Role::new(0, Tier::Proxy)), Some(Role::new(0, Tier::App))], u16::MAX);
        let u = t.with_role(NodeIndex(2), Some(Role::new(0, Tier::App)));
        assert_eq!(u.epoch(), 0);
        assert_eq!(u.split(SiteId(0)), (1, 2));
    }
}

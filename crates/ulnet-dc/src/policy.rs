//! The helper module's decision: when a tier has been overloaded for the history window
//! and another can spare nodes, propose a new role table that moves them.
//!
//! [`Helper`] is a pure state machine (no clock, no I/O). Its driver calls, every
//! [`HelperConfig::sensitivity`]:
//!
//! 1. [`Helper::handle_observation`] with `now`, the role word it read and the load records
//!    it accepted; it may return a [`Proposal`];
//! 2. for a proposal, compare-and-swap of the role word from [`Proposal::expected`] to
//!    [`Proposal::proposed`], then [`Helper::handle_cas`] with the outcome. A failed CAS
//!    returns the table another helper made: that becomes this helper's view, and it
//!    decides again from it at its next look. The winner announces the new table.
//!
//! Rules (thesis chapter 3 and 6):
//! - *Load equivalence.* A tier's pressure is (busy workers + waiting requests) / workers
//!   over its nodes: queueing at the proxies (cache I/O) and at the application servers
//!   (CPU) counts the same.
//! - *History.* A tier must stay at or above [`HelperConfig::overload_pressure`] for
//!   [`HelperConfig::history_window`] (T) before nodes move into it.
//! - *Settle.* After any change this helper sees, it waits [`HelperConfig::settle`] so the
//!   load records show the new configuration before it acts on them again.
//! - *Donors.* A tier gives nodes only if its busy workers, spread over the nodes it keeps,
//!   stay under [`HelperConfig::donor_utilization_max`]; the least busy node goes first.
//! - *Priorities.* Site 0 has the highest priority. An overloaded site with no donor of its
//!   own pulls from the lowest-priority site that has nodes above the floor, whatever that
//!   site's load (as many as one change may move); a lower-priority site gets a node back
//!   from a higher one, one per change, only when the higher one stays under
//!   [`HelperConfig::release_utilization_max`] without it and has no overloaded tier.
//! - *Shares.* Each site is entitled to a number of nodes ([`HelperConfig::shares`]: its
//!   starting split). A site below its share has lent nodes to lower-priority sites while it
//!   did not need them; as soon as one of its tiers is overloaded it takes back all it lent
//!   that the lower sites can give, in one change and without waiting for the history
//!   window. T filters bursts too short to pay for a move; a node the site lent is one its
//!   guarantee already counts on, and every second spent on the floor is a snapshot missed
//!   (thesis chapter 6: resources flow out of and back into the higher-priority cluster
//!   with its load). Beyond its share a site pulls by the rules above.
//! - *Floor.* No proposal leaves a site's tier with fewer than
//!   [`crate::role::TIER_NODES_MIN`] nodes; every proposal passes [`RoleTable::validate`].

use crate::load::LoadRecord;
use crate::role::{NodeIndex, Role, RoleTable, SiteId, Tier, SITES_MAX, TIER_NODES_MIN};
use crate::state::CasOutcome;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Settings of a helper module. Profiles: [`HelperConfig::lab`] (the default),
/// [`HelperConfig::cluster`].
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct HelperConfig {
    /// S, the sensitivity: time between two looks at the shared state. Smaller reacts to
    /// short bursts, larger costs fewer reads (thesis figure 5.12: 0.2–1.8 s).
    pub sensitivity: Duration,
    /// T, the history window: how long a tier must stay overloaded before nodes move into
    /// it. Smaller follows shorter bursts, larger avoids thrashing on them.
    pub history_window: Duration,
    /// Pressure at or above which a tier is overloaded. 0.9: queueing has started.
    pub overload_pressure: f64,
    /// A tier donates only if its busy workers fit in the nodes it keeps at this
    /// utilization. 0.6: the donor keeps headroom for its own next requests.
    pub donor_utilization_max: f64,
    /// A higher-priority site returns a node to a lower one only below this utilization
    /// without it. 0.4: stricter than donating within a site, so a site is not stripped by
    /// a lower one between two of its own bursts.
    pub release_utilization_max: f64,
    /// Wait after a change before acting again: at least the load records' averaging window
    /// (see [`crate::node::NodeConfig::load_window`]) so they reflect the change.
    pub settle: Duration,
    /// Most nodes one change moves. Moving the spare nodes of an idle tier together halves
    /// the time a burst runs on the wrong split; the donor rule still limits it.
    pub nodes_per_change_max: usize,
    /// A record whose version has not moved for this long is stale (its node stopped).
    pub stale_after: Duration,
    /// Nodes each website is entitled to, site 0 first (a center sets its sites' starting
    /// splits). All zero, the default: no site reclaims without the history window.
    #[serde(default)]
    pub shares: [u8; SITES_MAX],
}

impl HelperConfig {
    /// A center on one host or a LAN with bursts lasting seconds: S = 200 ms, T = 400 ms.
    pub fn lab() -> Self {
        HelperConfig {
            sensitivity: Duration::from_millis(200),
            history_window: Duration::from_millis(400),
            overload_pressure: 0.9,
            donor_utilization_max: 0.6,
            release_utilization_max: 0.4,
            settle: Duration::from_millis(300),
            nodes_per_change_max: 3,
            stale_after: Duration::from_millis(1000),
            shares: [0; SITES_MAX],
        }
    }

    /// A production cluster with longer-lived load shifts: S = 1 s, T = 5 s (fewer moves,
    /// less sensitivity to short bursts, as the thesis recommends for long bursts).
    pub fn cluster() -> Self {
        HelperConfig {
            sensitivity: Duration::from_secs(1),
            history_window: Duration::from_secs(5),
            settle: Duration::from_secs(2),
            stale_after: Duration::from_secs(5),
            nodes_per_change_max: 1,
            ..Self::lab()
        }
    }
}

impl Default for HelperConfig {
    fn default() -> Self {
        Self::lab()
    }
}

/// The part of a node's load record the decision uses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NodeLoad {
    /// Workers of the node.
    pub workers: f64,
    /// Busy workers (window average).
    pub busy: f64,
    /// Requests waiting for a worker (window average).
    pub queued: f64,
}

impl From<&LoadRecord> for NodeLoad {
    fn from(r: &LoadRecord) -> Self {
        NodeLoad {
            workers: f64::from(r.workers),
            busy: f64::from(r.busy_milli) / 1000.0,
            queued: f64::from(r.queued_milli) / 1000.0,
        }
    }
}

/// A proposed change of the role word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proposal {
    /// The table the decision was made on: the CAS's compare value.
    pub expected: RoleTable,
    /// The new table: the CAS's swap value.
    pub proposed: RoleTable,
    /// The role the moved nodes take (for a departure: the role the first departed node
    /// served).
    pub to: Role,
    /// How many nodes move.
    pub moved: usize,
    /// How many departed nodes the change takes out of the table.
    pub removed: usize,
}

/// What a helper counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelperCounters {
    /// Looks at the shared state.
    pub observations: u64,
    /// Proposals made.
    pub proposals: u64,
    /// Compare-and-swaps won (this helper reconfigured the center).
    pub cas_won: u64,
    /// Compare-and-swaps lost (another helper changed the table first).
    pub cas_lost: u64,
    /// Departed nodes this helper's won compare-and-swaps took out of the table.
    pub departures: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct TierLoad {
    nodes: usize,
    known: usize,
    workers: f64,
    busy: f64,
    queued: f64,
}

impl TierLoad {
    fn pressure(&self) -> f64 {
        if self.workers > 0.0 {
            (self.busy + self.queued) / self.workers
        } else {
            0.0
        }
    }
}

/// One node's helper module: its view of the table and its history of overloads.
#[derive(Debug)]
pub struct Helper {
    config: HelperConfig,
    view: RoleTable,
    overloaded_since: [[Option<Instant>; 2]; SITES_MAX],
    last_change: Option<Instant>,
    counters: HelperCounters,
}

impl Helper {
    /// A helper starting from `view`.
    pub fn new(config: HelperConfig, view: RoleTable) -> Self {
        Helper {
            config,
            view,
            overloaded_since: Default::default(),
            last_change: None,
            counters: HelperCounters::default(),
        }
    }

    /// The table this helper believes in.
    pub fn view(&self) -> RoleTable {
        self.view
    }

    /// Counters so far.
    pub fn counters(&self) -> HelperCounters {
        self.counters
    }

    /// The settings.
    pub fn config(&self) -> &HelperConfig {
        &self.config
    }

    fn adopt(&mut self, now: Instant, table: RoleTable) {
        if table != self.view {
            self.view = table;
            self.last_change = Some(now);
        }
    }

    /// One look: the role word read at `now` and the accepted load records by node index
    /// (`None`: absent, stale or forged — such a node is neither counted nor moved).
    pub fn handle_observation(
        &mut self,
        now: Instant,
        table: RoleTable,
        loads: &[Option<NodeLoad>],
    ) -> Option<Proposal> {
        self.counters.observations += 1;
        self.adopt(now, table);
        let tiers = self.tier_loads(loads);
        for (site, per_site) in tiers.iter().enumerate() {
            for tier in Tier::ALL {
                let t = per_site[tier as usize];
                let since = &mut self.overloaded_since[site][tier as usize];
                if t.known > 0 && t.pressure() >= self.config.overload_pressure {
                    since.get_or_insert(now);
                } else {
                    *since = None;
                }
            }
        }
        if self.last_change.is_some_and(|t| now.saturating_duration_since(t) < self.config.settle) {
            return None;
        }
        let proposal = self.decide(now, &tiers, loads)?;
        assert!(
            proposal.proposed.validate().is_ok(),
            "invariant: a proposal keeps every tier populated and every node in one role ({:?})",
            proposal.proposed
        );
        self.counters.proposals += 1;
        Some(proposal)
    }

    /// The outcome of the compare-and-swap of `proposal`.
    pub fn handle_cas(&mut self, now: Instant, proposal: &Proposal, outcome: CasOutcome) {
        match outcome {
            CasOutcome::Swapped => {
                self.counters.cas_won += 1;
                self.counters.departures += proposal.removed as u64;
                self.adopt(now, proposal.proposed);
            }
            CasOutcome::Failed(actual) => {
                self.counters.cas_lost += 1;
                self.adopt(now, actual);
            }
        }
    }

    /// Membership says the nodes of `departed` died: a proposal that takes those still in
    /// the table out of it, in one change, with no history window or settle time (a dead
    /// node gets requests until it is out). A tier the departure leaves empty gets a node in
    /// the same change: the least busy node of the site's other tier if it has two or more,
    /// else one from another site (lowest priority first) that keeps its own floor (a site
    /// all of whose nodes died gets one node per tier that way too). `None`
    /// when no departed node is in the table, or when no valid table without them exists (a
    /// site left with one live node and no other site to lend it one): they then stay in
    /// the word, and get no requests once their records go stale.
    pub fn handle_departures(
        &mut self,
        now: Instant,
        table: RoleTable,
        departed: &[NodeIndex],
        loads: &[Option<NodeLoad>],
    ) -> Option<Proposal> {
        self.adopt(now, table);
        let gone: Vec<NodeIndex> = departed.iter().copied().filter(|n| self.view.role(*n).is_some()).collect();
        let first = self.view.role(*gone.first()?)?;
        let mut changes: Vec<(NodeIndex, Option<Role>)> = gone.iter().map(|n| (*n, None)).collect();
        let mut moved = 0;
        for site in 0..SITES_MAX as u8 {
            for tier in Tier::ALL {
                let t = self.view.with_changes(&changes);
                let role = Role::new(site, tier);
                if self.view.site_nodes(role.site) == 0 || t.count(role) >= TIER_NODES_MIN {
                    continue;
                }
                let Some(donor) = Self::refill_donor(t, role, loads) else {
                    tracing::error!(table = ?t, %role, "a departure leaves a tier empty and no node can fill it");
                    return None;
                };
                changes.push((donor, Some(role)));
                moved += 1;
            }
        }
        let proposed = self.view.with_changes(&changes);
        if proposed.validate().is_err() {
            tracing::error!(table = ?proposed, "no valid table without the departed nodes");
            return None;
        }
        self.counters.proposals += 1;
        Some(Proposal { expected: self.view, proposed, to: first, moved, removed: gone.len() })
    }

    /// Nodes of `returned` are out of the table but alive again (membership excluded them,
    /// say a busy host starved them past the failure detector, and then took them back) and
    /// publishing fresh records: a proposal that gives the first of them back to its home
    /// site (the site whose share, counted in node order as the starting table assigns
    /// nodes, holds it; site 0 without shares), in that site's tier under the most
    /// pressure. No history window: a live node out of the table is capacity nobody uses.
    /// `None` when none of them is out of the table.
    pub fn handle_returns(
        &mut self,
        now: Instant,
        table: RoleTable,
        returned: &[NodeIndex],
        loads: &[Option<NodeLoad>],
    ) -> Option<Proposal> {
        self.adopt(now, table);
        let node = returned.iter().copied().find(|n| self.view.role(*n).is_none())?;
        let site = self.home_site(node);
        let tiers = self.tier_loads(loads);
        let pressure = |t: Tier| tiers[usize::from(site)][t as usize].pressure();
        let tier = if pressure(Tier::App) > pressure(Tier::Proxy) { Tier::App } else { Tier::Proxy };
        let to = Role::new(site, tier);
        let proposed = self.view.with_changes(&[(node, Some(to))]);
        if proposed.validate().is_err() {
            return None;
        }
        self.counters.proposals += 1;
        Some(Proposal { expected: self.view, proposed, to, moved: 1, removed: 0 })
    }

    /// The site whose share holds `node`, counting shares in node order.
    fn home_site(&self, node: NodeIndex) -> u8 {
        let mut end = 0;
        for (site, share) in self.config.shares.iter().enumerate() {
            end += usize::from(*share);
            if node.get() < end {
                return site as u8;
            }
        }
        0
    }

    /// A node of `t` that can move into the empty `role`: from the same site's other tier,
    /// else from the other sites, lowest priority first; from a tier that keeps its floor;
    /// least busy first (a node of unknown load last).
    fn refill_donor(t: RoleTable, role: Role, loads: &[Option<NodeLoad>]) -> Option<NodeIndex> {
        let mut donors = vec![Role::new(role.site.0, role.tier.other())];
        for site in (0..SITES_MAX as u8).rev().filter(|s| *s != role.site.0) {
            donors.extend(Tier::ALL.map(|tier| Role::new(site, tier)));
        }
        donors.into_iter().filter(|d| t.count(*d) > TIER_NODES_MIN).find_map(|d| {
            t.nodes_in(d).min_by(|a, b| {
                let busy = |n: &NodeIndex| loads.get(n.get()).copied().flatten().map_or(f64::INFINITY, |l| l.busy);
                busy(a).total_cmp(&busy(b))
            })
        })
    }

    fn tier_loads(&self, loads: &[Option<NodeLoad>]) -> [[TierLoad; 2]; SITES_MAX] {
        let mut out = [[TierLoad::default(); 2]; SITES_MAX];
        for (node, role) in self.view.members() {
            let t = &mut out[usize::from(role.site.0)][role.tier as usize];
            t.nodes += 1;
            if let Some(Some(l)) = loads.get(node.get()) {
                t.known += 1;
                t.workers += l.workers;
                t.busy += l.busy;
                t.queued += l.queued;
            }
        }
        out
    }

    fn overloaded(&self, role: Role) -> bool {
        self.overloaded_since[usize::from(role.site.0)][role.tier as usize].is_some()
    }

    /// Nodes `site` lent out: how far it is below its share.
    fn lent(&self, site: u8) -> usize {
        usize::from(self.config.shares[usize::from(site)]).saturating_sub(self.view.site_nodes(SiteId(site)))
    }

    fn overloaded_long_enough(&self, now: Instant, role: Role) -> bool {
        self.overloaded_since[usize::from(role.site.0)][role.tier as usize]
            .is_some_and(|since| now.saturating_duration_since(since) >= self.config.history_window)
    }

    /// Members of `role` with known loads, least busy first (ties: higher index first).
    fn candidates(&self, role: Role, loads: &[Option<NodeLoad>]) -> Vec<(NodeIndex, NodeLoad)> {
        let mut c: Vec<(NodeIndex, NodeLoad)> =
            self.view.nodes_in(role).filter_map(|n| loads.get(n.get()).copied().flatten().map(|l| (n, l))).collect();
        c.sort_by(|a, b| a.1.busy.total_cmp(&b.1.busy).then(b.0.cmp(&a.0)));
        c
    }

    /// Up to `limit` nodes of `donor` that can leave it with its busy workers, spread over
    /// the rest, under `utilization_max` (`None`: no load limit, only the floor).
    fn spare(
        &self,
        donor: Role,
        tier: TierLoad,
        loads: &[Option<NodeLoad>],
        utilization_max: Option<f64>,
        limit: usize,
    ) -> Vec<NodeIndex> {
        let mut picked = Vec::new();
        if tier.known < tier.nodes {
            return picked; // a node of unknown load may be busy: do not judge the tier
        }
        let (mut nodes, mut workers) = (tier.nodes, tier.workers);
        for (n, l) in self.candidates(donor, loads) {
            if picked.len() >= limit || nodes <= TIER_NODES_MIN {
                break;
            }
            let rest = workers - l.workers;
            if let Some(max) = utilization_max {
                if rest <= 0.0 || tier.busy / rest >= max || tier.pressure() >= self.config.overload_pressure {
                    break;
                }
            }
            picked.push(n);
            nodes -= 1;
            workers = rest;
        }
        picked
    }

    fn decide(&self, now: Instant, tiers: &[[TierLoad; 2]; SITES_MAX], loads: &[Option<NodeLoad>]) -> Option<Proposal> {
        let limit = self.config.nodes_per_change_max.max(1);
        for site in 0..SITES_MAX as u8 {
            let lent = self.lent(site);
            let mut wanting: Vec<Tier> = Tier::ALL
                .into_iter()
                .filter(|t| {
                    let role = Role::new(site, *t);
                    self.overloaded_long_enough(now, role) || (lent > 0 && self.overloaded(role))
                })
                .collect();
            wanting.sort_by(|a, b| {
                let p = |t: &Tier| tiers[usize::from(site)][*t as usize].pressure();
                p(b).total_cmp(&p(a))
            });
            for tier in wanting {
                let to = Role::new(site, tier);
                let waited = self.overloaded_long_enough(now, to);
                // 1. The other tier of the same site (after the history window).
                let own = Role::new(site, tier.other());
                let spare = if waited {
                    self.spare(
                        own,
                        tiers[usize::from(site)][tier.other() as usize],
                        loads,
                        Some(self.config.donor_utilization_max),
                        limit,
                    )
                } else {
                    Vec::new()
                };
                if !spare.is_empty() {
                    return Some(self.propose(to, &spare));
                }
                // 2. Lower-priority sites, lowest first, whatever their load: what this site
                // lent at once and in one change, more after the history window.
                let pull = if waited { limit.max(lent) } else { lent };
                let mut taken = Vec::new();
                for low in (site + 1..SITES_MAX as u8).rev() {
                    for donor_tier in self.by_utilization(tiers, low) {
                        let donor = Role::new(low, donor_tier);
                        let left = pull - taken.len();
                        if left == 0 {
                            break;
                        }
                        let t = tiers[usize::from(low)][donor_tier as usize];
                        taken.extend(self.spare(donor, t, loads, None, left));
                    }
                }
                if !taken.is_empty() {
                    return Some(self.propose(to, &taken));
                }
                // 3. Higher-priority sites, only what they do not need.
                for high in 0..site {
                    for donor_tier in self.by_utilization(tiers, high) {
                        let donor = Role::new(high, donor_tier);
                        if self.overloaded_since[usize::from(high)].iter().any(Option::is_some) {
                            continue;
                        }
                        let spare = self.spare(
                            donor,
                            tiers[usize::from(high)][donor_tier as usize],
                            loads,
                            Some(self.config.release_utilization_max),
                            1,
                        );
                        if !spare.is_empty() {
                            return Some(self.propose(to, &spare));
                        }
                    }
                }
            }
        }
        None
    }

    /// The tiers of a site, least utilized first.
    fn by_utilization(&self, tiers: &[[TierLoad; 2]; SITES_MAX], site: u8) -> [Tier; 2] {
        let t = &tiers[usize::from(site)];
        let u = |x: &TierLoad| if x.workers > 0.0 { x.busy / x.workers } else { 0.0 };
        if u(&t[1]) < u(&t[0]) {
            [Tier::App, Tier::Proxy]
        } else {
            [Tier::Proxy, Tier::App]
        }
    }

    fn propose(&self, to: Role, nodes: &[NodeIndex]) -> Proposal {
        Proposal {
            expected: self.view,
            proposed: self.view.with_roles(nodes, Some(to)),
            to,
            moved: nodes.len(),
            removed: 0,
        }
    }
}

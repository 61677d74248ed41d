//! The helper's decision logic: history window, donors, priorities, CAS outcomes, and the
//! invariant that concurrent decisions never leave a tier empty or a node in two tiers.

use proptest::prelude::*;
use std::time::{Duration, Instant};
use ulnet_dc::policy::{Helper, HelperConfig, NodeLoad};
use ulnet_dc::role::{initial_table, NodeIndex, Role, RoleTable, SiteId, Tier, NODES_MAX};
use ulnet_dc::state::CasOutcome;

const BUSY: NodeLoad = NodeLoad { workers: 2.0, busy: 2.0, queued: 8.0 };
const IDLE: NodeLoad = NodeLoad { workers: 2.0, busy: 0.05, queued: 0.0 };
const HALF: NodeLoad = NodeLoad { workers: 2.0, busy: 1.6, queued: 0.0 };

fn loads_by_role(table: RoleTable, f: impl Fn(Role) -> NodeLoad) -> Vec<Option<NodeLoad>> {
    (0..NODES_MAX as u8).map(|i| table.role(NodeIndex(i)).map(&f)).collect()
}

fn config() -> HelperConfig {
    HelperConfig {
        history_window: Duration::from_millis(400),
        settle: Duration::from_millis(300),
        nodes_per_change_max: 3,
        ..HelperConfig::lab()
    }
}

#[test]
fn static_burst_moves_idle_app_nodes_to_the_proxy_tier_after_the_history_window() {
    let table = initial_table(&[(3, 4)]);
    let loads = loads_by_role(table, |r| if r.tier == Tier::Proxy { BUSY } else { IDLE });
    let mut h = Helper::new(config(), table);
    let t0 = Instant::now();
    assert_eq!(h.handle_observation(t0, table, &loads), None, "overloaded for 0 ms < T");
    assert_eq!(h.handle_observation(t0 + Duration::from_millis(200), table, &loads), None, "200 ms < T");
    let p = h.handle_observation(t0 + Duration::from_millis(400), table, &loads).expect("overloaded for T");
    assert_eq!(p.expected, table);
    assert_eq!(p.to, Role::new(0, Tier::Proxy));
    assert_eq!(p.moved, 3);
    assert_eq!(p.proposed.split(SiteId(0)), (6, 1), "the app tier keeps its floor");
    assert_eq!(p.proposed.epoch(), table.epoch() + 1, "one change, one epoch");
}

#[test]
fn a_short_overload_moves_nothing() {
    let table = initial_table(&[(3, 4)]);
    let hot = loads_by_role(table, |r| if r.tier == Tier::Proxy { BUSY } else { IDLE });
    let calm = loads_by_role(table, |_| IDLE);
    let mut h = Helper::new(config(), table);
    let t0 = Instant::now();
    assert!(h.handle_observation(t0, table, &hot).is_none());
    assert!(h.handle_observation(t0 + Duration::from_millis(300), table, &calm).is_none());
    assert!(h.handle_observation(t0 + Duration::from_millis(500), table, &hot).is_none(), "history restarted");
    assert!(h.handle_observation(t0 + Duration::from_millis(900), table, &hot).is_some());
}

#[test]
fn a_busy_donor_gives_nothing() {
    let table = initial_table(&[(3, 4)]);
    let loads = loads_by_role(table, |r| if r.tier == Tier::Proxy { BUSY } else { HALF });
    let mut h = Helper::new(config(), table);
    let t0 = Instant::now();
    for ms in [0, 400, 800] {
        assert!(h.handle_observation(t0 + Duration::from_millis(ms), table, &loads).is_none());
    }
}

#[test]
fn a_donor_node_of_unknown_load_blocks_the_move() {
    let table = initial_table(&[(3, 4)]);
    let mut loads = loads_by_role(table, |r| if r.tier == Tier::Proxy { BUSY } else { IDLE });
    loads[5] = None; // an app node whose record was stale or forged
    let mut h = Helper::new(config(), table);
    let t0 = Instant::now();
    h.handle_observation(t0, table, &loads);
    assert!(h.handle_observation(t0 + Duration::from_millis(500), table, &loads).is_none());
}

#[test]
fn a_lost_cas_adopts_the_returned_table_and_settles() {
    let table = initial_table(&[(3, 4)]);
    let loads = loads_by_role(table, |r| if r.tier == Tier::Proxy { BUSY } else { IDLE });
    let mut h = Helper::new(config(), table);
    let t0 = Instant::now();
    h.handle_observation(t0, table, &loads);
    let now = t0 + Duration::from_millis(400);
    let p = h.handle_observation(now, table, &loads).unwrap();
    let theirs = table.with_role(NodeIndex(6), Some(Role::new(0, Tier::Proxy)));
    h.handle_cas(now, &p, CasOutcome::Failed(theirs));
    assert_eq!(h.view(), theirs);
    assert_eq!(h.counters().cas_lost, 1);
    let loads = loads_by_role(theirs, |r| if r.tier == Tier::Proxy { BUSY } else { IDLE });
    assert!(h.handle_observation(now + Duration::from_millis(100), theirs, &loads).is_none(), "settling");
    let p = h.handle_observation(now + Duration::from_millis(300), theirs, &loads).unwrap();
    assert_eq!(p.expected, theirs, "decides again from the returned view");
    assert_eq!(p.proposed.split(SiteId(0)), (6, 1));
}

/// Site 0 (high priority) on 5 nodes, site 1 on 2.
fn two_sites() -> RoleTable {
    initial_table(&[(2, 3), (1, 1)])
}

#[test]
fn the_high_priority_site_pulls_from_the_low_one_whatever_its_load() {
    let table = initial_table(&[(2, 3), (2, 1)]);
    let loads = loads_by_role(table, |r| if r.site.0 == 0 { BUSY } else { HALF });
    let mut h = Helper::new(config(), table);
    let t0 = Instant::now();
    h.handle_observation(t0, table, &loads);
    let p = h.handle_observation(t0 + Duration::from_millis(400), table, &loads).unwrap();
    assert_eq!(p.to.site, SiteId(0));
    assert_eq!(p.moved, 1);
    assert_eq!(p.proposed.split(SiteId(1)), (1, 1), "the low site keeps its floor");
}

#[test]
fn the_low_priority_site_gets_only_what_the_high_one_does_not_need() {
    let table = two_sites();
    let t0 = Instant::now();
    // Site 0 is busy: site 1 gets nothing from it, however loaded site 1 is.
    let loads = loads_by_role(table, |r| if r.site.0 == 0 { HALF } else { BUSY });
    let mut h = Helper::new(config(), table);
    h.handle_observation(t0, table, &loads);
    assert!(h.handle_observation(t0 + Duration::from_millis(500), table, &loads).is_none());
    // Site 0 is idle: site 1 gets one node at a time.
    let loads = loads_by_role(table, |r| if r.site.0 == 0 { IDLE } else { BUSY });
    let mut h = Helper::new(config(), table);
    h.handle_observation(t0, table, &loads);
    let p = h.handle_observation(t0 + Duration::from_millis(500), table, &loads).unwrap();
    assert_eq!((p.to.site, p.moved), (SiteId(1), 1));
    let (p0, a0) = p.proposed.split(SiteId(0));
    assert_eq!(p0 + a0, 4);
}

#[test]
fn a_site_below_its_share_takes_back_what_it_lent_at_once_and_in_one_change() {
    // Site 0 (share 5) lent three nodes to site 1 (share 2) and sits on its floor.
    let table = initial_table(&[(1, 1), (2, 3)]);
    let loads = loads_by_role(table, |r| if r.site.0 == 0 && r.tier == Tier::Proxy { BUSY } else { HALF });
    let shares = HelperConfig { shares: [5, 2, 0], ..config() };
    let t0 = Instant::now();
    let p = Helper::new(shares, table).handle_observation(t0, table, &loads).expect("no history window for a reclaim");
    assert_eq!((p.to, p.moved), (Role::new(0, Tier::Proxy), 3), "all it lent, in one change");
    assert_eq!(p.proposed.split(SiteId(0)), (4, 1));
    assert_eq!(p.proposed.split(SiteId(1)), (1, 1), "the low site keeps its floor");
    // Without shares the pull waits for the history window, and moves what one change may.
    let mut h = Helper::new(config(), table);
    assert!(h.handle_observation(t0, table, &loads).is_none());
    let p = h.handle_observation(t0 + Duration::from_millis(400), table, &loads).unwrap();
    assert_eq!(p.proposed.split(SiteId(0)), (4, 1));
    // At its share, a site pulls more only after the history window.
    let table = initial_table(&[(2, 3), (1, 1), (1, 1)]);
    let loads = loads_by_role(table, |r| if r.site.0 == 0 && r.tier == Tier::Proxy { BUSY } else { IDLE });
    let mut h = Helper::new(HelperConfig { shares: [5, 1, 1], ..config() }, table);
    assert!(h.handle_observation(t0, table, &loads).is_none(), "site 0 holds its share: no reclaim");
}

/// Each site's share: its starting split, as a center sets it.
fn shares_of(sites: &[(usize, usize)]) -> [u8; 3] {
    let mut shares = [0; 3];
    for (share, (p, a)) in shares.iter_mut().zip(sites) {
        *share = (p + a) as u8;
    }
    shares
}

/// One helper's step in a random schedule.
#[derive(Clone, Debug)]
struct Step {
    helper: usize,
    /// Milliseconds since the previous step.
    advance_ms: u64,
    /// Load per node as this helper sees it (possibly stale).
    loads: Vec<Option<(u8, u8)>>,
    /// Whether the helper reads the word fresh or decides on its old view.
    fresh_read: bool,
}

fn step(helpers: usize) -> impl Strategy<Value = Step> {
    (
        0..helpers,
        0u64..400,
        proptest::collection::vec(proptest::option::weighted(0.9, (0u8..=2, 0u8..=10)), NODES_MAX),
        any::<bool>(),
    )
        .prop_map(|(helper, advance_ms, loads, fresh_read)| Step { helper, advance_ms, loads, fresh_read })
}

fn check(table: RoleTable, members: usize) -> Result<(), TestCaseError> {
    prop_assert!(table.validate().is_ok(), "invalid table {table:?}: {:?}", table.validate());
    prop_assert_eq!(table.members().count(), members, "a node left or appeared: {:?}", table);
    // Each member has exactly one role: the per-role counts add up to the members.
    let mut counted = 0;
    for site in 0..3 {
        for tier in Tier::ALL {
            counted += table.count(Role::new(site, tier));
        }
    }
    prop_assert_eq!(counted, members, "a node counted in two tiers: {:?}", table);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Every helper decides on its own (often stale) view and loads, and CASes the shared
    /// word; whatever the interleaving, every table the word ever holds is valid.
    #[test]
    fn concurrent_decisions_keep_every_tier_populated(
        sites in prop_oneof![Just(vec![(3usize, 4usize)]), Just(vec![(2, 3), (1, 1)]), Just(vec![(1, 1), (1, 1), (1, 2)])],
        steps in proptest::collection::vec(step(7), 1..120),
        per_change in 1usize..=4,
    ) {
        let start = initial_table(&sites);
        let members = start.members().count();
        let mut word = start;
        let cfg = HelperConfig { nodes_per_change_max: per_change, history_window: Duration::from_millis(100), settle: Duration::from_millis(50), shares: shares_of(&sites), ..HelperConfig::lab() };
        let mut helpers: Vec<Helper> = (0..7).map(|_| Helper::new(cfg, start)).collect();
        let mut now = Instant::now();
        for s in steps {
            now += Duration::from_millis(s.advance_ms);
            let loads: Vec<Option<NodeLoad>> = s.loads.iter().map(|l| l.map(|(busy, queued)| NodeLoad {
                workers: 2.0, busy: f64::from(busy), queued: f64::from(queued),
            })).collect();
            let h = &mut helpers[s.helper];
            let seen = if s.fresh_read { word } else { h.view() };
            if let Some(p) = h.handle_observation(now, seen, &loads) {
                check(p.proposed, members)?;
                let outcome = if word == p.expected {
                    word = p.proposed;
                    CasOutcome::Swapped
                } else {
                    CasOutcome::Failed(word)
                };
                h.handle_cas(now, &p, outcome);
                check(word, members)?;
            }
        }
    }
}

#[test]
fn a_departure_takes_the_dead_node_out_and_refills_its_tier() {
    let table = initial_table(&[(2, 3)]);
    let loads = loads_by_role(table, |r| if r.tier == Tier::Proxy { HALF } else { IDLE });
    let mut h = Helper::new(config(), table);
    let now = Instant::now();
    // Node 0, a proxy, died: it goes, and the proxy tier keeps node 1.
    let p = h.handle_departures(now, table, &[NodeIndex(0)], &loads).unwrap();
    assert_eq!((p.removed, p.moved), (1, 0));
    assert_eq!(p.proposed.role(NodeIndex(0)), None);
    assert_eq!(p.proposed.split(SiteId(0)), (1, 3));
    assert_eq!(p.proposed.epoch(), table.epoch() + 1, "one change");
    // Both proxies died: an application node moves to the proxy tier in the same change.
    let p = h.handle_departures(now, table, &[NodeIndex(0), NodeIndex(1)], &loads).unwrap();
    assert_eq!((p.removed, p.moved), (2, 1));
    assert_eq!(p.proposed.split(SiteId(0)), (1, 2));
    assert!(p.proposed.validate().is_ok());
    // A node already out of the table: nothing to do.
    h.handle_cas(now, &p, CasOutcome::Swapped);
    assert_eq!(h.counters().departures, 2);
    assert!(h.handle_departures(now, p.proposed, &[NodeIndex(0)], &loads).is_none());
}

#[test]
fn a_node_membership_took_back_returns_to_its_home_site_and_busier_tier() {
    // Site 1's application node (node 6) was excluded and is back; site 1's proxy is busy.
    let start = two_sites();
    let table = start.with_changes(&[(NodeIndex(6), None), (NodeIndex(4), Some(Role::new(1, Tier::App)))]);
    assert!(table.validate().is_ok());
    let loads = loads_by_role(table, |r| if r == Role::new(1, Tier::Proxy) { BUSY } else { IDLE });
    let mut h = Helper::new(HelperConfig { shares: [5, 2, 0], ..config() }, table);
    let now = Instant::now();
    let p = h.handle_returns(now, table, &[NodeIndex(6)], &loads).expect("a live node out of the table comes back");
    assert_eq!((p.to, p.moved, p.removed), (Role::new(1, Tier::Proxy), 1, 0), "home site 1, its busier tier");
    assert_eq!(p.proposed.split(SiteId(1)), (2, 1));
    assert_eq!(p.proposed.epoch(), table.epoch() + 1, "one change");
    // Without shares a returning node goes to site 0; a node still in the table is no return.
    let mut h = Helper::new(config(), table);
    assert_eq!(h.handle_returns(now, table, &[NodeIndex(6)], &loads).unwrap().to.site, SiteId(0));
    assert!(h.handle_returns(now, table, &[NodeIndex(2)], &loads).is_none());
}

#[test]
fn a_low_priority_site_that_loses_a_tier_gets_a_node_from_the_other_site() {
    let table = two_sites(); // site 1: node 5 proxy, node 6 app
    let loads = loads_by_role(table, |_| IDLE);
    let mut h = Helper::new(config(), table);
    let p = h.handle_departures(Instant::now(), table, &[NodeIndex(6)], &loads).unwrap();
    assert_eq!(p.proposed.split(SiteId(1)), (1, 1));
    assert_eq!(p.proposed.split(SiteId(0)).0 + p.proposed.split(SiteId(0)).1, 4);
    // A site left with one live node and no other site to lend: no valid table, no proposal.
    let lone = initial_table(&[(1, 1)]);
    let mut h = Helper::new(config(), lone);
    assert!(h.handle_departures(Instant::now(), lone, &[NodeIndex(0)], &loads).is_none());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Nodes die at random moments while the helpers of the living decide on their own
    /// (often stale) views; a helper that knows of a death proposes its departure first.
    /// Every table the word ever holds is valid, and once every living helper has looked
    /// after the last death, no dead node is left in the word.
    #[test]
    fn departures_and_decisions_keep_every_tier_populated(
        sites in prop_oneof![Just(vec![(3usize, 4usize)]), Just(vec![(2, 3), (1, 1)]), Just(vec![(1, 1), (1, 1), (1, 2)])],
        steps in proptest::collection::vec((step(7), proptest::option::weighted(0.05, 0u8..7)), 1..120),
    ) {
        let start = initial_table(&sites);
        let members = start.members().count();
        let deaths_max = members - 2 * sites.len();
        let mut word = start;
        let cfg = HelperConfig { history_window: Duration::from_millis(100), settle: Duration::from_millis(50), shares: shares_of(&sites), ..HelperConfig::lab() };
        let mut helpers: Vec<Helper> = (0..7).map(|_| Helper::new(cfg, start)).collect();
        let mut dead: Vec<NodeIndex> = Vec::new();
        let mut now = Instant::now();
        let decide = |h: &mut Helper, seen: RoleTable, loads: &[Option<NodeLoad>], dead: &[NodeIndex], now: Instant, word: &mut RoleTable| -> Result<(), TestCaseError> {
            let p = h.handle_departures(now, seen, dead, loads).or_else(|| h.handle_observation(now, seen, loads));
            if let Some(p) = p {
                prop_assert!(p.proposed.validate().is_ok(), "invalid proposal {:?}", p.proposed);
                let outcome = if *word == p.expected {
                    *word = p.proposed;
                    CasOutcome::Swapped
                } else {
                    CasOutcome::Failed(*word)
                };
                h.handle_cas(now, &p, outcome);
                prop_assert!(word.validate().is_ok(), "invalid table {:?}", word);
                prop_assert!(word.members().count() + dead.len() >= members, "a living node left: {:?}", word);
            }
            Ok(())
        };
        for (s, kill) in steps {
            if let Some(k) = kill {
                if dead.len() < deaths_max && !dead.contains(&NodeIndex(k)) {
                    dead.push(NodeIndex(k));
                }
            }
            now += Duration::from_millis(s.advance_ms);
            if dead.contains(&NodeIndex(s.helper as u8)) {
                continue;
            }
            let loads: Vec<Option<NodeLoad>> = s.loads.iter().enumerate().map(|(i, l)| {
                if dead.contains(&NodeIndex(i as u8)) { return None; }
                l.map(|(busy, queued)| NodeLoad { workers: 2.0, busy: f64::from(busy), queued: f64::from(queued) })
            }).collect();
            let h = &mut helpers[s.helper];
            let seen = if s.fresh_read { word } else { h.view() };
            decide(h, seen, &loads, &dead, now, &mut word)?;
        }
        // Every living helper looks once more, at the word itself.
        for (i, h) in helpers.iter_mut().enumerate() {
            if dead.contains(&NodeIndex(i as u8)) {
                continue;
            }
            now += Duration::from_millis(500);
            let loads = vec![None; NODES_MAX];
            decide(h, word, &loads, &dead, now, &mut word)?;
        }
        for d in &dead {
            prop_assert!(word.role(*d).is_none(), "dead {} still in {:?}", d, word);
        }
    }
}

//! Real processes in network namespaces: five `ulnet node` processes, one per host of a
//! `ulnet-netlab` lab, form one cluster over the lab's bridge; faults are the kernel's
//! (iptables DROP rules), not a simulation.
//!
//! - A 3|2 partition leaves the three-side in a new view of three with quorum and the
//!   two-side without quorum (in `cluster status --json` and as a `no_quorum` event, no new
//!   view installed); healing merges all five into one agreed view.
//! - A one-way cut (a node can no longer send to the buddy that watches it) gets one end of
//!   the broken link pruned through the connectivity matrix while the other four agree on
//!   one view with quorum; healing brings the fifth back.
//!
//! Throughout, every status report and every `view` event is checked: members of one view
//! number agree everywhere, and no two views held with quorum at the same poll are
//! disjoint. Needs root (namespaces, iptables); skips with the reason otherwise.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use ulnet_cluster::runtime::StatusReport;
use ulnet_cluster::Config;
use ulnet_netlab::Lab;

const NODES: usize = 5;
/// Every node listens on this port of its own host's address (one namespace each).
const PORT: u16 = 7400;
const SECRET: &str = "netns-partition-test-secret";
/// Pause between two rounds of status queries.
const POLL: Duration = Duration::from_millis(50);
/// Bounds on each phase: far above what the `local()` profile needs (formation well under
/// a second, a partition handled within `exclusion_bound()`, 3 s), so that only a
/// failure to converge — not a busy machine — trips them.
const FORM_LIMIT: Duration = Duration::from_secs(20);
const CHANGE_LIMIT: Duration = Duration::from_secs(15);

/// A lab with one `ulnet node` per host. Dropping it kills the nodes, then tears the lab
/// down; the directory of logs and events is kept when the test failed.
struct Cluster {
    nodes: Vec<Child>,
    lab: Lab,
    dir: PathBuf,
    /// Members of every view number seen so far (status reports and events).
    views: BTreeMap<u64, BTreeSet<String>>,
    /// When the nodes were started.
    started: Instant,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.nodes {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("logs and events kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn name(i: usize) -> String {
    format!("p{i}")
}

fn names(hosts: &[usize]) -> BTreeSet<String> {
    hosts.iter().map(|&i| name(i)).collect()
}

/// The members of the view a report is in (the dead it lists are recently removed ones).
fn view_members(r: &StatusReport) -> BTreeSet<String> {
    r.members.iter().filter(|m| m.state != "dead").map(|m| m.name.clone()).collect()
}

/// The view that every node of `hosts` is in, with quorum, when its members are exactly
/// `members`.
fn agreed(reports: &[Option<StatusReport>], hosts: &[usize], members: &BTreeSet<String>) -> Option<u64> {
    let first = reports[hosts[0]].as_ref()?.view;
    hosts
        .iter()
        .all(|&i| reports[i].as_ref().is_some_and(|r| r.quorum && r.view == first && view_members(r) == *members))
        .then_some(first)
}

impl Cluster {
    /// Five hosts, one node each; `None` (with the reason printed) where labs cannot exist.
    fn start(test: &str) -> Option<Cluster> {
        let lab = Lab::for_test(NODES)?;
        let dir = std::env::temp_dir().join(format!("ulnet-netns-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("secret"), SECRET).unwrap();
        let mut cluster = Cluster { nodes: Vec::new(), lab, dir, views: BTreeMap::new(), started: Instant::now() };
        for i in 0..NODES {
            let mut c = cluster.lab.command(cluster.lab.host(i), env!("CARGO_BIN_EXE_ulnet"));
            c.args(["node", "--name", &name(i), "--listen", &cluster.addr(i), "--profile", "local"]);
            c.arg("--secret-file").arg(cluster.dir.join("secret"));
            c.arg("--events-json").arg(cluster.dir.join(format!("{}.jsonl", name(i))));
            if i > 0 {
                let seeds: BTreeSet<String> = [0, i - 1].iter().map(|&j| cluster.addr(j)).collect();
                c.args(["--seeds", &seeds.into_iter().collect::<Vec<_>>().join(",")]);
            }
            let log = std::fs::File::create(cluster.dir.join(format!("{}.log", name(i)))).unwrap();
            c.env("ULNET_LOG", "info").env("NO_COLOR", "1").stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
            cluster.nodes.push(c.spawn().expect("spawning ulnet node in its namespace"));
        }
        Some(cluster)
    }

    fn addr(&self, i: usize) -> String {
        format!("{}:{PORT}", self.lab.host(i).addr())
    }

    /// Every node's `ulnet cluster status --json`, each asked from inside its own host
    /// (all queries run at once); `None` where a node did not answer.
    fn statuses(&self) -> Vec<Option<StatusReport>> {
        let queries: Vec<_> = (0..NODES)
            .map(|i| {
                let mut c = self.lab.command(self.lab.host(i), env!("CARGO_BIN_EXE_ulnet"));
                c.args(["cluster", "status", "--connect", &self.addr(i), "--json"]);
                c.arg("--secret-file").arg(self.dir.join("secret"));
                c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap()
            })
            .collect();
        queries
            .into_iter()
            .map(|q| {
                let out = q.wait_with_output().unwrap();
                out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
            })
            .collect()
    }

    /// Checks one round of reports against everything seen: a view number always has the
    /// same members, and views held with quorum at the same time are never disjoint.
    fn check_agreement(&mut self, reports: &[Option<StatusReport>]) {
        for (i, r) in reports.iter().enumerate() {
            let Some(r) = r.as_ref().filter(|r| r.view > 0) else { continue };
            let members = view_members(r);
            let known = self.views.entry(r.view).or_insert_with(|| members.clone());
            assert_eq!(*known, members, "{} reports view {} with other members\n{}", name(i), r.view, summary(reports));
        }
        let with_quorum: Vec<BTreeSet<String>> =
            reports.iter().flatten().filter(|r| r.quorum).map(view_members).collect();
        for a in &with_quorum {
            for b in &with_quorum {
                assert!(!a.is_disjoint(b), "two disjoint views hold quorum at once\n{}", summary(reports));
            }
        }
    }

    /// Polls every node until `check` accepts a round of reports, or panics `limit` after
    /// `since` (when the change was caused) with the last reports and the nodes' log tails.
    fn wait_until<T>(
        &mut self,
        what: &str,
        since: Instant,
        limit: Duration,
        mut check: impl FnMut(&[Option<StatusReport>]) -> Option<T>,
    ) -> T {
        loop {
            let reports = self.statuses();
            self.check_agreement(&reports);
            if let Some(t) = check(&reports) {
                eprintln!("{what}: seen {:.2} s after the change", since.elapsed().as_secs_f64());
                return t;
            }
            if since.elapsed() > limit {
                panic!("{what}: not within {limit:?}\n{}\n{}", summary(&reports), self.log_tails());
            }
            std::thread::sleep(POLL);
        }
    }

    /// Polls every node for `span`, panicking at the first round of reports that `holds`
    /// rejects.
    fn hold_for(&mut self, what: &str, span: Duration, mut holds: impl FnMut(&[Option<StatusReport>]) -> bool) {
        let start = Instant::now();
        let mut rounds = 0;
        while start.elapsed() < span {
            let reports = self.statuses();
            self.check_agreement(&reports);
            if !holds(&reports) {
                panic!("{what}: broken after {:?}\n{}\n{}", start.elapsed(), summary(&reports), self.log_tails());
            }
            rounds += 1;
            std::thread::sleep(POLL);
        }
        eprintln!("{what}: held for {span:?} ({rounds} rounds of status queries)");
    }

    /// Node `i`'s `--events-json` lines.
    fn events(&self, i: usize) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join(format!("{}.jsonl", name(i))))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: bad event line {l:?}: {e}", name(i))))
            .collect()
    }

    /// Every `view` event of every node agrees with every other about its members.
    fn check_view_events(&mut self) {
        for i in 0..NODES {
            for e in self.events(i).iter().filter(|e| e["kind"] == "view") {
                let id = e["view"].as_u64().expect("view number");
                let members: BTreeSet<String> =
                    e["members"].as_array().expect("members").iter().map(|m| m.as_str().unwrap().to_string()).collect();
                let known = self.views.entry(id).or_insert_with(|| members.clone());
                assert_eq!(*known, members, "{} installed view {id} with other members", name(i));
            }
        }
    }

    fn log_tails(&self) -> String {
        (0..NODES)
            .map(|i| {
                let log = std::fs::read_to_string(self.dir.join(format!("{}.log", name(i)))).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                format!("--- {} log (last 15 lines)\n{}", name(i), lines[lines.len().saturating_sub(15)..].join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn summary(reports: &[Option<StatusReport>]) -> String {
    reports
        .iter()
        .enumerate()
        .map(|(i, r)| match r {
            Some(r) => {
                format!("{}: view {} {} quorum {} members {:?}", name(i), r.view, r.status, r.quorum, view_members(r))
            }
            None => format!("{}: no answer", name(i)),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_three_two_partition_leaves_quorum_with_the_three_and_healing_merges_one_view() {
    let Some(mut c) = Cluster::start("split") else { return };
    let all: Vec<usize> = (0..NODES).collect();
    let (three, two) = ([0, 1, 2], [3, 4]);
    let formed = c.wait_until("five nodes agree on one view", c.started, FORM_LIMIT, |r| agreed(r, &all, &names(&all)));

    // Times are taken before the firewall commands: rules take effect one by one.
    let cut = Instant::now();
    for a in three {
        for b in two {
            c.lab.partition(c.lab.host(a), c.lab.host(b)).unwrap();
        }
    }
    let split = c.wait_until(
        "the three-side installs a view of three with quorum, the two-side loses quorum",
        cut,
        CHANGE_LIMIT,
        |r| {
            let v = agreed(r, &three, &names(&three))?;
            let two_gave_up = two
                .iter()
                .all(|&i| r[i].as_ref().is_some_and(|s| !s.quorum && s.status == "no_quorum" && s.view == formed));
            two_gave_up.then_some(v)
        },
    );
    assert!(split > formed);
    // The two-side says so in its events and its log, and chose no view of its own.
    for i in two {
        let log = std::fs::read_to_string(c.dir.join(format!("{}.log", name(i)))).unwrap();
        assert!(log.contains("lost quorum"), "{} did not log losing quorum:\n{log}", name(i));
        let events = c.events(i);
        assert!(
            events.iter().any(|e| e["kind"] == "no_quorum" && e["view"] == formed),
            "{} did not report losing quorum: {events:?}",
            name(i)
        );
        assert!(
            !events.iter().any(|e| e["kind"] == "view" && e["view"].as_u64() > Some(formed)),
            "{} installed a view while cut off: {events:?}",
            name(i)
        );
    }
    // The three-side reports the two as dead in the view that excludes them ...
    for i in three {
        let dead: BTreeSet<String> = c
            .events(i)
            .iter()
            .filter(|e| e["kind"] == "dead" && e["view"] == split)
            .map(|e| e["node"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(dead, names(&two), "{}'s dead events for view {split}", name(i));
    }
    // ... and keeps working: it still holds that view with quorum now that the two-side has
    // given up.
    let again = c.statuses();
    c.check_agreement(&again);
    assert_eq!(agreed(&again, &three, &names(&three)), Some(split), "{}", summary(&again));

    let healed = Instant::now();
    c.lab.heal().unwrap();
    let merged = c.wait_until("healed: all five agree on one view with quorum", healed, CHANGE_LIMIT, |r| {
        agreed(r, &all, &names(&all))
    });
    assert!(merged > split);
    c.check_view_events();
}

#[test]
fn a_one_way_cut_prunes_one_end_and_the_rest_stays_one_view() {
    let Some(mut c) = Cluster::start("oneway") else { return };
    let all: Vec<usize> = (0..NODES).collect();
    let (formed, ring) = c.wait_until("five nodes agree on one view", c.started, FORM_LIMIT, |r| {
        let v = agreed(r, &all, &names(&all))?;
        // Members are listed in id order: the ring the buddy detector watches.
        let ring: Vec<usize> = r[0].as_ref()?.members.iter().map(|m| m.name[1..].parse().unwrap()).collect();
        Some((v, ring))
    });
    // Node 4 can no longer send to its ring successor, a buddy that watches it; every other
    // path, including the way back, still works.
    let mute = 4;
    let watcher = ring[(ring.iter().position(|&i| i == mute).unwrap() + 1) % NODES];
    let cut = Instant::now();
    c.lab.partition_one_way(c.lab.host(mute), c.lab.host(watcher)).unwrap();
    eprintln!("cut {} -> {} one way (ring in id order: {ring:?})", name(mute), name(watcher));

    let (pruned_view, pruned) =
        c.wait_until("one end of the broken link pruned, the other four agree on one view", cut, CHANGE_LIMIT, |r| {
            [mute, watcher].into_iter().find_map(|out| {
                let rest: Vec<usize> = all.iter().copied().filter(|&i| i != out).collect();
                let v = agreed(r, &rest, &names(&rest))?;
                let told = r[out].as_ref().is_some_and(|s| !s.quorum && s.status == "joining");
                (v > formed && told).then_some((v, out))
            })
        });
    let rest: Vec<usize> = all.iter().copied().filter(|&i| i != pruned).collect();
    eprintln!("pruned {} in view {pruned_view}", name(pruned));
    assert!(
        c.events(pruned).iter().any(|e| e["kind"] == "removed" && e["view"] == pruned_view),
        "{} was not told it was removed",
        name(pruned)
    );
    // While the link stays broken nothing moves: the pruned node does not come back (to be
    // pruned again), the four keep their view. A flapping node would be back within a
    // detection period and a regroup; the exclusion bound covers both.
    c.hold_for("the pruned node stays out, the four keep one view", Config::local().exclusion_bound(), |r| {
        agreed(r, &rest, &names(&rest)) == Some(pruned_view) && r[pruned].as_ref().is_some_and(|s| !s.quorum)
    });

    let healed = Instant::now();
    c.lab.heal().unwrap();
    let merged = c.wait_until("healed: all five agree on one view with quorum", healed, CHANGE_LIMIT, |r| {
        agreed(r, &all, &names(&all))
    });
    assert!(merged > pruned_view);
    c.check_view_events();
}

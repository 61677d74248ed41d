//! The write-ahead log on real files: group commit, snapshot segments, start-up checks
//! that cut torn tails and refuse corrupted ones (and say which), a writer that fails on a
//! full disk and is cut back to what it fsynced — then a 3-node registry over real logs
//! where one node's log is corrupted and it recovers what it lost from its peers.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ulnet_registry::gup::{Entry, Epoch, Gup, GupConfig, NodeId, Record, Snapshot, View, VotingConfig};
use ulnet_registry::wal::{cut_to_durable, recover, scan, InlineWal, TailKind, Wal, WalError};
use ulnet_registry::{Registry, RegistryEvent};

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ulnet-wal-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn entry(i: u64) -> Record {
    Record::Entry {
        seq: i,
        entry: Entry::single(
            NodeId(1),
            ulnet_registry::gup::BatchId { incarnation: 1, counter: i },
            vec![Arc::from(format!("update {i}").into_bytes())].into(),
        ),
    }
}

fn write(dir: &Path, records: &[Record]) {
    let (wal, durable) = Wal::open(dir).unwrap();
    for (i, r) in records.iter().enumerate() {
        wal.append(i as u64 + 1, r).unwrap();
    }
    let last = records.len() as u64;
    let mut got = 0;
    while got < last {
        got = durable.recv_timeout(Duration::from_secs(10)).expect("the writer reports durability");
    }
}

fn last_segment(dir: &Path) -> PathBuf {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segs.sort();
    segs.pop().unwrap()
}

#[test]
fn records_survive_reopening_in_order() {
    let dir = temp_dir("reopen");
    let records: Vec<Record> = (1..=500).map(entry).collect();
    write(&dir, &records);
    write(&dir, &[Record::Commit { seq: 500 }]);
    let rec = recover(&dir).unwrap();
    assert!(rec.refused.is_none());
    assert!(!rec.recovered.lost_tail);
    let mut want = records.clone();
    want.push(Record::Commit { seq: 500 });
    assert_eq!(rec.recovered.records, want);
}

#[test]
fn inline_commit_hints_ride_on_the_next_fsync() {
    let dir = temp_dir("hints");
    let mut wal = InlineWal::open(&dir).unwrap();
    wal.append(1, &entry(1)).unwrap();
    assert!(wal.pending(), "an entry must be made durable");
    assert_eq!(wal.sync().unwrap(), Some(1));
    wal.append(2, &Record::Commit { seq: 1 }).unwrap();
    assert!(!wal.pending(), "a commit hint alone asks for no fsync");
    wal.append(3, &entry(2)).unwrap();
    assert!(wal.pending());
    assert_eq!(wal.sync().unwrap(), Some(3), "the hint is written and fsynced with the entry after it");
    assert!(!wal.pending());
    drop(wal);
    let rec = recover(&dir).unwrap();
    assert!(rec.refused.is_none());
    assert_eq!(rec.recovered.records, vec![entry(1), Record::Commit { seq: 1 }, entry(2)]);
}

#[test]
fn a_snapshot_starts_a_segment_and_drops_the_older_ones() {
    let dir = temp_dir("snapshot");
    let mut records: Vec<Record> = (1..=100).map(entry).collect();
    let snapshot = Record::Snapshot {
        snapshot: Snapshot { seq: 100, config: VotingConfig::new(vec![NodeId(1)]), data: Arc::from(&b"state"[..]) },
        node: NodeId(1),
        incarnation: 1,
        promised: Epoch::default(),
        last_normal: None,
        tail: Vec::new(),
    };
    records.push(snapshot.clone());
    records.extend((101..=110).map(entry));
    write(&dir, &records);
    let rec = recover(&dir).unwrap();
    assert_eq!(rec.recovered.records[0], snapshot);
    assert_eq!(rec.recovered.records.len(), 11, "only the snapshot and what follows it remain");
}

#[test]
fn a_torn_tail_is_cut_and_the_node_keeps_its_identity() {
    let dir = temp_dir("torn");
    write(&dir, &(1..=50).map(entry).collect::<Vec<_>>());
    let seg = last_segment(&dir);
    let len = std::fs::metadata(&seg).unwrap().len();
    // A crash in the middle of the last write.
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 5).unwrap();
    let scanned = scan(&dir).unwrap();
    assert_eq!(scanned.refused().map(|r| r.kind), Some(TailKind::Torn));
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), len - 5, "a scan changes nothing on disk");
    let rec = scanned.cut().unwrap();
    let refused = rec.refused.expect("the torn record is cut");
    assert!(refused.reason.contains("torn"), "{}", refused.reason);
    assert_eq!(refused.kind, TailKind::Torn);
    assert!(!rec.recovered.lost_tail, "a write that never completed costs the node nothing it promised");
    assert_eq!(rec.recovered.records.len(), 49);
    // The bytes were set aside and the log cut: a second start finds a clean log.
    assert!(std::fs::read_dir(&dir).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().contains("refused")));
    let again = recover(&dir).unwrap();
    assert!(again.refused.is_none());
    assert_eq!(again.recovered.records.len(), 49);
}

#[test]
fn a_flipped_bit_is_refused_with_everything_after_it() {
    let dir = temp_dir("bitflip");
    write(&dir, &(1..=50).map(entry).collect::<Vec<_>>());
    write(&dir, &(51..=60).map(entry).collect::<Vec<_>>());
    // Flip one bit in the middle of the first segment: the rest of it and the whole later
    // segment are refused (what follows a bad record cannot be trusted to be complete).
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    segs.sort();
    let first = &segs[0];
    let mut bytes = std::fs::read(first).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(first, &bytes).unwrap();
    let rec = recover(&dir).unwrap();
    let refused = rec.refused.expect("the corrupt record is refused");
    assert!(refused.reason.contains("checksum") || refused.reason.contains("length"), "{}", refused.reason);
    assert_eq!(refused.kind, TailKind::Corrupt);
    assert!(rec.recovered.lost_tail);
    let n = rec.recovered.records.len();
    assert!((20..30).contains(&n), "kept the {n} records before the flip");
    assert_eq!(rec.recovered.records, (1..=n as u64).map(entry).collect::<Vec<_>>());
}

#[test]
fn a_flipped_bit_in_the_last_record_is_corruption_not_a_torn_write() {
    // The last record was whole: it may have been fsynced and acknowledged.
    let dir = temp_dir("lastflip");
    write(&dir, &(1..=50).map(entry).collect::<Vec<_>>());
    let seg = last_segment(&dir);
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes.len() - 3;
    bytes[at] ^= 0x10;
    std::fs::write(&seg, &bytes).unwrap();
    let rec = recover(&dir).unwrap();
    assert_eq!(rec.refused.map(|r| r.kind), Some(TailKind::Corrupt));
    assert!(rec.recovered.lost_tail);
    assert_eq!(rec.recovered.records.len(), 49);
}

#[test]
fn a_zero_filled_tail_is_torn() {
    // A filesystem that extended the file for a write that never reached the disk.
    let dir = temp_dir("zeros");
    write(&dir, &(1..=50).map(entry).collect::<Vec<_>>());
    let seg = last_segment(&dir);
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len + 8192).unwrap();
    let rec = recover(&dir).unwrap();
    assert_eq!(rec.refused.map(|r| r.kind), Some(TailKind::Torn));
    assert!(!rec.recovered.lost_tail);
    assert_eq!(rec.recovered.records, (1..=50).map(entry).collect::<Vec<_>>());
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), len, "cut back to the last whole record");
}

#[test]
fn a_writer_cut_back_to_its_durable_mark_keeps_exactly_what_it_fsynced() {
    let dir = temp_dir("mark");
    let mut wal = InlineWal::open(&dir).unwrap();
    for i in 1..=20 {
        wal.append(i, &entry(i)).unwrap();
    }
    assert_eq!(wal.sync().unwrap(), Some(20));
    let mark = wal.durable_mark();
    drop(wal);
    // What a failing write leaves: part of a batch in the segment, and the first bytes of
    // a segment that a snapshot's rotation began.
    let seg = last_segment(&dir);
    let mut f = std::fs::OpenOptions::new().append(true).open(&seg).unwrap();
    let mut frame = Vec::new();
    ulnet_registry::wal::record::frame_record(&entry(21), &mut frame);
    std::io::Write::write_all(&mut f, &frame).unwrap();
    std::io::Write::write_all(&mut f, &frame[..frame.len() / 2]).unwrap();
    let later = seg.with_file_name("wal-00000000000000000002.log");
    std::fs::write(&later, &frame[..7]).unwrap();
    cut_to_durable(&dir, mark).unwrap();
    assert!(!later.exists(), "the segment begun after the mark is removed");
    let rec = recover(&dir).unwrap();
    assert!(rec.refused.is_none(), "nothing torn is left: {:?}", rec.refused);
    assert_eq!(rec.recovered.records, (1..=20).map(entry).collect::<Vec<_>>(), "the whole record 21 is gone too");
}

/// A small tmpfs mounted for one test (root only), unmounted when dropped.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(name: &str, bytes: u64) -> Option<SmallFs> {
        let dir = temp_dir(name);
        let mount = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&dir)
            .stderr(std::process::Stdio::piped())
            .output();
        match mount {
            Ok(out) if out.status.success() => Some(SmallFs(dir)),
            other => {
                let why = other.map_or_else(|e| e.to_string(), |o| String::from_utf8_lossy(&o.stderr).into_owned());
                eprintln!("skipped: mounting a small tmpfs needs root (mount: {})", why.trim());
                None
            }
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_full_disk_fails_the_writer_with_no_space_and_the_cut_log_holds_every_fsynced_record() {
    let Some(fs) = SmallFs::mount("full", 64 * 1024) else { return };
    let dir = fs.0.join("registry");
    std::fs::create_dir_all(&dir).unwrap();
    let mut wal = InlineWal::open(&dir).unwrap();
    let big = |i: u64| Record::Entry {
        seq: i,
        entry: Entry::single(
            NodeId(1),
            ulnet_registry::gup::BatchId { incarnation: 1, counter: i },
            vec![Arc::from(vec![b'x'; 3000])].into(),
        ),
    };
    let mut durable = 0;
    let error = loop {
        let i = durable + 1;
        wal.append(i, &big(i)).unwrap();
        match wal.sync() {
            Ok(Some(lsn)) => durable = lsn,
            Ok(None) => unreachable!("a record was buffered"),
            Err(e) => break e,
        }
        assert!(durable < 1000, "a 64 KiB filesystem never filled");
    };
    assert_eq!(error, WalError::NoSpace { dir: dir.clone() });
    assert!(error.to_string().starts_with("no space left on "), "{error}");
    assert_eq!(wal.sync(), Err(error.clone()), "a failed log stays failed");
    let mark = wal.durable_mark();
    drop(wal);
    cut_to_durable(&dir, mark).unwrap();
    let rec = recover(&dir).unwrap();
    assert!(rec.refused.is_none());
    assert_eq!(rec.recovered.records, (1..=durable).map(big).collect::<Vec<_>>());
}

#[test]
fn a_snapshot_that_does_not_fit_leaves_the_log_before_it_whole() {
    // The snapshot's rotation begins a new segment, whose write fails: the cut removes it,
    // and the older segment (not yet deleted: the snapshot never became durable) stays.
    let Some(fs) = SmallFs::mount("snapfull", 64 * 1024) else { return };
    let dir = fs.0.join("registry");
    std::fs::create_dir_all(&dir).unwrap();
    let mut wal = InlineWal::open(&dir).unwrap();
    for i in 1..=10 {
        wal.append(i, &entry(i)).unwrap();
    }
    assert_eq!(wal.sync().unwrap(), Some(10));
    wal.append(11, &entry(11)).unwrap();
    let snapshot = Record::Snapshot {
        snapshot: Snapshot {
            seq: 11,
            config: VotingConfig::new(vec![NodeId(1)]),
            data: Arc::from(vec![7u8; 128 * 1024]),
        },
        node: NodeId(1),
        incarnation: 1,
        promised: Epoch::default(),
        last_normal: None,
        tail: Vec::new(),
    };
    wal.append(12, &snapshot).unwrap();
    let error = wal.sync().unwrap_err();
    assert!(matches!(error, WalError::NoSpace { .. }), "{error}");
    let mark = wal.durable_mark();
    drop(wal);
    assert!(std::fs::read_dir(&dir).unwrap().count() >= 2, "the rotation began a new segment");
    cut_to_durable(&dir, mark).unwrap();
    let rec = recover(&dir).unwrap();
    assert!(rec.refused.is_none(), "{:?}", rec.refused);
    assert_eq!(
        rec.recovered.records,
        (1..=11).map(entry).collect::<Vec<_>>(),
        "entry 11 was fsynced before the rotation"
    );
    // The disk takes writes again for what fits: a new writer appends after them.
    let mut wal = InlineWal::open(&dir).unwrap();
    wal.append(1, &Record::Commit { seq: 11 }).unwrap();
    wal.append(2, &entry(12)).unwrap();
    assert_eq!(wal.sync().unwrap(), Some(2));
}

/// A registry node with a real log, driven in-process.
struct DiskNode {
    reg: Registry,
    wal: Wal,
    durable: Receiver<u64>,
}

/// Opens the node in `dir` as `me`: the first node of a new cluster when the log is empty
/// and `bootstrap` is set, a joiner when empty otherwise, itself from its log otherwise.
fn open_node(dir: &Path, me: NodeId, bootstrap: bool, now: Instant) -> (DiskNode, Option<String>) {
    let rec = recover(dir).unwrap();
    let note = rec.refused.as_ref().map(|r| format!("{} bytes refused at {}: {}", r.bytes, r.offset, r.reason));
    let config = Registry::config(GupConfig::local());
    let records = rec.recovered.records.clone();
    let gup = if records.is_empty() && bootstrap {
        Gup::bootstrap(me, vec![me], config, now)
    } else {
        Gup::recover(me, config, rec.recovered, now)
    };
    let reg = Registry::recover(gup, &records, 50);
    let (wal, durable) = Wal::open(dir).unwrap();
    (DiskNode { reg, wal, durable }, note)
}

/// Nodes by slot, each with its current identity.
struct Net {
    nodes: Vec<Option<DiskNode>>,
    ids: Vec<NodeId>,
    inflight: VecDeque<(NodeId, NodeId, Vec<u8>)>,
    done: Vec<u64>,
    view: u64,
}

impl Net {
    /// Runs everyone on the real clock until `until` holds or 10 s pass.
    fn pump_until(&mut self, until: impl Fn(&Net) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !until(self) && Instant::now() < deadline {
            let now = Instant::now();
            let mut busy = false;
            for i in 0..self.nodes.len() {
                let me = self.ids[i];
                let Some(n) = self.nodes[i].as_mut() else { continue };
                while let Ok(lsn) = n.durable.try_recv() {
                    n.reg.handle_durable(now, lsn);
                    busy = true;
                }
                n.reg.handle_timeout(now);
                while let Some(ev) = n.reg.poll_event() {
                    busy = true;
                    match ev {
                        RegistryEvent::Persist { lsn, record } => n.wal.append(lsn, &record).unwrap(),
                        RegistryEvent::SetDone { id, .. } => self.done.push(id.0),
                        _ => {}
                    }
                }
                while let Some((to, bytes)) = n.reg.poll_transmit() {
                    busy = true;
                    self.inflight.push_back((me, to, bytes));
                }
            }
            while let Some((from, to, bytes)) = self.inflight.pop_front() {
                if let Some(slot) = self.ids.iter().position(|&id| id == to) {
                    if let Some(n) = self.nodes[slot].as_mut() {
                        n.reg.handle_message(now, from, &bytes);
                    }
                }
            }
            if !busy {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// A new view of the running nodes.
    fn view(&mut self, now: Instant) {
        self.view += 1;
        let members: Vec<NodeId> =
            (0..self.nodes.len()).filter(|&i| self.nodes[i].is_some()).map(|i| self.ids[i]).collect();
        for n in self.nodes.iter_mut().flatten() {
            n.reg.handle_view(now, View::new(self.view, members.clone()));
        }
    }

    /// The voters at `slot`'s applied position (none during a change).
    fn voters(&self, slot: usize) -> Vec<NodeId> {
        match self.nodes[slot].as_ref().and_then(|n| n.reg.gup().applied_config()) {
            Some(c) if !c.is_joint() => c.voters.to_vec(),
            _ => Vec::new(),
        }
    }
}

#[test]
fn a_node_with_a_corrupted_log_refuses_the_tail_and_recovers_from_its_peers() {
    let dirs: Vec<PathBuf> = (0..3).map(|i| temp_dir(&format!("cluster-{i}"))).collect();
    let ids: Vec<NodeId> = (1..=3).map(NodeId).collect();
    let start = Instant::now();
    let mut net = Net { nodes: Vec::new(), ids: ids.clone(), inflight: VecDeque::new(), done: Vec::new(), view: 0 };
    // The first node forms the cluster; the others join it empty and are voted in.
    for (i, d) in dirs.iter().enumerate() {
        net.nodes.push(Some(open_node(d, ids[i], i == 0, start).0));
    }
    net.view(Instant::now());
    net.pump_until(|n| n.nodes.iter().flatten().all(|x| x.reg.gup().is_normal()) && n.voters(0).len() == 3);
    assert_eq!(net.voters(0), ids, "the joiners were voted in");
    for k in 0..300 {
        let node = net.nodes[k % 3].as_mut().unwrap();
        node.reg.set(Instant::now(), format!("key{k}").into_bytes(), format!("value{k}").into_bytes()).unwrap();
        if k % 50 == 49 {
            net.pump_until(|n| n.done.len() > k);
        }
    }
    assert_eq!(net.done.len(), 300, "every set completes on a healthy cluster");
    // Node 2 stops; its newest log segment gets a flipped bit near the end.
    net.nodes[2] = None;
    net.view(Instant::now());
    let seg = last_segment(&dirs[2]);
    let mut bytes = std::fs::read(&seg).unwrap();
    assert!(bytes.len() > 100, "node 2 wrote its log");
    let at = bytes.len() - 40;
    bytes[at] ^= 0x01;
    std::fs::write(&seg, &bytes).unwrap();
    // More updates while it is down.
    for k in 300..320 {
        net.nodes[k % 2]
            .as_mut()
            .unwrap()
            .reg
            .set(Instant::now(), format!("key{k}").into_bytes(), b"late".to_vec())
            .unwrap();
    }
    net.pump_until(|n| n.done.len() == 320);
    assert_eq!(net.done.len(), 320, "the two others commit on their own");
    // It restarts: the bad tail is refused and reported; it comes back under a new
    // identity (what it promised is lost with the tail) and catches up from its peers.
    let new_id = NodeId(4);
    let (node, note) = open_node(&dirs[2], new_id, false, Instant::now());
    let note = note.expect("the corruption is detected and reported");
    assert!(note.contains("checksum") || note.contains("length") || note.contains("torn"), "{note}");
    net.nodes[2] = Some(node);
    net.ids[2] = new_id;
    net.view(Instant::now());
    net.pump_until(|n| {
        let x = n.nodes[2].as_ref().unwrap();
        x.reg.gup().is_normal()
            && x.reg.store().len() == 320
            && n.voters(0).contains(&new_id)
            && x.reg.store().applied() == n.nodes[0].as_ref().unwrap().reg.store().applied()
    });
    let a = net.nodes[0].as_ref().unwrap().reg.store().clone();
    let c = net.nodes[2].as_ref().unwrap().reg.store();
    assert_eq!(c.len(), 320);
    assert_eq!(a, *c, "the restarted node holds exactly what its peers hold");
    assert!(net.nodes[2].as_ref().unwrap().reg.gup().is_normal(), "it takes part again");
    assert_eq!(net.voters(0), vec![ids[0], ids[1], new_id], "the new identity votes, the old one not");
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

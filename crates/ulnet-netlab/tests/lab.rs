//! The lab itself: hosts reach each other, loss drops about the asked fraction, partitions
//! cut and heal restores, links go down and up, stale labs of dead processes are removed,
//! and the relay forwards with its seeded faults. Skips (with the reason) when not root.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;
use ulnet_netlab::{Lab, RelayFaults};

/// Sends `count` datagrams from `from` to `to`:`port` and returns how many arrived (the
/// receiver drains concurrently, so its socket buffer never overflows).
fn send_count(lab: &Lab, from: usize, to: usize, port: u16, count: usize) -> usize {
    let (a, b) = (lab.host(from), lab.host(to));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let receiver = lab.run_in(b, move || {
        let s = UdpSocket::bind((b.addr(), port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        // A test thread descheduled on a busy host must not lose datagrams of its own.
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size_force(&s, 8 << 20);
        ready_tx.send(()).unwrap();
        let mut got = 0;
        let mut buf = [0u8; 16];
        while s.recv(&mut buf).is_ok() {
            got += 1;
        }
        got
    });
    ready_rx.recv().unwrap();
    lab.run_in(a, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        for i in 0..count {
            let _ = s.send_to(&(i as u32).to_le_bytes(), (b.addr(), port));
            if i % 64 == 63 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    })
    .join()
    .unwrap();
    receiver.join().unwrap()
}

#[test]
fn hosts_reach_each_other_and_partitions_cut_and_heal() {
    let Some(lab) = Lab::for_test(3) else { return };
    assert_eq!(lab.host(1).addr().to_string(), "10.77.0.2");
    assert_eq!(send_count(&lab, 0, 1, 7001, 100), 100);
    lab.partition(lab.host(0), lab.host(1)).unwrap();
    assert_eq!(send_count(&lab, 0, 1, 7002, 50), 0, "partition must cut a→b");
    assert_eq!(send_count(&lab, 1, 0, 7003, 50), 0, "partition must cut b→a");
    assert_eq!(send_count(&lab, 0, 2, 7004, 50), 50, "a third host is not affected");
    lab.heal().unwrap();
    assert_eq!(send_count(&lab, 0, 1, 7005, 50), 50);
    lab.partition_one_way(lab.host(0), lab.host(1)).unwrap();
    assert_eq!(send_count(&lab, 0, 1, 7006, 50), 0);
    assert_eq!(send_count(&lab, 1, 0, 7007, 50), 50);
    lab.heal().unwrap();
    lab.link_down(lab.host(2)).unwrap();
    assert_eq!(send_count(&lab, 0, 2, 7008, 20), 0, "link down");
    lab.link_up(lab.host(2)).unwrap();
    assert_eq!(send_count(&lab, 0, 2, 7009, 20), 20, "link up again");
}

#[test]
fn loss_drops_about_the_asked_fraction() {
    let Some(lab) = Lab::for_test(2) else { return };
    lab.set_loss(lab.host(1), 0.3).unwrap();
    let got = send_count(&lab, 0, 1, 7100, 4000);
    // 4,000 trials at p = 0.7: σ ≈ 29, so ±200 is a seven-sigma band.
    assert!((2600..=3000).contains(&got), "{got} of 4000 arrived at 30% loss");
    lab.set_loss(lab.host(1), 0.0).unwrap();
    assert_eq!(send_count(&lab, 0, 1, 7101, 500), 500);
}

#[test]
fn spawned_processes_run_inside_the_host() {
    let Some(lab) = Lab::for_test(2) else { return };
    let out = lab.command(lab.host(1), "ip").args(["-4", "-o", "addr", "show", "dev", "eth0"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("10.77.0.2/24"));
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", "ip -4 -o addr show dev eth0 | grep -q 10.77.0.1/24"]);
    assert!(lab.spawn(lab.host(0), &cmd).unwrap().wait().unwrap().success());
}

#[test]
fn stale_labs_of_dead_processes_are_removed() {
    if let Err(why) = Lab::available() {
        eprintln!("skipped: {why}");
        return;
    }
    // A child process makes a lab and dies without tearing it down (as a crash would).
    if std::env::var("ULNET_NETLAB_CRASH").is_ok() {
        let lab = Lab::new(2).unwrap();
        println!("{}", lab.host(0).netns());
        std::process::exit(0); // no Drop
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "stale_labs_of_dead_processes_are_removed", "--nocapture"])
        .env("ULNET_NETLAB_CRASH", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let ns = text.lines().find(|l| l.starts_with("ulnl-")).expect("child printed its namespace").to_string();
    let list = || {
        String::from_utf8_lossy(&std::process::Command::new("ip").args(["netns", "list"]).output().unwrap().stdout)
            .to_string()
    };
    assert!(list().contains(&ns), "the crashed child's namespace is left behind");
    let _lab = Lab::new(1).unwrap();
    assert!(!list().contains(&ns), "a new lab removes the dead process's namespace");
}

#[test]
fn relay_forwards_with_seeded_duplication_reordering_and_delay() {
    let Some(lab) = Lab::for_test(3) else { return };
    let (a, b, r) = (lab.host(0), lab.host(1), lab.host(2));
    let server = lab
        .run_in(b, move || {
            let s = UdpSocket::bind((b.addr(), 7200)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            // A test thread descheduled on a busy host must not lose datagrams of its own.
            let _ = rustix::net::sockopt::set_socket_recv_buffer_size_force(&s, 8 << 20);
            s
        })
        .join()
        .unwrap();
    let faults = RelayFaults { duplicate: 0.1, reorder: 0.2, ..RelayFaults::dup_reorder_delay() };
    let relay = lab.start_relay(r, 7300, SocketAddr::from((b.addr(), 7200)), faults, 1234).unwrap();
    let relay_addr = relay.addr();
    let count = 2000u32;
    let client = lab.run_in(a, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        for i in 0..count {
            s.send_to(&i.to_le_bytes(), relay_addr).unwrap();
            if i % 32 == 31 {
                std::thread::sleep(Duration::from_micros(300));
            }
        }
        // One answer comes back through the relay, which may duplicate it too: its copies
        // are counted (a copy arrives within the relay's longest hold, 2.3 ms).
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 8];
        let answer = s.recv(&mut buf).map(|n| buf[..n].to_vec());
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let mut copies = 1;
        while s.recv(&mut buf).is_ok() {
            copies += 1;
        }
        answer.map(|a| (a, copies))
    });
    let mut seen = Vec::new();
    let mut buf = [0u8; 8];
    let mut reply_to = None;
    while let Ok((n, from)) = server.recv_from(&mut buf) {
        assert_eq!(n, 4);
        seen.push(u32::from_le_bytes(buf[..4].try_into().unwrap()));
        if reply_to.is_none() {
            reply_to = Some(from);
            server.send_to(b"pong", from).unwrap();
        }
    }
    let (reply, reply_copies) = client.join().unwrap().unwrap();
    assert_eq!(reply, b"pong");
    let c = relay.stop();
    let distinct: std::collections::HashSet<u32> = seen.iter().copied().collect();
    assert_eq!(distinct.len(), count as usize, "nothing lost (loss is 0)");
    assert!(seen.len() > count as usize, "some duplicated");
    assert!(seen.windows(2).any(|w| w[1] < w[0]), "some reordered");
    // The relay counts the copies it made both ways: the server's and the client's.
    assert_eq!(c.duplicated as usize, seen.len() - count as usize + (reply_copies - 1));
    assert!(c.reordered > 0 && c.lost == 0 && c.overflow == 0, "{c:?}");
}

//! Shared-memory rendezvous admit only the users they are told to, and prove the cluster
//! secret. A child process switched to uid and gid 65534 ("nobody") is refused by every
//! kind of listener in the abstract socket namespace — an endpoint's channel listener
//! (what `ulnet bench`, the River mesh and the demos listen with), an RMA node's channel
//! acceptor and its mapping rendezvous (the data center's and the name service's) — told
//! why, and counted; an allowed uid or gid is admitted; a connector refuses a listener of
//! another user squatting on the name, handing it nothing; a wrong secret is refused and
//! counted. Switching users needs root: those tests say so and pass without running
//! elsewhere.

use std::io::Read;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_core::rma::{Access, ImportError, ImportMode, NodeId, NotifyMode, Rights, Rma, RmaConfig, TargetCounters};
use ulnet_core::transport::shm::{AllowedPeers, ShmConfig};
use ulnet_core::{ConnectError, Endpoint, EndpointConfig, Event, Refusal, SendOutcome};

const T: Duration = Duration::from_secs(10);
/// The user and group the child runs as.
const NOBODY: u32 = 65534;
/// What the child is to do, and the name it does it at.
const ROLE_ENV: &str = "ULNET_SHM_ADMISSION_ROLE";
const NAME_ENV: &str = "ULNET_SHM_ADMISSION_NAME";
/// The line a child reports its outcome on (its test harness writes to stdout too).
const OUTCOME: &str = "OUTCOME ";
/// The segment the RMA targets export, and its first word.
const SEGMENT: &str = "s";
const WORD: u64 = 0x5eed_f00d;

fn unique(what: &str) -> String {
    format!("adm-{what}-{}-{:x}", std::process::id(), rand::random::<u32>())
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Runs `test` of this binary as uid and gid [`NOBODY`] (no supplementary groups), in
/// `role` at `name`, with pipes on its stdin and stdout.
fn as_nobody(test: &str, role: &str, name: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .env(NAME_ENV, name)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The child's outcome line, once it has exited successfully.
fn outcome(mut child: Child) -> String {
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    // (The harness's "test NAME ... " may begin the line.)
    let said = stdout.lines().rev().find_map(|l| l.split_once(OUTCOME)).map(|(_, said)| said);
    said.unwrap_or_else(|| panic!("no outcome in {stdout}")).into()
}

/// Waits until the child says it is ready (a squatter has bound its name), reading a byte
/// at a time so that nothing after the line is taken from [`outcome`].
fn wait_ready(child: &mut Child) {
    let stdout = child.stdout.as_mut().unwrap();
    let ready = format!("{OUTCOME}ready\n");
    let mut line = Vec::new();
    let mut byte = [0u8];
    while !line.ends_with(ready.as_bytes()) {
        assert_eq!(stdout.read(&mut byte).unwrap(), 1, "the child ended before it was ready");
        line.push(byte[0]);
    }
}

/// The child's side, when this process is one; `None` in the parent.
fn child_side() -> Option<()> {
    let role = std::env::var(ROLE_ENV).ok()?;
    let name = std::env::var(NAME_ENV).unwrap();
    let said = match role.as_str() {
        "endpoint" => endpoint_client(&name),
        "rma-map" => rma_client(&name, ImportMode::Map),
        "rma-channel" => rma_client(&name, ImportMode::Channel),
        "squat-endpoint" => squat_endpoint(&name),
        "squat-rendezvous" => squat_rendezvous(&name),
        other => panic!("unknown role {other}"),
    };
    println!("{OUTCOME}{said}");
    Some(())
}

/// Connects to an endpoint's listener and exchanges a ping and a pong.
fn endpoint_client(name: &str) -> String {
    let mut ep = Endpoint::new(EndpointConfig::default());
    let ch = match ep.connect_shm(name, T) {
        Ok(ch) => ch,
        Err(e) => return format!("error {e:?}"),
    };
    assert_eq!(ep.send(ch, &[b"ping"]).unwrap(), SendOutcome::Done);
    let deadline = Instant::now() + T;
    let mut pong = false;
    while !pong && Instant::now() < deadline {
        ep.poll(8, |e| pong |= matches!(e, Event::Message { data: b"pong", .. }));
    }
    if pong {
        "exchanged".into()
    } else {
        "no pong".into()
    }
}

/// Imports the target's segment and reads its first word.
fn rma_client(name: &str, mode: ImportMode) -> String {
    let mut me = Rma::new(RmaConfig::new(NodeId(7))).unwrap();
    let peer = me.connect_shm(name);
    let seg = match me.import_with(peer, SEGMENT, mode) {
        Ok(s) => s,
        Err(e) => return format!("error {e:?}"),
    };
    let mut word = [0u8; 8];
    me.get_blocking(&seg, 0, &mut word, T).unwrap();
    format!("read {:x}", u64::from_ne_bytes(word))
}

/// Binds an endpoint's name first, then says how many peers it admitted.
fn squat_endpoint(name: &str) -> String {
    let mut ep = Endpoint::new(EndpointConfig::default());
    ep.listen_shm(name).unwrap();
    println!("{OUTCOME}ready");
    // Run whatever connected (the parent's connector leaves without a word), then report.
    std::io::stdin().read_to_end(&mut Vec::new()).unwrap();
    let _ = ep.try_accept();
    format!("admitted {}", ep.shm_admission().unwrap().admitted)
}

/// Binds an RMA rendezvous name first, then says how many bytes the importer sent it.
fn squat_rendezvous(name: &str) -> String {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(format!("ulnet-rma/{name}")).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    println!("{OUTCOME}ready");
    std::io::stdin().read_to_end(&mut Vec::new()).unwrap();
    let (mut sock, _) = listener.accept().expect("the importer connected");
    sock.set_nonblocking(false).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut got = Vec::new();
    let _ = sock.read_to_end(&mut got);
    format!("received {}", got.len())
}

/// Serves an endpoint's listener until the child is done: accepts, answers a ping.
fn serve_endpoint(ep: &mut Endpoint, child: &mut Child) {
    while child.try_wait().unwrap().is_none() {
        if let Some(ch) = ep.try_accept().unwrap() {
            let deadline = Instant::now() + T;
            let mut answered = false;
            while !answered && Instant::now() < deadline {
                ep.poll(8, |e| {
                    if let Event::Message { data: b"ping", mut reply, .. } = e {
                        answered = reply.send(&[b"pong"]).is_ok();
                    }
                });
            }
            assert!(answered, "no ping on {ch:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn shm_endpoint(allowed: AllowedPeers, secret: &[u8]) -> (Endpoint, String) {
    let mut config = EndpointConfig::default();
    config.shm.allowed = allowed;
    config.shm.secret = secret.to_vec();
    let mut ep = Endpoint::new(config);
    let name = unique("ep");
    ep.listen_shm(&name).unwrap();
    (ep, name)
}

/// An RMA target listening on shared memory, exporting [`SEGMENT`] to everyone to read.
fn rma_target(allowed: AllowedPeers, secret: &[u8]) -> (Rma, String) {
    let mut config = RmaConfig::new(NodeId(1));
    config.shm = ShmConfig { allowed, secret: secret.to_vec(), ..ShmConfig::default() };
    let mut rma = Rma::new(config).unwrap();
    let name = unique("rma");
    rma.listen_shm(&name).unwrap();
    let seg = rma.export(SEGMENT, 4096, Access::everyone(Rights::READ), NotifyMode::Never).unwrap();
    seg.store_u64(0, WORD);
    std::mem::forget(seg); // exported for the life of the test process
    (rma, name)
}

/// The target's counters once `ready` holds of them (the threads that judge peers count
/// them after the peer may have heard its answer), or after [`T`].
fn counters_once(rma: &Rma, ready: impl Fn(&TargetCounters) -> bool) -> TargetCounters {
    let deadline = Instant::now() + T;
    loop {
        let c = rma.target_counters();
        if ready(&c) || Instant::now() > deadline {
            return c;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn refused_as_nobody(said: &str) -> bool {
    said.contains(&format!("{:?}", Refusal::PeerNotAllowed { uid: NOBODY, gid: NOBODY }))
}

#[test]
fn a_foreign_user_is_refused_by_every_listener_kind() {
    if child_side().is_some() {
        return;
    }
    if !is_root() {
        eprintln!("skipped: switching the child to uid {NOBODY} needs root");
        return;
    }
    let test = "a_foreign_user_is_refused_by_every_listener_kind";
    let (mut ep, name) = shm_endpoint(AllowedPeers::own_user(), b"");
    let mut child = as_nobody(test, "endpoint", &name);
    serve_endpoint(&mut ep, &mut child);
    let said = outcome(child);
    assert!(refused_as_nobody(&said), "endpoint listener: {said}");
    assert!(said.contains("Refused"), "the connector is told, as ConnectError::Refused: {said}");
    let counted = ep.shm_admission().unwrap();
    assert_eq!((counted.refused_credentials, counted.admitted), (1, 0), "endpoint listener");

    let (rma, name) = rma_target(AllowedPeers::own_user(), b"");
    for role in ["rma-map", "rma-channel"] {
        let said = outcome(as_nobody(test, role, &name));
        assert!(refused_as_nobody(&said), "{role}: {said}");
    }
    let c = counters_once(&rma, |c| c.admission.refused_credentials >= 2);
    assert_eq!((c.admission.refused_credentials, c.admission.admitted), (2, 0), "{c:?}");
    assert_eq!((c.mapped_imports, c.channels_accepted), (0, 0), "nothing was handed over: {c:?}");
}

#[test]
fn an_allowed_uid_or_gid_is_admitted() {
    if child_side().is_some() {
        return;
    }
    if !is_root() {
        eprintln!("skipped: switching the child to uid {NOBODY} needs root");
        return;
    }
    let test = "an_allowed_uid_or_gid_is_admitted";
    for allowed in [AllowedPeers::own_user().uid(NOBODY), AllowedPeers::own_user().gid(NOBODY)] {
        let (mut ep, name) = shm_endpoint(allowed.clone(), b"");
        let mut child = as_nobody(test, "endpoint", &name);
        serve_endpoint(&mut ep, &mut child);
        assert_eq!(outcome(child), "exchanged", "{allowed:?}");
        let counted = ep.shm_admission().unwrap();
        assert_eq!((counted.admitted, counted.refused_credentials), (1, 0), "{allowed:?}");
    }
    let (rma, name) = rma_target(AllowedPeers::own_user().uid(NOBODY), b"");
    for role in ["rma-map", "rma-channel"] {
        assert_eq!(outcome(as_nobody(test, role, &name)), format!("read {WORD:x}"), "{role}");
    }
    let c = counters_once(&rma, |c| c.admission.admitted >= 2);
    assert_eq!((c.admission.admitted, c.admission.refused_credentials), (2, 0), "{c:?}");
    assert_eq!((c.mapped_imports, c.channels_accepted), (1, 1), "{c:?}");
}

#[test]
fn a_connector_hands_nothing_to_a_listener_of_another_user() {
    if child_side().is_some() {
        return;
    }
    if !is_root() {
        eprintln!("skipped: switching the child to uid {NOBODY} needs root");
        return;
    }
    let test = "a_connector_hands_nothing_to_a_listener_of_another_user";
    let squatted = |r: &Refusal| matches!(r, Refusal::ListenerNotAllowed { uid: NOBODY, .. });

    let name = unique("squat-ep");
    let mut child = as_nobody(test, "squat-endpoint", &name);
    wait_ready(&mut child);
    let mut ep = Endpoint::new(EndpointConfig::default());
    match ep.connect_shm(&name, T) {
        Err(ConnectError::Refused(r)) if squatted(&r) => {}
        other => panic!("connected to a squatter: {other:?}"),
    }
    assert_eq!(outcome(child), "admitted 0");

    let name = unique("squat-rdv");
    let mut child = as_nobody(test, "squat-rendezvous", &name);
    wait_ready(&mut child);
    let mut me = Rma::new(RmaConfig::new(NodeId(7))).unwrap();
    let peer = me.connect_shm(&name);
    match me.import_with(peer, SEGMENT, ImportMode::Map) {
        Err(ImportError::Connect(ConnectError::Refused(r))) if squatted(&r) => {}
        other => panic!("imported from a squatter: {other:?}"),
    }
    assert_eq!(outcome(child), "received 0", "the importer sent the squatter nothing");
}

#[test]
fn a_wrong_secret_is_refused_and_counted() {
    if child_side().is_some() {
        return;
    }
    let (mut ep, name) = shm_endpoint(AllowedPeers::own_user(), b"the cluster's");
    for (secret, admitted) in [(&b"a stranger's"[..], false), (b"", false), (b"the cluster's", true)] {
        let (name, secret) = (name.clone(), secret.to_vec());
        let connector = std::thread::spawn(move || {
            let config = ShmConfig { secret, ..ShmConfig::default() };
            ulnet_core::transport::shm::connect::connect_retry(&name, &config, T)
        });
        let deadline = Instant::now() + T;
        let mut accepted = None;
        while !connector.is_finished() && Instant::now() < deadline {
            accepted = accepted.or(ep.try_accept().unwrap());
        }
        match connector.join().unwrap() {
            Ok(_) => assert!(admitted && accepted.is_some(), "a wrong secret was admitted"),
            Err(ConnectError::Refused(Refusal::Secret)) => assert!(!admitted, "the right secret was refused"),
            Err(e) => panic!("{e:?}"),
        }
    }
    let counted = ep.shm_admission().unwrap();
    assert_eq!((counted.refused_secret, counted.admitted), (2, 1), "{counted:?}");

    let (rma, name) = rma_target(AllowedPeers::own_user(), b"the cluster's");
    for (secret, mode) in [(b"a stranger's", ImportMode::Map), (b"a stranger's", ImportMode::Channel)] {
        let mut config = RmaConfig::new(NodeId(7));
        config.shm.secret = secret.to_vec();
        let mut me = Rma::new(config).unwrap();
        let peer = me.connect_shm(&name);
        match me.import_with(peer, SEGMENT, mode) {
            Err(ImportError::Connect(ConnectError::Refused(Refusal::Secret))) => {}
            other => panic!("{mode:?}: {other:?}"),
        }
    }
    let c = counters_once(&rma, |c| c.admission.refused_secret >= 2);
    assert_eq!((c.admission.refused_secret, c.mapped_imports, c.channels_accepted), (2, 0, 0), "{c:?}");
}

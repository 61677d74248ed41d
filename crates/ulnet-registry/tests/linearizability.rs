//! The checker against histories whose answer is known.

use ulnet_registry::linearizability::{check, Action, CheckError, Operation};

fn set(key: &str, v: &str, call: u64, ret: Option<u64>) -> Operation {
    Operation { key: key.into(), action: Action::Set(v.into()), call, ret }
}

fn get(key: &str, v: Option<&str>, call: u64, ret: u64) -> Operation {
    Operation { key: key.into(), action: Action::Get(v.map(Into::into)), call, ret: Some(ret) }
}

const BUDGET: u64 = 10_000_000;

#[test]
fn sequential_history_is_linearizable() {
    let h = vec![
        set("k", "1", 0, Some(1)),
        get("k", Some("1"), 2, 3),
        set("k", "2", 4, Some(5)),
        get("k", Some("2"), 6, 7),
    ];
    assert_eq!(check(&h, BUDGET), Ok(()));
}

#[test]
fn stale_read_after_completed_write_is_not() {
    let h = vec![set("k", "1", 0, Some(1)), set("k", "2", 2, Some(3)), get("k", Some("1"), 4, 5)];
    assert!(matches!(check(&h, BUDGET), Err(CheckError::NotLinearizable { .. })));
}

#[test]
fn concurrent_write_may_be_seen_or_not() {
    // The get overlaps the second set: either value is fine.
    for seen in ["1", "2"] {
        let h = vec![set("k", "1", 0, Some(1)), set("k", "2", 2, Some(10)), get("k", Some(seen), 3, 4)];
        assert_eq!(check(&h, BUDGET), Ok(()), "seeing {seen}");
    }
}

#[test]
fn reads_may_not_go_back_in_time() {
    // Two sequential reads during one long write: new then old is impossible.
    let h = vec![
        set("k", "1", 0, Some(1)),
        set("k", "2", 2, Some(100)),
        get("k", Some("2"), 3, 4),
        get("k", Some("1"), 5, 6),
    ];
    assert!(check(&h, BUDGET).is_err());
    let ok = vec![
        set("k", "1", 0, Some(1)),
        set("k", "2", 2, Some(100)),
        get("k", Some("1"), 3, 4),
        get("k", Some("2"), 5, 6),
    ];
    assert_eq!(check(&ok, BUDGET), Ok(()));
}

#[test]
fn indeterminate_write_may_or_may_not_happen() {
    let happened = vec![set("k", "1", 0, None), get("k", Some("1"), 5, 6)];
    let not = vec![set("k", "1", 0, None), get("k", None, 5, 6)];
    assert_eq!(check(&happened, BUDGET), Ok(()));
    assert_eq!(check(&not, BUDGET), Ok(()));
    // But once seen it cannot be unseen.
    let flicker = vec![set("k", "1", 0, None), get("k", Some("1"), 5, 6), get("k", None, 7, 8)];
    assert!(check(&flicker, BUDGET).is_err());
}

#[test]
fn value_never_written_is_not_readable() {
    let h = vec![set("k", "1", 0, Some(1)), get("k", Some("7"), 2, 3)];
    assert!(check(&h, BUDGET).is_err());
}

#[test]
fn keys_are_checked_independently() {
    let h = vec![
        set("a", "1", 0, Some(1)),
        set("b", "2", 0, Some(1)),
        get("a", Some("1"), 2, 3),
        get("b", Some("2"), 2, 3),
    ];
    assert_eq!(check(&h, BUDGET), Ok(()));
    let bad = vec![set("a", "1", 0, Some(1)), get("b", Some("1"), 2, 3)];
    assert!(matches!(check(&bad, BUDGET), Err(CheckError::NotLinearizable { key }) if key == "b"));
}

#[test]
fn many_concurrent_clients_linearizable_history() {
    // 8 clients, each setting its own values and reading; built from a sequential order
    // with intervals stretched around their linearization points.
    let mut h = Vec::new();
    let mut value = String::from("");
    for i in 0..400u64 {
        let t = i * 10;
        if i % 3 == 0 {
            value = format!("v{i}");
            h.push(set("k", &value, t.saturating_sub(25), Some(t + 25)));
        } else {
            let seen = if value.is_empty() { None } else { Some(value.as_str()) };
            h.push(get("k", seen, t.saturating_sub(3), t + 3));
        }
    }
    assert_eq!(check(&h, BUDGET), Ok(()));
}

#[test]
fn budget_exhaustion_is_reported_not_guessed() {
    // Values written twice take the search; 60 overlapping sets of two values with unknown
    // outcomes, all read, before an impossible "nope": too many orders for a small budget.
    let mut h = Vec::new();
    for i in 0..60u64 {
        h.push(set("k", &format!("{}", i % 2), 0, None));
        h.push(get("k", Some(&format!("{}", i % 2)), 1, 1000));
    }
    h.push(get("k", Some("nope"), 1, 2));
    assert!(matches!(check(&h, 1000), Err(CheckError::TooComplex { .. })));
}

#[test]
fn both_algorithms_agree_on_small_random_histories() {
    // Unique values (the zone check) against the same history with a duplicated dummy set
    // of a value nobody reads... which is dropped; so instead compare against the search by
    // forcing it with a repeated value that no get returns in a second key.
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut disagreements = 0;
    for _ in 0..3000 {
        let mut h = Vec::new();
        let n = rng.gen_range(1..7);
        for i in 0..n {
            let call = rng.gen_range(0..20u64);
            let ret = call + rng.gen_range(0..8u64);
            if rng.gen_bool(0.5) {
                h.push(set("k", &format!("{i}"), call, if rng.gen_bool(0.2) { None } else { Some(ret) }));
            } else {
                let v = rng.gen_range(0..n + 1);
                let seen = if v == n { None } else { Some(format!("{v}")) };
                h.push(get("k", seen.as_deref(), call, ret));
            }
        }
        let zones = check(&h, BUDGET).is_ok();
        // The same history plus an unread completed set of a value written twice in a
        // separate key forces nothing; so check the search directly on a copy whose values
        // are made non-unique by adding a never-read duplicate set at the very end.
        let mut dup = h.clone();
        dup.push(set("k", "dup", 1000, Some(1001)));
        dup.push(set("k", "dup", 1002, Some(1003)));
        let search = check(&dup, BUDGET).is_ok();
        if zones != search {
            disagreements += 1;
            eprintln!("disagree (zones {zones}, search {search}): {h:?}");
        }
    }
    assert_eq!(disagreements, 0);
}

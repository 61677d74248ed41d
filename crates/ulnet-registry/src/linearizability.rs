//! A linearizability checker for registry histories, per key (a key is a read/write
//! register; linearizability is local, so a history is linearizable when each key's is).
//!
//! When every set of a key writes a distinct value (as test clients do), the check is
//! Gibbons and Korach's polynomial one: group each set with the gets that returned its value
//! (a *cluster*); a cluster whose earliest return precedes its latest call has a *forward
//! zone* between the two, otherwise a *backward zone*; the history is linearizable iff no get
//! returns before its set was called, no two forward zones overlap, and no backward zone lies
//! inside a forward zone. Otherwise the search is the Wing–Gong algorithm with Lowe's
//! memoization (as Porcupine and Knossos do it), within a step budget.
//!
//! A set whose outcome is unknown (the client gave up) has no return: it may take effect at
//! any time after its call, or never. One whose value nobody read is left out (taking it as
//! never having happened changes no answer).
//!
//! ```
//! use ulnet_registry::linearizability::{check, Action, Operation};
//! let h = vec![
//!     Operation { key: b"k".to_vec(), action: Action::Set(b"1".to_vec()), call: 0, ret: Some(10) },
//!     Operation { key: b"k".to_vec(), action: Action::Get(Some(b"1".to_vec())), call: 11, ret: Some(12) },
//!     Operation { key: b"k".to_vec(), action: Action::Get(None), call: 13, ret: Some(14) },
//! ];
//! assert!(check(&h, 1_000_000).is_err(), "the set finished before the get of nothing began");
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};

/// What a client did to a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Set the key to this value.
    Set(Vec<u8>),
    /// Read the key and saw this (None: absent).
    Get(Option<Vec<u8>>),
}

/// One operation of a history; times in any unit, the same for all clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    /// The key.
    pub key: Vec<u8>,
    /// What was done.
    pub action: Action,
    /// When the client invoked it.
    pub call: u64,
    /// When the client got the answer; None when the outcome is unknown (only meaningful for
    /// sets; a get without an answer should be left out of the history).
    pub ret: Option<u64>,
}

/// Why a history is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// No order of the operations on this key respects real time and register semantics.
    #[error("not linearizable on key {key:?}")]
    NotLinearizable {
        /// The key (lossy UTF-8).
        key: String,
    },
    /// The search exceeded its step budget on this key (undecided).
    #[error("undecided on key {key:?}: search budget exhausted")]
    TooComplex {
        /// The key (lossy UTF-8).
        key: String,
    },
}

/// Checks `history` key by key, spending at most `steps_max` search steps per key.
pub fn check(history: &[Operation], steps_max: u64) -> Result<(), CheckError> {
    let mut by_key: BTreeMap<&[u8], Vec<&Operation>> = BTreeMap::new();
    let mut read: HashSet<(&[u8], &[u8])> = HashSet::new();
    for op in history {
        if let Action::Get(Some(v)) = &op.action {
            read.insert((&op.key, v));
        }
    }
    for op in history {
        // A set with an unknown outcome whose value nobody read can always be taken as never
        // having happened; leaving it out keeps the search small and changes no answer.
        if let (Action::Set(v), None) = (&op.action, op.ret) {
            if !read.contains(&(op.key.as_slice(), v.as_slice())) {
                continue;
            }
        }
        by_key.entry(&op.key).or_default().push(op);
    }
    for (key, ops) in by_key {
        let name = String::from_utf8_lossy(key).into_owned();
        let verdict = match check_unique_values(&ops) {
            Some(v) => Some(v),
            None => check_register(&ops, steps_max),
        };
        match verdict {
            Some(true) => {}
            Some(false) => return Err(CheckError::NotLinearizable { key: name }),
            None => return Err(CheckError::TooComplex { key: name }),
        }
    }
    Ok(())
}

/// Gibbons–Korach for one register whose sets all write distinct values; None when some
/// value is written twice (then the search decides).
fn check_unique_values(ops: &[&Operation]) -> Option<bool> {
    // Per value: (latest call, earliest return) over the set and its gets, and the set's
    // call. The absent value is "written" by a set at time 0.
    struct Cluster {
        call_max: u64,
        ret_min: u64,
        set_call: Option<u64>,
    }
    let mut clusters: HashMap<Option<&[u8]>, Cluster> = HashMap::new();
    // The absent value's set comes strictly before every operation: real times shift by one.
    clusters.insert(None, Cluster { call_max: 0, ret_min: 0, set_call: Some(0) });
    let shifted = |t: u64| t.saturating_add(1);
    for op in ops {
        let (call, ret) = (shifted(op.call), op.ret.map_or(u64::MAX, shifted));
        if let Action::Set(v) = &op.action {
            let c = clusters.entry(Some(v)).or_insert(Cluster { call_max: 0, ret_min: u64::MAX, set_call: None });
            if c.set_call.is_some() {
                return None;
            }
            c.set_call = Some(call);
            c.call_max = c.call_max.max(call);
            c.ret_min = c.ret_min.min(ret);
        }
    }
    for op in ops {
        let (call, ret) = (shifted(op.call), op.ret.map_or(u64::MAX, shifted));
        if let Action::Get(v) = &op.action {
            let Some(c) = clusters.get_mut(&v.as_deref()) else { return Some(false) };
            if c.set_call.is_some_and(|call| ret < call) {
                return Some(false);
            }
            c.call_max = c.call_max.max(call);
            c.ret_min = c.ret_min.min(ret);
        }
    }
    let mut forward: Vec<(u64, u64)> = Vec::new();
    let mut backward: Vec<(u64, u64)> = Vec::new();
    for c in clusters.values() {
        if c.set_call.is_none() {
            return Some(false);
        }
        if c.ret_min < c.call_max {
            forward.push((c.ret_min, c.call_max));
        } else {
            backward.push((c.call_max, c.ret_min));
        }
    }
    forward.sort_unstable();
    if forward.windows(2).any(|w| w[1].0 < w[0].1) {
        return Some(false);
    }
    for (lo, hi) in backward {
        // The forward zone starting last before `lo` is the only one that can contain it.
        let i = forward.partition_point(|z| z.0 < lo);
        if i > 0 && hi < forward[i - 1].1 {
            return Some(false);
        }
    }
    Some(true)
}

#[derive(Clone, Copy)]
struct Event {
    op: usize,
    is_call: bool,
}

/// One register's history: Some(linearizable?) or None when over budget.
fn check_register<'a>(ops: &[&'a Operation], steps_max: u64) -> Option<bool> {
    // Values as small numbers; 0 is "absent".
    let mut ids: HashMap<&'a [u8], u32> = HashMap::new();
    let mut value_id = |v: Option<&'a [u8]>| -> u32 {
        match v {
            None => 0,
            Some(v) => {
                let n = ids.len() as u32 + 1;
                *ids.entry(v).or_insert(n)
            }
        }
    };
    // (is_set, value) per operation.
    let model: Vec<(bool, u32)> = ops
        .iter()
        .map(|op| match &op.action {
            Action::Set(v) => (true, value_id(Some(v))),
            Action::Get(v) => (false, value_id(v.as_deref())),
        })
        .collect();
    let mut events: Vec<(u64, u8, Event)> = Vec::with_capacity(ops.len() * 2);
    for (i, op) in ops.iter().enumerate() {
        events.push((op.call, 0, Event { op: i, is_call: true }));
        events.push((op.ret.unwrap_or(u64::MAX), 1, Event { op: i, is_call: false }));
    }
    // At equal times calls come first: the operations overlap (the permissive reading).
    events.sort_by_key(|(t, kind, e)| (*t, *kind, e.op));
    let n = events.len();
    // Doubly linked list over event indices, with a head at n and an end at n + 1.
    let (head, end) = (n, n + 1);
    let mut next: Vec<usize> = (0..n + 2).map(|i| if i == head { 0 } else { i + 1 }).collect();
    let mut prev: Vec<usize> = (0..n + 2).map(|i| if i == 0 { head } else { i.wrapping_sub(1) }).collect();
    if n == 0 {
        return Some(true);
    }
    next[head] = 0;
    prev[0] = head;
    next[n - 1] = end;
    prev[end] = n - 1;
    let mut call_at = vec![0; ops.len()];
    let mut ret_at = vec![0; ops.len()];
    for (i, (_, _, e)) in events.iter().enumerate() {
        if e.is_call {
            call_at[e.op] = i;
        } else {
            ret_at[e.op] = i;
        }
    }
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, i: usize| {
        let (p, q) = (prev[i], next[i]);
        next[p] = q;
        prev[q] = p;
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, i: usize| {
        let (p, q) = (prev[i], next[i]);
        next[p] = i;
        prev[q] = i;
    };
    let words = ops.len().div_ceil(64);
    let mut taken = vec![0u64; words];
    let mut state: u32 = 0;
    let mut stack: Vec<(usize, u32)> = Vec::new();
    let mut seen: HashSet<(Vec<u64>, u32)> = HashSet::new();
    let mut entry = next[head];
    let mut steps = 0u64;
    loop {
        steps += 1;
        if steps > steps_max {
            return None;
        }
        if next[head] == end {
            return Some(true);
        }
        let call = entry != end && events[entry].2.is_call;
        if call {
            let e = events[entry].2;
            let (is_set, v) = model[e.op];
            let allowed = is_set || v == state;
            let new_state = if is_set { v } else { state };
            if allowed {
                taken[e.op / 64] |= 1 << (e.op % 64);
                if seen.insert((taken.clone(), new_state)) {
                    stack.push((e.op, state));
                    state = new_state;
                    unlink(&mut next, &mut prev, call_at[e.op]);
                    unlink(&mut next, &mut prev, ret_at[e.op]);
                    entry = next[head];
                    continue;
                }
                taken[e.op / 64] &= !(1 << (e.op % 64));
            }
            entry = next[entry];
        } else {
            // A return of an operation not taken yet (or the end): undo the last choice.
            let Some((op, old)) = stack.pop() else { return Some(false) };
            state = old;
            taken[op / 64] &= !(1 << (op % 64));
            relink(&mut next, &mut prev, ret_at[op]);
            relink(&mut next, &mut prev, call_at[op]);
            entry = next[call_at[op]];
        }
    }
}

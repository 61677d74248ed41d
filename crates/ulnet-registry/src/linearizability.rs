//! A linearizability checker for registry histories, per key (a key is a read/write
//! register; linearizability is local, so a history is linearizable when each key's is).
//!
//! The search is the Wing–Gong algorithm with Lowe's memoization (as Porcupine and Knossos
//! do it): walk the call and return events in time order; at a call, try to take the
//! operation now if the register allows it; at a return of an operation not yet taken,
//! undo the last choice. A set whose outcome is unknown (the client gave up) has no return:
//! it may take effect at any time after its call, or never.
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
    for op in history {
        by_key.entry(&op.key).or_default().push(op);
    }
    for (key, ops) in by_key {
        let name = String::from_utf8_lossy(key).into_owned();
        match check_register(&ops, steps_max) {
            Some(true) => {}
            Some(false) => return Err(CheckError::NotLinearizable { key: name }),
            None => return Err(CheckError::TooComplex { key: name }),
        }
    }
    Ok(())
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

//! A proxy's document cache: least recently used out first, bounded in bytes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Bytes of documents a proxy keeps by default: 8 MiB, about 1,800 documents of the traces'
/// 4.5 KiB average, so the zipf trace's tail misses and a single-file burst always hits.
pub const CACHE_BYTES_DEFAULT: usize = 8 << 20;

/// An LRU cache of documents keyed by (site, document).
#[derive(Debug)]
pub struct DocumentCache {
    capacity_bytes: usize,
    bytes: usize,
    tick: u64,
    entries: HashMap<u64, (Arc<[u8]>, u64)>,
    by_age: BTreeMap<u64, u64>,
}

fn key(site: u8, doc: u32) -> u64 {
    u64::from(site) << 32 | u64::from(doc)
}

impl DocumentCache {
    /// An empty cache holding at most `capacity_bytes`.
    pub fn new(capacity_bytes: usize) -> Self {
        DocumentCache { capacity_bytes, bytes: 0, tick: 0, entries: HashMap::new(), by_age: BTreeMap::new() }
    }

    /// The document, if cached (and marks it recently used).
    pub fn get(&mut self, site: u8, doc: u32) -> Option<Arc<[u8]>> {
        self.tick += 1;
        let tick = self.tick;
        let (body, age) = self.entries.get_mut(&key(site, doc))?;
        self.by_age.remove(age);
        *age = tick;
        self.by_age.insert(tick, key(site, doc));
        Some(body.clone())
    }

    /// Stores a document, evicting the least recently used ones to make room.
    pub fn insert(&mut self, site: u8, doc: u32, body: Arc<[u8]>) {
        if body.len() > self.capacity_bytes {
            return;
        }
        self.tick += 1;
        let k = key(site, doc);
        if let Some((old, age)) = self.entries.remove(&k) {
            self.by_age.remove(&age);
            self.bytes -= old.len();
        }
        while self.bytes + body.len() > self.capacity_bytes {
            let Some((_, oldest)) = self.by_age.pop_first() else { break };
            if let Some((b, _)) = self.entries.remove(&oldest) {
                self.bytes -= b.len();
            }
        }
        self.bytes += body.len();
        self.entries.insert(k, (body, self.tick));
        self.by_age.insert(self.tick, k);
        debug_assert!(self.bytes <= self.capacity_bytes, "cache over its byte bound");
    }

    /// Drops everything (a node leaving the proxy tier frees its memory).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.by_age.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used() {
        let mut c = DocumentCache::new(300);
        for d in 0..3 {
            c.insert(0, d, vec![0; 100].into());
        }
        assert!(c.get(0, 0).is_some());
        c.insert(0, 3, vec![0; 100].into());
        assert!(c.get(0, 1).is_none(), "1 was least recently used");
        assert!(c.get(0, 0).is_some() && c.get(0, 2).is_some() && c.get(0, 3).is_some());
    }
}

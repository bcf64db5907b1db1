//! The downstream mock's fault injection and per-key bookkeeping: which
//! `Idempotency-Key`s get a 503 on their first call, and how many calls each
//! key received, so a run can show that a retrying server called every step
//! exactly as often as it had to (once, or twice after an injected fault).
//!
//! The choice is a pure function of the key (FNV-1a, `% 100 < pct`), so a
//! run is reproducible and the server cannot tell faulted keys apart.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Lock shards: step calls from many connections rarely meet on one lock.
const SHARDS: usize = 64;

/// 64-bit FNV-1a: tiny, stable across platforms and releases (unlike std's
/// `DefaultHasher`), and mixes short ids well enough for a percentage.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Whether the first call with a key of this hash is answered 503 at `pct` percent.
fn chosen(hash: u64, pct: u8) -> bool {
    hash % 100 < u64::from(pct)
}

/// Whether the first call with `key` is answered 503 at `pct` percent.
pub fn fails_first(key: &[u8], pct: u8) -> bool {
    chosen(fnv1a(key), pct)
}

/// Calls a key may take: its first call, plus the retry an injected fault asked for.
pub fn expected_calls(faulted: bool) -> u32 {
    if faulted {
        2
    } else {
        1
    }
}

/// Calls beyond what the key needed (a duplicate the server should not have made).
pub fn excess(calls: u32, faulted: bool) -> u32 {
    calls.saturating_sub(expected_calls(faulted))
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    calls: u32,
    faulted: bool,
}

/// What `GET /stats` reports about keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeySummary {
    /// Distinct keys seen.
    pub keys: u64,
    pub faults_injected: u64,
    pub max_calls_per_key: u32,
    /// Sum over keys of the calls beyond `expected_calls`.
    pub excess_calls: u64,
    pub keys_called_more_than_needed: u64,
}

impl KeySummary {
    fn add(&mut self, e: Entry) {
        self.keys += 1;
        self.faults_injected += u64::from(e.faulted);
        self.max_calls_per_key = self.max_calls_per_key.max(e.calls);
        let extra = excess(e.calls, e.faulted);
        self.excess_calls += u64::from(extra);
        self.keys_called_more_than_needed += u64::from(extra > 0);
    }
}

/// Key -> calls, sharded by the key's hash.
pub struct KeyCounts {
    shards: Vec<Mutex<HashMap<Box<[u8]>, Entry>>>,
}

impl Default for KeyCounts {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl std::fmt::Debug for KeyCounts {
    // The map can hold millions of keys: show what /stats shows instead.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyCounts({:?})", self.summary())
    }
}

/// A panic elsewhere cannot leave a map half-updated (every update is one
/// statement), so a poisoned lock is still good to use.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl KeyCounts {
    /// Counts a call with `key`; true if this call is to be answered 503
    /// (the key's first call, when the key is chosen at `pct` percent).
    pub fn record(&self, key: &[u8], pct: u8) -> bool {
        let hash = fnv1a(key);
        // Top bits pick the shard: the low ones already decide the fault.
        let shard = &self.shards[(hash >> 58) as usize % SHARDS];
        let mut map = lock(shard);
        if let Some(e) = map.get_mut(key) {
            e.calls = e.calls.saturating_add(1);
            return false;
        }
        let faulted = chosen(hash, pct);
        map.insert(key.into(), Entry { calls: 1, faulted });
        faulted
    }

    pub fn summary(&self) -> KeySummary {
        let mut s = KeySummary::default();
        for shard in &self.shards {
            for e in lock(shard).values() {
                s.add(*e);
            }
        }
        s
    }

    pub fn clear(&self) {
        for shard in &self.shards {
            lock(shard).clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> Vec<u8> {
        // The shape clamp sends: `<service-request-id>:<step-id>`.
        format!("0190f3a2-7c41-7d2e-9b1a-{i:012x}:{}", i % 2 + 1).into_bytes()
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn choice_is_deterministic_and_near_the_percentage() {
        for pct in [0u8, 1, 25, 50, 99, 100] {
            let hits = (0..10_000).filter(|&i| fails_first(&key(i), pct)).count();
            let want = 100 * usize::from(pct);
            assert!(hits.abs_diff(want) <= 250, "pct {pct}: {hits} of 10000");
            let again = (0..10_000).filter(|&i| fails_first(&key(i), pct)).count();
            assert_eq!(hits, again);
        }
        assert_eq!((0..10_000).filter(|&i| fails_first(&key(i), 0)).count(), 0);
        assert_eq!(
            (0..10_000).filter(|&i| fails_first(&key(i), 100)).count(),
            10_000
        );
    }

    #[test]
    fn excess_allows_one_retry_only_after_a_fault() {
        assert_eq!(excess(0, false), 0);
        assert_eq!(excess(1, false), 0);
        assert_eq!(excess(2, false), 1);
        assert_eq!(excess(1, true), 0);
        assert_eq!(excess(2, true), 0);
        assert_eq!(excess(5, true), 3);
    }

    #[test]
    fn only_the_first_call_of_a_chosen_key_is_faulted() {
        let counts = KeyCounts::default();
        let faulted = (0..1000).find(|&i| fails_first(&key(i), 30)).unwrap();
        let clean = (0..1000).find(|&i| !fails_first(&key(i), 30)).unwrap();
        assert!(counts.record(&key(faulted), 30));
        assert!(!counts.record(&key(faulted), 30));
        assert!(!counts.record(&key(clean), 30));
        assert_eq!(
            counts.summary(),
            KeySummary {
                keys: 2,
                faults_injected: 1,
                max_calls_per_key: 2,
                excess_calls: 0,
                keys_called_more_than_needed: 0,
            }
        );
        // A third call of the faulted key and a second of the clean one are excess.
        counts.record(&key(faulted), 30);
        counts.record(&key(clean), 30);
        counts.record(&key(clean), 30);
        let s = counts.summary();
        assert_eq!(
            (
                s.max_calls_per_key,
                s.excess_calls,
                s.keys_called_more_than_needed
            ),
            (3, 3, 2)
        );
        counts.clear();
        assert_eq!(counts.summary(), KeySummary::default());
        // After a reset the key is new again, so its first call fails again.
        assert!(counts.record(&key(faulted), 30));
    }
}

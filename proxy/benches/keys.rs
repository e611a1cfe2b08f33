//! What choosing a key costs a request (docs/request-lifecycle.md#key-pools):
//! `KeyPool::pick`, one atomic add and a scan of the pool's atomics, for one key, a pool of
//! 3 and of 32 (some keys set aside), on one thread and on four at once; against the same
//! round robin behind a `Mutex`, the lock the pool does not take. Prints figures and
//! ratios; asserts nothing.
//!
//! `cargo bench -p switchback-proxy --bench keys`

use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use http::HeaderMap;
use switchback_proxy::limits::keys::{KeyPool, PoolKey};

const PICKS: usize = 2_000_000;
const THREADS: usize = 4;

fn pool(n: usize, aside: usize) -> KeyPool {
    let keys: Vec<PoolKey> = (0..n)
        .map(|i| PoolKey {
            name: format!("k{i}").into(),
            headers: HeaderMap::new(),
            secret: None,
            state: Arc::default(),
        })
        .collect();
    let pool = KeyPool::new(keys);
    for i in 0..aside {
        pool.get(i as u8).state.park_until(u64::MAX);
    }
    pool
}

/// The same turn as `pick` (the next usable key), kept behind a lock.
struct Locked {
    next: Mutex<usize>,
    pool: KeyPool,
}

impl Locked {
    fn pick(&self, now_ms: u64) -> u8 {
        let mut next = self.next.lock().unwrap();
        let n = self.pool.len();
        for k in 0..n {
            let i = (*next + k) % n;
            if self.pool.get(i as u8).state.usable(now_ms) {
                *next = i + 1;
                return i as u8;
            }
        }
        0
    }
}

/// Nanoseconds per pick, `threads` threads each picking `PICKS / threads` times.
fn ns_per_pick(threads: usize, pick: impl Fn() -> u8 + Sync) -> f64 {
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..PICKS / threads {
                    black_box(pick());
                }
            });
        }
    });
    started.elapsed().as_nanos() as f64 / PICKS as f64
}

fn main() {
    println!("keys: {PICKS} picks; ns per pick (pool) | ns per pick (Mutex) | ratio");
    for (n, aside) in [(1, 0), (3, 1), (32, 8)] {
        for threads in [1, THREADS] {
            let p = pool(n, aside);
            let pooled = ns_per_pick(threads, || p.pick(1_000).unwrap_or(0));
            let locked = Locked {
                next: Mutex::new(0),
                pool: pool(n, aside),
            };
            let mutexed = ns_per_pick(threads, || locked.pick(1_000));
            println!(
                "  {n:>2} keys ({aside} set aside), {threads} thread(s): {pooled:>7.1} | {mutexed:>7.1} | {:.2}x",
                mutexed / pooled
            );
        }
    }
}

//! The walk both `benches/store.rs` and `examples/keyed.rs` time: each
//! thread checks the keys in order from its own starting point.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Runs `check` over `keys` from `threads` threads, `iters` checks in all,
/// and returns the wall time.
pub(crate) fn run<F: Fn(&String) + Sync + Send + 'static>(
    check: Arc<F>,
    keys: &Arc<Vec<String>>,
    threads: usize,
    iters: u64,
) -> Duration {
    let per_thread = iters / threads as u64;
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (check, keys) = (check.clone(), keys.clone());
            thread::spawn(move || {
                // Each thread walks the keys in order from its own starting
                // point: the harness's own reads are sequential (prefetched),
                // so what is measured is the stores' random access to their
                // tables, as when a server checks the key it just parsed.
                let mut i = t * keys.len() / threads;
                for _ in 0..per_thread {
                    i += 1;
                    if i == keys.len() {
                        i = 0;
                    }
                    check(&keys[i]);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a checking thread");
    }
    start.elapsed()
}

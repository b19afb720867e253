//! The caller-side concurrency limit's gradient (`odmesh_filter::limiter`), as both shells
//! drive it: settings from the control plane's JSON, then any sequence of requests let
//! in, timed and ended, at any latencies and times.
//!
//! Input: `SETTINGS-JSON \0 OPS` or `OPS` alone (the default settings); each op is 3 bytes, a
//! kind and a 16-bit value: let one in, end one, time one (latency from the value, on a clock
//! that moves forward), let time pass. Checks:
//! - settings that parse but do not fit together are refused with what is wrong;
//! - the limit stays within `[min_limit, max_limit]`, finite, whatever the latencies;
//! - a request is let in only below the limit, and what is in flight is exactly what was let in
//!   and not ended;
//! - a window closes only with `min_samples` samples in it;
//! - the state read back from its bytes (as the wasm shell keeps it, in Envoy's shared data) is
//!   the same state, and any other bytes read as one are within its bounds or refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use odmesh_filter::limiter::{Gradient, Params};

const MS: u64 = 1_000_000;

fuzz_target!(|data: &[u8]| {
    if let Some(g) = Gradient::decode(data) {
        let p = *g.params();
        assert_eq!(p.check(), Ok(()));
        assert!((p.min_limit..=p.max_limit).contains(&g.limit()));
    }
    let (params, ops) = match data.iter().position(|&b| b == 0) {
        None => (Params::default(), data),
        Some(nul) => match serde_json::from_slice::<Params>(&data[..nul]) {
            Ok(p) => (p, &data[nul + 1..]),
            Err(_) => return,
        },
    };
    if let Err(why) = params.check() {
        assert!(!why.is_empty());
        return;
    }
    let mut now = 0u64;
    let mut g = Gradient::new(params, now);
    let mut held = 0u32;
    let mut samples_since_close = 0u32;
    for op in ops.chunks_exact(3) {
        let value = u64::from(u16::from_le_bytes([op[1], op[2]]));
        match op[0] % 4 {
            0 => {
                let below = g.in_flight() < g.limit();
                let admitted = g.try_acquire();
                assert_eq!(admitted, below, "let in exactly below the limit");
                if admitted {
                    held += 1;
                }
            }
            1 => {
                if held > 0 {
                    held -= 1;
                    g.release();
                }
            }
            2 => {
                // Latencies from 1 µs to about 4 s, on a clock that moves with them.
                let rtt = value * value + 1_000;
                now += value * 10_000;
                samples_since_close += 1;
                if g.sample(rtt, now) {
                    assert!(
                        samples_since_close >= params.min_samples,
                        "a window closed with {samples_since_close} samples"
                    );
                    samples_since_close = 0;
                }
            }
            _ => now += value * MS,
        }
        let limit = g.limit();
        assert!(
            (params.min_limit..=params.max_limit).contains(&limit),
            "limit {limit} outside [{}, {}]",
            params.min_limit,
            params.max_limit
        );
        assert_eq!(g.in_flight(), held);
        // Each step through its bytes, as the wasm shell does between two hooks.
        let again = Gradient::decode(&g.encode()).expect("a state reads back");
        assert_eq!(again, g);
        g = again;
    }
});

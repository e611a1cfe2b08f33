//! What `--auth required` costs per request, natively, piece by piece: the HMAC of
//! the presented key, reading the key from the headers, the tenant lookup with its
//! constant-time confirmation, and the client's admission. The callgrind figures of
//! the README's Benchmark section count instructions under valgrind, which does not
//! emulate the SHA extensions: there aws-lc runs its software SHA-256, so this is
//! where the HMAC's real cost shows. Prints figures; asserts nothing.
//!
//! `cargo run --release -p switchback-tests --example auth_cost`

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use hyper::HeaderMap;
use hyper::header::{AUTHORIZATION, HeaderValue};
use switchback_crds::config::ObjectId;
use switchback_crds::keyhash::{KeyHash, KeyHasher};
use switchback_proxy::config::snapshot::ByKeyHash;
use switchback_proxy::http::auth::presented_key;
use switchback_proxy::limits::clients::{ClientCounters, ClientRt, Need, WallClock};

const ROUNDS: u32 = 1_000_000;
const TRIES: usize = 7;

/// Best of [`TRIES`] runs of [`ROUNDS`] calls, in ns per call (the best run is the
/// one the rest of the machine disturbed least).
fn ns_per_call(mut f: impl FnMut()) -> f64 {
    for _ in 0..ROUNDS / 10 {
        f();
    }
    (0..TRIES)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..ROUNDS {
                f();
            }
            t.elapsed().as_nanos() as f64 / f64::from(ROUNDS)
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let secret = [0x5au8; 32];
    let hasher = KeyHasher::new(&secret).expect("32 bytes");
    let hmac_key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &secret);
    // A 40-byte key (`sk-` and 37 more), and the bench's 32-byte one.
    let key40 = b"sk-proj-0123456789abcdef0123456789abcdef";
    assert_eq!(key40.len(), 40);
    let key32 = b"sk-bench-client-0123456789abcdef";

    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_static("Bearer sk-proj-0123456789abcdef0123456789abcdef"),
    );
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("accept", HeaderValue::from_static("*/*"));

    // Eleven clients, keyed as a snapshot keys them.
    let mut tenants: HashMap<KeyHash, u32, ByKeyHash> = HashMap::default();
    for i in 0..10u32 {
        tenants.insert(hasher.hash(format!("sk-other-{i:031}").as_bytes()), i);
    }
    let mine = hasher.hash(key40);
    tenants.insert(mine, 99);

    let client = ClientRt {
        id: ObjectId::new("bench", "client"),
        label: "bench/client".into(),
        counters: Arc::new(ClientCounters::default()),
        limits: None,
        exhausted: None,
        budget: None,
        replicas: 1,
        reserve: true,
        standalone: true,
        clock: WallClock::new(SystemTime::now(), tokio::time::Instant::now()),
        settling: Arc::default(),
    };

    let now = tokio::time::Instant::now();
    let sha = aws_lc_rs::digest::SHA256.output_len();
    let rows: Vec<(&str, f64)> = vec![
        (
            "KeyHasher::hash, 40-byte key (HMAC-SHA256)",
            ns_per_call(|| {
                black_box(hasher.hash(black_box(key40)));
            }),
        ),
        (
            "  the same with hmac::sign and a copy (before)",
            ns_per_call(|| {
                let tag = aws_lc_rs::hmac::sign(&hmac_key, black_box(key40));
                let mut out = [0u8; 32];
                out.copy_from_slice(tag.as_ref());
                black_box(out);
            }),
        ),
        (
            "    of which: the keyed context's copy and wipe",
            ns_per_call(|| {
                // What every aws-lc-rs HMAC call does first (and last, when dropped).
                black_box(hmac_key.clone());
            }),
        ),
        (
            "KeyHasher::hash, 32-byte key (the bench's)",
            ns_per_call(|| {
                black_box(hasher.hash(black_box(key32)));
            }),
        ),
        (
            "  for scale: SHA-256 of 40 bytes (one block)",
            ns_per_call(|| {
                let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, black_box(key40));
                black_box(d.as_ref().len() == sha);
            }),
        ),
        (
            "presented_key (Authorization: Bearer)",
            ns_per_call(|| {
                black_box(presented_key(black_box(&headers)));
            }),
        ),
        (
            "tenant lookup (11 clients) + constant-time compare",
            ns_per_call(|| {
                let h = black_box(&mine);
                let found = tenants.get(h).is_some_and(|_| h.ct_eq(&mine));
                black_box(found);
            }),
        ),
        (
            "ClientRt::admit (no limits; its clock read not included)",
            ns_per_call(|| {
                black_box(client.admit(black_box(now), &Need::default()).is_ok());
            }),
        ),
        (
            "  for scale: one Instant::now()",
            ns_per_call(|| {
                black_box(Instant::now());
            }),
        ),
    ];
    println!("--auth required, native cost per call (best of {TRIES} x {ROUNDS} calls):");
    for (what, ns) in &rows {
        println!("  {what:<52} {ns:>8.1} ns");
    }
}

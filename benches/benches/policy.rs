//! How long classifying a path takes: it runs on every lookup.
use std::path::Path;

use ccfs::policy::Policy;
use criterion::{black_box, criterion_group, criterion_main, Criterion};

fn classify(c: &mut Criterion) {
    let p = Policy::default_policy();
    c.bench_function("classify deep firefox path", |b| {
        b.iter(|| {
            p.classify(black_box(Path::new(
                ".mozilla/firefox/abcd.default-release/storage/default/x/idb/1.sqlite",
            )))
        })
    });
    c.bench_function("classify document", |b| {
        b.iter(|| p.classify(black_box(Path::new("Documents/thesis/chapter1.odt"))))
    });
}

criterion_group!(benches, classify);
criterion_main!(benches);

//! Memory bound of the placement index: bytes per (block, instance) entry at 1M entries.
//!
//! Prints the measured figures (`cargo test -p kvgate-core --release --test index_memory -- --nocapture`).

use kvgate_core::index::{IndexConfig, PlacementIndex};
use kvgate_core::{InstanceId, Source};

const ENTRIES: usize = 1 << 20;

fn index() -> PlacementIndex {
    PlacementIndex::new(IndexConfig {
        shards: 64,
        max_entries: 2 * ENTRIES,
        default_instance_capacity: 2 * ENTRIES,
    })
}

fn chain(seed: u64, len: usize) -> Vec<u64> {
    (0..len as u64)
        .map(|i| kvgate_core::policy::util::mix(seed.wrapping_mul(1 << 32) ^ i))
        .collect()
}

fn per_entry(ix: &PlacementIndex) -> f64 {
    let st = ix.stats();
    st.memory_bytes as f64 / ix.len() as f64
}

#[test]
fn one_holder_per_block_fits_64_bytes_per_entry() {
    let ix = index();
    for s in 0..(ENTRIES / 1024) as u64 {
        ix.predict(
            InstanceId((s % 8) as u32),
            &chain(s, 1024),
            Source::Local,
            60_000,
            0,
        );
    }
    assert_eq!(ix.len(), ENTRIES);
    let b = per_entry(&ix);
    println!("1 holder/block: {} entries, {:.1} bytes/entry", ix.len(), b);
    assert!(b <= 64.0, "{b}");
}

#[test]
fn eight_holders_per_block_fits_64_bytes_per_entry() {
    let ix = index();
    for s in 0..(ENTRIES / 8 / 1024) as u64 {
        let hs = chain(s, 1024);
        for i in 0..8 {
            ix.predict(InstanceId(i), &hs, Source::Local, 60_000, 0);
        }
    }
    assert_eq!(ix.len(), ENTRIES);
    let b = per_entry(&ix);
    println!(
        "8 holders/block: {} entries, {:.1} bytes/entry",
        ix.len(),
        b
    );
    assert!(b <= 64.0, "{b}");
}

#[test]
fn churn_at_the_cap_stays_within_64_bytes_per_entry() {
    let ix = PlacementIndex::new(IndexConfig {
        shards: 64,
        max_entries: ENTRIES,
        default_instance_capacity: ENTRIES,
    });
    for s in 0..(2 * ENTRIES / 1024) as u64 {
        ix.predict(
            InstanceId((s % 8) as u32),
            &chain(s, 1024),
            Source::Local,
            60_000,
            0,
        );
    }
    assert!(ix.len() <= ENTRIES);
    let b = ix.stats().memory_bytes as f64 / ENTRIES as f64;
    println!(
        "after churn at the cap: {} entries, {:.1} bytes per capped entry",
        ix.len(),
        b
    );
    assert!(b <= 64.0, "{b}");
}

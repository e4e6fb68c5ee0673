//! Unit tests of the placement index with explicit times.

use super::*;

fn idx(cap: usize, max: usize) -> PlacementIndex {
    PlacementIndex::new(IndexConfig {
        shards: 4,
        max_entries: max,
        default_instance_capacity: cap,
    })
}

fn m(ix: &PlacementIndex, hashes: &[u64], now: Millis) -> Vec<(u32, u32, u32, u32)> {
    let mut out = PrefixMatches::default();
    ix.match_prefix(hashes, now, &mut out);
    let mut v: Vec<_> = out
        .rows
        .iter()
        .map(|r| (r.instance.0, r.gpu, r.cpu, r.disk))
        .collect();
    v.sort();
    v
}

#[test]
fn longest_leading_run_by_tier() {
    let ix = idx(1000, 10_000);
    ix.store(InstanceId(0), &[1, 2, 3], Tier::Gpu, 0);
    ix.store(InstanceId(1), &[1, 2], Tier::Gpu, 0);
    ix.store(InstanceId(1), &[3, 4], Tier::Cpu, 0);
    ix.store(InstanceId(2), &[2, 3, 4], Tier::Gpu, 0); // no block 0: never a leading run
    assert_eq!(m(&ix, &[1, 2, 3, 4], 0), vec![(0, 3, 0, 0), (1, 2, 2, 0)]);
    assert_eq!(m(&ix, &[9, 1], 0), vec![]);
    assert_eq!(m(&ix, &[], 0), vec![]);
    let mut out = PrefixMatches::default();
    ix.match_prefix(&[1, 2, 3, 4], 0, &mut out);
    assert_eq!(out.best(), 4);
    assert_eq!(out.get(InstanceId(0)).total(), 3);
    assert_eq!(out.get(InstanceId(7)).total(), 0);
}

#[test]
fn gap_ends_the_run() {
    let ix = idx(1000, 10_000);
    ix.store(InstanceId(0), &[1, 2, 4], Tier::Gpu, 0);
    assert_eq!(m(&ix, &[1, 2, 3, 4], 0), vec![(0, 2, 0, 0)]);
}

#[test]
fn refcounted_removal() {
    let ix = idx(1000, 10_000);
    ix.store(InstanceId(0), &[1], Tier::Gpu, 0);
    ix.store(InstanceId(0), &[1], Tier::Gpu, 0);
    ix.remove(InstanceId(0), &[1], Tier::Gpu);
    assert_eq!(m(&ix, &[1], 0), vec![(0, 1, 0, 0)]);
    ix.remove(InstanceId(0), &[1], Tier::Gpu);
    assert_eq!(m(&ix, &[1], 0), vec![]);
    assert_eq!(ix.len(), 0);
    // GPU copy removed while a CPU copy remains: the block now counts as CPU.
    ix.store(InstanceId(0), &[5], Tier::Gpu, 0);
    ix.store(InstanceId(0), &[5], Tier::Cpu, 0);
    ix.remove(InstanceId(0), &[5], Tier::Gpu);
    assert_eq!(m(&ix, &[5], 0), vec![(0, 0, 1, 0)]);
    // Removing an unknown block is harmless.
    ix.remove(InstanceId(3), &[77], Tier::Gpu);
    assert_eq!(ix.len(), 1);
}

#[test]
fn ttl_with_explicit_times() {
    let ix = idx(1000, 10_000);
    ix.predict(InstanceId(0), &[1, 2], Source::Local, 100, 1_000);
    assert_eq!(m(&ix, &[1, 2], 1_099), vec![(0, 2, 0, 0)]);
    // Expired predictions never count, even before a sweep.
    assert_eq!(m(&ix, &[1, 2], 1_100), vec![]);
    // Re-predicting extends; an event supersedes and never expires.
    ix.predict(InstanceId(0), &[1], Source::Local, 100, 1_050);
    ix.store(InstanceId(0), &[2], Tier::Gpu, 1_050);
    assert_eq!(m(&ix, &[1, 2], 1_120), vec![(0, 2, 0, 0)]);
    assert_eq!(m(&ix, &[1, 2], 5_000), vec![]);
    assert_eq!(m(&ix, &[2], 5_000), vec![(0, 1, 0, 0)]);
    assert_eq!(ix.expire(5_000), 1);
    let st = ix.stats();
    assert_eq!(st.entries_by_source, [1, 0, 0]);
    assert_eq!(st.expired, 1);
    assert_eq!(st.entries_by_instance, vec![1]);
}

#[test]
fn clear_by_source() {
    let ix = idx(1000, 10_000);
    ix.store(InstanceId(0), &[1, 2], Tier::Gpu, 0);
    ix.predict(InstanceId(0), &[3], Source::Peer, 1000, 0);
    ix.predict(InstanceId(1), &[1], Source::Local, 1000, 0);
    ix.clear_instance(InstanceId(0), &[Source::Event]);
    assert_eq!(m(&ix, &[1], 0), vec![(1, 1, 0, 0)]);
    assert_eq!(ix.instance_entries(InstanceId(0)), 1);
    ix.clear_instance(InstanceId(0), &[Source::Peer, Source::Local]);
    assert_eq!(ix.instance_entries(InstanceId(0)), 0);
    assert_eq!(ix.len(), 1);
}

#[test]
fn local_takes_over_peer_and_snapshot_lists_live_predictions() {
    let ix = idx(1000, 10_000);
    ix.predict(InstanceId(0), &[1, 2], Source::Peer, 100, 0);
    ix.predict(InstanceId(0), &[2], Source::Local, 500, 0);
    ix.predict(InstanceId(1), &[9], Source::Local, 50, 0);
    let mut local = Vec::new();
    ix.for_each_prediction(Source::Local, 60, &mut |i, h, exp| {
        local.push((i.0, h, exp))
    });
    assert_eq!(local, vec![(0, 2, 500)]);
    let mut peer = Vec::new();
    ix.for_each_prediction(Source::Peer, 0, &mut |i, h, _| peer.push((i.0, h)));
    assert_eq!(peer, vec![(0, 1)]);
}

#[test]
fn capacity_evicts_predictions_lru_first() {
    let ix = idx(4, 10_000);
    ix.store(InstanceId(0), &[100], Tier::Gpu, 0);
    ix.predict(InstanceId(0), &[1, 2, 3], Source::Local, 10_000, 0);
    assert_eq!(ix.instance_entries(InstanceId(0)), 4);
    // Two more blocks push out the two oldest predictions; the event entry is kept.
    ix.predict(InstanceId(0), &[4, 5], Source::Local, 10_000, 1);
    assert_eq!(ix.instance_entries(InstanceId(0)), 4);
    assert_eq!(ix.stats().evicted, 2);
    assert_eq!(
        m(&ix, &[100], 1),
        vec![(0, 1, 0, 0)],
        "events survive while predictions remain"
    );
    assert_eq!(m(&ix, &[1], 1), vec![]);
    assert_eq!(m(&ix, &[2], 1), vec![]);
    // Using 3 again gives it a second chance: the next insert evicts 4 instead.
    ix.predict(InstanceId(0), &[3], Source::Local, 10_000, 2);
    ix.predict(InstanceId(0), &[6], Source::Local, 10_000, 2);
    assert_eq!(m(&ix, &[3], 2), vec![(0, 1, 0, 0)]);
    assert_eq!(m(&ix, &[4], 2), vec![]);
    // Expired predictions go before anything else, whatever their reference bit.
    ix.predict(InstanceId(0), &[7], Source::Local, 1, 20_000);
    assert_eq!(ix.instance_entries(InstanceId(0)), 4);
    assert_eq!(m(&ix, &[100], 20_000), vec![(0, 1, 0, 0)]);
    // A smaller engine-reported capacity applies immediately.
    ix.set_instance_capacity(InstanceId(0), 2);
    assert_eq!(ix.instance_entries(InstanceId(0)), 2);
    assert_eq!(m(&ix, &[100], 20_000), vec![(0, 1, 0, 0)]);
}

#[test]
fn global_cap_holds() {
    let ix = idx(1_000_000, 1000);
    for i in 0..8u32 {
        let hs: Vec<u64> = (0..500).map(|k| u64::from(i) * 1_000_000 + k).collect();
        ix.predict(InstanceId(i), &hs, Source::Local, 10_000, 0);
        assert!(ix.len() <= 1000, "{}", ix.len());
    }
    let st = ix.stats();
    assert_eq!(st.entries_by_instance.iter().sum::<usize>(), ix.len());
    assert!(st.evicted >= 3000);
}

#[test]
fn out_of_range_instance_is_ignored() {
    let ix = idx(10, 100);
    ix.predict(InstanceId(u32::MAX), &[1], Source::Local, 10, 0);
    ix.store(InstanceId(MAX_INSTANCES as u32), &[1], Tier::Gpu, 0);
    assert!(ix.is_empty());
}

#[test]
fn long_chains_batched_and_linear_paths_agree() {
    // 5 instances exercise the batched path, 70 the path for more than 64 rows.
    for n in [5u32, 70] {
        let ix = idx(1 << 20, 1 << 22);
        let chain: Vec<u64> = (0..1000u64)
            .map(|k| crate::policy::util::mix(k ^ 0xabc))
            .collect();
        let mut expected = Vec::new();
        for i in 0..n {
            let len = (i as usize * 137) % 900 + 50;
            let tier = Tier::ALL[i as usize % 3];
            ix.store(InstanceId(i), &chain[..len], tier, 0);
            // Blocks after a gap never extend the run.
            let after = (len + 1).min(1000);
            ix.store(InstanceId(i), &chain[after..(len + 20).min(1000)], tier, 0);
            let l = len as u32;
            expected.push(match tier {
                Tier::Gpu => (i, l, 0, 0),
                Tier::Cpu => (i, 0, l, 0),
                Tier::Disk => (i, 0, 0, l),
            });
        }
        assert_eq!(m(&ix, &chain, 0), expected, "n = {n}");
    }
}

#[test]
fn concurrent_readers_and_writers_keep_counts_consistent() {
    let ix = std::sync::Arc::new(idx(500, 3000));
    let handles: Vec<_> = (0..4u32)
        .map(|t| {
            let ix = std::sync::Arc::clone(&ix);
            std::thread::spawn(move || {
                let mut out = PrefixMatches::default();
                for k in 0..300u64 {
                    let chain: Vec<u64> = (0..40)
                        .map(|b| crate::policy::util::mix(k % 50 * 1000 + b))
                        .collect();
                    match (k + u64::from(t)) % 4 {
                        0 => ix.predict(InstanceId(t), &chain, Source::Local, 50, k),
                        1 => ix.store(InstanceId((t + 1) % 4), &chain[..20], Tier::Gpu, k),
                        2 => ix.remove(InstanceId((t + 1) % 4), &chain[..10], Tier::Gpu),
                        _ => {
                            ix.expire(k);
                        }
                    }
                    ix.match_prefix(&chain, k, &mut out);
                    assert!(out.rows.iter().all(|r| r.total() <= 40));
                }
            })
        })
        .collect();
    for h in handles {
        assert!(h.join().is_ok());
    }
    let st = ix.stats();
    assert!(ix.len() <= 3000);
    assert_eq!(st.entries_by_instance.iter().sum::<usize>(), ix.len());
    assert_eq!(st.entries_by_source.iter().sum::<usize>(), ix.len());
}

#[test]
fn an_instance_full_of_event_entries_still_prefers_nearby_predictions() {
    // The engine reports more blocks than the configured capacity: the instance is full of event
    // entries. Inserts stay bounded (each evicts within a short scan) and the capacity holds.
    let cap = 1_000;
    let ix = idx(cap, 1 << 20);
    let events: Vec<u64> = (1..=cap as u64).collect();
    ix.store(InstanceId(0), &events, Tier::Gpu, 0);
    ix.predict(InstanceId(0), &[50_000], Source::Local, 60_000, 0);
    assert_eq!(ix.instance_entries(InstanceId(0)), cap);
    // The prediction sits behind 1 000 event entries in the ring, beyond the scan budget: an
    // event entry goes, the prediction survives this time.
    ix.store(InstanceId(0), &[60_000], Tier::Gpu, 0);
    assert_eq!(ix.instance_entries(InstanceId(0)), cap);
    assert_eq!(m(&ix, &[60_000], 0), vec![(0, 1, 0, 0)]);
    assert_eq!(m(&ix, &[50_000], 0), vec![(0, 1, 0, 0)]);
    let held = events
        .iter()
        .filter(|&&h| !m(&ix, &[h], 0).is_empty())
        .count();
    assert_eq!(held, cap - 2);
    // Many more event inserts: the bound holds throughout.
    let more: Vec<u64> = (100_000..105_000).collect();
    for chunk in more.chunks(16) {
        ix.store(InstanceId(0), chunk, Tier::Gpu, 0);
        assert!(ix.instance_entries(InstanceId(0)) <= cap);
    }
    assert_eq!(m(&ix, &[104_999], 0), vec![(0, 1, 0, 0)]);
}

#[test]
fn the_removal_hook_hears_every_engine_removal_after_it_applied() {
    let ix = std::sync::Arc::new(idx(1000, 10_000));
    // (instance, hashes, how many of them the index still held on it when told)
    type Heard = Vec<(u32, Vec<u64>, usize)>;
    let heard: std::sync::Arc<parking_lot::Mutex<Heard>> = Default::default();
    let (sink, seen_by) = (heard.clone(), std::sync::Arc::downgrade(&ix));
    assert!(ix.set_on_remove(std::sync::Arc::new(move |i, h| {
        // Called after the removal: the index no longer holds what it names.
        let left = seen_by
            .upgrade()
            .map_or(0, |ix| m(&ix, h, 0).iter().filter(|r| r.0 == i.0).count());
        sink.lock().push((i.0, h.to_vec(), left));
    })));
    assert!(
        !ix.set_on_remove(std::sync::Arc::new(|_, _| {})),
        "set once"
    );
    ix.store(InstanceId(2), &[1, 2, 3], Tier::Gpu, 0);
    ix.predict(InstanceId(1), &[1, 2], Source::Local, 60_000, 0);
    ix.remove(InstanceId(2), &[1, 2, 3], Tier::Gpu);
    ix.retract(InstanceId(1), &[1, 2], Source::Local);
    assert_eq!(
        *heard.lock(),
        vec![(2, vec![1, 2, 3], 0)],
        "engine removals only, not retractions"
    );
}

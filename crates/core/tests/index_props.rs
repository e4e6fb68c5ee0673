//! Property tests of the placement index against a naive model.

use kvgate_core::index::{IndexConfig, PlacementIndex, PrefixMatches};
use kvgate_core::{InstanceId, Source, Tier};
use proptest::prelude::*;
use std::collections::HashMap;

#[derive(Clone, Debug)]
enum Op {
    Store(u32, Vec<u64>, u8),
    Remove(u32, Vec<u64>, u8),
    Predict(u32, Vec<u64>, bool, u64),
    Clear(u32, u8),
    Tick(u64),
    Expire,
}

fn tier(t: u8) -> Tier {
    Tier::ALL[(t % 3) as usize]
}

fn op() -> impl Strategy<Value = Op> {
    let hashes = prop::collection::vec(0u64..12, 1..6);
    prop_oneof![
        (0u32..4, hashes.clone(), 0u8..3).prop_map(|(i, h, t)| Op::Store(i, h, t)),
        (0u32..4, hashes.clone(), 0u8..3).prop_map(|(i, h, t)| Op::Remove(i, h, t)),
        (0u32..4, hashes, any::<bool>(), 1u64..50)
            .prop_map(|(i, h, l, ttl)| Op::Predict(i, h, l, ttl)),
        (0u32..4, 1u8..8).prop_map(|(i, mask)| Op::Clear(i, mask)),
        (1u64..30).prop_map(Op::Tick),
        Just(Op::Expire),
    ]
}

/// The naive model: per (block, instance) the source, copies per tier and expiry.
#[derive(Clone, Debug)]
struct E {
    source: Source,
    copies: [u32; 3],
    expires: u64,
}

fn live(e: &E, now: u64) -> bool {
    e.source == Source::Event || e.expires > now
}

fn apply(model: &mut HashMap<(u64, u32), E>, op: &Op, now: u64) {
    match op {
        Op::Store(i, hs, t) => {
            for &h in hs {
                let e = model.entry((h, *i)).or_insert(E {
                    source: Source::Event,
                    copies: [0; 3],
                    expires: u64::MAX,
                });
                if e.source != Source::Event {
                    *e = E {
                        source: Source::Event,
                        copies: [0; 3],
                        expires: u64::MAX,
                    };
                }
                e.copies[tier(*t) as usize] += 1;
            }
        }
        Op::Remove(i, hs, t) => {
            for &h in hs {
                let Some(e) = model.get_mut(&(h, *i)) else {
                    continue;
                };
                if e.source != Source::Event {
                    model.remove(&(h, *i));
                    continue;
                }
                let t = tier(*t) as usize;
                let t = if e.copies[t] > 0 {
                    Some(t)
                } else {
                    (0..3).find(|&k| e.copies[k] > 0)
                };
                if let Some(t) = t {
                    e.copies[t] -= 1;
                }
                if e.copies == [0; 3] {
                    model.remove(&(h, *i));
                }
            }
        }
        Op::Predict(i, hs, local, ttl) => {
            let src = if *local { Source::Local } else { Source::Peer };
            for &h in hs {
                match model.get_mut(&(h, *i)) {
                    Some(e) if e.source == Source::Event => {}
                    Some(e) => {
                        e.expires = e.expires.max(now + ttl);
                        if src == Source::Local {
                            e.source = Source::Local;
                        }
                    }
                    None => {
                        model.insert(
                            (h, *i),
                            E {
                                source: src,
                                copies: [1, 0, 0],
                                expires: now + ttl,
                            },
                        );
                    }
                }
            }
        }
        Op::Clear(i, mask) => {
            let srcs: Vec<Source> = [Source::Event, Source::Local, Source::Peer]
                .into_iter()
                .enumerate()
                .filter(|(k, _)| mask & (1 << k) != 0)
                .map(|(_, s)| s)
                .collect();
            model.retain(|(_, inst), e| !(*inst == *i && srcs.contains(&e.source)));
        }
        Op::Expire => model.retain(|_, e| live(e, now)),
        Op::Tick(_) => {}
    }
}

fn naive_match(
    model: &HashMap<(u64, u32), E>,
    hashes: &[u64],
    now: u64,
) -> Vec<(u32, u32, u32, u32)> {
    let mut rows = Vec::new();
    for i in 0..4u32 {
        let mut row = (i, 0, 0, 0);
        for &h in hashes {
            match model.get(&(h, i)).filter(|e| live(e, now)) {
                Some(e) => match (0..3).find(|&k| e.copies[k] > 0).unwrap_or(0) {
                    0 => row.1 += 1,
                    1 => row.2 += 1,
                    _ => row.3 += 1,
                },
                None => break,
            }
        }
        if row.1 + row.2 + row.3 > 0 {
            rows.push(row);
        }
    }
    rows
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn matches_the_naive_model(ops in prop::collection::vec(op(), 1..60), queries in prop::collection::vec(prop::collection::vec(0u64..12, 0..8), 4)) {
        let ix = PlacementIndex::new(IndexConfig { shards: 4, max_entries: 1 << 20, default_instance_capacity: 1 << 20 });
        let mut model = HashMap::new();
        let mut now = 0u64;
        for op in &ops {
            match op {
                Op::Store(i, hs, t) => ix.store(InstanceId(*i), hs, tier(*t), now),
                Op::Remove(i, hs, t) => ix.remove(InstanceId(*i), hs, tier(*t)),
                Op::Predict(i, hs, local, ttl) => {
                    ix.predict(InstanceId(*i), hs, if *local { Source::Local } else { Source::Peer }, *ttl, now)
                }
                Op::Clear(i, mask) => {
                    let srcs: Vec<Source> = [Source::Event, Source::Local, Source::Peer].into_iter().enumerate().filter(|(k, _)| mask & (1 << k) != 0).map(|(_, s)| s).collect();
                    ix.clear_instance(InstanceId(*i), &srcs)
                }
                Op::Tick(d) => now += d,
                Op::Expire => {
                    ix.expire(now);
                }
            }
            apply(&mut model, op, now);
            prop_assert_eq!(ix.len(), model.len());
        }
        let mut out = PrefixMatches::default();
        for q in &queries {
            ix.match_prefix(q, now, &mut out);
            let mut got: Vec<_> = out.rows.iter().map(|r| (r.instance.0, r.gpu, r.cpu, r.disk)).collect();
            got.sort();
            prop_assert_eq!(got, naive_match(&model, q, now));
        }
        let st = ix.stats();
        prop_assert_eq!(st.entries_by_source.iter().sum::<usize>(), model.len());
        prop_assert_eq!(st.entries_by_instance.iter().sum::<usize>(), model.len());
    }

    #[test]
    fn bounds_always_hold(inserts in prop::collection::vec((0u32..6, prop::collection::vec(any::<u64>(), 1..40), any::<bool>()), 1..40), cap in 1usize..50, max in 1usize..120) {
        let ix = PlacementIndex::new(IndexConfig { shards: 2, max_entries: max, default_instance_capacity: cap });
        for (i, hs, event) in &inserts {
            if *event {
                ix.store(InstanceId(*i), hs, Tier::Gpu, 0);
            } else {
                ix.predict(InstanceId(*i), hs, Source::Local, 100, 0);
            }
            prop_assert!(ix.len() <= max, "{} > {}", ix.len(), max);
            for k in 0..6 {
                prop_assert!(ix.instance_entries(InstanceId(k)) <= cap);
            }
        }
        let st = ix.stats();
        prop_assert_eq!(st.entries_by_instance.iter().sum::<usize>(), ix.len());
    }
}

//! Property tests of one limiter, and a virtual-time cluster of limiters exchanging usage.

use super::*;
use crate::Millis;
use proptest::prelude::*;

fn limits(rps: u64, burst: u64, tpm: u64, tburst: u64) -> Limits {
    Limits {
        requests_per_second: Some(rps),
        tokens_per_minute: Some(tpm),
        burst_requests: Some(burst),
        burst_tokens: Some(tburst),
    }
}

proptest! {
    /// In every window between two admissions, requests ≤ burst + rate × t, and the tokens
    /// charged before the window's last admission ≤ token burst + token rate × t.
    #[test]
    fn never_admits_more_than_rate_times_t_plus_burst(
        rps in 1u64..50,
        burst in 1u64..20,
        tpm in 1u64..100_000,
        tburst in 1u64..5_000,
        arrivals in prop::collection::vec((0u64..40, 0u64..400, 0u64..300), 1..300),
    ) {
        let a = tenant_key("a");
        let mut l = Limiter::new(Limits::default(), 0, 0);
        l.configure([(a, limits(rps, burst, tpm, tburst))], 0);
        let mut now: Millis = 0;
        // (time, tokens charged with and after the admission before the next one)
        let mut admitted: Vec<(Millis, u64)> = Vec::new();
        for (gap, prompt, output) in arrivals {
            now += gap;
            if l.admit(a, prompt, now).is_ok() {
                l.charge_tokens(a, output, now);
                admitted.push((now, prompt + output));
            }
        }
        for i in 0..admitted.len() {
            let mut tokens = 0u64;
            for j in i..admitted.len() {
                let dt = u128::from(admitted[j].0 - admitted[i].0);
                let count = (j - i + 1) as u128;
                prop_assert!(
                    count * 1000 <= u128::from(burst) * 1000 + u128::from(rps) * dt,
                    "{count} requests in {dt} ms"
                );
                // Tokens charged in [t_i, t_j) at most what the bucket held, less the one
                // token admission at t_j needs.
                prop_assert!(
                    u128::from(tokens) * 60_000 + 60_000
                        <= u128::from(tburst) * 60_000 + u128::from(tpm) * dt,
                    "{tokens} tokens in {dt} ms"
                );
                tokens += admitted[j].1;
            }
        }
    }

    /// Refunds cannot be used to exceed the limits: with some requests failing and refunded
    /// later (any number of arrivals later), requests still stay within burst + rate × t (a
    /// refund never gives a request back) and the tokens of the requests that did not fail
    /// within token burst + token rate × t.
    #[test]
    fn refunds_never_admit_more_than_the_limits(
        rps in 1u64..50,
        burst in 1u64..20,
        tpm in 1u64..100_000,
        tburst in 1u64..5_000,
        arrivals in prop::collection::vec(
            (0u64..40, 0u64..400, 0u64..300, prop::option::of(0usize..5)),
            1..300,
        ),
    ) {
        let a = tenant_key("a");
        let mut l = Limiter::new(Limits::default(), 0, 0);
        l.configure([(a, limits(rps, burst, tpm, tburst))], 0);
        let mut now: Millis = 0;
        let mut admitted: Vec<(Millis, u64)> = Vec::new();
        // (arrival index at which it is refunded, ticket)
        let mut failing: Vec<(usize, Ticket)> = Vec::new();
        for (i, (gap, prompt, output, fails_after)) in arrivals.into_iter().enumerate() {
            now += gap;
            let (due, later): (Vec<_>, Vec<_>) = failing.drain(..).partition(|(at, _)| *at <= i);
            failing = later;
            for (_, t) in due {
                prop_assert!(l.refund(t, now) <= 400);
            }
            match (l.admit(a, prompt, now), fails_after) {
                (Ok(Some(adm)), Some(d)) => {
                    failing.push((i + d, adm.ticket));
                    admitted.push((now, 0));
                }
                (Ok(None), _) => prop_assert!(false, "configured tenant unlimited"),
                (Ok(Some(_)), None) => {
                    l.charge_tokens(a, output, now);
                    admitted.push((now, prompt + output));
                }
                (Err(_), _) => {}
            }
        }
        for i in 0..admitted.len() {
            let mut tokens = 0u64;
            for j in i..admitted.len() {
                let dt = u128::from(admitted[j].0 - admitted[i].0);
                let count = (j - i + 1) as u128;
                prop_assert!(
                    count * 1000 <= u128::from(burst) * 1000 + u128::from(rps) * dt,
                    "{count} requests in {dt} ms"
                );
                prop_assert!(
                    u128::from(tokens) * 60_000 + 60_000
                        <= u128::from(tburst) * 60_000 + u128::from(tpm) * dt,
                    "{tokens} tokens in {dt} ms"
                );
                tokens += admitted[j].1;
            }
        }
    }

    /// Usage reports are cumulative: however they are duplicated or reordered, the deltas a
    /// ledger returns add up to the newest totals.
    #[test]
    fn ledger_deltas_add_up_to_the_newest_totals(
        steps in prop::collection::vec((0u64..5, 0u64..500), 1..60),
        order in prop::collection::vec(0usize..60, 0..120),
    ) {
        let mut totals = vec![(0u64, 0u64)];
        for (r, t) in steps {
            let last = totals[totals.len() - 1];
            totals.push((last.0 + r, last.1 + t));
        }
        let mut ledger = PeerLedger::new(4);
        let mut charged = (0u64, 0u64);
        let reports = order.iter().map(|&i| totals[i % totals.len()]).chain(totals.last().copied());
        for (r, t) in reports {
            for (_, dr, dt) in ledger.observe(9, &[(5, r, t)], 0) {
                charged.0 += dr;
                charged.1 += dt;
            }
        }
        prop_assert_eq!(charged, totals[totals.len() - 1]);
    }
}

/// What a cluster run measured.
#[derive(Debug)]
struct ClusterRun {
    /// Largest number admitted in any window, and the window's bound without peers.
    worst_excess: f64,
    /// The derived bound on that excess.
    bound: f64,
}

/// A usage report on its way: deliver at, from, to, the report.
type Message = (Millis, usize, usize, Vec<(u64, u64, u64)>);

/// `n` replicas, each offered one request of `tenant` every ms, publish their cumulative usage
/// every `interval` ms; it reaches the others `latency` ms later. Every window of `window` ms
/// starting at a multiple of 50 ms is checked against burst + rate × window.
fn cluster(n: usize, rps: u64, burst: u64, interval: Millis, latency: Millis) -> ClusterRun {
    let a = tenant_key("a");
    let lim = Limits {
        requests_per_second: Some(rps),
        burst_requests: Some(burst),
        ..Limits::default()
    };
    let mut nodes: Vec<(Limiter, PeerLedger)> = (0..n)
        .map(|_| {
            let mut l = Limiter::new(Limits::default(), 0, 0);
            l.configure([(a, lim)], 0);
            (l, PeerLedger::new(16))
        })
        .collect();
    let end: Millis = 20_000;
    let mut in_flight: std::collections::VecDeque<Message> = Default::default();
    let mut admitted_at: Vec<Millis> = Vec::new();
    for now in 0..end {
        while in_flight.front().is_some_and(|m| m.0 <= now) {
            let Some((_, from, to, report)) = in_flight.pop_front() else {
                break;
            };
            let (l, ledger) = &mut nodes[to];
            for (t, r, k) in ledger.observe(from as u64, &report, now) {
                l.charge_peer(t, r, k, now);
            }
        }
        for (l, _) in nodes.iter_mut() {
            if l.admit(a, 0, now).is_ok() {
                admitted_at.push(now);
            }
        }
        if now % interval == 0 {
            for (from, (l, _)) in nodes.iter_mut().enumerate() {
                let report = l.usage();
                for to in (0..n).filter(|&t| t != from) {
                    in_flight.push_back((now + latency, from, to, report.clone()));
                }
            }
        }
    }
    let d = (interval + latency) as f64;
    let bound = (n as f64 - 1.0) * (rps as f64 * d / 1000.0 + burst as f64);
    let mut worst_excess = f64::MIN;
    for window in [1_000u64, 5_000, 10_000] {
        let mut start = 0;
        while start + window <= end {
            let count = admitted_at
                .iter()
                .filter(|&&t| t >= start && t < start + window)
                .count() as f64;
            let single = burst as f64 + rps as f64 * window as f64 / 1000.0;
            worst_excess = worst_excess.max(count - single);
            start += 50;
        }
    }
    ClusterRun {
        worst_excess,
        bound,
    }
}

#[test]
fn replicas_sharing_usage_over_admit_at_most_the_derived_bound() {
    for (n, rps, burst, interval, latency) in [
        (2, 100, 10, 100, 5),
        (3, 50, 5, 100, 20),
        (4, 200, 20, 250, 10),
        (8, 100, 10, 100, 50),
    ] {
        let run = cluster(n, rps, burst, interval, latency);
        println!(
            "n={n} rate={rps}/s burst={burst} interval={interval}ms latency={latency}ms: \
             worst excess {:.0} requests, bound {:.0}",
            run.worst_excess, run.bound
        );
        assert!(
            run.worst_excess <= run.bound,
            "n={n}: excess {} over bound {}",
            run.worst_excess,
            run.bound
        );
        // Sharing works: without it the excess would be (n - 1) × (burst + rate × window).
        let unshared = (n as f64 - 1.0) * (burst as f64 + rps as f64);
        assert!(run.worst_excess < unshared, "n={n}: {}", run.worst_excess);
    }
}

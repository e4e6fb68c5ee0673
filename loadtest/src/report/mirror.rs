//! Offline against live: does a live `compare` run fall where the offline simulator says it
//! should?
//!
//! One offline run is one draw: the order in which a burst's requests reach the router, compare's
//! warm-up request and tie-breaking move some policies' figures by tens of percent (see
//! docs/loadtest.md, "Offline against live"). So the live figures are judged against the range of
//! several offline draws of the same slice: a figure agrees when it lies within the draws' range
//! widened by `tolerance` (relative, latencies) or `hit_points` (absolute, hit ratio in points).
//!
//! Contenders are matched by name: offline policy `p` run with `--set` overrides `o1,o2` is the
//! live contender `p[o1,o2]`, and a live built-in policy's `kvgate:` prefix is dropped (the live
//! `kvgate:round_robin` is the offline `round_robin`); live contenders without an offline
//! counterpart (smg, sglang-router, vllm-router) are left out.
//!
//! Invariants: pure over parsed inputs (no I/O); every row has at least one offline draw; the
//! output lists contenders in the live run's order.

use serde_json::Value;

use crate::offline::OfflineReport;

/// Tolerances of the check.
#[derive(Debug, Clone, Copy)]
pub struct Tolerance {
    /// Relative margin around the draws' range for mean TTFT and mean E2E.
    pub relative: f64,
    /// Absolute margin around the draws' range for the hit ratio, in points.
    pub hit_points: f64,
}

impl Default for Tolerance {
    /// The goal: 5 % on latencies, 1 point of hit ratio.
    fn default() -> Self {
        Self {
            relative: 0.05,
            hit_points: 1.0,
        }
    }
}

/// One figure: the offline draws' mean and range, the live value, and whether it agrees.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Mean over the draws.
    pub mean: f64,
    /// Lowest draw.
    pub min: f64,
    /// Highest draw.
    pub max: f64,
    /// The live value.
    pub live: f64,
    /// Within the range widened by the tolerance.
    pub agrees: bool,
}

/// One contender's comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct MirrorRow {
    /// The live contender's name.
    pub contender: String,
    /// Offline draws compared.
    pub draws: usize,
    /// Mean TTFT, seconds (the live summary's unit: model seconds unless `--wall-time`).
    pub ttft: Figure,
    /// Mean end-to-end latency, seconds.
    pub e2e: Figure,
    /// Hit ratio, percent.
    pub hit: Figure,
    /// The engines' own mean TTFT live (when the run measured it) over the offline mean: how far
    /// the engines agree once the path through the router is taken out.
    pub engines_over_offline: Option<f64>,
}

impl MirrorRow {
    /// Every figure agrees.
    pub fn agrees(&self) -> bool {
        self.ttft.agrees && self.e2e.agrees && self.hit.agrees
    }
}

/// Why the inputs cannot be compared.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The live results have no `contenders` list.
    #[error("live results: no contenders list (is it a compare results.json?)")]
    NotCompare,
    /// No live contender has an offline counterpart.
    #[error("no live contender matches an offline policy (live: {live}; offline: {offline})")]
    NothingMatches {
        /// Live contender names.
        live: String,
        /// Offline keys.
        offline: String,
    },
}

/// The live name an offline policy result stands for.
fn offline_key(policy: &str, overrides: &[String]) -> String {
    if overrides.is_empty() {
        policy.to_string()
    } else {
        format!("{policy}[{}]", overrides.join(","))
    }
}

/// The offline name a live contender is compared with.
fn live_key(name: &str) -> &str {
    name.strip_prefix("kvgate:").unwrap_or(name)
}

fn figure(draws: &[f64], live: f64, within: impl Fn(f64, f64, f64) -> bool) -> Figure {
    let mean = draws.iter().sum::<f64>() / draws.len().max(1) as f64;
    let min = draws.iter().copied().fold(f64::INFINITY, f64::min);
    let max = draws.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Figure {
        mean,
        min,
        max,
        live,
        agrees: within(min, max, live),
    }
}

/// Compares a live `compare` results file (parsed JSON) with offline draws of the same slice.
pub fn compare(
    live: &Value,
    offline: &[OfflineReport],
    tol: Tolerance,
) -> Result<Vec<MirrorRow>, MirrorError> {
    let contenders = live["contenders"]
        .as_array()
        .ok_or(MirrorError::NotCompare)?;
    let rel =
        |lo: f64, hi: f64, v: f64| v >= lo * (1.0 - tol.relative) && v <= hi * (1.0 + tol.relative);
    let abs = |lo: f64, hi: f64, v: f64| v >= lo - tol.hit_points && v <= hi + tol.hit_points;
    let mut rows = Vec::new();
    for c in contenders {
        let Some(name) = c["name"].as_str() else {
            continue;
        };
        let s = &c["summary"];
        let (Some(ttft), Some(e2e), Some(hit)) = (
            s["ttft"]["mean"].as_f64(),
            s["e2e"]["mean"].as_f64(),
            s["hit_ratio"].as_f64(),
        ) else {
            continue;
        };
        let key = live_key(name);
        let draws: Vec<_> = offline
            .iter()
            .flat_map(|r| {
                r.results
                    .iter()
                    .filter(|p| offline_key(&p.policy, &r.params.overrides) == key)
            })
            .collect();
        if draws.is_empty() {
            continue;
        }
        let ttfts: Vec<f64> = draws.iter().map(|p| p.ttft_s.mean).collect();
        let ttft = figure(&ttfts, ttft, rel);
        let e2e = figure(
            &draws.iter().map(|p| p.e2e_s.mean).collect::<Vec<_>>(),
            e2e,
            rel,
        );
        let hit = figure(
            &draws
                .iter()
                .map(|p| p.hit_ratio * 100.0)
                .collect::<Vec<_>>(),
            hit * 100.0,
            abs,
        );
        let engines_over_offline = c["fleet"]["engine_ttft_mean_s"]
            .as_f64()
            .filter(|_| ttft.mean > 0.0)
            .map(|e| e / ttft.mean);
        rows.push(MirrorRow {
            contender: name.to_string(),
            draws: draws.len(),
            ttft,
            e2e,
            hit,
            engines_over_offline,
        });
    }
    if rows.is_empty() {
        let live = contenders
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let offline = offline
            .iter()
            .flat_map(|r| {
                r.results
                    .iter()
                    .map(|p| offline_key(&p.policy, &r.params.overrides))
            })
            .collect::<Vec<_>>()
            .join(", ");
        return Err(MirrorError::NothingMatches { live, offline });
    }
    Ok(rows)
}

/// The rows as a Markdown table, with a count of the rows that agree on every figure.
pub fn markdown(rows: &[MirrorRow]) -> String {
    use std::fmt::Write;
    let cell = |f: &Figure, digits: usize| {
        format!(
            "{:.d$} [{:.d$}–{:.d$}] / {:.d$}{}",
            f.mean,
            f.min,
            f.max,
            f.live,
            if f.agrees { "" } else { " ✗" },
            d = digits
        )
    };
    let mut out = String::from(
        "| contender | draws | TTFT offline [range] / live | E2E offline [range] / live | hit % offline [range] / live | engines' TTFT / offline |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            r.contender,
            r.draws,
            cell(&r.ttft, 3),
            cell(&r.e2e, 2),
            cell(&r.hit, 1),
            r.engines_over_offline
                .map_or("–".to_string(), |x| format!("{x:.2}"))
        );
    }
    let agree = rows.iter().filter(|r| r.agrees()).count();
    let _ = writeln!(
        out,
        "\n{agree} of {} contenders agree on every figure (✗: outside the offline range widened by the tolerance)",
        rows.len()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offline::summary::Dist;
    use crate::offline::{OfflineReport, PolicyResult};

    fn report(overrides: &[&str], results: &[(&str, f64, f64, f64)]) -> OfflineReport {
        let mut r: OfflineReport = serde_json::from_value(serde_json::json!({
            "params": {
                "trace": "t", "requests": 1, "engines": 1, "preset": "p",
                "engine": serde_json::to_value(kvgate_sim::model::EngineParams::default()).unwrap(),
                "speed_up": 1.0, "speed_up_fit": null, "index": "both", "predicted_ttl_ms": 1,
                "scrape_interval_ms": 1, "prefill_tokens_per_s": 1.0,
                "decode_interference_ms": 1.0, "policy_config": null,
                "overrides": overrides, "seed": 1
            },
            "references": serde_json::to_value(crate::offline::References::default()).unwrap(),
            "results": [],
            "wall_s": 0.0
        }))
        .expect("report");
        r.results = results
            .iter()
            .map(|&(p, t, e, h)| PolicyResult {
                policy: p.to_string(),
                ttft_s: Dist {
                    mean: t,
                    ..Dist::default()
                },
                e2e_s: Dist {
                    mean: e,
                    ..Dist::default()
                },
                hit_ratio: h,
                ..PolicyResult::default()
            })
            .collect();
        r
    }

    fn live(contenders: &[(&str, f64, f64, f64, Option<f64>)]) -> Value {
        let cs: Vec<Value> = contenders
            .iter()
            .map(|&(n, t, e, h, eng)| {
                serde_json::json!({
                    "name": n,
                    "summary": {"ttft": {"mean": t}, "e2e": {"mean": e}, "hit_ratio": h},
                    "fleet": {"engine_ttft_mean_s": eng},
                })
            })
            .collect();
        serde_json::json!({ "contenders": cs })
    }

    #[test]
    fn live_figures_are_judged_against_the_draws_range() {
        let draws = [
            report(
                &[],
                &[
                    ("kvgate", 1.0, 10.0, 0.20),
                    ("round_robin", 5.0, 25.0, 0.06),
                ],
            ),
            report(
                &[],
                &[
                    ("kvgate", 1.2, 10.4, 0.21),
                    ("round_robin", 8.0, 27.0, 0.05),
                ],
            ),
            report(&["kvgate.objective=ttft"], &[("kvgate", 0.9, 12.0, 0.18)]),
        ];
        let l = live(&[
            // Inside the range widened by 5 % on latencies, 1 point on the hit ratio.
            ("kvgate", 1.25, 9.6, 0.195, Some(1.1)),
            // TTFT inside a wide range; E2E 10 % above its highest draw; hit 2 points above.
            ("kvgate:round_robin", 7.9, 29.7, 0.08, None),
            ("kvgate[kvgate.objective=ttft]", 0.9, 12.0, 0.18, None),
            ("smg", 2.0, 12.0, 0.2, None),
        ]);
        let rows = compare(&l, &draws, Tolerance::default()).expect("rows");
        let names: Vec<&str> = rows.iter().map(|r| r.contender.as_str()).collect();
        assert_eq!(
            names,
            [
                "kvgate",
                "kvgate:round_robin",
                "kvgate[kvgate.objective=ttft]"
            ]
        );
        let k = &rows[0];
        assert_eq!(k.draws, 2);
        assert!((k.ttft.mean - 1.1).abs() < 1e-12);
        assert_eq!((k.ttft.min, k.ttft.max), (1.0, 1.2));
        assert!(k.agrees(), "{k:?}");
        assert!((k.engines_over_offline.unwrap() - 1.0).abs() < 1e-12);
        let rr = &rows[1];
        assert!(rr.ttft.agrees && !rr.e2e.agrees && !rr.hit.agrees, "{rr:?}");
        assert_eq!(rows[2].draws, 1);
        assert!(rows[2].agrees());
        let md = markdown(&rows);
        assert!(md.contains("2 of 3 contenders agree"), "{md}");
        assert!(md.contains("29.70 ✗"), "{md}");
    }

    #[test]
    fn unmatched_or_malformed_inputs_are_errors() {
        let draws = [report(&[], &[("kvgate", 1.0, 10.0, 0.2)])];
        assert!(matches!(
            compare(&serde_json::json!({"x": 1}), &draws, Tolerance::default()),
            Err(MirrorError::NotCompare)
        ));
        let only_smg = live(&[("smg", 1.0, 1.0, 0.1, None)]);
        let e = compare(&only_smg, &draws, Tolerance::default()).unwrap_err();
        assert!(e.to_string().contains("smg") && e.to_string().contains("kvgate"));
    }
}

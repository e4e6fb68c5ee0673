//! Figures over several rounds of one comparison: one live run is one draw.
//!
//! `compare --rounds N` runs every contender N times, the order rotated each round, so that a
//! difference smaller than a contender's own spread over rounds shows as such. Per contender
//! (by name, in the order of first appearance): the mean over its successful runs of each
//! headline figure, with the lowest and highest run.
//!
//! Invariants: pure over the results; a contender whose every run failed has no row; a figure
//! missing from a run (no hit ratio, no instance shares) is left out of that figure only.

use std::fmt::Write;

use serde::Serialize;

use crate::compare::ContenderResult;
use crate::report::summary::RunSummary;

/// Mean, lowest and highest of one figure over a contender's runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// Mean over the runs.
    pub mean: f64,
    /// Lowest run.
    pub min: f64,
    /// Highest run.
    pub max: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        let n = values.len() as f64;
        Some(Spread {
            mean: values.iter().sum::<f64>() / n,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }

    /// `mean (lowest–highest)`, each multiplied by `scale` and written with `digits` decimals;
    /// the terminal and HTML tables both read it, so they never disagree.
    pub fn display(&self, scale: f64, digits: usize) -> String {
        format!(
            "{:.digits$} ({:.digits$}–{:.digits$})",
            self.mean * scale,
            self.min * scale,
            self.max * scale
        )
    }
}

/// One contender's figures over the rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoundsRow {
    /// Contender name.
    pub name: String,
    /// Runs that produced figures.
    pub runs: usize,
    /// Runs that failed.
    pub failed: usize,
    /// Mean TTFT of each run.
    pub ttft_mean: Option<Spread>,
    /// p99 TTFT of each run.
    pub ttft_p99: Option<Spread>,
    /// Mean E2E of each run.
    pub e2e_mean: Option<Spread>,
    /// p99 E2E of each run.
    pub e2e_p99: Option<Spread>,
    /// Hit ratio of each run (engines' counters).
    pub hit_ratio: Option<Spread>,
    /// Busiest instance's request share over the mean, each run.
    pub busiest: Option<Spread>,
    /// Errors over all runs.
    pub errors: u64,
}

/// The busiest instance's request share over the mean share.
fn busiest(s: &RunSummary) -> Option<f64> {
    let n = s.instance_share.len();
    let max = s
        .instance_share
        .values()
        .copied()
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))?;
    Some(max * n as f64)
}

/// Groups the runs by contender name, in order of first appearance.
pub fn over_rounds(results: &[ContenderResult]) -> Vec<RoundsRow> {
    let mut names: Vec<&str> = Vec::new();
    for r in results {
        if !names.contains(&r.name.as_str()) {
            names.push(&r.name);
        }
    }
    names
        .into_iter()
        .filter_map(|name| {
            let runs: Vec<&ContenderResult> = results.iter().filter(|r| r.name == name).collect();
            let ok: Vec<&RunSummary> = runs.iter().filter_map(|r| r.summary.as_ref()).collect();
            if ok.is_empty() {
                return None;
            }
            let figure = |f: &dyn Fn(&RunSummary) -> Option<f64>| {
                Spread::of(&ok.iter().filter_map(|s| f(s)).collect::<Vec<_>>())
            };
            Some(RoundsRow {
                name: name.to_string(),
                runs: ok.len(),
                failed: runs.len() - ok.len(),
                ttft_mean: figure(&|s| (s.ttft.count > 0).then_some(s.ttft.mean)),
                ttft_p99: figure(&|s| (s.ttft.count > 0).then_some(s.ttft.p99)),
                e2e_mean: figure(&|s| (s.e2e.count > 0).then_some(s.e2e.mean)),
                e2e_p99: figure(&|s| (s.e2e.count > 0).then_some(s.e2e.p99)),
                hit_ratio: figure(&|s| s.hit_ratio),
                busiest: figure(&busiest),
                errors: ok.iter().map(|s| s.error_total).sum(),
            })
        })
        .collect()
}

fn cell(s: Option<Spread>, scale: f64, digits: usize) -> String {
    s.map_or("-".to_string(), |s| s.display(scale, digits))
}

/// The terminal table: one row per contender, each figure as mean (lowest–highest run).
pub fn render(rows: &[RoundsRow]) -> String {
    let mut out = String::new();
    let name_w = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(10);
    let _ = writeln!(
        out,
        "over rounds, mean (lowest–highest run):\n{:<name_w$} {:>4} {:>22} {:>22} {:>22} {:>22} {:>20} {:>20} {:>6}",
        "contender", "runs", "TTFT mean", "TTFT p99", "E2E mean", "E2E p99", "hit %", "busiest", "errors"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<name_w$} {:>4} {:>22} {:>22} {:>22} {:>22} {:>20} {:>20} {:>6}",
            r.name,
            if r.failed > 0 {
                format!("{}+{}✗", r.runs, r.failed)
            } else {
                r.runs.to_string()
            },
            cell(r.ttft_mean, 1.0, 3),
            cell(r.ttft_p99, 1.0, 3),
            cell(r.e2e_mean, 1.0, 3),
            cell(r.e2e_p99, 1.0, 2),
            cell(r.hit_ratio, 100.0, 1),
            cell(r.busiest, 1.0, 2),
            r.errors,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::ContenderSpec;
    use kvgate_core::policy::PolicyName;

    fn run(name: &str, ttft: f64, e2e: f64, hit: Option<f64>, shares: &[f64]) -> ContenderResult {
        let mut r =
            ContenderResult::failed(&ContenderSpec::kvgate(PolicyName::Kvgate), String::new());
        r.name = name.to_string();
        r.error = None;
        let mut s = RunSummary::default();
        s.ttft.count = 10;
        s.ttft.mean = ttft;
        s.ttft.p99 = ttft * 3.0;
        s.e2e.count = 10;
        s.e2e.mean = e2e;
        s.e2e.p99 = e2e * 2.0;
        s.hit_ratio = hit;
        s.error_total = 1;
        s.instance_share = shares
            .iter()
            .enumerate()
            .map(|(i, &v)| (format!("e{i}"), v))
            .collect();
        r.summary = Some(s);
        r
    }

    #[test]
    fn runs_are_grouped_by_name_with_their_spread() {
        let mut failed =
            ContenderResult::failed(&ContenderSpec::kvgate(PolicyName::Kvgate), "x".into());
        failed.name = "a".into();
        let results = vec![
            run("a", 1.0, 10.0, Some(0.5), &[0.5, 0.5]),
            run("b", 2.0, 20.0, None, &[]),
            run("a", 3.0, 14.0, Some(0.7), &[0.25, 0.75]),
            failed,
        ];
        let rows = over_rounds(&results);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        let a = &rows[0];
        assert_eq!((a.runs, a.failed, a.errors), (2, 1, 2));
        assert_eq!(
            a.ttft_mean,
            Some(Spread {
                mean: 2.0,
                min: 1.0,
                max: 3.0
            })
        );
        assert_eq!(
            a.e2e_p99,
            Some(Spread {
                mean: 24.0,
                min: 20.0,
                max: 28.0
            })
        );
        let hit = a.hit_ratio.expect("hit ratio");
        assert!((hit.mean - 0.6).abs() < 1e-12 && hit.min == 0.5 && hit.max == 0.7);
        // Busiest over the mean: 1.0 in the even run, 1.5 in the other.
        assert_eq!(
            a.busiest,
            Some(Spread {
                mean: 1.25,
                min: 1.0,
                max: 1.5
            })
        );
        let b = &rows[1];
        assert_eq!((b.hit_ratio, b.busiest), (None, None));
        let table = render(&rows);
        assert!(table.contains("2.000 (1.000–3.000)"), "{table}");
        assert!(table.contains("2+1✗"), "{table}");
    }

    #[test]
    fn a_contender_that_always_failed_has_no_row() {
        let mut failed =
            ContenderResult::failed(&ContenderSpec::kvgate(PolicyName::Kvgate), "x".into());
        failed.name = "gone".into();
        assert!(over_rounds(&[failed]).is_empty());
    }
}

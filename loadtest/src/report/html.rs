//! The self-contained HTML report: inline CSS and SVG only, viewable offline.

use std::fmt::Write;

use super::svg::{esc, line_chart, share_bars, Series};
use super::Report;
use crate::compare::ContenderResult;
use crate::report::rounds::{RoundsRow, Spread};
use crate::report::summary::RunSummary;

const STYLE: &str = "body{font-family:sans-serif;margin:24px;max-width:1100px;color:#222}\
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.best{font-weight:bold;color:#1a7f37}\
pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}.bars{display:flex;flex-wrap:wrap;gap:8px}\
.err{color:#b00}";

fn ok(c: &ContenderResult) -> Option<&RunSummary> {
    c.summary.as_ref()
}

/// A cell with the value and its ratio to the best value of the column.
fn ratio_cell(v: f64, best: f64, unit: &str) -> String {
    let r = if best > 0.0 { v / best } else { 1.0 };
    let class = if (r - 1.0).abs() < 1e-9 {
        " class=\"best\""
    } else {
        ""
    };
    format!("<td{class}>{v:.3}{unit} <small>(×{r:.2})</small></td>")
}

fn comparison_table(out: &mut String, cs: &[ContenderResult]) {
    let runs: Vec<&RunSummary> = cs.iter().filter_map(ok).collect();
    let min = |f: &dyn Fn(&RunSummary) -> f64| {
        runs.iter()
            .filter(|s| s.ok > 0)
            .map(|s| f(s))
            .fold(f64::INFINITY, f64::min)
    };
    let best_mean = min(&|s| s.ttft.mean);
    let best_p99 = min(&|s| s.ttft.p99);
    let best_e2e = min(&|s| s.e2e.mean);
    out.push_str(
        "<table><tr><th>contender</th><th>version</th><th>TTFT mean</th><th>p50</th><th>p90</th>\
         <th>TTFT p99</th><th>E2E mean</th><th>req/s</th><th>ok</th><th>errors</th><th>rejected</th>\
         <th>hit ratio (engines)</th></tr>",
    );
    for c in cs {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td>",
            esc(&c.label()),
            esc(c.version.as_deref().unwrap_or("-"))
        );
        match ok(c) {
            Some(s) => {
                out.push_str(&ratio_cell(s.ttft.mean, best_mean, " s"));
                let _ = write!(out, "<td>{:.3}</td><td>{:.3}</td>", s.ttft.p50, s.ttft.p90);
                out.push_str(&ratio_cell(s.ttft.p99, best_p99, " s"));
                out.push_str(&ratio_cell(s.e2e.mean, best_e2e, " s"));
                let _ = write!(
                    out,
                    "<td>{:.2}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    s.throughput_rps,
                    s.ok,
                    s.error_total,
                    s.rejected,
                    s.hit_ratio
                        .map_or("-".into(), |h| format!("{:.1} %", h * 100.0))
                );
            }
            None => {
                let _ = write!(
                    out,
                    "<td colspan=\"10\" class=\"err\">failed: {}</td></tr>",
                    esc(c.error.as_deref().unwrap_or("unknown"))
                );
            }
        }
    }
    out.push_str("</table><p><small>Ratios are against the best contender in each column (lower is better for latency).</small></p>");
}

/// Each contender's figures over the rounds: mean, lowest and highest run.
fn rounds_table(out: &mut String, rows: &[RoundsRow]) {
    out.push_str(
        "<table><tr><th>contender</th><th>runs</th><th>TTFT mean</th><th>TTFT p99</th>\
         <th>E2E mean</th><th>E2E p99</th><th>hit ratio</th><th>busiest / mean</th><th>errors</th></tr>",
    );
    let cell = |s: Option<Spread>, scale: f64| {
        s.map_or("<td>-</td>".to_string(), |s| {
            format!("<td>{}</td>", esc(&s.display(scale, 3)))
        })
    };
    for r in rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}{}</td>{}{}{}{}{}{}<td>{}</td></tr>",
            esc(&r.name),
            r.runs,
            if r.failed > 0 {
                format!(" <span class=\"err\">+{} failed</span>", r.failed)
            } else {
                String::new()
            },
            cell(r.ttft_mean, 1.0),
            cell(r.ttft_p99, 1.0),
            cell(r.e2e_mean, 1.0),
            cell(r.e2e_p99, 1.0),
            cell(r.hit_ratio, 100.0),
            cell(r.busiest, 1.0),
            r.errors
        );
    }
    out.push_str("</table><p><small>Mean over each contender's runs, with its lowest and highest run; hit ratio in %.</small></p>");
}

/// Renders the whole report.
pub fn render(r: &Report) -> String {
    let mut out = String::with_capacity(64 << 10);
    let _ = write!(
        out,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>kvgate-loadtest {}</title><style>{STYLE}</style></head><body>",
        esc(&r.kind)
    );
    let _ = write!(
        out,
        "<h1>kvgate-loadtest: {}</h1><p>{} · started at Unix time {}</p><pre>{}</pre>",
        esc(&r.kind),
        esc(&r.tool),
        r.started_unix_s,
        esc(&r.command_line.join(" "))
    );
    out.push_str("<h2>Comparison</h2>");
    comparison_table(&mut out, &r.contenders);
    if !r.over_rounds.is_empty() {
        out.push_str("<h2>Over the rounds</h2>");
        rounds_table(&mut out, &r.over_rounds);
    }
    let labels: Vec<String> = r.contenders.iter().map(ContenderResult::label).collect();

    let cdf: Vec<Series> = r
        .contenders
        .iter()
        .zip(&labels)
        .filter(|(c, _)| !c.ttft_sorted.is_empty())
        .map(|(c, label)| {
            let n = c.ttft_sorted.len() as f64;
            Series {
                name: label,
                points: c
                    .ttft_sorted
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| (t, (i + 1) as f64 / n))
                    .collect(),
            }
        })
        .collect();
    out.push_str("<h2>Time to first token</h2>");
    out.push_str(&line_chart(
        "TTFT distribution (CDF)",
        "TTFT, seconds (log scale)",
        "fraction of requests",
        &cdf,
        true,
    ));
    let hit: Vec<Series> = r
        .contenders
        .iter()
        .zip(&labels)
        .map(|(c, label)| Series {
            name: label,
            points: c
                .series
                .iter()
                .filter_map(|p| p.hit_ratio.map(|h| (p.at_s, h)))
                .collect(),
        })
        .collect();
    let spread: Vec<Series> = r
        .contenders
        .iter()
        .zip(&labels)
        .map(|(c, label)| Series {
            name: label,
            points: c
                .series
                .iter()
                .map(|p| (p.at_s, p.load_max_over_mean))
                .collect(),
        })
        .collect();
    out.push_str("<h2>Over time</h2>");
    out.push_str(&line_chart(
        "Prefix-cache hit ratio per interval (engines' counters)",
        "seconds since start",
        "hit ratio",
        &hit,
        false,
    ));
    out.push_str(&line_chart(
        "Load spread: busiest engine / mean (running + waiting)",
        "seconds since start",
        "max / mean",
        &spread,
        false,
    ));
    out.push_str("<h2>Per-instance request share</h2><div class=\"bars\">");
    for c in &r.contenders {
        if let Some(s) = ok(c) {
            let bars: Vec<(String, f64)> = s
                .instance_share
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            out.push_str(&share_bars(&c.label(), &bars));
        }
    }
    out.push_str("</div>");
    let dump = |v: &dyn erased::Json| v.pretty();
    let _ = write!(
        out,
        "<h2>Trace</h2><pre>{}</pre><h2>Prompt token counts</h2><pre>{}</pre>",
        esc(&dump(&r.trace)),
        esc(&dump(&r.prompt_tokens))
    );
    if let Some(refs) = &r.references {
        let _ = write!(out, "<h2>References</h2><pre>{}</pre>", esc(&dump(refs)));
    }
    let _ = write!(
        out,
        "<h2>Parameters</h2><pre>{}</pre>",
        esc(&dump(&r.parameters))
    );
    out.push_str("<h2>Errors by class</h2><table><tr><th>contender</th>");
    let classes: Vec<&str> = crate::replay::ErrorClass::ALL
        .iter()
        .map(|c| c.as_str())
        .collect();
    for c in &classes {
        let _ = write!(out, "<th>{c}</th>");
    }
    out.push_str("<th>unfinished</th><th>output mismatch</th></tr>");
    for c in &r.contenders {
        if let Some(s) = ok(c) {
            let _ = write!(out, "<tr><td>{}</td>", esc(&c.label()));
            for k in &classes {
                let _ = write!(out, "<td>{}</td>", s.errors.get(k).copied().unwrap_or(0));
            }
            let _ = write!(
                out,
                "<td>{}</td><td>{}</td></tr>",
                s.unfinished, s.output_mismatch
            );
        }
    }
    out.push_str("</table></body></html>\n");
    out
}

mod erased {
    /// Pretty JSON of any serialisable value (object-safe helper for the dump closure).
    pub trait Json {
        fn pretty(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn pretty(&self) -> String {
            serde_json::to_string_pretty(self).unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::ContenderSpec;
    use crate::prompt::{ApiKind, TokenCountError};
    use crate::replay::ReplayOutput;
    use crate::report::summary::summarise;
    use crate::trace::{Trace, TraceRequest};
    use kvgate_core::policy::PolicyName;

    #[test]
    fn report_has_every_section() {
        let trace = Trace::from_requests(
            vec![TraceRequest {
                timestamp_ms: 0,
                input_length: 4,
                output_length: 1,
                hash_ids: vec![1],
            }],
            4,
        )
        .unwrap();
        let out = ReplayOutput {
            records: Vec::new(),
            unfinished: 0,
            wall_s: 1.0,
            mean_send_lag_s: 0.0,
            api: ApiKind::Chat,
        };
        let mut ok =
            ContenderResult::failed(&ContenderSpec::kvgate(PolicyName::Kvgate), String::new());
        ok.error = None;
        let mut summary = summarise(&out, None, &[]);
        summary.instance_share.insert("e<0>".into(), 1.0);
        ok.summary = Some(summary);
        ok.ttft_sorted = vec![0.1, 0.2, 0.4];
        let bad = ContenderResult::failed(
            &ContenderSpec::kvgate(PolicyName::RoundRobin),
            "no <luck>".into(),
        );
        let r = Report {
            tool: "t".into(),
            command_line: vec!["kvgate-loadtest".into(), "compare".into()],
            started_unix_s: 0,
            kind: "compare".into(),
            parameters: serde_json::json!({"x": 1}),
            trace: trace.stats(),
            prompt_tokens: TokenCountError::default(),
            references: Some(serde_json::json!({"fleet_lru_hit_ratio": 0.3})),
            over_rounds: crate::report::rounds::over_rounds(&[ok.clone(), bad.clone()]),
            contenders: vec![ok, bad],
        };
        let html = render(&r);
        for needle in [
            "<table>",
            "TTFT distribution (CDF)",
            "hit ratio per interval",
            "Load spread",
            "Per-instance request share",
            "failed: no &lt;luck&gt;",
            "kvgate-loadtest compare",
            "fleet_lru_hit_ratio",
            "e&lt;0&gt;",
            "Over the rounds",
        ] {
            assert!(html.contains(needle), "missing {needle}");
        }
        assert!(!html.contains("<script"), "no scripts");
        assert!(!html.contains("http://") || html.contains("xmlns=\"http://www.w3.org/2000/svg\""));
    }
}

//! Per-run summary figures computed from request records and the engines' counter deltas.
//!
//! Latencies count only successful requests; errors and rejections are reported beside them,
//! never hidden. Per-instance share comes from the router's `x-kvgate-instance` header when every
//! successful request carried one, otherwise from the engines' own request counters.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::fleet_metrics::FleetDelta;
use crate::replay::{ErrorClass, Outcome, ReplayOutput};
use crate::stats::{ratio, shares, Summary};

/// Where per-instance shares came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareSource {
    /// The router's `x-kvgate-instance` response header.
    Header,
    /// The engines' request counters.
    EngineMetrics,
    /// Neither was available.
    #[default]
    None,
}

/// Summary of one replay.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    /// Requests sent.
    pub sent: usize,
    /// Requests that completed.
    pub ok: usize,
    /// Failed requests by class.
    pub errors: BTreeMap<&'static str, u64>,
    /// Failed requests in total.
    pub error_total: u64,
    /// Requests shed with 429/503.
    pub rejected: u64,
    /// Requests cancelled at the end of the drain period.
    pub unfinished: usize,
    /// Time to first token, successful requests.
    pub ttft: Summary,
    /// End-to-end latency, successful requests.
    pub e2e: Summary,
    /// Per-request mean inter-token latency.
    pub itl: Summary,
    /// Successful requests per second of wall time.
    pub throughput_rps: f64,
    /// Generated tokens per second of wall time.
    pub output_tokens_per_s: f64,
    /// Successful requests whose generated token count differs from the trace's.
    pub output_mismatch: usize,
    /// Prefix-cache hit ratio from the engines' counters (None without a fleet to scrape).
    pub hit_ratio: Option<f64>,
    /// Hit ratio from the responses' `cached_tokens` / `prompt_tokens`, when reported.
    pub hit_ratio_reported: Option<f64>,
    /// Fraction of requests served by each instance.
    pub instance_share: BTreeMap<String, f64>,
    /// Where `instance_share` came from.
    pub share_source: ShareSource,
    /// Wall time, seconds.
    pub wall_s: f64,
    /// Mean lag between the schedule and the actual send.
    pub mean_send_lag_s: f64,
    /// Rejections by the router's stated reason (`x-kvgate-reject-reason`), else by status.
    pub rejected_by_reason: BTreeMap<String, u64>,
    /// Per tenant, when the replay had a tenant mix.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tenants: BTreeMap<String, TenantSummary>,
    /// How the router's predicted time to first token compared with the measured one, when it
    /// gave (non-zero) predictions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction: Option<PredictionFit>,
    /// Requests served within a time-to-first-token objective, when one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goodput: Option<Goodput>,
    /// Follow-up turns and where they were sent (see [`super::follow_ups`]), when the trace is
    /// known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub follow_ups: Option<super::follow_ups::FollowUps>,
}

/// One tenant's part of a replay.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TenantSummary {
    /// Requests sent.
    pub sent: usize,
    /// Requests that completed.
    pub ok: usize,
    /// Requests shed with 429/503.
    pub rejected: u64,
    /// Failed requests.
    pub errors: u64,
    /// Prompt plus output tokens the workload asked for, over the requests sent.
    pub tokens: u64,
    /// Time to first token, successful requests.
    pub ttft: Summary,
    /// End-to-end latency, successful requests.
    pub e2e: Summary,
}

/// Predicted against measured time to first token, over successful requests with a prediction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PredictionFit {
    /// Requests compared.
    pub count: usize,
    /// Mean predicted TTFT, seconds.
    pub mean_predicted_s: f64,
    /// Mean measured TTFT of the same requests, seconds.
    pub mean_measured_s: f64,
    /// Measured ÷ predicted (predictions under 1 ms left out): median.
    pub ratio_p50: f64,
    /// Measured ÷ predicted: 90th percentile.
    pub ratio_p90: f64,
}

impl PredictionFit {
    fn of(out: &ReplayOutput) -> Option<PredictionFit> {
        let pairs: Vec<(f64, f64)> = out
            .records
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Ok))
            .filter_map(|r| r.predicted_ttft_s.zip(r.ttft_s))
            // Policies without a model send 0: nothing to compare.
            .filter(|(p, _)| *p > 0.0)
            .collect();
        if pairs.is_empty() {
            return None;
        }
        let n = pairs.len() as f64;
        let mut ratios: Vec<f64> = pairs
            .iter()
            .filter(|(p, _)| *p >= 1e-3)
            .map(|(p, m)| m / p)
            .collect();
        ratios.sort_by(f64::total_cmp);
        Some(PredictionFit {
            count: pairs.len(),
            mean_predicted_s: pairs.iter().map(|p| p.0).sum::<f64>() / n,
            mean_measured_s: pairs.iter().map(|p| p.1).sum::<f64>() / n,
            ratio_p50: crate::stats::percentile_sorted(&ratios, 50.0).unwrap_or(0.0),
            ratio_p90: crate::stats::percentile_sorted(&ratios, 90.0).unwrap_or(0.0),
        })
    }
}

/// Requests whose time to first token met an objective.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Goodput {
    /// The objective, seconds.
    pub ttft_slo_s: f64,
    /// Requests that completed with a TTFT within the objective.
    pub requests: usize,
    /// Their fraction of the requests sent.
    pub fraction: f64,
    /// Their rate, per second of wall time.
    pub rps: f64,
}

/// Goodput of `out` against a TTFT objective in the records' own time unit.
pub fn goodput(out: &ReplayOutput, ttft_slo_s: f64) -> Goodput {
    let requests = out
        .records
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Ok))
        .filter(|r| r.ttft_s.is_some_and(|t| t <= ttft_slo_s))
        .count();
    Goodput {
        ttft_slo_s,
        requests,
        fraction: ratio(requests as f64, out.records.len() as f64),
        rps: ratio(requests as f64, out.wall_s),
    }
}

impl RunSummary {
    /// Converts wall-clock figures to engine-model time when the engines ran `time_scale` times
    /// faster than real: latencies are multiplied, rates divided.
    pub fn scale_time(&mut self, time_scale: f64) {
        if !(time_scale.is_finite() && time_scale > 0.0) || time_scale == 1.0 {
            return;
        }
        let tenants = self
            .tenants
            .values_mut()
            .flat_map(|t| [&mut t.ttft, &mut t.e2e]);
        for s in [&mut self.ttft, &mut self.e2e, &mut self.itl]
            .into_iter()
            .chain(tenants)
        {
            s.mean *= time_scale;
            s.p50 *= time_scale;
            s.p90 *= time_scale;
            s.p99 *= time_scale;
            s.max *= time_scale;
        }
        self.throughput_rps /= time_scale;
        self.output_tokens_per_s /= time_scale;
        self.wall_s *= time_scale;
        self.mean_send_lag_s *= time_scale;
        if let Some(p) = &mut self.prediction {
            p.mean_predicted_s *= time_scale;
            p.mean_measured_s *= time_scale;
        }
        if let Some(g) = &mut self.goodput {
            g.ttft_slo_s *= time_scale;
            g.rps /= time_scale;
        }
    }
}

/// Summarises a replay; `fleet` adds the engines' view, `engine_names` labels its engines.
pub fn summarise(
    out: &ReplayOutput,
    fleet: Option<&FleetDelta>,
    engine_names: &[String],
) -> RunSummary {
    let mut errors: BTreeMap<&'static str, u64> = BTreeMap::new();
    let (mut rejected, mut ok) = (0u64, 0usize);
    let (mut ttft, mut e2e, mut itl) = (Vec::new(), Vec::new(), Vec::new());
    let (mut out_tokens, mut mismatch) = (0u64, 0usize);
    let (mut cached, mut prompt, mut reported) = (0u64, 0u64, false);
    let mut by_header: BTreeMap<String, u64> = BTreeMap::new();
    let mut all_have_header = true;
    let mut rejected_by_reason: BTreeMap<String, u64> = BTreeMap::new();
    let mut tenants: BTreeMap<String, (TenantSummary, Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for r in &out.records {
        if let Some(t) = &r.tenant {
            let (s, ttft, e2e) = tenants.entry(t.clone()).or_default();
            s.sent += 1;
            s.tokens += u64::from(r.input_length) + u64::from(r.output_length);
            match r.outcome {
                Outcome::Ok => {
                    s.ok += 1;
                    ttft.extend(r.ttft_s);
                    e2e.extend(r.e2e_s);
                }
                Outcome::Rejected { .. } => s.rejected += 1,
                Outcome::Error { .. } => s.errors += 1,
            }
        }
        if let Outcome::Rejected { status } = r.outcome {
            let reason = r
                .reject_reason
                .clone()
                .unwrap_or_else(|| format!("status_{status}"));
            *rejected_by_reason.entry(reason).or_default() += 1;
        }
        match r.outcome {
            Outcome::Ok => {
                ok += 1;
                ttft.extend(r.ttft_s);
                e2e.extend(r.e2e_s);
                itl.extend(r.itl_mean_s);
                out_tokens += u64::from(r.completion_tokens);
                if r.completion_tokens != r.output_length.max(1) {
                    mismatch += 1;
                }
                if let (Some(c), Some(p)) = (r.cached_tokens, r.prompt_tokens) {
                    reported = true;
                    cached += u64::from(c);
                    prompt += u64::from(p);
                }
                match &r.instance {
                    Some(i) => *by_header.entry(i.clone()).or_default() += 1,
                    None => all_have_header = false,
                }
            }
            Outcome::Rejected { .. } => rejected += 1,
            Outcome::Error { class } => *errors.entry(class.as_str()).or_default() += 1,
        }
    }
    for c in ErrorClass::ALL {
        errors.entry(c.as_str()).or_default();
    }
    let (instance_share, share_source) = if ok > 0 && all_have_header {
        // Instances that served nothing still belong in the share table.
        for n in engine_names {
            by_header.entry(n.clone()).or_default();
        }
        (shares(&by_header), ShareSource::Header)
    } else if let Some(f) = fleet.filter(|f| f.requests_per_engine.iter().sum::<f64>() > 0.0) {
        let counts: BTreeMap<String, u64> = f
            .requests_per_engine
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let name = engine_names
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| format!("engine-{i}"));
                (name, n.max(0.0) as u64)
            })
            .collect();
        (shares(&counts), ShareSource::EngineMetrics)
    } else {
        (BTreeMap::new(), ShareSource::None)
    };
    RunSummary {
        sent: out.records.len(),
        ok,
        error_total: errors.values().sum(),
        errors,
        rejected,
        unfinished: out.unfinished,
        ttft: Summary::of(&ttft),
        e2e: Summary::of(&e2e),
        itl: Summary::of(&itl),
        throughput_rps: ratio(ok as f64, out.wall_s),
        output_tokens_per_s: ratio(out_tokens as f64, out.wall_s),
        output_mismatch: mismatch,
        hit_ratio: fleet.map(|f| f.hit_ratio),
        hit_ratio_reported: reported.then(|| ratio(cached as f64, prompt as f64)),
        instance_share,
        share_source,
        wall_s: out.wall_s,
        mean_send_lag_s: out.mean_send_lag_s,
        rejected_by_reason,
        tenants: tenants
            .into_iter()
            .map(|(name, (mut s, ttft, e2e))| {
                s.ttft = Summary::of(&ttft);
                s.e2e = Summary::of(&e2e);
                (name, s)
            })
            .collect(),
        prediction: PredictionFit::of(out),
        goodput: None,
        follow_ups: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::ApiKind;
    use crate::replay::RequestRecord;

    fn rec(i: usize, outcome: Outcome, ttft: f64, inst: Option<&str>) -> RequestRecord {
        RequestRecord {
            index: i,
            scheduled_at_s: 0.0,
            sent_at_s: 0.0,
            input_length: 10,
            output_length: 2,
            ttft_s: Some(ttft),
            e2e_s: Some(ttft * 2.0),
            itl_mean_s: None,
            itl_max_s: None,
            prompt_tokens: Some(10),
            completion_tokens: 2,
            cached_tokens: Some(5),
            instance: inst.map(str::to_string),
            replica: None,
            predicted_ttft_s: None,
            tenant: None,
            reject_reason: None,
            outcome,
        }
    }

    #[test]
    fn counts_and_shares() {
        let out = ReplayOutput {
            records: vec![
                rec(0, Outcome::Ok, 1.0, Some("a")),
                rec(1, Outcome::Ok, 3.0, Some("b")),
                rec(2, Outcome::Ok, 2.0, Some("a")),
                rec(3, Outcome::Rejected { status: 429 }, 0.0, None),
                rec(
                    4,
                    Outcome::Error {
                        class: ErrorClass::Http5xx,
                    },
                    0.0,
                    None,
                ),
            ],
            unfinished: 0,
            wall_s: 2.0,
            mean_send_lag_s: 0.0,
            api: ApiKind::Chat,
        };
        let s = summarise(&out, None, &["a".into(), "b".into(), "c".into()]);
        assert_eq!(s.instance_share["c"], 0.0);
        assert_eq!((s.sent, s.ok, s.rejected, s.error_total), (5, 3, 1, 1));
        assert_eq!(s.errors["http_5xx"], 1);
        assert_eq!(s.ttft.p50, 2.0);
        assert_eq!(s.throughput_rps, 1.5);
        assert_eq!(s.share_source, ShareSource::Header);
        assert!((s.instance_share["a"] - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.hit_ratio_reported, Some(0.5));
        assert_eq!(s.hit_ratio, None);
        // Without headers the engines' counters decide.
        let mut out2 = out.clone();
        for r in &mut out2.records {
            r.instance = None;
        }
        let f = FleetDelta {
            hit_ratio: 0.4,
            requests_per_engine: vec![1.0, 3.0],
            ..Default::default()
        };
        let s = summarise(&out2, Some(&f), &["x".into(), "y".into()]);
        assert_eq!(s.share_source, ShareSource::EngineMetrics);
        assert_eq!(s.instance_share["y"], 0.75);
        assert_eq!(s.hit_ratio, Some(0.4));
    }

    #[test]
    fn tenants_reasons_and_goodput() {
        let mut recs = vec![
            rec(0, Outcome::Ok, 1.0, Some("a")),
            rec(1, Outcome::Ok, 3.0, Some("a")),
            rec(2, Outcome::Rejected { status: 429 }, 0.0, None),
            rec(3, Outcome::Rejected { status: 503 }, 0.0, None),
            rec(4, Outcome::Ok, 2.0, Some("a")),
        ];
        for (r, t) in recs.iter_mut().zip(["h", "h", "h", "l", "l"]) {
            r.tenant = Some(t.into());
        }
        recs[2].reject_reason = Some("queue_full".into());
        recs[0].predicted_ttft_s = Some(0.5);
        recs[1].predicted_ttft_s = Some(3.0);
        let out = ReplayOutput {
            records: recs,
            unfinished: 0,
            wall_s: 2.0,
            mean_send_lag_s: 0.0,
            api: ApiKind::Chat,
        };
        let mut s = summarise(&out, None, &[]);
        let p = s.prediction.clone().unwrap();
        assert_eq!(
            (p.count, p.mean_predicted_s, p.mean_measured_s),
            (2, 1.75, 2.0)
        );
        assert_eq!((p.ratio_p50, p.ratio_p90), (1.0, 2.0));
        assert_eq!(s.rejected_by_reason["queue_full"], 1);
        assert_eq!(s.rejected_by_reason["status_503"], 1);
        let (h, l) = (&s.tenants["h"], &s.tenants["l"]);
        assert_eq!((h.sent, h.ok, h.rejected, h.tokens), (3, 2, 1, 36));
        assert_eq!((l.sent, l.ok, l.rejected), (2, 1, 1));
        assert_eq!(h.ttft.mean, 2.0);
        assert_eq!(l.ttft.mean, 2.0);
        // TTFTs 1, 3, 2 against 2 s: two of five sent.
        let g = goodput(&out, 2.0);
        assert_eq!((g.requests, g.fraction, g.rps), (2, 0.4, 1.0));
        s.goodput = Some(g);
        s.scale_time(4.0);
        let g = s.goodput.as_ref().unwrap();
        assert_eq!((g.ttft_slo_s, g.rps), (8.0, 0.25));
        assert_eq!(s.tenants["h"].ttft.mean, 8.0);
    }
}

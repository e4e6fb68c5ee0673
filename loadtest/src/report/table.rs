//! The terminal summary table printed at the end of every run.

use std::fmt::Write;

use crate::compare::ContenderResult;

fn secs(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

/// Renders one row per contender: TTFT mean/p50/p90/p99, mean E2E, throughput, errors,
/// rejections, hit ratio (engines' counters), per-instance share range.
pub fn render(contenders: &[ContenderResult]) -> String {
    let mut out = String::new();
    let name_w = contenders
        .iter()
        .map(|c| c.label().chars().count())
        .max()
        .unwrap_or(4)
        .max(10);
    let _ = writeln!(
        out,
        "{:<name_w$} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>6} {:>6} {:>6}  share min–max (n)",
        "contender", "TTFT avg", "p50", "p90", "p99", "E2E avg", "req/s", "errors", "reject", "hit",
    );
    for c in contenders {
        let Some(s) = &c.summary else {
            let _ = writeln!(
                out,
                "{:<name_w$} FAILED: {}",
                c.label(),
                c.error.as_deref().unwrap_or("unknown error")
            );
            continue;
        };
        let shares: Vec<f64> = s.instance_share.values().copied().collect();
        let share = if shares.is_empty() {
            "-".to_string()
        } else {
            let min = shares.iter().copied().fold(f64::INFINITY, f64::min);
            let max = shares.iter().copied().fold(0.0, f64::max);
            format!("{:.1}–{:.1} % ({})", min * 100.0, max * 100.0, shares.len())
        };
        let _ = writeln!(
            out,
            "{:<name_w$} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7.2} {:>6} {:>6} {:>6}  {share}",
            c.label(),
            secs(s.ttft.mean),
            secs(s.ttft.p50),
            secs(s.ttft.p90),
            secs(s.ttft.p99),
            secs(s.e2e.mean),
            s.throughput_rps,
            s.error_total,
            s.rejected,
            s.hit_ratio
                .map_or("-".to_string(), |h| format!("{:.1}%", h * 100.0)),
        );
    }
    out.push_str("(latencies in seconds; hit ratio from the engines' prefix-cache counters)\n");
    for c in contenders {
        let Some(s) = &c.summary else { continue };
        let mut parts = Vec::new();
        if let Some(g) = &s.goodput {
            parts.push(format!(
                "goodput (TTFT <= {} s) {} of {} sent ({:.1} %), {:.2} req/s",
                secs(g.ttft_slo_s),
                g.requests,
                s.sent,
                g.fraction * 100.0,
                g.rps
            ));
        }
        if let Some(p) = &s.prediction {
            parts.push(format!(
                "predicted TTFT mean {} vs measured {} (measured/predicted p50 {:.2}, p90 {:.2})",
                secs(p.mean_predicted_s),
                secs(p.mean_measured_s),
                p.ratio_p50,
                p.ratio_p90
            ));
        }
        parts.extend(send_lag_note(s.mean_send_lag_s));
        if let Some(engine) = c
            .fleet
            .as_ref()
            .and_then(|f| f.engine_ttft_mean_s)
            .filter(|_| s.ttft.count > 0)
        {
            parts.push(format!(
                "TTFT mean at the engines {} (the path through the router added {})",
                secs(engine),
                secs(s.ttft.mean - engine)
            ));
        }
        if let Some(f) = c.fleet.as_ref().filter(|f| f.sim_steps > 0.0) {
            parts.push(format!(
                "simulated engines woke {:.1} ms (model) late per step on average, skipped {:.2} s",
                f.sim_step_late_mean_s * 1e3,
                f.sim_clock_skipped_s
            ));
        }
        if let Some(f) = s.follow_ups.filter(|f| f.requests > 0) {
            parts.push(format!(
                "follow-up turns {}: {:.1} % on the previous turn's instance, {} cached",
                f.requests,
                f.same_instance_fraction() * 100.0,
                f.hit_ratio
                    .map_or("-".to_string(), |h| format!("{:.1} %", h * 100.0)),
            ));
        }
        if !s.rejected_by_reason.is_empty() {
            let r: Vec<String> = s
                .rejected_by_reason
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            parts.push(format!("rejected: {}", r.join(", ")));
        }
        for (name, t) in &s.tenants {
            parts.push(format!(
                "tenant {name}: {} sent, {} ok, {} rejected, {} tokens, TTFT mean {} p99 {}, E2E mean {}",
                t.sent,
                t.ok,
                t.rejected,
                t.tokens,
                secs(t.ttft.mean),
                secs(t.ttft.p99),
                secs(t.e2e.mean)
            ));
        }
        if !parts.is_empty() {
            let _ = writeln!(out, "{}: {}", c.label(), parts.join("; "));
        }
    }
    out
}

/// Mean send lag (in the summary's seconds: model time unless `--wall-time`) above which a run
/// is flagged: the replay client's own
/// scheduling costs a few ms per request at `--time-scale 4` (~1 ms at 1), far below this.
const SEND_LAG_NOTE_S: f64 = 0.02;

/// A note when the client sent requests later than the workload scheduled them: arrivals were
/// throttled (the concurrency cap was reached, or the client was short of CPU), so the contender
/// saw a gentler load than the workload's and its latencies exclude the wait. Without the note
/// a slow contender looks better than it is, since the cap holds back exactly its backlog.
fn send_lag_note(mean_send_lag_s: f64) -> Option<String> {
    (mean_send_lag_s > SEND_LAG_NOTE_S).then(|| {
        format!(
            "sent {} s late on average: arrivals were held back (raise --concurrency, or the \
             client is short of CPU), so this load was gentler than the workload's and latencies \
             exclude the wait",
            secs(mean_send_lag_s)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::send_lag_note;

    #[test]
    fn a_throttled_replay_is_flagged_and_one_on_schedule_is_not() {
        assert_eq!(send_lag_note(0.004), None);
        let note = send_lag_note(6.25).unwrap_or_default();
        assert!(note.starts_with("sent 6.250 s late on average"), "{note}");
        assert!(note.contains("--concurrency"), "{note}");
    }
}

//! Finding the trace speed-up at which round robin keeps the fleet at a target utilisation.
//!
//! Utilisation is the fleet's work fraction between the first and the last arrival (see
//! [`super::result::PolicyResult::utilisation`]); it grows with the speed-up and approaches 1 as
//! the fleet saturates. The search keeps a bracket and takes proportional steps (utilisation is roughly
//! linear in the arrival rate below saturation), falling back to geometric bisection when a step
//! leaves the bracket.
//!
//! Invariants: bounded by `max_iters` simulations; deterministic (each probe is a seeded run).
//! Probes run without a placement index ([`IndexMode::Off`]): round robin's choices never read
//! it and utilisation comes from the engines alone, so a probe's figure is exactly that of a full
//! run, at a fraction of the cost (index maintenance is most of a simulation's work).

use serde::{Deserialize, Serialize};

use super::router::IndexMode;
use super::runner::{run_policy, OfflineConfig};
use super::workload::Workload;
use super::OfflineError;

/// The policy whose utilisation defines a load level.
pub const REFERENCE_POLICY: &str = "round_robin";

/// One probe of the search.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    /// Speed-up tried.
    pub speed_up: f64,
    /// Round robin's utilisation there.
    pub utilisation: f64,
}

/// Result of the search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpeedUpFit {
    /// Target utilisation.
    pub target: f64,
    /// Chosen speed-up (the probe closest to the target).
    pub speed_up: f64,
    /// Round robin's utilisation at that speed-up.
    pub utilisation: f64,
    /// Every probe, in order.
    pub probes: Vec<Probe>,
}

/// Finds the speed-up of `base` (a workload at speed-up 1) where round robin keeps the fleet
/// `target` busy, within `tolerance`, in at most `max_iters` simulations.
pub fn find_speed_up(
    base: &Workload,
    cfg: &OfflineConfig,
    target: f64,
    tolerance: f64,
    max_iters: usize,
) -> Result<SpeedUpFit, OfflineError> {
    if !(target > 0.0 && target.is_finite()) {
        return Err(OfflineError::Param(format!(
            "target utilisation must be a positive number, got {target}"
        )));
    }
    if base.span_us() == 0 {
        return Err(OfflineError::Param(
            "the workload spans no time: utilisation is undefined".into(),
        ));
    }
    let mut probe_cfg = cfg.clone();
    probe_cfg.router.index_mode = IndexMode::Off;
    let probe = |s: f64| -> Result<Probe, OfflineError> {
        let w = base.rescaled(s)?;
        let r = run_policy(&w, &probe_cfg, REFERENCE_POLICY)?;
        Ok(Probe {
            speed_up: s,
            utilisation: r.utilisation,
        })
    };
    let mut probes: Vec<Probe> = Vec::new();
    let (mut lo, mut hi): (Option<f64>, Option<f64>) = (None, None);
    let mut s = 1.0f64;
    for _ in 0..max_iters.max(1) {
        let p = probe(s)?;
        probes.push(p);
        if (p.utilisation - target).abs() <= tolerance {
            break;
        }
        if p.utilisation < target {
            lo = Some(lo.map_or(s, |l: f64| l.max(s)));
        } else {
            hi = Some(hi.map_or(s, |h: f64| h.min(s)));
        }
        // Proportional step, limited to a factor of 4 per probe.
        let ratio = if p.utilisation > 0.0 {
            (target / p.utilisation).clamp(0.25, 4.0)
        } else {
            4.0
        };
        let mut next = s * ratio;
        let inside = lo.is_none_or(|l| next > l) && hi.is_none_or(|h| next < h);
        if !inside {
            if let (Some(l), Some(h)) = (lo, hi) {
                next = (l * h).sqrt();
            }
        }
        if (next - s).abs() < 1e-6 * s {
            break;
        }
        s = next;
    }
    let best = probes
        .iter()
        .copied()
        .min_by(|a, b| {
            (a.utilisation - target)
                .abs()
                .total_cmp(&(b.utilisation - target).abs())
        })
        .ok_or_else(|| OfflineError::Param("no probe ran".into()))?;
    Ok(SpeedUpFit {
        target,
        speed_up: best.speed_up,
        utilisation: best.utilisation,
        probes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offline::engine_loop::FleetSpec;
    use crate::offline::router::RouterSettings;
    use crate::offline::workload::OfflineRequest;
    use kvgate_core::policy::PolicyConfig;
    use kvgate_sim::model::EngineParams;

    /// Conversations that share their history, so the index has work to do.
    fn setup() -> (Workload, OfflineConfig) {
        let params = EngineParams {
            num_gpu_blocks: 600,
            ..Default::default()
        };
        let mut requests = Vec::new();
        for i in 0..240u64 {
            let conv = i % 12;
            let turn = i / 12;
            let blocks: Vec<u64> = (0..(20 + 8 * turn)).map(|b| (conv << 32) | b).collect();
            requests.push(OfflineRequest {
                arrival_us: i * 150_000,
                prompt_tokens: blocks.len() as u32 * params.block_size + 5,
                output_tokens: 40 + (i % 7) as u32 * 10,
                blocks,
            });
        }
        let w = Workload {
            requests,
            block_tokens: params.block_size,
        };
        let cfg = OfflineConfig {
            router: RouterSettings::gateway_defaults(vec![u64::from(params.num_gpu_blocks); 4]),
            fleet: FleetSpec::uniform(4, params),
            policy: PolicyConfig::default(),
            seed: 3,
            jobs: 1,
        };
        (w, cfg)
    }

    #[test]
    fn probes_without_the_index_give_round_robin_exactly() {
        let (w, cfg) = setup();
        let mut off = cfg.clone();
        off.router.index_mode = IndexMode::Off;
        let full = run_policy(&w, &cfg, REFERENCE_POLICY).expect("full");
        let probe = run_policy(&w, &off, REFERENCE_POLICY).expect("probe");
        assert!(full.hit_ratio > 0.0 && full.router_best_ratio > 0.0);
        assert_eq!(probe.router_best_ratio, 0.0);
        assert_eq!(full.utilisation, probe.utilisation);
        assert_eq!(full.ttft_s, probe.ttft_s);
        assert_eq!(full.hit_ratio, probe.hit_ratio);
        assert_eq!(full.instance_share, probe.instance_share);

        let fit = find_speed_up(&w, &cfg, 0.5, 0.01, 6).expect("fit");
        let at = run_policy(
            &w.rescaled(fit.speed_up).expect("rescale"),
            &cfg,
            REFERENCE_POLICY,
        )
        .expect("run at the fit");
        assert_eq!(at.utilisation, fit.utilisation);
    }
}

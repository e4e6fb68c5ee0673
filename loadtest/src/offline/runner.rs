//! Running several policies (and the references) over one workload, in parallel, deterministically.
//!
//! Invariants: each policy runs on a fresh fleet and a fresh router (cold caches, empty index), so
//! contenders never share state; results come back in the order the policies were given whatever
//! the thread count; the work queue is bounded by the number of policies.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::bounds::{infinite_cache_hit, lru_cache_hit};
use super::engine_loop::{simulate, FleetSpec};
use super::floor::floors_fastest;
use super::policies::make_policy;
use super::result::{PolicyResult, References};
use super::router::{RouterSettings, SimRouter};
use super::workload::Workload;
use super::OfflineError;
use kvgate_core::policy::PolicyConfig;

/// Everything a run needs besides the workload and the policy names.
#[derive(Clone, Debug)]
pub struct OfflineConfig {
    /// The fleet.
    pub fleet: FleetSpec,
    /// Router-side settings.
    pub router: RouterSettings,
    /// Policy parameters (every policy reads its own section).
    pub policy: PolicyConfig,
    /// Seed for tie-breaking and event ordering.
    pub seed: u64,
    /// Worker threads (at least 1).
    pub jobs: usize,
}

/// Runs one policy.
pub fn run_policy(
    workload: &Workload,
    cfg: &OfflineConfig,
    policy: &str,
) -> Result<PolicyResult, OfflineError> {
    let p = make_policy(policy, &cfg.policy)?;
    let router = SimRouter::new(
        p,
        cfg.router.clone(),
        cfg.fleet.len(),
        workload.requests.len(),
        workload.block_tokens,
        cfg.seed,
    );
    let mut r = simulate(workload, &cfg.fleet, router, cfg.seed)?;
    r.policy = policy.to_string();
    Ok(r)
}

/// Runs each policy on a fresh fleet, `cfg.jobs` at a time; results in the given order.
pub fn run_policies(
    workload: &Workload,
    cfg: &OfflineConfig,
    policies: &[String],
) -> Result<Vec<PolicyResult>, OfflineError> {
    let jobs: Vec<Job<'_>> = policies.iter().map(|p| Job::Policy(p)).collect();
    let mut out = Vec::with_capacity(policies.len());
    for r in run_jobs(workload, cfg, &jobs) {
        match r? {
            JobOut::Policy(p) => out.push(*p),
            JobOut::Refs(_) => {}
        }
    }
    Ok(out)
}

/// The policies' results and the references, computed together (references on a worker too).
pub fn run_with_references(
    workload: &Workload,
    cfg: &OfflineConfig,
    policies: &[String],
    with_floor: bool,
) -> Result<(Vec<PolicyResult>, References), OfflineError> {
    let mut jobs: Vec<Job<'_>> = vec![Job::Refs { with_floor }];
    jobs.extend(policies.iter().map(|p| Job::Policy(p)));
    let mut results = Vec::with_capacity(policies.len());
    let mut refs = References::default();
    for r in run_jobs(workload, cfg, &jobs) {
        match r? {
            JobOut::Policy(p) => results.push(*p),
            JobOut::Refs(r) => refs = r,
        }
    }
    Ok((results, refs))
}

/// The references of a workload on a fleet.
pub fn references(
    workload: &Workload,
    fleet: &FleetSpec,
    with_floor: bool,
) -> Result<References, OfflineError> {
    let cap = fleet.capacity_blocks();
    let floors = if with_floor {
        let classes: Vec<_> = fleet.classes().into_iter().map(|c| c.2).collect();
        floors_fastest(workload, &classes)?
    } else {
        Default::default()
    };
    Ok(References {
        infinite_hit_ratio: infinite_cache_hit(workload).ratio(),
        fleet_lru_hit_ratio: lru_cache_hit(workload, cap as usize).ratio(),
        fleet_lru_capacity_blocks: cap,
        ttft_floor_s: floors.ttft_s,
        e2e_floor_s: floors.e2e_s,
    })
}

enum Job<'a> {
    Policy(&'a str),
    Refs { with_floor: bool },
}

enum JobOut {
    Policy(Box<PolicyResult>),
    Refs(References),
}

fn run_jobs(
    workload: &Workload,
    cfg: &OfflineConfig,
    jobs: &[Job<'_>],
) -> Vec<Result<JobOut, OfflineError>> {
    let next = AtomicUsize::new(0);
    let slots: Mutex<Vec<Option<Result<JobOut, OfflineError>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    let threads = cfg.jobs.clamp(1, jobs.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let r = match job {
                    Job::Policy(p) => {
                        run_policy(workload, cfg, p).map(|r| JobOut::Policy(Box::new(r)))
                    }
                    Job::Refs { with_floor } => {
                        references(workload, &cfg.fleet, *with_floor).map(JobOut::Refs)
                    }
                };
                if let Ok(mut g) = slots.lock() {
                    g[i] = Some(r);
                }
            });
        }
    });
    let slots = match slots.into_inner() {
        Ok(s) => s,
        Err(poisoned) => poisoned.into_inner(),
    };
    slots
        .into_iter()
        .map(|s| {
            s.unwrap_or_else(|| Err(OfflineError::Param("a simulation worker panicked".into())))
        })
        .collect()
}

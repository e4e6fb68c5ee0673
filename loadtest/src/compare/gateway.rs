//! kvgate's gateway started in-process on 127.0.0.1:0, fronting a simulated fleet: one
//! gateway, or several replicas sharing placements and load by gossip on 127.0.0.1 ephemeral
//! UDP ports, as several pods behind one Service would.
//!
//! Invariant: every start and stop is bounded in time; a replica set is returned only once every
//! replica sees all the others as live members.

use std::time::Duration;

use kvgate::config::{Config, Flavour, InstanceConfig, PoolConfig};
use kvgate_core::policy::PolicyName;
use kvgate_sim::SimInstanceInfo;
use tokio::sync::oneshot;

/// A running in-process gateway.
pub struct InProcessGateway {
    /// Base URL.
    pub url: String,
    /// Its state (routing, index, gossip handle).
    pub state: kvgate::app::AppState,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
#[error("starting kvgate: {0}")]
pub struct GatewayStartError(String);

/// The gateway config: `base` with one pool of the fleet's engines and `policy`.
///
/// The pool hashes in token mode with the simulator's own built-in tokenizer and subscribes to
/// every engine's KV events, as a production deployment in front of vLLM would: the index is then
/// exact, not only predicted, and every kvgate contender sees the same information.
pub fn config_for(
    base: &Config,
    policy: PolicyName,
    engines: &[SimInstanceInfo],
    model: &str,
) -> Config {
    let mut cfg = base.clone();
    cfg.server.listen = "127.0.0.1:0".to_string();
    cfg.routing.policy.name = policy;
    cfg.pools = vec![PoolConfig {
        model: model.to_string(),
        block_size: engines.first().map(|e| e.block_size),
        tokenizer: Some("builtin".to_string()),
        chat_template: None,
        flavour: Flavour::Vllm,
        instances: engines
            .iter()
            .map(|e| InstanceConfig {
                name: Some(e.name.clone()),
                url: e.url.clone(),
                kv_events: e.kv_events_endpoint.clone(),
                kv_replay: e.replay_endpoint.clone(),
                kv_topic: None,
                capacity_blocks: Some(e.capacity_blocks),
            })
            .collect(),
        max_instances: None,
        discovery: Default::default(),
    }];
    cfg
}

impl InProcessGateway {
    /// Starts the gateway with `cfg`, its admin surface (`/metrics`, `/admin/*`) on the same
    /// ephemeral port as the rest (`url`): never an admin listener on a fixed port, which a
    /// second gateway of the same run could not bind.
    pub async fn start(mut cfg: Config) -> Result<Self, GatewayStartError> {
        cfg.server.admin_listen = kvgate::config::ADMIN_ON_MAIN.to_string();
        let state =
            kvgate::app::AppState::new(cfg).map_err(|e| GatewayStartError(e.to_string()))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| GatewayStartError(e.to_string()))?;
        let addr = listener
            .local_addr()
            .map_err(|e| GatewayStartError(e.to_string()))?;
        let (stop, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(kvgate::app::run(listener, state.clone(), async move {
            let _ = rx.await;
        }));
        Ok(InProcessGateway {
            url: format!("http://{addr}"),
            state,
            stop,
            task,
        })
    }

    /// Starts `n` replicas of the gateway with `cfg`, gossiping with each other on loopback
    /// (placements and load; each still subscribes to every engine's KV events itself), and
    /// waits until each sees the other `n − 1` as live members. `n = 1` is [`Self::start`].
    ///
    /// Every engine-time setting, the gossip intervals included, is converted to wall time at
    /// `time_scale` ([`in_wall_time`]), for one gateway as for many.
    pub async fn start_replicas(
        mut cfg: Config,
        n: usize,
        time_scale: f64,
    ) -> Result<Vec<Self>, GatewayStartError> {
        in_wall_time(&mut cfg, time_scale);
        if n <= 1 {
            return Ok(vec![Self::start(cfg).await?]);
        }
        let mut replicas: Vec<Self> = Vec::with_capacity(n);
        let mut seed = None;
        for _ in 0..n {
            let mut c = cfg.clone();
            c.gossip.enabled = true;
            c.gossip.bind = "127.0.0.1:0".to_string();
            c.gossip.secret = REPLICA_SECRET.to_string();
            c.gossip.seeds = seed.iter().map(ToString::to_string).collect();
            c.gossip.prediction_ttl_ms = c.routing.predicted_ttl_ms;
            let g = match Self::start(c).await {
                Ok(g) => g,
                Err(e) => {
                    stop_all(replicas).await;
                    return Err(e);
                }
            };
            let addr = wait_for(|| g.state.routing.gossip().map(|h| h.local_addr())).await;
            replicas.push(g);
            match addr {
                Some(a) => seed = seed.or(Some(a)),
                None => {
                    stop_all(replicas).await;
                    return Err(GatewayStartError("gossip did not start".into()));
                }
            }
        }
        let joined = wait_for(|| {
            replicas
                .iter()
                .all(|g| g.state.routing.gossip().map_or(0, |h| h.live_peers()) + 1 >= n)
                .then_some(())
        })
        .await;
        if joined.is_none() {
            stop_all(replicas).await;
            return Err(GatewayStartError(format!(
                "{n} replicas did not all join one gossip cluster in {} s",
                START_TIMEOUT.as_secs()
            )));
        }
        Ok(replicas)
    }

    /// Stops the gateway (bounded wait).
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(10), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

/// Cluster secret of in-process replicas (they gossip on loopback only).
const REPLICA_SECRET: &str = "kvgate-loadtest-replicas-0123456789";

/// How long replicas may take to start and join.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// Converts the routing model's engine-time quantities to wall time for engines that run
/// `time_scale` times faster than real: the learned rates' starting points and bounds (prefill
/// tokens/s, decode step costs, interference, overhead), the policy's prices and targets in
/// ms, the engine-load scrape interval and staleness bound, and the two gossip intervals that
/// carry decisions and load between replicas (`flush_interval_ms`, `load_interval_ms`; at least
/// 1 ms; membership timing and `push_gap_ms`, a bound on datagrams per second, stay as
/// configured). The gateway measures in wall time, so a
/// configuration meant for real engines would start its rates `time_scale` times too slow;
/// learning corrects that only after hundreds of requests, and a replay of a few hundred would
/// be routed by the configured starting points instead of what the engines do. At
/// `time_scale` ≤ 1 (or not finite) nothing changes.
pub fn in_wall_time(cfg: &mut Config, time_scale: f64) {
    let Some(t) = faster_than_real(time_scale) else {
        return;
    };
    let r = &mut cfg.routing.rates;
    r.prefill_tokens_per_s *= t;
    r.min_prefill_tokens_per_s *= t;
    r.max_prefill_tokens_per_s *= t;
    r.decode_interference_ms /= t;
    r.max_decode_interference_ms /= t;
    r.overhead_ms /= t;
    r.max_overhead_ms /= t;
    let d = &mut cfg.routing.decode_rates;
    d.step_ms /= t;
    d.per_seq_ms /= t;
    d.per_kctx_ms /= t;
    d.max_step_ms /= t;
    d.max_per_seq_ms /= t;
    d.max_per_kctx_ms /= t;
    // Engine load is scraped at the offline simulator's cadence in engine time; the scrape
    // timeout bounds I/O, which runs in wall time, and stays as configured.
    let l = &mut cfg.load;
    l.poll_interval_ms = scaled_ms(l.poll_interval_ms, t);
    l.stale_after_ms = scaled_ms(l.stale_after_ms, t);
    let g = &mut cfg.gossip;
    g.flush_interval_ms = scaled_ms(g.flush_interval_ms, t);
    g.load_interval_ms = scaled_ms(g.load_interval_ms, t);
    let k = &mut cfg.routing.policy.kvgate;
    k.ttft_slo_ms /= t;
    k.tpot_slo_ms /= t;
    k.slo_penalty_ms /= t;
    k.tie_epsilon_ms /= t;
}

/// `ms` of wall time at `time_scale`: the same span of engine time, at least 1 ms.
fn scaled_ms(ms: u64, time_scale: f64) -> u64 {
    match faster_than_real(time_scale) {
        Some(t) => ((ms as f64 / t).round() as u64).max(1),
        None => ms,
    }
}

/// The time scale when engines run faster than real (finite and above 1): the only case in
/// which engine time and wall time differ.
fn faster_than_real(time_scale: f64) -> Option<f64> {
    (time_scale.is_finite() && time_scale > 1.0).then_some(time_scale)
}

/// Polls `probe` every 10 ms until it answers, for at most [`START_TIMEOUT`].
async fn wait_for<T>(mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Stops every replica (each bounded).
pub async fn stop_all(replicas: Vec<InProcessGateway>) {
    for g in replicas {
        g.stop().await;
    }
}

#[cfg(test)]
mod tests {
    use super::{in_wall_time, scaled_ms};
    use kvgate::config::Config;

    #[test]
    fn the_routing_model_starts_in_the_engines_time() {
        let base = Config::default();
        let mut c = base.clone();
        in_wall_time(&mut c, 4.0);
        let (r, r0) = (&c.routing.rates, &base.routing.rates);
        assert_eq!(r.prefill_tokens_per_s, r0.prefill_tokens_per_s * 4.0);
        assert_eq!(
            r.max_prefill_tokens_per_s,
            r0.max_prefill_tokens_per_s * 4.0
        );
        assert_eq!(r.overhead_ms, r0.overhead_ms / 4.0);
        let (d, d0) = (&c.routing.decode_rates, &base.routing.decode_rates);
        assert_eq!(
            d.initial().tpot_ms(8.0, 64_000.0),
            d0.initial().tpot_ms(8.0, 64_000.0) / 4.0
        );
        assert_eq!(
            c.routing.policy.kvgate.ttft_slo_ms,
            base.routing.policy.kvgate.ttft_slo_ms / 4.0
        );
        // Dimensionless settings and everything outside the routing model stay as configured.
        assert_eq!(r.forgetting, r0.forgetting);
        assert_eq!(
            c.routing.policy.kvgate.decode_weight,
            base.routing.policy.kvgate.decode_weight
        );
        // Load is scraped as often in engine time as the offline simulator scrapes it; the
        // scrape's own timeout is I/O and stays.
        assert_eq!(c.load.poll_interval_ms, base.load.poll_interval_ms / 4);
        assert_eq!(c.load.stale_after_ms, base.load.stale_after_ms / 4);
        assert_eq!(c.load.timeout_ms, base.load.timeout_ms);
        assert_eq!(
            c.gossip.load_interval_ms,
            scaled_ms(base.gossip.load_interval_ms, 4.0)
        );
        assert!(c.validate().is_ok());
        for t in [1.0, 0.5, f64::NAN] {
            let mut same = base.clone();
            in_wall_time(&mut same, t);
            assert_eq!(same.routing.rates, base.routing.rates, "time scale {t}");
            assert_eq!(same.routing.policy.kvgate, base.routing.policy.kvgate);
            assert_eq!(same.load, base.load);
            assert_eq!(same.gossip, base.gossip);
        }
    }

    #[test]
    fn gossip_intervals_follow_the_engines_time_scale() {
        assert_eq!(scaled_ms(50, 4.0), 13);
        assert_eq!(scaled_ms(25, 1.0), 25);
        assert_eq!(
            scaled_ms(25, 0.5),
            25,
            "a slower fleet keeps the configured interval"
        );
        assert_eq!(scaled_ms(2, 100.0), 1);
        assert_eq!(scaled_ms(25, f64::NAN), 25);
    }
}

//! kvgate's gateway started in-process on 127.0.0.1:0, fronting a simulated fleet.

use std::time::Duration;

use kvgate::config::{Config, Flavour, InstanceConfig, PoolConfig};
use kvgate_core::policy::PolicyName;
use kvgate_sim::SimInstanceInfo;
use tokio::sync::oneshot;

/// A running in-process gateway.
pub struct InProcessGateway {
    /// Base URL.
    pub url: String,
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
        let task = tokio::spawn(kvgate::app::run(listener, state, async move {
            let _ = rx.await;
        }));
        Ok(InProcessGateway {
            url: format!("http://{addr}"),
            stop,
            task,
        })
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

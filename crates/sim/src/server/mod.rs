//! The HTTP surface of one simulated engine (axum), around the engine loop.
//!
//! Routes: OpenAI (`/v1/chat/completions`, `/v1/completions`, `/v1/models`), vLLM extras
//! (`/health`, `/metrics`, `/tokenize`, `POST /reset_prefix_cache`), SGLang's worker surface
//! (`/get_server_info`, `/server_info`, `/get_model_info`, `/model_info`, `/get_load`,
//! `/v1/loads`), and `/admin/faults`, `/admin/stats`, `/admin/cache`.

pub mod admin;
pub mod engine_loop;
pub mod error;
pub mod faults;
pub mod metrics;
pub mod openai;
pub mod output;
pub mod request;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use kvgate_tokenizer::TokenMode;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::error::SimError;
use crate::kv_events::{Publisher, PublisherConfig};
use crate::model::{EngineModel, EngineParams};
use engine_loop::Core;
use faults::Faults;
use metrics::Snapshot;

/// Which engine the simulator imitates (metric names, error shape).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Flavour {
    /// vLLM.
    #[default]
    Vllm,
    /// SGLang.
    Sglang,
}

/// How long [`RunningEngine::shutdown`] waits for the engine loop to end.
pub const LOOP_STOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// State shared by the handlers of one engine.
pub struct AppState {
    /// Instance name (in ids and logs).
    pub name: String,
    /// Served model name.
    pub model: String,
    /// Flavour.
    pub flavour: Flavour,
    /// Engine parameters (read-only copy).
    pub params: EngineParams,
    /// Tokenizer and chat template.
    pub tokens: Arc<TokenMode>,
    /// Loop handle, snapshot, faults.
    pub core: Arc<Core>,
    /// Output-text seed.
    pub seed: u64,
    /// Next request id.
    pub next_id: AtomicU64,
    /// Fault dice.
    pub rng: Mutex<SmallRng>,
    /// Output length when a request gives no `max_tokens`.
    pub default_max_tokens: u32,
    /// Whether KV events are published.
    pub events_enabled: bool,
    /// Words of generated text, with their token ids.
    pub vocab: Arc<output::OutputVocab>,
}

/// The router of one engine.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/models", get(admin::models))
        .route("/health", get(admin::health))
        .route("/metrics", get(admin::metrics))
        .route("/tokenize", post(admin::tokenize))
        .route("/reset_prefix_cache", post(admin::reset_prefix_cache))
        .route("/get_server_info", get(admin::server_info))
        .route("/server_info", get(admin::server_info))
        .route("/get_model_info", get(admin::model_info))
        .route("/model_info", get(admin::model_info))
        .route("/get_load", get(admin::get_load))
        .route("/v1/loads", get(admin::loads))
        .route(
            "/admin/faults",
            get(admin::get_faults).post(admin::set_faults),
        )
        .route("/admin/stats", get(admin::stats))
        .route("/admin/cache", get(admin::cache))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Everything needed to start one engine.
pub struct EngineConfig {
    /// Instance name.
    pub name: String,
    /// Served model name.
    pub model: String,
    /// Flavour.
    pub flavour: Flavour,
    /// Engine parameters.
    pub params: EngineParams,
    /// Divides every duration.
    pub time_scale: f64,
    /// Output seed.
    pub seed: u64,
    /// KV event publisher, if enabled.
    pub kv_events: Option<PublisherConfig>,
    /// Initial faults.
    pub faults: Faults,
    /// Tokenizer and template.
    pub tokens: Arc<TokenMode>,
    /// Output length without `max_tokens`.
    pub default_max_tokens: u32,
    /// Command queue bound.
    pub queue: usize,
}

/// A running engine.
pub struct RunningEngine {
    /// Listening address.
    pub addr: std::net::SocketAddr,
    /// Handler state.
    pub state: Arc<AppState>,
    /// The publisher, if any.
    pub publisher: Option<Arc<Publisher>>,
    server: JoinHandle<()>,
    engine: JoinHandle<()>,
}

impl RunningEngine {
    /// Starts the loop, the publisher and the HTTP server on `listener`.
    pub async fn start(cfg: EngineConfig, listener: TcpListener) -> Result<Self, SimError> {
        cfg.params.validate()?;
        let addr = listener.local_addr()?;
        let publisher = match cfg.kv_events {
            Some(pc) => Some(Arc::new(Publisher::start(pc).await?)),
            None => None,
        };
        let (cmd_tx, cmd_rx) = mpsc::channel(cfg.queue.max(1));
        let core = Arc::new(Core {
            cmd_tx,
            snapshot: Mutex::new(Snapshot::default()),
            faults: Mutex::new(cfg.faults.sanitised()),
            faults_changed: tokio::sync::Notify::new(),
            stop: tokio_util::sync::CancellationToken::new(),
        });
        let model = EngineModel::new(cfg.params.clone());
        core.snapshot.lock().update(&model);
        let engine = tokio::spawn(engine_loop::run(
            model,
            core.clone(),
            cmd_rx,
            publisher.clone(),
            cfg.time_scale,
        ));
        let state = Arc::new(AppState {
            name: cfg.name,
            model: cfg.model,
            flavour: cfg.flavour,
            params: cfg.params,
            tokens: cfg.tokens.clone(),
            core,
            seed: cfg.seed,
            next_id: AtomicU64::new(1),
            rng: Mutex::new(SmallRng::seed_from_u64(cfg.seed)),
            default_max_tokens: cfg.default_max_tokens.max(1),
            events_enabled: publisher.is_some(),
            vocab: Arc::new(output::OutputVocab::new(&cfg.tokens)),
        });
        let app = router(state.clone());
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "simulated engine server stopped");
            }
        });
        Ok(RunningEngine {
            addr,
            state,
            publisher,
            server,
            engine,
        })
    }

    /// Stops the server, the loop and the publisher. Requests still in flight end as aborted.
    /// Returns whether the loop stopped within [`LOOP_STOP_TIMEOUT`] (it always should; `false`
    /// is also logged).
    pub async fn shutdown(self) -> bool {
        // The loop is told directly: the handlers' state (and open connections' copies of it)
        // keeps the command channel open, so waiting for it to close would wait forever.
        self.state.core.stop.cancel();
        self.server.abort();
        let _ = self.server.await;
        drop(self.state);
        let stopped = tokio::time::timeout(LOOP_STOP_TIMEOUT, self.engine)
            .await
            .is_ok();
        if !stopped {
            tracing::warn!("engine loop did not stop in time");
        }
        if let Some(p) = self.publisher {
            if let Ok(p) = Arc::try_unwrap(p) {
                p.shutdown().await;
            }
        }
        stopped
    }
}

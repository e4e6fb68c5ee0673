//! The `kvgate` binary: parse flags, load config, start things. Nothing else lives here.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use kvgate::config::{env, Config, Flavour, InstanceConfig, LogFormat, PoolConfig};
use std::path::PathBuf;

// A faster allocator for the many small per-request allocations of the proxy path.
#[global_allocator]
static GLOBAL: kvgate::alloc::MiMalloc = kvgate::alloc::MiMalloc;

/// Cache-aware request router for LLM inference fleets.
#[derive(Parser, Debug)]
#[command(name = "kvgate", version, about)]
struct Cli {
    /// TOML config file (env: KVGATE_CONFIG). Without one, built-in defaults apply.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Listen address, overriding config and KVGATE_LISTEN.
    #[arg(long)]
    listen: Option<String>,
    /// Log format: human or json, overriding config and KVGATE_LOG_FORMAT.
    #[arg(long)]
    log_format: Option<LogFormat>,
    /// Threads serving client connections, overriding `server.threads` and KVGATE_THREADS.
    #[arg(long)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a simulated vLLM/SGLang-like fleet (no GPU needed); prints its instances as JSON.
    Sim(Box<kvgate_sim::SimArgs>),
    /// Probe a running gateway's /health (exit 0 when healthy); used by the container HEALTHCHECK.
    Healthcheck {
        /// Address to probe; default: the configured listen address.
        #[arg(long)]
        addr: Option<String>,
    },
}

fn load_config(cli: &Cli) -> Result<Config> {
    let path = cli
        .config
        .clone()
        .or_else(|| std::env::var_os(env::CONFIG).map(PathBuf::from));
    let mut cfg = match &path {
        Some(p) => Config::from_file(p)?,
        None => Config::default(),
    };
    cfg.apply_env(|k| std::env::var(k).ok())?;
    if let Some(l) = &cli.listen {
        cfg.server.listen = l.clone();
    }
    if let Some(f) = cli.log_format {
        cfg.server.log_format = f;
    }
    // Before the embedded fleet fills `pools`: the default depends on what the gateway fronts.
    let token = std::env::var(kvgate::auth::ENV_ADMIN_TOKEN).ok();
    let token = cfg.auth.admin_token_configured(token.as_deref());
    cfg.settle_admin_listen(token);
    cfg.validate()?;
    Ok(cfg)
}

fn init_logging(cfg: &Config) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&cfg.server.log_filter)
        .with_context(|| format!("invalid server.log_filter `{}`", cfg.server.log_filter))?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match cfg.server.log_format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

fn healthcheck(cfg: &Config, addr: Option<String>) -> Result<()> {
    use std::io::{Read, Write};
    // Picker only (no proxy listener): the admin listener answers /health.
    let own = if cfg.server.has_proxy_listener() {
        &cfg.server.listen
    } else {
        &cfg.server.admin_listen
    };
    let addr = addr.unwrap_or_else(|| own.replace("0.0.0.0", "127.0.0.1"));
    let sock: std::net::SocketAddr = addr
        .parse()
        .with_context(|| format!("bad address {addr}"))?;
    let timeout = std::time::Duration::from_secs(3);
    let mut s = std::net::TcpStream::connect_timeout(&sock, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut buf = [0u8; 32];
    let n = s.read(&mut buf)?;
    let head = String::from_utf8_lossy(&buf[..n]);
    if head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200") {
        Ok(())
    } else {
        bail!("unhealthy: {}", head.lines().next().unwrap_or(""))
    }
}

fn main() -> std::process::ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kvgate: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The error chain, without a backtrace: these are operator-facing messages.
            eprintln!("kvgate: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let cli = Cli::parse();
    if let Some(Command::Sim(args)) = cli.command {
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env(env::LOG)
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
            )
            .with_writer(std::io::stderr)
            .init();
        return kvgate_sim::cli::run(*args).await.map_err(Into::into);
    }
    let cfg = load_config(&cli)?;
    if let Some(Command::Healthcheck { addr }) = cli.command {
        return healthcheck(&cfg, addr);
    }
    init_logging(&cfg)?;
    let threads = match cli.threads.unwrap_or(cfg.server.threads) {
        0 => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        n => n,
    };
    serve(cfg, threads).await
}

/// Starts the embedded simulated fleet and turns it into one pool.
async fn start_embedded(cfg: &mut Config) -> Result<kvgate_sim::Fleet> {
    let fleet = kvgate_sim::Fleet::start(cfg.sim.clone())
        .await
        .context("cannot start the embedded simulated fleet")?;
    let infos = fleet.instances();
    let tokenizer = match &cfg.sim.tokenizer_dir {
        Some(d) => d.display().to_string(),
        None => "builtin".to_string(),
    };
    let block_size = infos.first().map(|i| i.block_size);
    cfg.pools = vec![PoolConfig {
        model: cfg.sim.model.clone(),
        block_size,
        tokenizer: Some(tokenizer),
        chat_template: None,
        flavour: match cfg.sim.flavour {
            kvgate_sim::Flavour::Vllm => Flavour::Vllm,
            kvgate_sim::Flavour::Sglang => Flavour::Sglang,
        },
        instances: infos
            .iter()
            .map(|i| InstanceConfig {
                name: Some(i.name.clone()),
                url: i.url.clone(),
                kv_events: i.kv_events_endpoint.clone(),
                kv_replay: i.replay_endpoint.clone(),
                kv_topic: Some(cfg.sim.topic.clone()),
                capacity_blocks: Some(i.capacity_blocks),
            })
            .collect(),
        max_instances: None,
        discovery: Default::default(),
    }];
    cfg.validate()?;
    Ok(fleet)
}

async fn serve(mut cfg: Config, threads: usize) -> Result<()> {
    let fleet_kind = cfg.fleet_kind();
    let embedded = if cfg.pools.is_empty() {
        let fleet = start_embedded(&mut cfg).await?;
        tracing::warn!(
            engines = cfg.sim.engine_count(),
            fleet = %cfg.sim.describe(),
            "no [[pools]] configured: fronting an EMBEDDED SIMULATED FLEET (no real model); configure pools to serve real instances"
        );
        Some(fleet)
    } else {
        None
    };
    // Picker only (`server.listen` empty): no HTTP proxy listener.
    let listener = if cfg.server.has_proxy_listener() {
        Some(
            kvgate::proxy::limits::listen::bind(
                &cfg.server.listen,
                cfg.server.limits.listen_backlog,
            )
            .await
            .with_context(|| format!("cannot listen on {}", cfg.server.listen))?,
        )
    } else {
        None
    };
    let state = kvgate::app::AppState::new(cfg)?;
    kvgate::app::warn_open_surfaces(&state.config, fleet_kind, state.admin_token.is_set());
    let admin = kvgate::proxy::server::bind_admin(&state).await?;
    if let Some(a) = &admin {
        let tls = state.config.server.tls.as_ref().is_some_and(|t| t.admin);
        tracing::info!(
            listen = %a.local_addr()?,
            tls,
            "admin listener serving /admin/*, /metrics, /health and /ready"
        );
    }
    let listen = match &listener {
        Some(l) => l.local_addr()?.to_string(),
        None => "none (picker only)".to_string(),
    };
    tracing::info!(
        %listen,
        pools = state.fleet.pools().len(),
        instances = state.fleet.view().serving().count(),
        policy = state.routing.policy_name(0),
        "kvgate serving"
    );
    if let (Some(_), Some(listener)) = (&embedded, &listener) {
        let addr = listener.local_addr()?;
        let host = if addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            addr.ip().to_string()
        };
        println!(
            "\nkvgate is up in front of a simulated fleet. Try:\n\n  curl -s {scheme}://{host}:{port}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'\n",
            port = addr.port(),
            model = state.fleet.pools()[0].model,
            scheme = if state.config.server.tls.is_some() { "https" } else { "http" },
        );
    }
    // One signal stops both doors: the HTTP listener and, when enabled, the endpoint picker.
    let stop = tokio_util::sync::CancellationToken::new();
    let picker = if state.config.picker.enabled {
        let addr = &state.config.picker.listen;
        let l =
            kvgate::proxy::limits::listen::bind(addr, state.config.server.limits.listen_backlog)
                .await
                .with_context(|| format!("cannot listen on {addr} (picker.listen)"))?;
        tracing::info!(
            listen = %l.local_addr()?,
            failure_mode = ?state.config.picker.failure_mode,
            "endpoint picker (ext_proc) serving"
        );
        let s = stop.clone();
        Some(tokio::spawn(kvgate::picker::serve(
            l,
            state.clone(),
            async move { s.cancelled().await },
        )))
    } else {
        None
    };
    let s = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        s.cancel();
    });
    let stop_all = stop.clone();
    let served =
        kvgate::proxy::server::run_with_admin(listener, admin, state, threads, async move {
            stop.cancelled().await
        })
        .await;
    // The HTTP side stopped (a signal, or an error): the picker stops with it.
    stop_all.cancel();
    if let Some(p) = picker {
        match p.await {
            Ok(r) => r.context("endpoint picker")?,
            Err(e) => tracing::warn!("endpoint picker task failed: {e}"),
        }
    }
    served?;
    if let Some(f) = embedded {
        f.shutdown().await;
    }
    tracing::info!("kvgate stopped");
    Ok(())
}

//! [`ApiTarget`]: where the API server is and how to authenticate to it — an explicit
//! `api_server` with optional token and CA files, a kubeconfig file, or in-cluster config (the
//! service account).
//!
//! Which one, first match wins: `api_server`; the configured `kubeconfig`; the files of
//! `$KUBECONFIG`, merged as kubectl merges them; in-cluster (`KUBERNETES_SERVICE_HOST` set); `~/.kube/config` if it exists.
//! Explicit settings beat ambient ones, and a pod's service account beats a stray home
//! kubeconfig baked into an image.
//!
//! Invariants: a token file is read on every (re)connect, never cached, because bound service
//! account tokens rotate (the kubelet rewrites the file); the token file is bounded in size;
//! the namespace is always known before the source starts; `token_file` and `ca_file`, when
//! configured, override what a kubeconfig says.

use super::kubeconfig::{self, Secret};
use crate::config::DiscoveryConfig;
use crate::source::DiscoveryError;
use std::path::{Path, PathBuf};

/// In-cluster service account files.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Environment variable naming the in-cluster API server host.
pub const ENV_HOST: &str = "KUBERNETES_SERVICE_HOST";
/// Environment variable naming the in-cluster API server port.
pub const ENV_PORT: &str = "KUBERNETES_SERVICE_PORT";

/// The API server and credentials of one source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiTarget {
    /// `https://host:port`, no trailing slash.
    pub base: String,
    /// The bearer token's file, re-read on every request.
    pub token_file: Option<PathBuf>,
    /// A static bearer token (a kubeconfig user's `token`), used when there is no token file.
    pub token: Option<Secret<String>>,
    /// PEM of the CA to trust (none: the API server must be plain http, e.g. a test server).
    pub ca_pem: Option<Vec<u8>>,
    /// PEM of a client certificate chain and its key, for mutual TLS (a kubeconfig user's
    /// `client-certificate` + `client-key`).
    pub identity_pem: Option<Secret<Vec<u8>>>,
    /// The namespace watched.
    pub namespace: String,
}

fn unavailable(msg: impl Into<String>) -> DiscoveryError {
    DiscoveryError::Unavailable(msg.into())
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, DiscoveryError> {
    std::fs::read(path).map_err(|e| {
        unavailable(format!(
            "kubernetes: reading {what} {}: {e}",
            path.display()
        ))
    })
}

impl ApiTarget {
    /// The target for `cfg` (see the module docs for the order), with `env` the process
    /// environment in production and the service account files under `sa_dir`.
    pub fn resolve(
        cfg: &DiscoveryConfig,
        env: impl Fn(&str) -> Option<String>,
        sa_dir: &Path,
    ) -> Result<Self, DiscoveryError> {
        let configured_ns = cfg
            .namespace
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string);
        if let Some(base) = cfg.api_server.as_deref() {
            let namespace = configured_ns.ok_or(DiscoveryError::Config {
                key: "namespace",
                message: "required with api_server (there is no pod namespace to default to)"
                    .into(),
            })?;
            let ca_pem = match &cfg.ca_file {
                Some(p) => Some(read(p, "ca_file")?),
                None => None,
            };
            return Ok(Self {
                base: base.trim_end_matches('/').to_string(),
                token_file: cfg.token_file.clone(),
                token: None,
                ca_pem,
                identity_pem: None,
                namespace,
            });
        }
        let in_cluster = env(ENV_HOST).zip(env(ENV_PORT));
        let kubeconfig = cfg
            .kubeconfig
            .clone()
            .map(|p| vec![p])
            .or_else(|| kubeconfig::env_paths(&env))
            .or_else(|| {
                in_cluster
                    .is_none()
                    .then(|| kubeconfig::home_path(&env).map(|p| vec![p]))
                    .flatten()
            });
        if let Some(paths) = kubeconfig {
            return Self::from_kubeconfig(cfg, &paths, configured_ns);
        }
        let Some((host, port)) = in_cluster else {
            return Err(unavailable(format!(
                "kubernetes: not running in a cluster ({ENV_HOST}/{ENV_PORT} unset) and no \
                 kubeconfig (discovery.kubeconfig, ${}, ~/{}); set one, or discovery.api_server",
                kubeconfig::ENV_KUBECONFIG,
                kubeconfig::DEFAULT_PATH
            )));
        };
        // An IPv6 service host needs brackets in a URL.
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host
        };
        let namespace = match configured_ns {
            Some(n) => n,
            None => String::from_utf8_lossy(&read(&sa_dir.join("namespace"), "namespace file")?)
                .trim()
                .to_string(),
        };
        let ca_file = cfg.ca_file.clone().unwrap_or_else(|| sa_dir.join("ca.crt"));
        Ok(Self {
            base: format!("https://{host}:{port}"),
            token_file: Some(
                cfg.token_file
                    .clone()
                    .unwrap_or_else(|| sa_dir.join("token")),
            ),
            token: None,
            ca_pem: Some(read(&ca_file, "ca_file")?),
            identity_pem: None,
            namespace,
        })
    }

    /// The target a kubeconfig file's context names; the namespace is the configured one, else
    /// the context's, else `default` (as kubectl).
    fn from_kubeconfig(
        cfg: &DiscoveryConfig,
        paths: &[PathBuf],
        configured_ns: Option<String>,
    ) -> Result<Self, DiscoveryError> {
        let k = kubeconfig::load_merged(paths, cfg.context.as_deref())
            .map_err(|e| unavailable(format!("kubernetes: {e}")))?;
        let ca_pem = match &cfg.ca_file {
            Some(p) => Some(read(p, "ca_file")?),
            None => k.ca_pem,
        };
        let (token_file, token) = match &cfg.token_file {
            Some(p) => (Some(p.clone()), None),
            None => (k.token_file, k.token),
        };
        let files: Vec<_> = paths.iter().map(|p| p.display().to_string()).collect();
        tracing::info!(kubeconfig = %files.join(":"), server = %k.server, "kubernetes discovery: using a kubeconfig");
        Ok(Self {
            base: k.server,
            token_file,
            token,
            ca_pem,
            identity_pem: k.identity_pem,
            namespace: configured_ns
                .or(k.namespace)
                .unwrap_or_else(|| "default".to_string()),
        })
    }

    /// The bearer token now (re-read from its file), or the static token, if any.
    pub async fn token(&self, max_bytes: u64) -> Result<Option<String>, String> {
        let Some(path) = &self.token_file else {
            return Ok(self.token.as_ref().map(|t| t.0.clone()));
        };
        let len = tokio::fs::metadata(path)
            .await
            .map_err(|e| format!("kubernetes: token file {}: {e}", path.display()))?
            .len();
        if len > max_bytes {
            return Err(format!(
                "kubernetes: token file {} is {len} bytes, more than {max_bytes}",
                path.display()
            ));
        }
        let raw = tokio::fs::read_to_string(path)
            .await
            .map_err(|e| format!("kubernetes: token file {}: {e}", path.display()))?;
        Ok(Some(raw.trim().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(files: &[(&str, &str)]) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "kvgate-k8s-auth-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&d).unwrap();
        for (name, body) in files {
            std::fs::write(d.join(name), body).unwrap();
        }
        d
    }

    #[tokio::test]
    async fn in_cluster_reads_the_service_account_and_rereads_the_token() {
        let sa = dir(&[
            ("namespace", "inference\n"),
            ("ca.crt", "PEM"),
            ("token", "t1\n"),
        ]);
        let env = |k: &str| match k {
            ENV_HOST => Some("fd00::1".to_string()),
            ENV_PORT => Some("443".to_string()),
            _ => None,
        };
        let t = ApiTarget::resolve(&DiscoveryConfig::default(), env, &sa).unwrap();
        assert_eq!(t.base, "https://[fd00::1]:443");
        assert_eq!(t.namespace, "inference");
        assert_eq!(t.ca_pem.as_deref(), Some(&b"PEM"[..]));
        assert_eq!(t.token(1024).await.unwrap().as_deref(), Some("t1"));
        std::fs::write(sa.join("token"), "t2").unwrap();
        assert_eq!(
            t.token(1024).await.unwrap().as_deref(),
            Some("t2"),
            "rotated"
        );
        assert!(t.token(1).await.is_err(), "bounded");
        let _ = std::fs::remove_dir_all(sa);
    }

    #[test]
    fn out_of_cluster_needs_a_namespace_and_in_cluster_needs_the_env() {
        let none = |_: &str| None;
        let e = ApiTarget::resolve(&DiscoveryConfig::default(), none, Path::new("/nonexistent"))
            .unwrap_err();
        assert!(e.to_string().contains("api_server"), "{e}");
        let mut cfg = DiscoveryConfig {
            api_server: Some("http://127.0.0.1:1/".into()),
            ..DiscoveryConfig::default()
        };
        let e = ApiTarget::resolve(&cfg, none, Path::new("/nonexistent")).unwrap_err();
        assert!(e.to_string().contains("namespace"), "{e}");
        cfg.namespace = Some("ns".into());
        let t = ApiTarget::resolve(&cfg, none, Path::new("/nonexistent")).unwrap();
        assert_eq!(t.base, "http://127.0.0.1:1");
        assert_eq!(t.token_file, None);
    }

    #[test]
    fn kubeconfig_order_env_over_in_cluster_and_home_only_outside() {
        let kc = "current-context: d\nclusters:\n- name: c\n  cluster:\n    server: http://kc:1\n\
                  contexts:\n- name: d\n  context: {cluster: c, user: u, namespace: from-kc}\n\
                  users:\n- name: u\n  user: {tokenFile: tok}\n";
        let home = dir(&[]);
        std::fs::create_dir_all(home.join(".kube")).unwrap();
        std::fs::write(home.join(".kube/config"), kc).unwrap();
        let sa = dir(&[("namespace", "sa-ns"), ("ca.crt", "PEM"), ("token", "t")]);
        let home_s = home.to_string_lossy().into_owned();
        let kc_env = home.join(".kube/config").to_string_lossy().into_owned();
        let cfg = DiscoveryConfig::default();
        // Outside a cluster: ~/.kube/config, the context's namespace, paths beside the file.
        let outside = |k: &str| (k == "HOME").then(|| home_s.clone());
        let t = ApiTarget::resolve(&cfg, outside, &sa).unwrap();
        assert_eq!(
            (t.base.as_str(), t.namespace.as_str()),
            ("http://kc:1", "from-kc")
        );
        assert_eq!(t.token_file, Some(home.join(".kube/tok")));
        // In a cluster the home file is ignored ...
        let inside = |k: &str| match k {
            "HOME" => Some(home_s.clone()),
            ENV_HOST => Some("10.0.0.1".into()),
            ENV_PORT => Some("443".into()),
            _ => None,
        };
        let t = ApiTarget::resolve(&cfg, inside, &sa).unwrap();
        assert_eq!(
            (t.base.as_str(), t.namespace.as_str()),
            ("https://10.0.0.1:443", "sa-ns")
        );
        // ... but $KUBECONFIG, set on purpose, wins; a configured namespace wins over it.
        let with_env = |k: &str| match k {
            kubeconfig::ENV_KUBECONFIG => Some(kc_env.clone()),
            other => inside(other),
        };
        let cfg = DiscoveryConfig {
            namespace: Some("mine".into()),
            ..DiscoveryConfig::default()
        };
        let t = ApiTarget::resolve(&cfg, with_env, &sa).unwrap();
        assert_eq!(
            (t.base.as_str(), t.namespace.as_str()),
            ("http://kc:1", "mine")
        );
        let _ = std::fs::remove_dir_all(home);
        let _ = std::fs::remove_dir_all(sa);
    }
}

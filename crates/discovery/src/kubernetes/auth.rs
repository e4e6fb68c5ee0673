//! [`ApiTarget`]: where the API server is and how to authenticate to it — in-cluster config
//! (the service account) or an explicit `api_server` with optional token and CA files.
//!
//! Invariants: the token is read from its file on every (re)connect, never cached, because bound
//! service account tokens rotate (the kubelet rewrites the file); the token file is bounded in
//! size; the namespace is always known before the source starts.

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
    /// PEM of the CA to trust (none: the API server must be plain http, e.g. a test server).
    pub ca_pem: Option<Vec<u8>>,
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
    /// The target for `cfg`: `api_server` when set, else in-cluster from `env` (the process
    /// environment in production) and the service account files under `sa_dir`.
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
                ca_pem,
                namespace,
            });
        }
        let (Some(host), Some(port)) = (env(ENV_HOST), env(ENV_PORT)) else {
            return Err(unavailable(format!(
                "kubernetes: not running in a cluster ({ENV_HOST}/{ENV_PORT} unset); set \
                 discovery.api_server (kubeconfig files are not read)"
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
            ca_pem: Some(read(&ca_file, "ca_file")?),
            namespace,
        })
    }

    /// The bearer token now (re-read from its file), if there is a token file.
    pub async fn token(&self, max_bytes: u64) -> Result<Option<String>, String> {
        let Some(path) = &self.token_file else {
            return Ok(None);
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
}

//! `[server.tls]`: TLS on the public listener.
//!
//! Invariants:
//! - `[server.tls]` absent means plain HTTP; present, `cert_file` and `key_file` are required.
//! - `client_auth` is meaningful only with `client_ca_file`, and `client_ca_file` only with a
//!   `client_auth` that verifies (both are checked together, the error naming the key).
//! - `admin` is meaningful only with `server.admin_listen` (checked by the server section).

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};

/// Whether clients must present a certificate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// No client certificate is asked for.
    #[default]
    None,
    /// A certificate is asked for and verified when sent; clients without one are served.
    Optional,
    /// A certificate signed by `client_ca_file` is required; the handshake fails without one.
    Required,
}

/// `[server.tls]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerTlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert_file: String,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the leaf certificate.
    pub key_file: String,
    /// PEM CA certificates that client certificates must chain to.
    pub client_ca_file: Option<String>,
    /// `none`, `optional` or `required` (the latter two need `client_ca_file`).
    pub client_auth: ClientAuth,
    /// How often `cert_file` and `key_file` are checked for a new pair (mtime, then content).
    pub reload_interval_ms: u64,
    /// Longest a TLS handshake may take, from accept; the connection is closed beyond it.
    pub handshake_timeout_ms: u64,
    /// Serve the admin listener (`server.admin_listen`) with TLS too: the same pair and client
    /// authentication. Off, it is plain HTTP (it listens on loopback by default).
    pub admin: bool,
}

impl Default for ServerTlsConfig {
    fn default() -> Self {
        Self {
            cert_file: String::new(),
            key_file: String::new(),
            client_ca_file: None,
            client_auth: ClientAuth::None,
            reload_interval_ms: 10_000,
            handshake_timeout_ms: 10_000,
            admin: false,
        }
    }
}

impl ServerTlsConfig {
    /// Checks every value; the error names the offending key.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.cert_file.is_empty() {
            return Err(invalid(
                "server.tls.cert_file",
                "required with [server.tls]",
            ));
        }
        if self.key_file.is_empty() {
            return Err(invalid("server.tls.key_file", "required with [server.tls]"));
        }
        match (&self.client_ca_file, self.client_auth) {
            (None, ClientAuth::Optional | ClientAuth::Required) => {
                return Err(invalid(
                    "server.tls.client_ca_file",
                    "required when client_auth is optional or required",
                ))
            }
            (Some(_), ClientAuth::None) => {
                return Err(invalid(
                    "server.tls.client_auth",
                    "must be `optional` or `required` when client_ca_file is set",
                ))
            }
            _ => {}
        }
        for (key, v) in [
            ("reload_interval_ms", self.reload_interval_ms),
            ("handshake_timeout_ms", self.handshake_timeout_ms),
        ] {
            if v == 0 || v > 3_600_000 {
                return Err(invalid(
                    format!("server.tls.{key}"),
                    "must be between 1 and 3600000",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn server(extra: &str) -> String {
        format!("[server.tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n{extra}")
    }

    #[test]
    fn server_tls_parses_with_defaults() {
        let c = Config::from_toml_str(&server(""), "t").unwrap();
        let tls = c.server.tls.clone().unwrap();
        assert_eq!(tls.cert_file, "c.pem");
        assert_eq!(tls.client_auth, ClientAuth::None);
        assert_eq!(
            tls.reload_interval_ms,
            ServerTlsConfig::default().reload_interval_ms
        );
        c.validate().unwrap();
    }

    #[test]
    fn each_bad_server_tls_value_names_its_key() {
        let cases = [
            (
                "server.tls.cert_file",
                "[server.tls]\nkey_file = \"k\"\n".to_string(),
            ),
            (
                "server.tls.key_file",
                "[server.tls]\ncert_file = \"c\"\n".to_string(),
            ),
            (
                "server.tls.client_ca_file",
                server("client_auth = \"required\"\n"),
            ),
            (
                "server.tls.client_auth",
                server("client_ca_file = \"ca.pem\"\n"),
            ),
            (
                "server.tls.reload_interval_ms",
                server("reload_interval_ms = 0\n"),
            ),
            (
                "server.tls.handshake_timeout_ms",
                server("handshake_timeout_ms = 0\n"),
            ),
        ];
        for (key, text) in cases {
            let c = Config::from_toml_str(&text, "t").unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(key), "{key}: {e}");
        }
        let e = Config::from_toml_str(&server("client_auth = \"sometimes\"\n"), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("client_auth"), "{e}");
    }
}

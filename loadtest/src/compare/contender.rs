//! Contenders of a comparison: kvgate with a policy (in-process), or an external router started
//! from a command template.
//!
//! Template placeholders: `{python}` (the peers' venv interpreter), `{bindir}` (its `bin/`),
//! `{port}` and `{metrics_port}` (free 127.0.0.1 ports), `{workers}` (space-separated worker
//! URLs), `{workers_comma}` (comma-separated), `{model}`. Unknown placeholders are left as is so
//! a typo shows up in the router's own error output.

use std::path::{Path, PathBuf};

use kvgate_core::policy::PolicyName;
use serde::Serialize;

/// Default location of the peers' virtualenv (made by `loadtest/peers/install.sh`).
pub const DEFAULT_PEERS_VENV: &str = ".cache/kvgate-peers/venv";

/// One configuration under test.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ContenderSpec {
    /// kvgate's gateway, in-process, with a routing policy.
    Kvgate {
        /// Display name.
        name: String,
        /// Routing policy.
        policy: PolicyName,
        /// Policy parameter overrides (`KEY=VALUE`, keys as in `offline --set`), applied to the
        /// base config's policy section: two variants of one policy can run in one comparison.
        /// Keys under `gossip.` set the replicas' gossip section instead, keys under `routing.` the
        /// `[routing]` section.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        overrides: Vec<String>,
        /// Gateway replicas sharing placements and load by gossip, each request sent to one of
        /// them (as through a Kubernetes Service); 1 = one gateway.
        replicas: u32,
    },
    /// An external router process.
    External {
        /// Display name.
        name: String,
        /// Command template (run by `sh -c` after substitution).
        command: String,
        /// Command template printing the router's version.
        version_command: Option<String>,
    },
    /// An already running endpoint (plain `replay`; not startable by a comparison).
    Endpoint {
        /// Display name.
        name: String,
        /// Base URL.
        url: String,
    },
}

impl ContenderSpec {
    /// Display name.
    pub fn name(&self) -> &str {
        match self {
            ContenderSpec::Kvgate { name, .. }
            | ContenderSpec::External { name, .. }
            | ContenderSpec::Endpoint { name, .. } => name,
        }
    }

    /// A kvgate contender named after its policy (`kvgate` for the default policy).
    pub fn kvgate(policy: PolicyName) -> Self {
        let name = match policy {
            PolicyName::Kvgate => "kvgate".to_string(),
            p => format!("kvgate:{p}"),
        };
        ContenderSpec::Kvgate {
            name,
            policy,
            overrides: Vec::new(),
            replicas: 1,
        }
    }

    /// Most gateway replicas one contender may run (`kvgate*N`).
    pub const MAX_REPLICAS: u32 = 16;

    /// Built-in external routers, by the names [`ContenderSpec::parse`] accepts.
    pub const PRESETS: [&'static str; 3] = ["smg", "sglang-router", "vllm-router"];

    /// Known external routers by short name: `smg`, `sglang-router`, `vllm-router`.
    ///
    /// All bind 127.0.0.1 only (their listeners and metrics default to 0.0.0.0) and use their
    /// cache-aware policy; everything else stays at the router's defaults.
    pub fn preset(name: &str) -> Option<Self> {
        let (command, version) = match name {
            // `{python} -m smg`, not `{bindir}/smg`: sglang-router 0.3.2 installs a `smg` script
            // of its own (an alias of its CLI) into the same venv, so which program `bin/smg`
            // runs depends on install order. `--log-level warn`: at its default, info, smg logs
            // every request, which costs it throughput under load. `--disable-tokenizer-autoload`:
            // over HTTP its cache-aware tree matches characters, so it needs no tokenizer, and
            // with the flag it never looks one up on a model hub (the fleet is offline).
            "smg" => (
                "{python} -m smg launch --host 127.0.0.1 --port {port} \
                 --prometheus-host 127.0.0.1 --prometheus-port {metrics_port} \
                 --log-level warn --policy cache_aware --disable-tokenizer-autoload \
                 --worker-urls {workers}",
                // The wheel's metadata; `smg --version` would print the binary's own
                // "smg 1.13.0", which would show as "smg smg 1.13.0" beside the name.
                "{python} -m pip show smg",
            ),
            "sglang-router" => (
                "{python} -m sglang_router.launch_router --host 127.0.0.1 --port {port} \
                 --prometheus-host 127.0.0.1 --prometheus-port {metrics_port} \
                 --policy cache_aware --worker-urls {workers}",
                "{python} -m pip show sglang-router",
            ),
            "vllm-router" => (
                "{bindir}/vllm-router --host 127.0.0.1 --port {port} \
                 --prometheus-host 127.0.0.1 --prometheus-port {metrics_port} \
                 --policy cache_aware --worker-urls {workers}",
                "{python} -m pip show vllm-router",
            ),
            _ => return None,
        };
        Some(ContenderSpec::External {
            name: name.to_string(),
            command: command.to_string(),
            version_command: Some(version.to_string()),
        })
    }

    /// Parses a CLI contender: a kvgate policy name (`kvgate`, `round_robin`, ...), optionally
    /// with policy overrides in brackets (`kvgate[kvgate.objective=e2e;kvgate.decode_weight=0.5]`,
    /// or gossip settings of replicas: `kvgate[gossip.push_on_change=true]*8`,
    /// shown under that whole name), a preset (`smg`, `sglang-router`, `vllm-router`), or
    /// `NAME=COMMAND TEMPLATE`.
    pub fn parse(s: &str) -> Result<Self, String> {
        if let Some((head, count)) = s.rsplit_once('*') {
            // `NAME=COMMAND` templates may contain `*`; a policy name (before any brackets) has
            // neither `=` nor spaces.
            let policy_part = head.split_once('[').map_or(head, |(p, _)| p);
            let is_policy = !policy_part.contains('=') && !policy_part.contains(' ');
            if is_policy && !count.is_empty() && count.bytes().all(|b| b.is_ascii_digit()) {
                let n: u32 = count
                    .parse()
                    .ok()
                    .filter(|n| (1..=Self::MAX_REPLICAS).contains(n))
                    .ok_or_else(|| {
                        format!(
                            "contender {s:?}: replicas must be 1 to {}",
                            Self::MAX_REPLICAS
                        )
                    })?;
                return match Self::parse(head)? {
                    ContenderSpec::Kvgate {
                        policy, overrides, ..
                    } => Ok(ContenderSpec::Kvgate {
                        name: s.to_string(),
                        policy,
                        overrides,
                        replicas: n,
                    }),
                    _ => Err(format!(
                        "contender {s:?}: replicas (*N) apply to kvgate policies only"
                    )),
                };
            }
        }
        if let Some((head, rest)) = s.split_once('[') {
            if let Some(inner) = rest.strip_suffix(']') {
                if !head.contains('=') && !head.contains(' ') {
                    let overrides: Vec<String> = inner
                        .split(';')
                        .map(str::trim)
                        .filter(|o| !o.is_empty())
                        .map(str::to_string)
                        .collect();
                    if overrides.is_empty() || overrides.iter().any(|o| !o.contains('=')) {
                        return Err(format!(
                            "contender {s:?}: expected POLICY[KEY=VALUE;KEY=VALUE...]"
                        ));
                    }
                    let policy = match Self::parse(head)? {
                        ContenderSpec::Kvgate { policy, .. } => policy,
                        _ => {
                            return Err(format!(
                                "contender {s:?}: overrides apply to kvgate policies only"
                            ))
                        }
                    };
                    return Ok(ContenderSpec::Kvgate {
                        name: s.to_string(),
                        policy,
                        overrides,
                        replicas: 1,
                    });
                }
            }
        }
        if let Some((name, command)) = s.split_once('=') {
            let name = name.trim();
            if name.is_empty() || command.trim().is_empty() {
                return Err(format!("contender {s:?}: expected NAME=COMMAND"));
            }
            return Ok(ContenderSpec::External {
                name: name.to_string(),
                command: command.trim().to_string(),
                version_command: None,
            });
        }
        if let Some(p) = Self::preset(s) {
            return Ok(p);
        }
        let policy = PolicyName::ALL
            .into_iter()
            .find(|p| p.as_str() == s.trim_start_matches("kvgate:"))
            .ok_or_else(|| {
                let known: Vec<&str> = PolicyName::ALL.iter().map(|p| p.as_str()).collect();
                format!(
                    "unknown contender {s:?}: expected a kvgate policy ({}), an external router \
                     ({}), or NAME=COMMAND",
                    known.join(", "),
                    Self::PRESETS.join(", ")
                )
            })?;
        Ok(Self::kvgate(policy))
    }
}

/// Values substituted into command templates.
#[derive(Debug, Clone)]
pub struct TemplateVars {
    /// Python interpreter of the peers' venv.
    pub python: PathBuf,
    /// Router port.
    pub port: u16,
    /// Router metrics port.
    pub metrics_port: u16,
    /// Worker base URLs.
    pub workers: Vec<String>,
    /// Model name.
    pub model: String,
}

impl TemplateVars {
    /// Substitutes the placeholders in `template`.
    pub fn apply(&self, template: &str) -> String {
        let bindir = self
            .python
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        template
            .replace("{python}", &self.python.to_string_lossy())
            .replace("{bindir}", &bindir.to_string_lossy())
            .replace("{port}", &self.port.to_string())
            .replace("{metrics_port}", &self.metrics_port.to_string())
            .replace("{workers_comma}", &self.workers.join(","))
            .replace("{workers}", &self.workers.join(" "))
            .replace("{model}", &self.model)
    }
}

/// The peers' venv interpreter: `$HOME/.cache/kvgate-peers/venv/bin/python`.
pub fn default_python() -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(DEFAULT_PEERS_VENV).join("bin").join("python")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_contenders() {
        assert_eq!(
            ContenderSpec::parse("kvgate").unwrap(),
            ContenderSpec::kvgate(PolicyName::Kvgate)
        );
        assert_eq!(
            ContenderSpec::parse("round_robin").unwrap().name(),
            "kvgate:round_robin"
        );
        assert!(matches!(
            ContenderSpec::parse("sglang-router").unwrap(),
            ContenderSpec::External { .. }
        ));
        let v =
            ContenderSpec::parse("kvgate[kvgate.objective=e2e; kvgate.decode_weight=0.5]").unwrap();
        assert_eq!(
            v,
            ContenderSpec::Kvgate {
                name: "kvgate[kvgate.objective=e2e; kvgate.decode_weight=0.5]".into(),
                policy: PolicyName::Kvgate,
                overrides: vec![
                    "kvgate.objective=e2e".into(),
                    "kvgate.decode_weight=0.5".into()
                ],
                replicas: 1,
            }
        );
        let r = ContenderSpec::parse("kvgate[kvgate.objective=e2e]*8").unwrap();
        assert_eq!(
            r,
            ContenderSpec::Kvgate {
                name: "kvgate[kvgate.objective=e2e]*8".into(),
                policy: PolicyName::Kvgate,
                overrides: vec!["kvgate.objective=e2e".into()],
                replicas: 8,
            }
        );
        assert!(matches!(
            ContenderSpec::parse("round_robin*4").unwrap(),
            ContenderSpec::Kvgate { replicas: 4, .. }
        ));
        assert!(ContenderSpec::parse("kvgate*0").is_err());
        assert!(ContenderSpec::parse("kvgate*17").is_err());
        assert!(ContenderSpec::parse("smg*2").is_err());
        assert!(ContenderSpec::parse("kvgate*x").is_err());
        assert!(matches!(
            ContenderSpec::parse("mine=./r --glob a*2").unwrap(),
            ContenderSpec::External { .. }
        ));
        assert!(ContenderSpec::parse("kvgate[]").is_err());
        assert!(ContenderSpec::parse("kvgate[objective]").is_err());
        assert!(ContenderSpec::parse("smg[kvgate.objective=e2e]").is_err());
        let c = ContenderSpec::parse("mine=./r --port {port}").unwrap();
        assert_eq!(c.name(), "mine");
        let err = ContenderSpec::parse("nope").unwrap_err();
        assert!(err.contains("round_robin"), "{err}");
        for name in ContenderSpec::PRESETS {
            assert!(err.contains(name), "{err}");
        }
        assert!(ContenderSpec::parse("=x").is_err());
    }

    #[test]
    fn every_preset_is_a_pinned_loopback_router() {
        for name in ContenderSpec::PRESETS {
            let Ok(ContenderSpec::External {
                name: n,
                command,
                version_command,
            }) = ContenderSpec::parse(name)
            else {
                panic!("{name} is not an external preset");
            };
            assert_eq!(n, name);
            assert!(
                command.contains("--host 127.0.0.1 --port {port}"),
                "{command}"
            );
            assert!(command.contains("--prometheus-host 127.0.0.1"), "{command}");
            assert!(command.contains("--policy cache_aware"), "{command}");
            assert!(command.ends_with("--worker-urls {workers}"), "{command}");
            assert!(
                version_command
                    .as_deref()
                    .is_some_and(|v| v.ends_with(&format!("pip show {name}"))),
                "{version_command:?}"
            );
        }
        assert_eq!(ContenderSpec::preset("kvgate"), None);
    }

    #[test]
    fn smg_runs_its_own_module_quietly_and_offline() {
        let Some(ContenderSpec::External { command, .. }) = ContenderSpec::preset("smg") else {
            panic!("no smg preset");
        };
        assert!(command.starts_with("{python} -m smg launch "), "{command}");
        assert!(command.contains("--log-level warn"), "{command}");
        assert!(
            command.contains("--disable-tokenizer-autoload"),
            "{command}"
        );
    }

    #[test]
    fn substitutes_placeholders() {
        let v = TemplateVars {
            python: PathBuf::from("/v/bin/python"),
            port: 10,
            metrics_port: 11,
            workers: vec!["http://a:1".into(), "http://b:2".into()],
            model: "m".into(),
        };
        assert_eq!(
            v.apply("{python} {bindir}/x --port {port} -m {metrics_port} {workers} {workers_comma} {model} {other}"),
            "/v/bin/python /v/bin/x --port 10 -m 11 http://a:1 http://b:2 http://a:1,http://b:2 m {other}"
        );
    }
}

//! Every `kvgate.toml` under `deploy/` (the files the Kubernetes manifests turn into the
//! `kvgate-config` ConfigMap) is a valid kvgate config: every key known, every value valid.
//!
//! Each file is checked as the pod sees it: with the environment the base Deployment sets
//! (`KVGATE_GOSSIP_ADVERTISE` from the pod IP, the gossip secret from the `kvgate-gossip`
//! Secret); then parsed and validated as the gateway's [`Config`], `[pools.discovery]` included.

use kvgate::config::Config;
use std::path::{Path, PathBuf};

/// What the Deployment's `KVGATE_GOSSIP_ADVERTISE` (`$(POD_IP):7946`) expands to.
const ADVERTISE: &str = "10.0.0.1:7946";
/// A gossip secret of the length the docs' `openssl rand -base64 32` gives.
const SECRET: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// Checks one deploy config file's text as the gateway reads it; the error names the problem.
fn check(text: &str, origin: &str) -> Result<(), String> {
    let mut cfg = Config::from_toml_str(text, origin).map_err(|e| e.to_string())?;
    cfg.apply_env(|k| match k {
        kvgate_gossip::ENV_SECRET => Some(SECRET.to_string()),
        kvgate::config::env::GOSSIP_ADVERTISE => Some(ADVERTISE.to_string()),
        _ => None,
    })
    .map_err(|e| e.to_string())?;
    cfg.validate().map_err(|e| format!("{origin}: {e}"))?;
    if cfg.pools.is_empty() {
        return Err(format!(
            "{origin}: no pool (kvgate would start its simulated fleet)"
        ));
    }
    Ok(())
}

fn deploy_configs(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            deploy_configs(&path, out);
        } else if path.file_name().is_some_and(|n| n == "kvgate.toml") {
            out.push(path);
        }
    }
}

#[test]
fn every_deploy_config_is_valid() {
    let mut files = Vec::new();
    deploy_configs(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy"),
        &mut files,
    );
    files.sort();
    // The base and the example-vllm overlay at least.
    assert!(files.len() >= 2, "{files:?}");
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        if let Err(e) = check(&text, &f.display().to_string()) {
            panic!("{e}");
        }
    }
}

#[test]
fn mistakes_in_a_deploy_config_are_caught() {
    let good = "[gossip]\nenabled = true\nbind = \"0.0.0.0:7946\"\n\
                [[pools]]\nmodel = \"m\"\n[pools.discovery]\nsource = \"kubernetes\"\nservice = \"vllm\"\nport = 8000\n";
    check(good, "good").unwrap();
    for (bad, expect) in [
        (good.replace("service =", "servcie ="), "servcie"),
        (
            good.replace("service =", "selector = \"app=x\"\nservice ="),
            "exactly one",
        ),
        (good.replace("\"kubernetes\"", "\"k8s\""), "k8s"),
        (
            good.replace("model = \"m\"", "model = \"m\"\nblock_size = 0"),
            "block_size",
        ),
        (
            good.replace("[gossip]", "[gossip]\nflush_interval = 1"),
            "flush_interval",
        ),
        (
            good.replace("[gossip]", "[server]\nlisten = \"nowhere\"\n[gossip]"),
            "server.listen",
        ),
        (
            format!("{good}[[pools]]\nmodel = \"m\"\ninstances = [{{ url = \"http://h:1\" }}]\n"),
            "twice",
        ),
    ] {
        let e = check(&bad, "bad").unwrap_err();
        assert!(e.contains(expect), "expected `{expect}` in: {e}");
    }
}

//! Reading a kubeconfig file into what [`super::auth::ApiTarget`] needs: the chosen context's
//! cluster (`server`, CA) and user (token, token file, client certificate and key) and
//! namespace.
//!
//! The common subset only. Invariants:
//! - The file is bounded in size ([`MAX_KUBECONFIG_BYTES`]) before it is parsed.
//! - TLS verification is never turned off: a cluster with `insecure-skip-tls-verify: true` is
//!   an error, not a warning.
//! - Users that authenticate through a program or plugin (`exec`, `auth-provider`) or with a
//!   password are errors naming the user and the field; nothing is silently ignored that would
//!   leave the request unauthenticated.
//! - Relative file paths are relative to the kubeconfig's own directory, as kubectl reads them.
//! - Several files (`$KUBECONFIG` lists them, `:`-separated) merge as kubectl merges them: the
//!   first file that sets `current-context` names it, and the first file that defines a context,
//!   cluster or user by a name defines it (later ones with the same name are ignored); a listed
//!   file that does not exist is skipped, one that cannot be read or parsed is an error. At most
//!   [`MAX_KUBECONFIG_FILES`] are read.
//! - Secrets (tokens, keys) never appear in errors or `Debug` output.

use base64::Engine as _;
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Largest kubeconfig read.
pub const MAX_KUBECONFIG_BYTES: u64 = 1 << 20;
/// Most kubeconfig files merged.
pub const MAX_KUBECONFIG_FILES: usize = 64;
/// Environment variable listing kubeconfig files (`:`-separated, merged).
pub const ENV_KUBECONFIG: &str = "KUBECONFIG";
/// The default kubeconfig, under `$HOME`.
pub const DEFAULT_PATH: &str = ".kube/config";

/// Why a kubeconfig could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kubeconfig {path}: {message}")]
pub struct KubeconfigError {
    /// The file.
    pub path: String,
    /// What is wrong, naming the context, cluster or user.
    pub message: String,
}

/// A value that must not be printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret<T>(pub T);

impl<T> std::fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// What the chosen context resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The cluster's `server`, no trailing slash.
    pub server: String,
    /// PEM of the cluster's CA, if it names one (else the system has none: the server must be
    /// plain http).
    pub ca_pem: Option<Vec<u8>>,
    /// A static bearer token (`token`).
    pub token: Option<Secret<String>>,
    /// A bearer token file (`tokenFile`), re-read on every request.
    pub token_file: Option<PathBuf>,
    /// Client certificate chain and key, PEM, concatenated (`client-certificate(-data)` +
    /// `client-key(-data)`).
    pub identity_pem: Option<Secret<Vec<u8>>>,
    /// The context's namespace.
    pub namespace: Option<String>,
}

#[derive(Deserialize)]
struct File {
    #[serde(rename = "current-context", default)]
    current_context: Option<String>,
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    contexts: Vec<Named<Context>>,
    #[serde(default)]
    users: Vec<NamedUser>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "context")]
    value: T,
}

#[derive(Deserialize)]
struct NamedUser {
    name: String,
    user: User,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Cluster {
    server: String,
    #[serde(default)]
    certificate_authority: Option<PathBuf>,
    #[serde(default)]
    certificate_authority_data: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
}

#[derive(Deserialize)]
struct Context {
    cluster: String,
    user: String,
    #[serde(default)]
    namespace: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct User {
    #[serde(default)]
    token: Option<String>,
    #[serde(rename = "tokenFile", default)]
    token_file: Option<PathBuf>,
    #[serde(default)]
    client_certificate: Option<PathBuf>,
    #[serde(default)]
    client_certificate_data: Option<String>,
    #[serde(default)]
    client_key: Option<PathBuf>,
    #[serde(default)]
    client_key_data: Option<String>,
    #[serde(default)]
    exec: Option<IgnoredAny>,
    #[serde(default)]
    auth_provider: Option<IgnoredAny>,
    #[serde(default)]
    username: Option<IgnoredAny>,
    #[serde(default)]
    password: Option<IgnoredAny>,
}

/// The files `$KUBECONFIG` lists (empty entries and repeats dropped), if any.
pub fn env_paths(env: &impl Fn(&str) -> Option<String>) -> Option<Vec<PathBuf>> {
    let mut paths: Vec<PathBuf> = Vec::new();
    for p in env(ENV_KUBECONFIG)?.split(':').map(str::trim) {
        let p = PathBuf::from(p);
        if !p.as_os_str().is_empty() && !paths.contains(&p) {
            paths.push(p);
        }
    }
    (!paths.is_empty()).then_some(paths)
}

/// `$HOME/.kube/config`, if it exists.
pub fn home_path(env: &impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let home = PathBuf::from(env("HOME")?).join(DEFAULT_PATH);
    home.is_file().then_some(home)
}

/// Reads `path` and resolves `context` (default the file's `current-context`).
pub fn load(path: &Path, context: Option<&str>) -> Result<Resolved, KubeconfigError> {
    load_merged(&[path.to_path_buf()], context)
}

/// Reads `paths` (those that exist), merges them as kubectl does and resolves `context`
/// (default the first `current-context` set). The error names the file at fault, or the list.
pub fn load_merged(paths: &[PathBuf], context: Option<&str>) -> Result<Resolved, KubeconfigError> {
    let list = paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let mut files = Vec::new();
    for path in paths.iter().take(MAX_KUBECONFIG_FILES) {
        let err = |message: String| KubeconfigError {
            path: path.display().to_string(),
            message,
        };
        let len = match std::fs::metadata(path) {
            Ok(m) => m.len(),
            // A single file must exist; of a list, kubectl skips the missing ones.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && paths.len() > 1 => continue,
            Err(e) => return Err(err(e.to_string())),
        };
        if len > MAX_KUBECONFIG_BYTES {
            return Err(err(format!(
                "{len} bytes, more than {MAX_KUBECONFIG_BYTES}"
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let file: File =
            serde_saphyr::from_str(&text).map_err(|e| err(format!("not a kubeconfig: {e}")))?;
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        files.push((file, dir));
    }
    if files.is_empty() {
        return Err(KubeconfigError {
            path: list,
            message: "none of these files exists".into(),
        });
    }
    resolve_files(&files, context).map_err(|message| KubeconfigError {
        path: list,
        message,
    })
}

/// Resolves `context` in the kubeconfig `text` whose relative paths start at `dir`.
pub fn resolve(text: &str, dir: &Path, context: Option<&str>) -> Result<Resolved, String> {
    let file: File = serde_saphyr::from_str(text).map_err(|e| format!("not a kubeconfig: {e}"))?;
    resolve_files(&[(file, dir.to_path_buf())], context)
}

/// Resolves `context` over `files` merged in order, each with the directory its relative paths
/// start at.
fn resolve_files(files: &[(File, PathBuf)], context: Option<&str>) -> Result<Resolved, String> {
    let current = files
        .iter()
        .find_map(|(f, _)| f.current_context.as_deref().filter(|c| !c.is_empty()));
    let name = match context.or(current) {
        Some(n) if !n.is_empty() => n,
        _ => return Err("no current-context, and no discovery.context configured".into()),
    };
    let ctx = &files
        .iter()
        .find_map(|(f, _)| f.contexts.iter().find(|c| c.name == name))
        .ok_or_else(|| format!("context {name:?} not found"))?
        .value;
    let (cluster, cluster_dir) = files
        .iter()
        .find_map(|(f, d)| {
            f.clusters
                .iter()
                .find(|c| c.name == ctx.cluster)
                .map(|c| (&c.value, d.as_path()))
        })
        .ok_or_else(|| format!("cluster {:?} of context {name:?} not found", ctx.cluster))?;
    let (user, dir) = files
        .iter()
        .find_map(|(f, d)| {
            f.users
                .iter()
                .find(|u| u.name == ctx.user)
                .map(|u| (&u.user, d.as_path()))
        })
        .ok_or_else(|| format!("user {:?} of context {name:?} not found", ctx.user))?;
    let cname = &ctx.cluster;
    if cluster.insecure_skip_tls_verify {
        return Err(format!(
            "cluster {cname:?} sets insecure-skip-tls-verify; kvgate does not turn off TLS \
             verification: give certificate-authority or certificate-authority-data"
        ));
    }
    let ca_pem = file_or_data(
        cluster_dir,
        cluster.certificate_authority.as_deref(),
        cluster.certificate_authority_data.as_deref(),
        &format!("cluster {cname:?} certificate-authority"),
    )?;
    let uname = &ctx.user;
    for (field, set) in [
        ("exec", user.exec.is_some()),
        ("auth-provider", user.auth_provider.is_some()),
        (
            "username/password",
            user.username.is_some() || user.password.is_some(),
        ),
    ] {
        if set {
            return Err(format!(
                "user {uname:?} authenticates with {field}, which kvgate does not support; \
                 use a token, tokenFile or client certificate (for example a service account \
                 token)"
            ));
        }
    }
    let cert = file_or_data(
        dir,
        user.client_certificate.as_deref(),
        user.client_certificate_data.as_deref(),
        &format!("user {uname:?} client-certificate"),
    )?;
    let key = file_or_data(
        dir,
        user.client_key.as_deref(),
        user.client_key_data.as_deref(),
        &format!("user {uname:?} client-key"),
    )?;
    let identity_pem = match (cert, key) {
        (Some(mut c), Some(k)) => {
            c.push(b'\n');
            c.extend_from_slice(&k);
            Some(Secret(c))
        }
        (None, None) => None,
        _ => {
            return Err(format!(
                "user {uname:?} has a client certificate or key without the other"
            ))
        }
    };
    let token = user
        .token
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| Secret(t.to_string()));
    Ok(Resolved {
        server: cluster.server.trim_end_matches('/').to_string(),
        ca_pem,
        // A static token wins over a token file, as in kubectl.
        token_file: if token.is_some() {
            None
        } else {
            user.token_file.as_deref().map(|p| dir.join(p))
        },
        token,
        identity_pem,
        namespace: ctx.namespace.clone().filter(|n| !n.is_empty()),
    })
}

/// The bytes of a `field` given as a file path (relative to `dir`) or inline base64 `data`
/// (which wins, as in kubectl).
fn file_or_data(
    dir: &Path,
    file: Option<&Path>,
    data: Option<&str>,
    field: &str,
) -> Result<Option<Vec<u8>>, String> {
    if let Some(d) = data {
        let clean: String = d.split_whitespace().collect();
        return base64::engine::general_purpose::STANDARD
            .decode(clean)
            .map(Some)
            .map_err(|e| format!("{field}-data is not base64: {e}"));
    }
    let Some(f) = file else { return Ok(None) };
    let p = dir.join(f);
    std::fs::read(&p)
        .map(Some)
        .map_err(|e| format!("{field} {}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn config(user: &str, cluster_extra: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: dev\npreferences: {{}}\n\
             clusters:\n- name: c1\n  cluster:\n    server: https://127.0.0.1:6443/\n    \
             certificate-authority-data: {}\n{cluster_extra}\
             contexts:\n- name: dev\n  context:\n    cluster: c1\n    user: u1\n    namespace: inference\n\
             - name: other\n  context:\n    cluster: c1\n    user: u1\n\
             users:\n- name: u1\n  user:\n{user}",
            b64("CA PEM")
        )
    }

    #[test]
    fn a_token_user_in_the_current_context() {
        let r = resolve(&config("    token: abc\n", ""), Path::new("/k"), None).unwrap();
        assert_eq!(r.server, "https://127.0.0.1:6443");
        assert_eq!(r.ca_pem.as_deref(), Some(&b"CA PEM"[..]));
        assert_eq!(r.token, Some(Secret("abc".into())));
        assert_eq!(r.namespace.as_deref(), Some("inference"));
        assert!(!format!("{r:?}").contains("abc"), "the token is redacted");
        let other = resolve(
            &config("    token: abc\n", ""),
            Path::new("/k"),
            Some("other"),
        );
        assert_eq!(other.unwrap().namespace, None);
    }

    #[test]
    fn token_files_and_client_certs_are_relative_to_the_kubeconfig() {
        let r = resolve(&config("    tokenFile: tok\n", ""), Path::new("/k"), None).unwrap();
        assert_eq!(r.token_file, Some(PathBuf::from("/k/tok")));
        let user = format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64("CERT"),
            b64("KEY")
        );
        let r = resolve(&config(&user, ""), Path::new("/k"), None).unwrap();
        assert_eq!(r.identity_pem, Some(Secret(b"CERT\nKEY".to_vec())));
        let half = format!("    client-certificate-data: {}\n", b64("CERT"));
        let e = resolve(&config(&half, ""), Path::new("/k"), None).unwrap_err();
        assert!(e.contains("without the other"), "{e}");
        let missing = "    client-certificate: c.crt\n    client-key: c.key\n";
        let e = resolve(&config(missing, ""), Path::new("/nonexistent"), None).unwrap_err();
        assert!(e.contains("/nonexistent/c.crt"), "{e}");
    }

    #[test]
    fn missing_contexts_clusters_and_users_are_named() {
        let e = resolve(&config("    token: t\n", ""), Path::new("/k"), Some("prod")).unwrap_err();
        assert!(e.contains("context \"prod\" not found"), "{e}");
        let text = config("    token: t\n", "").replace("current-context: dev\n", "");
        let e = resolve(&text, Path::new("/k"), None).unwrap_err();
        assert!(e.contains("no current-context"), "{e}");
        let text = config("    token: t\n", "").replace("user: u1", "user: u2");
        let e = resolve(&text, Path::new("/k"), None).unwrap_err();
        assert!(e.contains("user \"u2\""), "{e}");
        let e = resolve("just text", Path::new("/k"), None).unwrap_err();
        assert!(e.contains("not a kubeconfig"), "{e}");
    }

    #[test]
    fn exec_auth_provider_password_and_insecure_are_rejected() {
        let exec = "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws\n      args: [eks, get-token]\n";
        let e = resolve(&config(exec, ""), Path::new("/k"), None).unwrap_err();
        assert!(e.contains("user \"u1\"") && e.contains("exec"), "{e}");
        let ap = "    auth-provider:\n      name: gcp\n      config: {}\n";
        let e = resolve(&config(ap, ""), Path::new("/k"), None).unwrap_err();
        assert!(e.contains("auth-provider"), "{e}");
        let pw = "    username: admin\n    password: secret\n";
        let e = resolve(&config(pw, ""), Path::new("/k"), None).unwrap_err();
        assert!(
            e.contains("username/password") && !e.contains("secret"),
            "{e}"
        );
        let insecure = "    insecure-skip-tls-verify: true\n";
        let e = resolve(&config("    token: t\n", insecure), Path::new("/k"), None).unwrap_err();
        assert!(e.contains("insecure-skip-tls-verify"), "{e}");
    }

    /// kubectl's merge: the first `current-context` set, the first definition of each name, each
    /// entry's relative paths from its own file's directory, missing files skipped.
    #[test]
    fn several_files_merge_as_kubectl_merges_them() {
        let root = std::env::temp_dir().join(format!("kvgate-kc-merge-{}", std::process::id()));
        let (a, b) = (root.join("a"), root.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        // The first file: the current context and its cluster, no users.
        std::fs::write(
            a.join("config"),
            "current-context: prod\n\
             clusters:\n- name: c1\n  cluster:\n    server: http://first:1\n\
             contexts:\n- name: prod\n  context:\n    cluster: c1\n    user: u1\n    namespace: ns-a\n",
        )
        .unwrap();
        // The second: another current-context and another c1 (both ignored), and the user,
        // whose token file is relative to this file's directory.
        std::fs::write(
            b.join("config"),
            "current-context: dev\n\
             clusters:\n- name: c1\n  cluster:\n    server: http://second:2\n\
             users:\n- name: u1\n  user:\n    tokenFile: tok\n",
        )
        .unwrap();
        let paths = vec![a.join("config"), root.join("missing"), b.join("config")];
        let r = load_merged(&paths, None).unwrap();
        assert_eq!(r.server, "http://first:1", "the first definition of c1");
        assert_eq!(r.namespace.as_deref(), Some("ns-a"));
        assert_eq!(
            r.token_file,
            Some(b.join("tok")),
            "relative to its own file"
        );
        // A context only the second file could name is still found by name.
        let e = load_merged(&paths, Some("dev")).unwrap_err();
        assert!(e.message.contains("context \"dev\" not found"), "{e}");
        // Nothing exists: one error naming the list.
        let gone = vec![root.join("x"), root.join("y")];
        let e = load_merged(&gone, None).unwrap_err();
        assert!(e.message.contains("none of these files exists"), "{e}");
        assert!(e.path.contains(':'), "{e}");
        // A single configured file must exist.
        assert!(load(&root.join("x"), None).is_err());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn kubeconfig_env_lists_its_files_and_home_only_if_it_exists() {
        let env = |k: &str| (k == ENV_KUBECONFIG).then(|| ":/a/one:/b/two:/a/one".to_string());
        assert_eq!(
            env_paths(&env),
            Some(vec![PathBuf::from("/a/one"), PathBuf::from("/b/two")])
        );
        let none = |_: &str| None;
        assert_eq!(env_paths(&none), None);
        let empty = |k: &str| (k == ENV_KUBECONFIG).then(|| " : ".to_string());
        assert_eq!(env_paths(&empty), None);
        assert_eq!(home_path(&none), None);
        let home = |k: &str| (k == "HOME").then(|| "/nonexistent-home".to_string());
        assert_eq!(home_path(&home), None, "only an existing ~/.kube/config");
    }
}

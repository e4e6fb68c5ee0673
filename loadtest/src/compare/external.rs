//! External router processes: start from a substituted template, record the version, stop.
//!
//! The child runs `sh -c COMMAND` in its own process group so that stopping it (SIGTERM, then
//! SIGKILL after [`STOP_GRACE`]) also reaches anything the shell started. Its stdout and stderr
//! go to a log file so a failing router can be diagnosed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// Time a router gets to exit after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// Longest version command output kept.
const MAX_VERSION_CHARS: usize = 200;

/// Why an external router could not be run.
#[derive(Debug, thiserror::Error)]
pub enum ExternalError {
    /// Spawning failed.
    #[error("starting `{command}`: {source}")]
    Spawn {
        /// The command.
        command: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The log file could not be created.
    #[error("creating log {path}: {source}")]
    Log {
        /// Log path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A free port could not be found.
    #[error("finding a free port: {0}")]
    Port(std::io::Error),
}

/// A running external router.
pub struct ExternalRouter {
    child: Child,
    /// The command line that was run.
    pub command: String,
    /// Where its output goes.
    pub log: PathBuf,
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16, ExternalError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(ExternalError::Port)?;
    Ok(l.local_addr().map_err(ExternalError::Port)?.port())
}

impl ExternalRouter {
    /// Starts `command` with output to `log`.
    pub fn start(command: &str, log: &Path) -> Result<Self, ExternalError> {
        let out = std::fs::File::create(log).map_err(|source| ExternalError::Log {
            path: log.to_path_buf(),
            source,
        })?;
        let err = out.try_clone().map_err(|source| ExternalError::Log {
            path: log.to_path_buf(),
            source,
        })?;
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {command}"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ExternalError::Spawn {
                command: command.to_string(),
                source,
            })?;
        Ok(ExternalRouter {
            child,
            command: command.to_string(),
            log: log.to_path_buf(),
        })
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the process group: SIGTERM, then SIGKILL after the grace period.
    pub async fn stop(mut self) {
        let Some(pid) = self.child.id() else {
            return;
        };
        signal_group(pid, "TERM").await;
        if tokio::time::timeout(STOP_GRACE, self.child.wait())
            .await
            .is_err()
        {
            signal_group(pid, "KILL").await;
            let _ = tokio::time::timeout(STOP_GRACE, self.child.wait()).await;
        }
    }
}

async fn signal_group(pid: u32, sig: &str) {
    // The child leads its own group (process_group(0)), so -pid names exactly that group.
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(format!("-{pid}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
}

/// Runs a version command (bounded to 60 s) and extracts a version: the `Version:` line of
/// `pip show`, else the first line of output.
pub async fn version(command: &str) -> Option<String> {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .ok()?
    .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("Version:").map(str::trim))
        .or_else(|| text.lines().map(str::trim).find(|l| !l.is_empty()))?;
    Some(line.chars().take(MAX_VERSION_CHARS).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn version_parsing_and_stop() {
        assert_eq!(
            version("printf 'Name: x\\nVersion: 1.2.3\\n'")
                .await
                .as_deref(),
            Some("1.2.3")
        );
        assert_eq!(version("echo v9").await.as_deref(), Some("v9"));
        assert_eq!(version("true").await, None);
        let dir = std::env::temp_dir().join(format!("kvgate-lt-ext-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = ExternalRouter::start("sleep 30", &dir.join("r.log")).unwrap();
        assert!(r.is_running());
        r.stop().await;
        assert!(free_port().unwrap() > 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

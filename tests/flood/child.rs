//! The real `kvgate` binary as a child process: started on a config file, its bound address read
//! from its own startup log line, its memory and client sockets read from `/proc`.
//!
//! Invariants:
//! - The child is killed and reaped when its [`Child`] drops, panic or not.
//! - Its stdout is read to the end on a thread of its own, so the child never blocks on a full
//!   pipe; stderr goes to the test's.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running gateway process.
pub struct Child {
    proc: std::process::Child,
    pub addr: SocketAddr,
    config: PathBuf,
}

impl Child {
    /// Starts the binary on `toml` (written to a temporary file) and waits, at most 30 s, for
    /// its `kvgate serving` line.
    pub fn start(toml: &str) -> Child {
        Self::start_binary(Path::new(env!("CARGO_BIN_EXE_kvgate")), toml)
    }

    /// [`Child::start`] with another `kvgate` binary (an earlier release's).
    pub fn start_binary(bin: &Path, toml: &str) -> Child {
        // One file per child: the tests of this file run at once in one process.
        let config = crate::common::fresh_dir("flood").join("kvgate.toml");
        std::fs::write(&config, toml).unwrap();
        let mut proc = Command::new(bin)
            .arg("--config")
            .arg(&config)
            .arg("--log-format")
            .arg("json")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = proc.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Some(addr) = serving_addr(&line) {
                    let _ = tx.send(addr);
                }
            }
        });
        let mut child = Child {
            proc,
            addr: "0.0.0.0:0".parse().unwrap(),
            config,
        };
        child.addr = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("kvgate logged no `kvgate serving` line");
        child
    }

    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// `VmRSS` and `VmHWM` (peak RSS), in bytes.
    pub fn memory(&self) -> Memory {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let field = |name: &str| -> u64 {
            let line = status
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name} in /proc/pid/status"));
            let kib: u64 = line[name.len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .unwrap();
            kib * 1024
        };
        Memory {
            rss: field("VmRSS:"),
            hwm: field("VmHWM:"),
        }
    }

    /// Client connections the gateway has not closed: sockets on its listening port that are
    /// established or half-closed by the client (`/proc/net/tcp`). Its upstream connections
    /// (kept in its pool) are not counted.
    pub fn client_sockets(&self) -> usize {
        let port = format!(":{:04X}", self.addr.port());
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        table
            .lines()
            .skip(1)
            .filter(|l| {
                let mut f = l.split_whitespace();
                let (local, state) = (f.nth(1), f.nth(1));
                // 01 ESTABLISHED, 08 CLOSE_WAIT: the gateway's end is still open.
                local.is_some_and(|a| a.ends_with(&port)) && matches!(state, Some("01" | "08"))
            })
            .count()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
        if let Some(dir) = self.config.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A process's memory, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct Memory {
    pub rss: u64,
    pub hwm: u64,
}

/// The address in a JSON log line `{"message":"kvgate serving","listen":"…",…}`.
fn serving_addr(line: &str) -> Option<SocketAddr> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if v["message"] != "kvgate serving" {
        return None;
    }
    v["listen"].as_str()?.parse().ok()
}

/// Raises this process's soft descriptor limit to the hard one (children inherit it); returns it.
pub fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the duration of both calls.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(lim.rlim_max);
        lim.rlim_cur = lim.rlim_max.min(nr_open);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    lim.rlim_cur
}

#[test]
fn the_serving_line_gives_the_address() {
    let line = r#"{"timestamp":"t","level":"INFO","listen":"127.0.0.1:4321","pools":1,"message":"kvgate serving"}"#;
    assert_eq!(serving_addr(line), Some("127.0.0.1:4321".parse().unwrap()));
    assert_eq!(serving_addr(r#"{"message":"other"}"#), None);
}

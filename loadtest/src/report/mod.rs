//! Results of a run: the JSON results file, the self-contained HTML report, the terminal table.
//!
//! The JSON file holds every figure plus the exact command line, versions and parameters, so a
//! run can be audited and re-run; the HTML report is generated from the same [`Report`] value.

pub mod follow_ups;
pub mod html;
pub mod mirror;
pub mod rounds;
pub mod summary;
pub mod svg;
pub mod table;

use std::path::Path;

use serde::Serialize;

use crate::compare::ContenderResult;
use crate::prompt::TokenCountError;
use crate::trace::TraceStats;

/// Everything a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Tool name and version.
    pub tool: String,
    /// The exact command line.
    pub command_line: Vec<String>,
    /// Start time, seconds since the Unix epoch.
    pub started_unix_s: u64,
    /// `replay` or `compare`.
    pub kind: String,
    /// Parameters of the run (fleet, replay, prompts).
    pub parameters: serde_json::Value,
    /// Summary of the replayed trace.
    pub trace: TraceStats,
    /// Synthesised prompt length accuracy.
    pub prompt_tokens: TokenCountError,
    /// Reference bounds computed from the trace and the fleet (sizing), if computed.
    pub references: Option<serde_json::Value>,
    /// One entry per contender and round, in the order run.
    pub contenders: Vec<ContenderResult>,
    /// Per contender over the rounds, when there were several (`compare --rounds`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub over_rounds: Vec<rounds::RoundsRow>,
}

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// File I/O failed.
    #[error("writing {path}: {source}")]
    Io {
        /// Target path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Serialisation failed.
    #[error("serialising results: {0}")]
    Json(#[from] serde_json::Error),
}

impl Report {
    /// Seconds since the Unix epoch, now.
    pub fn now_unix_s() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }

    /// Writes the JSON results file.
    pub fn write_json(&self, path: &Path) -> Result<(), ReportError> {
        let bytes = serde_json::to_vec_pretty(self)?;
        write(path, &bytes)
    }

    /// Writes the HTML report.
    pub fn write_html(&self, path: &Path) -> Result<(), ReportError> {
        write(path, html::render(self).as_bytes())
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| ReportError::Io {
            path: dir.display().to_string(),
            source,
        })?;
    }
    std::fs::write(path, bytes).map_err(|source| ReportError::Io {
        path: path.display().to_string(),
        source,
    })
}

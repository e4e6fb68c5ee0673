//! Errors of the offline simulator.

/// Why an offline simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// A parameter is out of range or inconsistent.
    #[error("invalid parameter: {0}")]
    Param(String),
    /// The policy name or its configuration was rejected by the routing core.
    #[error("policy {name}: {msg}")]
    Policy {
        /// Policy name as given.
        name: String,
        /// What the core said.
        msg: String,
    },
    /// The engine model rejected its parameters or a request.
    #[error("engine model: {0}")]
    Engine(String),
    /// The trace could not be loaded.
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
    /// Writing results failed.
    #[error("writing {path}: {msg}")]
    Output {
        /// Destination.
        path: String,
        /// What failed.
        msg: String,
    },
}

//! The simulator's error type.

/// Errors of the simulator library.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Invalid configuration or parameters.
    #[error("invalid simulator configuration: {0}")]
    Config(String),
    /// A socket or listener could not be set up.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The ZMQ layer failed.
    #[error("zmq error: {0}")]
    Zmq(String),
    /// The tokenizer could not be loaded or failed.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
}

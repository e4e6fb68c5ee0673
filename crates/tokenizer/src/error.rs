//! The one error type of this crate; every failure names what was being done.

use std::path::PathBuf;

/// Why loading, encoding, decoding or rendering failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A tokenizer definition could not be loaded or parsed.
    #[error("cannot load tokenizer: {0}")]
    Load(String),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// Text could not be encoded into token ids.
    #[error("cannot encode text: {0}")]
    Encode(String),
    /// Token ids could not be decoded into text (unknown id, invalid UTF-8).
    #[error("cannot decode token ids: {0}")]
    Decode(String),
    /// A chat template failed to compile or to render.
    #[error("chat template error: {0}")]
    Template(String),
}

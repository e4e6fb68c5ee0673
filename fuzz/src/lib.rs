//! Reference implementations the fuzz targets compare kvgate's parsers against.
//!
//! Each reference is written from the parser's documented contract (its module's `//!` doc), as
//! simply as possible and independently of the code under test: over a tree that `serde_json`
//! or `rmpv` built, or over the whole input at once where the parser under test streams.

pub mod chunked;
pub mod json;
pub mod lines;
pub mod msgpack;
pub mod splits;
pub mod sse;
pub mod usage;

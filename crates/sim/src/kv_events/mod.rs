//! KV events on the wire: vLLM-compatible msgpack encoding and the ZMQ PUB/ROUTER publisher.

pub mod encode;
pub mod publisher;

pub use encode::{encode_batch, EventEncoding};
pub use publisher::{vllm_binds, BindMode, Publisher, PublisherConfig, END_SEQ};

//! The chaos suite: the real gateway in front of simulated engines (in this process, or as child
//! processes where a real kill is needed), a bounded load through it, one fault injected once
//! part of the load completed, and assertions on counts — requests lost, where requests went,
//! what the gateway's admin views show and within which bound.
//!
//! One module per fault family; each scenario's doc comment states what it asserts. See
//! `docs/chaos.md`. The openai Python client's view of a stream cut mid-way is covered by
//! `tests/e2e/openai_client.sh` and not repeated here.
//!
//! Every wait is a poll with a deadline or a count of completed requests; engines run at
//! [`harness::TIME_SCALE`] times real speed so the whole suite stays within about a minute.

#[path = "../common/mod.rs"]
mod common;

mod harness;

/// The real binary as a child process (shared with the flood tests).
#[path = "../flood/child.rs"]
#[allow(dead_code)]
mod child;

mod drop;
mod events;
mod faults_5xx;
mod kill;
mod metrics_hang;
mod replica_kill;
mod replicas;
mod restart;
mod slow;

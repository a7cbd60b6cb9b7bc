//! loadgen: a compilebench-like small-file workload generator.
//!
//! [`workload`] (pure: tree model, phase file sets, plans), [`engine`] (clients, barriers,
//! I/O, latency histograms), [`report`] (table, JSON with a schema, CSV).

pub mod charts;
pub mod engine;
pub mod remote;
pub mod report;
pub mod workload;

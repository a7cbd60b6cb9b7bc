//! loadgen: a compilebench-like small-file workload generator.
//!
//! [`workload`] (pure: tree model, phase file sets, plans), [`engine`] (clients, barriers,
//! I/O, latency histograms), [`store`] (a mounted directory or an NFS export spoken to
//! directly), [`report`] (table, JSON with a schema, CSV).

// Every `unsafe` block lives in `sys`, each with its SAFETY reasoning.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod charts;
pub mod engine;
pub mod locks;
pub mod login;
pub mod pyrandom;
pub mod remote;
pub mod report;
pub mod safety;
pub mod stop;
pub mod store;
pub mod storm;
#[allow(unsafe_code)]
pub mod sys;
pub mod workload;

//! One file per command, and the run directories they share.

pub(crate) mod manual;
pub(crate) mod progress;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod rundir;
pub(crate) mod storm;
pub(crate) mod storm_hosts;
pub(crate) mod stream;

pub(crate) use progress::*;
pub(crate) use report::*;
pub(crate) use run::*;
pub(crate) use rundir::*;
pub(crate) use storm::*;
pub(crate) use storm_hosts::*;
pub(crate) use stream::*;

//! One file per command.

pub(crate) mod config;
pub(crate) mod demo;
pub(crate) mod manual;
pub(crate) mod mount;
pub(crate) mod pam;
pub(crate) mod recover;
pub(crate) mod status;
pub(crate) mod umount;

pub(crate) use config::*;
pub(crate) use demo::*;
pub(crate) use mount::*;
pub(crate) use pam::*;
pub(crate) use recover::*;
pub(crate) use status::*;
pub(crate) use umount::*;

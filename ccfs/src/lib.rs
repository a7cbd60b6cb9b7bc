//! ccfs: a FUSE filesystem that keeps writes to configuration files (dotfiles) in a local
//! cache and syncs them back to the network share with rsync at logout.
//!
//! Layers: [`policy`] (which path is which class), [`state`] and [`journal`] (what is
//! unsynced, crash-safe), [`overlay`] (the filesystem logic over two directories, no FUSE
//! types), [`rsync`] (the command line, its report) below the overlay, [`sync`] (the sync-back
//! above it), [`fuse`] (the thin adapter to the kernel).

// Every `unsafe` block lives in `sys`, each with its SAFETY reasoning.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod backing;
pub mod config;
pub mod control;
pub mod counters;
pub mod daemon;
pub mod error;
pub mod extents;
pub mod fuse;
pub mod gate;
pub mod journal;
pub mod locks;
pub mod nodes;
pub mod overlay;
pub mod pam;
pub mod policy;
pub mod rsync;
pub mod state;
pub mod sync;
#[allow(unsafe_code)]
pub mod sys;

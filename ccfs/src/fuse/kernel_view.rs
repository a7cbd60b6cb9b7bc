//! What this mount told the kernel, for telling it to forget a name.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use fuser::INodeNo;

use crate::locks::Locked;
use crate::nodes::Nodes;

/// The kernel's names and inodes as this mount gave them, for telling the kernel to drop
/// what it keeps of a name: a sync that keeps the share's version at a conflict shows
/// another file at the name, whose size the kernel would otherwise keep for its timeout
/// (and clip reads to it).
#[derive(Debug)]
pub struct KernelView {
    nodes: Arc<Mutex<Nodes>>,
    notifier: fuser::Notifier,
}

impl KernelView {
    pub fn new(nodes: Arc<Mutex<Nodes>>, notifier: fuser::Notifier) -> Self {
        Self { nodes, notifier }
    }

    /// Drops the kernel's entry, attributes and pages of each path (below the mount root)
    /// and of its directory's listing; paths the kernel never saw are skipped.
    pub fn forget_paths(&self, paths: &[PathBuf]) {
        for rel in paths {
            let found = {
                let nodes = self.nodes.locked();
                nodes.walk(rel)
            };
            let Some((parent, name, node)) = found else {
                continue;
            };
            let mut sent = vec![self.notifier.inval_entry(INodeNo(parent), &name)];
            if let Some(node) = node {
                sent.push(self.notifier.inval_inode(INodeNo(node), 0, 0));
            }
            sent.push(self.notifier.inval_inode(INodeNo(parent), 0, 0));
            for e in sent.into_iter().filter_map(Result::err) {
                tracing::debug!(
                    path = %crate::journal::escape(rel),
                    "the kernel refused an invalidation: {e}"
                );
            }
        }
    }
}

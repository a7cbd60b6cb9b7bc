//! Which paths are cached, local-only or passed straight through to the share.
//!
//! Pure logic: a [`Policy`] classifies a path relative to the mount root.

use std::path::{Component, Path};

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

/// The class of a path below the mount root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathClass {
    /// Read and written directly on the share.
    Passthrough,
    /// Written to the local cache and synced back to the share at logout.
    Cached,
    /// Lives in the local cache only; never read from or synced to the share.
    LocalOnly,
}

/// Errors building a policy from configured globs.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("invalid glob {pattern:?} in [paths].{list}: {source}")]
    Glob {
        list: &'static str,
        pattern: String,
        source: globset::Error,
    },
    #[error("glob {pattern:?} in [paths].{list} must be relative to the mount root (no leading '/', no '..')")]
    NotRelative { list: &'static str, pattern: String },
}

/// SQLite databases (and their journals) by name: the `passthrough` list of the
/// databases-passed-through variant (the default before databases were held by block).
/// Passed through, the share sees every page and fsync the program writes, as without
/// ccfs; cached by default, a large one is held by block (see `overlay/blocks.rs`).
pub const SQLITE_DATABASES: &[&str] = &[
    "**/*.sqlite",
    "**/*.sqlite-wal",
    "**/*.sqlite-shm",
    "**/*.sqlite-journal",
];

/// The default `local_only` list: the cache's own, and SQLite's shared-memory index of a
/// database in WAL mode (`X-shm`). That index means something only while a program on
/// this workstation has the database open (the first program to open the database
/// rebuilds it from the WAL), so it never goes to the share: sent, it was one more file at
/// every logout, and after a crash during a sync on a share that keeps whole seconds its
/// changes through a mapping (which leave the mtime as it was) made it look like another
/// workstation's.
pub const LOCAL_ONLY: &[&str] = &[".cache/**", "**/*.sqlite-shm"];

/// What a directory's path says of its children's classes ([`Policy::ancestry`]).
#[derive(Debug, Clone, Copy)]
pub struct Ancestry {
    /// The directory is the mount root (a child's own name decides whether it is dotted).
    top: bool,
    /// Its first component starts with `.`.
    dotted: bool,
    local_only: bool,
    passthrough: bool,
    cached: bool,
}

/// Path classification rules.
#[derive(Debug, Clone)]
pub struct Policy {
    dotfiles_cached: bool,
    cached: GlobSet,
    passthrough: GlobSet,
    local_only: GlobSet,
}

fn build_set(list: &'static str, patterns: &[String]) -> Result<GlobSet, PolicyError> {
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        if pattern.starts_with('/') || pattern.split('/').any(|c| c == "..") {
            return Err(PolicyError::NotRelative {
                list,
                pattern: pattern.clone(),
            });
        }
        let glob = |p: &str| -> Result<Glob, PolicyError> {
            GlobBuilder::new(p)
                .literal_separator(true)
                .build()
                .map_err(|source| PolicyError::Glob {
                    list,
                    pattern: pattern.clone(),
                    source,
                })
        };
        builder.add(glob(pattern)?);
        // "dir/**" also names "dir" itself, so a whole subtree shares one class.
        if let Some(base) = pattern.strip_suffix("/**") {
            if !base.is_empty() {
                builder.add(glob(base)?);
            }
        }
    }
    builder.build().map_err(|source| PolicyError::Glob {
        list,
        pattern: patterns.join(","),
        source,
    })
}

impl Policy {
    /// Builds a policy. `dotfiles_cached` turns on the default rule (first component starts
    /// with `.`); `cached` adds more cached paths; `passthrough` forces paths to the share;
    /// `local_only` keeps paths in the cache only. Precedence: local-only, passthrough, cached.
    pub fn new(
        dotfiles_cached: bool,
        cached: &[String],
        passthrough: &[String],
        local_only: &[String],
    ) -> Result<Self, PolicyError> {
        Ok(Self {
            dotfiles_cached,
            cached: build_set("cached", cached)?,
            passthrough: build_set("passthrough", passthrough)?,
            local_only: build_set("local_only", local_only)?,
        })
    }

    /// The documented defaults: dotfiles cached (SQLite databases too), [`LOCAL_ONLY`]
    /// local-only.
    pub fn default_policy() -> Self {
        let local: Vec<String> = LOCAL_ONLY.iter().map(|g| g.to_string()).collect();
        Self::new(true, &[], &[], &local).unwrap_or_else(|_| Self {
            dotfiles_cached: true,
            cached: GlobSet::empty(),
            passthrough: GlobSet::empty(),
            local_only: GlobSet::empty(),
        })
    }

    /// True when `set` matches `rel` or one of its ancestors (so a class covers a subtree).
    fn matches_self_or_ancestor(set: &GlobSet, rel: &Path) -> bool {
        if set.is_empty() {
            return false;
        }
        rel.ancestors()
            .filter(|a| !a.as_os_str().is_empty())
            .any(|a| set.is_match(a))
    }

    /// What a directory passes on to its children's classes: computed once for a
    /// listing, so that each entry costs one match per list, not one per ancestor.
    pub fn ancestry(&self, dir: &Path) -> Ancestry {
        Ancestry {
            top: dir.as_os_str().is_empty(),
            dotted: matches!(dir.components().next(),
                Some(Component::Normal(first)) if first.as_encoded_bytes().first() == Some(&b'.')),
            local_only: Self::matches_self_or_ancestor(&self.local_only, dir),
            passthrough: Self::matches_self_or_ancestor(&self.passthrough, dir),
            cached: Self::matches_self_or_ancestor(&self.cached, dir),
        }
    }

    /// The class of `child`, an entry of the directory `above` was computed for: the
    /// same as [`Policy::classify`] gives it.
    pub fn classify_child(&self, above: &Ancestry, child: &Path) -> PathClass {
        if above.local_only || self.local_only.is_match(child) {
            return PathClass::LocalOnly;
        }
        if above.passthrough || self.passthrough.is_match(child) {
            return PathClass::Passthrough;
        }
        let dotted = if above.top {
            child.as_os_str().as_encoded_bytes().first() == Some(&b'.')
        } else {
            above.dotted
        };
        if (self.dotfiles_cached && dotted) || above.cached || self.cached.is_match(child) {
            return PathClass::Cached;
        }
        PathClass::Passthrough
    }

    /// Classifies a path relative to the mount root (`""` is the root itself).
    pub fn classify(&self, rel: &Path) -> PathClass {
        let Some(Component::Normal(first)) = rel.components().next() else {
            return PathClass::Passthrough;
        };
        if Self::matches_self_or_ancestor(&self.local_only, rel) {
            return PathClass::LocalOnly;
        }
        if Self::matches_self_or_ancestor(&self.passthrough, rel) {
            return PathClass::Passthrough;
        }
        let dotted = first.as_encoded_bytes().first() == Some(&b'.');
        if (self.dotfiles_cached && dotted) || Self::matches_self_or_ancestor(&self.cached, rel) {
            return PathClass::Cached;
        }
        PathClass::Passthrough
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn default_classes() {
        let p = Policy::default_policy();
        assert_eq!(p.classify(Path::new("")), PathClass::Passthrough);
        assert_eq!(p.classify(Path::new(".bashrc")), PathClass::Cached);
        assert_eq!(
            p.classify(Path::new(".mozilla/firefox/x/prefs.js")),
            PathClass::Cached
        );
        assert_eq!(
            p.classify(Path::new(".config/gtk-3.0/bookmarks")),
            PathClass::Cached
        );
        assert_eq!(p.classify(Path::new(".cache")), PathClass::LocalOnly);
        assert_eq!(
            p.classify(Path::new(".cache/mozilla/a/b")),
            PathClass::LocalOnly
        );
        assert_eq!(p.classify(Path::new(".cachedir")), PathClass::Cached);
        assert_eq!(
            p.classify(Path::new("Documents/report.odt")),
            PathClass::Passthrough
        );
        assert_eq!(
            p.classify(Path::new("Documents/.hidden")),
            PathClass::Passthrough
        );
        assert_eq!(p.classify(Path::new("notes.txt")), PathClass::Passthrough);
    }

    proptest::proptest! {
        /// A listing's entries get the class a lookup of each would give them.
        #[test]
        fn a_child_classed_through_its_directory_gets_its_own_class(
            parts in proptest::collection::vec(
                proptest::sample::select(vec![
                    ".cache", ".mozilla", "firefox", "p1", "cache2", ".thunderbird", "a",
                    "Desktop", "x.desktop", ".local", "share", "Trash", "db.sqlite-shm",
                    "notes.txt", ".hidden",
                ]),
                1..6,
            ),
            dotfiles in proptest::bool::ANY,
        ) {
            let p = Policy::new(
                dotfiles,
                &s(&["Desktop/*.desktop", "a/**"]),
                &s(&[".thunderbird/**", ".local/share/Trash"]),
                &s(&[".cache/**", ".mozilla/firefox/*/cache2/**", "**/*.sqlite-shm"]),
            )
            .expect("valid policy");
            let rel: std::path::PathBuf = parts.iter().collect();
            let dir = rel.parent().unwrap_or(Path::new(""));
            proptest::prop_assert_eq!(
                p.classify_child(&p.ancestry(dir), &rel),
                p.classify(&rel),
                "{}", rel.display()
            );
        }
    }

    #[test]
    fn precedence_local_only_then_passthrough_then_cached() {
        let p = Policy::new(
            true,
            &s(&["Desktop/*.desktop"]),
            &s(&[".thunderbird/**", ".local/share/Trash"]),
            &s(&[".cache/**", ".mozilla/firefox/*/cache2/**"]),
        )
        .expect("valid policy");
        assert_eq!(
            p.classify(Path::new(".thunderbird")),
            PathClass::Passthrough
        );
        assert_eq!(
            p.classify(Path::new(".thunderbird/a/b")),
            PathClass::Passthrough
        );
        assert_eq!(
            p.classify(Path::new(".local/share/Trash/files/x")),
            PathClass::Passthrough
        );
        assert_eq!(
            p.classify(Path::new(".local/share/recently-used.xbel")),
            PathClass::Cached
        );
        assert_eq!(
            p.classify(Path::new("Desktop/app.desktop")),
            PathClass::Cached
        );
        assert_eq!(
            p.classify(Path::new("Desktop/photo.png")),
            PathClass::Passthrough
        );
        assert_eq!(
            p.classify(Path::new(".mozilla/firefox/ab.default/cache2/entries/1")),
            PathClass::LocalOnly
        );
        assert_eq!(
            p.classify(Path::new(".mozilla/firefox/ab.default/prefs.js")),
            PathClass::Cached
        );
    }

    #[test]
    fn dotfile_rule_can_be_turned_off() {
        let p = Policy::new(false, &s(&[".bashrc"]), &[], &[]).expect("valid");
        assert_eq!(p.classify(Path::new(".bashrc")), PathClass::Cached);
        assert_eq!(p.classify(Path::new(".profile")), PathClass::Passthrough);
    }

    #[test]
    fn bad_globs_are_refused_with_the_list_named() {
        let e = Policy::new(true, &s(&["a[b"]), &[], &[]).expect_err("bad glob");
        assert!(e.to_string().contains("[paths].cached"), "{e}");
        let e = Policy::new(true, &[], &s(&["/etc/**"]), &[]).expect_err("absolute");
        assert!(e.to_string().contains("relative"), "{e}");
        let e = Policy::new(true, &[], &[], &s(&["../x"])).expect_err("dotdot");
        assert!(e.to_string().contains("local_only"), "{e}");
    }
}

//! The folders a session may read (`sparse-knn serve --allow-path`): a path outside them, in
//! any form, is refused before anything of it is read.
//!
//! A session that is not confined has no [`ReadRoots`] and reads what its process can. The
//! server's session carries one in its `ConfigOptions` (so every statement's planning sees it),
//! and its `file://` object store checks the same roots on every read ([`ReadRoots::check`]):
//! the planner checks the paths it opens itself (a table function's Parquet footer, an index
//! file), the store every file DataFusion lists or reads (URL tables, external tables, the
//! files of a folder), so a symbolic link inside a root that leads out is refused too.

use std::any::Any;
use std::path::{Component, Path, PathBuf};

use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::common::{plan_datafusion_err, plan_err, Result};

/// Canonical folders a confined session may read, and below them only.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadRoots {
    roots: Vec<PathBuf>,
}

impl ReadRoots {
    /// Roots from folders that must exist; each is resolved (symbolic links, `..`) once here.
    pub fn new<P: AsRef<Path>>(folders: impl IntoIterator<Item = P>) -> Result<Self> {
        let mut roots = Vec::new();
        for folder in folders {
            let folder = folder.as_ref();
            let root = std::fs::canonicalize(folder)
                .map_err(|e| plan_datafusion_err!("allowed folder '{}': {e}", folder.display()))?;
            if !root.is_dir() {
                return plan_err!("allowed folder '{}' is not a folder", folder.display());
            }
            if !roots.contains(&root) {
                roots.push(root);
            }
        }
        Ok(Self { roots })
    }

    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// `path` resolved (relative to the working folder, symbolic links followed) if it lies
    /// under a root; otherwise the reason, which names it and the roots.
    pub fn check(&self, path: &Path) -> std::result::Result<PathBuf, String> {
        let resolved = resolve(path);
        if self.roots.iter().any(|root| resolved.starts_with(root)) {
            return Ok(resolved);
        }
        Err(format!(
            "'{}' is outside the folders this server reads ({}); its administrator can add a folder with --allow-path",
            path.display(),
            self
        ))
    }

    /// The roots a session's options carry, if it is confined.
    pub fn of(options: &datafusion::common::config::ConfigOptions) -> Option<&ReadRoots> {
        options.extensions.get::<ReadRoots>()
    }
}

/// The real location of `path`: its longest existing prefix resolved by the file system (which
/// follows symbolic links and `..` as the kernel will), the rest normalised by name.
fn resolve(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.as_path();
    let mut rest: Vec<PathBuf> = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            let mut resolved = real;
            for part in rest.iter().rev() {
                push_normalised(&mut resolved, part);
            }
            return resolved;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(PathBuf::from(name));
                existing = parent;
            }
            // Nothing of it exists (not even `/`): normalise by name alone.
            _ => {
                let mut resolved = PathBuf::new();
                push_normalised(&mut resolved, &absolute);
                return resolved;
            }
        }
    }
}

fn push_normalised(into: &mut PathBuf, part: &Path) {
    for component in part.components() {
        match component {
            Component::ParentDir => {
                into.pop();
            }
            Component::CurDir => {}
            other => into.push(other),
        }
    }
}

/// The roots, comma-separated, or `none`.
impl std::fmt::Display for ReadRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.roots.is_empty() {
            return f.write_str("none");
        }
        for (i, root) in self.roots.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", root.display())?;
        }
        Ok(())
    }
}

/// Carried in `ConfigOptions` so that the planner sees it; SQL can read it (`SHOW ALL`) but
/// never change it: only the process that starts the session sets it.
impl ConfigExtension for ReadRoots {
    const PREFIX: &'static str = "sparse_knn_serve";
}

impl ExtensionOptions for ReadRoots {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, _value: &str) -> Result<()> {
        plan_err!(
            "{}.{key} is fixed when the server starts (--allow-path) and cannot be set by a statement",
            Self::PREFIX
        )
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        vec![ConfigEntry {
            key: format!("{}.allow_path", Self::PREFIX),
            value: Some(self.to_string()),
            description: "Folders this server's clients may read (sparse-knn serve --allow-path)",
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_a_root_pass_and_others_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("a.parquet"), b"x").unwrap();
        std::fs::write(dir.path().join("secret.parquet"), b"x").unwrap();
        let roots = ReadRoots::new([&root]).unwrap();
        assert!(roots.check(&root.join("a.parquet")).is_ok());
        // Not yet written, but under the root.
        assert!(roots.check(&root.join("new/b.parquet")).is_ok());
        let outside = roots.check(&dir.path().join("secret.parquet")).unwrap_err();
        assert!(outside.contains("secret.parquet"), "{outside}");
        assert!(outside.contains("--allow-path"), "{outside}");
        assert!(roots.check(&root.join("../secret.parquet")).is_err());
        assert!(roots
            .check(&root.join("missing/../../secret.parquet"))
            .is_err());
        assert!(roots.check(Path::new("/etc/passwd")).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn a_symbolic_link_that_leads_out_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(dir.path().join("secret.parquet"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret.parquet"), root.join("link.parquet"))
            .unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();
        let roots = ReadRoots::new([&root]).unwrap();
        assert!(roots.check(&root.join("link.parquet")).is_err());
        assert!(roots.check(&root.join("up/secret.parquet")).is_err());
        assert!(roots.check(&root.join("up/data/x.parquet")).is_ok());
    }

    #[test]
    fn statements_cannot_change_the_roots() {
        let mut roots = ReadRoots::new([std::env::temp_dir()]).unwrap();
        let e = roots.set("allow_path", "/").unwrap_err();
        assert!(e.to_string().contains("cannot be set"), "{e}");
        assert!(ReadRoots::new(["/no/such/folder/anywhere"]).is_err());
    }
}

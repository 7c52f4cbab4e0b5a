//! Where exports and imports keep their work while it is in flight, and how the work
//! of a process that died is found again.
//!
//! An export stages its archive's members under `<store>/.exports/<pid>.<n>.export`
//! and writes the archive as `.<pid>.<n>.<name>.partial` next to the file asked for,
//! renamed to that name only once it is whole, signed and on disk: a crash never
//! leaves a file under the archive's name that is not a whole archive. An import
//! unpacks under `<store>/.imports/<namespace>/<pid>.<n>.<id>`, and a restore pins
//! the images it reads under `<store>/.restores/<namespace>/<pid>.<n>.<id>`
//! ([`super::pin`]). Names carry the pid ([`work::tmp_name`]), so [`discard_dead`]
//! and [`discard_dead_partials`] remove what a dead export, import or restore left
//! and leave live work alone.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::storage::{work, ContainerKey};

/// The directory where this process stages an export.
pub fn export_staging(config: &Config) -> PathBuf {
    exports(config).join(work::tmp_name("export"))
}

/// A fresh directory name where this process unpacks an import of `key`.
pub fn import_dir(config: &Config, key: &ContainerKey) -> PathBuf {
    imports(config)
        .join(key.namespace())
        .join(work::tmp_name(key.id()))
}

/// A fresh directory where this process pins the process image a restore of `key`
/// reads ([`super::pin`]).
pub fn restore_pin_dir(config: &Config, key: &ContainerKey) -> PathBuf {
    restores(config)
        .join(key.namespace())
        .join(work::tmp_name(key.id()))
}

/// The name this process writes archive `out` under until it is whole.
pub fn partial(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "archive".into());
    out.with_file_name(format!(".{}.partial", work::tmp_name(&name)))
}

fn exports(config: &Config) -> PathBuf {
    config.checkpoint.store.join(".exports")
}

fn imports(config: &Config) -> PathBuf {
    config.checkpoint.store.join(".imports")
}

fn restores(config: &Config) -> PathBuf {
    config.checkpoint.store.join(".restores")
}

/// Removes the staging and unpack directories of exports and imports, and the
/// pins of restores, whose process no longer runs; answers what it removed.
pub fn discard_dead(config: &Config) -> Vec<PathBuf> {
    let mut dirs = vec![exports(config)];
    for by_namespace in [imports(config), restores(config)] {
        if let Ok(namespaces) = std::fs::read_dir(by_namespace) {
            dirs.extend(namespaces.flatten().map(|e| e.path()));
        }
    }
    let mut removed = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if work::owner_alive(&name) {
                continue;
            }
            if std::fs::remove_dir_all(e.path()).is_ok() {
                removed.push(e.path());
            }
        }
    }
    removed
}

/// Removes the partial archives that dead exports left next to `out`.
pub fn discard_dead_partials(out: &Path) -> Vec<PathBuf> {
    let Some(name) = out.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Vec::new();
    };
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let suffix = format!(".{name}.partial");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let Some(work_name) = n.strip_prefix('.').filter(|_| n.ends_with(&suffix)) else {
            continue;
        };
        if !work::owner_alive(work_name) && std::fs::remove_file(e.path()).is_ok() {
            removed.push(e.path());
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_only_the_partial_archives_of_dead_exports_are_removed() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("a.tar");
        let mine = partial(&out);
        let dead = dir.path().join(format!(".{}.0.a.tar.partial", i32::MAX));
        let other = dir.path().join(format!(".{}.0.b.tar.partial", i32::MAX));
        for p in [&mine, &dead, &other, &out] {
            std::fs::write(p, b"x")?;
        }
        assert_eq!(discard_dead_partials(&out), vec![dead.clone()]);
        assert!(mine.exists() && other.exists() && out.exists());
        assert!(!dead.exists());
        Ok(())
    }

    #[test]
    fn test_only_the_work_dirs_of_dead_processes_are_removed() -> std::io::Result<()> {
        let store = tempfile::tempdir()?;
        let mut config = Config::default();
        config.checkpoint.store = store.path().to_path_buf();
        let key = ContainerKey::new("ns", "web").expect("a valid key");
        let live = import_dir(&config, &key);
        let staging = export_staging(&config);
        let dead = live.with_file_name(format!("{}.0.web", i32::MAX));
        let dead_export = staging.with_file_name(format!("{}.0.export", i32::MAX));
        for d in [&live, &staging, &dead, &dead_export] {
            std::fs::create_dir_all(d.join("criu"))?;
        }
        let mut removed = discard_dead(&config);
        removed.sort();
        let mut expected = vec![dead.clone(), dead_export.clone()];
        expected.sort();
        assert_eq!(removed, expected);
        assert!(live.exists() && staging.exists());
        Ok(())
    }
}

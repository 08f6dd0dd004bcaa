//! The data directory's format stamp: a file `FORMAT` at its root holding `caisse-store N`, where N is
//! [`FORMAT_VERSION`]. The store's bytes are positional (see `layout`), so a build must never read a directory
//! laid out by another: the stamp is checked before the engine opens anything, and a directory of another
//! version, or sled data without a stamp, is refused with a message that says what was found and what to do.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::store::layout::{FORMAT_VERSION, UPGRADED_IN_PLACE};
use crate::store::StoreError;

/// The stamp's file name, at the root of the data directory.
pub const STAMP_FILE: &str = "FORMAT";
const STAMP_PREFIX: &str = "caisse-store ";

/// Files sled creates in a directory it has opened: a store sled made, the embedded engine of earlier releases
/// (without a stamp: of a build from before the stamp).
pub(crate) const SLED_FILES: [&str; 2] = ["conf", "db"];

/// Checks the stamp of `dir`, or stamps a directory that holds no store yet. Must run before the engine opens it.
pub(in crate::store) fn check_or_stamp(dir: &Path) -> Result<(), StoreError> {
    let path = dir.join(STAMP_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => check(dir, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if SLED_FILES.iter().any(|name| dir.join(name).exists()) {
                return Err(unstamped(dir));
            }
            write(dir)
        }
        Err(e) => Err(StoreError::Io(format!("read {}: {e}", path.display()))),
    }
}

/// Checks that the store in `dir` is of a format this build reads, writing nothing: for a store that is read
/// and copied, never written (the upgrade from sled), and one refused as it is.
pub(crate) fn check_readable(dir: &Path) -> Result<(), StoreError> {
    let path = dir.join(STAMP_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => match found_version(&text) {
            Some(version) if version == FORMAT_VERSION || UPGRADED_IN_PLACE.contains(&version) => Ok(()),
            _ => check(dir, &text),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(unstamped(dir)),
        Err(e) => Err(StoreError::Io(format!("read {}: {e}", path.display()))),
    }
}

/// The refusal of sled data without a stamp: written by a build from before format versions.
fn unstamped(dir: &Path) -> StoreError {
    StoreError::Format(format!(
        "{} holds a store written before data directories carried a format version (no {STAMP_FILE} file); this \
         build reads format {FORMAT_VERSION} only. Start with an empty data directory (move this one aside), since \
         no earlier format can be converted.",
        dir.display()
    ))
}

fn found_version(text: &str) -> Option<u32> {
    text.trim().strip_prefix(STAMP_PREFIX).and_then(|n| n.parse::<u32>().ok())
}

fn check(dir: &Path, text: &str) -> Result<(), StoreError> {
    let found = found_version(text);
    match found {
        Some(FORMAT_VERSION) => Ok(()),
        // Restamped before the engine opens: from here on the directory may hold what the older build cannot read.
        Some(older) if UPGRADED_IN_PLACE.contains(&older) => {
            tracing::info!(dir = %dir.display(), from = older, to = FORMAT_VERSION, "store format upgraded in place");
            write(dir)
        }
        Some(other) => Err(StoreError::Format(format!(
            "{} holds store format {other}; this build reads format {FORMAT_VERSION} only (and upgrades {:?} in \
             place). Run the build that wrote it, or start with an empty data directory (move this one aside).",
            dir.display(),
            UPGRADED_IN_PLACE
        ))),
        None => Err(StoreError::Format(format!(
            "{}/{STAMP_FILE} does not name a store format (it says {:?}); expected \"{STAMP_PREFIX}{FORMAT_VERSION}\"",
            dir.display(),
            text.chars().take(40).collect::<String>()
        ))),
    }
}

/// Writes the stamp so that a crash leaves either no stamp or a whole one: a temporary file, synced, renamed
/// into place, then the directory synced so that the name survives a power cut.
fn write(dir: &Path) -> Result<(), StoreError> {
    let io = |what: &str, e: std::io::Error| StoreError::Io(format!("{what} {}: {e}", dir.display()));
    let temporary = dir.join(format!("{STAMP_FILE}.tmp"));
    let mut file = File::create(&temporary).map_err(|e| io("create stamp in", e))?;
    file.write_all(format!("{STAMP_PREFIX}{FORMAT_VERSION}\n").as_bytes()).map_err(|e| io("write stamp in", e))?;
    file.sync_all().map_err(|e| io("sync stamp in", e))?;
    std::fs::rename(&temporary, dir.join(STAMP_FILE)).map_err(|e| io("rename stamp in", e))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io("sync", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::FjallStore;

    fn refusal(dir: &Path) -> String {
        match FjallStore::open(dir) {
            Err(StoreError::Format(message)) => message,
            Err(other) => panic!("refused for another reason: {other}"),
            Ok(_) => panic!("opened a directory of another format"),
        }
    }

    #[test]
    fn a_new_directory_is_stamped_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        drop(FjallStore::open(dir.path()).unwrap());
        let stamp = std::fs::read_to_string(dir.path().join(STAMP_FILE)).unwrap();
        assert_eq!(stamp, format!("caisse-store {FORMAT_VERSION}\n"));
        drop(FjallStore::open(dir.path()).unwrap());
    }

    /// What the build before format versions left: sled's files and no stamp.
    #[test]
    fn sled_data_without_a_stamp_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        drop(sled::Config::new().path(dir.path()).open().unwrap());
        let message = refusal(dir.path());
        assert!(message.contains("before data directories carried a format version"), "{message}");
        assert!(message.contains("Start with an empty data directory"), "{message}");
        assert!(!dir.path().join(STAMP_FILE).exists(), "a refused directory is left as it was");
    }

    #[test]
    fn a_version_that_only_lacks_trees_is_restamped() {
        let dir = tempfile::tempdir().unwrap();
        drop(FjallStore::open(dir.path()).unwrap());
        std::fs::write(dir.path().join(STAMP_FILE), format!("caisse-store {}\n", UPGRADED_IN_PLACE[0])).unwrap();
        drop(FjallStore::open(dir.path()).unwrap());
        let stamp = std::fs::read_to_string(dir.path().join(STAMP_FILE)).unwrap();
        assert_eq!(stamp, format!("caisse-store {FORMAT_VERSION}\n"));
    }

    #[test]
    fn another_version_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(STAMP_FILE), "caisse-store 0\n").unwrap();
        let message = refusal(dir.path());
        assert!(message.contains("holds store format 0"), "{message}");
        assert!(message.contains(&format!("reads format {FORMAT_VERSION} only")), "{message}");
        std::fs::write(dir.path().join(STAMP_FILE), "something else").unwrap();
        assert!(refusal(dir.path()).contains("does not name a store format"));
    }

    #[test]
    fn a_store_that_is_only_read_is_checked_without_being_restamped() {
        let dir = tempfile::tempdir().unwrap();
        let stamp = dir.path().join(STAMP_FILE);
        std::fs::write(dir.path().join("db"), b"").unwrap();
        let unstamped = check_readable(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(unstamped.contains("before data directories carried a format version"), "{unstamped}");
        for readable in [FORMAT_VERSION, UPGRADED_IN_PLACE[0]] {
            std::fs::write(&stamp, format!("caisse-store {readable}\n")).unwrap();
            check_readable(dir.path()).unwrap();
            assert_eq!(std::fs::read_to_string(&stamp).unwrap(), format!("caisse-store {readable}\n"));
        }
        std::fs::write(&stamp, "caisse-store 0\n").unwrap();
        assert!(matches!(check_readable(dir.path()), Err(StoreError::Format(m)) if m.contains("format 0")));
    }
}

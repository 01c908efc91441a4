//! Atomic file writes: write to a temporary file in the destination directory, fsync it,
//! rename it over the destination, then fsync the directory. Readers see either the old or
//! the new complete file, never a partial one.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// Writes `path` atomically with the bytes `write` produces.
pub fn write_atomic(path: &Path, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> anyhow::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().context("destination has no file name")?;
    let tmp: PathBuf = dir.join(format!(".{}.tmp.{}", name.to_string_lossy(), std::process::id()));
    let result = (|| -> anyhow::Result<()> {
        let f = File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        let mut w = BufWriter::new(f);
        write(&mut w).with_context(|| format!("cannot write {}", tmp.display()))?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all().with_context(|| format!("cannot fsync {}", tmp.display()))?;
        fs::rename(&tmp, path).with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
        // Make the rename itself durable.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Creates `dir` if needed and checks that files can be created in it.
pub fn check_writable_dir(dir: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create dump dir {}", dir.display()))?;
    write_atomic(&dir.join(".etm-bpf-write-test"), |w| w.write_all(b"ok\n"))
        .with_context(|| format!("dump dir {} is not writable", dir.display()))?;
    let _ = fs::remove_file(dir.join(".etm-bpf-write-test"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write replaces the file completely and leaves no temporary file behind.
    #[test]
    fn replaces_atomically() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("out.txt");
        write_atomic(&p, |w| w.write_all(b"first version, long")).unwrap();
        write_atomic(&p, |w| w.write_all(b"second")).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "second");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }

    /// A failing writer leaves the old file intact and removes the temporary file.
    #[test]
    fn failed_write_keeps_old_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("out.txt");
        write_atomic(&p, |w| w.write_all(b"old")).unwrap();
        let err = write_atomic(&p, |_| Err(std::io::Error::other("boom"))).unwrap_err();
        assert!(format!("{err:#}").contains("boom"));
        assert_eq!(fs::read_to_string(&p).unwrap(), "old");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }

    /// A path below a regular file cannot be a dump dir.
    #[test]
    fn unwritable_dir_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("file");
        fs::write(&f, "x").unwrap();
        assert!(check_writable_dir(&f.join("sub")).is_err());
        check_writable_dir(&d.path().join("new/sub")).unwrap();
    }
}

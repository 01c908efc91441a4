//! The bytes of a code image, shared by the pipeline's code map, the symbolizer, the DWARF
//! unwinder and the dump thread: bytes owned in memory (recorded sessions, tests, the vdso
//! read from the target) or a file mapped read-only ([`ImageBytes::map`]), so a 150 MB
//! library costs only the pages that are read, and those are the page cache's.
//!
//! A mapped file is a private read-only mapping (`MAP_PRIVATE`, `PROT_READ`) of the file
//! opened at load time. What happens when that file changes under the map:
//! * replaced by another file (a package upgrade, a rebuild: both write a new file and rename
//!   it over the old one, and `dpkg`, `ld` and `install` all do): the map keeps the old file's
//!   inode, still the code the target runs, so nothing changes for us;
//! * deleted: the same (the inode lives on while mapped);
//! * rewritten in place: the pages read afterwards may show the new bytes, and a truncation
//!   makes reading past the new end raise SIGBUS — as for the target itself, which maps the
//!   same file, and for every mapped-file reader (perf, addr2line, samply). [`ImageBytes::changed`]
//!   tells, from the open file's size and modification time, whether that happened; `run`
//!   counts such images in its manifest (`counts.images_changed_on_disk`).

use std::fs::File;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

/// A mapped file and what its metadata was when mapped.
#[derive(Debug)]
pub struct MappedFile {
    map: memmap2::Mmap,
    file: File,
    len: u64,
    modified: Option<SystemTime>,
}

#[derive(Debug, Clone)]
enum Inner {
    Owned(Arc<Vec<u8>>),
    Mapped(Arc<MappedFile>),
}

/// The bytes of a code image, cheap to clone (module docs).
#[derive(Debug, Clone)]
pub struct ImageBytes(Inner);

impl ImageBytes {
    /// Maps `path` read-only (module docs for what a change of the file does). An empty file
    /// is held as empty owned bytes (nothing to map).
    pub fn map(path: &Path) -> std::io::Result<ImageBytes> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
        }
        if meta.len() == 0 {
            return Ok(ImageBytes::from(Vec::new()));
        }
        // SAFETY: a private read-only mapping of a regular file, only read; what a truncation
        // of the file while mapped does is said in the module docs.
        let map = unsafe { memmap2::MmapOptions::new().map(&file) }?;
        Ok(ImageBytes(Inner::Mapped(Arc::new(MappedFile { map, file, len: meta.len(), modified: meta.modified().ok() }))))
    }

    /// Whether the bytes are a file mapping (not a copy).
    pub fn is_mapped(&self) -> bool {
        matches!(self.0, Inner::Mapped(_))
    }

    /// Whether the mapped file was changed in place since it was mapped (another size or
    /// modification time of the open file); always false for owned bytes.
    pub fn changed(&self) -> bool {
        match &self.0 {
            Inner::Owned(_) => false,
            Inner::Mapped(m) => m.file.metadata().map_or(true, |now| now.len() != m.len || now.modified().ok() != m.modified),
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Inner::Owned(v) => v,
            Inner::Mapped(m) => &m.map,
        }
    }
}

impl Deref for ImageBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for ImageBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl From<Vec<u8>> for ImageBytes {
    fn from(v: Vec<u8>) -> ImageBytes {
        ImageBytes(Inner::Owned(Arc::new(v)))
    }
}

impl From<Arc<Vec<u8>>> for ImageBytes {
    fn from(v: Arc<Vec<u8>>) -> ImageBytes {
        ImageBytes(Inner::Owned(v))
    }
}

impl From<&Arc<Vec<u8>>> for ImageBytes {
    fn from(v: &Arc<Vec<u8>>) -> ImageBytes {
        ImageBytes(Inner::Owned(v.clone()))
    }
}

impl From<&ImageBytes> for ImageBytes {
    fn from(v: &ImageBytes) -> ImageBytes {
        v.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// A mapped file reads as the file's bytes; replacing the file by rename (as installers
    /// do) leaves the map and its bytes as they were and is not a change in place; rewriting
    /// it in place is seen as one.
    #[test]
    fn mapped_file_bytes_and_changes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("img");
        std::fs::write(&p, b"\x7fELF first version").unwrap();
        let img = ImageBytes::map(&p).unwrap();
        assert!(img.is_mapped());
        assert_eq!(&img[..], b"\x7fELF first version");
        assert!(!img.changed());
        let q = d.path().join("img.new");
        std::fs::write(&q, b"\x7fELF second").unwrap();
        std::fs::rename(&q, &p).unwrap();
        assert_eq!(&img[..], b"\x7fELF first version", "the map keeps the replaced file");
        assert!(!img.changed());
        let img2 = ImageBytes::map(&p).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b" and more").unwrap();
        drop(f);
        assert!(img2.changed(), "a file grown in place is a change");
        assert_eq!(&ImageBytes::map(&d.path().join("empty")).err().map(|e| e.kind()), &Some(std::io::ErrorKind::NotFound));
        std::fs::write(d.path().join("empty"), b"").unwrap();
        assert!(ImageBytes::map(&d.path().join("empty")).unwrap().is_empty());
        assert!(ImageBytes::map(d.path()).is_err(), "a directory is not an image");
    }
}

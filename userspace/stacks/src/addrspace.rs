//! The pieces of a process address space: `/proc/PID/maps` text ([`parse_maps`]) and the ELF
//! program headers of a mapped file ([`parse_elf`], [`Binary`]). The live driver turns the
//! maps into MMAP2 sideband; the one resolver from runtime to link-time addresses is the
//! pipeline's (`etm_session`'s code map), fed by that sideband in both drivers.
//!
//! For a file-backed mapping `[start, end)` at file offset `off`, a runtime address `a` is at
//! file offset `f = a - start + off`; the `PT_LOAD` segment containing `f` gives the link-time
//! (ELF virtual) address `f - p_offset + p_vaddr` ([`Binary::file_offset_to_vaddr`]). File
//! offsets and virtual addresses differ in PIE executables, shared libraries and most Rust
//! binaries, so both are needed.
//!
//! I/O-free: the caller passes the maps text and the bytes of a mapped file.

use object::{Object, ObjectSegment, SegmentFlags};

/// The `etm_profile` id of a binary.
pub use etm_profile::BinaryId;
use etm_profile::BinaryInfo;

/// Errors of ELF parsing.
#[derive(Debug, thiserror::Error)]
pub enum AddrSpaceError {
    /// The bytes are not an ELF file `object` can read.
    #[error("not a readable ELF file: {0}")]
    Elf(#[from] object::Error),
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsEntry {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// `rwxp` flags.
    pub perms: [u8; 4],
    /// File offset of `start`.
    pub offset: u64,
    /// `major:minor` of the device.
    pub dev: String,
    /// Inode (0 for anonymous mappings).
    pub inode: u64,
    /// Path or pseudo name (`[vdso]`, `[heap]`, ...); empty for anonymous memory.
    pub path: String,
}

impl MapsEntry {
    /// True if the mapping is executable.
    pub fn is_exec(&self) -> bool {
        self.perms[2] == b'x'
    }
    /// True if the mapping is backed by a file (not anonymous, not a `[pseudo]` name).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }
}

/// Parses `/proc/PID/maps` text; returns the entries and the number of malformed lines skipped.
pub fn parse_maps(text: &str) -> (Vec<MapsEntry>, usize) {
    let mut out = Vec::new();
    let mut bad = 0;
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_maps_line(line) {
            Some(e) => out.push(e),
            None => bad += 1,
        }
    }
    (out, bad)
}

fn parse_maps_line(line: &str) -> Option<MapsEntry> {
    // start-end perms offset dev inode [path]; the path may contain spaces.
    let mut rest = line;
    let mut field = || {
        let s = rest.trim_start();
        let end = s.find(' ').unwrap_or(s.len());
        let (f, r) = s.split_at(end);
        rest = r;
        f
    };
    let range = field();
    let perms = field();
    let offset = field();
    let dev = field();
    let inode = field();
    let path = rest.trim_start().to_owned();
    let (s, e) = range.split_once('-')?;
    let start = u64::from_str_radix(s, 16).ok()?;
    let end = u64::from_str_radix(e, 16).ok()?;
    let pb = perms.as_bytes();
    if pb.len() != 4 || end < start {
        return None;
    }
    Some(MapsEntry {
        start,
        end,
        perms: [pb[0], pb[1], pb[2], pb[3]],
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: dev.to_owned(),
        inode: inode.parse().ok()?,
        path,
    })
}

/// A `PT_LOAD` segment of an ELF file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSegment {
    /// `p_offset`.
    pub offset: u64,
    /// `p_vaddr`.
    pub vaddr: u64,
    /// `p_filesz`.
    pub filesz: u64,
    /// True if `PF_X` is set.
    pub executable: bool,
}

/// What the address space needs from an ELF file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElfInfo {
    /// `PT_LOAD` segments.
    pub segments: Vec<LoadSegment>,
    /// GNU build id, if present.
    pub build_id: Option<Vec<u8>>,
}

/// Reads the load segments and build id of an ELF file.
pub fn parse_elf(bytes: &[u8]) -> Result<ElfInfo, AddrSpaceError> {
    let file = object::File::parse(bytes)?;
    let mut segments = Vec::new();
    for seg in file.segments() {
        let (offset, filesz) = seg.file_range();
        let executable = match seg.flags() {
            SegmentFlags::Elf { p_flags } => p_flags & object::elf::PF_X != 0,
            _ => false,
        };
        segments.push(LoadSegment { offset, vaddr: seg.address(), filesz, executable });
    }
    let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
    Ok(ElfInfo { segments, build_id })
}

/// A binary (ELF file or pseudo mapping such as `[vdso]`) seen in the address space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binary {
    /// Path as shown in the maps (` (deleted)` suffix kept).
    pub path: String,
    /// GNU build id, if the ELF had one.
    pub build_id: Option<Vec<u8>>,
    /// Load segments; empty if the file could not be read or parsed.
    pub segments: Vec<LoadSegment>,
    /// Runtime start addresses of its executable mappings (deduplicated, ascending).
    pub load_addresses: Vec<u64>,
    /// True if the ELF headers were read.
    pub elf_ok: bool,
    /// What the hybrid-profile writers need (`etm_profile`), from the same ELF bytes.
    pub info: BinaryInfo,
}

impl Binary {
    /// The build id as lowercase hex, if any.
    pub fn build_id_hex(&self) -> Option<String> {
        self.build_id.as_ref().map(|b| b.iter().map(|x| format!("{x:02x}")).collect())
    }

    /// Link-time address of file offset `f`, via the `PT_LOAD` segment containing it.
    pub fn file_offset_to_vaddr(&self, f: u64) -> Option<u64> {
        self.segments.iter().find(|s| f >= s.offset && f < s.offset + s.filesz.max(1)).map(|s| f - s.offset + s.vaddr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
5581c7a00000-5581c7a01000 r--p 00000000 fe:01 1234                       /usr/bin/demo
5581c7a01000-5581c7a02000 r-xp 00001000 fe:01 1234                       /usr/bin/demo
7f0000000000-7f0000021000 rw-p 00000000 00:00 0 
7f1000028000-7f10001bd000 r-xp 00028000 fe:01 5678                       /lib/x86_64-linux-gnu/libc.so.6
7ffd0a1f0000-7ffd0a1f2000 r-xp 00000000 00:00 0                          [vdso]
garbage line
7f2000000000-7f2000001000 r-xp 00000000 fe:01 999                        /tmp/with space (deleted)
";

    /// Maps lines parse including paths with spaces; malformed lines are counted.
    #[test]
    fn parses_maps() {
        let (e, bad) = parse_maps(MAPS);
        assert_eq!(bad, 1);
        assert_eq!(e.len(), 6);
        assert_eq!(e[1].start, 0x5581c7a01000);
        assert_eq!(e[1].offset, 0x1000);
        assert!(e[1].is_exec() && e[1].is_file());
        assert_eq!(e[2].path, "");
        assert_eq!(e[5].path, "/tmp/with space (deleted)");
    }

    /// The ELF parser reads the segments and build id of a real binary (this test executable).
    #[test]
    fn parses_real_elf() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let info = parse_elf(&exe).unwrap();
        assert!(info.segments.iter().any(|s| s.executable));
        assert!(parse_elf(b"not an elf").is_err());
    }
}

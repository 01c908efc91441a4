//! A process address space: `/proc/PID/maps` text plus the ELF program headers of each mapped
//! file, mapping runtime addresses to `(binary, link-time address)`.
//!
//! For a file-backed mapping `[start, end)` at file offset `off`, a runtime address `a` is at
//! file offset `f = a - start + off`; the `PT_LOAD` segment containing `f` gives the link-time
//! (ELF virtual) address `f - p_offset + p_vaddr`. File offsets and virtual addresses differ in
//! PIE executables, shared libraries and most Rust binaries, so both are needed.
//!
//! I/O-free: the caller passes the maps text and a callback returning the bytes of a mapped
//! file (e.g. read through `/proc/PID/map_files/` or `/proc/PID/root/`).

use std::collections::HashMap;

use object::{Object, ObjectSegment, SegmentFlags};

/// Index of a binary in an [`AddressSpace`] (stable for the life of the space): the
/// `etm_profile` id, so the space can serve as an [`etm_profile::AddressResolver`].
pub use etm_profile::BinaryId;
use etm_profile::{AddressResolver, BinaryInfo};

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

/// A runtime address resolved to its binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    /// The binary.
    pub binary: BinaryId,
    /// Link-time (ELF virtual) address; the file offset if the ELF headers are unknown.
    pub link_addr: u64,
    /// File offset of the address.
    pub file_offset: u64,
}

#[derive(Debug, Clone)]
struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    binary: BinaryId,
}

/// Counters of address-space maintenance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddrSpaceStats {
    /// `update` calls.
    pub updates: u64,
    /// Malformed maps lines skipped.
    pub bad_maps_lines: u64,
    /// Files whose ELF headers could not be read or parsed.
    pub unreadable_binaries: u64,
}

/// The address space of one process (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct AddressSpace {
    mappings: Vec<Mapping>,
    binaries: Vec<Binary>,
    by_key: HashMap<String, BinaryId>,
    stats: AddrSpaceStats,
}

impl AddressSpace {
    /// An empty address space.
    pub fn new() -> AddressSpace {
        AddressSpace::default()
    }

    /// Replaces the mappings with those in `maps_text` (all of `/proc/PID/maps`). Binaries are
    /// kept across updates (ids stay valid); `read_file` is called once per new file-backed
    /// executable mapping to get the file's bytes. Returns the number of new binaries.
    pub fn update(&mut self, maps_text: &str, read_file: &mut dyn FnMut(&MapsEntry) -> Option<Vec<u8>>) -> usize {
        self.stats.updates += 1;
        let (entries, bad) = parse_maps(maps_text);
        self.stats.bad_maps_lines += bad as u64;
        let before = self.binaries.len();
        let mut mappings = Vec::with_capacity(entries.len());
        for e in &entries {
            let pseudo = e.path.starts_with('[') && e.path != "[heap]" && e.path != "[stack]";
            if !(e.is_exec() && (e.is_file() || pseudo)) {
                continue;
            }
            let key = format!("{}:{}:{}", e.dev, e.inode, e.path);
            let id = match self.by_key.get(&key) {
                Some(&id) => id,
                None => {
                    let bytes = if e.is_file() { read_file(e) } else { None };
                    let info = bytes.as_deref().and_then(|b| parse_elf(b).ok());
                    let profile_info =
                        bytes.as_deref().and_then(|b| BinaryInfo::from_elf(&e.path, b).ok()).unwrap_or_else(|| BinaryInfo {
                            path: e.path.clone(),
                            build_id: info.as_ref().and_then(|i| i.build_id.clone()),
                            ..Default::default()
                        });
                    if e.is_file() && info.is_none() {
                        self.stats.unreadable_binaries += 1;
                        log::debug!("cannot read ELF headers of {}", e.path);
                    }
                    let id = BinaryId(self.binaries.len() as u32);
                    let elf_ok = info.is_some();
                    let info = info.unwrap_or_default();
                    self.binaries.push(Binary {
                        path: e.path.clone(),
                        build_id: info.build_id,
                        segments: info.segments,
                        load_addresses: Vec::new(),
                        elf_ok,
                        info: profile_info,
                    });
                    self.by_key.insert(key, id);
                    id
                }
            };
            let la = &mut self.binaries[id.0 as usize].load_addresses;
            if let Err(pos) = la.binary_search(&e.start) {
                la.insert(pos, e.start);
            }
            mappings.push(Mapping { start: e.start, end: e.end, offset: e.offset, binary: id });
        }
        mappings.sort_by_key(|m| m.start);
        self.mappings = mappings;
        self.binaries.len() - before
    }

    /// Resolves a runtime address; `None` if no executable mapping contains it.
    pub fn resolve(&self, addr: u64) -> Option<Resolved> {
        let i = self.mappings.partition_point(|m| m.start <= addr);
        let m = self.mappings.get(i.checked_sub(1)?)?;
        if addr >= m.end {
            return None;
        }
        let file_offset = addr - m.start + m.offset;
        let b = &self.binaries[m.binary.0 as usize];
        let link_addr = b.file_offset_to_vaddr(file_offset).unwrap_or(file_offset);
        Some(Resolved { binary: m.binary, link_addr, file_offset })
    }

    /// The binary `id`.
    pub fn binary(&self, id: BinaryId) -> Option<&Binary> {
        self.binaries.get(id.0 as usize)
    }

    /// All binaries seen so far, indexed by `BinaryId.0`.
    pub fn binaries(&self) -> &[Binary] {
        &self.binaries
    }

    /// Number of executable mappings currently known.
    pub fn mapping_count(&self) -> usize {
        self.mappings.len()
    }

    /// Counters.
    pub fn stats(&self) -> AddrSpaceStats {
        self.stats
    }
}

impl AddressResolver for AddressSpace {
    fn resolve(&self, addr: u64) -> Option<(BinaryId, u64)> {
        AddressSpace::resolve(self, addr).map(|r| (r.binary, r.link_addr))
    }

    fn binary(&self, id: BinaryId) -> Option<&BinaryInfo> {
        self.binaries.get(id.0 as usize).map(|b| &b.info)
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

    /// Runtime addresses go through file offset and the PT_LOAD segment to link-time addresses.
    #[test]
    fn resolves_through_segments() {
        let demo = ElfInfo {
            segments: vec![
                LoadSegment { offset: 0, vaddr: 0, filesz: 0x1000, executable: false },
                // An executable segment whose vaddr differs from its file offset.
                LoadSegment { offset: 0x1000, vaddr: 0x401000, filesz: 0x1000, executable: true },
            ],
            build_id: Some(vec![0xab, 0xcd]),
        };
        let mut space = AddressSpace::new();
        let mut calls = 0;
        let new = space.update(MAPS, &mut |e| {
            calls += 1;
            (e.path == "/usr/bin/demo").then(|| synth_elf_bytes(&demo))
        });
        // demo, libc (unreadable), [vdso], deleted file (unreadable)
        assert_eq!(new, 4);
        assert_eq!(calls, 3);
        let r = space.resolve(0x5581c7a01234).unwrap();
        assert_eq!(r.file_offset, 0x1234);
        assert_eq!(r.link_addr, 0x401234);
        let b = space.binary(r.binary).unwrap();
        assert_eq!(b.build_id_hex().as_deref(), Some("abcd"));
        assert_eq!(b.load_addresses, vec![0x5581c7a01000]);
        // Unknown ELF: the file offset stands in for the link-time address.
        let r = space.resolve(0x7f1000028010).unwrap();
        assert_eq!(r.link_addr, 0x28010);
        assert!(space.resolve(0x7f0000000010).is_none(), "anonymous rw memory");
        assert!(space.resolve(0x10).is_none());
        assert_eq!(space.stats().unreadable_binaries, 2);
        // A second update re-reads no known file and keeps ids.
        let again = space.update(MAPS, &mut |_| panic!("re-read a known binary"));
        assert_eq!(again, 0);
        assert_eq!(space.resolve(0x5581c7a01234).unwrap().binary, r_binary(&space));
        // The etm_profile resolver view agrees, with the binary's path and build id.
        let dynres: &dyn AddressResolver = &space;
        let (id, link) = dynres.resolve(0x5581c7a01234).unwrap();
        assert_eq!(link, 0x401234);
        let info = dynres.binary(id).unwrap();
        assert_eq!(info.path, "/usr/bin/demo");
        assert_eq!(info.build_id.as_deref(), Some(&[0xab, 0xcd][..]));
    }

    fn r_binary(s: &AddressSpace) -> BinaryId {
        s.resolve(0x5581c7a01000).unwrap().binary
    }

    /// The ELF parser reads the segments and build id of a real binary (this test executable).
    #[test]
    fn parses_real_elf() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let info = parse_elf(&exe).unwrap();
        assert!(info.segments.iter().any(|s| s.executable));
        assert!(parse_elf(b"not an elf").is_err());
    }

    /// Builds a minimal ELF64 file with the given load segments and a build-id note, written
    /// byte by byte from the ELF spec (independent of the parser under test).
    fn synth_elf_bytes(info: &ElfInfo) -> Vec<u8> {
        let phnum = info.segments.len() + 1;
        let ph_off = 64usize;
        let note_off = ph_off + 56 * phnum;
        let id = info.build_id.clone().unwrap_or_default();
        let desc_pad = id.len().div_ceil(4) * 4;
        let note_len = 12 + 4 + desc_pad;
        let mut b = vec![0u8; (note_off + note_len).max(0x2000)];
        b[0..4].copy_from_slice(b"\x7fELF");
        b[4] = 2; // ELFCLASS64
        b[5] = 1; // little endian
        b[6] = 1; // EV_CURRENT
        b[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
        b[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
        b[20..24].copy_from_slice(&1u32.to_le_bytes());
        b[32..40].copy_from_slice(&(ph_off as u64).to_le_bytes()); // e_phoff
        b[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        b[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        b[56..58].copy_from_slice(&(phnum as u16).to_le_bytes());
        b[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
        let mut ph = ph_off;
        let put = |b: &mut Vec<u8>, ph: usize, typ: u32, flags: u32, off: u64, va: u64, sz: u64| {
            b[ph..ph + 4].copy_from_slice(&typ.to_le_bytes());
            b[ph + 4..ph + 8].copy_from_slice(&flags.to_le_bytes());
            b[ph + 8..ph + 16].copy_from_slice(&off.to_le_bytes());
            b[ph + 16..ph + 24].copy_from_slice(&va.to_le_bytes());
            b[ph + 24..ph + 32].copy_from_slice(&va.to_le_bytes());
            b[ph + 32..ph + 40].copy_from_slice(&sz.to_le_bytes());
            b[ph + 40..ph + 48].copy_from_slice(&sz.to_le_bytes());
            b[ph + 48..ph + 56].copy_from_slice(&0x1000u64.to_le_bytes());
        };
        for s in &info.segments {
            put(&mut b, ph, 1, if s.executable { 5 } else { 4 }, s.offset, s.vaddr, s.filesz);
            ph += 56;
        }
        put(&mut b, ph, 4, 4, note_off as u64, note_off as u64, note_len as u64); // PT_NOTE
        b[ph + 48..ph + 56].copy_from_slice(&4u64.to_le_bytes()); // note p_align
        let n = note_off;
        b[n..n + 4].copy_from_slice(&4u32.to_le_bytes()); // namesz
        b[n + 4..n + 8].copy_from_slice(&(id.len() as u32).to_le_bytes());
        b[n + 8..n + 12].copy_from_slice(&3u32.to_le_bytes()); // NT_GNU_BUILD_ID
        b[n + 12..n + 16].copy_from_slice(b"GNU\0");
        b[n + 16..n + 16 + id.len()].copy_from_slice(&id);
        b
    }
}

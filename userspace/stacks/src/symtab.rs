//! Function symbols of an ELF file with their extents, looked up the way perf does, so that
//! an address is never named after a neighbour it does not belong to.
//!
//! Rules (perf's `dso__load_sym` / `symbols__fixup_end` / `symbols__fixup_duplicate`,
//! tools/perf/util/symbol-elf.c and symbol.c):
//!
//! * the symbols are those of `.symtab` when the file has one, else of `.dynsym` (a stripped
//!   library keeps only its exported functions);
//! * function symbols (`STT_FUNC`, `STT_GNU_IFUNC`) that are defined in an executable
//!   section;
//! * a symbol covers `[value, value + size)`; a symbol of size 0 covers up to the next
//!   symbol (the last one up to the next 4 KiB page boundary after it);
//! * of symbols at the same address one is kept: the sized one, then global over weak over
//!   local, then the one with fewer leading underscores, then the longer name;
//! * an address covered by no symbol has no name (callers show `binary+offset`);
//! * PLT stubs get the names perf synthesizes (`dso__synthesize_plt_symbols`,
//!   `dso__synthesize_plt_got_symbols`): `.plt` for the lazy-binding header, `name@plt` for
//!   each `.rela.plt` entry in order (in `.plt.sec` when the file has one, x86 sorted by GOT
//!   offset), `name@plt` for x86 `.plt.got` entries through the GOT slot's `.rela.dyn`
//!   relocation, `offset_0x...@plt` (file offset) when no name is found. They always come
//!   from the binary itself: a debug file has the PLT stripped.
//!
//! Also: the build-id and `.gnu_debuglink` of a file, to find its separate debug file.

use object::{Object, ObjectSection, ObjectSymbol, SectionFlags, SymbolFlags, SymbolKind, SymbolScope};

/// A function symbol and its extent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    pub start: u64,
    pub end: u64,
    pub name: String,
}

/// The function symbols of one file (module docs).
#[derive(Debug, Clone, Default)]
pub struct SymbolTable {
    syms: Vec<Symbol>,
    /// Wall time reading it took, us ([`SymbolTable::of_binary`]).
    read_us: u64,
}

fn rank(size: u64, scope: SymbolScope, weak: bool, name: &str) -> (bool, u8, std::cmp::Reverse<usize>, usize) {
    let binding = match (scope, weak) {
        (_, true) => 1,
        (SymbolScope::Dynamic | SymbolScope::Linkage, false) => 2,
        _ => 0,
    };
    let underscores = name.bytes().take_while(|&b| b == b'_').count();
    (size > 0, binding, std::cmp::Reverse(underscores), name.len())
}

impl SymbolTable {
    /// The table of an ELF file's bytes (empty if it is not ELF or has no function symbols).
    pub fn from_elf(data: &[u8]) -> SymbolTable {
        let Ok(f) = object::File::parse(data) else { return SymbolTable::default() };
        let exec_section = |idx: Option<object::SectionIndex>| {
            idx.and_then(|i| f.section_by_index(i).ok()).is_some_and(|s| match s.flags() {
                SectionFlags::Elf { sh_flags } => sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0,
                _ => true,
            })
        };
        type Cand = (u64, u64, (bool, u8, std::cmp::Reverse<usize>, usize), String);
        let take = |it: &mut dyn Iterator<Item = object::Symbol<'_, '_>>, cands: &mut Vec<Cand>| {
            for s in it {
                let func = s.kind() == SymbolKind::Text
                    && matches!(s.flags(), SymbolFlags::Elf { st_info, .. }
                        if matches!(st_info & 0xf, object::elf::STT_FUNC | object::elf::STT_GNU_IFUNC));
                if !func || s.is_undefined() || s.address() == 0 || !exec_section(s.section_index()) {
                    continue;
                }
                let Ok(name) = s.name() else { continue };
                if name.is_empty() {
                    continue;
                }
                let r = rank(s.size(), s.scope(), s.is_weak(), name);
                cands.push((s.address(), s.size(), r, name.to_string()));
            }
        };
        let mut cands: Vec<Cand> = Vec::new();
        take(&mut f.symbols(), &mut cands);
        if cands.is_empty() {
            take(&mut f.dynamic_symbols(), &mut cands);
        }
        // Best first among equal addresses, then one per address.
        cands.sort_by(|a, b| a.0.cmp(&b.0).then(b.2.cmp(&a.2)));
        cands.dedup_by_key(|c| c.0);
        let mut syms: Vec<Symbol> = Vec::with_capacity(cands.len());
        for i in 0..cands.len() {
            let (start, size) = (cands[i].0, cands[i].1);
            let end = if size > 0 {
                start.saturating_add(size)
            } else {
                match cands.get(i + 1) {
                    Some(next) => next.0,
                    None => (start & !0xfff).saturating_add(0x2000),
                }
            };
            syms.push(Symbol { start, end, name: std::mem::take(&mut cands[i].3) });
        }
        SymbolTable { syms, read_us: 0 }
    }

    /// The table of a binary: its symbols and its PLT stubs.
    pub fn of_binary(data: &[u8]) -> SymbolTable {
        let t0 = std::time::Instant::now();
        let mut t = SymbolTable::from_elf(data);
        t.add_plt(data);
        t.read_us = t0.elapsed().as_micros() as u64;
        t
    }

    /// How long [`of_binary`](Self::of_binary) took to read this table, us (0 for others).
    pub fn read_us(&self) -> u64 {
        self.read_us
    }

    /// [`of_binary`](Self::of_binary), read once per build-id and file size and shared while
    /// anyone holds it: the pipeline's code map, the live symbolizer and the dump thread's
    /// look a large library's table up without reading it three times. A file without a
    /// build-id is read each time. (The size is in the key because a stripped copy keeps
    /// its unstripped file's build-id.)
    pub fn of_binary_shared(data: &[u8]) -> std::sync::Arc<SymbolTable> {
        use std::collections::HashMap;
        use std::sync::{Arc, Mutex, Weak};
        type Cache = Mutex<HashMap<(Vec<u8>, usize), Weak<SymbolTable>>>;
        static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
        let Some(id) = build_id(data) else { return Arc::new(SymbolTable::of_binary(data)) };
        let key = (id, data.len());
        let cache = CACHE.get_or_init(Cache::default);
        if let Some(t) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key).and_then(Weak::upgrade) {
            return t;
        }
        // Built outside the lock: two threads may both build a table once, never wait.
        let t = Arc::new(SymbolTable::of_binary(data));
        let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
        c.retain(|_, w| w.strong_count() > 0);
        c.insert(key, Arc::downgrade(&t));
        t
    }

    /// Adds the PLT symbols of the binary `data` (module docs); a symbol running into the
    /// `.plt` is cut at its start, as perf does.
    pub fn add_plt(&mut self, data: &[u8]) {
        let plt = plt_symbols(data);
        let Some(first) = plt.first() else { return };
        let lo = first.start;
        let hi = plt.iter().map(|s| s.end).max().unwrap_or(lo);
        for s in &mut self.syms {
            if s.start < lo && s.end > lo {
                s.end = lo;
            }
        }
        self.syms.retain(|s| s.end <= lo || s.start >= hi);
        self.syms.extend(plt);
        self.syms.sort_by_key(|s| s.start);
    }

    /// The symbol covering `addr` (link-time address), if any.
    pub fn lookup(&self, addr: u64) -> Option<&Symbol> {
        let i = self.syms.partition_point(|s| s.start <= addr);
        let s = self.syms.get(i.checked_sub(1)?)?;
        (addr < s.end).then_some(s)
    }

    /// Number of symbols.
    pub fn len(&self) -> usize {
        self.syms.len()
    }

    /// No symbols.
    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }

    /// The symbols, by address.
    pub fn symbols(&self) -> &[Symbol] {
        &self.syms
    }
}

/// perf's `get_plt_sizes`: (header, entry) of a PLT section on the architectures we run on.
fn plt_sizes(machine: u16, entsize: u64, align: u64) -> Option<(u64, u64)> {
    match machine {
        object::elf::EM_AARCH64 | object::elf::EM_RISCV | object::elf::EM_LOONGARCH => Some((32, 16)),
        object::elf::EM_ARM => Some((20, 12)),
        object::elf::EM_X86_64 | object::elf::EM_386 => {
            let e = if entsize == 8 || entsize == 16 {
                entsize
            } else if align == 8 {
                8
            } else {
                16
            };
            Some((e, e))
        }
        _ => (entsize > 0).then_some((entsize, entsize)),
    }
}

/// The x86-64 `jmp *disp(%rip)` of a PLT entry: the offset of the GOT slot from the entry
/// (perf's `get_x86_64_plt_disp`: an optional `endbr64` and `bnd` prefix first).
fn x86_64_plt_disp(p: &[u8]) -> Option<u64> {
    let mut n = 0;
    if p.starts_with(&[0xf3, 0x0f, 0x1e, 0xfa]) {
        n += 4;
    }
    if p.get(n) == Some(&0xf2) {
        n += 1;
    }
    if p.get(n..n + 2) != Some(&[0xff, 0x25]) {
        return None;
    }
    let d = i32::from_le_bytes(p.get(n + 2..n + 6)?.try_into().ok()?);
    Some((n as i64 + 6 + i64::from(d)) as u64)
}

/// The synthesized PLT symbols of an ELF file (module docs), by address.
pub fn plt_symbols(data: &[u8]) -> Vec<Symbol> {
    plt_symbols_of(data).unwrap_or_default()
}

fn plt_symbols_of(data: &[u8]) -> Option<Vec<Symbol>> {
    use object::read::elf::{ElfFile64, FileHeader, Rela as _, SectionHeader, Sym as _};
    let f = ElfFile64::<object::Endianness>::parse(data).ok()?;
    let e = f.endian();
    let machine = f.elf_header().e_machine(e);
    let x86 = matches!(machine, object::elf::EM_X86_64 | object::elf::EM_386);
    let sections = f.elf_section_table();
    let named = |n: &str| sections.section_by_name(e, n.as_bytes());
    let (_, plt) = named(".plt").filter(|(_, s)| s.sh_type(e) != object::elf::SHT_NOBITS)?;
    let (mut header, mut entry) = plt_sizes(machine, plt.sh_entsize(e), plt.sh_addralign(e))?;
    let plt_addr = plt.sh_addr(e);
    let file_off = |sec: &object::elf::SectionHeader64<object::Endianness>, addr: u64| addr - sec.sh_addr(e) + sec.sh_offset(e);
    let mut out = vec![Symbol { start: plt_addr, end: plt_addr + header, name: ".plt".into() }];
    // Names of symbols by index in the table a relocation section links to.
    // Each relocation section's symbol table, parsed once (not per relocation).
    let table_of = |link: object::SectionIndex| {
        object::read::elf::SymbolTable::parse(e, data, sections, link, sections.section(link).ok()?).ok()
    };
    let sym_name = |table: Option<&object::read::elf::SymbolTable<'_, object::elf::FileHeader64<object::Endianness>>>,
                    idx: u32|
     -> Option<String> {
        let table = table?;
        let sym = table.symbol(object::SymbolIndex(idx as usize)).ok()?;
        let name = sym.name(e, table.strings()).ok()?;
        (!name.is_empty()).then(|| String::from_utf8_lossy(name).into_owned())
    };
    if x86 && let Some((_, got)) = named(".plt.got").filter(|(_, s)| s.sh_entsize(e) > 0) {
        // GOT slot -> symbol, from .rela.dyn.
        let mut slots: Vec<(u64, u32)> = Vec::new();
        let mut link = object::SectionIndex(0);
        if let Some((_, rd)) = named(".rela.dyn")
            && let Ok(Some((relas, l))) = rd.rela(e, data)
        {
            link = l;
            slots = relas.iter().map(|r| (r.r_offset(e), r.r_sym(e, false))).filter(|&(_, s)| s != 0).collect();
            slots.sort_unstable();
        }
        let dyn_table = table_of(link);
        let bytes = got.data(e, data).ok()?;
        let step = got.sh_entsize(e);
        let mut i = 0;
        while i < got.sh_size(e) {
            let addr = got.sh_addr(e) + i;
            let name = x86_64_plt_disp(bytes.get(i as usize..).unwrap_or(&[]))
                .filter(|_| machine == object::elf::EM_X86_64)
                .and_then(|d| {
                    let slot = addr.wrapping_add(d);
                    let k = slots.binary_search_by_key(&slot, |s| s.0).ok()?;
                    sym_name(dyn_table.as_ref(), slots[k].1)
                })
                .map_or_else(|| format!("offset_{:#x}@plt", file_off(got, addr)), |n| format!("{n}@plt"));
            out.push(Symbol { start: addr, end: addr + step, name });
            i += step;
        }
    }
    let (mut offset, lazy) = match named(".plt.sec").filter(|_| x86) {
        Some((_, sec)) => {
            (header, entry) = plt_sizes(machine, sec.sh_entsize(e), sec.sh_addralign(e))?;
            out[0].end = plt_addr + plt.sh_size(e);
            (sec.sh_addr(e), false)
        }
        None => (plt_addr, true),
    };
    let sec_of_offset = if lazy { plt } else { named(".plt.sec")?.1 };
    let (_, rel) = named(".rela.plt")?;
    let (relas, link) = rel.rela(e, data).ok()??;
    let mut relas: Vec<_> = relas.iter().collect();
    if lazy {
        if relas.len() as u64 * entry == plt.sh_size(e) {
            out.remove(0);
        } else {
            offset += header;
        }
    }
    if x86 {
        relas.sort_by_key(|r| r.r_offset(e));
    }
    let plt_table = table_of(link);
    // The file's function symbols, for IRELATIVE slots; built on the first one.
    let funcs: std::cell::OnceCell<SymbolTable> = std::cell::OnceCell::new();
    for r in relas {
        let name = sym_name(plt_table.as_ref(), r.r_sym(e, false))
            .or_else(|| {
                // An IRELATIVE slot: the resolver's symbol (perf's get_ifunc_name).
                let addend = r.r_addend(e) as u64;
                (addend != 0)
                    .then(|| funcs.get_or_init(|| SymbolTable::from_elf(data)).lookup(addend).map(|s| s.name.clone()))
                    .flatten()
            })
            .map_or_else(|| format!("offset_{:#x}@plt", file_off(sec_of_offset, offset)), |n| format!("{n}@plt"));
        out.push(Symbol { start: offset, end: offset + entry, name });
        offset += entry;
    }
    out.sort_by_key(|s| s.start);
    Some(out)
}

/// The GNU build-id of an ELF file.
pub fn build_id(data: &[u8]) -> Option<Vec<u8>> {
    let f = object::File::parse(data).ok()?;
    f.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// The `.gnu_debuglink` of an ELF file: the debug file's name and its CRC-32.
pub fn debuglink(data: &[u8]) -> Option<(String, u32)> {
    let f = object::File::parse(data).ok()?;
    let (name, crc) = f.gnu_debuglink().ok().flatten()?;
    Some((String::from_utf8_lossy(name).into_owned(), crc))
}

/// Where gdb and perf look for the separate debug file of `path` (a file in the target's
/// file system, seen through `root`): by build-id under `/usr/lib/debug/.build-id/`, then by
/// debuglink name next to the file, in its `.debug/` directory and under `/usr/lib/debug/`
/// followed by the file's directory. Candidates, in order; the caller checks which exist
/// (and the debuglink CRC).
pub fn debug_file_candidates(root: &str, path: &str, build_id: Option<&[u8]>, link: Option<&str>) -> Vec<std::path::PathBuf> {
    let mut v = Vec::new();
    if let Some(id) = build_id.filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        v.push(format!("{root}/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]).into());
    }
    if let Some(name) = link {
        let dir = std::path::Path::new(path).parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        v.push(format!("{root}{dir}/{name}").into());
        v.push(format!("{root}{dir}/.debug/{name}").into());
        v.push(format!("{root}/usr/lib/debug{dir}/{name}").into());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(syms: &[(u64, u64, &str)]) -> SymbolTable {
        // Through the same fixup as from_elf: sized symbols exact, zero-size to the next.
        let mut v: Vec<Symbol> = Vec::new();
        for (i, &(start, size, name)) in syms.iter().enumerate() {
            let end = if size > 0 { start + size } else { syms.get(i + 1).map_or((start & !0xfff) + 0x2000, |n| n.0) };
            v.push(Symbol { start, end, name: name.into() });
        }
        SymbolTable { syms: v, read_us: 0 }
    }

    /// An address past a sized symbol has no name; a zero-size symbol reaches the next one.
    #[test]
    fn extents() {
        let t = table(&[(0x1000, 0x1c, "tiny"), (0x1100, 0, "asm_entry"), (0x1200, 0x40, "f")]);
        assert_eq!(t.lookup(0x1000).map(|s| s.name.as_str()), Some("tiny"));
        assert_eq!(t.lookup(0x101b).map(|s| s.name.as_str()), Some("tiny"));
        assert_eq!(t.lookup(0x101c), None);
        assert_eq!(t.lookup(0x10ff), None);
        assert_eq!(t.lookup(0x11ff).map(|s| s.name.as_str()), Some("asm_entry"));
        assert_eq!(t.lookup(0x1240), None);
        assert_eq!(t.lookup(0xfff), None);
    }

    /// The best of symbols at one address: sized, then global, then fewer underscores.
    #[test]
    fn duplicates() {
        let r = |size, scope, weak, name| rank(size, scope, weak, name);
        assert!(r(4, SymbolScope::Compilation, false, "a") > r(0, SymbolScope::Dynamic, false, "a"));
        assert!(r(4, SymbolScope::Dynamic, false, "memcpy") > r(4, SymbolScope::Dynamic, true, "memcpy"));
        assert!(r(4, SymbolScope::Dynamic, true, "x") > r(4, SymbolScope::Compilation, false, "x"));
        assert!(r(4, SymbolScope::Dynamic, false, "memcpy") > r(4, SymbolScope::Dynamic, false, "__memcpy"));
    }

    #[test]
    fn candidates() {
        let c = debug_file_candidates("/proc/1/root", "/usr/lib/libx.so.1", Some(&[0xab, 0xcd, 0xef]), Some("libx.so.1.debug"));
        let c: Vec<String> = c.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        assert_eq!(
            c,
            [
                "/proc/1/root/usr/lib/debug/.build-id/ab/cdef.debug",
                "/proc/1/root/usr/lib/libx.so.1.debug",
                "/proc/1/root/usr/lib/.debug/libx.so.1.debug",
                "/proc/1/root/usr/lib/debug/usr/lib/libx.so.1.debug",
            ]
        );
    }
}

#[cfg(test)]
mod shared_tests {
    use super::*;

    /// The shared table of a binary is the table [`SymbolTable::of_binary`] reads, read once
    /// while held, and read again once every holder dropped it.
    #[test]
    fn shared_table_per_build_id() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        assert!(build_id(&exe).is_some(), "the test binary has a build-id (the linker's default)");
        let own = SymbolTable::of_binary(&exe);
        let a = SymbolTable::of_binary_shared(&exe);
        let b = SymbolTable::of_binary_shared(&exe);
        assert!(std::sync::Arc::ptr_eq(&a, &b));
        assert_eq!(a.syms, own.syms);
        let weak = std::sync::Arc::downgrade(&a);
        drop((a, b));
        assert!(weak.upgrade().is_none(), "the cache does not keep a table alive");
        // A copy without the last byte (another size) is not taken for the same file.
        let c = SymbolTable::of_binary_shared(&exe[..exe.len() - 1]);
        let d = SymbolTable::of_binary_shared(&exe);
        assert!(!std::sync::Arc::ptr_eq(&c, &d));
    }
}

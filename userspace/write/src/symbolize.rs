//! Inline-frame symbolization as llvm-profgen does it for DWARF binaries
//! (`ProfiledBinary::symbolize`): per address, the inline frames outermost first, each with
//! the function's linkage name (else its name) and the line location
//! `(line - DW_AT_decl_line) & 0xffff` plus the raw discriminator. The innermost frame's line
//! and discriminator come from the line table, each caller frame's from the
//! `DW_AT_call_line` / `DW_AT_GNU_discriminator` of the inlined callee.
//!
//! [`Symbolizer`] keeps the context-sensitive writer I/O-free; [`DwarfSymbolizer`] reads the
//! DWARF of ELF bytes the caller passes in.

use std::collections::HashMap;
use std::sync::Arc;

use object::{Object, ObjectSection};

use etm_profile::ElfError;

/// One (possibly inlined) frame at an address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InlineFrame {
    /// Linkage name (or name) of the function, canonicalized as llvm-profgen does.
    pub func: Arc<str>,
    /// Line offset from the function's declaration line (16 bits).
    pub line_offset: u32,
    /// Raw DWARF discriminator (not decoded).
    pub discriminator: u32,
}

/// Maps a link-time address to its inline frames, outermost first; empty when no function
/// with debug info covers the address.
pub trait Symbolizer {
    /// Inline frames at `addr`, outermost first.
    fn inline_frames(&self, addr: u64) -> Vec<InlineFrame>;
}

/// `FunctionSamples::getCanonicalFnName(name, "selected")`: strip a trailing `.llvm.N` or
/// `.part.N` suffix (`.__uniq.N` is kept).
pub fn canonical_fn_name(name: &str) -> &str {
    let mut cand = name;
    for suf in [".llvm.", ".part."] {
        let Some(it) = cand.rfind(suf) else { continue };
        if cand.rfind('.') == Some(it + suf.len() - 1) {
            cand = &cand[..it];
        }
    }
    cand
}

#[derive(Debug)]
struct Node {
    func: Arc<str>,
    decl_line: u32,
    ranges: Vec<(u64, u64)>,
    call_line: u32,
    call_disc: u32,
    children: Vec<usize>,
}

#[derive(Debug)]
struct Sequence {
    start: u64,
    end: u64,
    /// (address, line, discriminator)
    rows: Vec<(u64, u32, u32)>,
}

/// DWARF symbolizer over the bytes of an ELF file (see the module docs).
#[derive(Debug, Default)]
pub struct DwarfSymbolizer {
    nodes: Vec<Node>,
    /// (begin, end, subprogram node), sorted by begin.
    subprograms: Vec<(u64, u64, usize)>,
    sequences: Vec<Sequence>,
    units_skipped: usize,
}

type Slice<'a> = gimli::EndianSlice<'a, gimli::RunTimeEndian>;

fn attr_u32(e: &gimli::DebuggingInformationEntry<'_, '_, Slice<'_>>, at: gimli::DwAt) -> Option<u32> {
    e.attr_value(at).ok().flatten().and_then(|v| v.udata_value()).map(|v| v as u32)
}

impl DwarfSymbolizer {
    /// Index the DWARF of an ELF image (no DWARF gives a symbolizer that knows nothing).
    pub fn from_elf(data: &[u8]) -> Result<Self, ElfError> {
        let file = object::File::parse(data)?;
        let endian = if file.is_little_endian() { gimli::RunTimeEndian::Little } else { gimli::RunTimeEndian::Big };
        let load = |id: gimli::SectionId| -> Result<Slice<'_>, gimli::Error> {
            let d = file.section_by_name(id.name()).and_then(|s| s.data().ok()).unwrap_or(&[]);
            Ok(gimli::EndianSlice::new(d, endian))
        };
        let mut out = DwarfSymbolizer::default();
        let Ok(dwarf) = gimli::Dwarf::load(load) else { return Ok(out) };
        let mut units = dwarf.units();
        while let Ok(Some(header)) = units.next() {
            let Ok(unit) = dwarf.unit(header) else {
                out.units_skipped += 1;
                continue;
            };
            out.index_lines(&unit);
            out.index_dies(&dwarf, &unit);
        }
        out.subprograms.sort_unstable();
        out.sequences.sort_unstable_by_key(|s| s.start);
        Ok(out)
    }

    /// Compilation units that could not be parsed (their code symbolizes to nothing).
    pub fn units_skipped(&self) -> usize {
        self.units_skipped
    }

    fn index_lines(&mut self, unit: &gimli::Unit<Slice<'_>>) {
        let Some(prog) = unit.line_program.clone() else { return };
        let mut rows = prog.rows();
        let mut cur: Vec<(u64, u32, u32)> = Vec::new();
        while let Ok(Some((_, row))) = rows.next_row() {
            if row.end_sequence() {
                if let Some(&(start, _, _)) = cur.first()
                    && start != 0
                    && row.address() > start
                {
                    self.sequences.push(Sequence { start, end: row.address(), rows: std::mem::take(&mut cur) });
                }
                cur.clear();
                continue;
            }
            let line = row.line().map(|l| l.get() as u32).unwrap_or(0);
            cur.push((row.address(), line, row.discriminator() as u32));
        }
    }

    /// Name and decl line, following `DW_AT_specification` / `DW_AT_abstract_origin` like
    /// LLVM's `findRecursively`.
    fn name_and_decl(
        unit: &gimli::Unit<Slice<'_>>,
        dwarf: &gimli::Dwarf<Slice<'_>>,
        off: gimli::UnitOffset,
    ) -> (Option<String>, Option<String>, Option<u32>) {
        let (mut linkage, mut name, mut decl) = (None, None, None);
        let mut work = vec![off];
        let mut seen = 0;
        while let Some(o) = work.pop() {
            seen += 1;
            if seen > 16 {
                break;
            }
            let Ok(e) = unit.entry(o) else { continue };
            let s = |at| {
                e.attr_value(at)
                    .ok()
                    .flatten()
                    .and_then(|v| dwarf.attr_string(unit, v).ok())
                    .map(|s| s.to_string_lossy().into_owned())
            };
            if linkage.is_none() {
                linkage = s(gimli::DW_AT_linkage_name).or_else(|| s(gimli::DW_AT_MIPS_linkage_name));
            }
            if name.is_none() {
                name = s(gimli::DW_AT_name);
            }
            if decl.is_none() {
                decl = attr_u32(&e, gimli::DW_AT_decl_line);
            }
            for at in [gimli::DW_AT_specification, gimli::DW_AT_abstract_origin] {
                if let Ok(Some(gimli::AttributeValue::UnitRef(r))) = e.attr_value(at) {
                    work.push(r);
                }
            }
        }
        (linkage, name, decl)
    }

    fn index_dies(&mut self, dwarf: &gimli::Dwarf<Slice<'_>>, unit: &gimli::Unit<Slice<'_>>) {
        let mut entries = unit.entries();
        // Stack of (depth, node index or None for non-function scopes).
        let mut stack: Vec<(isize, Option<usize>)> = Vec::new();
        let mut depth: isize = 0;
        let mut names: HashMap<String, Arc<str>> = HashMap::new();
        while let Ok(Some((delta, e))) = entries.next_dfs() {
            depth += delta;
            while stack.last().is_some_and(|&(d, _)| d >= depth) {
                stack.pop();
            }
            let tag = e.tag();
            if tag != gimli::DW_TAG_subprogram && tag != gimli::DW_TAG_inlined_subroutine {
                stack.push((depth, stack.last().and_then(|&(_, n)| n)));
                continue;
            }
            let mut ranges = Vec::new();
            if let Ok(mut it) = dwarf.die_ranges(unit, e) {
                while let Ok(Some(r)) = it.next() {
                    if r.begin < r.end {
                        ranges.push((r.begin, r.end));
                    }
                }
            }
            let (linkage, name, decl) = Self::name_and_decl(unit, dwarf, e.offset());
            let n = linkage.or(name).unwrap_or_default();
            let canon = canonical_fn_name(&n).to_string();
            let func = names.entry(canon.clone()).or_insert_with(|| Arc::from(canon.as_str())).clone();
            let parent = stack.last().and_then(|&(_, n)| n);
            let idx = self.nodes.len();
            let inlined = tag == gimli::DW_TAG_inlined_subroutine;
            self.nodes.push(Node {
                func,
                decl_line: decl.unwrap_or(0),
                ranges: ranges.clone(),
                call_line: if inlined { attr_u32(e, gimli::DW_AT_call_line).unwrap_or(0) } else { 0 },
                call_disc: if inlined { attr_u32(e, gimli::DW_AT_GNU_discriminator).unwrap_or(0) } else { 0 },
                children: Vec::new(),
            });
            match (inlined, parent) {
                (true, Some(p)) => self.nodes[p].children.push(idx),
                (false, _) => {
                    for (b, en) in ranges {
                        self.subprograms.push((b, en, idx));
                    }
                }
                (true, None) => {}
            }
            stack.push((depth, Some(idx)));
        }
    }

    fn line_at(&self, addr: u64) -> Option<(u32, u32)> {
        let i = self.sequences.partition_point(|s| s.start <= addr);
        // Sequences may overlap (discarded COMDAT code at 0 is skipped); search back a little.
        for s in self.sequences[..i].iter().rev().take(8) {
            if addr < s.end {
                let j = s.rows.partition_point(|r| r.0 <= addr);
                return s.rows.get(j.checked_sub(1)?).map(|r| (r.1, r.2));
            }
        }
        None
    }
}

impl Symbolizer for DwarfSymbolizer {
    fn inline_frames(&self, addr: u64) -> Vec<InlineFrame> {
        let i = self.subprograms.partition_point(|s| s.0 <= addr);
        let Some(&(_, _, sp)) = self.subprograms[..i].iter().rev().take(8).find(|s| addr < s.1) else {
            return Vec::new();
        };
        // Chain outermost first.
        let mut chain = vec![sp];
        let mut cur = sp;
        'descend: loop {
            for &c in &self.nodes[cur].children {
                if self.nodes[c].ranges.iter().any(|&(b, e)| b <= addr && addr < e) {
                    chain.push(c);
                    cur = c;
                    continue 'descend;
                }
            }
            break;
        }
        let (leaf_line, leaf_disc) = self.line_at(addr).unwrap_or((0, 0));
        let mut out = Vec::with_capacity(chain.len());
        for (k, &n) in chain.iter().enumerate() {
            let node = &self.nodes[n];
            if node.func.is_empty() {
                break;
            }
            let (line, disc) = match chain.get(k + 1) {
                Some(&callee) => (self.nodes[callee].call_line, self.nodes[callee].call_disc),
                None => (leaf_line, leaf_disc),
            };
            out.push(InlineFrame {
                func: node.func.clone(),
                line_offset: line.wrapping_sub(node.decl_line) & 0xffff,
                discriminator: disc,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known LLVM suffixes are stripped only when they are the last dotted component.
    #[test]
    fn canonical_names() {
        assert_eq!(canonical_fn_name("foo.llvm.123"), "foo");
        assert_eq!(canonical_fn_name("foo.part.1"), "foo");
        assert_eq!(canonical_fn_name("foo.__uniq.42"), "foo.__uniq.42");
        assert_eq!(canonical_fn_name("foo.llvm.1.cold"), "foo.llvm.1.cold");
        assert_eq!(canonical_fn_name("bar"), "bar");
    }

    /// Bytes that are not ELF are an error, not a panic.
    #[test]
    fn rejects_garbage() {
        assert!(DwarfSymbolizer::from_elf(b"not an elf").is_err());
    }
}

/// Checks [`DwarfSymbolizer`] against LLVM's own DWARF symbolizer (`llvm-symbolizer-22
/// --inlines --output-style=JSON`, the library llvm-profgen symbolizes with) at every
/// instruction of the DWARF test binaries in `../shared/testdata/profgen`.
#[cfg(test)]
mod llvm_tests {
    use super::*;
    use std::io::Write as _;
    use std::path::PathBuf;
    use std::process::{Command, Stdio};

    fn shared() -> PathBuf {
        std::env::var_os("ETM_BPF_SHARED")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
    }

    /// LLVM's frames at each address, outermost first, as llvm-profgen's `symbolize` keeps
    /// them (stop at an empty name; offset = (line - start line) & 0xffff).
    /// Also says whether the outermost frame has no start line (no DWARF function).
    fn llvm_frames(bin: &std::path::Path, addrs: &[u64]) -> Option<Vec<(Vec<InlineFrame>, bool)>> {
        let mut child = Command::new("llvm-symbolizer-22")
            .arg(format!("--obj={}", bin.display()))
            .args(["--inlines", "--functions=linkage", "--no-demangle", "--output-style=JSON"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        let mut input = String::new();
        for a in addrs {
            input.push_str(&format!("0x{a:x}\n"));
        }
        let mut stdin = child.stdin.take()?;
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let out = child.wait_with_output().ok()?;
        writer.join().ok()?.ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        let mut res = Vec::new();
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).ok()?;
            let mut frames = Vec::new();
            let syms = v["Symbol"].as_array()?;
            let no_start = syms.last().is_none_or(|f| f["StartLine"].as_u64().unwrap_or(0) == 0);
            for f in syms.iter().rev() {
                let name = f["FunctionName"].as_str().unwrap_or("");
                if name.is_empty() || name == "<invalid>" {
                    break;
                }
                let line = f["Line"].as_u64().unwrap_or(0) as u32;
                let start = f["StartLine"].as_u64().unwrap_or(0) as u32;
                frames.push(InlineFrame {
                    func: Arc::from(canonical_fn_name(name)),
                    line_offset: line.wrapping_sub(start) & 0xffff,
                    discriminator: f["Discriminator"].as_u64().unwrap_or(0) as u32,
                });
            }
            res.push((frames, no_start));
        }
        Some(res)
    }

    fn symbol_at(data: &[u8], a: u64) -> Option<String> {
        use object::ObjectSymbol;
        let f = object::File::parse(data).ok()?;
        // The sized symbol covering `a`, else the nearest symbol before it.
        let syms: Vec<_> = f.symbols().filter(|s| s.address() <= a && s.address() != 0).collect();
        syms.iter()
            .find(|s| a < s.address() + s.size())
            .or_else(|| syms.iter().max_by_key(|s| s.address()))
            .and_then(|s| s.name().ok().map(String::from))
    }

    /// Same inline frames as LLVM's symbolizer at every instruction covered by DWARF.
    #[test]
    fn matches_llvm_symbolizer() {
        let root = shared().join("testdata/profgen");
        if !root.is_dir() {
            etm_testutil::skip(format!("no shared profgen test data at {}", root.display()));
            return;
        }
        if Command::new("llvm-symbolizer-22").arg("--version").output().is_err() {
            etm_testutil::skip("llvm-symbolizer-22 not installed");
            return;
        }
        let bins = [
            "noinline-cs-noprobe/noinline-cs-noprobe.perfbin",
            "inline-cs-noprobe/inline-cs-noprobe.perfbin",
            "recursion-compression-noprobe/recursion-compression-noprobe.perfbin",
            "inline-noprobe/inline-noprobe.perfbin",
            "fname-canonicalization/unique-linkage-name-dwarf.perfbin",
            "func-split/func-split.perfbin",
            "coroutine/coroutine.perfbin",
            // Not multi-load-segs.perfbin: gimli 0.32 fails to parse 2 of its 6 units (glibc
            // csu objects, `BadUnsignedLeb128`); they are counted in `units_skipped`.
        ];
        let (mut checked, mut with_frames) = (0usize, 0usize);
        for rel in bins {
            let path = root.join(rel);
            let Ok(data) = std::fs::read(&path) else {
                etm_testutil::skip(format!("{rel} missing"));
                continue;
            };
            let sym = DwarfSymbolizer::from_elf(&data).unwrap();
            let facts = crate::elf::ElfCodeFacts::from_elf(&data).unwrap();
            let addrs: Vec<u64> = facts.instructions().to_vec();
            let theirs = llvm_frames(&path, &addrs).expect("llvm-symbolizer output");
            assert_eq!(theirs.len(), addrs.len(), "{rel}: symbolizer answered {} of {}", theirs.len(), addrs.len());
            for (a, (t, no_start)) in addrs.iter().zip(&theirs) {
                let ours = sym.inline_frames(*a);
                // Without DWARF, llvm-symbolizer names the function from the symbol table
                // (llvm-profgen does not use it): only compare addresses with DWARF frames.
                if ours.is_empty() && t.len() <= 1 && *no_start {
                    continue;
                }
                // llvm-symbolizer also renames the outermost frame after the ELF symbol
                // covering the address (e.g. `foo.cold`); llvm-profgen turns that off.
                let mut t = t.clone();
                if let (Some(o), Some(f)) = (ours.first(), t.first_mut())
                    && o.func != f.func
                    && symbol_at(&data, *a).as_deref() == Some(canonical_fn_name(&f.func))
                {
                    f.func = o.func.clone();
                }
                assert_eq!(ours, t, "{rel}: frames at {a:#x}");
                checked += 1;
                with_frames += (ours.len() > 1) as usize;
            }
        }
        eprintln!("symbolizer: {checked} addresses identical to llvm-symbolizer-22 ({with_frames} with inline frames)");
        assert!(checked > 1000 && with_frames > 10, "too little checked: {checked}/{with_frames}");
    }
}

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

use crate::ElfError;

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
            let Ok(unit) = dwarf.unit(header) else { continue };
            out.index_lines(&unit);
            out.index_dies(&dwarf, &unit);
        }
        out.subprograms.sort_unstable();
        out.sequences.sort_unstable_by_key(|s| s.start);
        Ok(out)
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
            let s = |at| e.attr_value(at).ok().flatten().and_then(|v| dwarf.attr_string(unit, v).ok()).map(|s| s.to_string_lossy().into_owned());
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

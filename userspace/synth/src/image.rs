//! The code of a static AArch64 ELF program: its executable `PT_LOAD` segments, read with the
//! `object` crate, and an instruction-class cache over them.

use std::collections::HashMap;
use std::path::Path;

use object::{Object, ObjectSegment, SegmentFlags};

use crate::SynthError;
use crate::a64::{self, InsnClass};

/// `PF_X` in an ELF program header.
const PF_X: u32 = 1;

/// One executable segment.
#[derive(Debug, Clone)]
pub struct Segment {
    /// Link-time (= runtime, static non-PIE) virtual address.
    pub vaddr: u64,
    /// File bytes of the segment (`p_filesz`).
    pub data: Vec<u8>,
    /// File offset of the segment (`p_offset`).
    pub file_offset: u64,
}

/// Executable code of a program plus a per-address class cache.
#[derive(Debug, Clone)]
pub struct CodeImage {
    /// Executable segments, sorted by address.
    pub segments: Vec<Segment>,
    /// ELF entry point.
    pub entry: u64,
    cache: HashMap<u64, InsnClass>,
}

impl CodeImage {
    /// Read the executable segments of the ELF file at `path`.
    pub fn load(path: &Path) -> Result<Self, SynthError> {
        let bytes = std::fs::read(path).map_err(|source| SynthError::Io { path: path.to_path_buf(), source })?;
        Self::parse(&bytes).map_err(|e| match e {
            SynthError::Elf { reason, .. } => SynthError::Elf { path: path.to_path_buf(), reason },
            other => other,
        })
    }

    /// Parse an in-memory ELF file.
    pub fn parse(bytes: &[u8]) -> Result<Self, SynthError> {
        let elf = |reason: String| SynthError::Elf { path: Default::default(), reason };
        let file = object::File::parse(bytes).map_err(|e| elf(e.to_string()))?;
        if file.architecture() != object::Architecture::Aarch64 {
            return Err(elf(format!("not an AArch64 program ({:?})", file.architecture())));
        }
        let mut segments = Vec::new();
        for seg in file.segments() {
            let exec = match seg.flags() {
                SegmentFlags::Elf { p_flags } => p_flags & PF_X != 0,
                _ => false,
            };
            if !exec {
                continue;
            }
            let data = seg.data().map_err(|e| elf(e.to_string()))?.to_vec();
            segments.push(Segment { vaddr: seg.address(), data, file_offset: seg.file_range().0 });
        }
        if segments.is_empty() {
            return Err(elf("no executable segment".into()));
        }
        segments.sort_by_key(|s| s.vaddr);
        Ok(CodeImage { segments, entry: file.entry(), cache: HashMap::new() })
    }

    /// The instruction word at `addr`, if it lies in an executable segment.
    pub fn insn(&self, addr: u64) -> Option<u32> {
        let seg = self.segments.iter().find(|s| addr >= s.vaddr && addr + 4 <= s.vaddr + s.data.len() as u64)?;
        let off = (addr - seg.vaddr) as usize;
        Some(u32::from_le_bytes(seg.data[off..off + 4].try_into().ok()?))
    }

    /// The class of the instruction at `addr` (cached); `None` outside the image.
    pub fn class(&mut self, addr: u64) -> Option<InsnClass> {
        if let Some(c) = self.cache.get(&addr) {
            return Some(*c);
        }
        let c = a64::classify(self.insn(addr)?, addr);
        self.cache.insert(addr, c);
        Some(c)
    }
}

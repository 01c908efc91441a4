//! [`BinaryInfo`] from ELF file contents (the caller reads the file).

use object::{Object, ObjectSection, ObjectSegment, SectionKind, SegmentFlags};

use crate::{BinaryInfo, ExecSegment};

/// Why an ELF image could not be described.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// The bytes are not a parsable object file.
    #[error("not a valid elf file: {0}")]
    Parse(#[from] object::Error),
    /// The file has no executable `PT_LOAD` segment.
    #[error("no executable load segment")]
    NoExecSegment,
}

const PF_X: u32 = 1;

impl BinaryInfo {
    /// Describe an ELF binary from its bytes; `path` is recorded as given.
    pub fn from_elf(path: &str, data: &[u8]) -> Result<BinaryInfo, ElfError> {
        let file = object::File::parse(data)?;
        let mut exec_segments = Vec::new();
        for seg in file.segments() {
            let exec = matches!(seg.flags(), SegmentFlags::Elf { p_flags } if p_flags & PF_X != 0);
            if exec {
                let (offset, _) = seg.file_range();
                exec_segments.push(ExecSegment { vaddr: seg.address(), memsz: seg.size(), offset });
            }
        }
        if exec_segments.is_empty() {
            return Err(ElfError::NoExecSegment);
        }
        let mut code_ranges: Vec<(u64, u64)> = file
            .sections()
            .filter(|s| s.kind() == SectionKind::Text && s.size() > 0)
            .map(|s| (s.address(), s.address() + s.size()))
            .collect();
        if code_ranges.is_empty() {
            code_ranges = exec_segments.iter().map(|s| (s.vaddr, s.vaddr + s.memsz)).collect();
        }
        code_ranges.sort_unstable();
        let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
        Ok(BinaryInfo {
            path: path.to_string(),
            build_id,
            exec_segments,
            code_ranges,
            is_pie: file.kind() == object::ObjectKind::Dynamic,
        })
    }
}

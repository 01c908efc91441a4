//! The exact profile of an AArch64 program: qemu-user's executed path walked with the true
//! call stack (`etm_synth::truth::CallStack`), every instruction counted in its calling
//! context, named from the ELF symbol table. A sampled profile of the same program is a draw
//! from these shares (sampling on cycles where, as under `-icount`, cycles count instructions).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use object::{Object, ObjectSymbol};

use etm_synth::image::CodeImage;
use etm_synth::qemu::{self, QemuOptions};
use etm_synth::truth::{CallStack, PathStats, flow};

/// Function symbols: (start, end, name), sorted.
pub struct Symbols(Vec<(u64, u64, String)>);

impl Symbols {
    pub fn parse(elf: &[u8]) -> anyhow::Result<Symbols> {
        let f = object::File::parse(elf).context("parse the ELF file")?;
        let mut v: Vec<(u64, u64, String)> = f
            .symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
            .filter_map(|s| Some((s.address(), s.address() + s.size(), s.name().ok()?.to_string())))
            .collect();
        v.sort();
        Ok(Symbols(v))
    }

    /// The function holding `addr`.
    pub fn name(&self, addr: u64) -> Option<&str> {
        let i = self.0.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        let s = &self.0[i];
        (addr < s.1).then_some(s.2.as_str())
    }
}

/// Instruction counts per calling context, as folded stacks from `root` (outermost first,
/// `;`-separated, the leaf last); instructions outside any context under `root` count as
/// `(other)`.
pub fn context_counts(elf: &[u8], pcs: &[u64], root: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let syms = Symbols::parse(elf)?;
    let mut image = CodeImage::parse(elf)?;
    let mut stack = CallStack::default();
    let mut stats = PathStats::default();
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut key = String::new();
    for (i, &pc) in pcs.iter().enumerate() {
        key.clear();
        // Frames from the outermost: each return address names its caller.
        let mut names: Vec<&str> = stack.returns.iter().map(|&r| syms.name(r.wrapping_sub(4)).unwrap_or("?")).collect();
        names.push(syms.name(pc).unwrap_or("?"));
        match names.iter().position(|n| *n == root) {
            Some(p) => key.push_str(&names[p..].join(";")),
            None => key.push_str("(other)"),
        }
        *counts.entry(key.clone()).or_default() += 1;
        let f = flow(image.class(pc), pc, pcs.get(i + 1).copied(), false);
        stack.apply(pc, f, &mut stats);
    }
    Ok(counts)
}

/// Runs `program args` under qemu-user and returns its context counts from `root`.
pub fn program_counts(program: &Path, args: &[String], root: &str, max_insns: u64) -> anyhow::Result<BTreeMap<String, u64>> {
    let elf = std::fs::read(program).with_context(|| format!("read {}", program.display()))?;
    let run = qemu::run(program, args, &QemuOptions { max_insns, ..Default::default() })?;
    anyhow::ensure!((run.pcs.len() as u64) < max_insns, "{} did not finish within {max_insns} instructions", program.display());
    context_counts(&elf, &run.pcs, root)
}

/// Shares of the contexts under the root (`(other)` left out: start-up and exit code, whose
/// share depends on the run's length).
pub fn shares(counts: &BTreeMap<String, u64>) -> BTreeMap<String, f64> {
    let total: u64 = counts.iter().filter(|(k, _)| *k != "(other)").map(|(_, v)| v).sum();
    counts.iter().filter(|(k, _)| *k != "(other)").map(|(k, v)| (k.clone(), *v as f64 / total.max(1) as f64)).collect()
}

/// A `profile.folded` (outermost first, `count` last) cut to the contexts from `root`; other
/// stacks count as `(other)`.
pub fn folded_counts(text: &str, root: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else { continue };
        let Ok(n) = n.parse::<u64>() else { continue };
        let frames: Vec<&str> = stack.split(';').collect();
        let key = match frames.iter().position(|f| *f == root) {
            Some(p) => frames[p..].join(";"),
            None => "(other)".to_string(),
        };
        *out.entry(key).or_default() += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_is_cut_at_the_root() {
        let c = folded_counts("_start;__libc_start_main;main;work;alpha 7\nmain;work;alpha 3\n_start;x 2\nbad line\n", "main");
        assert_eq!(c["main;work;alpha"], 10);
        assert_eq!(c["(other)"], 2);
        assert_eq!(c.len(), 2);
    }
}

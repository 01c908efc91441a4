//! Reader for `perf script -F ip,brstack` text (with or without call stacks), plain or
//! aggregated (a decimal count line before a sample), with `PERF_RECORD_MMAP[2]` lines, into a
//! [`HybridProfile`].
//!
//! The parse follows llvm-profgen's (`PerfReader.cpp`) so that the samples we keep are the
//! samples it would read from the same text:
//! * the file is *hybrid* if its first sample has stack lines before its branch line, else
//!   *branch-only*; a file is read in one mode;
//! * a hybrid sample is indented hex stack lines (leaf first) then a branch line starting with
//!   `" 0x"`; a stack line that is not hex (comment, blank) abandons that sample;
//! * a branch-only line is an optional leading IP then `0xFROM/0xTO[/...]` entries; a broken
//!   entry ends the branch stack;
//! * MMAP lines (>= 50 chars, not starting with a digit) update the load base of a binary
//!   through [`MmapResolver::on_mmap`].
//!
//! Corrupt lines are counted in [`PerfScriptStats`] and skipped; nothing panics.

use crate::{Branch, HybridProfile, HybridSample, MmapResolver};

/// What the reader saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerfScriptStats {
    /// Lines read.
    pub lines: u64,
    /// Hybrid samples added (with their aggregated counts).
    pub hybrid_samples: u64,
    /// Branch-only samples added (with their aggregated counts).
    pub branch_only_samples: u64,
    /// MMAP/MMAP2 lines seen.
    pub mmap_events: u64,
    /// MMAP lines that set a binary's load base.
    pub mmap_matched: u64,
    /// MMAP lines that could not be parsed.
    pub mmap_unparsed: u64,
    /// Samples abandoned: non-hex stack line, no usable branch entry, missing branch line.
    pub rejected_samples: u64,
    /// Branch entries that did not parse (ending their branch stack).
    pub broken_branch_entries: u64,
}

/// How the file's samples are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerfScriptKind {
    /// Stack lines then a branch line (CSSPGO input).
    Hybrid,
    /// One line per sample: optional IP then branch entries (AutoFDO input).
    BranchOnly,
}

fn is_mmap_line(line: &str) -> bool {
    line.len() >= 50 && !line.as_bytes()[0].is_ascii_digit() && line.contains("PERF_RECORD_MMAP")
}

/// A line whose second whitespace token starts with `0x` and contains `/` (llvm-profgen's test).
fn is_branch_line(line: &str) -> bool {
    let mut it = line.split(' ').filter(|t| !t.is_empty());
    it.next();
    it.next().is_some_and(|t| t.starts_with("0x") && t.contains('/'))
}

fn parse_hex(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

fn parse_count(line: &str) -> Option<u64> {
    if line.is_empty() || !line.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    line.parse().ok()
}

/// Decide the file's layout the way llvm-profgen does (first sample-looking line).
pub fn detect_kind(text: &str) -> Option<PerfScriptKind> {
    let mut lines = text.lines().peekable();
    while let Some(mut line) = lines.next() {
        if parse_count(line).is_some() {
            match lines.next() {
                Some(l) => line = l,
                None => break,
            }
        }
        let mut frames = 0;
        loop {
            if parse_hex(line.trim_start()).is_none() {
                break;
            }
            frames += 1;
            match lines.next() {
                Some(l) => line = l,
                None => return None,
            }
        }
        if is_branch_line(line) {
            return Some(if frames > 0 { PerfScriptKind::Hybrid } else { PerfScriptKind::BranchOnly });
        }
    }
    None
}

/// Parse a branch line into `out` (newest first); returns the leading IP if present.
fn parse_branches(line: &str, out: &mut Vec<Branch>, stats: &mut PerfScriptStats) -> Option<u64> {
    out.clear();
    let mut tokens = line.split(' ').filter(|t| !t.is_empty()).peekable();
    let mut ip = None;
    if let Some(first) = tokens.peek()
        && !first.contains('/')
    {
        ip = parse_hex(first);
        if ip.is_none() {
            stats.broken_branch_entries += 1;
            return None;
        }
        tokens.next();
    }
    for tok in tokens {
        let mut parts = tok.split('/');
        let (Some(f), Some(t)) = (parts.next(), parts.next()) else {
            stats.broken_branch_entries += 1;
            break;
        };
        let (Some(from), Some(to)) = (f.get(2..).and_then(parse_hex), t.get(2..).and_then(parse_hex)) else {
            stats.broken_branch_entries += 1;
            break;
        };
        out.push(Branch { from, to });
    }
    ip
}

/// Parse `PERF_RECORD_MMAP2 pid/tid: [0xADDR(0xLEN) @ PGOFF ...]: prot path` (or MMAP).
/// Returns (addr, len, pgoff, path).
pub fn parse_mmap_line(line: &str) -> Option<(u64, u64, u64, &str)> {
    let rest = &line[line.find("PERF_RECORD_MMAP")?..];
    let rest = &rest[rest.find('[')? + 1..];
    let (addr, rest) = rest.split_once('(')?;
    let (len, rest) = rest.split_once(')')?;
    let rest = rest.trim_start().strip_prefix('@')?.trim_start();
    let pgoff_end = rest.find([' ', ']']).unwrap_or(rest.len());
    let pgoff_s = &rest[..pgoff_end];
    let rest = &rest[rest.find("]: ")? + 3..];
    let (_prot, path) = rest.split_once(' ')?;
    let hex = |s: &str| s.strip_prefix("0x").and_then(parse_hex);
    let pgoff = if pgoff_s == "0" { 0 } else { hex(pgoff_s)? };
    Some((hex(addr)?, hex(len)?, pgoff, path.trim_end()))
}

/// Read a whole perf-script text into `profile`, resolving addresses with `resolver` (whose
/// load bases the MMAP lines update as they come).
pub fn read_perfscript(text: &str, resolver: &mut MmapResolver, profile: &mut HybridProfile) -> PerfScriptStats {
    let mut stats = PerfScriptStats::default();
    let Some(kind) = detect_kind(text) else {
        // Still apply MMAP lines so the caller can see them counted.
        for line in text.lines() {
            stats.lines += 1;
            if is_mmap_line(line) {
                apply_mmap(line, resolver, &mut stats);
            }
        }
        return stats;
    };
    let lines: Vec<&str> = text.lines().collect();
    stats.lines = lines.len() as u64;
    let mut stack: Vec<u64> = Vec::with_capacity(128);
    let mut branches: Vec<Branch> = Vec::with_capacity(64);
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if is_mmap_line(line) {
            apply_mmap(line, resolver, &mut stats);
            i += 1;
            continue;
        }
        let mut count = 1;
        if let Some(c) = parse_count(line) {
            count = c;
            i += 1;
            if i >= lines.len() {
                break;
            }
        }
        match kind {
            PerfScriptKind::BranchOnly => {
                let ip = parse_branches(lines[i], &mut branches, &mut stats);
                i += 1;
                if branches.is_empty() {
                    stats.rejected_samples += 1;
                    continue;
                }
                let ip = ip.unwrap_or(branches[0].to);
                if count > 0 {
                    profile.add_branch_only(ip, &branches, resolver, count);
                    stats.branch_only_samples += count;
                }
            }
            PerfScriptKind::Hybrid => {
                stack.clear();
                let mut ok = true;
                while i < lines.len() && !lines[i].starts_with(" 0x") {
                    match parse_hex(lines[i].trim_start()) {
                        Some(a) => stack.push(a),
                        None => {
                            ok = false;
                            i += 1;
                            break;
                        }
                    }
                    i += 1;
                }
                if !ok || stack.is_empty() {
                    if i < lines.len() && lines[i].starts_with(" 0x") {
                        i += 1;
                    }
                    if !stack.is_empty() || ok {
                        stats.rejected_samples += 1;
                    }
                    continue;
                }
                if i >= lines.len() {
                    stats.rejected_samples += 1;
                    break;
                }
                parse_branches(lines[i], &mut branches, &mut stats);
                i += 1;
                if branches.is_empty() {
                    stats.rejected_samples += 1;
                    continue;
                }
                if count > 0 {
                    profile.add_counted(&HybridSample { stack: &stack, branches: &branches }, resolver, count);
                    stats.hybrid_samples += count;
                }
            }
        }
    }
    stats
}

fn apply_mmap(line: &str, resolver: &mut MmapResolver, stats: &mut PerfScriptStats) {
    stats.mmap_events += 1;
    match parse_mmap_line(line) {
        Some((addr, _len, pgoff, path)) => {
            if resolver.on_mmap(addr, pgoff, path).is_some() {
                stats.mmap_matched += 1;
            }
        }
        None => stats.mmap_unparsed += 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MMAP2 line forms perf and our writer produce both parse.
    #[test]
    fn parses_mmap2_lines() {
        let l = "PERF_RECORD_MMAP2 2854748/2854748: [0x400000(0x1000) @ 0 00:1d 123291722 526021]: r-xp /home/noinline-cs-noprobe.perfbin";
        assert_eq!(parse_mmap_line(l), Some((0x400000, 0x1000, 0, "/home/noinline-cs-noprobe.perfbin")));
        let m = "PERF_RECORD_MMAP2 1/1: [0x555555555000(0x1000) @ 0x1000 ]: r-xp app";
        assert_eq!(parse_mmap_line(m), Some((0x555555555000, 0x1000, 0x1000, "app")));
        assert_eq!(parse_mmap_line("PERF_RECORD_MMAP2 garbage"), None);
    }

    /// Layout detection matches llvm-profgen: stack lines before the branch line mean hybrid.
    #[test]
    fn detects_kind() {
        assert_eq!(detect_kind("\t 4005dc\n\t 400634\n 0x1/0x2  0x3/0x4\n"), Some(PerfScriptKind::Hybrid));
        assert_eq!(detect_kind("3\n   40062f 0x40062f/0x4005b0/P/-/-/9  0x1/0x2\n"), Some(PerfScriptKind::BranchOnly));
        assert_eq!(detect_kind("nothing here\n"), None);
    }

    /// A broken branch entry ends the branch stack; a leading IP is returned.
    #[test]
    fn branch_line_parsing() {
        let mut st = PerfScriptStats::default();
        let mut out = Vec::new();
        let ip = parse_branches("  40062f 0x40062f/0x4005b0/P/-/-/9  0x400645/0x4005ff/P 0xzz/0x1 0x5/0x6", &mut out, &mut st);
        assert_eq!(ip, Some(0x40062f));
        assert_eq!(out, vec![Branch { from: 0x40062f, to: 0x4005b0 }, Branch { from: 0x400645, to: 0x4005ff }]);
        assert_eq!(st.broken_branch_entries, 1);
    }
}

//! Folded-stack writer: one line per context with self samples, `outermost;...;leaf count`,
//! sorted by path (the format of Brendan Gregg's `stackcollapse` and inferno).

use std::io::{self, Write};

use crate::{frames::FrameTable, trie::ContextTrie};

/// Writes `name` with the separators of the folded format (`;`, newlines) replaced.
fn push_sanitized(out: &mut String, name: &str) {
    for c in name.chars() {
        out.push(match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        });
    }
}

/// The folded lines of `trie` (without trailing newlines), sorted.
pub fn folded_lines(trie: &ContextTrie, frames: &FrameTable) -> Vec<String> {
    let mut lines = Vec::new();
    let mut path = Vec::new();
    for id in trie.node_ids() {
        let n = trie.node(id);
        if n.self_count == 0 {
            continue;
        }
        trie.path_into(id, &mut path);
        let mut line = String::new();
        for (i, &f) in path.iter().enumerate() {
            if i > 0 {
                line.push(';');
            }
            push_sanitized(&mut line, &frames.get(f).function);
        }
        line.push(' ');
        line.push_str(&n.self_count.to_string());
        lines.push(line);
    }
    lines.sort_unstable();
    lines
}

/// Writes the folded profile of `trie` to `w`.
pub fn write_folded<W: Write + ?Sized>(trie: &ContextTrie, frames: &FrameTable, w: &mut W) -> io::Result<()> {
    for line in folded_lines(trie, frames) {
        writeln!(w, "{line}")?;
    }
    Ok(())
}

/// A line of a folded file that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {why}")]
pub struct FoldedError {
    pub line: usize,
    pub why: &'static str,
}

/// Reads a folded profile (`a;b;c count` per line; repeated paths add up). Empty lines are
/// skipped; a line without a count is an error.
pub fn parse_folded(text: &str) -> Result<std::collections::BTreeMap<Vec<String>, u64>, FoldedError> {
    let mut m = std::collections::BTreeMap::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim_end();
        if l.is_empty() {
            continue;
        }
        let (path, count) = l.rsplit_once(' ').ok_or(FoldedError { line: i + 1, why: "no count" })?;
        let count: u64 = count.parse().map_err(|_| FoldedError { line: i + 1, why: "count is not a number" })?;
        let path: Vec<String> = path.split(';').map(str::to_owned).collect();
        *m.entry(path).or_insert(0) += count;
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::Frame;

    /// Each context with self samples is one line, outermost first, counts summing to the total.
    #[test]
    fn writes_folded_lines() {
        let mut f = FrameTable::new();
        let main = f.intern(Frame::new("main", None));
        let a = f.intern(Frame::new("a;weird", None));
        let hot = f.intern(Frame::new("hot", None));
        let mut t = ContextTrie::new(100);
        t.add(&[main, a, hot], 3);
        t.add(&[main], 1);
        let mut out = Vec::new();
        write_folded(&t, &f, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "main 1\nmain;a:weird;hot 3\n");
    }
}

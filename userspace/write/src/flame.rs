//! Flame graphs (SVG) with inferno: of a folded profile, and the differential one of two
//! (inferno's `difffolded`: each frame coloured by how its self samples changed, red for more
//! in the second profile, blue for fewer; the first is normalised to the second's total so
//! runs of different length compare).

use std::io::{self, Write};

use inferno::flamegraph::{self, Options};

fn options(title: &str, count_name: &str) -> Options<'static> {
    let mut o = Options::default();
    o.title = title.to_owned();
    o.count_name = count_name.to_owned();
    o
}

/// The flame graph of folded `lines` (`a;b;c count`).
pub fn write_flamegraph<W: Write>(lines: &[String], title: &str, count_name: &str, w: W) -> io::Result<()> {
    write_with(options(title, count_name), lines, w)
}

/// [`write_flamegraph`] keeping every frame, however narrow (inferno leaves out frames under
/// 0.1 pixel by default): the widths of exact counts add up to their totals.
pub fn write_flamegraph_all<W: Write>(lines: &[String], title: &str, count_name: &str, w: W) -> io::Result<()> {
    let mut o = options(title, count_name);
    o.min_width = 0.0;
    write_with(o, lines, w)
}

fn write_with<W: Write>(mut o: Options<'static>, lines: &[String], w: W) -> io::Result<()> {
    if lines.is_empty() {
        // inferno refuses an empty profile; an empty graph says so.
        return flamegraph::from_lines(&mut o, ["[no samples] 1"].iter().copied(), w).map_err(io::Error::other);
    }
    flamegraph::from_lines(&mut o, lines.iter().map(String::as_str), w).map_err(io::Error::other)
}

/// The differential flame graph from folded `before` to `after` (counts of `count_name`).
pub fn write_diff_flamegraph<W: Write>(before: &str, after: &str, title: &str, count_name: &str, w: W) -> io::Result<()> {
    let mut diff = Vec::new();
    let dopt = inferno::differential::Options { normalize: true, ..Default::default() };
    inferno::differential::from_readers(dopt, before.as_bytes(), after.as_bytes(), &mut diff)?;
    let mut o = options(title, count_name);
    flamegraph::from_reader(&mut o, &diff[..], w).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SVG names every frame and carries the counts in its titles.
    #[test]
    fn svg_has_the_frames() {
        let mut out = Vec::new();
        write_flamegraph(&["main;hot 30".into(), "main;cold 10".into()], "t", "samples", &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        assert!(svg.starts_with("<?xml") && svg.contains("<svg"));
        assert!(svg.contains("hot (30 samples, 75.00%)"), "{svg}");
        assert!(svg.contains("cold (10 samples, 25.00%)"));
        let mut d = Vec::new();
        write_diff_flamegraph("main;hot 30\nmain;cold 10\n", "main;hot 10\nmain;cold 30\n", "d", "samples", &mut d).unwrap();
        let d = String::from_utf8(d).unwrap();
        assert!(d.contains("hot (10 samples, 25.00%; -50.00%)"), "{d}");
    }
}

//! pprof writer: the calling-context trie as a gzip-compressed `perftools.profiles.Profile`
//! (`profile.proto` from github.com/google/pprof, messages declared here with prost).
//!
//! [`build_address_profile`]: from the profile's sampled stacks (one per sampled instant: ETM's
//!   synthesized samples are not among them).
//!   One `Mapping` per executable segment of each binary, in link-time addresses
//!   (`memory_start` = `p_vaddr`, `memory_limit` = `p_vaddr + p_memsz`, `file_offset` =
//!   `p_offset`, file name and build-id), so pprof maps an address to its file offset as for
//!   a process image; one `Location` per distinct address (a caller's return address minus 1:
//!   the call instruction) with its `Line`s, inlined callees first, each with its function's
//!   file and line; a stack cut by the callers check gets a `[truncated]` root location.
//!   `pprof -lines`, `-addresses`, `-list` and `-disasm` work on it.
//!
//! Samples: `location_id` leaf first, values `[samples/count, cpu/nanoseconds]`.

use std::collections::HashMap;
use std::io::{self, Write};

use prost::Message;

/// `perftools.profiles.Profile` (the fields etm-bpf writes).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// `ValueType`: indices into the string table.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `Sample`: locations leaf first, one value per sample type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
}

/// `Mapping`: a binary's address range.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// `Location`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

/// `Line`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// `Function`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// Profile-wide information.
#[derive(Debug, Clone, Default)]
pub struct PprofMeta {
    /// Sampling period in nanoseconds (1e9 / frequency).
    pub period_ns: i64,
    /// Collection start, nanoseconds since the Unix epoch.
    pub time_nanos: i64,
    /// Collection duration in nanoseconds.
    pub duration_nanos: i64,
    /// Free-form comments.
    pub comments: Vec<String>,
}

#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// One frame of an address, as [`build_address_profile`]'s symbolizer reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceLine {
    pub function: String,
    pub file: String,
    pub line: i64,
}

/// The root location of a stack cut at a return address that follows no call.
pub const TRUNCATED: &str = "[truncated]";

/// Builds the pprof `Profile` of the address-level samples of `profile` (module docs).
/// `symbolize(binary, addr)` gives the frames at a link-time address of a binary of the
/// profile, innermost first; `unresolved` names an address in no known binary.
pub fn build_address_profile(
    profile: &etm_profile::HybridProfile,
    symbolize: &mut dyn FnMut(etm_profile::ProfileBinary, u64) -> Vec<SourceLine>,
    unresolved: &str,
    meta: &PprofMeta,
) -> Profile {
    let mut s = Strings::default();
    s.id("");
    let samples = s.id("samples");
    let count = s.id("count");
    let cpu = s.id("cpu");
    let ns = s.id("nanoseconds");
    let mut p = Profile {
        sample_type: vec![ValueType { r#type: samples, unit: count }, ValueType { r#type: cpu, unit: ns }],
        period_type: Some(ValueType { r#type: cpu, unit: ns }),
        period: meta.period_ns,
        time_nanos: meta.time_nanos,
        duration_nanos: meta.duration_nanos,
        default_sample_type: cpu,
        ..Default::default()
    };
    for c in &meta.comments {
        p.comment.push(s.id(c));
    }
    // Mappings: (binary, segment index) -> mapping id.
    let mut seg_maps: Vec<Vec<(u64, u64, u64)>> = Vec::new();
    for (b, info) in profile.binaries().iter().enumerate() {
        let mut segs = Vec::new();
        let build_id =
            info.build_id.as_ref().map(|v| v.iter().map(|x| format!("{x:02x}")).collect::<String>()).unwrap_or_default();
        for seg in &info.exec_segments {
            let id = p.mapping.len() as u64 + 1;
            p.mapping.push(Mapping {
                id,
                memory_start: seg.vaddr,
                memory_limit: seg.vaddr.saturating_add(seg.memsz),
                file_offset: seg.offset,
                filename: s.id(&info.path),
                build_id: s.id(&build_id),
                has_functions: true,
                has_filenames: true,
                has_line_numbers: true,
                has_inline_frames: true,
            });
            segs.push((seg.vaddr, seg.vaddr.saturating_add(seg.memsz), id));
        }
        debug_assert_eq!(seg_maps.len(), b);
        seg_maps.push(segs);
    }
    let mut functions: HashMap<(String, String), u64> = HashMap::new();
    let mut function = |p: &mut Profile, s: &mut Strings, name: &str, file: &str| -> u64 {
        if let Some(&id) = functions.get(&(name.to_owned(), file.to_owned())) {
            return id;
        }
        let id = p.function.len() as u64 + 1;
        let n = s.id(name);
        p.function.push(Function { id, name: n, system_name: n, filename: s.id(file) });
        functions.insert((name.to_owned(), file.to_owned()), id);
        id
    };
    let mut locations: HashMap<(Option<usize>, u64), u64> = HashMap::new();
    let mut truncated_loc = None;
    let mut agg: HashMap<Vec<u64>, i64> = HashMap::new();
    for smp in profile.stacks() {
        let mut ids = Vec::with_capacity(smp.stack().len() + 1);
        for (i, loc) in smp.stack().enumerate() {
            // A caller's frame is its call instruction, one byte before the return address.
            let addr = if i == 0 { loc.addr } else { loc.addr.saturating_sub(1) };
            let key = (loc.binary, addr);
            let id = match locations.get(&key) {
                Some(&id) => id,
                None => {
                    let id = p.location.len() as u64 + 1;
                    let (mapping_id, lines) = match loc.binary {
                        Some(b) => {
                            let m = seg_maps
                                .get(b)
                                .and_then(|v| v.iter().find(|(lo, hi, _)| *lo <= addr && addr < *hi))
                                .map_or(0, |m| m.2);
                            (m, symbolize(b, addr))
                        }
                        None => (0, vec![SourceLine { function: unresolved.to_owned(), file: String::new(), line: 0 }]),
                    };
                    let line = lines
                        .iter()
                        .map(|l| Line { function_id: function(&mut p, &mut s, &l.function, &l.file), line: l.line })
                        .collect();
                    p.location.push(Location { id, mapping_id, address: addr, line });
                    locations.insert(key, id);
                    id
                }
            };
            ids.push(id);
        }
        if smp.is_cut() {
            let id = *truncated_loc.get_or_insert_with(|| {
                let id = p.location.len() as u64 + 1;
                let f = function(&mut p, &mut s, TRUNCATED, "");
                p.location.push(Location { id, mapping_id: 0, address: 0, line: vec![Line { function_id: f, line: 0 }] });
                id
            });
            ids.push(id);
        }
        *agg.entry(ids).or_default() += smp.count as i64;
    }
    let mut agg: Vec<(Vec<u64>, i64)> = agg.into_iter().collect();
    agg.sort();
    for (ids, c) in agg {
        p.sample.push(Sample { location_id: ids, value: vec![c, c.saturating_mul(meta.period_ns)] });
    }
    p.string_table = s.table;
    p
}

/// Writes `profile` gzip-compressed (the on-disk pprof format).
pub fn write_pprof_gz<W: Write + ?Sized>(profile: &Profile, w: &mut W) -> io::Result<()> {
    let mut gz = flate2::write::GzEncoder::new(w, flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A written profile decodes back (gunzip + protobuf) to the samples: per-address
    /// locations (callers one byte before their return address) with their lines innermost
    /// first, mappings with their segment's extent, a `[truncated]` root for a cut stack,
    /// unresolved addresses under `[unknown]`.
    #[test]
    fn address_profile_round_trip() {
        use etm_profile::{BinaryInfo, ExecSegment, HybridProfile, HybridSample, IdentityResolver};
        let bin = |path: &str, vaddr, id: Option<Vec<u8>>| BinaryInfo {
            path: path.into(),
            build_id: id,
            exec_segments: vec![ExecSegment { vaddr, memsz: 0x1000, offset: vaddr - 0x400 }],
            code_ranges: vec![(vaddr, vaddr + 0x1000)],
            is_pie: true,
        };
        let r = IdentityResolver::new(vec![bin("/bin/demo", 0x1000, Some(vec![1, 2])), bin("/lib/libc.so.6", 0x7000, None)]);
        let mut prof = HybridProfile::new(Default::default());
        for _ in 0..7 {
            prof.add(&HybridSample { stack: &[0x7010, 0x1105, 0x1203], branches: &[] }, &r);
        }
        prof.add(&HybridSample { stack: &[0x1105, 0x1203], branches: &[] }, &r);
        prof.add_cut(&HybridSample { stack: &[0x1105, 0x9_0000], branches: &[] }, &r);
        let meta = PprofMeta { period_ns: 1_001_001, ..Default::default() };
        // A symbolizer by address: main [0x1200..), a [0x1100..) with `inl` inlined at
        // 0x1104, hot in libc.
        let mut looked_up = Vec::new();
        let paths: Vec<String> = prof.binaries().iter().map(|b| b.path.clone()).collect();
        let mut sym = |b: usize, a: u64| {
            let path = paths[b].as_str();
            looked_up.push((path.to_owned(), a));
            let l = |f: &str, line| SourceLine { function: f.into(), file: "x.c".into(), line };
            match (path, a) {
                ("/lib/libc.so.6", _) => vec![l("hot", 3)],
                (_, 0x1104) => vec![l("inl", 9), l("a", 12)],
                (_, a) if a >= 0x1200 => vec![l("main", 20)],
                _ => vec![],
            }
        };
        let p = build_address_profile(&prof, &mut sym, "[unknown]", &meta);
        let mut gz = Vec::new();
        write_pprof_gz(&p, &mut gz).unwrap();
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
        let p = Profile::decode(&raw[..]).unwrap();
        assert_eq!(p.string_table[0], "");
        let st = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(st(p.sample_type[0].r#type), "samples");
        assert_eq!(st(p.sample_type[1].unit), "nanoseconds");
        let loc = |id: u64| p.location.iter().find(|l| l.id == id).expect("location exists");
        let names = |id: u64| -> Vec<&str> {
            loc(id).line.iter().map(|l| st(p.function.iter().find(|f| f.id == l.function_id).unwrap().name)).collect()
        };
        type Got<'a> = (Vec<Vec<&'a str>>, Vec<u64>, i64, i64);
        let mut got: Vec<Got> = p
            .sample
            .iter()
            .map(|s| {
                (
                    s.location_id.iter().map(|&l| names(l)).collect(),
                    s.location_id.iter().map(|&l| loc(l).address).collect(),
                    s.value[0],
                    s.value[1],
                )
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                (vec![vec![], vec!["[unknown]"], vec!["[truncated]"]], vec![0x1105, 0x8_ffff, 0], 1, 1_001_001),
                (vec![vec![], vec!["main"]], vec![0x1105, 0x1202], 1, 1_001_001),
                (vec![vec!["hot"], vec!["inl", "a"], vec!["main"]], vec![0x7010, 0x1104, 0x1202], 7, 7 * 1_001_001),
            ]
        );
        assert_eq!(looked_up.iter().filter(|x| x.1 == 0x1104).count(), 1, "one lookup per address");
        let m = p
            .mapping
            .iter()
            .find(|m| m.id == loc(p.sample.iter().find(|s| s.value[0] == 7).unwrap().location_id[0]).mapping_id)
            .unwrap();
        assert_eq!((st(m.filename), m.memory_start, m.memory_limit, m.file_offset), ("/lib/libc.so.6", 0x7000, 0x8000, 0x6c00));
        let demo = p.mapping.iter().find(|m| st(m.filename) == "/bin/demo").unwrap();
        assert_eq!((st(demo.build_id), demo.memory_start, demo.memory_limit, demo.file_offset), ("0102", 0x1000, 0x2000, 0xc00));
        assert!(p.mapping.iter().all(|m| m.has_functions && m.has_filenames && m.has_line_numbers && m.has_inline_frames));
    }
}

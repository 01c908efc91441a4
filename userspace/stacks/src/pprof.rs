//! pprof writer: the calling-context trie as a gzip-compressed `perftools.profiles.Profile`
//! (`profile.proto` from github.com/google/pprof, messages declared here with prost).
//!
//! One `Location` (and one `Function`) per distinct frame, one `Mapping` per binary, one
//! `Sample` per context with self samples: `location_id` leaf first, values
//! `[samples/count, cpu/nanoseconds]`.

use std::collections::HashMap;
use std::io::{self, Write};

use prost::Message;

use crate::{addrspace::Binary, frames::FrameTable, trie::ContextTrie};

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

/// Builds the pprof `Profile` of `trie`. `binaries` is indexed by `Frame::binary`.
pub fn build_profile(trie: &ContextTrie, frames: &FrameTable, binaries: &[Binary], meta: &PprofMeta) -> Profile {
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
    for (i, b) in binaries.iter().enumerate() {
        let start = b.load_addresses.first().copied().unwrap_or(0);
        let build_id = b.build_id_hex().unwrap_or_default();
        p.mapping.push(Mapping {
            id: i as u64 + 1,
            memory_start: start,
            memory_limit: start,
            filename: s.id(&b.path),
            build_id: s.id(&build_id),
            has_functions: true,
            ..Default::default()
        });
    }
    // Location/function id = frame id + 1, emitted only for frames used by some sample.
    let mut used = vec![false; frames.len()];
    let mut path = Vec::new();
    for id in trie.node_ids() {
        let n = trie.node(id);
        if n.self_count == 0 {
            continue;
        }
        trie.path_into(id, &mut path);
        let mut locs = Vec::with_capacity(path.len());
        for &f in path.iter().rev() {
            if let Some(u) = used.get_mut(f as usize) {
                *u = true;
            }
            locs.push(f as u64 + 1);
        }
        let c = n.self_count as i64;
        p.sample.push(Sample { location_id: locs, value: vec![c, c.saturating_mul(meta.period_ns)] });
    }
    for (f, _) in used.iter().enumerate().filter(|(_, u)| **u) {
        let frame = frames.get(f as u32);
        let name = s.id(&frame.function);
        let mapping_id = frame.binary.filter(|&b| (b as usize) < binaries.len()).map_or(0, |b| b as u64 + 1);
        p.function.push(Function { id: f as u64 + 1, name, system_name: name, filename: 0 });
        p.location.push(Location {
            id: f as u64 + 1,
            mapping_id,
            address: 0,
            line: vec![Line { function_id: f as u64 + 1, line: 0 }],
        });
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
    use crate::frames::Frame;
    use std::io::Read;

    /// A written profile decodes back (gunzip + protobuf) to the trie's contexts and counts.
    #[test]
    fn pprof_round_trip() {
        let mut f = FrameTable::new();
        let main = f.intern(Frame::new("main", Some(0)));
        let a = f.intern(Frame::new("a", Some(0)));
        let hot = f.intern(Frame::new("hot", Some(1)));
        let mut t = ContextTrie::new(100);
        t.add(&[main, a, hot], 7);
        t.add(&[main, a], 2);
        let bins = vec![
            Binary {
                path: "/bin/demo".into(),
                build_id: Some(vec![1, 2]),
                segments: vec![],
                load_addresses: vec![0x1000],
                elf_ok: true,
                info: Default::default(),
            },
            Binary {
                path: "/lib/libc.so.6".into(),
                build_id: None,
                segments: vec![],
                load_addresses: vec![0x7000],
                elf_ok: true,
                info: Default::default(),
            },
        ];
        let meta = PprofMeta { period_ns: 1_001_001, ..Default::default() };
        let mut gz = Vec::new();
        write_pprof_gz(&build_profile(&t, &f, &bins, &meta), &mut gz).unwrap();

        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
        let p = Profile::decode(&raw[..]).unwrap();
        assert_eq!(p.string_table[0], "");
        let st = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(st(p.sample_type[0].r#type), "samples");
        assert_eq!(st(p.sample_type[1].unit), "nanoseconds");
        let loc_name = |id: u64| {
            let l = p.location.iter().find(|l| l.id == id).expect("location exists");
            let fid = l.line[0].function_id;
            st(p.function.iter().find(|f| f.id == fid).expect("function exists").name)
        };
        let mut got: Vec<(Vec<&str>, i64, i64)> =
            p.sample.iter().map(|s| (s.location_id.iter().map(|&l| loc_name(l)).collect(), s.value[0], s.value[1])).collect();
        got.sort();
        assert_eq!(got, vec![(vec!["a", "main"], 2, 2 * 1_001_001), (vec!["hot", "a", "main"], 7, 7 * 1_001_001),]);
        let hot_loc = p.location.iter().find(|l| loc_name(l.id) == "hot").unwrap();
        let m = p.mapping.iter().find(|m| m.id == hot_loc.mapping_id).unwrap();
        assert_eq!(st(m.filename), "/lib/libc.so.6");
        assert_eq!(st(p.mapping[0].build_id), "0102");
    }
}

//! A minimal protobuf wire-format decoder and a `perftools.profiles.Profile` reader built on
//! it, written from the protobuf encoding spec and `profile.proto` field numbers — independent
//! of the prost declarations in etm-stacks that the writer uses.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;

/// One field of a message.
#[derive(Debug, Clone)]
pub enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2.
    Bytes(&'a [u8]),
    /// Wire type 5.
    Fixed32(u32),
}

fn varint(b: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos).ok_or("truncated varint")?;
        *pos += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint too long".into())
}

/// Splits a message into `(field number, value)` pairs.
pub fn fields(b: &[u8]) -> Result<Vec<(u64, Value<'_>)>, String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < b.len() {
        let key = varint(b, &mut pos)?;
        let v = match key & 7 {
            0 => Value::Varint(varint(b, &mut pos)?),
            1 => {
                let s = b.get(pos..pos + 8).ok_or("truncated fixed64")?;
                pos += 8;
                Value::Fixed64(u64::from_le_bytes(s.try_into().unwrap()))
            }
            2 => {
                let n = varint(b, &mut pos)? as usize;
                let s = b.get(pos..pos + n).ok_or("truncated bytes")?;
                pos += n;
                Value::Bytes(s)
            }
            5 => {
                let s = b.get(pos..pos + 4).ok_or("truncated fixed32")?;
                pos += 4;
                Value::Fixed32(u32::from_le_bytes(s.try_into().unwrap()))
            }
            w => return Err(format!("unsupported wire type {w}")),
        };
        out.push((key >> 3, v));
    }
    Ok(out)
}

/// Repeated integer field values, packed (wire type 2) or not.
fn ints(vals: &[&Value<'_>]) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for v in vals {
        match v {
            Value::Varint(x) => out.push(*x),
            Value::Bytes(b) => {
                let mut p = 0;
                while p < b.len() {
                    out.push(varint(b, &mut p)?);
                }
            }
            _ => return Err("unexpected wire type for an integer".into()),
        }
    }
    Ok(out)
}

fn get<'a, 'b>(f: &'b [(u64, Value<'a>)], n: u64) -> Vec<&'b Value<'a>> {
    f.iter().filter(|(k, _)| *k == n).map(|(_, v)| v).collect()
}

fn int1(f: &[(u64, Value<'_>)], n: u64) -> Result<u64, String> {
    Ok(ints(&get(f, n))?.last().copied().unwrap_or(0))
}

fn sub<'a>(v: &Value<'a>) -> Result<Vec<(u64, Value<'a>)>, String> {
    match v {
        Value::Bytes(b) => fields(b),
        _ => Err("expected a message".into()),
    }
}

/// What the tests check in a profile.
#[derive(Debug, Clone, Default)]
pub struct PprofSummary {
    /// `sample_type` as (type, unit) strings.
    pub sample_types: Vec<(String, String)>,
    /// Per stack (function names, outermost first): summed values.
    pub stacks: BTreeMap<Vec<String>, Vec<i64>>,
    /// Per stack of physical frames (the outermost function of each location, outermost
    /// location first): summed values.
    pub physical_stacks: BTreeMap<Vec<String>, Vec<i64>>,
    /// Mapping file names.
    pub mapping_files: Vec<String>,
    /// Every location: (its mapping's file name, address, function names innermost first).
    pub locations: Vec<(String, u64, Vec<String>)>,
}

/// Gunzips and decodes a `profile.pb.gz`.
pub fn read_pprof_gz(gz: &[u8]) -> Result<PprofSummary, String> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz).read_to_end(&mut raw).map_err(|e| format!("gunzip: {e}"))?;
    let top = fields(&raw)?;
    let strings: Vec<String> = get(&top, 6)
        .iter()
        .map(|v| match v {
            Value::Bytes(b) => Ok(String::from_utf8_lossy(b).into_owned()),
            _ => Err("string_table entry is not bytes".to_string()),
        })
        .collect::<Result<_, _>>()?;
    if strings.first().map(String::as_str) != Some("") {
        return Err("string_table[0] must be empty".into());
    }
    let s = |i: u64| strings.get(i as usize).cloned().ok_or(format!("string index {i} out of range"));
    let mut sample_types = Vec::new();
    for v in get(&top, 1) {
        let f = sub(v)?;
        sample_types.push((s(int1(&f, 1)?)?, s(int1(&f, 2)?)?));
    }
    let mut functions = HashMap::new();
    for v in get(&top, 5) {
        let f = sub(v)?;
        functions.insert(int1(&f, 1)?, s(int1(&f, 2)?)?);
    }
    let mut mapping_file = HashMap::new();
    for v in get(&top, 3) {
        let f = sub(v)?;
        mapping_file.insert(int1(&f, 1)?, s(int1(&f, 5)?)?);
    }
    // Location id -> function names (line[0] is the innermost inlined function).
    let mut locations: HashMap<u64, Vec<String>> = HashMap::new();
    let mut all_locations = Vec::new();
    for v in get(&top, 4) {
        let f = sub(v)?;
        let file = mapping_file.get(&int1(&f, 2)?).cloned().unwrap_or_default();
        let mut names = Vec::new();
        for l in get(&f, 4) {
            let lf = sub(l)?;
            let fid = int1(&lf, 1)?;
            names.push(functions.get(&fid).cloned().ok_or(format!("function {fid} missing"))?);
        }
        all_locations.push((file, int1(&f, 3)?, names.clone()));
        locations.insert(int1(&f, 1)?, names);
    }
    let mut stacks: BTreeMap<Vec<String>, Vec<i64>> = BTreeMap::new();
    let mut physical_stacks: BTreeMap<Vec<String>, Vec<i64>> = BTreeMap::new();
    for v in get(&top, 2) {
        let f = sub(v)?;
        let locs = ints(&get(&f, 1))?;
        let vals: Vec<i64> = ints(&get(&f, 2))?.into_iter().map(|x| x as i64).collect();
        if vals.len() != sample_types.len() {
            return Err("sample value count differs from sample_type count".into());
        }
        // Leaf first in the file; build outermost first.
        let mut path = Vec::new();
        let mut physical = Vec::new();
        for id in locs.iter().rev() {
            let names = locations.get(id).ok_or(format!("location {id} missing"))?;
            path.extend(names.iter().rev().cloned());
            physical.extend(names.last().cloned());
        }
        for (m, p) in [(&mut stacks, path), (&mut physical_stacks, physical)] {
            let e = m.entry(p).or_insert_with(|| vec![0; vals.len()]);
            for (a, b) in e.iter_mut().zip(&vals) {
                *a += b;
            }
        }
    }
    let mut mapping_files = Vec::new();
    for v in get(&top, 3) {
        let f = sub(v)?;
        mapping_files.push(s(int1(&f, 5)?)?);
    }
    Ok(PprofSummary { sample_types, stacks, physical_stacks, mapping_files, locations: all_locations })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-encoded bytes (from the protobuf spec's examples) decode to the right fields.
    #[test]
    fn decodes_spec_examples() {
        // Field 1 varint 150 = 08 96 01; field 2 string "testing" = 12 07 74 65 73 74 69 6e 67.
        let b = [0x08, 0x96, 0x01, 0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g'];
        let f = fields(&b).unwrap();
        assert!(matches!(f[0], (1, Value::Varint(150))));
        assert!(matches!(f[1], (2, Value::Bytes(b"testing"))));
        // Packed repeated 3, 270, 86942: 22 06 03 8E 02 9E A7 05.
        let p = [0x22, 0x06, 0x03, 0x8e, 0x02, 0x9e, 0xa7, 0x05];
        let f = fields(&p).unwrap();
        assert_eq!(ints(&get(&f, 4)).unwrap(), vec![3, 270, 86942]);
        assert!(fields(&[0x08]).is_err());
    }
}

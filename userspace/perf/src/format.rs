//! PMU `format/<name>` field specifications (`config:12`, `config:0-3`, `config2:32-63`,
//! comma-separated bit lists) and placing values into the attr config words.
//!
//! The grammar is the kernel's `PMU_FORMAT_ATTR` text as parsed by perf
//! (`tools/perf/util/pmu.y`): `configN:` followed by a list of bits or `lo-hi` ranges; the
//! value's bits are distributed over the ranges from least significant up.

/// Which attr word a field lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConfigWord {
    Config,
    Config1,
    Config2,
    Config3,
}

/// The four attr config words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConfigWords {
    pub config: u64,
    pub config1: u64,
    pub config2: u64,
    pub config3: u64,
}

impl ConfigWords {
    fn word_mut(&mut self, w: ConfigWord) -> &mut u64 {
        match w {
            ConfigWord::Config => &mut self.config,
            ConfigWord::Config1 => &mut self.config1,
            ConfigWord::Config2 => &mut self.config2,
            ConfigWord::Config3 => &mut self.config3,
        }
    }
    fn word(&self, w: ConfigWord) -> u64 {
        match w {
            ConfigWord::Config => self.config,
            ConfigWord::Config1 => self.config1,
            ConfigWord::Config2 => self.config2,
            ConfigWord::Config3 => self.config3,
        }
    }
}

/// A parsed `format/<name>` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatField {
    pub word: ConfigWord,
    /// Inclusive bit ranges `(lo, hi)`, in file order (value bits fill them in this order).
    pub ranges: Vec<(u8, u8)>,
}

/// A format file that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Not `configN:bits`.
    #[error("bad format specification {0:?}")]
    Syntax(String),
    /// A value does not fit the field.
    #[error("value {value:#x} does not fit in a {width}-bit field")]
    TooWide { value: u64, width: u32 },
}

impl FormatField {
    /// Parses `config:0-3`, `config2:32-63`, `config:8`, `config1:0-7,32-35`.
    pub fn parse(text: &str) -> Result<Self, FormatError> {
        let err = || FormatError::Syntax(text.trim().to_string());
        let (w, bits) = text.trim().split_once(':').ok_or_else(err)?;
        let word = match w.trim() {
            "config" | "config0" => ConfigWord::Config,
            "config1" => ConfigWord::Config1,
            "config2" => ConfigWord::Config2,
            "config3" => ConfigWord::Config3,
            _ => return Err(err()),
        };
        let mut ranges = Vec::new();
        for part in bits.split(',') {
            let part = part.trim();
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (a.trim().parse::<u8>().map_err(|_| err())?, b.trim().parse::<u8>().map_err(|_| err())?),
                None => {
                    let b = part.parse::<u8>().map_err(|_| err())?;
                    (b, b)
                }
            };
            if lo > hi || hi > 63 {
                return Err(err());
            }
            ranges.push((lo, hi));
        }
        if ranges.is_empty() {
            return Err(err());
        }
        Ok(FormatField { word, ranges })
    }

    /// Total width in bits.
    pub fn width(&self) -> u32 {
        self.ranges.iter().map(|&(lo, hi)| u32::from(hi - lo) + 1).sum()
    }

    /// Mask of the field's bits within its word.
    pub fn mask(&self) -> u64 {
        self.ranges.iter().fold(0, |m, &(lo, hi)| m | range_mask(lo, hi))
    }

    /// Writes `value` into the field (clearing its previous bits).
    pub fn set(&self, words: &mut ConfigWords, value: u64) -> Result<(), FormatError> {
        let width = self.width();
        if width < 64 && value >> width != 0 {
            return Err(FormatError::TooWide { value, width });
        }
        let w = words.word_mut(self.word);
        *w &= !self.mask();
        let mut v = value;
        for &(lo, hi) in &self.ranges {
            let n = u32::from(hi - lo) + 1;
            let part = if n == 64 { v } else { v & ((1u64 << n) - 1) };
            *w |= part << lo;
            v = if n == 64 { 0 } else { v >> n };
        }
        Ok(())
    }

    /// Reads the field's value back from the words.
    pub fn get(&self, words: &ConfigWords) -> u64 {
        let w = words.word(self.word);
        let mut out = 0u64;
        let mut at = 0u32;
        for &(lo, hi) in &self.ranges {
            let n = u32::from(hi - lo) + 1;
            let part = (w & range_mask(lo, hi)) >> lo;
            if at < 64 {
                out |= part << at;
            }
            at += n;
        }
        out
    }
}

fn range_mask(lo: u8, hi: u8) -> u64 {
    let n = u32::from(hi - lo) + 1;
    let m = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
    m << lo
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mainline cs_etm field texts parse to the bit positions documented in
    /// coresight-etm-perf.h (etm-interface.md §1.2).
    #[test]
    fn parses_cs_etm_fields() {
        let f = FormatField::parse("config:0-3\n").unwrap();
        assert_eq!((f.word, f.ranges.clone(), f.width(), f.mask()), (ConfigWord::Config, vec![(0, 3)], 4, 0xf));
        let f = FormatField::parse("config2:32-63").unwrap();
        assert_eq!((f.word, f.mask()), (ConfigWord::Config2, 0xffff_ffff_0000_0000));
        let f = FormatField::parse("config:28").unwrap();
        assert_eq!(f.mask(), 1 << 28);
        let f = FormatField::parse("config3:0-11").unwrap();
        assert_eq!((f.word, f.width()), (ConfigWord::Config3, 12));
    }

    /// Split fields distribute the value's low bits into the first range, as perf's pmu.y does.
    #[test]
    fn split_field_round_trip() {
        let f = FormatField::parse("config1:0-3,32-35").unwrap();
        let mut w = ConfigWords::default();
        f.set(&mut w, 0xab).unwrap();
        assert_eq!(w.config1, 0xb | (0xa << 32));
        assert_eq!(f.get(&w), 0xab);
    }

    /// A value wider than its field is refused rather than silently truncated.
    #[test]
    fn rejects_too_wide_and_garbage() {
        let f = FormatField::parse("config:4-7").unwrap();
        let mut w = ConfigWords::default();
        assert!(f.set(&mut w, 16).is_err());
        f.set(&mut w, 15).unwrap();
        assert_eq!(w.config, 0xf0);
        for bad in ["", "config", "config9:1", "config:5-2", "config:64", "config:a"] {
            assert!(FormatField::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// Setting a field clears only its own bits.
    #[test]
    fn set_preserves_other_bits() {
        let f = FormatField::parse("config2:0-31").unwrap();
        let mut w = ConfigWords { config2: 0xdead_beef_0000_0000, ..Default::default() };
        f.set(&mut w, 0x1234_5678).unwrap();
        assert_eq!(w.config2, 0xdead_beef_1234_5678);
    }
}

//! One module per subcommand; each owns its `clap::Args` and a `main` returning an exit code.

pub mod convert;
pub mod decode;
pub mod diff;
pub mod doctor;
pub mod replay;
pub mod run;
pub mod synth;

/// `--decode-threads` of `run` and `replay`: a number, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    Auto,
    N(usize),
}

impl Threads {
    /// The number of decode threads for a session of `cpus` traced CPUs: `auto` is the smaller
    /// of the cores and the CPUs (each CPU's stream is decoded on one thread).
    pub fn count(self, cpus: usize) -> usize {
        match self {
            Threads::N(n) => n,
            Threads::Auto => std::thread::available_parallelism().map_or(1, |n| n.get()).min(cpus.max(1)),
        }
    }
}

/// `--perfscript` of `run` and `replay`: which samples the profile keeps for the
/// `<binary>.perfscript` dumps (the counters behind `.unsym.txt` and `.bolt.pa` have every
/// sample either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Perfscript {
    /// Samples of binaries llvm-profgen needs them for: pseudo-probe binaries (LLVM 22 cannot
    /// read their context-sensitive `.unsym.txt`) and binaries without code facts.
    #[default]
    Needed,
    /// Every sample with branches: a `.perfscript` for every binary.
    All,
}

impl Perfscript {
    /// As the profile's policy.
    pub fn keep(self) -> etm_profile::KeepSamples {
        match self {
            Perfscript::Needed => etm_profile::KeepSamples::Needed,
            Perfscript::All => etm_profile::KeepSamples::All,
        }
    }
}

/// Parses `--decode-threads`.
pub fn parse_threads(s: &str) -> Result<Threads, String> {
    match s {
        "auto" => Ok(Threads::Auto),
        _ => match s.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Threads::N(n)),
            _ => Err(format!("{s:?} is neither a positive number nor `auto`")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Numbers as given, `auto` bounded by the CPUs and at least one, nonsense refused.
    #[test]
    fn decode_threads_parse() {
        assert_eq!(parse_threads("3"), Ok(Threads::N(3)));
        assert_eq!(Threads::N(3).count(64), 3);
        let auto = parse_threads("auto").unwrap();
        let cores = std::thread::available_parallelism().unwrap().get();
        assert_eq!(auto.count(64), cores.min(64));
        assert_eq!(auto.count(1), 1);
        assert_eq!(auto.count(0), 1);
        for bad in ["0", "-1", "x", ""] {
            assert!(parse_threads(bad).is_err(), "{bad}");
        }
    }
}

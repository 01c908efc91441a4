//! perf as the independent peer of `etm-bpf run`: record a running process with `perf record`
//! (`--call-graph dwarf` or `-g`), read the stacks back with `perf script`, and compare the two
//! profilers' distributions of calling contexts.
//!
//! A context here is the sequence of physical frames (one per return address, root first),
//! each named as `perf script` names it (see [`parse_perf_script`]); kernel frames are left out (etm-bpf profiles user stacks only).
//! etm-bpf's side comes from its `profile.pb.gz` (the outermost `Line` of each `Location`).
//! Both sides go through [`normalize`], which removes only the differences of spelling the two
//! demanglers and symbol readers make systematically (listed there).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Root-first stacks of normalized frame names -> sample count.
pub type Contexts = BTreeMap<Vec<String>, u64>;

/// `perf record -e cpu-clock -F 999 <call_graph...> -p PID -- sleep SECS` into `dir/NAME`
/// (e.g. `call_graph = ["--call-graph", "dwarf,16384"]` or `["-g"]`). `None` (after
/// [`etm_testutil::skip`], a failure under CI) if perf is missing or cannot record here.
pub fn perf_record(pid: u32, dir: &Path, name: &str, call_graph: &[&str], secs: u32) -> Option<PathBuf> {
    let data = dir.join(name);
    let rec = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-F", "999"])
        .args(call_graph)
        .args(["-p", &pid.to_string(), "-o"])
        .arg(&data)
        .args(["--", "sleep", &secs.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    match rec {
        Ok(o) if o.status.success() => Some(data),
        Ok(o) => {
            etm_testutil::skip(format!("perf record failed: {}", String::from_utf8_lossy(&o.stderr)));
            None
        }
        Err(e) => {
            etm_testutil::skip(format!("no perf: {e}"));
            None
        }
    }
}

/// The user-space contexts of a `perf.data` file (frames in `[kernel.kallsyms]` and other
/// bracketed kernel DSOs dropped), from `perf script --no-inline -F ip,sym,dso` (see
/// [`parse_perf_script`]).
pub fn perf_script_contexts(data: &Path) -> Contexts {
    let script = |inline: &str| {
        let out = Command::new("perf")
            .args(["script", inline, "-F", "ip,sym,dso", "-i"])
            .arg(data)
            .stderr(Stdio::null())
            .output()
            .expect("run perf script");
        assert!(out.status.success(), "perf script {inline} -i {} failed", data.display());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    parse_perf_script(&script("--no-inline"))
}

/// One `perf script -F ip,sym,dso` line: `ADDR SYM (DSO)`, or `ADDR SYM (inlined)` for an
/// inlined function (innermost first, then the function it is inlined into).
fn perf_line(t: &str) -> Option<(&str, &str, &str)> {
    let (ip, rest) = t.split_once(char::is_whitespace)?;
    if let Some(sym) = rest.strip_suffix(" (inlined)") {
        return Some((ip, sym, ""));
    }
    let (sym, dso) = match rest.rfind(" (") {
        Some(i) if rest.ends_with(')') => (&rest[..i], &rest[i + 2..rest.len() - 1]),
        _ => (rest, ""),
    };
    Some((ip, sym.split("+0x").next().unwrap_or(sym), dso))
}

/// The samples of `perf script` output (a blank line after each), each a list of lines.
fn perf_samples(text: &str) -> Vec<Vec<&str>> {
    let mut out = vec![Vec::new()];
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() {
            if !out.last().unwrap().is_empty() {
                out.push(Vec::new());
            }
        } else {
            out.last_mut().unwrap().push(t);
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// Contexts from `perf script --no-inline -F ip,sym,dso`: the physical frames (one line per
/// return address), each named by the ELF symbol perf gives it, as etm-bpf names a real
/// function after its ELF symbol where it has one (as LLVM's symbolizer does: `malloc`, not
/// the DWARF name `__GI___libc_malloc` of glibc's debug file).
pub fn parse_perf_script(no_inline: &str) -> Contexts {
    let mut m = Contexts::new();
    for frames in perf_samples(no_inline) {
        let mut path: Vec<String> = Vec::new();
        for (_, sym, dso) in frames.iter().filter_map(|l| perf_line(l)) {
            if dso.starts_with('[') && dso != "[unknown]" && dso != "[vdso]" {
                continue; // [kernel.kallsyms], kernel modules
            }
            path.push(normalize(sym));
        }
        if !path.is_empty() {
            path.reverse();
            *m.entry(path).or_insert(0) += 1;
        }
    }
    m
}

/// etm-bpf's contexts from its `profile.pb.gz`: per sample the outermost function of each
/// location (the physical frame), normalized.
pub fn etm_bpf_contexts(pprof_gz: &Path) -> Contexts {
    let gz = std::fs::read(pprof_gz).unwrap_or_else(|e| panic!("read {}: {e}", pprof_gz.display()));
    let p = crate::pprof_wire::read_pprof_gz(&gz).expect("decode profile.pb.gz");
    let mut m = Contexts::new();
    for (stack, vals) in p.physical_stacks {
        let path: Vec<String> = stack.iter().map(|f| normalize(f)).collect();
        *m.entry(path).or_insert(0) += vals[0] as u64;
    }
    m
}

/// One spelling for a frame name on both sides. The differences removed, all systematic:
/// * perf names an address outside every symbol `[unknown]`, etm-bpf `[binary+0xOFFSET]`;
/// * perf keeps ELF symbol versions (`cfree@GLIBC_2.2.5`) and etm-bpf PLT entries read
///   `name@plt`: everything from the first `@` is dropped;
/// * perf demangles without parameter lists, etm-bpf (as `llvm-addr2line -C`) with them and
///   with a function template's return type: all parenthesized groups, a trailing ` const`
///   and everything before the last space outside `<>` are dropped (so `operator()() const`
///   and perf's `operator()` both read `operator`).
/// * perf writes lambdas as c++filt does, etm-bpf as LLVM does ([`llvm_lambdas`]), and
///   closes nested template argument lists with `> >` where etm-bpf (as LLVM) writes `>>`.
pub fn normalize(name: &str) -> String {
    let name = name.trim();
    if name.starts_with('[') && name.ends_with(']') {
        return "[unknown]".into();
    }
    let mut name = name.split('@').next().unwrap_or(name).to_string();
    while name.contains("> >") {
        name = name.replace("> >", ">>");
    }
    let mut out = String::new();
    let mut paren = 0usize;
    for c in name.chars() {
        match c {
            '(' => paren += 1,
            ')' => paren = paren.saturating_sub(1),
            _ if paren == 0 => out.push(c),
            _ => {}
        }
    }
    let mut s = llvm_lambdas(out.trim().trim_end_matches(" const").trim());
    let mut angle = 0i32;
    let mut last_space = None;
    for (i, c) in s.char_indices() {
        match c {
            '<' => angle += 1,
            '>' => angle -= 1,
            ' ' if angle == 0 => last_space = Some(i),
            _ => {}
        }
    }
    if let Some(i) = last_space {
        s = s[i + 1..].to_string();
    }
    s
}

/// perf (as c++filt) writes the N-th lambda of a scope `{lambda(ARGS)#N}`, etm-bpf (as LLVM)
/// `'lambda'(ARGS)`, `'lambda0'(ARGS)`, ...: with the argument lists dropped, `{lambda#1}` is
/// read as `'lambda'`, `{lambda#2}` as `'lambda0'`.
fn llvm_lambdas(name: &str) -> String {
    let mut out = String::new();
    let mut rest = name;
    while let Some(i) = rest.find("{lambda#") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "{lambda#".len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        match (after[..digits].parse::<u32>(), after[digits..].strip_prefix('}')) {
            (Ok(n), Some(tail)) => {
                out.push_str(&if n <= 1 { "'lambda'".to_string() } else { format!("'lambda{}'", n - 2) });
                rest = tail;
            }
            _ => {
                out.push_str("{lambda#");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Total-variation distance between the two normalized distributions (0: equal, 1: disjoint).
pub fn total_variation(a: &Contexts, b: &Contexts) -> f64 {
    let (na, nb) = (total(a) as f64, total(b) as f64);
    let keys: BTreeSet<&Vec<String>> = a.keys().chain(b.keys()).collect();
    keys.iter().map(|k| (count(a, k) / na - count(b, k) / nb).abs()).sum::<f64>() / 2.0
}

/// The total-variation distance expected from sampling alone: if both profiles were
/// independent samples of one distribution (estimated by pooling them), each context's
/// difference of shares is about normal with variance p(1-p)(1/na + 1/nb), whose mean absolute
/// value is sqrt(2/pi) times its standard deviation; half their sum.
pub fn sampling_tv(a: &Contexts, b: &Contexts) -> f64 {
    let (na, nb) = (total(a) as f64, total(b) as f64);
    let keys: BTreeSet<&Vec<String>> = a.keys().chain(b.keys()).collect();
    let var = 1.0 / na + 1.0 / nb;
    keys.iter()
        .map(|k| {
            let p = (count(a, k) + count(b, k)) / (na + nb);
            (2.0 / std::f64::consts::PI * p * (1.0 - p) * var).sqrt()
        })
        .sum::<f64>()
        / 2.0
}

/// The bound the tests put on the total-variation distance: twice what sampling alone gives,
/// plus 0.05 for the two profilers sampling different seconds of the workload.
pub fn tv_bound(a: &Contexts, b: &Contexts) -> f64 {
    2.0 * sampling_tv(a, b) + 0.05
}

/// The largest differences of share, for the failure messages.
pub fn largest_differences(a: &Contexts, b: &Contexts, n: usize) -> String {
    let (na, nb) = (total(a) as f64, total(b) as f64);
    let keys: BTreeSet<&Vec<String>> = a.keys().chain(b.keys()).collect();
    let mut d: Vec<(f64, &Vec<String>)> = keys.into_iter().map(|k| (count(a, k) / na - count(b, k) / nb, k)).collect();
    d.sort_by(|x, y| y.0.abs().total_cmp(&x.0.abs()));
    d.iter().take(n).map(|(x, k)| format!("{x:+.3} {}\n", k.join(";"))).collect()
}

/// Sum of the counts.
pub fn total(m: &Contexts) -> u64 {
    m.values().sum()
}

fn count(m: &Contexts, k: &Vec<String>) -> f64 {
    m.get(k).copied().unwrap_or(0) as f64
}

pub use crate::{containing, ending_with};

#[cfg(test)]
mod tests {
    use super::*;

    /// The spellings of perf 6.1 and of llvm-addr2line-22 -C for the same symbols meet.
    #[test]
    fn both_spellings_normalize_alike() {
        for (perf, ours) in [
            ("Pool::work", "Pool::work()"),
            ("std::function<void ()>::operator()", "std::function<void ()>::operator()() const"),
            (
                "std::thread::_State_impl<std::thread::_Invoker<std::tuple<Pool::Pool(unsigned int)::{lambda()#1}> > >::_M_run",
                "std::thread::_State_impl<std::thread::_Invoker<std::tuple<Pool::Pool(unsigned int)::'lambda'()>>>::_M_run()",
            ),
            ("main::{lambda()#3}::operator()", "main::'lambda1'()::operator()() const"),
            ("cfree@GLIBC_2.2.5", "cfree"),
            ("[unknown]", "[libstdc++.so.6.0.30+0xd44a2]"),
            ("std::_Rb_tree_increment@plt", "std::_Rb_tree_increment(std::_Rb_tree_node_base*)@plt"),
            ("std::__invoke_impl<void, F>", "void std::__invoke_impl<void, F>(std::__invoke_other, F&&)"),
        ] {
            assert_eq!(normalize(perf), normalize(ours), "{perf} / {ours}");
        }
        assert_ne!(normalize("job_a"), normalize("job_b"));
    }

    #[test]
    fn perf_script_is_parsed_leaf_last_kernel_dropped() {
        let no_inline = "\n\t ffffffff8100 schedule ([kernel.kallsyms])\n\t 2c21 std::_Rb_tree<int>::_M_erase (/tmp/pool)\n\t 2d97 crunch (/tmp/pool)\n\t 89c8 malloc (/usr/lib/libc.so.6)\n\t 300c job_b (/tmp/pool)\n\t d44a2 [unknown] (/usr/lib/libstdc++.so.6)\n\n\t 10 main (/tmp/pool)\n";
        let m = parse_perf_script(no_inline);
        let want: Vec<String> =
            ["[unknown]", "job_b", "malloc", "crunch", "std::_Rb_tree<int>::_M_erase"].map(String::from).to_vec();
        assert_eq!(m.get(&want), Some(&1), "{m:?}");
        assert_eq!(m.get(&vec!["main".to_string()]), Some(&1));
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn total_variation_of_known_distributions() {
        let a: Contexts = [(vec!["x".into()], 3), (vec!["y".into()], 1)].into();
        let b: Contexts = [(vec!["x".into()], 1), (vec!["z".into()], 1)].into();
        assert!((total_variation(&a, &a) - 0.0).abs() < 1e-12);
        // |0.75-0.5| + |0.25-0| + |0-0.5| = 1.0, halved.
        assert!((total_variation(&a, &b) - 0.5).abs() < 1e-12);
    }
}

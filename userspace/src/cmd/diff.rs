//! `etm-bpf diff A B`: two dump directories (two builds, or two runs of one build), function by
//! function and calling context: the share of samples each function and each context (a path
//! from the stacks' root) has, self and inclusive, in A and in B, the change with its 95%
//! interval and whether it is significant (two-proportion z-test, Holm–Bonferroni over the
//! functions, and apart over the contexts: `etm_stacks::diff`), largest significant change
//! first; a text table, `--json`, and a differential flame graph (`--svg`, default
//! `B/diff.svg`; of the exact instructions per context when both dumps have them). Functions are matched by name, so builds with different addresses compare.
//! When both dumps hold `functions.csv` (ETM: exact instruction counts from the trace), the
//! functions' shares of the traced instructions are compared too, without skid, and so are
//! the instructions per call of the functions called in both (self per call tested, inclusive
//! per call beside it), and, when both hold `contexts.csv`, the same per calling context (the
//! caller chain the trace saw, matched by symbol names).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use etm_stacks::diff::{
    Comparison, ExactDiff, PerCallDiff, compare, compare_context_per_call, compare_contexts, compare_exact, compare_per_call,
    parse_contexts_csv, parse_functions_csv,
};

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    etm-bpf diff before/ after/                 # table of the significant changes first\n  \
    etm-bpf diff before/ after/ --json > d.json\n  \
    etm-bpf diff before/ after/ --svg diff.svg --top 40")]
pub struct DiffArgs {
    /// Dump directory of the baseline (holds profile.folded).
    pub a: PathBuf,
    /// Dump directory to compare with it.
    pub b: PathBuf,
    /// One JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Rows of the table (all with --json).
    #[arg(long, default_value_t = 25)]
    pub top: usize,
    /// Family-wise significance level.
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
    /// Where to write the differential flame graph (default: B/diff.svg).
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

fn read_folded(dir: &Path) -> anyhow::Result<(String, std::collections::BTreeMap<Vec<String>, u64>)> {
    let p = dir.join("profile.folded");
    let bytes = std::fs::read(&p)
        .with_context(|| format!("cannot read {} (is {} an etm-bpf dump directory?)", p.display(), dir.display()))?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let m = etm_stacks::folded::parse_folded(&text).with_context(|| format!("{} is not a folded profile", p.display()))?;
    Ok((text, m))
}

/// A CSV of exact counts in a dump (`functions.csv`, `contexts.csv`), parsed, if the dump has it.
fn read_csv<T>(
    dir: &Path,
    name: &str,
    parse: fn(&str) -> Result<Vec<T>, etm_stacks::folded::FoldedError>,
) -> anyhow::Result<Option<Vec<T>>> {
    let p = dir.join(name);
    let Ok(bytes) = std::fs::read(&p) else { return Ok(None) };
    let rows = parse(&String::from_utf8_lossy(&bytes)).with_context(|| format!("{} is not an etm-bpf {name}", p.display()))?;
    Ok(Some(rows))
}

fn exact_table(d: &[ExactDiff], top: usize) -> String {
    let mut s = String::from(
        "exact instructions from the trace (functions.csv): share of traced instructions in %, change with its 95% interval, \
         * = significant (z-test, Holm-Bonferroni); no skid\n",
    );
    s += &format!("{:>8} {:>8} {:>26}  {}\n", "instr A", "instr B", "change", "function");
    for f in d.iter().take(top) {
        s += &format!(
            "{:>8.3} {:>8.3} {:>26}  {}\n",
            100.0 * f.share_a,
            100.0 * f.share_b,
            change(f.significant, f.delta, f.ci),
            f.function
        );
    }
    s
}

fn per_call_table(d: &[PerCallDiff], top: usize, by_context: bool) -> String {
    let (file, what) = if by_context { ("contexts.csv", "context (caller;...;function)") } else { ("functions.csv", "function") };
    let mut s = format!(
        "instructions per call from the trace ({file}){}: self instructions per call in A and B, change with its 95% \
         interval, * = significant (z-test, Holm-Bonferroni); inclusive per call beside it; no skid\n",
        if by_context { " by calling context" } else { "" }
    );
    s += &format!("{:>9} {:>9} {:>26} {:>26}  {}\n", "self A", "self B", "self change", "inclusive change", what);
    let ch = |sig: bool, d: f64, ci: (f64, f64)| format!("{}{:+.2} [{:+.2}, {:+.2}]", if sig { "*" } else { "" }, d, ci.0, ci.1);
    for f in d.iter().take(top) {
        let incl = f.inclusive_delta.map_or_else(|| "-".to_owned(), |(d, ci)| ch(false, d, ci));
        s += &format!(
            "{:>9.2} {:>9.2} {:>26} {:>26}  {}\n",
            f.self_a,
            f.self_b,
            ch(f.significant, f.delta, f.ci),
            incl,
            f.function
        );
    }
    s
}

fn pct(x: f64) -> String {
    format!("{:+.2}", 100.0 * x)
}

/// A change with its interval, in percentage points, `*` first when significant.
fn change(significant: bool, delta: f64, ci: (f64, f64)) -> String {
    format!("{}{} [{}, {}]", if significant { "*" } else { "" }, pct(delta), pct(ci.0), pct(ci.1))
}

/// The sampled comparison's table, of functions or of calling contexts (`what`).
fn table(c: &Comparison, top: usize, what: &str) -> String {
    let mut s = format!(
        "A: {} samples, B: {} samples; shares in % of each profile's samples; change = B - A with its 95% interval; \
         * = significant (two-proportion z-tests, Holm-Bonferroni over {} {what}s x 2, alpha {})\n\
         Sampled stacks carry skid: a change is where the samples landed, not always where the instructions were.\n",
        c.total_a,
        c.total_b,
        c.functions.len(),
        c.alpha
    );
    s += &format!(
        "{:>7} {:>7} {:>26} {:>7} {:>7} {:>26}  {what}\n",
        "self A", "self B", "self change", "incl A", "incl B", "incl change"
    );
    let share = |k: u64, n: u64| if n == 0 { 0.0 } else { 100.0 * k as f64 / n as f64 };
    for f in c.functions.iter().take(top) {
        s += &format!(
            "{:>7.2} {:>7.2} {:>26} {:>7.2} {:>7.2} {:>26}  {}\n",
            share(f.self_a, c.total_a),
            share(f.self_b, c.total_b),
            change(f.self_significant, f.self_delta, f.self_ci),
            share(f.incl_a, c.total_a),
            share(f.incl_b, c.total_b),
            change(f.incl_significant, f.incl_delta, f.incl_ci),
            f.function
        );
    }
    let sig = c.functions.iter().filter(|f| f.significant()).count();
    s += &format!("{sig} significant change(s) of {} {what}s\n", c.functions.len());
    s
}

/// The sampled comparison's rows as JSON, each named under `key` (`function` or `context`).
fn rows_json(c: &Comparison, key: &str) -> Vec<serde_json::Value> {
    c.functions
        .iter()
        .map(|f| {
            serde_json::json!({
                key: f.function,
                "self_a": f.self_a, "self_b": f.self_b, "incl_a": f.incl_a, "incl_b": f.incl_b,
                "self_change": f.self_delta, "self_ci95": [f.self_ci.0, f.self_ci.1],
                "incl_change": f.incl_delta, "incl_ci95": [f.incl_ci.0, f.incl_ci.1],
                "p_self": f.p_self, "p_incl": f.p_incl,
                "self_significant": f.self_significant, "incl_significant": f.incl_significant, "significant": f.significant(),
            })
        })
        .collect()
}

fn json(c: &Comparison, contexts: &Comparison) -> serde_json::Value {
    serde_json::json!({
        "total_a": c.total_a,
        "total_b": c.total_b,
        "alpha": c.alpha,
        "test": "two-proportion z-tests on self and inclusive shares, Holm-Bonferroni over both (functions and contexts apart); 95% Wald intervals",
        "skid": "sampled stacks: shares are where samples landed",
        "functions": rows_json(c, "function"),
        "contexts": rows_json(contexts, "context"),
    })
}

/// One per-call change as JSON (a function's or a context's).
fn per_call_json(f: &PerCallDiff) -> serde_json::Value {
    serde_json::json!({
        "function": f.function, "calls_a": f.calls_a, "calls_b": f.calls_b,
        "self_per_call_a": f.self_a, "self_per_call_b": f.self_b, "change": f.delta,
        "ci95": [f.ci.0, f.ci.1], "p_value": f.p_value, "significant": f.significant,
        "inclusive_per_call_a": f.inclusive_a, "inclusive_per_call_b": f.inclusive_b,
        "inclusive_change": f.inclusive_delta.map(|x| x.0),
        "inclusive_ci95": f.inclusive_delta.map(|x| [x.1.0, x.1.1]),
    })
}

pub fn main(args: DiffArgs) -> anyhow::Result<ExitCode> {
    let (ta, a) = read_folded(&args.a)?;
    let (tb, b) = read_folded(&args.b)?;
    anyhow::ensure!(args.alpha > 0.0 && args.alpha < 1.0, "--alpha must be between 0 and 1, not {}", args.alpha);
    let c = compare(&a, &b, args.alpha);
    let cc = compare_contexts(&a, &b, args.alpha);
    let (exact, per_call) = match (
        read_csv(&args.a, "functions.csv", parse_functions_csv)?,
        read_csv(&args.b, "functions.csv", parse_functions_csv)?,
    ) {
        (Some(ea), Some(eb)) => (Some(compare_exact(&ea, &eb, args.alpha)), Some(compare_per_call(&ea, &eb, args.alpha))),
        _ => (None, None),
    };
    let per_context =
        match (read_csv(&args.a, "contexts.csv", parse_contexts_csv)?, read_csv(&args.b, "contexts.csv", parse_contexts_csv)?) {
            (Some(ca), Some(cb)) => Some(compare_context_per_call(&ca, &cb, args.alpha)),
            _ => None,
        };
    let svg = args.svg.clone().unwrap_or_else(|| args.b.join("diff.svg"));
    let title = format!("{} -> {}", args.a.display(), args.b.display());
    // Both dumps with exact counts: the graph is of their instructions per context (no skid).
    let exact_folded =
        |d: &Path| std::fs::read(d.join("instructions.folded")).ok().map(|b| String::from_utf8_lossy(&b).into_owned());
    let (fa, fb, weight) = match (exact_folded(&args.a), exact_folded(&args.b)) {
        (Some(ia), Some(ib)) => (ia, ib, "instructions"),
        _ => (ta, tb, "samples"),
    };
    crate::dump::write_atomic(&svg, |w| etm_write::flame::write_diff_flamegraph(&fa, &fb, &title, weight, w))
        .with_context(|| format!("cannot write the differential flame graph {}", svg.display()))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut v = json(&c, &cc);
        v["svg"] = serde_json::json!(svg);
        v["svg_weight"] = serde_json::json!(weight);
        if let Some(d) = &exact {
            v["exact_functions"] = d
                .iter()
                .map(|f| {
                    serde_json::json!({
                        "function": f.function, "instr_a": f.instr_a, "instr_b": f.instr_b,
                        "share_a": f.share_a, "share_b": f.share_b, "change": f.delta,
                        "ci95": [f.ci.0, f.ci.1], "p_value": f.p_value, "significant": f.significant,
                    })
                })
                .collect();
        }
        if let Some(d) = &per_call {
            v["per_call"] = d.iter().map(per_call_json).collect();
        }
        if let Some(d) = &per_context {
            v["per_call_contexts"] = d
                .iter()
                .map(|f| {
                    let mut e = per_call_json(f);
                    e["context"] = serde_json::json!(f.function);
                    e["function"] = serde_json::json!(f.function.rsplit(';').next().unwrap_or(&f.function));
                    e
                })
                .collect();
        }
        writeln!(out, "{v}")?;
    } else {
        write!(out, "{}", table(&c, args.top, "function"))?;
        write!(out, "\n{}", table(&cc, args.top, "context"))?;
        if let Some(d) = &exact {
            write!(out, "\n{}", exact_table(d, args.top))?;
        }
        if let Some(d) = &per_call {
            write!(out, "\n{}", per_call_table(d, args.top, false))?;
        }
        if let Some(d) = &per_context {
            write!(out, "\n{}", per_call_table(d, args.top, true))?;
        }
        writeln!(out, "differential flame graph ({weight}): {}", svg.display())?;
    }
    Ok(ExitCode::SUCCESS)
}

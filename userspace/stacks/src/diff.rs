//! A/B comparison of two sampled profiles, function by function, with confidence.
//!
//! For every function (matched by name: addresses differ between builds) the share of the
//! samples whose leaf it is (*self*) and of those whose stack contains it (*inclusive*), in
//! each profile. A sample is taken as an independent draw of where the CPU was (binomial):
//!
//! * the difference of shares `d = p_B - p_A` with its 95% Wald interval
//!   `d ± 1.96 · sqrt(p_A(1-p_A)/n_A + p_B(1-p_B)/n_B)`;
//! * the two-proportion z-test with pooled variance (`z = d / sqrt(p(1-p)(1/n_A + 1/n_B))`,
//!   `p` the pooled share), two-sided, for the self and for the inclusive share;
//! * significance after Holm–Bonferroni over all those tests (two per function), at
//!   family-wise level `alpha` (default 0.05): with thousands of functions, unadjusted tests
//!   would flag dozens of noise differences.
//!
//! The same per calling context ([`compare_contexts`]): every path from the root of the
//! stacks (`main;f;g`, the frames' names joined by `;`), its *self* share the samples whose
//! whole stack it is and its *inclusive* share those whose stack begins with it; tested and
//! adjusted as the functions are, over the contexts.
//!
//! Sampled profiles carry skid and attribute the cost of long-latency instructions to their
//! neighbours: a significant difference is a real difference of *where the samples landed*,
//! which is not always where the instructions were.

use std::collections::{BTreeMap, BTreeSet};

/// One function's comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionDiff {
    pub function: String,
    /// Self samples in A and B.
    pub self_a: u64,
    pub self_b: u64,
    /// Inclusive samples in A and B (each sample counted once per function).
    pub incl_a: u64,
    pub incl_b: u64,
    /// Self share difference B - A and its 95% interval.
    pub self_delta: f64,
    pub self_ci: (f64, f64),
    /// Inclusive share difference B - A and its 95% interval.
    pub incl_delta: f64,
    pub incl_ci: (f64, f64),
    /// Two-sided p-values of the self- and inclusive-share differences (unadjusted).
    pub p_self: f64,
    pub p_incl: f64,
    /// Self / inclusive change significant after Holm–Bonferroni.
    pub self_significant: bool,
    pub incl_significant: bool,
}

impl FunctionDiff {
    /// Either change is significant.
    pub fn significant(&self) -> bool {
        self.self_significant || self.incl_significant
    }

    /// The larger of the significant changes (0 if none).
    fn significant_size(&self) -> f64 {
        let s = if self.self_significant { self.self_delta.abs() } else { 0.0 };
        let i = if self.incl_significant { self.incl_delta.abs() } else { 0.0 };
        s.max(i)
    }
}

/// The comparison of two profiles.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub total_a: u64,
    pub total_b: u64,
    /// Family-wise significance level.
    pub alpha: f64,
    /// Significant changes first (largest self change first), then the rest by total samples.
    pub functions: Vec<FunctionDiff>,
}

/// The standard normal distribution function, from `erfc` (Abramowitz & Stegun 7.1.26,
/// absolute error below 1.5e-7: p-values are exact to that).
pub fn normal_cdf(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erfc = poly * (-z * z).exp();
    if x >= 0.0 { 1.0 - 0.5 * erfc } else { 0.5 * erfc }
}

fn wald(ka: u64, na: u64, kb: u64, nb: u64) -> (f64, (f64, f64)) {
    let pa = if na == 0 { 0.0 } else { ka as f64 / na as f64 };
    let pb = if nb == 0 { 0.0 } else { kb as f64 / nb as f64 };
    let var = if na == 0 { 0.0 } else { pa * (1.0 - pa) / na as f64 } + if nb == 0 { 0.0 } else { pb * (1.0 - pb) / nb as f64 };
    let h = 1.96 * var.sqrt();
    let d = pb - pa;
    (d, (d - h, d + h))
}

/// Two-sided p-value of the two-proportion z-test with pooled variance.
pub fn two_proportion_p(ka: u64, na: u64, kb: u64, nb: u64) -> f64 {
    if na == 0 || nb == 0 {
        return 1.0;
    }
    let p = (ka + kb) as f64 / (na + nb) as f64;
    let se = (p * (1.0 - p) * (1.0 / na as f64 + 1.0 / nb as f64)).sqrt();
    if se == 0.0 {
        return 1.0;
    }
    let z = (kb as f64 / nb as f64 - ka as f64 / na as f64) / se;
    2.0 * (1.0 - normal_cdf(z.abs()))
}

/// Self and inclusive samples per function.
fn per_function(folded: &BTreeMap<Vec<String>, u64>) -> (u64, BTreeMap<String, (u64, u64)>) {
    let mut total = 0;
    let mut m: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (path, &c) in folded {
        total += c;
        if let Some(leaf) = path.last() {
            m.entry(leaf.clone()).or_default().0 += c;
        }
        let distinct: BTreeSet<&str> = path.iter().map(String::as_str).collect();
        for f in distinct {
            m.entry(f.to_owned()).or_default().1 += c;
        }
    }
    (total, m)
}

/// Self and inclusive samples per calling context: every prefix of every stack, joined by `;`
/// (a recursive path's prefixes are distinct contexts, so each sample counts once in each).
fn per_context(folded: &BTreeMap<Vec<String>, u64>) -> (u64, BTreeMap<String, (u64, u64)>) {
    let mut total = 0;
    let mut m: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (path, &c) in folded {
        total += c;
        let mut key = String::new();
        for (i, f) in path.iter().enumerate() {
            if i > 0 {
                key.push(';');
            }
            key.push_str(f);
            let e = m.entry(key.clone()).or_default();
            e.1 += c;
            if i + 1 == path.len() {
                e.0 += c;
            }
        }
    }
    (total, m)
}

/// Compares profile A with profile B function by function (module docs).
pub fn compare(a: &BTreeMap<Vec<String>, u64>, b: &BTreeMap<Vec<String>, u64>, alpha: f64) -> Comparison {
    compare_tallies(per_function(a), per_function(b), alpha)
}

/// Compares profile A with profile B per calling context (module docs); each result's
/// `function` is the context, `outermost;...;innermost`.
pub fn compare_contexts(a: &BTreeMap<Vec<String>, u64>, b: &BTreeMap<Vec<String>, u64>, alpha: f64) -> Comparison {
    compare_tallies(per_context(a), per_context(b), alpha)
}

/// The tests of two tallies of (self, inclusive) samples by name, with their totals.
fn compare_tallies(
    (na, fa): (u64, BTreeMap<String, (u64, u64)>),
    (nb, fb): (u64, BTreeMap<String, (u64, u64)>),
    alpha: f64,
) -> Comparison {
    let names: BTreeSet<&str> = fa.keys().chain(fb.keys()).map(String::as_str).collect();
    let mut out: Vec<FunctionDiff> = names
        .into_iter()
        .map(|f| {
            let (sa, ia) = fa.get(f).copied().unwrap_or_default();
            let (sb, ib) = fb.get(f).copied().unwrap_or_default();
            let (self_delta, self_ci) = wald(sa, na, sb, nb);
            let (incl_delta, incl_ci) = wald(ia, na, ib, nb);
            FunctionDiff {
                function: f.to_owned(),
                self_a: sa,
                self_b: sb,
                incl_a: ia,
                incl_b: ib,
                self_delta,
                self_ci,
                incl_delta,
                incl_ci,
                p_self: two_proportion_p(sa, na, sb, nb),
                p_incl: two_proportion_p(ia, na, ib, nb),
                self_significant: false,
                incl_significant: false,
            }
        })
        .collect();
    // Holm–Bonferroni over the 2m tests: the k-th smallest p-value (0-based) is compared with
    // alpha / (2m - k), until the first that fails.
    let mut tests: Vec<(f64, usize, bool)> = Vec::with_capacity(2 * out.len());
    for (i, f) in out.iter().enumerate() {
        tests.push((f.p_self, i, false));
        tests.push((f.p_incl, i, true));
    }
    tests.sort_by(|x, y| x.0.total_cmp(&y.0));
    let m = tests.len();
    for (k, &(p, i, incl)) in tests.iter().enumerate() {
        if p > alpha / (m - k) as f64 {
            break;
        }
        if incl {
            out[i].incl_significant = true;
        } else {
            out[i].self_significant = true;
        }
    }
    out.sort_by(|x, y| {
        y.significant()
            .cmp(&x.significant())
            .then(y.significant_size().total_cmp(&x.significant_size()))
            .then(y.self_delta.abs().total_cmp(&x.self_delta.abs()))
            .then((y.incl_a + y.incl_b).cmp(&(x.incl_a + x.incl_b)))
            .then(x.function.cmp(&y.function))
    });
    Comparison { total_a: na, total_b: nb, alpha, functions: out }
}

/// One function of a `functions.csv` (exact instruction counts from the trace).
#[derive(Debug, Clone, PartialEq)]
pub struct ExactRow {
    pub function: String,
    pub instructions: u64,
    /// Share of the traced instructions and its standard error.
    pub share: f64,
    pub stderr: f64,
    /// Calls seen, and the instructions per call, self and inclusive: (estimate, standard
    /// error); `None` without calls (or in a `functions.csv` of before these columns).
    pub calls: u64,
    pub self_per_call: Option<(f64, f64)>,
    pub inclusive_per_call: Option<(f64, f64)>,
}

/// Per-call figures of one name over several rows (binaries): the calls add up, the per-call
/// estimates are weighted by the calls (variances by the squared weights).
#[derive(Default)]
struct PerCallSum {
    calls: u64,
    /// (sum c_k v_k, sum c_k^2 se_k^2) for self and inclusive, and whether any row had them.
    own: (f64, f64, bool),
    incl: (f64, f64, bool),
}

impl PerCallSum {
    fn add(&mut self, calls: u64, own: Option<(f64, f64)>, incl: Option<(f64, f64)>) {
        self.calls += calls;
        let c = calls as f64;
        for (acc, v) in [(&mut self.own, own), (&mut self.incl, incl)] {
            if let Some((v, se)) = v {
                acc.0 += c * v;
                acc.1 += c * c * se * se;
                acc.2 = true;
            }
        }
    }

    fn get(&self, acc: (f64, f64, bool)) -> Option<(f64, f64)> {
        let c = self.calls as f64;
        (acc.2 && c > 0.0).then(|| (acc.0 / c, acc.1.sqrt() / c))
    }
}

/// The fields of one CSV line (RFC 4180 quoting).
fn csv_fields(l: &str) -> Vec<String> {
    let (mut out, mut cur, mut q, mut it) = (Vec::new(), String::new(), false, l.chars().peekable());
    while let Some(c) = it.next() {
        match (c, q) {
            ('"', true) if it.peek() == Some(&'"') => {
                cur.push('"');
                it.next();
            }
            ('"', _) => q = !q,
            (',', false) => out.push(std::mem::take(&mut cur)),
            (c, _) => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// An instructions-per-call estimate and its stderr from fields `v` and `e` of a row (`None`
/// when empty or absent).
fn per_call_pair(f: &[String], v: usize, e: usize, line: usize) -> Result<Option<(f64, f64)>, crate::folded::FoldedError> {
    let bad = |why| crate::folded::FoldedError { line, why };
    match (f.get(v).map(String::as_str), f.get(e).map(String::as_str)) {
        (None | Some(""), _) => Ok(None),
        (Some(v), Some(e)) => match (v.parse(), e.parse()) {
            (Ok(v), Ok(e)) => Ok(Some((v, e))),
            _ => Err(bad("an instructions-per-call field is not a number")),
        },
        (Some(_), None) => Err(bad("an instructions-per-call field without its stderr")),
    }
}

/// Reads a `functions.csv` (RFC 4180 quoting); rows of one function name in several
/// binaries add up (shares and variances).
pub fn parse_functions_csv(text: &str) -> Result<Vec<ExactRow>, crate::folded::FoldedError> {
    let mut m: BTreeMap<String, (u64, f64, f64, PerCallSum)> = BTreeMap::new();
    for (i, l) in text.lines().enumerate().skip(1) {
        let f = csv_fields(l);
        let bad = |why| crate::folded::FoldedError { line: i + 1, why };
        if f.len() < 8 {
            return Err(bad("fewer than 8 fields"));
        }
        let n: u64 = f[2].parse().map_err(|_| bad("instructions is not a number"))?;
        let share: f64 = f[3].parse().map_err(|_| bad("share is not a number"))?;
        let se: f64 = f[6].parse().map_err(|_| bad("stderr is not a number"))?;
        // The per-call columns (10: calls; 11, 14: self per call and its stderr; 15, 18:
        // inclusive), empty without calls.
        let calls: u64 = match f.get(9) {
            None => 0,
            Some(c) => c.parse().map_err(|_| bad("calls is not a number"))?,
        };
        let (own, incl) = (per_call_pair(&f, 10, 13, i + 1)?, per_call_pair(&f, 14, 17, i + 1)?);
        let e = m.entry(f[0].clone()).or_default();
        e.0 += n;
        e.1 += share;
        e.2 += se * se;
        e.3.add(calls, own, incl);
    }
    Ok(m.into_iter()
        .map(|(function, (instructions, share, var, pc))| ExactRow {
            function,
            instructions,
            share,
            stderr: var.sqrt(),
            calls: pc.calls,
            self_per_call: pc.get(pc.own),
            inclusive_per_call: pc.get(pc.incl),
        })
        .collect())
}

/// One calling context of a `contexts.csv`: its path (`outermost;...;innermost`, by symbol
/// names), its calls and instructions per call (estimate, standard error).
#[derive(Debug, Clone, PartialEq)]
pub struct ContextRow {
    pub context: String,
    pub calls: u64,
    pub self_per_call: Option<(f64, f64)>,
    pub inclusive_per_call: Option<(f64, f64)>,
}

/// Reads a `contexts.csv` (RFC 4180 quoting); rows of one context name (the same names in
/// several binaries) combine as in [`parse_functions_csv`].
pub fn parse_contexts_csv(text: &str) -> Result<Vec<ContextRow>, crate::folded::FoldedError> {
    let mut m: BTreeMap<String, PerCallSum> = BTreeMap::new();
    for (i, l) in text.lines().enumerate().skip(1) {
        let f = csv_fields(l);
        let bad = |why| crate::folded::FoldedError { line: i + 1, why };
        if f.len() < 13 {
            return Err(bad("fewer than 13 fields"));
        }
        let calls: u64 = f[3].parse().map_err(|_| bad("calls is not a number"))?;
        let (own, incl) = (per_call_pair(&f, 5, 8, i + 1)?, per_call_pair(&f, 9, 12, i + 1)?);
        m.entry(f[0].clone()).or_default().add(calls, own, incl);
    }
    Ok(m.into_iter()
        .map(|(context, pc)| ContextRow {
            context,
            calls: pc.calls,
            self_per_call: pc.get(pc.own),
            inclusive_per_call: pc.get(pc.incl),
        })
        .collect())
}

/// One function's change of exact instruction share.
#[derive(Debug, Clone, PartialEq)]
pub struct ExactDiff {
    pub function: String,
    pub instr_a: u64,
    pub instr_b: u64,
    pub share_a: f64,
    pub share_b: f64,
    /// B - A and its 95% interval (independent estimates: the variances add).
    pub delta: f64,
    pub ci: (f64, f64),
    pub p_value: f64,
    /// Significant after Holm–Bonferroni over the functions.
    pub significant: bool,
}

/// Compares the exact instruction shares of two traces (`functions.csv` of each), function
/// by function: the difference of the two ratio estimates, a z-test on it, Holm–Bonferroni.
/// Unlike sampled shares these carry no skid: the instructions were counted in the trace.
pub fn compare_exact(a: &[ExactRow], b: &[ExactRow], alpha: f64) -> Vec<ExactDiff> {
    let ma: BTreeMap<&str, &ExactRow> = a.iter().map(|r| (r.function.as_str(), r)).collect();
    let mb: BTreeMap<&str, &ExactRow> = b.iter().map(|r| (r.function.as_str(), r)).collect();
    let names: BTreeSet<&str> = ma.keys().chain(mb.keys()).copied().collect();
    let mut out: Vec<ExactDiff> = names
        .into_iter()
        .map(|f| {
            let (ia, sa, va) = ma.get(f).map_or((0, 0.0, 0.0), |r| (r.instructions, r.share, r.stderr * r.stderr));
            let (ib, sb, vb) = mb.get(f).map_or((0, 0.0, 0.0), |r| (r.instructions, r.share, r.stderr * r.stderr));
            let d = sb - sa;
            let se = (va + vb).sqrt();
            let p = z_p(d, se);
            ExactDiff {
                function: f.to_owned(),
                instr_a: ia,
                instr_b: ib,
                share_a: sa,
                share_b: sb,
                delta: d,
                ci: (d - 1.96 * se, d + 1.96 * se),
                p_value: p,
                significant: false,
            }
        })
        .collect();
    flag_and_sort(&mut out, alpha);
    out
}

/// Two-sided p-value of a z-test of the difference `d` of two independent estimates with
/// standard error `se` (0 when an exact difference is not 0, 1 when undefined).
fn z_p(d: f64, se: f64) -> f64 {
    if se > 0.0 && se.is_finite() {
        2.0 * (1.0 - normal_cdf((d / se).abs()))
    } else if d != 0.0 && se == 0.0 {
        0.0
    } else {
        1.0
    }
}

/// A change tested per function: [`ExactDiff`], [`PerCallDiff`].
trait Tested {
    fn p_value(&self) -> f64;
    fn size(&self) -> f64;
    fn name(&self) -> &str;
    fn significant(&self) -> bool;
    fn set_significant(&mut self, s: bool);
}

macro_rules! tested {
    ($t:ty) => {
        impl Tested for $t {
            fn p_value(&self) -> f64 {
                self.p_value
            }
            fn size(&self) -> f64 {
                self.delta.abs()
            }
            fn name(&self) -> &str {
                &self.function
            }
            fn significant(&self) -> bool {
                self.significant
            }
            fn set_significant(&mut self, s: bool) {
                self.significant = s;
            }
        }
    };
}
tested!(ExactDiff);
tested!(PerCallDiff);

/// Flags the significant changes (Holm–Bonferroni over all of `out`) and sorts them first,
/// largest change first, then by name.
fn flag_and_sort<T: Tested>(out: &mut [T], alpha: f64) {
    let sig = holm(&out.iter().map(Tested::p_value).collect::<Vec<_>>(), alpha);
    for (d, s) in out.iter_mut().zip(sig) {
        d.set_significant(s);
    }
    out.sort_by(|x, y| y.significant().cmp(&x.significant()).then(y.size().total_cmp(&x.size())).then(x.name().cmp(y.name())));
}

/// Holm–Bonferroni at family-wise level `alpha`: which of the p-values are significant (the
/// k-th smallest, 0-based, is compared with alpha / (m - k), until the first that fails).
fn holm(p: &[f64], alpha: f64) -> Vec<bool> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&x, &y| p[x].total_cmp(&p[y]));
    let mut sig = vec![false; m];
    for (k, &i) in order.iter().enumerate() {
        if p[i] > alpha / (m - k) as f64 {
            break;
        }
        sig[i] = true;
    }
    sig
}

/// One function's change of instructions per call (exact counts from the trace).
#[derive(Debug, Clone, PartialEq)]
pub struct PerCallDiff {
    pub function: String,
    /// Calls seen in A and B.
    pub calls_a: u64,
    pub calls_b: u64,
    /// Self instructions per call in A and B, the change B - A with its 95% interval, its
    /// p-value and significance (Holm–Bonferroni over the functions).
    pub self_a: f64,
    pub self_b: f64,
    pub delta: f64,
    pub ci: (f64, f64),
    pub p_value: f64,
    pub significant: bool,
    /// Inclusive instructions per call in A and B and the change with its 95% interval (not
    /// tested: a callee's change moves every caller's).
    pub inclusive_a: Option<f64>,
    pub inclusive_b: Option<f64>,
    pub inclusive_delta: Option<(f64, (f64, f64))>,
}

/// Compares the instructions per call of the functions called in both traces: the change of
/// the self instructions per call (ratio estimates of each trace, independent: the variances
/// add), a z-test, Holm–Bonferroni over those functions. Self, not inclusive, is tested: it
/// places a change in the function whose own instructions changed, where the inclusive change
/// of every caller follows its callees' (reported beside it).
pub fn compare_per_call(a: &[ExactRow], b: &[ExactRow], alpha: f64) -> Vec<PerCallDiff> {
    let rows = |v: &[ExactRow]| -> Vec<PerCallRow> {
        v.iter()
            .map(|r| PerCallRow {
                name: r.function.clone(),
                calls: r.calls,
                self_per_call: r.self_per_call,
                inclusive_per_call: r.inclusive_per_call,
            })
            .collect()
    };
    compare_per_call_rows(&rows(a), &rows(b), alpha)
}

/// [`compare_per_call`] per calling context (`contexts.csv` of each trace, matched by the
/// context's symbol names): the change of the self instructions per call of each context's
/// innermost function, Holm–Bonferroni over the contexts in both; `function` of each result
/// is the context (`outermost;...;innermost`).
pub fn compare_context_per_call(a: &[ContextRow], b: &[ContextRow], alpha: f64) -> Vec<PerCallDiff> {
    let rows = |v: &[ContextRow]| -> Vec<PerCallRow> {
        v.iter()
            .map(|r| PerCallRow {
                name: r.context.clone(),
                calls: r.calls,
                self_per_call: r.self_per_call,
                inclusive_per_call: r.inclusive_per_call,
            })
            .collect()
    };
    compare_per_call_rows(&rows(a), &rows(b), alpha)
}

/// The per-call figures of a function or a context.
struct PerCallRow {
    name: String,
    calls: u64,
    self_per_call: Option<(f64, f64)>,
    inclusive_per_call: Option<(f64, f64)>,
}

fn compare_per_call_rows(a: &[PerCallRow], b: &[PerCallRow], alpha: f64) -> Vec<PerCallDiff> {
    let mb: BTreeMap<&str, &PerCallRow> = b.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut out: Vec<PerCallDiff> = a
        .iter()
        .filter_map(|ra| {
            let rb = mb.get(ra.name.as_str())?;
            let ((sa, ea), (sb, eb)) = (ra.self_per_call?, rb.self_per_call?);
            let d = sb - sa;
            let se = (ea * ea + eb * eb).sqrt();
            let incl = ra.inclusive_per_call.zip(rb.inclusive_per_call);
            Some(PerCallDiff {
                function: ra.name.clone(),
                calls_a: ra.calls,
                calls_b: rb.calls,
                self_a: sa,
                self_b: sb,
                delta: d,
                ci: (d - 1.96 * se, d + 1.96 * se),
                p_value: z_p(d, se),
                significant: false,
                inclusive_a: ra.inclusive_per_call.map(|x| x.0),
                inclusive_b: rb.inclusive_per_call.map(|x| x.0),
                inclusive_delta: incl.map(|((va, ea), (vb, eb))| {
                    let (d, h) = (vb - va, 1.96 * (ea * ea + eb * eb).sqrt());
                    (d, (d - h, d + h))
                }),
            })
        })
        .collect();
    flag_and_sort(&mut out, alpha);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference values: Phi(1.96) = 0.9750021, Phi(-1) = 0.1586553, Phi(0) = 0.5
    /// (standard normal tables).
    #[test]
    fn normal_distribution() {
        assert!((normal_cdf(1.96) - 0.975_002_1).abs() < 2e-7);
        assert!((normal_cdf(-1.0) - 0.158_655_3).abs() < 2e-7);
        assert!((normal_cdf(0.0) - 0.5).abs() < 2e-7);
        assert!((normal_cdf(3.0) - 0.998_650_1).abs() < 2e-7);
    }

    /// A textbook two-proportion test: 45/100 vs 60/100: pooled p = 0.525, z = 2.1239,
    /// two-sided p = 0.03368.
    #[test]
    fn two_proportions() {
        let p = two_proportion_p(45, 100, 60, 100);
        assert!((p - 0.033_68).abs() < 1e-4, "{p}");
        assert_eq!(two_proportion_p(0, 0, 1, 1), 1.0);
    }

    fn folded(lines: &[(&str, u64)]) -> BTreeMap<Vec<String>, u64> {
        lines.iter().map(|(p, c)| (p.split(';').map(String::from).collect(), *c)).collect()
    }

    /// Per calling context: self is the samples whose whole stack the context is, inclusive
    /// those whose stack begins with it; a recursive path's two levels are two contexts; a
    /// shift of 1,000 samples from one caller's path to another's is significant on both
    /// paths, while the leaf's own totals (the function view) do not move.
    #[test]
    fn per_context_shares() {
        let a = folded(&[("main;fa;unit", 3000), ("main;fb;unit", 1000), ("main;fr;fr", 500), ("main", 500)]);
        let b = folded(&[("main;fa;unit", 2000), ("main;fb;unit", 2000), ("main;fr;fr", 500), ("main", 500)]);
        let c = compare_contexts(&a, &b, 0.05);
        let get = |n: &str| c.functions.iter().find(|f| f.function == n).unwrap_or_else(|| panic!("{n}: {c:?}"));
        assert_eq!((c.total_a, c.total_b), (5000, 5000));
        let fa_unit = get("main;fa;unit");
        assert_eq!((fa_unit.self_a, fa_unit.self_b, fa_unit.incl_a, fa_unit.incl_b), (3000, 2000, 3000, 2000));
        assert!((fa_unit.self_delta + 0.2).abs() < 1e-12 && fa_unit.self_significant, "{fa_unit:?}");
        let fa = get("main;fa");
        assert_eq!((fa.self_a, fa.incl_a, fa.incl_b), (0, 3000, 2000));
        assert!(fa.incl_significant && !fa.self_significant, "{fa:?}");
        assert!(get("main;fb;unit").self_significant && get("main;fb").incl_significant);
        let main = get("main");
        assert_eq!((main.self_a, main.incl_a, main.incl_b), (500, 5000, 5000));
        assert!(!main.significant());
        let (r1, r2) = (get("main;fr"), get("main;fr;fr"));
        assert_eq!((r1.self_a, r1.incl_a, r2.self_a, r2.incl_a), (0, 500, 500, 500));
        assert!(!r1.significant() && !r2.significant());
        // Seven contexts, the two moved paths' four first.
        assert_eq!(c.functions.len(), 7);
        assert!(c.functions[..4].iter().all(FunctionDiff::significant) && !c.functions[4].significant());
        // The function view sees unit unchanged: the shift is between its callers.
        let f = compare(&a, &b, 0.05);
        let unit = f.functions.iter().find(|x| x.function == "unit").unwrap();
        assert_eq!((unit.self_a, unit.self_b), (4000, 4000));
        assert!(!unit.significant());
    }

    /// The exact comparison: a shift of many standard errors is significant, a small one not;
    /// quoted names with commas read back whole.
    #[test]
    fn exact_shares() {
        let head = "function,binary,instructions,share,ci95_low,ci95_high,stderr,segments\n";
        let a = parse_functions_csv(&format!(
            "{head}f,/b,500,0.5,0.48,0.52,0.01,10\n\"g<int, long>\",/b,300,0.3,0.28,0.32,0.01,10\n"
        ))
        .unwrap();
        let b = parse_functions_csv(&format!(
            "{head}f,/b,400,0.4,0.38,0.42,0.01,10\n\"g<int, long>\",/b,301,0.301,0.28,0.32,0.01,10\n"
        ))
        .unwrap();
        assert_eq!(a[1].function, "g<int, long>");
        let d = compare_exact(&a, &b, 0.05);
        assert_eq!(d[0].function, "f");
        assert!(d[0].significant && (d[0].delta + 0.1).abs() < 1e-12);
        assert!((d[0].ci.1 - (-0.1 + 1.96 * 0.02f64.sqrt() * 0.1)).abs() < 1e-9, "{:?}", d[0].ci);
        assert!(!d[1].significant);
        assert!(parse_functions_csv(&format!("{head}f,/b,x,0.5,0,0,0,1\n")).is_err());
    }

    /// Instructions per call: a change of many standard errors is significant with its
    /// interval by hand, a small one not; rows without calls are left out; two binaries' rows
    /// of one name combine weighted by their calls.
    #[test]
    fn per_call_changes() {
        let head = "function,binary,instructions,share,ci95_low,ci95_high,stderr,segments,inclusive,calls,\
                    s,sl,sh,se,i,il,ih,ie,blocks,branches\n";
        let a = parse_functions_csv(&format!(
            "{head}f,/b,500,0.5,0,0,0.01,10,900,50,10.0,0,0,0.3,18.0,0,0,0.4,3,2\n\
             g,/b,300,0.3,0,0,0.01,10,300,30,10.0,0,0,0.4,10.0,0,0,0.4,3,2\n\
             h,/b,200,0.2,0,0,0.01,10,200,0,,,,,,,,,1,0\n"
        ))
        .unwrap();
        let b = parse_functions_csv(&format!(
            "{head}f,/b,400,0.4,0,0,0.01,10,800,50,8.0,0,0,0.4,16.0,0,0,0.3,3,2\n\
             g,/b,300,0.3,0,0,0.01,10,300,30,10.5,0,0,0.4,10.5,0,0,0.4,3,2\n\
             h,/b,200,0.2,0,0,0.01,10,200,0,,,,,,,,,1,0\n"
        ))
        .unwrap();
        assert_eq!((a[0].calls, a[0].self_per_call, a[2].self_per_call), (50, Some((10.0, 0.3)), None));
        let d = compare_per_call(&a, &b, 0.05);
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].function.as_str(), d[0].significant, d[1].significant), ("f", true, false));
        assert!((d[0].delta + 2.0).abs() < 1e-12 && (d[0].ci.0 - (-2.0 - 1.96 * 0.5)).abs() < 1e-9, "{:?}", d[0]);
        let (di, _) = d[0].inclusive_delta.unwrap();
        assert!((di + 2.0).abs() < 1e-12);
        // Two rows of one name: 10 calls at 4.0 (se 1) and 30 at 8.0 (se 1) -> 7.0, se sqrt(1000)/40.
        let c = parse_functions_csv(&format!(
            "{head}k,/a,40,0.1,0,0,0.01,10,40,10,4.0,0,0,1,4.0,0,0,1,1,1\nk,/b,240,0.1,0,0,0.01,10,240,30,8.0,0,0,1,8.0,0,0,1,1,1\n"
        ))
        .unwrap();
        let (v, se) = c[0].self_per_call.unwrap();
        assert!((v - 7.0).abs() < 1e-12 && (se - 1000f64.sqrt() / 40.0).abs() < 1e-12);
    }

    /// Per context: rows matched by the context's names, the estimator's change tested as per
    /// function; a context in one trace only is left out; two rows of one name combine.
    #[test]
    fn per_context_changes() {
        let head = "context,function,instructions,calls,complete_calls,s,sl,sh,se,i,il,ih,ie\n";
        let a = parse_contexts_csv(&format!(
            "{head}main;left;shared,shared,900,100,90,12.0,0,0,0.1,12.0,0,0,0.1\n\
             main;right;shared,shared,900,100,90,12.0,0,0,0.1,12.0,0,0,0.1\n\
             main;left,left,300,50,50,6.0,0,0,0.2,18.0,0,0,0.2\n\
             main;only_a,only_a,1,1,1,1.0,0,0,0,1.0,0,0,0\n"
        ))
        .unwrap();
        let b = parse_contexts_csv(&format!(
            "{head}main;left;shared,shared,600,100,90,6.0,0,0,0.1,6.0,0,0,0.1\n\
             \"main;right;shared\",shared,900,100,90,12.1,0,0,0.1,12.1,0,0,0.1\n\
             main;left,left,300,50,50,6.0,0,0,0.2,12.0,0,0,0.2\n"
        ))
        .unwrap();
        let d = compare_context_per_call(&a, &b, 0.05);
        assert_eq!(d.len(), 3);
        assert_eq!((d[0].function.as_str(), d[0].significant), ("main;left;shared", true));
        assert!((d[0].delta + 6.0).abs() < 1e-12 && (d[0].ci.1 - (-6.0 + 1.96 * 0.02f64.sqrt())).abs() < 1e-9, "{:?}", d[0]);
        assert!(d[1..].iter().all(|x| !x.significant), "{d:?}");
        assert!(parse_contexts_csv(&format!("{head}main;f,f,1,x,1,,,,,,,,\n")).is_err());
        assert!(parse_contexts_csv(&format!("{head}main;f,f,1,1\n")).is_err());
    }

    /// A real shift is significant with the right sign and interval; equal shares are not;
    /// inclusive counts count a recursive function once per sample.
    #[test]
    fn shifts_and_noise() {
        let a = folded(&[("main;f", 600), ("main;g", 300), ("main;h", 100), ("main;r;r", 10)]);
        let b = folded(&[("main;f", 450), ("main;g", 450), ("main;h", 100), ("main;r;r", 10)]);
        let c = compare(&a, &b, 0.05);
        assert_eq!((c.total_a, c.total_b), (1010, 1010));
        let get = |n: &str| c.functions.iter().find(|f| f.function == n).unwrap();
        let (f, g, h) = (get("f"), get("g"), get("h"));
        assert!(f.self_significant && g.self_significant && !h.significant());
        assert!(f.self_delta < 0.0 && g.self_delta > 0.0);
        assert!(f.self_ci.0 < f.self_delta && f.self_delta < f.self_ci.1 && f.self_ci.1 < 0.0);
        assert!((f.self_delta - (450.0 - 600.0) / 1010.0).abs() < 1e-12);
        assert_eq!((get("r").incl_a, get("main").incl_a, get("main").self_a), (10, 1010, 0));
        assert!(c.functions[0].significant() && c.functions[1].significant());
        assert!(!get("main").significant());
        // A caller whose callee moved: its inclusive share, not its self share, changed.
        let a = folded(&[("main;x;leaf", 600), ("main;y;leaf", 400)]);
        let b = folded(&[("main;x;leaf", 300), ("main;y;leaf", 700)]);
        let c = compare(&a, &b, 0.05);
        let x = c.functions.iter().find(|f| f.function == "x").unwrap();
        assert!(x.incl_significant && !x.self_significant && x.incl_delta < 0.0);
        assert!(!c.functions.iter().find(|f| f.function == "leaf").unwrap().significant());
    }
}

//! Exact instruction counts per function from decoded trace, with confidence.
//!
//! A decoded trace segment (one window's trace, from its trace-on) is the exact path over
//! thousands of instructions: every instruction it executed is counted for the function it
//! lies in, with no skid. The segments are the *sampling unit*: the share of all traced
//! instructions that a function has is the ratio estimator `R = sum_i x_i / sum_i t_i` (x_i its
//! instructions in segment i, t_i the segment's), and its 95% interval `R ± 1.96 sqrt(V)` with
//! the cluster-sampling variance `V = n / (n - 1) · sum_i (x_i - R t_i)^2 / (sum_i t_i)^2`
//! (delta method, `n` segments). Memory: four numbers per function seen, a per-segment list
//! of the functions it touched; bounded by `max_functions` (beyond it, instructions go to one
//! `other` bucket, counted).

/// Index of a function in an [`ExactCounts`] (the caller names them).
pub type FunctionIndex = u32;

#[derive(Debug, Clone, Copy, Default)]
struct Acc {
    /// sum x_i, sum x_i^2, sum x_i t_i, segments with x_i > 0.
    x: u64,
    xx: f64,
    xt: f64,
    segments: u64,
}

/// One function's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FunctionCount {
    pub function: FunctionIndex,
    /// Instructions executed in it, over all segments.
    pub instructions: u64,
    /// Segments in which it executed.
    pub segments: u64,
    /// Share of all traced instructions, its standard error and 95% interval.
    pub share: f64,
    pub stderr: f64,
    pub ci: (f64, f64),
}

/// The counts (module docs).
#[derive(Debug, Clone)]
pub struct ExactCounts {
    acc: Vec<Acc>,
    /// The open segment: functions touched (with their count so far) and its total.
    cur: Vec<(FunctionIndex, u64)>,
    cur_pos: Vec<u32>,
    cur_t: u64,
    n: u64,
    t: u64,
    tt: f64,
    max_functions: usize,
    /// Instructions of functions beyond `max_functions`.
    pub overflow_instructions: u64,
}

const NONE: u32 = u32::MAX;

impl ExactCounts {
    /// Counts for at most `max_functions` functions.
    pub fn new(max_functions: usize) -> Self {
        ExactCounts {
            acc: Vec::new(),
            cur: Vec::new(),
            cur_pos: Vec::new(),
            cur_t: 0,
            n: 0,
            t: 0,
            tt: 0.0,
            max_functions,
            overflow_instructions: 0,
        }
    }

    /// Adds `n` instructions of function `f` to the open segment.
    #[inline]
    pub fn add(&mut self, f: FunctionIndex, n: u64) {
        let i = f as usize;
        if i >= self.max_functions {
            self.overflow_instructions += n;
            self.cur_t += n;
            return;
        }
        if i >= self.cur_pos.len() {
            self.cur_pos.resize(i + 1, NONE);
        }
        match self.cur_pos[i] {
            NONE => {
                self.cur_pos[i] = self.cur.len() as u32;
                self.cur.push((f, n));
            }
            p => self.cur[p as usize].1 += n,
        }
        self.cur_t += n;
    }

    /// Closes the open segment (a no-op if it counted nothing).
    pub fn end_segment(&mut self) {
        if self.cur_t == 0 {
            return;
        }
        let t = self.cur_t as f64;
        for &(f, x) in &self.cur {
            let i = f as usize;
            if i >= self.acc.len() {
                self.acc.resize(i + 1, Acc::default());
            }
            let a = &mut self.acc[i];
            a.x += x;
            a.xx += (x as f64) * (x as f64);
            a.xt += x as f64 * t;
            a.segments += 1;
            self.cur_pos[i] = NONE;
        }
        self.cur.clear();
        self.n += 1;
        self.t += self.cur_t;
        self.tt += t * t;
        self.cur_t = 0;
    }

    /// Segments closed.
    pub fn segments(&self) -> u64 {
        self.n
    }

    /// Instructions in closed segments.
    pub fn instructions(&self) -> u64 {
        self.t
    }

    /// How many functions have instructions (without building [`functions`](Self::functions)).
    pub fn functions_seen(&self) -> usize {
        self.acc.iter().filter(|a| a.x > 0).count()
    }

    /// Functions with instructions, most instructions first.
    pub fn functions(&self) -> Vec<FunctionCount> {
        let (n, t) = (self.n as f64, self.t as f64);
        let mut v: Vec<FunctionCount> = self
            .acc
            .iter()
            .enumerate()
            .filter(|(_, a)| a.x > 0)
            .map(|(i, a)| {
                let r = a.x as f64 / t;
                // sum (x_i - r t_i)^2 = sum x^2 - 2 r sum x t + r^2 sum t^2
                let ss = (a.xx - 2.0 * r * a.xt + r * r * self.tt).max(0.0);
                let v = if self.n > 1 { n / (n - 1.0) * ss / (t * t) } else { f64::INFINITY };
                let h = 1.96 * v.sqrt();
                FunctionCount {
                    function: i as FunctionIndex,
                    instructions: a.x,
                    segments: a.segments,
                    share: r,
                    stderr: v.sqrt(),
                    ci: ((r - h).max(0.0), (r + h).min(1.0)),
                }
            })
            .collect();
        v.sort_by(|a, b| b.instructions.cmp(&a.instructions).then(a.function.cmp(&b.function)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exact sums; the interval by hand for three segments:
    /// f: x = (10, 0, 30), t = (100, 100, 100): R = 40/300; residuals (10-13.33, -13.33,
    /// 30-13.33) -> ss = 11.11 + 177.78 + 277.78 = 466.67; V = 3/2 * 466.67 / 90000.
    #[test]
    fn ratio_estimator() {
        let mut c = ExactCounts::new(10);
        for (x, rest) in [(10, 90), (0, 100), (30, 70)] {
            if x > 0 {
                c.add(1, x);
            }
            c.add(2, rest / 2);
            c.add(2, rest - rest / 2);
            c.end_segment();
        }
        c.end_segment(); // empty: no segment
        assert_eq!((c.segments(), c.instructions()), (3, 300));
        let fs = c.functions();
        assert_eq!(fs.iter().map(|f| (f.function, f.instructions, f.segments)).collect::<Vec<_>>(), [(2, 260, 3), (1, 40, 2)]);
        let f = fs[1];
        let v: f64 = 1.5 * 466.666_666_7 / 90_000.0;
        assert!((f.share - 40.0 / 300.0).abs() < 1e-12);
        assert!((f.ci.1 - (40.0 / 300.0 + 1.96 * v.sqrt())).abs() < 1e-9, "{f:?}");
        // The two functions' shares add up to 1, intervals of the same width.
        assert!((fs[0].share + fs[1].share - 1.0).abs() < 1e-12);
        assert!(((fs[0].ci.1 - fs[0].ci.0) - (f.ci.1 - f.ci.0)).abs() < 1e-9);
    }

    /// Beyond the bound, instructions are counted apart, still in the totals.
    #[test]
    fn bounded() {
        let mut c = ExactCounts::new(2);
        c.add(0, 5);
        c.add(7, 3);
        c.end_segment();
        assert_eq!((c.instructions(), c.overflow_instructions, c.functions().len()), (8, 3, 1));
    }
}

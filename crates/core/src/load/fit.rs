//! A three-parameter linear fit with exponential forgetting, a ridge towards an anchor, clipped
//! residuals and bounded parameters: the regression behind every learned rate.
//!
//! Unlike the textbook recursive (covariance-update) least squares, the fit keeps exponentially
//! weighted sufficient statistics (`Σ λᵏ x xᵀ`, `Σ λᵏ x y`) and re-solves a 3 × 3 system, so the
//! statistics stay positive semi-definite under any sequence of observations and the fit cannot
//! go numerically unstable.
//!
//! Invariants: `theta` is always finite and inside the bounds given to [`Fit::solve`]; one
//! observation moves the statistics by at most its clipped residual.

/// Bounds and scales of one model's parameters.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    /// Typical magnitude of each feature: sizes the pseudo-observations of a prior and of the
    /// ridge towards an anchor.
    pub prior_feature_scale: [f64; 3],
    /// Lower bound of each parameter.
    pub lo: [f64; 3],
    /// Upper bound of each parameter.
    pub hi: [f64; 3],
}

/// The configured values enter as this many pseudo-observations, forgotten like real ones: a
/// couple of observations already move an instance away from the guess, and after a few hundred
/// the guess no longer biases the fit.
const PRIOR_OBSERVATIONS: f64 = 2.0;

/// A permanent ridge towards the anchor, relative to each feature's weight: too small to bias the
/// fit, but it keeps a degenerate design (say, every request with the same work) solvable,
/// picking the solution nearest the anchor.
const PERMANENT_RIDGE: f64 = 1e-4;

/// One regression's state.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fit {
    /// The parameters.
    pub theta: [f64; 3],
    /// Σ λᵏ x xᵀ.
    xtx: [[f64; 3]; 3],
    /// Σ λᵏ x y.
    xty: [f64; 3],
    /// Running mean absolute residual, the scale for outlier clipping.
    pub mean_abs_residual: f64,
}

impl Fit {
    /// A fit at `theta`, holding it as [`PRIOR_OBSERVATIONS`] pseudo-observations.
    pub fn prior(theta: [f64; 3], shape: &Shape, mean_abs_residual: f64) -> Fit {
        let mut xtx = [[0.0; 3]; 3];
        let mut xty = [0.0; 3];
        for i in 0..3 {
            let w = PRIOR_OBSERVATIONS * shape.prior_feature_scale[i].powi(2);
            xtx[i][i] = w;
            xty[i] = w * theta[i];
        }
        Fit {
            theta,
            xtx,
            xty,
            mean_abs_residual,
        }
    }

    /// A fit with no observations of its own, at `pool`'s estimate.
    pub fn anchored_on(pool: &Fit) -> Fit {
        Fit {
            theta: pool.theta,
            xtx: [[0.0; 3]; 3],
            xty: [0.0; 3],
            mean_abs_residual: pool.mean_abs_residual,
        }
    }

    /// The model's prediction for features `x`.
    pub fn predict(&self, x: [f64; 3]) -> f64 {
        (0..3).map(|i| self.theta[i] * x[i]).sum()
    }

    /// Folds one observation into the statistics: each older one keeps `forgetting` of its
    /// weight, and the residual against the current fit is clipped at `outlier_clip` running
    /// mean absolute residuals.
    pub fn accumulate(&mut self, forgetting: f64, outlier_clip: f64, x: [f64; 3], y: f64) {
        let lambda = clamp(forgetting, 0.5, 1.0);
        let pred = self.predict(x);
        let clip = clamp(outlier_clip, 0.1, 1e6) * self.mean_abs_residual;
        let raw = y - pred;
        let y = pred + raw.clamp(-clip, clip);
        self.mean_abs_residual =
            (0.95 * self.mean_abs_residual + 0.05 * raw.abs().min(10.0 * clip)).clamp(0.1, 1e9);
        for i in 0..3 {
            for j in 0..3 {
                self.xtx[i][j] = lambda * self.xtx[i][j] + x[i] * x[j];
            }
            self.xty[i] = lambda * self.xty[i] + x[i] * y;
        }
    }

    /// Re-solves `theta` with a ridge pulling towards `anchor`: `weight` observations' worth
    /// (absolute) plus [`PERMANENT_RIDGE`] of the data's own weight; the result is clamped into
    /// the shape's bounds. A singular system leaves `theta` as it was.
    pub fn solve(&mut self, shape: &Shape, anchor: [f64; 3], weight: f64) {
        let mut m = self.xtx;
        let mut v = self.xty;
        for i in 0..3 {
            let scale = (self.xtx[i][i] * PERMANENT_RIDGE
                + weight * shape.prior_feature_scale[i].powi(2))
            .max(1e-9);
            m[i][i] += scale;
            v[i] += scale * anchor[i];
        }
        let Some(theta) = solve3(m, v) else {
            return;
        };
        for (i, t) in theta.into_iter().enumerate() {
            self.theta[i] = clamp(t, shape.lo[i], shape.hi[i]);
        }
    }
}

/// How one observation is folded in.
#[derive(Clone, Copy, Debug)]
pub(super) struct Learning {
    /// Parameter bounds and scales.
    pub shape: Shape,
    /// The configured values: the fleet-wide fit's anchor.
    pub configured: [f64; 3],
    /// Weight an older observation keeps per newer one.
    pub forgetting: f64,
    /// Residual clip, in running mean absolute residuals.
    pub outlier_clip: f64,
    /// Weight, in observations, of the fleet-wide fit in each instance's.
    pub pool_weight: f64,
}

/// A fleet's fits: one over every instance's observations, anchored on the configured values,
/// and one per instance, anchored on the fleet's.
#[derive(Debug)]
pub(super) struct Fits {
    /// The fleet-wide fit.
    pub pool: Fit,
    /// Per-instance fits.
    pub instances: Vec<Fit>,
    /// Next instance whose fit is re-anchored on the moving pool estimate (one per observation,
    /// so instances without traffic follow the pool at a bounded cost per observation).
    cursor: usize,
}

impl Fits {
    /// `n` instances, all at `pool`.
    pub fn new(pool: Fit, n: usize) -> Fits {
        Fits {
            pool,
            instances: vec![Fit::anchored_on(&pool); n],
            cursor: 0,
        }
    }

    /// The fit of instance `idx` (the pool's for unknown instances).
    pub fn get(&self, idx: usize) -> &Fit {
        self.instances.get(idx).unwrap_or(&self.pool)
    }

    /// Grows to at least `n` instances (new ones start at the pool's estimate).
    pub fn ensure_len(&mut self, n: usize) {
        if self.instances.len() < n {
            let init = Fit::anchored_on(&self.pool);
            self.instances.resize(n, init);
        }
    }

    /// Instance `idx` starts again from the pool's estimate.
    pub fn reset(&mut self, idx: usize) {
        let init = Fit::anchored_on(&self.pool);
        if let Some(f) = self.instances.get_mut(idx) {
            *f = init;
        }
    }

    /// Folds observation `(x, y)` of instance `idx` into the pool's fit and its own, and
    /// re-anchors one more instance on the pool. `None` for an unknown instance (nothing learned).
    pub fn learn(&mut self, idx: usize, l: &Learning, x: [f64; 3], y: f64) -> Option<&Fit> {
        if idx >= self.instances.len() {
            return None;
        }
        let pool_weight = clamp(l.pool_weight, 0.0, 1e6);
        self.pool.accumulate(l.forgetting, l.outlier_clip, x, y);
        self.pool.solve(&l.shape, l.configured, 0.0);
        let anchor = self.pool.theta;
        let f = &mut self.instances[idx];
        f.accumulate(l.forgetting, l.outlier_clip, x, y);
        f.solve(&l.shape, anchor, pool_weight);
        self.cursor = (self.cursor + 1) % self.instances.len();
        let c = self.cursor;
        if c != idx {
            self.instances[c].solve(&l.shape, anchor, pool_weight);
        }
        self.instances.get(idx)
    }
}

/// `x` inside `[lo, hi]`; non-finite bounds fall back to `[0, lo]`, NaN to `lo`.
pub(super) fn clamp(x: f64, lo: f64, hi: f64) -> f64 {
    let lo = if lo.is_finite() { lo } else { 0.0 };
    let hi = if hi.is_finite() && hi >= lo { hi } else { lo };
    if x.is_nan() {
        lo
    } else {
        x.clamp(lo, hi)
    }
}

/// Solves `m · t = v` by Gaussian elimination with partial pivoting; `None` if singular or not
/// finite.
fn solve3(mut m: [[f64; 3]; 3], mut v: [f64; 3]) -> Option<[f64; 3]> {
    for col in 0..3 {
        let pivot = (col..3).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[pivot][col].abs().is_nan() || m[pivot][col].abs() <= 1e-12 {
            return None;
        }
        m.swap(col, pivot);
        v.swap(col, pivot);
        for row in col + 1..3 {
            let f = m[row][col] / m[col][col];
            let pivot_row = m[col];
            for (dst, src) in m[row].iter_mut().zip(pivot_row).skip(col) {
                *dst -= f * src;
            }
            v[row] -= f * v[col];
        }
    }
    let mut t = [0.0; 3];
    for row in (0..3).rev() {
        let s: f64 = (row + 1..3).map(|k| m[row][k] * t[k]).sum();
        t[row] = (v[row] - s) / m[row][row];
    }
    t.iter().all(|x| x.is_finite()).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Shape = Shape {
        prior_feature_scale: [1.0, 1.0, 1.0],
        lo: [0.0, 0.0, 0.0],
        hi: [100.0, 100.0, 100.0],
    };

    #[test]
    fn recovers_a_linear_model_and_respects_bounds() {
        let mut f = Fit::prior([1.0, 1.0, 1.0], &SHAPE, 1.0);
        for k in 0..500 {
            let x = [1.0, (k % 7) as f64, (k % 5) as f64];
            f.accumulate(0.999, 3.0, x, 4.0 + 2.0 * x[1] + 0.5 * x[2]);
            f.solve(&SHAPE, [1.0, 1.0, 1.0], 0.0);
        }
        assert!((f.theta[0] - 4.0).abs() < 0.1, "{:?}", f.theta);
        assert!((f.theta[1] - 2.0).abs() < 0.05, "{:?}", f.theta);
        assert!((f.theta[2] - 0.5).abs() < 0.05, "{:?}", f.theta);
        for _ in 0..200 {
            f.accumulate(0.9, 1e6, [1.0, 1.0, 1.0], 1e9);
            f.solve(&SHAPE, [1.0, 1.0, 1.0], 0.0);
        }
        assert!(
            f.theta.iter().all(|t| (0.0..=100.0).contains(t)),
            "{:?}",
            f.theta
        );
    }

    #[test]
    fn singular_systems_have_no_solution() {
        assert_eq!(solve3([[0.0; 3]; 3], [1.0; 3]), None);
        let m = [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 0.0, 1.0]];
        assert_eq!(solve3(m, [1.0; 3]), None);
        assert_eq!(solve3([[f64::NAN; 3]; 3], [1.0; 3]), None);
    }
}

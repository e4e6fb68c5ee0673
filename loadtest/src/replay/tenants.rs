//! Tenants of a replay: each request of the workload belongs to one tenant, named in a request
//! header, so that a gateway's fair share between tenants can be measured.
//!
//! Invariants:
//! - The tenant of a request depends only on its index in the (sliced) workload, the mix and the
//!   seed: a run restricted to one tenant (`only`) sends exactly that tenant's requests of the
//!   full run, at the same arrival times, so "the light tenant alone" and "with the heavy one" are
//!   the same requests.
//! - Requests are drawn with probability proportional to their tenant's weight, so weights are
//!   shares of requests (and, for a workload whose lengths do not depend on the index, of tokens
//!   in expectation; the report gives the measured token split).

use serde::Serialize;

/// How the workload's requests are split between tenants.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantMix {
    /// Request header carrying the tenant's name.
    pub header: String,
    /// Tenants and their weights (positive), in the order given.
    pub tenants: Vec<(String, f64)>,
    /// Send only this tenant's requests.
    pub only: Option<String>,
    /// Seed of the draw.
    pub seed: u64,
}

/// A bad `--tenants` specification.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TenantSpecError {
    /// The specification named no tenant.
    #[error("no tenant given (expected NAME:WEIGHT[,NAME:WEIGHT...])")]
    Empty,
    /// A group is not `NAME:WEIGHT` with a positive finite weight.
    #[error("bad tenant {0:?}: expected NAME:WEIGHT with a weight > 0")]
    Group(String),
    /// Two groups share a name.
    #[error("tenant {0:?} is given twice")]
    Duplicate(String),
    /// `only` names no tenant of the mix.
    #[error("--only-tenant {0:?} is not one of the tenants")]
    UnknownOnly(String),
}

impl TenantMix {
    /// Parses `NAME:WEIGHT[,NAME:WEIGHT...]` (a group without `:WEIGHT` weighs 1).
    pub fn parse(
        spec: &str,
        header: impl Into<String>,
        only: Option<String>,
        seed: u64,
    ) -> Result<TenantMix, TenantSpecError> {
        let mut tenants: Vec<(String, f64)> = Vec::new();
        for group in spec.split(',').map(str::trim).filter(|g| !g.is_empty()) {
            let (name, weight) = match group.split_once(':') {
                Some((n, w)) => (n.trim(), w.trim().parse::<f64>().ok()),
                None => (group, Some(1.0)),
            };
            let weight = weight
                .filter(|w| w.is_finite() && *w > 0.0)
                .ok_or_else(|| TenantSpecError::Group(group.to_string()))?;
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(TenantSpecError::Group(group.to_string()));
            }
            if tenants.iter().any(|(n, _)| n == name) {
                return Err(TenantSpecError::Duplicate(name.to_string()));
            }
            tenants.push((name.to_string(), weight));
        }
        if tenants.is_empty() {
            return Err(TenantSpecError::Empty);
        }
        if let Some(o) = &only {
            if !tenants.iter().any(|(n, _)| n == o) {
                return Err(TenantSpecError::UnknownOnly(o.clone()));
            }
        }
        Ok(TenantMix {
            header: header.into(),
            tenants,
            only,
            seed,
        })
    }

    /// The tenant of the request at `index`.
    pub fn of(&self, index: usize) -> &str {
        let total: f64 = self.tenants.iter().map(|(_, w)| w).sum();
        // A uniform draw in [0, 1) from the index and the seed (splitmix64's finaliser).
        let mut z = (index as u64)
            .wrapping_add(self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let u = (z >> 11) as f64 / (1u64 << 53) as f64;
        let mut at = u * total;
        for (name, w) in &self.tenants {
            if at < *w {
                return name;
            }
            at -= w;
        }
        // Rounding at the top end.
        &self.tenants[self.tenants.len() - 1].0
    }

    /// Whether the request at `index` is sent.
    pub fn sends(&self, index: usize) -> bool {
        self.only.as_deref().is_none_or(|o| self.of(index) == o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(spec: &str, only: Option<&str>) -> TenantMix {
        TenantMix::parse(spec, "x-kvgate-tenant", only.map(String::from), 7).unwrap()
    }

    #[test]
    fn parses_and_rejects() {
        let m = mix("heavy:10, light", None);
        assert_eq!(
            m.tenants,
            vec![("heavy".to_string(), 10.0), ("light".to_string(), 1.0)]
        );
        let p = |s: &str| TenantMix::parse(s, "h", None, 1).map(|_| ());
        assert_eq!(p(""), Err(TenantSpecError::Empty));
        assert_eq!(p("a:0"), Err(TenantSpecError::Group("a:0".into())));
        assert_eq!(p("a:x"), Err(TenantSpecError::Group("a:x".into())));
        assert_eq!(p(":3"), Err(TenantSpecError::Group(":3".into())));
        assert_eq!(p("a b:1"), Err(TenantSpecError::Group("a b:1".into())));
        assert_eq!(p("a:1,a:2"), Err(TenantSpecError::Duplicate("a".into())));
        assert_eq!(
            TenantMix::parse("a:1", "h", Some("b".into()), 1).map(|_| ()),
            Err(TenantSpecError::UnknownOnly("b".into()))
        );
    }

    #[test]
    fn shares_follow_weights_and_only_keeps_the_same_requests() {
        let m = mix("heavy:10,light:1", None);
        let n = 20_000;
        let light: Vec<usize> = (0..n).filter(|&i| m.of(i) == "light").collect();
        let share = light.len() as f64 / n as f64;
        assert!((share - 1.0 / 11.0).abs() < 0.01, "light share {share}");
        let alone = mix("heavy:10,light:1", Some("light"));
        let sent: Vec<usize> = (0..n).filter(|&i| alone.sends(i)).collect();
        assert_eq!(sent, light);
        // Another seed, another draw.
        let other = TenantMix::parse("heavy:10,light:1", "h", None, 8).unwrap();
        assert!((0..200).any(|i| other.of(i) != m.of(i)));
    }
}

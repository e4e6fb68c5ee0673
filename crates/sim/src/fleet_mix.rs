//! A fleet made of engines of different classes: `PRESET:COUNT[,PRESET:COUNT...]`.
//!
//! `llama3-8b-h100:4,llama3-8b-a100-40gb:4` is four engines of the first preset followed by four
//! of the second; a group without `:COUNT` is one engine. The same string is accepted on every
//! command line that takes a preset (`--fleet`) and in configuration files (`fleet = "..."`).
//!
//! Invariants of a parsed [`FleetMix`]: at least one group; every group names a known preset and
//! has at least one engine; the total is at most [`MAX_ENGINES`]; engines are numbered in the
//! order the groups are written, so engine `i` always has the same class for the same string.
//! Its display form parses back to the same value.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::model::params::{preset, PRESET_NAMES};

/// Most engines a fleet may have (the same bound as `FleetConfig::engines`).
pub const MAX_ENGINES: usize = 1024;

/// Why a fleet string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FleetMixError {
    /// Nothing but separators.
    #[error("empty fleet: expected PRESET:COUNT[,PRESET:COUNT...], e.g. llama3-8b-h100:4,llama3-8b-a100-40gb:4")]
    Empty,
    /// `a:1,,b:2` or a trailing comma.
    #[error("empty group at position {0} of the fleet (two commas in a row or a trailing comma?)")]
    EmptyGroup(usize),
    /// Not a known preset.
    #[error("unknown preset {name:?} in the fleet; known: {known}", known = PRESET_NAMES.join(", "))]
    UnknownPreset {
        /// The name as written.
        name: String,
    },
    /// The count is not a positive integer.
    #[error("bad engine count {count:?} for {preset}: expected a whole number of at least 1")]
    BadCount {
        /// The preset it belongs to.
        preset: String,
        /// The count as written.
        count: String,
    },
    /// More engines than a fleet may have.
    #[error("the fleet has {0} engines; at most {MAX_ENGINES} are allowed")]
    TooMany(usize),
}

/// One group of identical engines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetGroup {
    /// Preset of the group's engines.
    pub preset: String,
    /// Number of engines.
    pub engines: usize,
}

/// Groups of engines by preset, in engine order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct FleetMix {
    groups: Vec<FleetGroup>,
}

impl FleetMix {
    /// A fleet of `engines` engines of one preset.
    pub fn uniform(preset_name: &str, engines: usize) -> Result<Self, FleetMixError> {
        Self::from_groups(vec![FleetGroup {
            preset: preset_name.to_string(),
            engines,
        }])
    }

    /// A fleet of these groups, checked.
    pub fn from_groups(groups: Vec<FleetGroup>) -> Result<Self, FleetMixError> {
        if groups.is_empty() {
            return Err(FleetMixError::Empty);
        }
        let mut total = 0usize;
        for g in &groups {
            if preset(&g.preset).is_none() {
                return Err(FleetMixError::UnknownPreset {
                    name: g.preset.clone(),
                });
            }
            if g.engines == 0 {
                return Err(FleetMixError::BadCount {
                    preset: g.preset.clone(),
                    count: "0".into(),
                });
            }
            total = total.saturating_add(g.engines);
        }
        if total > MAX_ENGINES {
            return Err(FleetMixError::TooMany(total));
        }
        Ok(FleetMix { groups })
    }

    /// The groups, in engine order.
    pub fn groups(&self) -> &[FleetGroup] {
        &self.groups
    }

    /// Number of engines.
    pub fn engines(&self) -> usize {
        self.groups.iter().map(|g| g.engines).sum()
    }

    /// The preset of every engine, in engine order.
    pub fn engine_presets(&self) -> Vec<&str> {
        self.groups
            .iter()
            .flat_map(|g| std::iter::repeat_n(g.preset.as_str(), g.engines))
            .collect()
    }

    /// Whether every engine has the same preset.
    pub fn is_uniform(&self) -> bool {
        self.groups
            .iter()
            .all(|g| g.preset == self.groups[0].preset)
    }
}

impl FromStr for FleetMix {
    type Err = FleetMixError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.split(',').all(|g| g.trim().is_empty()) {
            return Err(FleetMixError::Empty);
        }
        let mut groups = Vec::new();
        for (i, raw) in s.split(',').enumerate() {
            let g = raw.trim();
            if g.is_empty() {
                return Err(FleetMixError::EmptyGroup(i + 1));
            }
            let (name, count) = match g.rsplit_once(':') {
                Some((n, c)) => (n.trim(), Some(c.trim())),
                None => (g, None),
            };
            if preset(name).is_none() {
                return Err(FleetMixError::UnknownPreset { name: name.into() });
            }
            let engines = match count {
                None => 1,
                Some(c) => match c.parse::<usize>() {
                    Ok(n) if n >= 1 => n,
                    _ => {
                        return Err(FleetMixError::BadCount {
                            preset: name.into(),
                            count: c.into(),
                        })
                    }
                },
            };
            groups.push(FleetGroup {
                preset: name.to_string(),
                engines,
            });
        }
        Self::from_groups(groups)
    }
}

impl fmt::Display for FleetMix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, g) in self.groups.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}:{}", g.preset, g.engines)?;
        }
        Ok(())
    }
}

impl TryFrom<String> for FleetMix {
    type Error = FleetMixError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<FleetMix> for String {
    fn from(m: FleetMix) -> String {
        m.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_groups_in_engine_order() {
        let m: FleetMix = "llama3-8b-h100:2, llama3-8b-a100-40gb:3".parse().unwrap();
        assert_eq!(m.engines(), 5);
        assert_eq!(
            m.engine_presets(),
            [
                "llama3-8b-h100",
                "llama3-8b-h100",
                "llama3-8b-a100-40gb",
                "llama3-8b-a100-40gb",
                "llama3-8b-a100-40gb"
            ]
        );
        assert!(!m.is_uniform());
        assert_eq!(m.to_string(), "llama3-8b-h100:2,llama3-8b-a100-40gb:3");
        assert_eq!(m.to_string().parse::<FleetMix>().unwrap(), m);
        let one: FleetMix = "tiny-cpu".parse().unwrap();
        assert_eq!((one.engines(), one.is_uniform()), (1, true));
        assert_eq!(FleetMix::uniform("tiny-cpu", 1).unwrap(), one);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let err = |s: &str| s.parse::<FleetMix>().unwrap_err();
        assert_eq!(err(""), FleetMixError::Empty);
        assert_eq!(err(" , "), FleetMixError::Empty);
        assert_eq!(err("tiny-cpu:1,,tiny-cpu:2"), FleetMixError::EmptyGroup(2));
        assert_eq!(err("tiny-cpu:1,"), FleetMixError::EmptyGroup(2));
        let e = err("llama3-8b-h10:4");
        assert!(e.to_string().contains("\"llama3-8b-h10\""), "{e}");
        assert!(e.to_string().contains("llama3-8b-h100"), "{e}");
        for bad in [
            "tiny-cpu:0",
            "tiny-cpu:-1",
            "tiny-cpu:x",
            "tiny-cpu:",
            "tiny-cpu:1.5",
        ] {
            let e = err(bad);
            assert!(matches!(e, FleetMixError::BadCount { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("tiny-cpu"), "{e}");
        }
        assert_eq!(
            err("tiny-cpu:1000,tiny-cpu:25"),
            FleetMixError::TooMany(1025)
        );
        assert!(FleetMix::from_groups(Vec::new()).is_err());
    }

    #[test]
    fn serde_uses_the_string_form() {
        let m: FleetMix = serde_json::from_str("\"llama3-8b-h100:1,tiny-cpu:2\"").unwrap();
        assert_eq!(m.engines(), 3);
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            "\"llama3-8b-h100:1,tiny-cpu:2\""
        );
        let e = serde_json::from_str::<FleetMix>("\"nope:1\"").unwrap_err();
        assert!(e.to_string().contains("unknown preset"), "{e}");
    }
}

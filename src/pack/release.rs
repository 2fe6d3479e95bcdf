//! Upstream releases of a pack (`te@2.19.0`): a pack's `releases:` and the `releases:` bounds
//! on its rules and backend files (docs/packs/releases.md).

use crate::lang::Version;

/// A release bound as written on a rule or backend file: comparisons joined by commas, all of
/// which must hold (`">=2.19.0"`, `"<2.20.0"`, `">=2.19.0, <2.20.0"`, `"==2.18.0"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseRange(Vec<(Op, Version)>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Ge,
    Gt,
    Le,
    Lt,
    Eq,
}

impl ReleaseRange {
    /// Parses a bound; the error says what is wrong.
    pub fn parse(text: &str) -> Result<ReleaseRange, String> {
        let mut out = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            let (op, rest) = [
                (">=", Op::Ge),
                ("<=", Op::Le),
                ("==", Op::Eq),
                (">", Op::Gt),
                ("<", Op::Lt),
            ]
            .into_iter()
            .find_map(|(p, op)| part.strip_prefix(p).map(|r| (op, r)))
            .ok_or_else(|| format!("release bound `{part}` must start with >=, >, <=, < or =="))?;
            let v = Version::parse(rest.trim()).ok_or_else(|| {
                format!(
                    "`{}` in release bound `{part}` is not a version",
                    rest.trim()
                )
            })?;
            out.push((op, v));
        }
        Ok(ReleaseRange(out))
    }

    /// Whether `release` satisfies every comparison.
    pub fn contains(&self, release: &Version) -> bool {
        self.0.iter().all(|(op, v)| match op {
            Op::Ge => release >= v,
            Op::Gt => release > v,
            Op::Le => release <= v,
            Op::Lt => release < v,
            Op::Eq => release == v,
        })
    }
}

/// `te@2.19.0` -> (`te`, Some(`2.19.0`)); `te` -> (`te`, None).
pub fn split_name(name: &str) -> (&str, Option<&str>) {
    match name.split_once('@') {
        Some((pack, release)) => (pack, Some(release)),
        None => (name, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_hold_together() {
        let r = ReleaseRange::parse(">=2.19.0, <2.20.0").unwrap();
        let v = |s| Version::parse(s).unwrap();
        assert!(r.contains(&v("2.19.0")));
        assert!(!r.contains(&v("2.18.0")));
        assert!(!r.contains(&v("2.20.2")));
        assert!(
            ReleaseRange::parse("==2.18.0")
                .unwrap()
                .contains(&v("2.18.0"))
        );
        assert!(ReleaseRange::parse("2.18.0").is_err());
        assert!(ReleaseRange::parse(">=x").is_err());
        assert_eq!(split_name("te@2.19.0"), ("te", Some("2.19.0")));
        assert_eq!(split_name("te"), ("te", None));
    }
}

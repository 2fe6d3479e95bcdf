//! Semantic versions as the selector compares them (PEP 440-like ordering for the subset used by
//! cuDNN, flash-attn and friends): `9.19.0`, `2.8.3`, `4.0.0b11`, `1.29.0rc1`, `2.20.0.dev0`.
//! A pre-release sorts below its release, so `1.29.0rc1 < 1.29.0`.

use std::cmp::Ordering;
use std::fmt;

/// Pre-release kinds in PEP 440 order (dev < a < b < rc < final).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PreKind {
    Dev = 0,
    Alpha = 1,
    Beta = 2,
    Rc = 3,
}

/// A parsed version. `Copy` so that fact values stay allocation-free on the hot path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    pub parts: [u32; 3],
    /// `None` for a final release.
    pub pre: Option<(PreKind, u32)>,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            parts: [major, minor, patch],
            pre: None,
        }
    }

    /// Parses `X`, `X.Y`, `X.Y.Z` with an optional pre-release suffix (`rc1`, `b11`, `a2`,
    /// `.dev0`, `-rc1`) and an optional local/build suffix (`+cu13`), which is ignored for
    /// ordering as PEP 440 does for comparisons against public versions.
    pub fn parse(text: &str) -> Option<Version> {
        let s = text.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        let s = match s.find('+') {
            Some(i) => &s[..i],
            None => s,
        };
        if s.is_empty() {
            return None;
        }
        let bytes = s.as_bytes();
        let mut parts = [0u32; 3];
        let mut n = 0;
        let mut i = 0;
        loop {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            if i == start || n == 3 {
                return None;
            }
            parts[n] = s[start..i].parse().ok()?;
            n += 1;
            if i + 1 < bytes.len() && bytes[i] == b'.' && bytes[i + 1].is_ascii_digit() {
                i += 1;
                continue;
            }
            break;
        }
        let rest = &s[i..];
        if rest.is_empty() {
            return Some(Version { parts, pre: None });
        }
        let rest = rest.trim_start_matches(['.', '-', '_']);
        let (kind, digits) = [
            ("dev", PreKind::Dev),
            ("alpha", PreKind::Alpha),
            ("beta", PreKind::Beta),
            ("rc", PreKind::Rc),
            ("a", PreKind::Alpha),
            ("b", PreKind::Beta),
            ("c", PreKind::Rc),
        ]
        .iter()
        .find_map(|(p, k)| rest.strip_prefix(p).map(|d| (*k, d)))?;
        let digits = digits.trim_start_matches(['.', '-', '_']);
        let num = if digits.is_empty() {
            0
        } else if digits.bytes().all(|b| b.is_ascii_digit()) {
            digits.parse().ok()?
        } else {
            return None;
        };
        Some(Version {
            parts,
            pre: Some((kind, num)),
        })
    }

    pub fn is_prerelease(&self) -> bool {
        self.pre.is_some()
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        self.parts
            .cmp(&other.parts)
            .then_with(|| match (self.pre, other.pre) {
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Greater,
                (Some(_), None) => Ordering::Less,
                (Some(a), Some(b)) => a.cmp(&b),
            })
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.parts[0], self.parts[1], self.parts[2])?;
        if let Some((kind, n)) = self.pre {
            let tag = match kind {
                PreKind::Dev => ".dev",
                PreKind::Alpha => "a",
                PreKind::Beta => "b",
                PreKind::Rc => "rc",
            };
            write!(f, "{tag}{n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap_or_else(|| panic!("{s} should parse"))
    }

    #[test]
    fn prerelease_sorts_below_release() {
        assert!(v("1.29.0rc1") < v("1.29.0"));
        assert!(v("1.29.0rc1") > v("1.28.9"));
        assert!(v("4.0.0b11") < v("4.0.0"));
        assert!(v("4.0.0b11") > v("4.0.0b2"));
        assert!(v("2.20.0.dev0") < v("2.20.0a1"));
        assert!(v("3.0.0b1") < v("3.0.0"));
    }

    #[test]
    fn short_forms_pad_with_zero() {
        assert_eq!(v("9.23"), v("9.23.0"));
        assert_eq!(v("9"), v("9.0.0"));
        assert!(v("9.18.1") > v("9.18"));
    }

    #[test]
    fn local_suffix_is_ignored() {
        assert_eq!(v("2.8.3+cu130"), v("2.8.3"));
    }

    #[test]
    fn garbage_does_not_parse() {
        for s in ["", "abc", "1..2", "1.2.3.4", "1.2x", "rc1", "1.2.3rcx"] {
            assert!(Version::parse(s).is_none(), "{s} should not parse");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in ["9.19.0", "1.29.0rc1", "4.0.0b11", "2.20.0.dev0"] {
            assert_eq!(v(s).to_string(), s);
            assert_eq!(v(&v(s).to_string()), v(s));
        }
    }
}

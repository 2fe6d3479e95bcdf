//! Upstream releases of a pack (`te@2.19.0`): a pack's `releases:` and the `releases:` bounds
//! on its rules and backend files (docs/packs/releases.md).

use crate::lang::Version;
use crate::policy::AutoRelease;

/// Why `<pack>@auto` gave no pack (docs/packs/releases.md, "te@auto"); each error names the
/// releases that have packs.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// `te@auto` without the installed release (the `te_version` fact).
    #[error("`{requested}` needs the installed {upstream} release to choose a pack; none was given{}", hint.as_ref().map(|h| format!(" ({h})")).unwrap_or_default())]
    NoInstalledRelease {
        requested: String,
        upstream: String,
        /// How the front end takes one (`--te-version X`, `--set te_version=X`, ...).
        hint: Option<String>,
    },
    /// `te@auto` for a release older than every release with a pack (before 2.18.0).
    #[error("{upstream} {installed} is older than every release with a pack; releases with packs: {}", releases.join(", "))]
    ReleaseTooOld {
        upstream: String,
        installed: String,
        releases: Vec<&'static str>,
    },
    /// `te@auto` for text that is not a version.
    #[error("`{installed}` is not a release version (for `{requested}`); releases with packs: {}", releases.join(", "))]
    BadInstalledRelease {
        requested: String,
        installed: String,
        releases: Vec<&'static str>,
    },
}

/// The release word that asks for the installed release: `te@auto`.
pub const AUTO: &str = "auto";

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

/// Whether `name` asks for the pack of the installed release (`te@auto`).
pub fn is_auto(name: &str) -> bool {
    split_name(name).1 == Some(AUTO)
}

/// The upstream project a pack family mirrors, as messages name it (`te`: TransformerEngine).
pub fn upstream(pack: &str) -> &str {
    match pack {
        "te" => "TransformerEngine",
        other => other,
    }
}

/// The pack of `pack`'s releases (`releases`: its `<pack>@<release>` names, any order) that
/// decides for `installed`, the upstream version this process runs. Versions compare as
/// PEP 440 orders them ([`Version`]): a local suffix (`+cu13`) is ignored, a pre-release or
/// dev build sorts below its release (`2.20.2rc1` and `2.20.2.dev0` are older than 2.20.2).
///
/// * a release with a pack: that pack;
/// * between two releases: the nearest older one, with a warning naming both;
/// * newer than every release: the newest, with a warning;
/// * older than every release: [`ReleaseError::ReleaseTooOld`], naming the releases;
/// * not a version: [`ReleaseError::BadInstalledRelease`].
pub fn resolve_installed(
    pack: &str,
    installed: &str,
    releases: &[&'static str],
) -> Result<AutoRelease, ReleaseError> {
    let mut known: Vec<(Version, &'static str)> = releases
        .iter()
        .filter_map(|r| Some((Version::parse(split_name(r).1?)?, *r)))
        .collect();
    known.sort();
    let names: Vec<&'static str> = known.iter().map(|(_, r)| *r).collect();
    let requested = format!("{pack}@{AUTO}");
    let Some(v) = Version::parse(installed) else {
        return Err(ReleaseError::BadInstalledRelease {
            requested,
            installed: installed.to_string(),
            releases: names,
        });
    };
    let Some(&(at, chosen)) = known.iter().rev().find(|(r, _)| *r <= v) else {
        return Err(ReleaseError::ReleaseTooOld {
            upstream: upstream(pack).to_string(),
            installed: installed.to_string(),
            releases: names,
        });
    };
    let upstream = upstream(pack);
    let list = names.join(", ");
    let warning = if at == v {
        None
    } else if Some(chosen) == names.last().copied() {
        Some(format!(
            "{upstream} {installed} is newer than every release with a pack; deciding with \
             {chosen}, the newest (packs: {list})"
        ))
    } else {
        Some(format!(
            "{upstream} {installed} has no pack; deciding with {chosen}, the nearest older \
             release (packs: {list})"
        ))
    };
    Ok(AutoRelease {
        requested,
        installed: installed.to_string(),
        upstream: upstream.to_string(),
        pack: chosen,
        warning,
    })
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

    const RELEASES: &[&str] = &["te@2.20.2", "te@2.19.0", "te@2.18.0"];

    fn auto(v: &str) -> Result<AutoRelease, ReleaseError> {
        resolve_installed("te", v, RELEASES)
    }

    #[test]
    fn installed_release_with_a_pack_is_exact() {
        for (v, pack) in [
            ("2.18.0", "te@2.18.0"),
            ("2.19.0", "te@2.19.0"),
            ("2.20.2", "te@2.20.2"),
            // A local suffix is ignored: the same public release.
            ("2.19.0+cu13", "te@2.19.0"),
        ] {
            let a = auto(v).unwrap();
            assert_eq!(a.pack, pack, "{v}");
            assert_eq!(a.installed, v);
            assert_eq!(a.requested, "te@auto");
            assert_eq!(a.warning, None, "{v}");
        }
    }

    #[test]
    fn between_releases_takes_the_nearest_older_with_a_warning() {
        let a = auto("2.19.5").unwrap();
        assert_eq!(a.pack, "te@2.19.0");
        assert_eq!(
            a.warning.as_deref(),
            Some(
                "TransformerEngine 2.19.5 has no pack; deciding with te@2.19.0, the nearest \
                 older release (packs: te@2.18.0, te@2.19.0, te@2.20.2)"
            )
        );
        // PEP 440: a dev build or release candidate of 2.20.2 precedes 2.20.2.
        for v in ["2.20.2.dev0", "2.20.2rc1", "2.20.0"] {
            let a = auto(v).unwrap();
            assert_eq!(a.pack, "te@2.19.0", "{v}");
            assert!(a.warning.unwrap().contains(v));
        }
        let a = auto("2.21.0").unwrap();
        assert_eq!(a.pack, "te@2.20.2");
        assert!(a.warning.unwrap().contains("newer than every release"));
        assert_eq!(auto("2.20.3+abc").unwrap().pack, "te@2.20.2");
    }

    #[test]
    fn older_or_unparseable_releases_are_refused() {
        for v in ["2.17.0", "2.18.0rc1", "1.0"] {
            let e = auto(v).unwrap_err();
            assert!(matches!(e, ReleaseError::ReleaseTooOld { .. }), "{v}");
            let text = e.to_string();
            assert!(text.contains(v), "{text}");
            assert!(text.contains("te@2.18.0, te@2.19.0, te@2.20.2"), "{text}");
        }
        for v in ["garbage", "", "2.19.0.1"] {
            let e = auto(v).unwrap_err();
            assert!(matches!(e, ReleaseError::BadInstalledRelease { .. }), "{v}");
            assert!(e.to_string().contains("te@2.18.0"), "{e}");
        }
        assert!(is_auto("te@auto"));
        assert!(!is_auto("te@2.19.0"));
        assert!(!is_auto("te"));
    }
}

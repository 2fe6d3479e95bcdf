//! [`PackSpec`]: which pack to load and how (embedded name or folder, overlays, `--parity`,
//! layers switched off, the executor catalogue to check chains against), resolved in one place
//! for every command and binding.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::load::{LoadError, PackSource, load_pack_with};
use super::release::ReleaseError;
use crate::catalogue::ExecutorCatalogue;
use crate::facts::did_you_mean;
use crate::policy::AutoRelease;
use crate::policy::Policy;

/// A pack to load: its source plus everything that changes what it decides.
#[derive(Clone, Debug, Default)]
pub struct PackSpec {
    /// `None`: the default pack, `te`.
    pub source: Option<PackSource>,
    /// Site overlay files: extra rules in their own layer (`--overlay`).
    pub overlays: Vec<PathBuf>,
    /// Pure TransformerEngine parity: the `guard` layer off where the pack has one.
    pub parity: bool,
    /// Further layers to switch off by name.
    pub layers_off: Vec<String>,
    /// Executor names chains may use; `None`: chains are not checked against a catalogue.
    pub catalogue: Option<Arc<ExecutorCatalogue>>,
    /// The installed upstream release (the `te_version` fact): what `te@auto` resolves
    /// against (docs/packs/releases.md). Read only for an `@auto` name.
    pub installed_release: Option<String>,
}

/// Why a [`PackSpec`] did not give a policy.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("unknown pack `{name}`{}; embedded packs: {}", suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default(), known.join(", "))]
    UnknownPack {
        name: String,
        known: Vec<&'static str>,
        suggestion: Option<String>,
    },
    #[error("unknown release `{name}`{}; releases: {}", suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default(), if releases.is_empty() { "none (this pack mirrors no upstream releases)".to_string() } else { releases.join(", ") })]
    UnknownRelease {
        name: String,
        releases: Vec<&'static str>,
        suggestion: Option<String>,
    },
    #[error("`{spec}` is neither a folder holding pack.yaml nor an embedded pack ({})", known.join(", "))]
    NotAPack {
        spec: String,
        known: Vec<&'static str>,
    },
    /// `te@auto` gave no pack (no release, too old, not a version).
    #[error(transparent)]
    Release(#[from] ReleaseError),
    /// The pack's files have errors (rendered with [`LoadError::render`]).
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{0}")]
    Layer(String),
}

impl PackError {
    /// The diagnostics rendered with their source snippets (load errors), or the message.
    pub fn render(&self, color: bool) -> String {
        match self {
            PackError::Load(e) => e.render(color),
            other => format!("error: {other}\n"),
        }
    }
}

impl PackSpec {
    /// An embedded pack by name.
    pub fn embedded(name: impl Into<String>) -> PackSpec {
        PackSpec {
            source: Some(PackSource::Embedded(name.into())),
            ..PackSpec::default()
        }
    }

    fn embedded_source(source: PackSource) -> PackSpec {
        PackSpec {
            source: Some(source),
            ..PackSpec::default()
        }
    }

    /// A pack folder holding `pack.yaml`.
    pub fn dir(path: impl AsRef<Path>) -> PackSpec {
        PackSpec {
            source: Some(PackSource::Dir(path.as_ref().to_path_buf())),
            ..PackSpec::default()
        }
    }

    /// A pack named on a command line: an existing folder, else an embedded pack's name.
    pub fn parse(spec: &str) -> Result<PackSpec, PackError> {
        let path = Path::new(spec);
        if path.is_dir() {
            return Ok(PackSpec::dir(path));
        }
        let known = super::embedded::all_names();
        if known.contains(&spec) {
            return Ok(PackSpec::embedded(spec));
        }
        if let (pack, Some(release)) = super::release::split_name(spec)
            && super::embedded::pack_names().contains(&pack)
        {
            if release == super::release::AUTO {
                // Resolved when loaded, against the installed release given by then.
                return Ok(PackSpec::embedded(spec));
            }
            // `te@2.17.0`: the resolver names the releases that exist.
            return PackSpec::embedded(spec)
                .resolve()
                .map(PackSpec::embedded_source);
        }
        Err(PackError::NotAPack {
            spec: spec.to_string(),
            known,
        })
    }

    pub fn with_overlays(mut self, overlays: impl IntoIterator<Item = PathBuf>) -> PackSpec {
        self.overlays.extend(overlays);
        self
    }

    pub fn with_parity(mut self, parity: bool) -> PackSpec {
        self.parity = parity;
        self
    }

    pub fn with_catalogue(mut self, catalogue: Arc<ExecutorCatalogue>) -> PackSpec {
        self.catalogue = Some(catalogue);
        self
    }

    /// The installed upstream release `te@auto` resolves against (the `te_version` fact).
    pub fn with_installed_release(mut self, version: Option<String>) -> PackSpec {
        self.installed_release = version;
        self
    }

    /// Whether the pack is named `<pack>@auto` (resolved against the installed release).
    pub fn is_auto(&self) -> bool {
        matches!(&self.source, Some(PackSource::Embedded(n)) if super::release::is_auto(n))
    }

    /// For a pack named `<pack>@auto` (`te@auto`): the release pack that decides for the
    /// installed release, with the warning when it is not that release's own pack; `None` for
    /// any other name. Errors: no installed release given, one older than every pack, or not a
    /// version (each names the releases that have packs).
    pub fn resolve_auto(&self) -> Result<Option<AutoRelease>, PackError> {
        let Some(PackSource::Embedded(name)) = &self.source else {
            return Ok(None);
        };
        let (pack, Some(super::release::AUTO)) = super::release::split_name(name) else {
            return Ok(None);
        };
        let releases = super::embedded::release_names(pack);
        if releases.is_empty() {
            return Err(PackError::UnknownRelease {
                name: name.clone(),
                releases,
                suggestion: None,
            });
        }
        let Some(installed) = &self.installed_release else {
            return Err(ReleaseError::NoInstalledRelease {
                requested: name.clone(),
                upstream: super::release::upstream(pack).to_string(),
                hint: None,
            }
            .into());
        };
        Ok(Some(super::release::resolve_installed(
            pack, installed, &releases,
        )?))
    }

    /// The source, with an embedded name checked (did-you-mean on a typo).
    pub fn resolve(&self) -> Result<PackSource, PackError> {
        match &self.source {
            None => Ok(PackSource::Embedded("te".into())),
            Some(PackSource::Dir(d)) => Ok(PackSource::Dir(d.clone())),
            Some(PackSource::Embedded(name)) => {
                if let Some(auto) = self.resolve_auto()? {
                    return Ok(PackSource::Embedded(auto.pack.to_string()));
                }
                let known = super::embedded::all_names();
                if known.contains(&name.as_str()) {
                    return Ok(PackSource::Embedded(name.clone()));
                }
                // `te@2.17.0`: name the releases the pack has.
                let (pack, release) = super::release::split_name(name);
                if release.is_some() && super::embedded::pack_names().contains(&pack) {
                    let releases = super::embedded::release_names(pack);
                    return Err(PackError::UnknownRelease {
                        suggestion: did_you_mean(name, releases.iter().copied()),
                        name: name.clone(),
                        releases,
                    });
                }
                Err(PackError::UnknownPack {
                    suggestion: did_you_mean(name, known.iter().copied()),
                    name: name.clone(),
                    known,
                })
            }
        }
    }

    /// Loads, type-checks and links the pack, then switches off the requested layers.
    pub fn load(&self) -> Result<Policy, PackError> {
        let auto = self.resolve_auto()?;
        let source = self.resolve()?;
        let mut policy = load_pack_with(source, &self.overlays, self.catalogue.as_deref())?;
        policy.auto = auto;
        let mut off = self.layers_off.clone();
        if self.parity && policy.layers.iter().any(|l| l == "guard") {
            off.push("guard".into());
        }
        for layer in off {
            policy
                .set_layer_enabled(&layer, false)
                .map_err(PackError::Layer)?;
        }
        Ok(policy)
    }
}

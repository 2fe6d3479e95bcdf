//! The executor catalogue: which executors exist, as data (names, descriptions, who provides
//! them, and what each admits as a condition over a pack family's facts). No executor code
//! lives here: the adapters crate builds the catalogue of its executors, a host (the Python
//! package) adds its own, and the pack loader checks every executor chain against the catalogue
//! it is given (`E-EXECUTOR` for an unknown name; `check` proves dead entries from the
//! `admits` conditions).

use serde::Serialize;

/// Who provides an executor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "name")]
pub enum Provider {
    /// Compiled into the adapters crate (available where its feature and device are).
    Builtin,
    /// Provided by a host process (`python`): known everywhere, runnable only inside it.
    Host(String),
}

/// One executor, as the loader and the analysis see it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CatalogueEntry {
    /// The name executor chains use (`cudnn`).
    pub name: String,
    /// One line for listings.
    pub description: String,
    pub provider: Provider,
    /// Per pack family: the condition (rule language, over that family's facts) under which the
    /// executor's manifest admits the problem. A family without an entry: unknown (the
    /// dead-entry lint then makes no claim).
    pub admits: Vec<(String, String)>,
}

impl CatalogueEntry {
    /// The `admits` condition for a family, if the executor states one.
    pub fn admits_for(&self, family: &str) -> Option<&str> {
        self.admits
            .iter()
            .find(|(f, _)| f == family)
            .map(|(_, c)| c.as_str())
    }
}

/// The set of executors a pack's chains may name.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ExecutorCatalogue {
    entries: Vec<CatalogueEntry>,
}

impl ExecutorCatalogue {
    pub fn new() -> ExecutorCatalogue {
        ExecutorCatalogue::default()
    }

    /// Adds an executor, replacing one of the same name.
    pub fn add(&mut self, entry: CatalogueEntry) {
        self.entries.retain(|e| e.name != entry.name);
        self.entries.push(entry);
    }

    pub fn get(&self, name: &str) -> Option<&CatalogueEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    pub fn entries(&self) -> &[CatalogueEntry] {
        &self.entries
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.name.as_str())
    }
}

//! Backend name (as written in rule packs) -> executor.
//!
//! Manifests are available without creating an executor (no device is touched), so a rule-pack
//! cross-check runs on any machine. Executors are created on first use and then shared.
//!
//! Adding an executor: write a `fn manifest() -> Manifest` and a
//! `fn create() -> Result<Arc<dyn Executor>, ExecError>` and add a [`RegistryEntry`] in
//! [`Registry::builtin`] (or call [`Registry::register`] at run time).

use crate::executor::{ExecError, Executor, Manifest};
use std::sync::{Arc, Mutex};

/// Constructor of an executor (may fail with [`ExecError::NoDevice`]).
pub type CreateFn = fn() -> Result<Arc<dyn Executor>, ExecError>;

/// One registered backend.
#[derive(Clone)]
pub struct RegistryEntry {
    /// Name as rule packs write it.
    pub name: &'static str,
    /// One-line description.
    pub description: &'static str,
    /// Static manifest (no device needed).
    pub manifest: fn() -> Manifest,
    /// Constructor.
    pub create: CreateFn,
}

/// The set of known executors.
pub struct Registry {
    entries: Vec<RegistryEntry>,
    created: Mutex<Vec<(&'static str, Arc<dyn Executor>)>>,
}

impl Registry {
    /// An empty registry.
    pub fn empty() -> Registry {
        Registry {
            entries: Vec::new(),
            created: Mutex::new(Vec::new()),
        }
    }

    /// The executors built into this crate: `reference` always; `chunked` always listed (its
    /// constructor fails with [`ExecError::NoDevice`] without the `cuda` feature or a GPU).
    pub fn builtin() -> Registry {
        let mut r = Registry::empty();
        r.register(RegistryEntry {
            name: crate::reference::NAME,
            description: "CPU float64 reference (oracle), every shape/mask/window/GQA",
            manifest: crate::reference::manifest,
            create: crate::reference::create,
        });
        r.register(RegistryEntry {
            name: crate::chunked::NAME,
            description: "CUDA chunked cuBLAS GEMMs + NVRTC softmax, any head_dim (multiple of 8)",
            manifest: crate::chunked::manifest,
            create: crate::chunked::create,
        });
        r
    }

    /// Add (or replace) an entry.
    pub fn register(&mut self, entry: RegistryEntry) {
        self.entries.retain(|e| e.name != entry.name);
        self.entries.push(entry);
    }

    /// Registered names, in registration order.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.name).collect()
    }

    /// The entry for `name`.
    pub fn entry(&self, name: &str) -> Result<&RegistryEntry, ExecError> {
        self.entries
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| ExecError::UnknownExecutor {
                name: name.to_string(),
                known: self.names().join(", "),
            })
    }

    /// Static manifest of `name` (no device touched).
    pub fn manifest(&self, name: &str) -> Result<Manifest, ExecError> {
        Ok((self.entry(name)?.manifest)())
    }

    /// Every registered executor's static manifest, in registration order (for pack
    /// cross-checks and docs; serializes to JSON with serde).
    pub fn manifests(&self) -> Vec<Manifest> {
        self.entries.iter().map(|e| (e.manifest)()).collect()
    }

    /// The executor for `name`, created on first use and shared afterwards.
    pub fn get(&self, name: &str) -> Result<Arc<dyn Executor>, ExecError> {
        let entry = self.entry(name)?;
        let mut created = self.created.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, e)) = created.iter().find(|(n, _)| *n == entry.name) {
            return Ok(e.clone());
        }
        let e = (entry.create)()?;
        created.push((entry.name, e.clone()));
        Ok(e)
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry::builtin()
    }
}

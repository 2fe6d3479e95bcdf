//! The executor catalogue this crate gives the pack loader: every executor of
//! [`Registry::builtin`] (this crate's and the Python host's `torch_*`) as data, with each
//! manifest's te-family `admits` condition ([`crate::from_facts::te_admits`]). A pack naming a
//! host executor loads everywhere; outside Python that executor is unavailable.

use attn_policy::{CatalogueEntry, ExecutorCatalogue, Provider};

use crate::registry::{self, Registry};

/// The catalogue of a registry.
pub fn of(registry: &Registry) -> ExecutorCatalogue {
    let mut c = ExecutorCatalogue::new();
    // Manifests only: no availability probe (that may open a device) is needed to load a pack.
    for name in registry.names() {
        let Ok(e) = registry.entry(name) else {
            continue;
        };
        c.add(CatalogueEntry {
            admits: vec![("te".into(), crate::from_facts::te_admits(&e.manifest))],
            name: e.name.clone(),
            description: e.description.clone(),
            provider: match e.provider {
                registry::Provider::PythonHost => Provider::Host("python".into()),
                registry::Provider::Builtin => Provider::Builtin,
            },
        });
    }
    c
}

/// The catalogue of this build ([`Registry::builtin`]).
pub fn catalogue() -> ExecutorCatalogue {
    of(&Registry::builtin())
}

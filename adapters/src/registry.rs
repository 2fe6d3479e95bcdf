//! Executor name (as written in rule packs) -> executor, with each executor's manifest and an
//! answer to "can it run here?".
//!
//! Manifests are data held by the entry: no device is touched to read them, so a rule-pack
//! check runs on any machine. Executors are created on first use per CUDA device and shared.
//!
//! [`Registry::builtin`] holds every executor this crate has (`reference`, `chunked`, `cudnn`,
//! `frost`), each gated by its cargo feature and a run-time probe, plus the executors a Python
//! host provides (`torch_flash`, `torch_efficient`, `torch_cudnn`, `torch_math`), which report
//! `unavailable: provided by the Python host` here. The Python package registers its own
//! entries for those ([`Registry::register_host`]).
//!
//! Adding a built-in executor: a `fn manifest() -> Manifest`, a
//! `fn create(ordinal: usize) -> Result<Arc<dyn Executor>, ExecError>` and a
//! `fn availability() -> Availability`, then a [`RegistryEntry`] in [`Registry::builtin`].

pub use crate::device::Availability;
use crate::executor::{ExecError, Executor, Manifest};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Constructor of an executor on a CUDA device ordinal (host executors ignore it); may fail
/// with [`ExecError::NoDevice`].
pub type CreateFn = fn(usize) -> Result<Arc<dyn Executor>, ExecError>;

/// Run-time probe of whether an executor can run in this process.
pub type ProbeFn = fn() -> Availability;

/// Who provides an executor's implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// This crate.
    Builtin,
    /// The Python host (the `attn_policy` package inside a PyTorch process).
    PythonHost,
}

/// Why a host-provided executor cannot run outside its host.
pub const HOST_ONLY: &str = "provided by the Python host";

/// One registered executor.
#[derive(Clone)]
pub struct RegistryEntry {
    /// Name as rule packs write it.
    pub name: String,
    /// One-line description.
    pub description: String,
    /// Capability manifest (data; no device needed).
    pub manifest: Manifest,
    /// Who implements it.
    pub provider: Provider,
    /// Cargo feature it needs (None: always built).
    pub feature: Option<&'static str>,
    /// Constructor (None for host-provided executors: they are not created here).
    pub create: Option<CreateFn>,
    /// Availability probe (None: the fixed answer in `fixed`).
    pub probe: Option<ProbeFn>,
    /// The answer when there is no probe.
    pub fixed: Availability,
}

impl RegistryEntry {
    /// A built-in entry.
    pub fn builtin(
        name: &str,
        description: &str,
        manifest: Manifest,
        feature: Option<&'static str>,
        create: CreateFn,
        probe: ProbeFn,
    ) -> RegistryEntry {
        RegistryEntry {
            name: name.into(),
            description: description.into(),
            manifest,
            provider: Provider::Builtin,
            feature,
            create: Some(create),
            probe: Some(probe),
            fixed: Availability::unavailable("not probed"),
        }
    }

    /// An entry the Python host provides; `available` is the host's answer (outside the host:
    /// `Unavailable` with [`HOST_ONLY`]).
    pub fn host(
        name: &str,
        description: &str,
        manifest: Manifest,
        available: Availability,
    ) -> Self {
        RegistryEntry {
            name: name.into(),
            description: description.into(),
            manifest,
            provider: Provider::PythonHost,
            feature: None,
            create: None,
            probe: None,
            fixed: available,
        }
    }
}

/// What `attn-policy executors` and the bindings list per executor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutorInfo {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Who implements it.
    pub provider: Provider,
    /// Cargo feature it needs.
    pub feature: Option<String>,
    /// Whether it can run here, and why not.
    #[serde(flatten)]
    pub availability: Availability,
    /// Its manifest.
    pub manifest: Manifest,
}

type Created = HashMap<(String, usize), Arc<dyn Executor>>;

/// The set of known executors.
pub struct Registry {
    entries: Vec<RegistryEntry>,
    created: Mutex<Created>,
    probed: Mutex<HashMap<String, Availability>>,
}

impl Registry {
    /// An empty registry.
    pub fn empty() -> Registry {
        Registry {
            entries: Vec::new(),
            created: Mutex::new(HashMap::new()),
            probed: Mutex::new(HashMap::new()),
        }
    }

    /// Every executor of this crate (each gated by its feature and a run-time probe) and the
    /// Python host's executors (unavailable outside it).
    pub fn builtin() -> Registry {
        let mut r = Registry::empty();
        r.register(RegistryEntry::builtin(
            crate::reference::NAME,
            "CPU float64 reference (oracle), every shape/mask/window/GQA; fp16/bf16/fp32/fp64",
            crate::reference::manifest(),
            None,
            crate::reference::create,
            || Availability::Available {
                detail: "host CPU".into(),
            },
        ));
        r.register(RegistryEntry::builtin(
            crate::chunked::NAME,
            "CUDA chunked cuBLAS GEMMs + NVRTC softmax, any head_dim (multiple of 8)",
            crate::chunked::manifest(),
            Some("cuda"),
            crate::chunked::create,
            crate::chunked::availability,
        ));
        r.register(RegistryEntry::builtin(
            crate::fused::NAME,
            "CUDA fused wgmma kernel (NVRTC, SM90), head_dim 264..512, forward",
            crate::fused::manifest(),
            Some("cuda"),
            crate::fused::create,
            crate::fused::availability,
        ));
        r.register(RegistryEntry::builtin(
            crate::cudnn::NAME,
            "cuDNN fused attention through the backend graph API (the process's libcudnn)",
            crate::cudnn::manifest(),
            Some("cudnn"),
            crate::cudnn::create,
            crate::cudnn::availability,
        ));
        r.register(RegistryEntry::builtin(
            crate::frost::NAME,
            "cuDNN frontend FROST (CuTe DSL) engines, head_dim 264..512, through Python",
            crate::frost::manifest(),
            Some("frost"),
            crate::frost::create,
            crate::frost::availability,
        ));
        for (name, description, manifest) in crate::host::torch_executors() {
            r.register(RegistryEntry::host(
                name,
                description,
                manifest,
                Availability::unavailable(HOST_ONLY),
            ));
        }
        r
    }

    /// Add an entry, or replace the one of the same name in place (its position in
    /// [`Registry::names`] is kept); a replaced executor's created instances are dropped.
    pub fn register(&mut self, entry: RegistryEntry) {
        let name = entry.name.clone();
        match self.entries.iter_mut().find(|e| e.name == entry.name) {
            Some(slot) => *slot = entry,
            None => self.entries.push(entry),
        }
        self.created
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(n, _), _| *n != name);
        self.probed
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&name);
    }

    /// Registers (or replaces) an executor the Python host provides, with its manifest and the
    /// host's availability answer.
    pub fn register_host(
        &mut self,
        name: &str,
        description: &str,
        manifest: Manifest,
        available: Availability,
    ) {
        self.register(RegistryEntry::host(name, description, manifest, available));
    }

    /// Registered names, in registration order.
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.name.as_str()).collect()
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

    /// Manifest of `name` (no device touched).
    pub fn manifest(&self, name: &str) -> Result<Manifest, ExecError> {
        Ok(self.entry(name)?.manifest.clone())
    }

    /// Every registered executor's manifest, in registration order (for pack checks and docs;
    /// serializes to JSON with serde).
    pub fn manifests(&self) -> Vec<Manifest> {
        self.entries.iter().map(|e| e.manifest.clone()).collect()
    }

    /// Whether `name` can run here (the probe runs once per registry and is remembered).
    pub fn availability(&self, name: &str) -> Result<Availability, ExecError> {
        let e = self.entry(name)?;
        let Some(probe) = e.probe else {
            return Ok(e.fixed.clone());
        };
        let mut probed = self.probed.lock().unwrap_or_else(|p| p.into_inner());
        Ok(probed.entry(e.name.clone()).or_insert_with(probe).clone())
    }

    /// Every executor with its availability and manifest, in registration order.
    pub fn describe(&self) -> Vec<ExecutorInfo> {
        self.entries
            .iter()
            .map(|e| ExecutorInfo {
                name: e.name.clone(),
                description: e.description.clone(),
                provider: e.provider,
                feature: e.feature.map(str::to_string),
                availability: self
                    .availability(&e.name)
                    .unwrap_or_else(|x| Availability::unavailable(x.to_string())),
                manifest: e.manifest.clone(),
            })
            .collect()
    }

    /// The executor for `name` on CUDA device 0 (host executors: the host), created on first
    /// use and shared afterwards.
    pub fn get(&self, name: &str) -> Result<Arc<dyn Executor>, ExecError> {
        self.get_on(name, 0)
    }

    /// The executor for `name` on CUDA device `ordinal`, created on first use per device and
    /// shared afterwards. Unavailable executors fail with the probe's reason.
    pub fn get_on(&self, name: &str, ordinal: usize) -> Result<Arc<dyn Executor>, ExecError> {
        let entry = self.entry(name)?;
        let Some(create) = entry.create else {
            return Err(ExecError::Unavailable {
                name: entry.name.clone(),
                reason: entry.fixed.reason().unwrap_or(HOST_ONLY).to_string(),
            });
        };
        let key = (entry.name.clone(), ordinal);
        {
            let created = self.created.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = created.get(&key) {
                return Ok(e.clone());
            }
        }
        if let Availability::Unavailable { reason } = self.availability(name)? {
            return Err(ExecError::NoDevice { reason });
        }
        // Created outside the lock: a GPU constructor takes a while (kernel compilation).
        let e = create(ordinal)?;
        let mut created = self.created.lock().unwrap_or_else(|e| e.into_inner());
        Ok(created.entry(key).or_insert(e).clone())
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry::builtin()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_lists_every_executor_with_an_answer() {
        let r = Registry::builtin();
        assert_eq!(
            r.names(),
            vec![
                "reference",
                "chunked",
                "fused",
                "cudnn",
                "frost",
                "torch_flash",
                "torch_efficient",
                "torch_cudnn",
                "torch_math"
            ]
        );
        assert!(r.availability("reference").unwrap().is_available());
        for host in [
            "torch_flash",
            "torch_efficient",
            "torch_cudnn",
            "torch_math",
        ] {
            assert_eq!(
                r.availability(host).unwrap(),
                Availability::unavailable(HOST_ONLY)
            );
            match r.get(host) {
                Err(ExecError::Unavailable { name, reason }) => {
                    assert_eq!((name.as_str(), reason.as_str()), (host, HOST_ONLY))
                }
                Err(other) => panic!("{host}: {other}"),
                Ok(_) => panic!("{host}: created outside its host"),
            }
        }
        // GPU executors: available only with their feature and a device; otherwise the reason
        // names what is missing.
        for gpu in ["chunked", "fused", "cudnn", "frost"] {
            let a = r.availability(gpu).unwrap();
            if let Some(reason) = a.reason() {
                assert!(
                    reason.contains("feature")
                        || reason.contains("GPU")
                        || reason.contains("librar")
                        || reason.contains("libcudnn")
                        || reason.contains("device")
                        || reason.contains("sm_"),
                    "{gpu}: {reason}"
                );
                assert!(r.get(gpu).is_err(), "{gpu} created while unavailable");
            }
        }
        let described = r.describe();
        assert_eq!(described.len(), 9);
        let j = serde_json::to_value(&described[0]).unwrap();
        assert_eq!(j["availability"], "available");
        assert_eq!(j["provider"], "builtin");
        assert_eq!(j["manifest"]["name"], "reference");
    }

    #[test]
    fn a_host_registration_replaces_the_placeholder() {
        let mut r = Registry::builtin();
        let m = r.manifest("torch_flash").unwrap();
        r.register_host(
            "torch_flash",
            "torch's FlashAttention-2",
            m,
            Availability::Available {
                detail: "torch 2.11".into(),
            },
        );
        assert!(r.availability("torch_flash").unwrap().is_available());
        assert_eq!(r.names().len(), 9);
        assert_eq!(r.names()[5], "torch_flash", "replaced in place");
        assert!(matches!(
            r.get("nope"),
            Err(ExecError::UnknownExecutor { .. })
        ));
    }

    #[test]
    fn reference_is_shared_per_device() {
        let r = Registry::builtin();
        let a = r.get_on("reference", 0).unwrap();
        let b = r.get_on("reference", 0).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let c = r.get_on("reference", 1).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
    }
}

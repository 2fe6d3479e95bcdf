//! `attn_policy._native`: the compiled half of the Python package. The public API lives in
//! `python/attn_policy/` (pure Python) on top of these classes.
//!
//! Hot paths stay in Rust: reading a config dict (or a TransformerEngine `AttentionParams`
//! object) into facts, the cached decision, and the TE tuple. The GIL is not released around
//! a decision (it takes microseconds; releasing costs more).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use attn_policy::CachedPolicy;
use attn_policy::Decision;
use attn_policy::facts::schema::Origin;
use attn_policy::facts::te::FIELDS;
use attn_policy::pack::ReleaseError;
use attn_policy::{CallExtras, ExecutorAttempt, ExecutorOutcome, Explanation};
use attn_policy::{Facts, PackSpec, Policy};
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use serde_json::{Map, Value as Json};

mod call;
mod eager_abi;
mod inputs;
mod torch_ops;
mod walk;

create_exception!(
    _native,
    PolicyError,
    PyValueError,
    "A bad pack or a bad config; the message is the CLI's. Pack errors carry `.diagnostics`."
);

fn policy_error(py: Python<'_>, message: String, diagnostics: Option<Json>) -> PyErr {
    let err = PolicyError::new_err(message);
    let value = err.value(py);
    let diags = match diagnostics {
        Some(d) => pythonize::pythonize(py, &d)
            .map(|o| o.unbind())
            .unwrap_or_else(|_| py.None()),
        None => PyList::empty(py).into_any().unbind(),
    };
    let _ = value.setattr("diagnostics", diags);
    err
}

fn to_py(py: Python<'_>, v: &Json) -> PyResult<Py<PyAny>> {
    pythonize::pythonize(py, v)
        .map(|o| o.unbind())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A loaded pack with its decision cache.
#[pyclass(frozen, module = "attn_policy._native")]
struct NativePolicy {
    inner: Arc<CachedPolicy>,
    /// Input memo in front of the decision cache: the exact [`InputKey`] of a Python input ->
    /// the facts and decision it reads into (and, for TE drop-in calls, the provenance of its
    /// environment facts). A hit skips building JSON and `Facts`. Bounded: cleared when full.
    memo: RwLock<IdMap<u64, Memo>>,
    memo_cap: usize,
}

/// Keys that are hashes already: no rehashing (a multiply spreads the low bits).
#[derive(Default)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01B3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = x.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(32);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    fn write_isize(&mut self, x: isize) {
        self.write_u64(x as u64);
    }
}

type IdMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<IdHasher>>;

struct Memo {
    key: InputKey,
    /// The config the facts were read from (after live probes), for `NativeDecision.config`.
    config: Arc<Json>,
    facts: Arc<Facts>,
    decision: Arc<Decision>,
    provenance: Arc<Provenance>,
    explained: Explained,
}

/// The explanation of a memo entry's decision, built on first use and shared by every
/// `NativeDecision` of that entry (a repeated TE drop-in call renders its tuple from it).
type Explained = Arc<OnceLock<Explanation>>;

// Words of an [`InputKey`]. Each value starts with a tag word that says what follows.
const K_NONE: u64 = 1;
const K_FALSE: u64 = 2;
const K_TRUE: u64 = 3;
const K_INT: u64 = 4; // + the i64
const K_FLOAT: u64 = 5; // + the bit pattern
const K_STR: u64 = 6; // + Python's hash; the str object is kept in `strs`
const K_DICT: u64 = 7; // + length, then (key, value) pairs
const K_LIST: u64 = 8; // + length, then items
const K_TUPLE: u64 = 9; // + length, then items
const K_JSON: u64 = 10; // + the JSON the value reads as (any other object)
const K_TEXT: u64 = 11; // + byte length, then the bytes
const K_ATTR: u64 = 12; // | attribute index << 8, then the value
const K_OSENV: u64 = 13; // | switch index << 8, then K_NONE or K_TEXT
const K_SELECT: u64 = 14; // a `select` input
const K_TE: u64 = 15; // a TE drop-in input (+ answer-probes flag)
const K_JSON_TEXT: u64 = 16; // `select` of a JSON string: the str follows
const K_ARRAY: u64 = 17; // JSON array + length
const K_OBJECT: u64 = 18; // JSON object + length, then (text, value) pairs
const K_NUM: u64 = 19; // JSON number: + i64 or f64 bits
const K_ARG: u64 = 20; // an environment fact given as a call argument

/// The exact key of a Python input, read without building JSON: a word sequence (a prefix
/// code: type tags, lengths, ints, float bit patterns, attribute indices, environment
/// switches) and every `str` read along the way, kept alive and compared by identity, else by
/// value. Plain values (None, bool, int, float, str, dict, list, tuple) are encoded as they
/// are; any other object by the JSON it reads as. So two inputs with equal keys read into the
/// same config, and a dict changed between two calls has a different key.
struct InputKey {
    words: Vec<u64>,
    strs: Vec<Py<PyString>>,
}

impl InputKey {
    fn new() -> InputKey {
        InputKey {
            words: Vec::with_capacity(256),
            strs: Vec::with_capacity(64),
        }
    }

    fn word(&mut self, w: u64) {
        self.words.push(w);
    }

    fn str(&mut self, s: &Bound<'_, PyString>) -> PyResult<()> {
        self.words.extend([K_STR, s.hash()? as u64]);
        self.strs.push(s.clone().unbind());
        Ok(())
    }

    fn text(&mut self, s: &str) {
        self.words.extend([K_TEXT, s.len() as u64]);
        self.words.extend(s.as_bytes().chunks(8).map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        }));
    }

    fn json(&mut self, v: &Json) {
        match v {
            Json::Null => self.word(K_NONE),
            Json::Bool(b) => self.word(if *b { K_TRUE } else { K_FALSE }),
            Json::Number(n) => match n.as_i64() {
                Some(i) => self.words.extend([K_NUM, 0, i as u64]),
                None => match n.as_u64() {
                    Some(u) => self.words.extend([K_NUM, 1, u]),
                    None => self
                        .words
                        .extend([K_NUM, 2, n.as_f64().map_or(0, f64::to_bits)]),
                },
            },
            Json::String(s) => self.text(s),
            Json::Array(a) => {
                self.words.extend([K_ARRAY, a.len() as u64]);
                for x in a {
                    self.json(x);
                }
            }
            Json::Object(m) => {
                self.words.extend([K_OBJECT, m.len() as u64]);
                for (k, x) in m {
                    self.text(k);
                    self.json(x);
                }
            }
        }
    }

    fn hash(&self) -> u64 {
        // Four independent multiply lanes, then splitmix64's finaliser.
        const MUL: u64 = 0xF135_7AEA_2E62_A9C5;
        let mix = |h: u64, w: u64| (h ^ w).wrapping_mul(MUL).rotate_left(26);
        let mut lanes = [1u64, 2, 3, 4];
        let mut chunks = self.words.chunks_exact(4);
        for c in &mut chunks {
            for i in 0..4 {
                lanes[i] = mix(lanes[i], c[i]);
            }
        }
        let mut h = mix(0x9E37_79B9_7F4A_7C15, self.words.len() as u64);
        for &w in chunks.remainder().iter().chain(&lanes) {
            h = mix(h, w);
        }
        h ^= h >> 30;
        h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h ^= h >> 27;
        h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
        h ^ (h >> 31)
    }

    /// Equal words and equal strings (`is`, else `==` on two exact `str`s: no Python code).
    fn same(&self, py: Python<'_>, other: &InputKey) -> PyResult<bool> {
        if self.words != other.words || self.strs.len() != other.strs.len() {
            return Ok(false);
        }
        for (a, b) in self.strs.iter().zip(&other.strs) {
            if !a.is(b) && !a.bind(py).as_any().eq(b.bind(py))? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The name a value is read under (`*dtype` strings are translated), resolved only when needed.
#[derive(Clone, Copy)]
enum Name<'a, 'py> {
    Static(&'a str),
    Key(&'a Bound<'py, PyAny>),
}

impl Name<'_, '_> {
    fn text(&self) -> PyResult<String> {
        match self {
            Name::Static(s) => Ok((*s).to_owned()),
            Name::Key(k) => match k.cast::<PyString>() {
                Ok(s) => Ok(s.to_cow()?.into_owned()),
                Err(_) => Ok(k.str()?.to_cow()?.into_owned()),
            },
        }
    }
}

/// Reads one value into `key` and, when `build`, into JSON exactly as [`value_json`] does.
/// Plain values go into the key as they are (no JSON is built for a key alone); any other
/// object is read through `value_json` and goes into the key as that JSON.
fn read_value(
    v: &Bound<'_, PyAny>,
    name: Name<'_, '_>,
    key: &mut InputKey,
    build: bool,
) -> PyResult<Option<Json>> {
    if v.is_none() {
        key.word(K_NONE);
        return Ok(build.then_some(Json::Null));
    }
    if let Ok(b) = v.cast_exact::<PyBool>() {
        let b = b.is_true();
        key.word(if b { K_TRUE } else { K_FALSE });
        return Ok(build.then_some(Json::Bool(b)));
    }
    if v.is_exact_instance_of::<PyInt>() {
        let Ok(i) = v.extract::<i64>() else {
            return Err(unrepresentable(v, &name.text()?));
        };
        key.words.extend([K_INT, i as u64]);
        return Ok(build.then(|| Json::from(i)));
    }
    if let Ok(f) = v.cast_exact::<PyFloat>() {
        let f = f.value();
        if !f.is_finite() {
            return Err(unrepresentable(v, &name.text()?));
        }
        key.words.extend([K_FLOAT, f.to_bits()]);
        return Ok(build.then(|| serde_json::Number::from_f64(f).map_or(Json::Null, Json::Number)));
    }
    if let Ok(s) = v.cast_exact::<PyString>() {
        key.str(s)?;
        return if build {
            value_json(v, &name.text()?).map(Some)
        } else {
            Ok(None)
        };
    }
    if let Ok(d) = v.cast_exact::<PyDict>() {
        key.words.extend([K_DICT, d.len() as u64]);
        let mut m = build.then(|| Map::with_capacity(d.len()));
        for (k, x) in d.iter() {
            match k.cast_exact::<PyString>() {
                Ok(s) => key.str(s)?,
                Err(_) => key.text(&Name::Key(&k).text()?),
            }
            let j = read_value(&x, Name::Key(&k), key, build)?;
            if let (Some(m), Some(j)) = (m.as_mut(), j) {
                m.insert(Name::Key(&k).text()?, j);
            }
        }
        return Ok(m.map(Json::Object));
    }
    let seq = if v.is_exact_instance_of::<PyList>() {
        Some((K_LIST, v.cast::<PyList>()?.iter().collect::<Vec<_>>()))
    } else if let Ok(t) = v.cast::<PyTuple>() {
        // tuples and torch.Size (a tuple subclass: its items are the tuple's own)
        Some((K_TUPLE, t.iter().collect::<Vec<_>>()))
    } else {
        None
    };
    if let Some((tag, items)) = seq {
        key.words.extend([tag, items.len() as u64]);
        let mut a = build.then(|| Vec::with_capacity(items.len()));
        for x in &items {
            let j = read_value(x, name, key, build)?;
            if let (Some(a), Some(j)) = (a.as_mut(), j) {
                a.push(j);
            }
        }
        return Ok(a.map(Json::Array));
    }
    let j = value_json(v, &name.text()?)?;
    key.word(K_JSON);
    key.json(&j);
    Ok(build.then_some(j))
}

/// Facts of a config in `policy`'s pack family (te, torch, ...).
fn facts_from(policy: &Policy, config: &Json) -> Result<Facts, String> {
    policy
        .read_facts(config)
        .map_err(|e| format!("invalid config: {e}"))
}

#[pymethods]
impl NativePolicy {
    /// Loads an embedded pack (`pack`) or a folder holding pack.yaml (`path`), with overlays,
    /// layers switched off and a cache bound.
    /// `te_version`: the installed TransformerEngine release `te@auto` resolves against.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (pack=None, path=None, overlays=Vec::new(), layers_off=Vec::new(), parity=false, cache_size=4096, te_version=None))]
    fn load(
        py: Python<'_>,
        pack: Option<String>,
        path: Option<String>,
        overlays: Vec<String>,
        layers_off: Vec<String>,
        parity: bool,
        cache_size: usize,
        te_version: Option<String>,
    ) -> PyResult<NativePolicy> {
        let spec = match (pack, path) {
            (_, Some(p)) => PackSpec::dir(p),
            (Some(name), None) => PackSpec::embedded(name),
            (None, None) => PackSpec::embedded("te"),
        };
        // The executor catalogue (this crate's executors and the Python host's `torch_*`):
        // `executors:` chains are type-checked against it at load, as the CLI does.
        let spec = PackSpec {
            layers_off,
            ..spec
                .with_overlays(overlays.into_iter().map(Into::into))
                .with_parity(parity)
                .with_catalogue(torch_ops::catalogue())
                .with_installed_release(te_version)
        };
        let policy: Policy = py.detach(|| spec.load()).map_err(|e| match e {
            attn_policy::PackError::Load(e) => {
                let diags: Vec<Json> = e
                    .diagnostics
                    .0
                    .iter()
                    .map(|d| {
                        serde_json::json!({
                            "code": d.code.name(),
                            "severity": d.severity.word(),
                            "message": d.message,
                            "location": d.location,
                            "label": d.label,
                            "help": d.help,
                        })
                    })
                    .collect();
                policy_error(py, e.render(false), Some(Json::Array(diags)))
            }
            attn_policy::PackError::Release(ReleaseError::NoInstalledRelease {
                requested,
                upstream,
                hint: None,
            }) => policy_error(
                py,
                attn_policy::PackError::Release(ReleaseError::NoInstalledRelease {
                    requested,
                    upstream,
                    hint: Some(TE_VERSION_HINT.into()),
                })
                .to_string(),
                None,
            ),
            other => policy_error(py, other.to_string(), None),
        })?;
        Ok(NativePolicy {
            inner: Arc::new(CachedPolicy::new(policy, cache_size)),
            memo: RwLock::new(IdMap::default()),
            memo_cap: cache_size.max(1),
        })
    }

    #[getter]
    fn name(&self) -> String {
        self.inner.policy().name.clone()
    }

    /// Set when the pack was named `te@auto`: `{"requested", "installed", "warning"}` (the
    /// explanation's `pack_from`); else None.
    #[getter]
    fn pack_from(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.inner.policy().auto {
            Some(a) => to_py(
                py,
                &serde_json::json!({
                    "requested": a.requested,
                    "installed": a.installed,
                    "warning": a.warning,
                }),
            ),
            None => Ok(py.None()),
        }
    }

    #[getter]
    fn backend_names(&self) -> Vec<String> {
        self.inner
            .policy()
            .backends
            .iter()
            .map(|b| b.name.clone())
            .collect()
    }

    #[getter]
    fn layers(&self) -> Vec<String> {
        self.inner.policy().layers.clone()
    }

    /// The executor chain the pack declares for `backend` (and its `variant`, whose own chain
    /// wins where the pack gives one): executor names in order, first = the backend's own.
    /// Empty when the pack names none; a backend or variant the pack lacks is a `ValueError`.
    #[pyo3(signature = (backend, variant=None))]
    fn executor_chain(&self, backend: &str, variant: Option<&str>) -> PyResult<Vec<String>> {
        let p = self.inner.policy();
        let b = p.backend_index(backend).ok_or_else(|| {
            PolicyError::new_err(format!(
                "pack {} has no backend {backend:?} (backends: {})",
                p.name,
                p.backends
                    .iter()
                    .map(|b| b.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let v = match variant {
            None => None,
            Some(name) => Some(
                p.backends[b]
                    .variants
                    .iter()
                    .position(|v| v.name == name)
                    .ok_or_else(|| {
                        PolicyError::new_err(format!(
                            "backend {backend} has no variant {name:?} (variants: {})",
                            p.backends[b]
                                .variants
                                .iter()
                                .map(|v| v.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ))
                    })? as u8,
            ),
        };
        Ok(chain_names(p, b as u16, v))
    }

    /// Decides for a config (a dict of facts by TE's names, or a JSON string).
    fn select(&self, py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<NativeDecision> {
        let read = |key: &mut InputKey, build: bool| -> PyResult<Option<ReadInput>> {
            key.word(K_SELECT);
            if let Ok(s) = config.cast_exact::<PyString>() {
                key.word(K_JSON_TEXT);
                key.str(s)?;
                if !build {
                    return Ok(None);
                }
                let json = serde_json::from_str(&s.to_cow()?).map_err(|e| {
                    policy_error(py, format!("invalid config: not JSON: {e}"), None)
                })?;
                return Ok(Some((json, Vec::new(), false)));
            }
            if config.cast::<PyString>().is_ok() {
                // A str subclass: its text, read like the JSON string it holds.
                let text = config.cast::<PyString>()?.to_cow()?.into_owned();
                key.text(&text);
                if !build {
                    return Ok(None);
                }
                let json = serde_json::from_str(&text).map_err(|e| {
                    policy_error(py, format!("invalid config: not JSON: {e}"), None)
                })?;
                return Ok(Some((json, Vec::new(), false)));
            }
            let Ok(d) = config.cast::<PyDict>() else {
                return Err(policy_error(
                    py,
                    format!(
                        "invalid config: expected a dict of facts, found {}",
                        config.get_type().name()?
                    ),
                    None,
                ));
            };
            if d.is_exact_instance_of::<PyDict>() {
                let json = read_value(d.as_any(), Name::Static(""), key, build)?;
                Ok(json.map(|j| (j, Vec::new(), false)))
            } else {
                let json = dict_json(d)?;
                key.word(K_JSON);
                key.json(&json);
                Ok(build.then_some((json, Vec::new(), false)))
            }
        };
        self.decide_read(py, read)
    }

    /// Decides for a TransformerEngine `AttentionParams`-like object. `environment` maps each
    /// environment fact the caller resolved to `(value, source)`; facts the object itself has
    /// win. Switches under `env` come from the object, then `environment`, then the process
    /// environment. Probe facts the object lacks stay unknown unless `prober` answers them.
    /// `arguments` (optional) are environment facts given to this call: each counts as
    /// `(value, "argument")` and wins over `environment`'s entry of the same name.
    /// `prober` (optional) answers the probe facts the object lacks, live:
    /// `prober(problem, is_training) -> {probe name: True | False | None}`, with `problem` the
    /// executor problem the facts describe (a `NativeProblem`, or None when they describe none
    /// the executors express). Unanswered probes stay unknown (never "supported"). Answers are
    /// cached with the decision (see `cache_clear`).
    #[pyo3(signature = (params, environment, arguments=None, prober=None))]
    fn te_select(
        &self,
        py: Python<'_>,
        params: &Bound<'_, PyAny>,
        environment: &Bound<'_, PyDict>,
        arguments: Option<&Bound<'_, PyDict>>,
        prober: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<NativeDecision> {
        let arguments = arguments.filter(|a| !a.is_empty());
        let prober = prober.filter(|p| !p.is_none());
        self.decide_read_probed(
            py,
            |key, build| te_read(params, environment, arguments, key, build),
            prober,
        )
    }

    /// Cache counters: hits, misses, inserts, evictions, len, capacity.
    fn cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.cache().stats();
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("inserts", s.inserts)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("len", s.len)?;
        d.set_item("capacity", s.capacity)?;
        Ok(d)
    }

    fn cache_clear(&self) {
        self.memo.write().unwrap_or_else(|p| p.into_inner()).clear();
        self.inner.cache().clear();
        self.inner.cache().reset_stats();
    }
}

/// What one read of a Python input gives when asked to build: the config as JSON, the
/// provenance of its environment facts, and whether the input lacks probe facts (then a live
/// prober may answer them).
type ReadInput = (Json, Provenance, bool);

/// Probe facts of the te family, answered live by a prober.
const PROBES: [&str; 3] = ["cuda_device", "fused_attn_graph", "frost_plan"];

/// Executor names of a backend's chain (with its variant).
fn chain_names(p: &Policy, backend: u16, variant: Option<u8>) -> Vec<String> {
    p.executor_chain(backend, variant)
        .iter()
        .map(|e| e.executor.clone())
        .collect()
}

/// Asks `prober` for the probe facts of `config` (whose facts `facts` are, probes unknown)
/// and writes the answers into `config["probe"]`; returns the provenance of each probe.
fn answer_probes(
    py: Python<'_>,
    prober: &Bound<'_, PyAny>,
    facts: &Facts,
    config: &mut Json,
) -> PyResult<Provenance> {
    let problem = match attn_policy_adapters::from_facts::problem_from_facts(facts) {
        Ok(p) => Some(torch_ops::NativeProblem::from_problem(p)),
        Err(_) => None,
    };
    let training = facts.get("is_training") == Some(attn_policy::facts::Value::Bool(true));
    let answers = prober.call1((problem, training))?;
    let answers = answers.cast::<PyDict>().map_err(|_| {
        policy_error(
            py,
            "the prober must return a dict {probe name: True | False | None}".into(),
            None,
        )
    })?;
    let mut probe = Map::new();
    let mut prov = Provenance::new();
    for name in PROBES {
        let answer = match answers.get_item(name)? {
            Some(v) if !v.is_none() => Some(v.is_truthy()?),
            _ => None,
        };
        let path = format!("probe.{name}");
        match answer {
            Some(b) => {
                probe.insert(name.into(), Json::Bool(b));
                prov.push((path, "probe"));
            }
            None => prov.push((path, "default")),
        }
    }
    if let Json::Object(m) = config {
        m.insert("probe".into(), Json::Object(probe));
    }
    Ok(prov)
}

impl NativePolicy {
    /// Facts and decision for a Python input, through the input memo and then the decision
    /// cache. `read(key, build)` reads the input into `key` (and, when `build`, into a config).
    /// A miss reads the input a second time, building the config and the key together from
    /// the same reads, and stores that key: an entry's key always describes its facts.
    fn decide_read(
        &self,
        py: Python<'_>,
        read: impl Fn(&mut InputKey, bool) -> PyResult<Option<ReadInput>>,
    ) -> PyResult<NativeDecision> {
        self.decide_read_probed(py, read, None)
    }

    /// [`Self::decide_read`], with `prober` answering the probe facts an input lacks.
    fn decide_read_probed(
        &self,
        py: Python<'_>,
        read: impl Fn(&mut InputKey, bool) -> PyResult<Option<ReadInput>>,
        prober: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<NativeDecision> {
        let mut key = InputKey::new();
        read(&mut key, false)?;
        let h = key.hash();
        let hit = {
            let memo = self.memo.read().unwrap_or_else(|p| p.into_inner());
            match memo.get(&h) {
                Some(m) if m.key.same(py, &key)? => Some((
                    m.config.clone(),
                    m.facts.clone(),
                    m.decision.clone(),
                    m.provenance.clone(),
                    m.explained.clone(),
                )),
                _ => None,
            }
        };
        if let Some((config, facts, decision, provenance, explained)) = hit {
            // Count it as the cache hit it is (the decision cache was not asked).
            self.inner.cache().count_hit();
            return Ok(NativeDecision {
                policy: self.inner.clone(),
                config,
                facts,
                decision,
                provenance,
                explained,
            });
        }
        let mut key = InputKey::new();
        let (mut input, mut provenance, lacks_probes) =
            read(&mut key, true)?.expect("a building read returns the config");
        let mut facts =
            facts_from(self.inner.policy(), &input).map_err(|m| policy_error(py, m, None))?;
        if lacks_probes && let Some(prober) = prober {
            provenance.extend(answer_probes(py, prober, &facts, &mut input)?);
            facts =
                facts_from(self.inner.policy(), &input).map_err(|m| policy_error(py, m, None))?;
        }
        let facts = Arc::new(facts);
        let config = Arc::new(input);
        let decision = self.inner.decide(&facts);
        let provenance = Arc::new(provenance);
        let explained = Explained::default();
        let h = key.hash();
        let mut memo = self.memo.write().unwrap_or_else(|p| p.into_inner());
        if memo.len() >= self.memo_cap {
            memo.clear();
        }
        memo.insert(
            h,
            Memo {
                key,
                config: config.clone(),
                facts: facts.clone(),
                decision: decision.clone(),
                provenance: provenance.clone(),
                explained: explained.clone(),
            },
        );
        Ok(NativeDecision {
            policy: self.inner.clone(),
            config,
            facts,
            decision,
            provenance,
            explained,
        })
    }
}

/// One decision, with the facts and policy that produced it. Everything it renders (text,
/// dict, JSON, TE tuple, declines) reads the explanation model, built once per decision.
#[pyclass(frozen, module = "attn_policy._native")]
struct NativeDecision {
    policy: Arc<CachedPolicy>,
    /// The config the facts were read from (null where the caller gave facts, not a config).
    config: Arc<Json>,
    facts: Arc<Facts>,
    decision: Arc<Decision>,
    provenance: Arc<Provenance>,
    explained: Explained,
}

impl NativeDecision {
    fn explanation(&self) -> &Explanation {
        self.explained.get_or_init(|| {
            Explanation::new(self.policy.policy(), &self.facts, &self.decision)
                .with_provenance(self.provenance.iter().map(|(k, s)| (k.as_str(), *s)))
        })
    }
}

#[pymethods]
impl NativeDecision {
    /// The config object the decision's facts were read from (the environment's and the live
    /// probes' answers merged in): what `attn-policy explain CONFIG` reads to decide the same.
    #[getter]
    fn config(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.config)
    }

    #[getter]
    fn selected(&self) -> Option<String> {
        self.decision
            .selected
            .map(|s| self.policy.policy().backends[s as usize].name.clone())
    }

    /// The executor chain that runs this decision: the pack's chain for the selected backend
    /// and its variant, without the `if_admitted:` entries these facts are not admitted by
    /// (empty when nothing was selected or the pack names no chain).
    #[getter]
    fn executor_chain(&self) -> Vec<String> {
        match self.decision.selected {
            Some(b) => self
                .policy
                .policy()
                .executor_chain_for(b, self.decision.backends[b as usize].variant, &self.facts)
                .iter()
                .map(|e| e.executor.clone())
                .collect(),
            None => Vec::new(),
        }
    }

    /// The status word of a backend (`selected`, `outranked`, `declined`, `disabled`,
    /// `undecided`), or None for a backend the pack does not have.
    fn status_of(&self, backend: &str) -> Option<&'static str> {
        let b = self.policy.policy().backend_index(backend)?;
        Some(self.decision.backends[b].status.word())
    }

    /// Whether a backend may run this call (selected or eligible but outranked).
    fn eligible(&self, backend: &str) -> Option<bool> {
        let b = self.policy.policy().backend_index(backend)?;
        Some(self.decision.backends[b].status.eligible())
    }

    /// The CLI's human text; provenance of environment facts follows when known.
    #[pyo3(signature = (color=false))]
    fn explain(&self, color: bool) -> String {
        let ex = self.explanation();
        ex.to_text(color) + &ex.provenance_text()
    }

    /// The `explain/v1` document as a dict (the CLI's `--json`), with `provenance`.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.explanation().to_json())
    }

    fn to_json(&self) -> String {
        self.explanation().to_json_string(false)
    }

    /// TransformerEngine's return tuple: (use_flash_attention, flash_attention_backend,
    /// use_fused_attention, fused_attention_backend, use_unfused_attention,
    /// available_backends[, use_frost_attention]).
    #[pyo3(signature = (frost=false))]
    fn te_tuple<'py>(&self, py: Python<'py>, frost: bool) -> PyResult<Bound<'py, PyTuple>> {
        let te = self.explanation().te();
        let flag = |b: bool| PyBool::new(py, b).to_owned().into_any().unbind();
        let available = PyList::new(py, te.available_backends)?;
        let mut items: Vec<Py<PyAny>> = vec![
            flag(te.use_flash_attention),
            to_py(py, &te.flash_attention_backend.to_json())?,
            flag(te.use_fused_attention),
            to_py(py, &te.fused_attention_backend.to_json())?,
            flag(te.use_unfused_attention),
            available.into_any().unbind(),
        ];
        if frost {
            items.push(flag(te.use_frost_attention));
        }
        PyTuple::new(py, items)
    }

    /// The rules that declined `backend` here, as `explain/v1` rule objects.
    fn declined_by(&self, py: Python<'_>, backend: &str) -> PyResult<Py<PyAny>> {
        let rules = match self.explanation().backend(backend) {
            Some(b) => serde_json::to_value(&b.declined_by)
                .map_err(|e| PyValueError::new_err(e.to_string()))?,
            None => Json::Array(Vec::new()),
        };
        to_py(py, &rules)
    }

    /// `(fact, source)` pairs for the environment facts of a TE drop-in call.
    #[getter]
    fn provenance(&self) -> Provenance {
        (*self.provenance).clone()
    }

    #[getter]
    fn provisional(&self) -> bool {
        self.decision.pending
    }

    #[getter]
    fn none_selected(&self) -> bool {
        self.decision.selected.is_none()
    }

    fn __repr__(&self) -> String {
        let ex = self.explanation();
        let parts: Vec<String> = ex
            .backends
            .iter()
            .map(|b| format!("{}={}", b.name, b.status.word()))
            .collect();
        format!(
            "<Decision selected={:?} {}>",
            ex.selected.as_deref().unwrap_or("none"),
            parts.join(" ")
        )
    }
}

// ---------------------------------------------------------------------------------------
// Python values -> JSON facts

fn dict_json(d: &Bound<'_, PyDict>) -> PyResult<Json> {
    let mut m = Map::with_capacity(d.len());
    for (k, v) in d.iter() {
        let key = match k.cast::<PyString>() {
            Ok(s) => s.to_cow()?.into_owned(),
            Err(_) => k.str()?.to_cow()?.into_owned(),
        };
        let value = value_json(&v, &key)?;
        m.insert(key, value);
    }
    Ok(Json::Object(m))
}

/// A number no fact can hold: NaN, an infinity, an int outside 64 bits. (Read as JSON null
/// before, it surfaced as "must not be null" or, for a huge int, as its float rounding.)
fn unrepresentable(v: &Bound<'_, PyAny>, key: &str) -> PyErr {
    let text = v
        .repr()
        .and_then(|r| Ok(r.to_cow()?.into_owned()))
        .unwrap_or_else(|_| "?".into());
    let why = if v.cast::<PyInt>().is_ok() {
        "does not fit a 64-bit integer"
    } else {
        "is not a finite number"
    };
    PolicyError::new_err(format!("invalid config: {key}: {text} {why}"))
}

/// torch dtype names (`str(torch.bfloat16)` without `torch.`) -> the schema's dtype names.
fn dtype_name(name: &str) -> &str {
    match name {
        "bfloat16" => "bf16",
        "float16" | "half" => "fp16",
        "float32" | "float" => "fp32",
        "float8_e4m3fn" | "float8_e4m3fnuz" => "fp8_e4m3",
        "float8_e5m2" | "float8_e5m2fnuz" => "fp8_e5m2",
        other => other,
    }
}

/// One Python value as JSON: plain values as they are; TE's own objects translated
/// (torch dtypes, classes by name, `torch.Size`/tuples as lists, enums by member name).
fn value_json(v: &Bound<'_, PyAny>, key: &str) -> PyResult<Json> {
    if v.is_none() {
        return Ok(Json::Null);
    }
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(Json::Bool(b.is_true()));
    }
    if v.cast::<PyInt>().is_ok() {
        return match v.extract::<i64>() {
            Ok(i) => Ok(Json::from(i)),
            Err(_) => Err(unrepresentable(v, key)),
        };
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        return serde_json::Number::from_f64(f.value())
            .map(Json::Number)
            .ok_or_else(|| unrepresentable(v, key));
    }
    if let Ok(s) = v.cast::<PyString>() {
        let s = s.to_cow()?;
        let s: &str = &s;
        if key.ends_with("dtype") {
            return Ok(Json::String(
                dtype_name(s.strip_prefix("torch.").unwrap_or(s)).into(),
            ));
        }
        return Ok(Json::String(s.to_owned()));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        return dict_json(d);
    }
    if let Ok(t) = v.cast::<PyType>() {
        // qkv_type = torch.Tensor / Float8Tensor ...: the class name.
        return Ok(Json::String(t.name()?.to_cow()?.into_owned()));
    }
    if let Ok(l) = v.cast::<PyList>() {
        return l
            .iter()
            .map(|x| value_json(&x, key))
            .collect::<PyResult<_>>()
            .map(Json::Array);
    }
    if let Ok(t) = v.cast::<PyTuple>() {
        // tuples and torch.Size (a tuple subclass)
        return t
            .iter()
            .map(|x| value_json(&x, key))
            .collect::<PyResult<_>>()
            .map(Json::Array);
    }
    let ty = v.get_type();
    let tyname = ty.name()?;
    let tyname = tyname.to_cow()?;
    if tyname == "dtype" {
        let s = v.str()?;
        let s = s.to_cow()?;
        let s: &str = &s;
        return Ok(Json::String(
            dtype_name(s.strip_prefix("torch.").unwrap_or(s)).into(),
        ));
    }
    let py = v.py();
    if v.hasattr(intern!(py, "_value_"))? && v.hasattr(intern!(py, "name"))? {
        // enum.Enum members (recipe Format.HYBRID): the member name.
        return Ok(Json::String(
            v.getattr(intern!(py, "name"))?
                .str()?
                .to_cow()?
                .into_owned(),
        ));
    }
    if let Ok(f) = v.extract::<f64>() {
        return serde_json::Number::from_f64(f)
            .map(Json::Number)
            .ok_or_else(|| unrepresentable(v, key));
    }
    Err(PolicyError::new_err(format!(
        "invalid config: {key}: cannot read a value of type {tyname}"
    )))
}

fn get_opt<'py>(
    obj: &Bound<'py, PyAny>,
    name: impl IntoPyObject<'py, Target = PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    match obj.getattr(name) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// TE recipe object -> the `fp8_recipe` fact object.
fn recipe_json(recipe: &Bound<'_, PyAny>, local: Option<&Bound<'_, PyAny>>) -> PyResult<Json> {
    let mut m = Map::new();
    let class = |o: &Bound<'_, PyAny>| -> PyResult<String> {
        Ok(o.get_type().name()?.to_cow()?.into_owned())
    };
    m.insert("recipe".into(), Json::String(class(recipe)?));
    let py = recipe.py();
    for (attr, name) in [
        ("fp8_dpa", intern!(py, "fp8_dpa")),
        ("fp8_mha", intern!(py, "fp8_mha")),
        ("fp8_format", intern!(py, "fp8_format")),
        ("reduce_amax", intern!(py, "reduce_amax")),
    ] {
        if let Some(v) = get_opt(recipe, name)? {
            m.insert(attr.into(), value_json(&v, attr)?);
        }
    }
    if let Some(l) = local {
        m.insert("local_recipe".into(), Json::String(class(l)?));
    }
    Ok(Json::Object(m))
}

/// TE `fp8_meta` dict -> `fp8_recipe`, or None when it holds no recipe.
fn fp8_meta_json(meta: &Bound<'_, PyAny>) -> PyResult<Option<Json>> {
    let Ok(d) = meta.cast::<PyDict>() else {
        return Ok(None);
    };
    let py = meta.py();
    let Some(recipe) = d.get_item(intern!(py, "recipe"))? else {
        return Ok(None);
    };
    if recipe.is_none() {
        return Ok(None);
    }
    let local = match d.get_item(intern!(py, "local_recipes"))? {
        Some(l) if !l.is_none() => l.get_item(0).ok(),
        _ => None,
    };
    recipe_json(&recipe, local.as_ref()).map(Some)
}

/// TE `InferenceParams` object -> the `inference` fact object.
fn inference_json(ip: &Bound<'_, PyAny>) -> PyResult<Json> {
    if let Ok(d) = ip.cast::<PyDict>() {
        return dict_json(d);
    }
    let mut m = Map::new();
    let py = ip.py();
    for (attr, name) in [
        ("is_paged", intern!(py, "is_paged")),
        ("page_size", intern!(py, "page_size")),
        ("total_num_pages", intern!(py, "total_num_pages")),
    ] {
        if let Some(v) = get_opt(ip, name)? {
            m.insert(attr.into(), value_json(&v, attr)?);
        }
    }
    let mpps = match get_opt(ip, intern!(py, "max_pages_per_seq"))? {
        Some(v) => Some(v),
        None => match get_opt(ip, intern!(py, "cache_manager"))? {
            Some(cm) if !cm.is_none() => get_opt(&cm, intern!(py, "max_pages_per_seq"))?,
            _ => None,
        },
    };
    if let Some(v) = mpps {
        m.insert(
            "max_pages_per_seq".into(),
            value_json(&v, "max_pages_per_seq")?,
        );
    }
    Ok(Json::Object(m))
}

/// Top-level input keys of the schema (TE's `AttentionParams` names plus environment facts).
fn input_keys() -> &'static [&'static str] {
    static KEYS: std::sync::LazyLock<Vec<&'static str>> = std::sync::LazyLock::new(|| {
        attn_policy::facts::te::TE
            .input_keys()
            .into_iter()
            .filter(|k| *k != "id")
            .collect()
    });
    &KEYS
}

/// Environment switch names (`env.NVTE_FLASH_ATTN` -> `NVTE_FLASH_ATTN`).
fn env_switches() -> &'static [&'static str] {
    static KEYS: std::sync::LazyLock<Vec<&'static str>> = std::sync::LazyLock::new(|| {
        FIELDS
            .iter()
            .filter(|f| f.origin == Origin::Input)
            .filter_map(|f| f.path.strip_prefix("env."))
            .collect()
    });
    &KEYS
}

type Provenance = Vec<(String, &'static str)>;

fn source_name(s: &str) -> &'static str {
    match s {
        "object" => "object",
        "argument" => "argument",
        "set_environment" => "set_environment",
        "probe" => "probe",
        "os.environ" => "os.environ",
        _ => "default",
    }
}

/// Names the TE drop-in reads, interned once: `input_keys()` in order, then `fp8_meta`,
/// `inference_params`, `__dict__`; an index by Python hash finds a name's position.
/// A name object met before (kept alive) and its index among the attribute names.
type SeenName = (Py<PyString>, Option<usize>);

struct Names {
    strs: Vec<Py<PyString>>,
    by_hash: IdMap<isize, Vec<usize>>,
    /// Attribute names met before, by identity: the object (kept alive, so its address is
    /// not reused while it is here) -> its index among the attribute names. Bounded.
    seen: std::sync::Mutex<IdMap<usize, SeenName>>,
}

const SOURCES: [&str; 6] = [
    "object",
    "argument",
    "set_environment",
    "probe",
    "os.environ",
    "default",
];

impl Names {
    fn get(py: Python<'_>) -> PyResult<&'static Names> {
        static NAMES: PyOnceLock<Names> = PyOnceLock::new();
        NAMES.get_or_try_init(py, || {
            let strs: Vec<Py<PyString>> = input_keys()
                .iter()
                .chain(&["fp8_meta", "inference_params", "__dict__"])
                .chain(&SOURCES)
                .map(|k| PyString::intern(py, k).unbind())
                .collect();
            let mut by_hash: IdMap<isize, Vec<usize>> = IdMap::default();
            for (i, s) in strs.iter().enumerate() {
                by_hash.entry(s.bind(py).hash()?).or_default().push(i);
            }
            Ok(Names {
                strs,
                by_hash,
                seen: Default::default(),
            })
        })
    }

    /// The position of an exact `str` among the names in `range` (identity, else hash and
    /// `==`).
    fn index(
        &self,
        s: &Bound<'_, PyString>,
        range: std::ops::Range<usize>,
    ) -> PyResult<Option<usize>> {
        let Some(cands) = self.by_hash.get(&s.hash()?) else {
            return Ok(None);
        };
        for &i in cands.iter().filter(|i| range.contains(i)) {
            let n = self.strs[i].bind(s.py());
            if s.is(n) || s.as_any().eq(n)? {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }
}

/// Reads a TE `AttentionParams`-like object and the caller's environment into `key` and, when
/// `build`, into the config, its provenance and the answer-probes flag. Every value the
/// config depends on goes into the key: the attributes present (by index) with their values,
/// recipe and inference objects as the JSON they read as, every `(value, source)` of
/// `environment`, and the process environment's switches when the object has no `env`.
fn te_read(
    params: &Bound<'_, PyAny>,
    environment: &Bound<'_, PyDict>,
    arguments: Option<&Bound<'_, PyDict>>,
    key: &mut InputKey,
    build: bool,
) -> PyResult<Option<ReadInput>> {
    let py = params.py();
    let names = Names::get(py)?;
    key.word(K_TE);
    let mut prov: Provenance = Vec::new();
    let found = te_attributes(params, names, key)?;
    let (present, mut cfg) = te_attribute_config(&found, key, build)?;
    let (env, probe) = (input_slot("env"), input_slot("probe"));
    let items = te_environment_items(environment, arguments)?;
    let has_env = present[env];
    let given = te_environment_facts(items, names, key, build, &present, &mut cfg, &mut prov)?;
    te_switches(has_env, given, key, build, &mut cfg, &mut prov);
    // Probes given by the object or as a call argument are taken as they are.
    Ok(build.then(|| {
        let lacks_probes = !present[probe] && !cfg.contains_key("probe");
        (Json::Object(cfg), prov, lacks_probes)
    }))
}

/// The position of a top-level input key in [`input_keys`].
fn input_slot(name: &str) -> usize {
    input_keys()
        .iter()
        .position(|k| *k == name)
        .expect("an input key")
}

/// The attributes of a TE params object that are present, (name index, value), with which way
/// they were read in `key`. A plain dict (a corpus record's `config`) reads like an object's
/// attributes; a dataclass or SimpleNamespace is read through its instance `__dict__`;
/// anything else through getattr. An exact dict whose keys are all exact strs is read in one
/// pass (in its order), else each name is looked up.
fn te_attributes<'py>(
    params: &Bound<'py, PyAny>,
    names: &Names,
    key: &mut InputKey,
) -> PyResult<Vec<(usize, Bound<'py, PyAny>)>> {
    let py = params.py();
    let keys = input_keys();
    let n = keys.len();
    let (fp8_meta, inference_params, dunder_dict) = (n, n + 1, n + 2);
    let as_dict: Option<Bound<'_, PyDict>> = match params.cast::<PyDict>() {
        Ok(d) => Some(d.clone()),
        Err(_) => match get_opt(params, names.strs[dunder_dict].bind(py))? {
            Some(d) => d.cast_into::<PyDict>().ok(),
            None => None,
        },
    };
    let mut found: Vec<(usize, Bound<'_, PyAny>)> = Vec::with_capacity(48);
    let start = key.words.len();
    let mut iterated = false;
    if let Some(d) = as_dict
        .as_ref()
        .filter(|d| d.is_exact_instance_of::<PyDict>())
    {
        iterated = true;
        // Never wait for the memo of names: another thread may hold it while `==` runs
        // Python code (and so gives up the GIL); then this call looks names up by hash.
        let mut seen = names.seen.try_lock().ok();
        for (k, v) in d.iter() {
            let Ok(s) = k.cast_exact::<PyString>() else {
                iterated = false;
                break;
            };
            let addr = s.as_ptr() as usize;
            let i = match seen.as_ref().and_then(|m| m.get(&addr)) {
                Some((_, i)) => *i,
                None => {
                    let i = names.index(s, 0..dunder_dict)?;
                    if let Some(m) = seen.as_mut() {
                        if m.len() >= 16384 {
                            m.clear();
                        }
                        m.insert(addr, (s.clone().unbind(), i));
                    }
                    i
                }
            };
            if let Some(i) = i {
                found.push((i, v));
            }
        }
    }
    if !iterated {
        found.clear();
        key.words.truncate(start);
        let get = |i: usize| -> PyResult<Option<Bound<'_, PyAny>>> {
            let k = names.strs[i].bind(py);
            match &as_dict {
                Some(d) => d.get_item(k),
                None => get_opt(params, k),
            }
        };
        for i in 0..n {
            if let Some(v) = get(i)? {
                found.push((i, v));
            }
        }
        let has = |found: &[(usize, Bound<'_, PyAny>)], name: &str| {
            found.iter().any(|(i, _)| keys.get(*i) == Some(&name))
        };
        for (i, name) in [(fp8_meta, "fp8_recipe"), (inference_params, "inference")] {
            if !has(&found, name)
                && let Some(v) = get(i)?
            {
                found.push((i, v));
            }
        }
    }
    key.word(if iterated { K_DICT } else { K_ATTR });
    Ok(found)
}

/// The config's top-level keys read from the attributes `found` (tracked in the first value,
/// by input key, whether or not the config is built): input keys in schema order, then what
/// `fp8_meta` / `inference_params` give.
fn te_attribute_config(
    found: &[(usize, Bound<'_, PyAny>)],
    key: &mut InputKey,
    build: bool,
) -> PyResult<(Vec<bool>, Map<String, Json>)> {
    let keys = input_keys();
    let n = keys.len();
    let (fp8_meta, inference_params) = (n, n + 1);
    let mut present = vec![false; n];
    let mut cfg: Vec<(usize, Json)> = Vec::new();
    for (i, v) in found {
        let (i, v) = (*i, v);
        if i >= n {
            continue;
        }
        key.word(K_ATTR | (i as u64) << 8);
        let name = keys[i];
        let j = match name {
            "fp8_recipe" if !v.is_none() && v.cast::<PyDict>().is_err() => {
                let j = recipe_json(v, None)?;
                key.word(K_JSON);
                key.json(&j);
                build.then_some(j)
            }
            "inference" if !v.is_none() => {
                let j = inference_json(v)?;
                key.word(K_JSON);
                key.json(&j);
                build.then_some(j)
            }
            _ => read_value(v, Name::Static(name), key, build)?,
        };
        present[i] = true;
        if let Some(j) = j {
            cfg.push((i, j));
        }
    }
    // Input keys in schema order, then what fp8_meta / inference_params give.
    cfg.sort_by_key(|(i, _)| *i);
    let mut cfg: Map<String, Json> = cfg
        .into_iter()
        .map(|(i, j)| (keys[i].to_owned(), j))
        .collect();
    let (recipe, inference) = (input_slot("fp8_recipe"), input_slot("inference"));
    let attr = |i: usize| found.iter().find(|(j, _)| *j == i).map(|(_, v)| v);
    if !present[recipe]
        && let Some(meta) = attr(fp8_meta)
    {
        key.word(K_ATTR | (fp8_meta as u64) << 8);
        match fp8_meta_json(meta)? {
            Some(r) => {
                key.word(K_JSON);
                key.json(&r);
                present[recipe] = true;
                cfg.insert("fp8_recipe".into(), r);
            }
            None => key.word(K_NONE),
        }
    }
    if !present[inference]
        && let Some(ip) = attr(inference_params)
    {
        key.word(K_ATTR | (inference_params as u64) << 8);
        if ip.is_none() {
            key.word(K_NONE);
        } else {
            let j = inference_json(ip)?;
            key.word(K_JSON);
            key.json(&j);
            present[inference] = true;
            cfg.insert("inference".into(), j);
        }
    }
    Ok((present, cfg))
}

/// An environment fact for the TE drop-in: (name, value, source; None: a call argument).
type EnvItem<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
);

/// Environment facts: what the caller resolved, `environment` with `arguments` over it (as
/// `dict(environment) | {k: (v, "argument")}` would order them).
fn te_environment_items<'py>(
    environment: &Bound<'py, PyDict>,
    arguments: Option<&Bound<'py, PyDict>>,
) -> PyResult<Vec<EnvItem<'py>>> {
    let mut items: Vec<EnvItem<'_>> =
        Vec::with_capacity(environment.len() + arguments.map_or(0, |a| a.len()));
    for (k, v) in environment.iter() {
        if let Some(x) = arguments.map(|a| a.get_item(&k)).transpose()?.flatten() {
            items.push((k, x, None));
            continue;
        }
        let (value, source): (Bound<'_, PyAny>, Bound<'_, PyAny>) = v.extract()?;
        items.push((k, value, Some(source)));
    }
    if let Some(a) = arguments {
        for (k, x) in a.iter() {
            if !environment.contains(&k)? {
                items.push((k, x, None));
            }
        }
    }
    Ok(items)
}

/// Reads the environment facts `items` into `key` (names, sources and the values that are
/// read) and the config: an object's own facts (`present`) win. Returns the `env` switches
/// given, with their source, unless the object has its own.
fn te_environment_facts(
    items: Vec<EnvItem<'_>>,
    names: &Names,
    key: &mut InputKey,
    build: bool,
    present: &[bool],
    cfg: &mut Map<String, Json>,
    prov: &mut Provenance,
) -> PyResult<Option<(Json, &'static str)>> {
    let keys = input_keys();
    let n = keys.len();
    key.words.extend([K_DICT, items.len() as u64]);
    let has_env = present[input_slot("env")];
    let mut given: Option<(Json, &'static str)> = None;
    for (k, value, source) in items {
        let ks = k.cast_exact::<PyString>().ok();
        let idx = match &ks {
            Some(s) => names.index(s, 0..n)?,
            None => None,
        };
        let owned: String;
        let name: &str = match idx {
            Some(i) => keys[i],
            None => {
                owned = k.extract()?;
                &owned
            }
        };
        match &ks {
            Some(s) => key.str(s)?,
            None => key.text(name),
        }
        let src = match source.as_ref().map(|s| s.cast_exact::<PyString>()) {
            None => {
                key.word(K_ARG);
                "argument"
            }
            Some(Ok(s)) => {
                key.str(s)?;
                match names.index(s, n + 3..n + 3 + SOURCES.len())? {
                    Some(i) => SOURCES[i - n - 3],
                    None => "default",
                }
            }
            Some(Err(_)) => {
                let text: String = source.as_ref().expect("a source").extract()?;
                key.text(&text);
                source_name(&text)
            }
        };
        if name == "env" {
            if has_env {
                // The object's own switches win; these are not read.
                key.word(K_NONE);
            } else {
                // Built in both modes: which switches it gives decides what else is read.
                let j = read_value(&value, Name::Static("env"), key, true)?;
                given = j.map(|j| (j, src));
            }
            continue;
        }
        if idx.is_some_and(|i| present[i]) {
            key.word(K_NONE);
            prov.push((name.to_owned(), "object"));
        } else if src == "default" && value.is_none() {
            // Nothing measured it: the schema default applies.
            key.word(K_NONE);
            prov.push((name.to_owned(), "default"));
        } else {
            if let Some(j) = read_value(&value, Name::Static(name), key, build)? {
                cfg.insert(name.to_owned(), j);
            }
            prov.push((name.to_owned(), src));
        }
    }
    Ok(given)
}

/// Switches: object > caller (argument / set_environment, `given`) > process environment. The
/// process environment's are read into `key` (and the config, when `build`) unless the object
/// has its own `env` or the caller gave the switch.
fn te_switches(
    has_env: bool,
    given: Option<(Json, &'static str)>,
    key: &mut InputKey,
    build: bool,
    cfg: &mut Map<String, Json>,
    prov: &mut Provenance,
) {
    if has_env {
        prov.push(("env".into(), "object"));
    } else {
        let mut env = Map::new();
        for (i, &name) in env_switches().iter().enumerate() {
            if let Some((Json::Object(g), src)) = &given
                && let Some(v) = g.get(name)
            {
                if build {
                    env.insert(name.into(), v.clone());
                    prov.push((format!("env.{name}"), src));
                }
                continue;
            }
            key.word(K_OSENV | (i as u64) << 8);
            match std::env::var_os(name) {
                Some(v) => {
                    let v = v.to_string_lossy();
                    key.text(&v);
                    if build {
                        env.insert(name.into(), Json::String(v.into_owned()));
                        prov.push((format!("env.{name}"), "os.environ"));
                    }
                }
                None => key.word(K_NONE),
            }
        }
        cfg.insert("env".into(), Json::Object(env));
    }
}

/// Top-level keys a config may hold (for did-you-mean in Python and for the TE translation).
#[pyfunction]
fn config_keys() -> Vec<&'static str> {
    input_keys().to_vec()
}

/// Names of the packs compiled into the module, with each pack's upstream releases
/// (`te`, `te@2.18.0`, `te@2.19.0`, `te@2.20.2`, ...).
#[pyfunction]
fn embedded_packs() -> Vec<&'static str> {
    attn_policy::pack::embedded_names()
}

/// How the Python package takes the installed TransformerEngine release for `te@auto`.
const TE_VERSION_HINT: &str = "import transformer_engine, or pass te_version=, e.g. \
    Policy.load(\"te@auto\", te_version=\"2.19.0\")";

/// The pack that decides for an installed release of `pack` (`te`): `(name, warning)`, the
/// warning set when that release has no pack of its own (the nearest older one decides, or the
/// newest). Raises `PolicyError` for a release older than every pack, or text that is not a
/// version, naming the releases that have packs. The resolver of `te@auto`
/// (docs/packs/releases.md).
#[pyfunction]
#[pyo3(signature = (installed, pack="te"))]
fn resolve_release(
    py: Python<'_>,
    installed: &str,
    pack: &str,
) -> PyResult<(String, Option<String>)> {
    let releases = attn_policy::pack::embedded_release_names(pack);
    if releases.is_empty() {
        return Err(policy_error(
            py,
            format!("pack `{pack}` mirrors no upstream releases"),
            None,
        ));
    }
    attn_policy::pack::resolve_installed(pack, installed, &releases)
        .map(|a| (a.pack.to_string(), a.warning))
        .map_err(|e| policy_error(py, e.to_string(), None))
}

// ---------------------------------------------------------------------------------------------
// `NativeCall`: one call's account (the kinds and outcomes it reads: call.rs).

/// One call's account. Immutable: built once per call signature, when the call is decided.
#[pyclass(frozen, module = "attn_policy._native")]
struct NativeCall {
    kind: call::Kind,
    /// None: nothing was decided (a context-parallel call refused before its pre-flight).
    decision: Option<Py<NativeDecision>>,
    pack: String,
    attempts: Vec<ExecutorAttempt>,
    /// Where the call's facts came from (replacing the decision's own), when the caller knows.
    provenance: Option<Vec<(String, String)>>,
    fallback: Option<String>,
    substitution_refused: bool,
    problem: String,
    /// The error of a call of another kind, as the caller states it (a call's is derived).
    error: Option<String>,
    /// The kind's own fields (beside `kind`, the SDPA facts and the per-step documents).
    extra: Map<String, Json>,
    steps: Vec<Py<NativeCall>>,
}

impl NativeCall {
    fn decided(&self) -> Option<&NativeDecision> {
        self.decision.as_ref().map(|d| d.get())
    }

    fn provenance_pairs(&self) -> Vec<(String, String)> {
        match (&self.provenance, self.decided()) {
            (Some(p), _) => p.clone(),
            (None, Some(d)) => d
                .provenance
                .iter()
                .map(|(k, s)| (k.clone(), (*s).to_string()))
                .collect(),
            (None, None) => Vec::new(),
        }
    }

    fn ran(&self) -> Option<usize> {
        self.attempts
            .iter()
            .position(|a| a.outcome == ExecutorOutcome::Ran)
    }

    fn selected(&self) -> Option<String> {
        let d = self.decided()?;
        d.decision
            .selected
            .map(|s| d.policy.policy().backends[s as usize].name.clone())
    }

    /// Why nothing ran: for one call, from its decision and walk (as `attn-policy run` says
    /// it); for another kind, as its caller stated it.
    fn error_text(&self) -> Option<String> {
        if self.kind != call::Kind::Call {
            return self.error.clone();
        }
        let selected = self.decided().and_then(|d| d.decision.selected);
        match (selected, self.ran().is_some()) {
            (_, true) => None,
            (None, false) => Some("no backend selected".to_string()),
            (Some(_), false) if self.attempts.is_empty() => {
                Some("the selected backend has no executor chain".to_string())
            }
            (Some(_), false) => Some(attn_policy_adapters::chain::summarize(&self.attempts)),
        }
    }

    fn extra_json(&self) -> PyResult<Option<Json>> {
        if self.kind == call::Kind::Call {
            return Ok(None);
        }
        let mut m = Map::with_capacity(self.extra.len() + 2);
        m.insert("kind".into(), Json::String(self.kind.word().into()));
        m.extend(self.extra.clone());
        match self.kind {
            call::Kind::Sdpa => {
                // The facts PyTorch's choice was decided on: the decision's config.
                let facts = self.decided().map_or(Json::Null, |d| (*d.config).clone());
                m.insert("facts".into(), facts);
            }
            call::Kind::ContextParallel => {
                let steps = self
                    .steps
                    .iter()
                    .map(|s| s.get().document())
                    .collect::<PyResult<Vec<_>>>()?;
                m.insert("steps".into(), Json::Array(steps));
            }
            call::Kind::Call => {}
        }
        Ok(Some(Json::Object(m)))
    }

    /// The call document (`attn-policy/call/v1`).
    fn document(&self) -> PyResult<Json> {
        let Some(d) = self.decided() else {
            return Err(PyValueError::new_err(
                "this explanation has no decision to describe",
            ));
        };
        let ex = Explanation::new(d.policy.policy(), &d.facts, &d.decision)
            .with_provenance(self.provenance_pairs())
            .with_executor_chain(self.attempts.clone());
        Ok(ex.to_call_json(CallExtras {
            fallback: self.fallback.clone(),
            error: self.error_text(),
            extra: self.extra_json()?,
            ..CallExtras::default()
        }))
    }
}

#[pymethods]
impl NativeCall {
    /// `decision`: the `NativeDecision` (None: nothing decided); `chain`: the walk's
    /// `(executor, outcome, reason)` entries (`walk_chain`'s); `provenance`: where the call's
    /// facts came from (None: the decision's own); `pack`: None for the decision's pack;
    /// `kind`: `call`, `context_parallel` or `sdpa`; `error`: why a call of another kind did
    /// not run; `extra`: that kind's fields (a dict of plain values); `steps`: a
    /// context-parallel call's per-step calls.
    #[new]
    #[pyo3(signature = (decision, chain, provenance=None, *, pack=None, fallback=None,
                        substitution_refused=false, problem=String::new(), kind="call",
                        error=None, extra=None, steps=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        decision: Option<Py<NativeDecision>>,
        chain: Vec<(String, String, String)>,
        provenance: Option<Vec<(String, String)>>,
        pack: Option<String>,
        fallback: Option<String>,
        substitution_refused: bool,
        problem: String,
        kind: &str,
        error: Option<String>,
        extra: Option<Bound<'_, PyAny>>,
        steps: Vec<Py<NativeCall>>,
    ) -> PyResult<Self> {
        let attempts = chain
            .into_iter()
            .map(|(executor, o, reason)| {
                Ok(ExecutorAttempt {
                    executor,
                    outcome: call::outcome(&o)?,
                    reason: (!reason.is_empty()).then_some(reason),
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let extra = match extra {
            None => Map::new(),
            Some(x) if x.is_none() => Map::new(),
            Some(x) => match pythonize::depythonize::<Json>(&x) {
                Ok(Json::Object(m)) => m,
                Ok(_) => return Err(PyValueError::new_err("extra must be a dict")),
                Err(e) => return Err(PyValueError::new_err(format!("extra: {e}"))),
            },
        };
        let pack = match (pack, &decision) {
            (Some(p), _) => p,
            (None, Some(d)) => d.get().policy.policy().name.clone(),
            (None, None) => {
                return Err(PyValueError::new_err(
                    "a call without a decision names its pack",
                ));
            }
        };
        Ok(NativeCall {
            kind: call::Kind::parse(kind)?,
            decision,
            pack,
            attempts,
            provenance,
            fallback,
            substitution_refused,
            problem,
            error,
            extra,
            steps,
        })
    }

    /// `call`, `context_parallel` or `sdpa`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind.word()
    }

    #[getter]
    fn pack(&self) -> String {
        self.pack.clone()
    }

    /// The `NativeDecision`, or None.
    #[getter]
    fn decision(&self, py: Python<'_>) -> Option<Py<NativeDecision>> {
        self.decision.as_ref().map(|d| d.clone_ref(py))
    }

    /// The selected backend, or None.
    #[getter]
    fn backend(&self) -> Option<String> {
        self.selected()
    }

    /// The executor that ran (the chain entry whose outcome is `ran`), or None.
    #[getter]
    fn executor(&self) -> Option<String> {
        self.ran().map(|i| self.attempts[i].executor.clone())
    }

    /// The executor that ran is not the chain's first entry.
    #[getter]
    fn substitute(&self) -> bool {
        self.ran().is_some_and(|i| i > 0)
    }

    /// The chain as walked: `(executor, outcome, reason)`, reason "" where none.
    #[getter]
    fn executor_chain(&self) -> Vec<(String, &'static str, String)> {
        self.attempts
            .iter()
            .map(|a| {
                (
                    a.executor.clone(),
                    a.outcome.word(),
                    a.reason.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Where each fact came from, in order: `(fact, source)`.
    #[getter]
    fn provenance(&self) -> Vec<(String, String)> {
        self.provenance_pairs()
    }

    #[getter]
    fn fallback(&self) -> Option<String> {
        self.fallback.clone()
    }

    #[getter]
    fn substitution_refused(&self) -> bool {
        self.substitution_refused
    }

    #[getter]
    fn problem(&self) -> String {
        self.problem.clone()
    }

    /// The document's `error`: why nothing ran (None when something ran, or nothing had to).
    #[getter]
    fn error(&self) -> Option<String> {
        self.error_text()
    }

    /// The document's `extra` (None for one attention call).
    #[getter]
    fn extra(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match self.extra_json()? {
            Some(x) => to_py(py, &x),
            None => Ok(py.None()),
        }
    }

    /// The kind's own fields as the caller gave them (the document's `extra` without `kind`,
    /// the SDPA facts and the per-step documents): cheap to read.
    #[getter]
    fn fields(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &Json::Object(self.extra.clone()))
    }

    /// A context-parallel call's per-step calls.
    #[getter]
    fn steps(&self, py: Python<'_>) -> Vec<Py<NativeCall>> {
        self.steps.iter().map(|s| s.clone_ref(py)).collect()
    }

    /// The call document (`attn-policy/call/v1`, docs/schema/call-v1.json): what `attn-policy
    /// run --json` prints, its `extra` this kind's fields.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.document()?)
    }

    /// The call document as compact JSON text.
    fn to_json(&self) -> PyResult<String> {
        Ok(self.document()?.to_string())
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativePolicy>()?;
    m.add_class::<NativeDecision>()?;
    m.add_class::<NativeCall>()?;
    m.add("PolicyError", m.py().get_type::<PolicyError>())?;
    m.add_function(wrap_pyfunction!(config_keys, m)?)?;
    m.add_function(wrap_pyfunction!(embedded_packs, m)?)?;
    m.add_function(wrap_pyfunction!(resolve_release, m)?)?;
    torch_ops::register(m)?;
    eager_abi::register(m)?;
    inputs::register(m)?;
    walk::register(m)?;
    Ok(())
}

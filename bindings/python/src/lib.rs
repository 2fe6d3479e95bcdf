//! `attn_policy._native`: the compiled half of the Python package. The public API lives in
//! `python/attn_policy/` (pure Python) on top of these classes.
//!
//! Hot paths stay in Rust: reading a config dict (or a TransformerEngine `AttentionParams`
//! object) into facts, the cached decision, and the TE tuple. The GIL is not released around
//! a decision (it takes microseconds; releasing costs more).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use attn_policy::cache::CachedPolicy;
use attn_policy::decision::{Decision, Explanation, Status};
use attn_policy::facts::schema::{FIELDS, Origin};
use attn_policy::{Facts, PackSource, Policy, load_pack};
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use serde_json::{Map, Value as Json};

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
    /// Input memo: the config exactly as given (JSON) -> its facts and decision. Reading a
    /// config into facts is a pure function and the policy is immutable, so an equal input
    /// always yields the same facts; the memo only skips re-reading them. Bounded: cleared
    /// when full.
    memo: RwLock<HashMap<u64, Memo>>,
    memo_cap: usize,
}

struct Memo {
    input: Json,
    facts: Arc<Facts>,
    decision: Arc<Decision>,
}

fn json_hash(v: &Json, h: &mut u64) {
    #[inline(always)]
    fn mix(h: &mut u64, w: u64) {
        *h = (*h ^ w).wrapping_mul(0xF135_7AEA_2E62_A9C5).rotate_left(26);
    }
    fn bytes(h: &mut u64, s: &str) {
        mix(h, s.len() as u64);
        for c in s.as_bytes().chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            mix(h, u64::from_le_bytes(w));
        }
    }
    match v {
        Json::Null => mix(h, 1),
        Json::Bool(b) => mix(h, 2 + *b as u64),
        Json::Number(n) => {
            mix(h, 4);
            match n.as_i64() {
                Some(i) => mix(h, i as u64),
                None => mix(h, n.as_f64().map_or(0, f64::to_bits) ^ 0x55),
            }
        }
        Json::String(s) => {
            mix(h, 5);
            bytes(h, s);
        }
        Json::Array(a) => {
            mix(h, 6 + ((a.len() as u64) << 8));
            for x in a {
                json_hash(x, h);
            }
        }
        Json::Object(m) => {
            mix(h, 7 + ((m.len() as u64) << 8));
            for (k, x) in m {
                bytes(h, k);
                json_hash(x, h);
            }
        }
    }
}

fn facts_from(config: &Json) -> Result<Facts, String> {
    Facts::from_json(config).map_err(|e| format!("invalid config: {e}"))
}

#[pymethods]
impl NativePolicy {
    /// Loads an embedded pack (`pack`) or a folder holding pack.yaml (`path`), with overlays,
    /// layers switched off and a cache bound.
    #[staticmethod]
    #[pyo3(signature = (pack=None, path=None, overlays=Vec::new(), layers_off=Vec::new(), parity=false, cache_size=4096))]
    fn load(
        py: Python<'_>,
        pack: Option<String>,
        path: Option<String>,
        overlays: Vec<String>,
        mut layers_off: Vec<String>,
        parity: bool,
        cache_size: usize,
    ) -> PyResult<NativePolicy> {
        let source = match (pack, path) {
            (_, Some(p)) => PackSource::Dir(p.into()),
            (Some(name), None) => {
                let names = attn_policy::pack::embedded::pack_names();
                if !names.contains(&name.as_str()) {
                    let hint = attn_policy::facts::did_you_mean(&name, names.iter().copied())
                        .map(|h| format!(" (did you mean `{h}`?)"))
                        .unwrap_or_default();
                    return Err(policy_error(
                        py,
                        format!(
                            "unknown pack `{name}`{hint}; embedded packs: {}",
                            names.join(", ")
                        ),
                        None,
                    ));
                }
                PackSource::Embedded(name)
            }
            (None, None) => PackSource::Embedded("te".into()),
        };
        let overlays: Vec<std::path::PathBuf> = overlays.into_iter().map(Into::into).collect();
        let mut policy: Policy = py
            .detach(|| load_pack(source, &overlays))
            .map_err(|e| {
                let diags: Vec<Json> = e
                    .diagnostics
                    .0
                    .iter()
                    .map(|d| {
                        serde_json::json!({
                            "code": d.code,
                            "severity": format!("{:?}", d.severity).to_lowercase(),
                            "message": d.message,
                            "location": d.location,
                            "label": d.label,
                            "help": d.help,
                        })
                    })
                    .collect();
                policy_error(py, e.render(false), Some(Json::Array(diags)))
            })?;
        // `--parity`: the guard layer off, where the pack has one.
        if parity && policy.layers.iter().any(|l| l == "guard") {
            layers_off.push("guard".into());
        }
        for layer in layers_off {
            policy
                .set_layer_enabled(&layer, false)
                .map_err(|m| policy_error(py, m, None))?;
        }
        Ok(NativePolicy {
            inner: Arc::new(CachedPolicy::new(policy, cache_size)),
            memo: RwLock::new(HashMap::new()),
            memo_cap: cache_size.max(1),
        })
    }

    #[getter]
    fn name(&self) -> String {
        self.inner.policy().name.clone()
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

    /// Decides for a config (a dict of facts by TE's names, or a JSON string).
    fn select(&self, py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<NativeDecision> {
        let json: Json = if let Ok(s) = config.cast::<PyString>() {
            serde_json::from_str(&s.to_cow()?).map_err(|e| {
                policy_error(py, format!("invalid config: not JSON: {e}"), None)
            })?
        } else if let Ok(d) = config.cast::<PyDict>() {
            dict_json(d)?
        } else {
            return Err(policy_error(
                py,
                format!(
                    "invalid config: expected a dict of facts, found {}",
                    config.get_type().name()?
                ),
                None,
            ));
        };
        self.decide_input(py, json, Vec::new(), false)
    }

    /// Decides for a TransformerEngine `AttentionParams`-like object. `environment` maps each
    /// environment fact the caller resolved to `(value, source)`; facts the object itself has
    /// win. Switches under `env` come from the object, then `environment`, then the process
    /// environment. Probe facts the object lacks are answered "supported", as TE's own
    /// selector would after cuDNN accepted the graph.
    fn te_select(
        &self,
        py: Python<'_>,
        params: &Bound<'_, PyAny>,
        environment: &Bound<'_, PyDict>,
    ) -> PyResult<NativeDecision> {
        let (cfg, prov) = te_config(params, environment)?;
        let answer_probes = !cfg.contains_key("probe");
        self.decide_input(py, Json::Object(cfg), prov, answer_probes)
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

impl NativePolicy {
    /// Facts and decision for a config, through the input memo and then the decision cache.
    fn decide_input(
        &self,
        py: Python<'_>,
        input: Json,
        provenance: Vec<(String, &'static str)>,
        answer_probes: bool,
    ) -> PyResult<NativeDecision> {
        let mut h = 0x9E37_79B9_7F4A_7C15 ^ answer_probes as u64;
        json_hash(&input, &mut h);
        let hit = {
            let memo = self.memo.read().unwrap_or_else(|p| p.into_inner());
            memo.get(&h)
                .filter(|m| m.input == input)
                .map(|m| (m.facts.clone(), m.decision.clone()))
        };
        let (facts, decision) = match hit {
            Some(x) => {
                // Count it as the cache hit it is (the decision cache was bypassed).
                self.inner.cache().get(self.inner.key(), &x.0);
                x
            }
            None => {
                let mut facts = facts_from(&input).map_err(|m| policy_error(py, m, None))?;
                if answer_probes {
                    facts.set_all_probes(true);
                }
                let facts = Arc::new(facts);
                let decision = self.inner.decide(&facts);
                let mut memo = self.memo.write().unwrap_or_else(|p| p.into_inner());
                if memo.len() >= self.memo_cap {
                    memo.clear();
                }
                memo.insert(
                    h,
                    Memo {
                        input,
                        facts: facts.clone(),
                        decision: decision.clone(),
                    },
                );
                (facts, decision)
            }
        };
        Ok(NativeDecision {
            policy: self.inner.clone(),
            facts,
            decision,
            provenance,
        })
    }
}

/// One decision, with the facts and policy that produced it.
#[pyclass(frozen, module = "attn_policy._native")]
struct NativeDecision {
    policy: Arc<CachedPolicy>,
    facts: Arc<Facts>,
    decision: Arc<Decision>,
    provenance: Vec<(String, &'static str)>,
}

impl NativeDecision {
    fn explanation(&self) -> Explanation<'_> {
        Explanation::new(self.policy.policy(), &self.facts, &self.decision)
    }

    fn json(&self) -> Json {
        let mut j = self.explanation().to_json();
        if !self.provenance.is_empty() {
            let prov: Map<String, Json> = self
                .provenance
                .iter()
                .map(|(k, s)| (k.clone(), Json::String((*s).into())))
                .collect();
            j["provenance"] = Json::Object(prov);
        }
        j
    }
}

#[pymethods]
impl NativeDecision {
    #[getter]
    fn selected(&self) -> Option<String> {
        self.decision
            .selected
            .map(|s| self.policy.policy().backends[s as usize].name.clone())
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
        let mut text = self.explanation().to_text(color);
        if !self.provenance.is_empty() {
            text.push_str("\nfacts from the environment:\n");
            let width = self.provenance.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
            for (k, s) in &self.provenance {
                let children: Vec<String> = FIELDS
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| {
                        f.path.len() > k.len() + 1
                            && f.path.starts_with(k.as_str())
                            && f.path.as_bytes()[k.len()] == b'.'
                    })
                    .map(|(slot, f)| {
                        let dom = match f.ty {
                            attn_policy::facts::Ty::Enum(d) => Some(d),
                            _ => None,
                        };
                        format!(
                            "{}={}",
                            &f.path[k.len() + 1..],
                            self.facts.values()[slot].display(dom)
                        )
                    })
                    .collect();
                let value = if !children.is_empty() {
                    Some(children.join(", "))
                } else {
                    None
                };
                let value = value.or_else(|| self
                    .facts
                    .get(k)
                    .map(|v| {
                        let dom = attn_policy::facts::schema::slot(k).and_then(|s| {
                            match FIELDS[s].ty {
                                attn_policy::facts::Ty::Enum(d) => Some(d),
                                _ => None,
                            }
                        });
                        v.display(dom).to_string()
                    }))
                    .unwrap_or_default();
                if value.is_empty() {
                    text.push_str(&format!("  {k:<width$}  from {s}\n"));
                } else {
                    text.push_str(&format!("  {k:<width$}  = {value}  from {s}\n"));
                }
            }
        }
        text
    }

    /// The `explain/v1` document as a dict (the CLI's `--json`), plus `provenance` when known.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.json())
    }

    fn to_json(&self) -> String {
        serde_json::to_string(&self.json()).unwrap_or_default()
    }

    /// TransformerEngine's return tuple: (use_flash_attention, flash_attention_backend,
    /// use_fused_attention, fused_attention_backend, use_unfused_attention,
    /// available_backends[, use_frost_attention]).
    #[pyo3(signature = (frost=false))]
    fn te_tuple<'py>(&self, py: Python<'py>, frost: bool) -> PyResult<Bound<'py, PyTuple>> {
        let p = self.policy.policy();
        let d = &self.decision;
        let ex = self.explanation();
        let find = |name: &str| p.backend_index(name);
        let selected = |b: Option<usize>| b.is_some_and(|b| d.selected == Some(b as u16));
        let eligible = |b: Option<usize>| b.is_some_and(|b| d.backends[b].status.eligible());
        let value = |b: Option<usize>| -> PyResult<Py<PyAny>> {
            match b {
                Some(b) if d.backends[b].status.eligible() => to_py(py, &ex.reported_value(b)),
                _ => Ok(py.None()),
            }
        };
        let (flash, fused, unfused) = (
            find("FlashAttention"),
            find("FusedAttention"),
            find("UnfusedDotProductAttention"),
        );
        let available = PyList::new(py, [eligible(flash), eligible(fused), eligible(unfused)])?;
        let mut items: Vec<Py<PyAny>> = vec![
            PyBool::new(py, selected(flash)).to_owned().into_any().unbind(),
            value(flash)?,
            PyBool::new(py, selected(fused)).to_owned().into_any().unbind(),
            value(fused)?,
            PyBool::new(py, selected(unfused)).to_owned().into_any().unbind(),
            available.into_any().unbind(),
        ];
        if frost {
            items.push(
                PyBool::new(py, selected(find("FrostAttention")))
                    .to_owned()
                    .into_any()
                    .unbind(),
            );
        }
        PyTuple::new(py, items)
    }

    /// The rules that declined `backend` here, as `explain/v1` rule objects.
    fn declined_by(&self, py: Python<'_>, backend: &str) -> PyResult<Py<PyAny>> {
        let j = self.explanation().to_json();
        let found = j["backends"]
            .as_array()
            .and_then(|a| a.iter().find(|b| b["name"] == backend))
            .map(|b| b["declined_by"].clone())
            .unwrap_or(Json::Array(Vec::new()));
        to_py(py, &found)
    }

    /// `(fact, source)` pairs for the environment facts of a TE drop-in call.
    #[getter]
    fn provenance(&self) -> Vec<(String, &'static str)> {
        self.provenance.clone()
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
        let status = |s: Status| s.word();
        let p = self.policy.policy();
        let parts: Vec<String> = p
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| format!("{}={}", b.name, status(self.decision.backends[i].status)))
            .collect();
        format!(
            "<Decision selected={:?} {}>",
            self.selected().unwrap_or_else(|| "none".into()),
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
        if let Ok(i) = v.extract::<i64>() {
            return Ok(Json::from(i));
        }
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        return Ok(serde_json::Number::from_f64(f.value()).map_or(Json::Null, Json::Number));
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
    if v.hasattr("_value_")? && v.hasattr("name")? {
        // enum.Enum members (recipe Format.HYBRID): the member name.
        return Ok(Json::String(v.getattr("name")?.str()?.to_cow()?.into_owned()));
    }
    if let Ok(f) = v.extract::<f64>() {
        return Ok(serde_json::Number::from_f64(f).map_or(Json::Null, Json::Number));
    }
    Err(PolicyError::new_err(format!(
        "invalid config: {key}: cannot read a value of type {tyname}"
    )))
}

fn get_opt<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
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
    for attr in ["fp8_dpa", "fp8_mha", "fp8_format", "reduce_amax"] {
        if let Some(v) = get_opt(recipe, attr)? {
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
    let Some(recipe) = d.get_item("recipe")? else {
        return Ok(None);
    };
    if recipe.is_none() {
        return Ok(None);
    }
    let local = match d.get_item("local_recipes")? {
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
    for attr in ["is_paged", "page_size", "total_num_pages"] {
        if let Some(v) = get_opt(ip, attr)? {
            m.insert(attr.into(), value_json(&v, attr)?);
        }
    }
    let mpps = match get_opt(ip, "max_pages_per_seq")? {
        Some(v) => Some(v),
        None => match get_opt(ip, "cache_manager")? {
            Some(cm) if !cm.is_none() => get_opt(&cm, "max_pages_per_seq")?,
            _ => None,
        },
    };
    if let Some(v) = mpps {
        m.insert("max_pages_per_seq".into(), value_json(&v, "max_pages_per_seq")?);
    }
    Ok(Json::Object(m))
}

/// Top-level input keys of the schema (TE's `AttentionParams` names plus environment facts).
fn input_keys() -> &'static [&'static str] {
    static KEYS: std::sync::LazyLock<Vec<&'static str>> = std::sync::LazyLock::new(|| {
        attn_policy::facts::schema::input_keys()
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

fn te_config(
    params: &Bound<'_, PyAny>,
    environment: &Bound<'_, PyDict>,
) -> PyResult<(Map<String, Json>, Provenance)> {
    let mut cfg = Map::new();
    let mut prov: Provenance = Vec::new();
    // A plain dict (a corpus record's `config`) reads like an object's attributes; a
    // dataclass or SimpleNamespace is read through its instance `__dict__` (no exception per
    // absent field); anything else through getattr.
    let as_dict: Option<Bound<'_, PyDict>> = match params.cast::<PyDict>() {
        Ok(d) => Some(d.clone()),
        Err(_) => match get_opt(params, "__dict__")? {
            Some(d) => d.cast_into::<PyDict>().ok(),
            None => None,
        },
    };
    let get = |k: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        match &as_dict {
            Some(d) => d.get_item(k),
            None => get_opt(params, k),
        }
    };
    for &key in input_keys() {
        if let Some(v) = get(key)? {
            let j = match key {
                "fp8_recipe" if !v.is_none() && v.cast::<PyDict>().is_err() => {
                    recipe_json(&v, None)?
                }
                "inference" if !v.is_none() => inference_json(&v)?,
                _ => value_json(&v, key)?,
            };
            cfg.insert(key.to_owned(), j);
        }
    }
    if !cfg.contains_key("fp8_recipe") {
        if let Some(meta) = get("fp8_meta")? {
            if let Some(r) = fp8_meta_json(&meta)? {
                cfg.insert("fp8_recipe".into(), r);
            }
        }
    }
    if !cfg.contains_key("inference") {
        if let Some(ip) = get("inference_params")? {
            if !ip.is_none() {
                cfg.insert("inference".into(), inference_json(&ip)?);
            }
        }
    }
    // Environment facts: the object's own, else what the caller resolved.
    for (k, v) in environment.iter() {
        let key: String = k.extract()?;
        let (value, source): (Bound<'_, PyAny>, String) = v.extract()?;
        if key == "env" {
            continue;
        }
        if cfg.contains_key(&key) {
            prov.push((key, "object"));
        } else if source == "default" && value.is_none() {
            // Nothing measured it: the schema default applies.
            prov.push((key, "default"));
        } else {
            cfg.insert(key.clone(), value_json(&value, &key)?);
            prov.push((key, source_name(&source)));
        }
    }
    // Switches: object > caller (argument / set_environment) > process environment.
    if cfg.contains_key("env") {
        prov.push(("env".into(), "object"));
    } else {
        let given = match environment.get_item("env")? {
            Some(v) => {
                let (value, source): (Bound<'_, PyAny>, String) = v.extract()?;
                Some((value_json(&value, "env")?, source_name(&source)))
            }
            None => None,
        };
        let mut env = Map::new();
        for &name in env_switches() {
            let key = format!("env.{name}");
            if let Some((Json::Object(g), src)) = &given {
                if let Some(v) = g.get(name) {
                    env.insert(name.into(), v.clone());
                    prov.push((key, src));
                    continue;
                }
            }
            if let Some(v) = std::env::var_os(name) {
                env.insert(name.into(), Json::String(v.to_string_lossy().into_owned()));
                prov.push((key, "os.environ"));
            }
        }
        cfg.insert("env".into(), Json::Object(env));
    }
    Ok((cfg, prov))
}

/// Top-level keys a config may hold (for did-you-mean in Python and for the TE translation).
#[pyfunction]
fn config_keys() -> Vec<&'static str> {
    input_keys().to_vec()
}

/// Names of the packs compiled into the module.
#[pyfunction]
fn embedded_packs() -> Vec<&'static str> {
    attn_policy::pack::embedded::pack_names()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativePolicy>()?;
    m.add_class::<NativeDecision>()?;
    m.add("PolicyError", m.py().get_type::<PolicyError>())?;
    m.add_function(wrap_pyfunction!(config_keys, m)?)?;
    m.add_function(wrap_pyfunction!(embedded_packs, m)?)?;
    Ok(())
}

//! Reading a config object (the `config` of conformance records; JSON or YAML) into [`Facts`].
//! Unknown keys and out-of-domain values are errors with a did-you-mean; absent keys take the
//! defaults documented in the schema.

use serde_json::{Map, Value as Json};

use super::schema::{DefaultValue as Default, Origin, Schema, Ty};
use super::value::Value;
use crate::lang::Version;

/// A problem with one input field.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{path}: {message}{}", suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default())]
pub struct InputError {
    /// Dotted path of the offending key (`flash_attn_versions.v5`).
    pub path: String,
    pub message: String,
    pub suggestion: Option<String>,
}

impl InputError {
    /// An error at `path` without a suggestion.
    pub(crate) fn new(path: &str, message: impl Into<String>) -> InputError {
        err(path, message)
    }
}

fn err(path: &str, message: impl Into<String>) -> InputError {
    InputError {
        path: path.to_string(),
        message: message.into(),
        suggestion: None,
    }
}

/// The closest candidate within a small edit distance, for did-you-mean hints.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(word, c), c))
        .filter(|(d, c)| *d <= 2.max(word.len().min(c.len()) / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.to_string())
}

/// The facts of one attention call, one [`Value`] per slot of its family's [`Schema`].
#[derive(Clone, Debug, PartialEq)]
pub struct Facts {
    pub(crate) schema: &'static Schema,
    pub(crate) values: Vec<Value>,
    /// Raw text of version facts that did not parse, for explanations.
    pub(crate) raw_versions: Vec<(usize, String)>,
    /// The decision cache's key of these facts, taken on first use (`crate::cache`); every
    /// method that changes the facts clears it, and a clone starts without it. Code in this
    /// crate that writes `values` directly must do so before the facts meet a cache.
    pub(crate) key: super::key::KeyMemo,
}

impl Facts {
    /// Every fact of the `te` family at its default (probes unknown).
    pub fn defaults() -> Facts {
        Facts::defaults_of(&super::te::TE)
    }

    /// Every fact of `schema` at its default (probes unknown), derived facts computed.
    pub(crate) fn defaults_of(schema: &'static Schema) -> Facts {
        let mut facts = Facts::underived_defaults(schema);
        (schema.derive)(&mut facts, &Map::new());
        facts
    }

    fn underived_defaults(schema: &'static Schema) -> Facts {
        let values = schema
            .fields
            .iter()
            .map(|d| match d.default {
                Default::Null => Value::Null,
                Default::Bool(b) => Value::Bool(b),
                Default::Int(i) => Value::Int(i),
                Default::Float(x) => Value::Float(x),
                Default::Enum(e) => match d.ty {
                    Ty::Enum(dom) => {
                        Value::Enum(dom.index_of(e).expect("schema default in domain"))
                    }
                    _ => unreachable!("enum default on a non-enum fact"),
                },
                Default::Version(v) => {
                    Value::Version(Version::parse(v).expect("schema default version"))
                }
                Default::Computed => match d.origin {
                    Origin::Probe => Value::Unknown,
                    _ => Value::Null,
                },
            })
            .collect();
        Facts {
            schema,
            values,
            raw_versions: Vec::new(),
            key: super::key::KeyMemo::default(),
        }
    }

    /// Reads a `te`-family config object (the `config` of TE conformance records). Other
    /// families: [`Schema::read`]. See `docs/facts.md` for the fields and their defaults.
    pub fn from_json(config: &Json) -> Result<Facts, InputError> {
        Facts::read(&super::te::TE, config)
    }

    /// Reads a config object of `schema`'s family: its structured keys through the family's
    /// reader, every other key as a typed scalar; then the derived facts.
    pub(crate) fn read(schema: &'static Schema, config: &Json) -> Result<Facts, InputError> {
        let obj = config
            .as_object()
            .ok_or_else(|| err("<config>", "expected an object of facts"))?;
        (schema.check)(obj)?;
        let mut facts = Facts::underived_defaults(schema);
        for (key, value) in obj {
            match key.as_str() {
                "id" => {}
                "probe" => facts.set_probes(value)?,
                _ => {
                    if !(schema.read_key)(&mut facts, key, value)? {
                        facts.set_scalar(key, value)?;
                    }
                }
            }
        }
        (schema.derive)(&mut facts, obj);
        Ok(facts)
    }

    /// The family schema these facts belong to.
    pub fn schema(&self) -> &'static Schema {
        self.schema
    }

    /// Value of a fact by path.
    pub fn get(&self, path: &str) -> Option<Value> {
        self.schema.slot(path).map(|s| self.values[s])
    }

    /// The value of an enum fact as its domain's text (`qkv_dtype` -> `"bf16"`); `None` for
    /// unknown paths, non-enum facts and null.
    pub fn text(&self, path: &str) -> Option<&'static str> {
        let slot = self.schema.slot(path)?;
        match (self.values[slot], self.schema.fields[slot].ty) {
            (Value::Enum(i), Ty::Enum(d)) => d.values().get(i as usize).copied(),
            _ => None,
        }
    }

    /// The value of an integer fact.
    pub(crate) fn int(&self, path: &str) -> Option<i64> {
        match self.get(path) {
            Some(Value::Int(i)) => Some(i),
            _ => None,
        }
    }

    pub fn values(&self) -> &[Value] {
        &self.values
    }

    /// The raw text of a version fact that did not parse.
    pub fn raw_version(&self, slot: usize) -> Option<&str> {
        self.raw_versions
            .iter()
            .find(|(s, _)| *s == slot)
            .map(|(_, t)| t.as_str())
    }

    /// Answers a probe fact (`probe.fused_attn_graph`), as a live adapter would.
    pub fn set_probe(&mut self, name: &str, answer: Option<bool>) -> Result<(), InputError> {
        let path = format!("probe.{name}");
        let slot = self
            .schema
            .slot(&path)
            .filter(|s| self.schema.fields[*s].origin == Origin::Probe)
            .ok_or_else(|| InputError {
                suggestion: did_you_mean(&path, self.schema.probe_names()),
                ..err(&path, "unknown probe")
            })?;
        self.key.clear();
        self.values[slot] = answer.map_or(Value::Unknown, Value::Bool);
        Ok(())
    }

    /// Answers every probe the same way (conformance runs answer "supported").
    pub fn set_all_probes(&mut self, answer: bool) {
        self.key.clear();
        for (slot, d) in self.schema.fields.iter().enumerate() {
            if d.origin == Origin::Probe {
                self.values[slot] = Value::Bool(answer);
            }
        }
    }

    pub(crate) fn put(&mut self, path: &str, v: Value) {
        self.key.clear();
        self.values[self.schema.known_slot(path)] = v;
    }

    /// A version fact given as a string (or, where `array_ok`, as `[9, 19, 0]`).
    pub(crate) fn set_version(
        &mut self,
        path: &str,
        value: &Json,
        array_ok: bool,
    ) -> Result<(), InputError> {
        let v = version_from(path, value, array_ok)?;
        self.put_version(path, v);
        Ok(())
    }

    fn put_version(&mut self, path: &str, v: Result<Option<Version>, String>) {
        let slot = self.schema.known_slot(path);
        self.key.clear();
        self.raw_versions.retain(|(s, _)| *s != slot);
        self.values[slot] = match v {
            Ok(Some(v)) => Value::Version(v),
            Ok(None) => Value::Null,
            Err(raw) => {
                self.raw_versions.push((slot, raw));
                Value::BadVersion
            }
        };
    }

    pub(crate) fn set_scalar(&mut self, path: &str, value: &Json) -> Result<(), InputError> {
        let slot = match self.schema.slot(path) {
            Some(s) if self.schema.fields[s].origin == Origin::Input => s,
            _ => {
                return Err(InputError {
                    suggestion: did_you_mean(path, self.schema.input_keys()),
                    ..err(path, "unknown fact")
                });
            }
        };
        let d = self.schema.def(slot);
        if value.is_null() {
            if d.nullable {
                self.values[slot] = Value::Null;
                return Ok(());
            }
            return Err(err(
                path,
                format!("must not be null (expected {})", d.ty.name()),
            ));
        }
        match d.ty {
            Ty::Version => {
                let v = version_from(path, value, false)?;
                self.put_version(path, v);
            }
            Ty::Object => return Err(err(path, "structured fact given in an unsupported form")),
            ty => self.values[slot] = typed_value(path, ty, value)?,
        }
        Ok(())
    }

    pub(crate) fn set_int_list(
        &mut self,
        path: &str,
        value: &Json,
        members: &[&str],
        len: Option<usize>,
    ) -> Result<(), InputError> {
        if value.is_null() {
            self.put(path, Value::Null);
            for m in members {
                self.put(&format!("{path}.{m}"), Value::Null);
            }
            return Ok(());
        }
        let items = value.as_array().ok_or_else(|| {
            err(
                path,
                format!("expected a list of integers or null, found {value}"),
            )
        })?;
        if let Some(n) = len
            && items.len() != n
        {
            return Err(err(
                path,
                format!("expected {n} integers, found {}", items.len()),
            ));
        }
        let ints = items
            .iter()
            .enumerate()
            .map(|(i, v)| int_from(&format!("{path}[{i}]"), v))
            .collect::<Result<Vec<_>, _>>()?;
        self.put(path, Value::Bool(true));
        for (m, v) in members.iter().zip(ints) {
            self.put(&format!("{path}.{m}"), Value::Int(v));
        }
        Ok(())
    }

    /// A compute capability given as `[major, minor]`, `"9.0"` or `"sm90"`, into the
    /// `PATH.major` / `PATH.minor` facts.
    pub(crate) fn set_compute_capability(
        &mut self,
        path: &str,
        value: &Json,
    ) -> Result<(), InputError> {
        let path_major = format!("{path}.major");
        let path_minor = format!("{path}.minor");
        let (major, minor) = match value {
            Json::Array(a) if a.len() == 2 => (int_from(path, &a[0])?, int_from(path, &a[1])?),
            Json::String(s) => {
                let t = s.trim_start_matches("sm").trim_start_matches("sm_");
                let parsed = match t.split_once('.') {
                    Some((a, b)) => a.parse().ok().zip(b.parse().ok()),
                    None => t.parse::<i64>().ok().map(|n| (n / 10, n % 10)),
                };
                parsed.ok_or_else(|| {
                    err(
                        path,
                        format!("expected [major, minor], \"9.0\" or \"sm90\", found {s:?}"),
                    )
                })?
            }
            _ => return Err(err(path, format!("expected [major, minor], found {value}"))),
        };
        if !(0..100).contains(&major) || !(0..10).contains(&minor) {
            return Err(err(
                path,
                format!("[{major}, {minor}] is not a compute capability"),
            ));
        }
        self.put(&path_major, Value::Int(major));
        self.put(&path_minor, Value::Int(minor));
        Ok(())
    }

    /// A structured fact given as an object of its members (`inference`, `flash_attn_versions`);
    /// `nullable`: `null` means absent, and a present object's members start from the family's
    /// member defaults.
    pub(crate) fn set_object(
        &mut self,
        path: &str,
        value: &Json,
        nullable: bool,
    ) -> Result<(), InputError> {
        let members: Vec<&'static str> = self
            .schema
            .fields
            .iter()
            .filter_map(|d| d.path.strip_prefix(path).and_then(|r| r.strip_prefix('.')))
            .collect();
        if value.is_null() && nullable {
            self.put(path, Value::Null);
            for m in &members {
                self.put(&format!("{path}.{m}"), Value::Null);
            }
            return Ok(());
        }
        let obj: &Map<String, Json> = value.as_object().ok_or_else(|| {
            err(
                path,
                format!(
                    "expected an object{}, found {value}",
                    if nullable { " or null" } else { "" }
                ),
            )
        })?;
        if nullable {
            self.put(path, Value::Bool(true));
            // Members of a present object start from their documented defaults.
            for m in &members {
                let default = (self.schema.member_default)(path, m);
                self.put(&format!("{path}.{m}"), default);
            }
        }
        for (k, v) in obj {
            let full = format!("{path}.{k}");
            if !members.contains(&k.as_str()) {
                return Err(InputError {
                    suggestion: did_you_mean(k, members.iter().copied())
                        .map(|s| format!("{path}.{s}")),
                    ..err(&full, "unknown field")
                });
            }
            self.set_member(&full, v)?;
        }
        Ok(())
    }

    /// Environment variables (`env: {NVTE_FLASH_ATTN: "0"}`): strings read as TE reads them,
    /// with `int(...)`.
    pub(crate) fn set_env(&mut self, path: &str, value: &Json) -> Result<(), InputError> {
        let members: Vec<&'static str> = self
            .schema
            .fields
            .iter()
            .filter_map(|d| d.path.strip_prefix(path).and_then(|r| r.strip_prefix('.')))
            .collect();
        let obj = value
            .as_object()
            .ok_or_else(|| err(path, format!("expected an object, found {value}")))?;
        for (k, v) in obj {
            let full = format!("{path}.{k}");
            if !members.contains(&k.as_str()) {
                return Err(InputError {
                    suggestion: did_you_mean(k, members.iter().copied())
                        .map(|s| format!("{path}.{s}")),
                    ..err(&full, "unknown field")
                });
            }
            let n = env_int(&full, v)?;
            self.put(&full, n.map_or(Value::Null, Value::Int));
        }
        Ok(())
    }

    pub(crate) fn set_member(&mut self, full: &str, v: &Json) -> Result<(), InputError> {
        // Members use the same typing as top-level scalars.
        let slot = self.schema.known_slot(full);
        let d = self.schema.def(slot);
        if v.is_null() {
            if d.nullable || d.ty == Ty::Version {
                self.values[slot] = Value::Null;
                return Ok(());
            }
            return Err(err(full, "must not be null"));
        }
        match d.ty {
            Ty::Version => {
                let parsed = version_from(full, v, false)?;
                self.put_version(full, parsed);
                Ok(())
            }
            ty => {
                self.values[slot] = typed_value(full, ty, v)?;
                Ok(())
            }
        }
    }

    fn set_probes(&mut self, value: &Json) -> Result<(), InputError> {
        let obj = value.as_object().ok_or_else(|| {
            err(
                "probe",
                format!("expected an object of probe answers, found {value}"),
            )
        })?;
        for (k, v) in obj {
            let answer = match v {
                Json::Bool(b) => Some(*b),
                Json::Null => None,
                _ => {
                    return Err(err(
                        &format!("probe.{k}"),
                        format!("expected true, false or null, found {v}"),
                    ));
                }
            };
            self.set_probe(k, answer)?;
        }
        Ok(())
    }
}

/// A JSON value as a bool, int, float or enum fact (the scalar types that need no side state).
fn typed_value(path: &str, ty: Ty, value: &Json) -> Result<Value, InputError> {
    Ok(match ty {
        Ty::Bool => Value::Bool(
            value
                .as_bool()
                .ok_or_else(|| err(path, format!("expected true or false, found {value}")))?,
        ),
        Ty::Int => Value::Int(int_from(path, value)?),
        Ty::Float => Value::Float(
            value
                .as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| err(path, format!("expected a number, found {value}")))?,
        ),
        Ty::Enum(dom) => {
            let text = value.as_str().ok_or_else(|| {
                err(
                    path,
                    format!("expected one of {}, found {value}", dom.values().join(", ")),
                )
            })?;
            Value::Enum(dom.index_of(text).ok_or_else(|| InputError {
                suggestion: did_you_mean(text, dom.values().iter().copied()),
                ..err(
                    path,
                    format!(
                        "`{text}` is not a valid {}; expected one of {}",
                        dom.name(),
                        dom.values().join(", ")
                    ),
                )
            })?)
        }
        Ty::Version | Ty::Object => return Err(err(path, "unsupported member type")),
    })
}

fn int_from(path: &str, v: &Json) -> Result<i64, InputError> {
    if let Some(i) = v.as_i64() {
        return Ok(i);
    }
    match v.as_f64() {
        Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => Ok(x as i64),
        _ => Err(err(path, format!("expected an integer, found {v}"))),
    }
}

/// Environment switches are strings in the environment; TE reads them with `int(...)`.
fn env_int(path: &str, v: &Json) -> Result<Option<i64>, InputError> {
    match v {
        Json::Null => Ok(None),
        Json::Bool(b) => Ok(Some(*b as i64)),
        Json::Number(_) => int_from(path, v).map(Some),
        Json::String(s) => s.trim().parse::<i64>().map(Some).map_err(|_| {
            err(
                path,
                format!("{s:?} is not an integer (TE reads this variable with int())"),
            )
        }),
        _ => Err(err(
            path,
            format!("expected a string such as \"0\" or \"1\", found {v}"),
        )),
    }
}

/// Reads a version given as a string ("9.19.0") or, where `array_ok`, as [9, 19, 0].
/// `Ok(None)` is null (not installed); `Err(raw)` is text that does not parse.
fn version_from(
    path: &str,
    v: &Json,
    array_ok: bool,
) -> Result<Result<Option<Version>, String>, InputError> {
    match v {
        Json::Null => Ok(Ok(None)),
        Json::String(s) => Ok(Version::parse(s).map(Some).ok_or_else(|| s.clone())),
        Json::Array(parts) if array_ok && (1..=3).contains(&parts.len()) => {
            let mut p = [0u32; 3];
            for (i, x) in parts.iter().enumerate() {
                p[i] = x
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| err(path, format!("expected version numbers, found {x}")))?;
            }
            Ok(Ok(Some(Version::new(p[0], p[1], p[2]))))
        }
        _ => Err(err(
            path,
            format!(
                "expected a version string such as \"9.19.0\"{}, found {v}",
                if array_ok { " or [9, 19, 0]" } else { "" }
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_apply_and_window_is_normalised() {
        let f = Facts::from_json(&json!({"attn_mask_type": "causal"})).unwrap();
        assert_eq!(f.get("window.left"), Some(Value::Int(-1)));
        assert_eq!(f.get("window.right"), Some(Value::Int(0)));
        assert_eq!(f.get("window_size"), Some(Value::Null));
        assert_eq!(f.get("head_dim_qk"), Some(Value::Int(64)));
        assert_eq!(f.get("sm"), Some(Value::Int(90)));
        assert_eq!(f.get("probe.fused_attn_graph"), Some(Value::Unknown));
    }

    #[test]
    fn unknown_key_suggests() {
        let e = Facts::from_json(&json!({"head_dim_kq": 64})).unwrap_err();
        assert_eq!(e.suggestion.as_deref(), Some("head_dim_qk"));
        let e = Facts::from_json(&json!({"attn_mask_type": "casual"})).unwrap_err();
        assert_eq!(e.suggestion.as_deref(), Some("causal"));
        let e = Facts::from_json(&json!({"flash_attn_versions": {"v5": "1.0.0"}})).unwrap_err();
        assert_eq!(e.path, "flash_attn_versions.v5");
    }

    #[test]
    fn versions_and_env() {
        let f = Facts::from_json(&json!({
            "cudnn_version": [9, 18, 1],
            "cudnn_frontend_version": "not-a-version",
            "env": {"NVTE_FLASH_ATTN": "0"},
            "device_compute_capability": [10, 3],
        }))
        .unwrap();
        assert_eq!(
            f.get("cudnn_version"),
            Some(Value::Version(Version::new(9, 18, 1)))
        );
        assert_eq!(f.get("cudnn_frontend_version"), Some(Value::BadVersion));
        assert_eq!(f.get("env.NVTE_FLASH_ATTN"), Some(Value::Int(0)));
        assert_eq!(f.get("sm"), Some(Value::Int(103)));
        assert!(Facts::from_json(&json!({"env": {"NVTE_FLASH_ATTN": "yes"}})).is_err());
    }

    #[test]
    fn deterministic_follows_env_when_absent() {
        let f =
            Facts::from_json(&json!({"env": {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}})).unwrap();
        assert_eq!(f.get("deterministic"), Some(Value::Bool(true)));
        let f = Facts::from_json(
            &json!({"deterministic": false, "env": {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}}),
        )
        .unwrap();
        assert_eq!(f.get("deterministic"), Some(Value::Bool(false)));
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(Facts::from_json(&json!({"window_size": [1]})).is_err());
        assert!(Facts::from_json(&json!({"batch_size": "two"})).is_err());
        assert!(Facts::from_json(&json!({"batch_size": null})).is_err());
        assert!(Facts::from_json(&json!([1, 2])).is_err());
        assert!(Facts::from_json(&json!({"device_compute_capability": [1000, 0]})).is_err());
    }
}

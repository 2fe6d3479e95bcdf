//! Reading a config object (the `config` of conformance records; JSON or YAML) into [`Facts`]
//! ([`Schema::read`]), and the accessors of `Facts` (the type is declared in `schema.rs`).
//! Unknown keys and out-of-domain values are errors with a did-you-mean; absent keys take the
//! defaults documented in the schema. No family is named here: the te family's shorthands
//! (`Facts::from_json`, `Facts::defaults`) are in `te.rs`.

use serde_json::{Map, Value as Json};

use std::sync::Arc;

use super::error::{InputError, InputErrorKind, did_you_mean};
use super::key::{FactsKey, KeyMemo, encode};
use super::schema::{DefaultValue as Default, Facts, Origin, Schema, Ty};
use super::value::Value;
use crate::lang::Version;

fn err(path: &str, message: impl Into<String>) -> InputError {
    InputError::new(path, message)
}

fn unknown(path: &str, message: &str, suggestion: Option<String>) -> InputError {
    err(path, message)
        .kind(InputErrorKind::UnknownKey)
        .suggest(suggestion)
}

fn domain(path: &str, message: impl Into<String>) -> InputError {
    err(path, message).kind(InputErrorKind::Domain)
}

/// What a JSON value is, for messages ("a list", "a string").
pub(crate) fn kind_of(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}

/// Reading a config of a family (the family's file adds a shorthand for its own, as `te.rs`
/// does with `Facts::from_json`).
impl Schema {
    /// Every fact at its default (probes unknown), derived facts computed.
    pub fn defaults(&'static self) -> Facts {
        Facts::defaults_of(self)
    }

    /// Reads a config object of this family. See `docs/facts.md` for the fields and defaults.
    pub fn read(&'static self, config: &Json) -> Result<Facts, InputError> {
        Facts::read(self, config)
    }

    /// Reads a config object without checking bounds and constraints: for tests that compare
    /// the constraints' checks with their expressions, never for deciding.
    #[doc(hidden)]
    pub fn read_unvalidated(&'static self, config: &Json) -> Result<Facts, InputError> {
        Facts::read_with(self, config, false)
    }
}

impl FactsKey {
    /// The exact cache key of a fact set (see [`FactsKey`]).
    pub fn of(facts: &Facts) -> FactsKey {
        FactsKey::of_parts(&facts.values, &facts.raw_versions)
    }
}

impl Facts {
    /// The exact cache key of these facts, computed once per `Facts` value (see [`FactsKey`]).
    pub fn cache_key(&self) -> &Arc<FactsKey> {
        let key = self.key.get_or_init(|| FactsKey::of(self));
        debug_assert!(
            *key.words == *encode(&self.values, &self.raw_versions),
            "stale FactsKey: Facts changed after its key was taken (clear the memo on every write)"
        );
        key
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
            key: KeyMemo::default(),
        }
    }

    /// Reads a config object of `schema`'s family: its structured keys through the family's
    /// reader, every other key as a typed scalar; then the derived facts.
    pub(crate) fn read(schema: &'static Schema, config: &Json) -> Result<Facts, InputError> {
        Facts::read_with(schema, config, true)
    }

    pub(crate) fn read_with(
        schema: &'static Schema,
        config: &Json,
        validate: bool,
    ) -> Result<Facts, InputError> {
        let obj = config.as_object().ok_or_else(|| {
            err(
                "",
                format!("expected an object of facts, found {}", kind_of(config)),
            )
            .kind(InputErrorKind::Syntax)
        })?;
        (schema.check)(obj)?;
        let mut facts = Facts::underived_defaults(schema);
        for (key, value) in obj {
            match key.as_str() {
                "id" => {}
                "probe" => facts.set_probes(value)?,
                // Chooses the pack (`te@auto`), read by the front end; no rule reads it.
                k if schema.selection_fact(k).is_some() => {
                    schema.selection_value(config, k)?;
                }
                _ => {
                    if !(schema.read_key)(&mut facts, key, value)? {
                        facts.set_scalar(key, value)?;
                    }
                }
            }
        }
        (schema.derive)(&mut facts, obj);
        if validate {
            super::constraint::validate(schema, &facts, &|key| obj.contains_key(key))?;
        }
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
            .ok_or_else(|| {
                unknown(
                    &path,
                    "unknown probe",
                    did_you_mean(&path, self.schema.probe_names()),
                )
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
        let slot = self.schema.known_slot(path);
        self.key.clear();
        self.raw_versions.retain(|(s, _)| *s != slot);
        self.values[slot] = v;
    }

    /// A version fact given as a string (or, where `array_ok`, as `[9, 19, 0]`). For a fact
    /// whose probe reports the raw string ([`super::schema::FieldDef::raw_text`]), a string
    /// that does not parse is kept as present-but-unparseable; for the others it is refused,
    /// as is every value that is not a string (or a version list where allowed) or null.
    pub(crate) fn set_version(
        &mut self,
        path: &str,
        value: &Json,
        array_ok: bool,
    ) -> Result<(), InputError> {
        if let Json::String(raw) = value
            && self.schema.def(self.schema.known_slot(path)).raw_text
            && Version::parse(raw).is_none()
        {
            self.put_version(path, Err(raw.clone()));
            return Ok(());
        }
        let v = version_from(path, value, array_ok)?;
        self.put_version(path, Ok(v));
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
            // A fact of the schema that is not an input (`docs/facts.md` lists them with the
            // inputs): say what it is and how to give it, not just "unknown fact".
            Some(s) if self.schema.fields[s].origin == Origin::Probe => {
                let name = path.strip_prefix("probe.").unwrap_or(path);
                return Err(unknown(
                    path,
                    &format!(
                        "a probe answer, given under `probe`: {{\"probe\": {{\"{name}\": true}}}} (true, false or null)"
                    ),
                    None,
                ));
            }
            Some(s) => {
                return Err(unknown(
                    path,
                    &format!(
                        "derived from the input facts, not one of them ({})",
                        self.schema.def(s).doc.trim_end_matches('.')
                    ),
                    did_you_mean(path, self.schema.input_keys()),
                ));
            }
            None => {
                return Err(unknown(
                    path,
                    "unknown fact",
                    did_you_mean(path, self.schema.input_keys()),
                ));
            }
        };
        let d = self.schema.def(slot);
        if value.is_null() {
            if d.nullable {
                self.put(path, Value::Null);
                return Ok(());
            }
            return Err(err(
                path,
                format!("must not be null (expected {})", d.ty.name()),
            ));
        }
        match d.ty {
            Ty::Version => self.set_version(path, value, false)?,
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
                let t = s.strip_prefix("sm_").or(s.strip_prefix("sm")).unwrap_or(s);
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
        // The family's constraints check that a GPU has this capability; here only its shape.
        if !(0..100).contains(&major) || !(0..10).contains(&minor) {
            return Err(domain(
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
                return Err(unknown(
                    &full,
                    "unknown field",
                    did_you_mean(k, members.iter().copied()).map(|s| format!("{path}.{s}")),
                ));
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
                return Err(unknown(
                    &full,
                    "unknown field",
                    did_you_mean(k, members.iter().copied()).map(|s| format!("{path}.{s}")),
                ));
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
                self.put(full, Value::Null);
                return Ok(());
            }
            return Err(err(full, "must not be null"));
        }
        match d.ty {
            Ty::Version => self.set_version(full, v, false),
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
            Value::Enum(dom.index_of(text).ok_or_else(|| {
                domain(
                    path,
                    format!(
                        "`{text}` is not a valid {}; expected one of {}",
                        dom.name(),
                        dom.values().join(", ")
                    ),
                )
                .suggest(did_you_mean(text, dom.values().iter().copied()))
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
        // Whole floats are exact below 2^53; beyond that a float has lost the integer.
        Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => Ok(x as i64),
        Some(x) if x.fract() == 0.0 => Err(err(
            path,
            format!("{v} does not fit a 64-bit integer exactly"),
        )),
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
/// `Ok(None)` is null (not installed); text that does not parse as a version is an error (a
/// word is not a version the rules could compare) unless the fact keeps raw text, which
/// [`Facts::set_version`] handles before calling this.
fn version_from(path: &str, v: &Json, array_ok: bool) -> Result<Option<Version>, InputError> {
    match v {
        Json::Null => Ok(None),
        Json::String(s) => Version::parse(s).map(Some).ok_or_else(|| {
            domain(
                path,
                format!(
                    "{s:?} is not a version (expected e.g. \"9.19.0\", \"2.8.3\" or \"1.29.0rc1\")"
                ),
            )
        }),
        Json::Array(parts) if array_ok && (1..=3).contains(&parts.len()) => {
            let mut p = [0u32; 3];
            for (i, x) in parts.iter().enumerate() {
                p[i] = x
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| err(path, format!("expected version numbers, found {x}")))?;
            }
            Ok(Some(Version::new(p[0], p[1], p[2])))
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
    fn a_probe_or_derived_fact_given_as_an_input_says_what_it_is() {
        let e = Facts::from_json(&json!({"probe.fused_attn_graph": true})).unwrap_err();
        assert_eq!(e.path, "probe.fused_attn_graph");
        assert!(
            e.message
                .contains(r#"given under `probe`: {"probe": {"fused_attn_graph": true}}"#),
            "{}",
            e.message
        );
        let e = Facts::from_json(&json!({"sm": 90})).unwrap_err();
        assert!(
            e.message
                .starts_with("derived from the input facts, not one of them (major * 10 + minor"),
            "{}",
            e.message
        );
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
            "cudnn_frontend_version": "1.29.0rc1",
            "env": {"NVTE_FLASH_ATTN": "0"},
            "device_compute_capability": [10, 3],
        }))
        .unwrap();
        assert_eq!(
            f.get("cudnn_version"),
            Some(Value::Version(Version::new(9, 18, 1)))
        );
        assert!(matches!(
            f.get("cudnn_frontend_version"),
            Some(Value::Version(_))
        ));
        // A word for a version TE reads as numbers (cuDNN's runtime version) or parses itself
        // at import (flash-attn): an error, not a fact the rules would see.
        let e = Facts::from_json(&json!({"cudnn_version": "not-a-version"})).unwrap_err();
        assert_eq!(e.kind, InputErrorKind::Domain);
        assert_eq!(e.path, "cudnn_version");
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

    /// Every structural class the schema refuses, with the kind and the fact it names.
    #[test]
    fn impossible_inputs_are_refused() {
        use InputErrorKind::{Constraint, Domain, Type};
        let cases = [
            (json!({"batch_size": 0}), Domain, "batch_size"),
            (json!({"num_heads": -8}), Domain, "num_heads"),
            (json!({"head_dim_qk": 0}), Domain, "head_dim_qk"),
            (json!({"max_seqlen_kv": 0}), Domain, "max_seqlen_kv"),
            (json!({"num_tokens_q": -1}), Domain, "num_tokens_q"),
            (json!({"cp_size": 0}), Domain, "cp_size"),
            (json!({"num_splits": 0}), Domain, "num_splits"),
            (
                json!({"attention_dropout": 1.5}),
                Domain,
                "attention_dropout",
            ),
            (
                json!({"attention_dropout": -0.1}),
                Domain,
                "attention_dropout",
            ),
            (json!({"softcap": -1.0}), Domain, "softcap"),
            (json!({"softmax_scale": 0.0}), Domain, "softmax_scale"),
            (json!({"window_size": [-2, 0]}), Domain, "window_size.left"),
            (
                json!({"window_size": [128, -7]}),
                Domain,
                "window_size.right",
            ),
            (
                json!({"inference": {"page_size": -1}}),
                Domain,
                "inference.page_size",
            ),
            (
                json!({"core_attention_bias_shape": [1, 0, 1, 1]}),
                Domain,
                "core_attention_bias_shape.h",
            ),
            (
                json!({"alibi_slopes_shape": [2, 0]}),
                Domain,
                "alibi_slopes_shape[1]",
            ),
            (json!({"cudnn_version": "9.x"}), Domain, "cudnn_version"),
            (
                json!({"flash_attn_versions": {"v2": "latest"}}),
                Domain,
                "flash_attn_versions.v2",
            ),
            (
                json!({"device_compute_capability": [9, 5]}),
                Constraint,
                "device_compute_capability",
            ),
            (
                json!({"device_compute_capability": [0, 0]}),
                Constraint,
                "device_compute_capability",
            ),
            (
                json!({"num_heads": 8, "num_gqa_groups": 3}),
                Constraint,
                "num_gqa_groups",
            ),
            (
                json!({"num_heads": 8, "num_gqa_groups": 16}),
                Constraint,
                "num_gqa_groups",
            ),
            // Only num_heads given: the error points at it.
            (json!({"num_heads": 6}), Constraint, "num_heads"),
            (
                json!({"attn_mask_type": "causal", "window_size": [-1, 4]}),
                Constraint,
                "window_size",
            ),
            (
                json!({"attn_mask_type": "no_mask", "window_size": [64, -1]}),
                Constraint,
                "window_size",
            ),
            (
                json!({"inference": {"is_paged": true, "page_size": 0}}),
                Constraint,
                "inference",
            ),
            (json!({"batch_size": 1.5}), Type, "batch_size"),
            (json!({"batch_size": 1e300}), Type, "batch_size"),
            (
                json!({"batch_size": 18446744073709551615u64}),
                Type,
                "batch_size",
            ),
            (
                json!({"cudnn_version": [9, 4294967296u64, 0]}),
                Type,
                "cudnn_version",
            ),
        ];
        for (config, kind, path) in cases {
            let e = Facts::from_json(&config).expect_err(&config.to_string());
            assert_eq!((e.kind, e.path.as_str()), (kind, path), "{config}: {e}");
        }
        // What TE accepts (and rewrites) stays an input: the rules see it as given.
        for ok in [
            json!({"attn_mask_type": "causal", "window_size": [-1, -1]}),
            json!({"attn_mask_type": "causal", "window_size": [128, 128]}),
            json!({"attn_mask_type": "no_mask", "window_size": [-1, 0]}),
            json!({"window_size": [0, 0]}),
            json!({"attention_dropout": 1.0, "softcap": 0.0}),
            json!({"num_heads": 8, "num_gqa_groups": 1}),
            json!({"inference": {"is_paged": false}}),
            json!({"device_compute_capability": "sm_120"}),
        ] {
            Facts::from_json(&ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }
}

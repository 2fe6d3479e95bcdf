//! Axes and fixed facts of a matrix: names (facts or the CLI's aliases), typed values, the
//! config keys each value sets, the fact slots it pins, and the default value lists.

use serde_json::{Map, Value as Json, json};

use attn_policy::facts::schema::{Origin, Schema, Ty};

use super::MatrixError;

/// What an axis (or `--fix`) name stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alias {
    /// A fact of the schema (or an object of facts, `flash_attn_versions`).
    Fact,
    /// `head_dim`: head_dim_qk and head_dim_v.
    HeadDim,
    /// `sm`: the compute capability (`device_compute_capability: [sm / 10, sm % 10]`).
    Sm,
    /// `seqlen`: max_seqlen_q and max_seqlen_kv.
    Seqlen,
    /// `cp_comm_type`: also turns context parallelism on (`context_parallel: true`), with
    /// `cp_size` 2 (4 and `cp_size_a2a` 2 for `a2a+p2p`) unless those are fixed, as the CLI's
    /// `--cp-comm-type` does.
    CpCommType,
    /// `dtype`, `mask`, `layout`: the CLI's flag names for qkv_dtype, attn_mask_type,
    /// qkv_layout.
    Rename(&'static str),
}

/// A resolved axis or fixed name.
#[derive(Clone, Debug)]
pub struct Name {
    /// As given (`head_dim`, `sm`, `qkv_dtype`).
    pub name: String,
    alias: Alias,
    /// The fact whose type and domain type its values (`head_dim_qk` for `head_dim`).
    typed_by: usize,
    /// Every fact slot a value pins.
    pub slots: Vec<usize>,
    /// The config keys a value sets (each to the value, for the aliases that copy it).
    targets: Vec<&'static str>,
}

/// The config keys (paths) an alias sets, and the facts they are.
const ALIASES: &[(&str, &[&str])] = &[
    ("head_dim", &["head_dim_qk", "head_dim_v"]),
    ("sm", &["device_compute_capability"]),
    ("seqlen", &["max_seqlen_q", "max_seqlen_kv"]),
    ("seqlen", &["seqlen_q", "seqlen_kv"]),
    ("dtype", &["qkv_dtype"]),
    ("mask", &["attn_mask_type"]),
    ("layout", &["qkv_layout"]),
];

/// Every slot under a fact path (the fact, or an object and its members); `sm` goes with
/// the compute capability it is derived from.
pub fn slots_under(schema: &Schema, path: &str) -> Vec<usize> {
    let mut out: Vec<usize> = schema
        .fields
        .iter()
        .enumerate()
        .filter(|(_, f)| {
            f.path == path
                || f.path
                    .strip_prefix(path)
                    .is_some_and(|rest| rest.starts_with('.'))
        })
        .map(|(i, _)| i)
        .collect();
    if path.starts_with("device_compute_capability")
        && let Some(sm) = schema.slot("sm")
    {
        out.push(sm);
    }
    out.sort_unstable();
    out.dedup();
    out
}

impl Name {
    pub fn resolve(schema: &Schema, name: &str) -> Result<Name, MatrixError> {
        // The first alias of that name whose facts the family has.
        let alias_of = |n: &str| {
            ALIASES
                .iter()
                .find(|a| a.0 == n && a.1.iter().all(|p| schema.slot(p).is_some()))
        };
        let (alias, targets): (Alias, Vec<&str>) = match name {
            "cp_comm_type" if schema.slot("context_parallel").is_some() => {
                (Alias::CpCommType, vec!["cp_comm_type", "context_parallel"])
            }
            // `sm` is a derived fact: the alias sets what it is derived from.
            "sm" if schema.slot("device_compute_capability").is_some() => {
                (Alias::Sm, vec!["device_compute_capability"])
            }
            _ if schema.slot(name).is_some() => (Alias::Fact, vec![name]),
            _ => match alias_of(name) {
                Some((n, t)) if t.iter().all(|p| schema.slot(p).is_some()) => (
                    match *n {
                        "head_dim" => Alias::HeadDim,
                        "sm" => Alias::Sm,
                        "seqlen" => Alias::Seqlen,
                        _ => Alias::Rename(t[0]),
                    },
                    t.to_vec(),
                ),
                _ => {
                    let mut known: Vec<&str> = schema.expression_names().collect();
                    known.extend(
                        ALIASES
                            .iter()
                            .filter(|a| a.1.iter().all(|p| schema.slot(p).is_some()))
                            .map(|a| a.0),
                    );
                    return Err(MatrixError::UnknownFact {
                        name: name.to_string(),
                        family: schema.family,
                        suggestion: attn_policy::facts::did_you_mean(name, known),
                    });
                }
            },
        };
        let typed_by = match alias {
            Alias::Sm => schema
                .slot("sm")
                .unwrap_or(schema.slot(targets[0]).expect("alias target")),
            _ => schema.slot(targets[0]).expect("alias target"),
        };
        let f = &schema.fields[typed_by];
        if f.origin == Origin::Probe {
            return Err(MatrixError::Bad(format!(
                "{name}: a probe fact; the matrix answers every probe \"supported\""
            )));
        }
        if f.origin == Origin::Derived && alias != Alias::Sm {
            return Err(MatrixError::Bad(format!(
                "{name}: a derived fact; use the facts it is computed from"
            )));
        }
        let slots = targets
            .iter()
            .flat_map(|t| slots_under(schema, t))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let targets = targets
            .iter()
            .map(|t| schema.fields[schema.slot(t).expect("alias target")].path)
            .collect();
        Ok(Name {
            name: name.to_string(),
            alias,
            typed_by,
            slots,
            targets,
        })
    }

    /// The facts it sets, as a phrase for captions (None for a plain fact).
    pub fn meaning(&self) -> Option<String> {
        Some(match self.alias {
            Alias::Fact => return None,
            Alias::HeadDim | Alias::Seqlen => self.targets.join(" = "),
            Alias::Sm => "device_compute_capability = [sm / 10, sm % 10]".into(),
            Alias::CpCommType => "cp_comm_type with context_parallel = true (cp_size 2; \
                                  a2a+p2p: cp_size 4, cp_size_a2a 2, unless fixed)"
                .into(),
            Alias::Rename(t) => t.to_string(),
        })
    }

    /// Parses one value as the fact's type (JSON text is accepted for any fact).
    pub fn parse(&self, schema: &Schema, text: &str) -> Result<Json, MatrixError> {
        let text = text.trim();
        let f = &schema.fields[self.typed_by];
        let bad = |what: &str| MatrixError::Bad(format!("{}: `{text}` is not {what}", self.name));
        if text == "null" {
            return Ok(Json::Null);
        }
        Ok(match f.ty {
            Ty::Int => json!(text.parse::<i64>().map_err(|_| bad("an integer"))?),
            Ty::Float => json!(text.parse::<f64>().map_err(|_| bad("a number"))?),
            Ty::Bool => match text {
                "true" => json!(true),
                "false" => json!(false),
                _ => return Err(bad("true or false")),
            },
            Ty::Enum(d) => {
                let v = text.trim_matches('"');
                if d.index_of(v).is_none() {
                    return Err(MatrixError::Bad(format!(
                        "{}: `{v}` is not one of {}{}",
                        self.name,
                        d.values().join(", "),
                        attn_policy::facts::did_you_mean(v, d.values().iter().copied())
                            .map(|s| format!(" (did you mean `{s}`?)"))
                            .unwrap_or_default()
                    )));
                }
                json!(v)
            }
            Ty::Version => json!(text.trim_matches('"')),
            Ty::Object => serde_json::from_str(text).map_err(|_| bad("JSON"))?,
        })
    }

    /// The config keys (paths) and values one value of this name sets.
    pub fn sets(&self, value: &Json, fixed: &[String]) -> Vec<(String, Json)> {
        match self.alias {
            Alias::Fact => vec![(self.name.clone(), value.clone())],
            Alias::HeadDim | Alias::Seqlen => self
                .targets
                .iter()
                .map(|t| (t.to_string(), value.clone()))
                .collect(),
            Alias::Sm => {
                let cc = value
                    .as_i64()
                    .map_or(Json::Null, |sm| json!([sm / 10, sm % 10]));
                vec![("device_compute_capability".into(), cc)]
            }
            Alias::Rename(t) => vec![(t.to_string(), value.clone())],
            Alias::CpCommType => {
                let mut out = vec![
                    ("context_parallel".into(), json!(true)),
                    ("cp_comm_type".into(), value.clone()),
                ];
                let both = value.as_str() == Some("a2a+p2p");
                if !fixed.iter().any(|f| f == "cp_size") {
                    out.push(("cp_size".into(), json!(if both { 4 } else { 2 })));
                }
                if both && !fixed.iter().any(|f| f == "cp_size_a2a") {
                    out.push(("cp_size_a2a".into(), json!(2)));
                }
                out
            }
        }
    }

    /// The default values of an axis: head dims, real architectures, sequence lengths, every
    /// value of an enum or boolean. None: the fact needs explicit values.
    pub fn default_values(&self, schema: &Schema) -> Option<Vec<Json>> {
        let f = &schema.fields[self.typed_by];
        match (self.alias, f.ty) {
            (Alias::HeadDim, _) | (Alias::Fact, Ty::Int) if self.name.starts_with("head_dim") => {
                Some(HEAD_DIMS.iter().map(|&d| json!(d)).collect())
            }
            (Alias::Sm, _) | (Alias::Fact, Ty::Int) if self.name == "sm" => {
                Some(ARCHITECTURES.iter().map(|&s| json!(s)).collect())
            }
            (Alias::Seqlen, _) | (Alias::Fact, Ty::Int)
                if self.name.starts_with("max_seqlen") || self.name.starts_with("seqlen") =>
            {
                Some(SEQLENS.iter().map(|&s| json!(s)).collect())
            }
            (_, Ty::Enum(d)) => Some(d.values().iter().map(|&v| json!(v)).collect()),
            (_, Ty::Bool) => Some(vec![json!(false), json!(true)]),
            _ => None,
        }
    }
}

/// Head dims people ask about: powers of two and every size models ship with (72, 80, 96,
/// 160, 192, 264, 320) up to 512.
pub const HEAD_DIMS: &[i64] = &[64, 72, 80, 96, 128, 160, 192, 256, 264, 320, 384, 512];

/// Compute capabilities of shipping GPUs: A100, A10/RTX 30, L4/L40/RTX 40, H100/H200,
/// B200/GB200, B300/GB300, RTX 50/RTX PRO.
pub const ARCHITECTURES: &[i64] = &[80, 86, 89, 90, 100, 103, 120];

pub const SEQLENS: &[i64] = &[128, 512, 2048, 8192, 32768, 131072];

/// Splits `a,b,[1,2],"x,y"` at the commas outside brackets and quotes.
pub fn split_values(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut depth, mut quoted, mut cur) = (0i32, false, String::new());
    for ch in text.chars() {
        match ch {
            '"' => quoted = !quoted,
            '[' | '{' if !quoted => depth += 1,
            ']' | '}' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Sets `path` (dotted) in a config object.
pub fn insert_path(obj: &mut Map<String, Json>, path: &str, value: Json) {
    match path.split_once('.') {
        Some((head, rest)) => {
            let entry = obj
                .entry(head.to_string())
                .or_insert_with(|| Json::Object(Map::new()));
            if !entry.is_object() {
                *entry = Json::Object(Map::new());
            }
            insert_path(entry.as_object_mut().expect("object"), rest, value);
        }
        None => {
            obj.insert(path.to_string(), value);
        }
    }
}

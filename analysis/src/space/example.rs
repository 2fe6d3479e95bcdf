//! An assignment as a config object (the conformance `config` format): the examples that
//! `gaps` and `diff` print for their regions.
//!
//! What it writes: every assigned fact, derived ones as the inputs they come from (`sm` as
//! `device_compute_capability`, the window vars as `window_size`, shape members as lists);
//! not members of an absent or undecided object, nor unassigned facts (their defaults apply);
//! every probe answered "supported". Other families than te write each fact under its own
//! path (objects as `{}` that their members fill in). The tests decide the printed examples
//! again with the packs rather than trusting this mapping.

use serde_json::{Map, Value as Json, json};

use attn_policy::facts::Value;
use attn_policy::facts::schema::{Origin, Ty};

use super::model::Space;

impl Space {
    /// A config object (conformance `config` format) for a partial assignment: assigned
    /// facts are set, the others keep their defaults.
    pub fn example(&self, a: &[Option<u32>]) -> Json {
        self.example_with(a, &[])
    }

    /// [`Space::example`] with some integer vars at given values (see `materialize_with`).
    pub fn example_with(&self, a: &[Option<u32>], values: &[(usize, Value)]) -> Json {
        let mut obj = Map::new();
        let mut vals = Vec::new();
        self.materialize_with(a, values, &mut vals);
        for (i, v) in self.vars.iter().enumerate() {
            let val = match values.iter().find(|x| x.0 == i) {
                Some(&(_, x)) if self.value_of(a, i) != Value::Null => x,
                _ => self.value_of(a, i),
            };
            if matches!(val, Value::Unknown) {
                continue;
            }
            if let Some(p) = v.parent
                && (a[p].is_none() || self.value_of(a, p) == Value::Null)
            {
                // Members of an absent (or undecided) object are not written.
                continue;
            }
            let path = v.path;
            if self.schema.family != "te" {
                // Structured facts as objects their members fill in; the rest as values.
                let j = match (v.ty, val) {
                    (Ty::Object, Value::Null) => Json::Null,
                    (Ty::Object, _) => json!({}),
                    _ => val.to_json(v.domain()),
                };
                insert_path(&mut obj, path, j);
                continue;
            }
            match path {
                "sm" => {
                    if let Value::Int(sm) = val {
                        obj.insert(
                            "device_compute_capability".into(),
                            json!([sm / 10, sm % 10]),
                        );
                    }
                }
                "window_size" => {
                    if val == Value::Null {
                        obj.insert("window_size".into(), Json::Null);
                    } else {
                        let w = self.window.expect("window vars");
                        let get = |x: usize| match vals[self.vars[x].slot] {
                            Value::Int(i) => i,
                            _ => -1,
                        };
                        obj.insert("window_size".into(), json!([get(w.left), get(w.right)]));
                    }
                }
                "window_size.left" | "window_size.right" => {}
                "core_attention_bias_shape" | "alibi_slopes_shape" => {
                    if val == Value::Null {
                        obj.insert(path.into(), Json::Null);
                    } else if path == "alibi_slopes_shape" {
                        let n = match vals[self.slot("alibi_slopes_shape.len")] {
                            Value::Int(n) if (1..=8).contains(&n) => n as usize,
                            _ => 1,
                        };
                        obj.insert(path.into(), json!(vec![1; n]));
                    } else {
                        let dims: Vec<i64> = ["b", "h", "s_q", "s_kv"]
                            .iter()
                            .map(|m| match vals[self.slot(&format!("{path}.{m}"))] {
                                Value::Int(i) => i,
                                _ => 1,
                            })
                            .collect();
                        obj.insert(path.into(), json!(dims));
                    }
                }
                p if p.starts_with("core_attention_bias_shape.")
                    || p.starts_with("alibi_slopes_shape.") => {}
                "fp8_recipe" | "inference" => {
                    if val == Value::Null {
                        obj.insert(path.into(), Json::Null);
                    } else {
                        obj.entry(path.to_string()).or_insert_with(|| json!({}));
                    }
                }
                _ => {
                    let j = match (val, path.starts_with("env.")) {
                        (Value::Int(i), true) => json!(i.to_string()),
                        _ => val.to_json(v.domain()),
                    };
                    insert_path(&mut obj, path, j);
                }
            }
        }
        let probes: Map<String, Json> = self
            .schema
            .fields
            .iter()
            .filter(|d| d.origin == Origin::Probe)
            .filter_map(|d| d.path.strip_prefix("probe."))
            .map(|n| (n.to_string(), Json::Bool(true)))
            .collect();
        obj.insert("probe".into(), Json::Object(probes));
        Json::Object(obj)
    }
}

/// Sets `value` at a dotted `path` inside `obj`, creating (or replacing by) objects on the way.
pub(crate) fn insert_path(obj: &mut Map<String, Json>, path: &str, value: Json) {
    match path.split_once('.') {
        Some((head, rest)) => {
            let entry = obj
                .entry(head.to_string())
                .or_insert_with(|| Json::Object(Map::new()));
            if !entry.is_object() {
                *entry = Json::Object(Map::new());
            }
            if let Some(m) = entry.as_object_mut() {
                insert_path(m, rest, value);
            }
        }
        None => {
            obj.insert(path.to_string(), value);
        }
    }
}

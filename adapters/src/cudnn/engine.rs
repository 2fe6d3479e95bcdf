//! Which engine a cuDNN execution plan runs, read from the plan's JSON
//! (`CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION`).
//!
//! The JSON schema is undocumented; on 9.19 it holds `operationGraph.finalizeMode`
//! (`UNIFIED_SDPA_FWD`, `SDPA_FWD`, `SDPA_BWD` when the fused-attention pattern matched),
//! `engine.engineId`, `engine.knobChoices` and `engine.payload.kernels[].kernelName`. Keys are
//! looked up anywhere in the document so a moved field still parses; a plan whose mode cannot
//! be read is treated as not verified to be fused attention.

use std::fmt;

use serde_json::Value;

/// What the executor reports about the engine behind a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineInfo {
    /// `engine.engineId` (the backend's global engine index).
    pub engine_id: Option<i64>,
    /// `operationGraph.finalizeMode`.
    pub finalize_mode: Option<String>,
    /// Kernel names of the payload.
    pub kernels: Vec<String>,
    /// The frontend-style tag `eng<id>_k<knob>=<value>...` (from the engine config).
    pub tag: String,
    /// Whether the engine carries the NONDETERMINISTIC numerical note.
    pub nondeterministic: bool,
}

/// Finalize modes that mean cuDNN matched its fused flash-attention pattern.
pub const FUSED_ATTENTION_MODES: [&str; 3] = ["UNIFIED_SDPA_FWD", "SDPA_FWD", "SDPA_BWD"];

fn find_key<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) => {
            if let Some(x) = m.get(key) {
                return Some(x);
            }
            m.values().find_map(|x| find_key(x, key))
        }
        Value::Array(a) => a.iter().find_map(|x| find_key(x, key)),
        _ => None,
    }
}

fn collect_key(v: &Value, key: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == key {
                    if let Some(s) = x.as_str() {
                        out.push(s.to_string());
                    }
                } else {
                    collect_key(x, key, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_key(x, key, out)),
        _ => {}
    }
}

impl EngineInfo {
    /// Parses the plan JSON; `tag` and `nondeterministic` come from the engine config.
    pub fn from_plan_json(json: &str, tag: String, nondeterministic: bool) -> EngineInfo {
        let doc: Value = serde_json::from_str(json.trim_end_matches('\0')).unwrap_or(Value::Null);
        let engine_id = find_key(&doc, "engineId").and_then(Value::as_i64);
        let finalize_mode = find_key(&doc, "finalizeMode")
            .and_then(Value::as_str)
            .map(str::to_string);
        let mut kernels = Vec::new();
        collect_key(&doc, "kernelName", &mut kernels);
        EngineInfo {
            engine_id,
            finalize_mode,
            kernels,
            tag,
            nondeterministic,
        }
    }

    /// Whether the plan is a fused flash-attention engine (the pattern matched).
    pub fn is_fused_attention(&self) -> bool {
        self.finalize_mode
            .as_deref()
            .is_some_and(|m| FUSED_ATTENTION_MODES.contains(&m))
    }

    /// A short human-readable name: the tag, the mode and the first kernel.
    pub fn summary(&self) -> String {
        format!(
            "{} mode={} kernel={}",
            self.tag,
            self.finalize_mode.as_deref().unwrap_or("?"),
            self.kernels.first().map(String::as_str).unwrap_or("?")
        )
    }
}

impl fmt::Display for EngineInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The shape of a 9.19 plan JSON (cubin elided), as probed on the H200.
    const PLAN: &str = r#"{"cudnnVersion":91900,"schemaVersion":4,
        "operationGraph":{"finalizeMode":"SDPA_FWD","tensors":[],"nodes":[]},
        "GPUProfile":{"smCount":132},
        "engine":{"engineId":2,"smVersion":900,"knobChoices":{"CUDNN_KNOB_TYPE_KERNEL_CFG":7},
          "payload":{"kernels":[{"kernelName":"cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0","cubin":"AAAA"}]}}}"#;

    #[test]
    fn parses_engine_mode_and_kernels() {
        let e = EngineInfo::from_plan_json(PLAN, "eng2_k24=7".into(), false);
        assert_eq!(e.engine_id, Some(2));
        assert_eq!(e.finalize_mode.as_deref(), Some("SDPA_FWD"));
        assert_eq!(e.kernels.len(), 1);
        assert!(e.kernels[0].contains("sm90_flash_fprop_wgmma"));
        assert!(e.is_fused_attention());
        assert!(
            e.summary()
                .starts_with("eng2_k24=7 mode=SDPA_FWD kernel=cudnn_generated")
        );
    }

    #[test]
    fn a_generic_plan_is_not_fused_attention() {
        let generic = PLAN.replace("SDPA_FWD", "RUNTIME_FUSION");
        assert!(!EngineInfo::from_plan_json(&generic, "eng0".into(), false).is_fused_attention());
        // unreadable JSON: not verified, so not accepted as fused attention
        let e = EngineInfo::from_plan_json("not json", "eng3".into(), false);
        assert!(!e.is_fused_attention());
        assert_eq!(e.engine_id, None);
    }

    #[test]
    fn trailing_nul_from_the_c_buffer_is_ignored() {
        let with_nul = format!("{PLAN}\0");
        assert!(EngineInfo::from_plan_json(&with_nul, "eng2".into(), false).is_fused_attention());
    }
}

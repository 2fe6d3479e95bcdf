//! Arguments shared by subcommands: where the config comes from, which pack, how to print.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use serde_json::{Map, Value as Json, json};

use attn_policy::facts::{ConfigText, Facts, InputError, InputErrorKind, Schema, presets};
use attn_policy::pack::ReleaseError;
use attn_policy::{PackError, PackSpec, Policy};

/// The attention configuration: a preset, a file, then flags, each overriding the previous.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// Config object (JSON or YAML, the `config` format of conformance records); `-` reads stdin.
    pub config: Option<PathBuf>,
    /// Start from a named preset (see `attn-policy presets`).
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// Set head_dim_qk and head_dim_v.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub head_dim: Option<i64>,
    /// Set head_dim_qk only (the query/key head size; MLA: --head-dim-qk 192 --head-dim-v 128).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub head_dim_qk: Option<i64>,
    /// Set head_dim_v only (the value/output head size).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub head_dim_v: Option<i64>,
    /// GPU architecture as sm number: 80, 86, 89, 90, 100, 103, 120, ... (docs/facts.md lists
    /// every compute capability; others are refused).
    #[arg(long, value_name = "SM", allow_negative_numbers = true, value_parser = sm_number)]
    pub sm: Option<u32>,
    /// cuDNN runtime version, e.g. 9.19.0.
    #[arg(long, value_name = "VERSION")]
    pub cudnn: Option<String>,
    /// qkv_dtype: fp16, bf16, fp32, fp8_e4m3, fp8_e5m2.
    #[arg(long)]
    pub dtype: Option<String>,
    /// qkv_layout, e.g. bshd_bshd_bshd, sbhd_sbhd_sbhd, thd_thd_thd.
    #[arg(long)]
    pub layout: Option<String>,
    /// attn_mask_type: no_mask, causal, causal_bottom_right, padding, padding_causal, ...
    #[arg(long)]
    pub mask: Option<String>,
    /// Sliding window LEFT,RIGHT (-1 = unbounded), e.g. 128,0.
    #[arg(long, value_name = "LEFT,RIGHT", allow_hyphen_values = true)]
    pub window: Option<String>,
    /// Batch size (te: batch_size, the number of sequences under THD; torch: batch).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub batch: Option<i64>,
    /// Query heads (te: num_heads, torch: heads_q).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub heads: Option<i64>,
    /// Key/value heads (te: num_gqa_groups, torch: heads_kv).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub kv_heads: Option<i64>,
    /// Both sequence lengths, query and key/value (te: max_seqlen_q and max_seqlen_kv).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub seqlen: Option<i64>,
    /// The query length only (te: max_seqlen_q, torch: seqlen_q), e.g. 1 for a decode step.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub seqlen_q: Option<i64>,
    /// The key/value length only (te: max_seqlen_kv, torch: seqlen_kv), e.g. the KV cache's.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub seqlen_kv: Option<i64>,
    /// Context-parallel algorithm: p2p, all_gather, a2a, a2a+p2p (turns context_parallel on).
    #[arg(long, value_name = "TYPE")]
    pub cp_comm_type: Option<String>,
    /// Context-parallel group size (turns context_parallel on when > 1).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub cp_size: Option<i64>,
    /// Logit soft-capping: softcap (0 = off), e.g. 50 for Gemma 2.
    #[arg(long, value_name = "C", allow_negative_numbers = true)]
    pub softcap: Option<f64>,
    /// The softmax's sink (softmax_type): vanilla, off-by-one or learnable (gpt-oss).
    #[arg(long, value_name = "TYPE")]
    pub softmax_type: Option<String>,
    /// Inference (is_training = false).
    #[arg(long)]
    pub inference: bool,
    /// Require deterministic algorithms.
    #[arg(long)]
    pub deterministic: bool,
    /// Set any fact: PATH=JSON, e.g. --set softcap=30 --set 'flash_attn_versions.v3="3.0.0"'.
    #[arg(long = "set", value_name = "PATH=JSON")]
    pub sets: Vec<String>,
    /// Set an environment switch: NAME=VALUE, e.g. --env NVTE_FLASH_ATTN=0 (overrides the
    /// shell's value).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub envs: Vec<String>,
    /// Answer a probe fact: NAME=true|false, e.g. --probe fused_attn_graph=true.
    #[arg(long = "probe", value_name = "NAME=BOOL")]
    pub probes: Vec<String>,
    /// Ignore the shell's environment variables that the pack family's selector reads (NVTE_*
    /// for te packs; read by default, as the selector reads them).
    #[arg(long)]
    pub no_env: bool,
    // ---- flags of the torch family (PyTorch SDPA)
    /// torch: the attn_mask, as a kind: none, bool ([b, hq, sq, skv]), bool_bcast
    /// ([1, 1, sq, skv]) or float ([b, 1, sq, skv] in the query dtype).
    #[arg(long, value_name = "KIND")]
    pub attn_mask: Option<String>,
    /// torch: is_causal=True.
    #[arg(long)]
    pub causal: bool,
    /// torch: dropout_p.
    #[arg(long, value_name = "P")]
    pub dropout: Option<f64>,
    /// torch: enable_gqa=True.
    #[arg(long)]
    pub enable_gqa: bool,
    /// torch: query, key and value require grad.
    #[arg(long)]
    pub requires_grad: bool,
    /// torch: memory layout of q, k, v: bhsd, bshd_view (a transposed view) or
    /// noncontig_lastdim (last-dimension stride 2).
    #[arg(long, value_name = "LAYOUT")]
    pub tensor_layout: Option<String>,
    /// torch: switch a backend off as torch.backends.cuda.enable_*_sdp(False) does:
    /// flash, efficient, math or cudnn (repeatable).
    #[arg(long = "disable", value_name = "BACKEND")]
    pub disable: Vec<String>,
}

/// `--sm`: a compute capability as one number (major * 10 + minor). A negative or non-numeric
/// value is named as such (clap's own message for `-1` would suggest `-- -1`), and so is a
/// number of 1000 or more (read as a major version of 100 or more, it was refused as
/// "[100, 0] is not a compute capability").
fn sm_number(s: &str) -> Result<u32, String> {
    s.trim()
        .parse::<u32>()
        .ok()
        .filter(|&sm| sm < 1000)
        .ok_or_else(|| {
            format!(
                "expected an sm number, major * 10 + minor: 80, 86, 89, 90, 100, 103, 120, \
                 ...; got `{s}`"
            )
        })
}

/// Flags that set facts of one pack family only, by family.
const FAMILY_FLAGS: &[(&str, &[&str])] = &[
    (
        "te",
        &[
            "--layout",
            "--mask",
            "--window",
            "--cp-comm-type",
            "--cp-size",
            "--softcap",
            "--softmax-type",
            "--inference",
            "--probe",
        ],
    ),
    (
        "torch",
        &[
            "--attn-mask",
            "--causal",
            "--dropout",
            "--enable-gqa",
            "--requires-grad",
            "--tensor-layout",
            "--disable",
        ],
    ),
];

fn insert_path(obj: &mut Map<String, Json>, path: &str, value: Json) {
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

fn merge(into: &mut Map<String, Json>, from: &Json) {
    if let Some(from) = from.as_object() {
        for (k, v) in from {
            match (into.get_mut(k), v) {
                (Some(Json::Object(a)), Json::Object(_)) if k != "window_size" => merge(a, v),
                _ => {
                    into.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// Where an input key's value came from (the decision's provenance, and an error's location).
#[derive(Clone, Debug)]
pub enum Source {
    /// The shell environment (as the family's selector reads it), by variable name.
    Shell(String),
    Preset(String),
    /// The config file or stdin, with the position of every key.
    File(Arc<ConfigText>),
    /// A command-line flag as written (`--kv-heads`, `--set softcap`, `--env NVTE_FLASH_ATTN`).
    Flag(String),
}

impl Source {
    /// The provenance word (`shell`, `preset`, `config`, `flag`).
    pub fn word(&self) -> &'static str {
        match self {
            Source::Shell(_) => "shell",
            Source::Preset(_) => "preset",
            Source::File(_) => "config",
            Source::Flag(_) => "flag",
        }
    }

    /// Where the value at `path` was given: `file:line:col`, the flag, the preset, `$VAR`.
    pub fn locate(&self, path: &str) -> String {
        match self {
            Source::Shell(var) => format!("${var} (shell environment; --no-env ignores it)"),
            Source::Preset(name) => format!("preset `{name}`"),
            Source::File(text) => text.locate(path).unwrap_or_else(|| text.name.clone()),
            Source::Flag(flag) => flag.clone(),
        }
    }
}

/// Where each input key of a merged config came from: (dotted key, source word), one entry
/// per leaf value (a scalar, a list, `window_size`), in the order they were last set.
pub type Sources = Vec<(String, &'static str)>;

/// A merged config object and where each of its keys came from.
#[derive(Clone, Debug, Default)]
pub struct Input {
    pub json: Json,
    /// (dotted key, source), one per leaf value, in the order they were last set.
    pub sources: Vec<(String, Source)>,
}

impl Input {
    /// Records that `value` was written at `path` by `source`. `replace`: the write replaced the
    /// whole subtree at `path` (a flag); otherwise it merged into it (a preset or a file).
    fn record(&mut self, path: &str, value: &Json, source: &Source, replace: bool) {
        let under = |k: &str, p: &str| {
            k.len() > p.len() && k.starts_with(p) && k.as_bytes()[p.len()] == b'.'
        };
        if replace {
            self.sources.retain(|(k, _)| k != path && !under(k, path));
        }
        match value.as_object() {
            Some(members) if !path.ends_with("window_size") => {
                for (k, v) in members {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    if p != "id" {
                        self.record(&p, v, source, false);
                    }
                }
            }
            _ if path.is_empty() => {}
            _ => {
                // A leaf replaces what was at, under or above it (an object replaced a scalar).
                self.sources
                    .retain(|(k, _)| k != path && !under(k, path) && !under(path, k));
                self.sources.push((path.to_string(), source.clone()));
            }
        }
    }

    /// Where the value at `path` (`num_gqa_groups`, `window_size.left`, `window_size[1]`) was
    /// given: its own source, else its closest ancestor's, else a member's.
    pub fn locate(&self, path: &str) -> Option<String> {
        let top = path.split('[').next().unwrap_or(path);
        let mut p = top;
        loop {
            if let Some((_, s)) = self.sources.iter().rev().find(|(k, _)| k == p) {
                return Some(s.locate(path));
            }
            match p.rfind('.') {
                Some(i) => p = &p[..i],
                None => break,
            }
        }
        self.sources
            .iter()
            .rev()
            .find(|(k, _)| k.starts_with(top) && k.as_bytes().get(top.len()) == Some(&b'.'))
            .map(|(_, s)| s.locate(path))
    }

    /// The facts of `schema`'s family; an error says where the offending value was given.
    pub fn facts_of(&self, schema: &'static Schema) -> Result<Facts, InputError> {
        schema.read(&self.json).map_err(|e| {
            let at = self.locate(&e.path);
            e.at(at)
        })
    }

    /// Provenance as (input key, source word) pairs (the explanation's `provenance`).
    pub fn provenance(&self) -> Sources {
        self.sources
            .iter()
            .map(|(k, s)| (k.clone(), s.word()))
            .collect()
    }

    /// The environment variables that came from the shell, with their values.
    pub fn shell_values(&self) -> Vec<(String, String)> {
        self.sources
            .iter()
            .filter_map(|(k, s)| match s {
                Source::Shell(var) => Some((
                    var.clone(),
                    self.json
                        .pointer(&format!("/{}", k.replace('.', "/")))
                        .and_then(Json::as_str)
                        .unwrap_or_default()
                        .to_string(),
                )),
                _ => None,
            })
            .collect()
    }
}

/// The environment variables a family's selector reads (its `env.*` facts): NVTE_* for te,
/// TORCH_CUDNN_SDPA_* for torch.
pub fn env_variables(schema: &'static Schema) -> impl Iterator<Item = &'static str> {
    schema
        .fields
        .iter()
        .filter_map(|d| d.path.strip_prefix("env."))
}

fn flag_error(flag: &str, path: &str, message: impl Into<String>) -> InputError {
    InputError::new(path, message).at(Some(flag.to_string()))
}

/// A float flag's value as JSON. NaN and infinities are refused here: JSON has no spelling for
/// them (they would become null and be reported as a missing value).
fn finite(flag: &str, path: &str, x: f64) -> Result<Json, InputError> {
    if x.is_finite() {
        Ok(json!(x))
    } else {
        Err(
            flag_error(flag, path, format!("must be a finite number, found {x}"))
                .kind(InputErrorKind::Domain),
        )
    }
}

impl ConfigArgs {
    /// The family-specific flags given on the command line.
    fn given_flags(&self) -> Vec<&'static str> {
        let given = [
            ("--preset", self.preset.is_some()),
            ("--layout", self.layout.is_some()),
            ("--mask", self.mask.is_some()),
            ("--window", self.window.is_some()),
            ("--cp-comm-type", self.cp_comm_type.is_some()),
            ("--cp-size", self.cp_size.is_some()),
            ("--softcap", self.softcap.is_some()),
            ("--softmax-type", self.softmax_type.is_some()),
            ("--inference", self.inference),
            ("--probe", !self.probes.is_empty()),
            ("--attn-mask", self.attn_mask.is_some()),
            ("--causal", self.causal),
            ("--dropout", self.dropout.is_some()),
            ("--enable-gqa", self.enable_gqa),
            ("--requires-grad", self.requires_grad),
            ("--tensor-layout", self.tensor_layout.is_some()),
            ("--disable", !self.disable.is_empty()),
        ];
        given.iter().filter(|(_, g)| *g).map(|(f, _)| *f).collect()
    }

    /// Refuses flags of another pack family than `family` (they would set facts its packs do
    /// not have); the error is located at the flag.
    pub fn check_family(&self, family: &str) -> Result<(), InputError> {
        for flag in self.given_flags() {
            let Some((owner, _)) = FAMILY_FLAGS.iter().find(|(_, flags)| flags.contains(&flag))
            else {
                continue;
            };
            if *owner != family {
                let whose = match *owner {
                    "te" => "a TransformerEngine flag",
                    _ => "a PyTorch SDPA flag",
                };
                return Err(flag_error(
                    flag,
                    "",
                    format!(
                        "{flag} is {whose} (pack family `{owner}`); this pack's family is \
                         `{family}`, whose facts it does not set. Set {family} facts with \
                         --set PATH=JSON or a config file (list them with `attn-policy facts \
                         --pack PACK`)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The merged input (before typing) for a pack of `schema`'s family: the shell environment
    /// (unless --no-env), a preset, a file, then flags mapped onto the family's facts, each
    /// overriding the previous. Flags of another family are refused.
    pub fn input_for(&self, schema: &'static Schema) -> Result<Input, InputError> {
        let family = schema.family;
        self.check_family(family)?;
        let mut input = Input::default();
        let mut obj = Map::new();
        if !self.no_env {
            for var in env_variables(schema) {
                if let Some(value) = std::env::var_os(var) {
                    let value = Json::String(value.to_string_lossy().into_owned());
                    let path = format!("env.{var}");
                    input.record(&path, &value, &Source::Shell(var.to_string()), true);
                    insert_path(&mut obj, &path, value);
                }
            }
        }
        if let Some(name) = &self.preset {
            let p = presets::find(name).ok_or_else(|| {
                flag_error(
                    "--preset",
                    "",
                    format!("unknown preset `{name}`; see `attn-policy presets`"),
                )
                .suggest(attn_policy::facts::did_you_mean(name, presets::names()))
            })?;
            if p.family != family {
                return Err(flag_error(
                    "--preset",
                    "",
                    format!(
                        "preset `{name}` sets facts of pack family `{}`; this pack's family is \
                         `{family}` (its presets: {})",
                        p.family,
                        presets::of_family(family)
                            .map(|p| p.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            let config = (p.config)();
            input.record("", &config, &Source::Preset(name.clone()), false);
            merge(&mut obj, &config);
        }
        if let Some(path) = &self.config {
            let text = read_config(path)?;
            let value = text.value.clone();
            input.record("", &value, &Source::File(Arc::new(text)), false);
            merge(&mut obj, &value);
        }
        let mut set = |flag: &str, k: &str, v: Json| {
            input.record(k, &v, &Source::Flag(flag.to_string()), true);
            insert_path(&mut obj, k, v)
        };
        if family == "torch" {
            self.torch_flags(&mut set)?;
        } else {
            self.te_flags(&mut set)?;
        }
        for s in &self.sets {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| flag_error("--set", "", format!("expects PATH=JSON, got `{s}`")))?;
            if k.trim().split('.').any(str::is_empty) {
                return Err(flag_error(
                    "--set",
                    "",
                    format!(
                        "expects PATH=JSON with a fact path such as softcap or \
                         window_size.left before `=`, got `{s}`"
                    ),
                ));
            }
            let value: Json =
                serde_json::from_str(v).unwrap_or_else(|_| Json::String(v.to_string()));
            set(&format!("--set {}", k.trim()), k.trim(), value);
        }
        for s in &self.envs {
            let (k, v) = s
                .split_once('=')
                .filter(|(k, _)| !k.trim().is_empty())
                .ok_or_else(|| flag_error("--env", "", format!("expects NAME=VALUE, got `{s}`")))?;
            set(
                &format!("--env {}", k.trim()),
                &format!("env.{}", k.trim()),
                json!(v.trim()),
            );
        }
        for s in &self.probes {
            let (k, v) = s
                .split_once('=')
                .filter(|(k, _)| !k.trim().is_empty())
                .ok_or_else(|| {
                    flag_error("--probe", "", format!("expects NAME=true|false, got `{s}`"))
                })?;
            let flag = format!("--probe {}", k.trim());
            let b = match v.trim() {
                "true" | "yes" | "1" => Json::Bool(true),
                "false" | "no" | "0" => Json::Bool(false),
                "unknown" | "null" => Json::Null,
                other => {
                    return Err(flag_error(
                        &flag,
                        &format!("probe.{}", k.trim()),
                        format!("expected true, false or unknown, got `{other}`"),
                    ));
                }
            };
            set(&flag, &format!("probe.{}", k.trim()), b);
        }
        input.json = Json::Object(obj);
        Ok(input)
    }

    /// `--head-dim` (both dims), `--head-dim-qk`, `--head-dim-v`: the same fact names in
    /// every family.
    fn head_dim_flags(&self, set: &mut dyn FnMut(&str, &str, Json)) {
        if let Some(d) = self.head_dim {
            set("--head-dim", "head_dim_qk", json!(d));
            set("--head-dim", "head_dim_v", json!(d));
        }
        if let Some(d) = self.head_dim_qk {
            set("--head-dim-qk", "head_dim_qk", json!(d));
        }
        if let Some(d) = self.head_dim_v {
            set("--head-dim-v", "head_dim_v", json!(d));
        }
    }

    /// `--batch`, `--heads`, `--kv-heads` and the sequence lengths, under a family's fact
    /// names (`counts`: batch, query heads, KV heads; `seqlens`: query, key/value).
    fn size_flags(
        &self,
        set: &mut dyn FnMut(&str, &str, Json),
        counts: [&str; 3],
        seqlens: [&str; 2],
    ) {
        for (flag, key, value) in [
            ("--batch", counts[0], self.batch),
            ("--heads", counts[1], self.heads),
            ("--kv-heads", counts[2], self.kv_heads),
        ] {
            if let Some(v) = value {
                set(flag, key, json!(v));
            }
        }
        if let Some(s) = self.seqlen {
            set("--seqlen", seqlens[0], json!(s));
            set("--seqlen", seqlens[1], json!(s));
        }
        if let Some(s) = self.seqlen_q {
            set("--seqlen-q", seqlens[0], json!(s));
        }
        if let Some(s) = self.seqlen_kv {
            set("--seqlen-kv", seqlens[1], json!(s));
        }
    }

    /// The te family's flags: TransformerEngine's `AttentionParams` names.
    fn te_flags(&self, set: &mut dyn FnMut(&str, &str, Json)) -> Result<(), InputError> {
        self.head_dim_flags(set);
        if let Some(sm) = self.sm {
            set(
                "--sm",
                "device_compute_capability",
                json!([sm / 10, sm % 10]),
            );
        }
        if let Some(v) = &self.cudnn {
            set("--cudnn", "cudnn_version", json!(v));
        }
        if let Some(v) = &self.dtype {
            set("--dtype", "qkv_dtype", json!(v));
        }
        if let Some(v) = &self.layout {
            set("--layout", "qkv_layout", json!(v));
        }
        if let Some(v) = &self.mask {
            set("--mask", "attn_mask_type", json!(v));
        }
        if let Some(w) = &self.window {
            let parts: Vec<&str> = w.split(',').map(str::trim).collect();
            let parsed: Option<Vec<i64>> = parts.iter().map(|p| p.parse().ok()).collect();
            match parsed {
                Some(v) if v.len() == 2 => set("--window", "window_size", json!(v)),
                _ if w == "none" || w == "null" => set("--window", "window_size", Json::Null),
                _ => {
                    return Err(flag_error(
                        "--window",
                        "window_size",
                        format!("expects LEFT,RIGHT (e.g. 128,0 or -1,-1) or none, got `{w}`"),
                    ));
                }
            }
        }
        self.size_flags(
            set,
            ["batch_size", "num_heads", "num_gqa_groups"],
            ["max_seqlen_q", "max_seqlen_kv"],
        );
        if let Some(t) = &self.cp_comm_type {
            set("--cp-comm-type", "context_parallel", json!(true));
            set("--cp-comm-type", "cp_comm_type", json!(t));
            if self.cp_size.is_none() {
                let size = if t == "a2a+p2p" { 4 } else { 2 };
                set("--cp-comm-type", "cp_size", json!(size));
                if t == "a2a+p2p" {
                    set("--cp-comm-type", "cp_size_a2a", json!(2));
                }
            }
        }
        if let Some(n) = self.cp_size {
            set("--cp-size", "cp_size", json!(n));
            set("--cp-size", "context_parallel", json!(n > 1));
        }
        if let Some(c) = self.softcap {
            set("--softcap", "softcap", finite("--softcap", "softcap", c)?);
        }
        if let Some(t) = &self.softmax_type {
            set("--softmax-type", "softmax_type", json!(t));
        }
        if self.inference {
            set("--inference", "is_training", json!(false));
        }
        if self.deterministic {
            set("--deterministic", "deterministic", json!(true));
        }
        Ok(())
    }

    /// The torch family's flags: PyTorch SDPA's `sdp_params` and process state.
    fn torch_flags(&self, set: &mut dyn FnMut(&str, &str, Json)) -> Result<(), InputError> {
        self.head_dim_flags(set);
        if let Some(sm) = self.sm {
            set("--sm", "sm", json!(sm));
        }
        if let Some(v) = &self.cudnn {
            set("--cudnn", "cudnn_version", json!(v));
        }
        if let Some(v) = &self.dtype {
            set("--dtype", "dtype", json!(v));
        }
        self.size_flags(
            set,
            ["batch", "heads_q", "heads_kv"],
            ["seqlen_q", "seqlen_kv"],
        );
        if self.deterministic {
            set("--deterministic", "deterministic", json!(true));
        }
        if let Some(m) = &self.attn_mask {
            let kind = if m == "none" { Json::Null } else { json!(m) };
            set("--attn-mask", "attn_mask", kind);
        }
        if self.causal {
            set("--causal", "is_causal", json!(true));
        }
        if let Some(p) = self.dropout {
            set(
                "--dropout",
                "dropout_p",
                finite("--dropout", "dropout_p", p)?,
            );
        }
        if self.enable_gqa {
            set("--enable-gqa", "enable_gqa", json!(true));
        }
        if self.requires_grad {
            set("--requires-grad", "requires_grad", json!(true));
        }
        if let Some(l) = &self.tensor_layout {
            set("--tensor-layout", "layout", json!(l));
        }
        for b in &self.disable {
            let fact = match b.as_str() {
                "flash" => "flash_sdp_enabled",
                "efficient" | "mem_efficient" => "mem_efficient_sdp_enabled",
                "math" => "math_sdp_enabled",
                "cudnn" => "cudnn_sdp_enabled",
                other => {
                    return Err(flag_error(
                        &format!("--disable {other}"),
                        "",
                        "expected flash, efficient, math or cudnn",
                    )
                    .kind(InputErrorKind::Domain));
                }
            };
            set(&format!("--disable {b}"), fact, json!(false));
        }
        Ok(())
    }
}

/// Reads a config file (`-`: stdin) as a config object: JSON or YAML, or a whole conformance
/// record (its `config`). Empty text and text that is not a mapping are refused by name.
fn read_config(path: &std::path::Path) -> Result<ConfigText, InputError> {
    let (name, text) = if path.as_os_str() == "-" {
        let mut s = String::new();
        let mut stdin = std::io::stdin();
        // A user who typed `explain -` at a prompt otherwise sees nothing happen.
        if std::io::IsTerminal::is_terminal(&stdin) {
            eprintln!("reading a config (JSON or YAML) from stdin; end it with Ctrl-D");
        }
        stdin
            .read_to_string(&mut s)
            .map_err(|e| flag_error("<stdin>", "", format!("cannot read stdin: {e}")))?;
        ("<stdin>".to_string(), s)
    } else {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| flag_error(&name, "", format!("cannot read it: {e}")))?;
        (name, text)
    };
    // Empty text parses as YAML's null: say what is wrong instead of "found null".
    if text.trim().is_empty() {
        return Err(InputError::new(
            "",
            "is empty; expected a config object (JSON or YAML), e.g. {\"head_dim_qk\": 128}",
        )
        .kind(InputErrorKind::Syntax)
        .at(Some(name)));
    }
    // A whole conformance record is accepted too: its `config` is the input (with a
    // PyTorch record's `torch` device object).
    let text = ConfigText::parse(&name, &text)?.into_config();
    if !text.value.is_object() {
        // Text that is neither JSON nor YAML mapping reads as one YAML string.
        let hint = if text.value.is_string() {
            " (the text is neither a JSON object nor a YAML mapping)"
        } else {
            ""
        };
        return Err(InputError::new(
            "",
            format!(
                "expected a config object, found {}{hint}",
                kind(&text.value)
            ),
        )
        .kind(InputErrorKind::Syntax)
        .at(Some(name)));
    }
    Ok(text)
}

fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}

/// Which rule pack to use.
#[derive(Args, Debug, Clone)]
pub struct PackArgs {
    /// Embedded pack: te (TransformerEngine 2.20.2 + FROST), te@2.18.0, te@2.19.0, te@2.20.2
    /// (one TransformerEngine release each; te@2.20.2 is te), te@auto (the pack of the
    /// installed release, from --te-version or the te_version fact), native (this project's
    /// executors) or torch (PyTorch 2.11 SDPA on CUDA).
    #[arg(long, default_value = "te", value_name = "NAME")]
    pub pack: String,
    #[command(flatten)]
    pub te: TeVersionArg,
    /// Load the pack from a folder holding pack.yaml instead of an embedded one.
    #[arg(long, value_name = "DIR")]
    pub rules: Option<PathBuf>,
    /// Site policy overlay file(s): extra rules in their own layer (repeatable).
    #[arg(long, value_name = "FILE")]
    pub overlay: Vec<PathBuf>,
    /// Pure TransformerEngine parity: switch off the `guard` layer (rules for TE's crash paths).
    #[arg(long)]
    pub parity: bool,
}

impl PackArgs {
    /// The pack these flags name, checked against this build's executor catalogue.
    pub fn spec(&self) -> PackSpec {
        let spec = match &self.rules {
            Some(dir) => PackSpec::dir(dir),
            None => PackSpec::embedded(&self.pack),
        };
        spec.with_overlays(self.overlay.iter().cloned())
            .with_parity(self.parity)
            .with_catalogue(catalogue())
            .with_installed_release(self.te.te_version.clone())
    }

    /// Loads the pack; on failure prints the diagnostics and returns exit code 2. The warning
    /// of a `te@auto` pack chosen for a release without its own goes to stderr.
    pub fn load(&self, color: bool) -> Result<Policy, i32> {
        load_spec_warned(&self.spec(), color)
    }

    /// Loads the pack and reads the configuration for it (once: stdin is read once), see
    /// [`load_with_config`].
    pub fn load_with_config(
        &self,
        config: &ConfigArgs,
        color: bool,
        warn: bool,
    ) -> Result<(Policy, Input), i32> {
        load_with_config(
            self.spec(),
            self.te.te_version.as_deref(),
            config,
            color,
            warn,
        )
    }
}

/// `--te-version`, shared by every command that names packs.
#[derive(Args, Debug, Clone, Default)]
pub struct TeVersionArg {
    /// The installed TransformerEngine release (the te_version fact; where the command reads a
    /// config, `--set te_version=X` and a config's `te_version` give it too): a pack named
    /// te@auto decides with its pack, or the nearest older one with a warning; before 2.18.0 it
    /// is refused. Other packs ignore it.
    #[arg(long, value_name = "VERSION")]
    pub te_version: Option<String>,
}

/// How the te_version fact is given, for the error of a `te@auto` without one.
const TE_VERSION_HINT: &str = "give it with --te-version X, `--set te_version=X` or \
    `te_version` in the config file, e.g. --te-version 2.19.0";

/// Whether two spellings name the same release (`2.19.0` and `2.19`; text that is not a
/// version only as itself).
fn same_release(a: &str, b: &str) -> bool {
    use attn_policy::lang::Version;
    match (Version::parse(a), Version::parse(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a.trim() == b.trim(),
    }
}

/// Prints the warning of a `te@auto` pack chosen for a release without a pack of its own to
/// stderr (once per command).
pub fn warn_auto(policy: &Policy) {
    if let Some(w) = policy.auto.as_ref().and_then(|a| a.warning.as_ref()) {
        eprintln!("warning: {w}");
    }
}

/// Loads `spec`'s pack and reads `config` for it. For `te@auto` the config is read first (as
/// te-family input) and its `te_version` fact, or `flag` (`--te-version`), chooses the pack;
/// the two must agree when both are given. `warn`: print the `te@auto` warning to stderr.
/// Errors are printed; the result is the exit code (2).
pub fn load_with_config(
    spec: PackSpec,
    flag: Option<&str>,
    config: &ConfigArgs,
    color: bool,
    warn: bool,
) -> Result<(Policy, Input), i32> {
    if !spec.is_auto() {
        let policy = load_spec(&spec, color)?;
        let input = config.input_for(policy.schema).map_err(super::fail)?;
        if warn {
            warn_auto(&policy);
        }
        return Ok((policy, input));
    }
    let te = &*attn_policy::facts::te::TE;
    let input = config.input_for(te).map_err(super::fail)?;
    let given = te
        .selection_value(&input.json, "te_version")
        .map_err(|e| super::fail(e.at(input.locate("te_version"))))?;
    let version = match (flag, given) {
        (Some(f), Some(g)) if !same_release(f, &g) => {
            let at = input.locate("te_version").unwrap_or_default();
            return Err(super::fail(format!(
                "--te-version {f} and te_version `{g}` ({at}) disagree; give the installed \
                 TransformerEngine release once"
            )));
        }
        (Some(f), _) => Some(f.to_string()),
        (None, g) => g,
    };
    let policy = load_spec(&spec.with_installed_release(version), color)?;
    if warn {
        warn_auto(&policy);
    }
    Ok((policy, input))
}

/// This build's executor catalogue (every executor chain is checked against it).
pub fn catalogue() -> std::sync::Arc<attn_policy::ExecutorCatalogue> {
    static CATALOGUE: std::sync::LazyLock<std::sync::Arc<attn_policy::ExecutorCatalogue>> =
        std::sync::LazyLock::new(|| {
            std::sync::Arc::new(attn_policy_adapters::catalogue::catalogue())
        });
    CATALOGUE.clone()
}

/// [`load_spec`], then the `te@auto` warning (if any) to stderr.
pub fn load_spec_warned(spec: &PackSpec, color: bool) -> Result<Policy, i32> {
    let policy = load_spec(spec, color)?;
    warn_auto(&policy);
    Ok(policy)
}

/// Loads a pack spec; on failure prints the diagnostics (or the error) and returns exit code 2.
pub fn load_spec(spec: &PackSpec, color: bool) -> Result<Policy, i32> {
    spec.load().map_err(|e| {
        eprint!("{}", with_hint(e).render(color));
        2
    })
}

/// The error with how the command line gives what it lacks (`te@auto` without a release:
/// `--te-version X`, ...).
pub fn with_hint(e: PackError) -> PackError {
    match e {
        PackError::Release(ReleaseError::NoInstalledRelease {
            requested,
            upstream,
            hint: None,
        }) => PackError::Release(ReleaseError::NoInstalledRelease {
            requested,
            upstream,
            hint: Some(TE_VERSION_HINT.to_string()),
        }),
        e => e,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Default)]
pub enum Format {
    /// A compact table (colour only on a terminal).
    #[default]
    Human,
    /// The explain/v1 JSON document (docs/decision-json.md).
    Json,
    /// TransformerEngine's return tuple as a JSON object.
    Te,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Default)]
pub enum ColorChoice {
    #[default]
    Auto,
    Always,
    Never,
}

#[derive(Args, Debug, Clone)]
pub struct OutputArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
    /// Shorthand for --format json.
    #[arg(long)]
    pub json: bool,
    /// Colour: auto (terminal only, honours NO_COLOR), always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
}

impl OutputArgs {
    pub fn format(&self) -> Format {
        if self.json { Format::Json } else { self.format }
    }

    pub fn color(&self, stream_is_tty: bool) -> bool {
        match self.color {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => stream_is_tty && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    pub fn stdout_color(&self) -> bool {
        self.color(std::io::stdout().is_terminal())
    }

    pub fn stderr_color(&self) -> bool {
        self.color(std::io::stderr().is_terminal())
    }
}

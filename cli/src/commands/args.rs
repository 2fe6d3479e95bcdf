//! Arguments shared by subcommands: where the config comes from, which pack, how to print.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde_json::{Map, Value as Json, json};

use attn_policy::facts::{Facts, presets};
use attn_policy::{PackSpec, Policy};

/// The attention configuration: a preset, a file, then flags, each overriding the previous.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// Config object (JSON or YAML, the `config` format of conformance records); `-` reads stdin.
    pub config: Option<PathBuf>,
    /// Start from a named preset (see `attn-policy presets`).
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// Set head_dim_qk and head_dim_v.
    #[arg(long, value_name = "N")]
    pub head_dim: Option<i64>,
    #[arg(long, value_name = "N")]
    pub head_dim_qk: Option<i64>,
    #[arg(long, value_name = "N")]
    pub head_dim_v: Option<i64>,
    /// GPU architecture as sm number: 80, 89, 90, 100, 103, 120.
    #[arg(long, value_name = "SM")]
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
    #[arg(long, value_name = "N")]
    pub batch: Option<i64>,
    /// Query heads (num_heads).
    #[arg(long, value_name = "N")]
    pub heads: Option<i64>,
    /// Key/value heads (num_gqa_groups).
    #[arg(long, value_name = "N")]
    pub kv_heads: Option<i64>,
    /// Set max_seqlen_q and max_seqlen_kv.
    #[arg(long, value_name = "N")]
    pub seqlen: Option<i64>,
    #[arg(long, value_name = "N")]
    pub seqlen_q: Option<i64>,
    #[arg(long, value_name = "N")]
    pub seqlen_kv: Option<i64>,
    /// Context-parallel algorithm: p2p, all_gather, a2a, a2a+p2p (turns context_parallel on).
    #[arg(long, value_name = "TYPE")]
    pub cp_comm_type: Option<String>,
    /// Context-parallel group size (turns context_parallel on when > 1).
    #[arg(long, value_name = "N")]
    pub cp_size: Option<i64>,
    /// Inference (is_training = false).
    #[arg(long)]
    pub inference: bool,
    /// Require deterministic algorithms.
    #[arg(long)]
    pub deterministic: bool,
    /// Set any fact: PATH=JSON, e.g. --set softcap=30 --set 'flash_attn_versions.v3="3.0.0"'.
    #[arg(long = "set", value_name = "PATH=JSON")]
    pub sets: Vec<String>,
    /// Set an environment switch: NAME=VALUE, e.g. --env NVTE_FLASH_ATTN=0.
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub envs: Vec<String>,
    /// Answer a probe fact: NAME=true|false, e.g. --probe fused_attn_graph=true.
    #[arg(long = "probe", value_name = "NAME=BOOL")]
    pub probes: Vec<String>,
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

/// Flags that set facts of one pack family only, by family.
const FAMILY_FLAGS: &[(&str, &[&str])] = &[
    (
        "te",
        &[
            "--preset",
            "--layout",
            "--mask",
            "--window",
            "--cp-comm-type",
            "--cp-size",
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

/// Where each input key of a merged config came from: (dotted key, source word), one entry
/// per leaf value (a scalar, a list, `window_size`), in the order they were last set.
pub type Sources = Vec<(String, &'static str)>;

/// Records that `value` was written at `path` by `word`. `replace`: the write replaced the
/// whole subtree at `path` (a flag); otherwise it merged into it (a preset or a file).
fn record(sources: &mut Sources, path: &str, value: &Json, word: &'static str, replace: bool) {
    let under =
        |k: &str, p: &str| k.len() > p.len() && k.starts_with(p) && k.as_bytes()[p.len()] == b'.';
    if replace {
        sources.retain(|(k, _)| k != path && !under(k, path));
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
                    record(sources, &p, v, word, false);
                }
            }
        }
        _ if path.is_empty() => {}
        _ => {
            // A leaf replaces what was at, under or above it (an object replaced a scalar).
            sources.retain(|(k, _)| k != path && !under(k, path) && !under(path, k));
            sources.push((path.to_string(), word));
        }
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
    /// not have).
    fn check_family(&self, family: &str) -> Result<(), String> {
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
                return Err(format!(
                    "{flag} is {whose} (pack family `{owner}`); this pack's family is \
                     `{family}`, whose facts it does not set. Set {family} facts with \
                     --set PATH=JSON or a config file (list them with `attn-policy facts --pack \
                     PACK`)"
                ));
            }
        }
        Ok(())
    }

    /// The merged config object for a pack of `family`, its flags mapped onto that family's
    /// facts; flags of another family are refused.
    pub fn to_json_for(&self, family: &str) -> Result<Json, String> {
        self.check_family(family)?;
        if family != "torch" {
            return self.to_json();
        }
        let mut obj = Map::new();
        self.merge_file(&mut obj)?;
        let mut set = |k: &str, v: Json| insert_path(&mut obj, k, v);
        if let Some(d) = self.head_dim {
            set("head_dim_qk", json!(d));
            set("head_dim_v", json!(d));
        }
        if let Some(d) = self.head_dim_qk {
            set("head_dim_qk", json!(d));
        }
        if let Some(d) = self.head_dim_v {
            set("head_dim_v", json!(d));
        }
        if let Some(sm) = self.sm {
            set("sm", json!(sm));
        }
        if let Some(v) = &self.cudnn {
            set("cudnn_version", json!(v));
        }
        if let Some(v) = &self.dtype {
            set("dtype", json!(v));
        }
        for (flag, key) in [
            (self.batch, "batch"),
            (self.heads, "heads_q"),
            (self.kv_heads, "heads_kv"),
        ] {
            if let Some(v) = flag {
                set(key, json!(v));
            }
        }
        if let Some(s) = self.seqlen {
            set("seqlen_q", json!(s));
            set("seqlen_kv", json!(s));
        }
        if let Some(s) = self.seqlen_q {
            set("seqlen_q", json!(s));
        }
        if let Some(s) = self.seqlen_kv {
            set("seqlen_kv", json!(s));
        }
        if self.deterministic {
            set("deterministic", json!(true));
        }
        if let Some(m) = &self.attn_mask {
            let kind = if m == "none" { Json::Null } else { json!(m) };
            set("attn_mask", kind);
        }
        if self.causal {
            set("is_causal", json!(true));
        }
        if let Some(p) = self.dropout {
            set("dropout_p", json!(p));
        }
        if self.enable_gqa {
            set("enable_gqa", json!(true));
        }
        if self.requires_grad {
            set("requires_grad", json!(true));
        }
        if let Some(l) = &self.tensor_layout {
            set("layout", json!(l));
        }
        for b in &self.disable {
            let fact = match b.as_str() {
                "flash" => "flash_sdp_enabled",
                "efficient" | "mem_efficient" => "mem_efficient_sdp_enabled",
                "math" => "math_sdp_enabled",
                "cudnn" => "cudnn_sdp_enabled",
                other => {
                    return Err(format!(
                        "--disable {other}: expected flash, efficient, math or cudnn"
                    ));
                }
            };
            set(fact, json!(false));
        }
        self.apply_sets_and_envs(&mut obj)?;
        Ok(Json::Object(obj))
    }

    /// The config file (or stdin), merged into `obj`.
    fn merge_file(&self, obj: &mut Map<String, Json>) -> Result<(), String> {
        if let Some(path) = &self.config {
            let text = if path.as_os_str() == "-" {
                let mut s = String::new();
                std::io::stdin()
                    .read_to_string(&mut s)
                    .map_err(|e| format!("cannot read stdin: {e}"))?;
                s
            } else {
                std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?
            };
            let value: Json = match serde_json::from_str(&text) {
                Ok(v) => v,
                Err(json_err) => serde_saphyr::from_str(&text).map_err(|e| {
                    format!(
                        "{}: neither JSON ({json_err}) nor YAML ({})",
                        path.display(),
                        e.without_snippet()
                    )
                })?,
            };
            // Accept a whole conformance record too (a PyTorch record's `torch` object with it).
            let device = value.get("torch").cloned();
            let mut value = value.get("config").cloned().unwrap_or(value);
            if let (Some(torch), Some(cfg)) = (device, value.as_object_mut()) {
                cfg.entry("torch").or_insert(torch);
            }
            if !value.is_object() {
                return Err(format!("{}: expected a config object", path.display()));
            }
            merge(obj, &value);
        }
        Ok(())
    }

    /// `--set`, `--env` (and, for the te family, `--probe`) into `obj`.
    fn apply_sets_and_envs(&self, obj: &mut Map<String, Json>) -> Result<(), String> {
        let mut set = |k: &str, v: Json| insert_path(obj, k, v);
        for s in &self.sets {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| format!("--set expects PATH=JSON, got `{s}`"))?;
            let value: Json =
                serde_json::from_str(v).unwrap_or_else(|_| Json::String(v.to_string()));
            set(k.trim(), value);
        }
        for s in &self.envs {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| format!("--env expects NAME=VALUE, got `{s}`"))?;
            set(&format!("env.{}", k.trim()), json!(v.trim()));
        }
        Ok(())
    }

    /// The merged config object (before typing).
    pub fn to_json(&self) -> Result<Json, String> {
        self.to_json_with_sources().map(|(json, _)| json)
    }

    /// The merged config object and where each of its keys came from: `preset`, `config` (the
    /// file or stdin) or `flag`.
    pub fn to_json_with_sources(&self) -> Result<(Json, Sources), String> {
        let mut obj = Map::new();
        let mut sources = Sources::new();
        if let Some(name) = &self.preset {
            let p = presets::find(name).ok_or_else(|| {
                let hint = attn_policy::facts::did_you_mean(name, presets::names())
                    .map(|h| format!(" (did you mean `{h}`?)"))
                    .unwrap_or_default();
                format!("unknown preset `{name}`{hint}; see `attn-policy presets`")
            })?;
            let config = (p.config)();
            record(&mut sources, "", &config, "preset", false);
            merge(&mut obj, &config);
        }
        if let Some(path) = &self.config {
            let text = if path.as_os_str() == "-" {
                let mut s = String::new();
                std::io::stdin()
                    .read_to_string(&mut s)
                    .map_err(|e| format!("cannot read stdin: {e}"))?;
                s
            } else {
                std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?
            };
            let value: Json = match serde_json::from_str(&text) {
                Ok(v) => v,
                Err(json_err) => serde_saphyr::from_str(&text).map_err(|e| {
                    format!(
                        "{}: neither JSON ({json_err}) nor YAML ({})",
                        path.display(),
                        e.without_snippet()
                    )
                })?,
            };
            // Accept a whole conformance record too.
            let value = value.get("config").cloned().unwrap_or(value);
            if !value.is_object() {
                return Err(format!("{}: expected a config object", path.display()));
            }
            record(&mut sources, "", &value, "config", false);
            merge(&mut obj, &value);
        }
        let mut set = |k: &str, v: Json| {
            record(&mut sources, k, &v, "flag", true);
            insert_path(&mut obj, k, v)
        };
        if let Some(d) = self.head_dim {
            set("head_dim_qk", json!(d));
            set("head_dim_v", json!(d));
        }
        if let Some(d) = self.head_dim_qk {
            set("head_dim_qk", json!(d));
        }
        if let Some(d) = self.head_dim_v {
            set("head_dim_v", json!(d));
        }
        if let Some(sm) = self.sm {
            set("device_compute_capability", json!([sm / 10, sm % 10]));
        }
        if let Some(v) = &self.cudnn {
            set("cudnn_version", json!(v));
        }
        if let Some(v) = &self.dtype {
            set("qkv_dtype", json!(v));
        }
        if let Some(v) = &self.layout {
            set("qkv_layout", json!(v));
        }
        if let Some(v) = &self.mask {
            set("attn_mask_type", json!(v));
        }
        if let Some(w) = &self.window {
            let parts: Vec<&str> = w.split(',').map(str::trim).collect();
            let parsed: Option<Vec<i64>> = parts.iter().map(|p| p.parse().ok()).collect();
            match parsed {
                Some(v) if v.len() == 2 => set("window_size", json!(v)),
                _ if w == "none" || w == "null" => set("window_size", Json::Null),
                _ => {
                    return Err(format!(
                        "--window expects LEFT,RIGHT (e.g. 128,0 or -1,-1), got `{w}`"
                    ));
                }
            }
        }
        for (flag, key) in [
            (self.batch, "batch_size"),
            (self.heads, "num_heads"),
            (self.kv_heads, "num_gqa_groups"),
        ] {
            if let Some(v) = flag {
                set(key, json!(v));
            }
        }
        if let Some(s) = self.seqlen {
            set("max_seqlen_q", json!(s));
            set("max_seqlen_kv", json!(s));
        }
        if let Some(s) = self.seqlen_q {
            set("max_seqlen_q", json!(s));
        }
        if let Some(s) = self.seqlen_kv {
            set("max_seqlen_kv", json!(s));
        }
        if let Some(t) = &self.cp_comm_type {
            set("context_parallel", json!(true));
            set("cp_comm_type", json!(t));
            if self.cp_size.is_none() {
                set("cp_size", json!(if t == "a2a+p2p" { 4 } else { 2 }));
                if t == "a2a+p2p" {
                    set("cp_size_a2a", json!(2));
                }
            }
        }
        if let Some(n) = self.cp_size {
            set("cp_size", json!(n));
            set("context_parallel", json!(n > 1));
        }
        if self.inference {
            set("is_training", json!(false));
        }
        if self.deterministic {
            set("deterministic", json!(true));
        }
        for s in &self.sets {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| format!("--set expects PATH=JSON, got `{s}`"))?;
            let value: Json =
                serde_json::from_str(v).unwrap_or_else(|_| Json::String(v.to_string()));
            set(k.trim(), value);
        }
        for s in &self.envs {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| format!("--env expects NAME=VALUE, got `{s}`"))?;
            set(&format!("env.{}", k.trim()), json!(v.trim()));
        }
        for s in &self.probes {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| format!("--probe expects NAME=true|false, got `{s}`"))?;
            let b = match v.trim() {
                "true" | "yes" | "1" => Json::Bool(true),
                "false" | "no" | "0" => Json::Bool(false),
                "unknown" | "null" => Json::Null,
                other => {
                    return Err(format!(
                        "--probe {k}: expected true, false or unknown, got `{other}`"
                    ));
                }
            };
            set(&format!("probe.{}", k.trim()), b);
        }
        Ok((Json::Object(obj), sources))
    }

    /// The facts and where their input keys came from (see [`ConfigArgs::to_json_with_sources`]).
    pub fn facts_with_sources(&self) -> Result<(Facts, Sources), String> {
        let (json, sources) = self.to_json_with_sources()?;
        let facts = Facts::from_json(&json).map_err(|e| format!("invalid config: {e}"))?;
        Ok((facts, sources))
    }

    /// The facts of `policy`'s family with where each came from (the te family records
    /// `preset`, `config` and `flag`; other families record nothing yet).
    pub fn facts_for_with_sources(&self, policy: &Policy) -> Result<(Facts, Sources), String> {
        let family = policy.schema.family;
        let (json, sources) = if family == "te" {
            self.check_family(family)?;
            self.to_json_with_sources()?
        } else {
            (self.to_json_for(family)?, Sources::new())
        };
        let facts = policy
            .read_facts(&json)
            .map_err(|e| format!("invalid config: {e}"))?;
        Ok((facts, sources))
    }
}

/// Which rule pack to use.
#[derive(Args, Debug, Clone)]
pub struct PackArgs {
    /// Embedded pack: te (TransformerEngine 2.20.2 + FROST), native (this project's executors) or
    /// torch (PyTorch 2.11 SDPA on CUDA).
    #[arg(long, default_value = "te", value_name = "NAME")]
    pub pack: String,
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
    }

    /// Loads the pack; on failure prints the diagnostics and returns exit code 2.
    pub fn load(&self, color: bool) -> Result<Policy, i32> {
        load_spec(&self.spec(), color)
    }
}

/// This build's executor catalogue (every executor chain is checked against it).
pub fn catalogue() -> std::sync::Arc<attn_policy::ExecutorCatalogue> {
    static CATALOGUE: std::sync::LazyLock<std::sync::Arc<attn_policy::ExecutorCatalogue>> =
        std::sync::LazyLock::new(|| {
            std::sync::Arc::new(attn_policy_adapters::catalogue::catalogue())
        });
    CATALOGUE.clone()
}

/// Loads a pack spec; on failure prints the diagnostics (or the error) and returns exit code 2.
pub fn load_spec(spec: &PackSpec, color: bool) -> Result<Policy, i32> {
    spec.load().map_err(|e| {
        eprint!("{}", e.render(color));
        2
    })
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

//! `attn-policy why-not BACKEND <config>`: verified changes that would make a backend eligible.

use clap::Args;

use super::args::{ConfigArgs, PackArgs};
use attn_policy_analysis::why_not::why_not;

#[derive(Args, Debug)]
#[command(after_help = "\
Each hint is verified by deciding the changed input again. Facts the user cannot change (the
GPU, live probes) are reported, not proposed. Unanswered probes count as \"supported\".

Examples:
  attn-policy why-not FrostAttention --head-dim 260 --sm 100
  attn-policy why-not FrostAttention --preset gemma4-global-cp-p2p --window 128,0
  attn-policy why-not FlashAttention config.json --json
  attn-policy why-not flash --pack torch --head-dim 512 --heads 32 --kv-heads 8 --enable-gqa

Exit codes: 0 eligible already or hints found, 1 no verified hint, 2 bad input.")]
pub struct WhyNotArgs {
    /// Backend name as the pack spells it (e.g. FrostAttention).
    pub backend: String,
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub pack: PackArgs,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: WhyNotArgs) -> i32 {
    let (policy, input) = match a.pack.load_with_config(&a.config, false, true) {
        Ok(p) => p,
        Err(code) => return code,
    };
    // Read (and validate) the input first, so that a bad value is reported where it was given.
    if let Err(e) = input.facts_of(policy.schema) {
        return super::fail(e);
    }
    let config = input.json.clone();
    let r = match why_not(&policy, &a.backend, &config) {
        Ok(r) => r,
        Err(e) => return super::fail(e),
    };
    let switch = if r.eligible && r.selected.as_deref() != Some(r.backend.as_str()) {
        Some(switch_hint(&policy, &config, &r.backend))
    } else {
        None
    };
    if a.json {
        let mut v = serde_json::to_value(&r).expect("serialisable");
        if let Some(s) = &switch {
            v["switch"] = serde_json::json!({
                "preference": s.preference, "ahead": s.ahead, "set": s.set,
                "verified": s.verified, "text": s.text,
            });
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&v).expect("serialisable")
        );
    } else if r.eligible {
        println!(
            "{} is eligible for this input{}",
            r.backend,
            match &r.selected {
                Some(s) if *s != r.backend => format!(" (outranked by {s})"),
                _ => String::new(),
            }
        );
        if let Some(s) = &switch {
            println!("{}", s.text);
        }
    } else {
        println!("{} is not eligible for this input.", r.backend);
        for (id, reason) in &r.declined_by {
            println!("  declined by {id}: {reason}");
        }
        if r.hints.is_empty() {
            println!("no verified change makes it eligible");
        } else {
            println!("smallest changes (each verified):");
            for h in &r.hints {
                println!("  - {}", h.text);
            }
        }
        for u in &r.unchangeable {
            println!("  cannot change: {u}");
        }
    }
    if r.eligible || !r.hints.is_empty() {
        0
    } else {
        1
    }
}

/// How to get an eligible but outranked backend selected.
#[derive(Debug)]
pub struct Switch {
    /// The preference entry that ranks other backends first.
    pub preference: Option<String>,
    /// The eligible backends ranked before it there.
    pub ahead: Vec<String>,
    /// Environment settings that turn those off (`NVTE_FUSED_ATTN=0`), when every one of them
    /// has such a switch.
    pub set: Vec<String>,
    /// Deciding again with `set` applied selects the backend.
    pub verified: bool,
    pub text: String,
}

/// The backends ranked before `target` in the preference entry that applied, and the
/// environment switches (their rules that read only `env.*` facts) that turn them off,
/// verified by deciding again with the switches set (unanswered probes answered "supported",
/// as `why-not` does).
fn switch_hint(policy: &attn_policy::Policy, config: &serde_json::Value, target: &str) -> Switch {
    use attn_policy::facts::Value;
    let schema = policy.schema;
    let decide = |c: &serde_json::Value| {
        let mut f = schema.read(c).ok()?;
        for (s, d) in schema.fields.iter().enumerate() {
            if d.origin == attn_policy::facts::Origin::Probe && f.values()[s] == Value::Unknown {
                let _ = f.set_probe(d.path.trim_start_matches("probe."), Some(true));
            }
        }
        Some(policy.decide(&f))
    };
    let empty = |text: String| Switch {
        preference: None,
        ahead: Vec::new(),
        set: Vec::new(),
        verified: false,
        text,
    };
    let (Some(d), Some(t)) = (decide(config), policy.backend_index(target)) else {
        return empty(String::new());
    };
    let Some(pref) = d.preference.map(|i| &policy.preference[i as usize]) else {
        return empty(format!("no preference entry ranks {target} for this input"));
    };
    let ahead: Vec<usize> = pref
        .order
        .iter()
        .map(|&b| b as usize)
        .take_while(|&b| b != t)
        .filter(|&b| d.backends[b].status.eligible())
        .collect();
    let mut set = Vec::new();
    let mut missing = Vec::new();
    for &b in &ahead {
        let switch = policy.rules.iter().find(|r| {
            r.backend as usize == b
                && !r.when.slots.is_empty()
                && r.when
                    .slots
                    .iter()
                    .all(|&s| schema.def(s as usize).path.starts_with("env."))
        });
        match switch {
            Some(r) => set.extend(r.when.slots.iter().map(|&s| {
                format!(
                    "{}=0",
                    schema.def(s as usize).path.trim_start_matches("env.")
                )
            })),
            None => missing.push(policy.backends[b].name.clone()),
        }
    }
    set.dedup();
    let names: Vec<String> = ahead
        .iter()
        .map(|&b| policy.backends[b].name.clone())
        .collect();
    let mut verified = false;
    if missing.is_empty() && !set.is_empty() {
        let mut c = config.clone();
        for kv in &set {
            let (k, v) = kv.split_once('=').expect("NAME=0");
            if let Some(obj) = c.as_object_mut() {
                let env = obj.entry("env").or_insert_with(|| serde_json::json!({}));
                if let Some(e) = env.as_object_mut() {
                    e.insert(k.to_string(), serde_json::json!(v));
                }
            }
        }
        verified = decide(&c).is_some_and(|d2| d2.selected == Some(t as u16));
    }
    let text = if verified {
        format!(
            "select it with: {} (turns off {}, ranked first by preference `{}`; verified)",
            set.iter()
                .map(|s| format!("--env {s}"))
                .collect::<Vec<_>>()
                .join(" "),
            names.join(", "),
            pref.id
        )
    } else if !missing.is_empty() {
        format!(
            "preference `{}` ranks {} first; no environment switch turns {} off, so change the \
             pack's preference (or an overlay) to select {target}",
            pref.id,
            names.join(", "),
            missing.join(", ")
        )
    } else {
        format!(
            "preference `{}` ranks {} first; turning {} off does not select {target} here",
            pref.id,
            names.join(", "),
            if set.is_empty() {
                "them".to_string()
            } else {
                set.join(" ")
            }
        )
    };
    Switch {
        preference: Some(pref.id.clone()),
        ahead: names,
        set,
        verified,
        text,
    }
}

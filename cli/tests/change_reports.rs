//! docs/changes/: the checked-in change reports of the te packs per release (`attn-policy diff
//! OLD NEW --corpus FILE --format md`), and each upstream change the conformance README lists
//! (tests/corpora/README.md, "Upstream changes between releases") found in them.
//!
//! The diffs run over the whole configuration space and a 20,000-record corpus: about 10 s
//! (2.18.0 -> 2.19.0) and 60 s (2.19.0 -> 2.20.2) in a release build, far longer in a debug
//! one. So the tests that run them are ignored in debug builds; CI runs them in release
//! (`.ci/run`: `cargo test --release -p attn-policy-cli --test change_reports`).
//!
//! Regenerate the reports: `UPDATE_DOCS=1 cargo test --release -p attn-policy-cli --test
//! change_reports` (or the command at the top of each report, from the repository root).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use attn_policy::Record;
use attn_policy::conformance::read_record;
use attn_policy::facts::Facts;
use attn_policy::{PackSpec, Policy};
use attn_policy_analysis::regions::Restriction;
use serde_json::Value as Json;

/// The reports: file, old pack, new pack.
const REPORTS: [(&str, &str, &str); 2] = [
    (
        "docs/changes/te-2.18.0-to-2.19.0.md",
        "te@2.18.0",
        "te@2.19.0",
    ),
    (
        "docs/changes/te-2.19.0-to-2.20.2.md",
        "te@2.19.0",
        "te@2.20.2",
    ),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The command a report was generated with: the indented `attn-policy diff ...` line at its
/// top, as words (the reports' commands quote nothing).
fn command_of(report: &str) -> Vec<String> {
    let line = report
        .lines()
        .take(10)
        .find_map(|l| l.strip_prefix("    attn-policy diff "))
        .expect("the report names the command that generated it");
    line.split_whitespace().map(String::from).collect()
}

/// Runs `attn-policy diff ARGS` from the repository root: its standard output.
fn diff(args: &[String]) -> String {
    let o = Command::new(common::bin())
        .arg("diff")
        .args(args)
        .current_dir(root())
        .output()
        .expect("binary runs");
    assert_eq!(
        o.status.code(),
        Some(1),
        "`attn-policy diff {}` finds differences: {}",
        args.join(" "),
        common::text(&o)
    );
    String::from_utf8(o.stdout).expect("utf-8")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
#[cfg_attr(debug_assertions, ignore = "release builds only: see the module doc")]
fn change_reports_are_up_to_date() {
    for (path, old, new) in REPORTS {
        let before = read(path);
        let args = command_of(&before);
        assert_eq!(
            (&args[0], &args[1]),
            (&old.to_string(), &new.to_string()),
            "{path}"
        );
        let t = std::time::Instant::now();
        let now = diff(&args);
        eprintln!("{path}: regenerated in {:.1} s", t.elapsed().as_secs_f64());
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(root().join(path), &now).expect("write the report");
            continue;
        }
        assert!(
            now == before,
            "{path} is stale: regenerate it with `attn-policy diff {}` from the repository \
             root (or UPDATE_DOCS=1 cargo test --release -p attn-policy-cli --test \
             change_reports)",
            args.join(" ")
        );
    }
}

/// The JSON of a report's diff: its command with `--json` for `--format md`.
fn report_json(i: usize) -> &'static Json {
    static JSON: [OnceLock<Json>; 2] = [OnceLock::new(), OnceLock::new()];
    JSON[i].get_or_init(|| {
        let words = command_of(&read(REPORTS[i].0));
        let mut args: Vec<String> = Vec::new();
        let mut it = words.into_iter();
        while let Some(w) = it.next() {
            match w.as_str() {
                "--format" | "--group-regions" => {
                    it.next();
                }
                _ => args.push(w),
            }
        }
        args.push("--json".into());
        serde_json::from_str(&diff(&args)).expect("diff --json prints JSON")
    })
}

fn pack(name: &str) -> &'static Policy {
    static PACKS: OnceLock<Vec<(String, Policy)>> = OnceLock::new();
    let packs = PACKS.get_or_init(|| {
        ["te@2.18.0", "te@2.19.0", "te@2.20.2"]
            .into_iter()
            .map(|n| (n.to_string(), PackSpec::embedded(n).load().expect("loads")))
            .collect()
    });
    &packs.iter().find(|(n, _)| n == name).expect("a te@ pack").1
}

/// A release's corpus (the same ids in each).
fn corpus(release: &str) -> &'static [Record] {
    static CORPORA: OnceLock<Vec<(String, Vec<Record>)>> = OnceLock::new();
    let all = CORPORA.get_or_init(|| {
        ["2.18.0", "2.19.0", "2.20.2"]
            .into_iter()
            .map(|r| {
                let path = root().join(format!("tests/corpora/te-{r}-corpus-a.jsonl.gz"));
                (
                    r.to_string(),
                    attn_policy::read_corpus(&path).expect("corpus"),
                )
            })
            .collect()
    });
    &all.iter().find(|(r, _)| r == release).expect("a release").1
}

fn record(release: &str, id: &str) -> &'static Record {
    corpus(release)
        .iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("{id} in the {release} corpus"))
}

/// A pack's decision as `backend (variant)` / `none`, as the reports print it.
fn outcome(p: &Policy, facts: &Facts) -> String {
    let d = p.decide(facts);
    match d.selected {
        None => "none".into(),
        Some(b) => {
            let bk = &p.backends[b as usize];
            match d.backends[b as usize]
                .variant
                .and_then(|v| bk.variants.get(v as usize))
            {
                Some(v) => format!("{} ({})", bk.name, v.name),
                None => bk.name.clone(),
            }
        }
    }
}

/// TransformerEngine's own decision in a corpus record, in the same words.
fn te_outcome(rec: &Record) -> String {
    let d = &rec.decision;
    match d["selected"].as_str().expect("a decision") {
        "NoBackend" => "none".into(),
        "FlashAttention" => {
            let v = d["flash_attention_backend"]
                .as_str()
                .expect("a flash version");
            format!("FlashAttention (FA{})", &v[..1])
        }
        "FusedAttention" => match d["fused_attention_backend"].as_i64() {
            Some(1) => "FusedAttention (F16_arbitrary_seqlen)".into(),
            Some(2) => "FusedAttention (FP8)".into(),
            other => panic!("fused sub-backend {other:?}"),
        },
        other => other.to_string(),
    }
}

fn fired(p: &Policy, facts: &Facts) -> Vec<String> {
    p.decide(facts)
        .fired
        .iter()
        .map(|&i| p.rules[i as usize].id.clone())
        .collect()
}

/// One README item, shown by one corpus configuration.
struct Item {
    /// Which report (index into REPORTS).
    report: usize,
    /// The README's words.
    what: &'static str,
    id: &'static str,
    kind: &'static str,
    old: &'static str,
    new: &'static str,
    /// The change's rule: it fires for the configuration in one of the packs only.
    rule: &'static str,
}

const FA4: &str = "FlashAttention (FA4)";
const FA2: &str = "FlashAttention (FA2)";
const F16: &str = "FusedAttention (F16_arbitrary_seqlen)";
const FP8: &str = "FusedAttention (FP8)";
const UNFUSED: &str = "UnfusedDotProductAttention";

/// Per README item, a configuration of the corpus it changes: chosen from the records whose
/// TransformerEngine logs show the change (the first log line that differs between the two
/// releases' records is the item's message), and checked against the upstream rule by hand
/// (the comment says how).
const ITEMS: &[Item] = &[
    // 2.18.0 -> 2.19.0
    Item {
        report: 0,
        what: "1. FA4 minimum arch sm80 -> sm90",
        // sm89, flash-attn 4.0.0b11 and 2.6.3 installed: 2.18 ran FA4, 2.19 logs "Disabling
        // FlashAttention 4 for compute capability < sm90" and runs FA2.
        id: "s1-94",
        kind: "switched",
        old: FA4,
        new: FA2,
        rule: "F4.2",
    },
    Item {
        report: 0,
        what: "2. FA4 disabled for head_dim_qk == head_dim_v == 512 on sm100-sm110",
        // head dims 512/512 on sm103 with FA4 installed: "Disabling FlashAttention 4 for
        // unsupported symmetric head_dim=512 on SM100/SM110"; FusedAttention declined already.
        id: "s1-796",
        kind: "switched",
        old: FA4,
        new: UNFUSED,
        rule: "F4.10",
    },
    Item {
        report: 0,
        what: "3. THD + pad_between_seqs disables FA2 only (no longer FA4)",
        // THD with pad_between_seqs on sm90 with FA4: 2.18 "Disabling FlashAttention 2 and 4
        // for qkv_format = thd when there is padding between sequences" left nothing.
        id: "s1-65",
        kind: "gained",
        old: "none",
        new: FA4,
        rule: "F4.17",
    },
    Item {
        report: 0,
        what: "4. FA4 with context parallelism except a2a+p2p",
        // context parallelism (not a2a+p2p) with FA4 installed on sm90+: 2.18 "Disabling
        // FlashAttention 4 as it does not support context parallelism yet" ran FA2 2.8.3.
        id: "s1-743",
        kind: "switched",
        old: "FlashAttention (FA2)",
        new: FA4,
        rule: "F4.14",
    },
    Item {
        report: 0,
        what: "5. removed: FusedAttention disabled for CP + FP8 DPA + THD",
        // CP, fp8_dpa, THD on sm100: 2.18 "Disabling FusedAttention as it does not support
        // context parallelism with FP8 attention" (FU.46); 2.19 runs the FP8 sub-backend (its
        // library also takes FP8 THD on sm100+, item 10: CQ.fp8_format on the old side too).
        id: "s1-1009",
        kind: "gained",
        old: "none",
        new: FP8,
        rule: "FU.46",
    },
    Item {
        report: 0,
        what: "6. removed: FusedAttention disabled for CP + THD + a2a+p2p",
        // CP a2a+p2p with THD: 2.18 "Disabling FusedAttention as it does not support context
        // parallelism with THD format" (FU.47) ran FA2 2.5.9; 2.19 runs FusedAttention.
        id: "s1-13810",
        kind: "switched",
        old: "FlashAttention (FA2)",
        new: F16,
        rule: "FU.47",
    },
    // 2.19.0 -> 2.20.2
    Item {
        report: 1,
        what: "2. softcap != 0 disables FusedAttention (and FA4)",
        // softcap 30 on a config 2.19 ran with FusedAttention F16: "Disabling FusedAttention
        // as it does not support softcap" (FU.16).
        id: "s1-62",
        kind: "switched",
        old: F16,
        new: UNFUSED,
        rule: "FU.16",
    },
    Item {
        report: 1,
        what: "4. sliding window with bottom_right_diagonal=False and s_q != s_kv disables \
               FlashAttention for any version",
        // FA3 3.0.0b1, window, bottom_right_diagonal false, s_q != s_kv: before 2.20 the check
        // was an elif under FA2; 2.20 "Disabling FlashAttention as it only supports sliding
        // window with bottom right diagonal" (FL.13).
        id: "s1-1169",
        kind: "switched",
        old: "FlashAttention (FA3)",
        new: UNFUSED,
        rule: "FL.13",
    },
    Item {
        report: 1,
        what: "5. bias shape 111s only when max_seqlen_q != 1",
        // post_scale_bias [1, 1, 1, s_kv] with max_seqlen_q == 1: 2.19 derived "111s"
        // and logged "Disabling FusedAttention as dbias calculation is not supported for
        // 111s"; 2.20 classifies it otherwise and runs FusedAttention.
        id: "s1-7026",
        kind: "switched",
        old: UNFUSED,
        new: F16,
        rule: "FU.39",
    },
    Item {
        report: 1,
        what: "validation: THD without a padding mask",
        // thd_t2hd on sm90 with causal_bottom_right: 2.20's validation "THD format requires
        // PADDING / PADDING_CAUSAL / PADDING_CAUSAL_BOTTOM_RIGHT ..." (C.2).
        id: "s1-41",
        kind: "switched",
        old: F16,
        new: UNFUSED,
        rule: "C.2",
    },
    Item {
        report: 1,
        what: "validation: bottom-right causal with bias / ALiBi / dropout",
        // causal_bottom_right with ALiBi: "Bottom right causal mask is only supported with
        // is_bias=False, ..." (FE.br_bias_dropout).
        id: "s1-310",
        kind: "switched",
        old: F16,
        new: UNFUSED,
        rule: "FE.br_bias_dropout",
    },
    Item {
        report: 1,
        what: "validation: paged KV without a padding mask",
        // paged KV cache with a causal mask: "Paged KV requires PADDING / PADDING_CAUSAL /
        // PADDING_CAUSAL_BOTTOM_RIGHT" (C.4).
        id: "s1-435",
        kind: "switched",
        old: F16,
        new: UNFUSED,
        rule: "C.4",
    },
    Item {
        report: 1,
        what: "validation: s_q = s_kv = 1",
        // max_seqlen_q == max_seqlen_kv == 1 in training: "s_q = s_kv = 1 is not supported."
        id: "s1-303",
        kind: "switched",
        old: F16,
        new: UNFUSED,
        rule: "FE.bwd_s1",
    },
    Item {
        report: 1,
        what: "validation: decode (s_q == 1) with a sink",
        // s_q == 1 with a learnable softmax: "decode only mode, i.e. s_q == 1, not
        // supported with sink tokens".
        id: "s1-1121",
        kind: "switched",
        old: F16,
        new: UNFUSED,
        rule: "FE.decode_sink",
    },
    Item {
        report: 1,
        what: "validation: FP8 deterministic on Blackwell",
        // FP8 DPA (current scaling) training on sm100: 2.20's validation "FP8 deterministic
        // algorithm (required for MXFP8 and d_qk=192 ...) ..."; nothing else serves it here.
        id: "s1-493",
        kind: "lost",
        old: FP8,
        new: "none",
        rule: "FE.fp8_bwd_blackwell",
    },
    Item {
        report: 1,
        what: "validation: sinks with ragged offsets (backward)",
        // THD (th3d) with an off-by-one softmax (a sink) in training: "SDPA backward with
        // ragged offsets and a sink token requires ..."; pad_between_seqs: no other backend.
        id: "s1-112",
        kind: "lost",
        old: F16,
        new: "none",
        rule: "FE.bwd_ragged_sink",
    },
    Item {
        report: 1,
        what: "validation: THD learnable softmax on cuDNN < 9.26",
        // THD, softmax_type learnable, training, cuDNN < 9.26: "Known cuDNN < 9.26.0 issue
        // with THD learnable softmax backward".
        id: "s1-802",
        kind: "switched",
        old: F16,
        new: UNFUSED,
        rule: "FE.bwd_ragged_sink",
    },
];

/// The regions of a report's JSON whose (disjoint) constraints hold `facts`.
fn regions_holding<'j>(json: &'j Json, p: &Policy, facts: &Facts) -> Vec<&'j Json> {
    json["regions"]
        .as_array()
        .expect("regions")
        .iter()
        .filter(|r| {
            let c = r["constraints"].as_object().expect("constraints");
            Restriction::of_constraints_for(p.schema, c)
                .expect("a region's constraints compile")
                .holds(facts)
        })
        .collect()
}

fn show(b: &Json, v: &Json) -> String {
    match (b.as_str(), v.as_str()) {
        (None, _) => "none".into(),
        (Some(b), None) => b.into(),
        (Some(b), Some(v)) => format!("{b} ({v})"),
    }
}

fn check_item(it: &Item) {
    let (path, old, new) = REPORTS[it.report];
    let release = |p: &str| p.split_once('@').expect("te@release").1.to_string();
    let (ro, rn) = (record(&release(old), it.id), record(&release(new), it.id));
    // TransformerEngine itself decided so (the corpora record each release's decision).
    assert_eq!(
        (te_outcome(ro), te_outcome(rn)),
        (it.old.to_string(), it.new.to_string()),
        "{}: {} as TE decided",
        it.what,
        it.id
    );
    let (po, pn) = (pack(old), pack(new));
    let fo = read_record(po, ro).expect("a valid configuration");
    let fnew = read_record(pn, rn).expect("a valid configuration");
    assert_eq!(
        (outcome(po, &fo), outcome(pn, &fnew)),
        (it.old.to_string(), it.new.to_string()),
        "{}: {} as the packs decide",
        it.what,
        it.id
    );
    // Exactly one region of the report's diff holds it, with the expected change.
    let json = report_json(it.report);
    let hits = regions_holding(json, pn, &fnew);
    assert_eq!(hits.len(), 1, "{}: {} lies in one region", it.what, it.id);
    let r = hits[0];
    assert_eq!(r["kind"], it.kind, "{}: {}", it.what, it.id);
    assert_eq!(show(&r["old"], &r["old_variant"]), it.old, "{}", it.what);
    assert_eq!(show(&r["new"], &r["new_variant"]), it.new, "{}", it.what);
    assert!(r["corpus_count"].as_u64() >= Some(1), "{}", it.what);
    // The change's rule fires for it in one pack only (the region's `old_rules` /
    // `new_rules` name the rules whose firing differs throughout the region, which may be
    // others: 2.19.0's C++ query rules decline much of what 2.20.2's validation does).
    let (a, b) = (fired(po, &fo), fired(pn, &fnew));
    assert!(
        a.iter().any(|x| x == it.rule) != b.iter().any(|x| x == it.rule),
        "{}: {} fires in one pack only for {} (old {a:?}, new {b:?})",
        it.what,
        it.rule,
        it.id
    );
    // The checked-in report has the group of that change.
    let heading = format!("{}: {} -> {}", it.kind, it.old, it.new);
    assert!(
        read(path).contains(&heading),
        "{path} lists a group `{heading}` ({})",
        it.what
    );
}

#[test]
#[cfg_attr(debug_assertions, ignore = "release builds only: see the module doc")]
fn each_readme_change_is_a_region_of_its_report() {
    let failed: Vec<&str> = ITEMS
        .iter()
        .filter(|it| std::panic::catch_unwind(|| check_item(it)).is_err())
        .map(|it| it.what)
        .collect();
    assert!(
        failed.is_empty(),
        "items not shown as the README says: {failed:?}"
    );
}

/// A configuration of the te family (conformance `config` format) read for a pack.
fn facts(p: &Policy, config: &Json) -> Facts {
    p.read_facts(config)
        .unwrap_or_else(|e| panic!("{}: {config} reads: {e}", p.name))
}

/// The corpus configurations in the regions of report `report` whose rules (old or new side)
/// name `rule`.
fn in_corpus_regions(report: usize, rule: &str) -> u64 {
    report_json(report)["regions"]
        .as_array()
        .expect("regions")
        .iter()
        .filter(|r| {
            ["old_rules", "new_rules"].iter().any(|k| {
                r[*k]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|x| x == rule))
            })
        })
        .filter_map(|r| r["corpus_count"].as_u64())
        .sum()
}

/// README items (2.18.0 -> 2.19.0) that no configuration of the corpus shows: each says why,
/// and asserts the change at the rule level on a configuration written for it (checked
/// against the upstream rule by hand) and that the corpus has no configuration it changes.
#[test]
#[cfg_attr(debug_assertions, ignore = "release builds only: see the module doc")]
fn readme_changes_2_18_to_2_19_the_corpus_does_not_show() {
    use serde_json::json;
    let (o18, o19) = (pack("te@2.18.0"), pack("te@2.19.0"));

    // 2.18.0 -> 2.19.0 item 7: FusedAttention (F16) disabled under determinism on sm90 for THD
    // training when b*h*s_q*s_kv >= 2^30 (FU.45). Its regions exist but hold no corpus
    // configuration: where it fires on the corpus, both releases decide alike.
    assert_eq!(
        in_corpus_regions(0, "FU.45"),
        0,
        "FU.45: no corpus configuration"
    );
    let fu45_regions = report_json(0)["regions"]
        .as_array()
        .expect("regions")
        .iter()
        .filter(|r| {
            r["new_rules"]
                .as_array()
                .is_some_and(|v| v.iter().any(|x| x == "FU.45"))
        })
        .count();
    assert!(
        fu45_regions > 0,
        "FU.45 has regions (without corpus configurations)"
    );
    // Where FU.45 fires on the corpus, FusedAttention F16 was declined in 2.18.0 as well (or
    // another backend is chosen first): both packs decide alike.
    let mut fires = 0;
    for rec in corpus("2.19.0") {
        let (Ok(a), Ok(b)) = (read_record(o18, rec), read_record(o19, rec)) else {
            continue;
        };
        if fired(o19, &b).iter().any(|x| x == "FU.45") {
            fires += 1;
            assert_eq!(outcome(o18, &a), outcome(o19, &b), "{}", rec.id);
        }
    }
    eprintln!("FU.45 fires on {fires} corpus configuration(s), none decided differently");
    let big = json!({"device_compute_capability": [9, 0], "cudnn_version": [9, 19, 0],
        "flash_attn_versions": {"v2": null, "v3": null, "v4": null}, "qkv_dtype": "bf16",
        "qkv_layout": "thd_thd_thd", "attn_mask_type": "padding_causal", "head_dim_qk": 128,
        "head_dim_v": 128, "batch_size": 4, "num_heads": 16, "num_gqa_groups": 16,
        "max_seqlen_q": 8192, "max_seqlen_kv": 8192, "deterministic": true,
        "is_training": true, "core_attention_bias_requires_grad": false});
    // 4 * 16 * 8192 * 8192 = 2^32 >= 2^30.
    let (a, b) = (facts(o18, &big), facts(o19, &big));
    assert_eq!(outcome(o18, &a), F16);
    assert_ne!(outcome(o19, &b), F16);
    assert!(fired(o19, &b).contains(&"FU.45".to_string()));
    assert!(!fired(o18, &a).contains(&"FU.45".to_string()));

    // 2.18.0 -> 2.19.0 item 8: flash-attn 2's window [2.1.1, 2.8.3] -> [2.1.1, 2.8.4). It
    // differs only for versions in (2.8.3, 2.8.4), such as 2.8.3.post1, which the version
    // facts do not take (a local or post-release suffix is refused as input; docs/facts.md):
    // every readable version decides the same. The corpus has 2.8.3 and 2.8.4 only.
    for v in ["2.8.3", "2.8.4"] {
        let c = json!({"device_compute_capability": [8, 0], "cudnn_version": [9, 19, 0],
            "flash_attn_versions": {"v2": v, "v3": null, "v4": null}, "qkv_dtype": "bf16",
            "qkv_layout": "bshd_bshd_bshd", "attn_mask_type": "causal", "head_dim_qk": 128,
            "head_dim_v": 128});
        assert_eq!(
            outcome(o18, &facts(o18, &c)),
            outcome(o19, &facts(o19, &c)),
            "{v}"
        );
    }
    let post = json!({"device_compute_capability": [8, 0], "cudnn_version": [9, 19, 0],
        "flash_attn_versions": {"v2": "2.8.3.post1", "v3": null, "v4": null}});
    for p in [o18, o19] {
        let e = p
            .read_facts(&post)
            .expect_err("2.8.3.post1 is not a version")
            .to_string();
        assert!(e.contains("is not a version"), "{e}");
    }
    for rec in corpus("2.19.0") {
        let v = rec.config["flash_attn_versions"]["v2"].as_str();
        assert!(
            matches!(
                v,
                None | Some("2.3.3" | "2.4.2" | "2.5.9" | "2.6.3" | "2.7.4" | "2.8.3" | "2.8.4")
            ),
            "{}: {v:?}",
            rec.id
        );
    }
}

/// README items (2.19.0 -> 2.20.2) that no configuration of the corpus shows, as above.
#[test]
#[cfg_attr(debug_assertions, ignore = "release builds only: see the module doc")]
fn readme_changes_2_19_to_2_20_the_corpus_does_not_show() {
    use serde_json::json;
    let (o19, o20) = (pack("te@2.19.0"), pack("te@2.20.2"));

    // 2.19.0 -> 2.20.2 item 3: the THD layout filters read "thd" in (q_format, kv_format)
    // (`thd_any`) instead of qkv_format == "thd" (`qf_thd`: with a KV cache, the query in
    // THD and the cache in BSHD is not "thd" before 2.20). The filters' rule (FU.22 here)
    // then fires in 2.20.2 only; but the configurations it newly covers are declined by
    // 2.19.0's C++ query or by ALL.5 (KV cache with padding between sequences) as well, so
    // the decision does not change: no corpus region names a layout filter.
    let thd_cache = json!({"device_compute_capability": [12, 0], "cudnn_version": [9, 15, 1],
        "flash_attn_versions": {"v2": null, "v3": null, "v4": null}, "qkv_dtype": "bf16",
        "qkv_layout": "thd_bshd_bshd", "head_dim_qk": 128, "head_dim_v": 128,
        "attn_mask_type": "padding_causal", "inference": {"is_paged": false}});
    let (a, b) = (facts(o19, &thd_cache), facts(o20, &thd_cache));
    assert!(!fired(o19, &a).contains(&"FU.22".to_string()));
    assert!(fired(o20, &b).contains(&"FU.22".to_string()));
    assert_eq!(outcome(o19, &a), outcome(o20, &b));
    for rule in ["F2.12", "UN.5", "FU.22", "FU.23"] {
        assert_eq!(
            in_corpus_regions(1, rule),
            0,
            "{rule}: no corpus configuration"
        );
    }

    // 2.19.0 -> 2.20.2 item 7: determinism + post_scale_bias (F16) drops its
    // `cudnn_version < 8.9.5` clause. No effect: the packs state TE's rules for cuDNN >= 9.7
    // (docs/packs/releases.md; the corpora start at 9.12, which TE 2.20.2 requires), where
    // the clause is false in both releases, so that rule (FU.44) is the same in both packs:
    // not among the diff's changed rules, in no region.
    let json = report_json(1);
    let changed: Vec<&str> = json["changed_rules"]
        .as_array()
        .expect("changed_rules")
        .iter()
        .filter_map(Json::as_str)
        .collect();
    assert!(!changed.contains(&"FU.44@FusedAttention"), "{changed:?}");
    assert!(changed.contains(&"FU.16@FusedAttention"), "{changed:?}");
    assert_eq!(in_corpus_regions(1, "FU.44"), 0);

    // 2.19.0 -> 2.20.2 validation: GQA head counts that do not divide. 2.20.2's validation
    // rejects them, 2.19.0 accepted them (rules level only), but both packs refuse such a
    // configuration as an input error (KV heads must divide the query heads: docs/facts.md),
    // so it is in no region: the diff excludes input errors and counts them.
    let rec = record("2.20.2", "s1-36");
    let c = &rec.config;
    assert_ne!(
        c["num_heads"].as_i64().unwrap() % c["num_gqa_groups"].as_i64().unwrap(),
        0
    );
    assert_ne!(te_outcome(record("2.19.0", "s1-36")), te_outcome(rec));
    assert!(read_record(o19, rec).is_err() && read_record(o20, rec).is_err());
    assert_eq!(report_json(1)["corpus"]["input_errors"], 1922);
}

/// `--format md` on two small fixture packs (fast in debug builds): the command at the top,
/// the summary table, every region of the JSON listed in its group, the same bytes twice; and
/// the flags that go with it.
#[test]
fn md_lists_every_region_grouped_and_is_deterministic() {
    let mini = "../tests/fixtures/analysis/mini";
    let nowin = "../tests/fixtures/analysis/mini-nowin";
    let md_args = ["diff", mini, nowin, "--format", "md"];
    let (a, b) = (common::run(&md_args), common::run(&md_args));
    assert_eq!(a.status.code(), Some(1), "{}", common::text(&a));
    assert_eq!(a.stdout, b.stdout, "deterministic");
    let md = String::from_utf8(a.stdout).expect("utf-8");
    assert!(
        md.contains(&format!(
            "\n    attn-policy diff {mini} {nowin} --format md\n"
        )),
        "{md}"
    );
    assert!(md.contains("## Summary"), "{md}");
    let (_, json) = common::run_json(&["diff", mini, nowin, "--json"]);
    let regions = json["regions"].as_array().expect("regions");
    // Without a corpus every region is printed, as a numbered row of its group.
    let rows = md
        .lines()
        .filter(|l| l.starts_with("| ") && l.split('|').nth(1).is_some_and(|c| c.contains('.')))
        .count();
    assert_eq!(rows, regions.len(), "{md}");
    for r in regions {
        let heading = format!(
            "{}: {} -> {}",
            r["kind"].as_str().unwrap(),
            show(&r["old"], &r["old_variant"]),
            show(&r["new"], &r["new_variant"])
        );
        assert!(md.contains(&heading), "{heading}\n{md}");
    }
    for (args, msg) in [
        (
            vec!["diff", mini, nowin, "--format", "md", "--json"],
            "--json",
        ),
        (
            vec!["diff", mini, nowin, "--group-regions", "2"],
            "--group-regions",
        ),
    ] {
        let o = common::run(&args);
        assert_eq!(o.status.code(), Some(2), "{}", common::text(&o));
        assert!(common::text(&o).contains(msg), "{}", common::text(&o));
    }
    let cut = common::run(&[
        "diff",
        mini,
        nowin,
        "--format",
        "md",
        "--group-regions",
        "1",
    ]);
    let cut = String::from_utf8(cut.stdout).expect("utf-8");
    assert!(cut.contains("--group-regions 1 --format md"), "{cut}");
}

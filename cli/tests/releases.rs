//! `--pack te@auto`: the pack of the installed TransformerEngine release, from the `te_version`
//! fact (`--te-version X`, `--set te_version=X`, a config's `te_version`; docs/packs/releases.md).

mod common;

use common::{run, text};
use serde_json::Value as Json;

const PRESET: &[&str] = &["--no-env", "--preset", "gemma4-global", "--sm", "90"];

fn explain(extra: &[&str]) -> std::process::Output {
    let mut args = vec!["explain"];
    args.extend_from_slice(PRESET);
    args.extend_from_slice(extra);
    run(&args)
}

fn json(extra: &[&str]) -> Json {
    let mut args = extra.to_vec();
    args.push("--json");
    let o = explain(&args);
    assert!(o.status.code().unwrap_or(99) < 2, "{}", text(&o));
    serde_json::from_slice(&o.stdout).expect("explain --json")
}

/// The document without what says where the pack and the inputs came from.
fn decision(mut v: Json) -> Json {
    let o = v.as_object_mut().expect("object");
    o.remove("pack_from");
    o.remove("provenance");
    v
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn an_installed_release_with_a_pack_decides_with_it() {
    for release in ["2.18.0", "2.19.0", "2.20.2"] {
        let pack = format!("te@{release}");
        let o = explain(&["--pack", "te@auto", "--te-version", release]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains(&format!(
                "pack: {pack} (from te@auto, TransformerEngine {release})"
            )),
            "{out}"
        );
        assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
        let auto = json(&["--pack", "te@auto", "--te-version", release]);
        assert_eq!(auto["pack"], pack.as_str());
        assert_eq!(auto["pack_from"]["installed"], release);
        assert!(auto["pack_from"]["warning"].is_null());
        assert_eq!(decision(auto), decision(json(&["--pack", &pack])));
    }
}

#[test]
fn a_release_between_packs_takes_the_nearest_older_with_one_warning() {
    let o = explain(&["--pack", "te@auto", "--te-version", "2.19.5"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let err = stderr(&o);
    let warning = "warning: TransformerEngine 2.19.5 has no pack; deciding with te@2.19.0, the \
                   nearest older release (packs: te@2.18.0, te@2.19.0, te@2.20.2)";
    assert_eq!(err.matches("warning:").count(), 1, "{err}");
    assert!(err.contains(warning), "{err}");
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .contains("pack: te@2.19.0 (from te@auto, TransformerEngine 2.19.5)")
    );
    let auto = json(&["--pack", "te@auto", "--te-version", "2.19.5"]);
    assert_eq!(auto["pack"], "te@2.19.0");
    assert_eq!(
        auto["pack_from"]["warning"].as_str(),
        warning.strip_prefix("warning: ")
    );
    assert_eq!(decision(auto), decision(json(&["--pack", "te@2.19.0"])));
    // Newer than every pack: the newest, with a warning.
    let o = explain(&["--pack", "te@auto", "--te-version", "2.21.0", "--json"]);
    assert!(
        stderr(&o).is_empty(),
        "JSON carries the warning: {}",
        stderr(&o)
    );
    let v: Json = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["pack"], "te@2.20.2");
    assert!(
        v["pack_from"]["warning"]
            .as_str()
            .unwrap()
            .contains("2.21.0")
    );
}

#[test]
fn a_release_older_than_every_pack_is_refused() {
    for cmd in [
        &["explain", "--preset", "gemma4-global"][..],
        &["check"][..],
        &["facts"][..],
    ] {
        let mut args = cmd.to_vec();
        args.extend(["--pack", "te@auto", "--te-version", "2.17.0"]);
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let err = stderr(&o);
        assert!(err.contains("TransformerEngine 2.17.0 is older"), "{err}");
        assert!(err.contains("te@2.18.0, te@2.19.0, te@2.20.2"), "{err}");
    }
    let o = explain(&["--pack", "te@auto", "--te-version", "garbage"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(stderr(&o).contains("`garbage` is not a release version"));
}

#[test]
fn te_auto_without_a_release_says_how_to_give_one() {
    for cmd in [
        &["explain", "--preset", "gemma4-global"][..],
        &["check"][..],
    ] {
        let mut args = cmd.to_vec();
        args.extend(["--pack", "te@auto"]);
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let err = stderr(&o);
        assert!(err.contains("`te@auto` needs the installed TransformerEngine release"));
        assert!(
            err.contains("--te-version") && err.contains("te_version"),
            "{err}"
        );
    }
}

#[test]
fn te_version_flag_set_and_config_agree() {
    let flag = json(&["--pack", "te@auto", "--te-version", "2.19.5"]);
    let set = json(&["--pack", "te@auto", "--set", "te_version=2.19.5"]);
    let dir = std::env::temp_dir().join(format!("attn-policy-te-auto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("config.json");
    std::fs::write(&file, r#"{"te_version": "2.19.5"}"#).unwrap();
    let config = json(&["--pack", "te@auto", file.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(flag["pack_from"], set["pack_from"]);
    assert_eq!(flag["pack_from"], config["pack_from"]);
    assert_eq!(decision(flag.clone()), decision(set));
    assert_eq!(decision(flag), decision(config));
    // Both given: they must name the same release.
    let o = explain(&[
        "--pack",
        "te@auto",
        "--te-version",
        "2.19.0",
        "--set",
        "te_version=2.20.2",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(stderr(&o).contains("disagree"), "{}", stderr(&o));
    let same = json(&[
        "--pack",
        "te@auto",
        "--te-version",
        "2.19",
        "--set",
        "te_version=2.19.0",
    ]);
    assert_eq!(same["pack"], "te@2.19.0");
}

#[test]
fn te_version_chooses_the_pack_and_changes_no_decision() {
    // Another pack ignores it; it is not an input the decision reads.
    let plain = json(&["--pack", "te"]);
    let with = json(&["--pack", "te", "--set", "te_version=2.18.0"]);
    assert!(with.get("pack_from").is_none());
    assert_eq!(decision(plain), decision(with.clone()));
    assert!(with["input"].get("te_version").is_none());
    // `attn-policy facts` lists it, as a fact that chooses the pack.
    let o = run(&["facts"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("| `te_version` | version? |"));
    let o = run(&["facts", "--json"]);
    let v: Json = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["selection"][0]["path"], "te_version");
    assert!(
        v["facts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["path"] != "te_version")
    );
}

#[test]
fn run_takes_te_auto() {
    let o = run(&[
        "run",
        "--pack",
        "te@auto",
        "--te-version",
        "2.19.5",
        "--head-dim",
        "64",
        "--seqlen",
        "64",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--forward-only",
        "--verify",
        "never",
        "--as-configured",
        "--probe",
        "cuda_device=false",
        "--json",
    ]);
    let v: Json = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    assert_eq!(v["decision"]["pack"], "te@2.19.0");
    assert_eq!(v["decision"]["pack_from"]["installed"], "2.19.5");
}

#[test]
fn matrix_takes_te_auto() {
    let query = [
        "--rows",
        "head_dim=128,512",
        "--cols",
        "sm=90,100",
        "--format",
        "json",
    ];
    let matrix = |pack: &[&str]| {
        let mut args = vec!["matrix"];
        args.extend_from_slice(pack);
        args.extend_from_slice(&query);
        run(&args)
    };
    let auto = matrix(&["--pack", "te@auto", "--te-version", "2.19.5"]);
    let named = matrix(&["--pack", "te@2.19.0"]);
    assert_eq!(auto.status.code(), Some(0), "{}", text(&auto));
    assert_eq!(
        auto.stdout, named.stdout,
        "te@auto for 2.19.5 is te@2.19.0's matrix"
    );
    assert_eq!(
        stderr(&auto).matches("nearest older release").count(),
        1,
        "{}",
        stderr(&auto)
    );
    let missing = matrix(&["--pack", "te@auto"]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    assert!(
        stderr(&missing).contains("--te-version"),
        "{}",
        stderr(&missing)
    );
}

#[test]
fn diff_takes_te_auto() {
    let auto = run(&[
        "diff",
        "te@auto",
        "te@2.19.0",
        "--te-version",
        "2.19.0",
        "--json",
    ]);
    assert_eq!(auto.status.code(), Some(0), "{}", text(&auto));
    let v: Json =
        serde_json::from_slice(&auto.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&auto)));
    assert_eq!(
        v["regions"].as_array().map(Vec::len),
        Some(0),
        "the same release: no region"
    );
    let missing = run(&["diff", "te@auto", "te"]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    assert!(
        stderr(&missing).contains("--te-version"),
        "{}",
        stderr(&missing)
    );
}

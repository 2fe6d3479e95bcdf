//! `attn-policy matrix` and `attn-policy diff --format matrix` end to end: the docs' commands
//! reproduce the docs, every format, exit codes and errors.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn-policy"))
        .args(args)
        .output()
        .expect("binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The command lines docs/support-matrix.md shows print the matrices it holds.
#[test]
fn docs_commands_reproduce_the_docs() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/support-matrix.md"
    ))
    .expect("docs/support-matrix.md");
    for q in attn_policy_analysis::matrix::docs::QUESTIONS {
        let mut args = vec!["matrix"];
        args.extend(q.words());
        let o = run(&args);
        assert_eq!(o.status.code(), Some(0), "{}: {}", q.title, stderr(&o));
        let md = stdout(&o);
        assert!(doc.contains(&md), "{}: the docs do not hold\n{md}", q.title);
        assert!(doc.contains(&q.command()), "{}", q.title);
    }
}

#[test]
fn every_format() {
    let base = [
        "matrix",
        "--rows",
        "attn_mask_type=no_mask,arbitrary",
        "--cols",
        "sm=80,100",
        "--fix",
        "head_dim=128",
    ];
    let json = run(&[&base[..], &["--format", "json"]].concat());
    assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
    let j: serde_json::Value = serde_json::from_str(&stdout(&json)).expect("JSON");
    assert_eq!(j["pack"], "te");
    assert_eq!(j["rows"]["axis"], "attn_mask_type");
    assert_eq!(j["cells"].as_array().map(Vec::len), Some(4));
    assert_eq!(j["cells"][3]["backend"], "UnfusedDotProductAttention");
    let html = run(&[&base[..], &["--format", "html"]].concat());
    assert!(stdout(&html).starts_with("<!DOCTYPE html>"));
    let svg = run(&[&base[..], &["--format", "svg"]].concat());
    assert!(stdout(&svg).starts_with("<svg "));
    let md = run(&base);
    assert!(stdout(&md).contains("| attn_mask_type \\ sm | 80 | 100 |"));
    // The torch pack, its own facts and the `sm` fact.
    let torch = run(&[
        "matrix",
        "--pack",
        "torch",
        "--rows",
        "head_dim=64,512",
        "--cols",
        "sm=90",
    ]);
    assert_eq!(torch.status.code(), Some(0), "{}", stderr(&torch));
    assert!(stdout(&torch).contains("| head_dim \\ sm | 90 |"));
}

#[test]
fn bad_input_exits_2_with_a_reason() {
    for (args, says) in [
        (
            &["matrix", "--rows", "head_dims", "--cols", "sm"][..],
            "did you mean `head_dim`",
        ),
        (&["matrix", "--rows", "head_dim"][..], "--rows"),
        (
            &["matrix", "--rows", "batch_size", "--cols", "sm"][..],
            "no default values",
        ),
        (
            &[
                "matrix",
                "--rows",
                "head_dim",
                "--cols",
                "sm",
                "--fix",
                "head_dim_qk=64",
            ][..],
            "is on an axis",
        ),
        (
            &["matrix", "--rows", "head_dim", "--cols", "head_dim_v"][..],
            "set the same fact",
        ),
        (
            &["matrix", "--rows", "attn_mask_type=casual", "--cols", "sm"][..],
            "did you mean `causal`",
        ),
        (
            // Cell configs are read like every input: a head dim of 0 is refused there.
            &["matrix", "--rows", "head_dim=0", "--cols", "sm=90"][..],
            "head_dim_qk: must be > 0, found 0",
        ),
        (
            &["matrix", "--rows", "probe.frost_plan", "--cols", "sm"][..],
            "probe",
        ),
        (
            &[
                "matrix",
                "--pack",
                "torch",
                "--rows",
                "attn_mask_type",
                "--cols",
                "sm",
            ][..],
            "unknown fact",
        ),
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stdout(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn diff_format_matrix() {
    let same = run(&[
        "diff",
        "te",
        "te",
        "--format",
        "matrix",
        "--rows",
        "head_dim=128,512",
        "--cols",
        "sm=90,100",
    ]);
    assert_eq!(same.status.code(), Some(0), "{}", stderr(&same));
    assert!(
        stdout(&same).contains("0 of 4 cells change"),
        "{}",
        stdout(&same)
    );
    let missing = run(&["diff", "te", "te", "--format", "matrix"]);
    assert_eq!(missing.status.code(), Some(2));
    let stray = run(&["diff", "te", "te", "--rows", "head_dim"]);
    assert_eq!(stray.status.code(), Some(2));
    assert!(stderr(&stray).contains("--format matrix"));
    // Two packs of different families share no matrix.
    let families = run(&[
        "diff", "te", "torch", "--format", "matrix", "--rows", "head_dim", "--cols", "sm",
    ]);
    assert_eq!(families.status.code(), Some(2));
}

/// `matrix --pack A --pack B`: each pack's matrix is the one `matrix --pack A` prints alone,
/// and the cells marked differing are exactly those where the standalone matrices differ
/// (computed here from them); html outlines them, md marks them, a pack of another family is
/// refused.
#[test]
fn several_packs_compare_cell_by_cell() {
    let query = [
        "--rows",
        "head_dim=128,256,512",
        "--cols",
        "sm=80,90,100",
        "--fix",
        "qkv_dtype=bf16",
    ];
    let packs = ["te@2.18.0", "te@2.19.0", "te@2.20.2"];
    let alone: Vec<serde_json::Value> = packs
        .iter()
        .map(|p| {
            let mut args = vec!["matrix", "--pack", p, "--format", "json"];
            args.extend(query);
            let o = run(&args);
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            serde_json::from_str(&stdout(&o)).unwrap()
        })
        .collect();
    let mut args = vec!["matrix", "--format", "json"];
    for p in packs {
        args.extend(["--pack", p]);
    }
    args.extend(query);
    let o = run(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let both: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(both["packs"], serde_json::json!(packs));
    assert_eq!(both["matrices"].as_array().unwrap(), &alone);
    // A field a release does not have is not among its free facts.
    let free = |m: &serde_json::Value| m["free"].to_string();
    assert!(
        !free(&alone[1]).contains("num_tokens_q"),
        "{}",
        free(&alone[1])
    );
    assert!(
        free(&alone[2]).contains("num_tokens_q"),
        "{}",
        free(&alone[2])
    );
    let outcome = |m: &serde_json::Value, i: usize| {
        let c = &m["cells"][i];
        (c["backend"].clone(), c["variant"].clone())
    };
    let cells = alone[0]["cells"].as_array().unwrap().len();
    let expected: Vec<usize> = (0..cells)
        .filter(|&i| alone.iter().any(|m| outcome(m, i) != outcome(&alone[0], i)))
        .collect();
    let differing = both["differing"].as_array().unwrap();
    assert_eq!(differing.len(), expected.len(), "{differing:?}");
    assert!(
        !expected.is_empty(),
        "the releases differ at head_dim 512 on sm100"
    );
    for (d, &i) in differing.iter().zip(&expected) {
        for (k, m) in alone.iter().enumerate() {
            assert_eq!(d["cells"][k]["backend"], outcome(m, i).0);
            assert_eq!(d["cells"][k]["pack"], packs[k]);
        }
    }
    let mut md = vec!["matrix"];
    for p in packs {
        md.extend(["--pack", p]);
    }
    md.extend(query);
    let text = stdout(&run(&md));
    assert!(
        text.contains(&format!("{} of {cells} cells differ", expected.len())),
        "{text}"
    );
    assert_eq!(
        text.matches('✱').count(),
        1 + expected.len() * packs.len(),
        "{text}"
    );
    md.extend(["--format", "html"]);
    let html = stdout(&run(&md));
    assert_eq!(
        html.matches("data-differs=\"1\"").count(),
        expected.len() * packs.len()
    );
    let o = run(&[
        "matrix", "--pack", "te", "--pack", "torch", "--rows", "head_dim", "--cols", "sm",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("different facts"), "{}", stderr(&o));
}

//! Broken packs give clear errors with `file:line:col` and a snippet, never a panic. Each
//! fixture under tests/fixtures/invalid/ is one mistake; the rendered diagnostics are snapshots.

use std::path::Path;

use attn_policy::Policy;

fn render(name: &str) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/invalid")
        .join(name);
    let err = Policy::from_dir(&dir).expect_err("fixture must fail to load");
    assert!(err.diagnostics.has_errors());
    // Paths are machine-specific: show them relative to the fixtures folder.
    err.render(false)
        .replace(&format!("{}/", dir.display()), "")
}

macro_rules! fixture {
    ($($name:ident),+ $(,)?) => {$(
        #[test]
        fn $name() {
            insta::assert_snapshot!(render(stringify!($name)));
        }
    )+};
}

fixture!(
    yaml_syntax,
    unknown_key,
    enum_typo,
    unknown_fact,
    duplicate_id,
    bad_syntax,
    type_mismatch,
    unknown_backend,
    unknown_variant,
    not_bool,
    public_def_unknown,
    public_def_no_meaning,
    unguarded_version,
);

/// The executor catalogue the chain tests load with: `cudnn`, `chunked` and `reference`; `cudnn`
/// states `cudnn_admits` as its te-family `admits` condition when given.
fn catalogue(cudnn_admits: Option<&str>) -> attn_policy::ExecutorCatalogue {
    use attn_policy::{CatalogueEntry, ExecutorCatalogue, Provider};
    let mut catalogue = ExecutorCatalogue::new();
    for name in ["cudnn", "chunked", "reference"] {
        catalogue.add(CatalogueEntry {
            name: name.into(),
            description: String::new(),
            provider: Provider::Builtin,
            admits: match cudnn_admits {
                Some(c) if name == "cudnn" => vec![("te".into(), c.into())],
                _ => Vec::new(),
            },
        });
    }
    catalogue
}

/// Loads the fixture `name` with `catalogue`, expecting load errors; their rendering with
/// the fixture folder's paths made relative.
fn render_with_catalogue(name: &str, catalogue: attn_policy::ExecutorCatalogue) -> String {
    use attn_policy::{PackError, PackSpec};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/invalid")
        .join(name);
    let err = PackSpec::dir(&dir)
        .with_catalogue(std::sync::Arc::new(catalogue))
        .load()
        .expect_err("the fixture must fail to load");
    let PackError::Load(err) = err else {
        panic!("expected load diagnostics, got {err}")
    };
    err.render(false)
        .replace(&format!("{}/", dir.display()), "")
}

/// Executor chains are checked against the catalogue the loader is given: an unknown executor
/// (with a did-you-mean) and an unknown variant are errors with their location.
#[test]
fn unknown_executor() {
    let text = render_with_catalogue("unknown_executor", catalogue(None));
    insta::assert_snapshot!(text);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid/unknown_executor");
    // Without a catalogue the names are not checked, but the unknown variant still is.
    let err = Policy::from_dir(&dir).expect_err("unknown variant");
    assert_eq!(err.diagnostics.0.len(), 1, "{}", err.render(false));
    assert_eq!(err.diagnostics.0[0].code, "E-EXECUTOR");
}

/// `if_admitted:` names entries of the chain whose executor states an `admits` condition: a
/// name outside the chain (with a did-you-mean) and an executor without a condition are errors.
#[test]
fn if_admitted_errors() {
    let text = render_with_catalogue("if_admitted", catalogue(Some("head_dim_qk <= 256")));
    insta::assert_snapshot!(text);
}

/// An `if_admitted:` entry is in the chain that runs a decision only where its executor's
/// `admits` condition holds for the decision's facts; the declared chain keeps it.
#[test]
fn if_admitted_entries_leave_the_chain_where_not_admitted() {
    use attn_policy::{Facts, PackSpec};
    let dir = std::env::temp_dir().join(format!("ap-if-admitted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid/if_admitted");
    std::fs::copy(src.join("b.yaml"), dir.join("b.yaml")).unwrap();
    let pack = std::fs::read_to_string(src.join("pack.yaml"))
        .unwrap()
        .replace("[chunkd, reference]", "[cudnn]");
    std::fs::write(dir.join("pack.yaml"), pack).unwrap();
    let policy = PackSpec::dir(&dir)
        .with_catalogue(std::sync::Arc::new(catalogue(Some("head_dim_qk <= 256"))))
        .load()
        .expect("valid pack");
    std::fs::remove_dir_all(&dir).ok();
    let names = |d: i64| {
        let facts =
            Facts::from_json(&serde_json::json!({"head_dim_qk": d, "head_dim_v": d})).unwrap();
        policy
            .executor_chain_for(0, None, &facts)
            .iter()
            .map(|e| e.executor.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(128), ["cudnn", "chunked", "reference"]);
    assert_eq!(names(512), ["chunked", "reference"]);
    let declared: Vec<&str> = policy
        .executor_chain(0, None)
        .iter()
        .map(|e| e.executor.as_str())
        .collect();
    assert_eq!(declared, ["cudnn", "chunked", "reference"]);
}

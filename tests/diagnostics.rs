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

/// Executor chains are checked against the catalogue the loader is given: an unknown executor
/// (with a did-you-mean) and an unknown variant are errors with their location.
#[test]
fn unknown_executor() {
    use attn_policy::{CatalogueEntry, ExecutorCatalogue, PackError, PackSpec, Provider};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid/unknown_executor");
    let mut catalogue = ExecutorCatalogue::new();
    for name in ["cudnn", "chunked", "reference"] {
        catalogue.add(CatalogueEntry {
            name: name.into(),
            description: String::new(),
            provider: Provider::Builtin,
            admits: Vec::new(),
        });
    }
    let err = PackSpec::dir(&dir)
        .with_catalogue(std::sync::Arc::new(catalogue))
        .load()
        .expect_err("unknown executor");
    let PackError::Load(err) = err else {
        panic!("expected load diagnostics, got {err}")
    };
    let text = err
        .render(false)
        .replace(&format!("{}/", dir.display()), "");
    insta::assert_snapshot!(text);
    // Without a catalogue the names are not checked, but the unknown variant still is.
    let err = Policy::from_dir(&dir).expect_err("unknown variant");
    assert_eq!(err.diagnostics.0.len(), 1, "{}", err.render(false));
    assert_eq!(err.diagnostics.0[0].code, "E-EXECUTOR");
}

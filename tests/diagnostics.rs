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
);

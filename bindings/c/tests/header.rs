//! The committed header must match what cbindgen generates from the sources.
//! `ATTN_POLICY_BLESS=1 cargo test` rewrites it.

use std::path::Path;

#[test]
fn header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("utf-8 header");
    let path = dir.join("include/attn_policy.h");
    if std::env::var_os("ATTN_POLICY_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write header");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        committed, generated,
        "include/attn_policy.h is stale: run `ATTN_POLICY_BLESS=1 cargo test` in bindings/c"
    );
}

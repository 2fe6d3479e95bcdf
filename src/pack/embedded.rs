//! Packs compiled into the binary (build.rs lists every file under rules/), so the CLI and the
//! bindings work from any directory.

include!(concat!(env!("OUT_DIR"), "/embedded_packs.rs"));

/// Names of the embedded packs.
pub fn pack_names() -> Vec<&'static str> {
    let mut names: Vec<&str> = EMBEDDED.iter().map(|(pack, _, _)| *pack).collect();
    names.dedup();
    names
}

/// The text of `file` in embedded pack `pack`.
pub fn file(pack: &str, file: &str) -> Option<&'static str> {
    EMBEDDED
        .iter()
        .find(|(p, f, _)| *p == pack && *f == file)
        .map(|(_, _, text)| *text)
}

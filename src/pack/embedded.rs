//! Packs compiled into the binary (build.rs lists every file under rules/), so the CLI and the
//! bindings work from any directory.

include!(concat!(env!("OUT_DIR"), "/embedded_packs.rs"));

/// Names of the embedded packs (`native`, `te`, `torch`), without their releases.
pub fn pack_names() -> Vec<&'static str> {
    let mut names: Vec<&str> = EMBEDDED.iter().map(|(pack, _, _)| *pack).collect();
    names.dedup();
    names
}

/// Every name an embedded pack answers to: each pack followed by its releases (`te`,
/// `te@2.18.0`, `te@2.19.0`, `te@2.20.2`, `torch`).
pub fn all_names() -> Vec<&'static str> {
    let mut out = Vec::new();
    for n in pack_names() {
        out.push(n);
        out.extend(RELEASES.iter().filter(|(_, p)| *p == n).map(|(r, _)| *r));
    }
    out
}

/// The `<pack>@<release>` names of pack `pack`'s releases.
pub fn release_names(pack: &str) -> Vec<&'static str> {
    RELEASES
        .iter()
        .filter(|(_, p)| *p == pack)
        .map(|(r, _)| *r)
        .collect()
}

/// The text of `file` in embedded pack `pack` (`te@2.19.0` reads `te`'s files).
pub fn file(pack: &str, file: &str) -> Option<&'static str> {
    let pack = super::release::split_name(pack).0;
    EMBEDDED
        .iter()
        .find(|(p, f, _)| *p == pack && *f == file)
        .map(|(_, _, text)| *text)
}

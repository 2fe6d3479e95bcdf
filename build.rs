//! Embeds every file of every pack under rules/ (rules/<pack>/<file>.yaml) into the binary.

use std::fs;
use std::path::Path;

fn main() {
    // The manifest dir as cargo sets it when it *runs* this script (not `env!`, which would bake
    // in the path where the script was compiled: a target dir shared by two checkouts would
    // then embed the other checkout's packs, or none).
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest).join("rules");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut entries = Vec::new();
    // A binary without its packs cannot decide anything: fail the build instead.
    let packs = fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("cannot read the rule packs in {}: {e}", root.display()));
    {
        for pack in packs.flatten() {
            let path = pack.path();
            if !path.is_dir() {
                continue;
            }
            println!("cargo:rerun-if-changed={}", path.display());
            let pack_name = pack.file_name().to_string_lossy().into_owned();
            for file in fs::read_dir(&path).expect("read pack dir").flatten() {
                let fpath = file.path();
                if fpath.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                    println!("cargo:rerun-if-changed={}", fpath.display());
                    entries.push((
                        pack_name.clone(),
                        file.file_name().to_string_lossy().into_owned(),
                        fpath,
                    ));
                }
            }
        }
    }
    assert!(
        !entries.is_empty(),
        "no rule pack files (rules/<pack>/*.yaml) under {}",
        root.display()
    );
    entries.sort();
    let entries_for_releases = entries.clone();
    let mut out = String::from(
        "/// (pack, file, text) of every embedded pack file.\npub static EMBEDDED: &[(&str, &str, &str)] = &[\n",
    );
    for (pack, file, path) in entries {
        out.push_str(&format!(
            "    ({pack:?}, {file:?}, include_str!({:?})),\n",
            path.display().to_string()
        ));
    }
    out.push_str("];\n");
    // `<pack>@<release>` for each key of a pack.yaml's top-level `releases:` map (the loader
    // checks the map itself; this only lists the names, for did-you-mean and `PackSpec::parse`).
    out.push_str(
        "/// (`<pack>@<release>`, pack) of every release an embedded pack mirrors.\npub static RELEASES: &[(&str, &str)] = &[\n",
    );
    let mut packs: Vec<String> = Vec::new();
    for (pack, file, path) in &entries_for_releases {
        if file != "pack.yaml" || packs.contains(pack) {
            continue;
        }
        packs.push(pack.clone());
        let text = fs::read_to_string(path).expect("read pack.yaml");
        let mut inside = false;
        for line in text.lines() {
            if line.starts_with("releases:") {
                inside = true;
                continue;
            }
            if inside {
                if !line.starts_with(' ') && !line.trim().is_empty() && !line.starts_with('#') {
                    break;
                }
                let key = line.strip_prefix("  ").filter(|k| !k.starts_with(' '));
                if let Some((release, _)) = key.and_then(|k| k.split_once(':')) {
                    let release = release.trim().trim_matches('"');
                    if release.starts_with(|c: char| c.is_ascii_digit()) {
                        out.push_str(&format!("    (\"{pack}@{release}\", {pack:?}),\n"));
                    }
                }
            }
        }
    }
    out.push_str("];\n");
    let dest = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("embedded_packs.rs");
    fs::write(dest, out).expect("write embedded_packs.rs");
}

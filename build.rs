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
    let dest = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("embedded_packs.rs");
    fs::write(dest, out).expect("write embedded_packs.rs");
}

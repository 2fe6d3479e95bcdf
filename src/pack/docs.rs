//! docs/definitions.md, generated from the embedded packs (`tests/docs.rs` fails when the file
//! differs; `UPDATE_DOCS=1` regenerates it). Apart from [`shown`](super::shown): the page loads
//! packs, and the loader builds on `shown`.

use super::embedded::pack_names;
use super::shown::definitions_table;
use super::spec::PackSpec;

/// docs/definitions.md: the public definitions of every embedded pack (`tests/docs.rs` keeps
/// the file current).
pub fn definitions_page() -> String {
    let mut out = String::from(
        "# Definitions explanations name\n\n\
         Generated from the embedded packs (`public_defs:` in each pack.yaml; `attn-policy facts \
         --pack P` prints the same table after the facts, and a test keeps this file current: \
         `UPDATE_DOCS=1 cargo test --test docs` rewrites it).\n\n\
         A pack's `defs:` name derived conditions and values its rules share. Explanations \
         (text, `explain/v1` JSON, why-not, matrices, the Python `Decision`) name only facts \
         (`attn-policy facts --pack P`) and the public definitions below, each with what it \
         means; every other definition is shown as the condition it stands for, written out \
         (`fa4_inst` as `flash_attn_versions.v4 != null`). \"Stands for\" is a public \
         definition with the internal definitions it uses written out.\n",
    );
    for name in pack_names() {
        out.push_str(&format!("\n## Pack `{name}`\n\n"));
        match PackSpec::embedded(name).load() {
            Ok(policy) => out.push_str(&definitions_table(&policy)),
            Err(e) => out.push_str(&format!("(the pack does not load: {e})\n")),
        }
    }
    out
}

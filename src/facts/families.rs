//! The registry of compiled-in fact families. Each family's file (`te.rs`, `torch.rs`) builds on
//! the schema types; this file names the families, and no family file names it, so adding a
//! family is a new file and one entry here.

use super::schema::Schema;
use super::te::TE;
use super::torch::TORCH;

/// Every compiled-in family, by name.
pub fn families() -> [&'static Schema; 2] {
    [&*TE, &*TORCH]
}

/// The family a pack names (`family: te`).
pub fn family(name: &str) -> Option<&'static Schema> {
    families().into_iter().find(|s| s.family == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_family_default_is_valid() {
        for schema in families() {
            schema
                .read(&json!({}))
                .unwrap_or_else(|e| panic!("{}: {e}", schema.family));
        }
    }
}

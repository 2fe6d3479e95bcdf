//! Reading a config never panics: the input is JSON or YAML text (a config object or a whole
//! conformance record), read with key positions and duplicate-key checks, typed and validated
//! against the te family (domains, constraints); a config that reads is then decided and
//! explained. Every error must be an `InputError` with a location.
#![no_main]

use std::sync::LazyLock;

use attn_policy::facts::ConfigText;
use attn_policy::facts::te::TE;
use attn_policy::{Explanation, Policy};
use libfuzzer_sys::fuzz_target;

static POLICY: LazyLock<Policy> = LazyLock::new(|| Policy::embedded("te").expect("te pack"));

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let parsed = match ConfigText::parse("fuzz.json", text) {
        Ok(t) => t.into_config(),
        Err(e) => {
            assert!(e.location.is_some(), "a syntax error without a location: {e}");
            return;
        }
    };
    match parsed.read(&TE) {
        Ok(facts) => {
            let d = POLICY.decide(&facts);
            let _ = Explanation::new(&POLICY, &facts, &d).to_json();
        }
        Err(e) => {
            assert!(e.location.is_some(), "an input error without a location: {e}");
            let _ = e.to_string();
        }
    }
});

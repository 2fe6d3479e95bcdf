//! Loading a pack never panics: the input is split into a pack.yaml and one backend file, and
//! a successful load is then asked to decide on default facts.
#![no_main]

use std::sync::atomic::{AtomicU64, Ordering};

use attn_policy::{Facts, PackSource, load_pack};
use libfuzzer_sys::fuzz_target;

static N: AtomicU64 = AtomicU64::new(0);

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (pack, backend) = text.split_once("\n---\n").unwrap_or((text, ""));
    let dir = std::env::temp_dir().join(format!("attn-policy-fuzz-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed) % 4));
    let _ = std::fs::create_dir_all(&dir);
    if std::fs::write(dir.join("pack.yaml"), pack).is_err() || std::fs::write(dir.join("b.yaml"), backend).is_err() {
        return;
    }
    if let Ok(policy) = load_pack(PackSource::Dir(dir), &[]) {
        let d = policy.decide(&Facts::defaults());
        let _ = attn_policy::Explanation::new(&policy, &Facts::defaults(), &d).to_json();
    }
});

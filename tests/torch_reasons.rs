//! PyTorch's own reasons against the `torch` pack's rules, on the public SDPA corpus
//! (tests/corpora/torch-2.11-sdpa-corpus-a.jsonl.gz, shipped in the repository).
//!
//! For a backend forced on its own, PyTorch 2.11 prints the warning of the *first* check that
//! fails (`select_sdp_backend` re-runs `can_use_*` with `debug=true`). The pack lists each
//! backend's rules in PyTorch's check order, so the first rule that fires must be the one whose
//! cause PyTorch names. `REASONS` is the reviewed mapping from PyTorch's warning texts
//! (sdp_utils.cpp / sdp_utils_cpp.h, quoted by their opening words) to the pack's rule of that
//! check, per backend; a text the table does not know fails the test.

use std::collections::BTreeMap;
use std::path::Path;

use attn_policy::conformance::{TORCH_BACKENDS, torch_record_facts};
use attn_policy::read_corpus;
use attn_policy::{Decision, Policy};

const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/corpora/torch-2.11-sdpa-corpus-a.jsonl.gz"
);

/// (opening words of PyTorch's warning, rule id after `<backend>.`). Reviewed against the
/// TORCH_WARN sites: each text is emitted by exactly the check the rule mirrors.
const REASONS: &[(&str, &str)] = &[
    // H:303-320 check_tensor_shapes
    (
        "All fused kernels requires query, key and value to be 4 dimensional",
        "rank",
    ),
    // H:259-267 check_for_attn_mask
    (
        "Flash Attention does not support non-null attn_mask",
        "mask",
    ),
    // S:147-216 check_head_dim_size_flash
    (
        "Flash attention requires q,k,v to have the same last dimension and to be less than or equal to 256",
        "head_dim",
    ),
    // S:298-352, S:355-412, S:658-680 hardware support
    (
        "Flash attention only supports gpu architectures in the range",
        "arch",
    ),
    (
        "Mem Efficient Attention only supports gpu architectures in the range",
        "arch",
    ),
    (
        "cuDNN MHA only supports gpu architectures in the range",
        "arch",
    ),
    // S:415-447
    (
        "Flash attention currently doesn't support training with head_dim",
        "train_head_dim",
    ),
    // S:449-465 check_flash_causal_non_square_seqlens
    (
        "Flash attention does not support the is_causal flag when seqlen_q != seqlen_k",
        "causal_nonsquare",
    ),
    // H:80-106 check_tensor_dtype (flash, efficient and cuDNN dtype lists)
    ("Expected query, key and value to all be of dtype", "dtype"),
    // S:247-270 check_head_dim_size_mem_efficient
    (
        "Mem efficient attention requires last dimension of inputs to be divisible by",
        "head_dim",
    ),
    // H:396-409, H:415-430 check_batch_size_and_num_heads_dense
    (
        "For dense inputs, both fused kernels require query, key and value to have the same batch_size",
        "batch",
    ),
    (
        "For dense input, both fused kernels require query, key and value to have the same num_heads",
        "heads",
    ),
    // H:338-375 check_grouped_query_attention
    (
        "Both fused kernels require key and value to have the same num_heads and batch_size",
        "gqa_kv_heads",
    ),
    (
        "The number of heads in key/value must divide number of heads in query",
        "gqa_divide",
    ),
    // H:476-489, H:491-533 (dense)
    (
        "All fused kernels do not support zero seq_len_q or seq_len_kv",
        "seqlen_zero",
    ),
    (
        "All fused kernels require the last dimension of the input to have stride 1",
        "stride",
    ),
    // S:736-747, H:287-300, S:752-771, S:682-697 (cuDNN)
    ("cuDNN SDPA is not deterministic", "deterministic"),
    ("Please use the following attn mask shapes", "mask_shape"),
    ("Torch was not compiled with cuDNN attention", "not_built"),
    ("cuDNN version too old to use cuDNN Attention", "too_old"),
    (
        "cuDNN version does not support droppout in SDPA (9.11 - 9.13)",
        "dropout_9_11",
    ),
    (
        "Experimental cuDNN SDPA nested tensor support is not enabled",
        "nested_env",
    ),
    (
        "cuDNN SDPA supports nested tensors on SM 9.0, SM 10.0",
        "nested_arch",
    ),
    // S:527-587 check_cudnn_tensor_shapes
    ("head_dim should be no more than", "head_dim_limit"),
    ("head_dim should be a multiple of 8", "head_dim_8"),
    (
        "cudnn SDPA does not support key/value sequence length 1",
        "kv_len_1",
    ),
    (
        "cudnn SDPA does not support query sequence length 1 with dropout",
        "q_len_1_dropout",
    ),
    // nested inputs: S:218-245, H:139-224, H:248-257, H:322-335, H:434-474
    (
        "For NestedTensor inputs, Flash attention requires q,k,v to have the same last dimension",
        "nested_head_dim",
    ),
    (
        "Memory efficient attention currently doesn't support training with NT inputs",
        "nested_train",
    ),
    (
        "Both fused kernels require query, key and value to have broadcastable batch size",
        "nested_batch_bcast",
    ),
    (
        "Both fused kernels require query, key and value to have broadcastable num heads",
        "nested_heads_bcast",
    ),
    (
        "For both fused kernels, if one of key/value batch_size requires broadcasting",
        "nested_kv_bcast",
    ),
    (
        "Fused kernels do not support ragged num_head_dims",
        "nested_ragged_heads",
    ),
    (
        "Fused kernels do not support seq_len == 0",
        "nested_empty_seq",
    ),
];

/// One message, two checks (check_batch_size_nested and check_for_seq_len_0_nested_tensor).
const NESTED_TRAIN: (&str, [&str; 2]) = (
    "Both fused kernels do not support training with broadcasted NT inputs",
    ["nested_batch_train", "nested_heads_train"],
);

/// Rules whose check prints nothing, or only once per process (TORCH_WARN_ONCE): a record can
/// show no reason for a backend these decline.
const SILENT: &[&str] = &[
    "cudnn.mask_grad",
    "cudnn.mask_len",
    "cudnn.kv_len_1",
    "cudnn.q_len_1_dropout",
];

/// The rule ids a PyTorch warning of `backend` names.
fn mapped(backend: &str, text: &str) -> Option<Vec<String>> {
    // The dropout warning starts with the cuDNN version number.
    let hit = |p: &str| text.starts_with(p) || (p.starts_with("cuDNN version") && text.contains(p));
    if hit(NESTED_TRAIN.0) {
        return Some(
            NESTED_TRAIN
                .1
                .iter()
                .map(|s| format!("{backend}.{s}"))
                .collect(),
        );
    }
    let found: Vec<&str> = REASONS
        .iter()
        .filter(|(p, _)| hit(p))
        .map(|(_, s)| *s)
        .collect();
    match found.as_slice() {
        [one] => Some(vec![format!("{backend}.{one}")]),
        _ => None,
    }
}

/// Rules that fired for `backend`, in pack order.
fn fired_for(policy: &Policy, d: &Decision, backend: &str) -> Vec<String> {
    let b = policy.backend_index(backend).expect("backend in pack") as u16;
    d.fired
        .iter()
        .map(|&i| &policy.rules[i as usize])
        .filter(|r| r.backend == b)
        .map(|r| r.id.clone())
        .collect()
}

#[test]
fn every_mapped_rule_exists_in_the_pack() {
    let policy = Policy::embedded("torch").expect("torch pack loads");
    let suffixes = REASONS
        .iter()
        .map(|(_, s)| *s)
        .chain(NESTED_TRAIN.1.iter().copied());
    for suffix in suffixes {
        assert!(
            ["flash", "efficient", "cudnn"]
                .iter()
                .any(|b| policy.rule_index(&format!("{b}.{suffix}")).is_some()),
            "no backend has a rule `.{suffix}`"
        );
    }
    for id in SILENT {
        assert!(policy.rule_index(id).is_some(), "{id}");
    }
}

#[test]
fn pytorch_reasons_are_the_first_rule_that_declines() {
    assert!(
        Path::new(CORPUS).exists(),
        "corpus missing: {CORPUS} (shipped in tests/corpora/)"
    );
    let policy = Policy::embedded("torch").expect("torch pack loads");
    let records = read_corpus(Path::new(CORPUS)).expect("corpus reads");
    assert_eq!(records.len(), 20_000);
    let mut matched: BTreeMap<String, usize> = BTreeMap::new();
    let mut silent: BTreeMap<String, usize> = BTreeMap::new();
    let mut problems = Vec::new();
    for rec in &records {
        let facts = torch_record_facts(&policy, &rec.raw).expect("config reads");
        let d = policy.decide(&facts);
        for backend in TORCH_BACKENDS {
            let fired = fired_for(&policy, &d, backend);
            let reasons: Vec<&str> = rec.raw["reasons"][backend]
                .as_array()
                .expect("reasons per backend")
                .iter()
                .map(|t| t.as_str().expect("text"))
                .collect();
            let eligible = rec.raw["eligible"][backend].as_bool().expect("eligible");
            match reasons.first() {
                Some(text) => {
                    let Some(ids) = mapped(backend, text) else {
                        problems.push(format!("{}: {backend}: unmapped text {text:?}", rec.id));
                        continue;
                    };
                    match fired.first() {
                        Some(first) if ids.contains(first) => {
                            *matched.entry(first.clone()).or_default() += 1;
                        }
                        other => problems.push(format!(
                            "{}: {backend}: PyTorch says {text:?} ({ids:?}); first rule of the pack: {other:?} (fired {fired:?})",
                            rec.id
                        )),
                    }
                }
                None if !eligible => match fired.first() {
                    Some(first) if SILENT.contains(&first.as_str()) => {
                        *silent.entry(first.clone()).or_default() += 1;
                    }
                    other => problems.push(format!(
                        "{}: {backend}: declined without a warning, but the pack's first rule is {other:?}",
                        rec.id
                    )),
                },
                None => assert!(
                    fired.is_empty(),
                    "{}: {backend} eligible, yet the pack fired {fired:?}",
                    rec.id
                ),
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} mismatches, first: {:#?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
    // What corpus A exercises (reviewed against its reasons, see docs/packs/torch.md).
    let count = |m: &BTreeMap<String, usize>, id: &str| m.get(id).copied().unwrap_or(0);
    assert_eq!(count(&matched, "flash.mask"), 6157);
    assert_eq!(count(&matched, "flash.head_dim"), 4028);
    assert_eq!(count(&matched, "efficient.stride"), 4756);
    assert_eq!(count(&matched, "efficient.heads"), 3181);
    assert_eq!(count(&matched, "cudnn.dtype"), 4945);
    assert_eq!(count(&matched, "cudnn.head_dim_limit"), 2194);
    assert_eq!(count(&matched, "cudnn.kv_len_1"), 1);
    assert_eq!(count(&silent, "cudnn.kv_len_1"), 995);
    assert_eq!(count(&silent, "cudnn.q_len_1_dropout"), 65);
    let total: usize = matched.values().sum();
    assert_eq!(
        total, 36_445,
        "records x backends with a PyTorch reason: {matched:#?}"
    );
}

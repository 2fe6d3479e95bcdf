//! GPU test of the `frost` executor's rules on the H200: environment and version probes, the
//! plan-name check on the d = 512 forward (a non-FROST plan is refused, naming it), declines.
//! Prints a skip reason and returns without a GPU or without the cuDNN frontend package.
#![cfg(feature = "frost")]

use attn_policy_adapters::cudnn::Direction;
use attn_policy_adapters::frost::bridge::FrostExecutor;
use attn_policy_adapters::frost::{FrostError, PlanClass, classify_plan};
use attn_policy_adapters::{
    AttentionProblem, DType, ExecError, Executor, ForwardInputs, MaskSpec, run_forward,
};

#[test]
fn d512_forward_is_frost_or_refused_by_name() {
    let mut ex = match FrostExecutor::new(0) {
        Ok(e) => e,
        Err(e) => {
            println!("SKIPPED (no GPU or no cuDNN frontend here): {e}");
            return;
        }
    };
    match attn_policy_adapters::cudnn::runtime_version() {
        Ok(v) => println!("cudnnGetVersion() = {}", v.0),
        Err(e) => println!("cudnnGetVersion() unavailable: {e}"),
    }
    println!("environment: {:?}", ex.env());
    println!("environment declines: {:?}", ex.env().decline_reasons());
    assert!(
        ex.env().engines_enabled,
        "the FROST switch must be on before the import"
    );

    let mut p = AttentionProblem::new(2, 8, 4, 1024, 1024, 512, 512, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_TOP_LEFT);
    p.deterministic = false;

    // 1. with the environment checks (the default): a missing/old cutlass-dsl declines up front
    let strict = ex.frost_plan(&p, Direction::Forward);
    println!("strict environment, d512 fwd: {strict:?}");
    if !ex.env().decline_reasons().is_empty() {
        assert!(matches!(strict, Err(FrostError::Declined(_))));
    }

    // 2. the plan-name check alone, against what cuDNN really offers here
    ex.strict_env = false;
    // The executor as the registry hands it out: a shared handle.
    let ex = std::sync::Arc::new(ex);
    println!("device: {}", ex.device_description());
    let named = ex.frost_plan(&p, Direction::Forward);
    match &named {
        Ok(plan) => {
            println!("FROST plan selected: {plan:?}");
            assert!(matches!(
                classify_plan(&plan.name, None),
                PlanClass::Frost(_)
            ));
        }
        Err(e @ FrostError::NotFrost { plans, .. }) => {
            println!("refused as required: {e}");
            assert!(!plans.is_empty());
            // the host path refuses too, before running anything
            let inp = attn_policy_adapters::trial::random_inputs(&p, 3);
            let r = run_forward(
                &ex,
                &p,
                &ForwardInputs {
                    q: &inp.q,
                    k: &inp.k,
                    v: &inp.v,
                    sink: None,
                },
            );
            match r {
                Err(ExecError::Unsupported { reason }) => {
                    println!("forward(): unsupported: {reason}");
                    assert!(reason.contains("refused"));
                }
                other => panic!(
                    "a non-FROST plan must not run: {:?}",
                    other.map(|o| o.stats)
                ),
            }
        }
        Err(e) => panic!("unexpected: {e}"),
    }
    // cached: the same answer without rebuilding
    assert_eq!(
        format!("{:?}", ex.frost_plan(&p, Direction::Forward)),
        format!("{named:?}")
    );

    // 3. declines from the gate
    let mut det = p.clone();
    det.deterministic = true;
    let e = ex.frost_plan(&det, Direction::Forward).unwrap_err();
    println!("deterministic: {e}");
    assert!(e.to_string().contains("deterministic"));
    if ex.compute_capability() == 90 {
        let e = ex.frost_plan(&p, Direction::Backward).unwrap_err();
        println!("SM90 backward: {e}");
        assert!(e.to_string().contains("SM90 backward"));
    }
}

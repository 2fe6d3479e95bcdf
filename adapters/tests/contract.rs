//! The executor contract on the CPU: every run goes through `Executor::plan` and a `Plan`, the
//! reference's included; io of the other direction than the plan's is a typed
//! `ExecError::InvalidInput`, never a panic; the defaults of a plan without a stream or device
//! path refuse with `Unsupported`; the reference's `Plan::enqueue` (the Python binding's CPU
//! path, on host pointers) computes what its `Plan::run_host` computes.

use attn_policy_adapters::reference::Reference;
use attn_policy_adapters::trial::random_inputs;
use attn_policy_adapters::{
    AttentionProblem, BackwardInputs, DType, DeviceBackwardArgs, DeviceForwardArgs, DeviceIo,
    Direction, ExecError, Executor, ForwardInputs, HostIo, MaskSpec, Plan, StreamLaunch,
    run_backward, run_forward,
};

fn problem() -> AttentionProblem {
    AttentionProblem::new(1, 4, 2, 24, 40, 16, 16, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT)
}

const HOST: StreamLaunch = StreamLaunch {
    device: 0,
    stream: 0,
    workspace: 0,
    workspace_bytes: 0,
};

#[test]
fn a_plan_runs_its_own_direction_and_refuses_the_other_typed() {
    let p = problem();
    let inp = random_inputs(&p, 11);
    let fin = ForwardInputs {
        q: &inp.q,
        k: &inp.k,
        v: &inp.v,
        sink: None,
    };
    let fwd = Reference
        .plan(&p, Direction::Forward)
        .expect("forward plan");
    let bwd = Reference
        .plan(&p, Direction::Backward)
        .expect("backward plan");
    assert_eq!(fwd.direction(), Direction::Forward);
    assert_eq!(bwd.direction(), Direction::Backward);
    assert_eq!(fwd.executor(), "reference");
    let out = fwd
        .run_host(HostIo::Forward(fin))
        .and_then(|o| o.into_forward())
        .expect("forward");
    let bin = BackwardInputs {
        q: &inp.q,
        k: &inp.k,
        v: &inp.v,
        o: &out.o,
        d_o: &inp.d_o,
        lse: &out.lse,
        sink: None,
    };
    let e = fwd.run_host(HostIo::Backward(bin)).unwrap_err();
    assert!(matches!(e, ExecError::InvalidInput { .. }), "{e}");
    let e = bwd.run_host(HostIo::Forward(fin)).unwrap_err();
    assert!(matches!(e, ExecError::InvalidInput { .. }), "{e}");
    // A forward output is not a backward's.
    let again = fwd.run_host(HostIo::Forward(fin)).expect("forward");
    assert!(matches!(
        again.into_backward(),
        Err(ExecError::InvalidInput { .. })
    ));
    // The device io of the other direction is refused before any pointer is read.
    let null_fwd = DeviceIo::Forward(DeviceForwardArgs {
        q: 0,
        k: 0,
        v: 0,
        o: 0,
        lse: 0,
        sink: 0,
    });
    // SAFETY: the io is refused for its direction before any pointer is read.
    let e = unsafe { bwd.enqueue(&null_fwd, &HOST) }.unwrap_err();
    assert!(matches!(e, ExecError::InvalidInput { .. }), "{e}");
    // The reference has no synchronous device path (the benches').
    // SAFETY: the default refuses without reading the io.
    let e = unsafe { fwd.run_device(&null_fwd) }.unwrap_err();
    assert!(e.is_unsupported(), "{e}");
}

#[test]
fn the_whole_path_helpers_match_the_plans() {
    let p = problem();
    let inp = random_inputs(&p, 12);
    let fin = ForwardInputs {
        q: &inp.q,
        k: &inp.k,
        v: &inp.v,
        sink: None,
    };
    let a = run_forward(&Reference, &p, &fin).expect("forward");
    let b = Reference
        .plan(&p, Direction::Forward)
        .and_then(|plan| plan.run_host(HostIo::Forward(fin)))
        .and_then(|o| o.into_forward())
        .expect("forward");
    assert_eq!(a.o, b.o);
    let bin = BackwardInputs {
        q: &inp.q,
        k: &inp.k,
        v: &inp.v,
        o: &a.o,
        d_o: &inp.d_o,
        lse: &a.lse,
        sink: None,
    };
    let g = run_backward(&Reference, &p, &bin).expect("backward");
    assert!(g.dq.data.iter().any(|&x| x != 0));
    // A refused problem is refused by `check` and by `plan`, typed.
    // 4 query heads over 3 KV heads: not a problem the reference (or anyone) runs.
    let uneven = AttentionProblem::new(1, 4, 3, 24, 40, 16, 16, DType::BF16);
    assert!(Reference.check(&uneven).is_err());
    assert!(
        Reference
            .plan(&uneven, Direction::Forward)
            .unwrap_err()
            .is_unsupported()
    );
}

#[test]
fn the_reference_enqueue_on_host_pointers_matches_its_host_run() {
    let p = problem();
    let inp = random_inputs(&p, 13);
    let fin = ForwardInputs {
        q: &inp.q,
        k: &inp.k,
        v: &inp.v,
        sink: None,
    };
    let fwd = Reference.plan(&p, Direction::Forward).expect("plan");
    assert_eq!(fwd.workspace_bytes().expect("host: no workspace"), 0);
    let want = fwd
        .run_host(HostIo::Forward(fin))
        .and_then(|o| o.into_forward())
        .expect("forward");
    let mut o = vec![0u16; p.o_span()];
    let mut lse = vec![0f32; p.lse_len()];
    let io = DeviceIo::Forward(DeviceForwardArgs {
        q: inp.q.data.as_ptr() as u64,
        k: inp.k.data.as_ptr() as u64,
        v: inp.v.data.as_ptr() as u64,
        o: o.as_mut_ptr() as u64,
        lse: lse.as_mut_ptr() as u64,
        sink: 0,
    });
    // SAFETY: host buffers of the problem's spans, live for the call (the reference runs
    // before returning); outputs distinct from inputs.
    unsafe { fwd.enqueue(&io, &HOST) }.expect("enqueue on the host");
    assert_eq!(o, want.o.data);
    assert_eq!(
        lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        want.lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    // The backward from the given O and LSE writes every gradient.
    let bwd = Reference.plan(&p, Direction::Backward).expect("plan");
    let (mut dq, mut dk, mut dv) = (
        vec![0u16; p.q_span()],
        vec![0u16; p.k_span()],
        vec![0u16; p.v_span()],
    );
    let io = DeviceIo::Backward(DeviceBackwardArgs {
        q: inp.q.data.as_ptr() as u64,
        k: inp.k.data.as_ptr() as u64,
        v: inp.v.data.as_ptr() as u64,
        o: o.as_ptr() as u64,
        d_o: inp.d_o.data.as_ptr() as u64,
        lse: lse.as_ptr() as u64,
        dq: dq.as_mut_ptr() as u64,
        dk: dk.as_mut_ptr() as u64,
        dv: dv.as_mut_ptr() as u64,
        sink: 0,
        d_sink: 0,
    });
    // SAFETY: as above.
    unsafe { bwd.enqueue(&io, &HOST) }.expect("backward on the host");
    assert!(dq.iter().any(|&x| x != 0) && dk.iter().any(|&x| x != 0));
    assert!(dv.iter().any(|&x| x != 0));
}

#[test]
fn a_plan_without_a_stream_path_refuses_by_default() {
    struct HostOnly(std::sync::Arc<dyn Plan>);
    impl Plan for HostOnly {
        fn executor(&self) -> &str {
            "host_only"
        }
        fn direction(&self) -> Direction {
            self.0.direction()
        }
        fn run_host(&self, io: HostIo<'_>) -> Result<attn_policy_adapters::HostOutput, ExecError> {
            self.0.run_host(io)
        }
    }
    let p = problem();
    let plan = HostOnly(Reference.plan(&p, Direction::Forward).expect("plan"));
    let e = plan.workspace_bytes().unwrap_err();
    assert!(
        e.is_unsupported() && e.to_string().contains("host_only: no stream path"),
        "{e}"
    );
    let io = DeviceIo::Forward(DeviceForwardArgs {
        q: 0,
        k: 0,
        v: 0,
        o: 0,
        lse: 0,
        sink: 0,
    });
    // SAFETY: the default refuses without reading the io.
    let e = unsafe { plan.enqueue(&io, &HOST) }.unwrap_err();
    assert!(e.is_unsupported(), "{e}");
}

//! A small branch-and-bound search over a [`Space`] with three-valued evaluation (`check`'s
//! `until:` lint), and pieces the `diff` engine shares ([`Cond`], [`agreed`]): a node is split
//! on a variable only while the condition is still unknown. `gaps` and the other lints use the
//! decision diagrams of [`super::mdd`].

use attn_policy::eval::program::{NodeId, Truth};
use attn_policy::facts::Value;

use super::space::{Assign, SlotMask, Space};

/// A condition compiled in a policy's program, with the facts it reads.
#[derive(Clone, Copy, Debug)]
pub struct Cond {
    pub node: NodeId,
    pub mask: SlotMask,
}

/// Outcome of a three-valued test, with the facts its unknown parts read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tri {
    pub truth: Truth,
    pub mask: SlotMask,
}

/// What the judge says about a node of the search.
pub enum Step<T> {
    /// Nothing to report anywhere below.
    Prune,
    /// The whole region below has this outcome.
    Leaf(T),
    /// Undetermined: split on a variable that these facts depend on.
    Split(SlotMask),
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Search nodes evaluated.
    pub nodes: u64,
    /// Settled regions (leaves: pruned or reported), the equivalence classes examined.
    pub classes: u64,
    /// Nodes left undetermined with nothing to split on (should stay 0).
    pub stuck: u64,
    /// The node budget ran out: the result is incomplete.
    pub truncated: bool,
}

/// Depth-first branch and bound. `found` returns false to stop the search.
pub fn search<T>(
    space: &Space,
    budget: u64,
    judge: &mut dyn FnMut(&[Value]) -> Step<T>,
    found: &mut dyn FnMut(&Assign, T) -> bool,
) -> Stats {
    let mut order: Vec<usize> = (0..space.vars.len()).collect();
    // Most-read facts first (they settle the most conditions), then fewer classes.
    order.sort_by_key(|&i| {
        (
            std::cmp::Reverse(space.reads[i]),
            space.vars[i].classes.len(),
        )
    });
    let mut rank = vec![0usize; space.vars.len()];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r;
    }
    let mut st = Stats::default();
    let mut assign: Assign = vec![None; space.vars.len()];
    let mut vals = Vec::new();
    let mut stop = false;
    rec(
        space,
        &rank,
        budget,
        judge,
        found,
        &mut assign,
        &mut vals,
        &mut st,
        &mut stop,
    );
    st
}

#[allow(clippy::too_many_arguments)]
fn rec<T>(
    space: &Space,
    rank: &[usize],
    budget: u64,
    judge: &mut dyn FnMut(&[Value]) -> Step<T>,
    found: &mut dyn FnMut(&Assign, T) -> bool,
    assign: &mut Assign,
    vals: &mut Vec<Value>,
    st: &mut Stats,
    stop: &mut bool,
) {
    if *stop {
        return;
    }
    if st.nodes >= budget {
        st.truncated = true;
        *stop = true;
        return;
    }
    st.nodes += 1;
    space.materialize(assign, vals);
    let mask = match judge(vals) {
        Step::Prune => {
            st.classes += 1;
            return;
        }
        Step::Leaf(t) => {
            st.classes += 1;
            if !found(assign, t) {
                *stop = true;
            }
            return;
        }
        Step::Split(m) => m,
    };
    let mut best: Option<usize> = None;
    let mut m = mask;
    while m != 0 {
        let s = m.trailing_zeros() as usize;
        m &= m - 1;
        if let Some(&v) = space.deps[s].iter().find(|&&v| space.available(assign, v))
            && best.is_none_or(|b| rank[v] < rank[b])
        {
            best = Some(v);
        }
    }
    let Some(v) = best else {
        st.stuck += 1;
        st.classes += 1;
        return;
    };
    for c in 0..space.vars[v].classes.len() {
        assign[v] = Some(c as u32);
        rec(space, rank, budget, judge, found, assign, vals, st, stop);
        if *stop {
            break;
        }
    }
    assign[v] = None;
}

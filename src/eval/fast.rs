//! The evaluator used on the hot path: each compiled condition becomes a tree of closures,
//! specialised for the common shapes (`fact op constant`, `enum fact in [...]`, null tests).
//! It computes exactly what [`Program::eval_memo`] computes (a test checks both agree on every
//! rule over the conformance corpus); analysis keeps using the node interpreter, which it can
//! inspect.

use std::fmt;
use std::sync::Arc;

use super::program::{
    NO_MEMO, Node, NodeId, Program, Truth, arith, call, compare, compare3, kleene, member, neg,
    not, null_test,
};
use crate::facts::Value;

type Eval = dyn Fn(&[Value], &mut [Option<Value>]) -> Value + Send + Sync;

/// One compiled condition, ready to run.
#[derive(Clone)]
pub struct FastExpr(Arc<Eval>);

impl fmt::Debug for FastExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FastExpr")
    }
}

impl FastExpr {
    /// Builds the closure tree for node `id` of `program`.
    pub fn build(program: &Program, id: NodeId) -> FastExpr {
        FastExpr(build(program, id))
    }

    #[inline]
    pub fn eval(&self, facts: &[Value], memo: &mut [Option<Value>]) -> Value {
        (self.0)(facts, memo)
    }
}

fn build(p: &Program, id: NodeId) -> Arc<Eval> {
    let inner = build_node(p, id);
    match p.memo_of.get(id as usize).copied().unwrap_or(NO_MEMO) {
        NO_MEMO => inner,
        // Leaves are cheaper to recompute than to memoise.
        _ if matches!(p.nodes[id as usize], Node::Slot(_) | Node::Const(_)) => inner,
        m => {
            let m = m as usize;
            Arc::new(move |f: &[Value], memo: &mut [Option<Value>]| {
                if let Some(Some(v)) = memo.get(m) {
                    return *v;
                }
                let v = inner(f, memo);
                if let Some(x) = memo.get_mut(m) {
                    *x = Some(v);
                }
                v
            })
        }
    }
}

fn kids(p: &Program, start: u32, len: u32) -> Vec<Arc<Eval>> {
    p.children[start as usize..(start + len) as usize]
        .iter()
        .map(|&c| build(p, c))
        .collect()
}

fn slot_of(p: &Program, id: NodeId) -> Option<usize> {
    match p.nodes[id as usize] {
        Node::Slot(s) => Some(s as usize),
        _ => None,
    }
}

fn const_of(p: &Program, id: NodeId) -> Option<Value> {
    match p.nodes[id as usize] {
        Node::Const(v) => Some(v),
        _ => None,
    }
}

fn build_node(p: &Program, id: NodeId) -> Arc<Eval> {
    match p.nodes[id as usize] {
        Node::Const(v) => Arc::new(move |_, _| v),
        Node::Slot(s) => {
            let s = s as usize;
            Arc::new(move |f, _| f[s])
        }
        Node::Not(a) => {
            let a = build(p, a);
            Arc::new(move |f, m| not(a(f, m)))
        }
        Node::And { start, len } => {
            let ks = kids(p, start, len);
            Arc::new(move |f, m| kleene(false, ks.iter().map(|k| k(f, m))))
        }
        Node::Or { start, len } => {
            let ks = kids(p, start, len);
            Arc::new(move |f, m| kleene(true, ks.iter().map(|k| k(f, m))))
        }
        Node::Cmp(op, a, b) => match (slot_of(p, a), const_of(p, b)) {
            // `fact op constant`: one load and one comparison.
            (Some(s), Some(c)) if c != Value::Unknown => Arc::new(move |f, _| {
                let x = f[s];
                if x == Value::Unknown {
                    Value::Unknown
                } else {
                    Value::Bool(compare(op, x, c))
                }
            }),
            _ => {
                let (a, b) = (build(p, a), build(p, b));
                Arc::new(move |f, m| {
                    let x = a(f, m);
                    compare3(op, x, b(f, m))
                })
            }
        },
        Node::In {
            item,
            start,
            len,
            negate,
        } => {
            let consts: Vec<Value> = p.consts[start as usize..(start + len) as usize].to_vec();
            let mask = p.enum_masks.get(start as usize).copied().flatten();
            let item = build(p, item);
            Arc::new(move |f, m| member(item(f, m), mask, &consts, negate))
        }
        Node::IsNull(a) => {
            let a = build(p, a);
            Arc::new(move |f, m| null_test(a(f, m), true))
        }
        Node::IsNotNull(a) => {
            let a = build(p, a);
            Arc::new(move |f, m| null_test(a(f, m), false))
        }
        Node::Arith(op, a, b) => {
            let (a, b) = (build(p, a), build(p, b));
            Arc::new(move |f, m| {
                let x = a(f, m);
                let y = b(f, m);
                arith(op, x, y)
            })
        }
        Node::Neg(a) => {
            let a = build(p, a);
            Arc::new(move |f, m| neg(a(f, m)))
        }
        Node::Call { func, start, len } => {
            let ks = kids(p, start, len);
            if func == super::program::Func::If && ks.len() == 3 {
                return Arc::new(move |f, m| match Truth::of(ks[0](f, m)) {
                    Truth::True => ks[1](f, m),
                    Truth::False => ks[2](f, m),
                    Truth::Unknown => Value::Unknown,
                });
            }
            Arc::new(move |f, m| {
                // Arguments are few (functions take 1-3; max/min rarely more).
                if ks.len() <= 8 {
                    let mut vals = [Value::Null; 8];
                    for (v, k) in vals.iter_mut().zip(&ks) {
                        *v = k(f, m);
                    }
                    call(func, vals[..ks.len()].iter().copied())
                } else {
                    let vals: Vec<Value> = ks.iter().map(|k| k(f, m)).collect();
                    call(func, vals.into_iter())
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;
    use crate::facts::Facts;
    use crate::facts::presets::PRESETS;

    /// The closure evaluator and the node interpreter agree on every rule, over the presets and
    /// the conformance corpus (when ../shared is present), with probes unknown and answered.
    #[test]
    fn agrees_with_the_interpreter() {
        let policy = Policy::embedded("te").expect("te pack");
        let p = &policy.program;
        let fast: Vec<FastExpr> = policy
            .rules
            .iter()
            .map(|r| FastExpr::build(p, r.when.node))
            .collect();
        let mut configs: Vec<serde_json::Value> = PRESETS.iter().map(|x| (x.config)()).collect();
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/conformance/te-2.20.2-corpus-a.jsonl.gz");
        if let Ok(records) = crate::corpus::read_corpus(&corpus) {
            configs.extend(records.into_iter().step_by(7).map(|r| r.config));
        }
        let mut compared = 0;
        for config in &configs {
            let mut facts = Facts::from_json(config).expect("valid config");
            for answer in [None, Some(true)] {
                if let Some(a) = answer {
                    facts.set_all_probes(a);
                }
                let mut memo = p.new_memo();
                for (rule, f) in policy.rules.iter().zip(&fast) {
                    let want = p.eval(rule.when.node, facts.values());
                    let got = f.eval(facts.values(), &mut memo);
                    assert_eq!(got, want, "rule {} on {config}", rule.id);
                    compared += 1;
                }
            }
        }
        assert!(compared > 1000, "compared only {compared} evaluations");
    }
}

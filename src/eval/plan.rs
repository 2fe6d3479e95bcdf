//! The decision hot path: every rule of a pack compiled to a small typed tree, evaluated
//! without closures, whose shared parts are computed once per decision.
//!
//! Rules of one pack repeat the same tests (`fp8dpa`, `not fp8dpa`, `cp`, `thd_any`, ...).
//! Each condition is flattened into its top-level conjuncts (Kleene `and` is associative and
//! commutative, so order and grouping do not change the result). A conjunct that occurs in two
//! or more rules (up to a leading `not`), and every boolean pack definition, becomes a shared
//! *atom* whose truth is kept per decision in a byte array; numeric definitions keep their value
//! in the decision's memo. Conditions ([`Cond`]) and values ([`Num`]) are small enums with fast
//! paths for the common shapes (`int fact op constant`, `enum fact in [...]`). A rule stops at its
//! first false conjunct, so for a typical input most rules cost one or two array reads.
//!
//! The result is exactly the node interpreter's ([`Program::eval`]): both share the language's
//! semantic helpers, and a test compares them on every rule over the presets and the whole
//! conformance corpus, with probes unknown, answered yes and answered no.

use std::collections::HashMap;

use super::program::{
    Func, NO_MEMO, Node, NodeId, Program, Truth, arith, call, compare, compare3, member, neg,
    null_test,
};
use crate::facts::Value;
use crate::lang::ast::{ArithOp, CmpOp};

// Truth values as bytes: `not` swaps 0 and 1 and keeps 2.
const FALSE: u8 = 0;
const TRUE: u8 = 1;
const UNKNOWN: u8 = 2;
/// An atom not yet computed in this decision.
const UNSET: u8 = 3;

#[inline(always)]
fn truth_of(v: Value) -> u8 {
    match v {
        Value::Bool(true) => TRUE,
        Value::Unknown => UNKNOWN,
        _ => FALSE,
    }
}

#[inline(always)]
fn not(t: u8) -> u8 {
    if t < UNKNOWN { t ^ 1 } else { t }
}

/// A truth as the value a boolean expression produces (`Bool` or `Unknown`).
#[inline(always)]
fn value_of(t: u8) -> Value {
    match t {
        FALSE => Value::Bool(false),
        TRUE => Value::Bool(true),
        _ => Value::Unknown,
    }
}

/// An expression in boolean position.
#[derive(Clone, Debug)]
enum Cond {
    /// A shared atom: computed once per decision.
    Atom {
        index: u16,
        negate: bool,
    },
    /// `int fact op int constant`.
    CmpInt {
        slot: u16,
        op: CmpOp,
        c: i64,
    },
    /// `enum fact == value` (`equal`) or `!=`.
    EnumEq {
        slot: u16,
        value: u16,
        equal: bool,
    },
    /// `fact op constant` for the other kinds.
    Cmp {
        slot: u16,
        op: CmpOp,
        c: Value,
    },
    /// `definition op constant`, e.g. `fq_hg != 0`.
    CmpDef {
        memo: u16,
        body: u16,
        op: CmpOp,
        c: Value,
    },
    /// `fact op fact`.
    CmpFacts {
        a: u16,
        op: CmpOp,
        b: u16,
    },
    /// `(fact arith k) op c`, e.g. `head_dim_qk % 8 != 0`.
    CmpArith {
        slot: u16,
        arith: ArithOp,
        k: Value,
        op: CmpOp,
        c: Value,
    },
    /// Any other comparison.
    CmpNum {
        op: CmpOp,
        a: Box<Num>,
        b: Box<Num>,
    },
    /// `item in [...]` / `not in`; `mask` when the list is a set of enum values.
    In {
        item: Box<Num>,
        mask: Option<u64>,
        list: Box<[Value]>,
        negate: bool,
    },
    /// `enum fact in [...]` with the list as a bit set.
    InMask {
        slot: u16,
        mask: u64,
        negate: bool,
    },
    /// `fact == null` (`want_null`) / `fact != null`.
    NullFact {
        slot: u16,
        want_null: bool,
    },
    /// A boolean fact.
    Fact {
        slot: u16,
    },
    /// `x == null` (`want_null`) / `x != null`.
    Null {
        item: Box<Num>,
        want_null: bool,
    },
    Not(Box<Cond>),
    All(Box<[Cond]>),
    Any(Box<[Cond]>),
    /// A value in boolean position (a constant, `if(...)`).
    Value(Box<Num>),
}

/// An expression in value position.
#[derive(Clone, Debug)]
enum Num {
    Const(Value),
    Slot(u16),
    /// A pack definition: its value is memoised per decision (`memo[index]`).
    Def {
        memo: u16,
        body: u16,
    },
    Arith(ArithOp, Box<Num>, Box<Num>),
    Neg(Box<Num>),
    /// `if(cond, a, b)`: only the chosen branch is evaluated; unknown when `cond` is.
    If(Box<Cond>, Box<Num>, Box<Num>),
    Call(Func, Box<[Num]>),
    /// A boolean expression's value.
    Truth(Box<Cond>),
}

/// All rules of a pack, ready for [`RulePlan::eval_rule`].
#[derive(Clone, Debug, Default)]
pub struct RulePlan {
    atoms: Vec<Cond>,
    /// Bodies of the numeric definitions `Num::Def` refers to.
    defs: Vec<Num>,
    /// Per rule: the conjunction of its conjuncts.
    rules: Vec<Box<[Cond]>>,
    /// Conjuncts shared by several rules, tested first: one false gate rules out every rule
    /// that has it as a conjunct, without visiting them.
    gates: Vec<Gate>,
    /// Words per rule bit set.
    words: usize,
    /// Other conditions a decision reads (variant applicability, preference), by index.
    extras: Vec<Cond>,
}

/// A conjunct shared by several rules and the rules it rules out.
#[derive(Clone, Debug)]
struct Gate {
    cond: Cond,
    /// The words of the rule bit set it touches.
    words: Box<[GateWord]>,
}

#[derive(Clone, Copy, Debug)]
struct GateWord {
    word: usize,
    /// Rules with the gate as a conjunct (false when the gate is false).
    if_false: u64,
    /// Rules with `not gate` as a conjunct (false when the gate is true).
    if_true: u64,
}

/// Per-decision scratch: the truth of each atom (or `UNSET`) and the rules still live.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AtomScratch {
    atoms: Vec<u8>,
    live: Vec<u64>,
}

fn is_def(p: &Program, id: NodeId) -> bool {
    p.memo_of.get(id as usize).is_some_and(|&m| m != NO_MEMO)
}

struct Builder<'p> {
    p: &'p Program,
    atoms: Vec<Option<Cond>>,
    atom_of: HashMap<String, u16>,
    defs: Vec<Option<Num>>,
    def_of: HashMap<NodeId, u16>,
    /// How many rules' top-level conjuncts each structural key occurs in.
    shared: HashMap<String, usize>,
}

impl Builder<'_> {
    fn slot(&self, n: NodeId) -> Option<u16> {
        match self.p.nodes[n as usize] {
            Node::Slot(s) => Some(s),
            _ => None,
        }
    }

    fn konst(&self, n: NodeId) -> Option<Value> {
        match self.p.nodes[n as usize] {
            Node::Const(v) if v != Value::Unknown => Some(v),
            _ => None,
        }
    }

    fn kids(&self, start: u32, len: u32) -> Vec<NodeId> {
        self.p.children[start as usize..(start + len) as usize].to_vec()
    }

    /// The atom for `id` (keyed structurally), built on first use.
    fn atom(&mut self, id: NodeId, key: String) -> Cond {
        if let Some(&index) = self.atom_of.get(&key) {
            return Cond::Atom {
                index,
                negate: false,
            };
        }
        if self.atoms.len() >= u16::MAX as usize {
            return self.cond_body(id);
        }
        let index = self.atoms.len() as u16;
        self.atom_of.insert(key, index);
        self.atoms.push(None);
        let body = self.cond_body(id);
        self.atoms[index as usize] = Some(body);
        Cond::Atom {
            index,
            negate: false,
        }
    }

    /// `id` in boolean position: a definition becomes an atom.
    fn cond(&mut self, id: NodeId) -> Cond {
        if is_def(self.p, id) {
            return self.atom(id, key(self.p, id));
        }
        self.cond_body(id)
    }

    /// `id`'s own structure in boolean position (not looking it up as a definition).
    fn cond_body(&mut self, id: NodeId) -> Cond {
        match self.p.nodes[id as usize] {
            Node::Slot(slot) => Cond::Fact { slot },
            Node::Not(a) => match self.cond(a) {
                Cond::Atom { index, negate } => Cond::Atom {
                    index,
                    negate: !negate,
                },
                c => Cond::Not(Box::new(c)),
            },
            Node::And { start, len } => Cond::All(
                self.kids(start, len)
                    .into_iter()
                    .map(|c| self.cond(c))
                    .collect(),
            ),
            Node::Or { start, len } => Cond::Any(
                self.kids(start, len)
                    .into_iter()
                    .map(|c| self.cond(c))
                    .collect(),
            ),
            Node::Cmp(op, a, b) => match (self.slot(a), self.konst(b), self.slot(b)) {
                (Some(slot), Some(Value::Int(c)), _) => Cond::CmpInt { slot, op, c },
                (Some(slot), Some(Value::Enum(value)), _)
                    if matches!(op, CmpOp::Eq | CmpOp::Ne) =>
                {
                    Cond::EnumEq {
                        slot,
                        value,
                        equal: op == CmpOp::Eq,
                    }
                }
                (Some(slot), Some(c), _) => Cond::Cmp { slot, op, c },
                (None, Some(c), _) if is_def(self.p, a) => match self.num(a) {
                    Num::Def { memo, body } => Cond::CmpDef { memo, body, op, c },
                    _ => self.cmp_num(op, a, b),
                },
                (Some(a), _, Some(b)) => Cond::CmpFacts { a, op, b },
                (None, Some(c), _) => match self.p.nodes[a as usize] {
                    Node::Arith(arith, x, k) if !is_def(self.p, a) => {
                        match (self.slot(x), self.konst(k)) {
                            (Some(slot), Some(k)) => Cond::CmpArith {
                                slot,
                                arith,
                                k,
                                op,
                                c,
                            },
                            _ => self.cmp_num(op, a, b),
                        }
                    }
                    _ => self.cmp_num(op, a, b),
                },
                _ => self.cmp_num(op, a, b),
            },
            Node::In {
                item,
                start,
                len,
                negate,
            } => {
                let mask = self.p.enum_masks.get(start as usize).copied().flatten();
                match (self.slot(item), mask) {
                    (Some(slot), Some(mask)) => Cond::InMask { slot, mask, negate },
                    _ => Cond::In {
                        item: Box::new(self.num(item)),
                        mask,
                        list: self.p.consts[start as usize..(start + len) as usize].into(),
                        negate,
                    },
                }
            }
            Node::IsNull(a) | Node::IsNotNull(a) => {
                let want_null = matches!(self.p.nodes[id as usize], Node::IsNull(_));
                match self.slot(a) {
                    Some(slot) => Cond::NullFact { slot, want_null },
                    None => Cond::Null {
                        item: Box::new(self.num(a)),
                        want_null,
                    },
                }
            }
            Node::Const(_) | Node::Arith(..) | Node::Neg(_) | Node::Call { .. } => {
                Cond::Value(Box::new(self.num_body(id)))
            }
        }
    }

    fn cmp_num(&mut self, op: CmpOp, a: NodeId, b: NodeId) -> Cond {
        Cond::CmpNum {
            op,
            a: Box::new(self.num(a)),
            b: Box::new(self.num(b)),
        }
    }

    /// `id` in value position: a definition is memoised.
    fn num(&mut self, id: NodeId) -> Num {
        if !is_def(self.p, id) {
            return self.num_body(id);
        }
        let memo = self.p.memo_of[id as usize];
        let body = match self.def_of.get(&id) {
            Some(&b) => b,
            None => {
                let b = self.defs.len() as u16;
                self.def_of.insert(id, b);
                self.defs.push(None);
                let n = self.num_body(id);
                self.defs[b as usize] = Some(n);
                b
            }
        };
        Num::Def { memo, body }
    }

    fn num_body(&mut self, id: NodeId) -> Num {
        match self.p.nodes[id as usize] {
            Node::Const(v) => Num::Const(v),
            Node::Slot(s) => Num::Slot(s),
            Node::Arith(op, a, b) => Num::Arith(op, Box::new(self.num(a)), Box::new(self.num(b))),
            Node::Neg(a) => Num::Neg(Box::new(self.num(a))),
            Node::Call {
                func: Func::If,
                start,
                len: 3,
            } => {
                let k = self.kids(start, 3);
                Num::If(
                    Box::new(self.cond(k[0])),
                    Box::new(self.num(k[1])),
                    Box::new(self.num(k[2])),
                )
            }
            Node::Call { func, start, len } => Num::Call(
                func,
                self.kids(start, len)
                    .into_iter()
                    .map(|c| self.num(c))
                    .collect(),
            ),
            // Boolean node kinds always produce `Bool` or `Unknown`, i.e. their truth.
            Node::Not(_)
            | Node::And { .. }
            | Node::Or { .. }
            | Node::Cmp(..)
            | Node::In { .. }
            | Node::IsNull(_)
            | Node::IsNotNull(_) => Num::Truth(Box::new(self.cond_body(id))),
        }
    }

    /// A rule's top-level conjunct: shared ones become atoms.
    fn conjunct(&mut self, id: NodeId) -> Cond {
        let (operand, negate) = match self.p.nodes[id as usize] {
            Node::Not(inner) => (inner, true),
            _ => (id, false),
        };
        let k = key(self.p, operand);
        if self.shared.get(&k).is_some_and(|&n| n >= 2) && !is_leaf(self.p, operand) {
            return match self.atom(operand, k) {
                Cond::Atom { index, negate: n } => Cond::Atom {
                    index,
                    negate: n != negate,
                },
                c if negate => Cond::Not(Box::new(c)),
                c => c,
            };
        }
        self.cond(id)
    }
}

/// A leaf the plan evaluates inline as cheaply as an atom lookup.
fn is_leaf(p: &Program, id: NodeId) -> bool {
    if is_def(p, id) {
        return false;
    }
    let simple = |n: NodeId| matches!(p.nodes[n as usize], Node::Slot(_) | Node::Const(_));
    match p.nodes[id as usize] {
        Node::Slot(_) => true,
        Node::Cmp(_, a, b) => simple(a) && simple(b),
        Node::In { item, .. } | Node::IsNull(item) | Node::IsNotNull(item) => simple(item),
        _ => false,
    }
}

impl RulePlan {
    /// Plans the conditions `roots` (one per rule) of `program`, and `extras`, conditions
    /// evaluated one by one with [`RulePlan::eval_extra`]; both share atoms.
    pub fn build(program: &Program, roots: &[NodeId], extras: &[NodeId]) -> RulePlan {
        let flat: Vec<Vec<NodeId>> = roots
            .iter()
            .map(|&r| {
                let mut out = Vec::new();
                conjuncts_of(program, r, &mut out);
                out
            })
            .collect();
        // In how many rules each conjunct occurs (looking through one `not`).
        let mut shared: HashMap<String, usize> = HashMap::new();
        for cs in &flat {
            let mut keys: Vec<String> = cs
                .iter()
                .map(|&c| match program.nodes[c as usize] {
                    Node::Not(inner) => key(program, inner),
                    _ => key(program, c),
                })
                .collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                *shared.entry(k).or_default() += 1;
            }
        }
        let mut b = Builder {
            p: program,
            atoms: Vec::new(),
            atom_of: HashMap::new(),
            defs: Vec::new(),
            def_of: HashMap::new(),
            shared,
        };
        // Gates: cheap conjuncts (up to a `not`) shared by at least `GATE_MIN` rules,
        // cheapest first.
        const GATE_MIN: usize = 3;
        const GATE_MAX_COST: usize = 24;
        let words = flat.len().div_ceil(64);
        let mut gate_of: HashMap<String, usize> = HashMap::new();
        // (cost, condition, rules it rules out when false, ... when true)
        let mut gates: Vec<(usize, Cond, Vec<u64>, Vec<u64>)> = Vec::new();
        for (r, cs) in flat.iter().enumerate() {
            for &c in cs {
                let (operand, negate) = match program.nodes[c as usize] {
                    Node::Not(inner) => (inner, true),
                    _ => (c, false),
                };
                let k = key(program, operand);
                if b.shared.get(&k).is_none_or(|&n| n < GATE_MIN)
                    || program.cost(operand) > GATE_MAX_COST
                {
                    continue;
                }
                let g = match gate_of.get(&k) {
                    Some(&g) => g,
                    None => {
                        let cond = b.cond(operand);
                        gates.push((program.cost(operand), cond, vec![0; words], vec![0; words]));
                        gate_of.insert(k, gates.len() - 1);
                        gates.len() - 1
                    }
                };
                let mask = if negate {
                    &mut gates[g].3
                } else {
                    &mut gates[g].2
                };
                mask[r / 64] |= 1 << (r % 64);
            }
        }
        gates.sort_by_key(|g| g.0);
        let gates = gates
            .into_iter()
            .map(|(_, cond, if_false, if_true)| Gate {
                cond,
                words: (0..words)
                    .filter(|&w| if_false[w] | if_true[w] != 0)
                    .map(|w| GateWord {
                        word: w,
                        if_false: if_false[w],
                        if_true: if_true[w],
                    })
                    .collect(),
            })
            .collect();
        let mut rules = Vec::with_capacity(flat.len());
        for cs in &flat {
            // Cheapest first; a shared conjunct counts as cheap (most likely computed already),
            // so the first false one ends the rule early.
            let mut conds: Vec<(usize, Cond)> = cs
                .iter()
                .map(|&c| {
                    let cond = b.conjunct(c);
                    // A shared atom's cost is spread over the rules sharing it.
                    let cost = match cond {
                        Cond::Atom { .. } => {
                            let operand = match program.nodes[c as usize] {
                                Node::Not(inner) => inner,
                                _ => c,
                            };
                            let shares = b.shared.get(&key(program, operand)).copied();
                            program.cost(operand) * 4 / shares.unwrap_or(1).max(1)
                        }
                        _ => program.cost(c) * 4,
                    };
                    (cost, cond)
                })
                .collect();
            conds.sort_by_key(|(cost, _)| *cost);
            rules.push(conds.into_iter().map(|(_, c)| c).collect());
        }
        let extras = extras.iter().map(|&e| b.cond(e)).collect();
        RulePlan {
            extras,
            atoms: b
                .atoms
                .into_iter()
                .map(|a| a.expect("atom built"))
                .collect(),
            defs: b
                .defs
                .into_iter()
                .map(|d| d.expect("definition built"))
                .collect(),
            rules,
            gates,
            words,
        }
    }

    /// Number of shared atoms.
    pub fn atom_count(&self) -> usize {
        self.atoms.len()
    }

    /// Number of gates.
    pub fn gate_count(&self) -> usize {
        self.gates.len()
    }

    /// Clears `scratch` for a new decision.
    #[inline]
    pub fn reset(&self, scratch: &mut AtomScratch) {
        scratch.atoms.clear();
        scratch.atoms.resize(self.atoms.len(), UNSET);
    }

    /// Evaluates every rule and calls `visit(rule, truth)`, in rule order, for each rule whose
    /// condition is true or unknown (rules that are false are not reported). `memo` and
    /// `scratch` belong to this decision: reset both ([`RulePlan::reset`]) before its first
    /// evaluation.
    #[inline]
    pub fn eval_all(
        &self,
        facts: &[Value],
        memo: &mut [Option<Value>],
        scratch: &mut AtomScratch,
        mut visit: impl FnMut(usize, Truth),
    ) {
        let n = self.rules.len();
        let live = &mut scratch.live;
        live.clear();
        live.resize(self.words, u64::MAX);
        if !n.is_multiple_of(64) {
            live[self.words - 1] = (1u64 << (n % 64)) - 1;
        }
        let mut cx = Cx {
            plan: self,
            facts,
            memo,
            atoms: &mut scratch.atoms,
        };
        for g in &self.gates {
            // Skip a gate whose rules are all ruled out already.
            if !g
                .words
                .iter()
                .any(|w| live[w.word] & (w.if_false | w.if_true) != 0)
            {
                continue;
            }
            match cx.cond(&g.cond) {
                FALSE => g.words.iter().for_each(|w| live[w.word] &= !w.if_false),
                TRUE => g.words.iter().for_each(|w| live[w.word] &= !w.if_true),
                _ => {}
            }
        }
        for (w, &bits) in live.iter().enumerate() {
            let mut bits = bits;
            while bits != 0 {
                let r = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                match cx.all(&self.rules[r]) {
                    TRUE => visit(r, Truth::True),
                    UNKNOWN => visit(r, Truth::Unknown),
                    _ => {}
                }
            }
        }
    }

    /// The truth of extra condition `i` (see [`RulePlan::build`]).
    #[inline]
    pub fn eval_extra(
        &self,
        i: usize,
        facts: &[Value],
        memo: &mut [Option<Value>],
        scratch: &mut AtomScratch,
    ) -> Truth {
        let t = Cx::new(self, facts, memo, scratch).cond(&self.extras[i]);
        truth(t)
    }

    /// The truth of rule `rule`'s condition. `memo` and `scratch` belong to one decision
    /// (reset both before the next).
    #[inline]
    pub fn eval_rule(
        &self,
        rule: usize,
        facts: &[Value],
        memo: &mut [Option<Value>],
        scratch: &mut AtomScratch,
    ) -> Truth {
        let t = Cx::new(self, facts, memo, scratch).all(&self.rules[rule]);
        truth(t)
    }
}

/// One decision's evaluation context.
struct Cx<'a> {
    plan: &'a RulePlan,
    facts: &'a [Value],
    memo: &'a mut [Option<Value>],
    atoms: &'a mut [u8],
}

fn truth(t: u8) -> Truth {
    match t {
        FALSE => Truth::False,
        TRUE => Truth::True,
        _ => Truth::Unknown,
    }
}

impl<'a> Cx<'a> {
    fn new(
        plan: &'a RulePlan,
        facts: &'a [Value],
        memo: &'a mut [Option<Value>],
        scratch: &'a mut AtomScratch,
    ) -> Cx<'a> {
        Cx {
            plan,
            facts,
            memo,
            atoms: &mut scratch.atoms,
        }
    }

    /// Kleene `and`: the first false operand decides.
    #[inline(always)]
    fn all(&mut self, conds: &[Cond]) -> u8 {
        let mut unknown = false;
        for c in conds {
            match self.cond(c) {
                FALSE => return FALSE,
                UNKNOWN => unknown = true,
                _ => {}
            }
        }
        if unknown { UNKNOWN } else { TRUE }
    }

    /// The common leaves inline; everything else out of line, so this stays small enough to
    /// inline into the loops.
    #[inline(always)]
    fn cond(&mut self, c: &Cond) -> u8 {
        match c {
            Cond::Atom { index, negate } => {
                let i = *index as usize;
                let mut t = self.atoms[i];
                if t == UNSET {
                    t = self.atom(i);
                }
                if *negate { not(t) } else { t }
            }
            Cond::CmpInt { slot, op, c } => match self.facts[*slot as usize] {
                Value::Int(x) => {
                    (match op {
                        CmpOp::Eq => x == *c,
                        CmpOp::Ne => x != *c,
                        CmpOp::Lt => x < *c,
                        CmpOp::Le => x <= *c,
                        CmpOp::Gt => x > *c,
                        CmpOp::Ge => x >= *c,
                        CmpOp::In | CmpOp::NotIn => compare(*op, Value::Int(x), Value::Int(*c)),
                    }) as u8
                }
                Value::Unknown => UNKNOWN,
                x => compare(*op, x, Value::Int(*c)) as u8,
            },
            Cond::Fact { slot } => truth_of(self.facts[*slot as usize]),
            Cond::EnumEq { slot, value, equal } => match self.facts[*slot as usize] {
                Value::Enum(e) => ((e == *value) == *equal) as u8,
                Value::Unknown => UNKNOWN,
                x => compare(
                    if *equal { CmpOp::Eq } else { CmpOp::Ne },
                    x,
                    Value::Enum(*value),
                ) as u8,
            },
            Cond::NullFact { slot, want_null } => match self.facts[*slot as usize] {
                Value::Unknown => UNKNOWN,
                x => ((x == Value::Null) == *want_null) as u8,
            },
            Cond::InMask { slot, mask, negate } => match self.facts[*slot as usize] {
                Value::Enum(e) if e < 64 => (((mask >> e) & 1 == 1) != *negate) as u8,
                x => truth_of(member(x, Some(*mask), &[], *negate)),
            },
            _ => self.cond_slow(c),
        }
    }

    #[inline(never)]
    fn atom(&mut self, i: usize) -> u8 {
        let plan = self.plan;
        let t = self.cond(&plan.atoms[i]);
        self.atoms[i] = t;
        t
    }

    #[inline(never)]
    fn cond_slow(&mut self, c: &Cond) -> u8 {
        let f = self.facts;
        match c {
            Cond::Cmp { slot, op, c } => match f[*slot as usize] {
                Value::Unknown => UNKNOWN,
                x => compare(*op, x, *c) as u8,
            },
            Cond::CmpFacts { a, op, b } => truth_of(compare3(*op, f[*a as usize], f[*b as usize])),
            Cond::CmpArith {
                slot,
                arith: a,
                k,
                op,
                c,
            } => truth_of(compare3(*op, arith(*a, f[*slot as usize], *k), *c)),
            Cond::CmpDef { memo, body, op, c } => {
                let x = self.def(*memo, *body);
                truth_of(compare3(*op, x, *c))
            }
            Cond::CmpNum { op, a, b } => {
                let x = self.num(a);
                let y = self.num(b);
                truth_of(compare3(*op, x, y))
            }
            Cond::In {
                item,
                mask,
                list,
                negate,
            } => {
                let x = self.num(item);
                truth_of(member(x, *mask, list, *negate))
            }
            Cond::Null { item, want_null } => {
                let x = self.num(item);
                truth_of(null_test(x, *want_null))
            }
            Cond::Not(a) => not(self.cond(a)),
            Cond::All(cs) => self.all(cs),
            Cond::Any(cs) => {
                let mut unknown = false;
                for c in cs.iter() {
                    match self.cond(c) {
                        TRUE => return TRUE,
                        UNKNOWN => unknown = true,
                        _ => {}
                    }
                }
                if unknown { UNKNOWN } else { FALSE }
            }
            Cond::Value(n) => {
                let v = self.num(n);
                truth_of(v)
            }
            // The inline leaves: `cond` takes them before coming here.
            Cond::Atom { .. }
            | Cond::CmpInt { .. }
            | Cond::Fact { .. }
            | Cond::EnumEq { .. }
            | Cond::NullFact { .. }
            | Cond::InMask { .. } => self.cond(c),
        }
    }

    /// A definition's value, computed once per decision.
    #[inline(always)]
    fn def(&mut self, memo: u16, body: u16) -> Value {
        let m = memo as usize;
        if let Some(v) = self.memo[m] {
            return v;
        }
        let plan = self.plan;
        let v = self.num(&plan.defs[body as usize]);
        self.memo[m] = Some(v);
        v
    }

    fn num(&mut self, n: &Num) -> Value {
        match n {
            Num::Const(v) => *v,
            Num::Slot(s) => self.facts[*s as usize],
            Num::Def { memo, body } => self.def(*memo, *body),
            Num::Arith(op, a, b) => {
                let x = self.num(a);
                let y = self.num(b);
                arith(*op, x, y)
            }
            Num::Neg(a) => {
                let x = self.num(a);
                neg(x)
            }
            Num::If(c, a, b) => match self.cond(c) {
                TRUE => self.num(a),
                FALSE => self.num(b),
                _ => Value::Unknown,
            },
            Num::Call(func, args) => {
                // Functions take 1-3 arguments (max/min rarely more).
                if args.len() <= 8 {
                    let mut vals = [Value::Null; 8];
                    for (v, a) in vals.iter_mut().zip(args.iter()) {
                        *v = self.num(a);
                    }
                    call(*func, vals[..args.len()].iter().copied())
                } else {
                    let vals: Vec<Value> = args.iter().map(|a| self.num(a)).collect();
                    call(*func, vals.into_iter())
                }
            }
            Num::Truth(c) => {
                let t = self.cond(c);
                value_of(t)
            }
        }
    }
}

/// The top-level conjuncts of `id` (nested `and`s flattened; a definition is one conjunct).
fn conjuncts_of(p: &Program, id: NodeId, out: &mut Vec<NodeId>) {
    match p.nodes[id as usize] {
        Node::And { start, len } if !is_def(p, id) => {
            for &c in &p.children[start as usize..(start + len) as usize] {
                conjuncts_of(p, c, out);
            }
        }
        _ => out.push(id),
    }
}

/// A structural key: equal keys, equal values for every input (see `Program::fingerprint`).
fn key(p: &Program, id: NodeId) -> String {
    p.fingerprint(id, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;
    use crate::facts::Facts;
    use crate::facts::presets::PRESETS;

    /// The plan and the node interpreter agree on every rule of the te pack, over the presets
    /// and every record of the conformance corpus (tests/corpora), with probes
    /// unknown, answered yes and answered no.
    #[test]
    fn agrees_with_the_interpreter() {
        let policy = Policy::embedded("te").expect("te pack");
        let p = &policy.program;
        let roots: Vec<NodeId> = policy.rules.iter().map(|r| r.when.node).collect();
        let plan = RulePlan::build(p, &roots, &[]);
        assert!(plan.atom_count() > 10, "the te pack shares conjuncts");
        assert!(plan.gate_count() > 5, "the te pack has gates");
        let mut configs: Vec<serde_json::Value> = PRESETS.iter().map(|x| (x.config)()).collect();
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/corpora/te-2.20.2-corpus-a.jsonl.gz");
        let records = crate::corpus::read_corpus(&corpus).expect("tests/corpora ships the corpus");
        configs.extend(records.into_iter().map(|r| r.config));
        let (mut compared, mut fired, mut unknown) = (0, 0, 0);
        let mut scratch = AtomScratch::default();
        for config in &configs {
            // Structurally invalid records (KV heads that do not divide the query heads) are
            // input errors: never decided, so nothing to compare.
            let Ok(mut facts) = Facts::from_json(config) else {
                continue;
            };
            for answer in [None, Some(true), Some(false)] {
                if let Some(a) = answer {
                    facts.set_all_probes(a);
                }
                let want: Vec<Truth> = policy
                    .rules
                    .iter()
                    .map(|rule| Truth::of(p.eval(rule.when.node, facts.values())))
                    .collect();
                // One rule at a time, and all rules at once (gates on), as decisions run.
                let mut memo = p.new_memo();
                plan.reset(&mut scratch);
                for (i, rule) in policy.rules.iter().enumerate() {
                    let got = plan.eval_rule(i, facts.values(), &mut memo, &mut scratch);
                    assert_eq!(got, want[i], "rule {} on {config}", rule.id);
                }
                let mut got = vec![Truth::False; want.len()];
                let mut memo = p.new_memo();
                plan.reset(&mut scratch);
                plan.eval_all(facts.values(), &mut memo, &mut scratch, |i, t| got[i] = t);
                for (i, rule) in policy.rules.iter().enumerate() {
                    assert_eq!(got[i], want[i], "rule {} on {config} (eval_all)", rule.id);
                }
                compared += want.len();
                fired += want.iter().filter(|&&t| t == Truth::True).count();
                unknown += want.iter().filter(|&&t| t == Truth::Unknown).count();
            }
        }
        // Enough of each outcome that the comparison means something.
        assert!(compared > 3000, "compared only {compared} evaluations");
        assert!(
            fired > 30 && unknown > 5,
            "fired {fired}, unknown {unknown}"
        );
    }
}

//! The decision hot path: every rule of a pack planned so that a decision reads each fact once
//! and visits only the rules that fact values have not already ruled out.
//!
//! What a decision used to do that it need not: compare the same fact with the same constants
//! in rule after rule (a pack reads `sm`, `qkv_dtype` or `fp8` in dozens of conditions), each
//! comparison a branch on a value kind. But a condition that reads *one* fact (`sm >= 90`,
//! `qkv_layout in [...]`, `window_size != null`, `not fp8 or sm < 100`: a *slot formula*) has a
//! truth that depends only on which *class* the fact's value falls in: which of the constants
//! the rules compare it with it is below, equal to or above (every enum value and null and
//! unknown are classes of their own). So the plan, built once per pack:
//!
//! 1. finds every slot formula of every condition and gives each a bit in a per-fact word;
//! 2. per fact and class, tabulates the formulas' truths (a true word and an unknown word) and,
//!    for rules whose top-level conjunct is such a formula (a *literal*), the rules the class
//!    rules out (a false literal) and the rules it leaves unknown (an unknown literal);
//! 3. per rule, keeps the other conjuncts (the *residual*: arithmetic, definitions, two facts)
//!    as small typed condition trees (`Cond`, `Num`), cheapest first; a conjunct shared by
//!    several rules, and every boolean definition, becomes an *atom* computed at most once per
//!    decision; numeric definitions are memoised;
//! 4. rewrites every `and`/`or` over slot formulas inside those trees (and inside atoms) into a
//!    *leaf set* (`Cond::Leaves`): per formula word, a mask of the formulas it reads as they
//!    are and a mask of those it reads negated, answered with a few AND/OR tests per word; an
//!    atom that is a small leaf set is copied into its users (cheaper than its memo);
//! 5. pairs the groups of facts with few classes (booleans, small enums, a fact compared with
//!    one or two constants: at most 64 classes together) into one table indexed by both
//!    classes, so a decision pays one row load, one formula word and one rule-word fold per pair
//!    instead of per fact (`pair_groups`; the te pack's 71 groups become about 38). Groups
//!    that rule conjuncts read together (a leaf set over two groups' words) pair first;
//! 6. moves every rule conjunct that is a leaf set over one formula word into that word's
//!    table as a literal (`table_leaf_conjuncts`): it is a function of the group's class, so
//!    per class the table rules the rule out or leaves it unknown, and a decision never visits
//!    a rule such a conjunct rules out;
//! 7. takes a shared atom that is the first residual conjunct of two or more rules of a rule
//!    word out of those residuals (`shared_atom_conjuncts`): a decision computes it once after
//!    classification, when one of those rules is still live, and rules them out (or marks
//!    them unknown) together, instead of visiting each to read it.
//!
//! A decision then classifies each fact the formulas read (one pass over the single groups in
//! slot order, then the pairs: a bit index for an enum, a branch-free rank against up to eight
//! constants for a number, a binary search against more), ORs its class's rows into the
//! live-rule and unknown-rule sets and the formula words, and evaluates the residual of each
//! rule still live. A value no table covers (an
//! unparseable version, a NaN, a value of another kind) takes the slow path: that group's
//! formulas (both facts' for a pair) through the interpreter.
//!
//! The result is exactly the node interpreter's ([`Program::eval`]): formula truths come from
//! the interpreter itself for exact classes and from the order relation for the ranges between
//! constants, Kleene `and` is associative and commutative (so flattening and reordering
//! conjuncts changes nothing), and tests compare the two on every rule over the presets, the
//! conformance corpora and randomly perturbed inputs, with probes unknown, yes and no.

use std::cmp::Ordering;
use std::collections::HashMap;

use super::program::{
    Func, NO_MEMO, Node, NodeId, Program, Truth, arith, call, compare3, holds, member, neg,
    null_test, parsed_test,
};
use crate::facts::Value;
use crate::facts::schema::{Schema, Ty};
use crate::lang::Version;
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
    /// A slot formula: bit `bit` of formula word `word`, computed by the class pass.
    Leaf {
        word: u16,
        bit: u8,
    },
    /// A shared atom: computed once per decision.
    Atom {
        index: u16,
        negate: bool,
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
    /// `item in [...]` / `not in` over a computed item.
    In {
        item: Box<Num>,
        mask: Option<u64>,
        list: Box<[Value]>,
        negate: bool,
    },
    /// `x == null` (`want_null`) / `x != null` over a computed item.
    Null {
        item: Box<Num>,
        want_null: bool,
    },
    /// `parsed(x)` over a computed item.
    Parsed(Box<Num>),
    Not(Box<Cond>),
    All(Box<[Cond]>),
    Any(Box<[Cond]>),
    /// An `and` (`any: false`) or `or` (`any: true`) of slot formulas and their negations,
    /// answered with a few mask tests per formula word instead of a walk over leaves.
    Leaves {
        any: bool,
        words: Box<[LeafWord]>,
    },
    /// A value in boolean position (a constant, `if(...)`).
    Value(Box<Num>),
}

/// The formulas of one word a `Cond::Leaves` reads: `pos` as they are, `neg` negated.
#[derive(Clone, Copy, Debug, PartialEq)]
struct LeafWord {
    word: u16,
    pos: u64,
    neg: u64,
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

/// How a fact's value is mapped to its class. Classes 0 and 1 are null and unknown.
#[derive(Clone, Debug)]
enum Classes {
    /// 2: false, 3: true.
    Bool,
    /// 2 + the value's index (`n` values).
    Enum(u16),
    /// 2: any value that is not null (formulas only test `== null`).
    Present,
    /// Sorted distinct constants; 2 + 2i + eq, i = constants below the value, eq = equal to
    /// the i-th.
    Int(Box<[i64]>),
    /// 2 + the value modulo `m` (formulas read only `fact % k` with `k` dividing `m`).
    Residue(i64),
    Version(Box<[Version]>),
    /// Mixed or float constants, compared as the language compares (`Value::compare`), and
    /// the same constants as `f64` when they are all numbers and stay distinct as `f64` (else
    /// empty): a float value is then ranked against those without a branch.
    Ordered(Box<[Value]>, Box<[f64]>),
    /// No table: every value takes the slow path.
    Never,
}

const CLASS_NULL: usize = 0;
const CLASS_UNKNOWN: usize = 1;

impl Classes {
    fn count(&self) -> usize {
        2 + match self {
            Classes::Bool => 2,
            Classes::Enum(n) => *n as usize,
            Classes::Present => 1,
            Classes::Int(cs) => 2 * cs.len() + 1,
            Classes::Residue(m) => *m as usize,
            Classes::Version(cs) => 2 * cs.len() + 1,
            Classes::Ordered(cs, _) => 2 * cs.len() + 1,
            Classes::Never => 0,
        }
    }

    /// The class of `v`, or `None` for a value no class covers (slow path).
    #[inline(always)]
    fn of(&self, v: Value) -> Option<usize> {
        match (v, self) {
            (Value::Null, _) => Some(CLASS_NULL),
            (Value::Unknown, _) => Some(CLASS_UNKNOWN),
            (Value::Enum(e), Classes::Enum(n)) if e < *n => Some(2 + e as usize),
            (Value::Bool(b), Classes::Bool) => Some(2 + b as usize),
            (Value::Int(x), Classes::Int(cs)) => Some(2 + rank(cs, x)),
            (Value::Int(x), Classes::Residue(m)) => Some(2 + x.rem_euclid(*m) as usize),
            (_, Classes::Present) => Some(2),
            (Value::Version(x), Classes::Version(cs)) => {
                let i = cs.partition_point(|c| *c < x);
                Some(2 + 2 * i + (i < cs.len() && cs[i] == x) as usize)
            }
            // `Value::compare` of a float and a number is `f64::partial_cmp`: for a value that
            // is not NaN, `<` and `==` on the constants as `f64` give the same order.
            (Value::Float(x), Classes::Ordered(_, fs)) if !fs.is_empty() && !x.is_nan() => {
                Some(2 + rank(fs, x))
            }
            (v, Classes::Ordered(cs, _)) => ordered_class(cs, v),
            _ => None,
        }
    }
}

/// `2i + eq` for `x` against sorted distinct constants `cs` (`i`: the constants below `x`,
/// `eq`: `x` equals the next one), i.e. the class of `x` less 2. Most groups compare a fact
/// with one to eight constants: summing the comparisons is branch-free, where a binary search
/// branches on the value (mispredicted when the inputs vary).
#[inline(always)]
fn rank<T: PartialOrd + Copy>(cs: &[T], x: T) -> usize {
    if cs.len() <= 8 {
        cs.iter()
            .map(|&c| 2 * (c < x) as usize + (c == x) as usize)
            .sum()
    } else {
        let i = cs.partition_point(|&c| c < x);
        2 * i + (i < cs.len() && cs[i] == x) as usize
    }
}

#[inline(never)]
fn ordered_class(cs: &[Value], v: Value) -> Option<usize> {
    let (mut lo, mut hi) = (0, cs.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        match v.compare(cs[mid])? {
            Ordering::Greater => lo = mid + 1,
            Ordering::Equal => return Some(2 + 2 * mid + 1),
            Ordering::Less => hi = mid,
        }
    }
    Some(2 + 2 * lo)
}

/// The formulas over one fact of one kind (at most 64: more make several groups), their word,
/// and their tables per class.
#[derive(Clone, Debug)]
struct SlotGroup {
    slot: u16,
    classes: Classes,
    /// Index of this group's word among the formula words.
    word: u16,
    /// Per class: the formulas that are true and unknown.
    rows: Box<[Row]>,
    /// Per class, `2 * words` words: the rules it rules out, then the rules it leaves unknown.
    /// Dense (every word, changed or not), so classification folds them into rule sets held
    /// in registers: sparse per-word updates went through memory, one store after another.
    /// Empty when no rule has a literal in the group (it rules nothing out: nothing to fold).
    rule_words: Box<[u64]>,
    /// The group's formulas (their nodes), for the slow path, and the rules they are literals of.
    formulas: Box<[NodeId]>,
    literal_of: Box<[Box<[u64]>]>,
    /// A pair group (in `RulePlan::pairs`): the second fact it reads, its classes and their
    /// count `n`; the pair's class is `class(slot) * n + class(second)`.
    second: Option<(u16, Classes, usize)>,
    /// Rule conjuncts that are leaf sets over this group's word alone (`(rule, any, word)`):
    /// functions of the group's class, so they are tabulated into `rule_words` like literals
    /// (see [`table_leaf_conjuncts`]); kept for the slow path.
    leaf_literals: Box<[(u32, bool, LeafWord)]>,
    /// Per class: `rows` and the rules-out half of `rule_words` together (plans of at most four
    /// rule words; else empty). A class leaves rules unknown only if one of its formulas is
    /// unknown, so classification reads the unknown half of `rule_words` only when `u != 0`.
    hot: Box<[HotRow]>,
}

/// One class of a group as classification reads it when the plan has at most four rule words:
/// the formula word (true and unknown bits) and the rules the class rules out, in one cache
/// line. `rows` and `rule_words` (a row, then 64 bytes of rule words at any offset) took two
/// or three lines per group, and a decision reads one class of each of ~37 groups.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C, align(64))]
struct HotRow {
    t: u64,
    u: u64,
    kill: [u64; 4],
}

#[derive(Clone, Copy, Debug, Default)]
struct Row {
    true_bits: u64,
    unknown_bits: u64,
}

/// All rules of a pack, ready for [`RulePlan::eval_all`].
#[derive(Clone, Debug, Default)]
pub struct RulePlan {
    atoms: Vec<Cond>,
    /// Bodies of the numeric definitions `Num::Def` refers to.
    defs: Vec<Num>,
    /// Per rule: the conjunction of its residual conjuncts (literals are in the tables).
    rules: Vec<Box<[Cond]>>,
    /// Words per rule bit set.
    words: usize,
    groups: Vec<SlotGroup>,
    /// Groups over two facts (`SlotGroup::second`), classified after `groups`: formula word
    /// `groups.len() + i`.
    pairs: Vec<SlotGroup>,
    /// Other conditions a decision reads (variant applicability, preference), by index.
    extras: Vec<Cond>,
    /// Shared atoms that lead several rules' residuals, answered once per decision right after
    /// classification (see [`shared_atom_conjuncts`]).
    eager: Vec<EagerAtom>,
}

/// A shared atom taken out of the residuals of the rules it is the first conjunct of (those of
/// one rule word): a decision computes it (once, if one of those rules is still live: as
/// visiting the first of them would) and folds its truth into the rule sets as a class
/// table's row would, instead of visiting each rule to read it.
#[derive(Clone, Copy, Debug)]
struct EagerAtom {
    index: u16,
    word: u16,
    /// The rules (of `word`) that read the atom as it is, and negated.
    pos: u64,
    neg: u64,
}

/// Per-decision scratch: atoms (or `UNSET`), formula words, and the rules still live / with an
/// unknown literal.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AtomScratch {
    atoms: Vec<u8>,
    /// Per formula word: its true bits and its unknown bits (every word is written by each
    /// classification, so it is never cleared).
    leaf: Vec<Leaf>,
    live: Vec<u64>,
    unknown: Vec<u64>,
    /// The rule words of a value no class covers (`2 * words`, as a class's row).
    slow_row: Vec<u64>,
    /// Evaluation steps of the last decision (counted only by the counting entry points).
    steps: u64,
}

/// The live and unknown rule sets during classification: in registers (`W` words, `W > 0`)
/// or in the scratch (`W == 0`, any width).
struct RuleSets<'a, const W: usize> {
    live: &'a mut [u64; W],
    unknown: &'a mut [u64; W],
    dyn_live: &'a mut [u64],
    dyn_unknown: &'a mut [u64],
}

impl<const W: usize> RuleSets<'_, W> {
    /// Rules out `kill` and marks `unk` unknown (`rule_words`: `words` of each).
    #[inline(always)]
    fn fold(&mut self, rule_words: &[u64], words: usize) {
        let (kill, unk) = rule_words.split_at(words);
        if W > 0 {
            let (kill, unk) = (&kill[..W], &unk[..W]);
            for j in 0..W {
                self.live[j] &= !kill[j];
                self.unknown[j] |= unk[j];
            }
        } else {
            for j in 0..words {
                self.dyn_live[j] &= !kill[j];
                self.dyn_unknown[j] |= unk[j];
            }
        }
    }
}

/// The true and unknown bits of one formula word (read together, so kept together).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Leaf {
    t: u64,
    u: u64,
}

fn is_def(p: &Program, id: NodeId) -> bool {
    p.memo_of.get(id as usize).is_some_and(|&m| m != NO_MEMO)
}

/// How a slot formula's truth depends on its fact: through its order against constants
/// (`Plain`: comparisons, membership, null tests, `fact // k` against constants) or through its
/// remainders (`Residue`: `fact % k` against constants).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Plain,
    Residue,
}

fn positive_int(p: &Program, n: NodeId) -> bool {
    matches!(p.nodes[n as usize], Node::Const(Value::Int(k)) if k > 0)
}

/// An operand of a comparison in a slot formula: the fact, a constant, or `fact // k` /
/// `fact % k` with a positive integer `k`. `Ok((reads, arithmetic))`.
fn formula_operand(p: &Program, n: NodeId) -> Result<(Option<(u16, Kind)>, bool), ()> {
    match p.nodes[n as usize] {
        Node::Slot(s) => Ok((Some((s, Kind::Plain)), false)),
        Node::Const(_) => Ok((None, false)),
        Node::Arith(op, a, k) if positive_int(p, k) => match (op, p.nodes[a as usize]) {
            (ArithOp::FloorDiv, Node::Slot(s)) => Ok((Some((s, Kind::Plain)), true)),
            (ArithOp::Rem, Node::Slot(s)) => Ok((Some((s, Kind::Residue)), true)),
            _ => Err(()),
        },
        _ => Err(()),
    }
}

/// The one fact a slot formula reads and how: `Ok(Some(..))`; `Ok(None)`: it reads no fact (a
/// constant); `Err`: not a slot formula (other arithmetic, two facts, a function).
fn formula_slot(p: &Program, id: NodeId) -> Result<Option<(u16, Kind)>, ()> {
    let merge = |a: Option<(u16, Kind)>, b: Option<(u16, Kind)>| match (a, b) {
        (Some(x), Some(y)) if x != y => Err(()),
        (x, y) => Ok(x.or(y)),
    };
    let int_const = |n: NodeId| matches!(p.nodes[n as usize], Node::Const(Value::Int(_)));
    match p.nodes[id as usize] {
        Node::Const(_) => Ok(None),
        Node::Slot(s) => Ok(Some((s, Kind::Plain))),
        Node::Not(a) => formula_slot(p, a),
        Node::And { start, len } | Node::Or { start, len } => {
            let mut slot = None;
            for &c in &p.children[start as usize..(start + len) as usize] {
                slot = merge(slot, formula_slot(p, c)?)?;
            }
            Ok(slot)
        }
        Node::Cmp(_, a, b) => {
            let ((x, x_arith), (y, y_arith)) = (formula_operand(p, a)?, formula_operand(p, b)?);
            // One fact, and arithmetic compared with integers only (the tables' thresholds).
            if x.is_some() && y.is_some() || x_arith && !int_const(b) || y_arith && !int_const(a) {
                return Err(());
            }
            Ok(x.or(y))
        }
        Node::In {
            item, start, len, ..
        } => match formula_operand(p, item)? {
            (x, false) => Ok(x),
            (x, true) => p.consts[start as usize..(start + len) as usize]
                .iter()
                .all(|c| matches!(c, Value::Int(_)))
                .then_some(x)
                .ok_or(()),
        },
        Node::IsNull(item) | Node::IsNotNull(item) | Node::IsParsed(item) => {
            match p.nodes[item as usize] {
                Node::Slot(s) => Ok(Some((s, Kind::Plain))),
                Node::Const(_) => Ok(None),
                _ => Err(()),
            }
        }
        Node::Arith(..) | Node::Neg(_) | Node::Call { .. } => Err(()),
    }
}

/// The fact a formula over exactly one fact reads, and how.
fn is_formula(p: &Program, id: NodeId) -> Option<(u16, Kind)> {
    formula_slot(p, id).ok().flatten()
}

/// What the class tables of a group need from its formulas.
#[derive(Default)]
struct Boundaries {
    /// Constants the fact is compared with (for `fact // k op c`: `c * k` and `(c + 1) * k`).
    consts: Vec<Value>,
    /// The formulas only test the fact against null.
    null_only: bool,
    /// Some formula divides the fact (`//`): only integer tables can serve it.
    divides: bool,
    /// A threshold overflowed: no table.
    overflow: bool,
    /// The divisors of `%`.
    moduli: Vec<i64>,
}

/// Collects the class boundaries of slot formula `id`.
fn formula_boundaries(p: &Program, id: NodeId, b: &mut Boundaries) {
    let divisor = |n: NodeId| match p.nodes[n as usize] {
        Node::Arith(op, _, k) => match p.nodes[k as usize] {
            Node::Const(Value::Int(k)) => Some((op, k)),
            _ => None,
        },
        _ => None,
    };
    let threshold = |b: &mut Boundaries, arith: Option<(ArithOp, i64)>, c: Value| match arith {
        None => b.consts.push(c),
        Some((ArithOp::FloorDiv, k)) => {
            b.divides = true;
            match c {
                Value::Int(c) => match (
                    c.checked_mul(k),
                    c.checked_add(1).and_then(|c| c.checked_mul(k)),
                ) {
                    (Some(lo), Some(hi)) => b.consts.extend([Value::Int(lo), Value::Int(hi)]),
                    _ => b.overflow = true,
                },
                _ => b.overflow = true,
            }
        }
        Some((_, k)) => b.moduli.push(k),
    };
    match p.nodes[id as usize] {
        Node::Const(_) => {}
        Node::Slot(_) => b.null_only = false,
        Node::Not(a) => formula_boundaries(p, a, b),
        Node::And { start, len } | Node::Or { start, len } => {
            for &c in &p.children[start as usize..(start + len) as usize] {
                formula_boundaries(p, c, b);
            }
        }
        Node::Cmp(_, x, y) => {
            b.null_only = false;
            let (arith, c) = match (p.nodes[x as usize], p.nodes[y as usize]) {
                (_, Node::Const(c)) => (divisor(x), c),
                (Node::Const(c), _) => (divisor(y), c),
                _ => return,
            };
            threshold(b, arith, c);
        }
        Node::In {
            item, start, len, ..
        } => {
            b.null_only = false;
            let arith = divisor(item);
            for &c in &p.consts[start as usize..(start + len) as usize] {
                threshold(b, arith, c);
            }
        }
        Node::IsNull(_) | Node::IsNotNull(_) => {}
        Node::IsParsed(_) => b.null_only = false,
        Node::Arith(..) | Node::Neg(_) | Node::Call { .. } => b.null_only = false,
    }
}

/// A fact value as a class stands for it when formulas are tabulated.
#[derive(Clone, Copy)]
enum ClassValue {
    /// Every value of the class behaves as this one: the interpreter decides.
    Exact(Value),
    /// Above the first `below` constants, below the rest (not equal to any).
    Between { below: usize },
    /// Equal to constant `at`.
    Equal { at: usize },
}

/// The truth of slot formula `id` for a value of class `cv` (`cs`: the sorted constants;
/// `facts`: scratch facts whose formula slot the exact case writes).
fn formula_truth(
    p: &Program,
    id: NodeId,
    slot: u16,
    cs: &[Value],
    cv: ClassValue,
    facts: &mut [Value],
) -> u8 {
    if let ClassValue::Exact(v) = cv {
        facts[slot as usize] = v;
        return truth_of(p.eval(id, facts));
    }
    // The value's order against constant `c`; `None`: they do not compare.
    let order = |c: Value| -> Option<Ordering> {
        let j = cs
            .iter()
            .position(|x| x.compare(c) == Some(Ordering::Equal))?;
        Some(match cv {
            ClassValue::Between { below } if j < below => Ordering::Greater,
            ClassValue::Between { .. } => Ordering::Less,
            ClassValue::Equal { at } => j.cmp(&at).reverse(),
            ClassValue::Exact(_) => unreachable!(),
        })
    };
    let kids = |start: u32, len: u32| &p.children[start as usize..(start + len) as usize];
    match p.nodes[id as usize] {
        Node::Const(v) => truth_of(v),
        // A number or version in boolean position is false.
        Node::Slot(_) => FALSE,
        Node::Not(a) => not(formula_truth(p, a, slot, cs, cv, facts)),
        Node::And { start, len } | Node::Or { start, len } => {
            let decisive = if matches!(p.nodes[id as usize], Node::And { .. }) {
                FALSE
            } else {
                TRUE
            };
            let mut unknown = false;
            for &c in kids(start, len) {
                match formula_truth(p, c, slot, cs, cv, facts) {
                    UNKNOWN => unknown = true,
                    t if t == decisive => return decisive,
                    _ => {}
                }
            }
            if unknown { UNKNOWN } else { not(decisive) }
        }
        Node::Cmp(op, a, b) => {
            let (c, flipped) = match (p.nodes[a as usize], p.nodes[b as usize]) {
                (Node::Slot(_), Node::Const(c)) => (c, false),
                (Node::Const(c), Node::Slot(_)) => (c, true),
                _ => unreachable!("a slot formula compares its fact with a constant"),
            };
            if c == Value::Unknown {
                return UNKNOWN;
            }
            match order(c) {
                Some(ord) => holds(op, if flipped { ord.reverse() } else { ord }) as u8,
                None => FALSE,
            }
        }
        Node::In {
            start, len, negate, ..
        } => {
            let found = match cv {
                ClassValue::Equal { at } => p.consts[start as usize..(start + len) as usize]
                    .iter()
                    .any(|c| c.compare(cs[at]) == Some(Ordering::Equal)),
                _ => false,
            };
            (found != negate) as u8
        }
        Node::IsNull(_) => FALSE,
        Node::IsNotNull(_) => TRUE,
        // The classes between and at constants hold parsed versions (an unparseable one is
        // no table's class: it takes the slow path).
        Node::IsParsed(_) => TRUE,
        Node::Arith(..) | Node::Neg(_) | Node::Call { .. } => {
            unreachable!("not a slot formula")
        }
    }
}

/// Word-sized bit set over rules.
fn set_bit(set: &mut [u64], i: usize) {
    set[i / 64] |= 1 << (i % 64);
}

struct Builder<'p> {
    p: &'p Program,
    atoms: Vec<Option<Cond>>,
    atom_of: HashMap<String, u16>,
    defs: Vec<Option<Num>>,
    def_of: HashMap<NodeId, u16>,
    /// How many rules' residual conjuncts each structural key occurs in.
    shared: HashMap<String, usize>,
    /// Slot formulas by structural key: (index, node, slot).
    formula_of: HashMap<String, u16>,
    formulas: Vec<(NodeId, (u16, Kind))>,
}

impl Builder<'_> {
    fn kids(&self, start: u32, len: u32) -> Vec<NodeId> {
        self.p.children[start as usize..(start + len) as usize].to_vec()
    }

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

    /// The formula's index (registered on first use).
    fn formula(&mut self, id: NodeId, slot: (u16, Kind)) -> u16 {
        let k = key(self.p, id);
        if let Some(&f) = self.formula_of.get(&k) {
            return f;
        }
        let f = self.formulas.len() as u16;
        self.formulas.push((id, slot));
        self.formula_of.insert(k, f);
        f
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

    /// `id` in boolean position: a slot formula becomes a leaf (its bit, patched in later),
    /// a definition an atom.
    fn cond(&mut self, id: NodeId) -> Cond {
        if let Some(slot) = is_formula(self.p, id) {
            let f = self.formula(id, slot);
            return Cond::Leaf { word: f, bit: 0 };
        }
        if is_def(self.p, id) {
            return self.atom(id, key(self.p, id));
        }
        self.cond_body(id)
    }

    /// `id`'s own structure in boolean position (not looking it up as a definition).
    fn cond_body(&mut self, id: NodeId) -> Cond {
        match self.p.nodes[id as usize] {
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
            } => Cond::In {
                item: Box::new(self.num(item)),
                mask: self.p.enum_masks.get(start as usize).copied().flatten(),
                list: self.p.consts[start as usize..(start + len) as usize].into(),
                negate,
            },
            Node::IsNull(a) | Node::IsNotNull(a) => Cond::Null {
                item: Box::new(self.num(a)),
                want_null: matches!(self.p.nodes[id as usize], Node::IsNull(_)),
            },
            Node::IsParsed(a) => Cond::Parsed(Box::new(self.num(a))),
            Node::Slot(_) | Node::Const(_) | Node::Arith(..) | Node::Neg(_) | Node::Call { .. } => {
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
            | Node::IsNotNull(_)
            | Node::IsParsed(_) => Num::Truth(Box::new(match is_formula(self.p, id) {
                Some(_) => self.cond(id),
                None => self.cond_body(id),
            })),
        }
    }

    /// A rule's residual conjunct: shared ones become atoms.
    fn conjunct(&mut self, id: NodeId) -> Cond {
        let (operand, negate) = match self.p.nodes[id as usize] {
            Node::Not(inner) => (inner, true),
            _ => (id, false),
        };
        let k = key(self.p, operand);
        if self.shared.get(&k).is_some_and(|&n| n >= 2) && is_formula(self.p, operand).is_none() {
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

/// Replaces each leaf's formula index (kept in `word` while building) by its word and bit.
fn patch_cond(c: &mut Cond, bits: &[(u16, u8)]) {
    match c {
        Cond::Leaf { word, bit } => (*word, *bit) = bits[*word as usize],
        Cond::Atom { .. } | Cond::CmpDef { .. } | Cond::CmpFacts { .. } | Cond::CmpArith { .. } => {
        }
        Cond::CmpNum { a, b, .. } => {
            patch_num(a, bits);
            patch_num(b, bits);
        }
        Cond::In { item, .. } | Cond::Null { item, .. } | Cond::Parsed(item) => {
            patch_num(item, bits)
        }
        Cond::Not(a) => patch_cond(a, bits),
        Cond::All(cs) | Cond::Any(cs) => cs.iter_mut().for_each(|c| patch_cond(c, bits)),
        Cond::Value(n) => patch_num(n, bits),
        Cond::Leaves { .. } => unreachable!("leaf sets are built after patching"),
    }
}

/// Largest leaf set an atom may have and still be copied into the conditions that use it
/// (testing a few words is cheaper than looking up and storing the atom).
const INLINE_ATOM_WORDS: usize = 4;

/// Rewrites `and`/`or` over slot formulas into `Cond::Leaves` (Kleene `and`/`or` are
/// associative and commutative and evaluation has no effects, so regrouping changes no
/// result), and copies atoms that are leaf sets into their users. `atoms` holds the atoms
/// already folded (an atom's body only refers to atoms built after it, i.e. higher indices).
fn fold_cond(c: Cond, atoms: &[Option<Cond>]) -> Cond {
    match c {
        Cond::Not(a) => negate(fold_cond(*a, atoms)),
        Cond::Atom { index, negate: n } => match atoms.get(index as usize) {
            Some(Some(body @ (Cond::Leaf { .. } | Cond::Leaves { .. }))) => {
                let inline = match body {
                    Cond::Leaves { words, .. } => words.len() <= INLINE_ATOM_WORDS,
                    _ => true,
                };
                match (inline, n) {
                    (false, _) => c,
                    (true, false) => body.clone(),
                    (true, true) => negate(body.clone()),
                }
            }
            _ => c,
        },
        Cond::All(cs) => group(false, cs.into_vec(), atoms),
        Cond::Any(cs) => group(true, cs.into_vec(), atoms),
        Cond::CmpNum { op, a, b } => Cond::CmpNum {
            op,
            a: Box::new(fold_num(*a, atoms)),
            b: Box::new(fold_num(*b, atoms)),
        },
        Cond::In {
            item,
            mask,
            list,
            negate,
        } => Cond::In {
            item: Box::new(fold_num(*item, atoms)),
            mask,
            list,
            negate,
        },
        Cond::Null { item, want_null } => Cond::Null {
            item: Box::new(fold_num(*item, atoms)),
            want_null,
        },
        Cond::Parsed(item) => Cond::Parsed(Box::new(fold_num(*item, atoms))),
        Cond::Value(n) => Cond::Value(Box::new(fold_num(*n, atoms))),
        c @ (Cond::Leaf { .. }
        | Cond::Leaves { .. }
        | Cond::CmpDef { .. }
        | Cond::CmpFacts { .. }
        | Cond::CmpArith { .. }) => c,
    }
}

fn fold_num(n: Num, atoms: &[Option<Cond>]) -> Num {
    match n {
        Num::Arith(op, a, b) => Num::Arith(
            op,
            Box::new(fold_num(*a, atoms)),
            Box::new(fold_num(*b, atoms)),
        ),
        Num::Neg(a) => Num::Neg(Box::new(fold_num(*a, atoms))),
        Num::If(c, a, b) => Num::If(
            Box::new(fold_cond(*c, atoms)),
            Box::new(fold_num(*a, atoms)),
            Box::new(fold_num(*b, atoms)),
        ),
        Num::Call(f, args) => Num::Call(
            f,
            args.into_vec()
                .into_iter()
                .map(|a| fold_num(a, atoms))
                .collect(),
        ),
        Num::Truth(c) => Num::Truth(Box::new(fold_cond(*c, atoms))),
        n @ (Num::Const(_) | Num::Slot(_) | Num::Def { .. }) => n,
    }
}

/// `not c` (Kleene De Morgan for leaf sets).
fn negate(c: Cond) -> Cond {
    match c {
        Cond::Leaf { word, bit } => Cond::Leaves {
            any: false,
            words: Box::new([LeafWord {
                word,
                pos: 0,
                neg: 1 << bit,
            }]),
        },
        Cond::Leaves { any, words } => Cond::Leaves {
            any: !any,
            words: words
                .iter()
                .map(|w| LeafWord {
                    pos: w.neg,
                    neg: w.pos,
                    ..*w
                })
                .collect(),
        },
        Cond::Atom { index, negate } => Cond::Atom {
            index,
            negate: !negate,
        },
        Cond::Not(a) => *a,
        c => Cond::Not(Box::new(c)),
    }
}

/// Folds an `and` (`any: false`) or `or` of `cs`: nested groups of the same kind flattened,
/// the slot formulas merged into one leaf set tested first.
fn group(any: bool, cs: Vec<Cond>, atoms: &[Option<Cond>]) -> Cond {
    let mut leaves: Vec<LeafWord> = Vec::new();
    let mut rest: Vec<Cond> = Vec::new();
    let add = |w: LeafWord, leaves: &mut Vec<LeafWord>| match leaves
        .iter_mut()
        .find(|l| l.word == w.word)
    {
        Some(l) => {
            l.pos |= w.pos;
            l.neg |= w.neg;
        }
        None => leaves.push(w),
    };
    let mut todo: Vec<Cond> = cs.into_iter().rev().collect();
    while let Some(c) = todo.pop() {
        match fold_cond(c, atoms) {
            Cond::Leaf { word, bit } => add(
                LeafWord {
                    word,
                    pos: 1 << bit,
                    neg: 0,
                },
                &mut leaves,
            ),
            Cond::Leaves { any: a, words }
                if a == any
                    || words
                        .iter()
                        .map(|w| (w.pos | w.neg).count_ones())
                        .sum::<u32>()
                        == 1 =>
            {
                words.iter().for_each(|&w| add(w, &mut leaves))
            }
            Cond::All(inner) if !any => todo.extend(inner.into_vec().into_iter().rev()),
            Cond::Any(inner) if any => todo.extend(inner.into_vec().into_iter().rev()),
            c => rest.push(c),
        }
    }
    if !leaves.is_empty() {
        leaves.sort_by_key(|w| w.word);
        rest.insert(
            0,
            Cond::Leaves {
                any,
                words: leaves.into(),
            },
        );
    }
    match rest.len() {
        1 => rest.pop().expect("one"),
        _ if any => Cond::Any(rest.into()),
        _ => Cond::All(rest.into()),
    }
}

fn patch_num(n: &mut Num, bits: &[(u16, u8)]) {
    match n {
        Num::Const(_) | Num::Slot(_) | Num::Def { .. } => {}
        Num::Arith(_, a, b) => {
            patch_num(a, bits);
            patch_num(b, bits);
        }
        Num::Neg(a) => patch_num(a, bits),
        Num::If(c, a, b) => {
            patch_cond(c, bits);
            patch_num(a, bits);
            patch_num(b, bits);
        }
        Num::Call(_, args) => args.iter_mut().for_each(|a| patch_num(a, bits)),
        Num::Truth(c) => patch_cond(c, bits),
    }
}

/// The largest modulus a residue table is built for (`fact % k` with `k` dividing it).
const MAX_MODULUS: i64 = 4096;

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The classes of fact `slot` for a group of formulas of `kind` with these boundaries.
fn classes_for(schema: &Schema, slot: u16, kind: Kind, b: &Boundaries) -> Classes {
    let field = &schema.fields[slot as usize];
    if kind == Kind::Residue {
        let m = b.moduli.iter().try_fold(1i64, |m, &k| {
            let l = m / gcd(m, k) * k;
            (l <= MAX_MODULUS).then_some(l)
        });
        return match (field.ty, m) {
            (Ty::Int, Some(m)) => Classes::Residue(m),
            _ => Classes::Never,
        };
    }
    if b.overflow {
        return Classes::Never;
    }
    // Constants a value of the fact can be ordered against, sorted and without repeats.
    let mut cs: Vec<Value> = b
        .consts
        .iter()
        .copied()
        .filter(|c| c.compare(*c) == Some(Ordering::Equal))
        .collect();
    if cs
        .iter()
        .any(|a| cs.iter().any(|b| a.compare(*b).is_none()))
    {
        return Classes::Never;
    }
    cs.sort_by(|a, b| a.compare(*b).expect("mutually comparable"));
    cs.dedup_by(|a, b| a.compare(*b) == Some(Ordering::Equal));
    let ints: Option<Vec<i64>> = cs
        .iter()
        .map(|c| match c {
            Value::Int(i) => Some(*i),
            _ => None,
        })
        .collect();
    // Division is tabulated for integers only (its thresholds are integers).
    if b.divides && !(field.ty == Ty::Int && ints.is_some()) {
        return Classes::Never;
    }
    match (field.ty, ints) {
        (Ty::Bool, _) => Classes::Bool,
        (Ty::Enum(d), _) => Classes::Enum(d.values().len() as u16),
        (Ty::Object, _) if b.null_only => Classes::Present,
        (Ty::Object, _) => Classes::Never,
        (Ty::Int, Some(ints)) => Classes::Int(ints.into()),
        (Ty::Version, _) if cs.iter().all(|c| matches!(c, Value::Version(_))) => Classes::Version(
            cs.iter()
                .map(|c| match c {
                    Value::Version(v) => *v,
                    _ => unreachable!(),
                })
                .collect(),
        ),
        (Ty::Int | Ty::Float | Ty::Version, _) => {
            let fs: Option<Vec<f64>> = cs.iter().map(|c| c.as_f64()).collect();
            let fs = fs
                .filter(|fs| fs.windows(2).all(|w| w[0] < w[1]))
                .unwrap_or_default();
            Classes::Ordered(cs.into(), fs.into())
        }
    }
}

impl Classes {
    /// The sorted constants of an order classification without representatives.
    fn constants(&self) -> Vec<Value> {
        match self {
            Classes::Version(cs) => cs.iter().map(|&c| Value::Version(c)).collect(),
            Classes::Ordered(cs, _) => cs.to_vec(),
            _ => Vec::new(),
        }
    }

    /// What class `k` stands for when formulas are tabulated; `None`: no value falls in it
    /// (no integer lies between two adjacent thresholds).
    fn value(&self, k: usize) -> Option<ClassValue> {
        Some(match (k, self) {
            (CLASS_NULL, _) => ClassValue::Exact(Value::Null),
            (CLASS_UNKNOWN, _) => ClassValue::Exact(Value::Unknown),
            (k, Classes::Bool) => ClassValue::Exact(Value::Bool(k == 3)),
            (k, Classes::Enum(_)) => ClassValue::Exact(Value::Enum((k - 2) as u16)),
            // Null tests are all a present value is asked.
            (_, Classes::Present) => ClassValue::Exact(Value::Bool(true)),
            (k, Classes::Residue(_)) => ClassValue::Exact(Value::Int(k as i64 - 2)),
            // Every integer of a class answers its formulas alike (they compare the fact, or
            // `fact // k`, with thresholds all among the class boundaries): one represents it.
            (k, Classes::Int(cs)) => {
                let (i, eq) = ((k - 2) / 2, (k - 2) % 2 == 1);
                let rep = match (eq, i) {
                    (true, i) => Some(cs[i]),
                    (false, 0) => cs.first().map_or(Some(0), |c| c.checked_sub(1)),
                    (false, i) => cs[i - 1]
                        .checked_add(1)
                        .filter(|&r| cs.get(i).is_none_or(|&hi| r < hi)),
                };
                ClassValue::Exact(Value::Int(rep?))
            }
            (k, Classes::Version(_) | Classes::Ordered(..)) => {
                let (i, eq) = ((k - 2) / 2, (k - 2) % 2 == 1);
                if eq {
                    ClassValue::Equal { at: i }
                } else {
                    ClassValue::Between { below: i }
                }
            }
            (_, Classes::Never) => unreachable!("a table-less group has only null and unknown"),
        })
    }
}

/// In how many rules each residual conjunct occurs (looking through one `not`).
fn shared_residuals(program: &Program, flat: &[Vec<NodeId>]) -> HashMap<String, usize> {
    let mut shared: HashMap<String, usize> = HashMap::new();
    for cs in flat {
        let mut keys: Vec<String> = cs
            .iter()
            .filter(|&&c| is_formula(program, c).is_none())
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
    shared
}

/// Groups the slot formulas for [`RulePlan::build`] and tabulates each group's classes:
/// returns each formula's (word, bit) and the groups.
fn group_formulas(
    program: &Program,
    schema: &Schema,
    formulas: &[(NodeId, (u16, Kind))],
    literal_of: &[Vec<u64>],
    words: usize,
) -> (Vec<(u16, u8)>, Vec<SlotGroup>) {
    // Group the formulas by fact (slot order, so a decision reads the facts in order), at
    // most 64 to a word, and tabulate each group's classes.
    let mut order: Vec<usize> = (0..formulas.len()).collect();
    order.sort_by_key(|&f| (formulas[f].1, f));
    let mut bits = vec![(0u16, 0u8); formulas.len()];
    let mut groups: Vec<SlotGroup> = Vec::new();
    let mut scratch_facts = vec![Value::Null; schema.fields.len()];
    let mut i = 0;
    while i < order.len() {
        let slot = formulas[order[i]].1;
        let mut j = i;
        while j < order.len() && formulas[order[j]].1 == slot {
            j += 1;
        }
        let mut bounds = Boundaries {
            null_only: true,
            ..Boundaries::default()
        };
        for &f in &order[i..j] {
            formula_boundaries(program, formulas[f].0, &mut bounds);
        }
        for chunk in order[i..j].chunks(64) {
            let word = groups.len() as u16;
            for (bit, &f) in chunk.iter().enumerate() {
                bits[f] = (word, bit as u8);
            }
            let classes = classes_for(schema, slot.0, slot.1, &bounds);
            groups.push(tabulate(
                program,
                slot.0,
                word,
                classes,
                chunk.iter().map(|&f| (formulas[f].0, &literal_of[f])),
                words,
                &mut scratch_facts,
            ));
        }
        i = j;
    }
    (bits, groups)
}

/// Largest table (classes of one fact times classes of the other) of a pair group.
const MAX_PAIR_CLASSES: usize = 64;
/// Largest table of a pair whose groups rule conjuncts read together: the conjuncts it turns
/// into table literals pay for the larger table (torch presets -1.8% instructions against 64,
/// te unchanged; 256 gave the same as 128).
const MAX_AFFINITY_PAIR_CLASSES: usize = 2 * MAX_PAIR_CLASSES;

/// Pairs groups over facts with few classes: one table lookup, one formula word and one
/// rule-word fold per pair instead of two (the per-group costs of a decision), and leaf sets
/// over both facts test one word. A pair's row for classes (i, j) is the union of the two
/// groups' rows: the second group's formula bits above the first's, the rules either rules out
/// or leaves unknown (a literal is false, or unknown, in the pair exactly when it is in its own
/// group). Each group pairs with the first later one that fits (slot order). Merging three
/// facts a group cost more instructions (a loop over the facts) than it saved. Returns the new
/// (word, bit) of every formula, the groups left single, and the pairs (their words follow
/// the single groups').
fn pair_groups(
    bits: Vec<(u16, u8)>,
    groups: Vec<SlotGroup>,
    words: usize,
    affinity: &HashMap<(u16, u16), usize>,
) -> (Vec<(u16, u8)>, Vec<SlotGroup>, Vec<SlotGroup>) {
    let n = groups.len();
    let mut partner: Vec<Option<usize>> = vec![None; n];
    let mut taken = vec![false; n];
    let fits = |i: usize, j: usize| {
        groups[i].rows.len() * groups[j].rows.len() <= MAX_PAIR_CLASSES
            && groups[i].formulas.len() + groups[j].formulas.len() <= 64
    };
    // Most shared conjuncts first (ties in group order, so the plan is deterministic).
    let mut wanted: Vec<(usize, usize, usize)> = affinity
        .iter()
        .map(|(&(a, b), &count)| (count, a.min(b) as usize, a.max(b) as usize))
        .collect();
    wanted.sort_by_key(|&(count, a, b)| (std::cmp::Reverse(count), a, b));
    for (_, i, j) in wanted {
        let fits_wide = groups[i].rows.len() * groups[j].rows.len() <= MAX_AFFINITY_PAIR_CLASSES
            && groups[i].formulas.len() + groups[j].formulas.len() <= 64;
        if i != j && !taken[i] && !taken[j] && fits_wide {
            (taken[i], taken[j], partner[i]) = (true, true, Some(j));
        }
    }
    for i in 0..n {
        if taken[i] {
            continue;
        }
        if let Some(j) = (i + 1..n).find(|&j| !taken[j] && fits(i, j)) {
            (taken[i], taken[j], partner[i]) = (true, true, Some(j));
        }
    }
    let singles: Vec<usize> = (0..n).filter(|&i| !taken[i]).collect();
    let firsts: Vec<usize> = (0..n).filter(|&i| partner[i].is_some()).collect();
    // Per old group: its new word and the shift of its formula bits.
    let mut moved = vec![(0u16, 0u8); n];
    for (w, &i) in singles.iter().enumerate() {
        moved[i] = (w as u16, 0);
    }
    let mut pairs = Vec::with_capacity(firsts.len());
    for (p, &i) in firsts.iter().enumerate() {
        let (j, w) = (partner[i].expect("a pair"), (singles.len() + p) as u16);
        moved[i] = (w, 0);
        moved[j] = (w, groups[i].formulas.len() as u8);
        pairs.push(pair_of(&groups[i], &groups[j], w, words));
    }
    let bits = bits
        .into_iter()
        .map(|(word, bit)| {
            let (w, shift) = moved[word as usize];
            (w, bit + shift)
        })
        .collect();
    let mut groups: Vec<Option<SlotGroup>> = groups.into_iter().map(Some).collect();
    let singles = singles
        .iter()
        .map(|&i| {
            let mut g = groups[i].take().expect("each group once");
            g.word = moved[i].0;
            g
        })
        .collect();
    (bits, singles, pairs)
}

/// The pair group of single groups `a` and `b` (see [`pair_groups`]), formula word `word`.
fn pair_of(a: &SlotGroup, b: &SlotGroup, word: u16, words: usize) -> SlotGroup {
    let (na, nb) = (a.rows.len(), b.rows.len());
    let shift = a.formulas.len();
    let rule_row = |g: &SlotGroup, k: usize| -> Vec<u64> {
        if g.rule_words.is_empty() {
            vec![0; 2 * words]
        } else {
            g.rule_words[2 * words * k..2 * words * (k + 1)].to_vec()
        }
    };
    let mut rows = Vec::with_capacity(na * nb);
    let mut rule_words = Vec::with_capacity(na * nb * 2 * words);
    for i in 0..na {
        for j in 0..nb {
            let (x, y) = (a.rows[i], b.rows[j]);
            rows.push(Row {
                true_bits: x.true_bits | y.true_bits << shift,
                unknown_bits: x.unknown_bits | y.unknown_bits << shift,
            });
            let (x, y) = (rule_row(a, i), rule_row(b, j));
            rule_words.extend(x.iter().zip(&y).map(|(x, y)| x | y));
        }
    }
    if rule_words.iter().all(|&w| w == 0) {
        rule_words.clear();
    }
    SlotGroup {
        slot: a.slot,
        classes: a.classes.clone(),
        word,
        rows: rows.into(),
        rule_words: rule_words.into(),
        formulas: a
            .formulas
            .iter()
            .chain(b.formulas.iter())
            .copied()
            .collect(),
        literal_of: a
            .literal_of
            .iter()
            .chain(b.literal_of.iter())
            .cloned()
            .collect(),
        second: Some((b.slot, b.classes.clone(), nb)),
        leaf_literals: Box::new([]),
        hot: Box::new([]),
    }
}

/// `g`'s [`HotRow`]s (a plan of at most four rule words).
fn hot_rows(g: &SlotGroup, words: usize) -> Box<[HotRow]> {
    (0..g.rows.len())
        .map(|k| {
            let Row {
                true_bits: t,
                unknown_bits: u,
            } = g.rows[k];
            let mut kill = [0; 4];
            if !g.rule_words.is_empty() {
                let (k_words, unk) =
                    g.rule_words[2 * words * k..2 * words * (k + 1)].split_at(words);
                kill[..words].copy_from_slice(k_words);
                // Classification skips the unknown words of a class with no unknown formula.
                assert!(
                    u != 0 || unk.iter().all(|&w| w == 0),
                    "rules unknown without an unknown formula"
                );
            }
            HotRow { t, u, kill }
        })
        .collect()
}

/// The truth of a one-word leaf set (`Cond::Leaves` with one word) for the formula word
/// `(t, u)`: what `Cx::leaves` computes for it.
fn leaf_word_truth(any: bool, w: &LeafWord, t: u64, u: u64) -> u8 {
    let f = !(t | u);
    let decided = if any {
        w.pos & t | w.neg & f
    } else {
        w.pos & f | w.neg & t
    };
    match (decided != 0, (w.pos | w.neg) & u != 0, any) {
        (true, _, true) => TRUE,
        (true, _, false) => FALSE,
        (false, true, _) => UNKNOWN,
        (false, false, true) => FALSE,
        (false, false, false) => TRUE,
    }
}

/// Moves every rule conjunct that is a leaf set over one formula word (`sm in [90] or fp8`
/// over a pair's two facts, an inlined atom such as `not (fp8 and sm >= 100)`) out of the
/// rule's residual and into that word's group table, as a literal: its truth is a function of
/// the group's class, so per class the table rules the rule out (false) or marks it unknown,
/// as for a slot formula literal. A decision then never visits a rule such a conjunct rules
/// out (a te preset decision visited ~9 live rules only to find one false). The Kleene `and`
/// of the literals and the residual is unchanged, so every rule's truth is too.
fn table_leaf_conjuncts(
    rules: Vec<Box<[Cond]>>,
    groups: &mut [SlotGroup],
    pairs: &mut [SlotGroup],
    words: usize,
) -> Vec<Box<[Cond]>> {
    let n = groups.len();
    let mut lits: Vec<Vec<(u32, bool, LeafWord)>> = vec![Vec::new(); n + pairs.len()];
    let rules = rules
        .into_iter()
        .enumerate()
        .map(|(r, cs)| {
            cs.into_vec()
                .into_iter()
                .filter(|c| match c {
                    Cond::Leaves { any, words } if words.len() == 1 => {
                        lits[words[0].word as usize].push((r as u32, *any, words[0]));
                        false
                    }
                    _ => true,
                })
                .collect()
        })
        .collect();
    for (g, lits) in groups.iter_mut().chain(pairs.iter_mut()).zip(lits) {
        if lits.is_empty() {
            continue;
        }
        let mut rule_words = std::mem::take(&mut g.rule_words).into_vec();
        if rule_words.is_empty() {
            rule_words = vec![0; g.rows.len() * 2 * words];
        }
        for (k, row) in g.rows.iter().enumerate() {
            let (kill, unknown) =
                rule_words[2 * words * k..2 * words * (k + 1)].split_at_mut(words);
            for &(r, any, w) in &lits {
                match leaf_word_truth(any, &w, row.true_bits, row.unknown_bits) {
                    FALSE => set_bit(kill, r as usize),
                    UNKNOWN => set_bit(unknown, r as usize),
                    _ => {}
                }
            }
        }
        g.rule_words = rule_words.into();
        g.leaf_literals = lits.into();
    }
    rules
}

/// Takes the first residual conjunct of a rule out of its residual when it is a shared atom
/// (`Cond::Atom`, possibly negated) that leads two or more rules of the same rule word: per
/// such atom and word, the rules that read it as it is and negated ([`EagerAtom`]). A
/// decision then computes each such atom once after classification, if one of its rules is
/// still live (exactly when visiting the first of them would have computed it), and rules out
/// (false) or marks unknown all of them at once, as a class table does for a literal: a rule
/// ruled out by a shared atom (`head_dim_qk != head_dim_v`, a definition compared with a
/// constant) is no longer visited. Kleene `and` is associative and commutative and evaluation
/// has no effects, so the truths are unchanged.
fn shared_atom_conjuncts(rules: Vec<Box<[Cond]>>) -> (Vec<Box<[Cond]>>, Vec<EagerAtom>) {
    let lead = |r: usize, cs: &[Cond]| match cs.first() {
        Some(&Cond::Atom { index, negate }) => Some(((index, r / 64), negate)),
        _ => None,
    };
    // An atom that leads one rule of a word would only move that rule's work (and add a test
    // per decision): it stays in the residual.
    let mut leads: HashMap<(u16, usize), usize> = HashMap::new();
    for (r, cs) in rules.iter().enumerate() {
        if let Some((key, _)) = lead(r, cs) {
            *leads.entry(key).or_default() += 1;
        }
    }
    let mut eager: Vec<EagerAtom> = Vec::new();
    let mut entry: HashMap<(u16, usize), usize> = HashMap::new();
    let rules = rules
        .into_iter()
        .enumerate()
        .map(|(r, cs)| {
            let mut cs = cs.into_vec();
            if let Some((key @ (index, word), negate)) = lead(r, &cs)
                && leads[&key] >= 2
            {
                let e = *entry.entry(key).or_insert_with(|| {
                    eager.push(EagerAtom {
                        index,
                        word: word as u16,
                        pos: 0,
                        neg: 0,
                    });
                    eager.len() - 1
                });
                let bit = 1u64 << (r % 64);
                if negate {
                    eager[e].neg |= bit;
                } else {
                    eager[e].pos |= bit;
                }
                cs.remove(0);
            }
            cs.into()
        })
        .collect();
    (rules, eager)
}

/// Patches the formula bits into the atoms and rules, folds the atoms (leaf sets, inlined
/// small atoms) and groups each rule's conjuncts (see [`group`]).
fn fold_rules(
    mut rules: Vec<Box<[Cond]>>,
    mut atoms: Vec<Cond>,
    bits: &[(u16, u8)],
) -> (Vec<Cond>, Vec<Box<[Cond]>>) {
    for c in rules.iter_mut().flat_map(|r| r.iter_mut()) {
        patch_cond(c, bits);
    }
    for c in atoms.iter_mut() {
        patch_cond(c, bits);
    }
    let mut folded: Vec<Option<Cond>> = vec![None; atoms.len()];
    for i in (0..atoms.len()).rev() {
        let body = std::mem::replace(&mut atoms[i], Cond::All(Box::new([])));
        folded[i] = Some(fold_cond(body, &folded));
    }
    let rules = rules
        .into_iter()
        .map(|r| match group(false, r.into_vec(), &folded) {
            Cond::All(cs) => cs,
            c => Box::new([c]) as Box<[Cond]>,
        })
        .collect();
    let atoms = folded.into_iter().map(|a| a.expect("folded")).collect();
    (atoms, rules)
}

impl RulePlan {
    /// Plans the conditions `roots` (one per rule) of `program` over `schema`'s facts, and
    /// `extras`, conditions evaluated one by one with [`RulePlan::eval_extra`].
    pub fn build(
        program: &Program,
        schema: &Schema,
        roots: &[NodeId],
        extras: &[NodeId],
    ) -> RulePlan {
        let flat: Vec<Vec<NodeId>> = roots
            .iter()
            .map(|&r| {
                let mut out = Vec::new();
                conjuncts_of(program, r, &mut out);
                out
            })
            .collect();
        let shared = shared_residuals(program, &flat);
        let mut b = Builder {
            p: program,
            atoms: Vec::new(),
            atom_of: HashMap::new(),
            defs: Vec::new(),
            def_of: HashMap::new(),
            shared,
            formula_of: HashMap::new(),
            formulas: Vec::new(),
        };
        let words = flat.len().div_ceil(64);
        // Per formula: the rules it is a literal (top-level conjunct) of.
        let mut literal_of: Vec<Vec<u64>> = Vec::new();
        let mut rules = Vec::with_capacity(flat.len());
        for (r, cs) in flat.iter().enumerate() {
            let mut residual: Vec<(usize, Cond)> = Vec::new();
            for &c in cs {
                if let Some(slot) = is_formula(program, c) {
                    let f = b.formula(c, slot) as usize;
                    literal_of.resize(b.formulas.len(), vec![0; words]);
                    set_bit(&mut literal_of[f], r);
                    continue;
                }
                // Cheapest first; a shared conjunct counts as cheap (most likely computed
                // already), so the first false one ends the rule early.
                let cond = b.conjunct(c);
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
                residual.push((cost, cond));
            }
            residual.sort_by_key(|(cost, _)| *cost);
            rules.push(
                residual
                    .into_iter()
                    .map(|(_, c)| c)
                    .collect::<Box<[Cond]>>(),
            );
        }
        let mut extras: Vec<Cond> = extras.iter().map(|&e| b.cond(e)).collect();
        let atoms: Vec<Cond> = b
            .atoms
            .into_iter()
            .map(|a| a.expect("atom built"))
            .collect();
        let mut defs: Vec<Num> = b
            .defs
            .into_iter()
            .map(|d| d.expect("definition built"))
            .collect();
        literal_of.resize(b.formulas.len(), vec![0; words]);

        let (bits, groups) = group_formulas(program, schema, &b.formulas, &literal_of, words);
        // Groups that rule conjuncts read together (a leaf set over two groups' words) pair
        // first: the conjunct then reads one word, and becomes a table literal.
        let mut affinity: HashMap<(u16, u16), usize> = HashMap::new();
        for r in fold_rules(rules.clone(), atoms.clone(), &bits).1 {
            for c in r.iter() {
                if let Cond::Leaves { words: ws, .. } = c
                    && ws.len() == 2
                {
                    *affinity.entry((ws[0].word, ws[1].word)).or_default() += 1;
                }
            }
        }
        let (bits, groups, pairs) = pair_groups(bits, groups, words, &affinity);
        for c in extras.iter_mut() {
            patch_cond(c, &bits);
        }
        for d in &mut defs {
            patch_num(d, &bits);
        }
        // A decision keeps group i's formula bits in word i (`classify` writes them in order).
        assert!(
            groups
                .iter()
                .chain(&pairs)
                .enumerate()
                .all(|(i, g)| g.word as usize == i)
        );
        let (atoms, rules) = fold_rules(rules, atoms, &bits);
        let folded: Vec<Option<Cond>> = atoms.iter().cloned().map(Some).collect();
        let (mut groups, mut pairs) = (groups, pairs);
        let rules = table_leaf_conjuncts(rules, &mut groups, &mut pairs, words);
        let (rules, eager) = shared_atom_conjuncts(rules);
        if words <= 4 {
            for g in groups.iter_mut().chain(pairs.iter_mut()) {
                g.hot = hot_rows(g, words);
            }
        }
        let extras = extras.into_iter().map(|c| fold_cond(c, &folded)).collect();
        let defs = defs.into_iter().map(|d| fold_num(d, &folded)).collect();
        RulePlan {
            atoms,
            defs,
            rules,
            words,
            groups,
            pairs,
            extras,
            eager,
        }
    }

    /// Number of shared atoms.
    pub fn atom_count(&self) -> usize {
        self.atoms.len()
    }

    /// Number of slot formulas (conditions over one fact, answered by the class tables).
    pub fn formula_count(&self) -> usize {
        self.groups
            .iter()
            .chain(&self.pairs)
            .map(|g| g.formulas.len())
            .sum()
    }

    /// Clears `scratch` for a new decision.
    #[inline]
    pub fn reset(&self, scratch: &mut AtomScratch) {
        scratch.atoms.clear();
        scratch.atoms.resize(self.atoms.len(), UNSET);
        scratch.steps = 0;
    }

    /// Classifies every fact the formulas read and folds the class tables into the formula
    /// words and the live / unknown rule sets (the first step of a decision).
    // Out of line: inlined, it crowds the rule loop's registers (more instructions overall).
    #[inline(never)]
    fn classify<const COUNT: bool>(
        &self,
        program: &Program,
        facts: &[Value],
        scratch: &mut AtomScratch,
    ) {
        // A width known at compile time keeps the rule sets in registers.
        match self.words {
            1 => self.classify_in::<COUNT, 1>(program, facts, scratch),
            2 => self.classify_in::<COUNT, 2>(program, facts, scratch),
            3 => self.classify_in::<COUNT, 3>(program, facts, scratch),
            4 => self.classify_in::<COUNT, 4>(program, facts, scratch),
            _ => self.classify_in::<COUNT, 0>(program, facts, scratch),
        }
    }

    /// [`RulePlan::classify`] for plans of `W` rule words (`W == 0`: any width, the sets
    /// updated in the scratch).
    #[inline(always)]
    fn classify_in<const COUNT: bool, const W: usize>(
        &self,
        program: &Program,
        facts: &[Value],
        scratch: &mut AtomScratch,
    ) {
        let (n, words) = (self.rules.len(), self.words);
        let s = scratch;
        // Every word is rewritten below: size the buffers once, never clear them.
        if s.live.len() != words {
            s.live.resize(words, 0);
            s.unknown.resize(words, 0);
            s.slow_row.resize(2 * words, 0);
        }
        s.live.fill(u64::MAX);
        if !n.is_multiple_of(64) {
            s.live[words - 1] = (1u64 << (n % 64)) - 1;
        }
        s.unknown.fill(0);
        let n = self.groups.len() + self.pairs.len();
        if s.leaf.len() != n {
            s.leaf.resize(n, Leaf::default());
        }
        let (mut live, mut unknown) = ([u64::MAX; W], [0u64; W]);
        if W > 0 {
            live.copy_from_slice(&s.live);
        }
        let (singles, pairs) = s.leaf.split_at_mut(self.groups.len());
        let mut sets = RuleSets::<W> {
            live: &mut live,
            unknown: &mut unknown,
            dyn_live: &mut s.live,
            dyn_unknown: &mut s.unknown,
        };
        let mut slow = (&mut s.slow_row, &mut s.steps);
        for (g, leaf) in self.groups.iter().zip(singles.iter_mut()) {
            let k = g.classes.of(facts[g.slot as usize]);
            self.classify_group::<COUNT, W>(g, k, leaf, program, facts, &mut sets, &mut slow);
        }
        for (g, leaf) in self.pairs.iter().zip(pairs.iter_mut()) {
            let k = g.classes.of(facts[g.slot as usize]);
            let k = match &g.second {
                Some((second, classes, count)) => match (k, classes.of(facts[*second as usize])) {
                    (Some(i), Some(j)) => Some(i * count + j),
                    _ => None,
                },
                None => k,
            };
            self.classify_group::<COUNT, W>(g, k, leaf, program, facts, &mut sets, &mut slow);
        }
        if W > 0 {
            s.live.copy_from_slice(&live);
            s.unknown.copy_from_slice(&unknown);
        }
    }

    /// Writes group `g`'s formula word for class `k` (`None`: no class, the slow path) and
    /// folds the rules it rules out or leaves unknown into the rule sets.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn classify_group<const COUNT: bool, const W: usize>(
        &self,
        g: &SlotGroup,
        k: Option<usize>,
        leaf: &mut Leaf,
        program: &Program,
        facts: &[Value],
        sets: &mut RuleSets<'_, W>,
        (slow_row, steps): &mut (&mut Vec<u64>, &mut u64),
    ) {
        let words = self.words;
        if COUNT {
            **steps += 1;
        }
        if W > 0
            && let Some(k) = k
        {
            let h = &g.hot[k];
            *leaf = Leaf { t: h.t, u: h.u };
            // A group that rules nothing out (a quarter of the te pack's) folds nothing.
            if !g.rule_words.is_empty() {
                for j in 0..W {
                    sets.live[j] &= !h.kill[j];
                }
                if h.u != 0 {
                    let unk = &g.rule_words[2 * words * k + words..2 * words * (k + 1)];
                    // Indexed as the rules-out loop above: the `zip` form of this loop cost
                    // the torch presets (one rule word) ~30 ns per decision.
                    #[allow(clippy::needless_range_loop)]
                    for j in 0..W {
                        sets.unknown[j] |= unk[j];
                    }
                }
            }
            return;
        }
        let (row, rule_words) = match k {
            // A group that rules nothing out (a quarter of the te pack's) folds nothing.
            Some(k) if g.rule_words.is_empty() => {
                let row = g.rows[k];
                *leaf = Leaf {
                    t: row.true_bits,
                    u: row.unknown_bits,
                };
                return;
            }
            Some(k) => (g.rows[k], &g.rule_words[2 * words * k..2 * words * (k + 1)]),
            None => {
                let row = self.classify_slow::<COUNT>(g, program, facts, slow_row, steps);
                (row, &slow_row[..])
            }
        };
        *leaf = Leaf {
            t: row.true_bits,
            u: row.unknown_bits,
        };
        sets.fold(rule_words, words);
    }

    /// A value no class covers: the group's formulas through the interpreter, tabulated into
    /// `rule_words` as a class's row would be.
    #[inline(never)]
    fn classify_slow<const COUNT: bool>(
        &self,
        g: &SlotGroup,
        program: &Program,
        facts: &[Value],
        rule_words: &mut [u64],
        steps: &mut u64,
    ) -> Row {
        rule_words.fill(0);
        let (kill, unknown) = rule_words.split_at_mut(self.words);
        let mut row = Row::default();
        for (bit, (&f, rules)) in g.formulas.iter().zip(g.literal_of.iter()).enumerate() {
            if COUNT {
                *steps += 1;
            }
            let target = match truth_of(program.eval(f, facts)) {
                TRUE => {
                    row.true_bits |= 1 << bit;
                    continue;
                }
                UNKNOWN => {
                    row.unknown_bits |= 1 << bit;
                    &mut *unknown
                }
                _ => &mut *kill,
            };
            for (x, r) in target.iter_mut().zip(rules.iter()) {
                *x |= r;
            }
        }
        for &(r, any, w) in g.leaf_literals.iter() {
            match leaf_word_truth(any, &w, row.true_bits, row.unknown_bits) {
                FALSE => set_bit(kill, r as usize),
                UNKNOWN => set_bit(unknown, r as usize),
                _ => {}
            }
        }
        row
    }

    /// Evaluates every rule and calls `visit(rule, truth)`, in rule order, for each rule whose
    /// condition is true or unknown (rules that are false are not reported). `memo` and
    /// `scratch` belong to this decision: reset both ([`RulePlan::reset`]) before its first
    /// evaluation, and call this before [`RulePlan::eval_extra`].
    #[inline]
    pub fn eval_all(
        &self,
        program: &Program,
        facts: &[Value],
        memo: &mut [Option<Value>],
        scratch: &mut AtomScratch,
        visit: impl FnMut(usize, Truth),
    ) {
        self.eval_all_in::<false>(program, facts, memo, scratch, visit)
    }

    /// [`RulePlan::eval_all`], counting evaluation steps into the scratch
    /// ([`AtomScratch::steps`]): the deterministic cost measure CI guards.
    pub fn eval_all_counting(
        &self,
        program: &Program,
        facts: &[Value],
        memo: &mut [Option<Value>],
        scratch: &mut AtomScratch,
        visit: impl FnMut(usize, Truth),
    ) {
        self.eval_all_in::<true>(program, facts, memo, scratch, visit)
    }

    #[inline(always)]
    fn eval_all_in<const COUNT: bool>(
        &self,
        program: &Program,
        facts: &[Value],
        memo: &mut [Option<Value>],
        scratch: &mut AtomScratch,
        mut visit: impl FnMut(usize, Truth),
    ) {
        self.classify::<COUNT>(program, facts, scratch);
        let mut cx = Cx::<COUNT> {
            plan: self,
            facts,
            memo,
            atoms: &mut scratch.atoms,
            leaf: &scratch.leaf,
            steps: 0,
        };
        let (live, unknown) = (&mut scratch.live, &mut scratch.unknown);
        for e in &self.eager {
            let w = e.word as usize;
            if live[w] & (e.pos | e.neg) == 0 {
                continue;
            }
            match cx.shared(e.index as usize) {
                FALSE => live[w] &= !e.pos,
                TRUE => live[w] &= !e.neg,
                _ => unknown[w] |= e.pos | e.neg,
            }
        }
        for (w, &bits) in scratch.live.iter().enumerate() {
            let mut bits = bits;
            let unknown = scratch.unknown[w];
            while bits != 0 {
                let b = bits.trailing_zeros();
                let r = w * 64 + b as usize;
                bits &= bits - 1;
                if COUNT {
                    cx.steps += 1;
                }
                let t = match cx.all(&self.rules[r]) {
                    FALSE => continue,
                    UNKNOWN => UNKNOWN,
                    _ if unknown >> b & 1 == 1 => UNKNOWN,
                    t => t,
                };
                visit(r, truth(t));
            }
        }
        scratch.steps += cx.steps;
    }

    /// The truth of extra condition `i` (see [`RulePlan::build`]), after [`RulePlan::eval_all`]
    /// in the same decision.
    #[inline]
    pub fn eval_extra(
        &self,
        i: usize,
        facts: &[Value],
        memo: &mut [Option<Value>],
        scratch: &mut AtomScratch,
    ) -> Truth {
        self.eval_extra_in::<false>(i, facts, memo, scratch)
    }

    /// [`RulePlan::eval_extra`], counting steps into the scratch.
    pub fn eval_extra_counting(
        &self,
        i: usize,
        facts: &[Value],
        memo: &mut [Option<Value>],
        scratch: &mut AtomScratch,
    ) -> Truth {
        self.eval_extra_in::<true>(i, facts, memo, scratch)
    }

    #[inline(always)]
    fn eval_extra_in<const COUNT: bool>(
        &self,
        i: usize,
        facts: &[Value],
        memo: &mut [Option<Value>],
        scratch: &mut AtomScratch,
    ) -> Truth {
        let mut cx = Cx::<COUNT> {
            plan: self,
            facts,
            memo,
            atoms: &mut scratch.atoms,
            leaf: &scratch.leaf,
            steps: 0,
        };
        let t = cx.cond(&self.extras[i]);
        scratch.steps += cx.steps;
        truth(t)
    }

    /// The truth of rule `rule`'s condition, after [`RulePlan::eval_all`] in the same decision
    /// (which computed the formula words and rule sets this reads).
    pub fn eval_rule(
        &self,
        rule: usize,
        facts: &[Value],
        memo: &mut [Option<Value>],
        scratch: &mut AtomScratch,
    ) -> Truth {
        let (w, b) = (rule / 64, rule % 64);
        if scratch.live[w] >> b & 1 == 0 {
            return Truth::False;
        }
        let mut cx = Cx::<false> {
            plan: self,
            facts,
            memo,
            atoms: &mut scratch.atoms,
            leaf: &scratch.leaf,
            steps: 0,
        };
        match cx.all(&self.rules[rule]) {
            FALSE => Truth::False,
            _ if scratch.unknown[w] >> b & 1 == 1 => Truth::Unknown,
            t => truth(t),
        }
    }
}

impl AtomScratch {
    /// Evaluation steps of the last counted decision: facts classified, formulas evaluated on
    /// the slow path, rules visited, and conditions, atoms and definitions evaluated.
    pub fn steps(&self) -> u64 {
        self.steps
    }
}

/// Tabulates one group of formulas over fact `slot`: per class, the true and unknown formula
/// bits and the rules ruled out / left unknown through their literals.
fn tabulate<'a>(
    program: &Program,
    slot: u16,
    word: u16,
    classes: Classes,
    formulas: impl Iterator<Item = (NodeId, &'a Vec<u64>)>,
    words: usize,
    facts: &mut [Value],
) -> SlotGroup {
    let (nodes, literal_of): (Vec<NodeId>, Vec<&Vec<u64>>) = formulas.unzip();
    let cs = classes.constants();
    let mut rows = Vec::with_capacity(classes.count());
    let mut rule_words = Vec::with_capacity(classes.count() * 2 * words);
    for k in 0..classes.count() {
        let mut row = Row::default();
        let (mut kill, mut unknown) = (vec![0u64; words], vec![0u64; words]);
        // `None`: no value falls in this class; its row is never read.
        if let Some(cv) = classes.value(k) {
            for (bit, (&f, rules)) in nodes.iter().zip(&literal_of).enumerate() {
                let target = match formula_truth(program, f, slot, &cs, cv, facts) {
                    TRUE => {
                        row.true_bits |= 1 << bit;
                        continue;
                    }
                    UNKNOWN => {
                        row.unknown_bits |= 1 << bit;
                        &mut unknown
                    }
                    _ => &mut kill,
                };
                for (x, r) in target.iter_mut().zip(rules.iter()) {
                    *x |= r;
                }
            }
        }
        rule_words.extend_from_slice(&kill);
        rule_words.extend_from_slice(&unknown);
        rows.push(row);
    }
    facts[slot as usize] = Value::Null;
    if rule_words.iter().all(|&w| w == 0) {
        rule_words.clear();
    }
    SlotGroup {
        slot,
        classes,
        word,
        rows: rows.into(),
        rule_words: rule_words.into(),
        formulas: nodes.into(),
        literal_of: literal_of.into_iter().map(|l| l.clone().into()).collect(),
        second: None,
        leaf_literals: Box::new([]),
        hot: Box::new([]),
    }
}

/// What [`arith`] computes, with the common cases inline: integers, and a positive divisor
/// (for which Python's `//` and `%` are Euclid's).
#[inline(always)]
fn int_arith(op: ArithOp, x: Value, y: Value) -> Value {
    match (op, x, y) {
        (ArithOp::Add, Value::Int(p), Value::Int(q)) => {
            p.checked_add(q).map_or(Value::Null, Value::Int)
        }
        (ArithOp::Sub, Value::Int(p), Value::Int(q)) => {
            p.checked_sub(q).map_or(Value::Null, Value::Int)
        }
        (ArithOp::Mul, Value::Int(p), Value::Int(q)) => {
            p.checked_mul(q).map_or(Value::Null, Value::Int)
        }
        (ArithOp::FloorDiv, Value::Int(p), Value::Int(q)) if q > 0 => Value::Int(p.div_euclid(q)),
        (ArithOp::Rem, Value::Int(p), Value::Int(q)) if q > 0 => Value::Int(p.rem_euclid(q)),
        _ => arith(op, x, y),
    }
}

/// One decision's evaluation context.
struct Cx<'a, const COUNT: bool> {
    plan: &'a RulePlan,
    facts: &'a [Value],
    memo: &'a mut [Option<Value>],
    atoms: &'a mut [u8],
    leaf: &'a [Leaf],
    steps: u64,
}

fn truth(t: u8) -> Truth {
    match t {
        FALSE => Truth::False,
        TRUE => Truth::True,
        _ => Truth::Unknown,
    }
}

impl<const COUNT: bool> Cx<'_, COUNT> {
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

    /// Leaves and atoms inline; everything else out of line, so this stays small enough to
    /// inline into the loops.
    #[inline(always)]
    fn cond(&mut self, c: &Cond) -> u8 {
        if COUNT {
            self.steps += 1;
        }
        match c {
            Cond::Leaf { word, bit } => {
                let w = *word as usize;
                let Leaf { t, u } = self.leaf[w];
                let (t, u) = ((t >> bit) & 1, (u >> bit) & 1);
                (t | u << 1) as u8
            }
            Cond::Atom { index, negate } => {
                let t = self.cached(*index as usize);
                if *negate { not(t) } else { t }
            }
            Cond::Leaves { any, words } => self.leaves(*any, words),
            _ => self.cond_slow(c),
        }
    }

    /// Kleene `and` (`or` when `any`) of the formulas in `words`.
    #[inline(always)]
    fn leaves(&self, any: bool, words: &[LeafWord]) -> u8 {
        let mut unknown = 0u64;
        for w in words {
            let Leaf { t, u } = self.leaf[w.word as usize];
            let f = !(t | u);
            unknown |= (w.pos | w.neg) & u;
            let decided = if any {
                w.pos & t | w.neg & f
            } else {
                w.pos & f | w.neg & t
            };
            if decided != 0 {
                return if any { TRUE } else { FALSE };
            }
        }
        match (unknown != 0, any) {
            (true, _) => UNKNOWN,
            (false, true) => FALSE,
            (false, false) => TRUE,
        }
    }

    /// Atom `i`'s truth: computed on first use in the decision.
    #[inline(always)]
    fn cached(&mut self, i: usize) -> u8 {
        let t = self.atoms[i];
        if t == UNSET { self.atom(i) } else { t }
    }

    /// Atom `i` as a rule conjunct taken out of the residuals (one step, as `cond` counts it).
    #[inline(always)]
    fn shared(&mut self, i: usize) -> u8 {
        if COUNT {
            self.steps += 1;
        }
        self.cached(i)
    }

    /// Computes atom `i`. Straight into `cond_slow` (which takes every kind): an out-of-line
    /// frame of its own cost a call and a prologue per atom on top of `cond_slow`'s.
    #[inline(always)]
    fn atom(&mut self, i: usize) -> u8 {
        let plan = self.plan;
        let c = &plan.atoms[i];
        // One step, as `cond` counted it when it led here (`cond_slow` hands the kinds `cond`
        // answers inline back to `cond`, which counts them).
        if COUNT
            && !matches!(
                c,
                Cond::Leaf { .. } | Cond::Atom { .. } | Cond::Leaves { .. }
            )
        {
            self.steps += 1;
        }
        let t = self.cond_slow(c);
        self.atoms[i] = t;
        t
    }

    #[inline(never)]
    fn cond_slow(&mut self, c: &Cond) -> u8 {
        let f = self.facts;
        match c {
            Cond::CmpFacts { a, op, b } => truth_of(compare3(*op, f[*a as usize], f[*b as usize])),
            Cond::CmpArith {
                slot,
                arith: a,
                k,
                op,
                c,
            } => truth_of(compare3(*op, int_arith(*a, f[*slot as usize], *k), *c)),
            Cond::CmpDef { memo, body, op, c } => {
                let x = self.def(*memo, *body);
                truth_of(compare3(*op, x, *c))
            }
            Cond::CmpNum { op, a, b } => {
                let x = self.operand(a);
                let y = self.operand(b);
                truth_of(compare3(*op, x, y))
            }
            Cond::In {
                item,
                mask,
                list,
                negate,
            } => {
                let x = self.operand(item);
                truth_of(member(x, *mask, list, *negate))
            }
            Cond::Null { item, want_null } => {
                let x = self.operand(item);
                truth_of(null_test(x, *want_null))
            }
            Cond::Parsed(item) => {
                let x = self.operand(item);
                truth_of(parsed_test(x))
            }
            Cond::Not(a) => not(self.cond(a)),
            // An operand of a connective that is itself a connective (`(a and b) or (c and d)`,
            // most of the te pack's boolean definitions) is walked here, one level inline,
            // instead of in a `cond_slow` frame of its own.
            Cond::All(cs) => {
                let mut unknown = false;
                for c in cs.iter() {
                    match self.operand_cond(c) {
                        FALSE => return FALSE,
                        UNKNOWN => unknown = true,
                        _ => {}
                    }
                }
                if unknown { UNKNOWN } else { TRUE }
            }
            Cond::Any(cs) => {
                let mut unknown = false;
                for c in cs.iter() {
                    match self.operand_cond(c) {
                        TRUE => return TRUE,
                        UNKNOWN => unknown = true,
                        _ => {}
                    }
                }
                if unknown { UNKNOWN } else { FALSE }
            }
            Cond::Value(n) => {
                let v = self.operand(n);
                truth_of(v)
            }
            // The inline kinds: `cond` takes them before coming here.
            Cond::Leaf { .. } | Cond::Atom { .. } | Cond::Leaves { .. } => self.cond(c),
        }
    }

    /// An operand of `and`/`or` in `cond_slow`: a nested `and`/`or` walked inline, one level
    /// (its own operands through `cond`).
    #[inline(always)]
    fn operand_cond(&mut self, c: &Cond) -> u8 {
        match c {
            Cond::All(cs) => {
                if COUNT {
                    self.steps += 1;
                }
                self.all(cs)
            }
            Cond::Any(cs) => {
                if COUNT {
                    self.steps += 1;
                }
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
            _ => self.cond(c),
        }
    }

    /// A definition's value, computed once per decision.
    #[inline(always)]
    fn def(&mut self, memo: u16, body: u16) -> Value {
        let m = memo as usize;
        if let Some(v) = self.memo[m] {
            return v;
        }
        if COUNT {
            self.steps += 1;
        }
        let plan = self.plan;
        let v = self.operand(&plan.defs[body as usize]);
        self.memo[m] = Some(v);
        v
    }

    /// A function call. Out of line: its argument buffer would enlarge every `num` frame.
    #[inline(never)]
    fn call(&mut self, func: Func, args: &[Num]) -> Value {
        // Functions take 1-3 arguments (max/min rarely more).
        if args.len() <= 4 {
            let mut vals = [Value::Null; 4];
            for (v, a) in vals.iter_mut().zip(args.iter()) {
                *v = self.operand(a);
            }
            call(func, vals[..args.len()].iter().copied())
        } else {
            let vals: Vec<Value> = args.iter().map(|a| self.num(a)).collect();
            call(func, vals.into_iter())
        }
    }

    /// An operand's value: constants and facts (most operands) without `num`'s frame.
    #[inline(always)]
    fn operand(&mut self, n: &Num) -> Value {
        match n {
            Num::Const(v) => *v,
            Num::Slot(s) => self.facts[*s as usize],
            _ => self.num(n),
        }
    }

    fn num(&mut self, n: &Num) -> Value {
        match n {
            Num::Const(v) => *v,
            Num::Slot(s) => self.facts[*s as usize],
            Num::Def { memo, body } => self.def(*memo, *body),
            Num::Arith(op, a, b) => {
                let x = self.operand(a);
                let y = self.operand(b);
                int_arith(*op, x, y)
            }
            Num::Neg(a) => {
                let x = self.operand(a);
                neg(x)
            }
            Num::If(c, a, b) => match self.cond(c) {
                TRUE => self.operand(a),
                FALSE => self.operand(b),
                _ => Value::Unknown,
            },
            Num::Call(func, args) => self.call(*func, args),
            Num::Truth(c) => {
                let t = self.cond(c);
                value_of(t)
            }
        }
    }
}

/// The top-level conjuncts of `id`: nested `and`s flattened, boolean definitions that are
/// conjunctions included (Kleene `and` is associative, so this changes no result).
fn conjuncts_of(p: &Program, id: NodeId, out: &mut Vec<NodeId>) {
    match p.nodes[id as usize] {
        Node::And { start, len } => {
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
    use crate::facts::presets;

    /// Every rule's and extra's truth through the plan and through the interpreter, for one
    /// input; returns (rules compared, fired, unknown).
    fn compare_one(
        policy: &Policy,
        plan: &RulePlan,
        extras: &[NodeId],
        facts: &Facts,
        what: &str,
    ) -> (usize, usize, usize) {
        let p = &policy.program;
        let values = facts.values();
        let want: Vec<Truth> = policy
            .rules
            .iter()
            .map(|rule| Truth::of(p.eval(rule.when.node, values)))
            .collect();
        let mut got = vec![Truth::False; want.len()];
        let mut memo = p.new_memo();
        let mut scratch = AtomScratch::default();
        plan.reset(&mut scratch);
        plan.eval_all(p, values, &mut memo, &mut scratch, |i, t| got[i] = t);
        for (i, rule) in policy.rules.iter().enumerate() {
            assert_eq!(
                got[i], want[i],
                "pack {}: rule {} on {what}",
                policy.name, rule.id
            );
            let one = plan.eval_rule(i, values, &mut memo, &mut scratch);
            assert_eq!(
                one, want[i],
                "pack {}: rule {} alone on {what}",
                policy.name, rule.id
            );
        }
        for (i, &e) in extras.iter().enumerate() {
            let want = Truth::of(p.eval(e, values));
            let got = plan.eval_extra(i, values, &mut memo, &mut scratch);
            assert_eq!(got, want, "pack {}: extra {i} on {what}", policy.name);
        }
        (
            want.len(),
            want.iter().filter(|&&t| t == Truth::True).count(),
            want.iter().filter(|&&t| t == Truth::Unknown).count(),
        )
    }

    fn extras_of(policy: &Policy) -> Vec<NodeId> {
        let mut out = Vec::new();
        for b in &policy.backends {
            out.extend(
                b.variants
                    .iter()
                    .filter_map(|v| v.applicable.as_ref().map(|c| c.node)),
            );
        }
        out.extend(
            policy
                .preference
                .iter()
                .filter_map(|p| p.when.as_ref().map(|c| c.node)),
        );
        out
    }

    /// The plan of `policy`'s rules (and the extra conditions it evaluates), as the policy
    /// builds it.
    fn plan_of(policy: &Policy) -> (RulePlan, Vec<NodeId>) {
        let roots: Vec<NodeId> = policy.rules.iter().map(|r| r.when.node).collect();
        let extras = extras_of(policy);
        let plan = RulePlan::build(&policy.program, policy.schema, &roots, &extras);
        (plan, extras)
    }

    /// Inputs for `policy`: the presets of its family and a corpus of its family.
    fn inputs(policy: &Policy) -> Vec<Facts> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpora");
        let mut out: Vec<Facts> = presets::of_family(policy.schema.family)
            .map(|x| policy.schema.read(&(x.config)()).expect("preset"))
            .collect();
        let corpus = match policy.schema.family {
            "torch" => "torch-2.11-sdpa-corpus-a.jsonl.gz",
            _ => "te-2.20.2-corpus-a.jsonl.gz",
        };
        let records =
            crate::corpus::read_corpus(&root.join(corpus)).expect("tests/corpora ships the corpus");
        // Structurally invalid records are input errors: never decided, so nothing to compare.
        out.extend(
            records
                .iter()
                .filter_map(|r| crate::conformance::read_record(policy, r).ok()),
        );
        out
    }

    /// A seeded generator (xorshift): reproducible perturbations without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// The values a perturbed fact takes: the pack's constants and their neighbours, nulls,
    /// unknowns, unparseable versions and other enum values, so every class and the slow path
    /// are reached.
    fn perturb(policy: &Policy, facts: &mut Facts, rng: &mut Rng) {
        let consts: Vec<Value> = policy
            .program
            .consts
            .iter()
            .copied()
            .chain(policy.program.nodes.iter().filter_map(|n| match n {
                Node::Const(v) => Some(*v),
                _ => None,
            }))
            .collect();
        let n = facts.values.len();
        for _ in 0..1 + rng.below(6) {
            let slot = rng.below(n);
            let field = &policy.schema.fields[slot];
            let v = match rng.below(8) {
                0 => Value::Null,
                1 => Value::Unknown,
                2 if field.ty == Ty::Version => Value::BadVersion,
                _ => match field.ty {
                    Ty::Bool => Value::Bool(rng.below(2) == 1),
                    Ty::Enum(d) => Value::Enum(rng.below(d.values().len()) as u16),
                    Ty::Int => {
                        let ints: Vec<i64> = consts
                            .iter()
                            .filter_map(|c| match c {
                                Value::Int(i) => Some(*i),
                                _ => None,
                            })
                            .collect();
                        let base = if ints.is_empty() {
                            0
                        } else {
                            ints[rng.below(ints.len())]
                        };
                        Value::Int(base + rng.below(3) as i64 - 1)
                    }
                    Ty::Float => Value::Float([0.0, 0.5, 1.0, -1.0, 30.0, f64::NAN][rng.below(6)]),
                    Ty::Version => {
                        let vs: Vec<Version> = consts
                            .iter()
                            .filter_map(|c| match c {
                                Value::Version(v) => Some(*v),
                                _ => None,
                            })
                            .collect();
                        match vs.is_empty() {
                            true => Value::Version(Version::new(1, 0, 0)),
                            false => {
                                let mut v = vs[rng.below(vs.len())];
                                match rng.below(4) {
                                    0 => v.parts[2] += 1,
                                    1 if v.parts[2] > 0 => v.parts[2] -= 1,
                                    2 => v.pre = Some((crate::lang::version::PreKind::Rc, 1)),
                                    _ => {}
                                }
                                Value::Version(v)
                            }
                        }
                    }
                    Ty::Object => Value::Bool(true),
                },
            };
            facts.values[slot] = v;
        }
    }

    /// The inline integer arithmetic computes exactly what the interpreter's `arith` does,
    /// including overflow, zero, negative divisors and operands of other kinds.
    #[test]
    fn int_arith_is_arith() {
        let ints = [i64::MIN, -7, -2, -1, 0, 1, 2, 3, 7, 8, 64, i64::MAX];
        let mut vals: Vec<Value> = ints.iter().map(|&i| Value::Int(i)).collect();
        vals.extend([
            Value::Null,
            Value::Unknown,
            Value::Float(2.5),
            Value::Bool(true),
        ]);
        let ops = [
            ArithOp::Add,
            ArithOp::Sub,
            ArithOp::Mul,
            ArithOp::Div,
            ArithOp::FloorDiv,
            ArithOp::Rem,
        ];
        let mut compared = 0;
        for op in ops {
            for &x in &vals {
                for &y in &vals {
                    // `arith` panics where Rust's own division does (MIN // -1): skip it.
                    if matches!(
                        (op, x, y),
                        (
                            ArithOp::FloorDiv | ArithOp::Rem,
                            Value::Int(i64::MIN),
                            Value::Int(-1)
                        )
                    ) {
                        continue;
                    }
                    assert_eq!(int_arith(op, x, y), arith(op, x, y), "{op:?} {x:?} {y:?}");
                    compared += 1;
                }
            }
        }
        assert!(compared > 1000);
    }

    /// The branch-free ranks (integers against up to eight constants, floats against numeric
    /// constants) give the classes the binary searches give, and the te plan uses both.
    #[test]
    fn ranks_agree_with_the_searches() {
        let ints: Vec<i64> = vec![-3, 0, 1, 64, 128, 256, 4096, i64::MAX];
        for x in [
            i64::MIN,
            -4,
            -3,
            -1,
            0,
            1,
            2,
            63,
            64,
            200,
            256,
            5000,
            i64::MAX,
        ] {
            for n in 0..=ints.len() {
                let cs = &ints[..n];
                let i = cs.partition_point(|&c| c < x);
                let want = 2 * i + (i < cs.len() && cs[i] == x) as usize;
                assert_eq!(rank(cs, x), want, "{x} against {cs:?}");
            }
        }
        let cs = [
            Value::Int(-1),
            Value::Float(0.0),
            Value::Float(0.5),
            Value::Int(30),
        ];
        let fs: Vec<f64> = cs.iter().map(|c| c.as_f64().expect("number")).collect();
        let classes = Classes::Ordered(cs.into(), fs.into());
        let xs = [
            f64::NEG_INFINITY,
            -2.0,
            -1.0,
            -0.5,
            -0.0,
            0.0,
            0.25,
            0.5,
            1.0,
            30.0,
            31.0,
            f64::INFINITY,
            f64::NAN,
        ];
        for x in xs {
            let v = Value::Float(x);
            assert_eq!(classes.of(v), ordered_class(&cs, v), "{x}");
        }
        let policy = Policy::embedded("te").expect("embedded pack");
        let (plan, _) = plan_of(&policy);
        let all = || plan.groups.iter().chain(&plan.pairs);
        let kinds = |g: &SlotGroup| {
            [Some(&g.classes), g.second.as_ref().map(|(_, c, _)| c)]
                .into_iter()
                .flatten()
                .map(|c| match c {
                    Classes::Int(cs) => (cs.len() <= 8, false),
                    Classes::Ordered(_, fs) => (false, !fs.is_empty()),
                    _ => (false, false),
                })
                .collect::<Vec<_>>()
        };
        assert!(all().flat_map(kinds).any(|(int, _)| int));
        assert!(all().flat_map(kinds).any(|(_, float)| float));
    }

    /// Every group that rules something out, in a plan of at most four rule words (every
    /// embedded pack's), has one `HotRow` per class that holds its row and the rules-out half
    /// of its rule words, and a class with no unknown formula leaves no rule unknown (so
    /// classification may skip the unknown half for it).
    #[test]
    fn hot_rows_hold_the_tables() {
        for name in ["te", "native", "torch"] {
            let policy = Policy::embedded(name).expect("embedded pack");
            let (plan, _) = plan_of(&policy);
            let words = plan.words;
            assert!(words <= 4, "{name}: {words} rule words");
            let mut hot = 0;
            for g in plan.groups.iter().chain(&plan.pairs) {
                if g.rule_words.is_empty() {
                    continue;
                }
                hot += 1;
                assert_eq!(g.hot.len(), g.rows.len(), "{name}: slot {}", g.slot);
                for (k, (h, row)) in g.hot.iter().zip(g.rows.iter()).enumerate() {
                    let (kill, unknown) =
                        g.rule_words[2 * words * k..2 * words * (k + 1)].split_at(words);
                    assert_eq!((h.t, h.u), (row.true_bits, row.unknown_bits));
                    assert_eq!(&h.kill[..words], kill);
                    assert!(h.kill[words..].iter().all(|&w| w == 0));
                    assert!(h.u != 0 || unknown.iter().all(|&w| w == 0));
                }
            }
            assert!(hot > 0, "{name}: no group rules anything out");
        }
    }

    /// The plan and the node interpreter agree on every rule and extra condition of every
    /// embedded pack, over the presets, the whole conformance corpus of the pack's family and
    /// seeded random perturbations of them, with probes unknown, answered yes and answered no.
    /// Leaf-set conjuncts tabulated into a group's rule words (`table_leaf_conjuncts`) give the
    /// interpreter's truths also when a fact of the group takes the slow path (a value no
    /// class covers, e.g. an unparseable version), where `classify_slow` evaluates them.
    #[test]
    fn tabulated_leaf_conjuncts_agree_on_the_slow_path() {
        let odd = [
            Value::BadVersion,
            Value::Float(f64::NAN),
            Value::Enum(u16::MAX),
            Value::Int(i64::MIN),
            Value::Bool(true),
        ];
        for name in ["te", "native", "torch"] {
            let policy = Policy::embedded(name).expect("embedded pack");
            let (plan, extras) = plan_of(&policy);
            let tabulated: Vec<&SlotGroup> = plan
                .groups
                .iter()
                .chain(&plan.pairs)
                .filter(|g| !g.leaf_literals.is_empty())
                .collect();
            if name == "te" {
                assert!(
                    tabulated
                        .iter()
                        .map(|g| g.leaf_literals.len())
                        .sum::<usize>()
                        > 10,
                    "the te plan tabulates leaf-set conjuncts"
                );
            }
            let mut slow = 0;
            for g in tabulated {
                let second = g.second.as_ref().map(|(s, c, _)| (*s, c));
                for (slot, classes) in [(g.slot, &g.classes)].into_iter().chain(second) {
                    let Some(v) = odd.iter().copied().find(|&v| classes.of(v).is_none()) else {
                        continue;
                    };
                    for (i, preset) in presets::of_family(policy.schema.family).enumerate() {
                        let mut facts = policy.schema.read(&(preset.config)()).expect("preset");
                        facts.values[slot as usize] = v;
                        compare_one(
                            &policy,
                            &plan,
                            &extras,
                            &facts,
                            &format!("preset {i}, slot {slot} = {v:?}"),
                        );
                        slow += 1;
                    }
                }
            }
            if name == "te" {
                assert!(slow > 0, "some te input took the slow path");
            }
        }
    }

    #[test]
    fn agrees_with_the_interpreter() {
        for name in ["te", "native", "torch"] {
            let policy = Policy::embedded(name).expect("embedded pack");
            let (plan, extras) = plan_of(&policy);
            assert!(
                plan.formula_count() > 10,
                "pack {name} reads facts in formulas"
            );
            assert!(
                !plan.pairs.is_empty() && !plan.groups.is_empty(),
                "pack {name}: the plan has single and pair groups (both paths compared)"
            );
            assert!(
                !plan.eager.is_empty(),
                "pack {name}: the plan answers shared atoms after classification (compared)"
            );
            let (mut compared, mut fired, mut unknown) = (0, 0, 0);
            let mut rng = Rng(0x5eed_0000 + name.len() as u64);
            for (i, base) in inputs(&policy).into_iter().enumerate() {
                let mut variants = vec![base.clone()];
                let mut perturbed = base.clone();
                perturb(&policy, &mut perturbed, &mut rng);
                variants.push(perturbed);
                for facts in &mut variants {
                    for answer in [None, Some(true), Some(false)] {
                        if let Some(a) = answer {
                            facts.set_all_probes(a);
                        }
                        let (c, f, u) = compare_one(
                            &policy,
                            &plan,
                            &extras,
                            facts,
                            &format!("input {i} ({answer:?})"),
                        );
                        compared += c;
                        fired += f;
                        unknown += u;
                    }
                }
            }
            // Enough of each outcome that the comparison means something.
            assert!(
                compared > 30_000,
                "pack {name}: compared only {compared} evaluations"
            );
            assert!(
                fired > 300 && unknown > 50,
                "pack {name}: fired {fired}, unknown {unknown}"
            );
        }
    }
}

//! A pack's conditions compiled to one flat node arena. Evaluation is a small recursive walk
//! over `Copy` values: no allocation, no string comparison, no hashing.

use std::cmp::Ordering;

use crate::facts::Schema;
use crate::facts::Value;
use crate::lang::ast::{ArithOp, CmpOp};

pub type NodeId = u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    Max,
    Min,
    Gcd,
    RoundUp,
    Abs,
    /// `if(cond, a, b)`: `a` when `cond` holds, else `b` (unknown when `cond` is unknown).
    If,
}

impl Func {
    pub fn lookup(name: &str) -> Option<Func> {
        Some(match name {
            "max" => Func::Max,
            "min" => Func::Min,
            "gcd" => Func::Gcd,
            "round_up" => Func::RoundUp,
            "abs" => Func::Abs,
            "if" => Func::If,
            _ => return None,
        })
    }

    pub const NAMES: &'static [&'static str] = &["max", "min", "gcd", "round_up", "abs", "if"];

    /// Calls of the language that are not functions of values: `parsed(x)` tests the state
    /// of a version fact (lowered to [`Node::IsParsed`]).
    pub const PREDICATES: &'static [&'static str] = &["parsed"];
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Node {
    Const(Value),
    Slot(u16),
    Not(NodeId),
    /// Children are `children[start..start + len]`.
    And {
        start: u32,
        len: u32,
    },
    Or {
        start: u32,
        len: u32,
    },
    Cmp(CmpOp, NodeId, NodeId),
    /// `item in consts[start..start + len]` (or `not in`).
    In {
        item: NodeId,
        start: u32,
        len: u32,
        negate: bool,
    },
    IsNull(NodeId),
    IsNotNull(NodeId),
    /// `parsed(x)`: the version fact `x` is present and parsed (false for null and for an
    /// unparseable version).
    IsParsed(NodeId),
    Arith(ArithOp, NodeId, NodeId),
    Neg(NodeId),
    Call {
        func: Func,
        start: u32,
        len: u32,
    },
}

#[derive(Clone, Debug, Default)]
pub struct Program {
    pub nodes: Vec<Node>,
    pub children: Vec<NodeId>,
    pub consts: Vec<Value>,
    /// Per node: its memo index if it is the root of a pack definition, else `NO_MEMO`.
    pub memo_of: Vec<u16>,
    pub memo_count: u16,
    /// Per const list start: the bit set of its enum values, when the list is all enums (< 64),
    /// so `x in [...]` over an enum is one shift.
    pub enum_masks: Vec<Option<u64>>,
}

pub const NO_MEMO: u16 = u16::MAX;

/// Where definition values are kept during one evaluation.
pub trait Memo {
    fn get(&self, i: usize) -> Option<Value>;
    fn set(&mut self, i: usize, v: Value);
}

/// No memo: every use of a definition recomputes it (analysis with partial facts).
pub struct NoMemo;

impl Memo for NoMemo {
    #[inline]
    fn get(&self, _: usize) -> Option<Value> {
        None
    }
    #[inline]
    fn set(&mut self, _: usize, _: Value) {}
}

impl Memo for [Option<Value>] {
    #[inline]
    fn get(&self, i: usize) -> Option<Value> {
        self.get(i).copied().flatten()
    }
    #[inline]
    fn set(&mut self, i: usize, v: Value) {
        if let Some(x) = self.get_mut(i) {
            *x = Some(v);
        }
    }
}

/// Truth of a value in a boolean position: null is false, unknown stays unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Truth {
    False,
    True,
    Unknown,
}

impl Truth {
    pub fn of(v: Value) -> Truth {
        match v {
            Value::Bool(true) => Truth::True,
            Value::Unknown => Truth::Unknown,
            _ => Truth::False,
        }
    }
}

impl Program {
    pub fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        self.memo_of.push(NO_MEMO);
        (self.nodes.len() - 1) as NodeId
    }

    /// Drops nodes, children and consts pushed after a mark (type probing in the compiler).
    pub fn truncate(&mut self, nodes: usize, children: usize, consts: usize) {
        self.nodes.truncate(nodes);
        self.memo_of.truncate(nodes);
        self.children.truncate(children);
        self.consts.truncate(consts);
        self.enum_masks.truncate(consts);
    }

    pub fn push_children(&mut self, ids: &[NodeId]) -> (u32, u32) {
        let start = self.children.len() as u32;
        self.children.extend_from_slice(ids);
        (start, ids.len() as u32)
    }

    pub fn push_consts(&mut self, vals: &[Value]) -> (u32, u32) {
        let start = self.consts.len() as u32;
        self.consts.extend_from_slice(vals);
        let mask = vals.iter().try_fold(0u64, |m, v| match v {
            Value::Enum(e) if *e < 64 => Some(m | 1 << e),
            _ => None,
        });
        self.enum_masks.resize(self.consts.len(), None);
        if !vals.is_empty() {
            self.enum_masks[start as usize] = mask;
        }
        (start, vals.len() as u32)
    }

    /// Evaluates node `id` over the fact slots `facts`, recomputing shared definitions at each use.
    pub fn eval(&self, id: NodeId, facts: &[Value]) -> Value {
        self.eval_in(id, facts, &mut NoMemo)
    }

    /// Like [`Program::eval`], but each pack definition is computed at most once per `memo`
    /// (one memo per decision: reset it with [`Program::new_memo`] / `fill(None)`).
    pub fn eval_memo(&self, id: NodeId, facts: &[Value], memo: &mut [Option<Value>]) -> Value {
        self.eval_in(id, facts, memo)
    }

    /// Static evaluation cost of a node: its tree size, a memoised definition counting once.
    pub fn cost(&self, id: NodeId) -> usize {
        self.cost_in(id, true)
    }

    fn cost_in(&self, id: NodeId, top: bool) -> usize {
        if !top && self.memo_of.get(id as usize).is_some_and(|&m| m != NO_MEMO) {
            return 2;
        }
        let kids = |start: u32, len: u32| -> usize {
            self.children[start as usize..(start + len) as usize]
                .iter()
                .map(|&c| self.cost_in(c, false))
                .sum()
        };
        1 + match self.nodes[id as usize] {
            Node::Const(_) | Node::Slot(_) => 0,
            Node::Not(a)
            | Node::IsNull(a)
            | Node::IsNotNull(a)
            | Node::IsParsed(a)
            | Node::Neg(a) => self.cost_in(a, false),
            Node::And { start, len } | Node::Or { start, len } | Node::Call { start, len, .. } => {
                kids(start, len)
            }
            Node::Cmp(_, a, b) | Node::Arith(_, a, b) => {
                self.cost_in(a, false) + self.cost_in(b, false)
            }
            Node::In { item, .. } => 1 + self.cost_in(item, false),
        }
    }

    /// A structural fingerprint of node `id`: equal fingerprints compute the same function of
    /// the facts. With `defs_by_id`, a pack definition is written as its node (cheap, and all
    /// uses of one definition in this program agree); without, it is written out, so
    /// fingerprints compare across programs (`diff` of two packs).
    pub fn fingerprint(&self, id: NodeId, defs_by_id: bool) -> String {
        let mut s = String::new();
        self.write_fingerprint(id, defs_by_id, &mut s);
        s
    }

    fn write_fingerprint(&self, id: NodeId, defs_by_id: bool, s: &mut String) {
        use std::fmt::Write as _;
        if defs_by_id && self.memo_of.get(id as usize).is_some_and(|&m| m != NO_MEMO) {
            let _ = write!(s, "d{id}");
            return;
        }
        let list = |name: &str, start: u32, len: u32, s: &mut String| {
            s.push_str(name);
            s.push('(');
            for &c in &self.children[start as usize..(start + len) as usize] {
                self.write_fingerprint(c, defs_by_id, s);
                s.push(',');
            }
            s.push(')');
        };
        let pair = |name: &str, a: NodeId, b: NodeId, s: &mut String| {
            s.push_str(name);
            s.push('(');
            self.write_fingerprint(a, defs_by_id, s);
            s.push(',');
            self.write_fingerprint(b, defs_by_id, s);
            s.push(')');
        };
        match self.nodes[id as usize] {
            Node::Const(v) => {
                let _ = write!(s, "c{v:?}");
            }
            Node::Slot(x) => {
                let _ = write!(s, "s{x}");
            }
            Node::And { start, len } => list("and", start, len, s),
            Node::Or { start, len } => list("or", start, len, s),
            Node::Call { func, start, len } => list(&format!("{func:?}"), start, len, s),
            Node::Not(a)
            | Node::IsNull(a)
            | Node::IsNotNull(a)
            | Node::IsParsed(a)
            | Node::Neg(a) => {
                let name = match self.nodes[id as usize] {
                    Node::Not(_) => "not",
                    Node::IsNull(_) => "null",
                    Node::IsNotNull(_) => "notnull",
                    Node::IsParsed(_) => "parsed",
                    _ => "neg",
                };
                s.push_str(name);
                s.push('(');
                self.write_fingerprint(a, defs_by_id, s);
                s.push(')');
            }
            Node::Cmp(op, a, b) => pair(&format!("{op:?}"), a, b, s),
            Node::Arith(op, a, b) => pair(&format!("{op:?}"), a, b, s),
            Node::In {
                item,
                start,
                len,
                negate,
            } => {
                let _ = write!(
                    s,
                    "in{negate}{:?}(",
                    &self.consts[start as usize..(start + len) as usize]
                );
                self.write_fingerprint(item, defs_by_id, s);
                s.push(')');
            }
        }
    }

    /// Node `id` as an expression of the rule language over the fact schema's names (fully
    /// parenthesised below the top), e.g. `(num_heads // cp_size) % 2 != 0`: how the analysis
    /// prints a condition it could not split into per-fact constraints.
    pub fn render(&self, id: NodeId, schema: &Schema) -> String {
        self.render_with(id, schema, None, true)
    }

    /// The enum domain of the fact `id` reads directly (to print enum constants as names).
    fn domain_of(&self, id: NodeId, schema: &Schema) -> Option<crate::facts::Domain> {
        match self.nodes[id as usize] {
            Node::Slot(s) => match schema.fields[s as usize].ty {
                crate::facts::schema::Ty::Enum(d) => Some(d),
                _ => None,
            },
            _ => None,
        }
    }

    fn render_value(v: Value, domain: Option<crate::facts::Domain>) -> String {
        match v {
            Value::Enum(i) => match domain {
                Some(d) => format!("{:?}", d.values()[i as usize]),
                None => i.to_string(),
            },
            Value::Version(x) => x.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(x) => format!("{x:?}"),
            Value::Bool(b) => b.to_string(),
            Value::Null => "null".into(),
            Value::Unknown | Value::BadVersion => "null".into(),
        }
    }

    fn render_with(
        &self,
        id: NodeId,
        schema: &Schema,
        domain: Option<crate::facts::Domain>,
        top: bool,
    ) -> String {
        let kids = |start: u32, len: u32| &self.children[start as usize..(start + len) as usize];
        let wrap = |s: String| if top { s } else { format!("({s})") };
        match self.nodes[id as usize] {
            Node::Const(v) => Self::render_value(v, domain),
            Node::Slot(s) => schema.fields[s as usize].path.to_string(),
            Node::Not(a) => format!("not {}", self.render_with(a, schema, None, false)),
            Node::And { start, len } | Node::Or { start, len } => {
                let sep = if matches!(self.nodes[id as usize], Node::And { .. }) {
                    " and "
                } else {
                    " or "
                };
                let parts: Vec<String> = kids(start, len)
                    .iter()
                    .map(|&c| self.render_with(c, schema, None, false))
                    .collect();
                wrap(parts.join(sep))
            }
            Node::Cmp(op, a, b) => {
                let (da, db) = (self.domain_of(b, schema), self.domain_of(a, schema));
                wrap(format!(
                    "{} {} {}",
                    self.render_with(a, schema, da, false),
                    op.symbol(),
                    self.render_with(b, schema, db, false)
                ))
            }
            Node::In {
                item,
                start,
                len,
                negate,
            } => {
                let d = self.domain_of(item, schema);
                let list: Vec<String> = self.consts[start as usize..(start + len) as usize]
                    .iter()
                    .map(|&v| Self::render_value(v, d))
                    .collect();
                wrap(format!(
                    "{} {}in [{}]",
                    self.render_with(item, schema, None, false),
                    if negate { "not " } else { "" },
                    list.join(", ")
                ))
            }
            Node::IsNull(a) => wrap(format!(
                "{} == null",
                self.render_with(a, schema, None, false)
            )),
            Node::IsNotNull(a) => wrap(format!(
                "{} != null",
                self.render_with(a, schema, None, false)
            )),
            Node::IsParsed(a) => format!("parsed({})", self.render_with(a, schema, None, true)),
            Node::Arith(op, a, b) => wrap(format!(
                "{} {} {}",
                self.render_with(a, schema, None, false),
                op.symbol(),
                self.render_with(b, schema, None, false)
            )),
            Node::Neg(a) => format!("-{}", self.render_with(a, schema, None, false)),
            Node::Call { func, start, len } => {
                let name = Func::NAMES[func as usize];
                let args: Vec<String> = kids(start, len)
                    .iter()
                    .map(|&c| self.render_with(c, schema, None, true))
                    .collect();
                format!("{name}({})", args.join(", "))
            }
        }
    }

    /// A memo sized for this program's definitions.
    pub fn new_memo(&self) -> Vec<Option<Value>> {
        vec![None; self.memo_count as usize]
    }

    /// Marks `node` as the root of a definition whose value is memoised per decision.
    pub fn memoise(&mut self, node: NodeId) {
        self.memo_of.resize(self.nodes.len(), NO_MEMO);
        if self.memo_of[node as usize] == NO_MEMO {
            self.memo_of[node as usize] = self.memo_count;
            self.memo_count += 1;
        }
    }

    #[inline]
    fn eval_in<M: Memo + ?Sized>(&self, id: NodeId, facts: &[Value], memo: &mut M) -> Value {
        // Leaves are most of the calls: answer them without the general evaluator's frame.
        match self.nodes[id as usize] {
            Node::Slot(s) => return facts[s as usize],
            Node::Const(v) => return v,
            _ => {}
        }
        self.eval_inner(id, facts, memo)
    }

    fn eval_inner<M: Memo + ?Sized>(&self, id: NodeId, facts: &[Value], memo: &mut M) -> Value {
        let slot = self.memo_of.get(id as usize).copied().unwrap_or(NO_MEMO);
        if slot != NO_MEMO
            && let Some(v) = memo.get(slot as usize)
        {
            return v;
        }
        let v = self.eval_node(id, facts, memo);
        if slot != NO_MEMO {
            memo.set(slot as usize, v);
        }
        v
    }

    fn eval_node<M: Memo + ?Sized>(&self, id: NodeId, facts: &[Value], memo: &mut M) -> Value {
        match self.nodes[id as usize] {
            Node::Const(v) => v,
            Node::Slot(s) => facts[s as usize],
            Node::Not(a) => not(self.eval_in(a, facts, memo)),
            Node::And { start, len } => kleene(
                false,
                self.children[start as usize..(start + len) as usize]
                    .iter()
                    .map(|&c| self.eval_in(c, facts, memo)),
            ),
            Node::Or { start, len } => kleene(
                true,
                self.children[start as usize..(start + len) as usize]
                    .iter()
                    .map(|&c| self.eval_in(c, facts, memo)),
            ),
            Node::Cmp(op, a, b) => {
                let (x, y) = (self.eval_in(a, facts, memo), self.eval_in(b, facts, memo));
                compare3(op, x, y)
            }
            Node::In {
                item,
                start,
                len,
                negate,
            } => {
                let x = self.eval_in(item, facts, memo);
                let mask = self.enum_masks.get(start as usize).copied().flatten();
                member(
                    x,
                    mask,
                    &self.consts[start as usize..(start + len) as usize],
                    negate,
                )
            }
            Node::IsNull(a) => null_test(self.eval_in(a, facts, memo), true),
            Node::IsNotNull(a) => null_test(self.eval_in(a, facts, memo), false),
            Node::IsParsed(a) => parsed_test(self.eval_in(a, facts, memo)),
            Node::Arith(op, a, b) => arith(
                op,
                self.eval_in(a, facts, memo),
                self.eval_in(b, facts, memo),
            ),
            Node::Neg(a) => neg(self.eval_in(a, facts, memo)),
            // `if` is lazy: only the branch the condition picks is evaluated.
            Node::Call {
                func: Func::If,
                start,
                len: 3,
            } => {
                let a = &self.children[start as usize..start as usize + 3];
                match Truth::of(self.eval_in(a[0], facts, memo)) {
                    Truth::True => self.eval_in(a[1], facts, memo),
                    Truth::False => self.eval_in(a[2], facts, memo),
                    Truth::Unknown => Value::Unknown,
                }
            }
            Node::Call { func, start, len } => {
                let args = &self.children[start as usize..(start + len) as usize];
                call(func, args.iter().map(|&c| self.eval_in(c, facts, memo)))
            }
        }
    }
}

// The language's semantics, shared by this interpreter and the decision plan (plan.rs).

/// Kleene `not`: null is false, unknown stays unknown.
pub(crate) fn not(v: Value) -> Value {
    match Truth::of(v) {
        Truth::True => Value::Bool(false),
        Truth::False => Value::Bool(true),
        Truth::Unknown => Value::Unknown,
    }
}

/// Kleene `and` (`decisive = false`) or `or` (`decisive = true`) over lazily evaluated
/// operands: the decisive value wins over unknown and stops evaluation.
pub(crate) fn kleene(decisive: bool, operands: impl Iterator<Item = Value>) -> Value {
    let mut unknown = false;
    for v in operands {
        match Truth::of(v) {
            Truth::Unknown => unknown = true,
            t if (t == Truth::True) == decisive => return Value::Bool(decisive),
            _ => {}
        }
    }
    if unknown {
        Value::Unknown
    } else {
        Value::Bool(!decisive)
    }
}

/// A comparison that propagates unknown operands.
///
/// Public for the analysis crate (`attn_policy_analysis::cell`), which folds exact operands
/// with the evaluator's own operations.
pub fn compare3(op: CmpOp, x: Value, y: Value) -> Value {
    if x == Value::Unknown || y == Value::Unknown {
        Value::Unknown
    } else {
        Value::Bool(compare(op, x, y))
    }
}

/// `x in list` / `x not in list`; `mask` is the list as an enum bit set when it is one.
///
/// Public for the analysis crate (`attn_policy_analysis::cell`), which folds exact operands
/// with the evaluator's own operations.
pub fn member(x: Value, mask: Option<u64>, list: &[Value], negate: bool) -> Value {
    match (x, mask) {
        (Value::Unknown, _) => Value::Unknown,
        (Value::Null | Value::BadVersion, _) => Value::Bool(false),
        (Value::Enum(e), Some(mask)) if e < 64 => Value::Bool(((mask >> e) & 1 == 1) != negate),
        _ => {
            let found = list.iter().any(|c| x.compare(*c) == Some(Ordering::Equal));
            Value::Bool(found != negate)
        }
    }
}

/// `x == null` (`want_null`) or `x != null`.
///
/// Public for the analysis crate (`attn_policy_analysis::cell`), which folds exact operands
/// with the evaluator's own operations.
pub fn null_test(v: Value, want_null: bool) -> Value {
    match v {
        Value::Unknown => Value::Unknown,
        v => Value::Bool((v == Value::Null) == want_null),
    }
}

/// `parsed(x)`: true for a parsed version, false for null and an unparseable version.
///
/// Public for the analysis crate (`attn_policy_analysis::cell`), which folds exact operands
/// with the evaluator's own operations.
pub fn parsed_test(v: Value) -> Value {
    match v {
        Value::Unknown => Value::Unknown,
        v => Value::Bool(matches!(v, Value::Version(_))),
    }
}

/// Unary minus; overflow gives null.
///
/// Public for the analysis crate (`attn_policy_analysis::cell`), which folds exact operands
/// with the evaluator's own operations.
pub fn neg(v: Value) -> Value {
    match v {
        Value::Int(i) => i.checked_neg().map_or(Value::Null, Value::Int),
        Value::Float(x) => Value::Float(-x),
        other => other,
    }
}

/// Comparison with the language's null rule: any comparison with null (or an unparseable
/// version) is false, whatever the operator.
pub fn compare(op: CmpOp, x: Value, y: Value) -> bool {
    let Some(ord) = x.compare(y) else {
        return false;
    };
    holds(op, ord)
}

/// Whether `op` holds between two operands that compare as `ord`.
#[inline]
pub(crate) fn holds(op: CmpOp, ord: Ordering) -> bool {
    match op {
        CmpOp::Eq => ord == Ordering::Equal,
        CmpOp::Ne => ord != Ordering::Equal,
        CmpOp::Lt => ord == Ordering::Less,
        CmpOp::Le => ord != Ordering::Greater,
        CmpOp::Gt => ord == Ordering::Greater,
        CmpOp::Ge => ord != Ordering::Less,
        CmpOp::In | CmpOp::NotIn => unreachable!("membership is compiled to Node::In"),
    }
}

/// A binary arithmetic operation on values (unknown and null operands propagate).
///
/// Public for the analysis crate (`attn_policy_analysis::cell`), which folds exact operands
/// with the evaluator's own operations.
pub fn arith(op: ArithOp, x: Value, y: Value) -> Value {
    match (x, y) {
        (Value::Unknown, _) | (_, Value::Unknown) => Value::Unknown,
        (Value::Int(a), Value::Int(b)) => {
            let r = match op {
                ArithOp::Add => a.checked_add(b),
                ArithOp::Sub => a.checked_sub(b),
                ArithOp::Mul => a.checked_mul(b),
                ArithOp::Div => {
                    return if b == 0 {
                        Value::Null
                    } else {
                        Value::Float(a as f64 / b as f64)
                    };
                }
                // Python semantics: floor division and a remainder with the divisor's sign.
                ArithOp::FloorDiv => (b != 0)
                    .then(|| a.div_euclid(b) - if b < 0 && a.rem_euclid(b) != 0 { 1 } else { 0 }),
                ArithOp::Rem => (b != 0).then(|| {
                    let r = a.rem_euclid(b);
                    if b < 0 && r != 0 { r + b } else { r }
                }),
            };
            r.map_or(Value::Null, Value::Int)
        }
        _ => match (x.as_f64(), y.as_f64()) {
            (Some(a), Some(b)) => {
                let r = match op {
                    ArithOp::Add => a + b,
                    ArithOp::Sub => a - b,
                    ArithOp::Mul => a * b,
                    ArithOp::Div => a / b,
                    ArithOp::FloorDiv => (a / b).floor(),
                    ArithOp::Rem => a - b * (a / b).floor(),
                };
                if r.is_finite() {
                    Value::Float(r)
                } else {
                    Value::Null
                }
            }
            _ => Value::Null,
        },
    }
}

fn gcd(mut a: i64, mut b: i64) -> i64 {
    a = a.abs();
    b = b.abs();
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A built-in function applied to its arguments' values.
///
/// Public for the analysis crate (`attn_policy_analysis::cell`), which folds exact operands
/// with the evaluator's own operations.
pub fn call(func: Func, mut args: impl Iterator<Item = Value>) -> Value {
    let first = args.next().unwrap_or(Value::Null);
    match func {
        Func::If => {
            let (then, otherwise) = (
                args.next().unwrap_or(Value::Null),
                args.next().unwrap_or(Value::Null),
            );
            match Truth::of(first) {
                Truth::True => then,
                Truth::False => otherwise,
                Truth::Unknown => Value::Unknown,
            }
        }
        Func::Abs => match first {
            Value::Int(i) => i.checked_abs().map_or(Value::Null, Value::Int),
            Value::Float(x) => Value::Float(x.abs()),
            other => other,
        },
        Func::Max | Func::Min => args.fold(first, |acc, v| match (acc, v) {
            (Value::Unknown, _) | (_, Value::Unknown) => Value::Unknown,
            (a, b) => match a.compare(b) {
                Some(Ordering::Less) if func == Func::Max => b,
                Some(Ordering::Greater) if func == Func::Min => b,
                Some(_) => a,
                None => Value::Null,
            },
        }),
        Func::Gcd | Func::RoundUp => {
            let second = args.next().unwrap_or(Value::Null);
            match (first, second) {
                (Value::Unknown, _) | (_, Value::Unknown) => Value::Unknown,
                (Value::Int(a), Value::Int(b)) => match func {
                    Func::Gcd => Value::Int(gcd(a, b)),
                    _ if b > 0 => a
                        .checked_add(b - 1)
                        .map(|s| s.div_euclid(b) * b)
                        .map_or(Value::Null, Value::Int),
                    _ => Value::Null,
                },
                _ => Value::Null,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_division_semantics() {
        assert_eq!(
            arith(ArithOp::Rem, Value::Int(-7), Value::Int(3)),
            Value::Int(2)
        );
        assert_eq!(
            arith(ArithOp::FloorDiv, Value::Int(-7), Value::Int(2)),
            Value::Int(-4)
        );
        assert_eq!(
            arith(ArithOp::FloorDiv, Value::Int(7), Value::Int(-2)),
            Value::Int(-4)
        );
        assert_eq!(
            arith(ArithOp::Rem, Value::Int(7), Value::Int(-3)),
            Value::Int(-2)
        );
        assert_eq!(
            arith(ArithOp::Rem, Value::Int(7), Value::Int(0)),
            Value::Null
        );
        assert_eq!(
            arith(ArithOp::Add, Value::Int(i64::MAX), Value::Int(1)),
            Value::Null
        );
    }

    #[test]
    fn functions() {
        let f = |func, a: i64, b: i64| call(func, [Value::Int(a), Value::Int(b)].into_iter());
        assert_eq!(f(Func::Gcd, 32, 48), Value::Int(16));
        assert_eq!(f(Func::RoundUp, 72, 16), Value::Int(80));
        assert_eq!(f(Func::RoundUp, 80, 16), Value::Int(80));
        assert_eq!(f(Func::Max, 3, 9), Value::Int(9));
        assert_eq!(f(Func::Min, 3, 9), Value::Int(3));
        let pick = |c: Value| call(Func::If, [c, Value::Int(1), Value::Int(2)].into_iter());
        assert_eq!(pick(Value::Bool(true)), Value::Int(1));
        assert_eq!(pick(Value::Bool(false)), Value::Int(2));
        assert_eq!(pick(Value::Null), Value::Int(2));
        assert_eq!(pick(Value::Unknown), Value::Unknown);
    }

    #[test]
    fn kleene_logic() {
        let mut p = Program::default();
        let t = p.push(Node::Const(Value::Bool(true)));
        let f = p.push(Node::Const(Value::Bool(false)));
        let u = p.push(Node::Const(Value::Unknown));
        let and = |p: &mut Program, a, b| {
            let (start, len) = p.push_children(&[a, b]);
            p.push(Node::And { start, len })
        };
        let or = |p: &mut Program, a, b| {
            let (start, len) = p.push_children(&[a, b]);
            p.push(Node::Or { start, len })
        };
        let fu = and(&mut p, f, u);
        let tu = and(&mut p, t, u);
        let tu_or = or(&mut p, t, u);
        let fu_or = or(&mut p, f, u);
        let nu = p.push(Node::Not(u));
        assert_eq!(p.eval(fu, &[]), Value::Bool(false));
        assert_eq!(p.eval(tu, &[]), Value::Unknown);
        assert_eq!(p.eval(tu_or, &[]), Value::Bool(true));
        assert_eq!(p.eval(fu_or, &[]), Value::Unknown);
        assert_eq!(p.eval(nu, &[]), Value::Unknown);
    }

    #[test]
    fn null_compares_false() {
        for op in [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Ge] {
            assert!(!compare(op, Value::Null, Value::Int(1)));
            assert!(!compare(op, Value::BadVersion, Value::Int(1)));
        }
    }
}

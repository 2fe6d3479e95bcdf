//! The unparseable-version guard: a version fact whose probe reports raw text
//! ([`FieldDef::raw_text`](crate::facts::schema::FieldDef::raw_text)) has three states, and a
//! comparison sees only two of them (an unparseable version compares false with everything,
//! like null). So a condition may compare such a fact only where it has established
//! `parsed(x)` on that path: `parsed(x) and x < 1.29.0`, `x == null or not parsed(x) or x <
//! 1.29.0`, `if(parsed(x), x < 1.29.0, false)`. Then every rule says what it does with the
//! unparseable state.
//!
//! The analysis is syntactic, over `and` / `or` / `not` / `if` (and definitions, written
//! out): a subexpression is *guarded* for `x` when a sibling conjunct implies `parsed(x)`
//! when it holds, or a sibling disjunct implies it when it fails. Kleene `and` / `or` are
//! commutative in this language, so a sibling's position does not matter. A definition's own
//! comparisons are checked inside the definition (where it is defined, with no guard around).

use std::collections::BTreeMap;

use super::error::TypeError;
use crate::facts::schema::Schema;
use crate::lang::ast::{CmpOp, Expr, ExprKind};

/// Definitions nest at most this deep for the guard analysis (deeper ones, or cycles, which
/// the checker reports on its own, imply nothing).
const MAX_DEF_DEPTH: usize = 16;

pub(super) struct Guards<'a> {
    pub schema: &'a Schema,
    /// The pack's definitions that parse: name -> expression.
    pub defs: &'a BTreeMap<String, Expr>,
}

/// Fact slots, small and sorted.
type Set = Vec<usize>;

fn union(mut a: Set, b: &[usize]) -> Set {
    for &x in b {
        if !a.contains(&x) {
            a.push(x);
        }
    }
    a.sort_unstable();
    a
}

fn intersect(a: &[usize], b: &[usize]) -> Set {
    a.iter().copied().filter(|x| b.contains(x)).collect()
}

fn strip(e: &Expr) -> &Expr {
    match &e.kind {
        ExprKind::Group(inner) => strip(inner),
        _ => e,
    }
}

/// The operands of a chain of one operator (`a and b and c`), flattened.
fn flatten<'e>(e: &'e Expr, and: bool, out: &mut Vec<&'e Expr>) {
    match &e.kind {
        ExprKind::And(a, b) if and => {
            flatten(a, and, out);
            flatten(b, and, out);
        }
        ExprKind::Or(a, b) if !and => {
            flatten(a, and, out);
            flatten(b, and, out);
        }
        ExprKind::Group(inner)
            if matches!(strip(inner).kind, ExprKind::And(..) | ExprKind::Or(..)) =>
        {
            flatten(inner, and, out)
        }
        _ => out.push(e),
    }
}

impl Guards<'_> {
    fn def(&self, name: &str) -> Option<&Expr> {
        self.defs.get(name)
    }

    /// The raw-text version fact a name is, if it is one (definitions shadow facts).
    fn raw_fact(&self, name: &str) -> Option<usize> {
        if self.defs.contains_key(name) {
            return None;
        }
        self.schema
            .slot(name)
            .filter(|&s| self.schema.def(s).raw_text)
    }

    /// Facts `x` for which `e` holding implies `parsed(x)` (`when = true`), or `e` failing
    /// implies it (`when = false`).
    fn implied(&self, e: &Expr, when: bool, depth: usize) -> Set {
        match &e.kind {
            ExprKind::Group(inner) => self.implied(inner, when, depth),
            ExprKind::Not(a) => self.implied(a, !when, depth),
            ExprKind::Call(name, args) if name == "parsed" && when && args.len() == 1 => {
                match &strip(&args[0]).kind {
                    ExprKind::Path(p) => self.raw_fact(p).into_iter().collect(),
                    _ => Set::new(),
                }
            }
            ExprKind::And(a, b) | ExprKind::Or(a, b) => {
                let (x, y) = (self.implied(a, when, depth), self.implied(b, when, depth));
                // `a and b` holding: both hold; failing: one of them fails (and dually).
                if matches!(e.kind, ExprKind::And(..)) == when {
                    union(x, &y)
                } else {
                    intersect(&x, &y)
                }
            }
            ExprKind::Path(p) if depth < MAX_DEF_DEPTH => match self.def(p) {
                Some(body) => self.implied(body, when, depth + 1),
                None => Set::new(),
            },
            _ => Set::new(),
        }
    }

    /// The raw-text version facts whose value flows into `e`'s value (not through a
    /// comparison, which yields a bool checked where it is written).
    fn value_reads(&self, e: &Expr, depth: usize, out: &mut Set) {
        match &e.kind {
            ExprKind::Group(inner) | ExprKind::Neg(inner) => self.value_reads(inner, depth, out),
            ExprKind::Path(p) => {
                if let Some(s) = self.raw_fact(p) {
                    *out = union(std::mem::take(out), &[s]);
                } else if depth < MAX_DEF_DEPTH
                    && let Some(body) = self.def(p)
                {
                    self.value_reads(body, depth + 1, out);
                }
            }
            ExprKind::Arith(_, a, b) => {
                self.value_reads(a, depth, out);
                self.value_reads(b, depth, out);
            }
            ExprKind::Call(name, args) if name == "if" && args.len() == 3 => {
                self.value_reads(&args[1], depth, out);
                self.value_reads(&args[2], depth, out);
            }
            ExprKind::Call(name, args) if name != "parsed" => {
                for a in args {
                    self.value_reads(a, depth, out);
                }
            }
            _ => {}
        }
    }

    /// The error for comparing `operand`, which reads the unguarded facts `facts`.
    fn unguarded(&self, operand: &Expr, facts: &[usize], what: &str) -> TypeError {
        let x = self.schema.def(facts[0]).path;
        TypeError {
            message: format!(
                "{what} on `{x}` is false for a version that is present but unparseable; \
                 the condition must test `parsed({x})` first to say what that state does"
            ),
            span: operand.span,
            help: Some(format!(
                "test the state first: `parsed({x}) and ...` to compare parsed versions only, \
                 or `{x} == null or not parsed({x}) or ...` to let an unparseable version pass"
            )),
            syntax: false,
        }
    }

    /// Checks every comparison in `e` given the facts `known` parsed wherever `e` matters.
    pub fn check(&self, e: &Expr, known: &[usize]) -> Result<(), TypeError> {
        match &e.kind {
            ExprKind::Group(a) | ExprKind::Not(a) | ExprKind::Neg(a) => self.check(a, known),
            ExprKind::And(..) | ExprKind::Or(..) => {
                let and = matches!(e.kind, ExprKind::And(..));
                let mut parts = Vec::new();
                flatten(e, and, &mut parts);
                // A conjunct matters only when its siblings hold; a disjunct when they fail.
                let implied: Vec<Set> = parts.iter().map(|p| self.implied(p, and, 0)).collect();
                for (i, part) in parts.iter().enumerate() {
                    let mut k = known.to_vec();
                    for (j, imp) in implied.iter().enumerate() {
                        if j != i {
                            k = union(k, imp);
                        }
                    }
                    self.check(part, &k)?;
                }
                Ok(())
            }
            ExprKind::Arith(_, a, b) => {
                self.check(a, known)?;
                self.check(b, known)
            }
            ExprKind::Call(name, args) if name == "if" && args.len() == 3 => {
                self.check(&args[0], known)?;
                self.check(
                    &args[1],
                    &union(known.to_vec(), &self.implied(&args[0], true, 0)),
                )?;
                self.check(
                    &args[2],
                    &union(known.to_vec(), &self.implied(&args[0], false, 0)),
                )
            }
            ExprKind::Call(name, args) => {
                // `max` / `min` compare their arguments.
                if matches!(name.as_str(), "max" | "min") {
                    for a in args {
                        self.operand(a, known, &format!("`{name}`"))?;
                    }
                }
                args.iter().try_for_each(|a| self.check(a, known))
            }
            ExprKind::Compare(first, links) => {
                let mut lhs = first.as_ref();
                for (op, _, rhs) in links {
                    let null_test = matches!(op, CmpOp::Eq | CmpOp::Ne)
                        && (matches!(strip(lhs).kind, ExprKind::Null)
                            || matches!(strip(rhs).kind, ExprKind::Null));
                    if !null_test {
                        let what = format!("`{}`", op.symbol());
                        self.operand(lhs, known, &what)?;
                        if !matches!(op, CmpOp::In | CmpOp::NotIn) {
                            self.operand(rhs, known, &what)?;
                        }
                    }
                    lhs = rhs;
                }
                self.check(first, known)?;
                links.iter().try_for_each(|(_, _, x)| self.check(x, known))
            }
            ExprKind::List(items) => items.iter().try_for_each(|x| self.check(x, known)),
            _ => Ok(()),
        }
    }

    fn operand(&self, e: &Expr, known: &[usize], what: &str) -> Result<(), TypeError> {
        let mut reads = Set::new();
        self.value_reads(e, 0, &mut reads);
        reads.retain(|s| !known.contains(s));
        if reads.is_empty() {
            Ok(())
        } else {
            Err(self.unguarded(e, &reads, what))
        }
    }
}

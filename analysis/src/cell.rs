//! Is a condition constant on a *cell* (a set of classes per fact)?
//!
//! Most conditions are constant on every class by construction of the space (facts split at
//! the constants they are compared with). A condition relating two facts, or using non-linear
//! arithmetic (`num_heads % cp_size`), is not: the decision diagrams ask this module, cell by
//! cell, whether it is provably constant there; where it is not, the diagram tests a relation
//! variable instead of guessing (see `mdd/relations.rs`). Two sound answers:
//!
//! - small cells are decided by evaluating every concrete member (a "mixed" answer is then
//!   proved by two witnesses);
//! - large cells by interval-and-congruence evaluation (`x` in `[lo, hi]`, `x = r mod m`),
//!   which may answer "undecided" where the condition is in fact constant (never the
//!   reverse).

use attn_policy::eval::program::{Func, Node, NodeId, Program, Truth, arith, compare3, member};
use attn_policy::facts::Value;
use attn_policy::lang::ast::{ArithOp, CmpOp};

/// An abstract value: exact, an integer range with a congruence, or anything.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Abs {
    Exact(Value),
    /// Integers in `[lo, hi]` congruent to `r` modulo `m` (`m >= 1`, `0 <= r < m`).
    Int {
        lo: i64,
        hi: i64,
        r: i64,
        m: i64,
    },
    Any,
}

fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.abs(), b.abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Abs {
    /// An integer range (normalised: a single member is exact).
    pub fn int(lo: i64, hi: i64, r: i64, m: i64) -> Abs {
        let m = m.max(1);
        let r = r.rem_euclid(m);
        // Tighten the bounds to members of the congruence class.
        let lo2 = lo.saturating_add((r - lo).rem_euclid(m));
        let hi2 = hi.saturating_sub((hi - r).rem_euclid(m));
        if lo2 > hi2 {
            return Abs::Any;
        }
        if lo2 == hi2 {
            Abs::Exact(Value::Int(lo2))
        } else {
            Abs::Int {
                lo: lo2,
                hi: hi2,
                r,
                m,
            }
        }
    }

    /// The range view of an integer value (exact ints included).
    fn range(self) -> Option<(i64, i64, i64, i64)> {
        match self {
            Abs::Exact(Value::Int(i)) => Some((i, i, 0, 1)),
            Abs::Int { lo, hi, r, m } => Some((lo, hi, r, m)),
            _ => None,
        }
    }

    pub fn truth(self) -> Option<bool> {
        match self {
            Abs::Exact(v) => match Truth::of(v) {
                Truth::True => Some(true),
                Truth::False => Some(false),
                Truth::Unknown => None,
            },
            _ => None,
        }
    }

    /// The smallest set covering both.
    fn join(self, o: Abs) -> Abs {
        if self == o {
            return self;
        }
        match (self.range(), o.range()) {
            (Some((a, b, r1, m1)), Some((c, d, r2, m2))) => {
                let m = gcd(gcd(m1, m2), (r1 - r2).abs());
                let m = if m == 0 { 1 } else { m };
                Abs::int(a.min(c), b.max(d), r1, m)
            }
            _ => Abs::Any,
        }
    }
}

fn fits(x: i128) -> Option<i64> {
    i64::try_from(x).ok()
}

/// Ranges whose end points overflow become `Any` (overflow makes the language's result null).
fn range_of(lo: i128, hi: i128, r: i64, m: i64) -> Abs {
    match (fits(lo), fits(hi)) {
        (Some(lo), Some(hi)) => Abs::int(lo, hi, r, m),
        _ => Abs::Any,
    }
}

/// Which of `<`, `==`, `>` are possible between two ranges.
pub fn orderings(a: (i64, i64, i64, i64), b: (i64, i64, i64, i64)) -> [bool; 3] {
    let (alo, ahi, ar, am) = a;
    let (blo, bhi, br, bm) = b;
    let lt = alo < bhi;
    let gt = ahi > blo;
    let g = gcd(am, bm);
    let eq = alo.max(blo) <= ahi.min(bhi) && (ar - br).rem_euclid(g.max(1)) == 0;
    [lt, eq, gt]
}

/// The value of `op` for the ordering `o` (0: less, 1: equal, 2: greater).
pub fn cmp_for(op: CmpOp, o: usize) -> bool {
    let (x, y) = [(0, 1), (0, 0), (1, 0)][o];
    attn_policy::eval::program::compare(op, Value::Int(x), Value::Int(y))
}

/// Abstract evaluation of node `id`, facts read through `fact` (by slot).
pub fn eval(p: &Program, id: NodeId, fact: &dyn Fn(usize) -> Abs) -> Abs {
    let kids = |start: u32, len: u32| &p.children[start as usize..(start + len) as usize];
    match p.nodes[id as usize] {
        Node::Const(v) => Abs::Exact(v),
        Node::Slot(s) => fact(s as usize),
        Node::Not(a) => match eval(p, a, fact).truth() {
            Some(t) => Abs::Exact(Value::Bool(!t)),
            None => Abs::Any,
        },
        Node::And { start, len } | Node::Or { start, len } => {
            let decisive = matches!(p.nodes[id as usize], Node::Or { .. });
            let mut undecided = false;
            for &c in kids(start, len) {
                match eval(p, c, fact).truth() {
                    Some(t) if t == decisive => return Abs::Exact(Value::Bool(decisive)),
                    Some(_) => {}
                    None => undecided = true,
                }
            }
            if undecided {
                Abs::Any
            } else {
                Abs::Exact(Value::Bool(!decisive))
            }
        }
        Node::Cmp(op, a, b) => {
            let (x, y) = (eval(p, a, fact), eval(p, b, fact));
            // `x op x` (after a split, `batch_size != batch_size`): the ordering is "equal".
            let same = a == b
                || (p.nodes[a as usize] == p.nodes[b as usize]
                    && matches!(p.nodes[a as usize], Node::Slot(_)));
            if same && x.range().is_some() {
                return Abs::Exact(Value::Bool(cmp_for(op, 1)));
            }
            if let (Abs::Exact(x), Abs::Exact(y)) = (x, y) {
                return Abs::Exact(compare3(op, x, y));
            }
            match (x.range(), y.range()) {
                (Some(rx), Some(ry)) => {
                    let possible = orderings(rx, ry);
                    let mut seen: Option<bool> = None;
                    for (o, &ok) in possible.iter().enumerate() {
                        if !ok {
                            continue;
                        }
                        let t = cmp_for(op, o);
                        if seen.is_some_and(|s| s != t) {
                            return Abs::Any;
                        }
                        seen = Some(t);
                    }
                    seen.map_or(Abs::Any, |t| Abs::Exact(Value::Bool(t)))
                }
                _ => Abs::Any,
            }
        }
        Node::In {
            item,
            start,
            len,
            negate,
        } => {
            let x = eval(p, item, fact);
            let list = &p.consts[start as usize..(start + len) as usize];
            match x {
                Abs::Exact(v) => {
                    let mask = p.enum_masks.get(start as usize).copied().flatten();
                    Abs::Exact(member(v, mask, list, negate))
                }
                Abs::Int { lo, hi, r, m } => {
                    let hit = list.iter().any(|c| match *c {
                        Value::Int(c) => lo <= c && c <= hi && (c - r).rem_euclid(m) == 0,
                        Value::Float(c) => lo as f64 <= c && c <= hi as f64,
                        _ => false,
                    });
                    if hit {
                        Abs::Any
                    } else {
                        Abs::Exact(Value::Bool(negate))
                    }
                }
                Abs::Any => Abs::Any,
            }
        }
        Node::IsNull(a) | Node::IsNotNull(a) => {
            let want_null = matches!(p.nodes[id as usize], Node::IsNull(_));
            match eval(p, a, fact) {
                Abs::Exact(v) => Abs::Exact(attn_policy::eval::program::null_test(v, want_null)),
                Abs::Int { .. } => Abs::Exact(Value::Bool(!want_null)),
                Abs::Any => Abs::Any,
            }
        }
        Node::IsParsed(a) => match eval(p, a, fact) {
            Abs::Exact(v) => Abs::Exact(attn_policy::eval::program::parsed_test(v)),
            // Integer intervals are never versions.
            Abs::Int { .. } => Abs::Exact(Value::Bool(false)),
            Abs::Any => Abs::Any,
        },
        Node::Neg(a) => match eval(p, a, fact) {
            Abs::Exact(v) => Abs::Exact(attn_policy::eval::program::neg(v)),
            Abs::Int { lo, hi, r, m } => Abs::int(-hi, -lo, -r, m),
            Abs::Any => Abs::Any,
        },
        Node::Arith(op, a, b) => arith_abs(op, eval(p, a, fact), eval(p, b, fact)),
        Node::Call {
            func: Func::If,
            start,
            len: 3,
        } => {
            let k = kids(start, 3);
            match eval(p, k[0], fact).truth() {
                Some(true) => eval(p, k[1], fact),
                Some(false) => eval(p, k[2], fact),
                None => eval(p, k[1], fact).join(eval(p, k[2], fact)),
            }
        }
        Node::Call { func, start, len } => {
            let args: Vec<Abs> = kids(start, len).iter().map(|&c| eval(p, c, fact)).collect();
            if args.iter().all(|a| matches!(a, Abs::Exact(_))) {
                let vals = args.iter().map(|a| match a {
                    Abs::Exact(v) => *v,
                    _ => unreachable!("all exact"),
                });
                return Abs::Exact(attn_policy::eval::program::call(func, vals));
            }
            let ranges: Option<Vec<(i64, i64, i64, i64)>> =
                args.iter().map(|a| a.range()).collect();
            match (func, ranges) {
                (Func::Max, Some(rs)) => {
                    let lo = rs.iter().map(|r| r.0).max().unwrap_or(0);
                    let hi = rs.iter().map(|r| r.1).max().unwrap_or(0);
                    Abs::int(lo, hi, 0, 1)
                }
                (Func::Min, Some(rs)) => {
                    let lo = rs.iter().map(|r| r.0).min().unwrap_or(0);
                    let hi = rs.iter().map(|r| r.1).min().unwrap_or(0);
                    Abs::int(lo, hi, 0, 1)
                }
                (Func::RoundUp, Some(rs)) if rs.len() == 2 && rs[1].0 == rs[1].1 && rs[1].0 > 0 => {
                    let k = rs[1].0 as i128;
                    let up = |x: i64| (x as i128 + k - 1).div_euclid(k) * k;
                    range_of(up(rs[0].0), up(rs[0].1), 0, k as i64)
                }
                _ => Abs::Any,
            }
        }
    }
}

fn arith_abs(op: ArithOp, x: Abs, y: Abs) -> Abs {
    if let (Abs::Exact(a), Abs::Exact(b)) = (x, y) {
        return Abs::Exact(arith(op, a, b));
    }
    let (Some((alo, ahi, ar, am)), Some((blo, bhi, br, bm))) = (x.range(), y.range()) else {
        return Abs::Any;
    };
    let (alo_, ahi_, blo_, bhi_) = (alo as i128, ahi as i128, blo as i128, bhi as i128);
    let single_b = (blo == bhi).then_some(blo);
    match op {
        ArithOp::Add => {
            let m = gcd(am, bm).max(1);
            range_of(alo_ + blo_, ahi_ + bhi_, ar + br, m)
        }
        ArithOp::Sub => {
            let m = gcd(am, bm).max(1);
            range_of(alo_ - bhi_, ahi_ - blo_, ar - br, m)
        }
        ArithOp::Mul => {
            let ps = [alo_ * blo_, alo_ * bhi_, ahi_ * blo_, ahi_ * bhi_];
            let (lo, hi) = (ps.iter().min().copied(), ps.iter().max().copied());
            let (lo, hi) = (lo.unwrap_or(0), hi.unwrap_or(0));
            // x = r mod m times a constant k: k*x = k*r mod k*m.
            let (r, m) = match (single_b, (alo == ahi).then_some(alo)) {
                (Some(k), _) if k != 0 => (ar.saturating_mul(k), am.saturating_mul(k.abs())),
                (_, Some(k)) if k != 0 => (br.saturating_mul(k), bm.saturating_mul(k.abs())),
                _ => (0, 1),
            };
            range_of(lo, hi, r, m)
        }
        ArithOp::FloorDiv => match single_b {
            Some(k) if k > 0 => {
                let (r, m) = if am % k == 0 {
                    (ar.div_euclid(k), am / k)
                } else {
                    (0, 1)
                };
                Abs::int(alo.div_euclid(k), ahi.div_euclid(k), r, m)
            }
            _ if blo > 0 && alo >= 0 => Abs::int(alo / bhi, ahi / blo, 0, 1),
            _ => Abs::Any,
        },
        ArithOp::Rem => match single_b {
            Some(k) if k > 0 => {
                if am % k == 0 {
                    Abs::Exact(Value::Int(ar.rem_euclid(k)))
                } else if alo.div_euclid(k) == ahi.div_euclid(k) {
                    // One period: x % k = x - q*k.
                    let qk = alo.div_euclid(k) * k;
                    Abs::int(alo - qk, ahi - qk, ar - qk, am)
                } else {
                    Abs::int(0, k - 1, 0, 1)
                }
            }
            // 0 <= x < y: x % y = x.
            _ if blo > 0 && alo >= 0 && ahi < blo => x,
            _ if blo > 0 && alo >= 0 => Abs::int(0, ahi.min(bhi - 1), 0, 1),
            _ => Abs::Any,
        },
        ArithOp::Div => Abs::Any,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_policy::lang::parse_expr;

    fn compile(text: &str) -> (Program, NodeId) {
        let ast = parse_expr(text).expect("parses");
        let mut c = attn_policy::typecheck::Compiler::default();
        let cond = c.condition(&ast).expect("compiles");
        (c.program, cond.node)
    }

    fn on(text: &str, facts: &[(&str, Abs)]) -> Abs {
        let (p, id) = compile(text);
        let f = |s: usize| {
            facts
                .iter()
                .find(|(n, _)| attn_policy::facts::te::slot(n) == Some(s))
                .map_or(Abs::Any, |x| x.1)
        };
        eval(&p, id, &f)
    }

    #[test]
    fn congruences_decide_remainders_and_ranges_decide_comparisons() {
        let even_big = Abs::int(6, 1 << 40, 0, 2);
        let two = Abs::Exact(Value::Int(2));
        let four = Abs::Exact(Value::Int(4));
        let t = Abs::Exact(Value::Bool(true));
        let f = Abs::Exact(Value::Bool(false));
        let facts = [("num_heads", even_big), ("cp_size_a2a", two)];
        assert_eq!(on("num_heads % cp_size_a2a != 0", &facts), f);
        // 6 % 4 != 0 but 8 % 4 == 0: undecided.
        let facts = [("num_heads", even_big), ("cp_size_a2a", four)];
        assert_eq!(on("num_heads % cp_size_a2a != 0", &facts), Abs::Any);
        let lo = Abs::int(1, 100, 0, 1);
        let hi = Abs::int(101, 200, 0, 1);
        let facts = [("max_seqlen_q", hi), ("max_seqlen_kv", lo)];
        assert_eq!(on("max_seqlen_q > max_seqlen_kv", &facts), t);
        assert_eq!(
            on("max_seqlen_q // 2 > max_seqlen_kv // 2", &facts),
            Abs::Any
        );
        // Residues 0 and 1 mod 2 never meet.
        let facts = [
            ("head_dim_qk", Abs::int(2, 100, 0, 2)),
            ("head_dim_v", Abs::int(1, 99, 1, 2)),
        ];
        assert_eq!(on("head_dim_qk != head_dim_v", &facts), t);
        // Overflow makes a product null (comparison false): never claimed constant.
        let big = Abs::int(1 << 20, 1 << 40, 0, 1);
        let facts = [
            ("batch_size", big),
            ("num_heads", big),
            ("max_seqlen_q", big),
        ];
        assert_eq!(
            on(
                "batch_size * num_heads * max_seqlen_q >= 1073741824",
                &facts
            ),
            Abs::Any
        );
    }
}

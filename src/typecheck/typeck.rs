//! The type checker doubles as the lowering pass: every well-typed expression becomes nodes
//! of a shared [`Program`]. String literals are resolved against the enum they are compared
//! with, so a typo in `attn_mask_type == "casual"` is a load error with a did-you-mean.

use std::collections::BTreeMap;

use crate::eval::program::{Func, Node, NodeId, Program};
use crate::facts::schema::{Schema, Ty};
use crate::facts::{Domain, Value, did_you_mean};
use crate::lang::ast::{CmpOp, Expr, ExprKind, Span};
use crate::lang::{Version, parse_expr};

/// Defined in `error.rs` (the guard check reports it too); named here as before.
pub use super::error::TypeError;

fn terr(span: Span, message: impl Into<String>) -> TypeError {
    TypeError {
        message: message.into(),
        span,
        help: None,
        syntax: false,
    }
}

/// Static type of an expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum T {
    Bool,
    Int,
    Float,
    Version,
    Enum(Domain),
    Object,
    Null,
}

impl T {
    fn from_ty(ty: Ty) -> T {
        match ty {
            Ty::Bool => T::Bool,
            Ty::Int => T::Int,
            Ty::Float => T::Float,
            Ty::Version => T::Version,
            Ty::Enum(d) => T::Enum(d),
            Ty::Object => T::Object,
        }
    }

    fn name(self) -> String {
        match self {
            T::Bool => "bool".into(),
            T::Int => "int".into(),
            T::Float => "float".into(),
            T::Version => "version".into(),
            T::Enum(d) => format!("{} (enum)", d.name()),
            T::Object => "object".into(),
            T::Null => "null".into(),
        }
    }

    fn numeric(self) -> bool {
        matches!(self, T::Int | T::Float)
    }
}

/// A compiled expression: its root node, type, and the fact slots it reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Compiled {
    pub node: NodeId,
    pub ty: T,
    pub slots: Vec<u16>,
}

struct DefState {
    source: String,
    compiled: Option<Compiled>,
    in_progress: bool,
}

/// Compiles expressions of one pack into one program; knows the pack's `defs`.
pub struct Compiler {
    /// The pack family's facts that names resolve against.
    pub schema: &'static Schema,
    pub program: Program,
    defs: BTreeMap<String, DefState>,
    /// The definitions that parse, for the unparseable-version guard (`guard.rs`).
    def_asts: BTreeMap<String, Expr>,
    /// Whether comparing a version fact that can be unparseable needs `parsed(x)` on its
    /// path (pack conditions); off for analysis restrictions (`--where`), where such a
    /// comparison is simply false for an unparseable version.
    version_guards: bool,
    /// Errors found while compiling a definition on first use: (def name, error).
    pub def_errors: Vec<(String, TypeError)>,
}

impl Default for Compiler {
    /// A compiler over the `te` family's facts without definitions.
    fn default() -> Self {
        Compiler::new(&crate::facts::te::TE, BTreeMap::new())
    }
}

impl Compiler {
    pub fn new(schema: &'static Schema, defs: BTreeMap<String, String>) -> Compiler {
        let def_asts = defs
            .iter()
            .filter_map(|(k, src)| parse_expr(src).ok().map(|e| (k.clone(), e)))
            .collect();
        Compiler {
            schema,
            program: Program::default(),
            def_asts,
            version_guards: true,
            defs: defs
                .into_iter()
                .map(|(k, source)| {
                    (
                        k,
                        DefState {
                            source,
                            compiled: None,
                            in_progress: false,
                        },
                    )
                })
                .collect(),
            def_errors: Vec::new(),
        }
    }

    /// The same compiler without the unparseable-version guard: a comparison of a version
    /// fact that can be unparseable is accepted as is (false for an unparseable version).
    /// For analysis restrictions, not for packs.
    pub fn without_version_guards(mut self) -> Compiler {
        self.version_guards = false;
        self
    }

    /// Checks that every comparison of a version fact that can be unparseable is guarded by
    /// `parsed(x)` (see `guard.rs`).
    fn check_guards(&self, e: &Expr) -> Result<(), TypeError> {
        if !self.version_guards {
            return Ok(());
        }
        super::guard::Guards {
            schema: self.schema,
            defs: &self.def_asts,
        }
        .check(e, &[])
    }

    /// Compiles a definition by name (used to check every def, referenced or not).
    pub fn compile_def(&mut self, name: &str) -> Result<Compiled, TypeError> {
        let state = self
            .defs
            .get_mut(name)
            .ok_or_else(|| terr(Span::default(), format!("no definition `{name}`")))?;
        if let Some(c) = &state.compiled {
            return Ok(c.clone());
        }
        if state.in_progress {
            return Err(terr(
                Span::default(),
                format!("definition `{name}` refers to itself"),
            ));
        }
        state.in_progress = true;
        let source = state.source.clone();
        let result = parse_expr(&source)
            .map_err(TypeError::from)
            .and_then(|ast| self.expr(&ast));
        if let Ok(c) = &result {
            // Each definition is computed once per decision (see Program::eval_memo).
            self.program.memoise(c.node);
        }
        let state = self.defs.get_mut(name).expect("def exists");
        state.in_progress = false;
        if let Ok(c) = &result {
            state.compiled = Some(c.clone());
        }
        result
    }

    pub fn def_names(&self) -> Vec<String> {
        self.defs.keys().cloned().collect()
    }

    /// Compiles a condition that must be boolean.
    pub fn condition(&mut self, ast: &Expr) -> Result<Compiled, TypeError> {
        let c = self.expr(ast)?;
        if c.ty != T::Bool {
            return Err(TypeError {
                help: Some("a condition must be true or false, e.g. `head_dim_qk > 256`".into()),
                ..terr(
                    ast.span,
                    format!("condition has type {}, expected bool", c.ty.name()),
                )
            });
        }
        Ok(c)
    }

    /// Compiles an expression of any type (variant values).
    pub fn expr(&mut self, e: &Expr) -> Result<Compiled, TypeError> {
        let mut slots = Vec::new();
        let (node, ty) = self.lower(e, &mut slots)?;
        self.check_guards(e)?;
        slots.sort_unstable();
        slots.dedup();
        Ok(Compiled { node, ty, slots })
    }

    fn konst(&mut self, v: Value) -> NodeId {
        self.program.push(Node::Const(v))
    }

    fn lower(&mut self, e: &Expr, slots: &mut Vec<u16>) -> Result<(NodeId, T), TypeError> {
        Ok(match &e.kind {
            ExprKind::Int(i) => (self.konst(Value::Int(*i)), T::Int),
            ExprKind::Float(x) | ExprKind::Decimal(x, _) => {
                (self.konst(Value::Float(*x)), T::Float)
            }
            ExprKind::Bool(b) => (self.konst(Value::Bool(*b)), T::Bool),
            ExprKind::Version(v) => (self.konst(Value::Version(*v)), T::Version),
            ExprKind::Null => (self.konst(Value::Null), T::Null),
            ExprKind::Str(s) => {
                return Err(TypeError {
                    help: Some(
                        "compare it with an enum fact, e.g. `attn_mask_type == \"causal\"`".into(),
                    ),
                    ..terr(
                        e.span,
                        format!("string {s:?} can only be compared with an enum fact"),
                    )
                });
            }
            ExprKind::List(_) => {
                return Err(terr(
                    e.span,
                    "a list can only appear on the right of `in` / `not in`",
                ));
            }
            ExprKind::Group(inner) => self.lower(inner, slots)?,
            ExprKind::Path(p) => self.path(p, e.span, slots)?,
            ExprKind::Not(a) => {
                let (n, t) = self.lower(a, slots)?;
                self.expect_bool(t, a.span, "`not`")?;
                (self.program.push(Node::Not(n)), T::Bool)
            }
            ExprKind::And(a, b) | ExprKind::Or(a, b) => {
                let is_and = matches!(e.kind, ExprKind::And(..));
                let word = if is_and { "`and`" } else { "`or`" };
                let mut ids = Vec::new();
                // Flatten chains of the same operator into one n-ary node.
                let mut stack = vec![b.as_ref(), a.as_ref()];
                while let Some(x) = stack.pop() {
                    match &x.kind {
                        ExprKind::And(l, r) if is_and => {
                            stack.push(r);
                            stack.push(l);
                        }
                        ExprKind::Or(l, r) if !is_and => {
                            stack.push(r);
                            stack.push(l);
                        }
                        _ => {
                            let (n, t) = self.lower(x, slots)?;
                            self.expect_bool(t, x.span, word)?;
                            ids.push(n);
                        }
                    }
                }
                // Kleene `and`/`or` are commutative: evaluate cheap operands first so that
                // short-circuiting skips the expensive ones (same result, fewer nodes).
                ids.sort_by_key(|&n| self.program.cost(n));
                let (start, len) = self.program.push_children(&ids);
                let node = if is_and {
                    Node::And { start, len }
                } else {
                    Node::Or { start, len }
                };
                (self.program.push(node), T::Bool)
            }
            ExprKind::Neg(a) => {
                let (n, t) = self.lower(a, slots)?;
                if !t.numeric() {
                    return Err(terr(a.span, format!("cannot negate a {}", t.name())));
                }
                (self.program.push(Node::Neg(n)), t)
            }
            ExprKind::Arith(op, a, b) => {
                let (na, ta) = self.lower(a, slots)?;
                let (nb, tb) = self.lower(b, slots)?;
                for (t, s) in [(ta, a.span), (tb, b.span)] {
                    if !t.numeric() {
                        return Err(terr(
                            s,
                            format!("`{}` needs numbers, found {}", op.symbol(), t.name()),
                        ));
                    }
                }
                let ty = if ta == T::Int && tb == T::Int && *op != crate::lang::ast::ArithOp::Div {
                    T::Int
                } else {
                    T::Float
                };
                (self.program.push(Node::Arith(*op, na, nb)), ty)
            }
            ExprKind::Call(name, args) => self.call(name, args, e.span, slots)?,
            ExprKind::Compare(first, links) => self.compare(first, links, slots)?,
        })
    }

    fn expect_bool(&self, t: T, span: Span, what: &str) -> Result<(), TypeError> {
        if t == T::Bool {
            Ok(())
        } else {
            Err(terr(
                span,
                format!("{what} needs a bool, found {}", t.name()),
            ))
        }
    }

    fn path(
        &mut self,
        p: &str,
        span: Span,
        slots: &mut Vec<u16>,
    ) -> Result<(NodeId, T), TypeError> {
        if self.defs.contains_key(p) {
            let c = self.compile_def(p).map_err(|inner| {
                self.def_errors.push((p.to_string(), inner.clone()));
                terr(
                    span,
                    format!("definition `{p}` is invalid: {}", inner.message),
                )
            })?;
            slots.extend_from_slice(&c.slots);
            return Ok((c.node, c.ty));
        }
        let Some(slot) = self.schema.slot(p) else {
            let names = self
                .schema
                .expression_names()
                .map(str::to_string)
                .chain(self.defs.keys().cloned())
                .collect::<Vec<_>>();
            return Err(TypeError {
                help: did_you_mean(p, names.iter().map(String::as_str))
                    .map(|s| format!("did you mean `{s}`?")),
                ..terr(span, format!("unknown fact `{p}`"))
            });
        };
        slots.push(slot as u16);
        let d = self.schema.def(slot);
        Ok((self.program.push(Node::Slot(slot as u16)), T::from_ty(d.ty)))
    }

    fn call(
        &mut self,
        name: &str,
        args: &[Expr],
        span: Span,
        slots: &mut Vec<u16>,
    ) -> Result<(NodeId, T), TypeError> {
        if name == "parsed" {
            return self.parsed_call(args, span, slots);
        }
        let known = || Func::NAMES.iter().chain(Func::PREDICATES).copied();
        let func = Func::lookup(name).ok_or_else(|| TypeError {
            help: did_you_mean(name, known()).map(|s| format!("did you mean `{s}`?")),
            ..terr(
                span,
                format!(
                    "unknown function `{name}`; known: {}",
                    known().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        let arity_ok = match func {
            Func::Abs => args.len() == 1,
            Func::Gcd | Func::RoundUp => args.len() == 2,
            Func::If => args.len() == 3,
            Func::Max | Func::Min => args.len() >= 2,
        };
        if !arity_ok {
            return Err(terr(
                span,
                format!(
                    "wrong number of arguments to `{name}` ({} given)",
                    args.len()
                ),
            ));
        }
        if func == Func::If {
            return self.if_call(args, slots);
        }
        let mut ids = Vec::new();
        let mut ty = T::Int;
        for a in args {
            let (n, t) = self.lower(a, slots)?;
            let ok = match func {
                Func::Gcd | Func::RoundUp => t == T::Int,
                Func::Max | Func::Min => t.numeric() || t == T::Version,
                Func::Abs => t.numeric(),
                Func::If => unreachable!("if() is lowered by if_call"),
            };
            if !ok {
                return Err(terr(
                    a.span,
                    format!("`{name}` does not take a {}", t.name()),
                ));
            }
            if t == T::Float {
                ty = T::Float;
            }
            if t == T::Version {
                ty = T::Version;
            }
            ids.push(n);
        }
        let (start, len) = self.program.push_children(&ids);
        Ok((self.program.push(Node::Call { func, start, len }), ty))
    }

    /// `parsed(x)`: whether the version fact `x` is present and parsed (not null, not an
    /// unparseable version). Takes a version fact by name only, so that the guard analysis
    /// knows which fact it establishes.
    fn parsed_call(
        &mut self,
        args: &[Expr],
        span: Span,
        slots: &mut Vec<u16>,
    ) -> Result<(NodeId, T), TypeError> {
        let help =
            || Some("write the version fact's name, e.g. `parsed(cudnn_frontend_version)`".into());
        let [arg] = args else {
            return Err(TypeError {
                help: help(),
                ..terr(
                    span,
                    format!(
                        "wrong number of arguments to `parsed` ({} given)",
                        args.len()
                    ),
                )
            });
        };
        let arg = strip(arg);
        let by_name = match &arg.kind {
            ExprKind::Path(p) if !self.defs.contains_key(p) => Some(p),
            _ => None,
        };
        let Some(p) = by_name else {
            return Err(TypeError {
                help: help(),
                ..terr(
                    arg.span,
                    "`parsed` takes a version fact by name (not an expression or a definition)",
                )
            });
        };
        // An unknown name gets the usual error and did-you-mean.
        let (n, t) = self.path(p, arg.span, slots)?;
        if t != T::Version {
            return Err(TypeError {
                help: help(),
                ..terr(
                    arg.span,
                    format!("`parsed` takes a version fact; `{p}` is {}", t.name()),
                )
            });
        }
        Ok((self.program.push(Node::IsParsed(n)), T::Bool))
    }

    /// `if(cond, a, b)`: `cond` is a bool; the branches share a type (int and float mix to
    /// float, a null branch takes the other's type).
    fn if_call(&mut self, args: &[Expr], slots: &mut Vec<u16>) -> Result<(NodeId, T), TypeError> {
        let (c, ct) = self.lower(&args[0], slots)?;
        if ct != T::Bool && ct != T::Null {
            return Err(terr(
                args[0].span,
                format!("the condition of `if` must be a bool, not a {}", ct.name()),
            ));
        }
        let (a, at) = self.lower(&args[1], slots)?;
        let (b, bt) = self.operand(&args[2], Some(at), slots)?;
        let ty = match (at, bt) {
            (x, y) if x == y => x,
            (T::Null, y) => y,
            (x, T::Null) => x,
            (x, y) if x.numeric() && y.numeric() => T::Float,
            (x, y) => {
                return Err(terr(
                    args[2].span,
                    format!(
                        "the branches of `if` differ in type ({} and {})",
                        x.name(),
                        y.name()
                    ),
                ));
            }
        };
        let (start, len) = self.program.push_children(&[c, a, b]);
        Ok((
            self.program.push(Node::Call {
                func: Func::If,
                start,
                len,
            }),
            ty,
        ))
    }

    /// Lowers an operand that may be a string literal, resolved against `other`.
    fn operand(
        &mut self,
        e: &Expr,
        other: Option<T>,
        slots: &mut Vec<u16>,
    ) -> Result<(NodeId, T), TypeError> {
        match (&e.kind, other) {
            (ExprKind::Str(s), Some(T::Enum(d))) => {
                Ok((self.konst(enum_value(d, s, e.span)?), T::Enum(d)))
            }
            (ExprKind::Str(s), Some(T::Version)) => {
                let v = Version::parse(s)
                    .ok_or_else(|| terr(e.span, format!("{s:?} is not a version")))?;
                Ok((self.konst(Value::Version(v)), T::Version))
            }
            // `cudnn_version >= 9.23`: a two-part number against a version is that version.
            (ExprKind::Decimal(_, v), Some(T::Version)) => {
                Ok((self.konst(Value::Version(*v)), T::Version))
            }
            (ExprKind::Group(inner), _) => self.operand(inner, other, slots),
            _ => self.lower(e, slots),
        }
    }

    fn static_type(&mut self, e: &Expr) -> Option<T> {
        match &e.kind {
            ExprKind::Str(_) | ExprKind::List(_) => None,
            ExprKind::Group(inner) => self.static_type(inner),
            _ => {
                // Type without keeping nodes: lower into a scratch and roll back.
                // Definitions first compiled during the probe would point into the rolled-back
                // nodes: compile them for real first.
                let mut names = Vec::new();
                collect_paths(e, &mut names);
                for n in names {
                    if self
                        .defs
                        .get(&n)
                        .is_some_and(|d| d.compiled.is_none() && !d.in_progress)
                    {
                        let _ = self.compile_def(&n);
                    }
                }
                let mark = (
                    self.program.nodes.len(),
                    self.program.children.len(),
                    self.program.consts.len(),
                );
                let mut scratch = Vec::new();
                let t = self.lower(e, &mut scratch).ok().map(|(_, t)| t);
                self.program.truncate(mark.0, mark.1, mark.2);
                t
            }
        }
    }

    fn compare(
        &mut self,
        first: &Expr,
        links: &[(CmpOp, Span, Expr)],
        slots: &mut Vec<u16>,
    ) -> Result<(NodeId, T), TypeError> {
        let mut conj = Vec::new();
        let mut lhs_expr = first;
        let mut lhs: Option<(NodeId, T)> = None;
        for (op, op_span, rhs_expr) in links {
            let node = match op {
                CmpOp::In | CmpOp::NotIn => {
                    let negate = *op == CmpOp::NotIn;
                    self.membership(lhs_expr, lhs, rhs_expr, negate, *op_span, slots)?
                }
                _ => {
                    let rhs_t = self.static_type(rhs_expr);
                    let (ln, lt) = match lhs {
                        Some(x) => x,
                        None => self.operand(lhs_expr, rhs_t, slots)?,
                    };
                    let (rn, rt) = self.operand(rhs_expr, Some(lt), slots)?;
                    lhs = Some((rn, rt));
                    self.comparison(
                        *op,
                        (ln, lt, lhs_expr.span),
                        (rn, rt, rhs_expr.span),
                        *op_span,
                    )?
                }
            };
            conj.push(node);
            if matches!(op, CmpOp::In | CmpOp::NotIn) {
                lhs = None;
            }
            lhs_expr = rhs_expr;
        }
        if conj.len() == 1 {
            return Ok((conj[0], T::Bool));
        }
        let (start, len) = self.program.push_children(&conj);
        Ok((self.program.push(Node::And { start, len }), T::Bool))
    }

    fn comparison(
        &mut self,
        op: CmpOp,
        (ln, lt, ls): (NodeId, T, Span),
        (rn, rt, rs): (NodeId, T, Span),
        op_span: Span,
    ) -> Result<NodeId, TypeError> {
        let both = ls.join(rs);
        if lt == T::Null || rt == T::Null {
            let (other, ot, os) = if lt == T::Null {
                (rn, rt, rs)
            } else {
                (ln, lt, ls)
            };
            if ot == T::Null {
                return Err(terr(both, "comparing null with null"));
            }
            if !is_nullable(self.schema, &self.program, other, ot) {
                return Err(TypeError {
                    help: Some(
                        "only optional facts (marked nullable in docs/facts.md) can be null".into(),
                    ),
                    ..terr(os, "this value is never null")
                });
            }
            return match op {
                CmpOp::Eq => Ok(self.program.push(Node::IsNull(other))),
                CmpOp::Ne => Ok(self.program.push(Node::IsNotNull(other))),
                _ => Err(terr(
                    op_span,
                    format!("`{}` with null; use `== null` or `!= null`", op.symbol()),
                )),
            };
        }
        if lt == T::Object || rt == T::Object {
            return Err(TypeError {
                help: Some(
                    "compare its members instead, e.g. `window_size.left`, or test `!= null`"
                        .into(),
                ),
                ..terr(
                    if lt == T::Object { ls } else { rs },
                    "a structured fact can only be compared with null",
                )
            });
        }
        let compatible = (lt.numeric() && rt.numeric()) || lt == rt;
        if !compatible {
            return Err(terr(
                both,
                format!("cannot compare {} with {}", lt.name(), rt.name()),
            ));
        }
        let ordered = matches!(op, CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge);
        if ordered && matches!(lt, T::Enum(_) | T::Bool) {
            return Err(terr(
                op_span,
                format!("`{}` does not apply to {}", op.symbol(), lt.name()),
            ));
        }
        Ok(self.program.push(Node::Cmp(op, ln, rn)))
    }

    fn membership(
        &mut self,
        lhs_expr: &Expr,
        lhs: Option<(NodeId, T)>,
        rhs: &Expr,
        negate: bool,
        op_span: Span,
        slots: &mut Vec<u16>,
    ) -> Result<NodeId, TypeError> {
        // `"causal" in attn_mask_type`: substring test over an enum, expanded at compile time.
        if let (ExprKind::Str(needle), None) = (&strip(lhs_expr).kind, lhs) {
            let (rn, rt) = self.lower(rhs, slots)?;
            let T::Enum(d) = rt else {
                return Err(terr(
                    rhs.span,
                    format!(
                        "`\"{needle}\" in x` needs an enum fact on the right, found {}",
                        rt.name()
                    ),
                ));
            };
            let hits: Vec<Value> = d
                .values()
                .iter()
                .enumerate()
                .filter(|(_, v)| v.contains(needle.as_str()))
                .map(|(i, _)| Value::Enum(i as u16))
                .collect();
            if hits.is_empty() {
                return Err(terr(
                    lhs_expr.span,
                    format!(
                        "no {} value contains {needle:?}; values: {}",
                        d.name(),
                        d.values().join(", ")
                    ),
                ));
            }
            let (start, len) = self.program.push_consts(&hits);
            return Ok(self.program.push(Node::In {
                item: rn,
                start,
                len,
                negate,
            }));
        }
        let (ln, lt) = match lhs {
            Some(x) => x,
            None => self.lower(lhs_expr, slots)?,
        };
        let ExprKind::List(items) = &strip(rhs).kind else {
            return Err(TypeError {
                help: Some("write the set as a list literal, e.g. `cp_comm_type in [\"p2p\", \"a2a+p2p\"]`".into()),
                ..terr(rhs.span, format!("`{}` needs a list literal on the right", if negate { "not in" } else { "in" }))
            });
        };
        let _ = op_span;
        if matches!(lt, T::Object | T::Null) {
            return Err(terr(
                lhs_expr.span,
                format!("`in` does not apply to {}", lt.name()),
            ));
        }
        let mut vals = Vec::new();
        for item in items {
            let v = match (&strip(item).kind, lt) {
                (ExprKind::Str(s), T::Enum(d)) => enum_value(d, s, item.span)?,
                (ExprKind::Str(s), T::Version) => Value::Version(
                    Version::parse(s)
                        .ok_or_else(|| terr(item.span, format!("{s:?} is not a version")))?,
                ),
                (ExprKind::Int(i), T::Int | T::Float) => Value::Int(*i),
                (ExprKind::Float(x) | ExprKind::Decimal(x, _), T::Int | T::Float) => {
                    Value::Float(*x)
                }
                (ExprKind::Decimal(_, v), T::Version) => Value::Version(*v),
                (ExprKind::Bool(b), T::Bool) => Value::Bool(*b),
                (ExprKind::Version(v), T::Version) => Value::Version(*v),
                _ => {
                    return Err(terr(
                        item.span,
                        format!("list item must be a literal of type {}", lt.name()),
                    ));
                }
            };
            vals.push(v);
        }
        let (start, len) = self.program.push_consts(&vals);
        Ok(self.program.push(Node::In {
            item: ln,
            start,
            len,
            negate,
        }))
    }
}

/// Every name an expression mentions (facts and definitions alike).
fn collect_paths(e: &Expr, out: &mut Vec<String>) {
    match &e.kind {
        ExprKind::Path(p) => out.push(p.clone()),
        ExprKind::List(xs) | ExprKind::Call(_, xs) => xs.iter().for_each(|x| collect_paths(x, out)),
        ExprKind::Not(a) | ExprKind::Neg(a) | ExprKind::Group(a) => collect_paths(a, out),
        ExprKind::And(a, b) | ExprKind::Or(a, b) | ExprKind::Arith(_, a, b) => {
            collect_paths(a, out);
            collect_paths(b, out);
        }
        ExprKind::Compare(first, rest) => {
            collect_paths(first, out);
            rest.iter().for_each(|(_, _, x)| collect_paths(x, out));
        }
        _ => {}
    }
}

fn strip(e: &Expr) -> &Expr {
    match &e.kind {
        ExprKind::Group(inner) => strip(inner),
        _ => e,
    }
}

fn enum_value(d: Domain, s: &str, span: Span) -> Result<Value, TypeError> {
    d.index_of(s).map(Value::Enum).ok_or_else(|| TypeError {
        help: did_you_mean(s, d.values().iter().copied())
            .map(|x| format!("did you mean {x:?}?"))
            .or_else(|| Some(format!("values: {}", d.values().join(", ")))),
        ..terr(span, format!("{s:?} is not a valid {}", d.name()))
    })
}

/// Whether a compiled operand may be null: nullable facts and arithmetic over them.
fn is_nullable(schema: &Schema, p: &Program, node: NodeId, t: T) -> bool {
    match p.nodes[node as usize] {
        Node::Slot(s) => {
            let d = schema.def(s as usize);
            d.nullable || d.ty == Ty::Version
        }
        Node::Arith(..) | Node::Call { .. } | Node::Neg(_) => true,
        Node::Const(v) => v == Value::Null,
        _ => t == T::Object,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Facts;
    use serde_json::json;

    fn eval(src: &str, facts: serde_json::Value) -> Value {
        let mut c = Compiler::default();
        let ast = parse_expr(src).unwrap();
        let compiled = c.condition(&ast).unwrap_or_else(|e| panic!("{src}: {e}"));
        let facts = Facts::from_json(&facts).unwrap();
        c.program.eval(compiled.node, facts.values())
    }

    fn type_error(src: &str) -> TypeError {
        let mut c = Compiler::default();
        c.condition(&parse_expr(src).unwrap()).unwrap_err()
    }

    #[test]
    fn chained_and_membership() {
        assert_eq!(
            eval("256 < head_dim_qk <= 512", json!({"head_dim_qk": 512})),
            Value::Bool(true)
        );
        assert_eq!(
            eval("256 < head_dim_qk <= 512", json!({"head_dim_qk": 256})),
            Value::Bool(false)
        );
        assert_eq!(
            eval(
                "cp_comm_type in ['p2p', 'a2a+p2p']",
                json!({"cp_comm_type": "a2a+p2p"})
            ),
            Value::Bool(true)
        );
        assert_eq!(
            eval(
                "cp_comm_type not in ['p2p', 'a2a+p2p']",
                json!({"cp_comm_type": "a2a"})
            ),
            Value::Bool(true)
        );
        assert_eq!(
            eval(
                "'causal' in attn_mask_type",
                json!({"attn_mask_type": "padding_causal_bottom_right"})
            ),
            Value::Bool(true)
        );
        assert_eq!(
            eval(
                "'bottom_right' in attn_mask_type",
                json!({"attn_mask_type": "causal"})
            ),
            Value::Bool(false)
        );
        assert_eq!(
            eval("head_dim_qk % 8 != 0", json!({"head_dim_qk": 260})),
            Value::Bool(true)
        );
    }

    #[test]
    fn two_part_numbers_compare_as_versions() {
        let on = |v: &str| json!({"cudnn_version": v});
        assert_eq!(
            eval("cudnn_version >= 9.23", on("9.23.0")),
            Value::Bool(true)
        );
        assert_eq!(
            eval("cudnn_version >= 9.23", on("9.22.1")),
            Value::Bool(false)
        );
        // Read from the text: 9.10 is 9.10.0, not the float 9.1.
        assert_eq!(eval("cudnn_version < 9.10", on("9.9.0")), Value::Bool(true));
        assert_eq!(
            eval("9.5 <= cudnn_version", on("9.10.0")),
            Value::Bool(true)
        );
        assert_eq!(
            eval("cudnn_version in [9.23, 9.23.1]", on("9.23.0")),
            Value::Bool(true)
        );
        // Still a float elsewhere.
        assert_eq!(
            eval(
                "attention_dropout > 0.05",
                json!({"attention_dropout": 0.1})
            ),
            Value::Bool(true)
        );
    }

    #[test]
    fn versions_and_nulls() {
        // FR.27's form: absent declines, parsed below the floor declines, unparseable does not.
        let fr27 = "cudnn_frontend_version == null or (parsed(cudnn_frontend_version) and \
                    cudnn_frontend_version < 1.29.0)";
        for (v, declines) in [
            (json!(null), true),
            (json!("1.28.0"), true),
            (json!("1.29.0rc1"), true),
            (json!("1.29.0"), false),
            (json!("1.30.2+cu13"), false),
            (json!("1.29.x-custom"), false),
            (json!("not-a-version"), false),
        ] {
            assert_eq!(
                eval(fr27, json!({ "cudnn_frontend_version": v })),
                Value::Bool(declines),
                "{v}"
            );
        }
        assert_eq!(eval(fr27, json!({})), Value::Bool(true));
        assert_eq!(
            eval(
                "cudnn_version in [9.23.0, 9.23.1]",
                json!({"cudnn_version": [9, 23, 1]})
            ),
            Value::Bool(true)
        );
        assert_eq!(
            eval("inference.page_size % 256 != 0", json!({})),
            Value::Bool(false)
        );
        assert_eq!(
            eval(
                "env.NVTE_FLASH_ATTN == 0",
                json!({"env": {"NVTE_FLASH_ATTN": "0"}})
            ),
            Value::Bool(true)
        );
        assert_eq!(
            eval("env.NVTE_FLASH_ATTN == 0", json!({})),
            Value::Bool(false)
        );
    }

    /// `parsed(x)` tells the three states of a version apart; `== null` stays the absence test.
    #[test]
    fn parsed_tells_the_three_states_apart() {
        let states = [
            (json!(null), false, true),
            (json!("1.29.0"), true, false),
            (json!("1.29.x-custom"), false, false),
        ];
        for (v, parsed, null) in states {
            let facts = json!({ "cutlass_dsl_version": v });
            assert_eq!(
                eval("parsed(cutlass_dsl_version)", facts.clone()),
                Value::Bool(parsed),
                "{v}"
            );
            assert_eq!(
                eval("cutlass_dsl_version == null", facts.clone()),
                Value::Bool(null),
                "{v}"
            );
            // Unparseable: present, not parsed.
            assert_eq!(
                eval(
                    "cutlass_dsl_version != null and not parsed(cutlass_dsl_version)",
                    facts
                ),
                Value::Bool(!parsed && !null),
                "{v}"
            );
        }
        // A version fact that is never unparseable: parsed is "present".
        assert_eq!(
            eval("parsed(flash_attn_versions.v2)", json!({})),
            Value::Bool(false)
        );
        assert_eq!(eval("parsed(cudnn_version)", json!({})), Value::Bool(true));
    }

    /// Comparing a version fact that can be unparseable needs `parsed(x)` on the path.
    #[test]
    fn unguarded_version_comparisons_are_type_errors() {
        let fe = "cudnn_frontend_version";
        let rejected = [
            "cudnn_frontend_version < 1.29.0",
            "cudnn_frontend_version == null or cudnn_frontend_version < 1.29.0",
            "cudnn_frontend_version != null and cudnn_frontend_version >= 1.29.0",
            "cudnn_frontend_version == 1.29.0",
            "cudnn_frontend_version != 1.29.0",
            "1.29.0 <= cudnn_frontend_version",
            "cudnn_frontend_version in [1.29.0, 1.29.1]",
            "cudnn_frontend_version not in [1.29.0]",
            // Wrong polarity: the comparison matters exactly when the version is not parsed.
            "not parsed(cudnn_frontend_version) and cudnn_frontend_version < 1.29.0",
            "parsed(cudnn_frontend_version) or cudnn_frontend_version < 1.29.0",
            "if(parsed(cudnn_frontend_version), false, cudnn_frontend_version < 1.29.0)",
            // Another fact's guard.
            "parsed(cutlass_dsl_version) and cudnn_frontend_version < 1.29.0",
            // Only one side of an `or` establishes it.
            "(parsed(cudnn_frontend_version) or head_dim_qk > 8) and cudnn_frontend_version < 1.29.0",
            "max(cudnn_frontend_version, 1.0.0) > 1.28.0",
            "parsed(cudnn_frontend_version) and cutlass_dsl_version < 4.7.0",
        ];
        for src in rejected {
            let e = type_error(src);
            assert!(e.message.contains("unparseable"), "{src}: {}", e.message);
            let help = e.help.unwrap_or_default();
            assert!(help.contains("parsed("), "{src}: {help}");
            // The span is the operand that reads the fact.
            let at = &src[e.span.start..e.span.end];
            assert!(
                at.contains("cudnn_frontend_version") || at.contains("cutlass_dsl_version"),
                "{src}: span {at:?}"
            );
        }
        let e = type_error("head_dim_qk > 64 and cudnn_frontend_version < 1.29.0");
        assert_eq!((e.span.start, e.span.end), (21, 21 + fe.len()));
        let accepted = [
            "parsed(cudnn_frontend_version) and cudnn_frontend_version < 1.29.0",
            "cudnn_frontend_version < 1.29.0 and parsed(cudnn_frontend_version)",
            "cudnn_frontend_version == null or not parsed(cudnn_frontend_version) or cudnn_frontend_version < 1.29.0",
            "cudnn_frontend_version == null or (parsed(cudnn_frontend_version) and cudnn_frontend_version < 1.29.0)",
            "not (not parsed(cudnn_frontend_version) or cudnn_frontend_version >= 1.29.0)",
            "if(parsed(cudnn_frontend_version), cudnn_frontend_version < 1.29.0, true)",
            "parsed(cudnn_frontend_version) and parsed(cutlass_dsl_version) and cudnn_frontend_version < 1.29.0 and cutlass_dsl_version < 4.7.0",
            "parsed(cudnn_frontend_version) and 1.28.0 < cudnn_frontend_version <= 1.29.0",
            "parsed(cudnn_frontend_version) and cudnn_frontend_version in [1.29.0]",
            "cudnn_frontend_version == null",
            "cudnn_frontend_version != null",
            // Versions that are never unparseable need no guard.
            "cudnn_version < 9.0.0",
            "flash_attn_versions.v2 != null and flash_attn_versions.v2 < 2.5.0",
        ];
        for src in accepted {
            let mut c = Compiler::default();
            c.condition(&parse_expr(src).unwrap())
                .unwrap_or_else(|e| panic!("{src}: {e}"));
        }
        // Restrictions (analysis `--where`) take the comparison as is.
        let mut c = Compiler::default().without_version_guards();
        let ast = parse_expr("cudnn_frontend_version < 1.29.0").unwrap();
        let compiled = c.condition(&ast).unwrap();
        let bad = Facts::from_json(&json!({ "cudnn_frontend_version": "x" })).unwrap();
        assert_eq!(
            c.program.eval(compiled.node, bad.values()),
            Value::Bool(false)
        );
    }

    #[test]
    fn parsed_guards_through_definitions() {
        let defs = [
            ("fe", "cudnn_frontend_version"),
            ("fe_known", "parsed(cudnn_frontend_version)"),
            ("fe_unknown", "not parsed(cudnn_frontend_version)"),
            (
                "fe_old",
                "parsed(cudnn_frontend_version) and cudnn_frontend_version < 1.29.0",
            ),
            ("fe_bad", "cudnn_frontend_version < 1.29.0"),
        ];
        let compiler = || {
            Compiler::new(
                &crate::facts::te::TE,
                defs.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        for ok in [
            "fe_old",
            "fe_known and cudnn_frontend_version < 1.29.0",
            "fe_unknown or cudnn_frontend_version < 1.29.0",
            "parsed(cudnn_frontend_version) and fe < 1.29.0",
        ] {
            compiler()
                .condition(&parse_expr(ok).unwrap())
                .unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "fe < 1.29.0",
            "fe_unknown and cudnn_frontend_version < 1.29.0",
        ] {
            let e = compiler().condition(&parse_expr(bad).unwrap()).unwrap_err();
            assert!(e.message.contains("unparseable"), "{bad}: {e}");
        }
        // A definition's own comparisons are checked where it is defined.
        let e = compiler().compile_def("fe_bad").unwrap_err();
        assert!(e.message.contains("unparseable"), "{e}");
        let e = compiler()
            .condition(&parse_expr("fe_bad").unwrap())
            .unwrap_err();
        assert!(e.message.contains("definition `fe_bad` is invalid"), "{e}");
    }

    #[test]
    fn parsed_takes_a_version_fact_by_name() {
        for (src, says) in [
            ("parsed(head_dim_qk)", "`head_dim_qk` is int"),
            ("parsed(1.29.0)", "by name"),
            ("parsed(max(cudnn_version, 9.0.0))", "by name"),
            ("parsed(cudnn_version, cudnn_version)", "wrong number"),
            ("parsed()", "wrong number"),
            ("parsed(cudnn_frontend_versio)", "unknown fact"),
        ] {
            let e = type_error(src);
            assert!(e.message.contains(says), "{src}: {}", e.message);
        }
        assert_eq!(
            type_error("parsed(cudnn_frontend_versio)").help.as_deref(),
            Some("did you mean `cudnn_frontend_version`?")
        );
        assert!(
            type_error("parsd(cudnn_version)")
                .help
                .unwrap()
                .contains("parsed")
        );
    }

    #[test]
    fn probes_are_three_valued() {
        assert_eq!(
            eval("not probe.fused_attn_graph", json!({})),
            Value::Unknown
        );
        assert_eq!(
            eval(
                "head_dim_qk > 256 and not probe.fused_attn_graph",
                json!({"head_dim_qk": 64})
            ),
            Value::Bool(false)
        );
        assert_eq!(
            eval(
                "not probe.fused_attn_graph",
                json!({"probe": {"fused_attn_graph": true}})
            ),
            Value::Bool(false)
        );
    }

    #[test]
    fn functions_compile() {
        assert_eq!(
            eval(
                "(round_up(head_dim_v, 16) // 2) % gcd(32, round_up(head_dim_qk, 16) // 2) != 0",
                json!({"head_dim_qk": 192, "head_dim_v": 128})
            ),
            Value::Bool(false)
        );
        assert_eq!(
            eval(
                "max(head_dim_qk, head_dim_v) > 256",
                json!({"head_dim_qk": 192, "head_dim_v": 512})
            ),
            Value::Bool(true)
        );
    }

    #[test]
    fn type_errors_are_precise() {
        let e = type_error("attn_mask_type == \"casual\"");
        assert!(e.help.unwrap().contains("\"causal\""));
        assert_eq!(e.span.start, 18);
        let e = type_error("head_dim_kq > 256");
        assert_eq!(e.help.as_deref(), Some("did you mean `head_dim_qk`?"));
        assert!(type_error("head_dim_qk").message.contains("expected bool"));
        assert!(
            type_error("head_dim_qk == true")
                .message
                .contains("cannot compare")
        );
        assert!(
            type_error("attn_mask_type < 'causal'")
                .message
                .contains("does not apply")
        );
        assert!(
            type_error("head_dim_qk == null")
                .message
                .contains("never null")
        );
        assert!(
            type_error("cudnn_version > 9")
                .message
                .contains("cannot compare")
        );
        assert!(
            type_error("'x' in attn_mask_type")
                .message
                .contains("no attn_mask_type value")
        );
        assert!(
            type_error("window_size == 3")
                .message
                .contains("cannot compare")
                || type_error("window_size == 3")
                    .message
                    .contains("structured")
        );
        assert!(type_error("foo(1)").message.contains("unknown function"));
    }

    #[test]
    fn defs_inline_and_detect_cycles() {
        let mut defs = BTreeMap::new();
        defs.insert(
            "fp8dpa".to_string(),
            "fp8 and fp8_recipe.fp8_dpa".to_string(),
        );
        defs.insert("loop_a".to_string(), "loop_b".to_string());
        defs.insert("loop_b".to_string(), "loop_a".to_string());
        let mut c = Compiler::new(&crate::facts::te::TE, defs);
        let ast = parse_expr("fp8dpa and head_dim_qk > 128").unwrap();
        let compiled = c.condition(&ast).unwrap();
        assert!(
            compiled
                .slots
                .contains(&(c.schema.slot("fp8").unwrap() as u16))
        );
        let f = Facts::from_json(&json!({"fp8": true, "fp8_recipe": {"recipe": "DelayedScaling", "fp8_dpa": true}, "head_dim_qk": 192})).unwrap();
        assert_eq!(c.program.eval(compiled.node, f.values()), Value::Bool(true));
        assert!(c.condition(&parse_expr("loop_a").unwrap()).is_err());
    }
}

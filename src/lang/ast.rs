//! The untyped syntax tree of a condition, with byte spans into the expression text.

use super::version::Version;

/// Byte range into the expression string (not the file: see `pack::source` for the mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn join(self, other: Span) -> Span {
        Span {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    NotIn,
}

impl CmpOp {
    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
            CmpOp::In => "in",
            CmpOp::NotIn => "not in",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    Rem,
}

impl ArithOp {
    pub fn symbol(self) -> &'static str {
        match self {
            ArithOp::Add => "+",
            ArithOp::Sub => "-",
            ArithOp::Mul => "*",
            ArithOp::Div => "/",
            ArithOp::FloorDiv => "//",
            ArithOp::Rem => "%",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    Int(i64),
    Float(f64),
    /// A number written `X.Y` (`9.23`): a float, or the version `X.Y.0` where it is compared
    /// with a version (`cudnn_version >= 9.23`), read from its text so `9.10` stays 9.10.
    Decimal(f64, Version),
    Bool(bool),
    Str(String),
    Version(Version),
    Null,
    List(Vec<Expr>),
    /// A fact, a field of a structured fact (`window.left`) or a pack definition.
    Path(String),
    Call(String, Vec<Expr>),
    Not(Box<Expr>),
    Neg(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Arith(ArithOp, Box<Expr>, Box<Expr>),
    /// `a < b <= c` is one chain: `(a < b) and (b <= c)`, `b` evaluated once per link.
    Compare(Box<Expr>, Vec<(CmpOp, Span, Expr)>),
    /// Parentheses, kept so that `(a < b) < c` is not read as a chain.
    Group(Box<Expr>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

impl Expr {
    pub fn new(kind: ExprKind, span: Span) -> Expr {
        Expr { kind, span }
    }
}

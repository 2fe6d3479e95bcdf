//! pest grammar + Pratt folding into [`Expr`]. Limits protect callers on any thread: the
//! expression length and nesting depth are bounded before any recursive AST building.

use std::sync::LazyLock;

use pest::Parser;
use pest::iterators::{Pair, Pairs};
use pest::pratt_parser::{Assoc, Op, PrattParser};
use pest_derive::Parser;

use super::ast::{ArithOp, CmpOp, Expr, ExprKind, Span};
use super::version::Version;

#[derive(Parser)]
#[grammar = "lang/grammar.pest"]
struct ConditionParser;

/// Longest accepted expression, in bytes.
pub const MAX_EXPR_LEN: usize = 4096;
/// Deepest accepted nesting of parentheses, lists, calls and prefix operators.
pub const MAX_DEPTH: usize = 64;

/// A syntax error inside one expression; `span` is relative to the expression text.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct SyntaxError {
    pub message: String,
    pub span: Span,
}

static PRATT: LazyLock<PrattParser<Rule>> = LazyLock::new(|| {
    PrattParser::new()
        .op(Op::infix(Rule::or_op, Assoc::Left))
        .op(Op::infix(Rule::and_op, Assoc::Left))
        .op(Op::prefix(Rule::not_op))
        .op(Op::infix(Rule::eq, Assoc::Left)
            | Op::infix(Rule::ne, Assoc::Left)
            | Op::infix(Rule::lt, Assoc::Left)
            | Op::infix(Rule::le, Assoc::Left)
            | Op::infix(Rule::gt, Assoc::Left)
            | Op::infix(Rule::ge, Assoc::Left)
            | Op::infix(Rule::in_op, Assoc::Left)
            | Op::infix(Rule::not_in, Assoc::Left))
        .op(Op::infix(Rule::add, Assoc::Left) | Op::infix(Rule::sub, Assoc::Left))
        .op(Op::infix(Rule::mul, Assoc::Left)
            | Op::infix(Rule::div, Assoc::Left)
            | Op::infix(Rule::floordiv, Assoc::Left)
            | Op::infix(Rule::rem, Assoc::Left))
        .op(Op::prefix(Rule::neg))
});

/// Parses one condition.
pub fn parse_expr(text: &str) -> Result<Expr, SyntaxError> {
    if text.len() > MAX_EXPR_LEN {
        return Err(SyntaxError {
            message: format!(
                "expression is {} bytes long; the limit is {MAX_EXPR_LEN}",
                text.len()
            ),
            span: Span { start: 0, end: 0 },
        });
    }
    check_depth(text)?;
    let mut pairs = ConditionParser::parse(Rule::condition, text).map_err(convert_error)?;
    let condition = pairs.next().expect("grammar: condition");
    let expr = condition
        .into_inner()
        .next()
        .expect("grammar: condition holds an expr");
    build_expr(expr)
}

/// Rejects nesting deeper than [`MAX_DEPTH`] with a cheap lexical scan, so that the recursive
/// AST builder below can never exhaust a caller's stack.
fn check_depth(text: &str) -> Result<(), SyntaxError> {
    let mut depth = 0usize;
    let mut prefix_run = 0usize;
    let mut in_str: Option<u8> = None;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if let Some(q) = in_str {
            if b == q {
                in_str = None;
            }
            i += 1;
            continue;
        }
        match b {
            b'"' | b'\'' => in_str = Some(b),
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth = depth.saturating_sub(1),
            b'-' => prefix_run += 1,
            b'n' if text[i..].starts_with("not")
                && !text[i + 3..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')) =>
            {
                prefix_run += 1;
                i += 3;
                continue;
            }
            b' ' | b'\t' | b'\r' | b'\n' => {}
            _ => prefix_run = 0,
        }
        if depth + prefix_run > MAX_DEPTH {
            return Err(SyntaxError {
                message: format!("expression nests deeper than {MAX_DEPTH} levels"),
                span: Span {
                    start: i,
                    end: i + 1,
                },
            });
        }
        i += 1;
    }
    Ok(())
}

fn rule_name(rule: &Rule) -> &'static str {
    match rule {
        Rule::expr | Rule::condition => "an expression",
        Rule::or_op => "`or`",
        Rule::and_op => "`and`",
        Rule::not_op => "`not`",
        Rule::in_op => "`in`",
        Rule::not_in => "`not in`",
        Rule::eq => "`==`",
        Rule::ne => "`!=`",
        Rule::le => "`<=`",
        Rule::ge => "`>=`",
        Rule::lt => "`<`",
        Rule::gt => "`>`",
        Rule::add => "`+`",
        Rule::sub => "`-`",
        Rule::mul => "`*`",
        Rule::div => "`/`",
        Rule::floordiv => "`//`",
        Rule::rem => "`%`",
        Rule::neg => "`-`",
        Rule::path | Rule::ident => "a fact name",
        Rule::call => "a function call",
        Rule::version => "a version",
        Rule::float => "a number",
        Rule::int => "an integer",
        Rule::string => "a string",
        Rule::boolean => "`true` or `false`",
        Rule::null => "`null`",
        Rule::list => "a list",
        Rule::EOI => "the end of the expression",
        _ => "a token",
    }
}

fn convert_error(e: pest::error::Error<Rule>) -> SyntaxError {
    use pest::error::{ErrorVariant, InputLocation};
    let span = match e.location {
        InputLocation::Pos(p) => Span { start: p, end: p },
        InputLocation::Span((s, t)) => Span { start: s, end: t },
    };
    let message = match &e.variant {
        ErrorVariant::ParsingError {
            positives,
            negatives,
        } => {
            let mut names: Vec<&str> = positives.iter().map(rule_name).collect();
            names.sort_unstable();
            names.dedup();
            if names.is_empty() && !negatives.is_empty() {
                "unexpected token".to_string()
            } else if names.len() > 6 {
                "expected an operator, `)` or the end of the expression".to_string()
            } else {
                format!("expected {}", names.join(", "))
            }
        }
        ErrorVariant::CustomError { message } => message.clone(),
    };
    SyntaxError { message, span }
}

fn span_of(pair: &Pair<Rule>) -> Span {
    let s = pair.as_span();
    Span {
        start: s.start(),
        end: s.end(),
    }
}

fn build_expr(pair: Pair<Rule>) -> Result<Expr, SyntaxError> {
    fold(pair.into_inner())
}

fn fold(pairs: Pairs<Rule>) -> Result<Expr, SyntaxError> {
    PRATT
        .map_primary(build_primary)
        .map_prefix(|op, rhs| {
            let rhs = rhs?;
            let span = span_of(&op).join(rhs.span);
            let kind = match op.as_rule() {
                Rule::not_op => ExprKind::Not(Box::new(rhs)),
                _ => match rhs.kind {
                    // Fold `-1` into a literal so that windows read naturally.
                    ExprKind::Int(v) => ExprKind::Int(-v),
                    ExprKind::Float(v) | ExprKind::Decimal(v, _) => ExprKind::Float(-v),
                    _ => ExprKind::Neg(Box::new(rhs)),
                },
            };
            Ok(Expr::new(kind, span))
        })
        .map_infix(|lhs, op, rhs| {
            let (lhs, rhs) = (lhs?, rhs?);
            let span = lhs.span.join(rhs.span);
            let op_span = span_of(&op);
            let cmp = match op.as_rule() {
                Rule::eq => Some(CmpOp::Eq),
                Rule::ne => Some(CmpOp::Ne),
                Rule::lt => Some(CmpOp::Lt),
                Rule::le => Some(CmpOp::Le),
                Rule::gt => Some(CmpOp::Gt),
                Rule::ge => Some(CmpOp::Ge),
                Rule::in_op => Some(CmpOp::In),
                Rule::not_in => Some(CmpOp::NotIn),
                _ => None,
            };
            if let Some(cmp) = cmp {
                // Python-style chains: `a < b <= c`.
                return Ok(match lhs.kind {
                    ExprKind::Compare(first, mut rest) => {
                        rest.push((cmp, op_span, rhs));
                        Expr::new(ExprKind::Compare(first, rest), span)
                    }
                    _ => Expr::new(
                        ExprKind::Compare(Box::new(lhs), vec![(cmp, op_span, rhs)]),
                        span,
                    ),
                });
            }
            let kind = match op.as_rule() {
                Rule::or_op => ExprKind::Or(Box::new(lhs), Box::new(rhs)),
                Rule::and_op => ExprKind::And(Box::new(lhs), Box::new(rhs)),
                Rule::add => ExprKind::Arith(ArithOp::Add, Box::new(lhs), Box::new(rhs)),
                Rule::sub => ExprKind::Arith(ArithOp::Sub, Box::new(lhs), Box::new(rhs)),
                Rule::mul => ExprKind::Arith(ArithOp::Mul, Box::new(lhs), Box::new(rhs)),
                Rule::div => ExprKind::Arith(ArithOp::Div, Box::new(lhs), Box::new(rhs)),
                Rule::floordiv => ExprKind::Arith(ArithOp::FloorDiv, Box::new(lhs), Box::new(rhs)),
                _ => ExprKind::Arith(ArithOp::Rem, Box::new(lhs), Box::new(rhs)),
            };
            Ok(Expr::new(kind, span))
        })
        .parse(pairs)
}

fn build_primary(pair: Pair<Rule>) -> Result<Expr, SyntaxError> {
    let span = span_of(&pair);
    let text = pair.as_str();
    let bad_number = |what: &str| SyntaxError {
        message: format!("{what} `{text}` is out of range"),
        span,
    };
    let kind = match pair.as_rule() {
        Rule::expr => {
            let inner = build_expr(pair)?;
            // Parentheses: keep a group node with the span of the parenthesised text.
            return Ok(Expr::new(
                ExprKind::Group(Box::new(inner.clone())),
                inner.span,
            ));
        }
        Rule::int => ExprKind::Int(text.parse().map_err(|_| bad_number("integer"))?),
        Rule::float => {
            let v: f64 = text.parse().map_err(|_| bad_number("number"))?;
            if !v.is_finite() {
                return Err(bad_number("number"));
            }
            match Version::parse(text) {
                Some(ver) if text.bytes().all(|b| b.is_ascii_digit() || b == b'.') => {
                    ExprKind::Decimal(v, ver)
                }
                _ => ExprKind::Float(v),
            }
        }
        Rule::version => ExprKind::Version(Version::parse(text).ok_or_else(|| SyntaxError {
            message: format!("`{text}` is not a valid version"),
            span,
        })?),
        Rule::string => {
            let inner = pair.into_inner().next().map(|p| p.as_str()).unwrap_or("");
            ExprKind::Str(inner.to_string())
        }
        Rule::boolean => ExprKind::Bool(text.starts_with('t')),
        Rule::null => ExprKind::Null,
        Rule::path => ExprKind::Path(text.to_string()),
        Rule::list => ExprKind::List(
            pair.into_inner()
                .map(build_expr)
                .collect::<Result<_, _>>()?,
        ),
        Rule::call => {
            let mut inner = pair.into_inner();
            let name = inner.next().expect("grammar: call has a name").as_str();
            let args = inner.map(build_expr).collect::<Result<_, _>>()?;
            ExprKind::Call(name.to_string(), args)
        }
        other => unreachable!("grammar: unexpected primary {other:?}"),
    };
    Ok(Expr::new(kind, span))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Canonical, fully parenthesised rendering, to test structure without spans.
    fn show(e: &Expr) -> String {
        match &e.kind {
            ExprKind::Int(v) => v.to_string(),
            ExprKind::Float(v) | ExprKind::Decimal(v, _) => format!("{v:?}"),
            ExprKind::Bool(v) => v.to_string(),
            ExprKind::Str(s) => format!("{s:?}"),
            ExprKind::Version(v) => format!("v{v}"),
            ExprKind::Null => "null".into(),
            ExprKind::List(xs) => {
                format!("[{}]", xs.iter().map(show).collect::<Vec<_>>().join(", "))
            }
            ExprKind::Path(p) => p.clone(),
            ExprKind::Call(n, xs) => {
                format!(
                    "{n}({})",
                    xs.iter().map(show).collect::<Vec<_>>().join(", ")
                )
            }
            ExprKind::Not(x) => format!("(not {})", show(x)),
            ExprKind::Neg(x) => format!("(-{})", show(x)),
            ExprKind::And(a, b) => format!("({} and {})", show(a), show(b)),
            ExprKind::Or(a, b) => format!("({} or {})", show(a), show(b)),
            ExprKind::Arith(op, a, b) => format!("({} {} {})", show(a), op.symbol(), show(b)),
            ExprKind::Compare(first, rest) => {
                let mut s = format!("({}", show(first));
                for (op, _, e) in rest {
                    s.push_str(&format!(" {} {}", op.symbol(), show(e)));
                }
                s + ")"
            }
            ExprKind::Group(x) => show(x),
        }
    }

    fn p(s: &str) -> String {
        show(&parse_expr(s).unwrap_or_else(|e| panic!("{s}: {e}")))
    }

    #[test]
    fn precedence_follows_python() {
        assert_eq!(p("a or b and c"), "(a or (b and c))");
        assert_eq!(p("not a == b"), "(not (a == b))");
        assert_eq!(p("a + b * c % 8 == 0"), "((a + ((b * c) % 8)) == 0)");
        assert_eq!(p("not a and b"), "((not a) and b)");
        assert_eq!(p("-x + 1"), "((-x) + 1)");
    }

    #[test]
    fn chained_comparison_is_one_chain() {
        assert_eq!(p("256 < head_dim_qk <= 512"), "(256 < head_dim_qk <= 512)");
        assert_eq!(p("(a < b) == c"), "((a < b) == c)");
    }

    #[test]
    fn literals() {
        assert_eq!(p("9.19.0"), "v9.19.0");
        assert_eq!(p("1.29.0rc1"), "v1.29.0rc1");
        assert_eq!(p("0.1"), "0.1");
        assert_eq!(p("-1"), "-1");
        assert_eq!(p("'p2p'"), "\"p2p\"");
        assert_eq!(p("[1, 2, 3,]"), "[1, 2, 3]");
        assert_eq!(p("null"), "null");
        assert_eq!(p("x not in ['a', \"b\"]"), "(x not in [\"a\", \"b\"])");
        assert_eq!(
            p("gcd(32, round_up(d, 16) // 2)"),
            "gcd(32, (round_up(d, 16) // 2))"
        );
        assert_eq!(p("window.left != -1"), "(window.left != -1)");
    }

    #[test]
    fn keywords_are_not_names() {
        assert!(parse_expr("and").is_err());
        assert_eq!(p("notable or android"), "(notable or android)");
        assert_eq!(p("index in [1]"), "(index in [1])");
    }

    #[test]
    fn errors_carry_spans() {
        let e = parse_expr("head_dim >> 3").unwrap_err();
        assert_eq!(e.span.start, 10, "{e:?}");
        let e = parse_expr("a and").unwrap_err();
        assert_eq!(e.span.start, 5);
        assert!(parse_expr("(a").is_err());
        assert!(parse_expr("1.2.3.4").is_err());
        assert!(parse_expr("'unterminated").is_err());
        assert!(parse_expr("").is_err());
    }

    #[test]
    fn limits_are_errors_not_crashes() {
        let deep = format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(parse_expr(&deep).is_err());
        let nots = format!("{}true", "not ".repeat(1000));
        assert!(parse_expr(&nots).is_err());
        let long = "a or ".repeat(2000) + "b";
        assert!(parse_expr(&long).unwrap_err().message.contains("limit"));
        let ok = format!("{}1{}", "(".repeat(30), ")".repeat(30));
        assert!(parse_expr(&ok).is_ok());
    }
}

//! Conditions as explanations show them: every reference to a definition of the pack that is
//! not public (`public_defs:` in pack.yaml) is replaced by the condition it stands for, so a
//! reader meets only names they can look up (facts, public definitions, the language's own
//! functions and keywords). `fa4_inst` is shown as `flash_attn_versions.v4 != null`.
//!
//! The replacement is textual, at the spans of the parsed condition: the rest of the
//! condition stays as written (on one line). A replacement is parenthesised where the
//! language's precedence would read it otherwise, and for the reader where an `and` meets an
//! `or` or `not` meets a compound condition (`not (flash_attn_versions.v4 != null)`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::lang::{Expr, ExprKind, Span, parse_expr};
use crate::policy::Policy;

/// The public definitions of `policy` as a Markdown table (name, meaning, what it stands for
/// with the internal definitions written out), or a sentence saying it has none: what
/// `attn-policy facts` prints after the facts, and docs/definitions.md per embedded pack.
pub fn definitions_table(policy: &Policy) -> String {
    let public: Vec<_> = policy
        .definitions
        .iter()
        .filter_map(|d| d.public.as_ref().map(|m| (d, m)))
        .collect();
    if public.is_empty() {
        return format!(
            "Pack `{}` has no public definitions: explanations show each of its definitions as \
             the condition it stands for.\n",
            policy.name
        );
    }
    let mut out = String::from("| definition | meaning | stands for |\n|---|---|---|\n");
    for (d, meaning) in public {
        out.push_str(&format!(
            "| `{}` | {} | `{}` |\n",
            d.name,
            meaning.replace('|', "\\|"),
            d.shown
        ));
    }
    out
}

/// Expands the non-public definitions of one pack; each definition is expanded once.
pub(crate) struct Shower<'a> {
    /// Definition name -> its source as written.
    sources: &'a BTreeMap<String, String>,
    public: &'a BTreeSet<String>,
    /// Shown bodies, with the operator at their root.
    done: HashMap<String, (String, Top)>,
    /// Definitions being expanded (a cycle was reported at type-check; it is left by name).
    open: BTreeSet<String>,
}

/// The operator at the root of a shown condition (a written-out definition may be longer
/// than the parser takes, so it is not parsed again).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Top {
    /// A name, a literal, a call, a list, parentheses.
    Atom,
    /// `not` or unary minus.
    Unary,
    And,
    Or,
    Arith,
    Compare,
}

impl<'a> Shower<'a> {
    pub(crate) fn new(
        sources: &'a BTreeMap<String, String>,
        public: &'a BTreeSet<String>,
    ) -> Shower<'a> {
        Shower {
            sources,
            public,
            done: HashMap::new(),
            open: BTreeSet::new(),
        }
    }

    /// `src` on one line (comments dropped, whitespace collapsed outside string literals),
    /// with every non-public definition replaced by what it stands for. A condition that does
    /// not parse (it was reported at load) is returned on one line, unexpanded.
    pub(crate) fn show(&mut self, src: &str) -> String {
        self.show_top(src).0
    }

    fn show_top(&mut self, src: &str) -> (String, Top) {
        let src = one_line(src);
        let Ok(ast) = parse_expr(&src) else {
            return (src, Top::Atom);
        };
        let mut edits: Vec<(Span, String)> = Vec::new();
        let top = self.walk(&ast, Ctx::Bare, &mut edits);
        edits.sort_by_key(|(s, _)| s.start);
        let mut out = String::with_capacity(src.len());
        let mut at = 0;
        for (span, text) in edits {
            out.push_str(&src[at..span.start]);
            out.push_str(&text);
            at = span.end;
        }
        out.push_str(&src[at..]);
        (out, top)
    }

    /// The shown body of definition `name`, or `None` when it stays by name (public, unknown,
    /// or part of a cycle).
    fn body(&mut self, name: &str) -> Option<(String, Top)> {
        if self.public.contains(name) || self.open.contains(name) {
            return None;
        }
        if let Some(b) = self.done.get(name) {
            return Some(b.clone());
        }
        let src = self.sources.get(name)?;
        self.open.insert(name.to_string());
        let body = self.show_top(src);
        self.open.remove(name);
        self.done.insert(name.to_string(), body.clone());
        Some(body)
    }

    /// Collects the replacements under `e`, which stands in `ctx`; returns the operator at
    /// the root of `e` as shown.
    fn walk(&mut self, e: &Expr, ctx: Ctx, edits: &mut Vec<(Span, String)>) -> Top {
        match &e.kind {
            ExprKind::Path(p) => match self.body(p) {
                Some((body, top)) => {
                    if needs_parens(ctx, top) {
                        edits.push((e.span, format!("({body})")));
                        Top::Atom
                    } else {
                        edits.push((e.span, body));
                        top
                    }
                }
                None => Top::Atom,
            },
            ExprKind::List(items) | ExprKind::Call(_, items) => {
                for x in items {
                    self.walk(x, Ctx::Bare, edits);
                }
                Top::Atom
            }
            ExprKind::Group(x) => {
                self.walk(x, Ctx::Bare, edits);
                Top::Atom
            }
            ExprKind::Not(x) | ExprKind::Neg(x) => {
                self.walk(x, Ctx::Unary, edits);
                Top::Unary
            }
            ExprKind::And(a, b) => {
                self.walk(a, Ctx::And, edits);
                self.walk(b, Ctx::And, edits);
                Top::And
            }
            ExprKind::Or(a, b) => {
                self.walk(a, Ctx::Or, edits);
                self.walk(b, Ctx::Or, edits);
                Top::Or
            }
            ExprKind::Arith(_, a, b) => {
                self.walk(a, Ctx::Arith, edits);
                self.walk(b, Ctx::Arith, edits);
                Top::Arith
            }
            ExprKind::Compare(first, links) => {
                self.walk(first, Ctx::Compare, edits);
                for (_, _, x) in links {
                    self.walk(x, Ctx::Compare, edits);
                }
                Top::Compare
            }
            ExprKind::Int(_)
            | ExprKind::Float(_)
            | ExprKind::Decimal(..)
            | ExprKind::Bool(_)
            | ExprKind::Str(_)
            | ExprKind::Version(_)
            | ExprKind::Null => Top::Atom,
        }
    }
}

/// Where a reference stands: what binds it.
#[derive(Clone, Copy)]
enum Ctx {
    /// Nothing: the whole condition, inside parentheses, a call argument, a list element.
    Bare,
    /// The operand of `not` or unary minus.
    Unary,
    And,
    Or,
    /// An operand of a comparison (`==`, `<`, `in`, ...; a chain `a < b <= c` included).
    Compare,
    Arith,
}

/// Whether a body with `top` at its root needs parentheses in `ctx`: wherever the language's
/// precedence (or a comparison chain) would read it otherwise, and, for the reader, an `and`
/// inside an `or` and anything compound under `not`.
fn needs_parens(ctx: Ctx, top: Top) -> bool {
    match ctx {
        Ctx::Bare => false,
        Ctx::Unary | Ctx::Arith => top != Top::Atom,
        Ctx::And => top == Top::Or,
        Ctx::Or => top == Top::And,
        Ctx::Compare => !matches!(top, Top::Atom | Top::Arith),
    }
}

/// `src` on one line: `#` comments dropped, runs of whitespace outside string literals made
/// one space (none after an opening or before a closing bracket), trimmed. String literals (`"..."`, `'...'`; no escapes, no newlines) are kept.
pub(crate) fn one_line(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut quote: Option<char> = None;
    let mut comment = false;
    let mut space = false;
    for c in src.chars() {
        if comment {
            if c == '\n' {
                comment = false;
                space = true;
            }
            continue;
        }
        if let Some(q) = quote {
            out.push(c);
            if c == q {
                quote = None;
            }
            continue;
        }
        if c.is_whitespace() {
            space = true;
            continue;
        }
        if c == '#' {
            comment = true;
            continue;
        }
        // No space inside brackets or before a comma: `( a )` comes out `(a)`.
        if space && !out.is_empty() && !out.ends_with(['(', '[']) && !matches!(c, ')' | ']' | ',') {
            out.push(' ');
        }
        space = false;
        if c == '"' || c == '\'' {
            quote = Some(c);
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(defs: &[(&str, &str)], public: &[&str], src: &str) -> String {
        let sources: BTreeMap<String, String> = defs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let public: BTreeSet<String> = public.iter().map(|s| s.to_string()).collect();
        Shower::new(&sources, &public).show(src)
    }

    #[test]
    fn private_definitions_are_replaced_by_what_they_stand_for() {
        let defs = [
            ("fa4_inst", "flash_attn_versions.v4 != null"),
            ("fp8dpa", "fp8 and fp8_recipe.fp8_dpa == true"),
            (
                "rcp_mx",
                "fp8dpa and fp8_recipe.recipe == \"MXFP8BlockScaling\"",
            ),
            ("hmax", "max(head_dim_qk, head_dim_v)"),
            ("sum", "head_dim_qk + head_dim_v"),
            ("cp", "context_parallel"),
            ("big", "sm < 80 or sm > 100"),
        ];
        let cases = [
            // the whole condition: no parentheses
            ("fa4_inst", "flash_attn_versions.v4 != null"),
            // under `not`, and an `and` under an `or`: parenthesised
            ("not fp8dpa", "not (fp8 and fp8_recipe.fp8_dpa == true)"),
            ("not fa4_inst", "not (flash_attn_versions.v4 != null)"),
            (
                "sm < 80 or fp8dpa",
                "sm < 80 or (fp8 and fp8_recipe.fp8_dpa == true)",
            ),
            // an `and` under an `and` reads the same without them; nested definitions
            (
                "return_max_logit and fp8dpa",
                "return_max_logit and fp8 and fp8_recipe.fp8_dpa == true",
            ),
            (
                "rcp_mx and sm < 100",
                "fp8 and fp8_recipe.fp8_dpa == true and fp8_recipe.recipe == \"MXFP8BlockScaling\" and sm < 100",
            ),
            // an `or` under an `and`, a comparison under a comparison, arithmetic under
            // arithmetic or a minus
            ("big and sm == 90", "(sm < 80 or sm > 100) and sm == 90"),
            (
                "fa4_inst == true",
                "(flash_attn_versions.v4 != null) == true",
            ),
            ("sum * 2 > 8", "(head_dim_qk + head_dim_v) * 2 > 8"),
            ("-sum < 0", "-(head_dim_qk + head_dim_v) < 0"),
            // arithmetic under a comparison binds tighter (chains included)
            ("256 < sum <= 512", "256 < head_dim_qk + head_dim_v <= 512"),
            // atomic replacements and unbound positions: as is
            ("hmax > 256", "max(head_dim_qk, head_dim_v) > 256"),
            ("cp and sm >= 90", "context_parallel and sm >= 90"),
            ("(fp8dpa)", "(fp8 and fp8_recipe.fp8_dpa == true)"),
            (
                "if(fp8dpa, 1, 2) == 1",
                "if(fp8 and fp8_recipe.fp8_dpa == true, 1, 2) == 1",
            ),
            (
                "[sum, 1] == [1, 1]",
                "[head_dim_qk + head_dim_v, 1] == [1, 1]",
            ),
            // fields of facts, string literals and keywords are not definitions
            (
                "window.left == -1 and qkv_layout in [\"cp\", 'fp8dpa']",
                "window.left == -1 and qkv_layout in [\"cp\", 'fp8dpa']",
            ),
            // multi-line and commented conditions come out on one line
            (
                "fa4_inst   # FA4\n  or sm == 90",
                "flash_attn_versions.v4 != null or sm == 90",
            ),
        ];
        for (src, want) in cases {
            assert_eq!(show(&defs, &[], src), want, "{src}");
        }
    }

    #[test]
    fn public_definitions_stay_by_name() {
        let defs = [
            ("q_thd", "qkv_layout in [\"t3hd\", \"th3d\"]"),
            ("thd_any", "q_thd or kv_thd"),
            ("kv_thd", "qkv_layout in [\"t3hd\"]"),
        ];
        assert_eq!(
            show(&defs, &["q_thd"], "thd_any and sm >= 90"),
            "(q_thd or qkv_layout in [\"t3hd\"]) and sm >= 90"
        );
        assert_eq!(
            show(&defs, &["thd_any"], "thd_any and sm >= 90"),
            "thd_any and sm >= 90"
        );
    }

    #[test]
    fn a_written_out_definition_longer_than_the_parser_takes_is_still_parenthesised() {
        let long: Vec<String> = (0..400).map(|i| format!("sm == {i}")).collect();
        let long = long.join(" or ");
        assert!(long.len() > crate::lang::parse::MAX_EXPR_LEN);
        let defs = [("many", "few or sm == 999"), ("few", long.as_str())];
        assert_eq!(
            show(&defs, &[], "not many and cp"),
            format!("not ({long} or sm == 999) and cp")
        );
    }

    #[test]
    fn a_cycle_is_left_by_name() {
        let defs = [("a", "b or sm == 90"), ("b", "a")];
        assert_eq!(show(&defs, &[], "a"), "a or sm == 90");
    }

    #[test]
    fn one_line_keeps_literals() {
        assert_eq!(
            one_line("  a  ==  \"x  #y\"  # c\n and b "),
            "a == \"x  #y\" and b"
        );
        assert_eq!(
            one_line("not x and (\n  a or (\n    b in [\n 1 , 2 ]\n  )\n)"),
            "not x and (a or (b in [1, 2]))"
        );
    }
}

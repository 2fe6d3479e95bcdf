//! Every diagnostic code, as a type: its stable name (`E-TYPE`), severity, one-line summary and
//! long description. `docs/diagnostics.md` is generated from [`Code::markdown`] (a test fails
//! when it is stale) and `attn-policy explain-code CODE` prints [`Code::long`].

use serde::Serialize;
use strum::{EnumIter, EnumString, IntoEnumIterator, IntoStaticStr};

/// How bad a diagnostic is (each [`Code`] has one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Error,
}

impl Severity {
    pub fn word(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

/// A diagnostic code. The `E-` codes are load errors (the pack does not load); the `W-` codes
/// are warnings from the loader or from `attn-policy check`'s lints.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, EnumIter, EnumString, IntoStaticStr,
)]
pub enum Code {
    #[strum(serialize = "E-IO")]
    Io,
    #[strum(serialize = "E-YAML")]
    Yaml,
    #[strum(serialize = "E-FAMILY")]
    Family,
    #[strum(serialize = "E-SYNTAX")]
    Syntax,
    #[strum(serialize = "E-TYPE")]
    Type,
    #[strum(serialize = "E-NAME")]
    Name,
    #[strum(serialize = "E-DEF")]
    Def,
    #[strum(serialize = "E-DUP-BACKEND")]
    DupBackend,
    #[strum(serialize = "E-DUP-RULE")]
    DupRule,
    #[strum(serialize = "E-RULE")]
    Rule,
    #[strum(serialize = "E-VARIANTS")]
    Variants,
    #[strum(serialize = "E-PREF")]
    Pref,
    #[strum(serialize = "E-EXECUTOR")]
    Executor,
    #[strum(serialize = "W-REASON")]
    Reason,
    #[strum(serialize = "W-NEVER-FIRES")]
    NeverFires,
    #[strum(serialize = "W-ALWAYS-FIRES")]
    AlwaysFires,
    #[strum(serialize = "W-SUBSUMED")]
    Subsumed,
    #[strum(serialize = "W-UNSELECTABLE")]
    Unselectable,
    #[strum(serialize = "W-CAPABILITY")]
    Capability,
    #[strum(serialize = "W-UNKNOWN-CAPABILITY")]
    UnknownCapability,
    #[strum(serialize = "W-OBSOLETE-WORKAROUND")]
    ObsoleteWorkaround,
    #[strum(serialize = "W-DEAD-EXECUTOR")]
    DeadExecutor,
    #[strum(serialize = "W-NO-EXECUTOR")]
    NoExecutor,
    #[strum(serialize = "W-ANALYSIS-INCOMPLETE")]
    AnalysisIncomplete,
}

impl Code {
    /// The stable name (`E-TYPE`).
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The code of a stable name, case-insensitively (`e-type` works).
    pub fn parse(name: &str) -> Option<Code> {
        name.to_ascii_uppercase().parse().ok()
    }

    pub fn severity(self) -> Severity {
        if self.name().starts_with("E-") {
            Severity::Error
        } else {
            Severity::Warning
        }
    }

    /// Who reports it: the loader (every load) or `attn-policy check` (the lints).
    pub fn reported_by(self) -> &'static str {
        use Code::*;
        match self {
            NeverFires | AlwaysFires | Subsumed | Unselectable | Capability | UnknownCapability
            | ObsoleteWorkaround | DeadExecutor | NoExecutor | AnalysisIncomplete => "check",
            _ => "loader",
        }
    }

    /// One line: what the code means.
    pub fn summary(self) -> &'static str {
        use Code::*;
        match self {
            Io => "a pack or overlay file cannot be read",
            Yaml => "a file is not valid YAML of the expected shape",
            Family => "pack.yaml names an unknown pack family",
            Syntax => "an expression does not parse",
            Type => "an expression is ill-typed against the pack family's facts",
            Name => "a name (fact, backend, variant, definition) is unknown",
            Def => "a definition shadows a fact, or a public one has no meaning",
            DupBackend => "a backend is defined twice",
            DupRule => "two rules share an id",
            Rule => "a rule is malformed (backend:, variants:, kind:)",
            Variants => "a backend has more than 63 variants",
            Pref => "a preference entry is malformed",
            Executor => "an executor chain is malformed or names an unknown executor",
            Reason => "a rule has an empty reason",
            NeverFires => "a rule's condition is false for every input",
            AlwaysFires => "a rule's condition is true for every input",
            Subsumed => "whenever a rule fires, another rule of the same backend fires too",
            Unselectable => "a backend is never selected",
            Capability => "a backend neither reads a capability's facts nor declares it",
            UnknownCapability => "`supports:` names a capability the checker does not know",
            ObsoleteWorkaround => "a workaround's `until:` holds for every supported version",
            DeadExecutor => "an executor-chain entry can never run what its backend admits",
            NoExecutor => "inputs where a backend is selected but no chain entry can run",
            AnalysisIncomplete => "a search ran out of budget; the lint it served was skipped",
        }
    }

    /// The long description: why it matters and how to fix it.
    pub fn long(self) -> &'static str {
        use Code::*;
        match self {
            Io => {
                "The loader could not read a file the pack names (pack.yaml, a backend file \
                   listed under `backends:`, a layer file, or an overlay given with --overlay). \
                   The message carries the operating system's reason. Embedded packs never \
                   fail this way; check the path of a pack folder or overlay."
            }
            Yaml => {
                "A file is not YAML, or its YAML does not have the shape the format expects \
                     (an unknown key, a missing `when:`, a list where a string belongs). Keys \
                     are checked strictly so a typo is an error rather than an ignored key. \
                     docs/rule-language.md describes every file's shape."
            }
            Family => {
                "`family:` in pack.yaml selects whose facts the rules read (`te` for \
                       TransformerEngine's AttentionParams, the default). The named family is \
                       not compiled in; the message lists the families that are."
            }
            Syntax => {
                "An expression in `when:`, `until:`, `applicable:`, `value:`, a \
                       definition or a preference condition does not parse. The caret points \
                       at the first character the grammar could not take; \
                       docs/rule-language.md has the grammar."
            }
            Type => {
                "An expression parses but is ill-typed: comparing a version with an int, \
                     `in` over a list of another type, arithmetic on a boolean, an enum value \
                     outside its domain, or a nullable fact compared without a null test. The \
                     label names the operand and the types involved."
            }
            Name => {
                "A name does not resolve: a fact the pack family does not have, a backend \
                     that no backend file defines (in a layer rule or preference order), a \
                     variant the backend does not declare, or an unknown definition (in a \
                     condition or under `public_defs:`). A \
                     did-you-mean suggestion follows when a close name exists."
            }
            Def => {
                "A definition under `defs:` has the name of a fact, so every use of that \
                    name would be ambiguous: rename the definition. Or an entry of \
                    `public_defs:` gives no meaning: explanations name a public definition, so \
                    say in a sentence what it means (docs/rule-language.md, \"Definitions in \
                    explanations\")."
            }
            DupBackend => {
                "Two backend files define the same `backend:` name. Each backend is \
                           defined once; merge the files or rename one."
            }
            DupRule => {
                "Two rules share an id. Rule ids are how decisions, coverage and diffs \
                        name a rule, so they must be unique across the pack and its overlays; \
                        the message gives the first definition's location."
            }
            Rule => {
                "A rule is malformed: a backend file's rule names `backend:` (it applies to \
                     its own backend), a layer rule names no backend or both `backend:` and \
                     `backends:`, `variants:` is given with several backends, or `kind:` is \
                     neither `decline` nor `switch`."
            }
            Variants => {
                "A backend may have at most 63 variants (a decision keeps one bit per \
                         variant). Split the backend."
            }
            Pref => {
                "A preference entry is malformed: its order names a backend twice, its \
                     condition reads a probe fact (an order must not wait on a probe), or the \
                     pack has no preference entry at all."
            }
            Executor => {
                "An `executors:` entry in pack.yaml is malformed: it names a backend \
                         or variant the pack does not have, lists an executor twice, gives the \
                         same backend (and variant) two chains, or names an executor the \
                         executor catalogue does not know (the catalogue lists the executors \
                         this build and its host provide: `attn-policy executors`); or its \
                         `if_admitted:` list names an executor that is not in the chain, or \
                         one whose catalogue entry states no `admits` condition for the pack's \
                         family (then where it is admitted cannot be known; docs/executors.md)."
            }
            Reason => {
                "A rule's `reason:` is empty. The reason is what a user reads when the \
                       rule declines their configuration; say what is unsupported and what to \
                       do instead."
            }
            NeverFires => {
                "The rule's condition is false for every input of the pack family \
                           (proved over the pack's equivalence classes), so the rule never \
                           declines anything: it is dead code, or its condition has a bug \
                           (a misspelled enum value, an impossible range)."
            }
            AlwaysFires => {
                "The rule's condition is true for every input, so its backend (or \
                            variants) can never be selected. Usually a negation or range \
                            mistake; the FROST pull request had one (a shadowed local)."
            }
            Subsumed => {
                "Whenever this rule fires, another rule of the same backend, layer and \
                         kind (declining the same variants or more) fires too, so removing it \
                         changes no decision. Keep it only if its reason is more helpful, and \
                         then say so in a comment."
            }
            Unselectable => {
                "The backend is never selected: no input makes it eligible, or \
                             wherever it is eligible another backend comes first in every \
                             preference order that applies."
            }
            Capability => {
                "A backend's rules never read the facts of a capability (FP8, \
                           context parallelism, KV cache, ...) and its `supports:` does not \
                           declare it, so every such input is silently admitted. Declare the \
                           capability in `supports:` or add the rule that declines it; the \
                           capability -> facts table is in docs/analysis.md."
            }
            UnknownCapability => {
                "`supports:` names a capability the checker does not know; \
                                  the help lists the known ones."
            }
            ObsoleteWorkaround => {
                "The rule's `until:` condition holds for every input the \
                                   pack's `min_versions:` allow, so the workaround it encodes \
                                   is no longer needed and the rule can be deleted."
            }
            DeadExecutor => {
                "An executor-chain entry can never run anything its backend \
                             admits: the executor's manifest refuses every input where the \
                             backend is eligible (proved exactly). Remove the entry or fix \
                             the backend's rules."
            }
            NoExecutor => {
                "There are inputs where the backend is selected but no entry of its \
                           executor chain admits the problem, so such a decision cannot run \
                           here (`run` exits 4). The example shows one such input; extend the \
                           chain or decline those inputs with a rule."
            }
            AnalysisIncomplete => {
                "A search behind one lint ran out of its node budget, so the \
                                   lint was skipped rather than answered; nothing is claimed \
                                   either way. Raise --budget."
            }
        }
    }

    /// The documentation page: a table of every code (`docs/diagnostics.md`).
    pub fn markdown() -> String {
        let mut out = String::from(
            "# Diagnostic codes\n\n\
             Generated from `src/diag/code.rs` (a test fails when this file is stale). \
             `attn-policy explain-code CODE` prints one code's description.\n\n\
             | code | severity | reported by | meaning |\n|---|---|---|---|\n",
        );
        for c in Code::iter() {
            out.push_str(&format!(
                "| [`{}`](#{}) | {} | {} | {} |\n",
                c.name(),
                c.name().to_ascii_lowercase(),
                c.severity().word(),
                c.reported_by(),
                c.summary()
            ));
        }
        for c in Code::iter() {
            out.push_str(&format!("\n## {}\n\n{}\n", c.name(), c.long()));
        }
        out
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `diag.code == "W-SUBSUMED"`: codes compare with their stable names.
impl PartialEq<&str> for Code {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_carry_their_severity() {
        for c in Code::iter() {
            assert_eq!(Code::parse(c.name()), Some(c));
            assert_eq!(Code::parse(&c.name().to_lowercase()), Some(c));
            let expected = if c.name().starts_with("E-") {
                Severity::Error
            } else {
                Severity::Warning
            };
            assert_eq!(c.severity(), expected);
            assert!(!c.long().is_empty() && !c.summary().is_empty());
        }
        assert_eq!(Code::parse("E-NOPE"), None);
    }
}

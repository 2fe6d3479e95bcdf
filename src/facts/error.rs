//! Input errors: one error type for every entry point that reads facts (files, flags, presets,
//! corpus records, the bindings), and the did-you-mean hint their messages carry. A file of its
//! own so that the schema (whose readers return it) and the reader name it without naming each
//! other.

/// What is wrong with an input (the `kind` of an [`InputError`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InputErrorKind {
    /// The text is neither JSON nor YAML, or not an object of facts.
    Syntax,
    /// A key appears twice in one object (JSON and YAML readers would keep one silently).
    DuplicateKey,
    /// A key the family does not have.
    UnknownKey,
    /// A value of the wrong type or shape (a string for a count, a list of the wrong length,
    /// a number that does not fit its type).
    Type,
    /// A value outside its fact's domain: a bound (`docs/facts.md`), an enum value, a version
    /// that does not parse, a compute capability no GPU has.
    Domain,
    /// Facts that cannot hold together (a constraint of the family, `docs/facts.md`).
    Constraint,
}

/// A problem with an input: one error type for every entry point (files, flags, presets,
/// corpus records, bindings). Nothing is decided for an input that has one.
#[derive(Clone, Debug, PartialEq, thiserror::Error, serde::Serialize)]
pub struct InputError {
    pub kind: InputErrorKind,
    /// Dotted path of the offending key (`flash_attn_versions.v5`, `window_size[1]`).
    pub path: String,
    pub message: String,
    pub suggestion: Option<String>,
    /// Where the offending value was given, when the reader knows: `file:line:col` in a JSON
    /// or YAML file, a flag (`--kv-heads`), `preset NAME`, `$NVTE_FLASH_ATTN` (the shell).
    pub location: Option<String>,
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(at) = &self.location {
            write!(f, "{at}: ")?;
        }
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)?;
        if let Some(s) = &self.suggestion {
            write!(f, " (did you mean `{s}`?)")?;
        }
        Ok(())
    }
}

impl InputError {
    /// A [`InputErrorKind::Type`] error at `path` (change the kind with [`InputError::kind`]).
    pub fn new(path: &str, message: impl Into<String>) -> InputError {
        InputError {
            kind: InputErrorKind::Type,
            path: path.to_string(),
            message: message.into(),
            suggestion: None,
            location: None,
        }
    }

    pub fn kind(mut self, kind: InputErrorKind) -> InputError {
        self.kind = kind;
        self
    }

    pub fn suggest(mut self, suggestion: Option<String>) -> InputError {
        self.suggestion = suggestion;
        self
    }

    /// Sets where the value was given (see [`InputError::location`]), unless already known.
    pub fn at(mut self, location: Option<String>) -> InputError {
        if self.location.is_none() {
            self.location = location;
        }
        self
    }
}

/// The closest candidate within a small edit distance, for did-you-mean hints. A candidate
/// that shares no character position with the word (as many edits as the word has characters:
/// `a` -> `id`, the empty word -> anything) is not similar and never suggested.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let chars = word.chars().count();
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(word, c), c))
        .filter(|(d, c)| *d <= 2.max(word.len().min(c.len()) / 3) && *d < chars)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::did_you_mean;

    #[test]
    fn did_you_mean_needs_a_shared_character() {
        assert_eq!(
            did_you_mean("casual", ["causal", "no_mask"]),
            Some("causal".into())
        );
        assert_eq!(did_you_mean("fp17", ["fp16", "bf16"]), Some("fp16".into()));
        // As many edits as the word has characters: nothing in common, no suggestion.
        assert_eq!(did_you_mean("", ["id"]), None);
        assert_eq!(did_you_mean("a", ["id"]), None);
        assert_eq!(did_you_mean("ab", ["id"]), None);
    }
}

//! Config objects read from text, JSON or YAML, with the position of every key, so that an
//! [`InputError`] found while reading the facts says `file:line:col`. A key given twice in one
//! object is an error in both syntaxes (serde_json would keep the last one silently).

use serde::Deserialize;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value as Json};
use serde_saphyr::Spanned;

use super::error::{InputError, InputErrorKind};
use super::schema::{Facts, Schema};
use crate::diag::SourceFile;

/// A config object (or a whole conformance record) read from text, with where its keys are.
#[derive(Clone, Debug)]
pub struct ConfigText {
    /// Name used in locations (a file path, `<stdin>`).
    pub name: String,
    pub value: Json,
    /// Dotted key path (`inference.page_size`, list items as `window_size[1]`) -> 1-based
    /// (line, column) where the key (for list items: the item) starts.
    keys: Vec<(String, usize, usize)>,
}

impl ConfigText {
    /// Parses JSON, or YAML when the text is not JSON. A duplicate key is an error in both.
    pub fn parse(name: &str, text: &str) -> Result<ConfigText, InputError> {
        match ConfigText::json(name, text) {
            Ok(c) => Ok(c),
            Err(e) if e.kind == InputErrorKind::DuplicateKey => Err(e),
            Err(json_err) => ConfigText::yaml(name, text).map_err(|yaml_err| {
                // Text that starts like JSON was meant as JSON: its error is the useful one.
                if text.trim_start().starts_with(['{', '[']) {
                    json_err
                } else {
                    yaml_err
                }
            }),
        }
    }

    /// Parses JSON (one value).
    pub fn json(name: &str, text: &str) -> Result<ConfigText, InputError> {
        let source = SourceFile::new(name.to_string(), text.to_string());
        let value: Json = serde_json::from_str(text).map_err(|e| {
            let msg = parser_message(e.to_string());
            InputError::new("", format!("not JSON: {msg}"))
                .kind(InputErrorKind::Syntax)
                .at(Some(format!("{name}:{}:{}", e.line(), e.column())))
        })?;
        let mut scan = JsonScan {
            text: text.as_bytes(),
            at: 0,
            keys: Vec::new(),
        };
        if let Err((path, first, second)) = scan.value("", 0) {
            let (l1, c1) = source.line_col(first);
            let (l2, c2) = source.line_col(second);
            return Err(InputError::new(
                &path,
                format!("duplicate key (first given at {l1}:{c1})"),
            )
            .kind(InputErrorKind::DuplicateKey)
            .at(Some(format!("{name}:{l2}:{c2}"))));
        }
        let keys = scan
            .keys
            .into_iter()
            .map(|(p, off)| {
                let (l, c) = source.line_col(off);
                (p, l, c)
            })
            .collect();
        Ok(ConfigText {
            name: name.to_string(),
            value,
            keys,
        })
    }

    /// Parses YAML (one document).
    pub fn yaml(name: &str, text: &str) -> Result<ConfigText, InputError> {
        let node: Spanned<Node> = serde_saphyr::from_str(text).map_err(|e| {
            let msg = parser_message(e.without_snippet().to_string());
            let at = e.location().map_or_else(
                || name.to_string(),
                |l| format!("{name}:{}:{}", l.line(), l.column()),
            );
            let kind = if msg.contains("duplicate") {
                InputErrorKind::DuplicateKey
            } else {
                InputErrorKind::Syntax
            };
            InputError::new("", format!("not YAML: {msg}"))
                .kind(kind)
                .at(Some(at))
        })?;
        let mut keys = Vec::new();
        let value = node.value.into_json(name, "", &mut keys)?;
        Ok(ConfigText {
            name: name.to_string(),
            value,
            keys,
        })
    }

    /// The `config` of a whole conformance record (`{"id", "config": {...}, ...}`), or the
    /// object itself. A PyTorch record keeps the device beside its config (`torch: {version,
    /// cudnn, sm}`): it joins the config unless the config names it itself.
    pub fn into_config(self) -> ConfigText {
        let Some(mut config) = self.value.get("config").filter(|c| c.is_object()).cloned() else {
            return self;
        };
        let device = self
            .value
            .get("torch")
            .filter(|_| config.get("torch").is_none())
            .cloned();
        if let (Some(torch), Some(obj)) = (&device, config.as_object_mut()) {
            obj.insert("torch".into(), torch.clone());
        }
        let keys = self
            .keys
            .into_iter()
            .filter_map(|(p, l, c)| {
                if device.is_some() && (p == "torch" || p.starts_with("torch.")) {
                    return Some((p, l, c));
                }
                let rest = p.strip_prefix("config")?;
                let rest = rest.strip_prefix('.').unwrap_or(rest);
                (!rest.is_empty()).then(|| (rest.to_string(), l, c))
            })
            .collect();
        ConfigText {
            name: self.name,
            value: config,
            keys,
        }
    }

    /// `name:line:col` of the key at `path`, or of its closest ancestor given in the text.
    pub fn locate(&self, path: &str) -> Option<String> {
        let mut p = path;
        loop {
            if let Some((_, l, c)) = self.keys.iter().find(|(k, _, _)| k == p) {
                return Some(format!("{}:{l}:{c}", self.name));
            }
            p = &p[..p.rfind(['.', '['])?];
        }
    }

    /// Reads the facts of `schema`'s family; an error carries this text's location.
    pub fn read(&self, schema: &'static Schema) -> Result<Facts, InputError> {
        schema.read(&self.value).map_err(|e| {
            let at = self.locate(&e.path).or_else(|| Some(self.name.clone()));
            e.at(at)
        })
    }
}

/// Byte offsets of every key of valid JSON (serde_json has parsed it), and the first duplicate.
struct JsonScan<'a> {
    text: &'a [u8],
    at: usize,
    keys: Vec<(String, usize)>,
}

/// A duplicate key: its path and the offsets of both occurrences.
type Duplicate = (String, usize, usize);

impl JsonScan<'_> {
    fn ws(&mut self) {
        while self
            .text
            .get(self.at)
            .is_some_and(|b| b.is_ascii_whitespace())
        {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    /// Skips a string starting at the quote; returns its decoded text.
    fn string(&mut self) -> String {
        let start = self.at;
        self.at += 1;
        while let Some(b) = self.peek() {
            self.at += 1;
            match b {
                b'\\' => self.at += 1,
                b'"' => break,
                _ => {}
            }
        }
        let raw = self
            .text
            .get(start..self.at.min(self.text.len()))
            .unwrap_or(b"\"\"");
        serde_json::from_slice(raw).unwrap_or_default()
    }

    /// Scans one value; `depth` bounds recursion like serde_json does (which has accepted it).
    fn value(&mut self, path: &str, depth: usize) -> Result<(), Duplicate> {
        self.ws();
        match self.peek() {
            Some(b'{') if depth < 256 => {
                self.at += 1;
                let mut seen: Vec<(String, usize)> = Vec::new();
                loop {
                    self.ws();
                    match self.peek() {
                        Some(b'"') => {}
                        Some(b'}') | None => {
                            self.at += 1;
                            return Ok(());
                        }
                        Some(_) => {
                            self.at += 1;
                            continue;
                        }
                    }
                    let key_at = self.at;
                    let key = self.string();
                    let child = join(path, &key);
                    if let Some((_, first)) = seen.iter().find(|(k, _)| *k == key) {
                        return Err((child, *first, key_at));
                    }
                    seen.push((key, key_at));
                    self.keys.push((child.clone(), key_at));
                    self.ws();
                    if self.peek() == Some(b':') {
                        self.at += 1;
                    }
                    self.value(&child, depth + 1)?;
                    self.ws();
                    if self.peek() == Some(b',') {
                        self.at += 1;
                    }
                }
            }
            Some(b'[') if depth < 256 => {
                self.at += 1;
                let mut i = 0;
                loop {
                    self.ws();
                    match self.peek() {
                        Some(b']') | None => {
                            self.at += 1;
                            return Ok(());
                        }
                        Some(b',') => {
                            self.at += 1;
                            continue;
                        }
                        Some(_) => {}
                    }
                    let child = format!("{path}[{i}]");
                    self.keys.push((child.clone(), self.at));
                    let before = self.at;
                    self.value(&child, depth + 1)?;
                    if self.at == before {
                        self.at += 1;
                    }
                    i += 1;
                }
            }
            Some(b'"') => {
                self.string();
                Ok(())
            }
            Some(_) => {
                while self
                    .peek()
                    .is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace())
                {
                    self.at += 1;
                }
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// A parser's message without its position (the caller gives one as `file:line:col`), and
/// the YAML parser's resource budget (`budget breached: Nodes { nodes: 250001 }`) in words: a
/// config is a few dozen keys; aliases that expand without end are refused.
fn parser_message(mut msg: String) -> String {
    if let Some(i) = msg.find(" at line ") {
        msg.truncate(i);
    }
    if msg.starts_with("budget breached") {
        return "the document is too large once its aliases (*name) are expanded; a config is a \
                few dozen keys"
            .to_string();
    }
    msg
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// A YAML node with the positions of its keys and items (serde-saphyr's [`Spanned`]).
#[derive(Debug)]
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(Spanned<String>, Spanned<Node>)>),
}

impl Node {
    fn into_json(
        self,
        name: &str,
        path: &str,
        keys: &mut Vec<(String, usize, usize)>,
    ) -> Result<Json, InputError> {
        Ok(match self {
            Node::Null => Json::Null,
            Node::Bool(b) => Json::Bool(b),
            Node::Int(i) => Json::from(i),
            Node::UInt(u) => Json::from(u),
            Node::Float(x) => match serde_json::Number::from_f64(x) {
                Some(n) => Json::Number(n),
                None => {
                    return Err(InputError::new(path, format!("{x} is not a finite number")));
                }
            },
            Node::Str(s) => Json::String(s),
            Node::Seq(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.into_iter().enumerate() {
                    let child = format!("{path}[{i}]");
                    keys.push((
                        child.clone(),
                        item.referenced.line() as usize,
                        item.referenced.column() as usize,
                    ));
                    out.push(item.value.into_json(name, &child, keys)?);
                }
                Json::Array(out)
            }
            Node::Map(entries) => {
                let mut out = Map::new();
                for (k, v) in entries {
                    let child = join(path, &k.value);
                    let (line, col) =
                        (k.referenced.line() as usize, k.referenced.column() as usize);
                    if out.contains_key(&k.value) {
                        // serde-saphyr refuses duplicates itself; kept for keys it normalises.
                        return Err(InputError::new(&child, "duplicate key")
                            .kind(InputErrorKind::DuplicateKey)
                            .at(Some(format!("{name}:{line}:{col}"))));
                    }
                    keys.push((child.clone(), line, col));
                    let value = v.value.into_json(name, &child, keys)?;
                    out.insert(k.value, value);
                }
                Json::Object(out)
            }
        })
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Node, E> {
        Ok(Node::Bool(b))
    }

    fn visit_i64<E>(self, i: i64) -> Result<Node, E> {
        Ok(Node::Int(i))
    }

    fn visit_u64<E>(self, u: u64) -> Result<Node, E> {
        Ok(Node::UInt(u))
    }

    fn visit_i128<E: de::Error>(self, i: i128) -> Result<Node, E> {
        i64::try_from(i)
            .map(Node::Int)
            .map_err(|_| E::custom(format!("{i} does not fit a 64-bit integer")))
    }

    fn visit_u128<E: de::Error>(self, u: u128) -> Result<Node, E> {
        u64::try_from(u)
            .map(Node::UInt)
            .map_err(|_| E::custom(format!("{u} does not fit a 64-bit integer")))
    }

    fn visit_f64<E>(self, x: f64) -> Result<Node, E> {
        Ok(Node::Float(x))
    }

    fn visit_str<E>(self, s: &str) -> Result<Node, E> {
        Ok(Node::Str(s.to_string()))
    }

    fn visit_string<E>(self, s: String) -> Result<Node, E> {
        Ok(Node::Str(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Node>>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<String>>()? {
            let value = map.next_value::<Spanned<Node>>()?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::te::TE;

    #[test]
    fn json_keys_have_positions() {
        let t = ConfigText::json(
            "c.json",
            "{\n  \"num_heads\": 8,\n  \"window_size\": [128, -5],\n  \"inference\": {\"page_size\": 0}\n}",
        )
        .unwrap();
        assert_eq!(t.locate("num_heads").as_deref(), Some("c.json:2:3"));
        assert_eq!(t.locate("window_size[1]").as_deref(), Some("c.json:3:24"));
        assert_eq!(
            t.locate("inference.page_size").as_deref(),
            Some("c.json:4:17")
        );
        // An unknown member falls back to its closest ancestor.
        assert_eq!(t.locate("inference.nope").as_deref(), Some("c.json:4:3"));
        let e = t.read(&TE).unwrap_err();
        assert_eq!(e.path, "window_size.right");
        assert_eq!(e.kind, InputErrorKind::Domain);
        assert_eq!(e.location.as_deref(), Some("c.json:3:3"));
    }

    #[test]
    fn duplicate_keys_are_errors_in_both_syntaxes() {
        let e = ConfigText::parse("c.json", "{\"num_heads\": 8,\n \"num_heads\": 4}").unwrap_err();
        assert_eq!(e.kind, InputErrorKind::DuplicateKey);
        assert_eq!(e.path, "num_heads");
        assert_eq!(e.location.as_deref(), Some("c.json:2:2"));
        let e = ConfigText::parse("c.yaml", "num_heads: 8\nnum_heads: 4\n").unwrap_err();
        assert_eq!(e.kind, InputErrorKind::DuplicateKey, "{e}");
        assert!(
            e.location
                .as_deref()
                .is_some_and(|l| l.starts_with("c.yaml:2")),
            "{e}"
        );
        let e = ConfigText::parse("c.json", "{\"env\": {\"A\": 1, \"A\": 2}}").unwrap_err();
        assert_eq!(e.path, "env.A");
    }

    #[test]
    fn yaml_keys_have_positions() {
        let t = ConfigText::parse(
            "c.yaml",
            "num_heads: 8\nnum_gqa_groups: 3\nwindow_size: [128, 0]\n",
        )
        .unwrap();
        let e = t.read(&TE).unwrap_err();
        assert_eq!(e.kind, InputErrorKind::Constraint);
        assert_eq!(e.location.as_deref(), Some("c.yaml:2:1"));
        assert_eq!(t.locate("window_size[1]").as_deref(), Some("c.yaml:3:20"));
    }

    #[test]
    fn syntax_errors_have_positions() {
        let e = ConfigText::parse("c.json", "{\"num_heads\": 8,,}").unwrap_err();
        assert_eq!(e.kind, InputErrorKind::Syntax);
        assert_eq!(e.location.as_deref(), Some("c.json:1:17"));
        let e = ConfigText::parse("c.yaml", "a: [1, 2\n").unwrap_err();
        assert_eq!(e.kind, InputErrorKind::Syntax);
    }

    #[test]
    fn records_are_rerooted_at_their_config() {
        let t = ConfigText::parse("r.json", "{\"id\": \"x\", \"config\": {\"batch_size\": 0}}")
            .unwrap()
            .into_config();
        let e = t.read(&TE).unwrap_err();
        assert_eq!(e.location.as_deref(), Some("r.json:1:24"));
    }
}

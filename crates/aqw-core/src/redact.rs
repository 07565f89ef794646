//! Redaction: the JSON pointers of `aqw.functions.<Name>.redact`, whose
//! values are masked wherever aqw shows a payload to a person (`aqw poison
//! show`, in text and in JSON; the dashboard's record page, its fix form and
//! its search). The stored payload stays exact, so a replay is byte-exact;
//! a fix that leaves a masked value as the mask gets the original value back
//! (`Redaction::restore`), so masking never corrupts a corrected payload.
//!
//! A pointer segment `*` is a wildcard: it matches every element of an
//! array and every member of an object at that level (`/items/*/pan`), so a
//! patch that inserts an element cannot shift a redacted value out from
//! under an index (`/items/0/pan` masks only what is at index 0 now).
//!
//! A group fix's JSON Patch is shown through [`patch_for_display`]: a value
//! written at, under or above a redacted field is masked, and a viewer who
//! may not act sees no value at all (a patch may add a secret at a path no
//! rule covers).
//!
//! Logs and alerts carry no payload, only errors and keys; a key rule over a
//! redacted field puts that value in the key, which is shown (say so in the
//! docs/configuration.md rather than hide keys, which the procedure needs).

use serde_json::Value;
use std::borrow::Cow;

/// What a masked value reads as.
pub const MASK: &str = "[redacted]";

/// The pointer segment that matches every array element and object member.
const WILDCARD: &str = "*";

/// Why a configured redaction pointer is refused; each names the pointer's
/// position in the list and the pointer (configuration, not payload).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedactError {
    /// Not starting with `/` (the empty pointer, the whole payload, included).
    #[error("[{index}] {pointer:?}: a JSON pointer starts with / (e.g. \"/card/number\")")]
    NoLeadingSlash {
        /// The pointer's position in the list.
        index: usize,
        /// The pointer as configured.
        pointer: String,
    },
    /// A `~` not written as `~0` or `~1`.
    #[error("[{index}] {pointer:?}: ~ must be written ~0, and / inside a name ~1")]
    BadEscape {
        /// The pointer's position in the list.
        index: usize,
        /// The pointer as configured.
        pointer: String,
    },
    /// A `*` inside a segment rather than a whole segment.
    #[error("[{index}] {pointer:?}: * is a wildcard and stands alone as a whole segment (\"/items/*/pan\"); a name with * in it cannot be redacted")]
    PartialWildcard {
        /// The pointer's position in the list.
        index: usize,
        /// The pointer as configured.
        pointer: String,
    },
}

/// The pointers of one function; empty when it declares none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redaction {
    pointers: Vec<String>,
}

impl Redaction {
    /// Check each pointer (RFC 6901: empty is the whole document, which
    /// would hide every payload, so it is refused; otherwise `/`-separated,
    /// `~` only as `~0` or `~1`; `*` only as a whole segment, the wildcard).
    pub fn parse(pointers: &[String]) -> Result<Self, RedactError> {
        for (index, p) in pointers.iter().enumerate() {
            let pointer = p.clone();
            if !p.starts_with('/') {
                return Err(RedactError::NoLeadingSlash { index, pointer });
            }
            let mut chars = p.chars();
            while let Some(c) = chars.next() {
                if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                    return Err(RedactError::BadEscape { index, pointer });
                }
            }
            if segments(p).any(|s| s.contains('*') && s != WILDCARD) {
                return Err(RedactError::PartialWildcard { index, pointer });
            }
        }
        Ok(Self {
            pointers: pointers.to_vec(),
        })
    }

    /// Whether the function declares no pointers.
    pub fn is_empty(&self) -> bool {
        self.pointers.is_empty()
    }

    /// The pointers, as configured.
    pub fn pointers(&self) -> &[String] {
        &self.pointers
    }

    /// `text` as a person may see it. Unchanged (the exact text) when no
    /// pointer is present in it; re-serialized with each present value
    /// replaced by [`MASK`] otherwise; and wholly masked when it is not JSON,
    /// since then no field can be found and the value could be anywhere.
    pub fn mask<'a>(&self, text: &'a str) -> Masked<'a> {
        if self.is_empty() {
            return Masked::Exact(Cow::Borrowed(text));
        }
        let Ok(mut value) = serde_json::from_str::<Value>(text) else {
            return Masked::Hidden(format!(
                "{MASK}: not JSON ({} bytes), and this function redacts fields",
                text.len()
            ));
        };
        // One reading only: with a key twice in an object, readers disagree
        // on which value counts (serde_json keeps the last), so a redacted
        // field could hide behind its twin and show in the exact text.
        if let Some(key) = duplicate_key(text) {
            return Masked::Hidden(format!(
                "{MASK}: the payload has the key {key:?} twice in one object, so it cannot be read unambiguously, and this function redacts fields"
            ));
        }
        let masked: Vec<String> = (self.pointers.iter())
            .filter(|p| mask_pattern(&mut value, &segments(p).collect::<Vec<_>>()))
            .cloned()
            .collect();
        if masked.is_empty() {
            return Masked::Exact(Cow::Borrowed(text));
        }
        let text = serde_json::to_string(&value).unwrap_or_else(|_| MASK.into());
        Masked::Fields { text, masked }
    }

    /// A corrected payload written from a masked one: each redacted field
    /// still reading [`MASK`] gets its value from `original` back. Anything
    /// else (a field the operator changed, a payload that is not JSON) is
    /// left as written.
    pub(crate) fn restore<'a>(&self, edited: &'a str, original: &str) -> Cow<'a, str> {
        if self.is_empty() {
            return Cow::Borrowed(edited);
        }
        let (Ok(mut fixed), Ok(original)) = (
            serde_json::from_str::<Value>(edited),
            serde_json::from_str::<Value>(original),
        ) else {
            return Cow::Borrowed(edited);
        };
        let mut restored = false;
        for p in &self.pointers {
            // Each concrete field the pointer reaches, at the same place in
            // the original (a wildcard reaches each element by its index).
            for at in reached(&fixed, &segments(p).collect::<Vec<_>>()) {
                let (Some(slot), Some(was)) = (fixed.pointer_mut(&at), original.pointer(&at))
                else {
                    continue;
                };
                if slot.as_str() == Some(MASK) {
                    *slot = was.clone();
                    restored = true;
                }
            }
        }
        if !restored {
            return Cow::Borrowed(edited);
        }
        Cow::Owned(serde_json::to_string(&fixed).unwrap_or_else(|_| edited.to_string()))
    }

    /// Whether the concrete pointer `path` (a JSON Patch operation's) is at,
    /// under or above a redacted field; a `*` of a rule matches any one
    /// segment, and the empty path (the whole document) is above them all.
    pub(crate) fn touches(&self, path: &str) -> bool {
        self.pointers.iter().any(|r| prefix_related(r, path))
    }

    /// Whether the concrete pointer `path` is at or under a redacted field
    /// (a `*` of a rule matching any one segment): its value is masked.
    pub(crate) fn covers(&self, path: &str) -> bool {
        let depth = segments(path).count();
        (self.pointers.iter()).any(|r| segments(r).count() <= depth && prefix_related(r, path))
    }

    /// `value`, written at the concrete pointer `path` by a patch, as a
    /// person may see it: wholly masked when `path` is at or under a
    /// redacted field; with the redacted fields below `path` masked inside
    /// it when it is above one.
    fn mask_written(&self, path: &str, value: &mut Value) {
        let at: Vec<&str> = segments(path).collect();
        for r in &self.pointers {
            if !prefix_related(r, path) {
                continue;
            }
            let rule: Vec<&str> = segments(r).collect();
            if at.len() >= rule.len() {
                *value = Value::String(MASK.into());
                return;
            }
            mask_pattern(value, &rule[at.len()..]);
        }
    }
}

/// A group fix's JSON Patch (RFC 6902) `text` as a person may see it, in
/// every view (the dashboard's operation page, `aqw ops show` and `list`, in
/// text and in JSON): compact JSON with the operations' `op`, `path` and
/// `from` as written, and each `value`
/// - when `show_values` (the viewer may act): shown, except a value written
///   at or under a redacted field is [`MASK`], and one written above one has
///   that field masked inside it (`/items/*/pan` masks `pan` in a value
///   added at `/items/-`);
/// - otherwise (a read-only viewer): [`MASK`], every one: a patch may add a
///   secret at a path no rule covers, and one who may not act has no need
///   of its values.
///
/// Text that is not a JSON Patch (a row no aqw wrote) is not shown at all.
pub fn patch_for_display(text: &str, redact: &Redaction, show_values: bool) -> String {
    use json_patch::PatchOperation as Op;
    let Ok(mut patch) = serde_json::from_str::<json_patch::Patch>(text) else {
        return format!("{MASK}: not a JSON Patch ({} bytes)", text.len());
    };
    for op in &mut patch.0 {
        let (path, value) = match op {
            Op::Add(o) => (o.path.as_str(), &mut o.value),
            Op::Replace(o) => (o.path.as_str(), &mut o.value),
            Op::Test(o) => (o.path.as_str(), &mut o.value),
            Op::Remove(_) | Op::Move(_) | Op::Copy(_) => continue,
        };
        if show_values {
            redact.mask_written(path, value);
        } else {
            *value = Value::String(MASK.into());
        }
    }
    serde_json::to_string(&patch).unwrap_or_else(|_| MASK.into())
}

/// The segments of a JSON pointer as written (still escaped); none for the
/// empty pointer, the whole document.
fn segments(pointer: &str) -> impl Iterator<Item = &str> {
    pointer.split('/').skip(1)
}

/// Whether the rule `rule` (`*` matching any one segment) and the concrete
/// pointer `path` agree on every segment both have: `path` is at, under or
/// above what the rule redacts.
fn prefix_related(rule: &str, path: &str) -> bool {
    segments(rule)
        .zip(segments(path))
        .all(|(r, p)| r == WILDCARD || r == p)
}

/// Mask every place of `value` the pattern `segs` reaches; whether one was.
fn mask_pattern(value: &mut Value, segs: &[&str]) -> bool {
    let at = reached(value, segs);
    for p in &at {
        if let Some(v) = value.pointer_mut(p) {
            *v = Value::String(MASK.into());
        }
    }
    !at.is_empty()
}

/// Every place of `value` the pattern `segs` reaches (`*`: each element of
/// an array, each member of an object), as concrete pointers.
fn reached(value: &Value, segs: &[&str]) -> Vec<String> {
    fn walk(v: &Value, segs: &[&str], at: String, out: &mut Vec<String>) {
        let Some((&first, rest)) = segs.split_first() else {
            out.push(at);
            return;
        };
        if first != WILDCARD {
            // serde_json's own reading of the segment (unescaping, indices).
            if let Some(child) = v.pointer(&format!("/{first}")) {
                walk(child, rest, format!("{at}/{first}"), out);
            }
            return;
        }
        match v {
            Value::Array(xs) => {
                for (i, c) in xs.iter().enumerate() {
                    walk(c, rest, format!("{at}/{i}"), out);
                }
            }
            Value::Object(m) => {
                for (k, c) in m {
                    let k = k.replace('~', "~0").replace('/', "~1");
                    walk(c, rest, format!("{at}/{k}"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = vec![];
    walk(value, segs, String::new(), &mut out);
    out
}

/// The first key found twice in one object of the JSON `text`, if any.
fn duplicate_key(text: &str) -> Option<String> {
    let err = serde_json::from_str::<Unique>(text).err()?;
    // The marker (a NUL, which no serde_json message holds) sets our error
    // apart from a syntax error, which is not a duplicate.
    let msg = err.to_string();
    let start = msg.find('\u{0}')? + 1;
    let end = msg[start..]
        .rfind(" at line ")
        .map_or(msg.len(), |i| start + i);
    Some(msg[start..end].to_string())
}

/// Walks a JSON document and fails at the first key an object holds twice.
struct Unique;

/// The error [`Unique`] fails with: the marker, then the key.
struct DuplicateKey(String);

impl std::fmt::Display for DuplicateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "\u{0}{}", self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Unique)
    }
}

impl<'de> serde::de::Visitor<'de> for Unique {
    type Value = Unique;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
        use serde::de::Error;
        let mut seen = std::collections::HashSet::new();
        while let Some(k) = map.next_key::<String>()? {
            if !seen.insert(k.clone()) {
                return Err(A::Error::custom(DuplicateKey(k)));
            }
            map.next_value::<Unique>()?;
        }
        Ok(Unique)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
        while seq.next_element::<Unique>()?.is_some() {}
        Ok(Unique)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_unit<E>(self) -> Result<Unique, E> {
        Ok(Unique)
    }
}

/// A payload after [`Redaction::mask`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Masked<'a> {
    /// Nothing to mask: the exact text.
    Exact(Cow<'a, str>),
    /// These pointers were masked in this re-serialized text.
    Fields {
        /// The payload with the masked values replaced by [`MASK`].
        text: String,
        /// The pointers whose values were masked.
        masked: Vec<String>,
    },
    /// Not JSON: nothing of it is shown.
    Hidden(String),
}

impl Masked<'_> {
    /// The text to show: the exact text, the masked text, or (hidden) why
    /// nothing is shown.
    pub fn text(&self) -> &str {
        match self {
            Masked::Exact(t) => t,
            Masked::Fields { text, .. } => text,
            Masked::Hidden(why) => why,
        }
    }

    /// What was masked, for the page or the JSON output; None when nothing was.
    pub(crate) fn note(&self) -> Option<String> {
        match self {
            Masked::Exact(_) => None,
            Masked::Fields { masked, .. } => Some(format!(
                "redacted ({}): not the exact text; replay sends the exact stored payload",
                masked.join(", ")
            )),
            Masked::Hidden(_) => Some(
                "redacted (not JSON, wholly hidden); replay sends the exact stored payload".into(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(p: &[&str]) -> Redaction {
        Redaction::parse(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    /// Issue 40: a twin key cannot unmask a redacted field; a payload with
    /// a key twice in one object is hidden whole under redaction.
    #[test]
    fn duplicate_keys_hide_the_whole_payload() {
        let red = r(&["/card/number"]);
        let bypass = r#"{"card":{"number":"4111111111111111"},"card":"none"}"#;
        let shown = red.mask(bypass);
        assert!(matches!(shown, Masked::Hidden(_)), "{shown:?}");
        assert!(!shown.text().contains("4111"), "{}", shown.text());
        assert!(shown.text().contains("\"card\" twice"), "{}", shown.text());
        let nested = r#"{"a":[{"x":1,"y":{"k":1,"k":2}}]}"#;
        assert_eq!(duplicate_key(nested).as_deref(), Some("k"));
        assert_eq!(duplicate_key(r#"{"a":{"k":1},"b":{"k":2}}"#), None);
        assert_eq!(duplicate_key("not json"), None);
        // An escaped twin is the same key.
        assert_eq!(
            duplicate_key(r#"{"card":1,"c\u0061rd":2}"#).as_deref(),
            Some("card")
        );
    }

    #[test]
    fn pointers_are_checked() {
        assert!(Redaction::parse(&["/card/number".into(), "/a~1b".into()]).is_ok());
        let e = Redaction::parse(&["card".into()]).unwrap_err();
        assert_eq!(
            e,
            RedactError::NoLeadingSlash {
                index: 0,
                pointer: "card".into()
            }
        );
        let e = e.to_string();
        assert!(e.contains("[0]") && e.contains("starts with /"), "{e}");
        assert!(
            Redaction::parse(&["".into()]).is_err(),
            "not the whole payload"
        );
        let e = Redaction::parse(&["/a~2".into()]).unwrap_err();
        assert!(matches!(e, RedactError::BadEscape { index: 0, .. }));
        assert!(e.to_string().contains("~0"));
        assert!(Redaction::parse(&["/items/*/pan".into(), "/*".into(), "/a/*".into()]).is_ok());
        for bad in ["/items/*x/pan", "/a*", "/**", "/a/b*c"] {
            let e = Redaction::parse(&["/ok".into(), bad.into()]).unwrap_err();
            assert!(matches!(e, RedactError::PartialWildcard { index: 1, .. }));
            let e = e.to_string();
            assert!(
                e.contains("[1]") && e.contains("whole segment"),
                "{bad}: {e}"
            );
        }
    }

    /// Issue 48: `*` matches every array element and object member at its
    /// level, nested, at the end, and reaches nothing where nothing is.
    #[test]
    fn wildcards_match_every_element_and_member() {
        let masked = |rules: &[&str], text: &str| -> (Value, Option<String>) {
            let m = r(rules).mask(text);
            (serde_json::from_str(m.text()).unwrap(), m.note())
        };
        // Arrays: each element's pan, whatever its index.
        let (v, note) = masked(
            &["/items/*/pan"],
            r#"{"items":[{"pan":"4111","n":1},{"n":2},{"pan":"5500","n":3}]}"#,
        );
        assert_eq!(v["items"][0]["pan"], MASK);
        assert_eq!(
            v["items"][1],
            serde_json::json!({"n": 2}),
            "no pan, none added"
        );
        assert_eq!(v["items"][2]["pan"], MASK);
        assert_eq!(v["items"][2]["n"], 3);
        assert!(note.unwrap().contains("/items/*/pan"));
        // Objects: each member.
        let (v, _) = masked(
            &["/cards/*/number"],
            r#"{"cards":{"visa":{"number":"4111"},"mc":{"number":"5500","exp":"1/30"}}}"#,
        );
        assert_eq!(v["cards"]["visa"]["number"], MASK);
        assert_eq!(v["cards"]["mc"]["number"], MASK);
        assert_eq!(v["cards"]["mc"]["exp"], "1/30");
        // Nested wildcards, and names that need escaping.
        let (v, _) = masked(
            &["/a/*/b/*/c"],
            r#"{"a":[{"b":{"x/y":{"c":"s1"},"z~":{"c":"s2","d":1}}},{"b":[{"c":"s3"}]}]}"#,
        );
        let text = v.to_string();
        assert!(
            !text.contains("s1") && !text.contains("s2") && !text.contains("s3"),
            "{text}"
        );
        assert_eq!(v["a"][0]["b"]["z~"]["d"], 1);
        // `*` at the end: every element itself, the array's length kept.
        let (v, _) = masked(&["/tags/*"], r#"{"tags":["t1","t2"],"x":1}"#);
        assert_eq!(v, serde_json::json!({"tags": [MASK, MASK], "x": 1}));
        // No match: a scalar or missing level under the wildcard, an empty array.
        let red = r(&["/items/*/pan"]);
        for exact in [
            r#"{"items":"4111"}"#,
            r#"{"items":[]}"#,
            r#"{"other":[{"pan":1}]}"#,
            r#"{"items":[1,2]}"#,
        ] {
            assert_eq!(
                red.mask(exact),
                Masked::Exact(Cow::Borrowed(exact)),
                "{exact}"
            );
        }
    }

    /// A fix written from a view masked by a wildcard gets each element's
    /// value back from the same element of the original.
    #[test]
    fn a_fix_keeps_wildcard_masked_values() {
        let red = r(&["/items/*/pan"]);
        let original = r#"{"items":[{"pan":"4111","q":1},{"pan":"5500","q":2}]}"#;
        let edited = red.mask(original).text().replace("\"q\":2", "\"q\":3");
        let fixed: Value = serde_json::from_str(&red.restore(&edited, original)).unwrap();
        assert_eq!(fixed["items"][0]["pan"], "4111");
        assert_eq!(fixed["items"][1]["pan"], "5500");
        assert_eq!(fixed["items"][1]["q"], 3);
    }

    #[test]
    fn touches_reads_a_wildcard_as_any_segment() {
        let red = r(&["/items/*/pan", "/card/number"]);
        for yes in [
            "/items/0/pan",
            "/items/7/pan",
            "/items/-/pan",
            "/items/3",
            "/items",
            "",
            "/items/0/pan/x",
            "/card",
            "/card/number/0",
        ] {
            assert!(red.touches(yes), "{yes}");
        }
        for no in [
            "/items/0/name",
            "/card/exp",
            "/cardx",
            "/other",
            "/items/0/panx",
        ] {
            assert!(!red.touches(no), "{no}");
        }
    }

    /// A group fix may not move, copy or test a field a wildcard rule
    /// redacts, at any index, nor anything above it; writing one is fine.
    #[test]
    fn a_group_fix_cannot_read_a_wildcard_redacted_field() {
        use crate::ops::operation::parse_patch_for;
        let red = r(&["/items/*/pan"]);
        for refused in [
            r#"[{"op":"copy","from":"/items/3/pan","path":"/x"}]"#,
            r#"[{"op":"move","from":"/items/0","path":"/x"}]"#,
            r#"[{"op":"test","path":"/items/1/pan","value":"4111"}]"#,
            r#"[{"op":"copy","from":"/items","path":"/x"}]"#,
        ] {
            assert!(parse_patch_for(refused, &red).is_err(), "{refused}");
        }
        for fine in [
            r#"[{"op":"replace","path":"/items/0/pan","value":"x"}]"#,
            r#"[{"op":"add","path":"/items/0","value":{"sku":"gift"}}]"#,
            r#"[{"op":"copy","from":"/items/0/sku","path":"/sku"}]"#,
        ] {
            assert!(parse_patch_for(fine, &red).is_ok(), "{fine}");
        }
    }

    /// Issue 48: a patch's values are masked where they write a redacted
    /// field (at, under or above it), and not shown at all to a viewer who
    /// may not act.
    #[test]
    fn patches_are_shown_with_redacted_values_masked() {
        let red = r(&["/card/number", "/items/*/pan"]);
        let patch = r#"[
            {"op":"replace","path":"/card/number","value":"4111111111111111"},
            {"op":"add","path":"/card","value":{"number":"5500005555555559","exp":"1/30"}},
            {"op":"add","path":"/items/0","value":{"pan":"4012888888881881","sku":"s-1"}},
            {"op":"add","path":"/items/-","value":{"pan":"378282246310005"}},
            {"op":"replace","path":"/items/2/pan/last4","value":"0005"},
            {"op":"replace","path":"","value":{"card":{"number":"6011111111111117"},"items":[{"pan":"3530111333300000"}]}},
            {"op":"add","path":"/note","value":"ada@example.com"},
            {"op":"move","from":"/acount","path":"/account"},
            {"op":"remove","path":"/card/number"}
        ]"#;
        let shown = patch_for_display(patch, &red, true);
        for secret in ["4111", "5500", "4012", "3782", "0005", "6011", "3530"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        for kept in [
            "1/30",
            "s-1",
            "ada@example.com",
            "/acount",
            "\"remove\"",
            "/items/-",
        ] {
            assert!(shown.contains(kept), "{kept} not in {shown}");
        }
        let ops: Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(ops[0]["value"], MASK);
        assert_eq!(ops[1]["value"]["number"], MASK);
        assert_eq!(ops.as_array().unwrap().len(), 9);
        // A read-only viewer: paths and ops, no value at all.
        let bare = patch_for_display(patch, &red, false);
        assert!(
            !bare.contains("1/30") && !bare.contains("ada@") && !bare.contains("s-1"),
            "{bare}"
        );
        assert!(
            bare.contains("/note") && bare.contains("/card/number"),
            "{bare}"
        );
        let unredacted = patch_for_display(patch, &Redaction::default(), false);
        assert!(!unredacted.contains("ada@"), "{unredacted}");
        // Not a patch, or one with a twin member: nothing of it.
        for odd in [
            "4111 not json",
            r#"[{"op":"add","path":"/a","value":"4111","value":"x"}]"#,
        ] {
            let s = patch_for_display(odd, &red, true);
            assert!(!s.contains("4111") && s.starts_with(MASK), "{s}");
        }
    }

    #[test]
    fn present_fields_are_masked_and_absent_ones_keep_the_exact_text() {
        let red = r(&["/card/number", "/email", "/items/0"]);
        let exact = r#"{ "orderId": "o-1" }"#;
        assert_eq!(red.mask(exact), Masked::Exact(Cow::Borrowed(exact)));
        let m = red.mask(r#"{"card":{"number":"4242424242424242","exp":"12/30"},"email":"a@b.c","items":[{"x":1}]}"#);
        let text = m.text();
        assert!(
            !text.contains("4242") && !text.contains("a@b.c") && !text.contains("\"x\""),
            "{text}"
        );
        assert!(text.contains("12/30"), "{text}");
        assert!(m.note().unwrap().contains("/card/number, /email, /items/0"));
        let hidden = red.mask("card=4242424242424242");
        assert!(!hidden.text().contains("4242"), "{}", hidden.text());
        assert_eq!(Redaction::default().mask("x").text(), "x");
    }

    #[test]
    fn a_fix_keeps_the_masked_values_it_did_not_change() {
        let red = r(&["/card/number", "/email"]);
        let original = r#"{"card":{"number":"4242"},"email":"a@b.c","acount":"A-1"}"#;
        let shown = red.mask(original).text().to_string();
        let edited = shown.replace("acount", "account");
        let fixed: Value = serde_json::from_str(&red.restore(&edited, original)).unwrap();
        assert_eq!(fixed["card"]["number"], "4242");
        assert_eq!(fixed["email"], "a@b.c");
        assert_eq!(fixed["account"], "A-1");
        // A value the operator typed over stays as typed.
        let typed = shown.replace(MASK, "new@b.c");
        let fixed: Value = serde_json::from_str(&red.restore(&typed, original)).unwrap();
        assert_eq!(fixed["email"], "new@b.c");
        // Not JSON, or nothing redacted: as written.
        assert_eq!(red.restore("nope", original), "nope");
        assert_eq!(Redaction::default().restore(&shown, original), shown);
    }
}

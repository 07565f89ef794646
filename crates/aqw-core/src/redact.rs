//! Redaction: the JSON pointers of `aqw.functions.<Name>.redact`, whose
//! values are masked wherever aqw shows a payload to a person (`aqw poison
//! show`, in text and in JSON; the dashboard's record page, its fix form and
//! its search). The stored payload stays exact, so a replay is byte-exact;
//! a fix that leaves a masked value as the mask gets the original value back
//! ([`Redaction::restore`]), so masking never corrupts a corrected payload.
//!
//! Logs and alerts carry no payload, only errors and keys; a key rule over a
//! redacted field puts that value in the key, which is shown (say so in the
//! docs/configuration.md rather than hide keys, which the procedure needs).

use serde_json::Value;
use std::borrow::Cow;

/// What a masked value reads as.
pub const MASK: &str = "[redacted]";

/// The pointers of one function; empty when it declares none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redaction {
    pointers: Vec<String>,
}

impl Redaction {
    /// Check each pointer (RFC 6901: empty is the whole document, which
    /// would hide every payload, so it is refused; otherwise `/`-separated,
    /// `~` only as `~0` or `~1`).
    pub fn parse(pointers: &[String]) -> Result<Self, String> {
        for (i, p) in pointers.iter().enumerate() {
            let bad = |why: &str| Err(format!("[{i}] {p:?}: {why}"));
            if !p.starts_with('/') {
                return bad("a JSON pointer starts with / (e.g. \"/card/number\")");
            }
            let mut chars = p.chars();
            while let Some(c) = chars.next() {
                if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                    return bad("~ must be written ~0, and / inside a name ~1");
                }
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
        let mut masked = vec![];
        for p in &self.pointers {
            if let Some(v) = value.pointer_mut(p) {
                *v = Value::String(MASK.into());
                masked.push(p.clone());
            }
        }
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
    pub fn restore<'a>(&self, edited: &'a str, original: &str) -> Cow<'a, str> {
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
            let (Some(slot), Some(was)) = (fixed.pointer_mut(p), original.pointer(p)) else {
                continue;
            };
            if slot.as_str() == Some(MASK) {
                *slot = was.clone();
                restored = true;
            }
        }
        if !restored {
            return Cow::Borrowed(edited);
        }
        Cow::Owned(serde_json::to_string(&fixed).unwrap_or_else(|_| edited.to_string()))
    }
}

/// The first key found twice in one object of the JSON `text`, if any.
pub fn duplicate_key(text: &str) -> Option<String> {
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
    pub fn note(&self) -> Option<String> {
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
        assert!(e.contains("[0]") && e.contains("starts with /"), "{e}");
        assert!(
            Redaction::parse(&["".into()]).is_err(),
            "not the whole payload"
        );
        assert!(Redaction::parse(&["/a~2".into()])
            .unwrap_err()
            .contains("~0"));
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

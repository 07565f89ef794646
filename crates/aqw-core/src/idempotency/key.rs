//! Idempotency keys: one stable id per intended effect, derived from
//! business facts in the payload (a template of JSON pointers, the
//! payload's `idempotencyKey` field, or an explicit opt-out).

use serde_json::Value;
use sha2::{Digest, Sha256};

/// A business key: one stable id per intended effect. Never empty; carried
/// typed from derivation to the handler, the poison record and replay, and
/// written as its plain text wherever it is serialized.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IdempotencyKey(String);

/// Why a key template is refused or a key cannot be derived from a payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The key text is empty.
    #[error("the idempotency key is empty")]
    Empty,
    /// A `{` with no closing `}` in the template.
    #[error("unclosed '{{' in key template \"{template}\"")]
    UnclosedBrace {
        /// The template as written.
        template: String,
    },
    /// A `}` with no opening `{` in the template.
    #[error("unmatched '}}' in key template \"{template}\"")]
    UnmatchedBrace {
        /// The template as written.
        template: String,
    },
    /// A placeholder naming something that changes per attempt (`{messageId}`, `{now}`).
    #[error(
        "{{{name}}} changes with every attempt or message, so retries would never match; \
         derive the key from business facts in the payload, e.g. {{/orderId}}"
    )]
    PerAttemptPlaceholder {
        /// The placeholder's name, without braces.
        name: String,
    },
    /// A placeholder that is not a JSON pointer (`{orderId}` for `{/orderId}`).
    #[error("{{{name}}} is not a JSON pointer into the payload (write {{/{name}}})")]
    NotAPointer {
        /// The placeholder's name, without braces.
        name: String,
    },
    /// A template with no placeholder: every job would share one key.
    #[error(
        "key template \"{template}\" has no {{/field}} placeholder: every job would share one key \
         (use \"none\" to opt out of keys)"
    )]
    NoPlaceholder {
        /// The template as written.
        template: String,
    },
    /// A pointed field holds an empty string.
    #[error("key field {field} is empty")]
    EmptyField {
        /// The JSON pointer.
        field: String,
    },
    /// A pointed field is absent or null.
    #[error("key field {field} is missing from the payload")]
    MissingField {
        /// The JSON pointer.
        field: String,
    },
    /// A pointed field is an object or an array.
    #[error("key field {field} is an object or array, not a value")]
    NotAScalar {
        /// The JSON pointer.
        field: String,
    },
    /// The payload is not JSON but the key template reads it.
    #[error("payload is not valid JSON ({reason}); the key template {template} needs JSON")]
    TemplatePayloadNotJson {
        /// The parser's reason (a position, never payload text).
        reason: String,
        /// The template as written.
        template: String,
    },
    /// The payload is not JSON but the key comes from its `idempotencyKey` field.
    #[error("payload is not valid JSON ({reason}); the key comes from its idempotencyKey field")]
    FieldPayloadNotJson {
        /// The parser's reason (a position, never payload text).
        reason: String,
    },
    /// No key template and no usable `idempotencyKey` field in the payload.
    #[error(
        "payload has no idempotencyKey field and the function has no key template \
         (set aqw.functions.<name>.key, or \"none\" for naturally idempotent jobs)"
    )]
    NoPayloadKey,
}

impl TryFrom<String> for IdempotencyKey {
    type Error = KeyError;
    fn try_from(text: String) -> Result<Self, KeyError> {
        Self::new(text)
    }
}

impl From<IdempotencyKey> for String {
    fn from(k: IdempotencyKey) -> String {
        k.0
    }
}

impl std::ops::Deref for IdempotencyKey {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl IdempotencyKey {
    /// A key of `text`; an error when it is empty.
    pub fn new(text: impl Into<String>) -> Result<Self, KeyError> {
        let text = text.into();
        if text.is_empty() {
            return Err(KeyError::Empty);
        }
        Ok(Self(text))
    }
    /// The key's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// RowKey: hex SHA-256 of the key text.
    pub fn row_key(&self) -> String {
        hex::encode(Sha256::digest(self.0.as_bytes()))
    }
    /// PartitionKey: the function name plus the first hash byte, spreading load
    /// over 256 partitions per function.
    pub fn partition_key(&self, function: &str) -> String {
        format!("{function}-{}", &self.row_key()[..2])
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Pointer(String),
}

/// A key template over the JSON payload: `receipt:{/orderId}:{/period}`.
///
/// Placeholders are JSON pointers into the payload and nothing else: a key
/// built from the message id, the dequeue count, the time or a random value
/// would change per attempt and defeat the constraint, so such templates
/// are rejected when the config is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate {
    source: String,
    parts: Vec<Part>,
}

/// Why `{name}` (not a JSON pointer) cannot be a key placeholder.
fn not_a_pointer(name: &str) -> KeyError {
    const PER_ATTEMPT: [&str; 13] = [
        "messageid",
        "id",
        "dequeuecount",
        "now",
        "time",
        "timestamp",
        "utcnow",
        "random",
        "uuid",
        "guid",
        "randguid",
        "popreceipt",
        "insertiontime",
    ];
    let lower = name.to_ascii_lowercase().replace(['_', '-', '.'], "");
    let name = name.to_string();
    if PER_ATTEMPT.contains(&lower.as_str()) {
        KeyError::PerAttemptPlaceholder { name }
    } else {
        KeyError::NotAPointer { name }
    }
}

impl KeyTemplate {
    /// Parse a template such as `credit:{/account}:{/period}`: literal text
    /// and `{/pointer}` placeholders (`{{` and `}}` for braces). An error
    /// names what is wrong: an unclosed brace, a placeholder that is not a
    /// JSON pointer, no placeholder at all.
    pub fn parse(source: &str) -> Result<Self, KeyError> {
        let template = || source.to_string();
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut chars = source.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    let mut closed = false;
                    for c in chars.by_ref() {
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        name.push(c);
                    }
                    if !closed {
                        return Err(KeyError::UnclosedBrace {
                            template: template(),
                        });
                    }
                    if !name.starts_with('/') {
                        return Err(not_a_pointer(&name));
                    }
                    if !lit.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut lit)));
                    }
                    parts.push(Part::Pointer(name));
                }
                '}' => {
                    return Err(KeyError::UnmatchedBrace {
                        template: template(),
                    })
                }
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Literal(lit));
        }
        if !parts.iter().any(|p| matches!(p, Part::Pointer(_))) {
            return Err(KeyError::NoPlaceholder {
                template: template(),
            });
        }
        Ok(Self {
            source: source.to_string(),
            parts,
        })
    }

    /// The template as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render the key from a payload. Reads the payload and nothing else.
    pub(crate) fn render(&self, payload: &Value) -> Result<IdempotencyKey, KeyError> {
        let field = |p: &str| p.to_string();
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(l) => out.push_str(l),
                Part::Pointer(p) => match payload.pointer(p) {
                    Some(Value::String(s)) if !s.is_empty() => out.push_str(s),
                    Some(Value::Number(n)) => out.push_str(&n.to_string()),
                    Some(Value::Bool(b)) => out.push_str(&b.to_string()),
                    Some(Value::String(_)) => return Err(KeyError::EmptyField { field: field(p) }),
                    Some(Value::Null) | None => {
                        return Err(KeyError::MissingField { field: field(p) })
                    }
                    Some(_) => return Err(KeyError::NotAScalar { field: field(p) }),
                },
            }
        }
        IdempotencyKey::new(out)
    }
}

/// Where a function's idempotency key comes from.
#[derive(Debug, Clone)]
pub enum KeySpec {
    /// A template over the JSON payload (`receipt:{/orderId}`).
    Template(KeyTemplate),
    /// The payload's `idempotencyKey` field (no `key` configured).
    PayloadField,
    /// Explicit opt-out: the job is naturally idempotent.
    None,
}

/// Derive a job's idempotency key from its payload per the function's rule.
pub fn derive_key(spec: &KeySpec, payload: &str) -> Result<Option<IdempotencyKey>, KeyError> {
    match spec {
        KeySpec::None => Ok(None),
        KeySpec::Template(t) => {
            let json: serde_json::Value =
                serde_json::from_str(payload).map_err(|e| KeyError::TemplatePayloadNotJson {
                    reason: e.to_string(),
                    template: t.source().to_string(),
                })?;
            t.render(&json).map(Some)
        }
        KeySpec::PayloadField => {
            let json: serde_json::Value =
                serde_json::from_str(payload).map_err(|e| KeyError::FieldPayloadNotJson {
                    reason: e.to_string(),
                })?;
            match json.get("idempotencyKey") {
                Some(serde_json::Value::String(s)) if !s.is_empty() => {
                    IdempotencyKey::new(s.clone()).map(Some)
                }
                _ => Err(KeyError::NoPayloadKey),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn template_renders_pointers() {
        let t = KeyTemplate::parse("credits:{/accountId}:{/period}").unwrap();
        let k = t
            .render(&json!({"accountId": "a1", "period": 202611}))
            .unwrap();
        assert_eq!(k.as_str(), "credits:a1:202611");
        let t = KeyTemplate::parse("x{{y}}:{/a/b}").unwrap();
        assert_eq!(
            t.render(&json!({"a": {"b": "z"}})).unwrap().as_str(),
            "x{y}:z"
        );
    }

    #[test]
    fn template_names_the_missing_field() {
        let t = KeyTemplate::parse("receipt:{/orderId}").unwrap();
        let e = t.render(&json!({"other": 1})).unwrap_err();
        assert_eq!(
            e,
            KeyError::MissingField {
                field: "/orderId".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "key field /orderId is missing from the payload"
        );
        let field = || "/orderId".to_string();
        assert_eq!(
            t.render(&json!({"orderId": ""})),
            Err(KeyError::EmptyField { field: field() })
        );
        assert_eq!(
            t.render(&json!({"orderId": null})),
            Err(KeyError::MissingField { field: field() })
        );
        assert_eq!(
            t.render(&json!({"orderId": {"x": 1}})),
            Err(KeyError::NotAScalar { field: field() })
        );
    }

    #[test]
    fn per_attempt_templates_are_rejected() {
        for bad in [
            "r:{messageId}",
            "r:{/a}:{dequeueCount}",
            "r:{now}",
            "r:{random}",
            "r:{uuid}",
            "r:{sys.RandGuid}",
        ] {
            assert!(KeyTemplate::parse(bad).is_err(), "{bad}");
        }
        assert!(matches!(
            KeyTemplate::parse("r:{now}"),
            Err(KeyError::PerAttemptPlaceholder { name }) if name == "now"
        ));
        assert!(matches!(
            KeyTemplate::parse("r:{orderId}"),
            Err(KeyError::NotAPointer { name }) if name == "orderId"
        ));
        let constant = KeyTemplate::parse("constant").unwrap_err();
        assert!(
            matches!(&constant, KeyError::NoPlaceholder { template } if template == "constant")
        );
        assert!(constant.to_string().contains("share one key"));
        assert!(matches!(
            KeyTemplate::parse("r:{/a"),
            Err(KeyError::UnclosedBrace { .. })
        ));
        assert!(matches!(
            KeyTemplate::parse("r:/a}"),
            Err(KeyError::UnmatchedBrace { .. })
        ));
    }

    #[test]
    fn row_keys_distinguish_long_keys() {
        let a = IdempotencyKey::new(format!("{}a", "x".repeat(600))).unwrap();
        let b = IdempotencyKey::new(format!("{}b", "x".repeat(600))).unwrap();
        assert_ne!(a.row_key(), b.row_key());
        assert_eq!(a.row_key().len(), 64);
        assert!(a.partition_key("F").starts_with("F-"));
    }

    proptest! {
        #[test]
        fn same_payload_same_key(order in "[a-zA-Z0-9 /#?'\"😀]{1,40}", period in 0u32..1_000_000) {
            let t = KeyTemplate::parse("receipt:{/orderId}:{/period}").unwrap();
            let p = json!({"orderId": order, "period": period});
            let k1 = t.render(&p).unwrap();
            let k2 = t.render(&p.clone()).unwrap();
            prop_assert_eq!(&k1, &k2);
            prop_assert_eq!(k1.row_key(), k2.row_key());
        }

        #[test]
        fn key_ignores_everything_but_the_pointed_fields(order in "[a-z0-9]{1,20}", noise in any::<u64>()) {
            // The template sees only the payload; extra fields (or anything a
            // message carries around it) cannot change the key.
            let t = KeyTemplate::parse("r:{/orderId}").unwrap();
            let a = t.render(&json!({"orderId": order})).unwrap();
            let b = t.render(&json!({"orderId": order, "attempt": noise, "ts": noise.to_string()})).unwrap();
            prop_assert_eq!(a, b);
        }

        #[test]
        fn template_parser_never_panics(s in "\\PC{0,60}") {
            let _ = KeyTemplate::parse(&s);
        }
    }
}

//! Dry runs of `poison fix` and `poison discard`: what the command would do,
//! read from the same records, with nothing written. They check what the
//! real commands check, in the same order, so a rehearsal that says
//! "would replace" is one the command carries out.

use super::{OpsResult, QueueOps};
use crate::idempotency::{derive_key, IdempotencyKey, KeyRecord};
use crate::message::decode;
use crate::poison::PoisonRecord;
use crate::redact::{Redaction, MASK};
use serde_json::Value;

/// What `poison fix --dry-run` found.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FixRehearsal {
    /// The record id (the source message id).
    pub id: String,
    /// The key the record keeps (the poisoned payload's).
    pub old_key: Option<IdempotencyKey>,
    /// The key the corrected payload derives (`None`: keyless function, or
    /// no key derivable — then `refusal` says why).
    pub new_key: Option<IdempotencyKey>,
    /// The new key's state (`none`: never claimed).
    pub key_state: Option<String>,
    /// Why the fix would put nothing; `None`: it would replace the record.
    pub refusal: Option<String>,
    /// The payload's changes: `- old` / `+ new` lines per JSON field that
    /// changed (per line for a payload that is not JSON).
    pub diff: Vec<String>,
    /// The corrected payload's size minus the original's, in bytes.
    pub size_diff: i64,
}

/// What `poison discard --dry-run` found.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscardRehearsal {
    /// The record id (the source message id).
    pub id: String,
    /// The record's key.
    pub key: Option<IdempotencyKey>,
    /// The key's state (`none`: never claimed); `None` for a keyless record.
    pub key_state: Option<String>,
    /// `--close-key` was given: the key would be closed too.
    pub close_key: bool,
    /// Why the discard would be refused; `None`: it would close the record.
    pub refusal: Option<String>,
}

/// `poison fix --dry-run`: the derived key, its state, whether fix would
/// refuse, and the payload's diff. Reads only.
pub async fn rehearse_fix(ops: &QueueOps, id: &str, payload: &str) -> OpsResult<FixRehearsal> {
    let (rec, _) = ops.open_record(id).await?;
    let old = decode(&rec.message, rec.encoding).unwrap_or_else(|_| rec.message.clone());
    let none = Redaction::default();
    let redact = ops.function.as_ref().map_or(&none, |f| &f.redact);
    // As the fix will: a masked value left as the mask gets its own back.
    let restored = redact.restore(payload, &old);
    let payload: &str = &restored;
    let mut report = FixRehearsal {
        id: id.into(),
        old_key: rec.key.clone(),
        new_key: None,
        key_state: None,
        refusal: None,
        diff: payload_diff(&old, payload, redact),
        size_diff: payload.len() as i64 - old.len() as i64,
    };
    let Some(f) = ops.function.clone() else {
        report.refusal = Some(format!("queue {} has no function in this app", ops.queue));
        return Ok(report);
    };
    match derive_key(&f.key, payload) {
        Err(e) => {
            report.refusal = Some(format!(
                "the corrected payload would be poisoned at once: {e}"
            ));
            return Ok(report);
        }
        Ok(k) => report.new_key = k,
    }
    if let Err(e) = crate::message::encode_checked(payload, ops.app.message_encoding) {
        report.refusal = Some(e.to_string());
        return Ok(report);
    }
    if let Some(k) = report.new_key.clone() {
        let state = ops.keys.get(&f.name, &k).await?;
        report.key_state = Some(
            state
                .as_ref()
                .map_or("none".into(), KeyRecord::state_summary),
        );
        if let Some(r) = state.filter(|r| r.status.is_settled()) {
            report.refusal = Some(format!(
                "key {} is already {}: nothing would be put",
                k.as_str(),
                r.status.as_str()
            ));
        }
    }
    Ok(report)
}

/// `poison discard --dry-run`: the record's key, its state, and whether the
/// discard (with `--close-key` if given) would be refused. Reads only.
pub async fn rehearse_discard(
    ops: &QueueOps,
    id: &str,
    close_key: bool,
) -> OpsResult<DiscardRehearsal> {
    let (rec, _) = ops.open_record(id).await?;
    let state = ops.key_record(&rec).await?;
    let refusal = if close_key {
        close_key_refusal(&rec, state.as_ref())
    } else {
        None
    };
    Ok(DiscardRehearsal {
        id: id.into(),
        key: rec.key.clone(),
        key_state: rec.key.as_ref().map(|_| {
            state
                .as_ref()
                .map_or("none".into(), KeyRecord::state_summary)
        }),
        close_key,
        refusal,
    })
}

/// Why `--close-key` would be refused: no key, or an attempt holds it now.
fn close_key_refusal(rec: &PoisonRecord, state: Option<&KeyRecord>) -> Option<String> {
    if rec.key.as_deref().is_none_or(str::is_empty) {
        return Some(format!(
            "record {} has no key; discard it without --close-key",
            rec.message_id
        ));
    }
    let until = state?.lease_live(crate::clock::now_utc())?;
    Some(format!(
        "an attempt holds the key until {}; wait for it",
        crate::idempotency::fmt_time(until)
    ))
}

/// `- old` / `+ new` lines: per JSON leaf (by its pointer) when both payloads
/// are JSON, a leaf `redact` covers shown as [`MASK`] (that it changed still
/// shows); else per text line, unless `redact` has rules: a redacted value
/// could be on any line.
fn payload_diff(old: &str, new: &str, redact: &Redaction) -> Vec<String> {
    let (Ok(a), Ok(b)) = (
        serde_json::from_str::<Value>(old),
        serde_json::from_str::<Value>(new),
    ) else {
        if !redact.is_empty() {
            return vec![format!(
                "{MASK}: not JSON, and this function redacts fields: no line diff"
            )];
        }
        return line_diff(old, new);
    };
    let (a, b) = (leaves(&a), leaves(&b));
    let show = |p: &str, v: &Value| match redact.covers(p) {
        true => MASK.to_string(),
        false => v.to_string(),
    };
    let mut out = Vec::new();
    for (p, v) in &a {
        match b.iter().find(|(q, _)| q == p) {
            Some((_, w)) if w == v => {}
            Some((_, w)) => out.extend([
                format!("- {p}: {}", show(p, v)),
                format!("+ {p}: {}", show(p, w)),
            ]),
            None => out.push(format!("- {p}: {}", show(p, v))),
        }
    }
    for (p, w) in b.iter().filter(|(q, _)| !a.iter().any(|(p, _)| p == q)) {
        out.push(format!("+ {p}: {}", show(p, w)));
    }
    out
}

/// `- old` / `+ new` per text line.
fn line_diff(old: &str, new: &str) -> Vec<String> {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let gone = a
        .iter()
        .filter(|l| !b.contains(l))
        .map(|l| format!("- {l}"));
    let came = b
        .iter()
        .filter(|l| !a.contains(l))
        .map(|l| format!("+ {l}"));
    gone.chain(came).collect()
}

/// Every leaf of a JSON value with its JSON pointer, in document order.
fn leaves(v: &Value) -> Vec<(String, Value)> {
    fn walk(v: &Value, at: String, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, c) in m {
                    walk(
                        c,
                        format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                        out,
                    );
                }
            }
            Value::Array(xs) if !xs.is_empty() => {
                for (i, c) in xs.iter().enumerate() {
                    walk(c, format!("{at}/{i}"), out);
                }
            }
            leaf => out.push((if at.is_empty() { "/".into() } else { at }, leaf.clone())),
        }
    }
    let mut out = Vec::new();
    walk(v, String::new(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::payload_diff;
    use crate::redact::Redaction;

    #[test]
    fn a_renamed_field_is_one_removal_and_one_addition() {
        let none = Redaction::default();
        let d = payload_diff(
            r#"{"acount":"a4","credits":5}"#,
            r#"{"account":"a4","credits":5}"#,
            &none,
        );
        assert_eq!(d, vec![r#"- /acount: "a4""#, r#"+ /account: "a4""#]);
        let d = payload_diff(r#"{"n":{"x":1}}"#, r#"{"n":{"x":2}}"#, &none);
        assert_eq!(d, vec!["- /n/x: 1", "+ /n/x: 2"]);
        assert_eq!(payload_diff("a\nb", "a\nc", &none), vec!["- b", "+ c"]);
    }

    /// A redacted leaf's change shows, never its values; nor do the lines
    /// of a payload that is not JSON.
    #[test]
    fn a_redacted_leaf_shows_as_the_mask() {
        let red = Redaction::parse(&["/items/*/pan".into()]).unwrap();
        let d = payload_diff(
            r#"{"items":[{"pan":"4111","q":1}]}"#,
            r#"{"items":[{"sku":"s"},{"pan":"5500","q":2}]}"#,
            &red,
        );
        let text = d.join("\n");
        assert!(!text.contains("4111") && !text.contains("5500"), "{text}");
        assert!(text.contains("- /items/0/pan: [redacted]"), "{text}");
        assert!(text.contains("+ /items/1/pan: [redacted]"), "{text}");
        assert!(text.contains("+ /items/0/sku: \"s\""), "{text}");
        let d = payload_diff("pan=4111", "pan=5500", &red);
        assert!(
            !d.join("").contains("4111") && !d.join("").contains("5500"),
            "{d:?}"
        );
    }
}

//! A poison payload made safe to look at. The payload is attacker-controlled
//! bytes: it is decoded per the record's encoding, shown as pretty JSON or
//! text when it is UTF-8, and otherwise lossily (U+FFFD for each bad
//! sequence) next to a hex dump; control and bidirectional-override
//! characters are shown as `\u{…}` escapes. HTML escaping is maud's job.

use aqw_core::message::MessageEncoding;
use aqw_core::ops::ShowReport;
use aqw_core::poison::PoisonRecord;
use base64::Engine as _;

/// How many bytes of a binary payload the hex dump shows.
const HEX_MAX: usize = 4096;

/// A payload, ready to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayloadView {
    /// Valid JSON, pretty-printed.
    Json(String),
    /// Valid UTF-8, not JSON.
    Text(String),
    /// Not UTF-8: a lossy rendering and a hex dump of the first bytes.
    Binary {
        lossy: String,
        hex: String,
        len: usize,
        valid_up_to: usize,
    },
    /// The message text is not valid base64 (messageEncoding base64).
    Undecodable { why: String, raw: String },
}

impl PayloadView {
    pub fn of(rec: &PoisonRecord) -> Self {
        let bytes = match rec.encoding {
            MessageEncoding::None => rec.message.as_bytes().to_vec(),
            MessageEncoding::Base64 => {
                match base64::engine::general_purpose::STANDARD.decode(rec.message.trim()) {
                    Ok(b) => b,
                    Err(e) => {
                        return PayloadView::Undecodable {
                            why: format!("not valid base64 (messageEncoding is base64): {e}"),
                            raw: printable(&rec.message),
                        }
                    }
                }
            }
        };
        Self::of_bytes(bytes)
    }

    pub fn of_bytes(bytes: Vec<u8>) -> Self {
        match String::from_utf8(bytes) {
            Ok(text) => match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(v) => {
                    PayloadView::Json(printable(&serde_json::to_string_pretty(&v).unwrap_or(text)))
                }
                Err(_) => PayloadView::Text(printable(&text)),
            },
            Err(e) => {
                let valid_up_to = e.utf8_error().valid_up_to();
                let bytes = e.into_bytes();
                PayloadView::Binary {
                    lossy: printable(&String::from_utf8_lossy(&bytes)),
                    hex: hex_dump(&bytes),
                    len: bytes.len(),
                    valid_up_to,
                }
            }
        }
    }

    /// What the record page shows of a `poison show` report, and the text
    /// its fix form starts from. A claim-checked record shows its job's
    /// body, fetched through a reference checked for the record's queue and
    /// masked by the function's `redact` (`report.payload_text`), never the
    /// reference; when the body cannot be had, why, and the reference.
    pub fn of_report(report: &ShowReport) -> (Self, String) {
        let rec = &report.record;
        let reference = aqw_core::message::decode(&rec.message, rec.encoding)
            .is_ok_and(|p| aqw_core::claim::is_reference(&p));
        match (&report.payload_text, &report.decode_error) {
            (Some(body), _) if reference => {
                (Self::of_bytes(body.clone().into_bytes()), body.clone())
            }
            (None, Some(why)) if reference => {
                let why = format!("The claim-checked body cannot be shown: {why}");
                let raw = printable(&Self::editable(rec));
                (PayloadView::Undecodable { why, raw }, String::new())
            }
            _ => (Self::of(rec), Self::editable(rec)),
        }
    }

    /// The text a fix form starts from (the lossy text for binary payloads).
    pub fn editable(rec: &PoisonRecord) -> String {
        match rec.encoding {
            MessageEncoding::None => rec.message.clone(),
            MessageEncoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(rec.message.trim())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default(),
        }
    }
}

/// `text` with control characters (but newline and tab) and bidirectional
/// overrides written as `\u{…}`, so what is shown is what is there.
pub fn printable(text: &str) -> String {
    let hidden = |c: char| {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}')
    };
    if !text.chars().any(hidden) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden(c) {
            out.push_str(&format!("\\u{{{:04x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// A classic hex dump (offset, 16 bytes, ASCII) of the first [`HEX_MAX`] bytes.
pub fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, chunk) in bytes[..bytes.len().min(HEX_MAX)].chunks(16).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        let ascii: String = chunk
            .iter()
            .map(|&b| {
                if (0x20..0x7f).contains(&b) {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!(
            "{:08x}  {:<47}  |{ascii}|\n",
            i * 16,
            hex.join(" ")
        ));
    }
    if bytes.len() > HEX_MAX {
        out.push_str(&format!("… {} more bytes\n", bytes.len() - HEX_MAX));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_utf8_renders_lossily_with_a_hex_dump() {
        let v = PayloadView::of_bytes(b"{\"a\":\"\xff\xfe<script>\"}".to_vec());
        let PayloadView::Binary {
            lossy,
            hex,
            len,
            valid_up_to,
        } = v
        else {
            panic!("{v:?}")
        };
        assert_eq!((len, valid_up_to), (18, 6));
        assert!(lossy.contains('\u{FFFD}') && lossy.contains("<script>"));
        assert!(
            hex.starts_with("00000000  7b 22 61 22 3a 22 ff fe"),
            "{hex}"
        );
    }

    #[test]
    fn controls_and_bidi_overrides_are_shown_escaped() {
        assert_eq!(
            printable("a\u{202E}b\u{1b}[31m\n"),
            "a\\u{202e}b\\u{001b}[31m\n"
        );
        assert_eq!(printable("plain\ttext"), "plain\ttext");
    }

    #[test]
    fn json_is_pretty_and_text_is_kept() {
        assert_eq!(
            PayloadView::of_bytes(br#"{"a":1}"#.to_vec()),
            PayloadView::Json("{\n  \"a\": 1\n}".into())
        );
        assert_eq!(
            PayloadView::of_bytes(b"not json".to_vec()),
            PayloadView::Text("not json".into())
        );
        let big = PayloadView::of_bytes(vec![0xff; 5000]);
        let PayloadView::Binary { hex, .. } = big else {
            panic!()
        };
        assert!(hex.ends_with("… 904 more bytes\n"));
    }
}

//! Secrets never reach a log line, an error or a record: [`scrub`] removes
//! account keys, SAS signatures, `Authorization` values and bearer tokens.
//! The binary's log writer runs every line through it as a last line of
//! defence.

use regex::Regex;
use std::sync::OnceLock;

/// What [`scrub`] removes: (pattern, replacement).
const SECRET_PATTERNS: &[(&str, &str)] = &[
    (r"(?i)(AccountKey\s*=\s*)[^;\s]+", "${1}***"),
    (r"(?i)(SharedAccessSignature\s*=\s*)[^;\s]+", "${1}***"),
    (r"(?i)([?&;]sig=)[^&\s;]+", "${1}***"),
    (
        r"(?i)(authorization[\x22']?\s*[:=]\s*[\x22']?)(Bearer|SharedKey|Basic)?\s*[^\s\x22',]+",
        "${1}***",
    ),
    (r"(?i)(bearer\s+)[A-Za-z0-9\-._~+/]+=*", "${1}***"),
    // A SharedKey signature wherever it appears (the SDK's debug lines
    // print headers in Debug form, not as "Authorization: ...").
    (
        r"(SharedKey(?:Lite)?\s+[A-Za-z0-9]+:)[A-Za-z0-9+/=]+",
        "${1}***",
    ),
    // A bare storage account key: 64 bytes in base64.
    (r"[A-Za-z0-9+/]{86}==", "***"),
];

fn patterns() -> &'static [(Regex, &'static str)] {
    static P: OnceLock<Vec<(Regex, &'static str)>> = OnceLock::new();
    P.get_or_init(|| {
        SECRET_PATTERNS
            .iter()
            .map(|(re, rep)| (Regex::new(re).unwrap(), *rep))
            .collect()
    })
}

/// All patterns at once: one pass over a line that holds no secret (every
/// log line goes through [`scrub`]), instead of one pass per pattern.
fn any_secret() -> &'static regex::RegexSet {
    static S: OnceLock<regex::RegexSet> = OnceLock::new();
    S.get_or_init(|| regex::RegexSet::new(SECRET_PATTERNS.iter().map(|(re, _)| re)).unwrap())
}

/// Remove secrets from text bound for a log line, an error or a record.
pub fn scrub(text: &str) -> String {
    scrubbed(text).into_owned()
}

/// Words without which no pattern of [`SECRET_PATTERNS`] can match (each
/// pattern but the bare key contains one, in any case).
const SECRET_MARKERS: &[&str] = &[
    "accountkey",
    "sharedaccesssignature",
    "sig=",
    "authorization",
    "bearer",
    "sharedkey",
];

/// Whether `text` could hold a secret: one of [`SECRET_MARKERS`], or a
/// base64 run as long as a bare account key. A cheap test first because
/// every log line is scrubbed and almost none holds a secret: the regex set
/// cost some 40 k instructions per `aqw run` job line (callgrind), this
/// scan a few hundred.
fn may_hold_secret(text: &str) -> bool {
    static MARKERS: OnceLock<aho_corasick::AhoCorasick> = OnceLock::new();
    let markers = MARKERS.get_or_init(|| {
        aho_corasick::AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(SECRET_MARKERS)
            .expect("static markers")
    });
    if markers.is_match(text) {
        return true;
    }
    let mut run = 0usize;
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b == b'+' || b == b'/' {
            run += 1;
            if run >= 86 {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

/// [`scrub`] without a copy when there is nothing to remove.
pub fn scrubbed(text: &str) -> std::borrow::Cow<'_, str> {
    let mut out = std::borrow::Cow::Borrowed(text);
    if !may_hold_secret(text) || !any_secret().is_match(text) {
        return out;
    }
    for (re, rep) in patterns() {
        if re.is_match(&out) {
            out = std::borrow::Cow::Owned(re.replace_all(&out, *rep).into_owned());
        }
    }
    out
}

/// Whether `c` must not reach a terminal, a log line or a page as it is:
/// a control character (but newline and tab) or a bidirectional override
/// or isolate (or a directional mark), which can forge a line, recolour a terminal or reorder the
/// text around it.
fn hidden_char(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(
            c,
            '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}'
        )
}

/// `text` with control characters (but newline and tab) and bidirectional
/// overrides written as `\u{…}`, so what is shown is what is there: for a
/// person's terminal, the dashboard and chat alerts (issue 40).
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    escape_hidden(text, |c, out| {
        out.push_str(&format!("\\u{{{:04x}}}", c as u32))
    })
}

/// `text` with the same characters written as JSON's `\uXXXX` escapes: for
/// output that may be JSON (a log line, `--output json`), where the escape
/// stays valid and decodes to the same text.
pub fn json_safe(text: &str) -> std::borrow::Cow<'_, str> {
    escape_hidden(text, |c, out| out.push_str(&format!("\\u{:04x}", c as u32)))
}

/// One line of free text (a reason, a key, an error) for a line of
/// output: [`printable`], newlines and tabs escaped too.
pub fn one_line(text: &str) -> String {
    printable(text).replace('\n', "\\n").replace('\t', "\\t")
}

fn escape_hidden(text: &str, escape: impl Fn(char, &mut String)) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(hidden_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden_char(c) {
            escape(c, &mut out);
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_characters_are_shown_escaped() {
        assert_eq!(
            printable("a\u{202E}b\u{1b}[31m\n"),
            "a\\u{202e}b\\u{001b}[31m\n"
        );
        assert_eq!(printable("plain\ttext"), "plain\ttext");
        assert_eq!(json_safe("x\u{202E}y"), "x\\u202ey");
        let decoded: String =
            serde_json::from_str(&format!("\"{}\"", json_safe("x\u{202E}y"))).unwrap();
        assert_eq!(
            decoded, "x\u{202E}y",
            "the JSON escape decodes to the same text"
        );
        assert_eq!(one_line("a\nINFO forged"), "a\\nINFO forged");
    }

    #[test]
    fn scrub_removes_secrets() {
        let key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
        let cases = [
            format!(
                "DefaultEndpointsProtocol=https;AccountName=a;AccountKey={key};EndpointSuffix=x"
            ),
            "GET https://a.queue.core.windows.net/q?sv=2022&sig=abc%2Bdef%3D&se=1".to_string(),
            "Authorization: SharedKey devstoreaccount1:c2lnbmF0dXJl".to_string(),
            r#"HeaderName("authorization"): HeaderValue("SharedKey devstoreaccount1:c2lnbmF0dXJl=")"#.to_string(),
            "authorization=Bearer eyJhbGciOi.payload.sig".to_string(),
            "token bearer eyJhbGciOiJIUzI1NiJ9.e30.abc".to_string(),
            format!("the key is {key}"),
            "SharedAccessSignature=sv=2022&sig=zzz".to_string(),
        ];
        for c in cases {
            let s = scrub(&c);
            assert!(!s.contains(key), "{s}");
            assert!(!s.contains("abc%2Bdef"), "{s}");
            assert!(!s.contains("c2lnbmF0dXJl"), "{s}");
            assert!(!s.contains("eyJhbGciOi"), "{s}");
            assert!(!s.contains("zzz"), "{s}");
        }
        assert_eq!(scrub("plain text, no secrets"), "plain text, no secrets");
    }

    /// The cheap pre-test never lets a line through that a pattern would
    /// change: every case above is flagged, and so is any text a pattern
    /// matches (checked on the patterns' own shapes in mixed case).
    #[test]
    fn the_pre_test_flags_everything_a_pattern_matches() {
        let key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
        let samples = [
            "ACCOUNTKEY = abc".to_string(),
            "sharedAccessSignature=x".to_string(),
            "https://h/q?SIG=abc".to_string(),
            "AUTHORIZATION: token".to_string(),
            "BeArEr abc.def".to_string(),
            "SharedKeyLite acct:c2ln".to_string(),
            format!("x {key} y"),
        ];
        for s in &samples {
            assert!(any_secret().is_match(s), "pattern should match: {s}");
            assert!(may_hold_secret(s), "pre-test let through: {s}");
            assert_ne!(scrub(s), *s, "not scrubbed: {s}");
        }
        for s in [
            "{\"event\":\"aqw.job.completed\",\"trace_id\":\"4bf92f3577b34da6a3ce929d0e0e4736\"}",
            "signal",
            "a/b+c",
        ] {
            assert!(!may_hold_secret(s), "{s}");
        }
    }
}

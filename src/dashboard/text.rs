//! Free text on a page: the one way a key, an error, a reason, a name or a
//! cause reaches HTML (issue 48: right-to-left overrides and ESC still
//! reached the list's error column, the group list, chart titles, the key
//! state and the reviews, each rendered as its own `(value)`).
//!
//! [`Text`] renders through [`neutralise`]: secrets scrubbed, then every
//! control character (C0 and C1, ESC included, but newline and tab) and
//! every bidirectional control (U+202A–U+202E, U+2066–U+2069, U+200E,
//! U+200F, U+061C) written as a visible `\u{…}`; maud escapes the HTML. A
//! view shows free text as `(Text(&s))`; a bare `(s)` is for what the
//! dashboard itself composed (counts, states, times it formatted).

use maud::Render;

/// `text` as a page shows it: [`aqw_core::scrub::scrub`] then
/// [`aqw_core::scrub::printable`]. The only neutralising function of the
/// dashboard's views.
pub fn neutralise(text: &str) -> String {
    aqw_core::scrub::printable(&aqw_core::scrub::scrub(text)).into_owned()
}

/// Free text, neutralised when rendered.
#[derive(Debug, Clone, Copy)]
pub struct Text<'a>(pub &'a str);

impl Render for Text<'_> {
    fn render_to(&self, buffer: &mut String) {
        neutralise(self.0).as_str().render_to(buffer);
    }
}

/// `Text` of an optional value, `-` when there is none.
pub fn or_dash(text: Option<&str>) -> Text<'_> {
    Text(text.unwrap_or("-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_escapes_and_markup_are_shown_not_obeyed() {
        let hostile = "a\u{202E}b\u{1b}[31mc\u{2066}d\u{200F}e\u{061C}f\u{9b}g<b>";
        let html = maud::html! { td { (Text(hostile)) } }.into_string();
        for raw in [
            '\u{202E}', '\u{1b}', '\u{2066}', '\u{200F}', '\u{061C}', '\u{9b}',
        ] {
            assert!(!html.contains(raw), "{raw:?} in {html}");
        }
        assert!(
            html.contains("\\u{202e}") && html.contains("&lt;b&gt;"),
            "{html}"
        );
    }
}

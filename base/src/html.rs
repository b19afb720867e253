//! Server-rendered HTML pages for people (the embedded registry's status page, the admin's
//! dashboard): a [`Page`] writes tags the code names and text it escapes, so a page cannot
//! carry markup from its data (a hostile instance's `hostName`, say). No script: the answer's
//! `Content-Security-Policy` allows none, and inline styles only ([`response`]).

use std::fmt::Write as _;
use std::time::Duration;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// The answer's `Content-Security-Policy`: nothing but the page's own inline style.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `text` with `&`, `<`, `>`, `"` and `'` written as character references: safe between tags
/// and in a quoted attribute value.
pub fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains(['&', '<', '>', '"', '\'']) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out.into()
}

/// The one style every page shares.
const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:0 2em 2em;color:#222}\
h1{font-size:1.5em;margin:.8em 0 .2em}h2{font-size:1.15em;margin:1.4em 0 .4em;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:.3em 0}th,td{text-align:left;padding:.2em .7em;border-bottom:1px solid #eee;vertical-align:top}td.w{overflow-wrap:anywhere;min-width:5em}\
th{background:#f3f3f3}td.n{text-align:right}.muted{color:#777}.ok{color:#171}.warn{color:#a60}.bad{color:#b11;font-weight:bold}\
.alert{background:#fdd;border:1px solid #b11;color:#b11;padding:.5em 1em;margin:1em 0;font-weight:bold}\
.note{background:#fff6dd;border:1px solid #d9b200;padding:.5em 1em;margin:1em 0}code{font-size:.95em}";

/// A page being written: the code names the tags (`&'static str`), and every text and
/// attribute value is escaped on the way in.
#[derive(Debug)]
pub struct Page {
    out: String,
}

impl Page {
    /// A page titled `title`, with the shared style; its body is open.
    pub fn new(title: &str) -> Page {
        let mut page = Page {
            out: String::with_capacity(16 * 1024),
        };
        page.out
            .push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
        page.out
            .push_str("<meta name=\"viewport\" content=\"width=device-width\">");
        let _ = write!(page.out, "<title>{}</title>", escape(title));
        let _ = writeln!(page.out, "<style>{STYLE}</style></head><body>");
        page
    }

    /// Opens `tag`, with `class` unless empty.
    pub fn open(&mut self, tag: &'static str, class: &'static str) -> &mut Page {
        self.out.push('<');
        self.out.push_str(tag);
        if !class.is_empty() {
            let _ = write!(self.out, " class=\"{class}\"");
        }
        self.out.push('>');
        self
    }

    /// Opens `tag` with the `id` `id` (escaped), for a link to it.
    pub fn open_with_id(&mut self, tag: &'static str, id: &str) -> &mut Page {
        let _ = write!(self.out, "<{tag} id=\"{}\">", escape(id));
        self
    }

    /// Closes `tag`.
    pub fn close(&mut self, tag: &'static str) -> &mut Page {
        let _ = write!(self.out, "</{tag}>");
        if matches!(tag, "p" | "div" | "table" | "tr" | "ul" | "li" | "section") {
            self.out.push('\n');
        }
        self
    }

    /// `text`, escaped.
    pub fn text(&mut self, text: &str) -> &mut Page {
        self.out.push_str(&escape(text));
        self
    }

    /// `<tag class="class">text</tag>`, the text escaped.
    pub fn el(&mut self, tag: &'static str, class: &'static str, text: &str) -> &mut Page {
        self.open(tag, class).text(text).close(tag)
    }

    /// A link to `href` (escaped; only a path or fragment of this server: the caller's
    /// constant, or a query it built) with `text`.
    pub fn link(&mut self, href: &str, text: &str) -> &mut Page {
        let _ = write!(
            self.out,
            "<a href=\"{}\">{}</a>",
            escape(href),
            escape(text)
        );
        self
    }

    /// A table with `headers`; [`Page::row`] adds rows, [`Page::close`]`("table")` ends it.
    pub fn table(&mut self, headers: &[&str]) -> &mut Page {
        self.open("table", "").open("tr", "");
        for h in headers {
            self.el("th", "", h);
        }
        self.close("tr")
    }

    /// One table row of `cells`.
    pub fn row(&mut self, cells: &[Cell]) -> &mut Page {
        self.open("tr", "");
        for cell in cells {
            self.el("td", cell.class, &cell.text);
        }
        self.close("tr")
    }

    /// A two-column table of `(name, value)`.
    pub fn facts(&mut self, facts: &[(&str, Cell)]) -> &mut Page {
        self.open("table", "");
        for (name, value) in facts {
            self.open("tr", "").el("th", "", name);
            self.el("td", value.class, &value.text).close("tr");
        }
        self.close("table")
    }

    /// The page, closed.
    pub fn finish(mut self) -> String {
        self.out.push_str("</body></html>\n");
        self.out
    }
}

/// A table cell: its text (escaped when written) and a class of the shared style.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    pub text: String,
    pub class: &'static str,
}

impl Cell {
    /// `text`, plain.
    pub fn new(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            class: "",
        }
    }

    /// `text` in `class` (`ok`, `warn`, `bad`, `muted`, `n` for numbers, `w` for long text).
    pub fn with(text: impl Into<String>, class: &'static str) -> Cell {
        Cell {
            text: text.into(),
            class,
        }
    }

    /// Long text that may break anywhere (a host name, an error), so that it does not widen
    /// the page.
    pub fn wrap(text: impl Into<String>) -> Cell {
        Cell::with(text, "w")
    }

    /// A number, right-aligned.
    pub fn number(n: impl std::fmt::Display) -> Cell {
        Cell::with(n.to_string(), "n")
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Cell {
        Cell::new(text)
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Cell {
        Cell::new(text)
    }
}

/// `body` as an HTML answer: UTF-8, no script, not sniffed, not cached, not framed.
pub fn response(body: String) -> Response {
    let mut answer = body.into_response();
    let headers = answer.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    answer
}

/// A duration for people, to the second: `45 s`, `3 min 12 s`, `2 h 5 min`, `3 d 4 h`.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        3600..86400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86400, s % 86400 / 3600),
    }
}

/// The time `unix_ms` (milliseconds since the Unix epoch) in UTC, `2026-12-06 01:02:03Z`.
pub fn utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rest) = (secs / 86400, secs % 86400);
    // Days to a civil date (Howard Hinnant's `civil_from_days`), for dates after 1970.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_writes_every_markup_character_as_a_reference() {
        assert_eq!(
            escape(r#"<script>alert(1)</script>"><img src=x onerror='a&b'>"#),
            "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=&#39;a&amp;b&#39;&gt;"
        );
        assert!(matches!(
            escape("plain-text 1.2"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(escape("é ✓"), "é ✓");
    }

    #[test]
    fn a_page_escapes_every_text_cell_attribute_and_title() {
        let evil = "<script>alert(1)</script>\"'&";
        let mut page = Page::new(evil);
        page.el("h1", "", evil).open_with_id("section", evil);
        page.table(&[evil])
            .row(&[Cell::with(evil, "bad")])
            .close("table");
        page.facts(&[(evil, Cell::new(evil))]).link(evil, evil);
        let html = page.finish();
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("\"'&"), "{html}");
        assert_eq!(html.matches("&lt;script&gt;").count(), 9, "{html}");
        assert!(html.contains("<td class=\"bad\">&lt;script"), "{html}");
    }

    #[test]
    fn the_answer_is_html_without_script() {
        let answer = response(Page::new("t").finish());
        let header = |name| answer.headers()[name].to_str().unwrap().to_owned();
        assert_eq!(header(header::CONTENT_TYPE), "text/html; charset=utf-8");
        assert_eq!(header(header::X_CONTENT_TYPE_OPTIONS), "nosniff");
        let csp = header(header::CONTENT_SECURITY_POLICY);
        assert!(
            csp.starts_with("default-src 'none'; style-src 'unsafe-inline'"),
            "{csp}"
        );
    }

    #[test]
    fn ages_and_times_read_as_people_write_them() {
        let s = Duration::from_secs;
        assert_eq!(age(s(45)), "45 s");
        assert_eq!(age(s(192)), "3 min 12 s");
        assert_eq!(age(s(7500)), "2 h 5 min");
        assert_eq!(age(s(3 * 86400 + 4 * 3600)), "3 d 4 h");
        assert_eq!(utc(0), "1970-01-01 00:00:00Z");
        // date -u -d @1796518923 → Sun Dec  6 01:02:03 UTC 2026
        assert_eq!(utc(1_796_518_923_000), "2026-12-06 01:02:03Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00Z");
    }
}

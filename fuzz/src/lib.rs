//! Oracles shared by the fuzz targets: what "well-formed XML" and "the same text" mean,
//! written independently of the code under test.
#![forbid(unsafe_code)]

/// Whether XML 1.0 allows `c` anywhere in a document (its `Char` production).
pub fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
}

/// `text` as a reader of the writer's XML gets it back: every character XML forbids
/// replaced by U+FFFD (the writer's documented replacement), everything else unchanged.
pub fn as_read_back(text: &str) -> String {
    text.chars()
        .map(|c| if is_xml_char(c) { c } else { '\u{fffd}' })
        .collect()
}

/// Parses `xml` as a whole document, panicking (a fuzzing failure) with the reason and the
/// document if it holds a character XML 1.0 forbids or is not well-formed.
pub fn parse_xml(xml: &str) -> roxmltree::Document<'_> {
    if let Some((at, c)) = xml.char_indices().find(|&(_, c)| !is_xml_char(c)) {
        panic!("the XML holds {c:?}, which XML 1.0 forbids, at byte {at}: {xml:?}");
    }
    match roxmltree::Document::parse(xml) {
        Ok(doc) => doc,
        Err(e) => panic!("the XML is not well-formed ({e}): {xml:?}"),
    }
}

/// The element children of `node`.
pub fn elements<'a, 'input>(
    node: roxmltree::Node<'a, 'input>,
) -> impl Iterator<Item = roxmltree::Node<'a, 'input>> {
    node.children().filter(roxmltree::Node::is_element)
}

/// The text of an element that holds only text (`""` when empty), panicking if it has
/// element children.
pub fn text_of(node: roxmltree::Node<'_, '_>) -> String {
    assert!(
        elements(node).next().is_none(),
        "<{}> should hold only text",
        node.tag_name().name()
    );
    node.children()
        .filter_map(|n| n.text())
        .collect::<Vec<_>>()
        .concat()
}

/// Whether `name` is an XML name as the writer promises them: ASCII letters, digits and
/// `_ - .`, starting with a letter or `_`, not with `xml`.
pub fn is_plain_xml_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !name.to_ascii_lowercase().starts_with("xml")
}

/// Publishes what `eureka` holds (its publisher, run once) and checks that the model it
/// publishes on `rx` is that of its full document: the same instances (its apps are
/// published in shards, in another order), nothing changed between them, and the same
/// completeness. Panics (a fuzzing failure) otherwise.
pub fn assert_published_is_the_full_document(
    eureka: &odmesh_eureka::server::EurekaRegistry,
    rx: &tokio::sync::watch::Receiver<std::sync::Arc<odmesh_registry::Registry>>,
) {
    runtime().block_on(async {
        let publisher = tokio::spawn(eureka.clone().run_publisher());
        eureka.published().await;
        publisher.abort();
        // Wait for the task to go, so that nothing of this input outlives it.
        let _ = publisher.await;
    });
    let full = eureka.applications().to_registry().registry;
    let published = rx.borrow().clone();
    let sorted = |r: &odmesh_registry::Registry| {
        let mut all: Vec<odmesh_registry::Instance> =
            r.instances().map(|i| (**i).clone()).collect();
        all.sort_by(|a, b| (&a.app, &a.instance_id).cmp(&(&b.app, &b.instance_id)));
        all
    };
    assert_eq!(
        sorted(&published),
        sorted(&full),
        "the published model is not that of the full document"
    );
    assert!(published.changes_since(&full).is_empty());
    assert_eq!(published.is_complete(), full.is_complete());
}

/// Panics (a fuzzing failure) unless `error` says why: the last error of its chain, the
/// cause the others wrap, has a message. (A level that only adds context may be empty:
/// `odmesh_base::error::Chain`, which logs them, leaves it out.)
pub fn assert_says_why(error: &(dyn std::error::Error + 'static)) {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    assert!(
        !cause.to_string().trim().is_empty(),
        "a refusal without a reason: {error:?}"
    );
}

/// One runtime for every input of a target (a current-thread one, with time).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a tokio runtime")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_characters_are_the_c0_controls_but_tab_lf_cr_and_fffe_ffff() {
        for c in [
            '\u{0}', '\u{8}', '\u{b}', '\u{c}', '\u{1f}', '\u{fffe}', '\u{ffff}',
        ] {
            assert!(!is_xml_char(c), "{c:?}");
        }
        for c in ['\t', '\n', '\r', ' ', '\u{7f}', '\u{fffd}', '\u{10ffff}'] {
            assert!(is_xml_char(c), "{c:?}");
        }
    }

    #[test]
    #[should_panic(expected = "forbids")]
    fn a_document_with_a_forbidden_character_is_refused() {
        parse_xml("<a>\u{ffff}</a>");
    }

    #[test]
    #[should_panic(expected = "not well-formed")]
    fn a_document_with_a_bad_name_is_refused() {
        parse_xml("<a><1b/></a>");
    }
}

//! Which plugin a request belongs to: the filter's bookkeeping of proxy-wasm contexts.
//!
//! One wasm VM can hold several plugins, each a root context with its own configuration: Envoy
//! shares a VM between every wasm filter with the same `vm_config` (its key is the VM id, the
//! VM configuration and the code, not the plugin configuration). Two listeners with different
//! odmesh configurations share one, and so do the old and the new configuration while a
//! listener update drains. The host tells the filter which root a new HTTP context belongs to
//! in `proxy_on_context_create(context, root)` only; `proxy_on_request_headers` names just the
//! context. [`Contexts`] keeps what it takes to get from one to the other:
//!
//! - every root context's plugin, set by its `proxy_on_configure`;
//! - the HTTP context created last, and its root.
//!
//! Only the last creation is kept because Envoy creates a filter's context in the VM right
//! before the request headers reach it (`Context::decodeHeaders` calls `onCreate`, then
//! `onRequestHeaders`, with no other call into the VM between). The one other place Envoy
//! creates a context is the access log of a request that never reached the filter (an earlier
//! filter answered it); that context gets no request headers, and since the filter exports no
//! `proxy_on_delete` (it would cost a VM entry per request) nothing would say it ended: a map
//! of contexts would grow by one entry per such request.
//!
//! Root contexts are never removed, for the same reason. A VM gains one entry per root context
//! it ever starts (a plugin, or a listener update that replaces one): a context id and a
//! shared pointer, since roots with equal plugins share one (see [`Contexts::find`]).

use std::collections::BTreeMap;
use std::rc::Rc;

/// The plugins of one VM by root context id, and the root of the HTTP context created last.
#[derive(Debug)]
pub struct Contexts<P> {
    roots: BTreeMap<u32, Rc<P>>,
    /// `(context id, root context id)` of the HTTP context created last, until its request
    /// headers arrive.
    created: Option<(u32, u32)>,
}

impl<P> Default for Contexts<P> {
    fn default() -> Self {
        Contexts::new()
    }
}

impl<P> Contexts<P> {
    /// No plugins, no contexts.
    pub const fn new() -> Self {
        Contexts {
            roots: BTreeMap::new(),
            created: None,
        }
    }

    /// Records the plugin of root context `root` (configured, or configured again).
    pub fn configure(&mut self, root: u32, plugin: Rc<P>) {
        self.roots.insert(root, plugin);
    }

    /// A plugin already in use that satisfies `matches`, to share rather than build another.
    pub fn find(&self, matches: impl Fn(&P) -> bool) -> Option<Rc<P>> {
        self.roots.values().find(|p| matches(p)).cloned()
    }

    /// Records a context the host created: an HTTP context of root `root`, or, when `root` is
    /// 0, a root context (which has nothing to record until it is configured).
    pub fn created(&mut self, context: u32, root: u32) {
        if root != 0 {
            self.created = Some((context, root));
        }
    }

    /// The plugin whose configuration HTTP context `context` must use.
    ///
    /// That is its root's, when `context` is the HTTP context created last; else, if the VM
    /// has a single plugin, that one (a host that creates contexts earlier still works while
    /// there is no choice). `None` when it cannot be told: the context's root is not
    /// configured, or there are several plugins and the context was not the last created.
    pub fn plugin(&mut self, context: u32) -> Option<Rc<P>> {
        match self.created {
            Some((created, root)) if created == context => {
                self.created = None;
                self.roots.get(&root).cloned()
            }
            _ if self.roots.len() == 1 => self.roots.values().next().cloned(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_plugins() -> Contexts<&'static str> {
        let mut contexts = Contexts::new();
        contexts.configure(1, Rc::new("egress"));
        contexts.configure(2, Rc::new("ingress"));
        contexts
    }

    #[test]
    fn a_request_uses_the_plugin_of_the_root_its_context_was_created_for() {
        let mut contexts = two_plugins();
        contexts.created(10, 2);
        assert_eq!(contexts.plugin(10).as_deref(), Some(&"ingress"));
        contexts.created(11, 1);
        assert_eq!(contexts.plugin(11).as_deref(), Some(&"egress"));
        contexts.created(12, 2);
        assert_eq!(contexts.plugin(12).as_deref(), Some(&"ingress"));
    }

    #[test]
    fn a_context_created_only_for_the_access_log_is_forgotten_at_the_next_creation() {
        let mut contexts = two_plugins();
        contexts.created(10, 1);
        contexts.created(11, 2);
        assert_eq!(contexts.plugin(11).as_deref(), Some(&"ingress"));
    }

    #[test]
    fn with_several_plugins_a_context_that_was_not_the_last_created_has_none() {
        let mut contexts = two_plugins();
        contexts.created(10, 1);
        contexts.created(11, 2);
        assert_eq!(contexts.plugin(10), None);
        assert_eq!(contexts.plugin(11).as_deref(), Some(&"ingress"));
        assert_eq!(contexts.plugin(11), None, "the record is used once");
    }

    #[test]
    fn with_a_single_plugin_any_context_uses_it() {
        let mut contexts = Contexts::new();
        contexts.configure(1, Rc::new("only"));
        assert_eq!(contexts.plugin(7).as_deref(), Some(&"only"));
        contexts.created(8, 1);
        contexts.created(9, 1);
        assert_eq!(contexts.plugin(8).as_deref(), Some(&"only"));
    }

    #[test]
    fn a_context_of_a_root_that_is_not_configured_has_no_plugin() {
        let mut contexts = Contexts::new();
        contexts.configure(1, Rc::new("configured"));
        contexts.created(10, 3);
        assert_eq!(contexts.plugin(10), None);
        let mut empty: Contexts<&str> = Contexts::new();
        assert_eq!(empty.plugin(10), None);
    }

    #[test]
    fn creating_a_root_context_changes_nothing() {
        let mut contexts = two_plugins();
        contexts.created(10, 2);
        contexts.created(3, 0);
        assert_eq!(contexts.plugin(10).as_deref(), Some(&"ingress"));
    }

    #[test]
    fn a_root_configured_again_gets_its_new_plugin() {
        let mut contexts = two_plugins();
        contexts.configure(2, Rc::new("ingress v2"));
        contexts.created(10, 2);
        assert_eq!(contexts.plugin(10).as_deref(), Some(&"ingress v2"));
    }

    #[test]
    fn an_equal_plugin_in_use_can_be_found_and_shared() {
        let contexts = two_plugins();
        let found = contexts.find(|p| *p == "ingress").expect("in use");
        assert!(Rc::ptr_eq(&found, &contexts.roots[&2]));
        assert_eq!(contexts.find(|p| *p == "other"), None);
    }
}

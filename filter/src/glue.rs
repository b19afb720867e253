//! The filter's callbacks: the thin layer between the host ([`crate::abi`]) and
//! [`crate::mapping`].
//!
//! - `on_initialize` sends panic messages to Envoy's log;
//! - `on_configure` parses a root context's plugin configuration once, refuses a bad one with a
//!   critical log line that names the field (Envoy then refuses the filter), and defines the
//!   counters;
//! - `on_context_create` notes which plugin a new HTTP context belongs to ([`Contexts`]);
//! - `on_request_headers` does, per request, one read of the destination header, one mapping,
//!   one write of the cluster header (always overwritten, so a client cannot pick a cluster),
//!   removes the secure header if the request has one, and counts; an invalid host gets a
//!   local 400 whose body says what was wrong.

use std::cell::RefCell;
use std::rc::Rc;

use odmesh_names::Kind;

use crate::abi::{self, Action, LogLevel};
use crate::config::Config;
use crate::contexts::Contexts;
use crate::mapping::{is_secure_value, route_request};

/// Counter: requests mapped to a `.vip` cluster (`wasmcustom.odmesh_requests_vip` in `/stats`).
const METRIC_VIP: &str = "odmesh_requests_vip";
/// Counter: requests mapped to a `.svip` cluster.
const METRIC_SVIP: &str = "odmesh_requests_svip";
/// Counter: requests answered with 400 because their host names no valid VIP.
const METRIC_REJECTED: &str = "odmesh_requests_rejected";

/// Fallback destination header when the configured source header is absent.
const HOST_HEADER: &str = "host";

/// The headers of the filter's local replies.
const TEXT_PLAIN: [(&str, &str); 1] = [("content-type", "text/plain; charset=utf-8")];

/// The answer to a request whose plugin cannot be told (see [`Contexts::plugin`]); Envoy's
/// call order makes it unreachable there.
const NO_PLUGIN: &str =
    "odmesh: cannot route this request: the filter does not know which configuration it is under\n";

thread_local! {
    /// This VM's plugins and contexts. A VM runs on one thread, and wasm32-wasip1 has one.
    static CONTEXTS: RefCell<Contexts<Plugin>> = const { RefCell::new(Contexts::new()) };
}

/// Counter ids, as the host returned them; `None` if defining one failed (counting is then
/// skipped, routing is not).
#[derive(Clone, Copy, Debug)]
struct Counters {
    vip: Option<u32>,
    svip: Option<u32>,
    rejected: Option<u32>,
}

impl Counters {
    fn define() -> Counters {
        Counters {
            vip: abi::define_counter(METRIC_VIP),
            svip: abi::define_counter(METRIC_SVIP),
            rejected: abi::define_counter(METRIC_REJECTED),
        }
    }

    fn increment(id: Option<u32>) {
        if let Some(id) = id {
            abi::increment_counter(id);
        }
    }
}

/// What every request of one plugin shares: the configuration and the counters.
#[derive(Debug)]
struct Plugin {
    config: Config,
    counters: Counters,
}

/// `_initialize`: a panic (a bug: the filter has no `unwrap` on its paths) aborts the VM; the
/// hook first puts its message in Envoy's log, as the SDK's did.
pub fn on_initialize() {
    std::panic::set_hook(Box::new(|info| {
        abi::log(LogLevel::Critical, &info.to_string())
    }));
}

/// `proxy_on_configure`: parses root context `root`'s plugin configuration.
pub fn on_configure(root: u32) -> bool {
    let bytes = match abi::plugin_configuration() {
        Ok(bytes) => bytes,
        Err(status) => {
            abi::log(
                LogLevel::Critical,
                &format!("odmesh: cannot read the plugin configuration (host status {status})"),
            );
            return false;
        }
    };
    let config = match Config::parse(&bytes) {
        Ok(config) => config,
        Err(e) => {
            abi::log(LogLevel::Critical, &e.to_string());
            return false;
        }
    };
    // Roots with the same configuration share one plugin (and its counter ids, which stay
    // valid for the VM's life): a root is never removed, so each costs only its entry.
    let shared = CONTEXTS.with_borrow(|contexts| contexts.find(|p| p.config == config));
    let plugin = shared.unwrap_or_else(|| {
        Rc::new(Plugin {
            config,
            counters: Counters::define(),
        })
    });
    CONTEXTS.with_borrow_mut(|contexts| contexts.configure(root, plugin));
    true
}

/// `proxy_on_context_create`: notes which root a new HTTP context belongs to.
pub fn on_context_create(context: u32, root: u32) {
    CONTEXTS.with_borrow_mut(|contexts| contexts.created(context, root));
}

/// `proxy_on_request_headers`: maps the request's host to its cluster.
pub fn on_request_headers(context: u32) -> Action {
    let Some(plugin) = CONTEXTS.with_borrow_mut(|contexts| contexts.plugin(context)) else {
        abi::send_local_response(500, &TEXT_PLAIN, NO_PLUGIN.as_bytes());
        return Action::Pause;
    };
    let config = &plugin.config;
    let counters = plugin.counters;

    let host =
        abi::request_header(&config.source_header).or_else(|| abi::request_header(HOST_HEADER));
    let secure_value = abi::request_header(&config.secure_header);
    let secure = secure_value.as_deref().is_some_and(is_secure_value);

    let route = route_request(host, secure, config);

    match route {
        Ok(route) => {
            abi::set_request_header(&config.cluster_header, &route.cluster);
            if secure_value.is_some() {
                abi::remove_request_header(&config.secure_header);
            }
            Counters::increment(match route.kind {
                Kind::Vip => counters.vip,
                Kind::Svip => counters.svip,
            });
            Action::Continue
        }
        Err(e) => {
            Counters::increment(counters.rejected);
            let mut body = e.to_string();
            body.push('\n');
            abi::send_local_response(400, &TEXT_PLAIN, body.as_bytes());
            Action::Pause
        }
    }
}

//! The odmesh filter as a proxy-wasm module: the shell that runs the pure mapping of
//! `odmesh-filter` in Envoy's wasm VM, on the proxy-wasm SDK, in the shape of the SDK's
//! examples:
//!
//! - the root context parses the plugin configuration once, in `on_configure`, refuses a bad
//!   one (Envoy then refuses the filter) with a log line that names the field, and defines the
//!   counters (`wasmcustom.odmesh_requests_*` in Envoy's `/stats`);
//! - per request, the HTTP context does one read of the headers, one decision
//!   ([`odmesh_filter::mapping::decide`]) and one write: the cluster header (always
//!   overwritten, so a client cannot pick a cluster) or a local 400 that says what was wrong.
//!
//! The same module is also the caller-side concurrency limit (README, "Adaptive concurrency"),
//! as a second plugin of the same VM with the root id [`LIMIT_ROOT_ID`]: off in the bootstrap's
//! chain, switched on by the control plane on the routes to VIPs with a `concurrency_limit`,
//! whose settings it reads from the route's metadata (`odmesh.limit`, the same JSON as the
//! native module's per-route configuration). Its state is in Envoy's shared data ([`shared`]).
//!
//! Built for `wasm32-wasip1`; on other targets only the pure [`shared`] is, for its tests.
#![forbid(unsafe_code)]

pub mod shared;

/// The root id of the limit plugin (`root_id` in the bootstrap); any other is the mapping.
pub const LIMIT_ROOT_ID: &str = "odmesh_limit";
/// Where the limit plugin finds its setting: the route's metadata, `odmesh.limit`.
pub const ROUTE_METADATA_PATH: [&str; 5] = [
    "xds",
    "route_metadata",
    "filter_metadata",
    "odmesh",
    "limit",
];

#[cfg(target_arch = "wasm32")]
mod limit;

#[cfg(target_arch = "wasm32")]
mod shell {
    use std::rc::Rc;

    use odmesh_filter::config::Config;
    use odmesh_filter::mapping::{
        METRIC_REJECTED, METRIC_SVIP, METRIC_VIP, TEXT_PLAIN, Verdict, decide,
    };
    use odmesh_names::Kind;
    use proxy_wasm::hostcalls;
    use proxy_wasm::traits::{Context, HttpContext, RootContext};
    use proxy_wasm::types::{Action, ContextType, LogLevel, MetricType};

    proxy_wasm::main! {{
        proxy_wasm::set_log_level(LogLevel::Warn);
        proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
    }}

    /// Counter ids; `None` if defining one failed (counting is then skipped, routing is not).
    #[derive(Clone, Copy, Debug, Default)]
    struct Counters {
        vip: Option<u32>,
        svip: Option<u32>,
        rejected: Option<u32>,
    }

    impl Counters {
        fn define() -> Counters {
            let define = |name| hostcalls::define_metric(MetricType::Counter, name).ok();
            Counters {
                vip: define(METRIC_VIP),
                svip: define(METRIC_SVIP),
                rejected: define(METRIC_REJECTED),
            }
        }

        fn increment(id: Option<u32>) {
            if let Some(id) = id {
                let _ = hostcalls::increment_metric(id, 1);
            }
        }
    }

    /// What every request of one plugin shares.
    #[derive(Debug)]
    struct Plugin {
        config: Config,
        counters: Counters,
    }

    /// One plugin (root context): its configuration, once parsed; or, under the root id
    /// [`crate::LIMIT_ROOT_ID`], the concurrency limit.
    #[derive(Default)]
    struct Root {
        plugin: Option<Rc<Plugin>>,
        limit: Option<Rc<crate::limit::Plugin>>,
    }

    impl Context for Root {}

    impl RootContext for Root {
        fn on_configure(&mut self, _: usize) -> bool {
            let root_id = self
                .get_property(vec!["plugin_root_id"])
                .unwrap_or_default();
            if root_id == crate::LIMIT_ROOT_ID.as_bytes() {
                self.limit = Some(Rc::new(crate::limit::Plugin::define()));
                return true;
            }
            let bytes = self.get_plugin_configuration().unwrap_or_default();
            match Config::parse(&bytes) {
                Ok(config) => {
                    let counters = Counters::define();
                    self.plugin = Some(Rc::new(Plugin { config, counters }));
                    true
                }
                Err(e) => {
                    let _ = hostcalls::log(LogLevel::Critical, &e.to_string());
                    false
                }
            }
        }

        fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
            if let Some(limit) = &self.limit {
                return Some(Box::new(crate::limit::Request::new(Rc::clone(limit))));
            }
            // Envoy creates HTTP contexts only for a configured plugin.
            let plugin = self.plugin.clone()?;
            Some(Box::new(Request { plugin }))
        }

        fn get_type(&self) -> Option<ContextType> {
            Some(ContextType::HttpContext)
        }
    }

    /// One request.
    struct Request {
        plugin: Rc<Plugin>,
    }

    impl Context for Request {}

    impl HttpContext for Request {
        fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
            let Plugin { config, counters } = &*self.plugin;
            let verdict = decide(config, |name| self.get_http_request_header_bytes(name));
            match verdict {
                Verdict::Route {
                    cluster,
                    kind,
                    remove_secure,
                } => {
                    self.set_http_request_header(&config.cluster_header, Some(&cluster));
                    if remove_secure {
                        self.set_http_request_header(&config.secure_header, None);
                    }
                    Counters::increment(match kind {
                        Kind::Vip => counters.vip,
                        Kind::Svip => counters.svip,
                    });
                    Action::Continue
                }
                Verdict::Reject { body } => {
                    Counters::increment(counters.rejected);
                    let headers = vec![("content-type", TEXT_PLAIN)];
                    self.send_http_response(400, headers, Some(body.as_bytes()));
                    Action::Pause
                }
            }
        }
    }
}

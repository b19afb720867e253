//! The proxy-wasm root and HTTP contexts: the thin layer between Envoy and [`crate::mapping`].

use std::rc::Rc;

use odmesh_names::Kind;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MetricType};

use crate::config::Config;
use crate::mapping::{InvalidHost, is_secure_value, map_host};

/// Counter: requests mapped to a `.vip` cluster (`wasmcustom.odmesh_requests_vip` in `/stats`).
const METRIC_VIP: &str = "odmesh_requests_vip";
/// Counter: requests mapped to a `.svip` cluster.
const METRIC_SVIP: &str = "odmesh_requests_svip";
/// Counter: requests answered with 400 because their host names no valid VIP.
const METRIC_REJECTED: &str = "odmesh_requests_rejected";

/// Fallback destination header when the configured source header is absent.
const HOST_HEADER: &str = "host";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

/// Counter ids, as the host returned them; `None` if defining one failed (counting is then
/// skipped, routing is not).
#[derive(Clone, Copy, Default)]
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
            // A failed increment only loses a count; the request goes on.
            let _ = hostcalls::increment_metric(id, 1);
        }
    }
}

/// What every request of one plugin instance shares: the configuration and the counters.
struct Shared {
    config: Config,
    counters: Counters,
}

/// The root context: one per plugin configuration per worker.
#[derive(Default)]
struct Root {
    shared: Option<Rc<Shared>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        match Config::parse(&bytes) {
            Ok(config) => {
                self.shared = Some(Rc::new(Shared {
                    config,
                    counters: Counters::define(),
                }));
                true
            }
            Err(e) => {
                let _ = hostcalls::log(LogLevel::Critical, &e.to_string());
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Envoy creates HTTP contexts only after a successful `on_configure`; should one come
        // earlier, it gets the defaults rather than a panic.
        let shared = self.shared.clone().unwrap_or_else(|| {
            Rc::new(Shared {
                config: Config::default(),
                counters: Counters::default(),
            })
        });
        Some(Box::new(Request { shared }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The HTTP context: one per request.
struct Request {
    shared: Rc<Shared>,
}

impl Context for Request {}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let config = &self.shared.config;
        let counters = self.shared.counters;

        // Bytes, not `get_http_request_header`: that one panics on a non-UTF-8 value.
        let host = self
            .get_http_request_header_bytes(&config.source_header)
            .or_else(|| self.get_http_request_header_bytes(HOST_HEADER));
        let secure_value = self.get_http_request_header_bytes(&config.secure_header);
        let secure = secure_value.as_deref().is_some_and(is_secure_value);

        let route = match host {
            None => Err(InvalidHost::Missing),
            Some(bytes) => match String::from_utf8(bytes) {
                Ok(host) => map_host(host, secure, config),
                Err(_) => Err(InvalidHost::NotUtf8),
            },
        };

        match route {
            Ok(route) => {
                self.set_http_request_header(&config.cluster_header, Some(&route.cluster));
                if secure_value.is_some() {
                    self.set_http_request_header(&config.secure_header, None);
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
                self.send_http_response(
                    400,
                    vec![("content-type", "text/plain; charset=utf-8")],
                    Some(body.as_bytes()),
                );
                Action::Pause
            }
        }
    }
}

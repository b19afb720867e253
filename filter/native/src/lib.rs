//! The odmesh filter as a native Envoy dynamic module (`dist/libodmesh_filter.so`, loaded by
//! `envoy.filters.http.dynamic_modules`): the same mapping as the wasm module
//! (`odmesh_filter::mapping::decide`), the same JSON configuration (the filter's
//! `filter_config`), the same answers, at the cost of a function call instead of a VM entry.
//!
//! [`abi`] binds Envoy 1.40's C ABI and is the only module with `unsafe` code; [`shell`] is
//! the filter, on the safe handles `abi` gives it.
#![deny(unsafe_code, clippy::undocumented_unsafe_blocks)]

#[allow(unsafe_code)]
mod abi;

pub mod shell {
    //! The filter on safe handles: the configuration once, then one decision per request.

    use odmesh_filter::config::Config;
    use odmesh_filter::mapping::{
        METRIC_REJECTED, METRIC_SVIP, METRIC_VIP, TEXT_PLAIN, Verdict, decide,
    };
    use odmesh_names::Kind;

    use crate::abi::{self, CounterId, Filter};

    /// Counter ids; `None` if defining one failed (counting is then skipped, routing is not).
    #[derive(Debug)]
    struct Counters {
        vip: Option<CounterId>,
        svip: Option<CounterId>,
        rejected: Option<CounterId>,
    }

    /// One filter configuration, shared by every request (and worker thread) under it.
    #[derive(Debug)]
    pub struct Plugin {
        config: Config,
        counters: Counters,
    }

    /// `config_new`: parses the configuration (the filter's `filter_config`, JSON) and
    /// defines the counters; `None` refuses it, with a log line that names the field.
    pub(crate) fn config_new(envoy: &abi::Config, _name: &[u8], config: &[u8]) -> Option<Plugin> {
        match Config::parse(config) {
            Ok(config) => Some(Plugin {
                config,
                counters: Counters {
                    vip: envoy.define_counter(METRIC_VIP),
                    svip: envoy.define_counter(METRIC_SVIP),
                    rejected: envoy.define_counter(METRIC_REJECTED),
                },
            }),
            Err(e) => {
                abi::log_critical(&e.to_string());
                None
            }
        }
    }

    /// The request headers: one decision, then its verdict. `true` to continue.
    pub(crate) fn on_request_headers(filter: &Filter, plugin: &Plugin) -> bool {
        let Plugin { config, counters } = plugin;
        let count = |id: Option<CounterId>| {
            if let Some(id) = id {
                filter.increment(id);
            }
        };
        match decide(config, |name| filter.request_header(name)) {
            Verdict::Route {
                cluster,
                kind,
                remove_secure,
            } => {
                filter.set_request_header(&config.cluster_header, &cluster);
                if remove_secure {
                    filter.remove_request_header(&config.secure_header);
                }
                filter.clear_route_cache();
                count(match kind {
                    Kind::Vip => counters.vip,
                    Kind::Svip => counters.svip,
                });
                true
            }
            Verdict::Reject { body } => {
                count(counters.rejected);
                let headers = [("content-type", TEXT_PLAIN)];
                filter.send_response(400, &headers, body.as_bytes(), "odmesh_invalid_host");
                false
            }
        }
    }
}

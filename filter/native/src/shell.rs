//! The cluster specifier on safe handles: the configuration once, then one decision per
//! request, while its route resolves.
//!
//! A specifier cannot answer a request itself or change its headers; what it does instead:
//! - a mapped Host: the cluster is set; if this worker does not know the cluster yet (the
//!   first request, which `on_demand` will pause to discover it), its name is written to the
//!   route metadata `odmesh:cluster` too, so that the "not discovered" reply can name it;
//! - a bad Host: no cluster (the route has none), the not-found status 400 and the mapping's
//!   text in the route metadata `odmesh:error`. The router then answers 400 (flag `NC`) and
//!   the bootstrap's local reply prints that text; `on_demand` asks nothing for a request
//!   without a cluster.
//!
//! The secure header is removed by the route (`request_headers_to_remove`), not here.
//!
//! The route the control plane serves (RDS) may add a `timeouts` table to the configuration:
//! `{"timeouts": {"slow.vip": {"request_ms": 500, "per_try": "per-try-100ms"}}}`, the policy's
//! request timeout of each cluster whose timeouts differ from the route's own, and the route
//! action override (declared beside the configuration) that carries its per-try timeout
//! (control/src/xds/route.rs). A request to such a cluster gets them while its route resolves.

use std::collections::HashMap;

use odmesh_filter::config::Config;
use odmesh_filter::mapping::{METRIC_REJECTED, METRIC_SVIP, METRIC_VIP, Verdict, decide};
use odmesh_names::Kind;

/// A counter Envoy defined for the specifier configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterId(pub usize);

/// Envoy while the configuration is built.
pub trait Setup {
    /// Defines counter `name` (`dynamicmodulescustom.<name>` in Envoy's stats); `None` if
    /// Envoy refused it.
    fn define_counter(&self, name: &str) -> Option<CounterId>;
    /// Writes `message` to Envoy's log at level critical.
    fn log_critical(&self, message: &str);
}

/// Envoy while one request's route resolves.
pub trait Request {
    /// The first value of request header `name`, copied; `None` if the request has none.
    fn header(&self, name: &str) -> Option<Vec<u8>>;
    /// Routes the request to `cluster`.
    fn route_to(&mut self, cluster: &str);
    /// Whether this worker has `cluster` now (it may still be discovered on demand).
    fn has_cluster(&self, cluster: &str) -> bool;
    /// Sets the route metadata `odmesh:<key>` for this request (read by the local replies).
    fn note(&mut self, key: &str, value: &str);
    /// The status Envoy answers with when the request has no cluster; `false` if refused.
    fn not_found_status(&mut self, status: u32) -> bool;
    /// Sets the request's timeout (the whole request, all tries); 0 for none.
    fn set_timeout_ms(&mut self, ms: u64);
    /// Applies the route action override `name`; `false` if the route declares none such.
    fn use_override(&mut self, name: &str) -> bool;
    /// Adds one to counter `id`.
    fn count(&mut self, id: CounterId);
}

/// The configuration key of the control plane's timeouts table.
pub const TIMEOUTS_KEY: &str = "timeouts";

/// One cluster's timeouts, from the table.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterTimeouts {
    /// The request timeout; 0 for none.
    request_ms: u64,
    /// The route action override with its per-try timeout, if it differs from the route's.
    #[serde(default)]
    per_try: Option<String>,
}

/// The configuration without its `timeouts` key, and the table under it (empty without one).
fn split_timeouts(config: &[u8]) -> Result<(Vec<u8>, HashMap<String, ClusterTimeouts>), String> {
    let Ok(serde_json::Value::Object(mut object)) = serde_json::from_slice(config) else {
        // Not an object (or empty): the mapping's own parser says what is wrong.
        return Ok((config.to_vec(), HashMap::new()));
    };
    let Some(table) = object.remove(TIMEOUTS_KEY) else {
        return Ok((config.to_vec(), HashMap::new()));
    };
    let table = serde_json::from_value(table)
        .map_err(|e| format!("invalid odmesh filter configuration: field `{TIMEOUTS_KEY}`: {e}"))?;
    let rest = serde_json::Value::Object(object).to_string().into_bytes();
    Ok((rest, table))
}

/// Route metadata key: the cluster a first request waits for.
pub const NOTE_CLUSTER: &str = "cluster";
/// Route metadata key: why the request cannot be routed (the body of the 400).
pub const NOTE_ERROR: &str = "error";
/// The status of a request whose Host names no valid VIP.
pub const BAD_HOST_STATUS: u32 = 400;
/// The status of a request on which the module panicked.
pub const FAILED_STATUS: u32 = 500;
/// The body of that answer.
pub const FAILED_TEXT: &str = "odmesh: the filter failed on this request\n";

/// Counter ids; `None` if defining one failed (counting is then skipped, routing is not).
#[derive(Debug)]
struct Counters {
    vip: Option<CounterId>,
    svip: Option<CounterId>,
    rejected: Option<CounterId>,
}

/// One specifier configuration, shared by every request (and worker thread) under it.
#[derive(Debug)]
pub struct Plugin {
    config: Config,
    timeouts: HashMap<String, ClusterTimeouts>,
    counters: Counters,
}

/// `config_new`: parses the configuration (the specifier's `specifier_config`, JSON) and
/// defines the counters; `None` refuses it, with a log line that names the field.
pub fn config_new(envoy: &impl Setup, _name: &[u8], config: &[u8]) -> Option<Plugin> {
    let parsed = split_timeouts(config).and_then(|(config, timeouts)| {
        let config = Config::parse(&config).map_err(|e| e.to_string())?;
        Ok((config, timeouts))
    });
    match parsed {
        Ok((config, timeouts)) => Some(Plugin {
            config,
            timeouts,
            counters: Counters {
                vip: envoy.define_counter(METRIC_VIP),
                svip: envoy.define_counter(METRIC_SVIP),
                rejected: envoy.define_counter(METRIC_REJECTED),
            },
        }),
        Err(e) => {
            envoy.log_critical(&e);
            None
        }
    }
}

/// `select`: one decision, then its verdict. Always `true`: the decision applies.
pub fn select(plugin: &Plugin, request: &mut impl Request) -> bool {
    let Plugin {
        config,
        timeouts,
        counters,
    } = plugin;
    let counter = match decide(config, |name| request.header(name)) {
        Verdict::Route { cluster, kind, .. } => {
            request.route_to(&cluster);
            if !request.has_cluster(&cluster) {
                request.note(NOTE_CLUSTER, &cluster);
            }
            if let Some(own) = timeouts.get(&cluster) {
                request.set_timeout_ms(own.request_ms);
                if let Some(name) = &own.per_try {
                    let declared = request.use_override(name);
                    debug_assert!(declared, "the route declares override {name}");
                }
            }
            match kind {
                Kind::Vip => counters.vip,
                Kind::Svip => counters.svip,
            }
        }
        Verdict::Reject { body } => {
            fail(request, BAD_HOST_STATUS, &body);
            counters.rejected
        }
    };
    if let Some(id) = counter {
        request.count(id);
    }
    true
}

/// What `select` applies when the shell panicked: a 500 that says so.
pub fn failed(request: &mut impl Request) -> bool {
    fail(request, FAILED_STATUS, FAILED_TEXT);
    true
}

/// No cluster: Envoy answers `status` with `text` (through the bootstrap's local reply).
fn fail(request: &mut impl Request, status: u32, text: &str) {
    let accepted = request.not_found_status(status);
    debug_assert!(accepted, "{status} is within Envoy's [200, 600)");
    request.note(NOTE_ERROR, text);
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    use super::*;

    /// Envoy, recorded: what the shell read and set.
    #[derive(Default)]
    struct Fake {
        headers: BTreeMap<String, Vec<u8>>,
        known: Vec<String>,
        defined: RefCell<Vec<String>>,
        logged: RefCell<Vec<String>>,
        cluster: Option<String>,
        notes: BTreeMap<String, String>,
        status: Option<u32>,
        timeout_ms: Option<u64>,
        overrides: Vec<String>,
        counted: Vec<CounterId>,
    }

    impl Setup for Fake {
        fn define_counter(&self, name: &str) -> Option<CounterId> {
            let mut defined = self.defined.borrow_mut();
            defined.push(name.to_owned());
            Some(CounterId(defined.len() - 1))
        }
        fn log_critical(&self, message: &str) {
            self.logged.borrow_mut().push(message.to_owned());
        }
    }

    impl Request for Fake {
        fn header(&self, name: &str) -> Option<Vec<u8>> {
            self.headers.get(name).cloned()
        }
        fn route_to(&mut self, cluster: &str) {
            self.cluster = Some(cluster.to_owned());
        }
        fn has_cluster(&self, cluster: &str) -> bool {
            self.known.iter().any(|known| known == cluster)
        }
        fn note(&mut self, key: &str, value: &str) {
            self.notes.insert(key.to_owned(), value.to_owned());
        }
        fn not_found_status(&mut self, status: u32) -> bool {
            self.status = Some(status);
            (200..600).contains(&status)
        }
        fn set_timeout_ms(&mut self, ms: u64) {
            self.timeout_ms = Some(ms);
        }
        fn use_override(&mut self, name: &str) -> bool {
            self.overrides.push(name.to_owned());
            true
        }
        fn count(&mut self, id: CounterId) {
            self.counted.push(id);
        }
    }

    fn request(headers: &[(&str, &str)], known: &[&str]) -> Fake {
        Fake {
            headers: (headers.iter())
                .map(|(name, value)| ((*name).to_owned(), value.as_bytes().to_vec()))
                .collect(),
            known: known.iter().map(|name| (*name).to_owned()).collect(),
            ..Fake::default()
        }
    }

    /// The plugin and the counter names, by id.
    fn plugin(config: &str) -> (Plugin, Vec<String>) {
        let envoy = Fake::default();
        let plugin = config_new(&envoy, b"odmesh", config.as_bytes()).expect("a valid config");
        (plugin, envoy.defined.take())
    }

    fn counted(names: &[String], request: &Fake) -> Vec<String> {
        (request.counted.iter())
            .map(|id| names[id.0].clone())
            .collect()
    }

    #[test]
    fn a_known_vip_is_routed_and_counted_with_nothing_noted() {
        let (plugin, names) = plugin("{}");
        let mut request = request(&[(":authority", "Hello:8080")], &["hello.vip"]);
        assert!(select(&plugin, &mut request));
        assert_eq!(request.cluster.as_deref(), Some("hello.vip"));
        assert!(request.notes.is_empty(), "{:?}", request.notes);
        assert_eq!(request.status, None);
        assert_eq!(counted(&names, &request), [METRIC_VIP]);
    }

    #[test]
    fn a_cluster_this_worker_lacks_is_noted_for_the_not_discovered_reply() {
        let (plugin, names) = plugin("{}");
        let mut request = request(&[(":authority", "late:8443")], &[]);
        assert!(select(&plugin, &mut request));
        assert_eq!(request.cluster.as_deref(), Some("late.svip"));
        assert_eq!(request.notes[NOTE_CLUSTER], "late.svip");
        assert_eq!(counted(&names, &request), [METRIC_SVIP]);
    }

    #[test]
    fn the_secure_header_picks_the_svip_and_a_sent_cluster_header_is_not_read() {
        let (plugin, _) = plugin("{}");
        let headers = [
            (":authority", "hello"),
            ("x-odmesh-secure", "true"),
            ("x-odmesh-cluster", "admin.vip"),
        ];
        let mut request = request(&headers, &["hello.svip"]);
        select(&plugin, &mut request);
        assert_eq!(request.cluster.as_deref(), Some("hello.svip"));
    }

    #[test]
    fn a_bad_host_gets_no_cluster_the_status_400_and_the_mappings_text() {
        let (plugin, names) = plugin("{}");
        let mut request = request(&[(":authority", "bad host")], &[]);
        assert!(select(&plugin, &mut request));
        assert_eq!(request.cluster, None);
        assert_eq!(request.status, Some(BAD_HOST_STATUS));
        let Verdict::Reject { body } = decide(&Config::default(), |name| request.header(name))
        else {
            panic!("`bad host` should be refused by the mapping");
        };
        assert_eq!(request.notes[NOTE_ERROR], body);
        assert!(
            body.starts_with("odmesh: cannot route this request"),
            "{body}"
        );
        assert_eq!(counted(&names, &request), [METRIC_REJECTED]);
    }

    #[test]
    fn the_configuration_is_the_filters_own() {
        let (plugin, _) = plugin(r#"{"source_header": "x-dest", "strip_suffixes": [".mesh"]}"#);
        let mut request = request(&[("x-dest", "orders.mesh"), (":authority", "x")], &[]);
        select(&plugin, &mut request);
        assert_eq!(request.cluster.as_deref(), Some("orders.vip"));
    }

    #[test]
    fn a_bad_configuration_is_refused_with_a_log_line_naming_the_field() {
        let envoy = Fake::default();
        let refused = config_new(&envoy, b"odmesh", br#"{"secure_ports": [0]}"#);
        assert!(refused.is_none());
        let logged = envoy.logged.take();
        assert_eq!(logged.len(), 1, "{logged:?}");
        assert!(logged[0].contains("secure_ports"), "{logged:?}");
    }

    #[test]
    fn a_panic_answers_500_with_its_text() {
        let mut request = request(&[], &[]);
        assert!(failed(&mut request));
        assert_eq!(request.status, Some(FAILED_STATUS));
        assert_eq!(request.notes[NOTE_ERROR], FAILED_TEXT);
        assert_eq!(request.cluster, None);
    }

    #[test]
    fn a_cluster_in_the_timeouts_table_gets_its_timeout_and_override_and_others_nothing() {
        let (plugin, _) = plugin(
            r#"{"strip_suffixes": [".mesh"], "timeouts": {
                "slow.vip": {"request_ms": 500, "per_try": "per-try-100ms"},
                "free.vip": {"request_ms": 0}}}"#,
        );
        let mut slow = request(&[(":authority", "slow.mesh")], &["slow.vip"]);
        select(&plugin, &mut slow);
        assert_eq!(slow.cluster.as_deref(), Some("slow.vip"));
        assert_eq!(slow.timeout_ms, Some(500));
        assert_eq!(slow.overrides, ["per-try-100ms"]);
        let mut free = request(&[(":authority", "free")], &[]);
        select(&plugin, &mut free);
        assert_eq!((free.timeout_ms, free.overrides.len()), (Some(0), 0));
        let mut other = request(&[(":authority", "other")], &[]);
        select(&plugin, &mut other);
        assert_eq!((other.timeout_ms, other.overrides.len()), (None, 0));
    }

    #[test]
    fn a_bad_timeouts_table_is_refused_naming_it() {
        let envoy = Fake::default();
        let config = br#"{"timeouts": {"slow.vip": {"request_ms": "soon"}}}"#;
        assert!(config_new(&envoy, b"odmesh", config).is_none());
        let logged = envoy.logged.take();
        assert!(logged[0].contains("`timeouts`"), "{logged:?}");
    }
}

//! The inbound side's adaptive concurrency filter, as extension config discovery (ECDS) serves
//! it: the bootstraps' inbound listener has Envoy's adaptive concurrency filter, its
//! configuration discovered by name ([`LIMITER`]); each proxy gets the one of its own service
//! (the node's `cluster`) from the policy file's `services:`, and a switched-off one when the
//! file has none (docs/envoy.md, "Adaptive concurrency"). Pure: the service is
//! [`crate::routes`].

use envoy_types::pb::envoy::config::core::v3::{RuntimeFeatureFlag, TypedExtensionConfig};
use envoy_types::pb::envoy::extensions::filters::http::adaptive_concurrency::v3::{
    AdaptiveConcurrency, GradientControllerConfig,
    adaptive_concurrency::ConcurrencyControllerConfig,
    gradient_controller_config::{ConcurrencyLimitCalculationParams, MinimumRttCalculationParams},
};
use envoy_types::pb::envoy::r#type::v3::{HttpStatus, Percent};
use envoy_types::pb::google::protobuf::{Any, BoolValue, UInt32Value};
use prost::Message;

use super::{duration, version};
use crate::policy::inbound::{AdaptiveConcurrency as Policy, Limiter};

/// Type URL of `envoy.config.core.v3.TypedExtensionConfig` (ECDS).
pub const EXTENSION_TYPE_URL: &str =
    "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
/// The inbound limiter's name in the bootstraps (the ECDS resource name).
pub const LIMITER: &str = "odmesh.inbound.adaptive_concurrency";
const ADAPTIVE_CONCURRENCY_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.adaptive_concurrency.v3.AdaptiveConcurrency";

/// A built extension configuration and its version.
#[derive(Clone, Debug, PartialEq)]
pub struct BuiltExtension {
    pub resource: Any,
    pub version: String,
}

/// The limiter `name` for a service whose policy is `limiter` (`None`: switched off, with
/// Envoy's defaults, as the bootstraps' default configuration).
pub fn build(name: &str, limiter: Option<&Policy>) -> BuiltExtension {
    let on = limiter.is_some();
    let l = limiter.map_or(Policy::DEFAULTS, Policy::limiter);
    let config = TypedExtensionConfig {
        name: name.to_owned(),
        typed_config: Some(Any {
            type_url: ADAPTIVE_CONCURRENCY_TYPE_URL.to_owned(),
            value: filter(on, &l).encode_to_vec(),
        }),
    };
    let bytes = config.encode_to_vec();
    BuiltExtension {
        version: format!("{:016x}", version::encoded(&bytes)),
        resource: Any {
            type_url: EXTENSION_TYPE_URL.to_owned(),
            value: bytes,
        },
    }
}

/// The filter's configuration: `l`, on or off.
fn filter(on: bool, l: &Limiter) -> AdaptiveConcurrency {
    let n = |v: u32| Some(UInt32Value { value: v });
    let gradient = GradientControllerConfig {
        sample_aggregate_percentile: Some(Percent {
            value: f64::from(l.latency_percentile),
        }),
        concurrency_limit_params: Some(ConcurrencyLimitCalculationParams {
            max_concurrency_limit: n(l.max_limit),
            concurrency_update_interval: Some(duration(l.update_interval)),
            min_concurrency_limit: n(l.min_limit),
        }),
        min_rtt_calc_params: Some(MinimumRttCalculationParams {
            interval: Some(duration(l.min_rtt_interval)),
            request_count: n(l.min_rtt_requests),
            jitter: Some(Percent {
                value: f64::from(l.jitter_percent),
            }),
            min_concurrency: n(l.min_rtt_concurrency),
            buffer: Some(Percent {
                value: f64::from(l.buffer_percent),
            }),
            fixed_value: None,
        }),
    };
    AdaptiveConcurrency {
        enabled: Some(RuntimeFeatureFlag {
            default_value: Some(BoolValue { value: on }),
            runtime_key: "odmesh.inbound.adaptive_concurrency.enabled".to_owned(),
        }),
        concurrency_limit_exceeded_status: Some(HttpStatus {
            code: i32::try_from(l.status).unwrap_or(503),
        }),
        concurrency_controller_config: Some(ConcurrencyControllerConfig::GradientControllerConfig(
            gradient,
        )),
    }
}

/// How long the limit waits between updates, for tests.
#[cfg(test)]
fn update_interval(built: &BuiltExtension) -> std::time::Duration {
    let config = TypedExtensionConfig::decode(built.resource.value.as_slice()).unwrap();
    let filter =
        AdaptiveConcurrency::decode(config.typed_config.unwrap().value.as_slice()).unwrap();
    let Some(ConcurrencyControllerConfig::GradientControllerConfig(g)) =
        filter.concurrency_controller_config
    else {
        panic!("gradient controller");
    };
    let d = g
        .concurrency_limit_params
        .unwrap()
        .concurrency_update_interval
        .unwrap();
    std::time::Duration::new(d.seconds as u64, d.nanos as u32)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn decoded(built: &BuiltExtension) -> (String, AdaptiveConcurrency) {
        assert_eq!(built.resource.type_url, EXTENSION_TYPE_URL);
        let config = TypedExtensionConfig::decode(built.resource.value.as_slice()).unwrap();
        let any = config.typed_config.unwrap();
        assert_eq!(any.type_url, ADAPTIVE_CONCURRENCY_TYPE_URL);
        (
            config.name,
            AdaptiveConcurrency::decode(any.value.as_slice()).unwrap(),
        )
    }

    #[test]
    fn without_a_policy_the_limiter_is_switched_off_with_envoys_defaults() {
        let built = build(LIMITER, None);
        let (name, filter) = decoded(&built);
        assert_eq!(name, LIMITER);
        let enabled = filter.enabled.unwrap().default_value.unwrap().value;
        assert!(!enabled);
        assert_eq!(update_interval(&built), Duration::from_millis(100));
        assert_eq!(filter.concurrency_limit_exceeded_status.unwrap().code, 503);
    }

    #[test]
    fn a_policy_switches_it_on_with_its_values_and_changes_the_version() {
        let policy: Policy = serde_json::from_value(serde_json::json!({
            "update_interval": "250ms",
            "max_limit": 40,
            "status": 429,
        }))
        .unwrap();
        let built = build(LIMITER, Some(&policy));
        let (_, filter) = decoded(&built);
        assert!(filter.enabled.unwrap().default_value.unwrap().value);
        assert_eq!(update_interval(&built), Duration::from_millis(250));
        assert_eq!(filter.concurrency_limit_exceeded_status.unwrap().code, 429);
        let Some(ConcurrencyControllerConfig::GradientControllerConfig(g)) =
            filter.concurrency_controller_config
        else {
            panic!("gradient controller");
        };
        let params = g.concurrency_limit_params.unwrap();
        assert_eq!(params.max_concurrency_limit.unwrap().value, 40);
        assert_eq!(params.min_concurrency_limit.unwrap().value, 3, "a default");
        assert_ne!(built.version, build(LIMITER, None).version);
        assert_eq!(built.version, build(LIMITER, Some(&policy)).version);
        assert_ne!(
            built.version,
            build(LIMITER, Some(&Policy::default())).version
        );
    }
}

//! The metrics of the registry in use, whichever source keeps it: loads, failures, size, a
//! held drop, completeness. Rendered by the admin `/metrics` after the control plane's own.

odmesh_base::metrics! {
    /// The `registry_*` metrics: the sources record loads and held drops; the control plane
    /// sets the gauges it derives (clusters, completeness, the age of the last load).
    pub struct RegistryMetrics {
        /// Registry loads that succeeded.
        registry_loads_total: "counter",
        /// Registry loads that failed (the last good registry stayed in use).
        registry_load_errors_total: "counter",
        /// Unix time in seconds of the last successful registry load (0: never).
        registry_last_success_seconds: "gauge",
        /// Seconds since the last successful registry load (0 before the first one); for Eureka,
        /// the age of the last good fetch.
        registry_last_success_age_seconds: "gauge",
        /// Instances in the registry in use.
        registry_instances: "gauge",
        /// Clusters (VIPs and SVIPs) the registry in use defines.
        registry_clusters: "gauge",
        /// 1 while a source's drop of most of the registry is held (not followed yet).
        registry_drop_held: "gauge",
        /// Drops of most of the registry that a source made at once and that were held.
        registry_drops_held_total: "counter",
        /// 1 when the registry in use is complete; 0 while its source is still loading (after a
        /// start: before Eureka's first answer, during the embedded registry's warm-up).
        registry_complete: "gauge",
    }
}

//! The metrics only Eureka's sources keep: the client's fetches and the embedded registry's
//! leases, refusals and connections. What every source counts (loads, held drops) is in
//! [`RegistryMetrics`](odmesh_registry::RegistryMetrics). Rendered by the admin `/metrics`
//! after the registry's.

odmesh_base::metrics! {
    /// The Eureka client source's `eureka_*` metrics.
    pub struct ClientMetrics {
        /// Eureka source: fetches (full or delta) that a Eureka server answered with a usable document.
        eureka_fetches_total: "counter",
        /// Eureka source: full registry fetches (the first, and after a mismatch, bad delta or outage).
        eureka_full_fetches_total: "counter",
        /// Eureka source: fetch rounds that failed on every configured server (the last good registry stayed).
        eureka_fetch_errors_total: "counter",
        /// Eureka source: deltas whose result did not match the server's `apps__hashcode`.
        eureka_hash_mismatches_total: "counter",
        /// Eureka source: switches to another configured server after a failure.
        eureka_failovers_total: "counter",
        /// Eureka source: answers refused as larger than --eureka-max-answer (the fetch failed;
        /// the last good registry stayed).
        eureka_answers_too_large_total: "counter",
    }
    histograms {
        /// Eureka source: how long a fetch from a Eureka server took (full or delta, answered
        /// or failed), from the request to the answer read whole.
        eureka_fetch_seconds: (0.001, 2.0, 16),
    }
}

odmesh_base::metrics! {
    /// The embedded Eureka registry's `eureka_*` metrics.
    pub struct ServerMetrics {
        /// Embedded Eureka registry: registrations accepted.
        eureka_registrations_total: "counter",
        /// Client registrations older (by lastDirtyTimestamp) than the instance registered:
        /// the newer is kept, the lease renewed, and the client answered 409.
        eureka_registrations_older_total: "counter",
        /// Embedded Eureka registry: answers to `GET /apps` and `/apps/delta` written (in one
        /// form each: JSON or XML, gzip or not), which every reader meanwhile shares.
        eureka_registry_answers_written_total: "counter",
        /// Reads of GET /apps or /apps/delta that waited, without a thread, for one of the
        /// threads that read the whole registry at once (64) to be free.
        eureka_registry_readers_queued_total: "counter",
        /// Embedded Eureka registry: heartbeats that renewed a lease.
        eureka_renewals_total: "counter",
        /// Embedded Eureka registry: heartbeats for an unknown instance (answered 404).
        eureka_renewals_not_found_total: "counter",
        /// Embedded Eureka registry: cancellations.
        eureka_cancels_total: "counter",
        /// Embedded Eureka registry: instances evicted after their lease expired.
        eureka_evictions_total: "counter",
        /// Embedded Eureka registry: status overrides set or removed.
        eureka_status_updates_total: "counter",
        /// Embedded Eureka registry: requests refused, by why: `invalid` writes (400: names,
        /// address, not a registration); `throttled` (429: the address sent more than
        /// --eureka-max-auth-failures requests without valid credentials within 10 s);
        /// `unauthenticated` (401, with --eureka-auth); `forbidden` writes (403: another's
        /// instance, a VIP not granted); `body` (413 too large, 408 too slow, 415 not JSON);
        /// `full` registrations (503: --eureka-max-instances registered); `identity_full` (503:
        /// the identity registered --eureka-max-instances-per-identity).
        eureka_refused_invalid_total: "counter" in eureka_refused_total { reason = "invalid" },
        /// (the same family)
        eureka_refused_throttled_total: "counter" in eureka_refused_total { reason = "throttled" },
        /// (the same family)
        eureka_refused_unauthenticated_total: "counter" in eureka_refused_total { reason = "unauthenticated" },
        /// (the same family)
        eureka_refused_forbidden_total: "counter" in eureka_refused_total { reason = "forbidden" },
        /// (the same family)
        eureka_refused_body_total: "counter" in eureka_refused_total { reason = "body" },
        /// (the same family)
        eureka_refused_full_total: "counter" in eureka_refused_total { reason = "full" },
        /// (the same family)
        eureka_refused_identity_full_total: "counter" in eureka_refused_total { reason = "identity_full" },
        /// Embedded Eureka registry: registrations whose lease was longer than
        /// --max-lease-duration, registered with that lease.
        eureka_leases_clamped_total: "counter",
        /// Embedded Eureka registry: metadata entries left out of registrations (beyond the
        /// metadata bounds, or a key or value the registry cannot keep).
        eureka_metadata_dropped_total: "counter",
        /// Embedded Eureka registry: registrations of an instance cancelled while overridden
        /// (drained) that got its override back.
        eureka_overrides_restored_total: "counter",
        /// Embedded Eureka registry: 1 while self-preservation holds lease eviction.
        eureka_self_preservation: "gauge",
        /// Embedded Eureka registry: expired leases the last eviction round kept, held by
        /// self-preservation or by the per-round eviction bound.
        eureka_evictions_held: "gauge",
        /// Embedded Eureka registry: eviction rounds that ran late, whose delay was added to
        /// every lease.
        eureka_late_eviction_rounds_total: "counter",
        /// Embedded Eureka registry: replicated heartbeats a peer answered 404 (it does not
        /// hold the instance, or not as this node does): the registration follows 2 s later.
        eureka_peer_resends_total: "counter",
        /// Embedded Eureka registry: writes for a peer that took the place of the last one
        /// queued for the same instance and action (a peer that is down).
        eureka_peer_merged_total: "counter",
        /// Embedded Eureka registry: writes a peer refused as a whole batch (an error status
        /// other than 503, or an answer that is not one), dropped as Eureka's servers drop
        /// them; the heartbeats bring the registrations back once the peer takes them.
        eureka_peer_discarded_total: "counter",
        /// Embedded Eureka registry: writes received from peers and applied.
        eureka_peer_received_total: "counter",
        /// Embedded Eureka registry: fills from a peer's registry at start.
        eureka_peer_fills_total: "counter",
        /// Embedded Eureka registry: fills refused because the peer's answer was larger than
        /// --peer-max-answer (the next peer was tried).
        eureka_peer_fills_too_large_total: "counter",
        /// Embedded Eureka registry: connections closed on arrival because
        /// --eureka-max-connections were open.
        eureka_http_connections_refused_total: "counter",
        /// Embedded Eureka registry: connections closed on arrival because
        /// --eureka-max-connections-per-source were open from their address.
        eureka_http_source_refused_total: "counter",
        /// Embedded Eureka registry: connections closed because their client did not send a
        /// request's headers within --eureka-header-timeout (or sat idle that long), or read
        /// nothing of an answer for --eureka-write-timeout.
        eureka_http_timeouts_total: "counter",
        /// Embedded Eureka registry: TLS handshakes that failed or timed out.
        eureka_http_tls_failures_total: "counter",
        /// Embedded Eureka registry: the tokens file (--eureka-auth) read again and put in
        /// force (it changed, or SIGHUP).
        eureka_tokens_reloads_total: "counter",
        /// Embedded Eureka registry: new versions of the tokens file refused (not a tokens
        /// file, unreadable): the identities in force stayed.
        eureka_tokens_reloads_refused_total: "counter",
        /// Embedded Eureka registry: its HTTPS certificate and key (--eureka-tls-cert,
        /// --eureka-tls-key) read again and put in force for new connections.
        eureka_tls_reloads_total: "counter",
        /// Embedded Eureka registry: new HTTPS certificates or keys refused (unreadable, or
        /// not a matching pair): the ones in force stayed.
        eureka_tls_reloads_refused_total: "counter",
    }
}

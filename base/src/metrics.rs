//! Metrics, exposed through the Prometheus project's Rust client (`prometheus-client`): each
//! crate declares the metrics it owns with [`metrics!`](crate::metrics!), bumps them with
//! [`inc`], [`set`] and [`observe`], and the admin `/metrics` renders every crate's through one
//! [`Exposition`], in OpenMetrics or in Prometheus' text format, as the scraper asks.
//!
//! Counters and gauges stay plain atomics, cheap to bump on any path; a declaration turns them
//! into a collector that reads them when scraped. Several counters of one idea (refusals by
//! reason, responses by resource type) are one family with a label. Histograms are the
//! client's own.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

#[doc(hidden)]
pub use prometheus_client;

/// Declares a metrics struct, its field docs (the help text) and its collector in one place.
/// Counters and gauges are `AtomicU64` fields, exported as `odmesh_<field>`; a `counter`
/// only goes up (its name ends `_total`), a `gauge` is set. `in <family> { <label> = "<value>" }`
/// makes a field one series of a labelled family, named by the family and helped by its first
/// member's doc (the members of a family are declared one after the other). An optional
/// `histograms { name: (start, factor, buckets), }` part adds histograms with exponential
/// buckets, in seconds (names end `_seconds`).
///
/// ```
/// odmesh_base::metrics! {
///     /// What the example counts.
///     pub struct ExampleMetrics {
///         /// Examples run.
///         examples_total: "counter",
///         /// Examples refused, by why.
///         examples_refused_empty_total: "counter" in examples_refused_total { reason = "empty" },
///         /// (the same family)
///         examples_refused_large_total: "counter" in examples_refused_total { reason = "large" },
///     }
///     histograms {
///         /// How long an example took.
///         example_seconds: (0.001, 2.0, 4),
///     }
/// }
/// let m = std::sync::Arc::new(ExampleMetrics::default());
/// odmesh_base::metrics::inc(&m.examples_total);
/// odmesh_base::metrics::inc(&m.examples_refused_large_total);
/// odmesh_base::metrics::observe(&m.example_seconds, std::time::Duration::from_millis(3));
/// let text = m.render();
/// assert!(text.contains("odmesh_examples_total 1\n"));
/// assert!(text.contains("odmesh_examples_refused_total{reason=\"large\"} 1\n"));
/// assert!(text.contains("odmesh_example_seconds_bucket{le=\"0.004\"} 1\n"));
/// ```
#[macro_export]
macro_rules! metrics {
    (
        $(#[doc = $struct_doc:literal])*
        $vis:vis struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                $field:ident : $kind:literal $(in $family:ident { $key:ident = $value:literal })?,
            )*
        }
        $(histograms {
            $(
                $(#[doc = $hdoc:literal])*
                $hist:ident : ($start:expr, $factor:expr, $buckets:expr),
            )*
        })?
    ) => {
        $(#[doc = $struct_doc])*
        #[derive(Debug)]
        $vis struct $name {
            $($(#[doc = $doc])* pub $field: ::std::sync::atomic::AtomicU64,)*
            $($(
                $(#[doc = $hdoc])*
                pub $hist: $crate::metrics::prometheus_client::metrics::histogram::Histogram,
            )*)?
        }

        impl Default for $name {
            fn default() -> $name {
                $name {
                    $($field: ::std::sync::atomic::AtomicU64::new(0),)*
                    $($($hist: $crate::metrics::histogram($start, $factor, $buckets),)*)?
                }
            }
        }

        impl $crate::metrics::prometheus_client::collector::Collector for $name {
            fn encode(
                &self,
                mut encoder: $crate::metrics::prometheus_client::encoding::DescriptorEncoder,
            ) -> ::std::fmt::Result {
                let samples = [$(
                    $crate::metrics::Sample {
                        name: stringify!($field),
                        help: concat!($($doc),*),
                        kind: $kind,
                        label: $crate::metrics_label!($($family $key $value)?),
                        value: self.$field.load(::std::sync::atomic::Ordering::Relaxed),
                    },
                )*];
                $crate::metrics::encode_samples(&mut encoder, &samples)?;
                $($(
                    $crate::metrics::encode_histogram(
                        &mut encoder,
                        stringify!($hist),
                        concat!($($hdoc),*),
                        &self.$hist,
                    )?;
                )*)?
                Ok(())
            }
        }

        impl $name {
            /// These metrics alone, in Prometheus' text format, each prefixed `odmesh_`.
            pub fn render(self: &::std::sync::Arc<Self>) -> String {
                let exposition = $crate::metrics::Exposition::default();
                exposition.add(::std::sync::Arc::clone(self));
                exposition.render($crate::metrics::Format::Prometheus)
            }
        }
    };
}

/// The label of a [`metrics!`](crate::metrics!) field: `(family, label, value)`, if any.
#[doc(hidden)]
#[macro_export]
macro_rules! metrics_label {
    () => {
        ::core::option::Option::None
    };
    ($family:ident $key:ident $value:literal) => {
        ::core::option::Option::Some((stringify!($family), stringify!($key), $value))
    };
}

/// Adds one to a counter.
pub fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Sets a gauge.
pub fn set(gauge: &AtomicU64, value: u64) {
    gauge.store(value, Ordering::Relaxed);
}

/// Records a duration in a histogram, in seconds.
pub fn observe(histogram: &Histogram, took: Duration) {
    histogram.observe(took.as_secs_f64());
}

/// A histogram with `buckets` exponential buckets from `start`, each `factor` times the last.
pub fn histogram(start: f64, factor: f64, buckets: u16) -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        start, factor, buckets,
    ))
}

/// A histogram's buckets now: `(upper bound, observations at most that)`, the last `+Inf`.
/// Read through the client's own exposition (the client gives no other access to them); for
/// pages people read, not for a hot path.
pub fn buckets(histogram: &Histogram) -> Vec<(f64, u64)> {
    let mut registry = Registry::default();
    registry.register("h", "", histogram.clone());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .expect("a histogram renders into a String");
    (text.lines())
        .filter_map(|line| line.strip_prefix("h_bucket{le=\""))
        .filter_map(|rest| {
            let (bound, count) = rest.split_once("\"} ")?;
            let bound = if bound == "+Inf" {
                f64::INFINITY
            } else {
                bound.parse().ok()?
            };
            Some((bound, count.trim().parse().ok()?))
        })
        .collect()
}

/// The `q` quantile (0.99: the 99th percentile) of what `buckets` (as [`buckets`] gives them)
/// counted, interpolated within its bucket as Prometheus' `histogram_quantile` does: the
/// lowest bucket from 0, and the highest finite bound for what lies past it. `None` if
/// nothing was observed.
pub fn quantile(buckets: &[(f64, u64)], q: f64) -> Option<f64> {
    let &(_, total) = buckets.last()?;
    if total == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let (mut lower, mut below) = (0.0, 0u64);
    for &(bound, count) in buckets {
        if count as f64 >= rank {
            if bound.is_infinite() {
                return Some(lower);
            }
            let within = (count - below) as f64;
            let share = if within == 0.0 {
                1.0
            } else {
                (rank - below as f64) / within
            };
            return Some(lower + (bound - lower) * share);
        }
        (lower, below) = (bound, count);
    }
    Some(lower)
}

/// One counter or gauge of a [`metrics!`](crate::metrics!) struct, as read for a scrape.
#[doc(hidden)]
#[derive(Debug)]
pub struct Sample {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: &'static str,
    /// `(family, label, value)` for a series of a labelled family.
    pub label: Option<(&'static str, &'static str, &'static str)>,
    pub value: u64,
}

/// The help text of a doc comment: its lines joined, trimmed. The Prometheus text encoder
/// escapes `\` and line ends itself, the OpenMetrics one does not: a help text holds neither,
/// nor `"` (tested where the metrics are declared).
fn help(doc: &str) -> &str {
    doc.trim()
}

/// Writes `samples` in order; the members of a family, one after the other, under one
/// descriptor.
#[doc(hidden)]
pub fn encode_samples(encoder: &mut DescriptorEncoder, samples: &[Sample]) -> std::fmt::Result {
    let mut rest = samples;
    while let Some(first) = rest.first() {
        let family = first.label.map(|(family, ..)| family);
        let members = match family {
            Some(f) => rest
                .iter()
                .take_while(|s| s.label.map(|l| l.0) == Some(f))
                .count(),
            None => 1,
        };
        let (run, after) = rest.split_at(members);
        let (ty, name) = match first.kind {
            // The text formats add `_total` to a counter's samples.
            "counter" => (MetricType::Counter, family.unwrap_or(first.name)),
            "gauge" => (MetricType::Gauge, family.unwrap_or(first.name)),
            other => panic!(
                "metrics!: {}: a kind is counter or gauge, not {other}",
                first.name
            ),
        };
        let name = name.strip_suffix("_total").unwrap_or(name);
        let mut metric = encoder.encode_descriptor(name, help(first.help), None, ty)?;
        if family.is_none() {
            encode_value(first, metric)?;
        } else {
            for sample in run {
                assert_eq!(sample.kind, first.kind, "metrics!: one family, one kind");
                let (_, key, value) = sample.label.expect("a member of a family");
                encode_value(sample, metric.encode_family(&[(key, value)])?)?;
            }
        }
        rest = after;
    }
    Ok(())
}

fn encode_value(
    sample: &Sample,
    metric: prometheus_client::encoding::MetricEncoder,
) -> std::fmt::Result {
    match sample.kind {
        "counter" => ConstCounter::new(sample.value).encode(metric),
        _ => ConstGauge::new(sample.value).encode(metric),
    }
}

/// Writes a histogram named `name` (ending `_seconds`: its unit).
#[doc(hidden)]
pub fn encode_histogram(
    encoder: &mut DescriptorEncoder,
    name: &str,
    doc: &str,
    histogram: &Histogram,
) -> std::fmt::Result {
    let base = name.strip_suffix("_seconds");
    let unit = base.map(|_| Unit::Seconds);
    let metric = encoder.encode_descriptor(
        base.unwrap_or(name),
        help(doc),
        unit.as_ref(),
        histogram.metric_type(),
    )?;
    histogram.encode(metric)
}

/// Writes a family whose label values are known only at run time (one series per peer,
/// say): `kind` is `counter` or `gauge`, `series` the label values and their values. Writes
/// nothing for no series.
pub fn encode_labelled(
    encoder: &mut DescriptorEncoder,
    name: &str,
    doc: &str,
    kind: &str,
    label: &str,
    series: &[(&str, u64)],
) -> std::fmt::Result {
    if series.is_empty() {
        return Ok(());
    }
    let ty = match kind {
        "counter" => MetricType::Counter,
        _ => MetricType::Gauge,
    };
    let name = name.strip_suffix("_total").unwrap_or(name);
    let mut metric = encoder.encode_descriptor(name, help(doc), None, ty)?;
    for &(value, count) in series {
        let labels = [(label, value)];
        let labelled = metric.encode_family(&labels)?;
        match ty {
            MetricType::Counter => ConstCounter::new(count).encode(labelled)?,
            _ => ConstGauge::new(count).encode(labelled)?,
        }
    }
    Ok(())
}

/// Which text format `/metrics` answers in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0, for a scraper that asks for it (Prometheus does).
    OpenMetrics,
    /// Prometheus' text format 0.0.4: for anyone else (curl, older scrapers).
    Prometheus,
}

impl Format {
    /// The format a request's `Accept` header asks for.
    pub fn for_accept(accept: &str) -> Format {
        match accept.contains("application/openmetrics-text") {
            true => Format::OpenMetrics,
            false => Format::Prometheus,
        }
    }

    /// The answer's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// Every metric of a process, under the prefix `odmesh`: the collectors the crates declare,
/// added once at start, rendered at each scrape.
#[derive(Debug)]
pub struct Exposition {
    registry: Mutex<Registry>,
}

impl Default for Exposition {
    fn default() -> Exposition {
        Exposition {
            registry: Mutex::new(Registry::with_prefix("odmesh")),
        }
    }
}

impl Exposition {
    /// Adds `collector`'s metrics, after those added before.
    pub fn add(&self, collector: impl Collector) {
        self.lock().register_collector(Box::new(collector));
    }

    /// Adds the info metric `odmesh_<name>_info` (value 1) with `labels`, such as a build's
    /// version.
    pub fn add_info(&self, name: &str, help: &str, labels: Vec<(String, String)>) {
        self.lock().register(name, help, Info::new(labels));
    }

    /// Every metric in `format`.
    pub fn render(&self, format: Format) -> String {
        let mut out = String::new();
        let registry = self.lock();
        let written = match format {
            Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry),
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
            }
        };
        // Writing into a String fails only if a collector fails, which ours do not.
        written.expect("metrics render into a String");
        out
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    crate::metrics! {
        /// Metrics to render.
        struct Things {
            /// Things counted.
            things_total: "counter",
            /// Things there are now, a help text
            /// on two lines.
            things: "gauge",
            /// Things refused, by why.
            refused_small_total: "counter" in refused_total { reason = "small" },
            /// (the same family)
            refused_large_total: "counter" in refused_total { reason = "large" },
        }
        histograms {
            /// How long a thing took.
            thing_seconds: (0.001, 10.0, 3),
        }
    }

    #[test]
    fn prometheus_text_has_help_type_labels_and_buckets() {
        let m = Arc::new(Things::default());
        inc(&m.things_total);
        inc(&m.things_total);
        set(&m.things, 7);
        inc(&m.refused_large_total);
        observe(&m.thing_seconds, Duration::from_millis(50));
        observe(&m.thing_seconds, Duration::from_secs(2));
        assert_eq!(
            m.render(),
            "# HELP odmesh_things_total Things counted.\n\
             # TYPE odmesh_things_total counter\n\
             odmesh_things_total 2\n\
             # HELP odmesh_things Things there are now, a help text on two lines.\n\
             # TYPE odmesh_things gauge\n\
             odmesh_things 7\n\
             # HELP odmesh_refused_total Things refused, by why.\n\
             # TYPE odmesh_refused_total counter\n\
             odmesh_refused_total{reason=\"small\"} 0\n\
             odmesh_refused_total{reason=\"large\"} 1\n\
             # HELP odmesh_thing_seconds How long a thing took.\n\
             # TYPE odmesh_thing_seconds histogram\n\
             odmesh_thing_seconds_bucket{le=\"0.001\"} 0\n\
             odmesh_thing_seconds_bucket{le=\"0.01\"} 0\n\
             odmesh_thing_seconds_bucket{le=\"0.1\"} 1\n\
             odmesh_thing_seconds_bucket{le=\"+Inf\"} 2\n\
             odmesh_thing_seconds_sum 2.05\n\
             odmesh_thing_seconds_count 2\n"
        );
    }

    #[test]
    fn openmetrics_names_counters_by_family_and_ends_with_eof() {
        let m = Arc::new(Things::default());
        inc(&m.refused_small_total);
        let exposition = Exposition::default();
        exposition.add(m);
        exposition.add_info(
            "build",
            "The build.",
            vec![("version".into(), "1.2.3".into())],
        );
        let text = exposition.render(Format::OpenMetrics);
        assert!(text.contains("# TYPE odmesh_refused counter\n"), "{text}");
        assert!(
            text.contains("odmesh_refused_total{reason=\"small\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("# UNIT odmesh_thing_seconds seconds\n"),
            "{text}"
        );
        assert!(
            text.contains("odmesh_build_info{version=\"1.2.3\"} 1\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn buckets_and_quantiles_read_a_histogram_as_prometheus_would() {
        let h = histogram(0.001, 10.0, 3);
        assert_eq!(quantile(&buckets(&h), 0.5), None, "nothing observed");
        for ms in [2, 3, 4, 50] {
            observe(&h, Duration::from_millis(ms));
        }
        let b = buckets(&h);
        assert_eq!(b, [(0.001, 0), (0.01, 3), (0.1, 4), (f64::INFINITY, 4)]);
        // The 2nd of 4 lies in (0.001, 0.01], two thirds of the way through its 3.
        let median = quantile(&b, 0.5).unwrap();
        assert!((median - 0.007).abs() < 1e-9, "{median}");
        assert_eq!(quantile(&b, 1.0), Some(0.1));
        observe(&h, Duration::from_secs(5));
        assert_eq!(
            quantile(&buckets(&h), 1.0),
            Some(0.1),
            "past the last bound: that bound"
        );
    }

    #[test]
    fn format_follows_accept() {
        let prometheus = "application/openmetrics-text;version=1.0.0,text/plain;q=0.5";
        assert_eq!(Format::for_accept(prometheus), Format::OpenMetrics);
        assert_eq!(Format::for_accept("*/*"), Format::Prometheus);
        assert_eq!(Format::for_accept(""), Format::Prometheus);
    }
}

//! Counters and gauges as plain atomics, rendered as Prometheus text: each crate declares the
//! metrics it owns with [`metrics!`](crate::metrics!), bumps them with [`inc`] and [`set`], and
//! the admin `/metrics` renders every crate's in turn.

use std::sync::atomic::{AtomicU64, Ordering};

/// Declares a metrics struct, its field docs (the help text) and its Prometheus rendering in
/// one place. Every metric is an `AtomicU64` field, exported as `odmesh_<field>`; a
/// `counter` only goes up, a `gauge` is set.
///
/// ```
/// odmesh_base::metrics! {
///     /// What the example counts.
///     pub struct ExampleMetrics {
///         /// Examples run.
///         examples_total: "counter",
///     }
/// }
/// let m = ExampleMetrics::default();
/// odmesh_base::metrics::inc(&m.examples_total);
/// assert!(m.render().contains("odmesh_examples_total 1\n"));
/// ```
#[macro_export]
macro_rules! metrics {
    (
        $(#[doc = $struct_doc:literal])*
        $vis:vis struct $name:ident {
            $($(#[doc = $doc:literal])* $field:ident : $kind:literal,)*
        }
    ) => {
        $(#[doc = $struct_doc])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $($(#[doc = $doc])* pub $field: ::std::sync::atomic::AtomicU64,)*
        }

        impl $name {
            /// The Prometheus text exposition of these metrics, each prefixed `odmesh_`.
            pub fn render(&self) -> String {
                use ::std::fmt::Write as _;
                let mut out = String::new();
                $(
                    let help = concat!($($doc),*).trim();
                    let _ = writeln!(out, "# HELP odmesh_{} {}", stringify!($field), help);
                    let _ = writeln!(out, "# TYPE odmesh_{} {}", stringify!($field), $kind);
                    let _ = writeln!(
                        out,
                        "odmesh_{} {}",
                        stringify!($field),
                        self.$field.load(::std::sync::atomic::Ordering::Relaxed)
                    );
                )*
                out
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    crate::metrics! {
        /// Two metrics to render.
        struct Two {
            /// Things counted.
            things_total: "counter",
            /// Things there are now, a help text
            /// on two lines.
            things: "gauge",
        }
    }

    #[test]
    fn render_writes_help_type_and_value_for_each_metric() {
        let m = Two::default();
        inc(&m.things_total);
        inc(&m.things_total);
        set(&m.things, 7);
        assert_eq!(
            m.render(),
            "# HELP odmesh_things_total Things counted.\n\
             # TYPE odmesh_things_total counter\n\
             odmesh_things_total 2\n\
             # HELP odmesh_things Things there are now, a help text on two lines.\n\
             # TYPE odmesh_things gauge\n\
             odmesh_things 7\n"
        );
    }
}

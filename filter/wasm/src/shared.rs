//! One limiter per cluster for the whole Envoy, though each worker has a wasm VM of its own:
//! the limiter's state lives in Envoy's shared data (one value per cluster, reached by every
//! VM of this module), and each change is a compare-and-swap on it (docs/envoy.md, "On the
//! caller's side, per destination"). Pure but for the [`Store`] it is given, so the retry
//! loop is tested here without Envoy.

use odmesh_filter::limiter::{Gradient, Setting};

/// A key-value store with compare-and-swap, as Envoy's shared data is: a value comes with a
/// version (`cas`), and a write with that version fails if another wrote in between.
pub trait Store {
    /// The value and its version; `(None, _)` when there is none.
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>);
    /// Writes `value` if the version is still `cas` (`None`: whatever it is). `false`: another
    /// writer came first.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> bool;
}

/// How often a change is tried before giving up: each failure means another worker changed
/// the same limiter in between, so this many in a row does not happen short of a bug.
pub const TRIES: usize = 64;

/// The shared-data key of `cluster`'s limiter.
pub fn key(cluster: &str) -> String {
    format!("odmesh.limit.{cluster}")
}

/// Applies `change` to the limiter of `setting.cluster` at `key` (its [`key`]; made at
/// `setting.params` at `now` if there is none yet, or if what is there is not one; given
/// `setting.params` if they changed) and writes it back, trying again on a concurrent write.
/// `None` after [`TRIES`] failed writes: the caller lets the request through untouched, as
/// without a limit.
pub fn update<T>(
    store: &impl Store,
    key: &str,
    setting: &Setting,
    now: u64,
    mut change: impl FnMut(&mut Gradient) -> T,
) -> Option<T> {
    for _ in 0..TRIES {
        let (bytes, cas) = store.get(key);
        let mut gradient = match bytes.as_deref().and_then(Gradient::decode) {
            Some(g) => g,
            None => Gradient::new(setting.params, now),
        };
        if *gradient.params() != setting.params {
            gradient.set_params(setting.params);
        }
        let result = change(&mut gradient);
        if store.set(key, &gradient.encode(), cas) {
            return Some(result);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;

    use odmesh_filter::limiter::Params;

    use super::*;

    /// Envoy's shared data as proxy-wasm-cpp-host keeps it: a version per key, bumped on
    /// every write; `interfere` writes made by "another worker" just before the next write.
    #[derive(Default)]
    struct Shared {
        values: RefCell<HashMap<String, (Vec<u8>, u32)>>,
        interfere: Cell<usize>,
        next: Cell<u32>,
    }

    impl Store for Shared {
        fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
            match self.values.borrow().get(key) {
                Some((v, cas)) => (Some(v.clone()), Some(*cas)),
                None => (None, None),
            }
        }

        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
            let mut values = self.values.borrow_mut();
            if self.interfere.get() > 0 {
                self.interfere.set(self.interfere.get() - 1);
                if let Some((_, version)) = values.get_mut(key) {
                    *version += 1;
                }
            }
            let current = values.get(key).map(|(_, v)| *v);
            if cas.is_some() && current.is_some() && cas != current {
                return false;
            }
            self.next.set(self.next.get() + 1);
            values.insert(key.to_owned(), (value.to_vec(), self.next.get() + 1000));
            true
        }
    }

    fn setting(cluster: &str, max: u32) -> Setting {
        Setting {
            cluster: cluster.to_owned(),
            params: Params {
                initial_limit: max,
                max_limit: max,
                ..Params::default()
            },
        }
    }

    /// [`update`] of `s`'s limiter at its key, at time 0.
    fn on<T>(store: &Shared, s: &Setting, change: impl FnMut(&mut Gradient) -> T) -> Option<T> {
        update(store, &key(&s.cluster), s, 0, change)
    }

    fn in_flight(store: &Shared, s: &Setting) -> (u32, u32) {
        on(store, s, |g| (g.limit(), g.in_flight())).unwrap()
    }

    #[test]
    fn workers_share_one_limiter_per_cluster() {
        let store = Shared::default();
        let a = setting("a.vip", 2);
        // Two "workers" acquiring in turn share the two slots.
        assert_eq!(on(&store, &a, Gradient::try_acquire), Some(true));
        assert_eq!(on(&store, &a, Gradient::try_acquire), Some(true));
        assert_eq!(on(&store, &a, Gradient::try_acquire), Some(false));
        // Another cluster has its own.
        assert_eq!(
            on(&store, &setting("b.vip", 2), Gradient::try_acquire),
            Some(true)
        );
        on(&store, &a, Gradient::release).unwrap();
        assert_eq!(in_flight(&store, &a), (2, 1));
        assert!(store.values.borrow().contains_key("odmesh.limit.a.vip"));
    }

    #[test]
    fn a_concurrent_write_is_retried_on_what_the_other_wrote() {
        let store = Shared::default();
        let a = setting("a.vip", 5);
        on(&store, &a, Gradient::try_acquire).unwrap();
        store.interfere.set(3);
        let mut tries = 0;
        let got = on(&store, &a, |g| {
            tries += 1;
            g.try_acquire()
        });
        assert_eq!(got, Some(true));
        assert_eq!(tries, 4, "three lost races, then the write");
        assert_eq!(
            in_flight(&store, &a),
            (5, 2),
            "acquired once, not four times"
        );
        // A writer that never wins gives up, and nothing changed.
        store.interfere.set(TRIES);
        assert_eq!(on(&store, &a, Gradient::try_acquire), None);
        assert_eq!(in_flight(&store, &a), (5, 2));
    }

    #[test]
    fn new_settings_reach_the_limiter_and_bad_bytes_start_a_new_one() {
        let store = Shared::default();
        on(&store, &setting("a.vip", 5), Gradient::try_acquire).unwrap();
        assert_eq!(
            in_flight(&store, &setting("a.vip", 3)),
            (3, 1),
            "in flight kept"
        );
        store
            .values
            .borrow_mut()
            .insert(key("a.vip"), (b"garbage".to_vec(), 1));
        assert_eq!(in_flight(&store, &setting("a.vip", 3)), (3, 0));
    }
}

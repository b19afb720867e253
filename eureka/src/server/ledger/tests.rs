//! The ledger on its own: no HTTP, no tasks, the time given by hand.

use std::collections::BTreeSet;

use super::*;
use crate::wire::json::{Port, reconcile_hash_code};

const SEC: Duration = Duration::from_secs(1);

fn terms() -> Terms {
    Terms {
        delta_retention: SEC * 180,
        max_instances: 10_000,
        // Off: these tests are about leases, not about holding them.
        preservation: PreservationConfig {
            threshold: 0.0,
            ..PreservationConfig::default()
        },
    }
}

struct Clock {
    t0: Instant,
    now: Now,
}

impl Clock {
    fn new() -> Clock {
        let t0 = Instant::now();
        Clock {
            t0,
            now: Now { at: t0, ms: 1_000 },
        }
    }

    fn advance(&mut self, by: Duration) {
        self.now.at += by;
        self.now.ms += by.as_millis() as u64;
    }
}

fn registration(app: &str, id: &str, lease: Duration) -> Registration {
    let info = InstanceInfo {
        instance_id: Some(id.to_owned()),
        app: Some(app.to_owned()),
        host_name: Some("10.0.0.1".to_owned()),
        ip_addr: Some("10.0.0.1".to_owned()),
        status: Some("UP".to_owned()),
        port: Some(Port::enabled(8080)),
        vip_address: Some(app.to_ascii_lowercase()),
        ..InstanceInfo::default()
    };
    Registration {
        info,
        reported: Status::Up,
        body_override: None,
        duration: lease,
        renewal_interval: SEC * 30,
        owner: None,
        replicated: false,
        expected_now: false,
    }
}

/// Registers `id` of HELLO with a lease of `lease`.
fn hello(ledger: &mut Ledger, id: &str, lease: Duration, now: Now) -> Registered {
    ledger.register("HELLO", id, registration("HELLO", id, lease), now)
}

fn registered(ledger: &Ledger) -> BTreeSet<String> {
    (ledger.apps.iter())
        .flat_map(|(app, leases)| leases.keys().map(move |id| format!("{app}/{id}")))
        .collect()
}

#[test]
fn a_lease_runs_out_its_duration_after_its_last_heartbeat_not_before() {
    let mut clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    hello(&mut ledger, "h1", SEC * 10, clock.now);
    clock.advance(SEC * 8);
    assert_eq!(ledger.renew("HELLO", "h1", None, clock.now), Ok(()));
    // Its first deadline (10 s) passes: the queue holds it, finds it renewed, keeps it.
    clock.advance(SEC * 9);
    assert!(ledger.evict(clock.now, Duration::ZERO).evicted.is_empty());
    assert_eq!(ledger.len(), 1);
    clock.advance(SEC);
    let round = ledger.evict(clock.now, Duration::ZERO);
    assert_eq!(round.evicted, [(Name::from("HELLO"), Name::from("h1"))]);
    assert_eq!(ledger.len(), 0);
    assert!(ledger.to_registry().registry.is_empty());
    // The delta says so, with the eviction's time in the document.
    let delta = ledger.delta(clock.now.at).applications();
    let info = &delta.application[0].instance[0];
    assert_eq!(info.action_type, Some(ActionType::Deleted));
    let eviction = info.lease_info.as_ref().and_then(|l| l.eviction_timestamp);
    assert_eq!(eviction, Some(clock.now.ms));
}

#[test]
fn a_registration_again_is_not_evicted_by_the_deadline_of_the_one_before() {
    let mut clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    hello(&mut ledger, "h1", SEC * 5, clock.now);
    clock.advance(SEC * 4);
    // Registered again with a longer lease: the first entry in the queue is stale.
    let again = hello(&mut ledger, "h1", SEC * 60, clock.now);
    assert!(!again.new);
    clock.advance(SEC * 2);
    assert!(ledger.evict(clock.now, Duration::ZERO).evicted.is_empty());
    assert_eq!(ledger.len(), 1);
    clock.advance(SEC * 58);
    assert_eq!(ledger.evict(clock.now, Duration::ZERO).evicted.len(), 1);
}

#[test]
fn a_late_round_extends_every_lease_by_its_delay() {
    let mut clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    hello(&mut ledger, "h1", SEC * 10, clock.now);
    hello(&mut ledger, "h2", SEC * 10, clock.now);
    // The process stalled for 60 s: nobody could renew.
    clock.advance(SEC * 61);
    assert!(ledger.evict(clock.now, SEC * 60).evicted.is_empty());
    // h1 renews after the stall; h2 stays silent and runs out 10 s after the stall.
    assert_eq!(ledger.renew("HELLO", "h1", None, clock.now), Ok(()));
    clock.advance(SEC * 9);
    let evicted = ledger.evict(clock.now, Duration::ZERO).evicted;
    assert_eq!(evicted, [(Name::from("HELLO"), Name::from("h2"))]);
    clock.advance(SEC * 2);
    assert_eq!(ledger.evict(clock.now, Duration::ZERO).evicted.len(), 1);
}

#[test]
fn the_lease_the_delta_and_an_answer_share_one_document_until_it_changes() {
    let mut clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    hello(&mut ledger, "h1", SEC * 90, clock.now);
    let lease_doc = |l: &Ledger| l.lease("HELLO", "h1").unwrap().doc.clone();
    let first = lease_doc(&ledger);
    let in_delta = ledger.recent.iter().next().unwrap().1.clone();
    assert!(Stored::same(&first, &in_delta));

    // A heartbeat stamps the lease, not the document; answers show the renewal.
    clock.advance(SEC * 5);
    ledger.renew("HELLO", "h1", None, clock.now).unwrap();
    assert!(Stored::same(&first, &lease_doc(&ledger)));
    let served = ledger.instance("HELLO", "h1").unwrap().info();
    let renewal = served.lease_info.as_ref().unwrap().last_renewal_timestamp;
    assert_eq!(renewal, Some(clock.now.ms));

    // A change copies it: the delta's old entry goes, the new one shares the new document.
    ledger
        .modify("HELLO", "h1", clock.now, |lease| {
            lease.overridden = Some(Status::OutOfService);
            lease.refresh_status();
            Ok::<(), ()>(())
        })
        .unwrap()
        .unwrap();
    let second = lease_doc(&ledger);
    assert!(!Stored::same(&first, &second));
    assert_eq!(second.status(), Status::OutOfService);
    assert_eq!(
        first.status(),
        Status::Up,
        "what was answered before stays as it was"
    );
    assert_eq!(ledger.delta_len(), 1);
    let in_delta = ledger.recent.iter().next().unwrap().1.clone();
    assert!(Stored::same(&second, &in_delta));
}

#[test]
fn a_failed_change_leaves_the_lease_and_the_version_as_they_were() {
    let clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    hello(&mut ledger, "h1", SEC * 90, clock.now);
    let version = ledger.version();
    let failed = ledger.modify("HELLO", "h1", clock.now, |_| Err("no"));
    assert_eq!(failed, Some(Err("no")));
    assert_eq!(ledger.version(), version);
    let unknown = ledger.modify("HELLO", "nope", clock.now, |_| Ok::<(), ()>(()));
    assert_eq!(unknown, None);
}

#[test]
fn the_kept_status_counts_give_the_hash_code_of_every_document() {
    let mut clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    for n in 0..6 {
        let id = format!("h{n}");
        hello(&mut ledger, &id, SEC * 90, clock.now);
    }
    let from_documents = |l: &Ledger| {
        reconcile_hash_code((l.apps.values().flat_map(BTreeMap::values)).map(|l| l.doc.status()))
    };
    for (n, status) in [(0, Status::OutOfService), (1, Status::OutOfService)] {
        let id = format!("h{n}");
        let drain = |lease: &mut Lease| {
            lease.overridden = Some(status);
            lease.refresh_status();
            Ok::<(), ()>(())
        };
        ledger
            .modify("HELLO", &id, clock.now, drain)
            .unwrap()
            .unwrap();
    }
    let mut down = registration("HELLO", "h2", SEC * 90);
    down.reported = Status::Down;
    ledger.register("HELLO", "h2", down, clock.now);
    ledger.cancel("HELLO", "h3", clock.now).unwrap();
    assert_eq!(ledger.hash_code(), "DOWN_1_OUT_OF_SERVICE_2_UP_2_");
    assert_eq!(ledger.hash_code(), from_documents(&ledger));
    clock.advance(SEC * 91);
    ledger.evict(clock.now, Duration::ZERO);
    assert_eq!(ledger.hash_code(), "");
    assert_eq!(ledger.hash_code(), from_documents(&ledger));
}

/// Random registrations, heartbeats, cancels, late and punctual rounds against a model
/// that keeps every lease's deadline by hand: each round evicts exactly what the model says
/// ran out, the published registry is exactly what is registered, and the delta holds the
/// latest change of each instance within the retention.
#[test]
fn eviction_from_the_queue_matches_a_model_over_random_operations() {
    let mut clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    // "APP/id" -> (renewed, duration, credit when renewed).
    let mut model: BTreeMap<String, (Instant, Duration, Duration)> = BTreeMap::new();
    // The delta as a list: each instance's latest change, oldest first.
    type Changes = Vec<(String, String, ActionType, Instant)>;
    let mut changes: Changes = Vec::new();
    fn changed(changes: &mut Changes, app: &str, id: &str, action: ActionType, at: Instant) {
        changes.retain(|(a, i, ..)| (a.as_str(), i.as_str()) != (app, id));
        changes.push((app.to_owned(), id.to_owned(), action, at));
    }
    let mut credit = Duration::ZERO;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for step in 0..4_000 {
        let app = format!("APP{}", next(3));
        let id = format!("i{}", next(12));
        let key = format!("{app}/{id}");
        match next(10) {
            0..=2 => {
                let lease = SEC * (1 + next(20)) as u32;
                ledger.register(&app, &id, registration(&app, &id, lease), clock.now);
                model.insert(key, (clock.now.at, lease, credit));
                changed(&mut changes, &app, &id, ActionType::Added, clock.now.at);
            }
            3..=4 => {
                let renewed = ledger.renew(&app, &id, None, clock.now);
                match model.get_mut(&key) {
                    Some(entry) => {
                        assert_eq!(renewed, Ok(()));
                        (entry.0, entry.2) = (clock.now.at, credit);
                    }
                    None => assert_eq!(renewed, Err(RenewRefused::Unknown)),
                }
            }
            5 => {
                let cancelled = ledger.cancel(&app, &id, clock.now);
                assert_eq!(cancelled.is_some(), model.remove(&key).is_some());
                if cancelled.is_some() {
                    changed(&mut changes, &app, &id, ActionType::Deleted, clock.now.at);
                }
            }
            6..=7 => clock.advance(Duration::from_millis(next(1_500))),
            8 => {
                let status = STATUSES[next(5) as usize];
                let modified = ledger.modify(&app, &id, clock.now, |lease| {
                    lease.overridden = Some(status);
                    lease.refresh_status();
                    Ok::<(), ()>(())
                });
                assert_eq!(modified.is_some(), model.contains_key(&key));
                if modified.is_some() {
                    changed(&mut changes, &app, &id, ActionType::Modified, clock.now.at);
                }
            }
            _ => {
                let late = if next(4) == 0 {
                    SEC * next(5) as u32
                } else {
                    Duration::ZERO
                };
                credit += late;
                let now = clock.now.at;
                let due: BTreeSet<String> = (model.iter())
                    .filter(|(_, (renewed, lease, at))| *renewed + *lease + (credit - *at) <= now)
                    .map(|(k, _)| k.clone())
                    .collect();
                let evicted: BTreeSet<String> = (ledger.evict(clock.now, late).evicted)
                    .iter()
                    .map(|(app, id)| format!("{app}/{id}"))
                    .collect();
                assert_eq!(evicted, due, "at step {step}");
                model.retain(|k, _| !due.contains(k));
                // Evicted most overdue first, which the model does not follow: by name.
                for key in &due {
                    let (app, id) = key.split_once('/').unwrap();
                    changed(&mut changes, app, id, ActionType::Deleted, clock.now.at);
                }
            }
        }
        assert_eq!(
            registered(&ledger),
            model.keys().cloned().collect(),
            "at step {step}"
        );
        assert_eq!(ledger.len(), model.len());
        // The delta holds the latest change of each instance within the retention.
        let now = clock.now.at;
        changes.retain(|(.., at)| now.saturating_duration_since(*at) <= terms().delta_retention);
        let expected: BTreeSet<(String, String, String)> = (changes.iter())
            .map(|(app, id, action, _)| (app.clone(), id.clone(), format!("{action:?}")))
            .collect();
        let delta = ledger.delta(now);
        let held: BTreeSet<(String, String, String)> = (delta.apps.iter())
            .flat_map(|(app, served)| {
                served.iter().map(|s| {
                    let id = s.doc.instance_id().unwrap_or_default().to_owned();
                    (
                        app.to_string(),
                        id,
                        format!("{:?}", s.action.expect("an action")),
                    )
                })
            })
            .collect();
        assert_eq!(held, expected, "at step {step}");
        assert_eq!(ledger.delta_len(), expected.len());
    }
    assert_eq!(ledger.to_registry().registry.len(), model.len());
}

#[test]
fn the_delta_shows_the_last_renewal_before_a_change_a_cancel_or_an_eviction() {
    let mut clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    for id in ["h1", "h2", "h3"] {
        hello(&mut ledger, id, SEC * 30, clock.now);
    }
    clock.advance(SEC * 20);
    let renewed = clock.now.ms;
    for id in ["h1", "h2", "h3"] {
        ledger.renew("HELLO", id, None, clock.now).unwrap();
    }
    clock.advance(SEC);
    let drain = |lease: &mut Lease| {
        lease.overridden = Some(Status::OutOfService);
        lease.refresh_status();
        Ok::<(), ()>(())
    };
    ledger
        .modify("HELLO", "h1", clock.now, drain)
        .unwrap()
        .unwrap();
    ledger.cancel("HELLO", "h2", clock.now).unwrap();
    clock.advance(SEC * 30);
    assert_eq!(ledger.evict(clock.now, Duration::ZERO).evicted.len(), 2);
    let delta = ledger.delta(clock.now.at).applications();
    for info in &delta.application[0].instance {
        let lease = info.lease_info.as_ref().unwrap();
        assert_eq!(
            lease.last_renewal_timestamp,
            Some(renewed),
            "{:?}",
            info.instance_id
        );
    }
}

#[test]
fn register_and_cancel_churn_keeps_the_deadline_queue_within_twice_the_registry() {
    let clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    hello(&mut ledger, "stays", SEC * 90, clock.now);
    for n in 0..10_000 {
        let id = format!("churn-{n}");
        hello(&mut ledger, &id, SEC * 90, clock.now);
        assert!(
            ledger.expiry.len() <= 2 * ledger.len() + 1024,
            "{}",
            ledger.expiry.len()
        );
        ledger.cancel("HELLO", &id, clock.now).unwrap();
    }
    assert_eq!(ledger.len(), 1);
}

/// `id` of HELLO with `lastDirtyTimestamp` `dirty` and port `port`.
fn dirty(id: &str, dirty: u64, port: u16) -> Registration {
    let mut r = registration("HELLO", id, SEC * 90);
    r.info.last_dirty_timestamp = Some(dirty);
    r.info.port = Some(Port::enabled(port));
    r
}

fn port_of(ledger: &Ledger, id: &str) -> Option<u16> {
    let lease = ledger.lease("HELLO", id)?;
    lease.doc().port.as_ref().map(|p| p.port)
}

#[test]
fn an_older_document_registered_again_keeps_the_newer_and_renews_its_lease() {
    let mut clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    ledger.register("HELLO", "h1", dirty("h1", 2_000, 8081), clock.now);
    clock.advance(SEC * 60);
    let late = ledger.register("HELLO", "h1", dirty("h1", 1_000, 8080), clock.now);
    assert!(late.kept_newer && !late.new, "{late:?}");
    assert_eq!(port_of(&ledger, "h1"), Some(8081));
    // Renewed by it: alive 60 s after its first deadline would have passed.
    clock.advance(SEC * 60);
    assert!(ledger.evict(clock.now, Duration::ZERO).evicted.is_empty());
    // A newer or equal one replaces it.
    let newer = ledger.register("HELLO", "h1", dirty("h1", 3_000, 8082), clock.now);
    assert!(!newer.kept_newer);
    assert_eq!(port_of(&ledger, "h1"), Some(8082));
}

#[test]
fn a_replicated_registration_sets_the_override_exactly_and_a_client_one_keeps_it() {
    let mut clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    hello(&mut ledger, "h1", SEC * 90, clock.now);
    let drain = |lease: &mut Lease| -> Result<(), ()> {
        lease.overridden = Some(Status::OutOfService);
        lease.refresh_status();
        Ok(())
    };
    assert_eq!(ledger.modify("HELLO", "h1", clock.now, drain), Some(Ok(())));
    clock.advance(SEC);
    // A client registering again does not undo an operator's drain.
    hello(&mut ledger, "h1", SEC * 90, clock.now);
    let status = |ledger: &Ledger| ledger.lease("HELLO", "h1").map(|l| l.doc().status());
    assert_eq!(status(&ledger), Some(Status::OutOfService));
    // A peer's copy without the override removes it: the peer removed it.
    let mut copy = registration("HELLO", "h1", SEC * 90);
    copy.replicated = true;
    ledger.register("HELLO", "h1", copy, clock.now);
    assert_eq!(status(&ledger), Some(Status::Up));
    let mut drained = registration("HELLO", "h1", SEC * 90);
    (drained.replicated, drained.body_override) = (true, Some(Status::OutOfService));
    ledger.register("HELLO", "h1", drained, clock.now);
    assert_eq!(status(&ledger), Some(Status::OutOfService));
}

#[test]
fn renewals_are_expected_from_an_instances_first_renewal_or_at_once_for_a_peers_live_copy() {
    let mut clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    let window = terms().preservation.window;
    // Every instance here is expected every 30 s: a window of one minute expects two renewals.
    let per_window = window.as_secs_f64() / 30.0;
    let mut copy = registration("HELLO", "copy", SEC * 90);
    copy.expected_now = true;
    ledger.register("HELLO", "copy", copy, clock.now);
    hello(&mut ledger, "client", SEC * 90, clock.now);
    clock.advance(window);
    let expected = |ledger: &mut Ledger, now: Instant| ledger.expected.at(now);
    assert_eq!(
        expected(&mut ledger, clock.now.at),
        per_window,
        "the copy alone"
    );

    // The client's first renewal: expected from then on.
    ledger.renew("HELLO", "client", None, clock.now).unwrap();
    clock.advance(window);
    assert_eq!(expected(&mut ledger, clock.now.at), 2.0 * per_window);
    // Registering again while expected (a changed document) keeps it expected.
    hello(&mut ledger, "client", SEC * 90, clock.now);
    clock.advance(window);
    assert_eq!(expected(&mut ledger, clock.now.at), 2.0 * per_window);
    // Leaving takes each out, whenever it came in.
    ledger.cancel("HELLO", "client", clock.now).unwrap();
    ledger.cancel("HELLO", "copy", clock.now).unwrap();
    assert_eq!(expected(&mut ledger, clock.now.at), 0.0);
}

#[test]
fn the_instance_the_mesh_sees_shares_the_ledgers_names_and_vips() {
    let clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    hello(&mut ledger, "h1", SEC * 90, clock.now);
    hello(&mut ledger, "h2", SEC * 90, clock.now);
    let published = ledger.to_registry().registry;
    let instances: Vec<_> = published.instances().collect();
    let (app, leases) = ledger.apps.get_key_value("HELLO").unwrap();
    let (id, _) = leases.get_key_value("h1").unwrap();
    assert!(Arc::ptr_eq(&instances[0].app, app));
    assert!(Arc::ptr_eq(&instances[0].instance_id, id));
    // The VIP both list is one name, the ledger's.
    assert_eq!(instances[0].vips, ["hello"].map(Arc::<str>::from));
    let (vip, _) = ledger.vip_apps[0].get_key_value("hello").unwrap();
    assert!(Arc::ptr_eq(&instances[0].vips[0], vip));
    assert!(Arc::ptr_eq(&instances[1].vips[0], vip));
}

#[test]
fn the_json_answer_written_instance_by_instance_is_serdes_bytes() {
    let mut clock = Clock::new();
    let mut ledger = Ledger::new(terms(), clock.t0);
    for (app, id) in [("HELLO", "h1"), ("HELLO", "h\"2\u{7}"), ("B<&>", "b1")] {
        let mut r = registration(app, id, SEC * 90);
        r.info.metadata.insert("zone".into(), "é\n".into());
        ledger.register(app, id, r, clock.now);
    }
    clock.advance(SEC);
    ledger.cancel("HELLO", "h1", clock.now);
    for view in [
        ledger.applications(),
        ledger.delta(clock.now.at),
        AppsView::default(),
    ] {
        let applications = view.applications();
        let expected =
            serde_json::to_vec(&crate::wire::json::ApplicationsDocument { applications });
        assert_eq!(
            String::from_utf8(view.to_json()).unwrap(),
            String::from_utf8(expected.unwrap()).unwrap()
        );
    }
    assert!(
        !ledger.applications().apps.is_empty(),
        "something was written"
    );
}

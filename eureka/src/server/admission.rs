//! From a registration to what the ledger records, as pure functions: the body read (JSON or
//! XML), the instance document checked, filled in and made canonical ([`document`]), the
//! caller's claims authorised, and the lease's terms. No lock, no I/O and no clock: the
//! ledger stamps the times, and [`super::EurekaRegistry`] records, counts and logs.

use std::sync::Arc;
use std::time::Duration;

use odmesh_registry::{Status, split_vips};

use super::auth::Caller;
use super::ledger::Registration;
use super::{InvalidRequest, ServerConfig, document, policy};
use crate::wire::json::{InstanceDocument, InstanceInfo};
use crate::wire::xml;

/// How a peer's copy of an instance differs from a client's registration: it states the
/// status the instance reports and its override exactly (and its owner, in its metadata:
/// see [`document`]).
#[derive(Debug)]
pub(super) struct PeerCopy {
    pub reported: Status,
    pub overridden: Option<Status>,
    /// What the peer held when this node filled itself from it (see [`Replicated::held`]).
    ///
    /// [`Replicated::held`]: super::peers::Replicated::held
    pub held: bool,
}

/// A registration ready for the ledger.
#[derive(Debug)]
pub(super) struct Admitted {
    /// The instance id, as Eureka derives it.
    pub id: String,
    pub registration: Registration,
    /// What was changed to bring it within the limits.
    pub fitted: policy::Fitted,
}

/// A client's registration body: XML when it starts with `<`, as Eureka's server takes it,
/// JSON (`{"instance": {...}}`) otherwise.
pub(super) fn read_body(body: &[u8]) -> Result<InstanceInfo, InvalidRequest> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'<') {
        let text = std::str::from_utf8(body)
            .map_err(|e| InvalidRequest::invalid(format!("not UTF-8 XML: {e}")))?;
        return xml::read_instance(text).map_err(|e| {
            InvalidRequest::invalid(format!(
                "not a Eureka registration (<instance>...</instance>): {e}"
            ))
        });
    }
    let doc: InstanceDocument = serde_json::from_slice(body).map_err(|e| {
        InvalidRequest::invalid(format!(
            "not a Eureka registration ({{\"instance\": {{...}}}}): {e}"
        ))
    })?;
    Ok(doc.instance)
}

/// Checks a registration of `info` under `app` (uppercase, checked) and builds what the
/// ledger records: a client's (`copy` is `None`), whose owner is `caller`, or a peer's copy.
pub(super) fn admit(
    caller: &Caller,
    app: &str,
    mut info: InstanceInfo,
    copy: Option<PeerCopy>,
    config: &ServerConfig,
) -> Result<Admitted, InvalidRequest> {
    let id = identify(app, &mut info)?;
    let fitted = policy::fit(&mut info, &config.limits);
    document::canonical(&mut info);
    policy::check_instance(&info, &config.limits)?;
    may_claim(caller, &info)?;
    info.action_type = None;
    let owner = match &copy {
        Some(_) => document::owner_of_copy(&info).map(Arc::from),
        None => caller.owner().map(Arc::from),
    };
    document::set_owner(&mut info, owner.as_deref());
    let registration = terms(info, owner, copy, config.lease_duration);
    Ok(Admitted {
        id,
        registration,
        fitted,
    })
}

/// Names the instance: its `app` is `app` (a registration naming another is refused), its
/// `hostName` defaults to its `ipAddr` (which it must have), and it must have an id; the id.
fn identify(app: &str, info: &mut InstanceInfo) -> Result<String, InvalidRequest> {
    match info.app.as_deref().map(str::trim) {
        Some(named) if !named.is_empty() && !named.eq_ignore_ascii_case(app) => {
            return Err(InvalidRequest::invalid(format!(
                "mismatched app name: the path says {app:?}, the instance {named:?}"
            )));
        }
        _ => info.app = Some(app.to_owned()),
    }
    let Some(ip) = info.ip_addr.clone().filter(|ip| !ip.trim().is_empty()) else {
        return Err(InvalidRequest::invalid("missing ipAddr"));
    };
    if info
        .host_name
        .as_deref()
        .is_none_or(|h| h.trim().is_empty())
    {
        info.host_name = Some(ip);
    }
    let Some(id) = info.id().map(str::to_owned) else {
        return Err(InvalidRequest::invalid("missing instanceId"));
    };
    info.instance_id = Some(id.clone());
    Ok(id)
}

/// Whether `caller` may claim every VIP and SVIP `info` serves.
fn may_claim(caller: &Caller, info: &InstanceInfo) -> Result<(), InvalidRequest> {
    let claimed = split_vips(info.vip_address.as_deref().unwrap_or_default())
        .into_iter()
        .chain(split_vips(
            info.secure_vip_address.as_deref().unwrap_or_default(),
        ));
    for vip in claimed {
        caller.may_claim(&vip).map_err(InvalidRequest::forbidden)?;
    }
    Ok(())
}

/// The lease's terms and statuses of a checked document: the lease it asks for, else
/// `lease_duration`; the status it reports and its override (a peer's copy states both).
fn terms(
    info: InstanceInfo,
    owner: Option<Arc<str>>,
    copy: Option<PeerCopy>,
    lease_duration: Duration,
) -> Registration {
    let lease_info = info.lease_info.as_ref();
    let duration = match lease_info.and_then(|l| l.duration_in_secs) {
        Some(secs) if secs > 0 => Duration::from_secs(secs),
        _ => lease_duration,
    };
    let reported = copy.as_ref().map_or_else(|| info.status(), |c| c.reported);
    // What the client says, within 1 s and its lease (a lease it cannot renew in time
    // makes no sense, and would weigh more in self-preservation than it should).
    let stated_interval = lease_info.and_then(|l| l.renewal_interval_in_secs);
    let renewal_interval = Duration::from_secs(stated_interval.unwrap_or(30))
        .clamp(Duration::from_secs(1), duration.max(Duration::from_secs(1)));
    let body_override = match &copy {
        Some(copy) => copy.overridden,
        None => info
            .overridden_status
            .as_deref()
            .or(info.overriddenstatus_legacy.as_deref())
            .and_then(Status::parse)
            .filter(|s| *s != Status::Unknown),
    };
    Registration {
        info,
        reported,
        body_override,
        duration,
        renewal_interval,
        owner,
        replicated: copy.is_some(),
        expected_now: copy.is_some_and(|c| c.held),
    }
}

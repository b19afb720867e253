//! What the embedded registry accepts from a client, checked before anything is stored:
//! names of a sane length and alphabet, an address traffic may go to, a bounded lease and
//! bounded metadata. Plain functions over the registration; the server answers a refusal
//! with 400 and the reason.

use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use crate::wire::json::InstanceInfo;

/// The bounds of one registration, and of the registry as a whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistrationLimits {
    /// Instances the registry holds at most; a registration of a new one beyond is refused.
    pub max_instances: usize,
    /// Instances one identity may have registered (with authentication); a registration of
    /// a new one beyond is refused, so that one identity cannot fill the registry, nor weigh
    /// on self-preservation with instances it lets lapse.
    pub max_instances_per_identity: usize,
    /// The longest lease (`leaseInfo.durationInSecs`) a client may ask for: a client that
    /// dies holds its VIP at most this long.
    pub max_lease: Duration,
    /// Metadata entries of one instance (its own and its data center's).
    pub max_metadata_entries: usize,
    /// Bytes of metadata (keys and values) of one instance.
    pub max_metadata_bytes: usize,
    /// Which addresses instances may have.
    pub networks: NetworkPolicy,
}

impl Default for RegistrationLimits {
    /// 2,000,000 instances, 10,000 per identity, leases up to 5 minutes, 64 metadata
    /// entries in 8 KiB, any address but loopback, link-local, unspecified, multicast and
    /// broadcast.
    fn default() -> RegistrationLimits {
        RegistrationLimits {
            max_instances: 2_000_000,
            max_instances_per_identity: 10_000,
            max_lease: Duration::from_secs(300),
            max_metadata_entries: 64,
            max_metadata_bytes: 8 * 1024,
            networks: NetworkPolicy::default(),
        }
    }
}

/// Which instance addresses are accepted.
///
/// Never: unspecified (`0.0.0.0`, `::`), link-local (`169.254.0.0/16`, where clouds serve
/// instance credentials; `fe80::/10`), multicast and broadcast. Loopback only with
/// `allow_loopback` (a registration pointing at `127.0.0.1` would send the mesh's traffic to
/// each proxy's own host, its admin port included). When `allowed` is not empty, the address
/// must also be in one of its networks. IPv4 addresses written as IPv6 (`::ffff:a.b.c.d`)
/// are judged as the IPv4 address they are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkPolicy {
    pub allow_loopback: bool,
    pub allowed: Vec<Cidr>,
}

impl NetworkPolicy {
    /// Why `ip` is refused, if it is.
    pub fn check(&self, ip: IpAddr) -> Result<(), String> {
        let ip = ip.to_canonical();
        let kind = match ip {
            IpAddr::V4(v4) if v4.is_unspecified() => Some("the unspecified address"),
            IpAddr::V6(v6) if v6.is_unspecified() => Some("the unspecified address"),
            IpAddr::V4(v4) if v4.is_link_local() => Some("a link-local address"),
            IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("a link-local address"),
            IpAddr::V4(v4) if v4.is_broadcast() => Some("the broadcast address"),
            _ if ip.is_multicast() => Some("a multicast address"),
            _ => None,
        };
        if let Some(kind) = kind {
            return Err(format!("{ip} is {kind}: no instance can be reached there"));
        }
        if ip.is_loopback() && !self.allow_loopback {
            return Err(format!(
                "{ip} is a loopback address: traffic would go to each proxy's own host \
                 (odmesh-control --allow-loopback-instances accepts it, for a single machine)"
            ));
        }
        if !self.allowed.is_empty() && !self.allowed.iter().any(|net| net.contains(ip)) {
            let list: Vec<String> = self.allowed.iter().map(ToString::to_string).collect();
            return Err(format!(
                "{ip} is outside the networks instances may be in ({})",
                list.join(", ")
            ));
        }
        Ok(())
    }
}

/// A network, `a.b.c.d/n` or `x::/n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix)
            }
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let (whole, bits) = (usize::from(prefix / 8), prefix % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    bits == 0 || {
        let mask = 0xffu8 << (8 - bits);
        a[whole] & mask == b[whole] & mask
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = s
            .trim()
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a network: expected ADDRESS/PREFIX"))?;
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?}: {addr:?} is not an IP address"))?;
        if addr.to_canonical() != addr {
            return Err(format!(
                "{s:?}: an IPv4 network written as IPv6; write it as IPv4 (a.b.c.d/n)"
            ));
        }
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("{s:?}: the prefix must be a number from 0 to {max}"))?;
        Ok(Cidr { addr, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A registration refused: which field, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {reason}")]
pub struct Refused {
    pub field: &'static str,
    pub reason: String,
}

fn refused(field: &'static str, reason: impl Into<String>) -> Refused {
    Refused {
        field,
        reason: reason.into(),
    }
}

/// Longest app name.
pub const MAX_APP: usize = 128;
/// Longest instance id.
pub const MAX_ID: usize = 256;
/// Longest host name (DNS's bound).
pub const MAX_HOST: usize = 253;
/// Longest metadata key.
pub const MAX_METADATA_KEY: usize = 128;

/// An app name (as in the path): 1 to 128 characters of letters, digits, `.`, `-`, `_`.
pub fn check_app(app: &str) -> Result<(), Refused> {
    if app.is_empty() || app.len() > MAX_APP {
        return Err(refused(
            "app",
            format!("must be 1 to {MAX_APP} characters, not {}", app.len()),
        ));
    }
    if let Some(c) = app
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
    {
        return Err(refused(
            "app",
            format!("{c:?} is not allowed: use letters, digits, '.', '-' and '_'"),
        ));
    }
    Ok(())
}

/// An instance id: 1 to 256 characters of letters, digits and `. - _ : @ + ~ = [ ]`
/// (`host:app:port`, `[::1]:app:80` and random ids all fit).
pub fn check_id(id: &str) -> Result<(), Refused> {
    if id.is_empty() || id.len() > MAX_ID {
        return Err(refused(
            "instanceId",
            format!("must be 1 to {MAX_ID} characters, not {}", id.len()),
        ));
    }
    let allowed = |c: char| {
        c.is_ascii_alphanumeric()
            || matches!(c, '.' | '-' | '_' | ':' | '@' | '+' | '~' | '=' | '[' | ']')
    };
    if let Some(c) = id.chars().find(|c| !allowed(*c)) {
        return Err(refused(
            "instanceId",
            format!("{c:?} is not allowed: use letters, digits and . - _ : @ + ~ = [ ]"),
        ));
    }
    Ok(())
}

/// A metadata key, which Eureka's XML form writes as an element name: a letter or `_`,
/// then letters, digits, `.`, `-`, `_`; at most 128 characters.
pub fn check_metadata_key(key: &str) -> Result<(), String> {
    let mut chars = key.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if key.len() > MAX_METADATA_KEY || !first_ok || !rest_ok {
        return Err(format!(
            "key {:?} is not allowed: a letter or '_', then letters, digits, '.', '-', '_', at most {MAX_METADATA_KEY} characters",
            odmesh_base::logs::truncated(key, MAX_METADATA_KEY)
        ));
    }
    Ok(())
}

/// Whether `s` holds a control character (other than tab), which no field needs and which
/// would garble logs and answers.
fn has_control(s: &str) -> bool {
    s.chars().any(|c| c.is_control() && c != '\t')
}

/// The metadata of one instance within `limits`: count, bytes, keys, values.
pub fn check_metadata<'a>(
    entries: impl IntoIterator<Item = (&'a String, &'a String)>,
    limits: &RegistrationLimits,
) -> Result<(), Refused> {
    let (mut count, mut bytes) = (0usize, 0usize);
    for (key, value) in entries {
        count += 1;
        bytes += key.len() + value.len();
        check_metadata_key(key).map_err(|reason| refused("metadata", reason))?;
        if has_control(value) {
            return Err(refused(
                "metadata",
                format!("the value of {key:?} holds a control character"),
            ));
        }
    }
    if count > limits.max_metadata_entries {
        return Err(refused(
            "metadata",
            format!(
                "{count} entries; at most {} are allowed",
                limits.max_metadata_entries
            ),
        ));
    }
    if bytes > limits.max_metadata_bytes {
        return Err(refused(
            "metadata",
            format!(
                "{bytes} bytes of keys and values; at most {} are allowed",
                limits.max_metadata_bytes
            ),
        ));
    }
    Ok(())
}

/// What [`fit`] changed in a registration to bring it within the limits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fitted {
    /// The lease asked for, in seconds, when it was longer than the limit (it is the limit
    /// now).
    pub lease_clamped: Option<u64>,
    /// The metadata entries left out (their keys).
    pub metadata_dropped: Vec<String>,
}

impl Fitted {
    /// Whether nothing had to change.
    pub fn is_unchanged(&self) -> bool {
        self.lease_clamped.is_none() && self.metadata_dropped.is_empty()
    }
}

/// Brings a registration within `limits` where Eureka would take it as it is: a lease
/// longer than `max_lease` is shortened to it, and metadata entries the registry cannot
/// keep (a key that is not an XML name, a value with a control character, and those beyond
/// `max_metadata_entries` or `max_metadata_bytes`, `odmesh.*` entries kept first, then in
/// key order) are left out. Eureka's clients count any answer but 204 as a failed
/// registration and never appear; so the instance is registered, and the registry says
/// what it left out (docs/eureka.md).
pub fn fit(info: &mut InstanceInfo, limits: &RegistrationLimits) -> Fitted {
    let mut fitted = Fitted::default();
    if let Some(lease) = &mut info.lease_info
        && let Some(secs) = lease.duration_in_secs
        && Duration::from_secs(secs) > limits.max_lease
    {
        fitted.lease_clamped = Some(secs);
        lease.duration_in_secs = Some(limits.max_lease.as_secs());
    }
    let mut entries: Vec<(String, String)> = info
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // odmesh's own entries (the protocol) first: they change how the mesh routes.
    entries.sort_by_key(|(key, _)| !key.starts_with("odmesh."));
    let data_center = info
        .data_center_info
        .iter()
        .flat_map(|dc| dc.metadata.iter());
    let (mut count, mut bytes) =
        data_center.fold((0, 0), |(n, b), (k, v)| (n + 1, b + k.len() + v.len()));
    let mut kept = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        let size = key.len() + value.len();
        let fits = count < limits.max_metadata_entries && bytes + size <= limits.max_metadata_bytes;
        if fits && check_metadata_key(&key).is_ok() && !has_control(&value) {
            count += 1;
            bytes += size;
            kept.push((key, value));
        } else {
            fitted.metadata_dropped.push(key);
        }
    }
    if !fitted.metadata_dropped.is_empty() {
        info.metadata = kept.into_iter().collect();
    }
    fitted
}

/// A whole registration (already given its id and app, and [`fit`]): every check above,
/// plus the address, the host name, the lease and no control characters in the text fields
/// clients read back.
pub fn check_instance(info: &InstanceInfo, limits: &RegistrationLimits) -> Result<(), Refused> {
    if let Some(id) = &info.instance_id {
        check_id(id)?;
    }
    let ip_text = info.ip_addr.as_deref().unwrap_or_default().trim();
    let ip: IpAddr = ip_text
        .parse()
        .map_err(|_| refused("ipAddr", format!("{ip_text:?} is not an IP address")))?;
    limits
        .networks
        .check(ip)
        .map_err(|reason| refused("ipAddr", reason))?;
    if let Some(host) = &info.host_name
        && (host.len() > MAX_HOST || host.chars().any(|c| c.is_control() || c == ' '))
    {
        return Err(refused(
            "hostName",
            format!("must be at most {MAX_HOST} characters, without spaces or control characters"),
        ));
    }
    // A VIP is what the mesh routes by: one that can never route is refused, not dropped
    // in silence with a 204 that tells the client all is well.
    let lists = [
        ("vipAddress", &info.vip_address),
        ("secureVipAddress", &info.secure_vip_address),
    ];
    for (field, list) in lists {
        for vip in odmesh_registry::split_vips(list.as_deref().unwrap_or_default()) {
            odmesh_registry::check_vip(&vip).map_err(|reason| refused(field, reason))?;
        }
    }
    let texts = [
        ("vipAddress", &info.vip_address),
        ("secureVipAddress", &info.secure_vip_address),
        ("status", &info.status),
        ("overriddenStatus", &info.overridden_status),
        ("homePageUrl", &info.home_page_url),
        ("statusPageUrl", &info.status_page_url),
        ("healthCheckUrl", &info.health_check_url),
        ("secureHealthCheckUrl", &info.secure_health_check_url),
        ("appGroupName", &info.app_group_name),
        ("asgName", &info.asg_name),
        ("sid", &info.sid),
    ];
    for (field, text) in texts {
        if text.as_deref().is_some_and(has_control) {
            return Err(refused(field, "holds a control character"));
        }
    }
    if let Some(secs) = info.lease_info.as_ref().and_then(|l| l.duration_in_secs)
        && Duration::from_secs(secs) > limits.max_lease
    {
        return Err(refused(
            "leaseInfo.durationInSecs",
            format!(
                "{secs} s is longer than the {} s a lease may last (odmesh-control --max-lease-duration)",
                limits.max_lease.as_secs()
            ),
        ));
    }
    let data_center = info
        .data_center_info
        .iter()
        .flat_map(|dc| dc.metadata.iter());
    check_metadata(info.metadata.iter().chain(data_center), limits)?;
    if let Some(name) = info
        .data_center_info
        .as_ref()
        .and_then(|dc| dc.name.as_deref())
        && has_control(name)
    {
        return Err(refused("dataCenterInfo.name", "holds a control character"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_no_instance_can_have_are_refused_whatever_the_policy() {
        let open = NetworkPolicy {
            allow_loopback: true,
            allowed: vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()],
        };
        for bad in [
            "0.0.0.0",
            "::",
            "169.254.169.254",
            "fe80::1",
            "224.0.0.1",
            "ff02::1",
            "255.255.255.255",
            "::ffff:169.254.169.254",
        ] {
            assert!(open.check(ip(bad)).is_err(), "{bad} accepted");
        }
        assert!(open.check(ip("10.0.0.1")).is_ok());
    }

    #[test]
    fn loopback_is_refused_unless_allowed_also_when_written_as_ipv6() {
        let strict = NetworkPolicy::default();
        for lo in ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"] {
            let err = strict.check(ip(lo)).unwrap_err();
            assert!(err.contains("loopback"), "{lo}: {err}");
        }
        let local = NetworkPolicy {
            allow_loopback: true,
            allowed: Vec::new(),
        };
        assert!(local.check(ip("127.0.0.1")).is_ok());
    }

    #[test]
    fn with_allowed_networks_only_their_addresses_are_accepted() {
        let policy = NetworkPolicy {
            allow_loopback: false,
            allowed: vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()],
        };
        assert!(policy.check(ip("10.200.3.4")).is_ok());
        assert!(policy.check(ip("fd12::1")).is_ok());
        let err = policy.check(ip("192.168.1.1")).unwrap_err();
        assert!(
            err.contains("outside") && err.contains("10.0.0.0/8"),
            "{err}"
        );
        assert!(policy.check(ip("::ffff:10.1.1.1")).is_ok(), "mapped IPv4");
    }

    #[test]
    fn networks_parse_with_a_clear_error() {
        let net: Cidr = "192.168.0.0/23".parse().unwrap();
        assert!(net.contains(ip("192.168.1.255")));
        assert!(!net.contains(ip("192.168.2.0")));
        assert!(!net.contains(ip("::1")));
        assert!(
            "10.0.0.0"
                .parse::<Cidr>()
                .unwrap_err()
                .contains("ADDRESS/PREFIX")
        );
        assert!(
            "10.0.0.0/33"
                .parse::<Cidr>()
                .unwrap_err()
                .contains("0 to 32")
        );
        assert!("x/8".parse::<Cidr>().unwrap_err().contains("not an IP"));
        // Once a panic on the first IPv4 registration (a 104-bit prefix of 4 bytes).
        assert!(
            "::ffff:10.0.0.0/104"
                .parse::<Cidr>()
                .unwrap_err()
                .contains("write it as IPv4")
        );
        assert_eq!(net.to_string(), "192.168.0.0/23");
    }

    #[test]
    fn app_names_and_ids_have_a_length_and_an_alphabet() {
        assert!(check_app("HELLO-WORLD_2.0").is_ok());
        for bad in ["", " ", "A B", "A/B", "<X>", &"A".repeat(MAX_APP + 1)] {
            assert!(check_app(bad).is_err(), "{bad:?}");
        }
        for good in [
            "10.0.0.1:hello:8080",
            "[::1]:hello:80",
            "i-0abc",
            "a@b+c~d=e",
        ] {
            assert!(check_id(good).is_ok(), "{good}");
        }
        for bad in ["", "a b", "a/b", "a\nb", "a%2f", &"i".repeat(MAX_ID + 1)] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
    }

    fn registration(json: serde_json::Value) -> InstanceInfo {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_plain_registration_passes() {
        let info = registration(serde_json::json!({
            "instanceId": "h1", "ipAddr": "10.0.0.1", "hostName": "h1.example",
            "leaseInfo": {"durationInSecs": 90}, "metadata": {"zone": "a", "management.port": "8081"}
        }));
        assert_eq!(
            check_instance(&info, &RegistrationLimits::default()),
            Ok(())
        );
    }

    #[test]
    fn an_eternal_lease_is_refused() {
        let info = registration(serde_json::json!({
            "ipAddr": "10.0.0.1", "leaseInfo": {"durationInSecs": 4_000_000_000u64}
        }));
        let err = check_instance(&info, &RegistrationLimits::default()).unwrap_err();
        assert_eq!(err.field, "leaseInfo.durationInSecs");
        assert!(err.reason.contains("300 s"), "{err}");
    }

    #[test]
    fn metadata_is_bounded_in_entries_bytes_and_key_alphabet() {
        let limits = RegistrationLimits {
            max_metadata_entries: 2,
            max_metadata_bytes: 20,
            ..RegistrationLimits::default()
        };
        let meta = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let too_many = meta(&[("a", "1"), ("b", "2"), ("c", "3")]);
        assert!(
            check_metadata(&too_many, &limits)
                .unwrap_err()
                .reason
                .contains("3 entries")
        );
        let too_big = meta(&[("a", &"x".repeat(30))]);
        assert!(
            check_metadata(&too_big, &limits)
                .unwrap_err()
                .reason
                .contains("31 bytes")
        );
        for key in ["a b", "1abc", "<x>", ""] {
            let bad = meta(&[(key, "v")]);
            assert!(check_metadata(&bad, &limits).is_err(), "{key:?}");
        }
        let control = meta(&[("a", "x\u{0}y")]);
        assert!(
            check_metadata(&control, &limits)
                .unwrap_err()
                .reason
                .contains("control")
        );
        assert!(check_metadata(&meta(&[("a.b-c_d", "v")]), &limits).is_ok());
    }

    #[test]
    fn a_vip_that_can_never_route_is_refused_naming_it() {
        let info = registration(
            serde_json::json!({"ipAddr": "10.0.0.1", "vipAddress": "hello, Not A Vip!"}),
        );
        let err = check_instance(&info, &RegistrationLimits::default()).unwrap_err();
        assert_eq!(err.field, "vipAddress");
        assert!(
            err.reason.contains("\"not a vip!\" is not a valid VIP"),
            "{err}"
        );
        let info =
            registration(serde_json::json!({"ipAddr": "10.0.0.1", "secureVipAddress": "ok,x..y"}));
        assert_eq!(
            check_instance(&info, &RegistrationLimits::default())
                .unwrap_err()
                .field,
            "secureVipAddress"
        );
    }

    #[test]
    fn control_characters_in_text_fields_and_bad_host_names_are_refused() {
        let info =
            registration(serde_json::json!({"ipAddr": "10.0.0.1", "vipAddress": "a\u{1b}[31m"}));
        assert_eq!(
            check_instance(&info, &RegistrationLimits::default())
                .unwrap_err()
                .field,
            "vipAddress"
        );
        let info = registration(serde_json::json!({"ipAddr": "10.0.0.1", "hostName": "a b"}));
        assert_eq!(
            check_instance(&info, &RegistrationLimits::default())
                .unwrap_err()
                .field,
            "hostName"
        );
        let info = registration(serde_json::json!({"ipAddr": "localhost"}));
        assert_eq!(
            check_instance(&info, &RegistrationLimits::default())
                .unwrap_err()
                .field,
            "ipAddr"
        );
    }
}

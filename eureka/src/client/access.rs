//! How the follower reaches its Eureka servers: each URL checked, with the credentials it
//! carries and the form in which it may be shown (`user:***@`), and the TLS client for the
//! `https://` ones.

use std::net::IpAddr;
use std::path::Path;

use base64::Engine;
use hyper::header::HeaderValue;
use percent_encoding::percent_decode_str;

use odmesh_base::tls;

use super::{ClientConfig, InvalidEurekaConfig, InvalidEurekaUrl};

/// One checked Eureka base URL.
///
/// Requests go to [`ServerUrl::base`], which has no credentials; they travel in the
/// `Authorization` header, marked sensitive. Everything that shows the URL (logs, errors,
/// `/readyz`, `/debug/registry`) uses its `Display`, which shows a password as `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerUrl {
    /// The base URL without credentials or trailing `/`, e.g. `https://eureka:8761/eureka`.
    base: String,
    /// `base` with `user:***@` when the URL had credentials.
    shown: String,
    tls: bool,
    /// The host is `localhost` or a loopback address.
    loopback: bool,
    /// Sent with every request.
    authorization: Option<HeaderValue>,
}

impl ServerUrl {
    /// Checks a `--eureka` URL: `http://` or `https://`, an optional `user:password@`
    /// (percent-encoded, as in Eureka's own `serviceUrl`), no query; a URL without a path
    /// means `/eureka`, and a trailing `/` is dropped.
    pub fn parse(url: &str) -> Result<ServerUrl, InvalidEurekaUrl> {
        let invalid = |reason: &'static str| InvalidEurekaUrl {
            url: redact_url(url),
            reason: Some(reason),
            source: None,
        };
        let uri: hyper::Uri = url.trim().parse().map_err(|e| InvalidEurekaUrl {
            url: redact_url(url),
            reason: None,
            source: Some(e),
        })?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(invalid("expected http(s)://HOST[:PORT]/PATH")),
        };
        let (Some(authority), Some(host)) = (uri.authority(), uri.host()) else {
            return Err(invalid("no host"));
        };
        if host.is_empty() {
            return Err(invalid("no host"));
        }
        if uri.query().is_some() {
            return Err(invalid("a base URL takes no query"));
        }
        let (userinfo, host_port) = match authority.as_str().rsplit_once('@') {
            Some((userinfo, host_port)) => (Some(userinfo), host_port),
            None => (None, authority.as_str()),
        };
        // `hyper::Uri` takes any text after the host's ':' as the port.
        let port = match host_port.rfind(']') {
            Some(end) => host_port[end + 1..].strip_prefix(':'),
            None => host_port.split_once(':').map(|(_, port)| port),
        };
        if port.is_some_and(|p| p.parse::<u16>().is_err()) {
            return Err(invalid("the port is not a number from 0 to 65535"));
        }
        let authorization = userinfo.map(basic).transpose().map_err(invalid)?;
        let scheme = if tls { "https" } else { "http" };
        let path = uri.path().trim_end_matches('/');
        let path = if path.is_empty() { "/eureka" } else { path };
        let base = format!("{scheme}://{host_port}{path}");
        let shown = match userinfo.and_then(|u| u.split_once(':')) {
            Some((user, _)) => format!("{scheme}://{user}:***@{host_port}{path}"),
            None => base.clone(),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        Ok(ServerUrl {
            base,
            shown,
            tls,
            loopback,
            authorization,
        })
    }

    /// Where requests go: no credentials in it.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The `Authorization` header sent to this server, if any.
    pub fn authorization(&self) -> Option<&HeaderValue> {
        self.authorization.as_ref()
    }

    /// Whether this is an `https://` URL.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// Whether credentials would go in clear text to another host.
    pub fn sends_credentials_in_clear(&self) -> bool {
        self.authorization.is_some() && !self.tls && !self.loopback
    }

    /// Sends `authorization` unless the URL has its own credentials.
    fn authorize_unless_own(&mut self, authorization: Option<&HeaderValue>) {
        if self.authorization.is_none() {
            self.authorization = authorization.cloned();
        }
    }
}

impl std::fmt::Display for ServerUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl std::fmt::Debug for ServerUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// `Authorization: Basic` from a URL's `user:password` (each percent-encoded).
fn basic(userinfo: &str) -> Result<HeaderValue, &'static str> {
    let Some((user, password)) = userinfo.split_once(':') else {
        return Err("credentials in a URL are user:password@");
    };
    let user: Vec<u8> = percent_decode_str(user).collect();
    if user.is_empty() {
        return Err("credentials without a user name");
    }
    if user.contains(&b':') {
        // Basic authentication splits at the first ':' (RFC 7617).
        return Err("a user name cannot hold ':'");
    }
    let mut pair = user;
    pair.push(b':');
    pair.extend(percent_decode_str(password));
    let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
    sensitive(&format!("Basic {encoded}")).ok_or("credentials that no header can carry")
}

fn sensitive(value: &str) -> Option<HeaderValue> {
    let mut value = HeaderValue::from_str(value).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// A URL as it may be shown: a password (or a user-only secret) replaced by `***`. Works on
/// text that is not a valid URL too, so that an error about a bad URL never shows it.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    // The last '@' ends the credentials, even when a password holds an unencoded '/' or '@'.
    let Some((userinfo, after)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) if !user.contains('/') => format!("{scheme}{user}:***@{after}"),
        _ => format!("{scheme}***@{after}"),
    }
}

/// The `Authorization: Bearer` header from a token file: its content, trimmed.
fn bearer(path: &Path) -> Result<HeaderValue, InvalidEurekaConfig> {
    let content =
        std::fs::read_to_string(path).map_err(|source| InvalidEurekaConfig::TokenFile {
            path: path.to_owned(),
            source,
        })?;
    let token = content.trim();
    if token.is_empty() {
        return Err(InvalidEurekaConfig::EmptyToken {
            path: path.to_owned(),
        });
    }
    sensitive(&format!("Bearer {token}")).ok_or_else(|| InvalidEurekaConfig::BadToken {
        path: path.to_owned(),
    })
}

/// The servers, and the TLS client that reaches the `https://` ones.
pub(crate) struct Access {
    pub(crate) urls: Vec<ServerUrl>,
    pub(crate) tls: rustls::ClientConfig,
    /// Which CAs are trusted, for errors: `--eureka-ca FILE` or the system bundle's path.
    pub(crate) trust: String,
}

impl Access {
    /// Checks the URLs, reads the token file and the CA bundle (the system's, the first of
    /// `system_bundles` that exists, when `https://` is used without `--eureka-ca`).
    pub(crate) fn new(
        config: &ClientConfig,
        system_bundles: &[&str],
    ) -> Result<Access, InvalidEurekaConfig> {
        let mut urls = config
            .urls
            .iter()
            .map(|u| ServerUrl::parse(u))
            .collect::<Result<Vec<_>, _>>()?;
        if urls.is_empty() {
            return Err(InvalidEurekaConfig::NoUrl);
        }
        if let Some(path) = &config.token_file {
            let token = bearer(path)?;
            for url in &mut urls {
                url.authorize_unless_own(Some(&token));
            }
        }
        for url in urls.iter().filter(|u| u.sends_credentials_in_clear()) {
            if !config.allow_plain_credentials {
                let url = url.to_string();
                return Err(InvalidEurekaConfig::PlainCredentials { url });
            }
            tracing::warn!(
                %url,
                "credentials go to this server over plain http, readable on the way (--allow-plain-credentials); use https://"
            );
        }
        let (roots, trust) = match &config.ca_file {
            Some(path) => (
                tls::load_bundle(path).map_err(InvalidEurekaConfig::CaBundle)?,
                format!("--eureka-ca {}", path.display()),
            ),
            None if urls.iter().any(ServerUrl::is_tls) => {
                let (path, roots) =
                    tls::load_system_bundle(system_bundles).map_err(InvalidEurekaConfig::NoCa)?;
                (roots, format!("the system CA bundle {}", path.display()))
            }
            None => (rustls::RootCertStore::empty(), "none".to_owned()),
        };
        let tls = tls::client_config(roots).map_err(InvalidEurekaConfig::Tls)?;
        Ok(Access { urls, tls, trust })
    }
}

/// The HTTP client to Eureka servers, for the follower and the peers alike: `http://` or
/// `https://` (verified by `tls`), HTTP/1.1, Nagle off, a connection bounded by
/// `connect_timeout`, idle connections kept a minute.
pub(crate) fn http_client<B>(
    tls: rustls::ClientConfig,
    connect_timeout: std::time::Duration,
) -> hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    B,
>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut tcp = hyper_util::client::legacy::connect::HttpConnector::new();
    tcp.set_connect_timeout(Some(connect_timeout));
    tcp.set_nodelay(true);
    tcp.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp);
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(std::time::Duration::from_secs(60))
        .build(connector)
}

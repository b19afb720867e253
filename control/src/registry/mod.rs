//! Registry sources, and the one plain model of apps and instances they all produce.
//!
//! A source (a watched file, a Eureka server, the embedded registry) turns what it reads into
//! a [`Registry`]; everything above this layer sees only that.

/// The status of an instance, as Eureka names it. Only [`Status::Up`] carries traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Up,
    Down,
    Starting,
    OutOfService,
    Unknown,
}

impl Status {
    /// Eureka's spelling: `UP`, `DOWN`, `STARTING`, `OUT_OF_SERVICE`, `UNKNOWN`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Up => "UP",
            Status::Down => "DOWN",
            Status::Starting => "STARTING",
            Status::OutOfService => "OUT_OF_SERVICE",
            Status::Unknown => "UNKNOWN",
        }
    }

    /// Parses Eureka's spelling, case-insensitively; `None` for anything else.
    pub fn parse(s: &str) -> Option<Status> {
        [
            Status::Up,
            Status::Down,
            Status::Starting,
            Status::OutOfService,
            Status::Unknown,
        ]
        .into_iter()
        .find(|st| st.as_str().eq_ignore_ascii_case(s.trim()))
    }
}

/// One registered instance of an app, in the terms every source shares.
///
/// VIP and SVIP names are lowercase and valid (see `odmesh_names::validate_vip`); a source
/// drops or reports names that are not.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Instance {
    /// The app name, as registered (Eureka uppercases it).
    pub app: String,
    /// Unique within the app; the file form derives one from ip and ports when absent.
    pub instance_id: String,
    /// The address traffic goes to.
    pub ip: std::net::IpAddr,
    /// The plain port, when enabled.
    pub port: Option<u16>,
    /// The secure port, when enabled.
    pub secure_port: Option<u16>,
    /// VIPs served on `port`.
    pub vips: Vec<String>,
    /// SVIPs served on `secure_port`.
    pub svips: Vec<String>,
    pub status: Status,
    /// Availability zone, used as the endpoint's locality.
    pub zone: Option<String>,
}

/// Every instance a source knows of, in the order it read them.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Registry {
    pub instances: Vec<Instance>,
}

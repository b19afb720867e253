//! Who may use the embedded registry (`--eureka-auth FILE`): identities with a token each.
//!
//! With a tokens file, every request needs credentials: `Authorization: Bearer <token>`, or
//! `Basic` with the identity's name as user and its token as password (what Eureka clients
//! send for `http://name:token@host/eureka` URLs). An identity owns the instances it
//! registers: only it, or an operator, may renew, change or cancel them; and it may register
//! only under the apps and for the VIPs and SVIPs the file grants it (so it can neither
//! route a VIP nor pose as an app, nor squat an instance id of another's app). Without the file (the default on loopback,
//! and in `make run`), anyone may do anything, as with a stock Eureka server.
//!
//! ```yaml
//! identities:
//!   - name: hello          # owns what it registers
//!     token: "a-long-random-secret"
//!     apps: [HELLO]        # apps it may register instances of; default: [name]; "*": any
//!     vips: [hello, hello-canary]   # VIPs and SVIPs it may register; default: [name]; "*": any
//!   - name: ops
//!     token: "another-long-random-secret"
//!     operator: true       # may change or remove any instance
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, RwLock};

use axum::http::HeaderValue;
use serde::Deserialize;

/// Tokens shorter than this are refused: a token is the only secret there is.
pub const MIN_TOKEN: usize = 16;

/// A tokens file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum InvalidAuthFile {
    #[error("cannot read {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Not YAML, or not this form; `field` is where in the file (`identities[0].role`), and
    /// the message ends with the line and column. Boxed: an error is rare, and this keeps
    /// `Result`s small.
    #[error("{path}{}", field.as_ref().map_or(String::new(), |f| format!(": {f}")))]
    Yaml {
        path: String,
        field: Option<String>,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    #[error("{path}: identity {index} ({name:?}): {reason}")]
    Identity {
        path: String,
        index: usize,
        name: String,
        reason: String,
    },
    #[error("{path}: no identity: list at least one under `identities`")]
    Empty { path: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    identities: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    token: String,
    #[serde(default)]
    operator: bool,
    apps: Option<Vec<String>>,
    vips: Option<Vec<String>>,
}

/// The names (VIPs and SVIPs, or apps) an identity may register.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grant {
    Any,
    Only(BTreeSet<String>),
}

impl Grant {
    /// Whether `name` (in the grant's case: VIPs lowercase, apps uppercase) is granted.
    pub fn allows(&self, name: &str) -> bool {
        match self {
            Grant::Any => true,
            Grant::Only(names) => names.contains(name),
        }
    }

    /// `list` (default: `[default]`) as a grant, each name through `check` (which normalises
    /// it or says why it is not a name); `"*"` grants any.
    fn of(
        list: Option<&Vec<String>>,
        default: &str,
        check: impl Fn(&str) -> Result<String, String>,
    ) -> Result<Grant, String> {
        let list = list.cloned().unwrap_or_else(|| vec![default.to_owned()]);
        if list.iter().any(|v| v == "*") {
            return Ok(Grant::Any);
        }
        list.iter()
            .map(|v| check(v))
            .collect::<Result<_, _>>()
            .map(Grant::Only)
    }
}

/// Who is making a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Authentication is off: anyone may do anything.
    Anyone,
    /// An identity of the tokens file.
    Client {
        name: String,
        apps: Grant,
        vips: Grant,
    },
    /// An operator of the tokens file: may do anything, to any instance.
    Operator { name: String },
}

/// [`Caller::Anyone`], shared by every request while authentication is off.
pub static ANYONE: LazyLock<Arc<Caller>> = LazyLock::new(|| Arc::new(Caller::Anyone));

impl Caller {
    /// The owner recorded on what this caller registers (`None` when authentication is off).
    pub fn owner(&self) -> Option<&str> {
        match self {
            Caller::Anyone => None,
            Caller::Client { name, .. } | Caller::Operator { name } => Some(name),
        }
    }

    /// Whether this is an operator of the tokens file (not anyone, with authentication off).
    pub fn is_operator(&self) -> bool {
        matches!(self, Caller::Operator { .. })
    }

    /// Why this caller may not change an instance owned by `owner`, if it may not.
    pub fn may_change(&self, owner: Option<&str>) -> Result<(), String> {
        match self {
            Caller::Anyone | Caller::Operator { .. } => Ok(()),
            Caller::Client { name, .. } if owner == Some(name.as_str()) => Ok(()),
            Caller::Client { name, .. } => Err(format!(
                "identity {name:?} may not change an instance registered by {}",
                owner.map_or("nobody known".to_owned(), |o| format!("{o:?}"))
            )),
        }
    }

    /// Why this caller may not send a peer's writes (which carry their owner and override),
    /// if it may not: only an operator may, with a tokens file.
    pub fn may_replicate(&self) -> Result<(), String> {
        match self {
            Caller::Anyone | Caller::Operator { .. } => Ok(()),
            Caller::Client { name, .. } => Err(format!(
                "identity {name:?} may not send a peer's writes: peers need an operator identity"
            )),
        }
    }

    /// Why this caller may not register `vip`, if it may not.
    pub fn may_claim(&self, vip: &str) -> Result<(), String> {
        match self {
            Caller::Client { name, vips, .. } if !vips.allows(vip) => Err(format!(
                "identity {name:?} may not register VIP {vip:?} (see its `vips` in the tokens file)"
            )),
            _ => Ok(()),
        }
    }

    /// Why this caller may not register instances of `app` (uppercase), if it may not.
    pub fn may_register_app(&self, app: &str) -> Result<(), String> {
        match self {
            Caller::Client { name, apps, .. } if !apps.allows(app) => Err(format!(
                "identity {name:?} may not register instances of app {app:?} (see its `apps` in the tokens file)"
            )),
            _ => Ok(()),
        }
    }
}

/// Why a request carries no usable credentials (always answered 401, saying no more, so
/// that nobody learns which identities exist).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "missing or invalid credentials: send Authorization: Bearer <token>, or Basic with the identity's name and token"
)]
pub struct Unauthenticated;

/// The identities of a tokens file. They can be replaced whole while requests are served
/// ([`Authenticator::reload`]): each request is authenticated against one version of the
/// file, the old or the new.
pub struct Authenticator {
    identities: RwLock<Arc<Vec<Identity>>>,
}

struct Identity {
    /// The SHA-256 of its token: every comparison is of two digests of the same length, so
    /// its time says nothing of the token's length either.
    token: Digest,
    /// Shared with every request it makes.
    caller: Arc<Caller>,
}

impl Identity {
    fn name(&self) -> &str {
        self.caller.owner().unwrap_or_default()
    }

    /// The identity `entry` declares, if it is valid and unlike the `others`; else its name
    /// and why not.
    fn of(entry: Entry, others: &[Identity]) -> Result<Identity, (String, String)> {
        let invalid = |reason: String| (entry.name.clone(), reason);
        if entry.name.is_empty() || entry.name.contains(':') || entry.name.len() > 128 {
            return Err(invalid(
                "a name is 1 to 128 characters, without ':'".to_owned(),
            ));
        }
        if entry.token.chars().count() < MIN_TOKEN {
            return Err(invalid(format!(
                "the token must be at least {MIN_TOKEN} characters"
            )));
        }
        if others
            .iter()
            .any(|i| i.name() == entry.name || i.token == digest(entry.token.as_bytes()))
        {
            return Err(invalid(
                "another identity has the same name or token".to_owned(),
            ));
        }
        let caller = if entry.operator {
            if entry.vips.is_some() || entry.apps.is_some() {
                return Err(invalid(
                    "an operator may register any app and VIP: drop `apps` and `vips`".to_owned(),
                ));
            }
            Caller::Operator {
                name: entry.name.clone(),
            }
        } else {
            let vips = Grant::of(entry.vips.as_ref(), &entry.name, |vip| {
                let vip = vip.trim().to_ascii_lowercase();
                odmesh_registry::check_vip(&vip).map(|()| vip)
            })
            .map_err(invalid)?;
            let apps = Grant::of(entry.apps.as_ref(), &entry.name, |app| {
                let app = app.trim().to_ascii_uppercase();
                super::policy::check_app(&app)
                    .map(|()| app)
                    .map_err(|e| e.to_string())
            })
            .map_err(invalid)?;
            Caller::Client {
                name: entry.name.clone(),
                apps,
                vips,
            }
        };
        Ok(Identity {
            token: digest(entry.token.as_bytes()),
            caller: Arc::new(caller),
        })
    }
}

impl std::fmt::Debug for Authenticator {
    /// Names only: tokens never reach a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.current().iter().map(Identity::name))
            .finish()
    }
}

impl Authenticator {
    /// Reads a tokens file (see the module docs); warns when others may read it.
    pub fn load(path: &Path) -> Result<Authenticator, InvalidAuthFile> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| InvalidAuthFile::Io {
            path: shown.clone(),
            source,
        })?;
        #[cfg(unix)]
        if let Ok(meta) = std::fs::metadata(path) {
            use std::os::unix::fs::PermissionsExt;
            if meta.permissions().mode() & 0o077 != 0 {
                tracing::warn!(path = %shown, "the tokens file can be read by other users: chmod 600 it");
            }
        }
        Authenticator::parse(&shown, &bytes)
    }

    /// Parses a tokens file's content; `path` only names it in errors.
    pub fn parse(path: &str, yaml: &[u8]) -> Result<Authenticator, InvalidAuthFile> {
        // Without a snippet of the file, which would show the tokens next to the mistake.
        let mut options = serde_saphyr::Options::default();
        options.with_snippet = false;
        let mut field = None;
        let file: File =
            serde_saphyr::with_deserializer_from_slice_with_options(yaml, options, |de| {
                serde_path_to_error::deserialize(de).map_err(|e| {
                    field = Some(e.path().to_string()).filter(|p| p != ".");
                    e.into_inner()
                })
            })
            .map_err(|source| InvalidAuthFile::Yaml {
                path: path.to_owned(),
                field,
                source: Box::new(source),
            })?;
        if file.identities.is_empty() {
            return Err(InvalidAuthFile::Empty {
                path: path.to_owned(),
            });
        }
        let mut identities: Vec<Identity> = Vec::new();
        for (index, entry) in file.identities.into_iter().enumerate() {
            let identity = Identity::of(entry, &identities).map_err(|(name, reason)| {
                InvalidAuthFile::Identity {
                    path: path.to_owned(),
                    index,
                    name,
                    reason,
                }
            })?;
            identities.push(identity);
        }
        Ok(Authenticator {
            identities: RwLock::new(Arc::new(identities)),
        })
    }

    /// The identities in force.
    fn current(&self) -> Arc<Vec<Identity>> {
        (self.identities.read())
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How many identities are in force.
    pub fn len(&self) -> usize {
        self.current().len()
    }

    /// Whether no identity is in force (never: a tokens file lists at least one).
    pub fn is_empty(&self) -> bool {
        self.current().is_empty()
    }

    /// Reads the tokens file at `path` again and puts its identities in force, all at once,
    /// for the requests that arrive from now on; a file that cannot be used is refused, and
    /// the identities in force stay. Returns how many there are now.
    pub fn reload(&self, path: &Path) -> Result<usize, InvalidAuthFile> {
        let new = Authenticator::load(path)?;
        let identities = new
            .identities
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        let count = identities.len();
        *self.identities.write().unwrap_or_else(|e| e.into_inner()) = identities;
        Ok(count)
    }

    /// The caller an `Authorization` header proves.
    pub fn authenticate(
        &self,
        header: Option<&HeaderValue>,
    ) -> Result<Arc<Caller>, Unauthenticated> {
        let value = header
            .and_then(|h| h.to_str().ok())
            .ok_or(Unauthenticated)?;
        let (scheme, credentials) = value.trim().split_once(' ').ok_or(Unauthenticated)?;
        let credentials = credentials.trim();
        let basic: String;
        let (name, token): (Option<&str>, &[u8]) = if scheme.eq_ignore_ascii_case("bearer") {
            (None, credentials.as_bytes())
        } else if scheme.eq_ignore_ascii_case("basic") {
            let decoded = base64_decode(credentials).ok_or(Unauthenticated)?;
            basic = String::from_utf8(decoded).map_err(|_| Unauthenticated)?;
            let (user, password) = basic.split_once(':').ok_or(Unauthenticated)?;
            (Some(user), password.as_bytes())
        } else {
            return Err(Unauthenticated);
        };
        // Every token is compared, in time independent of where they differ and of their
        // lengths.
        let token = digest(token);
        // One version of the file for the whole request.
        let identities = self.current();
        let mut found: Option<&Identity> = None;
        for identity in identities.iter() {
            if constant_time_eq(&identity.token, &token) {
                found = Some(identity);
            }
        }
        match (found, name) {
            (Some(identity), Some(user)) if user != identity.name() => Err(Unauthenticated),
            (Some(identity), _) => Ok(identity.caller.clone()),
            (None, _) => Err(Unauthenticated),
        }
    }
}

/// An [`Authenticator`] and the tokens file it is read from, read again when the file
/// changes or on SIGHUP ([`odmesh_base::reload`]).
#[derive(Debug)]
pub struct TokensFile {
    path: PathBuf,
    auth: Arc<Authenticator>,
}

impl TokensFile {
    /// `auth`, as read from `path`.
    pub fn new(path: PathBuf, auth: Arc<Authenticator>) -> TokensFile {
        TokensFile { path, auth }
    }
}

impl odmesh_base::reload::Reload for TokensFile {
    fn files(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
    }

    fn reload(&self) -> Result<String, odmesh_base::reload::BoxError> {
        let count = self.auth.reload(&self.path)?;
        // Names and counts only: never a token.
        Ok(format!("{count} identities"))
    }
}

/// A token's SHA-256.
type Digest = [u8; 32];

fn digest(token: &[u8]) -> Digest {
    let hash = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0; 32];
    out.copy_from_slice(hash.as_ref());
    out
}

/// Whether two digests are equal, in time independent of where they differ.
fn constant_time_eq(a: &Digest, b: &Digest) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Standard base64, with or without padding (clients differ); `None` for anything else.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    base64::Engine::decode(&LENIENT, text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use odmesh_base::error::{Chain, repeats_its_cause};

    const FILE: &str = "identities:\n  - name: hello\n    token: hello-token-0123456789\n  - name: both\n    token: both-token-0123456789\n    vips: [hello, Other]\n  - name: ops\n    token: ops-token-0123456789ab\n    operator: true\n";

    fn auth() -> Authenticator {
        Authenticator::parse("tokens.yaml", FILE.as_bytes()).unwrap()
    }

    fn header(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).unwrap()
    }

    fn basic(user: &str, password: &str) -> HeaderValue {
        // Encoded here independently of the decoder under test.
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let raw = format!("{user}:{password}").into_bytes();
        let mut out = String::new();
        for chunk in raw.chunks(3) {
            let mut b = [0u8; 3];
            b[..chunk.len()].copy_from_slice(chunk);
            let n = u32::from_be_bytes([0, b[0], b[1], b[2]]);
            for i in 0..=chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
            out.extend(std::iter::repeat_n('=', 3 - chunk.len()));
        }
        header(&format!("Basic {out}"))
    }

    #[test]
    fn a_bearer_token_or_basic_credentials_name_the_caller() {
        let auth = auth();
        let hello = auth
            .authenticate(Some(&header("Bearer hello-token-0123456789")))
            .unwrap();
        assert_eq!(hello.owner(), Some("hello"));
        assert_eq!(
            auth.authenticate(Some(&basic("hello", "hello-token-0123456789")))
                .unwrap(),
            hello
        );
        let ops = auth
            .authenticate(Some(&header("bearer ops-token-0123456789ab")))
            .unwrap();
        assert!(matches!(*ops, Caller::Operator { .. }));
    }

    #[test]
    fn missing_wrong_or_mismatched_credentials_are_refused() {
        let auth = auth();
        for bad in [
            None,
            Some(header("Bearer wrong-token-0123456789")),
            Some(header("Bearer")),
            Some(header("Token hello-token-0123456789")),
            Some(header("Basic !!!")),
            Some(basic("ops", "hello-token-0123456789")),
            Some(basic("hello", "")),
        ] {
            assert_eq!(
                auth.authenticate(bad.as_ref()),
                Err(Unauthenticated),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_client_changes_only_what_it_registered_and_claims_only_its_vips() {
        let auth = auth();
        let hello = auth
            .authenticate(Some(&header("Bearer hello-token-0123456789")))
            .unwrap();
        let both = auth
            .authenticate(Some(&header("Bearer both-token-0123456789")))
            .unwrap();
        let ops = auth
            .authenticate(Some(&header("Bearer ops-token-0123456789ab")))
            .unwrap();
        assert!(hello.may_change(Some("hello")).is_ok());
        let err = hello.may_change(Some("both")).unwrap_err();
        assert!(err.contains("\"both\""), "{err}");
        assert!(ops.may_change(Some("hello")).is_ok());
        assert!(Caller::Anyone.may_change(Some("hello")).is_ok());
        assert!(hello.may_claim("hello").is_ok(), "default: its own name");
        assert!(hello.may_claim("other").is_err());
        assert!(
            hello.may_register_app("HELLO").is_ok(),
            "default: its own name, uppercase"
        );
        let err = hello.may_register_app("BOTH").unwrap_err();
        assert!(
            err.contains("may not register instances of app \"BOTH\""),
            "{err}"
        );
        assert!(ops.may_register_app("ANY").is_ok());
        assert!(
            both.may_claim("other").is_ok(),
            "granted names are lowercased"
        );
        assert!(ops.may_claim("anything").is_ok());
    }

    #[test]
    fn a_bad_tokens_file_says_which_identity_and_why() {
        let short = "identities:\n  - {name: a, token: short}\n";
        let err = Authenticator::parse("t.yaml", short.as_bytes()).unwrap_err();
        assert!(
            err.to_string().contains("identity 0 (\"a\")") && err.to_string().contains("16"),
            "{err}"
        );
        let dup = "identities:\n  - {name: a, token: aaaaaaaaaaaaaaaa}\n  - {name: b, token: aaaaaaaaaaaaaaaa}\n";
        let err = Authenticator::parse("t.yaml", dup.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("same name or token"), "{err}");
        let unknown = "identities:\n  - {name: a, token: aaaaaaaaaaaaaaaa, role: admin}\n";
        assert!(Authenticator::parse("t.yaml", unknown.as_bytes()).is_err());
        let bad_vip = "identities:\n  - {name: a, token: aaaaaaaaaaaaaaaa, vips: [\"no way\"]}\n";
        assert!(Authenticator::parse("t.yaml", bad_vip.as_bytes()).is_err());
        let empty = "identities: []\n";
        assert!(matches!(
            Authenticator::parse("t.yaml", empty.as_bytes()),
            Err(InvalidAuthFile::Empty { .. })
        ));
    }

    #[test]
    fn a_wrong_field_in_the_tokens_file_names_its_line_and_not_the_tokens() {
        let file = "identities:\n  - name: a\n    token: secret-token-0123456789\n    operator: maybe\n    role: admin\n";
        let err = Authenticator::parse("t.yaml", file.as_bytes()).unwrap_err();
        let err = Chain(&err).to_string();
        assert_eq!(
            err,
            "t.yaml: identities[0].operator: invalid boolean at line 4, column 15"
        );
        let unknown = file.replace("operator: maybe", "operator: true");
        let err = Authenticator::parse("t.yaml", unknown.as_bytes()).unwrap_err();
        let err = Chain(&err).to_string();
        assert!(
            err.starts_with("t.yaml: identities[0].role: unknown field `role`"),
            "{err}"
        );
        assert!(err.ends_with("at line 5, column 5"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn a_tokens_file_error_shows_its_cause_once() {
        let missing = Authenticator::load(Path::new("/nonexistent/odmesh/tokens.yaml"));
        let not_a_list = Authenticator::parse("t.yaml", b"identities: 3\n");
        for err in [missing.err().unwrap(), not_a_list.err().unwrap()] {
            assert!(std::error::Error::source(&err).is_some(), "{err}");
            assert!(!repeats_its_cause(&err), "{}", Chain(&err));
        }
    }

    #[test]
    fn a_prefix_or_an_extension_of_a_token_is_not_the_token() {
        let auth = Authenticator::parse("t.yaml", FILE.as_bytes()).unwrap();
        let bearer = |token: &str| HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
        assert!(
            auth.authenticate(Some(&bearer("hello-token-0123456789")))
                .is_ok()
        );
        for near in ["hello-token-012345678", "hello-token-0123456789x", ""] {
            assert!(auth.authenticate(Some(&bearer(near))).is_err(), "{near:?}");
        }
    }

    #[test]
    fn tokens_never_show_in_debug_output() {
        let shown = format!("{:?}", auth());
        assert!(!shown.contains("token-0123"), "{shown}");
        assert!(shown.contains("hello"));
    }

    /// Writes `content` over `path` as an operator should: a new file renamed over it.
    fn replace(path: &Path, content: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn a_reloaded_tokens_file_replaces_every_identity_at_once_and_a_bad_one_keeps_the_old() {
        use odmesh_base::reload::Reload;
        let dir = std::env::temp_dir().join(format!("odmesh-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens.yaml");
        replace(&path, FILE);
        let auth = Arc::new(Authenticator::load(&path).unwrap());
        let file = TokensFile::new(path.clone(), auth.clone());
        let bearer = |token: &str| HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
        let hello = auth
            .authenticate(Some(&bearer("hello-token-0123456789")))
            .unwrap();

        // `hello` revoked, `fresh` added, `ops` kept.
        let revoked = "identities:\n  - name: fresh\n    token: fresh-token-0123456789\n  - name: ops\n    token: ops-token-0123456789ab\n    operator: true\n";
        replace(&path, revoked);
        assert_eq!(file.reload().unwrap(), "2 identities");
        assert_eq!(
            auth.authenticate(Some(&bearer("hello-token-0123456789"))),
            Err(Unauthenticated)
        );
        assert!(
            auth.authenticate(Some(&bearer("fresh-token-0123456789")))
                .is_ok()
        );
        assert!(
            auth.authenticate(Some(&bearer("ops-token-0123456789ab")))
                .is_ok()
        );
        // A request authenticated before keeps its caller to its end.
        assert_eq!(hello.owner(), Some("hello"));

        // Files that cannot be used are refused, without a token in the reason, and the
        // identities in force stay.
        for bad in [
            "identities:\n  - name: a\n    token: leaked-token-0123456789\n    operator: maybe\n",
            "identities:\n  - {name: a, token: leaked-token-0123456789}\n  - {name: b, token: leaked-token-0123456789}\n",
            "identities: []\n",
            "",
        ] {
            replace(&path, bad);
            let err = file.reload().unwrap_err();
            let shown = Chain(&*err).to_string();
            assert!(shown.contains("tokens.yaml"), "{shown}");
            assert!(!shown.contains("leaked"), "{shown}");
            assert_eq!(auth.len(), 2, "{bad:?}");
            assert!(
                auth.authenticate(Some(&bearer("fresh-token-0123456789")))
                    .is_ok()
            );
        }
        std::fs::remove_file(&path).unwrap();
        assert!(file.reload().is_err(), "a file gone");
        assert!(
            auth.authenticate(Some(&bearer("fresh-token-0123456789")))
                .is_ok()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(base64_decode("aGk=").unwrap(), b"hi");
        assert_eq!(base64_decode("aGk").unwrap(), b"hi");
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert!(base64_decode("a").is_none());
        assert!(base64_decode("a*==").is_none());
    }
}

//! Eureka's replication between registries, as its servers exchange it: a batch of writes
//! (`POST /peerreplication/batch`, `{"replicationList": [...]}`) and the answers to it
//! (`{"responseList": [...]}`), docs/eureka.md, "Replication between peers". The instance in
//! an entry is the same [`InstanceInfo`] every other document holds.

use serde::{Deserialize, Serialize};

use super::json::{InstanceInfo, lenient};

/// What a write asks of a peer: Eureka's replication actions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    Register,
    Heartbeat,
    Cancel,
    StatusUpdate,
    DeleteStatusOverride,
}

/// One entry of `{"replicationList": [...]}`, as Eureka writes it; `I` is the instance,
/// owned when read and borrowed when written.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "I: Deserialize<'de>"))]
pub struct Entry<I> {
    pub app_name: String,
    pub id: String,
    #[serde(default)]
    #[serde(with = "lenient::number", skip_serializing_if = "Option::is_none")]
    pub last_dirty_timestamp: Option<u64>,
    #[serde(default)]
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub overridden_status: Option<String>,
    #[serde(default)]
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_info: Option<I>,
    pub action: Action,
}

/// `{"replicationList": [...]}`: a batch of writes, in order.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "I: Deserialize<'de>"))]
pub struct Batch<I> {
    pub replication_list: Vec<Entry<I>>,
}

/// The answer to one entry: an HTTP status.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reply {
    pub status_code: u16,
    /// With 409: the peer's newer document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_entity: Option<InstanceInfo>,
}

/// `{"responseList": [...]}`: the answers to a batch, in its order.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Replies {
    pub response_list: Vec<Reply>,
}

//! Which keys a node admits, from its settings, and their reload while it runs.
//!
//! A member pins every member's public keys and lists the clients it admits (see
//! `atomos_net::roster`). Reloading the configuration (the `node` command does on SIGHUP)
//! replaces the clients and the members' keys: a revoked client's connections close at once,
//! and a member's new key is admitted beside (or instead of) its old one. Every other setting
//! stays as the node started, and so does the membership: the configuration's under `tfa`,
//! `oss` and `local` (a reload naming other members is refused), the replicated log's under
//! `certify` and `active` (a reload rekeys the members both know).

use std::collections::BTreeSet;

use atomos_net::roster::Roster;

use crate::config::NodeSettings;

/// The roster of `settings`: every member (this node included) with its keys, and the
/// clients.
pub(crate) fn roster_of(settings: &NodeSettings) -> Roster {
    let mut members: Vec<_> = settings
        .peers
        .iter()
        .map(|p| (p.id, p.public_keys.clone()))
        .collect();
    if let Some(key) = &settings.key {
        members.push((settings.node_id, vec![key.public()]));
    }
    Roster::new(
        members,
        settings
            .clients
            .iter()
            .map(|c| (c.public_key, c.name.clone())),
    )
}

/// What a reload changed, for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeysReloaded {
    /// Clients admitted now that were not before, by name.
    pub clients_added: Vec<String>,
    /// Clients no longer admitted (their connections closed), by name.
    pub clients_removed: Vec<String>,
    /// Members whose keys changed.
    pub members_rekeyed: Vec<u64>,
}

/// Why keys cannot be reloaded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReloadError {
    /// The node does not run over TCP with a roster.
    #[error("this node has no roster to reload (it does not run over TCP)")]
    NoRoster,
    /// The new settings name other members than the node runs with.
    #[error("the members changed ({0}): membership is not reloaded; restart the node")]
    MembersChanged(String),
}

/// Admits the clients and the members' keys of `settings` in `roster` from now on (its
/// connections of keys no longer listed close). The members themselves must be those the roster
/// holds, unless `members_follow_log` (a `certify` or `active` node, whose members the
/// replicated log adds and removes): then the keys of the members both know are reloaded, and
/// the membership stays the log's.
pub(crate) fn reload(
    roster: &Roster,
    settings: &NodeSettings,
    members_follow_log: bool,
) -> Result<KeysReloaded, ReloadError> {
    let new = roster_of(settings);
    let old_members = roster.members();
    let mut new_members = new.members();
    if members_follow_log {
        new_members.retain(|id, _| old_members.contains_key(id));
    }
    let ids = |m: &std::collections::BTreeMap<u64, _>| m.keys().copied().collect::<Vec<_>>();
    if !members_follow_log && ids(&old_members) != ids(&new_members) {
        return Err(ReloadError::MembersChanged(format!(
            "{:?} then, {:?} now",
            ids(&old_members),
            ids(&new_members)
        )));
    }
    let members_rekeyed = new_members
        .iter()
        .filter(|(id, keys)| old_members.get(id) != Some(keys))
        .map(|(&id, _)| id)
        .collect();
    let names = |r: &Roster| r.clients().into_values().collect::<BTreeSet<_>>();
    let (before, after) = (names(roster), names(&new));
    roster.set_member_keys(new_members);
    roster.set_clients(new.clients());
    Ok(KeysReloaded {
        clients_added: after.difference(&before).cloned().collect(),
        clients_removed: before.difference(&after).cloned().collect(),
        members_rekeyed,
    })
}

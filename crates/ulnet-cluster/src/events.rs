//! What the membership tells applications.

use crate::view::{Member, MemberId, View};
use serde::Serialize;

/// A membership event, in the order things happened at this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipEvent {
    /// A member entered the view `view` (reported for each new member, before the view).
    Joined {
        /// The new member.
        member: Member,
        /// The view it entered.
        view: u64,
    },
    /// A member is suspected (by this node's detectors or by hearsay); a regroup decides.
    Suspected {
        /// The suspected member.
        member: MemberId,
        /// The current view.
        view: u64,
    },
    /// A member left the view `view` (failed, pruned, or replaced by a new incarnation).
    Dead {
        /// The member.
        member: Member,
        /// The first view without it.
        view: u64,
    },
    /// A new view was installed (after its `Joined` and `Dead` events).
    ViewInstalled {
        /// The view.
        view: View,
    },
    /// A regroup could not reach a quorum of view `view`: this node stops acting as a
    /// member until it is part of a view with quorum again.
    QuorumLost {
        /// The last view this node had.
        view: u64,
    },
    /// A newer view `view` was chosen without this node: it stops acting as a member and
    /// asks to join again once every member of the newest view it knows answers its
    /// probes (a node pruned for a broken link stays out until the link works).
    Removed {
        /// The view that excludes this node.
        view: u64,
    },
}

impl MembershipEvent {
    /// The `kind` of the event in `--events-json` lines (`join|suspect|dead|view`, and
    /// `no_quorum` / `removed` for this node's own loss of membership).
    pub fn kind(&self) -> &'static str {
        match self {
            MembershipEvent::Joined { .. } => "join",
            MembershipEvent::Suspected { .. } => "suspect",
            MembershipEvent::Dead { .. } => "dead",
            MembershipEvent::ViewInstalled { .. } => "view",
            MembershipEvent::QuorumLost { .. } => "no_quorum",
            MembershipEvent::Removed { .. } => "removed",
        }
    }

    /// The view number the event belongs to.
    pub fn view_id(&self) -> u64 {
        match self {
            MembershipEvent::Joined { view, .. }
            | MembershipEvent::Suspected { view, .. }
            | MembershipEvent::Dead { view, .. }
            | MembershipEvent::QuorumLost { view }
            | MembershipEvent::Removed { view } => *view,
            MembershipEvent::ViewInstalled { view } => view.id,
        }
    }

    /// One `--events-json` line (without the newline): `ts_ms`, `kind`, `node`, `view`,
    /// and for views the member names.
    pub fn to_json_line(&self, ts_ms: u64, view: Option<&View>) -> String {
        #[derive(Serialize)]
        struct Line<'a> {
            ts_ms: u64,
            kind: &'a str,
            node: String,
            view: u64,
            #[serde(skip_serializing_if = "Option::is_none")]
            members: Option<Vec<&'a str>>,
        }
        let name_of = |id: MemberId| view.and_then(|v| v.member(id)).map_or_else(|| id.to_string(), |m| m.name.clone());
        let (node, members) = match self {
            MembershipEvent::Joined { member, .. } | MembershipEvent::Dead { member, .. } => {
                (member.name.clone(), None)
            }
            MembershipEvent::Suspected { member, .. } => (name_of(*member), None),
            MembershipEvent::ViewInstalled { view } => {
                (String::new(), Some(view.members.iter().map(|m| m.name.as_str()).collect()))
            }
            MembershipEvent::QuorumLost { .. } | MembershipEvent::Removed { .. } => (String::new(), None),
        };
        serde_json::to_string(&Line { ts_ms, kind: self.kind(), node, view: self.view_id(), members })
            .expect("events serialize")
    }
}

/// The state of a member as `cluster status` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// In the view and not suspected.
    Alive,
    /// In the view and suspected.
    Suspect,
    /// Removed from the view recently.
    Dead,
}

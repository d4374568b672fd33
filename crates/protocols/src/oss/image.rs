//! Catching up from an image: a node that lacks write sets no other node keeps any more (a
//! node down for more commits than [`super::OssConfig::history_max`], or one that lost its
//! disk) gets the domain's replicated objects as another node applied them through one commit
//! id, in parts, persists the whole, and installs it as one commit once it is durable. Later
//! ids come as write sets, as before.
//!
//! An image also carries the latest commits applied of every node
//! ([`super::domain_log::RECENT_PER_NODE`] each): a node learns from them which of its own
//! commits waiting for an answer the image holds, and installs their node-local writes with it.

use std::collections::BTreeMap;

use atomos_core::Key;
use atomos_seam::Output;
use rustc_hash::FxHashSet;
use serde::{Deserialize, Serialize};

use super::domain_log::RECENT_PER_NODE;
use super::msg::{AbortReason, OssDelivery, OssMsg, OssRecord};
use super::node::OssNode;
use super::vocabulary::OssOutput;
use super::write_set::{CommitId, DomainId, TxId};

/// The most bytes of keys and values one part of an image carries (one message each).
pub const IMAGE_PART_BYTES: usize = 1 << 20;

/// The most parts an image may announce: a part naming more is refused. An image is persisted
/// as one log record, which the disk takes up to 4 GiB: a domain larger than that cannot be
/// sent as an image.
const IMAGE_PARTS_MAX: u32 = 4096;

/// A key of a domain: the commit id of its newest write and its value then (`None`: deleted).
pub type ImageObject = (Key, CommitId, Option<Vec<u8>>);

/// One domain's replicated objects as a node applied them through commit id `through`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainImage {
    /// The domain.
    pub domain: DomainId,
    /// Every commit id through this is in the image.
    pub through: CommitId,
    /// The digest of the commits applied through `through` (see
    /// [`OssNode::applied_digest`]).
    pub digest: u64,
    /// The latest commits applied of every node, oldest first per node.
    pub recent: Vec<(TxId, CommitId)>,
    /// Every key of the domain ever written, in key order: the commit id of its newest write
    /// and its value then (`None`: deleted).
    pub objects: Vec<ImageObject>,
}

/// One part of an image as it travels: the first part carries the recent commits, every part
/// a run of the objects in key order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImagePart {
    /// This part's number, from 0.
    pub part: u32,
    /// How many parts the image has.
    pub parts: u32,
    /// The image's head and this part's objects.
    pub image: DomainImage,
}

impl DomainImage {
    /// The image as parts of at most about [`IMAGE_PART_BYTES`] each (at least one part,
    /// and one object per part however large).
    pub fn into_parts(self) -> Vec<ImagePart> {
        let DomainImage {
            domain,
            through,
            digest,
            mut recent,
            objects,
        } = self;
        let mut runs: Vec<Vec<ImageObject>> = vec![Vec::new()];
        let mut bytes = 0;
        for object in objects {
            let size = object.0.as_bytes().len() + object.2.as_ref().map_or(0, Vec::len) + 16;
            let current = runs.last().map_or(0, Vec::len);
            if current > 0 && bytes + size > IMAGE_PART_BYTES {
                runs.push(Vec::new());
                bytes = 0;
            }
            bytes += size;
            if let Some(run) = runs.last_mut() {
                run.push(object);
            }
        }
        let parts = runs.len() as u32;
        runs.into_iter()
            .enumerate()
            .map(|(i, objects)| ImagePart {
                part: i as u32,
                parts,
                image: DomainImage {
                    domain,
                    through,
                    digest,
                    recent: if i == 0 {
                        std::mem::take(&mut recent)
                    } else {
                        Vec::new()
                    },
                    objects,
                },
            })
            .collect()
    }
}

/// The parts of one image received so far from one node.
#[derive(Debug, Default)]
pub(super) struct Assembly {
    from: u64,
    through: CommitId,
    parts: Vec<Option<DomainImage>>,
}

impl Assembly {
    /// Takes `part` from node `from`; returns the whole image once every part is here. A
    /// part of another image than the one being assembled starts that one over; a malformed
    /// part changes nothing.
    pub(super) fn take(&mut self, from: u64, part: ImagePart) -> Option<DomainImage> {
        if part.parts == 0 || part.parts > IMAGE_PARTS_MAX || part.part >= part.parts {
            return None;
        }
        let same = self.from == from
            && self.through == part.image.through
            && self.parts.len() == part.parts as usize;
        if !same {
            self.from = from;
            self.through = part.image.through;
            self.parts = vec![None; part.parts as usize];
        }
        let slot = self.parts.get_mut(part.part as usize)?;
        *slot = Some(part.image);
        if self.parts.iter().any(Option::is_none) {
            return None;
        }
        let mut parts = std::mem::take(&mut self.parts).into_iter().flatten();
        let mut whole = parts.next()?;
        for p in parts {
            whole.objects.extend(p.objects);
        }
        self.through = 0;
        Some(whole)
    }
}

impl OssNode {
    /// Node `to` lacks write sets of `domain` this node no longer keeps: it gets an image of
    /// the domain, at most once per four fetch intervals per part of the last one it got (an
    /// image may be large, and takes a while to arrive).
    pub(super) fn send_image(&mut self, to: u64, domain: DomainId, out: &mut Vec<OssOutput>) {
        let every = self.cfg.gap_after.max(1) * 4;
        let ticks = self.ticks;
        let Some(d) = self.domains.get_mut(domain as usize) else {
            return;
        };
        if d.images_sent
            .get(&to)
            .is_some_and(|&(at, parts)| ticks < at + every * parts.max(1))
        {
            return;
        }
        let image = match self.image_of(domain) {
            Ok(image) => image,
            Err(e) => {
                out.push(Output::Warn(format!(
                    "oss: no image of domain {domain} for node {to}: {e}"
                )));
                return;
            }
        };
        self.counters.images_sent += 1;
        let parts = image.into_parts();
        self.domains[domain as usize]
            .images_sent
            .insert(to, (ticks, parts.len() as u64));
        for part in parts {
            out.push(Output::Send {
                to,
                msg: OssMsg::ImagePart(part),
            });
        }
    }

    /// The image of `domain` as this node applied it.
    pub(super) fn image_of(&self, domain: DomainId) -> Result<DomainImage, String> {
        let d = &self.domains[domain as usize];
        let mut keys: BTreeMap<&Key, CommitId> = self
            .key_cid
            .iter()
            .filter(|(k, _)| self.domain_of(k) == domain)
            .map(|(k, c)| (k, *c))
            .collect();
        let mut objects = Vec::with_capacity(keys.len());
        self.engine.with_snapshot_objects(|all| {
            for (key, _, value) in all {
                if let Some(cid) = keys.remove(key) {
                    objects.push((key.clone(), cid, value.as_deref().map(<[u8]>::to_vec)));
                }
            }
        })?;
        // Written and deleted before the engine kept it: deleted.
        objects.extend(keys.into_iter().map(|(k, c)| (k.clone(), c, None)));
        objects.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok(DomainImage {
            domain,
            through: d.log.applied(),
            digest: d.digest,
            recent: d.log.recent(),
            objects,
        })
    }

    /// A part of an image from node `from`: once whole and ahead of what is applied here, it
    /// is persisted, and installed once durable.
    pub(super) fn take_image_part(&mut self, from: u64, part: ImagePart, out: &mut Vec<OssOutput>) {
        if from == self.cfg.id || !self.cfg.members.contains(&from) {
            return;
        }
        let Some(d) = self.domains.get_mut(part.image.domain as usize) else {
            return;
        };
        if part.image.through <= d.log.applied()
            || part.image.through == CommitId::MAX
            || d.image
                .as_ref()
                .is_some_and(|(_, i)| i.through >= part.image.through)
        {
            return;
        }
        // One image at a time from each member: several answering the fetches sent in turn
        // do not restart each other's.
        let Some(image) = d.assembly.entry(from).or_default().take(from, part) else {
            return;
        };
        let domain = image.domain as usize;
        // Images from other members no further than this one are of no more use.
        let through = image.through;
        self.domains[domain]
            .assembly
            .retain(|_, a| a.through > through);
        // Only keys of the domain: an image naming another's (or a node-local key) is not
        // one this node made.
        let foreign = image
            .objects
            .iter()
            .find(|(k, _, _)| self.is_local(k) || self.domain_of(k) != image.domain);
        if let Some((k, _, _)) = foreign {
            out.push(Output::Warn(format!(
                "oss: an image of domain {} from node {from} names key {k}, not one of the \
                 domain's: not taken",
                image.domain
            )));
            return;
        }
        let write = self.persist(vec![OssRecord::Image(image.clone())], out);
        self.domains[domain].image = Some((write, image));
    }

    /// Installs domain `i`'s image if it is durable here and ahead of what is applied: one
    /// engine commit that makes the domain's objects the image's, with the node-local writes
    /// of this node's waiting commits the image holds (they are answered).
    pub(super) fn install_durable_image(&mut self, i: usize, out: &mut Vec<OssOutput>) {
        let durable = self.durable;
        let d = &mut self.domains[i];
        if d.image.as_ref().is_none_or(|(w, _)| *w > durable) {
            return;
        }
        let Some((_, image)) = d.image.take() else {
            return;
        };
        if image.through <= d.log.applied() {
            return;
        }
        let me = self.cfg.id;
        let committed: FxHashSet<TxId> = image
            .recent
            .iter()
            .filter(|(tx, _)| tx.node == me)
            .map(|(tx, _)| *tx)
            .collect();
        let listed: FxHashSet<&Key> = image.objects.iter().map(|(k, _, _)| k).collect();
        let domain = i as DomainId;
        // Keys this node has that the image never had: as they are there, never written.
        let gone: Vec<Key> = self
            .key_cid
            .keys()
            .filter(|k| self.domain_of(k) == domain && !listed.contains(k))
            .cloned()
            .collect();
        let mut writes: Vec<(Key, Option<Vec<u8>>)> = Vec::with_capacity(image.objects.len());
        for k in gone {
            self.key_cid.remove(&k);
            writes.push((k, None));
        }
        for (k, cid, value) in image.objects {
            self.key_cid.insert(k.clone(), cid);
            writes.push((k, value));
        }
        let mine: Vec<TxId> = self
            .pending
            .iter()
            .filter(|(tx, p)| p.domain == domain && committed.contains(tx))
            .map(|(tx, _)| *tx)
            .collect();
        let mut callers = Vec::new();
        for tx in mine {
            if let Some(p) = self.pending.remove(&tx) {
                writes.extend(p.local_writes);
                callers.extend(p.caller);
            }
        }
        // A waiting commit the image's latest commits of this node do not name did not
        // commit through the image, unless those are full: then it may be older than all.
        let full = image.recent.iter().filter(|(tx, _)| tx.node == me).count() >= RECENT_PER_NODE;
        let unknown: Vec<TxId> = if full {
            self.pending
                .iter()
                .filter(|(_, p)| p.domain == domain)
                .map(|(tx, _)| *tx)
                .collect()
        } else {
            Vec::new()
        };
        self.position += 1;
        self.engine.apply_certified(self.position, &[], writes);
        let d = &mut self.domains[i];
        d.digest = image.digest;
        d.log.install_image(image.through, &image.recent);
        d.progress_at = self.ticks;
        self.counters.images_installed += 1;
        for tx in unknown {
            self.give_up(tx, AbortReason::Unknown, out);
        }
        for caller in callers {
            self.counters.commits += 1;
            out.push(Output::Deliver(OssDelivery::Committed {
                tx: caller,
                version: self.position,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(objects: usize, value: usize) -> DomainImage {
        DomainImage {
            domain: 1,
            through: 9,
            digest: 42,
            recent: vec![(
                TxId {
                    node: 2,
                    run: 3,
                    n: 4,
                },
                9,
            )],
            objects: (0..objects)
                .map(|i| {
                    (
                        Key::from(format!("k{i:05}")),
                        i as u64,
                        Some(vec![7; value]),
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn an_image_split_into_parts_is_assembled_whole_in_any_order() {
        let whole = image(40, IMAGE_PART_BYTES / 10);
        let mut parts = whole.clone().into_parts();
        assert!(parts.len() >= 4, "{} parts", parts.len());
        assert!(parts[1..].iter().all(|p| p.image.recent.is_empty()));
        parts.reverse();
        let mut assembly = Assembly::default();
        let last = parts.pop();
        for p in parts {
            assert_eq!(assembly.take(5, p), None);
        }
        assert_eq!(last.and_then(|p| assembly.take(5, p)), Some(whole));
        // An empty domain is one part.
        assert_eq!(image(0, 0).into_parts().len(), 1);
    }

    #[test]
    fn a_malformed_part_or_one_of_another_image_is_not_taken_as_this_one() {
        let parts = image(30, IMAGE_PART_BYTES / 10).into_parts();
        let mut assembly = Assembly::default();
        let mut bad = parts[0].clone();
        bad.part = bad.parts;
        assert_eq!(assembly.take(5, bad), None);
        let mut huge = parts[0].clone();
        huge.parts = u32::MAX;
        assert_eq!(assembly.take(5, huge), None);
        // Parts from two senders do not mix.
        for p in &parts[1..] {
            assembly.take(6, p.clone());
        }
        assert_eq!(assembly.take(5, parts[0].clone()), None);
    }
}

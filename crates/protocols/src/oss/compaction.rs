//! Compacting `oss.wal`: once [`super::OssConfig::compact_after`] records were written since
//! the last compaction, the node replaces its log with what rebuilds it as it is now: its
//! incarnation, the control log's records and the domains' epoch records (few, kept in memory
//! as they are written), an image of every domain as installed here, its node-local objects,
//! the write sets received and not installed yet, and its waiting commits with node-local
//! parts. Every fact in it comes from records written before (a node installs only what its
//! disk holds), so the disk may write it in the background ([`Write::Compact`]).

use std::collections::BTreeMap;

use atomos_core::Key;
use atomos_seam::{Output, Write};

use super::config::OssBug;
use super::msg::OssRecord;
use super::node::OssNode;
use super::vocabulary::OssOutput;
use super::write_set::DomainId;

/// The records a compaction carries over as they were written, in order.
#[derive(Debug, Default)]
pub(super) struct Kept {
    /// The control log's records, and the domains' fences, starts and rejoining marks.
    records: Vec<OssRecord>,
    /// Each domain's latest token taken (a replay only needs the latest of its epoch).
    tokens: BTreeMap<DomainId, OssRecord>,
    /// Records written since the last compaction (or in the log replayed).
    since: usize,
}

impl Kept {
    /// Notes `record`, written (or replayed) now.
    pub(super) fn note(&mut self, record: &OssRecord) {
        self.since += 1;
        match record {
            OssRecord::Order(_)
            | OssRecord::Fenced { .. }
            | OssRecord::Started { .. }
            | OssRecord::Rejoining(_) => self.records.push(record.clone()),
            OssRecord::TokenTaken { domain, .. } => {
                self.tokens.insert(*domain, record.clone());
            }
            _ => {}
        }
    }
}

impl OssNode {
    /// Compacts the log if it is due and the node is between commits that wait for its disk
    /// (a local commit not installed yet, an image not installed yet).
    pub(super) fn compact_if_due(&mut self, out: &mut Vec<OssOutput>) {
        if self.kept.since < self.cfg.compact_after.max(1)
            || !self.local_queue.is_empty()
            || self.domains.iter().any(|d| d.image.is_some())
        {
            return;
        }
        self.kept.since = 0;
        match self.compacted() {
            Ok(records) => {
                self.writes += 1;
                self.counters.compactions += 1;
                out.push(Output::Persist(Write::Compact(
                    records.iter().map(|r| r.encode().into()).collect(),
                )));
            }
            Err(e) => out.push(Output::Warn(format!("oss: log not compacted: {e}"))),
        }
    }

    /// The records that rebuild this node as it is now.
    fn compacted(&self) -> Result<Vec<OssRecord>, String> {
        let mut records = vec![OssRecord::Incarnation(self.incarnation)];
        // A domain fenced now takes no write set of its epoch: its fences go after the write
        // sets it received before (a replay must hold what it held when it reported its mark).
        let mut last_start: BTreeMap<DomainId, usize> = BTreeMap::new();
        for (i, r) in self.kept.records.iter().enumerate() {
            if let OssRecord::Started { domain, .. } = r {
                last_start.insert(*domain, i);
            }
        }
        let mut fences = Vec::new();
        for (i, r) in self.kept.records.iter().enumerate() {
            match r {
                OssRecord::Fenced { domain, .. }
                    if last_start.get(domain).is_none_or(|&s| i > s)
                        && self.cfg.planted_bug != Some(OssBug::FencesFirst) =>
                {
                    fences.push(r.clone())
                }
                _ => records.push(r.clone()),
            }
        }
        records.extend(self.kept.tokens.values().cloned());
        for (i, d) in self.domains.iter().enumerate() {
            if d.log.applied() > 0 {
                records.push(OssRecord::Image(self.image_of(i as DomainId)?));
            }
        }
        let applied = self.applied_marks();
        let mut local: Vec<(Key, Option<Vec<u8>>)> = Vec::new();
        self.engine.with_snapshot_objects(|all| {
            for (key, _, value) in all {
                if self.is_local(key) {
                    local.push((key.clone(), value.as_deref().map(<[u8]>::to_vec)));
                }
            }
        })?;
        if !local.is_empty() {
            records.push(OssRecord::Local {
                writes: local,
                applied: applied.clone(),
            });
        }
        for d in &self.domains {
            records.extend(d.log.unapplied().cloned().map(OssRecord::WriteSet));
        }
        records.extend(fences);
        for p in self.pending.values() {
            if !p.local_writes.is_empty() || !p.local_reads.is_empty() {
                records.push(OssRecord::LocalOf {
                    domain: p.domain,
                    epoch: p.epoch,
                    request: p.request.clone(),
                    writes: p.local_writes.clone(),
                    local_reads: p.local_reads.clone(),
                    applied: applied.clone(),
                });
            }
        }
        Ok(records)
    }
}

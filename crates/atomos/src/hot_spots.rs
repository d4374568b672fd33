//! A node's hot spots (the objects its conflicts came from) as metrics, in a bounded number
//! of series: `atomos_hot_spot_conflicts{node, rank}` for ranks 1 to [`HOT_SPOTS_SHOWN`],
//! each the conflict count of the object at that rank (0 when fewer objects conflicted).
//! Objects are named by their keys, which are the application's data, only when asked
//! (`metrics_hot_spot_keys`): then each series also carries a `key` label, and a rank's series
//! for a key that left it is no longer updated (the exporter drops idle gauges).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use atomos_core::Key;
use atomos_net::transport::NodeId;
use tokio_util::sync::CancellationToken;

use crate::node::Node;

/// How many of a node's hot spots its metrics show.
pub const HOT_SPOTS_SHOWN: usize = 10;

/// One series of a publication: its rank (from 1), the key when keys are shown, the count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HotSpotSeries {
    /// The rank, from 1 (the most conflicts).
    pub rank: usize,
    /// The object's key, when keys are shown and an object holds the rank.
    pub key: Option<String>,
    /// Its conflicts (0 for a rank no object holds).
    pub conflicts: u64,
}

/// The series one publication sets for `spots` (the hottest first, at most
/// [`HOT_SPOTS_SHOWN`] used): exactly one per rank, whatever the spots.
pub fn hot_spot_series(spots: &[(Key, u64)], show_keys: bool) -> Vec<HotSpotSeries> {
    (0..HOT_SPOTS_SHOWN)
        .map(|i| {
            let spot = spots.get(i);
            HotSpotSeries {
                rank: i + 1,
                key: spot.filter(|_| show_keys).map(|(k, _)| k.to_string()),
                conflicts: spot.map_or(0, |(_, c)| *c),
            }
        })
        .collect()
}

/// Publishes the node's hot spots once a second until `stop`; keys are shown while
/// `show_keys` is set.
pub(crate) async fn publish(
    id: NodeId,
    node: Node,
    show_keys: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let mut timer = tokio::time::interval(Duration::from_secs(1));
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = timer.tick() => {}
        }
        let spots = node.hot_spots(HOT_SPOTS_SHOWN);
        for s in hot_spot_series(&spots, show_keys.load(Ordering::Relaxed)) {
            let (node, rank) = (id.to_string(), s.rank.to_string());
            let gauge = match s.key {
                Some(key) => metrics::gauge!(
                    "atomos_hot_spot_conflicts",
                    "node" => node,
                    "rank" => rank,
                    "key" => key
                ),
                None => {
                    metrics::gauge!("atomos_hot_spot_conflicts", "node" => node, "rank" => rank)
                }
            };
            gauge.set(s.conflicts as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_series_per_rank_and_keys_only_when_asked() {
        let spots: Vec<(Key, u64)> = (0..25u64)
            .map(|i| (Key::from(format!("account/{i}")), 100 - i))
            .collect();
        for (spots, show) in [
            (&spots[..], false),
            (&spots[..], true),
            (&spots[..3], false),
        ] {
            let series = hot_spot_series(spots, show);
            let ranks: Vec<usize> = series.iter().map(|s| s.rank).collect();
            assert_eq!(ranks, (1..=HOT_SPOTS_SHOWN).collect::<Vec<_>>());
            assert_eq!(series[0].conflicts, 100);
            for s in &series {
                assert_eq!(s.key.is_some(), show && s.rank <= spots.len(), "{s:?}");
            }
        }
        let few = hot_spot_series(&spots[..3], true);
        assert_eq!(few[3].conflicts, 0);
        assert_eq!(few[3].key, None);
        assert_eq!(few[0].key.as_deref(), Some(spots[0].0.to_string().as_str()));
    }
}

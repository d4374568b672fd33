//! TPC-C in memory (TPC-C standard specification, revision 5.11; HyflowCPP thesis 6.2.2.3,
//! HiperTM 4.2, PRESTO chapter 6): a wholesale supplier's warehouses, districts, customers,
//! items, stock, orders, new-orders, order lines and history as shared objects, one object per
//! row, and the five transaction profiles run against them.
//!
//! What differs from the specification, on purpose: there are no terminals, keying or think
//! times (a worker runs its next transaction at once, on its home warehouse `thread % W`);
//! text columns other than the customer's credit data are left out; the customer index by last
//! name is built at load time and never changes (TPC-C never adds customers), so it lives
//! outside the transactional store; Delivery handles the ten districts in one transaction.

mod check;
mod load;
mod profiles;
mod rows;

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use atomos::{Node, TxError};
use rand::rngs::SmallRng;
use rand::Rng;

use super::{Check, Workload, WorkloadParams};

pub use rows::Keys;

/// Transaction profiles, in the order of [`Workload::profiles`].
pub const PROFILES: [&str; 5] = [
    "new-order",
    "payment",
    "order-status",
    "delivery",
    "stock-level",
];

/// Priority each profile's transactions carry (PRESTO table 6.1: the shorter a profile runs,
/// the higher its priority): new-order 3, payment 5, order-status 4, delivery 1, stock-level 2.
pub const PRIORITIES: [u16; 5] = [3, 5, 4, 1, 2];

/// Which share of transactions each profile gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TpccMix {
    /// The specification's mix: new-order 45%, payment 43%, order-status, delivery and
    /// stock-level 4% each.
    #[default]
    Standard,
    /// HiperTM's read-intensive mix: order-status and stock-level 45% each, the three update
    /// profiles 3.3% each.
    ReadHeavy,
}

impl TpccMix {
    /// Every mix.
    pub const ALL: [TpccMix; 2] = [TpccMix::Standard, TpccMix::ReadHeavy];

    /// Per-mille weights of the profiles, in [`PROFILES`] order; they add up to 1,000.
    pub fn weights(self) -> [u32; 5] {
        match self {
            TpccMix::Standard => [450, 430, 40, 40, 40],
            TpccMix::ReadHeavy => [33, 33, 450, 34, 450],
        }
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            TpccMix::Standard => "standard",
            TpccMix::ReadHeavy => "read-heavy",
        }
    }

    fn pick(self, rng: &mut SmallRng) -> usize {
        let mut roll = rng.random_range(0..1000);
        for (i, w) in self.weights().into_iter().enumerate() {
            if roll < w {
                return i;
            }
            roll -= w;
        }
        PROFILES.len() - 1
    }
}

impl fmt::Display for TpccMix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TpccMix {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        TpccMix::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown TPC-C mix {s:?} (known: standard, read-heavy)"))
    }
}

/// Population per warehouse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpccScale {
    /// Items (the catalogue, shared by all warehouses; one stock row per item and warehouse).
    pub items: u32,
    /// Customers per district.
    pub customers: u32,
    /// Orders per district at load time (the newest 30% still undelivered).
    pub orders: u32,
}

impl TpccScale {
    /// The specification's population: 100,000 items, 3,000 customers and 3,000 orders per
    /// district.
    pub const FULL: TpccScale = TpccScale {
        items: 100_000,
        customers: 3_000,
        orders: 3_000,
    };
    /// A tenth of the catalogue and of the customers, so a run starts in well under a second.
    pub const SMALL: TpccScale = TpccScale {
        items: 10_000,
        customers: 300,
        orders: 300,
    };

    fn validate(&self) -> Result<(), String> {
        if self.items < 20 || self.customers < 10 || self.orders < 10 {
            return Err(format!(
                "TPC-C scale too small: {self:?} (at least 20 items, 10 customers, 10 orders)"
            ));
        }
        if self.orders > self.customers {
            return Err(format!(
                "TPC-C scale: each loaded order belongs to a different customer, so orders ({}) \
                 cannot exceed customers ({})",
                self.orders, self.customers
            ));
        }
        Ok(())
    }

    fn name(&self) -> String {
        match *self {
            TpccScale::FULL => "full".to_string(),
            TpccScale::SMALL => "small".to_string(),
            s => format!("{}/{}/{}", s.items, s.customers, s.orders),
        }
    }
}

impl Default for TpccScale {
    fn default() -> Self {
        TpccScale::SMALL
    }
}

impl fmt::Display for TpccScale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for TpccScale {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "small" => Ok(TpccScale::SMALL),
            "full" => Ok(TpccScale::FULL),
            _ => Err(format!("unknown TPC-C scale {s:?} (known: small, full)")),
        }
    }
}

/// Districts per warehouse (fixed by the specification).
pub const DISTRICTS: u32 = 10;

/// The run-time constants of the non-uniform random function (clause 2.1.6).
#[derive(Clone, Copy, Debug)]
struct NuRandC {
    last: u32,
    id: u32,
    item: u32,
}

/// The TPC-C workload.
pub struct Tpcc {
    keys: Keys,
    warehouses: u32,
    scale: TpccScale,
    mix: TpccMix,
    c: NuRandC,
    /// Customer ids by (warehouse, district, last-name number), sorted (the specification sorts
    /// by first name; ours are the ids).
    by_last_name: std::collections::HashMap<(u32, u32, u32), Vec<u32>>,
    /// History rows each worker has committed (their keys are (worker, sequence)).
    history_rows: Vec<AtomicU64>,
    /// A logical clock for entry and delivery dates.
    clock: AtomicU64,
}

impl Tpcc {
    /// `p.warehouses` warehouses (at least one) of `p.scale`, transactions picked by `p.mix`.
    pub fn new(p: &WorkloadParams) -> Result<Tpcc, String> {
        p.scale.validate()?;
        if p.warehouses == 0 {
            return Err("TPC-C needs at least one warehouse".into());
        }
        let warehouses = u32::try_from(p.warehouses)
            .ok()
            .filter(|&w| w <= rows::MAX_WAREHOUSES)
            .ok_or_else(|| format!("at most {} warehouses", rows::MAX_WAREHOUSES))?;
        let c = NuRandC {
            last: 157,
            id: 259,
            item: 7911,
        };
        let mut by_last_name: std::collections::HashMap<_, Vec<u32>> = Default::default();
        for w in 1..=warehouses {
            for d in 1..=DISTRICTS {
                for cid in 1..=p.scale.customers {
                    let name = load::last_name_number(w, d, cid, c.last);
                    by_last_name.entry((w, d, name)).or_default().push(cid);
                }
            }
        }
        Ok(Tpcc {
            keys: Keys,
            warehouses,
            scale: p.scale,
            mix: p.mix,
            c,
            by_last_name,
            history_rows: (0..p.threads.max(1)).map(|_| AtomicU64::new(0)).collect(),
            clock: AtomicU64::new(1),
        })
    }

    fn now(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// NURand(A, x, y) of clause 2.1.6.
    fn nurand(rng: &mut SmallRng, a: u32, c: u32, x: u32, y: u32) -> u32 {
        (((rng.random_range(0..=a) | rng.random_range(x..=y)) + c) % (y - x + 1)) + x
    }

    fn home_warehouse(&self, thread: usize) -> u32 {
        (thread as u32 % self.warehouses) + 1
    }

    /// A warehouse other than `w`, if there is one.
    fn other_warehouse(&self, w: u32, rng: &mut SmallRng) -> u32 {
        if self.warehouses == 1 {
            return w;
        }
        let other = rng.random_range(1..self.warehouses);
        if other >= w {
            other + 1
        } else {
            other
        }
    }

    fn random_customer_id(&self, rng: &mut SmallRng) -> u32 {
        Self::nurand(rng, 1023, self.c.id, 1, self.scale.customers)
    }

    fn random_item_id(&self, rng: &mut SmallRng) -> u32 {
        Self::nurand(rng, 8191, self.c.item, 1, self.scale.items)
    }

    /// A customer picked by last name (60%) or by id (40%), as Payment and Order-Status do:
    /// by name, the middle one of the customers with that name.
    fn pick_customer(&self, w: u32, d: u32, rng: &mut SmallRng) -> u32 {
        if rng.random_range(0..100) < 60 {
            let top = self.scale.customers.min(1000) - 1;
            let name = Self::nurand(rng, 255, self.c.last, 0, top);
            if let Some(ids) = self.by_last_name.get(&(w, d, name)) {
                return ids[(ids.len() - 1) / 2];
            }
        }
        self.random_customer_id(rng)
    }
}

impl Workload for Tpcc {
    fn register(&self, node: &Node) -> Result<(), atomos::RegisterError> {
        profiles::register(node)
    }

    fn setup(&self, node: &Node) -> Result<(), TxError> {
        load::load(self, node)
    }

    fn profiles(&self) -> &'static [&'static str] {
        &PROFILES
    }

    fn op(&self, node: &Node, thread: usize, rng: &mut SmallRng) -> Result<usize, TxError> {
        let profile = self.mix.pick(rng);
        self.op_profile(node, thread, profile, rng)
    }

    fn next_request(&self, rng: &mut SmallRng) -> Option<(usize, u8)> {
        let profile = self.mix.pick(rng);
        Some((profile, PRIORITIES[profile] as u8))
    }

    fn op_profile(
        &self,
        node: &Node,
        thread: usize,
        profile: usize,
        rng: &mut SmallRng,
    ) -> Result<usize, TxError> {
        let w = self.home_warehouse(thread);
        match profile {
            0 => self.new_order(node, w, rng)?,
            1 => self.payment(node, w, thread, rng)?,
            2 => self.order_status(node, w, rng)?,
            3 => self.delivery(node, w, rng)?,
            _ => self.stock_level(node, w, rng)?,
        }
        Ok(profile)
    }

    fn check(&self, node: &Node) -> Result<Check, TxError> {
        check::check(self, node)
    }
}

#[cfg(test)]
mod tests;

//! Vacation (STAMP's travel reservation system; HyflowCPP thesis 6.2.2.1): customers reserve
//! cars, flights and rooms; administrators delete customers and update the offers.
//!
//! The three operations follow STAMP's client: a *reservation* queries `queries` random
//! resources, picks the most expensive one of each kind that has a free unit, adds the customer
//! if they do not exist yet and reserves what it picked; *delete customer* cancels every
//! reservation of a random customer and removes them; *update offers* adds 100 units at a new
//! price to, or takes 100 free units from, `queries` random resources (a resource whose last
//! units are taken is removed). As in the thesis, `read_ratio` is the share of reservations
//! (its "read" operation), and the other two share the rest equally.

use std::collections::HashMap;

use atomos::{Key, Node, TRef, Tx, TxError};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{Check, Workload, WorkloadParams};

/// Units an offer update adds or takes (STAMP's `manager_add*` / `manager_delete*`).
const UPDATE_UNITS: i32 = 100;
/// Resource kinds.
const KINDS: [Kind; 3] = [Kind::Car, Kind::Flight, Kind::Room];
/// Rows created per loading transaction.
const CHUNK: usize = 1024;

/// A kind of resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Kind {
    /// A rental car.
    Car,
    /// A seat on a flight.
    Flight,
    /// A hotel room.
    Room,
}

impl Kind {
    fn index(self) -> usize {
        self as usize
    }
}

/// Units of one car, flight or room offer.
#[derive(Clone, Debug, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.vacation.Resource")]
pub struct Resource {
    /// Units offered.
    pub total: i32,
    /// Units not reserved.
    pub free: i32,
    /// Price of one unit.
    pub price: i32,
}

/// One reserved unit.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Reservation {
    /// What was reserved.
    pub kind: Kind,
    /// Which one of that kind.
    pub id: u32,
    /// The price paid.
    pub price: i32,
}

/// A customer and what they reserved.
#[derive(Clone, Debug, Default, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.vacation.Customer")]
pub struct Customer {
    /// Reservations, oldest first.
    pub reservations: Vec<Reservation>,
}

/// The Vacation workload. Invariants: no resource has more units reserved than it offers, and
/// every reserved unit belongs to a reservation of an existing customer.
pub struct Vacation {
    customers: Vec<TRef<Customer>>,
    resources: [Vec<TRef<Resource>>; 3],
    read_ratio: f64,
    queries: usize,
}

impl Vacation {
    /// `p.objects` customers and three times as many of each resource (the thesis: 1,000 and
    /// 3,000); reservations and offer updates touch `p.queries` resources.
    pub fn new(p: &WorkloadParams) -> Vacation {
        let customers = p.objects.max(1) as u64;
        let relations = customers * 3;
        let table = |prefix: &str| -> Vec<TRef<Resource>> {
            (0..relations)
                .map(|i| TRef::new(Key::with_index(prefix, i)))
                .collect()
        };
        Vacation {
            customers: (0..customers)
                .map(|i| TRef::new(Key::with_index("vac/cu/", i)))
                .collect(),
            resources: [table("vac/car/"), table("vac/fl/"), table("vac/rm/")],
            read_ratio: p.read_ratio,
            queries: p.queries.max(1),
        }
    }

    fn random_resource(&self, rng: &mut SmallRng) -> (Kind, u32) {
        let kind = KINDS[rng.random_range(0..3)];
        (
            kind,
            rng.random_range(0..self.resources[kind.index()].len()) as u32,
        )
    }

    fn resource(&self, kind: Kind, id: u32) -> &TRef<Resource> {
        &self.resources[kind.index()][id as usize]
    }

    /// A reservation: the most expensive free unit of each kind among `queries` random
    /// resources, for a random customer (added if missing).
    fn reserve(&self, node: &Node, rng: &mut SmallRng) -> Result<(), TxError> {
        let customer = &self.customers[rng.random_range(0..self.customers.len())];
        let queried: Vec<(Kind, u32)> = (0..self.queries)
            .map(|_| self.random_resource(rng))
            .collect();
        node.atomically(|tx| {
            let mut best: [Option<(u32, i32)>; 3] = [None; 3];
            for &(kind, id) in &queried {
                let r = self.resource(kind, id);
                if !tx.exists(r)? {
                    continue;
                }
                let offer = tx.read(r)?;
                let slot = &mut best[kind.index()];
                if offer.free > 0 && slot.is_none_or(|(_, price)| offer.price > price) {
                    *slot = Some((id, offer.price));
                }
            }
            if best.iter().all(Option::is_none) {
                return Ok(());
            }
            if !tx.exists(customer)? {
                tx.create(customer, Customer::default())?;
            }
            let mut taken = Vec::with_capacity(3);
            for (kind, pick) in KINDS.into_iter().zip(best) {
                if let Some((id, price)) = pick {
                    tx.modify(self.resource(kind, id), |r| r.free -= 1)?;
                    taken.push(Reservation { kind, id, price });
                }
            }
            tx.modify(customer, |c| c.reservations.extend(taken))
        })
    }

    /// Deletes a random customer, cancelling their reservations.
    fn delete_customer(&self, node: &Node, rng: &mut SmallRng) -> Result<(), TxError> {
        let customer = &self.customers[rng.random_range(0..self.customers.len())];
        node.atomically(|tx| {
            if !tx.exists(customer)? {
                return Ok(());
            }
            let reservations = tx.read(customer)?.reservations.clone();
            for r in &reservations {
                tx.modify(self.resource(r.kind, r.id), |offer| offer.free += 1)?;
            }
            tx.delete(customer)
        })
    }

    /// Adds units at a new price to, or takes free units from, `queries` random resources.
    fn update_offers(&self, node: &Node, rng: &mut SmallRng) -> Result<(), TxError> {
        let updates: Vec<(Kind, u32, Option<i32>)> = (0..self.queries)
            .map(|_| {
                let (kind, id) = self.random_resource(rng);
                let add = rng.random_bool(0.5).then(|| random_price(rng));
                (kind, id, add)
            })
            .collect();
        node.atomically(|tx| {
            for &(kind, id, add) in &updates {
                let r = self.resource(kind, id);
                match add {
                    Some(price) => add_units(tx, r, price)?,
                    None => take_units(tx, r)?,
                }
            }
            Ok(())
        })
    }

    /// Reserved units counted from the customers, by resource, read as one snapshot with the
    /// resources; the problems found, at most a few.
    fn audit(&self, tx: &mut Tx<'_>) -> Result<(usize, usize, Vec<String>), TxError> {
        let mut reserved: HashMap<(Kind, u32), i32> = HashMap::new();
        let mut customers = 0;
        for c in &self.customers {
            if tx.exists(c)? {
                customers += 1;
                for r in &tx.read(c)?.reservations {
                    *reserved.entry((r.kind, r.id)).or_default() += 1;
                }
            }
        }
        let mut problems = Vec::new();
        let mut units = 0;
        for kind in KINDS {
            for (id, r) in self.resources[kind.index()].iter().enumerate() {
                let key = (kind, id as u32);
                let held = reserved.remove(&key).unwrap_or(0);
                units += held as usize;
                if !tx.exists(r)? {
                    if held > 0 {
                        problems.push(format!(
                            "{kind:?} {id} is gone but {held} units are reserved"
                        ));
                    }
                    continue;
                }
                let offer = tx.read(r)?;
                if offer.free < 0 || offer.free > offer.total {
                    problems.push(format!(
                        "{kind:?} {id} over-booked: {} free of {}",
                        offer.free, offer.total
                    ));
                } else if offer.total - offer.free != held {
                    problems.push(format!(
                        "{kind:?} {id}: {} units taken but {held} reserved by existing customers",
                        offer.total - offer.free
                    ));
                }
            }
        }
        problems.truncate(8);
        Ok((customers, units, problems))
    }
}

fn random_price(rng: &mut SmallRng) -> i32 {
    rng.random_range(0..5) * 10 + 50
}

fn add_units(tx: &mut Tx<'_>, r: &TRef<Resource>, price: i32) -> Result<(), TxError> {
    if tx.exists(r)? {
        tx.modify(r, |offer| {
            offer.total += UPDATE_UNITS;
            offer.free += UPDATE_UNITS;
            offer.price = price;
        })
    } else {
        tx.create(
            r,
            Resource {
                total: UPDATE_UNITS,
                free: UPDATE_UNITS,
                price,
            },
        )
    }
}

fn take_units(tx: &mut Tx<'_>, r: &TRef<Resource>) -> Result<(), TxError> {
    if !tx.exists(r)? || tx.read(r)?.free < UPDATE_UNITS {
        return Ok(());
    }
    let total = tx.modify(r, |offer| {
        offer.total -= UPDATE_UNITS;
        offer.free -= UPDATE_UNITS;
        offer.total
    })?;
    if total == 0 {
        tx.delete(r)?;
    }
    Ok(())
}

impl Workload for Vacation {
    fn setup(&self, node: &Node) -> Result<(), TxError> {
        let mut rng = SmallRng::seed_from_u64(0xfaca);
        for chunk in self.customers.chunks(CHUNK) {
            node.atomically(|tx| {
                chunk
                    .iter()
                    .try_for_each(|c| tx.create(c, Customer::default()))
            })?;
        }
        for table in &self.resources {
            for chunk in table.chunks(CHUNK) {
                // STAMP: 100 to 500 units at 50 to 90.
                let offers: Vec<Resource> = chunk
                    .iter()
                    .map(|_| {
                        let total = rng.random_range(1..=5) * 100;
                        Resource {
                            total,
                            free: total,
                            price: random_price(&mut rng),
                        }
                    })
                    .collect();
                node.atomically(|tx| {
                    chunk
                        .iter()
                        .zip(&offers)
                        .try_for_each(|(r, offer)| tx.create(r, offer.clone()))
                })?;
            }
        }
        Ok(())
    }

    fn profiles(&self) -> &'static [&'static str] {
        &["reservation", "delete-customer", "update-offers"]
    }

    fn op(&self, node: &Node, _thread: usize, rng: &mut SmallRng) -> Result<usize, TxError> {
        if rng.random_bool(self.read_ratio) {
            self.reserve(node, rng).map(|_| 0)
        } else if rng.random_bool(0.5) {
            self.delete_customer(node, rng).map(|_| 1)
        } else {
            self.update_offers(node, rng).map(|_| 2)
        }
    }

    fn check(&self, node: &Node) -> Result<Check, TxError> {
        let (customers, units, problems) = node.atomically_read(|tx| self.audit(tx))?;
        let summary = format!("vacation: {customers} customers hold {units} reserved units");
        Ok(if problems.is_empty() {
            Check {
                ok: true,
                detail: format!("{summary}; no resource over-booked, every unit reserved by an existing customer"),
            }
        } else {
            Check {
                ok: false,
                detail: format!("{summary}; VIOLATED: {}", problems.join("; ")),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded() -> (Node, Vacation) {
        let node = Node::local();
        let vacation = Vacation::new(&WorkloadParams {
            objects: 50,
            read_ratio: 0.6,
            queries: 10,
            ..WorkloadParams::default()
        });
        vacation.setup(&node).unwrap();
        let mut rng = SmallRng::seed_from_u64(3);
        let mut seen = [0; 3];
        for _ in 0..3_000 {
            seen[vacation.op(&node, 0, &mut rng).unwrap()] += 1;
        }
        assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
        let check = vacation.check(&node).unwrap();
        assert!(check.ok, "{}", check.detail);
        (node, vacation)
    }

    /// A customer with at least one reservation.
    fn holder(node: &Node, v: &Vacation) -> usize {
        (0..v.customers.len())
            .find(|&i| {
                node.atomically_read(|tx| {
                    Ok(tx.exists(&v.customers[i])?
                        && !tx.read(&v.customers[i])?.reservations.is_empty())
                })
                .unwrap()
            })
            .expect("some customer holds a reservation")
    }

    #[test]
    fn a_customer_deleted_without_cancelling_is_caught() {
        let (node, v) = loaded();
        let c = holder(&node, &v);
        node.atomically(|tx| tx.delete(&v.customers[c])).unwrap();
        let check = v.check(&node).unwrap();
        assert!(!check.ok, "a broken history passed: {}", check.detail);
        assert!(check.detail.contains("reserved by existing customers"));
    }

    #[test]
    fn over_booking_is_caught() {
        let (node, v) = loaded();
        node.atomically(|tx| {
            tx.modify(v.resource(Kind::Room, 7), |r| r.free = -1)
                .map(|_| ())
        })
        .or_else(|_| {
            node.atomically(|tx| {
                tx.create(
                    v.resource(Kind::Room, 7),
                    Resource {
                        total: 1,
                        free: -1,
                        price: 50,
                    },
                )
            })
        })
        .unwrap();
        let check = v.check(&node).unwrap();
        assert!(!check.ok, "a broken history passed: {}", check.detail);
        assert!(check.detail.contains("over-booked"), "{}", check.detail);
    }
}

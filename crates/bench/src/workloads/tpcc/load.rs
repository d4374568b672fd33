//! The initial population (clause 4.3.3), created in transactions of a few thousand rows.

use atomos::{Node, Object, TRef, Tx, TxError};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::rows::{Customer, District, Item, Order, OrderLine, Stock, Warehouse};
use super::{Tpcc, DISTRICTS};

/// Rows created per loading transaction.
const CHUNK: usize = 2048;
/// Every customer starts with one payment of 10.00 (clause 4.3.3.1).
pub(super) const INITIAL_PAYMENT: i64 = 1_000;

/// The last-name syllables of clause 4.3.2.3.
const SYLLABLES: [&str; 10] = [
    "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
];

/// The last name made of the three syllables of `n` (0 to 999).
pub(super) fn last_name(n: u32) -> String {
    let d = |k: u32| SYLLABLES[((n / k) % 10) as usize];
    format!("{}{}{}", d(100), d(10), d(1))
}

/// The number whose syllables form customer (w, d, c)'s last name: c - 1 for the first 1,000
/// customers of a district, NURand(255, 0, 999) for the others (drawn from a generator seeded
/// by the customer's id, so the index and the rows agree).
pub(super) fn last_name_number(w: u32, d: u32, c: u32, c_last: u32) -> u32 {
    if c <= 1000 {
        return c - 1;
    }
    let mut rng =
        SmallRng::seed_from_u64((u64::from(w) << 40) | (u64::from(d) << 32) | u64::from(c));
    Tpcc::nurand(&mut rng, 255, c_last, 0, 999)
}

/// One queued row write.
type RowWrite = Box<dyn Fn(&mut Tx<'_>) -> Result<(), TxError>>;

/// Queues row creations and commits them `CHUNK` at a time.
struct Loader<'n> {
    node: &'n Node,
    pending: Vec<RowWrite>,
}

impl<'n> Loader<'n> {
    fn create<T: Object>(&mut self, r: TRef<T>, value: T) -> Result<(), TxError> {
        self.pending
            .push(Box::new(move |tx| tx.create(&r, value.clone())));
        if self.pending.len() >= CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), TxError> {
        let batch = std::mem::take(&mut self.pending);
        self.node
            .atomically(|tx| batch.iter().try_for_each(|f| f(tx)))
    }
}

fn random_text(rng: &mut SmallRng, min: usize, max: usize) -> String {
    let len = rng.random_range(min..=max);
    (0..len)
        .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
        .collect()
}

/// Creates every row of the initial database.
pub(super) fn load(t: &Tpcc, node: &Node) -> Result<(), TxError> {
    let k = t.keys;
    let s = t.scale;
    let mut rng = SmallRng::seed_from_u64(0x7bcc);
    let mut l = Loader {
        node,
        pending: Vec::with_capacity(CHUNK),
    };
    for i in 1..=s.items {
        let item = Item {
            price: rng.random_range(100..=10_000),
            original: rng.random_range(0..10) == 0,
        };
        l.create(k.item(i), item)?;
    }
    let district_ytd = INITIAL_PAYMENT * i64::from(s.customers);
    // The newest 30% of the loaded orders are undelivered (clause 4.3.3.1: 900 of 3,000).
    let first_new = s.orders - (s.orders * 3) / 10 + 1;
    for w in 1..=t.warehouses {
        l.create(
            k.warehouse(w),
            Warehouse {
                tax_bp: rng.random_range(0..=2000),
            },
        )?;
        l.create(k.warehouse_ytd(w), district_ytd * i64::from(DISTRICTS))?;
        for i in 1..=s.items {
            let stock = Stock {
                quantity: rng.random_range(10..=100),
                ytd: 0,
                order_cnt: 0,
                remote_cnt: 0,
                original: rng.random_range(0..10) == 0,
            };
            l.create(k.stock(w, i), stock)?;
        }
        for d in 1..=DISTRICTS {
            l.create(
                k.district(w, d),
                District {
                    tax_bp: rng.random_range(0..=2000),
                    next_o_id: s.orders + 1,
                },
            )?;
            l.create(k.district_ytd(w, d), district_ytd)?;
            l.create(k.delivery_cursor(w, d), first_new)?;
            for c in 1..=s.customers {
                let customer = Customer {
                    balance: -INITIAL_PAYMENT,
                    ytd_payment: INITIAL_PAYMENT,
                    payment_cnt: 1,
                    delivery_cnt: 0,
                    discount_bp: rng.random_range(0..=5000),
                    bad_credit: rng.random_range(0..10) == 0,
                    last: last_name(last_name_number(w, d, c, t.c.last)),
                    data: random_text(&mut rng, 300, 500),
                };
                l.create(k.customer(w, d, c), customer)?;
                l.create(k.last_order(w, d, c), 0u32)?;
            }
            // Orders go to a random permutation of the customers.
            let mut owners: Vec<u32> = (1..=s.customers).collect();
            owners.shuffle(&mut rng);
            for o in 1..=s.orders {
                let c_id = owners[(o - 1) as usize];
                let delivered = o < first_new;
                let ol_cnt = rng.random_range(5..=15u8);
                let entry_d = t.now();
                l.create(
                    k.order(w, d, o),
                    Order {
                        c_id,
                        entry_d,
                        carrier_id: delivered.then(|| rng.random_range(1..=10)),
                        ol_cnt,
                        all_local: true,
                    },
                )?;
                for n in 1..=u32::from(ol_cnt) {
                    let line = OrderLine {
                        i_id: rng.random_range(1..=s.items),
                        supply_w_id: w,
                        delivery_d: delivered.then_some(entry_d),
                        quantity: 5,
                        amount: if delivered {
                            0
                        } else {
                            rng.random_range(1..=999_999)
                        },
                    };
                    l.create(k.order_line(w, d, o, n), line)?;
                }
                if !delivered {
                    l.create(k.new_order(w, d, o), ())?;
                }
                // Loading runs in id order, so the last write is the customer's newest order.
                l.pending
                    .push(Box::new(move |tx| tx.write(&k.last_order(w, d, c_id), o)));
            }
        }
    }
    l.flush()
}

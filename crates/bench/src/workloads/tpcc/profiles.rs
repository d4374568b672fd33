//! The five transaction profiles (clauses 2.4 to 2.8).

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use atomos::{Node, Protocol, RegisterError, Tx, TxError};
use rand::rngs::SmallRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::rows::{History, Keys, Order, OrderLine};
use super::{Tpcc, DISTRICTS, PRIORITIES};

/// The update profiles as procedures (run so under `active`, as closures elsewhere).
const NEW_ORDER: &str = "tpcc.new_order";
const PAYMENT: &str = "tpcc.payment";
const DELIVERY: &str = "tpcc.delivery";

/// The error of a New-Order that names an unused item (rolled back on purpose).
const UNUSED_ITEM: &str = "tpcc: unused item";

/// One line of a New-Order as the terminal keyed it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct LineInput {
    i_id: u32,
    supply_w_id: u32,
    quantity: u8,
}

/// A New-Order's input: everything the terminal chose, so that every replica runs the same.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct NewOrderArgs {
    w: u32,
    d: u32,
    c: u32,
    lines: Vec<LineInput>,
    all_local: bool,
    entry_d: u64,
}

/// A Payment's input (its history row is `(worker, seq)`).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct PaymentArgs {
    w: u32,
    d: u32,
    c_w: u32,
    c_d: u32,
    c: u32,
    amount: i64,
    date: u64,
    worker: u64,
    seq: u64,
}

/// A Delivery's input.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct DeliveryArgs {
    w: u32,
    carrier: u8,
    date: u64,
}

/// C_DATA keeps at most this many characters.
const CUSTOMER_DATA_MAX: usize = 500;

/// Registers the update profiles' procedures on `node`.
pub(super) fn register(node: &Node) -> Result<(), RegisterError> {
    node.register(NEW_ORDER, new_order_body)?;
    node.register(PAYMENT, payment_body)?;
    node.register(DELIVERY, delivery_body)
}

/// New-Order's transaction; returns the total the terminal shows.
fn new_order_body(tx: &mut Tx<'_>, a: &NewOrderArgs) -> Result<i64, TxError> {
    let k = Keys;
    let (w, d, c) = (a.w, a.d, a.c);
    let w_tax = tx.read(&k.warehouse(w))?.tax_bp;
    let district = k.district(w, d);
    let (o, d_tax) = tx.modify(&district, |row| {
        row.next_o_id += 1;
        (row.next_o_id - 1, row.tax_bp)
    })?;
    let discount = tx.read(&k.customer(w, d, c))?.discount_bp;
    tx.create(
        &k.order(w, d, o),
        Order {
            c_id: c,
            entry_d: a.entry_d,
            carrier_id: None,
            ol_cnt: a.lines.len() as u8,
            all_local: a.all_local,
        },
    )?;
    tx.create(&k.new_order(w, d, o), ())?;
    tx.write(&k.last_order(w, d, c), o)?;
    let mut total = 0i64;
    for (n, line) in (1u32..).zip(&a.lines) {
        let item = k.item(line.i_id);
        if !tx.exists(&item)? {
            return Err(TxError::abort(UNUSED_ITEM));
        }
        let price = tx.read(&item)?.price;
        let qty = i32::from(line.quantity);
        let remote = line.supply_w_id != w;
        tx.modify(&k.stock(line.supply_w_id, line.i_id), |s| {
            s.quantity = if s.quantity >= qty + 10 {
                s.quantity - qty
            } else {
                s.quantity - qty + 91
            };
            s.ytd += i64::from(qty);
            s.order_cnt += 1;
            s.remote_cnt += u32::from(remote);
        })?;
        let amount = i64::from(qty) * price;
        total += amount;
        tx.create(
            &k.order_line(w, d, o, n),
            OrderLine {
                i_id: line.i_id,
                supply_w_id: line.supply_w_id,
                delivery_d: None,
                quantity: line.quantity,
                amount,
            },
        )?;
    }
    // The total the terminal shows: after discount, with both taxes.
    let rates = (10_000 - i64::from(discount)) * (10_000 + i64::from(w_tax + d_tax));
    Ok(total * rates / 100_000_000)
}

/// Payment's transaction.
fn payment_body(tx: &mut Tx<'_>, a: &PaymentArgs) -> Result<(), TxError> {
    let k = Keys;
    let PaymentArgs {
        w,
        d,
        c_w,
        c_d,
        c,
        amount,
        date,
        worker,
        seq,
    } = *a;
    tx.modify(&k.warehouse_ytd(w), |ytd| *ytd += amount)?;
    tx.modify(&k.district_ytd(w, d), |ytd| *ytd += amount)?;
    tx.modify(&k.customer(c_w, c_d, c), |row| {
        row.balance -= amount;
        row.ytd_payment += amount;
        row.payment_cnt += 1;
        if row.bad_credit {
            let mut data = format!("{c} {c_d} {c_w} {d} {w} {amount}|");
            data.push_str(&row.data);
            data.truncate(CUSTOMER_DATA_MAX);
            row.data = data;
        }
    })?;
    tx.create(
        &k.history(worker as usize, seq),
        History {
            c_id: c,
            c_d_id: c_d,
            c_w_id: c_w,
            d_id: d,
            w_id: w,
            date,
            amount,
        },
    )
}

/// Delivery's transaction.
fn delivery_body(tx: &mut Tx<'_>, a: &DeliveryArgs) -> Result<(), TxError> {
    let k = Keys;
    let w = a.w;
    for d in 1..=DISTRICTS {
        let cursor = k.delivery_cursor(w, d);
        let o = *tx.read(&cursor)?;
        let new_order = k.new_order(w, d, o);
        if !tx.exists(&new_order)? {
            continue; // Nothing to deliver in this district (clause 2.7.4.2).
        }
        tx.delete(&new_order)?;
        tx.write(&cursor, o + 1)?;
        let (c, ol_cnt) = tx.modify(&k.order(w, d, o), |row| {
            row.carrier_id = Some(a.carrier);
            (row.c_id, row.ol_cnt)
        })?;
        let mut total = 0;
        for n in 1..=u32::from(ol_cnt) {
            total += tx.modify(&k.order_line(w, d, o, n), |line| {
                line.delivery_d = Some(a.date);
                line.amount
            })?;
        }
        tx.modify(&k.customer(w, d, c), |row| {
            row.balance += total;
            row.delivery_cnt += 1;
        })?;
    }
    Ok(())
}

impl Tpcc {
    /// New-Order (2.4): takes the district's next order id, checks the customer and the items,
    /// updates the stock of every line, creates the order, its new-order row and its lines.
    /// 1% name an unused item and are rolled back on purpose (clause 2.4.1.4); they count as
    /// completed business transactions.
    pub(super) fn new_order(&self, node: &Node, w: u32, rng: &mut SmallRng) -> Result<(), TxError> {
        let d = rng.random_range(1..=DISTRICTS);
        let c = self.random_customer_id(rng);
        let ol_cnt = rng.random_range(5..=15u32);
        let rollback = rng.random_range(0..100) == 0;
        let lines: Vec<LineInput> = (1..=ol_cnt)
            .map(|n| LineInput {
                i_id: if rollback && n == ol_cnt {
                    self.scale.items + 1
                } else {
                    self.random_item_id(rng)
                },
                supply_w_id: if rng.random_range(0..100) == 0 {
                    self.other_warehouse(w, rng)
                } else {
                    w
                },
                quantity: rng.random_range(1..=10),
            })
            .collect();
        let args = NewOrderArgs {
            w,
            d,
            c,
            all_local: lines.iter().all(|l| l.supply_w_id == w),
            lines,
            entry_d: self.now(),
        };
        let outcome = match node.protocol() {
            Protocol::Active => node.invoke::<_, i64>(NEW_ORDER, &args),
            _ => node
                .tx()
                .priority(PRIORITIES[0])
                .run(|tx| new_order_body(tx, &args)),
        };
        match outcome {
            Err(TxError::User(e)) if e.to_string() == UNUSED_ITEM => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Payment (2.5): adds the amount to the warehouse's and the district's year-to-date,
    /// charges the customer (85% of the home warehouse, 15% of another) and records a history
    /// row.
    pub(super) fn payment(
        &self,
        node: &Node,
        w: u32,
        worker: usize,
        rng: &mut SmallRng,
    ) -> Result<(), TxError> {
        let d = rng.random_range(1..=DISTRICTS);
        let (c_w, c_d) = if rng.random_range(0..100) < 85 {
            (w, d)
        } else {
            (
                self.other_warehouse(w, rng),
                rng.random_range(1..=DISTRICTS),
            )
        };
        let c = self.pick_customer(c_w, c_d, rng);
        let rows = &self.history_rows[worker];
        let args = PaymentArgs {
            w,
            d,
            c_w,
            c_d,
            c,
            amount: rng.random_range(100..=500_000i64),
            date: self.now(),
            worker: worker as u64,
            seq: rows.load(Ordering::Relaxed),
        };
        match node.protocol() {
            Protocol::Active => node.invoke::<_, ()>(PAYMENT, &args)?,
            _ => node
                .tx()
                .priority(PRIORITIES[1])
                .run(|tx| payment_body(tx, &args))?,
        }
        rows.store(args.seq + 1, Ordering::Relaxed);
        Ok(())
    }

    /// Order-Status (2.6, read-only): the customer's balance and newest order with its lines.
    pub(super) fn order_status(
        &self,
        node: &Node,
        w: u32,
        rng: &mut SmallRng,
    ) -> Result<(), TxError> {
        let k = self.keys;
        let d = rng.random_range(1..=DISTRICTS);
        let c = self.pick_customer(w, d, rng);
        node.tx()
            .priority(PRIORITIES[2])
            .read_only()
            .run(|tx| {
                let mut seen = tx.read(&k.customer(w, d, c))?.balance;
                let o = *tx.read(&k.last_order(w, d, c))?;
                if o == 0 {
                    return Ok(seen);
                }
                let order = tx.read(&k.order(w, d, o))?;
                for n in 1..=u32::from(order.ol_cnt) {
                    seen += tx.read(&k.order_line(w, d, o, n))?.amount;
                }
                Ok(seen)
            })
            .map(|_| ())
    }

    /// Delivery (2.7): in each of the ten districts, the oldest undelivered order gets a
    /// carrier, its lines a delivery date, and its customer the amount on their balance.
    pub(super) fn delivery(&self, node: &Node, w: u32, rng: &mut SmallRng) -> Result<(), TxError> {
        let args = DeliveryArgs {
            w,
            carrier: rng.random_range(1..=10),
            date: self.now(),
        };
        match node.protocol() {
            Protocol::Active => node.invoke::<_, ()>(DELIVERY, &args),
            _ => node
                .tx()
                .priority(PRIORITIES[3])
                .run(|tx| delivery_body(tx, &args)),
        }
    }

    /// Stock-Level (2.8, read-only): how many distinct items of the district's last 20 orders
    /// have less stock than a threshold.
    pub(super) fn stock_level(
        &self,
        node: &Node,
        w: u32,
        rng: &mut SmallRng,
    ) -> Result<(), TxError> {
        let k = self.keys;
        let d = rng.random_range(1..=DISTRICTS);
        let threshold = rng.random_range(10..=20);
        node.tx()
            .priority(PRIORITIES[4])
            .read_only()
            .run(|tx| {
                let next = tx.read(&k.district(w, d))?.next_o_id;
                let mut items = HashSet::with_capacity(300);
                for o in next.saturating_sub(20).max(1)..next {
                    let ol_cnt = tx.read(&k.order(w, d, o))?.ol_cnt;
                    for n in 1..=u32::from(ol_cnt) {
                        items.insert(tx.read(&k.order_line(w, d, o, n))?.i_id);
                    }
                }
                let mut low = 0;
                for i in items {
                    if tx.read(&k.stock(w, i))?.quantity < threshold {
                        low += 1;
                    }
                }
                Ok(low)
            })
            .map(|_| ())
    }
}

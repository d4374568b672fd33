//! The consistency conditions of clause 3.3.2, checked on one snapshot per warehouse after a
//! run (with no transaction running).
//!
//! Checked: (1) W_YTD = sum of its districts' D_YTD; (2) D_NEXT_O_ID - 1 = max(O_ID) =
//! max(NO_O_ID) where new-orders are present; (3) the new-orders of a district are contiguous;
//! (4) sum(O_OL_CNT) = the number of order lines of the district; (5) an order has no carrier
//! exactly when its new-order row exists; (6) every order has exactly O_OL_CNT lines; (7) an
//! order line has a delivery date exactly when its order has a carrier; (8, 9) W_YTD and D_YTD
//! = their load-time values + the payments in the history; (10) every customer's balance =
//! load-time balance + delivered order-line amounts - payments; (12) balance + C_YTD_PAYMENT =
//! the delivered order-line amounts. (Condition 11 depends on the load-time row counts of the
//! full population and is left out.)
//! Orders are looked for up to `LOOK_PAST` ids past D_NEXT_O_ID, so an order created without
//! taking an id is caught.

use std::collections::HashMap;

use atomos::{Node, Tx, TxError};

use super::load::INITIAL_PAYMENT;
use super::{Check, Tpcc, DISTRICTS};

/// How far past D_NEXT_O_ID orders and new-orders are looked for.
const LOOK_PAST: u32 = 64;

/// What one warehouse's check found wrong, at most a few of each.
#[derive(Default)]
struct Findings {
    problems: Vec<String>,
    orders: u64,
    lines: u64,
    new_orders: u64,
}

impl Findings {
    fn fail(&mut self, what: String) {
        if self.problems.len() < 8 {
            self.problems.push(what);
        }
    }
}

/// Payments recorded in the history, by warehouse, district and customer.
#[derive(Default)]
struct Payments {
    warehouse: HashMap<u32, i64>,
    district: HashMap<(u32, u32), i64>,
    customer: HashMap<(u32, u32, u32), i64>,
}

pub(super) fn check(t: &Tpcc, node: &Node) -> Result<Check, TxError> {
    let payments = node.atomically_read(|tx| history(t, tx))?;
    let mut all = Findings::default();
    for w in 1..=t.warehouses {
        let f = node.atomically_read(|tx| warehouse(t, tx, w, &payments))?;
        all.orders += f.orders;
        all.lines += f.lines;
        all.new_orders += f.new_orders;
        for p in f.problems {
            all.fail(p);
        }
    }
    let ok = all.problems.is_empty();
    let summary = format!(
        "tpcc: {} warehouses, {} orders, {} order lines, {} undelivered",
        t.warehouses, all.orders, all.lines, all.new_orders
    );
    Ok(Check {
        ok,
        detail: if ok {
            format!("{summary}; consistency conditions 1-10 and 12 hold")
        } else {
            format!("{summary}; VIOLATED: {}", all.problems.join("; "))
        },
    })
}

fn history(t: &Tpcc, tx: &mut Tx<'_>) -> Result<Payments, TxError> {
    let k = t.keys;
    let mut p = Payments::default();
    // Each worker's rows are numbered from 0 without gaps: read them from the store up to the
    // first missing one (so the workers may have run in other processes).
    for worker in 0..t.history_rows.len() {
        let mut seq = 0;
        while tx.exists(&k.history(worker, seq))? {
            let h = tx.read(&k.history(worker, seq))?;
            *p.warehouse.entry(h.w_id).or_default() += h.amount;
            *p.district.entry((h.w_id, h.d_id)).or_default() += h.amount;
            *p.customer.entry((h.c_w_id, h.c_d_id, h.c_id)).or_default() += h.amount;
            seq += 1;
        }
    }
    Ok(p)
}

fn warehouse(t: &Tpcc, tx: &mut Tx<'_>, w: u32, paid: &Payments) -> Result<Findings, TxError> {
    let k = t.keys;
    let s = t.scale;
    let mut f = Findings::default();
    let w_ytd = *tx.read(&k.warehouse_ytd(w))?;
    let district_ytd_at_load = INITIAL_PAYMENT * i64::from(s.customers);
    let mut sum_d_ytd = 0;
    // Delivered amounts per customer of this warehouse.
    let mut delivered: HashMap<(u32, u32), i64> = HashMap::new();
    for d in 1..=DISTRICTS {
        let district = tx.read(&k.district(w, d))?.clone();
        let d_ytd = *tx.read(&k.district_ytd(w, d))?;
        sum_d_ytd += d_ytd;
        let d_paid = paid.district.get(&(w, d)).copied().unwrap_or(0);
        if d_ytd != district_ytd_at_load + d_paid {
            f.fail(format!(
                "(9) district {w}/{d}: D_YTD {d_ytd} but load-time {district_ytd_at_load} + history {d_paid}"
            ));
        }
        let mut max_o = 0;
        let (mut min_no, mut max_no, mut count_no) = (u32::MAX, 0, 0u32);
        let (mut sum_ol_cnt, mut lines) = (0u64, 0u64);
        for o in 1..district.next_o_id + LOOK_PAST {
            let order_ref = k.order(w, d, o);
            let has_new_order = tx.exists(&k.new_order(w, d, o))?;
            if has_new_order {
                min_no = min_no.min(o);
                max_no = o;
                count_no += 1;
            }
            if !tx.exists(&order_ref)? {
                if o < district.next_o_id {
                    f.fail(format!("(2) district {w}/{d}: order {o} is missing"));
                }
                if has_new_order {
                    f.fail(format!(
                        "(2) district {w}/{d}: new-order {o} without its order"
                    ));
                }
                continue;
            }
            max_o = o;
            f.orders += 1;
            let order = tx.read(&order_ref)?.clone();
            if order.carrier_id.is_none() != has_new_order {
                f.fail(format!(
                    "(5) order {w}/{d}/{o}: carrier {:?} but new-order row {}",
                    order.carrier_id,
                    if has_new_order { "present" } else { "absent" }
                ));
            }
            sum_ol_cnt += u64::from(order.ol_cnt);
            for n in 1..=u32::from(order.ol_cnt) {
                let line_ref = k.order_line(w, d, o, n);
                if !tx.exists(&line_ref)? {
                    f.fail(format!("(6) order {w}/{d}/{o}: line {n} is missing"));
                    continue;
                }
                lines += 1;
                let line = tx.read(&line_ref)?;
                if line.delivery_d.is_some() != order.carrier_id.is_some() {
                    f.fail(format!(
                        "(7) order line {w}/{d}/{o}/{n}: delivery date {:?} but carrier {:?}",
                        line.delivery_d, order.carrier_id
                    ));
                }
                if line.delivery_d.is_some() {
                    *delivered.entry((d, order.c_id)).or_default() += line.amount;
                }
            }
            if tx.exists(&k.order_line(w, d, o, u32::from(order.ol_cnt) + 1))? {
                lines += 1;
                f.fail(format!(
                    "(6) order {w}/{d}/{o}: more lines than O_OL_CNT {}",
                    order.ol_cnt
                ));
            }
        }
        f.lines += lines;
        if sum_ol_cnt != lines {
            f.fail(format!(
                "(4) district {w}/{d}: sum(O_OL_CNT) {sum_ol_cnt} but {lines} order lines"
            ));
        }
        if max_o + 1 != district.next_o_id {
            f.fail(format!(
                "(2) district {w}/{d}: D_NEXT_O_ID {} but max(O_ID) {max_o}",
                district.next_o_id
            ));
        }
        if count_no > 0 {
            f.new_orders += u64::from(count_no);
            if max_no + 1 != district.next_o_id {
                f.fail(format!(
                    "(2) district {w}/{d}: D_NEXT_O_ID {} but max(NO_O_ID) {max_no}",
                    district.next_o_id
                ));
            }
            if max_no - min_no + 1 != count_no {
                f.fail(format!(
                    "(3) district {w}/{d}: {count_no} new-orders between {min_no} and {max_no}"
                ));
            }
        }
    }
    if w_ytd != sum_d_ytd {
        f.fail(format!(
            "(1) warehouse {w}: W_YTD {w_ytd} but its districts' D_YTD add up to {sum_d_ytd}"
        ));
    }
    let w_paid = paid.warehouse.get(&w).copied().unwrap_or(0);
    let w_at_load = district_ytd_at_load * i64::from(DISTRICTS);
    if w_ytd != w_at_load + w_paid {
        f.fail(format!(
            "(8) warehouse {w}: W_YTD {w_ytd} but load-time {w_at_load} + history {w_paid}"
        ));
    }
    for d in 1..=DISTRICTS {
        for c in 1..=s.customers {
            let customer = tx.read(&k.customer(w, d, c))?;
            let (balance, ytd_payment) = (customer.balance, customer.ytd_payment);
            let got = delivered.get(&(d, c)).copied().unwrap_or(0);
            let paid = paid.customer.get(&(w, d, c)).copied().unwrap_or(0);
            let want = -INITIAL_PAYMENT + got - paid;
            if balance != want {
                f.fail(format!(
                    "(10) customer {w}/{d}/{c}: balance {balance} but delivered {got} - paid {paid} \
                     from {} = {want}",
                    -INITIAL_PAYMENT
                ));
            }
            if balance + ytd_payment != got {
                f.fail(format!(
                    "(12) customer {w}/{d}/{c}: balance {balance} + YTD payment {ytd_payment} \
                     but delivered {got}"
                ));
            }
        }
    }
    Ok(f)
}

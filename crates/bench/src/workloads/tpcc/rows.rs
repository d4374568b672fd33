//! The TPC-C tables as object types, and the key of every row.
//!
//! Money is in cents, rates in basis points (1/100 of a percent), dates are ticks of the
//! workload's logical clock.

use atomos::{Key, TRef};
use serde::{Deserialize, Serialize};

/// Warehouse ids fit in 16 bits of a row key.
pub const MAX_WAREHOUSES: u32 = u16::MAX as u32;

/// A warehouse row (W_TAX; W_YTD is an object of its own: [`Keys::warehouse_ytd`]).
#[derive(Clone, Debug, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.tpcc.Warehouse")]
pub struct Warehouse {
    pub tax_bp: u32,
}

/// A district row (D_TAX, D_NEXT_O_ID; D_YTD is an object of its own:
/// [`Keys::district_ytd`]).
#[derive(Clone, Debug, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.tpcc.District")]
pub struct District {
    pub tax_bp: u32,
    pub next_o_id: u32,
}

/// A customer row.
#[derive(Clone, Debug, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.tpcc.Customer")]
pub struct Customer {
    pub balance: i64,
    pub ytd_payment: i64,
    pub payment_cnt: u32,
    pub delivery_cnt: u32,
    pub discount_bp: u32,
    pub bad_credit: bool,
    /// C_LAST.
    pub last: String,
    /// C_DATA: for customers with bad credit, Payment prepends a record of itself (500
    /// characters at most).
    pub data: String,
}

/// An item row (read-only).
#[derive(Clone, Debug, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.tpcc.Item")]
pub struct Item {
    pub price: i64,
    pub original: bool,
}

/// A stock row.
#[derive(Clone, Debug, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.tpcc.Stock")]
pub struct Stock {
    pub quantity: i32,
    pub ytd: i64,
    pub order_cnt: u32,
    pub remote_cnt: u32,
    pub original: bool,
}

/// An order row. Its lines are rows of their own, numbered 1 to `ol_cnt`.
#[derive(Clone, Debug, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.tpcc.Order")]
pub struct Order {
    pub c_id: u32,
    pub entry_d: u64,
    pub carrier_id: Option<u8>,
    pub ol_cnt: u8,
    pub all_local: bool,
}

/// An order line row.
#[derive(Clone, Debug, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.tpcc.OrderLine")]
pub struct OrderLine {
    pub i_id: u32,
    pub supply_w_id: u32,
    pub delivery_d: Option<u64>,
    pub quantity: u8,
    pub amount: i64,
}

/// A history row (payments).
#[derive(Clone, Debug, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.tpcc.History")]
pub struct History {
    pub c_id: u32,
    pub c_d_id: u32,
    pub c_w_id: u32,
    pub d_id: u32,
    pub w_id: u32,
    pub date: u64,
    pub amount: i64,
}

/// Row keys. A row's key is a table prefix and its primary key packed into 64 bits: warehouse
/// (16 bits), district (4), order or item or customer id (32), order line number (4); the
/// indexes beyond the specification's (the customer's newest order, the oldest undelivered
/// order of a district) have keys of their own.
#[derive(Clone, Copy, Debug, Default)]
pub struct Keys;

fn pack(w: u32, d: u32, id: u32, line: u32) -> u64 {
    (u64::from(w) << 40) | (u64::from(d & 0xf) << 36) | (u64::from(id) << 4) | u64::from(line & 0xf)
}

impl Keys {
    /// WAREHOUSE row `w`.
    pub fn warehouse(self, w: u32) -> TRef<Warehouse> {
        TRef::new(Key::with_index("tw/", pack(w, 0, 0, 0)))
    }
    /// W_YTD of warehouse `w`. Payment adds to it while New-Order reads W_TAX: a word-based
    /// STM (PRESTO's, TinySTM) sees no conflict between two fields of a row, and keeping the
    /// year-to-date apart gives an object-based one the same (in one object, every payment
    /// would invalidate the new orders running or preempted meanwhile).
    pub fn warehouse_ytd(self, w: u32) -> TRef<i64> {
        TRef::new(Key::with_index("twy/", pack(w, 0, 0, 0)))
    }
    /// DISTRICT row (w, d).
    pub fn district(self, w: u32, d: u32) -> TRef<District> {
        TRef::new(Key::with_index("td/", pack(w, d, 0, 0)))
    }
    /// D_YTD of district (w, d), apart from its row for the same reason as
    /// [`Keys::warehouse_ytd`] (New-Order reads D_TAX and bumps D_NEXT_O_ID).
    pub fn district_ytd(self, w: u32, d: u32) -> TRef<i64> {
        TRef::new(Key::with_index("tdy/", pack(w, d, 0, 0)))
    }
    /// CUSTOMER row (w, d, c).
    pub fn customer(self, w: u32, d: u32, c: u32) -> TRef<Customer> {
        TRef::new(Key::with_index("tc/", pack(w, d, c, 0)))
    }
    /// The id of customer (w, d, c)'s newest order (0: none): the index Order-Status needs.
    pub fn last_order(self, w: u32, d: u32, c: u32) -> TRef<u32> {
        TRef::new(Key::with_index("tl/", pack(w, d, c, 0)))
    }
    /// ITEM row `i`.
    pub fn item(self, i: u32) -> TRef<Item> {
        TRef::new(Key::with_index("ti/", pack(0, 0, i, 0)))
    }
    /// STOCK row (w, i).
    pub fn stock(self, w: u32, i: u32) -> TRef<Stock> {
        TRef::new(Key::with_index("ts/", pack(w, 0, i, 0)))
    }
    /// ORDER row (w, d, o).
    pub fn order(self, w: u32, d: u32, o: u32) -> TRef<Order> {
        TRef::new(Key::with_index("to/", pack(w, d, o, 0)))
    }
    /// NEW-ORDER row (w, d, o): present while order o is undelivered.
    pub fn new_order(self, w: u32, d: u32, o: u32) -> TRef<()> {
        TRef::new(Key::with_index("tn/", pack(w, d, o, 0)))
    }
    /// The oldest order of district (w, d) Delivery has not handled yet.
    pub fn delivery_cursor(self, w: u32, d: u32) -> TRef<u32> {
        TRef::new(Key::with_index("tk/", pack(w, d, 0, 0)))
    }
    /// ORDER-LINE row (w, d, o, n), n from 1 to 15.
    pub fn order_line(self, w: u32, d: u32, o: u32, n: u32) -> TRef<OrderLine> {
        TRef::new(Key::with_index("tol/", pack(w, d, o, n)))
    }
    /// HISTORY row `seq` of worker `worker`.
    pub fn history(self, worker: usize, seq: u64) -> TRef<History> {
        TRef::new(Key::with_index("th/", ((worker as u64) << 40) | seq))
    }
}

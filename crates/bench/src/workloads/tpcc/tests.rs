use rand::SeedableRng;

use super::*;

const TINY: TpccScale = TpccScale {
    items: 200,
    customers: 30,
    orders: 30,
};

fn params(warehouses: usize, mix: TpccMix) -> WorkloadParams {
    WorkloadParams {
        warehouses,
        mix,
        scale: TINY,
        threads: 2,
        ..WorkloadParams::default()
    }
}

/// A loaded database after `ops` transactions of the mix from two workers.
fn run(warehouses: usize, mix: TpccMix, ops: usize) -> (Node, Tpcc, [u64; 5]) {
    let node = Node::local();
    let tpcc = Tpcc::new(&params(warehouses, mix)).unwrap();
    tpcc.setup(&node).unwrap();
    let mut rng = SmallRng::seed_from_u64(4);
    let mut seen = [0u64; 5];
    for i in 0..ops {
        seen[tpcc.op(&node, i % 2, &mut rng).unwrap()] += 1;
    }
    (node, tpcc, seen)
}

fn assert_violated(node: &Node, tpcc: &Tpcc, condition: &str) {
    let check = tpcc.check(node).unwrap();
    assert!(!check.ok, "a broken history passed: {}", check.detail);
    assert!(
        check.detail.contains(condition),
        "expected condition {condition} to fail: {}",
        check.detail
    );
}

#[test]
fn every_profile_runs_and_the_database_stays_consistent() {
    for mix in TpccMix::ALL {
        let (node, tpcc, seen) = run(2, mix, 3_000);
        assert!(seen.iter().all(|&n| n > 0), "{mix}: profiles run {seen:?}");
        let check = tpcc.check(&node).unwrap();
        assert!(check.ok, "{mix}: {}", check.detail);
    }
}

#[test]
fn the_mixes_follow_their_weights() {
    let mut rng = SmallRng::seed_from_u64(1);
    let mut counts = [0u32; 5];
    for _ in 0..100_000 {
        counts[TpccMix::Standard.pick(&mut rng)] += 1;
    }
    // 45/43/4/4/4 within half a point.
    for (count, want) in counts.iter().zip([45.0, 43.0, 4.0, 4.0, 4.0]) {
        let got = f64::from(*count) / 1000.0;
        assert!((got - want).abs() < 0.5, "{counts:?}");
    }
    assert_eq!(TpccMix::ReadHeavy.weights().iter().sum::<u32>(), 1000);
}

#[test]
fn a_lost_district_payment_breaks_conditions_1_and_9() {
    let (node, tpcc, _) = run(1, TpccMix::Standard, 500);
    node.atomically(|tx| tx.modify(&tpcc.keys.district_ytd(1, 3), |ytd| *ytd -= 700))
        .unwrap();
    assert_violated(&node, &tpcc, "(1) warehouse 1");
    assert_violated(&node, &tpcc, "(9) district 1/3");
}

#[test]
fn an_order_that_took_no_id_breaks_condition_2() {
    let (node, tpcc, _) = run(1, TpccMix::Standard, 500);
    let k = tpcc.keys;
    node.atomically(|tx| {
        let next = tx.read(&k.district(1, 2))?.next_o_id;
        tx.create(
            &k.order(1, 2, next),
            rows::Order {
                c_id: 1,
                entry_d: 0,
                carrier_id: Some(1),
                ol_cnt: 0,
                all_local: true,
            },
        )
    })
    .unwrap();
    assert_violated(&node, &tpcc, "(2) district 1/2: D_NEXT_O_ID");
}

#[test]
fn a_delivery_that_forgot_the_carrier_breaks_condition_5() {
    let (node, tpcc, _) = run(1, TpccMix::Standard, 200);
    let k = tpcc.keys;
    node.atomically(|tx| {
        let o = *tx.read(&k.delivery_cursor(1, 5))?;
        tx.delete(&k.new_order(1, 5, o))?;
        tx.write(&k.delivery_cursor(1, 5), o + 1)
    })
    .unwrap();
    assert_violated(&node, &tpcc, "(5) order 1/5/");
}

#[test]
fn a_lost_customer_update_breaks_condition_10() {
    let (node, tpcc, _) = run(1, TpccMix::Standard, 500);
    node.atomically(|tx| tx.modify(&tpcc.keys.customer(1, 7, 11), |c| c.balance += 1))
        .unwrap();
    assert_violated(&node, &tpcc, "(10) customer 1/7/11");
}

#[test]
fn bad_parameters_are_refused() {
    let mut p = params(0, TpccMix::Standard);
    assert!(Tpcc::new(&p).is_err());
    p.warehouses = 1;
    p.scale.orders = p.scale.customers + 1;
    assert!(Tpcc::new(&p).err().unwrap().contains("cannot exceed"));
    assert!("huge".parse::<TpccScale>().is_err());
    assert_eq!("read-heavy".parse::<TpccMix>(), Ok(TpccMix::ReadHeavy));
}

#[test]
fn last_names_are_made_of_three_syllables() {
    assert_eq!(load::last_name(371), "PRICALLYOUGHT");
    assert_eq!(load::last_name(0), "BARBARBAR");
}

#[test]
fn a_payment_lost_from_the_customer_ytd_breaks_condition_12() {
    let (node, tpcc, _) = run(1, TpccMix::Standard, 300);
    node.atomically(|tx| tx.modify(&tpcc.keys.customer(1, 4, 9), |c| c.ytd_payment -= 100))
        .unwrap();
    let check = tpcc.check(&node).unwrap();
    assert!(
        check.detail.contains("(12) customer 1/4/9"),
        "{}",
        check.detail
    );
    assert!(!check.detail.contains("(10)"), "{}", check.detail);
}

#[test]
fn an_undelivered_line_with_a_delivery_date_breaks_condition_7() {
    let (node, tpcc, _) = run(1, TpccMix::Standard, 300);
    let k = tpcc.keys;
    node.atomically(|tx| {
        let o = *tx.read(&k.delivery_cursor(1, 6))?;
        tx.modify(&k.order_line(1, 6, o, 1), |l| l.delivery_d = Some(1))
    })
    .unwrap();
    assert_violated(&node, &tpcc, "(7) order line 1/6/");
}

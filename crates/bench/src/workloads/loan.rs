//! Loan (HyflowCPP thesis 6.2.2.2): a borrower takes a loan from five lenders, each borrowing
//! step a nested transaction; the read operation sums the balances of six accounts.

use atomos::{Key, Node, TRef, TxError};
use rand::rngs::SmallRng;
use rand::seq::index::sample;
use rand::Rng;

use super::bank::{open_accounts, total, Transfer};
use super::nesting::{run_composed, NestingModel};
use super::{Check, Workload, WorkloadParams};

const INITIAL: i64 = 1_000;
/// Accounts a loan or a balance touches: the borrower and five lenders.
const ACCOUNTS_PER_OP: usize = 6;

/// The Loan workload. Invariant: the total never changes.
pub struct Loan {
    accounts: Vec<TRef<i64>>,
    read_ratio: f64,
    nesting: NestingModel,
}

impl Loan {
    /// `p.objects` accounts (at least six). Loans nest their borrowing steps as `p.nesting`
    /// says, closed when it says flat (the thesis's loan is nested).
    pub fn new(p: &WorkloadParams) -> Loan {
        Loan {
            accounts: (0..p.objects.max(ACCOUNTS_PER_OP) as u64)
                .map(|i| TRef::new(Key::with_index("loan/", i)))
                .collect(),
            read_ratio: p.read_ratio,
            nesting: match p.nesting {
                NestingModel::Flat => NestingModel::Closed,
                other => other,
            },
        }
    }

    /// The sum of all balances, read as one snapshot.
    pub fn total(&self, node: &Node) -> Result<i64, TxError> {
        total(node, &self.accounts)
    }

    /// Six distinct random accounts.
    fn pick(&self, rng: &mut SmallRng) -> Vec<usize> {
        sample(rng, self.accounts.len(), ACCOUNTS_PER_OP).into_vec()
    }
}

impl Workload for Loan {
    fn setup(&self, node: &Node) -> Result<(), TxError> {
        open_accounts(node, &self.accounts, INITIAL)
    }

    fn profiles(&self) -> &'static [&'static str] {
        &["loan", "balance"]
    }

    fn op(&self, node: &Node, _thread: usize, rng: &mut SmallRng) -> Result<usize, TxError> {
        let picked = self.pick(rng);
        if rng.random_bool(self.read_ratio) {
            return node
                .atomically_read(|tx| {
                    let mut sum = 0i64;
                    for &i in &picked {
                        sum += *tx.read(&self.accounts[i])?;
                    }
                    Ok(sum)
                })
                .map(|_| 1);
        }
        let borrower = picked[0];
        let steps: Vec<Transfer> = picked[1..]
            .iter()
            .map(|&lender| {
                Transfer::new(
                    (lender, self.accounts[lender].clone()),
                    (borrower, self.accounts[borrower].clone()),
                    rng.random_range(1..=10),
                )
            })
            .collect();
        run_composed(node, self.nesting, &steps).map(|_| 0)
    }

    fn check(&self, node: &Node) -> Result<Check, TxError> {
        let total = self.total(node)?;
        let want = INITIAL * self.accounts.len() as i64;
        Ok(Check {
            ok: total == want,
            detail: format!("loan total {total}, expected {want}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn params() -> WorkloadParams {
        WorkloadParams {
            objects: 64,
            read_ratio: 0.3,
            ..WorkloadParams::default()
        }
    }

    #[test]
    fn loans_conserve_money_and_a_broken_history_is_caught() {
        let node = Node::local();
        let loan = Loan::new(&params());
        loan.setup(&node).unwrap();
        let mut rng = SmallRng::seed_from_u64(9);
        for _ in 0..500 {
            loan.op(&node, 0, &mut rng).unwrap();
        }
        let check = loan.check(&node).unwrap();
        assert!(check.ok, "{}", check.detail);
        // Money appearing from nowhere (a lost debit) must be caught.
        node.atomically(|tx| tx.modify(&loan.accounts[3], |b| *b += 5))
            .unwrap();
        let check = loan.check(&node).unwrap();
        assert!(!check.ok, "a broken history passed: {}", check.detail);
    }
}

//! Bank: transfers between random accounts; read-only balance over all or k accounts.

use atomos::{Key, Node, Protocol, RegisterError, TRef, Tx, TxError};
use rand::distr::{Bernoulli, Distribution};
use rand::rngs::SmallRng;
use rand::Rng;

use super::nesting::{run_composed, InnerOp, NestingModel};
use super::{below, coin, Check, Workload, WorkloadParams};

const INITIAL: i64 = 1_000;

/// The Bank workload (HyflowCPP thesis 6.2.1.1). Invariant: the total never changes.
pub struct Bank {
    accounts: Vec<TRef<i64>>,
    /// Whether an operation reads balances (else it transfers).
    reads: Bernoulli,
    balance_k: Option<usize>,
    nesting: NestingModel,
    inner: usize,
}

/// One transfer, as an inner operation of the nesting experiments.
#[derive(Clone)]
pub struct Transfer {
    from: (usize, TRef<i64>),
    to: (usize, TRef<i64>),
    amount: i64,
}

impl Transfer {
    /// Moves `amount` from account `from` to account `to` (each given as index and reference;
    /// the index names the abstract lock under open nesting).
    pub fn new(from: (usize, TRef<i64>), to: (usize, TRef<i64>), amount: i64) -> Transfer {
        Transfer { from, to, amount }
    }
}

impl InnerOp for Transfer {
    fn run(&self, tx: &mut Tx<'_>) -> Result<i64, TxError> {
        tx.modify(&self.from.1, |b| *b -= self.amount)?;
        tx.modify(&self.to.1, |b| *b += self.amount)?;
        Ok(0)
    }

    fn locks(&self) -> Vec<String> {
        vec![
            format!("bank/{}", self.from.0),
            format!("bank/{}", self.to.0),
        ]
    }

    fn compensation(&self, _: i64) -> Option<Transfer> {
        Some(Transfer {
            from: self.to.clone(),
            to: self.from.clone(),
            amount: self.amount,
        })
    }
}

impl Bank {
    /// A bank with `p.objects` accounts.
    pub fn new(p: &WorkloadParams) -> Bank {
        Bank {
            accounts: (0..p.objects.max(2) as u64)
                .map(|i| TRef::new(Key::with_index("bank/", i)))
                .collect(),
            reads: coin(p.read_ratio),
            balance_k: p.balance_k,
            nesting: p.nesting,
            inner: p.inner.max(1),
        }
    }

    /// The sum of all balances, read as one snapshot.
    pub fn total(&self, node: &Node) -> Result<i64, TxError> {
        total(node, &self.accounts)
    }
}

/// Creates every account with `initial`, 1,024 per transaction.
pub(crate) fn open_accounts(
    node: &Node,
    accounts: &[TRef<i64>],
    initial: i64,
) -> Result<(), TxError> {
    for chunk in accounts.chunks(1024) {
        node.atomically(|tx| {
            for a in chunk {
                tx.create(a, initial)?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// The sum of the balances, read as one snapshot.
pub(crate) fn total(node: &Node, accounts: &[TRef<i64>]) -> Result<i64, TxError> {
    node.atomically_read(|tx| {
        let mut sum = 0;
        for a in accounts {
            sum += *tx.read(a)?;
        }
        Ok(sum)
    })
}

/// The transfer procedure's name.
const TRANSFER: &str = "bank.transfer";

/// Moves `amount` from account `from` to account `to` (by index): the transfer procedure.
fn transfer_procedure(
    tx: &mut Tx<'_>,
    &(from, to, amount): &(u64, u64, i64),
) -> Result<(), TxError> {
    tx.modify(&TRef::<i64>::new(Key::with_index("bank/", from)), |b| {
        *b -= amount
    })?;
    tx.modify(&TRef::<i64>::new(Key::with_index("bank/", to)), |b| {
        *b += amount
    })?;
    Ok(())
}

impl Workload for Bank {
    fn register(&self, node: &Node) -> Result<(), RegisterError> {
        node.register(TRANSFER, transfer_procedure)
    }

    fn setup(&self, node: &Node) -> Result<(), TxError> {
        open_accounts(node, &self.accounts, INITIAL)
    }

    fn profiles(&self) -> &'static [&'static str] {
        &["transfer", "balance"]
    }

    fn op(&self, node: &Node, _thread: usize, rng: &mut SmallRng) -> Result<usize, TxError> {
        let n = self.accounts.len();
        if self.reads.sample(rng) {
            match self.balance_k {
                None => self.total(node).map(|_| 1),
                Some(k) => {
                    let picks: Vec<usize> = (0..k).map(|_| rng.random_range(0..n)).collect();
                    node.atomically_read(|tx| {
                        let mut sum = 0i64;
                        for &i in &picks {
                            sum += *tx.read(&self.accounts[i])?;
                        }
                        Ok(sum)
                    })
                    .map(|_| 1)
                }
            }
        } else if self.nesting == NestingModel::Flat && self.inner == 1 {
            let (from, to, amount) = draw_transfer(rng, n);
            if node.protocol() == Protocol::Active {
                return node
                    .invoke::<_, ()>(TRANSFER, &(from as u64, to as u64, amount))
                    .map(|()| 0);
            }
            node.atomically(|tx| {
                tx.modify(&self.accounts[from], |b| *b -= amount)?;
                tx.modify(&self.accounts[to], |b| *b += amount)
            })
            .map(|_| 0)
        } else {
            let transfers: Vec<Transfer> = (0..self.inner)
                .map(|_| {
                    let (from, to, amount) = draw_transfer(rng, n);
                    Transfer {
                        from: (from, self.accounts[from].clone()),
                        to: (to, self.accounts[to].clone()),
                        amount,
                    }
                })
                .collect();
            run_composed(node, self.nesting, &transfers).map(|_| 0)
        }
    }

    fn check(&self, node: &Node) -> Result<Check, TxError> {
        let total = self.total(node)?;
        let want = INITIAL * self.accounts.len() as i64;
        Ok(Check {
            ok: total == want,
            detail: format!("bank total {total}, expected {want}"),
        })
    }
}

/// A transfer's draw among `n` accounts (at least 2): two different accounts and an amount
/// from 1 to 10.
fn draw_transfer(rng: &mut SmallRng, n: usize) -> (usize, usize, i64) {
    let from = below(rng, n as u64) as usize;
    // Another account: from + 1 + k (k < n - 1) wraps around at most once, so a subtraction
    // does what `% n` would with a division.
    let to = from + 1 + below(rng, n as u64 - 1) as usize;
    let to = if to >= n { to - n } else { to };
    (from, to, 1 + below(rng, 10) as i64)
}

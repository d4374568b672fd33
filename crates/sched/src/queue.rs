//! The priority queue of a node's transaction service (PRESTO chapter 4): requests wait in
//! the *standing* list of their level until a worker starts them; a started transaction that
//! was preempted waits in its level's *active* list until a worker resumes it. A worker takes
//! from the highest non-empty level, the active list first (a preempted transaction holds a
//! context and has done work already). Two bitmaps, one bit per level, find that level with
//! one leading-zeros count, so a worker can also ask at once whether anything more urgent than
//! a transaction that just yielded is waiting (whether it goes back or carries on).

use std::collections::VecDeque;

/// A priority level: 1 is the lowest, [`PriorityQueue::levels`] the highest.
pub type Level = u8;

/// The most levels a queue has (one bit each in a `u64`).
pub const MAX_LEVELS: Level = 64;

/// Why a queue refused a request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// The queue was asked for no levels, or more than it can have.
    #[error("a queue has 1 to {MAX_LEVELS} priority levels, not {0}")]
    Levels(u16),
    /// A priority outside the queue's levels.
    #[error("priority {level} is not one of this queue's levels (1 to {levels})")]
    NoSuchLevel {
        /// The priority given.
        level: Level,
        /// The queue's levels.
        levels: Level,
    },
}

/// What a worker took from the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Taken<T> {
    /// A preempted transaction to resume.
    Resume(T),
    /// A request to start.
    Start(T),
}

/// The queue: `T` is a request (standing) or a preempted transaction's context (active).
#[derive(Debug)]
pub struct PriorityQueue<T> {
    levels: Level,
    active: Vec<VecDeque<T>>,
    standing: Vec<VecDeque<T>>,
    /// Bit `level - 1` set: that level's active list is not empty.
    active_bits: u64,
    /// Bit `level - 1` set: that level's standing list is not empty.
    standing_bits: u64,
}

impl<T> PriorityQueue<T> {
    /// An empty queue with priorities 1 to `levels`.
    pub fn new(levels: u16) -> Result<PriorityQueue<T>, QueueError> {
        if levels == 0 || levels > u16::from(MAX_LEVELS) {
            return Err(QueueError::Levels(levels));
        }
        let n = levels as usize;
        Ok(PriorityQueue {
            levels: levels as Level,
            active: (0..n).map(|_| VecDeque::new()).collect(),
            standing: (0..n).map(|_| VecDeque::new()).collect(),
            active_bits: 0,
            standing_bits: 0,
        })
    }

    /// Its highest priority (its lowest is 1).
    pub fn levels(&self) -> Level {
        self.levels
    }

    fn index(&self, level: Level) -> Result<usize, QueueError> {
        if level == 0 || level > self.levels {
            return Err(QueueError::NoSuchLevel {
                level,
                levels: self.levels,
            });
        }
        Ok(level as usize - 1)
    }

    /// A new request at `level`, behind the others of its level.
    pub fn push_standing(&mut self, level: Level, request: T) -> Result<(), QueueError> {
        let i = self.index(level)?;
        self.standing[i].push_back(request);
        self.standing_bits |= 1 << i;
        Ok(())
    }

    /// A preempted transaction at `level`, behind the others preempted at its level.
    pub fn push_active(&mut self, level: Level, context: T) -> Result<(), QueueError> {
        let i = self.index(level)?;
        self.active[i].push_back(context);
        self.active_bits |= 1 << i;
        Ok(())
    }

    /// The highest level with anything waiting.
    pub fn highest(&self) -> Option<Level> {
        let bits = self.active_bits | self.standing_bits;
        (bits != 0).then(|| (64 - bits.leading_zeros()) as Level)
    }

    /// The highest level with a preempted transaction waiting.
    pub fn highest_active(&self) -> Option<Level> {
        (self.active_bits != 0).then(|| (64 - self.active_bits.leading_zeros()) as Level)
    }

    /// Whether something above `level` waits.
    pub fn waits_above(&self, level: Level) -> bool {
        self.highest().is_some_and(|h| h > level)
    }

    /// Takes the next thing to run: from the highest level with anything waiting, a
    /// preempted transaction first, else the oldest request.
    pub fn take(&mut self) -> Option<(Level, Taken<T>)> {
        let level = self.highest()?;
        let i = level as usize - 1;
        let taken = match self.active[i].pop_front() {
            Some(t) => Taken::Resume(t),
            None => Taken::Start(self.standing[i].pop_front()?),
        };
        if self.active[i].is_empty() {
            self.active_bits &= !(1 << i);
        }
        if self.standing[i].is_empty() {
            self.standing_bits &= !(1 << i);
        }
        Some((level, taken))
    }

    /// Takes the preempted transaction of the highest level that has one (when no new
    /// request can start: every context is in use).
    pub fn take_active(&mut self) -> Option<(Level, T)> {
        if self.active_bits == 0 {
            return None;
        }
        let level = (64 - self.active_bits.leading_zeros()) as Level;
        let i = level as usize - 1;
        let t = self.active[i].pop_front()?;
        if self.active[i].is_empty() {
            self.active_bits &= !(1 << i);
        }
        Some((level, t))
    }

    /// Everything waiting, preempted or not.
    pub fn len(&self) -> usize {
        self.active
            .iter()
            .chain(&self.standing)
            .map(VecDeque::len)
            .sum()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.active_bits | self.standing_bits == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_highest_level_goes_first_and_a_preempted_transaction_before_a_new_one() {
        let mut q = PriorityQueue::new(5).unwrap();
        q.push_standing(1, "low").unwrap();
        q.push_standing(5, "urgent").unwrap();
        q.push_standing(3, "mid-new").unwrap();
        q.push_active(3, "mid-preempted").unwrap();
        assert_eq!(q.highest(), Some(5));
        assert!(q.waits_above(4) && !q.waits_above(5));
        assert_eq!(q.highest_active(), Some(3));
        assert_eq!(q.take(), Some((5, Taken::Start("urgent"))));
        assert_eq!(q.take(), Some((3, Taken::Resume("mid-preempted"))));
        assert_eq!(q.take(), Some((3, Taken::Start("mid-new"))));
        assert_eq!(q.take(), Some((1, Taken::Start("low"))));
        assert_eq!(q.take(), None);
        assert!(q.is_empty() && q.highest().is_none());
    }

    #[test]
    fn levels_outside_the_queue_are_refused() {
        assert_eq!(
            PriorityQueue::<()>::new(0).unwrap_err(),
            QueueError::Levels(0)
        );
        assert!(PriorityQueue::<()>::new(65).is_err());
        let mut q = PriorityQueue::new(64).unwrap();
        assert!(q.push_standing(64, ()).is_ok());
        assert_eq!(q.highest(), Some(64));
        assert_eq!(
            q.push_active(65, ()),
            Err(QueueError::NoSuchLevel {
                level: 65,
                levels: 64
            })
        );
        assert!(q.push_standing(0, ()).is_err());
        assert_eq!(q.len(), 1);
    }

    proptest! {
        /// Against a model: every take returns the highest level's oldest preempted entry, or
        /// else its oldest request; nothing is lost or taken twice.
        #[test]
        fn takes_follow_the_model(ops in proptest::collection::vec((0u8..3, 1u8..=5), 0..200)) {
            let mut q = PriorityQueue::new(5).unwrap();
            let mut model: Vec<(Vec<u32>, Vec<u32>)> = vec![(Vec::new(), Vec::new()); 5];
            for (n, (op, level)) in ops.into_iter().enumerate() {
                let n = n as u32;
                let i = level as usize - 1;
                match op {
                    0 => { q.push_standing(level, n).unwrap(); model[i].1.push(n); }
                    1 => { q.push_active(level, n).unwrap(); model[i].0.push(n); }
                    _ => {
                        let expected = model.iter_mut().enumerate().rev().find_map(|(i, (a, s))| {
                            if !a.is_empty() { Some((i as u8 + 1, Taken::Resume(a.remove(0)))) }
                            else if !s.is_empty() { Some((i as u8 + 1, Taken::Start(s.remove(0)))) }
                            else { None }
                        });
                        prop_assert_eq!(q.take(), expected);
                    }
                }
                let waiting: usize = model.iter().map(|(a, s)| a.len() + s.len()).sum();
                prop_assert_eq!(q.len(), waiting);
            }
        }
    }
}

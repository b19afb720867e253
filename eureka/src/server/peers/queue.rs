//! One peer's queue of writes, in order, merged per instance: a write of the same action as
//! the last one queued for its instance takes that one's place (its content, at its
//! position), as Eureka's servers merge their replication tasks by action and instance. A
//! peer that is down then costs one heartbeat per instance, not one per heartbeat, and the
//! order of each instance's writes is kept: only the last queued one is ever replaced.

use std::collections::{HashMap, VecDeque};

use super::Replicated;

/// The queue; each write has a sequence number, contiguous from the front.
#[derive(Debug, Default)]
pub struct PeerQueue {
    writes: VecDeque<(u64, Replicated)>,
    next: u64,
    /// The sequence number of the last write queued for each instance (`app`, `id`), while
    /// it is queued.
    last: HashMap<(String, String), u64>,
}

/// Writes taken from the front of a queue, to be put back if they could not be sent.
#[derive(Debug, Default)]
pub struct Taken {
    pub writes: Vec<Replicated>,
}

impl PeerQueue {
    /// How many writes are queued.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// Queues `write`; whether it took the place of the last write for its instance.
    pub fn push(&mut self, write: Replicated) -> bool {
        let key = (write.app.clone(), write.id.clone());
        if let Some(&seq) = self.last.get(&key)
            && let Some(slot) = self.position(seq)
            && self.writes[slot].1.action == write.action
        {
            self.writes[slot].1 = write;
            return true;
        }
        let seq = self.next;
        self.next += 1;
        self.writes.push_back((seq, write));
        self.last.insert(key, seq);
        false
    }

    /// Drops the oldest write (the queue is full).
    pub fn pop_oldest(&mut self) -> Option<Replicated> {
        let (seq, write) = self.writes.pop_front()?;
        self.unindex(seq, &write);
        Some(write)
    }

    /// Takes up to `n` writes from the front.
    pub fn take(&mut self, n: usize) -> Taken {
        let n = n.min(self.writes.len());
        let mut taken = Taken::default();
        for (seq, write) in self.writes.drain(..n).collect::<Vec<_>>() {
            self.unindex(seq, &write);
            taken.writes.push(write);
        }
        taken
    }

    /// Puts writes [`PeerQueue::take`] took back at the front, and merges the whole queue
    /// again in order (a write queued meanwhile may take the place of one put back); how
    /// many writes that merged. Linear in the queue, once per failed try.
    pub fn put_back(&mut self, taken: Taken) -> usize {
        let queued = std::mem::take(&mut self.writes);
        self.last.clear();
        let all = taken
            .writes
            .into_iter()
            .chain(queued.into_iter().map(|(_, w)| w));
        all.map(|write| usize::from(self.push(write))).sum()
    }

    /// Empties the queue; how many writes it held.
    pub fn clear(&mut self) -> usize {
        self.last.clear();
        std::mem::take(&mut self.writes).len()
    }

    /// Where the write numbered `seq` is, if it is still queued.
    fn position(&self, seq: u64) -> Option<usize> {
        let front = self.writes.front()?.0;
        let slot = usize::try_from(seq.checked_sub(front)?).ok()?;
        (self.writes.get(slot)?.0 == seq).then_some(slot)
    }

    fn unindex(&mut self, seq: u64, write: &Replicated) {
        let key = (write.app.clone(), write.id.clone());
        if self.last.get(&key) == Some(&seq) {
            self.last.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::replication::Action;

    fn write(action: Action, id: &str, stamp: u64) -> Replicated {
        Replicated {
            last_dirty_timestamp: Some(stamp),
            ..Replicated::new(action, "HELLO", id)
        }
    }

    fn shown(queue: &PeerQueue) -> Vec<(Action, String, u64)> {
        (queue.writes.iter())
            .map(|(_, w)| (w.action, w.id.clone(), w.last_dirty_timestamp.unwrap_or(0)))
            .collect()
    }

    #[test]
    fn a_write_replaces_the_last_one_of_its_instance_if_it_is_of_the_same_action() {
        let mut queue = PeerQueue::default();
        for stamp in 0..1000 {
            queue.push(write(Action::Heartbeat, "a", stamp));
            queue.push(write(Action::Heartbeat, "b", stamp));
        }
        assert_eq!(
            shown(&queue),
            [
                (Action::Heartbeat, "a".into(), 999),
                (Action::Heartbeat, "b".into(), 999)
            ]
        );
        // Another action for `a` queues behind; a heartbeat after it is not merged ahead of
        // it, which would change `a`'s order.
        queue.push(write(Action::Cancel, "a", 1000));
        assert!(!queue.push(write(Action::Heartbeat, "a", 1001)));
        assert_eq!(queue.len(), 4);
        assert_eq!(shown(&queue)[3], (Action::Heartbeat, "a".into(), 1001));
    }

    #[test]
    fn taken_writes_are_not_merged_into_and_merge_again_when_put_back() {
        let mut queue = PeerQueue::default();
        queue.push(write(Action::Register, "a", 1));
        queue.push(write(Action::Cancel, "b", 1));
        queue.push(write(Action::Heartbeat, "c", 1));
        let taken = queue.take(3);
        assert_eq!(taken.writes.len(), 3);
        // Their writes are on their way: newer ones queue behind, not into them.
        assert!(!queue.push(write(Action::Register, "a", 2)));
        assert!(!queue.push(write(Action::Register, "b", 2)));
        assert!(!queue.push(write(Action::Heartbeat, "c", 2)));
        // Not sent: put back in front, and merged again where the order allows.
        assert_eq!(queue.put_back(taken), 2);
        assert_eq!(
            shown(&queue),
            [
                (Action::Register, "a".into(), 2),
                (Action::Cancel, "b".into(), 1),
                (Action::Heartbeat, "c".into(), 2),
                (Action::Register, "b".into(), 2),
            ]
        );
        assert!(queue.push(write(Action::Register, "b", 3)));
        assert_eq!(queue.pop_oldest().map(|w| w.id), Some("a".into()));
        assert_eq!(queue.clear(), 3);
        assert!(
            !queue.push(write(Action::Register, "b", 4)),
            "nothing left to merge into"
        );
    }
}

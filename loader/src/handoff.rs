//! Batches from a loader thread to the consumer: a bounded queue that wakes a waiting consumer
//! once per few batches, not once per batch.
//!
//! A consumer faster than its loader threads finds the queue empty at every batch and sleeps;
//! with a plain channel each batch sent then wakes it, and on a virtual machine that wake-up (an
//! interrupt to a sleeping vCPU) costs the sending thread a large share of its time
//! (docs/PERFORMANCE.md, "Handing batches over"). Here a consumer that finds the queue empty
//! sleeps until the queue is one short of full (three batches at most) or the thread is done,
//! and then takes what is queued without sleeping again: one wake-up per `capacity - 1`
//! batches. A consumer slower than its threads never finds the queue empty and never waits; a
//! thread blocked on its full queue is woken once room for a group is free (half the queue,
//! three batches at most), not once per batch: that wake-up is a system call made by the
//! consumer, which is then the slowest part of the pipeline (issue 28, item 3: the Python
//! consumer's cost bounds the loader's rate on many cores).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The most batches a sleeping consumer waits for. A wake-up per three batches already saves
/// two thirds of the cost; a larger group would only let a loader's other threads fill their
/// queues and stop while the consumer waits on one of them.
const MAX_GROUP: usize = 3;

#[derive(Debug)]
struct State<T> {
    items: VecDeque<T>,
    /// The consumer sleeps until the queue reaches `wake_at` or the sender is gone.
    consumer_waiting: bool,
    /// The sender sleeps until the queue has room or the receiver is gone.
    sender_waiting: bool,
    sender_gone: bool,
    receiver_gone: bool,
    /// The consumer has taken an item: before that it is woken by the first one, so that an
    /// epoch's first batch is not held back waiting for the queue to fill.
    started: bool,
}

#[derive(Debug)]
struct Shared<T> {
    state: Mutex<State<T>>,
    filled: Condvar,
    emptied: Condvar,
    capacity: usize,
    /// Queue length at which a sleeping consumer is woken: one short of full (at most
    /// [`MAX_GROUP`]), so that the sender can queue one more batch while the consumer wakes
    /// instead of waiting for it (waking at full measured no better than waking per batch).
    wake_at: usize,
    /// Queue length at or below which a sender blocked on a full queue is woken: `capacity`
    /// less a group of half the queue (at most [`MAX_GROUP`], at least one).
    room_at: usize,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Neither side panics while holding the lock; recover the state if one ever did.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Why [`Receiver::try_recv`] has no item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Empty {
    /// None is queued yet.
    Waiting,
    /// None is queued and the sender is gone.
    Finished,
}

/// The loader thread's end.
#[derive(Debug)]
pub(crate) struct Sender<T>(Arc<Shared<T>>);

/// The consumer's end.
#[derive(Debug)]
pub(crate) struct Receiver<T>(Arc<Shared<T>>);

/// A queue of at most `capacity` (at least 1) items.
pub(crate) fn handoff<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::new(),
            consumer_waiting: false,
            sender_waiting: false,
            sender_gone: false,
            receiver_gone: false,
            started: false,
        }),
        filled: Condvar::new(),
        emptied: Condvar::new(),
        capacity: capacity.max(1),
        wake_at: capacity.saturating_sub(1).clamp(1, MAX_GROUP),
        room_at: capacity.max(1) - (capacity / 2).clamp(1, MAX_GROUP),
    });
    (Sender(shared.clone()), Receiver(shared))
}

impl<T> Sender<T> {
    /// Queues `item`, waiting while the queue is full; gives it back when the receiver is gone.
    pub fn send(&self, item: T) -> Result<(), T> {
        let shared = &*self.0;
        let mut state = shared.lock();
        while state.items.len() >= shared.capacity && !state.receiver_gone {
            state.sender_waiting = true;
            state = shared
                .emptied
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
        state.sender_waiting = false;
        if state.receiver_gone {
            return Err(item);
        }
        state.items.push_back(item);
        let wake_at = if state.started { shared.wake_at } else { 1 };
        if state.consumer_waiting && state.items.len() >= wake_at {
            state.consumer_waiting = false;
            shared.filled.notify_one();
        }
        Ok(())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.sender_gone = true;
        self.0.filled.notify_one();
    }
}

impl<T> Receiver<T> {
    /// The next item, if one is queued; else whether one may still come.
    pub fn try_recv(&self) -> Result<T, Empty> {
        let mut state = self.0.lock();
        self.take(&mut state).ok_or(if state.sender_gone {
            Empty::Finished
        } else {
            Empty::Waiting
        })
    }

    /// The next item, waiting for the sender when the queue is empty (until it is one short of
    /// full, or the sender is gone); `None` when the sender is gone and the queue is empty.
    pub fn recv(&self) -> Option<T> {
        let shared = &*self.0;
        let mut state = shared.lock();
        loop {
            if let Some(item) = self.take(&mut state) {
                return Some(item);
            }
            if state.sender_gone {
                return None;
            }
            state.consumer_waiting = true;
            while state.consumer_waiting && !state.sender_gone {
                state = shared.filled.wait(state).unwrap_or_else(|p| p.into_inner());
            }
        }
    }

    fn take(&self, state: &mut State<T>) -> Option<T> {
        let item = state.items.pop_front()?;
        state.started = true;
        if state.sender_waiting && state.items.len() <= self.0.room_at {
            state.sender_waiting = false;
            self.0.emptied.notify_one();
        }
        Some(item)
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.receiver_gone = true;
        state.items.clear();
        self.0.emptied.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_arrive_in_order_and_the_end_is_seen() {
        for capacity in [1, 2, 4, 7] {
            let (tx, rx) = handoff(capacity);
            let sender = std::thread::spawn(move || {
                for i in 0..1000u32 {
                    tx.send(i).expect("receiver alive");
                }
            });
            let got: Vec<u32> = std::iter::from_fn(|| rx.recv()).collect();
            sender.join().expect("sender");
            assert_eq!(got, (0..1000).collect::<Vec<_>>(), "capacity {capacity}");
            assert_eq!(rx.try_recv(), Err(Empty::Finished));
        }
    }

    /// Polls until `cond` holds of the queue's state: the tests wait for a state, never for a
    /// time, so that a slow machine cannot make them fail.
    fn wait_until<T>(shared: &Shared<T>, cond: impl Fn(&State<T>) -> bool) {
        let start = std::time::Instant::now();
        while !cond(&shared.lock()) {
            assert!(start.elapsed().as_secs() < 60, "never reached");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn a_waiting_consumer_is_woken_by_the_first_item_then_by_groups() {
        let (tx, rx) = handoff(4);
        let consumer = std::thread::spawn(move || {
            let first = rx.recv();
            // Waits with an empty queue: only the third queued item may wake it.
            let second = rx.recv();
            (first, second, std::iter::from_fn(|| rx.recv()).count())
        });
        wait_until(&tx.0, |s| s.consumer_waiting);
        tx.send(0u32).expect("alive");
        wait_until(&tx.0, |s| s.consumer_waiting && s.started);
        tx.send(1).expect("alive");
        tx.send(2).expect("alive");
        {
            let state = tx.0.lock();
            assert!(state.consumer_waiting, "woken before the queue held three");
            assert_eq!(state.items.len(), 2);
        }
        tx.send(3).expect("alive");
        drop(tx);
        let (first, second, rest) = consumer.join().expect("consumer");
        assert_eq!((first, second, rest), (Some(0), Some(1), 2));
    }

    #[test]
    fn a_blocked_sender_is_woken_once_a_group_is_free() {
        let (tx, rx) = handoff(4);
        let sender = std::thread::spawn(move || {
            for i in 0..6u32 {
                tx.send(i).expect("alive");
            }
        });
        wait_until(&rx.0, |s| s.sender_waiting && s.items.len() == 4);
        assert_eq!(rx.recv(), Some(0));
        {
            let state = rx.0.lock();
            assert!(state.sender_waiting, "woken with room for one batch only");
            assert_eq!(state.items.len(), 3);
        }
        // Two free (half the queue): woken, it fills the queue again.
        assert_eq!(rx.recv(), Some(1));
        wait_until(&rx.0, |s| s.items.len() == 4);
        assert_eq!(
            std::iter::from_fn(|| rx.recv()).collect::<Vec<_>>(),
            [2, 3, 4, 5]
        );
        sender.join().expect("sender");
    }

    #[test]
    fn a_short_stream_ends_without_filling_the_queue() {
        let (tx, rx) = handoff(8);
        let sender = std::thread::spawn(move || {
            tx.send(1).expect("alive");
            tx.send(2).expect("alive");
        });
        assert_eq!(rx.recv(), Some(1));
        assert_eq!(rx.recv(), Some(2));
        assert_eq!(rx.recv(), None);
        sender.join().expect("sender");
    }

    #[test]
    fn the_queue_never_holds_more_than_its_capacity() {
        let (tx, rx) = handoff(3);
        let sender = std::thread::spawn(move || {
            for i in 0..10u32 {
                tx.send(i).expect("alive");
            }
        });
        wait_until(&rx.0, |s| s.sender_waiting);
        assert_eq!(rx.0.lock().items.len(), 3);
        assert_eq!(std::iter::from_fn(|| rx.recv()).count(), 10);
        sender.join().expect("sender");
    }

    #[test]
    fn a_sender_blocked_on_a_full_queue_is_released_when_the_receiver_goes() {
        let (tx, rx) = handoff(1);
        let sender = std::thread::spawn(move || {
            tx.send(0u32).expect("alive");
            tx.send(1)
        });
        wait_until(&rx.0, |s| s.sender_waiting);
        drop(rx);
        assert_eq!(sender.join().expect("sender"), Err(1));
    }

    #[test]
    fn try_recv_tells_empty_from_finished() {
        let (tx, rx) = handoff::<u32>(2);
        assert_eq!(rx.try_recv(), Err(Empty::Waiting));
        tx.send(5).expect("alive");
        drop(tx);
        assert_eq!(rx.try_recv(), Ok(5));
        assert_eq!(rx.try_recv(), Err(Empty::Finished));
    }
}

//! Where a step's time goes: waiting for data, host-to-device copy, compute.
//!
//! The host measures its own waits. On CUDA the copy and compute run asynchronously, so they are
//! timed on the device with events recorded around them and read only when the loss is read
//! (the queue has drained then anyway). On the CPU there is no copy: the step reads the host
//! buffer in place, and compute is the rest of the wall time.

use crate::cuda::{CudaError, Event};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Totals of one interval (a logged window, or an epoch).
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    /// Wall time.
    pub wall: Duration,
    /// Time blocked waiting for the loader.
    pub data_wait: Duration,
    /// Device time of copies (CUDA).
    pub h2d: Duration,
    /// Device time of forward, backward and update (CUDA); wall minus waits on the CPU.
    pub compute: Duration,
    /// Contexts trained.
    pub samples: u64,
}

impl Totals {
    /// Adds `o`'s times and counts.
    pub fn add(&mut self, o: &Totals) {
        self.wall += o.wall;
        self.data_wait += o.data_wait;
        self.h2d += o.h2d;
        self.compute += o.compute;
        self.samples += o.samples;
    }

    /// The times as shares of the wall time, and the rate.
    pub fn shares(&self) -> Shares {
        let w = self.wall.as_secs_f64().max(1e-12);
        Shares {
            samples_per_s: self.samples as f64 / w,
            data_wait_share: self.data_wait.as_secs_f64() / w,
            h2d_share: self.h2d.as_secs_f64() / w,
            compute_share: self.compute.as_secs_f64() / w,
        }
    }
}

/// Shares of the wall time, as reported.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Shares {
    /// Contexts trained per second of wall time.
    pub samples_per_s: f64,
    /// Share of the wall time waiting for data.
    pub data_wait_share: f64,
    /// Share of the wall time copying to the device.
    pub h2d_share: f64,
    /// Share of the wall time computing (the rest, or device time on CUDA).
    pub compute_share: f64,
}

/// Per-step device events for one logging window.
#[derive(Debug)]
struct StepEvents {
    start: Event,
    copied: Event,
    done: Event,
}

/// Accumulates one logging window.
#[derive(Debug)]
pub struct Clock {
    window_start: Instant,
    cur: Totals,
    events: Vec<StepEvents>,
    used: usize,
}

impl Clock {
    /// `gpu_steps`: events for that many steps per window (the log interval), or 0 on the CPU.
    pub fn new(gpu_steps: usize) -> Result<Clock, CudaError> {
        let events = (0..gpu_steps)
            .map(|_| {
                Ok(StepEvents {
                    start: Event::new()?,
                    copied: Event::new()?,
                    done: Event::new()?,
                })
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        Ok(Clock {
            window_start: Instant::now(),
            cur: Totals::default(),
            events,
            used: 0,
        })
    }

    /// Adds a wait for data of `d`.
    pub fn waited(&mut self, d: Duration) {
        self.cur.data_wait += d;
    }

    /// Counts `n` more contexts trained.
    pub fn samples(&mut self, n: usize) {
        self.cur.samples += n as u64;
    }

    fn on_gpu(&self) -> bool {
        !self.events.is_empty()
    }

    /// Marks the start of a step's copy (CUDA).
    pub fn step_start(&self) -> Result<(), CudaError> {
        match self.events.get(self.used) {
            Some(e) => e.start.record(),
            None => Ok(()),
        }
    }

    /// Marks the end of the copy (CUDA).
    pub fn copied(&self) -> Result<(), CudaError> {
        match self.events.get(self.used) {
            Some(e) => e.copied.record(),
            None => Ok(()),
        }
    }

    /// Marks the end of the step's work (CUDA).
    pub fn step_done(&mut self) -> Result<(), CudaError> {
        if let Some(e) = self.events.get(self.used) {
            e.done.record()?;
            self.used += 1;
        }
        Ok(())
    }

    /// Closes the window and starts the next one. On CUDA this waits for the last step's work
    /// (the caller has just read the loss, so the queue is already drained).
    pub fn close(&mut self) -> Result<Totals, CudaError> {
        let mut t = self.cur;
        if self.on_gpu() {
            if let Some(last) = self.events[..self.used].last() {
                last.done.synchronize()?;
            }
            let (mut h2d, mut compute) = (0.0, 0.0);
            for e in &self.events[..self.used] {
                h2d += e.copied.since(&e.start)?;
                compute += e.done.since(&e.copied)?;
            }
            t.h2d = Duration::from_secs_f64(h2d / 1e3);
            t.compute = Duration::from_secs_f64(compute / 1e3);
        }
        // Taken after the wait above: on the GPU the window ends when its queued work does.
        t.wall = self.window_start.elapsed();
        if !self.on_gpu() {
            t.compute = t.wall.saturating_sub(t.data_wait);
        }
        self.window_start = Instant::now();
        self.cur = Totals::default();
        self.used = 0;
        Ok(t)
    }
}

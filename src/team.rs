//! The worker threads of the CPU forward's parallel sections (matrix products, attention).
//!
//! A forward runs ~5 parallel sections per layer, each a few to a few hundred µs long, with short
//! serial stretches between them (norms, RoPE, the activation quantizer). rayon's workers go to
//! sleep in those stretches and each section then starts with a futex wake: `perf` of a 9-token
//! forward here had ~12% of the samples in the scheduler. The helpers here keep looking for work
//! for a while after each section (spinning briefly, then yielding the core to any other thread,
//! then parking), so a section's tasks start at once; the calling thread takes tasks too.
//!
//! Tasks are claimed from one atomic ticket, `(generation, n_tasks, next)`: a claim is a
//! compare-and-swap on the whole ticket, so a helper that read an old section's ticket can never
//! claim a task of the next one by mistake, and a claimed task keeps its section (and the closure
//! it borrows) alive until the task reports done.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Name prefix of the threads that compute for the engine (the team's helpers, rayon's pool in the
/// app): the app tells their CPU time from the UI's by it (`crate::app::measure`). Thread names are
/// cut to 15 bytes on Linux; the prefix fits.
pub const COMPUTE_THREAD_PREFIX: &str = "mentor-cpu-";

/// Most tasks one section can have (the ticket's task fields are 16 bits).
pub const MAX_TASKS: usize = u16::MAX as usize;
/// How long an idle helper spins on the ticket before yielding its core between checks.
const SPIN: Duration = Duration::from_micros(50);
/// How long an idle helper keeps checking (yielding between checks) before it parks: longer than
/// the gaps inside a forward and between the steps of a generation, short enough that an idle app
/// costs nothing.
const STAY_AWAKE: Duration = Duration::from_millis(3);

type Task<'a> = dyn Fn(usize) + Sync + 'a;

/// One parallel section, on the stack of the thread that runs it.
struct Section<'a> {
    task: &'a Task<'a>,
}

struct Helper {
    thread: std::thread::Thread,
    parked: AtomicBool,
}

struct Team {
    /// `generation << 32 | n_tasks << 16 | next`.
    ticket: AtomicU64,
    section: AtomicPtr<Section<'static>>,
    done: AtomicUsize,
    panicked: AtomicBool,
    helpers: OnceLock<Vec<Helper>>,
    /// Held by the thread whose section the helpers serve; another caller (a second engine, a
    /// test thread, a task that itself asks for a section) runs its tasks alone.
    owner: Mutex<()>,
}

static TEAM: Team = Team {
    ticket: AtomicU64::new(0),
    section: AtomicPtr::new(std::ptr::null_mut()),
    done: AtomicUsize::new(0),
    panicked: AtomicBool::new(false),
    helpers: OnceLock::new(),
    owner: Mutex::new(()),
};

fn unpack(t: u64) -> (usize, usize) {
    (((t >> 16) & 0xFFFF) as usize, (t & 0xFFFF) as usize)
}

impl Team {
    /// Claim and run one task of the current section; false when there is none left.
    fn run_one(&self) -> bool {
        let mut t = self.ticket.load(Acquire);
        loop {
            let (n, next) = unpack(t);
            if next >= n {
                return false;
            }
            match self.ticket.compare_exchange_weak(t, t + 1, AcqRel, Acquire) {
                Ok(_) => {
                    // SAFETY: the section was published (Release) before the ticket that we just
                    // claimed from, and its owner waits for this task's `done` before it returns.
                    let section = unsafe { &*self.section.load(Acquire) };
                    if catch_unwind(AssertUnwindSafe(|| (section.task)(next))).is_err() {
                        self.panicked.store(true, Release);
                    }
                    self.done.fetch_add(1, Release);
                    return true;
                }
                Err(now) => t = now,
            }
        }
    }

    fn helper_loop(&self, me: usize) {
        // Spawned while the list is being built: wait for it.
        let helpers = loop {
            match self.helpers.get() {
                Some(h) => break h,
                None => std::thread::yield_now(),
            }
        };
        let mut idle_since = Instant::now();
        loop {
            if self.run_one() {
                idle_since = Instant::now();
                continue;
            }
            let idle = idle_since.elapsed();
            if idle < SPIN {
                std::hint::spin_loop();
            } else if idle < STAY_AWAKE {
                std::thread::yield_now();
            } else {
                // Announce the nap, then look once more: a section published after this load
                // sees `parked` and unparks us (park keeps the token if that comes first).
                helpers[me].parked.store(true, SeqCst);
                let (n, next) = unpack(self.ticket.load(SeqCst));
                if next >= n {
                    std::thread::park();
                }
                helpers[me].parked.store(false, SeqCst);
                idle_since = Instant::now();
            }
        }
    }

    fn start_helpers(&'static self) -> &'static [Helper] {
        self.helpers.get_or_init(|| {
            let n = rayon::current_num_threads().saturating_sub(1);
            // A helper finds its slot by index: stop at the first thread that cannot be spawned so
            // the indices stay those of the list.
            (0..n)
                .map_while(|i| {
                    std::thread::Builder::new()
                        .name(format!("{COMPUTE_THREAD_PREFIX}t{i}"))
                        .spawn(move || self.helper_loop(i))
                        .ok()
                        .map(|h| Helper { thread: h.thread().clone(), parked: AtomicBool::new(false) })
                })
                .collect()
        })
    }
}

/// Run `task(0) … task(n_tasks − 1)`, spread over the calling thread and the helpers (as many
/// threads in all as rayon is configured for: `RAYON_NUM_THREADS`, which the command line sets); returns when all are
/// done. Tasks may run in any order and concurrently. A panicking task panics here.
pub fn run(n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
    let helpers = TEAM.start_helpers();
    let owner = match TEAM.owner.try_lock() {
        _ if n_tasks < 2 || helpers.is_empty() => None,
        Ok(guard) => Some(guard),
        // Poisoned only by a panic outside any task (tasks' panics are caught): still consistent.
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    };
    let Some(owner) = owner else {
        (0..n_tasks).for_each(task);
        return;
    };
    for chunk_start in (0..n_tasks).step_by(MAX_TASKS) {
        let n = (n_tasks - chunk_start).min(MAX_TASKS);
        let shifted = |i: usize| task(chunk_start + i);
        let section = Section { task: &shifted };
        TEAM.section.store((&section as *const Section<'_>).cast_mut().cast(), Release);
        TEAM.done.store(0, Relaxed);
        let generation = (TEAM.ticket.load(Relaxed) >> 32).wrapping_add(1) & 0xFFFF_FFFF;
        TEAM.ticket.store(generation << 32 | (n as u64) << 16, SeqCst);
        for h in helpers {
            if h.parked.load(SeqCst) {
                h.thread.unpark();
            }
        }
        while TEAM.run_one() {}
        while TEAM.done.load(Acquire) < n {
            std::hint::spin_loop();
        }
        // Nothing may read `section` after this: every task is claimed and done.
    }
    drop(owner);
    if TEAM.panicked.swap(false, AcqRel) {
        panic!("a task of a parallel section panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_exactly_once() {
        for n in [0usize, 1, 2, 3, 17, 1000] {
            let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                run(n, &|i| {
                    counts[i].fetch_add(1, Relaxed);
                });
            }
            assert!(counts.iter().all(|c| c.load(Relaxed) == 50), "n = {n}");
        }
    }

    #[test]
    fn concurrent_and_nested_callers_still_run_everything() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..100 {
                        run(8, &|_| {
                            run(4, &|_| {
                                total.fetch_add(1, Relaxed);
                            })
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Relaxed), 3 * 100 * 8 * 4);
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_the_team_recovers() {
        let r = catch_unwind(|| run(16, &|i| assert_ne!(i, 7)));
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        run(16, &|_| {
            n.fetch_add(1, Relaxed);
        });
        assert_eq!(n.load(Relaxed), 16);
    }
}

// A fixed pool of worker threads, one pinned per physical core, that runs a two-phase job:
// units [0, n1) (pass 1), then units [n1, n1 + n2) (pass 2). No pass-2 unit is claimed while a
// pass-1 unit is unclaimed; a pass-2 unit starts once the job says its inputs are ready (the job
// tracks what its units depend on). Claims (Claims below): from one counter in order, or from
// per-worker contiguous ranges of each pass, then the pass's tail in order.
// For a job that asks (PoolJob::claim_ahead), a worker claims its next unit when it starts one (from
// its second unit of a run on), so the job can prefetch the next one's data meanwhile: with one
// counter as long as more than num_threads units of that unit's pass are left unclaimed after it
// (the last num_threads units of pass 1 and of the run are claimed as workers come free: a pass-1
// unit held back delays the pass-2 units that wait for it, a last unit held back lengthens the
// run's tail), with ranges only the next unit of the worker's own range.
//
// The calling thread is worker 0 and takes units like the others, so a pool of N threads starts
// N - 1 background threads. Idle workers spin briefly on the job generation, then sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ft {

class PoolJob {
 public:
  virtual ~PoolJob() = default;
  static constexpr uint32_t kNoUnit = 0xffffffffu;
  // Runs one unit; `worker` is in [0, num_threads) and selects per-worker scratch. `next` is the unit
  // this worker runs after it, when the pool already claimed it (else kNoUnit): the job may prefetch
  // its data while this one runs. `claimed_ahead`: this unit was the `next` of the worker's last one.
  virtual void run_unit(uint32_t unit, uint32_t next, bool claimed_ahead, int worker) = 0;
  // Whether workers claim their next unit when they start one (see WorkerPool); read once per run.
  virtual bool claim_ahead() const { return false; }
  // Whether pass-2 unit `u2` (counted from the first pass-2 unit) may start. Polled while it returns
  // false, so it must become true once the pass-1 units it depends on are done: every pass-1 unit
  // is claimed before any pass-2 unit, so those are already running. The pool keeps no shared count of finished units (one
  // contended atomic per unit less on 16 cores); a job counts what its pass-2 units need.
  virtual bool pass2_ready(uint32_t u2) const = 0;
  // How many of the last units of pass `pass` (0 or 1) are its tail: under Claims::kRanges they are
  // not cut into the workers' ranges but handed out in order from one counter once every range of
  // the pass is empty. Read once per run; 0: none.
  virtual uint32_t tail_units(int pass) const {
    (void)pass;
    return 0;
  }
};

// Logical CPUs this process may run on, one per physical core, in ascending order.
std::vector<int> physical_core_cpus();

// Where the workers' time went, summed over workers and runs since the last reset (ticks: the TSC on
// x86, nanoseconds elsewhere; `wall` counts each run's duration once per worker, so wall - busy -
// barrier is time a worker was not inside a unit: `join` before its first unit, `tail` after its
// last, and the rest between units, claiming the next one, or in runs where it took no unit).
struct PoolProfile {
  uint64_t runs = 0;
  uint64_t wall = 0;              // sum over runs of run() duration x num_threads
  uint64_t busy[2] = {0, 0};      // inside units of pass 1 / pass 2
  uint64_t barrier = 0;           // holding a pass-2 unit, waiting for its inputs (pass2_ready)
  uint64_t join = 0;              // from the start of a run to a worker's first unit (workers with one)
  uint64_t tail = 0;              // from a worker's last unit to the end of the run
  uint64_t units[2] = {0, 0};
  double ticks_per_second = 0.0;  // measured once per process
  uint64_t chain_links = 0;       // the executor's: weight streams chained to a successor (StreamChain)
};

class WorkerPool {
 public:
  // How workers claim units. kShared: one counter hands out each pass's units in order, so a
  // worker's consecutive units lie num_threads units apart. kRanges: each pass's units are cut into
  // num_threads contiguous ranges, worker w takes range w's units in order, then the other ranges'
  // (in order, from the same cursors) once its own is empty, and pass 2 only once no pass-1 unit is
  // left unclaimed; each worker's units then follow each other in memory (one long weight stream)
  // until the pass's last units. $FT_CPU_MOE_CLAIMS ("ranges" or "shared") picks; see worker_pool.cpp.
  enum class Claims { kShared, kRanges };
  explicit WorkerPool(int num_threads);
  Claims claims() const { return claims_; }
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int num_threads() const { return num_threads_; }
  // Blocking. Not reentrant: callers serialise (the executor holds a mutex).
  void run(uint32_t n1, uint32_t n2, PoolJob* job);

  // Not thread-safe against run(): call between runs.
  PoolProfile profile() const;
  void reset_profile();

 private:
  // Units a worker finished, over the pool's life; written by that worker only, read by run()'s
  // caller to know when a run is complete.
  struct alignas(64) WorkerDone {
    std::atomic<uint64_t> units{0};
  };
  struct alignas(64) WorkerTicks {
    uint64_t busy[2] = {0, 0};
    uint64_t barrier = 0;
    uint64_t join = 0;
    uint64_t units[2] = {0, 0};
    uint64_t last_end = 0;  // tick at which the worker's last unit of the current run ended (0: none)
  };

  void worker_main(int worker, int cpu);
  void work(int worker);

  int num_threads_;
  std::vector<std::thread> threads_;

  // Claim word: the run's unit count in the high 32 bits, the next unit in the low 32 bits. A claim
  // is one fetch_add (no compare-and-swap retries when 16 workers start at once); it hands out a unit
  // while the low half is below the high half, and only of the run in progress: a worker late from
  // an earlier run that gets one runs it for the run in progress (work()).
  alignas(64) std::atomic<uint64_t> next_{0};
  // kRanges: per pass and worker, a claim word as next_ (the range's end in the high half, its next
  // unit in the low half), each on a cache line of its own: [pass * num_threads + w]; then the words
  // of the passes' tails (PoolJob::tail_units), [2 * num_threads + pass].
  struct alignas(64) RangeWord {
    std::atomic<uint64_t> w{0};
  };
  std::unique_ptr<RangeWord[]> ranges_;
  Claims claims_ = Claims::kShared;
  alignas(64) std::atomic<uint32_t> gen_{0};
  std::atomic<uint32_t> n1_{0}, n2_{0};
  std::atomic<PoolJob*> job_{nullptr};
  std::atomic<uint64_t> run_start_{0};  // tick at which the current run began (profile)
  std::vector<WorkerTicks> ticks_;  // one per worker, each written only by its worker
  std::unique_ptr<WorkerDone[]> done_;  // one per worker
  uint64_t done_total_ = 0;             // sum of done_ after the last run (run()'s caller)
  uint64_t runs_ = 0, wall_ = 0, tail_ = 0;  // written by the thread that calls run()

  std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace ft

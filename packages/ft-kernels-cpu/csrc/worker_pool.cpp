#include "worker_pool.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>

#include "common.h"

namespace ft {

namespace {

inline void cpu_relax() {
#if FT_X86
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// How long an idle worker spins before it sleeps. Decode submits a layer every few tens of
// microseconds, so a short spin keeps the pool hot within a step without burning a core between
// requests.
constexpr auto kSpin = std::chrono::microseconds(200);

// A cheap monotonic tick for the pool's profile.
inline uint64_t ticks() {
#if FT_X86
  return __rdtsc();
#else
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
#endif
}

double ticks_per_second() {
  static const double rate = [] {
    const auto c0 = std::chrono::steady_clock::now();
    const uint64_t t0 = ticks();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const uint64_t t1 = ticks();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
    return static_cast<double>(t1 - t0) / s;
  }();
  return rate;
}

// Plain POSIX reads: iostreams crashed in one torch venv whose libstdc++ differs from the compiler's.
bool read_int_file(const std::string& path, int* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[32];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  char* end = nullptr;
  const long v = std::strtol(buf, &end, 10);
  if (end == buf) return false;
  *out = static_cast<int>(v);
  return true;
}

// $FT_CPU_MOE_CLAIMS: "ranges" or "shared" (WorkerPool::Claims), else the vendor's default: ranges on
// AMD, where a 2-core Zen 5 ran every format's batch-1 step 3-14% faster with them (each core's
// weight stream no longer jumps to another unit's rows at every unit, which cost one Zen 5 core up
// to 1.7 us a jump in tools/row_stream_probe.cpp), shared on Intel, where the GPU machine's 16-core
// Xeon ran as fast or faster with one counter in three VMs (the ranges' last pass-1 units held up
// the workers' first pass-2 units: 4-15 us a step; docs/benchmarks.md, twenty-fifth session).
WorkerPool::Claims parse_claims() {
  const char* env = std::getenv("FT_CPU_MOE_CLAIMS");
  if (env == nullptr || *env == '\0') return cpu_is_intel() ? WorkerPool::Claims::kShared : WorkerPool::Claims::kRanges;
  const std::string v(env);
  if (v == "ranges") return WorkerPool::Claims::kRanges;
  if (v == "shared") return WorkerPool::Claims::kShared;
  throw Error("FT_CPU_MOE_CLAIMS='" + v +
              "' must be 'ranges' (each worker takes a contiguous range of each pass's units first) or 'shared' "
              "(one counter hands out every unit in order)");
}

}  // namespace

std::vector<int> physical_core_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  std::set<std::pair<int, int>> seen;  // (package, core) pairs already taken
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    int core = cpu, pkg = 0;
    if (!read_int_file(base + "core_id", &core) || !read_int_file(base + "physical_package_id", &pkg)) {
      core = cpu;  // no topology exposed: count every logical CPU as a core
      pkg = 0;
    }
    if (seen.insert({pkg, core}).second) cpus.push_back(cpu);
  }
  return cpus;
}

WorkerPool::WorkerPool(int num_threads) : num_threads_(num_threads) {
  if (num_threads < 1) throw Error("num_threads must be >= 1, got " + std::to_string(num_threads));
  claims_ = parse_claims();
  ranges_ = std::make_unique<RangeWord[]>(2 * static_cast<size_t>(num_threads) + 2);
  ticks_.resize(num_threads);
  done_ = std::make_unique<WorkerDone[]>(num_threads);
  std::vector<int> cpus = physical_core_cpus();
  threads_.reserve(num_threads - 1);
  for (int w = 1; w < num_threads; ++w) {
    const int cpu = cpus.empty() ? -1 : cpus[w % cpus.size()];
    threads_.emplace_back(&WorkerPool::worker_main, this, w, cpu);
  }
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true, std::memory_order_seq_cst);
    gen_.fetch_add(1, std::memory_order_seq_cst);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::run(uint32_t n1, uint32_t n2, PoolJob* job) {
  if (n1 + n2 == 0) return;
  const uint64_t t0 = ticks();
  run_start_.store(t0, std::memory_order_relaxed);  // published by the release of gen_ below
  const uint32_t gen = gen_.load(std::memory_order_relaxed) + 1;
  job_.store(job, std::memory_order_relaxed);
  n1_.store(n1, std::memory_order_relaxed);
  n2_.store(n2, std::memory_order_relaxed);
  next_.store(static_cast<uint64_t>(n1 + n2) << 32, std::memory_order_release);
  if (claims_ == Claims::kRanges) {
    // Range w of a pass of n units: [n w / T, n (w + 1) / T), as a claim word (end << 32 | next). A
    // worker late from the last run that claims from one acquires the job's fields with it.
    const uint64_t T = static_cast<uint64_t>(num_threads_);
    for (int p = 0; p < 2; ++p) {
      const uint64_t base = p ? n1 : 0, all = p ? n2 : n1;
      const uint64_t tail = std::min<uint64_t>(all, job->tail_units(p)), n = all - tail;
      for (uint64_t w = 0; w < T; ++w) {
        const uint64_t b = base + n * w / T, e = base + n * (w + 1) / T;
        ranges_[p * T + w].w.store(e << 32 | b, std::memory_order_release);
      }
      ranges_[2 * T + p].w.store((base + all) << 32 | (base + n), std::memory_order_release);
    }
  }
  gen_.store(gen, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    cv_.notify_all();
  }
  work(0);
  // Every unit of this run is claimed once work() returns; wait for the other workers' last ones.
  const uint64_t target = done_total_ + n1 + n2;
  for (;;) {
    uint64_t sum = 0;
    for (int w = 0; w < num_threads_; ++w) sum += done_[w].units.load(std::memory_order_acquire);
    if (sum == target) break;
    cpu_relax();
  }
  done_total_ = target;
  const uint64_t t_end = ticks();
  // Every unit's end tick was written before its worker's done count's release; the loads above
  // acquired them.
  for (WorkerTicks& tk : ticks_) {
    if (tk.last_end > t0) tail_ += t_end - tk.last_end;
  }
  ++runs_;
  wall_ += (t_end - t0) * static_cast<uint64_t>(num_threads_);
}

PoolProfile WorkerPool::profile() const {
  PoolProfile p;
  p.runs = runs_;
  p.wall = wall_;
  for (const WorkerTicks& t : ticks_) {
    for (int i = 0; i < 2; ++i) {
      p.busy[i] += t.busy[i];
      p.units[i] += t.units[i];
    }
    p.barrier += t.barrier;
    p.join += t.join;
  }
  p.tail = tail_;
  p.ticks_per_second = ticks_per_second();
  return p;
}

void WorkerPool::reset_profile() {
  for (WorkerTicks& t : ticks_) t = WorkerTicks{};
  runs_ = wall_ = tail_ = 0;
}

void WorkerPool::work(int worker) {
  WorkerTicks& tk = ticks_[worker];
  std::atomic<uint64_t>& done = done_[worker].units;
  const uint32_t ahead_margin = static_cast<uint32_t>(num_threads_);
  bool first = true;
  uint64_t last = 0;  // the word the worker's last claim returned: its unit and the run's unit count
  // Claims the next unit of the run in progress into *unit; false once there is none. One
  // fetch_add, whichever run the word belongs to: a unit it hands out is one of the run in progress,
  // which cannot end before that unit does, so the job and n1 read after it are that run's (the
  // release of next_ in run() published them). With `ahead`, only while more than ahead_margin units
  // of its pass are left unclaimed. That takes a load of the word before the claim (another transfer
  // of its contended line) only near a margin: the word moves on by about num_threads units while a
  // worker runs one, so a claim ahead that comes more than 4 margins before the margin by the
  // worker's last claim is made without it (a race can take a unit past the margin either way).
  auto claim = [&](uint32_t* unit, bool ahead) {
    if (ahead) {
      const uint32_t n1 = n1_.load(std::memory_order_relaxed);
      const uint32_t u = static_cast<uint32_t>(last) + 1, total = static_cast<uint32_t>(last >> 32);
      if ((u < n1 ? n1 - u : total - u) <= 5 * ahead_margin) {
        const uint64_t cur = next_.load(std::memory_order_relaxed);
        const uint32_t c = static_cast<uint32_t>(cur), ct = static_cast<uint32_t>(cur >> 32);
        if (c >= ct || (c < n1 ? n1 - c : ct - c) <= ahead_margin) return false;
      }
    }
    const uint64_t w = next_.fetch_add(1, std::memory_order_acq_rel);
    if (static_cast<uint32_t>(w) >= static_cast<uint32_t>(w >> 32)) return false;
    *unit = static_cast<uint32_t>(w);
    last = w;
    return true;
  };
  // kRanges: the pass whose units this worker claims (2: none left): from its own range, the others'
  // (in worker order after its own), then the pass's tail. Pass 2 only once every range and the tail
  // of pass 1 were found empty, so the pass-1 units a pass-2 unit waits for are all claimed (running
  // or done). A claim ahead takes the next unit of the worker's own range only.
  int pass = 0;
  // One claim from a range or tail word; `peek`: skip it without a write to its line when it looks
  // empty (a word of another worker or the tail: its cursor only grows within a run).
  auto claim_word = [](std::atomic<uint64_t>& a, bool peek, uint32_t* unit) {
    auto open = [](uint64_t w) { return static_cast<uint32_t>(w) < static_cast<uint32_t>(w >> 32); };
    if (peek && !open(a.load(std::memory_order_relaxed))) return false;
    const uint64_t w = a.fetch_add(1, std::memory_order_acq_rel);
    if (!open(w)) return false;
    *unit = static_cast<uint32_t>(w);
    return true;
  };
  auto claim_ranges = [&](uint32_t* unit, bool ahead) {
    const size_t T = static_cast<size_t>(num_threads_);
    for (; pass < 2; ++pass) {
      if (claim_word(ranges_[pass * T + worker].w, false, unit)) return true;
      if (ahead) return false;
      for (size_t i = 1; i < T; ++i) {
        if (claim_word(ranges_[pass * T + (worker + i) % T].w, true, unit)) return true;
      }
      if (claim_word(ranges_[2 * T + pass].w, true, unit)) return true;  // the pass's tail
    }
    return false;
  };
  const bool ranges = claims_ == Claims::kRanges;
  auto take = [&](uint32_t* unit, bool ahead) { return ranges ? claim_ranges(unit, ahead) : claim(unit, ahead); };
  uint32_t unit = 0;
  if (!take(&unit, false)) return;
  bool claimed_ahead = false;
  for (;;) {
    // A unit is held, so its run is in progress and the job's fields are stable.
    PoolJob* job = job_.load(std::memory_order_relaxed);
    const uint32_t n1 = n1_.load(std::memory_order_relaxed);
    uint32_t next = PoolJob::kNoUnit;
    // Not for a worker's first unit of a run: the workers start together, and a second claim each
    // would queue on the word before they start.
    const bool have_next = !first && job->claim_ahead() && take(&next, true);
    const uint64_t t0 = ticks();
    if (first) {  // a unit is held, so run_start_ is its run's (published with the job)
      first = false;
      const uint64_t start = run_start_.load(std::memory_order_relaxed);
      tk.join += t0 > start ? t0 - start : 0;
    }
    if (unit < n1) {
      job->run_unit(unit, next, claimed_ahead, worker);
      tk.last_end = ticks();
      tk.busy[0] += tk.last_end - t0;
      ++tk.units[0];
    } else {
      while (!job->pass2_ready(unit - n1)) cpu_relax();
      const uint64_t t1 = ticks();
      tk.barrier += t1 - t0;
      job->run_unit(unit, next, claimed_ahead, worker);
      tk.last_end = ticks();
      tk.busy[1] += tk.last_end - t1;
      ++tk.units[1];
    }
    // Only this worker writes its count: a plain increment, released for run()'s caller.
    done.store(done.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    if (have_next) {
      unit = next;
      claimed_ahead = true;
    } else {
      if (!take(&unit, false)) return;
      claimed_ahead = false;
    }
  }
}

void WorkerPool::worker_main(int worker, int cpu) {
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);  // best effort: a refusal only costs locality
  }
  uint32_t seen = gen_.load(std::memory_order_acquire);
  for (;;) {
    auto spin_start = std::chrono::steady_clock::now();
    uint32_t g;
    int polls = 0;
    while ((g = gen_.load(std::memory_order_acquire)) == seen) {
      cpu_relax();
      if (++polls % 256 == 0 && std::chrono::steady_clock::now() - spin_start > kSpin) break;
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      cv_.wait(lock, [&] { return gen_.load(std::memory_order_seq_cst) != seen || stop_.load(); });
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      g = gen_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = g;
    work(worker);
  }
}

}  // namespace ft

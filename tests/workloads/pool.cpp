/* C++ workload for the unwinding tests against perf: a std::thread pool running tasks from a
 * std::deque<std::function<void()>> queue, built with the compilers' defaults (g++ -O2,
 * clang++ -O2: no frame pointers), so stacks pass through libstdc++ (thread start, std::function)
 * and libc (malloc/free) code without frame pointers.
 *
 * Per round the main thread queues two job_a tasks and one job_b task (lambdas capturing the
 * job number); job_a and job_b both call crunch(), the same code with the same input size:
 * job_a gets 2/3 and job_b 1/3 of the workers' CPU time in crunch. crunch() builds a std::map,
 * copies it into a std::vector, sorts it with a lambda comparator and sums it (std::accumulate),
 * so its samples fall in the workload's instantiated templates, in libstdc++
 * (std::_Rb_tree_insert_and_rebalance) and in libc (malloc, free).
 * `pool SECONDS [THREADS]`: prints "ready PID", runs for SECONDS with THREADS workers (2).
 * Build: g++ -O2 -g -pthread, or clang++ -O2 -g -pthread (job_a and job_b differ in a constant
 * so identical-code folding cannot merge them; their calls are not in tail position). */
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <unistd.h>
#include <vector>

static volatile unsigned long sink;

__attribute__((noinline)) unsigned long crunch(unsigned seed) {
  std::map<unsigned, unsigned> m;
  unsigned x = seed;
  for (int i = 0; i < 2000; i++) {
    x = x * 1103515245u + 12345u;
    m[x >> 8] = x;
  }
  std::vector<std::pair<unsigned, unsigned>> v(m.begin(), m.end());
  std::sort(v.begin(), v.end(), [](const auto &l, const auto &r) { return l.second < r.second; });
  return std::accumulate(v.begin(), v.end(), 0ul, [](unsigned long s, const auto &p) { return s + p.first; });
}

__attribute__((noinline)) void job_a(unsigned n) { sink = sink + crunch(n * 2 + 1); }
__attribute__((noinline)) void job_b(unsigned n) { sink = sink + crunch(n * 2 + 2) + 1; }

class Pool {
public:
  explicit Pool(unsigned n) {
    for (unsigned i = 0; i < n; i++) threads_.emplace_back([this] { work(); });
  }
  void submit(std::function<void()> f) {
    std::unique_lock<std::mutex> l(mu_);
    full_.wait(l, [this] { return queue_.size() < 64; });
    queue_.push_back(std::move(f));
    ready_.notify_one();
  }

private:
  void work() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> l(mu_);
        ready_.wait(l, [this] { return !queue_.empty(); });
        f = std::move(queue_.front());
        queue_.pop_front();
        full_.notify_one();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable ready_, full_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
};

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 1e12;
  unsigned nthreads = argc > 2 ? (unsigned)atoi(argv[2]) : 2;
  std::printf("ready %d\n", (int)getpid());
  std::fflush(stdout);
  Pool pool(nthreads);
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(secs);
  for (unsigned n = 0; std::chrono::steady_clock::now() < end; n++) {
    pool.submit([n] { job_a(n); });
    pool.submit([n] { job_a(n + 1); });
    pool.submit([n] { job_b(n); });
  }
  std::_Exit(0);
}

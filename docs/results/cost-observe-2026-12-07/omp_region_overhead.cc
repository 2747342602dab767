#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
int main() {
  std::vector<double> s0, s1, e;
  for (int it = 0; it < 200; it++) {
    // gap: serial work ~300us
    double g = now();
    volatile double x = 0;
    while (now() - g < 300e-6) x += 1;
    double r0 = now(), f0 = -1, f1 = -1;
#pragma omp parallel num_threads(2)
    {
      double t = now();
      if (omp_get_thread_num() == 0)
        f0 = t - r0;
      else
        f1 = t - r0;
      double w = now();
      while (now() - w < 100e-6) {
      }
    }
    double r1 = now();
    s0.push_back(f0 * 1e6);
    s1.push_back(f1 * 1e6);
    e.push_back((r1 - r0) * 1e6 - 100);
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  printf("master start %.1f us, helper start %.1f us, overhead beyond 100us work %.1f us\n",
         med(s0), med(s1), med(e));
}

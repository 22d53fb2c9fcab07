// The minitrain command line: train | sample | bench | data | plan | ckpt.
#include <cstdio>

int main() {
  std::puts("minitrain: under construction");
  return 0;
}
